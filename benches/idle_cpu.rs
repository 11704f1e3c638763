//! (e) CPU an idle Worker with two SUB workers burns over one second, all its processes together.
//!
//! init, one task to warm up, then utime + stime of this process (all its threads) and of every
//! child before and after one second of sleep (the measured interval). Figure:
//! `idle_cpu_percent` (percent of one core).

#![allow(clippy::print_stdout)]

mod common;

use std::time::{Duration, Instant};

use common::{figure, target};
use simpler::{HostArgs, HostFn, HostResult, TaskArgs, Worker};

fn empty(_args: &HostArgs<'_>) -> HostResult {
    Ok(())
}

/// utime + stime (fields 14 and 15 of `/proc/<pid>/stat`) in clock ticks.
fn cpu_ticks(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/<pid>/stat");
    // Fields after the parenthesized command name start at field 3 (state).
    let mut fields = stat.rsplit_once(')').expect("stat format").1.split_whitespace().skip(11);
    let utime: u64 = fields.next().and_then(|f| f.parse().ok()).expect("utime");
    let stime: u64 = fields.next().and_then(|f| f.parse().ok()).expect("stime");
    utime + stime
}

fn ticks_per_second() -> f64 {
    // sysconf is the only source of the tick rate; `getconf` is its command-line face.
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

fn main() -> simpler::Result<()> {
    let mut worker = Worker::builder().sub_workers(2).build()?;
    let f = worker.register(HostFn::new("empty", empty))?;
    worker.init()?;
    worker.run(|orch| {
        orch.submit_sub(&f, TaskArgs::new())?;
        orch.submit_sub(&f, TaskArgs::new()).map(|_| ())
    })?;
    let hz = ticks_per_second();
    let mut pids: Vec<String> = vec!["self".into()];
    pids.extend(worker.child_pids().iter().map(i32::to_string));

    let before: Vec<u64> = pids.iter().map(|p| cpu_ticks(p)).collect();
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let after: Vec<u64> = pids.iter().map(|p| cpu_ticks(p)).collect();
    let secs = start.elapsed().as_secs_f64();
    worker.close()?;

    let per: Vec<f64> = before.iter().zip(&after).map(|(b, a)| (a - b) as f64 / hz / secs * 100.0).collect();
    let total: f64 = per.iter().sum();
    println!(
        "idle Worker (2 SUB workers) over {secs:.3} s: parent {:.1}%, children {} (tick {:.0} ms)",
        per[0],
        per[1..].iter().map(|p| format!("{p:.1}%")).collect::<Vec<_>>().join(", "),
        1e3 / hz
    );
    figure("idle_cpu_percent", total, "%");
    target("idle_cpu_percent", total, "<", 5.0, "%");
    Ok(())
}
