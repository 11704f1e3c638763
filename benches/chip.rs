//! (g) Simulated chip tasks end to end through `Worker::run`, on an L3 Worker with one chip.
//!
//! - An empty chip kernel (no tensors), back to back after warm-up: `chip_task_p50_us`,
//!   `chip_task_p99_us`.
//! - A chip kernel with one 1 MiB Input host tensor and one 1 MiB Output host tensor that copies
//!   input to output: the chip copies 1 MiB into device scratch before the kernel and 1 MiB back
//!   after it. `chip_copy_gbps` is the 2 MiB moved over the copy task's median time less the
//!   empty task's median time (1 GB = 1e9 bytes). The net time also holds the kernel's own 1 MiB
//!   copy, so a chip that moved data as fast as `memcpy` would score 2/3 of `memcpy_gbps`.
//! - `memcpy_gbps`: a plain `copy_from_slice` of 1 MiB in the same process and run (median of
//!   many), for comparison.
//!
//! The empty and the copy tasks are measured in alternating blocks, so a slow patch of the
//! machine spreads over both.

#![allow(clippy::print_stdout)]

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use common::{bands, figure, last_cpu, percentile, placement, spread, target, us};
use simpler::{
    CallableHandle, DataType, HostArgs, HostResult, TaskArgs, Tensor, Worker, chip::CallConfig, chip::ChipFn,
};

/// Bytes of each host tensor of the copy task.
const MIB: usize = 1 << 20;
/// Warm-up runs of each task before any timing.
const WARMUP: usize = 200;
/// Timed runs of the empty task, in total.
const ITERATIONS: usize = 2_000;
/// Timed runs of the copy task, in total.
const COPY_ITERATIONS: usize = 1_000;
/// Blocks the timed runs are split into; blocks of the two tasks alternate.
const BLOCKS: usize = 10;
/// Untimed runs at the start of each block.
const BLOCK_WARMUP: usize = 10;
/// Timed `copy_from_slice` runs of 1 MiB.
const MEMCPY_ITERATIONS: usize = 2_000;

/// Provisional targets, printed for context only (no assertion).
const TASK_P50_TARGET_US: f64 = 20.0;
/// The copy figure should reach at least this share of `memcpy_gbps`.
const COPY_SHARE_TARGET: f64 = 0.25;

fn empty(_args: &HostArgs<'_>) -> HostResult {
    Ok(())
}

/// `out = x`, byte for byte.
fn copy(args: &HostArgs<'_>) -> HostResult {
    let (x, out) = (args.input::<u8>(0)?, args.output::<u8>(1)?);
    out.copy_from_slice(x);
    Ok(())
}

/// One run of the Worker: one chip task on chip 0 with `tensors` as its (input, output) pair.
fn one_task(
    worker: &Worker,
    f: &CallableHandle,
    tensors: Option<(&Tensor, &Tensor)>,
) -> simpler::Result<Duration> {
    let start = Instant::now();
    worker.run(|orch| {
        let mut args = TaskArgs::new();
        if let Some((input, output)) = tensors {
            args.input(input)?.output(output)?;
        }
        orch.submit_next_level(f, args, CallConfig::default(), 0).map(|_| ())
    })?;
    Ok(start.elapsed())
}

/// Median time of a 1 MiB `copy_from_slice`, in microseconds (both buffers touched first).
fn memcpy_p50_us() -> f64 {
    let src: Vec<u8> = (0..MIB).map(|i| i as u8).collect();
    let mut dst = vec![0u8; MIB];
    for _ in 0..WARMUP {
        dst.copy_from_slice(black_box(&src));
        black_box(&mut dst);
    }
    let mut times = Vec::with_capacity(MEMCPY_ITERATIONS);
    for _ in 0..MEMCPY_ITERATIONS {
        let start = Instant::now();
        dst.copy_from_slice(black_box(&src));
        black_box(&mut dst);
        times.push(us(start.elapsed()));
    }
    assert_eq!(dst, src, "memcpy result");
    spread("memcpy of 1 MiB", &mut times);
    percentile(&mut times, 50.0)
}

/// Median time, in microseconds, of the chip copy task's three copies done in this process
/// over four distinct 1 MiB buffers (host in -> scratch in -> scratch out -> host out): the same
/// memory footprint as the chip path, without a process or a thread in between.
fn three_memcpys_p50_us() -> f64 {
    let mut bufs: Vec<Vec<u8>> = (0..4).map(|k| (0..MIB).map(|i| (i + k) as u8).collect()).collect();
    let mut times = Vec::with_capacity(MEMCPY_ITERATIONS / 2);
    for n in 0..WARMUP + MEMCPY_ITERATIONS / 2 {
        let start = Instant::now();
        for k in 0..3 {
            let (a, b) = bufs.split_at_mut(k + 1);
            b[0].copy_from_slice(black_box(&a[k]));
            black_box(&mut b[0]);
        }
        if n >= WARMUP {
            times.push(us(start.elapsed()));
        }
    }
    spread("three memcpys of 1 MiB over four buffers", &mut times);
    percentile(&mut times, 50.0)
}

/// Gigabytes (1e9 bytes) per second of `bytes` moved in `time_us` microseconds.
fn gbps(bytes: usize, time_us: f64) -> f64 {
    bytes as f64 / (time_us * 1e-6) / 1e9
}

fn main() -> simpler::Result<()> {
    let mut worker = Worker::builder().chips(1).chip_memory(64 << 20).build()?;
    let e = worker.register_chip(ChipFn::kernel("empty", empty))?;
    let c = worker.register_chip(ChipFn::kernel("copy", copy))?;
    worker.init()?;
    let chip = worker.child_pids()[0].to_string();

    let src = worker.create_buffer(MIB)?;
    let dst = worker.create_buffer(MIB)?;
    let pattern: Vec<u8> = (0..MIB).map(|i| (i * 7 + 3) as u8).collect();
    src.write(0, &pattern)?;
    let (ts, td) = (src.tensor(&[MIB as u32], DataType::Uint8)?, dst.tensor(&[MIB as u32], DataType::Uint8)?);

    for _ in 0..WARMUP {
        one_task(&worker, &e, None)?;
        one_task(&worker, &c, Some((&ts, &td)))?;
    }
    assert_eq!(dst.read::<u8>(0, MIB)?, pattern, "the copy kernel's output came back to the host");

    let mut hot = Vec::with_capacity(ITERATIONS);
    let mut copies = Vec::with_capacity(COPY_ITERATIONS);
    let mut cpus = Vec::new();
    for block in 0..BLOCKS {
        for _ in 0..BLOCK_WARMUP {
            one_task(&worker, &e, None)?;
        }
        for _ in 0..ITERATIONS / BLOCKS {
            hot.push(us(one_task(&worker, &e, None)?));
        }
        if block == 0 {
            cpus = vec![("driver", last_cpu("thread-self")), ("chip", last_cpu(&chip))];
        }
        for _ in 0..BLOCK_WARMUP {
            one_task(&worker, &c, Some((&ts, &td)))?;
        }
        for _ in 0..COPY_ITERATIONS / BLOCKS {
            copies.push(us(one_task(&worker, &c, Some((&ts, &td)))?));
        }
    }
    worker.close()?;
    let memcpy_us = memcpy_p50_us();
    let three_us = three_memcpys_p50_us();

    spread("empty chip task, back to back", &mut hot);
    bands("  bands", &hot);
    placement("  placement", &cpus);
    spread("1 MiB in + 1 MiB out chip task, back to back", &mut copies);
    let p50 = percentile(&mut hot, 50.0);
    let p99 = percentile(&mut hot, 99.0);
    let copy_p50 = percentile(&mut copies, 50.0);
    let net_us = copy_p50 - p50;
    assert!(
        net_us > 0.0,
        "the 1 MiB copy task (p50 {copy_p50:.2} us) was not slower than the empty one (p50 {p50:.2} us): the machine was too noisy to measure"
    );
    let copy_gbps = gbps(2 * MIB, net_us);
    let memcpy = gbps(MIB, memcpy_us);
    println!(
        "chip_copy_gbps = 2 MiB / (copy task p50 {copy_p50:.2} us - empty task p50 {p50:.2} us = {net_us:.2} us); \
         over the whole copy task p50 it would be {:.3} GB/s (1 GB = 1e9 bytes)",
        gbps(2 * MIB, copy_p50)
    );
    println!(
        "memcpy_gbps = 1 MiB / memcpy p50 {memcpy_us:.2} us; the net copy time holds three 1 MiB copies \
         (in, kernel, out), so a chip as fast as memcpy would score {:.3} GB/s",
        memcpy * 2.0 / 3.0
    );
    println!(
        "reference: the same three copies in this process over four 1 MiB buffers take p50 {three_us:.2} us, \
         i.e. {:.3} GB/s for the 2 MiB moved",
        gbps(2 * MIB, three_us)
    );
    figure("chip_task_p50_us", p50, "us");
    figure("chip_task_p99_us", p99, "us");
    figure("chip_copy_gbps", copy_gbps, "GB/s");
    figure("memcpy_gbps", memcpy, "GB/s");
    println!(
        "targets (provisional, for context): chip_task_p50_us <= {TASK_P50_TARGET_US} us; \
         chip_copy_gbps >= {COPY_SHARE_TARGET} x memcpy_gbps"
    );
    target("chip_task_p50_us", p50, "<=", TASK_P50_TARGET_US, "us");
    let copy_target = (COPY_SHARE_TARGET * memcpy * 1000.0).round() / 1000.0;
    target("chip_copy_gbps", copy_gbps, ">=", copy_target, "GB/s");
    Ok(())
}
