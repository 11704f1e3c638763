//! Independent runs beside a hung one (issue 31): seven threads each run `RUNS` runs of two
//! chained SUB tasks on a buffer of their own (`Worker::run`), on a Worker with four SUB
//! workers admitting 8 runs; measured once with nothing else in the Worker and once while an
//! eighth run, the head of the run FIFO when the threads start, hangs in a task that never
//! returns (it holds one SUB worker and one pipeline lease until it is cancelled at the end). Each case gets a
//! Worker of its own, and the pair is measured `ROUNDS` times, alternating.
//!
//! The same on chips: three simulated chips, the hung run's kernel on chip 0, the threads'
//! two chained kernels on chip 1 or 2 (thread `t` on chip `1 + t % 2`, in both cases).
//!
//! Figures: `independent_runs_per_s` (free), `independent_runs_hung_per_s` (beside the hung
//! run) and `independent_runs_hung_ratio` (the second over the first, medians of the rounds;
//! target: at least 0.9, "the others' throughput must not drop"); the same with `chip_` after
//! `independent_` for the chips.

#![allow(clippy::print_stdout)]

mod common;

use std::time::Instant;

use common::{figure, percentile, target};
use simpler::chip::{CallConfig, ChipFn};
use simpler::memory::TensorView;
use simpler::{
    Buffer, CallableHandle, DataType, HostArgs, HostFn, HostResult, Orchestrator, TaskArgs, Tensor, Worker,
};

const THREADS: usize = 7;
const RUNS: usize = 2_000;
const ROUNDS: usize = 5;

/// `y = x * mul + add` over `u64` elements (tensor 0 in, tensor 1 out; scalars mul, add).
fn affine(args: &HostArgs<'_>) -> HostResult {
    let (mul, add) = (args.scalar(0)?, args.scalar(1)?);
    let x = args.input::<u64>(0)?;
    let y = args.output::<u64>(1)?;
    for (o, i) in y.iter_mut().zip(x) {
        *o = i.wrapping_mul(mul).wrapping_add(add);
    }
    Ok(())
}

/// Never returns; its run is cancelled at the end of the measurement, which stops its worker.
fn hang(_args: &HostArgs<'_>) -> HostResult {
    loop {
        std::thread::park();
    }
}

fn u64s(b: &Buffer, start: usize) -> simpler::Result<Tensor> {
    b.view(TensorView::new(8 * start as u64, &[1], None, DataType::Uint64)?)
}

/// Where the tasks run: SUB workers, or chips.
#[derive(Clone, Copy)]
enum On {
    Sub,
    Chips,
}

/// Submits `callable` with `args` where `on` says: a SUB worker, or chip `chip`.
fn submit(
    orch: &mut Orchestrator<'_>,
    on: On,
    callable: &CallableHandle,
    args: TaskArgs,
    chip: u32,
) -> simpler::Result<()> {
    match on {
        On::Sub => orch.submit_sub(callable, args).map(|_| ()),
        On::Chips => orch.submit_next_level(callable, args, CallConfig::default(), chip).map(|_| ()),
    }
}

/// Runs per second of `THREADS` threads each running `RUNS` runs, beside a hung run or not.
fn measure(on: On, hung: bool) -> simpler::Result<f64> {
    let (mut worker, affine, hang) = match on {
        On::Sub => {
            let mut w = Worker::builder().sub_workers(4).pending_run_depth(THREADS + 1).build()?;
            let (a, h) = (w.register(HostFn::new("affine", affine))?, w.register(HostFn::new("hang", hang))?);
            (w, a, h)
        }
        On::Chips => {
            let mut w = Worker::builder().chips(3).pending_run_depth(THREADS + 1).build()?;
            let a = w.register_chip(ChipFn::kernel("affine", affine))?;
            let h = w.register_chip(ChipFn::kernel("hang", hang))?;
            (w, a, h)
        }
    };
    worker.init()?;
    let bufs: Vec<Buffer> =
        (0..THREADS).map(|_| worker.create_buffer(3 * 8)).collect::<simpler::Result<_>>()?;
    let held = worker.create_buffer(8)?;
    let hung_run = if hung {
        Some(worker.submit(|orch| {
            let mut a = TaskArgs::new();
            a.output(&u64s(&held, 0)?)?;
            submit(orch, on, &hang, a, 0)
        })?)
    } else {
        None
    };
    let started = Instant::now();
    std::thread::scope(|s| {
        let handles: Vec<_> = bufs
            .iter()
            .enumerate()
            .map(|(t, buf)| {
                let (worker, affine) = (&worker, &affine);
                let chip = 1 + t as u32 % 2;
                s.spawn(move || -> simpler::Result<()> {
                    for r in 0..RUNS as u64 {
                        worker.run(|orch| {
                            let mut a = TaskArgs::new();
                            a.input(&u64s(buf, 0)?)?.output(&u64s(buf, 1)?)?.scalar(1).scalar(r);
                            submit(orch, on, affine, a, chip)?;
                            let mut b = TaskArgs::new();
                            b.input(&u64s(buf, 1)?)?.output(&u64s(buf, 2)?)?.scalar(2).scalar(0);
                            submit(orch, on, affine, b, chip)
                        })?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().expect("a submitting thread panicked"))
    })?;
    let per_s = (THREADS * RUNS) as f64 / started.elapsed().as_secs_f64();
    if let Some(run) = hung_run {
        assert!(!run.is_done(), "the hung run was still running when the others finished");
        run.cancel();
        assert!(run.wait().is_err(), "the hung run ends cancelled");
    }
    worker.close()?;
    Ok(per_s)
}

fn main() -> simpler::Result<()> {
    for (on, name) in [(On::Sub, "independent"), (On::Chips, "independent_chip")] {
        let (mut free, mut hung) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            free.push(measure(on, false)?);
            hung.push(measure(on, true)?);
            println!(
                "{name} round {round}: {:.0} runs/s free, {:.0} runs/s beside a hung run",
                free[round], hung[round]
            );
        }
        let (free, hung) = (percentile(&mut free, 50.0), percentile(&mut hung, 50.0));
        let ratio = hung / free;
        figure(&format!("{name}_runs_per_s"), free, "runs/s");
        figure(&format!("{name}_runs_hung_per_s"), hung, "runs/s");
        figure(&format!("{name}_runs_hung_ratio"), ratio, "x");
        target(&format!("{name}_runs_hung_ratio"), ratio, ">=", 0.9, "x");
    }
    Ok(())
}
