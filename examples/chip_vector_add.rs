//! Vector add on one simulated chip under an L3 Worker: the chip runs in its own forked
//! process; the orchestration (a closure here) places a typed call of a `#[callable(chip)]`
//! kernel on it with `.on(orch, chip(0))`. The chip copies the inputs from shared memory into
//! its device memory, runs the kernel, and copies the output back, so the parent reads the
//! result straight from the output buffer.
//!
//! Run it with `cargo run --example chip_vector_add`.

#![allow(clippy::print_stdout)] // An example talks to its user.

use std::process::ExitCode;

use simpler::prelude::*;

const ROWS: u32 = 128;
const COLS: u32 = 128;

/// `out = a + b` on one simulated core; the kernel sees the tensors as flat slices.
#[callable(chip)]
fn vadd(a: In<f32>, b: In<f32>, mut out: Out<f32>) {
    for i in 0..out.len() {
        out[i] = a[i] + b[i];
    }
}

fn main() -> simpler::Result<ExitCode> {
    let mut worker = Worker::builder().chips(1).chip_memory(16 << 20).build()?;
    worker.init()?; // forks the chip's process; registers every #[callable] there

    let n = (ROWS * COLS) as usize;
    let (ba, bb, bout) =
        (worker.create_buffer(4 * n)?, worker.create_buffer(4 * n)?, worker.create_buffer(4 * n)?);
    let av: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.001).collect();
    let bv: Vec<f32> = (0..n).map(|i| ((i * 7) % 1000) as f32 * 0.002).collect();
    ba.write(0, &av)?;
    bb.write(0, &bv)?;
    let shape = [ROWS, COLS];
    let (a, b, mut out) = (ba.typed::<f32>(&shape)?, bb.typed::<f32>(&shape)?, bout.typed::<f32>(&shape)?);

    // One run with one task: `vadd` on chip 0.
    worker.run(|orch| {
        vadd::call(&a, &b, &mut out)?.on(orch, chip(0))?;
        Ok(())
    })?;

    let got = bout.read::<f32>(0, n)?;
    worker.close()?;
    let worst = (0..n).map(|i| (got[i] - (av[i] + bv[i])).abs()).fold(0.0f32, f32::max);
    if worst > 1e-5 {
        eprintln!("FAILED: the largest error is {worst}");
        return Ok(ExitCode::FAILURE);
    }
    println!("{ROWS}x{COLS} vector add on chip 0 of an L3 Worker: largest error {worst}");
    Ok(ExitCode::SUCCESS)
}
