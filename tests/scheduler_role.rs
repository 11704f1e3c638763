//! The scheduler role protocol (engine/mod.rs rules 1-4).

mod common;

use std::time::{Duration, Instant};

use common::*;
use simpler::TaskArgs;

/// A run submitted with `Worker::submit` and never waited on must be driven by the background
/// thread. While another thread is inside `Worker::run` (which announces a waiter for the whole
/// build), the background thread refuses the role, so the first run stalls until that build
/// returns; if the build waits for the first run, nothing ever drives it.
#[test]
fn a_submitted_run_progresses_while_another_thread_builds_inside_worker_run() {
    if !in_own_process() {
        return;
    }
    let (rig, [noop_h, block_h]) = Rig::start(subs(2), [("noop", noop), ("block", block_on_flag)]);
    let flag = u32_buffer(&rig, 2);
    let flag_t = words_of(&flag);
    // Run 1: a blocking task, then a dependent no-op.
    let h1 = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.untracked(&flag_t)?.scalar(20_000);
            let first = orch.submit_sub(&block_h, a)?;
            let mut b = TaskArgs::new();
            b.add_dep(first);
            orch.submit_sub(&noop_h, b)?;
            Ok(())
        })
        .unwrap();
    wait_blocked(&flag);

    // Another thread runs a second graph. Its orchestration function releases run 1's first
    // task and then gives run 1 five seconds to finish (it only needs the background thread).
    let finished_in_time = std::thread::scope(|s| {
        s.spawn(|| {
            let mut seen = false;
            rig.run(|_orch| {
                release(&flag);
                let deadline = Instant::now() + Duration::from_secs(5);
                while Instant::now() < deadline {
                    if h1.is_done() {
                        seen = true;
                        break;
                    }
                    std::thread::yield_now();
                }
                Ok(())
            })
            .unwrap();
            seen
        })
        .join()
        .unwrap()
    });
    h1.wait_timeout(Duration::from_secs(10)).unwrap();
    assert!(finished_in_time, "run 1 was not driven while another thread built inside Worker::run");
}
