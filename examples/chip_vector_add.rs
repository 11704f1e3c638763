//! Vector add on simulated chips at L3: the same kernel on one chip, on four chips as a group,
//! and a weight kept resident in one chip's device memory across runs.
//!
//! Run it with `cargo run --example chip_vector_add`.

#![allow(clippy::print_stdout)] // An example talks to its user.

use simpler::{CallConfig, ChipFn, DataType, HostArgs, HostResult, TaskArgs, Worker};

const N: usize = 4096;

/// `out[i] = a[i] + b[i]` on one simulated core.
fn vadd(args: &HostArgs<'_>) -> HostResult {
    let (a, b, out) = (args.input::<f32>(0)?, args.input::<f32>(1)?, args.output::<f32>(2)?);
    for i in 0..out.len() {
        out[i] = a[i] + b[i];
    }
    Ok(())
}

fn main() -> simpler::Result<()> {
    let mut worker = Worker::builder().chips(4).chip_memory(64 << 20).chip_cores(2).build()?;
    let vadd = worker.register_chip(ChipFn::kernel("vadd", vadd))?;
    worker.init()?;

    let a = worker.create_buffer(N * 4)?;
    let b = worker.create_buffer(N * 4)?;
    a.write(0, &(0..N).map(|i| i as f32).collect::<Vec<_>>())?;
    b.write(0, &vec![0.5f32; N])?;
    let outs: Vec<_> = (0..4).map(|_| worker.create_buffer(N * 4)).collect::<Result<_, _>>()?;
    let f32s = |buf: &simpler::Buffer| buf.tensor(&[N as u32], DataType::Float32);
    let (ta, tb) = (f32s(&a)?, f32s(&b)?);
    let touts: Vec<_> = outs.iter().map(f32s).collect::<Result<_, _>>()?;

    // One group: four members on four chips, launched together.
    worker.run(
        |orch, _, _| {
            let mut members = Vec::new();
            for t in &touts {
                let mut args = TaskArgs::new();
                args.input(&ta)?.input(&tb)?.output(t)?;
                members.push(args);
            }
            orch.submit_next_level_group(&vadd, members, CallConfig::default(), &[0, 1, 2, 3])?;
            Ok(())
        },
        TaskArgs::new(),
        CallConfig::default(),
    )?;

    // A bias kept on chip 2 across two runs: copied in once, never copied around a run.
    let bias = worker.alloc_child_tensor(2, &[N as u32], DataType::Float32)?;
    worker.copy_to(&bias, &b)?;
    let tbias = bias.tensor(&[N as u32], DataType::Float32)?;
    for _ in 0..2 {
        worker.run(
            |orch, _, _| {
                let mut args = TaskArgs::new();
                args.input(&touts[2])?.input(&tbias)?.output(&touts[3])?;
                orch.submit_next_level(&vadd, args, CallConfig::default(), 2).map(|_| ())
            },
            TaskArgs::new(),
            CallConfig::default(),
        )?;
    }
    worker.free(&bias)?;

    let mut ok = true;
    for (k, out) in outs.iter().enumerate() {
        let got = out.read::<f32>(0, N)?;
        let extra = if k == 3 { 1.0 } else { 0.5 };
        ok &= got.iter().enumerate().all(|(i, v)| *v == i as f32 + extra);
    }
    worker.close()?;
    if !ok {
        eprintln!("FAILED: wrong sums");
        std::process::exit(1);
    }
    println!(
        "vector add on 4 chips (a group) and a device-resident bias on chip 2: all {N} x 4 elements correct"
    );
    Ok(())
}
