//! (c) Marginal cost per task and fixed cost per run, over two SUB workers.
//!
//! Runs of n = 1, 2, 4, ..., 256 independent empty SUB tasks go through `Worker::run`; each size
//! is timed several times (median taken), and a least-squares line `time = fixed + n * marginal`
//! is fitted over the medians. Figures: `sub_marginal_us_per_task`, `sub_fixed_us_per_run`.

#![allow(clippy::print_stdout)]

mod common;

use std::time::{Duration, Instant};

use common::{figure, last_cpu, percentile, placement, target, us};
use simpler::{CallableHandle, HostArgs, HostFn, HostResult, TaskArgs, Worker};

const SIZES: [usize; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];
const REPS: usize = 21;
const WARMUP_RUNS: usize = 50;

fn empty(_args: &HostArgs<'_>) -> HostResult {
    Ok(())
}

fn run_of(worker: &Worker, f: &CallableHandle, n: usize) -> simpler::Result<Duration> {
    let start = Instant::now();
    worker.run(|orch| {
        for _ in 0..n {
            orch.submit_sub(f, TaskArgs::new())?;
        }
        Ok(())
    })?;
    Ok(start.elapsed())
}

/// Least squares `y = a + b x`; returns `(a, b)`.
fn fit(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let (sx, sy) = points.iter().fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x, sy + y));
    let (mx, my) = (sx / n, sy / n);
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    let b = sxy / sxx;
    (my - b * mx, b)
}

fn main() -> simpler::Result<()> {
    let mut worker = Worker::builder().sub_workers(2).build()?;
    let f = worker.register(HostFn::new("empty", empty))?;
    worker.init()?;

    for i in 0..WARMUP_RUNS {
        run_of(&worker, &f, SIZES[i % SIZES.len()])?;
    }
    // Interleave the sizes, so a slow patch of the machine spreads over all of them.
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(REPS); SIZES.len()];
    for _ in 0..REPS {
        for (k, &n) in SIZES.iter().enumerate() {
            samples[k].push(us(run_of(&worker, &f, n)?));
        }
    }
    let pids: Vec<String> = worker.child_pids().iter().map(i32::to_string).collect();
    let cpus =
        [("driver", last_cpu("thread-self")), ("sub 0", last_cpu(&pids[0])), ("sub 1", last_cpu(&pids[1]))];
    worker.close()?;

    placement("placement after the last run", &cpus);
    let mut points = Vec::with_capacity(SIZES.len());
    for (k, &n) in SIZES.iter().enumerate() {
        let median = percentile(&mut samples[k], 50.0);
        println!(
            "run of {n:>3} empty SUB tasks: median {median:>9.2} us ({:.2} us per task)",
            median / n as f64
        );
        points.push((n as f64, median));
    }
    let (fixed, marginal) = fit(&points);
    figure("sub_marginal_us_per_task", marginal, "us");
    figure("sub_fixed_us_per_run", fixed, "us");
    target("sub_marginal_us_per_task", marginal, "<=", 2.0, "us");
    target("sub_fixed_us_per_run", fixed, "<=", 20.0, "us");
    Ok(())
}
