//! Chip-resident memory: buffers allocated in a chip's device memory with `alloc_child_tensor`,
//! filled with `copy_to`, used by kernels across several runs, read back with `copy_from` and
//! released with `free`. Host tensors are copied into the chip before each task and back after
//! it; device tensors stay where they are, so a value can accumulate on the chip across runs.
//! A device tensor belongs to its chip: naming it on another chip, or after `free`, is refused
//! when the task is submitted.
//!
//! Run it with `cargo run --example chip_resident_memory`.

#![allow(clippy::print_stdout)] // An example talks to its user.

use std::process::ExitCode;

use simpler::prelude::*;

const N: u32 = 1024;

/// `t = x + w`
#[callable(chip)]
fn vadd(x: In<f32>, w: In<f32>, mut t: Out<f32>) {
    for i in 0..t.len() {
        t[i] = x[i] + w[i];
    }
}

/// `acc += t`
#[callable(chip)]
fn accumulate(t: In<f32>, mut acc: InOut<f32>) {
    for i in 0..acc.len() {
        acc[i] += t[i];
    }
}

task_graph! {
    /// One step, two chained kernels on chip 0: `acc += x + w`, where `x` is host memory and
    /// `w` and `acc` live on chip 0.
    fn step(x: In<f32>, w: In<f32>, acc: InOut<f32>, n: u32) {
        let t = alloc::<f32>([n]);
        vadd(x, w, &mut t).on(chip(0));
        accumulate(t, &mut acc).on(chip(0));
    }
}

fn main() -> simpler::Result<ExitCode> {
    let mut worker = Worker::builder().chips(2).chip_memory(16 << 20).build()?;
    worker.init()?;
    let n = N as usize;

    // Device memory on chip 0: a weight and an accumulator, filled from host buffers.
    let (dev_w, dev_acc) = (
        worker.alloc_child_tensor(0, &[N], DataType::Float32)?,
        worker.alloc_child_tensor(0, &[N], DataType::Float32)?,
    );
    let host = worker.create_buffer(4 * n)?;
    host.write(0, &(0..n).map(|i| i as f32).collect::<Vec<_>>())?;
    worker.copy_to(&dev_w, &host)?; // w[i] = i
    host.write(0, &vec![0.0f32; n])?;
    worker.copy_to(&dev_acc, &host)?; // acc = 0
    let (w, mut acc) = (dev_w.typed::<f32>(&[N])?, dev_acc.typed::<f32>(&[N])?);

    // Three runs: acc += r + w for r = 1, 2, 3; nothing is copied back between them.
    let bx = worker.create_buffer(4 * n)?;
    let x = bx.typed::<f32>(&[N])?;
    for r in 1..=3 {
        bx.write(0, &vec![r as f32; n])?;
        step::call(&x, &w, &mut acc, N)?.run(&worker)?;
    }
    let host_untouched = host.read::<f32>(0, n)?.iter().all(|&v| v == 0.0); // acc never came back
    worker.copy_from(&host, &dev_acc)?; // until now
    let got = host.read::<f32>(0, n)?;

    // A device tensor of chip 0 cannot be used by a task on chip 1.
    let wrong_chip = worker.run(|orch| accumulate::call(&x, &mut acc)?.on(orch, chip(1)).map(|_| ()));
    println!("on the wrong chip: {}", wrong_chip.as_ref().map_or_else(|e| e.to_string(), |_| "ran".into()));

    worker.free(&dev_w)?;
    worker.free(&dev_acc)?;
    let after_free = step::call(&x, &w, &mut acc, N)?.run(&worker);
    println!("after free: {}", after_free.as_ref().map_or_else(|e| e.to_string(), |_| "ran".into()));
    worker.close()?;

    let bad = (0..n).filter(|&i| got[i] != 6.0 + 3.0 * i as f32).count();
    if bad != 0 || !host_untouched || wrong_chip.is_ok() || after_free.is_ok() {
        eprintln!(
            "FAILED: {bad} wrong sums, host untouched: {host_untouched}, refusals: {wrong_chip:?} {after_free:?}"
        );
        return Ok(ExitCode::FAILURE);
    }
    println!("result check: acc = 6 + 3 w accumulated on chip 0 over three runs, read back once");
    Ok(ExitCode::SUCCESS)
}
