//! Failures: a failing or panicking host function poisons its consumers only, a dead worker
//! process is reported as such, and the Worker stays usable afterwards.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use common::*;
use simpler::{ErrorKind, TaskArgs};

#[isolated_test]
fn failing_task_poisons_its_consumers_only() {
    let (rig, [block, fail, affine, fill]) = Rig::start(
        subs(2),
        [("block_on_flag", block_on_flag), ("fail_fn", fail), ("affine", affine), ("fill", fill)],
    );
    let flag = u32_buffer(&rig, 2);
    let t = u64_buffer(&rig, 1);
    let marks = u64_buffer(&rig, 3);
    let run = rig
        .submit(|orch| {
            // The gate keeps the failure back until every task is submitted, so the
            // consumers are waiting (PENDING) when their producer fails.
            let mut g = TaskArgs::new();
            g.untracked(&words_of(&flag))?.scalar(10_000);
            let gate = orch.submit_sub(&block, g)?;
            let mut f = TaskArgs::new();
            f.output(&u64s(&t, 0, 1))?.scalar(42).add_dep_wait(gate);
            orch.submit_sub(&fail, f)?;
            let mut c1 = TaskArgs::new(); // consumer of the failure
            c1.input(&u64s(&t, 0, 1))?.output(&u64s(&marks, 0, 1))?.scalar(1).scalar(1);
            orch.submit_sub(&affine, c1)?;
            let mut c2 = TaskArgs::new(); // consumer of the consumer
            c2.input(&u64s(&marks, 0, 1))?.output(&u64s(&marks, 1, 1))?.scalar(1).scalar(1);
            orch.submit_sub(&affine, c2)?;
            let mut ind = TaskArgs::new(); // independent
            ind.output(&u64s(&marks, 2, 1))?.scalar(5).add_dep_wait(gate);
            orch.submit_sub(&fill, ind)?;
            Ok(())
        })
        .unwrap();
    release(&flag);
    let err = run.wait().expect_err("the run fails");
    assert_err(&err, ErrorKind::TaskFailed, &["fail_fn", "sub worker", "boom 42"]);
    assert_eq!(read_u64(&marks, 0, 3), vec![0, 0, 5], "consumers never ran; independent work did");
    let stats = run.stats().unwrap();
    assert_eq!((stats.tasks, stats.failed), (5, 3), "the failure and its two consumers");
    assert_eq!(run.wait().unwrap_err().message(), err.message(), "waiting again gives the same error");

    // The Worker stays usable.
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.output(&u64s(&marks, 0, 1))?.scalar(11);
        orch.submit_sub(&fill, a).map(|_| ())
    })
    .expect("a later run succeeds");
    assert_eq!(read_u64(&marks, 0, 1), vec![11]);
}

#[isolated_test]
fn submit_into_a_failed_run_is_refused() {
    let (rig, [fail, noop]) = Rig::start(subs(1), [("fail_fn", fail), ("noop", noop)]);
    let mut refused = None;
    let err = rig
        .run(|orch| {
            let mut a = TaskArgs::new();
            a.scalar(1);
            orch.submit_sub(&fail, a)?;
            // The engine runs the task while this function keeps submitting.
            wait_for("a submit to be refused", Duration::from_secs(10), || {
                match orch.submit_sub(&noop, TaskArgs::new()) {
                    Ok(_) => false,
                    Err(e) => {
                        refused = Some(e);
                        true
                    }
                }
            });
            Ok(())
        })
        .expect_err("the run failed");
    assert_err(&err, ErrorKind::TaskFailed, &["fail_fn", "boom 1"]);
    let refused = refused.unwrap();
    assert_err(&refused, ErrorKind::TaskFailed, &["noop", "refused", "already failed", "boom 1"]);
}

#[isolated_test]
fn a_refused_submit_passed_on_fails_nothing_more_and_submit_returns_the_run() {
    let (rig, [block, fail, fill, noop]) = Rig::start(
        subs(2),
        [("block_on_flag", block_on_flag), ("fail_fn", fail), ("fill", fill), ("noop", noop)],
    );
    let flag = u32_buffer(&rig, 2);
    let marks = u64_buffer(&rig, 1);
    let mut submitted = 0;
    let run = rig
        .submit(|orch| {
            // An independent task that cannot start before the failure: behind a gate on one
            // worker while the other runs the failing task.
            let mut g = TaskArgs::new();
            g.untracked(&words_of(&flag))?.scalar(10_000);
            let gate = orch.submit_sub(&block, g)?;
            let mut ind = TaskArgs::new();
            ind.output(&u64s(&marks, 0, 1))?.scalar(5).add_dep_wait(gate);
            orch.submit_sub(&fill, ind)?;
            let mut f = TaskArgs::new();
            f.scalar(3);
            orch.submit_sub(&fail, f)?;
            // Submits until one is refused, and passes its error on as `?` does.
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                orch.submit_sub(&noop, TaskArgs::new())?;
                submitted += 1;
            }
            panic!("no submit was refused within 10 s of the failure");
        })
        .expect("the refusal passed on is the run's error, not the function's: submit returns the run");
    release(&flag);
    let err = run.wait().expect_err("the run failed");
    assert_err(&err, ErrorKind::TaskFailed, &["fail_fn", "boom 3"]);
    assert!(!err.message().contains("refused"), "waiting gives the run's first error: {err}");
    assert_eq!(read_u64(&marks, 0, 1), vec![5], "the independent task, unstarted at the refusal, ran");
    let stats = run.stats().unwrap();
    assert_eq!((stats.tasks, stats.failed), (3 + submitted, 1), "only the failure failed");

    // `run` gives the run's first error too.
    let err = rig
        .run(|orch| {
            let mut f = TaskArgs::new();
            f.scalar(4);
            orch.submit_sub(&fail, f)?;
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                orch.submit_sub(&noop, TaskArgs::new())?;
            }
            panic!("no submit was refused within 10 s of the failure");
        })
        .expect_err("the run failed");
    assert_err(&err, ErrorKind::TaskFailed, &["fail_fn", "boom 4"]);
    assert!(!err.message().contains("refused"), "{err}");
}

#[isolated_test]
fn panicking_task_fails_the_run_with_the_panic_message() {
    let (rig, [panics, fill]) = Rig::start(subs(1), [("panics", panics), ("fill", fill)]);
    let out = u64_buffer(&rig, 1);
    let err = rig
        .run(|orch| {
            let mut a = TaskArgs::new();
            a.scalar(7);
            orch.submit_sub(&panics, a).map(|_| ())
        })
        .expect_err("the task panicked");
    assert_err(&err, ErrorKind::TaskFailed, &["panics", "sub worker 0", "panicked", "kaboom 7"]);
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.output(&u64s(&out, 0, 1))?.scalar(3);
        orch.submit_sub(&fill, a).map(|_| ())
    })
    .expect("the worker that caught the panic runs the next task");
    assert_eq!(read_u64(&out, 0, 1), vec![3]);
}

#[isolated_test]
fn failing_orchestration_function_cancels_unstarted_tasks() {
    let (rig, [exclusive, fill]) = Rig::start(subs(1), [("exclusive", exclusive), ("fill", fill)]);
    let scratch = u32_buffer(&rig, 2);
    let out = u64_buffer(&rig, 2);
    let err = rig
        .submit(|orch| {
            // A running task (it holds for 500 ms) and one waiting for it.
            let mut g = TaskArgs::new();
            g.untracked(&words_of(&scratch))?.scalar(500_000);
            let gate = orch.submit_sub(&exclusive, g)?;
            let mut a = TaskArgs::new();
            a.output(&u64s(&out, 0, 1))?.scalar(1).add_dep_wait(gate);
            orch.submit_sub(&fill, a)?;
            wait_for("the gate to start", Duration::from_secs(10), || read_u32(&scratch, 0, 1)[0] == 1);
            Err(simpler::Error::new(ErrorKind::InvalidArgument, "orchestration gave up"))
        })
        .expect_err("the orchestration function failed");
    assert_err(&err, ErrorKind::InvalidArgument, &["orchestration gave up"]);
    assert_eq!(read_u32(&scratch, 0, 2), vec![0, 1], "the started task ran to its end");
    assert_eq!(read_u64(&out, 0, 1), vec![0], "the task that had not started was cancelled");

    // A panicking orchestration function: the panic reaches the caller, the Worker survives.
    let caught = catch_unwind(AssertUnwindSafe(|| rig.run(|_| panic!("orchestration panicked"))));
    let payload = caught.expect_err("the panic propagates");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"orchestration panicked"));
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.output(&u64s(&out, 1, 1))?.scalar(2);
        orch.submit_sub(&fill, a).map(|_| ())
    })
    .expect("the Worker is usable after both");
    assert_eq!(read_u64(&out, 1, 1), vec![2]);
}

/// Starts a blocking task, SIGKILLs the process running it, and checks the run's error.
/// Returns the index of the killed SUB worker.
fn kill_the_worker_running_a_task(rig: &Rig, block: &simpler::CallableHandle) -> usize {
    let flag = u32_buffer(rig, 2);
    let run = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.untracked(&words_of(&flag))?.scalar(30_000);
            orch.submit_sub(block, a).map(|_| ())
        })
        .unwrap();
    let pid = wait_blocked(&flag);
    let index = rig.pids().iter().position(|&p| p == pid).expect("the task runs in one of our children");
    sigkill(pid);
    let err = run.wait().expect_err("the worker died under the task");
    assert_err(
        &err,
        ErrorKind::WorkerDied,
        &[
            "block_on_flag",
            &format!("sub worker {index}"),
            &format!("process {pid}"),
            "died",
            "signal 9",
            "SIGKILL",
        ],
    );
    index
}

#[isolated_test]
fn sigkilled_worker_fails_its_run_and_the_survivor_keeps_working() {
    let (rig, [block, record]) =
        Rig::start(subs(2), [("block_on_flag", block_on_flag), ("record_worker", record_worker)]);
    let dead = kill_the_worker_running_a_task(&rig, &block);
    let who = u32_buffer(&rig, 8);
    who.write(0, &[u32::MAX; 8]).unwrap();
    rig.run(|orch| {
        for i in 0..8u64 {
            let slot =
                who.view(simpler::memory::TensorView::new(4 * i, &[1], None, simpler::DataType::Uint32)?)?;
            let mut a = TaskArgs::new();
            a.output(&slot)?;
            orch.submit_sub(&record, a)?;
        }
        Ok(())
    })
    .expect("later work runs on the surviving SUB worker");
    let survivor = 1 - dead as u32;
    assert_eq!(read_u32(&who, 0, 8), vec![survivor; 8]);
    rig.close().expect("close completes after a worker died");
}

#[isolated_test]
fn with_its_only_sub_worker_dead_later_sub_work_fails_clearly() {
    let (rig, [block, noop]) = Rig::start(subs(1), [("block_on_flag", block_on_flag), ("noop", noop)]);
    kill_the_worker_running_a_task(&rig, &block);
    let err = rig
        .run(|orch| orch.submit_sub(&noop, TaskArgs::new()).map(|_| ()))
        .expect_err("no SUB worker is alive");
    assert_err(&err, ErrorKind::WorkerDied, &["noop", "cannot run", "0 are alive"]);
    rig.close().expect("close completes");
}

#[isolated_test]
fn sigkill_during_a_group_fails_the_group_and_shrinks_the_pool() {
    let (rig, [block, noop, record]) = Rig::start(
        subs(2),
        [("block_on_flag", block_on_flag), ("noop", noop), ("record_worker", record_worker)],
    );
    let flags = [u32_buffer(&rig, 2), u32_buffer(&rig, 2)];
    let done = u64_buffer(&rig, 2);
    let run = rig
        .submit(|orch| {
            let members = (0..2)
                .map(|i| {
                    let mut a = TaskArgs::new();
                    a.untracked(&words_of(&flags[i]))?.output(&u64s(&done, i, 1))?;
                    a.scalar(10_000).scalar(1);
                    Ok(a)
                })
                .collect::<simpler::Result<Vec<_>>>()?;
            orch.submit_sub_group(&block, members).map(|_| ())
        })
        .unwrap();
    let victim = wait_blocked(&flags[0]);
    let survivor = wait_blocked(&flags[1]);
    assert_ne!(victim, survivor, "members run in distinct processes");
    sigkill(victim);
    release(&flags[1]);
    let err = run.wait().expect_err("a member's worker died");
    assert_err(&err, ErrorKind::WorkerDied, &["block_on_flag", "died", "SIGKILL"]);
    assert_eq!(read_u64(&done, 0, 2), vec![0, 1], "the surviving member ran to its end");

    let err = rig
        .run(|orch| orch.submit_sub_group(&noop, vec![TaskArgs::new(), TaskArgs::new()]).map(|_| ()))
        .expect_err("a group of two needs two live workers");
    assert_err(&err, ErrorKind::WorkerDied, &["noop", "needs 2 SUB workers", "only 1 are alive"]);

    let who = u32_buffer(&rig, 1);
    who.write(0, &[u32::MAX]).unwrap();
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.output(&words_of(&who))?;
        orch.submit_sub(&record, a).map(|_| ())
    })
    .expect("single tasks still run on the survivor");
    let survivor_index = rig.pids().iter().position(|&p| p == survivor).unwrap() as u32;
    assert_eq!(read_u32(&who, 0, 1), vec![survivor_index]);
    rig.close().expect("close completes");
}

#[isolated_test]
fn explicit_dependents_of_a_failed_task_never_run() {
    let (rig, [block, fail, log_fn]) =
        Rig::start(subs(2), [("block_on_flag", block_on_flag), ("fail_fn", fail), ("log", log_append)]);
    let flag = u32_buffer(&rig, 2);
    let log = u32_buffer(&rig, 8);
    let run = rig
        .submit(|orch| {
            let mut g = TaskArgs::new();
            g.untracked(&words_of(&flag))?.scalar(10_000);
            let gate = orch.submit_sub(&block, g)?;
            let mut f = TaskArgs::new();
            f.scalar(9).add_dep_wait(gate);
            let failed = orch.submit_sub(&fail, f)?;
            for (id, retain) in [(1u64, true), (2, false)] {
                let mut a = TaskArgs::new();
                a.untracked(&words_of(&log))?.scalar(id);
                if retain {
                    a.add_dep(failed);
                } else {
                    a.add_dep_wait(failed);
                }
                orch.submit_sub(&log_fn, a)?;
            }
            let mut a = TaskArgs::new(); // depends on the gate only
            a.untracked(&words_of(&log))?.scalar(3).add_dep_wait(gate);
            orch.submit_sub(&log_fn, a)?;
            Ok(())
        })
        .unwrap();
    release(&flag);
    let err = run.wait().expect_err("the run fails");
    assert_err(&err, ErrorKind::TaskFailed, &["fail_fn", "boom 9"]);
    // The log holds [arrivals, length, ids...]: only task 3, which did not depend on the
    // failure, appended.
    assert_eq!(read_u32(&log, 1, 2), vec![1, 3]);
    assert_eq!(run.stats().unwrap().failed, 3);
}
