//! Helpers shared by the benchmark binaries (`mod common;` in each).
//!
//! Every figure is printed as one line, `figure <name> <value> <unit>`; anything else a benchmark
//! prints is for humans.

#![allow(dead_code)] // each benchmark binary uses its own subset

use std::time::{Duration, Instant};

use simpler::{CallableHandle, TaskArgs, Worker};

/// Prints one figure line.
pub fn figure(name: &str, value: f64, unit: &str) {
    println!("figure {name} {value:.3} {unit}");
}

/// Prints one human line comparing a figure with its target on this machine (no assertion).
pub fn target(name: &str, value: f64, op: &str, limit: f64, unit: &str) {
    let met = match op {
        "<=" => value <= limit,
        "<" => value < limit,
        ">=" => value >= limit,
        _ => value > limit,
    };
    let verdict = if met { "met" } else { "MISSED" };
    println!("target {name}: {value:.3} {unit} (target {op} {limit} {unit}): {verdict}");
}

/// Microseconds of a duration, as a float.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The `p`-th percentile (0..=100) of `values` by nearest rank; sorts `values`.
pub fn percentile(values: &mut [f64], p: f64) -> f64 {
    assert!(!values.is_empty(), "percentile of nothing");
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

/// Prints the spread of a set of microsecond samples as a human line.
pub fn spread(label: &str, values: &mut [f64]) {
    let (p10, p50) = (percentile(values, 10.0), percentile(values, 50.0));
    let (p90, p99) = (percentile(values, 90.0), percentile(values, 99.0));
    let (min, max) = (values[0], values[values.len() - 1]);
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    println!(
        "{label}: n={} min={min:.2} p10={p10:.2} p50={p50:.2} p90={p90:.2} p99={p99:.2} max={max:.2} mean={mean:.2} us",
        values.len()
    );
}

/// Prints how a set of microsecond samples splits into latency bands, as a human line: a
/// handoff between two spinning processes takes well under 5 us; one that waited out a spin and
/// yielded on a shared CPU, 5-30 us; one that had to wake a sleeping (halted) vCPU, more.
pub fn bands(label: &str, values: &[f64]) {
    let n = values.len() as f64;
    let share = |lo: f64, hi: f64| values.iter().filter(|&&v| v >= lo && v < hi).count() as f64 / n * 100.0;
    println!(
        "{label}: <5 us {:.0}%, 5-30 us {:.0}%, 30-200 us {:.0}%, >=200 us {:.1}%",
        share(0.0, 5.0),
        share(5.0, 30.0),
        share(30.0, 200.0),
        share(200.0, f64::INFINITY)
    );
}

/// The CPU a process (or, with `"thread-self"`, the calling thread) last ran on: field 39 of
/// `/proc/<pid>/stat`. `None` where `/proc` cannot tell.
pub fn last_cpu(pid: &str) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesized command name start at field 3 (state).
    stat.rsplit_once(')')?.1.split_whitespace().nth(36)?.parse().ok()
}

/// Where processes last ran, as a human line (field 39 of `/proc/<pid>/stat`).
pub fn placement(label: &str, who: &[(&str, Option<u32>)]) {
    let parts: Vec<String> = who
        .iter()
        .map(|(name, cpu)| match cpu {
            Some(c) => format!("{name} on cpu {c}"),
            None => format!("{name} on cpu ?"),
        })
        .collect();
    println!("{label}: {}", parts.join(", "));
}

/// One `Worker::run` whose orchestration submits one task of `f` (no arguments) to a SUB
/// worker; returns its wall time.
pub fn one_sub_task(worker: &Worker, f: &CallableHandle) -> simpler::Result<Duration> {
    let start = Instant::now();
    worker.run(|orch| orch.submit_sub(f, TaskArgs::new()).map(|_| ()))?;
    Ok(start.elapsed())
}
