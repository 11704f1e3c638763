//! Failure and poisoning: a failed task poisons its downstream cone, refused submits, a failed
//! endpoint's lane, an orchestration error's unstarted tasks, and validation before anything
//! changes.

use super::*;

#[test]
fn failure_poisons_consumers_transitively() {
    let rig = Rig::manual(cfg(1, 0));
    let (x, y) = (buffer(1), buffer(2));
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.submit_next_level(&rig.chip, args(1, &[(&whole(x), Tag::Output)]), cc(), 0).unwrap();
    orch.submit_next_level(&rig.chip, args(2, &[(&whole(x), Tag::Input), (&whole(y), Tag::Output)]), cc(), 0)
        .unwrap();
    orch.submit_next_level(&rig.chip, args(3, &[(&whole(y), Tag::Input)]), cc(), 0).unwrap();
    orch.finish(None);
    rig.nl[0].finish(Outcome::TaskFailure("boom a".into()));
    let err = rig.wait(&run).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TaskFailed, "the first error is the real failure: {err}");
    assert!(err.message().contains("boom a"), "{err}");
    assert_eq!(ids(&rig.nl[0].history()), vec![1], "poisoned tasks never run");
    let stats = run.stats().unwrap();
    assert_eq!((stats.tasks, stats.failed), (3, 3));
    rig.assert_clean();
}

#[test]
fn failing_producer_only_marks_a_building_consumer() {
    // Slot rule 3, white-box: a consumer still BUILDING is not moved by the failing producer;
    // it is marked, and its submitting thread fails it at publication.
    let rig = Rig::manual(cfg(1, 0));
    let run = rig.begin();
    let slot = |index| {
        Arc::new(Slot::new(
            run.clone(),
            index,
            Some(TaskData {
                callable: rig.chip.clone(),
                args: smallvec::smallvec![TaskArgs::new()],
                config: None,
                target: Target::NextLevel(smallvec::smallvec![0]),
                group: false,
                names_device: false,
                holds: Default::default(),
            }),
            None,
        ))
    };
    let (producer, consumer) = (slot(0), slot(1));
    producer.set_state(State::Running);
    {
        let mut l = producer.lock();
        l.fanout_total = 2; // a scope reference and the consumer's: nothing gets consumed here
        l.fanout.push(consumer.clone());
    }
    let mut ready = Vec::new();
    rig.eng.complete(&producer, Err(Error::new(ErrorKind::TaskFailed, "boom p")), &mut ready);
    assert!(ready.is_empty());
    assert_eq!(producer.state(), State::Failed);
    assert_eq!(consumer.state(), State::Building, "a BUILDING consumer is only marked");
    let l = consumer.lock();
    let mark = l.poisoned.as_ref().expect("marked poisoned");
    assert_eq!(mark.kind(), ErrorKind::Poisoned);
    assert!(mark.message().contains("boom p"), "{mark}");
    assert!(l.failure.is_none());
    drop(l);
    assert_eq!(
        run.failed.load(Ordering::Relaxed),
        1,
        "only the producer is counted; publication counts the rest"
    );
    assert!(run.first_error().is_some_and(|e| e.message().contains("boom p")));
}

#[test]
fn submit_that_waited_while_its_producer_failed_is_refused() {
    // Window of 2: the third submit waits (driving the scheduler) and, while it waits, the
    // producer's failure is drained. The run has failed by the time the submit gets its place,
    // so the submit is refused with the run's error instead of landing in a failed run.
    let mut c = cfg(2, 0);
    c.task_window = 2;
    let rig = Rig::manual(c);
    let x = buffer(1);
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.submit_next_level(&rig.chip, args(1, &[(&whole(x), Tag::Output)]), cc(), 0).unwrap();
    orch.scope_begin().unwrap();
    orch.submit_next_level(&rig.chip, args(2, &[]), cc(), 1).unwrap();
    orch.scope_end().unwrap();
    rig.nl[0].finish(Outcome::TaskFailure("boom a".into()));
    rig.nl[1].finish(Outcome::Success);
    assert!(run.first_error().is_none(), "nothing drained yet");
    let e = err_of(orch.submit_next_level(&rig.chip, args(3, &[(&whole(x), Tag::Input)]), cc(), 1));
    assert_eq!(e.kind(), ErrorKind::TaskFailed);
    assert!(e.message().contains("boom a") && e.message().contains("already failed"), "{e}");
    orch.finish(None);
    let err = rig.wait(&run).unwrap_err();
    assert!(err.message().contains("boom a"), "{err}");
    assert_eq!(ids(&rig.dispatched()), vec![1, 2], "the refused task never ran");
    let stats = run.stats().unwrap();
    assert_eq!((stats.tasks, stats.failed), (2, 1));
    rig.assert_clean();
}

#[test]
fn only_a_refused_submits_error_passed_on_ends_the_build_as_ok_does() {
    // `Orchestrator::ended_by_refusal`: true for the refusal's error, as it is or with context
    // added; false before any refusal, and for an error of the function's own (another kind,
    // or the run's kind without its message). A run that is done: the test below.
    let rig = Rig::manual(cfg(1, 0));
    let x = buffer(1);
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.submit_next_level(&rig.chip, args(1, &[(&whole(x), Tag::Output)]), cc(), 0).unwrap();
    let own_same_kind = Error::new(ErrorKind::TaskFailed, "the function's own failure");
    rig.nl[0].finish(Outcome::TaskFailure("boom r".into()));
    rig.drive("the failure to be drained", || run.first_error().is_some());
    assert!(!orch.ended_by_refusal(run.first_error().unwrap()), "no submit was refused yet");
    let refused = err_of(orch.submit_next_level(&rig.chip, args(2, &[]), cc(), 0));
    assert!(orch.ended_by_refusal(&refused), "{refused}");
    assert!(orch.ended_by_refusal(&refused.context("step 3")), "context keeps the message");
    assert!(!orch.ended_by_refusal(&own_same_kind), "the run's kind without its message");
    assert!(!orch.ended_by_refusal(&Error::invalid("the function's own")), "another kind");
    orch.finish(None);
    let err = rig.wait(&run).unwrap_err();
    assert!(err.message().contains("boom r") && !err.message().contains("refused"), "{err}");
    rig.assert_clean();
}

#[test]
fn a_refusal_passed_on_in_a_run_abandoned_while_built_fails_its_unstarted_tasks() {
    // A run abandoned during its build (as after a scheduler panic) is done: a refusal passed
    // on then takes the path of the function's own error, which fails the unstarted tasks.
    let rig = Rig::manual(cfg(1, 0));
    let (x, y) = (buffer(1), buffer(2));
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.submit_next_level(&rig.chip, args(1, &[(&whole(x), Tag::Output)]), cc(), 0).unwrap();
    orch.submit_next_level(&rig.chip, args(2, &[(&whole(x), Tag::Input), (&whole(y), Tag::Output)]), cc(), 0)
        .unwrap();
    rig.drive("task 1 to start", || rig.was_dispatched(1));
    assert!(rig.eng.abandon_run(&run, Error::new(ErrorKind::Internal, "the scheduler panicked")));
    let refused = err_of(orch.submit_next_level(&rig.chip, args(3, &[]), cc(), 0));
    assert!(refused.message().contains("refused") && refused.message().contains("panicked"), "{refused}");
    assert!(!orch.ended_by_refusal(&refused), "the run is done");
    orch.finish(Some(&refused));
    let l = run.stats().unwrap();
    assert_eq!((l.tasks, l.failed), (2, 1), "task 2, unstarted, failed; task 1 still runs");
    rig.nl[0].finish(Outcome::Success);
}

#[test]
fn submit_that_waited_on_the_window_is_refused_once_the_run_failed() {
    // The run fails while a submit waits for the task window. Its producer is consumed during
    // that wait (scope ended), so the tag walk finds no producer: the task must still not land
    // in the failed run (upstream step 0: no further submits land in a failed run).
    let mut c = cfg(1, 0);
    c.task_window = 1;
    let rig = Rig::manual(c);
    let x = buffer(1);
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.scope_begin().unwrap();
    orch.submit_next_level(&rig.chip, args(1, &[(&whole(x), Tag::Output)]), cc(), 0).unwrap();
    orch.scope_end().unwrap();
    rig.nl[0].finish(Outcome::TaskFailure("boom a".into()));
    let submitted = orch.submit_next_level(&rig.chip, args(2, &[(&whole(x), Tag::Input)]), cc(), 0);
    let ran = rig.nl[0].running().is_some();
    if ran {
        rig.nl[0].finish(Outcome::Success);
    }
    orch.finish(None);
    assert!(rig.wait(&run).is_err());
    assert!(!ran, "a consumer of a failed producer ran after the run had failed");
    assert!(submitted.is_err(), "submit into a failed run was accepted");
    rig.assert_clean();
}

#[test]
fn endpoint_failure_kills_the_lane_and_fails_what_was_queued_there() {
    let rig = Rig::manual(cfg(2, 0));
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.submit_next_level(&rig.chip, args(1, &[]), cc(), 0).unwrap();
    orch.submit_next_level(&rig.chip, args(2, &[]), cc(), 0).unwrap(); // queued behind 1
    orch.submit_next_level(&rig.chip, args(3, &[]), cc(), 1).unwrap();
    orch.finish(None);
    rig.nl[0].finish(Outcome::EndpointFailure("child exited".into()));
    rig.nl[1].finish(Outcome::Success);
    let err = rig.wait(&run).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WorkerDied, "{err}");
    assert!(err.message().contains("child exited"), "{err}");
    assert_eq!(ids(&rig.nl[0].history()), vec![1]);
    let stats = run.stats().unwrap();
    assert_eq!((stats.tasks, stats.failed), (3, 2));
    rig.assert_clean();
}

#[test]
fn orchestration_error_fails_unstarted_tasks_and_the_run_settles() {
    let rig = Rig::manual(cfg(2, 0));
    let x = buffer(1);
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.submit_next_level(&rig.chip, args(1, &[(&whole(x), Tag::Output)]), cc(), 0).unwrap(); // running
    orch.submit_next_level(&rig.chip, args(2, &[(&whole(x), Tag::Input)]), cc(), 1).unwrap(); // pending
    orch.submit_next_level(&rig.chip, args(3, &[]), cc(), 0).unwrap(); // ready, queued
    orch.finish(Some(&Error::invalid("the orchestration function failed")));
    assert!(!run.is_done(), "the running task still runs");
    rig.nl[0].finish(Outcome::Success);
    let err = rig.wait(&run).unwrap_err();
    assert!(err.message().contains("the orchestration function failed"), "{err}");
    assert_eq!(ids(&rig.dispatched()), vec![1], "unstarted tasks never run");
    rig.assert_clean();
}

#[test]
fn cancelled_tasks_count_as_failed_in_run_stats() {
    let rig = Rig::manual(cfg(1, 0));
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.submit_next_level(&rig.chip, args(1, &[]), cc(), 0).unwrap(); // running
    orch.submit_next_level(&rig.chip, args(2, &[]), cc(), 0).unwrap(); // ready, queued
    orch.submit_next_level(&rig.chip, args(3, &[]), cc(), 0).unwrap(); // ready, queued
    orch.finish(Some(&Error::invalid("the orchestration function failed")));
    rig.nl[0].finish(Outcome::Success);
    assert!(rig.wait(&run).is_err());
    let stats = run.stats().unwrap();
    assert_eq!(stats.tasks, 3);
    assert_eq!(stats.failed, 2, "RunStats::failed counts tasks that failed or never ran");
    rig.assert_clean();
}

// ---------------------------------------------------------------------------------- validation

#[test]
fn submit_validates_before_anything_changes() {
    let rig = Rig::manual(cfg(2, 1));
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    let unknown = CallableHandle::new(Digest::of(b"nope"), CallableKind::Chip, "nope");
    let e = err_of(orch.submit_next_level(&unknown, args(1, &[]), cc(), 0));
    assert_eq!(e.kind(), ErrorKind::Callable);
    assert!(e.message().contains("not registered"), "{e}");
    let e = err_of(orch.submit_next_level(&rig.host, args(1, &[]), cc(), 0));
    assert_eq!(e.kind(), ErrorKind::Callable, "{e}");
    let e = err_of(orch.submit_sub(&rig.chip, args(1, &[])));
    assert_eq!(e.kind(), ErrorKind::Callable, "{e}");
    let e = err_of(orch.submit_next_level(&rig.chip, args(1, &[]), cc(), 2));
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("NEXT_LEVEL worker 2 does not exist"), "{e}");
    let e = err_of(orch.submit_next_level_group(&rig.chip, vec![args(1, &[]), args(1, &[])], cc(), &[1, 1]));
    assert!(e.message().contains("named twice"), "{e}");
    let e = err_of(orch.submit_next_level_group(&rig.chip, vec![args(1, &[])], cc(), &[0, 1]));
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let e = err_of(orch.submit_sub_group(&rig.host, vec![]));
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let ro = buffer_with(1, Access::Read);
    let e = err_of(orch.submit_next_level(&rig.chip, args(1, &[(&whole(ro), Tag::Output)]), cc(), 0));
    assert!(e.message().contains("access"), "{e}");
    let x = buffer(2);
    let e = err_of(orch.submit_next_level(
        &rig.chip,
        args(1, &[(&view(x, 0, 8), Tag::Input), (&view(x, 4, 8), Tag::Output)]),
        cc(),
        0,
    ));
    assert!(e.message().contains("overlap"), "{e}");
    // Disjoint views of one buffer in one task are fine.
    orch.submit_next_level(
        &rig.chip,
        args(1, &[(&view(x, 0, 8), Tag::Input), (&view(x, 8, 8), Tag::Output)]),
        cc(),
        0,
    )
    .unwrap();
    assert_eq!(orch.task_count(), 1);
    assert!(orch.scope_end().is_err(), "scope_end without scope_begin");
    for _ in 1..crate::engine::orchestrator::MAX_SCOPE_DEPTH {
        orch.scope_begin().unwrap();
    }
    let e = err_of(orch.scope_begin());
    assert_eq!(e.kind(), ErrorKind::InvalidState);
    orch.finish(None); // closes the open scopes
    rig.nl[0].finish(Outcome::Success);
    rig.wait(&run).unwrap();
    rig.assert_clean();
}
