//! (a) Bare mailbox ping-pong between two processes: the floor under every SUB task.
//!
//! A forked child serves empty task frames (`post_task_at` / `task_request` / `finish_task` /
//! `take_task_result_at`, what the SUB endpoint and child loop call), both sides waiting with the mailbox's own doorbell wait (spin a few
//! microseconds, yield, then futex). Figure: `pingpong_p50_us` (back to back). Also printed for
//! humans: the same after a 1 ms pause before each round trip (every process asleep), and where
//! the two processes ran.

#![allow(clippy::print_stdout)]

mod common;

use std::time::Duration;

use common::{bands, figure, last_cpu, percentile, placement, spread, us};
use simpler::bench_support::mailbox_pingpong;

const WARMUP: usize = 1_000;
const ITERATIONS: usize = 20_000;
const IDLE_ITERATIONS: usize = 300;
const PAUSE: Duration = Duration::from_millis(1);

fn main() -> simpler::Result<()> {
    // Forks (one child per measurement, reaped before the next), while this process has no other
    // thread.
    // Where the two processes ran, read while both still run.
    let cpus = |child: i32| (last_cpu("thread-self"), last_cpu(&child.to_string()));
    let hot = mailbox_pingpong(WARMUP, ITERATIONS, Duration::ZERO, cpus)?;
    let idle = mailbox_pingpong(10, IDLE_ITERATIONS, PAUSE, |_| ())?;

    let mut v: Vec<f64> = hot.times.iter().copied().map(us).collect();
    spread("mailbox round trip, back to back", &mut v);
    bands("  bands", &v);
    placement("  placement", &[("parent", hot.after.0), ("child", hot.after.1)]);
    let mut w: Vec<f64> = idle.times.iter().copied().map(us).collect();
    spread("mailbox round trip, after a 1 ms pause", &mut w);
    figure("pingpong_p50_us", percentile(&mut v, 50.0), "us");
    Ok(())
}
