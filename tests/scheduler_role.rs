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

/// A build whose tasks all wait for others still runs them as it goes: the building thread
/// takes a scheduler pass after a PENDING submit once something completed. Task A (released by
/// the build) and G (released only at its end) block; B waits for A; the build then submits
/// readers of G's output, each PENDING, and B must run before the build ends. (Before, only
/// READY submits made passes: nothing noticed A's end until the build returned.)
#[isolated_test]
fn tasks_run_while_a_graph_of_waiting_tasks_is_still_being_built() {
    let (rig, [block, log, noop_h]) =
        Rig::start(subs(2), [("block", block_on_flag), ("log", log_append), ("noop", noop)]);
    let (flag_a, flag_g, scratch) = (u32_buffer(&rig, 2), u32_buffer(&rig, 2), u32_buffer(&rig, 8));
    let (x, y) = (u64_buffer(&rig, 4), u64_buffer(&rig, 4));
    let (xt, yt) = (u64s(&x, 0, 4), u64s(&y, 0, 4));
    let mut b_ran_during_build = false;
    rig.run(|orch| {
        let blocker =
            |orch: &mut simpler::Orchestrator<'_>, flag: &simpler::Buffer, out: &simpler::Tensor| {
                let mut a = TaskArgs::new();
                a.untracked(&words_of(flag))?.output(out)?.scalar(20_000).scalar(1);
                orch.submit_sub(&block, a).map(|_| ())
            };
        blocker(orch, &flag_a, &xt)?;
        blocker(orch, &flag_g, &yt)?;
        let mut b = TaskArgs::new();
        b.untracked(&words_of(&scratch))?.input(&xt)?.scalar(7);
        orch.submit_sub(&log, b)?;
        wait_blocked(&flag_a);
        wait_blocked(&flag_g);
        release(&flag_a);
        for _ in 0..1000 {
            let mut r = TaskArgs::new();
            r.input(&yt)?;
            orch.submit_sub(&noop_h, r)?;
            let logged = Instant::now() + Duration::from_millis(1);
            if spin_until(logged, || read_u32(&scratch, 1, 1)[0] == 1) {
                b_ran_during_build = true;
                break;
            }
        }
        release(&flag_g);
        Ok(())
    })
    .unwrap();
    assert!(b_ran_during_build, "B waited for the whole graph to be built, though A had ended");
    assert_eq!(read_u32(&scratch, 2, 1), [7], "B logged itself");
}
