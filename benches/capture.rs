//! The cost of capturing a run (its DAG and a record per task, `RunOptions::capture_dag`):
//! one empty SUB task through `Worker::run`, back to back, with capture off and on,
//! in pairs of runs back to back in one process, so both see the same machine. Also a run of 1000
//! empty SUB tasks each way.
//!
//! * `capture_overhead_ratio`: the median, over pairs of runs back to back (one with capture,
//!   one without), of the pair's ratio (target at most 1.1).
//! * `capture_off_p50_us`, `capture_on_p50_us`: the two medians; `capture_p50_ratio`, their
//!   ratio (noisier: each median moves with where the threads run).
//! * `capture_1000_tasks_ratio`: the same ratio for a run of 1000 independent empty tasks.

#![allow(clippy::print_stdout)]

mod common;

use std::time::Instant;

use common::{figure, percentile, target, us};
use simpler::{HostArgs, HostFn, HostResult, RunOptions, TaskArgs, Worker};

const WARMUP: usize = 300;
/// Pairs of one-task runs, one with capture and one without.
const PAIRS: usize = 2000;
const BIG_RUNS: usize = 10;
const BIG_TASKS: usize = 1000;

fn empty(_args: &HostArgs<'_>) -> HostResult {
    Ok(())
}

fn main() -> simpler::Result<()> {
    let mut worker = Worker::builder().sub_workers(1).build()?;
    let f = worker.register(HostFn::new("empty", empty))?;
    worker.init()?;
    // `run_with`, as a program that waits for each run does (the waiting thread drives it).
    let run = |capture: bool, tasks: usize| -> simpler::Result<f64> {
        let options = if capture { RunOptions::new().capture_dag() } else { RunOptions::new() };
        let t = Instant::now();
        worker.run_with(options, |orch, _, _| {
            for _ in 0..tasks {
                orch.submit_sub(&f, TaskArgs::new())?;
            }
            Ok(())
        })?;
        Ok(us(t.elapsed()))
    };
    // A captured run has its records (checked once, outside the timed runs).
    let handle = worker.submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
        orch.submit_sub(&f, TaskArgs::new()).map(|_| ())
    })?;
    handle.wait()?;
    if handle.timeline().map(|t| t.records().len()) != Some(1) {
        return Err(simpler::Error::new(
            simpler::ErrorKind::InvalidState,
            "a captured run without its records",
        ));
    }
    for i in 0..WARMUP {
        run(i % 2 == 0, 1)?;
    }
    // Pairs of runs back to back, one with capture and one without (alternating which goes
    // first): the two runs of a pair see the same placement of this thread and the SUB worker
    // on the CPUs, which decides a run's time more than capture does (on 2 vCPUs the p50 of
    // either set jumps between about 2 and 5 us as that placement changes).
    let (mut off, mut on, mut pair) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..PAIRS {
        let first = i % 2 == 0;
        let a = run(first, 1)?;
        let b = run(!first, 1)?;
        let (with, without) = if first { (a, b) } else { (b, a) };
        on.push(with);
        off.push(without);
        pair.push(with / without);
    }
    let (mut big_off, mut big_on) = (Vec::new(), Vec::new());
    for _ in 0..BIG_RUNS {
        big_off.push(run(false, BIG_TASKS)?);
        big_on.push(run(true, BIG_TASKS)?);
    }
    worker.close()?;
    let (p_off, p_on) = (percentile(&mut off, 50.0), percentile(&mut on, 50.0));
    let ratio = percentile(&mut pair, 50.0);
    figure("capture_off_p50_us", p_off, "us");
    figure("capture_on_p50_us", p_on, "us");
    figure("capture_p50_ratio", p_on / p_off, "x");
    figure("capture_overhead_ratio", ratio, "x");
    let big = percentile(&mut big_on, 50.0) / percentile(&mut big_off, 50.0);
    figure("capture_1000_tasks_ratio", big, "x");
    target("capture_overhead_ratio", ratio, "<=", 1.1, "x");
    Ok(())
}
