//! Chip run pipelining on the L2 lifecycle (prepare -> launch -> wait -> finalize), measured
//! side by side in one process on a simulated chip.
//!
//! Each run copies 8 MiB of f32 into the chip (the host input), runs a kernel that makes
//! passes over them for about as long as that copy-in takes (calibrated below), and copies
//! 1 MiB back (the host output). 16 such runs are driven through `ChipRuntime` (in this
//! process, through `bench_support::chip_pipeline`):
//!
//! - at depth 1, each run is prepared (copy-in), launched, waited for and finalized (copy-back)
//!   before the next is prepared;
//! - at depth 2, run N+1 is prepared (its copy-in, into its own pipeline slot's staging buffer)
//!   while run N's kernel runs on the chip's executor thread, and launched once run N is
//!   finalized. Execution stays one run at a time.
//!
//! Figures:
//! - `chip_pipeline_speedup`: wall time of the 16 runs at depth 1 over the same at depth 2
//!   (median of alternating rounds). Target at least 1.5x on two cores.
//! - `chip_staging_allocs_per_run`: device allocations per run after the first two runs (the
//!   steady state: each slot's staging buffer has grown to what a run needs). Target 0.
//!
//! This measures the chip runtime's lifecycle, not a whole Worker: an L3 chip child still runs
//! each task with the blocking composition (see ARCHITECTURE.md, "Chip run pipelining").

#![allow(clippy::print_stdout)]

mod common;

use std::time::Duration;

use common::{figure, target};
use simpler::bench_support::chip_pipeline;

const RUNS: usize = 16;
const INPUT: usize = 8 << 20;
const OUTPUT: usize = 1 << 20;
const ROUNDS: usize = 5;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> simpler::Result<()> {
    // Calibration: how long a prepare (the 8 MiB copy-in) takes, and how long one round of
    // the kernel adds to a run's execution; pick the rounds that make them about equal.
    let measure = |rounds: u64| -> simpler::Result<(Duration, Duration)> {
        let r = (0..3).map(|_| chip_pipeline(1, 8, INPUT, OUTPUT, rounds).map(|m| (m.prepare, m.execute)));
        let r = r.collect::<simpler::Result<Vec<_>>>()?;
        Ok((median(r.iter().map(|x| x.0).collect()), median(r.iter().map(|x| x.1).collect())))
    };
    let (prepare, bare) = measure(0)?;
    let (_, eight) = measure(8)?;
    let round = (eight.saturating_sub(bare) / 8).max(Duration::from_micros(20));
    let passes =
        (prepare.saturating_sub(bare).as_secs_f64() / round.as_secs_f64()).round().clamp(1.0, 256.0) as u64;
    let (_, kernel) = measure(passes)?;
    println!(
        "calibration: prepare (copy-in) {:.2} ms, one kernel round {:.3} ms -> {passes} rounds, execution {:.2} ms",
        prepare.as_secs_f64() * 1e3,
        round.as_secs_f64() * 1e3,
        kernel.as_secs_f64() * 1e3
    );

    let (mut serial, mut piped) = (Vec::new(), Vec::new());
    let mut allocs = (0u64, 0usize, 0u64);
    for _ in 0..ROUNDS {
        let s = chip_pipeline(1, RUNS, INPUT, OUTPUT, passes)?;
        let p = chip_pipeline(2, RUNS, INPUT, OUTPUT, passes)?;
        assert!(s.outputs_checked && p.outputs_checked, "a run's output came back wrong");
        serial.push(s.wall);
        piped.push(p.wall);
        allocs.0 += p.steady_allocations + s.steady_allocations;
        allocs.1 += p.steady_runs + s.steady_runs;
        allocs.2 = p.first_run_allocations;
    }
    let (s, p) = (median(serial), median(piped));
    println!(
        "{RUNS} runs, 8 MiB in / 1 MiB out each: depth 1 {:.1} ms, depth 2 {:.1} ms (medians of {ROUNDS} rounds); first run allocated {} device block(s)",
        s.as_secs_f64() * 1e3,
        p.as_secs_f64() * 1e3,
        allocs.2
    );
    let speedup = s.as_secs_f64() / p.as_secs_f64();
    let per_run = allocs.0 as f64 / allocs.1 as f64;
    figure("chip_pipeline_speedup", speedup, "x");
    figure("chip_staging_allocs_per_run", per_run, "allocs");
    target("chip_pipeline_speedup", speedup, ">=", 1.5, "x");
    target("chip_staging_allocs_per_run", per_run, "<=", 0.0, "allocs");
    Ok(())
}
