//! Chip run pipelining, measured side by side in one process on a simulated chip.
//!
//! Each run copies 8 MiB of f32 into the chip (the host input), runs a kernel, and copies
//! 1 MiB back (the host output). The kernel does arithmetic in cache over one 4 KiB block in
//! eight of its input (`EVERY=1`: all of it), as a kernel on a real chip works from the chip's
//! own memory; its rounds are calibrated so that it takes about as long as the copy-in, both as
//! measured in the chip process from captured runs' timelines at depth 1 (the kernel's own
//! record; the copy-in as the time from handing the task over to the kernel's start with 8 MiB
//! in, less the same with 4 KiB in; medians over 48 runs each, as this machine's memory
//! bandwidth drifts by 2x from second to second). 16 such runs, each its own Worker run:
//!
//! - through an L3 `Worker` with one chip (a chip process), submitted back to back, with
//!   `pipeline_depth(1)` (each run's copy-in, kernel and copy-back before the next run's) and
//!   `pipeline_depth(2)` (the chip prepares run N+1, its copy-in into its own pipeline slot's
//!   staging buffer, while run N's kernel runs on the chip's executor thread, which then copies
//!   run N's output back while the copy-in goes on; it launches run N+1 once run N has
//!   finished). Execution stays one run at a time.
//! - through the chip runtime's lifecycle alone (prepare -> launch -> wait -> finalize, in this
//!   process, `bench_support::chip_pipeline`), the same runs at depth 1 and 2, and its device
//!   allocations.
//!
//! Figures:
//! - `chip_pipeline_speedup`: Worker wall time of the 16 runs at depth 1 over the same at depth
//!   2, the median over rounds of that ratio, each round measuring depth 1 and then depth 2
//!   back to back (so a drift of the machine's speed between rounds, which reaches 2x here,
//!   moves both sides of a ratio alike). Target at least 1.5x on two cores.
//! - `chip_pipeline_overlap_ceiling`: an 8 MiB copy beside the kernel on two threads, without
//!   `simpler`, over the two one after the other: what two threads of this machine overlap (an
//!   optimistic bound: its copy reads one source again and again, which stays in cache, where
//!   the runs' copy-ins read 16 inputs from memory).
//! - `chip_runtime_pipeline_speedup`: the same runs through the chip runtime alone (likewise).
//! - `chip_staging_allocs_per_run`: device allocations per run after the first two runs (the
//!   steady state: each slot's staging buffer has grown to what a run needs). Target 0.
//!
//! Environment: `ROUNDS` (default 15), `EVERY` (default 8), `PASSES` (the kernel's rounds,
//! instead of the calibration), `DEBUG_PIPE` (every round's wall times), `CAPTURE_PIPE` (each
//! run's timeline).

#![allow(clippy::print_stdout)]

mod common;

use std::time::Duration;

use common::{figure, target};
use simpler::bench_support::chip_pipeline;
use simpler::{DataType, HostArgs, HostResult, TaskArgs, Worker, chip::CallConfig, chip::ChipFn};

/// For each 1024-element block of the input (with `scalar 1` = `every` = k > 1: one block in
/// k, the others unread), `scalar 0` rounds of `x = 0.999 x + 0.5` over a copy of the block
/// (in the first-level cache, so the rounds are bound by arithmetic), summed into
/// `out[i % out.len()]`: a kernel whose duration scales with the blocks it reads and the
/// rounds (the pipeline benchmark's "kernel of comparable duration"). With `every` > 1 it
/// reads little of device memory, as a kernel on a real chip reads the chip's own memory and
/// not the host's, which a simulated chip shares with the next run's copy-in.
fn pipeline_kernel(args: &HostArgs<'_>) -> HostResult {
    let rounds = args.scalar(0)?;
    let every = args.scalar(1).unwrap_or(1).max(1) as usize;
    let input = args.input::<f32>(0)?;
    pipeline_compute(input, args.output::<f32>(1)?, rounds, every);
    Ok(())
}

/// What [`pipeline_kernel`] computes, on plain slices (the benchmark runs it beside a copy to
/// measure what two threads of this machine overlap at best).
fn pipeline_compute(input: &[f32], out: &mut [f32], rounds: u64, every: usize) {
    out.fill(0.0);
    let n = out.len();
    let mut block = [0.0f32; 1024];
    for (k, chunk) in input.chunks(block.len()).enumerate().step_by(every.max(1)) {
        let tmp = &mut block[..chunk.len()];
        tmp.copy_from_slice(chunk);
        for _ in 0..rounds {
            for v in tmp.iter_mut() {
                *v = *v * 0.999 + 0.5;
            }
        }
        let at = (k * 1024) % n;
        for (o, v) in out[at..].iter_mut().zip(tmp.iter()) {
            *o += *v;
        }
    }
}

/// Wall time of `RUNS` Worker runs at `depth` on one chip, each its own input and output;
/// checks every output. With `capture`, also each run's timeline.
fn worker_runs(
    depth: usize,
    passes: u64,
    input: usize,
    capture: bool,
) -> simpler::Result<(Duration, Vec<simpler::trace::Timeline>)> {
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
        let opts = if capture || std::env::var("CAPTURE_PIPE").is_ok() {
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
            let t = h.timeline().unwrap();
            let r = t.records()[0].clone();
            let k = t.inner_records().first().cloned();
            let us = |v: Option<u64>| v.map_or(-1.0, |v| (v as f64 - t0 as f64) / 1e3);
            println!(
                "depth {depth}: sub {:8.0} ready {:8.0} staged {:8.0} start {:8.0} kernel {:8.0}-{:8.0} end {:8.0}",
                us(Some(r.submitted_ns)),
                us(r.ready_ns),
                us(r.staged_ns),
                us(r.started_ns),
                us(k.as_ref().and_then(|k| k.started_ns)),
                us(k.as_ref().and_then(|k| k.ended_ns)),
                us(r.ended_ns)
            );
        }
    }
    let first = outputs[0].read::<f32>(0, n_out as usize)?;
    for o in &outputs {
        assert_eq!(o.read::<f32>(0, n_out as usize)?, first, "a run's output came back wrong");
    }
    let timelines = if capture { handles.iter().filter_map(|h| h.timeline()).collect() } else { Vec::new() };
    w.close()?;
    Ok((wall, timelines))
}

/// What the chip process spends per run at depth 1 with `passes` kernel rounds and `input`
/// bytes in, from the timelines of 3 x `RUNS` captured runs (medians over the runs): the
/// kernel's own time there, and the time from handing the task to the chip to the kernel's
/// start (the hand-over and the copy-in).
fn in_chip(passes: u64, input: usize) -> simpler::Result<(Duration, Duration)> {
    let (mut kernel, mut lead) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        for t in worker_runs(1, passes, input, true)?.1 {
            let (Some(task), Some(k)) = (t.records().first(), t.inner_records().first()) else {
                return Err(simpler::Error::new(
                    simpler::ErrorKind::Internal,
                    "a captured chip run has no kernel record",
                ));
            };
            let (Some(handed), Some(start), Some(end)) = (task.started_ns, k.started_ns, k.ended_ns) else {
                return Err(simpler::Error::new(
                    simpler::ErrorKind::Internal,
                    "a captured chip run's kernel never ran",
                ));
            };
            kernel.push(Duration::from_nanos(end.saturating_sub(start)));
            lead.push(Duration::from_nanos(start.saturating_sub(handed)));
        }
    }
    Ok((median(kernel), median(lead)))
}

const RUNS: usize = 16;
const INPUT: usize = 8 << 20;
const OUTPUT: usize = 1 << 20;
const ROUNDS: usize = 15;
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
    // Calibration, in the chip process at depth 1, from captured runs' timelines (per-run
    // medians, robust to this machine's run-to-run noise): what the 8 MiB copy-in takes there
    // (from hand-over to the kernel's start, less the same with 4 KiB in), and what the kernel
    // takes there; pick the rounds that make the kernel about as long as the copy-in.
    let (_, full) = in_chip(0, INPUT)?;
    let (_, small) = in_chip(0, 4096)?;
    let copy_in = full.saturating_sub(small).max(Duration::from_micros(50));
    // A first guess from the kernel's time on plain slices in this process (median of 5).
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
    // Then the kernel as it runs in the chip process, twice: the rounds scaled to match the
    // copy-in there.
    let scale = |passes: u64| -> simpler::Result<(u64, Duration)> {
        let (k, _) = in_chip(passes, INPUT)?;
        let k = k.max(Duration::from_micros(1));
        let scaled = (passes as f64 * copy_in.as_secs_f64() / k.as_secs_f64()).round().clamp(1.0, 4096.0);
        Ok((scaled as u64, k))
    };
    let (passes, chip_kernel) = scale(guess)?;
    let (passes, _) = scale(passes)?;
    let passes = std::env::var("PASSES").ok().and_then(|p| p.parse().ok()).unwrap_or(passes);
    let (chip_final, _) = in_chip(passes, INPUT)?;
    println!(
        "calibration: in the chip, hand-over to kernel start {:.2} ms (8 MiB in) and {:.2} ms (4 KiB in): the copy-in {:.2} ms; one kernel round {:.3} ms here -> {guess} rounds, {:.2} ms in the chip -> {passes} rounds, {:.2} ms in the chip",
        full.as_secs_f64() * 1e3,
        small.as_secs_f64() * 1e3,
        copy_in.as_secs_f64() * 1e3,
        round.as_secs_f64() * 1e3,
        chip_kernel.as_secs_f64() * 1e3,
        chip_final.as_secs_f64() * 1e3
    );

    let (mut serial, mut piped) = (Vec::new(), Vec::new());
    let (mut w_serial, mut w_piped) = (Vec::new(), Vec::new());
    let mut ceilings = Vec::new();
    let mut allocs = (0u64, 0usize, 0u64);
    for _ in 0..rounds() {
        ceilings.push(overlap_ceiling(passes));
        w_serial.push(worker_runs(1, passes, INPUT, false)?.0);
        w_piped.push(worker_runs(2, passes, INPUT, false)?.0);
        let s = chip_pipeline(pipeline_kernel, 1, RUNS, INPUT, OUTPUT, (passes, every()))?;
        let p = chip_pipeline(pipeline_kernel, 2, RUNS, INPUT, OUTPUT, (passes, every()))?;
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
    // The ratio of each round's two sides, measured back to back, then the median of those.
    let ratio = |a: &[Duration], b: &[Duration]| {
        let mut r: Vec<f64> = a.iter().zip(b).map(|(a, b)| a.as_secs_f64() / b.as_secs_f64()).collect();
        r.sort_by(f64::total_cmp);
        r[r.len() / 2]
    };
    let (speedup, runtime_speedup) = (ratio(&w_serial, &w_piped), ratio(&serial, &piped));
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
