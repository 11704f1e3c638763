//! (b) One empty SUB task end to end through `Worker::run`, on a Worker with one SUB worker.
//!
//! Back to back (the caller submits the next run as soon as the last returns) and after an idle
//! pause (1 ms of sleep before each run, outside the timed region, so every process of the tree
//! has gone to sleep in the kernel). Figures: `sub_task_p50_us`, `sub_task_p99_us`,
//! `sub_task_after_idle_p50_us`.

#![allow(clippy::print_stdout)]

mod common;

use std::time::Duration;

use common::{bands, figure, last_cpu, one_sub_task, percentile, placement, spread, target, us};
use simpler::{HostArgs, HostFn, HostResult, Worker};

const WARMUP: usize = 200;
const ITERATIONS: usize = 2_000;
const IDLE_ITERATIONS: usize = 300;
const PAUSE: Duration = Duration::from_millis(1);

fn empty(_args: &HostArgs<'_>) -> HostResult {
    Ok(())
}

fn main() -> simpler::Result<()> {
    let mut worker = Worker::builder().sub_workers(1).build()?;
    let f = worker.register(HostFn::new("empty", empty))?;
    worker.init()?;
    let child = worker.child_pids()[0].to_string();

    for _ in 0..WARMUP {
        one_sub_task(&worker, &f)?;
    }
    let mut hot = Vec::with_capacity(ITERATIONS);
    for _ in 0..ITERATIONS {
        hot.push(us(one_sub_task(&worker, &f)?));
    }
    let cpus = [("driver", last_cpu("thread-self")), ("sub worker", last_cpu(&child))];
    let mut idle = Vec::with_capacity(IDLE_ITERATIONS);
    for _ in 0..IDLE_ITERATIONS {
        std::thread::sleep(PAUSE);
        idle.push(us(one_sub_task(&worker, &f)?));
    }
    worker.close()?;

    spread("empty SUB task, back to back", &mut hot);
    bands("  bands", &hot);
    placement("  placement", &cpus);
    spread("empty SUB task, after a 1 ms pause", &mut idle);
    let p50 = percentile(&mut hot, 50.0);
    let p99 = percentile(&mut hot, 99.0);
    let idle50 = percentile(&mut idle, 50.0);
    figure("sub_task_p50_us", p50, "us");
    figure("sub_task_p99_us", p99, "us");
    figure("sub_task_after_idle_p50_us", idle50, "us");
    target("sub_task_p50_us", p50, "<=", 10.0, "us");
    target("sub_task_after_idle_p50_us", idle50, "<=", 50.0, "us");
    Ok(())
}
