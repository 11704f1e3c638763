//! Chip run pipelining, measured side by side in one process on a simulated chip.
//!
//! Each run copies 8 MiB of f32 into the chip (the host input), runs a kernel, and copies
//! 1 MiB back (the host output). The kernel does arithmetic in cache over one 4 KiB block in
//! eight of its input (`EVERY=1`: all of it), as a kernel on a real chip works from the chip's
//! own memory; its rounds are calibrated so that it takes about as long as the copy-in, as
//! measured through the Worker (what 8 MiB in adds to a run with a bare kernel, against 4 KiB
//! in). 16 such runs, each its own Worker run:
//!
//! - through an L3 `Worker` with one chip (a chip process), submitted back to back, with
//!   `pipeline_depth(1)` (each run's copy-in, kernel and copy-back before the next run's) and
//!   `pipeline_depth(2)` (the chip prepares run N+1, its copy-in into its own pipeline slot's
//!   staging buffer, while run N's kernel runs on the chip's executor thread, and launches it
//!   once run N has finished). Execution stays one run at a time.
//! - through the chip runtime's lifecycle alone (prepare -> launch -> wait -> finalize, in this
//!   process, `bench_support::chip_pipeline`), the same runs at depth 1 and 2, and its device
//!   allocations.
//!
//! Figures:
//! - `chip_pipeline_speedup`: Worker wall time of the 16 runs at depth 1 over the same at depth
//!   2 (medians of alternating rounds). Target at least 1.5x on two cores.
//! - `chip_pipeline_overlap_ceiling`: an 8 MiB copy beside the kernel on two threads, without
//!   `simpler`, over the two one after the other: what two threads of this machine overlap.
//! - `chip_runtime_pipeline_speedup`: the same runs through the chip runtime alone.
//! - `chip_staging_allocs_per_run`: device allocations per run after the first two runs (the
//!   steady state: each slot's staging buffer has grown to what a run needs). Target 0.
//!
//! Environment: `ROUNDS` (default 9), `EVERY` (default 8), `PASSES` (the kernel's rounds,
//! instead of the calibration), `DEBUG_PIPE` (every round's wall times), `CAPTURE_PIPE` (each
//! run's timeline).

#![allow(clippy::print_stdout)]

mod common;

use std::time::Duration;

use common::{figure, target};
use simpler::bench_support::{chip_pipeline, pipeline_compute, pipeline_kernel};
use simpler::{CallConfig, ChipFn, DataType, TaskArgs, Worker};

/// Wall time of `RUNS` Worker runs at `depth` on one chip, each its own input and output;
/// checks every output.
fn worker_runs(depth: usize, passes: u64, input: usize) -> simpler::Result<Duration> {
    let mut w = Worker::builder()
        .chips(1)
        .chip_cores(1)
        .chip_memory((4 * (input + OUTPUT) + (8 << 20)) as u64)
        .pipeline_depth(depth)
        // Runs are built ahead alike at both depths; only depth 2 prepares one on the chip.
        .pending_run_depth(4)
        .build()?;
    let k = w.register_chip(ChipFn::kernel("pipeline_kernel", pipeline_kernel))?;
    w.init()?;
    let (n_in, n_out) = ((input / 4) as u32, (OUTPUT / 4) as u32);
    let xs: Vec<f32> = (0..n_in).map(|i| (i % 7) as f32).collect();
    let mut inputs = Vec::with_capacity(RUNS);
    let mut outputs = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let i = w.create_buffer(input)?;
        i.write(0, &xs)?;
        let o = w.create_buffer(OUTPUT)?;
        o.write(0, &vec![-1.0f32; n_out as usize])?;
        inputs.push(i);
        outputs.push(o);
    }
    let submit = |i: &simpler::Buffer, o: &simpler::Buffer| -> simpler::Result<simpler::RunHandle> {
        let (ti, to) = (i.tensor(&[n_in], DataType::Float32)?, o.tensor(&[n_out], DataType::Float32)?);
        let k = k.clone();
        let opts = if std::env::var("CAPTURE_PIPE").is_ok() {
            simpler::RunOptions::new().capture_dag()
        } else {
            simpler::RunOptions::new()
        };
        w.submit_with(opts, move |orch, _, _| {
            let mut args = TaskArgs::new();
            args.input(&ti)?.output(&to)?.scalar(passes).scalar(every());
            orch.submit_next_level(&k, args, CallConfig::default(), 0).map(|_| ())
        })
    };
    // Warm-up: the measured pattern once (the chip maps every buffer and faults its pages in,
    // as for buffers a program reuses run after run, and both slots' staging buffers grow).
    let warm: Vec<_> =
        inputs.iter().zip(&outputs).map(|(i, o)| submit(i, o)).collect::<simpler::Result<_>>()?;
    for h in &warm {
        h.wait()?;
    }
    let start = std::time::Instant::now();
    let mut handles = Vec::with_capacity(RUNS);
    for (i, o) in inputs.iter().zip(&outputs) {
        handles.push(submit(i, o)?);
    }
    for h in &handles {
        h.wait()?;
    }
    let wall = start.elapsed();
    if std::env::var("CAPTURE_PIPE").is_ok() {
        let t0 = handles[0].timeline().unwrap().records()[0].submitted_ns;
        for h in &handles {
            let r = h.timeline().unwrap().records()[0].clone();
            let us = |v: Option<u64>| v.map_or(-1.0, |v| (v as f64 - t0 as f64) / 1e3);
            println!(
                "depth {depth}: sub {:8.0} ready {:8.0} staged {:8.0} start {:8.0} end {:8.0}",
                us(Some(r.submitted_ns)),
                us(r.ready_ns),
                us(r.staged_ns),
                us(r.started_ns),
                us(r.ended_ns)
            );
        }
    }
    let first = outputs[0].read::<f32>(0, n_out as usize)?;
    for o in &outputs {
        assert_eq!(o.read::<f32>(0, n_out as usize)?, first, "a run's output came back wrong");
    }
    w.close()?;
    Ok(wall)
}

const RUNS: usize = 16;
const INPUT: usize = 8 << 20;
const OUTPUT: usize = 1 << 20;
const ROUNDS: usize = 9;
fn rounds() -> usize {
    std::env::var("ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(ROUNDS)
}

/// The kernel reads one 4 KiB block in `every()` of its input (8 by default; `EVERY=1`: all of
/// it, streaming 8 MiB of host memory beside the next run's copy-in).
fn every() -> u64 {
    std::env::var("EVERY").ok().and_then(|v| v.parse().ok()).unwrap_or(8)
}

/// What two threads of this machine overlap at best: `RUNS` rounds of an 8 MiB copy then the
/// kernel on one thread, over the same with each copy on a second thread beside the kernel
/// (no `simpler` involved). The ceiling of `chip_pipeline_speedup` here.
fn overlap_ceiling(passes: u64) -> f64 {
    let src: Vec<f32> = (0..INPUT / 4).map(|i| (i % 7) as f32).collect();
    let mut dst = vec![0.0f32; INPUT / 4];
    let input = src.clone();
    let mut out = vec![0.0f32; OUTPUT / 4];
    let t = std::time::Instant::now();
    for _ in 0..RUNS {
        dst.copy_from_slice(&src);
        pipeline_compute(&input, &mut out, passes, every() as usize);
    }
    let serial = t.elapsed();
    let t = std::time::Instant::now();
    for _ in 0..RUNS {
        std::thread::scope(|s| {
            s.spawn(|| dst.copy_from_slice(&src));
            pipeline_compute(&input, &mut out, passes, every() as usize);
        });
    }
    let parallel = t.elapsed();
    std::hint::black_box((&dst, &out));
    serial.as_secs_f64() / parallel.as_secs_f64()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> simpler::Result<()> {
    // Calibration, through the Worker at depth 1 with a bare kernel: what the 8 MiB copy-in
    // adds to a run (a run with 8 MiB in, less one with 4 KiB in: the chip process's copy from
    // the host buffer into its staging buffer, as it happens there), and what one round of the
    // kernel takes; pick the rounds that make the kernel about as long as the copy-in.
    let per_run = |input: usize| -> simpler::Result<Duration> {
        let r = (0..3).map(|_| worker_runs(1, 0, input)).collect::<simpler::Result<Vec<_>>>()?;
        Ok(median(r) / RUNS as u32)
    };
    let (full, small) = (per_run(INPUT)?, per_run(4096)?);
    let copy_in = full.saturating_sub(small).max(Duration::from_micros(50));
    // The kernel's own time for `rounds`, on plain slices in this process (median of 5).
    let kernel_time = |rounds: u64| -> Duration {
        let input: Vec<f32> = (0..INPUT / 4).map(|i| (i % 7) as f32).collect();
        let mut out = vec![0.0f32; OUTPUT / 4];
        median(
            (0..5)
                .map(|_| {
                    let t = std::time::Instant::now();
                    pipeline_compute(&input, &mut out, rounds, every() as usize);
                    t.elapsed()
                })
                .collect(),
        )
    };
    let round = (kernel_time(64).saturating_sub(kernel_time(0)) / 64).max(Duration::from_micros(1));
    let guess = (copy_in.as_secs_f64() / round.as_secs_f64()).round().clamp(1.0, 4096.0) as u64;
    // Then the kernel as it runs in the chip process, at depth 1 (what those rounds add to a
    // run with a bare kernel), and the rounds scaled to match the copy-in there.
    let in_chip = |passes: u64| -> simpler::Result<Duration> {
        let r = (0..3).map(|_| worker_runs(1, passes, INPUT)).collect::<simpler::Result<Vec<_>>>()?;
        Ok((median(r) / RUNS as u32).saturating_sub(full).max(Duration::from_micros(1)))
    };
    let chip_kernel = in_chip(guess)?;
    let passes = ((guess as f64) * copy_in.as_secs_f64() / chip_kernel.as_secs_f64())
        .round()
        .clamp(1.0, 4096.0) as u64;
    let passes = std::env::var("PASSES").ok().and_then(|p| p.parse().ok()).unwrap_or(passes);
    let kernel = kernel_time(passes);
    println!(
        "calibration: a run with a bare kernel {:.2} ms (8 MiB in) and {:.2} ms (4 KiB in): the copy-in {:.2} ms; one kernel round {:.3} ms here -> {guess} rounds, {:.2} ms in the chip -> {passes} rounds, the kernel {:.2} ms here",
        full.as_secs_f64() * 1e3,
        small.as_secs_f64() * 1e3,
        copy_in.as_secs_f64() * 1e3,
        round.as_secs_f64() * 1e3,
        chip_kernel.as_secs_f64() * 1e3,
        kernel.as_secs_f64() * 1e3
    );

    let (mut serial, mut piped) = (Vec::new(), Vec::new());
    let (mut w_serial, mut w_piped) = (Vec::new(), Vec::new());
    let mut ceilings = Vec::new();
    let mut allocs = (0u64, 0usize, 0u64);
    for _ in 0..rounds() {
        ceilings.push(overlap_ceiling(passes));
        w_serial.push(worker_runs(1, passes, INPUT)?);
        w_piped.push(worker_runs(2, passes, INPUT)?);
        let s = chip_pipeline(1, RUNS, INPUT, OUTPUT, (passes, every()))?;
        let p = chip_pipeline(2, RUNS, INPUT, OUTPUT, (passes, every()))?;
        assert!(s.outputs_checked && p.outputs_checked, "a run's output came back wrong");
        serial.push(s.wall);
        piped.push(p.wall);
        allocs.0 += p.steady_allocations + s.steady_allocations;
        allocs.1 += p.steady_runs + s.steady_runs;
        allocs.2 = p.first_run_allocations;
    }
    if std::env::var("DEBUG_PIPE").is_ok() {
        println!("worker rounds: depth 1 {w_serial:?}, depth 2 {w_piped:?}");
    }
    let (ws, wp) = (median(w_serial), median(w_piped));
    let (s, p) = (median(serial), median(piped));
    println!(
        "{RUNS} Worker runs on one chip, 8 MiB in / 1 MiB out each: pipeline_depth 1 {:.1} ms, pipeline_depth 2 {:.1} ms (medians of {} rounds)",
        ws.as_secs_f64() * 1e3,
        wp.as_secs_f64() * 1e3,
        rounds(),
    );
    println!(
        "the same through the chip runtime alone: depth 1 {:.1} ms, depth 2 {:.1} ms; first run allocated {} device block(s)",
        s.as_secs_f64() * 1e3,
        p.as_secs_f64() * 1e3,
        allocs.2
    );
    let speedup = ws.as_secs_f64() / wp.as_secs_f64();
    let runtime_speedup = s.as_secs_f64() / p.as_secs_f64();
    let per_run = allocs.0 as f64 / allocs.1 as f64;
    ceilings.sort_by(f64::total_cmp);
    let ceiling = ceilings[ceilings.len() / 2];
    figure("chip_pipeline_speedup", speedup, "x");
    figure("chip_pipeline_overlap_ceiling", ceiling, "x");
    figure("chip_runtime_pipeline_speedup", runtime_speedup, "x");
    figure("chip_staging_allocs_per_run", per_run, "allocs");
    target("chip_pipeline_speedup", speedup, ">=", 1.5, "x");
    target("chip_staging_allocs_per_run", per_run, "<=", 0.0, "allocs");
    Ok(())
}
