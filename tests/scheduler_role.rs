//! The scheduler role protocol (engine/mod.rs rules 1-5).

mod common;

use std::time::{Duration, Instant};

use common::*;
use simpler::TaskArgs;

/// A run submitted with `Worker::submit` and never waited on must be driven by the background
/// thread. While another thread is inside `Worker::run` (which announces a waiter for the whole
/// build), the background thread refuses the role, so the first run stalls until that build
/// returns; if the build waits for the first run, nothing ever drives it.
#[isolated_test]
fn a_submitted_run_progresses_while_another_thread_builds_inside_worker_run() {
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

/// A lost wake-up (rule 4): the thread that waits on run 1 announces that it wants the
/// scheduler role, so the background thread gives it up and sleeps on its own bell; when the
/// waiter left (run 1 done) it did not wake the background thread again, and run 2, which nobody
/// waits on, stalled once its producer ended (SUB completions ring only the engine's doorbell)
/// until someone polled it. Run 2's consumers write results the test reads without driving the
/// scheduler. The window depends on timing (about 1-3% of tries on a many-core machine), so the
/// pattern repeats up to 1000 times within a time budget.
#[isolated_test]
fn a_run_nobody_waits_on_finishes_after_the_run_before_it_is_waited() {
    let (rig, [block_h, fill_h, affine_h]) =
        Rig::start(subs(1), [("block", block_on_flag), ("fill", fill), ("affine", affine)]);
    let flag = u32_buffer(&rig, 2);
    let flag_t = words_of(&flag);
    let x = u64_buffer(&rig, 1);
    let ys = u64_buffer(&rig, 2);
    let budget = Instant::now() + Duration::from_secs(20);
    let mut tries = 0u64;
    while tries < 1000 && Instant::now() < budget {
        tries += 1;
        flag.write(0, &[0u32, 0]).unwrap();
        ys.write(0, &[0u64, 0]).unwrap();
        // Run 1 holds the only SUB worker.
        let h1 = rig
            .submit(|orch| {
                let mut a = TaskArgs::new();
                a.untracked(&flag_t)?.scalar(20_000);
                orch.submit_sub(&block_h, a).map(|_| ())
            })
            .unwrap();
        wait_blocked(&flag);
        // Run 2, behind it: a producer and two consumers.
        let h2 = rig
            .submit(|orch| {
                let mut p = TaskArgs::new();
                p.output(&u64s(&x, 0, 1))?.scalar(tries);
                orch.submit_sub(&fill_h, p)?;
                for i in 0..2 {
                    let mut c = TaskArgs::new();
                    c.input(&u64s(&x, 0, 1))?;
                    c.output(&u64s(&ys, i, 1))?.scalar(1).scalar(1 + i as u64);
                    orch.submit_sub(&affine_h, c)?;
                }
                Ok(())
            })
            .unwrap();
        release(&flag);
        h1.wait_timeout(Duration::from_secs(10)).unwrap();
        // Nobody waits on run 2, and reading its outputs does not drive the scheduler.
        let want = [tries + 1, tries + 2];
        let finished = spin_until(Instant::now() + Duration::from_secs(2), || read_u64(&ys, 0, 2) == want);
        h2.wait_timeout(Duration::from_secs(10)).unwrap();
        assert!(finished, "try {tries}: run 2's consumers did not run until run 2 was waited on");
    }
}
