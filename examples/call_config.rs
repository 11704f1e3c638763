//! Per-task `CallConfig`: the execution knobs of one chip task (scheduler threads, ring sizes,
//! diagnostics), set on a typed call with `.config(cfg)`, in a `task_graph!` line or in a
//! closure. The config travels with the task to the chip and is checked when the task is
//! submitted: a bad one is refused there, naming the field.
//!
//! Every knob (AICPU threads, ring sizes, diagnostics) matters only on real hardware: the
//! simulated chip checks it and sizes nothing by it, so results never depend on it. What the
//! callee sees: a kernel (`#[callable(chip)]`) and a host function do not receive the config. A chip
//! orchestration written with the plain API (`ChipFn::orchestration`) receives its task's
//! config; this example uses one to show each task's own config arriving on the chip. SUB tasks
//! carry no config: `.config(..)` on a call placed with `sub()` is dropped.
//!
//! Run it with `cargo run --example call_config`.

#![allow(clippy::print_stdout)] // An example talks to its user.

use std::process::ExitCode;

use simpler::prelude::*;
use simpler::{chip::CallConfig, chip::ChipFn, chip::RingSizes};

const N: u32 = 64;

/// Small rings: a 16-task window, 64 KiB of heap and 64 dependency entries per ring.
fn small_rings() -> CallConfig {
    CallConfig::new().rings(RingSizes {
        task_window: Some(16),
        heap_bytes: Some(64 << 10),
        dep_pool: Some(64),
    })
}

/// Large rings, and four scheduler threads.
fn large_rings() -> CallConfig {
    let large = RingSizes { task_window: Some(1024), heap_bytes: Some(16 << 20), dep_pool: Some(4096) };
    CallConfig::new().aicpu_threads(4).rings(large)
}

/// `y = a + b`
#[callable(chip)]
fn vadd(a: In<f32>, b: In<f32>, mut y: Out<f32>) {
    for i in 0..y.len() {
        y[i] = a[i] + b[i];
    }
}

/// `out[..] = v`
#[callable(chip)]
fn fill(mut out: Out<i32>, v: i32) {
    out.fill(v);
}

task_graph! {
    /// The same kernel twice, each task with its own config.
    fn per_task_env(a: In<f32>, b: In<f32>, y0: Out<f32>, y1: Out<f32>) {
        vadd(a, b, &mut y0).config(small_rings()).on(chip(0));
        vadd(a, b, &mut y1).config(large_rings()).on(chip(0));
    }
}

/// A chip orchestration receives its task's config: it writes its AICPU thread count (0 for the
/// default) to tensor 0.
fn report_threads(orch: &mut Orchestrator<'_>, args: &TaskArgs, cfg: &CallConfig) -> simpler::Result<()> {
    let mut out = TensorOf::<i32>::new(args.tensor(0).expect("one tensor").clone())?;
    let threads = cfg.get_aicpu_threads().unwrap_or(0) as i32;
    fill::call(&mut out, threads)?.on(orch, chip(0)).map(|_| ())
}

fn main() -> simpler::Result<ExitCode> {
    let mut worker = Worker::builder().chips(1).chip_memory(16 << 20).build()?;
    let report = worker.register_chip(ChipFn::orchestration("report_threads", report_threads))?;
    worker.init()?;
    let n = N as usize;
    let bufs: Vec<_> = (0..3).map(|_| worker.create_buffer(4 * n)).collect::<simpler::Result<_>>()?;
    bufs[0].write(0, &vec![1.5f32; n])?;
    let (a, mut y0, mut y1) = (bufs[0].typed::<f32>(&[N])?, bufs[1].typed(&[N])?, bufs[2].typed(&[N])?);

    // 1. Per-task configs in a graph: both tasks compute the same sums.
    per_task_env::call(&a, &a, &mut y0, &mut y1)?.run(&worker)?;
    let sums_ok = bufs[1..].iter().all(|b| b.read::<f32>(0, n).is_ok_and(|v| v.iter().all(|&s| s == 3.0)));

    // 2. Each task's config reaches the chip orchestration: three tasks, three thread counts.
    let threads: [i32; 3] = [0, 2, 4];
    let outs: Vec<_> = threads.iter().map(|_| worker.create_buffer(4)).collect::<simpler::Result<_>>()?;
    worker.run(|orch| {
        for (t, out) in threads.into_iter().zip(&outs) {
            let mut args = TaskArgs::new();
            args.output(&out.tensor(&[1], DataType::Int32)?)?;
            let cfg = small_rings().aicpu_threads(t as u32);
            orch.submit_next_level(&report, args, cfg, 0)?; // the plain API: a handle, a config
        }
        Ok(())
    })?;
    let seen = outs.iter().map(|b| b.read::<i32>(0, 1).map(|v| v[0])).collect::<simpler::Result<Vec<_>>>()?;
    println!("AICPU threads seen on the chip by three tasks: {seen:?}");

    // 3. A bad config is refused at submit, naming the field (1 scheduler thread is too few).
    let bad = CallConfig::new().aicpu_threads(1);
    let refused = worker.run(|orch| vadd::call(&a, &a, &mut y0)?.config(bad).on(orch, chip(0)).map(|_| ()));
    println!("a bad config: {}", refused.as_ref().map_or_else(|e| e.to_string(), |_| "accepted".into()));
    worker.close()?;

    let refused_ok = refused.is_err_and(|e| e.to_string().contains("aicpu_threads"));
    if !sums_ok || seen != threads || !refused_ok {
        eprintln!("FAILED: sums {sums_ok}, configs seen {seen:?} (want {threads:?}), refusal {refused_ok}");
        return Ok(ExitCode::FAILURE);
    }
    println!("result check: per-task configs ran, each reached its task, the bad one was refused");
    Ok(ExitCode::SUCCESS)
}
