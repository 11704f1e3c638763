//! (d) Orchestrator submit throughput on an in-process engine with no-op endpoints.
//!
//! Each task names two Input tensors and one Output tensor over buffers of its own; the endpoints
//! complete every task at once, so this measures the Orchestrator (validation, slot creation,
//! the TensorMap walk, publishing) and the scheduler passes a submit triggers, without any
//! process or thread. Figures: `submit_mtasks_per_s` (submit loop only) and
//! `submit_total_mtasks_per_s` (submit loop plus closing and draining the run).

#![allow(clippy::print_stdout)]

mod common;

use common::{figure, percentile, target};

const TASKS: usize = 20_000;
const SMALL_TASKS: usize = 1_000;
const LANES: u32 = 2;
const REPS: usize = 9;

fn main() -> simpler::Result<()> {
    // One untimed repetition first (page faults, allocator warm-up).
    simpler::bench_support::orchestrator_submit(TASKS, LANES, 1)?;
    let reps = simpler::bench_support::orchestrator_submit(TASKS, LANES, REPS)?;
    let mut submit: Vec<f64> = reps.iter().map(|r| r.tasks as f64 / r.submit.as_secs_f64() / 1e6).collect();
    let mut total: Vec<f64> = reps.iter().map(|r| r.tasks as f64 / r.total.as_secs_f64() / 1e6).collect();
    let per_submit_ns = 1e3 / percentile(&mut submit, 50.0);
    println!(
        "{TASKS} submits (2 in + 1 out, independent) x {REPS} runs: median {:.3} M/s submit loop ({per_submit_ns:.0} ns per submit), {:.3} M/s with drain; submit-loop range {:.3}..{:.3} M/s",
        percentile(&mut submit, 50.0),
        percentile(&mut total, 50.0),
        submit[0],
        submit[submit.len() - 1],
    );
    // The same on small runs, whose slots and TensorMap stay in cache.
    let mut small: Vec<f64> = simpler::bench_support::orchestrator_submit(SMALL_TASKS, LANES, 5 * REPS)?
        .iter()
        .map(|r| r.tasks as f64 / r.submit.as_secs_f64() / 1e6)
        .collect();
    println!(
        "{SMALL_TASKS} submits per run x {} runs: median {:.3} M/s submit loop",
        5 * REPS,
        percentile(&mut small, 50.0)
    );
    let sizes: Vec<String> =
        simpler::bench_support::type_sizes().iter().map(|(n, b)| format!("{n} {b} B")).collect();
    println!("sizes: {}", sizes.join(", "));
    // The headline figure is the 1000-task run (a graph of typical size); the 20 000-task flat
    // run, which keeps every slot live until it ends, is reported beside it.
    let m = percentile(&mut small, 50.0);
    figure("submit_mtasks_per_s", m, "Mtasks/s");
    figure("submit_20k_flat_mtasks_per_s", percentile(&mut submit, 50.0), "Mtasks/s");
    figure("submit_total_mtasks_per_s", percentile(&mut total, 50.0), "Mtasks/s");
    target("submit_mtasks_per_s", m, ">=", 2.0, "Mtasks/s");
    Ok(())
}
