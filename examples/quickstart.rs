//! The main example: an L3 Worker with SUB workers runs a small DAG of host functions.
//!
//! Run it with `cargo run --example quickstart`.

#![allow(clippy::print_stdout)] // An example talks to its user.

use std::time::Instant;

use simpler::{CallConfig, DataType, HostArgs, HostFn, HostResult, TaskArgs, Worker};

const N: usize = 1024;

/// `out[i] = a[i] + b[i]`
fn add(args: &HostArgs<'_>) -> HostResult {
    let (a, b, out) = (args.input::<f32>(0)?, args.input::<f32>(1)?, args.output::<f32>(2)?);
    for i in 0..out.len() {
        out[i] = a[i] + b[i];
    }
    Ok(())
}

/// `x[i] *= k` in place.
fn scale(args: &HostArgs<'_>) -> HostResult {
    let k = args.scalar_f32(0)?;
    for v in args.output::<f32>(0)? {
        *v *= k;
    }
    Ok(())
}

fn main() -> simpler::Result<()> {
    let mut worker = Worker::builder().sub_workers(2).build()?;
    let add = worker.register(HostFn::new("add", add))?;
    let scale = worker.register(HostFn::new("scale", scale))?;
    worker.init()?;

    let a = worker.create_buffer(N * 4)?;
    let b = worker.create_buffer(N * 4)?;
    let out = worker.create_buffer(N * 4)?;
    let av: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let bv: Vec<f32> = (0..N).map(|i| 2.0 * i as f32).collect();
    a.write(0, &av)?;
    b.write(0, &bv)?;
    let (ta, tb, tout) = (
        a.tensor(&[N as u32], DataType::Float32)?,
        b.tensor(&[N as u32], DataType::Float32)?,
        out.tensor(&[N as u32], DataType::Float32)?,
    );

    let started = Instant::now();
    let run = worker.submit_captured(
        |orch, _args, _cfg| {
            // Two independent halves of a diamond: tmp1 = a + b, tmp2 = b + a (run in parallel),
            // then out = tmp1 + tmp2, then out *= 0.5.
            let tmp1 = orch.alloc(&[N as u32], DataType::Float32)?;
            let tmp2 = orch.alloc(&[N as u32], DataType::Float32)?;
            let mut x = TaskArgs::new();
            x.input(&ta)?.input(&tb)?.output(&tmp1)?;
            orch.submit_sub(&add, x)?;
            let mut y = TaskArgs::new();
            y.input(&tb)?.input(&ta)?.output(&tmp2)?;
            orch.submit_sub(&add, y)?;
            let mut z = TaskArgs::new();
            z.input(&tmp1)?.input(&tmp2)?.output(&tout)?;
            orch.submit_sub(&add, z)?;
            let mut w = TaskArgs::new();
            w.inout(&tout)?.scalar_f32(0.5);
            orch.submit_sub(&scale, w)?;
            Ok(())
        },
        TaskArgs::new(),
        CallConfig::default(),
    )?;
    run.wait()?;
    let elapsed = started.elapsed();

    let got = out.read::<f32>(0, N)?;
    let bad = got.iter().enumerate().filter(|&(i, v)| *v != av[i] + bv[i]).count();
    let dag = run.dag().expect("captured");
    println!("DAG of run {}:\n{}", run.id(), dag.to_dot());
    let stats = run.stats().expect("finished");
    println!(
        "{} tasks on {} SUB workers in {:?} (wall {:?})",
        stats.tasks,
        worker.sub_workers(),
        elapsed,
        stats.wall
    );
    worker.close()?;
    if bad != 0 {
        eprintln!("FAILED: {bad} of {N} elements are wrong");
        std::process::exit(1);
    }
    println!("result check: all {N} elements correct");
    Ok(())
}
