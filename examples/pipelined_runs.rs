//! Pipelined runs: while one run executes, the next one is already built; each `RunHandle` is
//! waited on separately, and a failing run does not affect the others.
//!
//! Run it with `cargo run --example pipelined_runs`.

#![allow(clippy::print_stdout)] // An example talks to its user.

use simpler::{CallConfig, DataType, HostArgs, HostFn, HostResult, TaskArgs, Worker};

/// `x[i] = x[i] * 2 + 1`, in place.
fn step(args: &HostArgs<'_>) -> HostResult {
    for v in args.output::<u64>(0)? {
        *v = *v * 2 + 1;
    }
    Ok(())
}

/// Fails on purpose when scalar 0 is 1.
fn maybe_fail(args: &HostArgs<'_>) -> HostResult {
    if args.scalar(0)? == 1 {
        return Err("asked to fail".into());
    }
    Ok(())
}

fn main() -> simpler::Result<()> {
    let mut worker = Worker::builder().sub_workers(2).pipeline_depth(2).build()?;
    let step = worker.register(HostFn::new("step", step))?;
    let maybe_fail = worker.register(HostFn::new("maybe_fail", maybe_fail))?;
    worker.init()?;

    let buffers: Vec<_> = (0..3).map(|_| worker.create_buffer(8 * 64)).collect::<Result<_, _>>()?;
    let tensors: Vec<_> =
        buffers.iter().map(|b| b.tensor(&[64], DataType::Uint64)).collect::<Result<_, _>>()?;

    // Three runs: each applies `step` four times (a chain through InOut), run 1 also fails on
    // purpose. The third submit waits until the first run is done (depth 2).
    let mut handles = Vec::new();
    for (r, t) in tensors.iter().enumerate() {
        let handle = worker.submit(
            |orch, _args, _cfg| {
                for _ in 0..4 {
                    let mut args = TaskArgs::new();
                    args.inout(t)?;
                    orch.submit_sub(&step, args)?;
                }
                let mut args = TaskArgs::new();
                args.scalar(r as u64);
                orch.submit_sub(&maybe_fail, args)?;
                Ok(())
            },
            TaskArgs::new(),
            CallConfig::default(),
        )?;
        handles.push(handle);
    }

    let mut ok = true;
    for (r, handle) in handles.iter().enumerate() {
        let result = handle.wait();
        let stats = handle.stats().expect("finished");
        println!(
            "run {} ({} tasks, {:?}): {:?}",
            handle.id(),
            stats.tasks,
            stats.wall,
            result.as_ref().map_err(|e| e.to_string())
        );
        ok &= result.is_ok() == (r != 1);
    }
    for b in &buffers {
        // 0 -> 1 -> 3 -> 7 -> 15 in every run, the failing one included (its chain ran first).
        ok &= b.read::<u64>(0, 64)?.iter().all(|&v| v == 15);
    }
    worker.close()?;
    if !ok {
        eprintln!("FAILED: unexpected results");
        std::process::exit(1);
    }
    println!("result check: all runs as expected");
    Ok(())
}
