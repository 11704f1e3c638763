//! Chained tasks: a task whose one unfinished producer runs on a SUB worker is handed to that
//! worker behind it, and the worker starts it itself once the producer succeeded (rule 5 of the
//! slot state machine, rule M13 of the mailbox). What a user relies on: the results are those
//! of the graph, a chained task behind a failure never runs and poisons its consumers, and one
//! whose run is cancelled or whose orchestration function fails does not start. A task whose two
//! unfinished producers run on two SUB workers is chained behind one of them and starts once
//! the other succeeded too. A task whose producers are all on one worker may wait there two
//! deep, behind a chained task.

mod common;

use std::time::Duration;

use common::*;
use simpler::{ErrorKind, HostArgs, HostResult, TaskArgs};

/// Holds the worker for scalar 0 milliseconds without using its CPU (the scheduler needs it
/// to see the task run, on a machine with as few CPUs as workers).
fn hold(args: &HostArgs<'_>) -> std::result::Result<(), simpler::Error> {
    std::thread::sleep(Duration::from_millis(args.scalar(0)?));
    Ok(())
}

/// Holds for scalar 0 milliseconds, then writes `input + 1` to its output (tensor 1 from
/// tensor 0, both `u64`).
fn slow_inc(args: &HostArgs<'_>) -> HostResult {
    hold(args)?;
    let x = args.input::<u64>(0)?[0];
    args.output::<u64>(1)?[0] = x + 1;
    Ok(())
}

/// Holds for scalar 0 milliseconds, then fails with `slow failure`.
fn slow_fail(args: &HostArgs<'_>) -> HostResult {
    hold(args)?;
    Err("slow failure".into())
}

/// Holds for scalar 0 milliseconds, then writes `in0 + in1` (tensors 0 and 1, `u64`) to
/// tensor 2.
fn slow_add2(args: &HostArgs<'_>) -> HostResult {
    hold(args)?;
    add2(args)
}

/// Counts the scheduler's `chain`, `chained task launched` and `completion` events (trace
/// level), the chains behind one running task and after another (`also_after`), and those two
/// and three deep (`depth` 2 and 3: behind one or two chained tasks).
mod recorder {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tracing::field::{Field, Visit};
    use tracing::{Event, Metadata, Subscriber, span};

    #[derive(Clone, Default)]
    pub struct Chains {
        pub chained: Arc<AtomicUsize>,
        pub launched: Arc<AtomicUsize>,
        pub behind_two: Arc<AtomicUsize>,
        pub two_deep: Arc<AtomicUsize>,
        pub three_deep: Arc<AtomicUsize>,
        pub completed: Arc<AtomicUsize>,
    }

    /// An event's message, whether it has an `also_after` field, and its `depth`.
    struct Message(String, bool, u64);
    impl Visit for Message {
        fn record_u64(&mut self, field: &Field, value: u64) {
            match field.name() {
                "depth" => self.2 = value,
                "also_after" => self.1 = true,
                _ => {}
            }
        }
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            match field.name() {
                "message" => self.0 = format!("{value:?}"),
                "also_after" => self.1 = true,
                _ => {}
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
        pub fn behind_two(&self) -> usize {
            self.behind_two.load(Ordering::SeqCst)
        }
        pub fn two_deep(&self) -> usize {
            self.two_deep.load(Ordering::SeqCst)
        }
        pub fn three_deep(&self) -> usize {
            self.three_deep.load(Ordering::SeqCst)
        }
        /// Tasks whose end the scheduler has taken (succeeded or failed).
        pub fn completed(&self) -> usize {
            self.completed.load(Ordering::SeqCst)
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
            let mut m = Message(String::new(), false, 0);
            event.record(&mut m);
            if m.0 == "chain" && m.1 {
                self.behind_two.fetch_add(1, Ordering::SeqCst);
            }
            if m.0 == "chain" && m.2 >= 2 {
                self.two_deep.fetch_add(1, Ordering::SeqCst);
            }
            if m.0 == "chain" && m.2 >= 3 {
                self.three_deep.fetch_add(1, Ordering::SeqCst);
            }
            match m.0.as_str() {
                "chain" => self.chained.fetch_add(1, Ordering::SeqCst),
                "chained task launched" => self.launched.fetch_add(1, Ordering::SeqCst),
                "completion" => self.completed.fetch_add(1, Ordering::SeqCst),
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
    // Each `slow_inc` is chained behind the task before it (the first behind the blocker) when
    // a pass sees it waiting while that one runs; a 40 ms task leaves time for that, but a
    // starved scheduler may miss one, which then starts as usual.
    let (chained, launched) = (chains.chained(), chains.launched());
    assert!(chained >= 2, "the tasks behind a running one were chained ({chained} of 4)");
    assert_eq!(launched, chained, "each chained task launched behind its producer's success");
}

/// A chain on one worker over two alternating slots (as a Task Bench point with two output
/// generations): each task reads the slot the one before wrote and overwrites the slot the
/// one two before wrote, so its producers are the two tasks ahead of it, both on this worker,
/// and it may wait chained three deep (as many as the mailbox has frames for).
#[isolated_test]
fn a_chain_over_two_slots_waits_three_deep_and_the_results_are_the_graphs() {
    let chains = recorder::install();
    let (rig, [block, inc]) = Rig::start(subs(1), [("block_on_flag", block_on_flag), ("slow_inc", slow_inc)]);
    let flag = u32_buffer(&rig, 2);
    let slots = u64_buffer(&rig, 2);
    let run = rig
        .submit(|orch| {
            let mut b = TaskArgs::new();
            b.untracked(&words_of(&flag))?.output(&u64s(&slots, 0, 1))?.scalar(10_000).scalar(10);
            orch.submit_sub(&block, b)?;
            for t in 1..7 {
                let mut a = TaskArgs::new();
                a.input(&u64s(&slots, (t - 1) % 2, 1))?.output(&u64s(&slots, t % 2, 1))?.scalar(HOLD_MS);
                orch.submit_sub(&inc, a)?;
            }
            Ok(())
        })
        .unwrap();
    wait_blocked(&flag);
    wait_for("three tasks chained behind the blocker", Duration::from_secs(10), || chains.three_deep() >= 1);
    release(&flag);
    run.wait().expect("the run succeeds");
    assert_eq!(read_u64(&slots, 0, 2), vec![16, 15], "six increments from 10, alternating slots");
    let (chained, launched) = (chains.chained(), chains.launched());
    assert_eq!(launched, chained, "each chained task launched behind its producer's success");
}

/// The same chain with its second task failing: the tasks chained behind it, two deep, never
/// run, and nothing after the failure is written.
#[isolated_test]
fn behind_a_failure_a_two_deep_chain_never_runs() {
    let chains = recorder::install();
    let (rig, [block, inc, fail]) = Rig::start(
        subs(1),
        [("block_on_flag", block_on_flag), ("slow_inc", slow_inc), ("slow_fail", slow_fail)],
    );
    let flag = u32_buffer(&rig, 2);
    let slots = u64_buffer(&rig, 2);
    slots.write(0, &[0u64, 7]).unwrap();
    let run = rig
        .submit(|orch| {
            let mut b = TaskArgs::new();
            b.untracked(&words_of(&flag))?.output(&u64s(&slots, 0, 1))?.scalar(10_000).scalar(10);
            orch.submit_sub(&block, b)?;
            let mut f = TaskArgs::new();
            f.input(&u64s(&slots, 0, 1))?.output(&u64s(&slots, 1, 1))?.scalar(HOLD_MS);
            orch.submit_sub(&fail, f)?;
            for t in 2..5 {
                let mut a = TaskArgs::new();
                a.input(&u64s(&slots, (t - 1) % 2, 1))?.output(&u64s(&slots, t % 2, 1))?.scalar(1);
                orch.submit_sub(&inc, a)?;
            }
            Ok(())
        })
        .unwrap();
    wait_blocked(&flag);
    wait_for("two tasks chained behind the blocker", Duration::from_secs(10), || chains.two_deep() >= 1);
    release(&flag);
    let err = run.wait().expect_err("the run fails");
    assert_err(&err, ErrorKind::TaskFailed, &["slow_fail", "slow failure"]);
    assert_eq!(read_u64(&slots, 0, 2), vec![10, 7], "nothing behind the failure ran");
    let stats = run.stats().unwrap();
    assert_eq!((stats.tasks, stats.failed), (5, 4), "the failure and the three behind it");
    assert_eq!(chains.launched(), 1, "only the failing task launched (behind the blocker)");
}

#[isolated_test]
fn a_chained_task_behind_a_failure_never_runs_and_its_consumers_are_poisoned() {
    let chains = recorder::install();
    let (rig, [fail, inc, fill]) = Rig::start(
        subs(1),
        [("fail_once_released", fail_once_released), ("slow_inc", slow_inc), ("fill", fill)],
    );
    let flag = u32_buffer(&rig, 2);
    let out = u64_buffer(&rig, 3);
    let run = rig
        .submit(|orch| {
            // It fails once released, after the tasks behind it are submitted (and chained).
            let mut f = TaskArgs::new();
            f.untracked(&words_of(&flag))?.output(&u64s(&out, 0, 1))?.scalar(5);
            orch.submit_sub(&fail, f)?;
            for i in 1..3 {
                let mut a = TaskArgs::new();
                a.input(&u64s(&out, i - 1, 1))?.output(&u64s(&out, i, 1))?.scalar(1);
                orch.submit_sub(&inc, a)?;
            }
            Ok(())
        })
        .unwrap();
    wait_for("the task behind the failure to be chained", Duration::from_secs(10), || chains.chained() >= 1);
    release(&flag);
    let err = run.wait().expect_err("the run fails");
    assert_err(&err, ErrorKind::TaskFailed, &["fail_once_released", "sub worker 0", "boom 5"]);
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

/// Writes `in0 + in1` (tensors 0 and 1, `u64`) to tensor 2.
fn add2(args: &HostArgs<'_>) -> HostResult {
    let (a, b) = (args.input::<u64>(0)?[0], args.input::<u64>(1)?[0]);
    args.output::<u64>(2)?[0] = a + b;
    Ok(())
}

/// What [`two_consumers_of_a_slow_and_a_quick_producer`] saw.
struct Seen {
    result: simpler::Result<()>,
    /// The consumers' outputs.
    out: Vec<u64>,
    /// Tasks chained, and chained tasks launched.
    counts: (usize, usize),
    /// The run's tasks and failed tasks.
    stats: (u64, u64),
}

/// Two producers on two SUB workers, the second quick, and two consumers of both: each is
/// chained behind one producer and after the other while both run, or, once the quick one
/// ended, one is chained behind the slow one on its worker and the other is handed to the idle
/// worker, to start when it sees the slow one succeed.
fn two_consumers_of_a_slow_and_a_quick_producer(slow_fails: bool) -> Seen {
    let chains = recorder::install();
    let (rig, [block, fail, fill, add]) = Rig::start(
        subs(2),
        [
            ("block_on_flag", block_on_flag),
            ("fail_once_released", fail_once_released),
            ("fill", fill),
            ("add2", add2),
        ],
    );
    let flag = u32_buffer(&rig, 2);
    let x = u64_buffer(&rig, 3);
    let out = u64_buffer(&rig, 2);
    let run = rig
        .submit(|orch| {
            // The slow producer ends (writing 42, or failing) once released, when both
            // consumers are chained: were it to end before their submits, they would not be
            // chained (and a failure would refuse them: the run has failed).
            let mut slow = TaskArgs::new();
            slow.untracked(&words_of(&flag))?.output(&u64s(&x, 1, 1))?;
            if slow_fails {
                slow.scalar(7);
                orch.submit_sub(&fail, slow)?;
            } else {
                slow.scalar(10_000).scalar(42);
                orch.submit_sub(&block, slow)?;
            }
            let mut quick = TaskArgs::new();
            quick.output(&u64s(&x, 2, 1))?.scalar(100);
            orch.submit_sub(&fill, quick)?;
            for i in 0..2 {
                let mut c = TaskArgs::new();
                c.input(&u64s(&x, 1, 1))?.input(&u64s(&x, 2, 1))?.output(&u64s(&out, i, 1))?;
                orch.submit_sub(&add, c)?;
            }
            Ok(())
        })
        .unwrap();
    wait_for("both consumers to be chained", Duration::from_secs(10), || chains.chained() == 2);
    release(&flag);
    let result = run.wait();
    let stats = run.stats().unwrap();
    Seen {
        result,
        out: read_u64(&out, 0, 2),
        counts: (chains.chained(), chains.launched()),
        stats: (stats.tasks, stats.failed),
    }
}

#[isolated_test]
fn a_task_waiting_for_a_producer_on_another_worker_is_handed_to_an_idle_one_and_starts_there() {
    let Seen { result, out, counts, stats } = two_consumers_of_a_slow_and_a_quick_producer(false);
    result.expect("the run succeeds");
    assert_eq!(out, vec![142, 142], "both consumers saw both producers' outputs");
    assert_eq!(counts, (2, 2), "both consumers were chained, and both launched");
    assert_eq!(stats, (4, 0));
}

#[isolated_test]
fn a_task_handed_to_an_idle_worker_behind_a_failure_never_runs() {
    let Seen { result, out, counts, stats } = two_consumers_of_a_slow_and_a_quick_producer(true);
    let err = result.expect_err("the run fails");
    assert_err(&err, ErrorKind::TaskFailed, &["fail_once_released", "boom 7"]);
    assert_eq!(out, vec![0, 0], "neither consumer ran");
    assert_eq!(counts, (2, 0), "both were chained, neither launched");
    assert_eq!(stats, (4, 3), "the failure and its two consumers");
}

#[isolated_test]
fn a_worker_killed_under_a_task_that_others_are_chained_behind_fails_them_all_without_a_hang() {
    killed_while_chained(false);
}

#[isolated_test]
fn a_worker_killed_while_it_waits_for_another_workers_task_fails_only_its_own() {
    killed_while_chained(true);
}

/// A blocked task on one SUB worker, a quick one on the other, and two consumers of both:
/// once the quick one ended, one consumer is chained behind the blocked task and the other
/// waits for it on the other worker (chained behind the quick one and after the blocked one,
/// or handed to that worker once it was idle). Then the worker of the blocked task is killed
/// (`waiting` false: every consumer fails), or the waiting one (`waiting` true: the blocked
/// task is released, the consumer behind it runs, the other fails).
fn killed_while_chained(waiting: bool) {
    let chains = recorder::install();
    let (rig, [block, fill, add]) =
        Rig::start(subs(2), [("block_on_flag", block_on_flag), ("fill", fill), ("add2", add2)]);
    let flag = u32_buffer(&rig, 2);
    let x = u64_buffer(&rig, 2);
    let out = u64_buffer(&rig, 2);
    let run = rig
        .submit(|orch| {
            let mut b = TaskArgs::new();
            b.untracked(&words_of(&flag))?.output(&u64s(&x, 0, 1))?.scalar(30_000).scalar(1);
            orch.submit_sub(&block, b)?;
            let mut quick = TaskArgs::new();
            quick.output(&u64s(&x, 1, 1))?.scalar(2);
            orch.submit_sub(&fill, quick)?;
            for i in 0..2 {
                let mut c = TaskArgs::new();
                c.input(&u64s(&x, 0, 1))?.input(&u64s(&x, 1, 1))?.output(&u64s(&out, i, 1))?;
                orch.submit_sub(&add, c)?;
            }
            Ok(())
        })
        .unwrap();
    let pid = wait_blocked(&flag);
    // One consumer behind the blocked task on its worker, one on the other worker, which
    // finished the quick task.
    wait_for("both consumers to be chained and the quick task to end", Duration::from_secs(10), || {
        chains.chained() == 2 && run.progress().completed == 1
    });
    if waiting {
        let other = *rig.pids().iter().find(|&&p| p != pid).expect("the other worker");
        sigkill(other);
        release(&flag);
        let err = run.wait().expect_err("the run fails");
        assert_err(&err, ErrorKind::WorkerDied, &["add2", "died"]);
        let mut out = read_u64(&out, 0, 2);
        out.sort_unstable();
        assert_eq!(out, vec![0, 3], "the consumer on the living worker ran, the other did not");
        let stats = run.stats().unwrap();
        assert_eq!((stats.tasks, stats.failed), (4, 1));
    } else {
        sigkill(pid);
        let err = run.wait().expect_err("the run fails");
        assert_err(&err, ErrorKind::WorkerDied, &["block_on_flag", "died"]);
        assert_eq!(read_u64(&out, 0, 2), vec![0, 0], "neither consumer ran");
        assert_eq!(chains.launched(), 0);
        let stats = run.stats().unwrap();
        assert_eq!((stats.tasks, stats.failed), (4, 3));
    }
}

/// Two steps of two tasks on two SUB workers, each task of a step reading both outputs of the
/// step before (the stencil of a width-2 Task Bench run): a task whose two producers run is
/// chained behind one and after the other, and starts when both succeeded.
#[isolated_test]
fn a_task_whose_two_producers_run_on_two_workers_is_chained_behind_one_and_after_the_other() {
    let chains = recorder::install();
    let (rig, [inc, add]) = Rig::start(subs(2), [("slow_inc", slow_inc), ("slow_add2", slow_add2)]);
    const STEPS: usize = 4;
    // Step s of point x writes element 2 * s + x.
    let x = u64_buffer(&rig, 2 * STEPS);
    let seed = u64_buffer(&rig, 2);
    seed.write(0, &[10u64, 20]).unwrap();
    let run = rig
        .submit(|orch| {
            for p in 0..2 {
                let mut a = TaskArgs::new();
                a.input(&u64s(&seed, p, 1))?.output(&u64s(&x, p, 1))?.scalar(HOLD_MS);
                orch.submit_sub(&inc, a)?;
            }
            for s in 1..STEPS {
                for p in 0..2 {
                    let mut a = TaskArgs::new();
                    a.input(&u64s(&x, 2 * (s - 1), 1))?
                        .input(&u64s(&x, 2 * (s - 1) + 1, 1))?
                        .output(&u64s(&x, 2 * s + p, 1))?
                        .scalar(HOLD_MS);
                    orch.submit_sub(&add, a)?;
                }
            }
            Ok(())
        })
        .unwrap();
    run.wait().expect("the run succeeds");
    assert_eq!(read_u64(&x, 0, 2 * STEPS), vec![11, 21, 32, 32, 64, 64, 128, 128]);
    // Each task of steps 1.. is chained behind a task of the step before, after the other,
    // when a pass sees it waiting while both run; a starved scheduler may miss one.
    let (chained, launched, two) = (chains.chained(), chains.launched(), chains.behind_two());
    assert!(two >= 2, "tasks waiting for two running producers were chained behind one ({two} of 6)");
    assert_eq!(launched, chained, "each chained task launched once both its producers succeeded");
}

/// Two producers on two SUB workers, one of them failing, and two consumers of both, chained
/// behind one and after the other while both run: neither consumer runs, and each fails
/// poisoned, whichever producer ends first (`fail_first`: the failing one). Each producer
/// ends once the test releases it: the first, then, once the scheduler has taken its end, the
/// other; the failing one only after the consumers are submitted (a failure before that
/// would refuse their submits: the run has failed).
fn two_running_producers_one_failing(fail_first: bool) {
    let chains = recorder::install();
    let (rig, [ok_fn, fail, add]) = Rig::start(
        subs(2),
        [("block_on_flag", block_on_flag), ("fail_once_released", fail_once_released), ("add2", add2)],
    );
    let (ok_flag, fail_flag) = (u32_buffer(&rig, 2), u32_buffer(&rig, 2));
    let x = u64_buffer(&rig, 3);
    let out = u64_buffer(&rig, 2);
    let run = rig
        .submit(|orch| {
            let mut ok = TaskArgs::new();
            ok.untracked(&words_of(&ok_flag))?.output(&u64s(&x, 1, 1))?.scalar(10_000).scalar(1);
            orch.submit_sub(&ok_fn, ok)?;
            let mut f = TaskArgs::new();
            f.untracked(&words_of(&fail_flag))?.output(&u64s(&x, 2, 1))?.scalar(7);
            orch.submit_sub(&fail, f)?;
            for i in 0..2 {
                let mut c = TaskArgs::new();
                c.input(&u64s(&x, 1, 1))?.input(&u64s(&x, 2, 1))?.output(&u64s(&out, i, 1))?;
                orch.submit_sub(&add, c)?;
            }
            Ok(())
        })
        .unwrap();
    wait_for("a consumer chained behind one producer and after the other", Duration::from_secs(10), || {
        chains.behind_two() >= 1
    });
    let (first, last) = if fail_first { (&fail_flag, &ok_flag) } else { (&ok_flag, &fail_flag) };
    release(first);
    wait_for("the first producer's end to be taken", Duration::from_secs(10), || chains.completed() == 1);
    release(last);
    let err = run.wait().expect_err("the run fails");
    assert_err(&err, ErrorKind::TaskFailed, &["fail_once_released", "boom 7"]);
    assert_eq!(read_u64(&x, 1, 1), vec![1], "the producer that succeeded ran");
    assert_eq!(read_u64(&out, 0, 2), vec![0, 0], "neither consumer ran");
    assert!(chains.behind_two() >= 1, "a consumer was chained behind one producer and after the other");
    assert_eq!(chains.launched(), 0, "no chained task launched");
    let stats = run.stats().unwrap();
    assert_eq!((stats.tasks, stats.failed), (4, 3), "the failure and its two consumers");
}

#[isolated_test]
fn a_task_chained_behind_a_success_and_after_a_failure_that_ends_first_never_runs() {
    two_running_producers_one_failing(true);
}

#[isolated_test]
fn a_task_chained_behind_a_success_and_after_a_failure_that_ends_last_never_runs() {
    two_running_producers_one_failing(false);
}

/// A tree step on two SUB workers: both tasks of step t wait for point 0 of step t-1, and
/// point 0 also for point 1. The task waiting for point 0 alone goes behind it on its worker,
/// and the other behind point 1 on the other worker, after point 0: both are chained, not one.
#[isolated_test]
fn both_tasks_of_a_tree_step_are_chained_on_two_workers() {
    let chains = recorder::install();
    let (rig, [inc, add]) = Rig::start(subs(2), [("slow_inc", slow_inc), ("slow_add2", slow_add2)]);
    const STEPS: usize = 4;
    // Step s of point p writes element 2 * s + p.
    let x = u64_buffer(&rig, 2 * STEPS);
    let seed = u64_buffer(&rig, 2);
    seed.write(0, &[10u64, 20]).unwrap();
    let run = rig
        .submit(|orch| {
            for p in 0..2 {
                let mut a = TaskArgs::new();
                a.input(&u64s(&seed, p, 1))?.output(&u64s(&x, p, 1))?.scalar(HOLD_MS);
                orch.submit_sub(&inc, a)?;
            }
            for s in 1..STEPS {
                // Submitted first, so it comes first among point 0's consumers.
                let mut both = TaskArgs::new();
                both.input(&u64s(&x, 2 * (s - 1), 1))?
                    .input(&u64s(&x, 2 * (s - 1) + 1, 1))?
                    .output(&u64s(&x, 2 * s, 1))?
                    .scalar(HOLD_MS);
                orch.submit_sub(&add, both)?;
                let mut one = TaskArgs::new();
                one.input(&u64s(&x, 2 * (s - 1), 1))?.output(&u64s(&x, 2 * s + 1, 1))?.scalar(HOLD_MS);
                orch.submit_sub(&inc, one)?;
            }
            Ok(())
        })
        .unwrap();
    run.wait().expect("the run succeeds");
    assert_eq!(read_u64(&x, 0, 2 * STEPS), vec![11, 21, 32, 12, 44, 33, 77, 45]);
    // With one of them chained per step, 3 of the 6; a starved scheduler may miss one.
    let (chained, launched, two) = (chains.chained(), chains.launched(), chains.behind_two());
    assert!(chained >= 5, "both tasks of each step were chained ({chained} of 6)");
    assert!(two >= 2, "the task waiting for both points went behind point 1 ({two} of 3)");
    assert_eq!(launched, chained, "each chained task launched");
}

/// A consumer of a single task and of a SUB group, both running: a group member's end is not
/// the group's, so the consumer is never chained to wait for one member; it runs once the
/// single task and every member succeeded, and sees all their outputs.
#[isolated_test]
fn a_task_waiting_for_a_running_group_is_not_chained_after_one_member() {
    let (rig, [inc, add]) = Rig::start(subs(4), [("slow_inc", slow_inc), ("add2", add2)]);
    let x = u64_buffer(&rig, 6);
    x.write(0, &[1u64]).unwrap();
    let out = u64_buffer(&rig, 1);
    rig.run(|orch| {
        let mut single = TaskArgs::new();
        single.input(&u64s(&x, 0, 1))?.output(&u64s(&x, 1, 1))?.scalar(100);
        orch.submit_sub(&inc, single)?;
        // Member 0 ends before the single task, member 1 long after it.
        let members = [(2usize, 30u64), (3, 300)]
            .into_iter()
            .map(|(at, ms)| {
                let mut m = TaskArgs::new();
                m.input(&u64s(&x, 0, 1))?.output(&u64s(&x, at, 1))?.scalar(ms);
                Ok(m)
            })
            .collect::<simpler::Result<Vec<_>>>()?;
        orch.submit_sub_group(&inc, members)?;
        let mut c = TaskArgs::new();
        c.input(&u64s(&x, 1, 1))?.input(&u64s(&x, 3, 1))?.output(&u64s(&out, 0, 1))?;
        orch.submit_sub(&add, c)?;
        // An unrelated task whose end, while both members run, makes the scheduler look for
        // chains.
        let mut other = TaskArgs::new();
        other.input(&u64s(&x, 4, 1))?.output(&u64s(&x, 5, 1))?.scalar(10);
        orch.submit_sub(&inc, other).map(|_| ())
    })
    .expect("the run succeeds");
    assert_eq!(
        read_u64(&out, 0, 1),
        vec![4],
        "the consumer saw the single task's and the slow member's outputs"
    );
}
