//! Per-task `CallConfig`: the execution knobs of one chip task (scheduler threads, ring sizes,
//! diagnostics), set on a typed call with `.config(cfg)`, in a `task_graph!` line or in a
//! closure. The config travels with the task to the chip and is checked when the task is
//! submitted: a bad one is refused there, naming the field.
//!
//! What the callee sees: a kernel (`#[callable(chip)]`) and a host function do not receive the
//! config, and the simulated chip sizes nothing by it, so results never depend on it. A chip
//! orchestration written with the plain API (`ChipFn::orchestration`) receives its task's
//! config; this example uses one to show each task's own config arriving on the chip. SUB tasks
//! carry no config: `.config(..)` on a call placed with `sub()` is dropped.
//!
//! Run it with `cargo run --example call_config`.

#![allow(clippy::print_stdout)] // An example talks to its user.

use std::process::ExitCode;

use simpler::{CallConfig, ChipFn, DataType, In, Orchestrator, Out, RuntimeEnv, TaskArgs, TensorOf, Worker};
use simpler::{callable, chip, task_graph};

const N: u32 = 64;

/// Small rings: a 16-task window, 64 KiB of heap and 64 dependency entries per ring.
const SMALL_RINGS: CallConfig = CallConfig {
    runtime_env: RuntimeEnv { ring_task_window: [16; 4], ring_heap: [64 << 10; 4], ring_dep_pool: [64; 4] },
    ..CallConfig::DEFAULT
};
/// Large rings, and four scheduler threads.
const LARGE_RINGS: CallConfig = CallConfig {
    aicpu_thread_num: 4,
    runtime_env: RuntimeEnv {
        ring_task_window: [1024; 4],
        ring_heap: [16 << 20; 4],
        ring_dep_pool: [4096; 4],
    },
    ..CallConfig::DEFAULT
};

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
        vadd(a, b, &mut y0).config(SMALL_RINGS).on(chip(0));
        vadd(a, b, &mut y1).config(LARGE_RINGS).on(chip(0));
    }
}

/// A chip orchestration receives its task's config: it writes `aicpu_thread_num` to tensor 0.
fn report_threads(orch: &mut Orchestrator<'_>, args: &TaskArgs, cfg: &CallConfig) -> simpler::Result<()> {
    let mut out = TensorOf::<i32>::new(args.tensor(0).expect("one tensor").clone())?;
    fill::call(&mut out, cfg.aicpu_thread_num)?.on(orch, chip(0)).map(|_| ())
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
    let threads = [0, 2, 4];
    let outs: Vec<_> = threads.iter().map(|_| worker.create_buffer(4)).collect::<simpler::Result<_>>()?;
    worker.run(
        |orch, _, _| {
            for (t, out) in threads.into_iter().zip(&outs) {
                let mut args = TaskArgs::new();
                args.output(&out.tensor(&[1], DataType::Int32)?)?;
                let cfg = CallConfig { aicpu_thread_num: t, ..SMALL_RINGS };
                orch.submit_next_level(&report, args, cfg, 0)?; // the plain API: a handle, a config
            }
            Ok(())
        },
        TaskArgs::new(),
        CallConfig::default(),
    )?;
    let seen = outs.iter().map(|b| b.read::<i32>(0, 1).map(|v| v[0])).collect::<simpler::Result<Vec<_>>>()?;
    println!("aicpu_thread_num seen on the chip by three tasks: {seen:?}");

    // 3. A bad config is refused at submit, naming the field (1 scheduler thread is too few).
    let bad = CallConfig { aicpu_thread_num: 1, ..CallConfig::DEFAULT };
    let refused = worker.run(
        |orch, _, _| vadd::call(&a, &a, &mut y0)?.config(bad).on(orch, chip(0)).map(|_| ()),
        TaskArgs::new(),
        CallConfig::default(),
    );
    println!("a bad config: {}", refused.as_ref().map_or_else(|e| e.to_string(), |_| "accepted".into()));
    worker.close()?;

    let refused_ok = refused.is_err_and(|e| e.to_string().contains("aicpu_thread_num"));
    if !sums_ok || seen != threads || !refused_ok {
        eprintln!("FAILED: sums {sums_ok}, configs seen {seen:?} (want {threads:?}), refusal {refused_ok}");
        return Ok(ExitCode::FAILURE);
    }
    println!("result check: per-task configs ran, each reached its task, the bad one was refused");
    Ok(ExitCode::SUCCESS)
}
