//! Panics (rule 5 of the scheduler role): a panic anywhere in the engine fails the runs it hit,
//! never the role or a waiter's wait.

use super::*;

/// Who drives the runs of a panic test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driver {
    /// The test waits on each run (`RunHandle::wait_timeout`: it takes the role).
    Waiter,
    /// The background thread; the test only watches.
    Background,
}

/// Waits for `run` the way `driver` says; fails the test if it does not end in time.
fn settle_run(rig: &Rig, run: &Arc<RunState>, driver: Driver) -> Result<()> {
    match driver {
        Driver::Waiter => {
            let h = RunHandle::new(run.clone(), &rig.eng);
            let r = h.wait_timeout(LONG);
            assert!(!r.as_ref().is_err_and(|e| e.kind() == ErrorKind::Timeout), "run {} hung", run.id);
            r
        }
        Driver::Background => {
            assert!(wait_undriven(&rig.eng, run, Instant::now() + LONG), "run {} hung", run.id);
            run.result()
        }
    }
}

/// One panic test: run 1 has an independent task 3, task 1 (held at its gate) and its consumer 2
/// on two SUB workers; the panic is armed, task 1 released, and run 1 must fail with an
/// `Internal` error naming where it panicked; then run 2 (a producer and its consumer) must
/// succeed, driven the same way, and the role must be free.
fn panic_case(what: Inject, driver: Driver) {
    let script = Script::new();
    let rig = Rig::threaded(cfg(0, 2), &script);
    let bg = (driver == Driver::Background).then(|| {
        let eng = rig.eng.clone();
        thread::spawn(move || eng.background_loop())
    });
    if what != Inject::Pass {
        // Task 1 is dispatched while run 1 is built, so `start` must be armed before.
        inject(&rig, what);
    }
    script.hold(1);
    let (x, y) = (buffer(1), buffer(2));
    let run1 = rig.begin();
    let mut orch = rig.orch(&run1);
    orch.submit_sub(&rig.host, args(3, &[(&whole(y), Tag::Output)])).unwrap();
    orch.submit_sub(&rig.host, args(1, &[(&whole(x), Tag::Output)])).unwrap();
    // Refused when task 1 already failed (a panic in `start`): submission stops at a failure.
    let _ = orch.submit_sub(&rig.host, args(2, &[(&whole(x), Tag::Input)]));
    orch.finish(None);
    if what == Inject::Pass {
        inject(&rig, what);
    }
    script.release(1);
    let err = settle_run(&rig, &run1, driver).expect_err("run 1 must fail");
    assert_eq!(err.kind(), ErrorKind::Internal, "{what:?}/{driver:?}: {err:?}");
    for n in what.needles() {
        assert!(err.message().contains(n), "{what:?}/{driver:?}: the error should mention {n:?}: {err:?}");
    }
    assert!(!script.started(2), "{what:?}/{driver:?}: task 2 ran although its producer failed");

    // The engine goes on.
    let z = buffer(3);
    let run2 = rig.begin();
    let mut orch = rig.orch(&run2);
    orch.submit_sub(&rig.host, args(11, &[(&whole(z), Tag::Output)])).unwrap();
    orch.submit_sub(&rig.host, args(12, &[(&whole(z), Tag::Input)])).unwrap();
    orch.finish(None);
    settle_run(&rig, &run2, driver).unwrap_or_else(|e| panic!("{what:?}/{driver:?}: run 2 failed: {e:?}"));
    assert!(script.ended(11) && script.ended(12));
    if let Some(bg) = bg {
        rig.eng.stop_background();
        bg.join().expect("the background thread survived");
    }
    assert!(!rig.eng.role.held(), "{what:?}/{driver:?}: the role is still held");
    assert_eq!(rig.eng.role.wanted(), 0);
    if what != Inject::CompleteAlways {
        // Everything of run 1 was released: 3 ran, 1 failed (or ended), 2 was poisoned.
        rig.drive("every slot of run 1 to be released", || rig.eng.window.live() == 0);
        rig.assert_clean();
    }
}

#[test]
fn a_panic_anywhere_in_the_engine_fails_the_run_and_a_waiter_goes_on() {
    for what in Inject::ALL {
        panic_case(what, Driver::Waiter);
    }
}

#[test]
fn a_panic_anywhere_in_the_engine_fails_the_run_and_the_background_thread_goes_on() {
    for what in Inject::ALL {
        panic_case(what, Driver::Background);
    }
}

#[test]
fn a_lane_whose_endpoint_panicked_is_out_of_service() {
    let script = Script::new();
    let rig = Rig::threaded(cfg(2, 0), &script);
    sync::lock(&rig.faults.poll).insert(1);
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.submit_next_level(&rig.chip, args(1, &[]), cc(), 0).unwrap();
    orch.finish(None);
    let err = err_of(rig.wait(&run));
    assert_eq!(err.kind(), ErrorKind::Internal, "{err:?}");
    // Worker 0 takes no more work; worker 1 does.
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.submit_next_level(&rig.chip, args(3, &[]), cc(), 1).unwrap();
    orch.submit_next_level(&rig.chip, args(2, &[]), cc(), 0).unwrap();
    orch.finish(None);
    let err = err_of(rig.wait(&run));
    assert_eq!(err.kind(), ErrorKind::WorkerDied, "{err:?}");
    assert!(err.message().contains("worker 0 is dead (its endpoint panicked in poll"), "{err:?}");
    assert!(!script.started(2) && script.ended(3));
    rig.assert_clean();
}

#[test]
fn the_role_is_given_up_when_its_holder_panics() {
    let rig = Rig::manual(cfg(0, 1));
    let eng = rig.eng.clone();
    let holder = thread::spawn(move || {
        let _role = eng.try_role().expect("nobody holds the role");
        panic!("the holder panics");
    });
    assert!(holder.join().is_err());
    #[cfg(not(loom))] // (under `--cfg loom` the lock is `loom`'s, which never poisons)
    assert!(rig.eng.sched.is_poisoned(), "the panic poisoned the scheduler lock");
    assert!(!rig.eng.role.held(), "the role flag was left set");
    // The poisoned lock is taken, not mistaken for a held one: a run is driven to its end.
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.submit_sub(&rig.host, args(1, &[])).unwrap();
    orch.finish(None);
    rig.drive("task 1 to start", || rig.was_dispatched(1));
    rig.sub[0].finish(Outcome::Success);
    rig.wait(&run).unwrap();
    rig.assert_clean();
}

/// A thread without the role hands its change to the holder, which applies it at its next
/// pass (the requester never waits for the role's lock: the holder may sleep with it); a
/// change that panics reaches its own requester as that panic, and the changes queued beside
/// it are applied all the same.
#[cfg(not(loom))]
#[test]
fn changes_asked_without_the_role_are_applied_by_the_holder_and_a_panic_reaches_its_requester() {
    let rig = Rig::manual(cfg(0, 1));
    let role = rig.eng.try_role().expect("nobody holds the role");
    let applied = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let ask = |n: usize, panics: bool| {
        let (eng, applied) = (rig.eng.clone(), applied.clone());
        let requester = thread::spawn(move || {
            eng.with_sched(move |_| {
                assert!(!panics, "change {n} panics");
                applied.fetch_add(1, Ordering::SeqCst);
                n
            })
        });
        let queued = Instant::now() + Duration::from_secs(10);
        while rig.eng.sched_rx.len() < n {
            assert!(Instant::now() < queued, "change {n} was never queued");
            thread::yield_now();
        }
        requester
    };
    let (first, bad, last) = (ask(1, false), ask(2, true), ask(3, false));
    assert_eq!(applied.load(Ordering::SeqCst), 0, "nothing applied before the holder's pass");
    assert!(!first.is_finished() && !last.is_finished(), "requesters wait for the holder");
    let mut role = role;
    role.pass();
    drop(role);
    assert_eq!(first.join().expect("change 1 applied"), 1);
    assert_eq!(last.join().expect("change 3 applied after the one that panicked"), 3);
    let panic = bad.join().expect_err("change 2's panic reaches its requester");
    assert!(
        crate::error::panic_message(&*panic).contains("change 2 panics"),
        "{}",
        crate::error::panic_message(&*panic)
    );
    assert_eq!(applied.load(Ordering::SeqCst), 2);
}

/// The holder asleep on the doorbell (as a driver waiting for its workers is): a thread
/// without the role that asks for a change rings it awake, and the holder's next pass applies
/// the change and wakes the requester; nothing else rings meanwhile.
#[cfg(not(loom))]
#[test]
fn a_change_asked_while_the_holder_sleeps_on_the_doorbell_wakes_it() {
    let rig = Rig::manual(cfg(0, 1));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (taken_tx, taken_rx) = mpsc::channel();
    let holder = {
        let (eng, stop) = (rig.eng.clone(), stop.clone());
        thread::spawn(move || {
            let mut role = eng.try_role().expect("nobody holds the role");
            taken_tx.send(()).unwrap();
            loop {
                let seen = eng.doorbell().seq();
                role.pass();
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                // Asleep in the kernel at once: no spinning that would see a request anyway.
                eng.doorbell().sleep(seen, Some(Instant::now() + LONG));
            }
        })
    };
    taken_rx.recv().unwrap();
    // Ends the holder's loop also when an assertion below fails.
    struct Stop(Arc<std::sync::atomic::AtomicBool>, Arc<Engine>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
            self.1.doorbell().ring();
        }
    }
    let stopper = Stop(stop.clone(), rig.eng.clone());
    let asleep = Instant::now() + LONG;
    while rig.eng.doorbell().sleepers() == 0 {
        assert!(Instant::now() < asleep, "the holder never slept");
        thread::yield_now();
    }
    let asked = Instant::now();
    let eng = rig.eng.clone();
    let ran_on =
        thread::spawn(move || eng.with_sched(|_| thread::current().id())).join().expect("the requester");
    assert_eq!(ran_on, holder.thread().id(), "the holder applied the change");
    assert!(asked.elapsed() < LONG / 2, "the requester was answered by the woken holder, not a timeout");
    drop(stopper);
    holder.join().expect("the holder");
}
