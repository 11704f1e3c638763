//! Chained tasks: a task whose one unfinished producer runs on a SUB worker is handed to that
//! worker behind it, and the worker starts it itself once the producer succeeded (rule 5 of the
//! slot state machine, rule M13 of the mailbox). What a user relies on: the results are those
//! of the graph, a chained task behind a failure never runs and poisons its consumers, and one
//! whose run is cancelled or whose orchestration function fails does not start.

mod common;

use std::time::{Duration, Instant};

use common::*;
use simpler::{ErrorKind, HostArgs, HostResult, TaskArgs};

/// Spins for scalar 0 milliseconds, then writes `input + 1` to its output (tensor 1 from
/// tensor 0, both `u64`).
fn slow_inc(args: &HostArgs<'_>) -> HostResult {
    let until = Instant::now() + Duration::from_millis(args.scalar(0)?);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
    let x = args.input::<u64>(0)?[0];
    args.output::<u64>(1)?[0] = x + 1;
    Ok(())
}

/// Spins for scalar 0 milliseconds, then fails with `slow failure`.
fn slow_fail(args: &HostArgs<'_>) -> HostResult {
    let until = Instant::now() + Duration::from_millis(args.scalar(0)?);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
    Err("slow failure".into())
}

/// Counts the scheduler's `chain` and `chained task launched` events (trace level).
mod recorder {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tracing::field::{Field, Visit};
    use tracing::{Event, Metadata, Subscriber, span};

    #[derive(Clone, Default)]
    pub struct Chains {
        pub chained: Arc<AtomicUsize>,
        pub launched: Arc<AtomicUsize>,
    }

    struct Message(String);
    impl Visit for Message {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                self.0 = format!("{value:?}");
            }
        }
    }

    impl Chains {
        pub fn chained(&self) -> usize {
            self.chained.load(Ordering::SeqCst)
        }
        pub fn launched(&self) -> usize {
            self.launched.load(Ordering::SeqCst)
        }
    }

    impl Subscriber for Chains {
        fn enabled(&self, meta: &Metadata<'_>) -> bool {
            meta.target() == "simpler::scheduler"
        }
        fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
            span::Id::from_u64(1)
        }
        fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
        fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut m = Message(String::new());
            event.record(&mut m);
            match m.0.as_str() {
                "chain" => self.chained.fetch_add(1, Ordering::SeqCst),
                "chained task launched" => self.launched.fetch_add(1, Ordering::SeqCst),
                _ => 0,
            };
        }
        fn enter(&self, _: &span::Id) {}
        fn exit(&self, _: &span::Id) {}
    }

    /// Installs the counter for this process (each test runs in its own).
    pub fn install() -> Chains {
        let chains = Chains::default();
        tracing::subscriber::set_global_default(chains.clone())
            .expect("the first subscriber of this process");
        chains
    }
}

/// How long each chained task of a test runs: long enough for the scheduler to see it run.
const HOLD_MS: u64 = 40;

#[isolated_test]
fn each_task_behind_a_running_one_is_chained_and_the_results_are_the_graphs() {
    let chains = recorder::install();
    let (rig, [block, inc]) = Rig::start(subs(1), [("block_on_flag", block_on_flag), ("slow_inc", slow_inc)]);
    let flag = u32_buffer(&rig, 2);
    let out = u64_buffer(&rig, 5);
    let run = rig
        .submit(|orch| {
            // The blocker holds the worker until every task is submitted (and PENDING), so
            // each one is found waiting when the one before it starts.
            let mut b = TaskArgs::new();
            b.untracked(&words_of(&flag))?.output(&u64s(&out, 0, 1))?.scalar(10_000).scalar(10);
            orch.submit_sub(&block, b)?;
            for i in 1..5 {
                let mut a = TaskArgs::new();
                a.input(&u64s(&out, i - 1, 1))?.output(&u64s(&out, i, 1))?.scalar(HOLD_MS);
                orch.submit_sub(&inc, a)?;
            }
            Ok(())
        })
        .unwrap();
    wait_blocked(&flag);
    release(&flag);
    run.wait().expect("the run succeeds");
    assert_eq!(read_u64(&out, 0, 5), vec![10, 11, 12, 13, 14]);
    // Each `slow_inc` was chained behind the task before it, the first behind the blocker:
    // each was published, or found by the pass that saw the task before it start, while the
    // task before it ran.
    assert_eq!((chains.chained(), chains.launched()), (4, 4), "every task behind a running one was chained");
}

#[isolated_test]
fn a_chained_task_behind_a_failure_never_runs_and_its_consumers_are_poisoned() {
    let chains = recorder::install();
    let (rig, [fail, inc, fill]) =
        Rig::start(subs(1), [("slow_fail", slow_fail), ("slow_inc", slow_inc), ("fill", fill)]);
    let out = u64_buffer(&rig, 3);
    let run = rig
        .submit(|orch| {
            let mut f = TaskArgs::new();
            f.output(&u64s(&out, 0, 1))?.scalar(HOLD_MS);
            orch.submit_sub(&fail, f)?;
            for i in 1..3 {
                let mut a = TaskArgs::new();
                a.input(&u64s(&out, i - 1, 1))?.output(&u64s(&out, i, 1))?.scalar(1);
                orch.submit_sub(&inc, a)?;
            }
            Ok(())
        })
        .unwrap();
    let err = run.wait().expect_err("the run fails");
    assert_err(&err, ErrorKind::TaskFailed, &["slow_fail", "sub worker 0", "slow failure"]);
    assert_eq!(read_u64(&out, 0, 3), vec![0, 0, 0], "nothing behind the failure ran");
    let stats = run.stats().unwrap();
    assert_eq!((stats.tasks, stats.failed), (3, 3), "the failure, the chained task and its consumer");
    assert!(chains.chained() >= 1, "the task behind the failing one was chained");
    assert_eq!(chains.launched(), 0, "and never launched");
    // The worker runs later work, from a fresh sequence.
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.output(&u64s(&out, 0, 1))?.scalar(7);
        orch.submit_sub(&fill, a).map(|_| ())
    })
    .expect("a later run succeeds");
    assert_eq!(read_u64(&out, 0, 1), vec![7]);
}

#[isolated_test]
fn a_chained_task_of_a_cancelled_run_does_not_start() {
    let chains = recorder::install();
    let (rig, [inc]) = Rig::start(subs(1), [("slow_inc", slow_inc)]);
    let out = u64_buffer(&rig, 3);
    out.write(0, &[5u64]).unwrap();
    let run = rig
        .submit(|orch| {
            for i in 1..3 {
                let mut a = TaskArgs::new();
                a.input(&u64s(&out, i - 1, 1))?.output(&u64s(&out, i, 1))?.scalar(500);
                orch.submit_sub(&inc, a)?;
            }
            Ok(())
        })
        .unwrap();
    wait_for("the second task to be chained", Duration::from_secs(10), || chains.chained() == 1);
    // The running task ends in its grace; the chained one must not start.
    assert!(run.cancel_gracefully(Duration::from_secs(30)));
    let err = run.wait().expect_err("the run was cancelled");
    assert_err(&err, ErrorKind::Cancelled, &["cancelled gracefully"]);
    assert_eq!(read_u64(&out, 0, 3), vec![5, 6, 0], "the running task ended, the chained one never ran");
    // The task ahead succeeded, so the scheduler counts the chained one as started; the
    // worker, asked to withdraw it, gave it back unrun.
    assert_eq!(chains.launched(), 1);
    let stats = run.stats().unwrap();
    assert_eq!((stats.tasks, stats.failed), (2, 1));
}
