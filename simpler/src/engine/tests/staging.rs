//! Staging: a successor run's task prepared beside the head's and activated after it, or
//! withdrawn when its run stops, fails or is abandoned.

use super::*;

/// Run 1 (the head) with task 1 on worker 0 naming `x` as `tag`, running once this returns;
/// then run 2 with task 2 on worker 0 reading `x`. Both submissions are closed.
fn head_and_successor(rig: &Rig, x: &Tensor, tag: Tag) -> (Arc<RunState>, Arc<RunState>) {
    let head = rig.begin();
    let mut orch = rig.orch(&head);
    orch.submit_next_level(&rig.chip, args(1, &[(x, tag)]), cc(), 0).unwrap();
    orch.finish(None);
    rig.drive("task 1 to start", || rig.nl[0].running().is_some());
    let next = rig.begin();
    let mut orch = rig.orch(&next);
    orch.submit_next_level(&rig.chip, args(2, &[(x, Tag::Input)]), cc(), 0).unwrap();
    orch.finish(None);
    (head, next)
}

#[test]
fn a_successor_task_is_staged_beside_the_head_prepared_and_activated_after_it() {
    let rig = Rig::staging(cfg(1, 0));
    let x = whole(buffer(1));
    let (head, next) = head_and_successor(&rig, &x, Tag::Input);
    rig.drive("task 2 to be staged", || rig.nl[0].staged().is_some());
    assert_eq!(rig.in_flight(), 2, "a staged task counts as in flight");
    rig.nl[0].prepare();
    rig.drive("task 2 to be counted prepared", || next.staged.load(Ordering::Relaxed) == 1);
    assert!(!rig.drive_briefly(|| rig.nl[0].staged().is_none()), "activated while the head runs");
    rig.nl[0].finish(Outcome::Success);
    rig.wait(&head).unwrap();
    rig.drive("task 2 to be activated", || rig.nl[0].running().is_some_and(|s| s.id() == 2));
    assert_eq!(next.staged.load(Ordering::Relaxed), 0);
    rig.nl[0].finish(Outcome::Success);
    rig.wait(&next).unwrap();
    assert_eq!(ids(&rig.nl[0].history()), vec![1, 2]);
    rig.assert_clean();
}

/// A READY group reserves its workers for staging as it does at the head: a single queued on
/// a worker the successor run's group needs is not staged there, so it cannot overtake the
/// group once the run is the head (upstream's rule; depth 1 keeps the order too). Worker 0
/// runs 5 (run 1), then the group 710 on workers 0 and 1, then 72; 73, on worker 2, which no
/// group needs, runs at once (run 2 names nothing of run 1's, so it dispatches before its
/// turn, its group excepted).
#[test]
fn a_single_behind_a_group_of_the_successor_is_not_staged_on_the_groups_worker() {
    let rig = Rig::staging(cfg(3, 0));
    let head = rig.begin();
    let mut orch = rig.orch(&head);
    orch.submit_next_level(&rig.chip, args(5, &[]), cc(), 0).unwrap();
    orch.finish(None);
    rig.drive("task 5 to start", || rig.nl[0].running().is_some());
    let next = rig.begin();
    let mut orch = rig.orch(&next);
    orch.submit_next_level_group(&rig.chip, vec![args(710, &[]), args(710, &[])], cc(), &[0, 1]).unwrap();
    orch.submit_next_level(&rig.chip, args(72, &[]), cc(), 0).unwrap();
    orch.submit_next_level(&rig.chip, args(73, &[]), cc(), 2).unwrap();
    orch.finish(None);
    // 73 starts in the pass that would have started or staged 72 too.
    rig.drive("task 73 to start", || rig.nl[2].running().is_some_and(|s| s.id() == 73));
    assert_eq!(
        rig.nl[0].staged().map(|s| s.id()),
        None,
        "72 was staged on worker 0, which group 710 ahead of it needs"
    );
    assert!(!rig.was_dispatched(72), "72 started ahead of group 710");
    rig.nl[2].finish(Outcome::Success);
    rig.nl[0].finish(Outcome::Success);
    rig.wait(&head).unwrap();
    rig.drive("group 710 to start", || rig.nl[0].running().is_some_and(|s| s.id() == 710));
    assert_eq!(rig.nl[1].running().map(|s| s.id()), Some(710));
    rig.nl[1].finish(Outcome::Success);
    assert!(!rig.drive_briefly(|| rig.was_dispatched(72)), "72 started while the group ran on worker 0");
    rig.nl[0].finish(Outcome::Success);
    rig.drive("task 72 to start", || rig.nl[0].running().is_some_and(|s| s.id() == 72));
    rig.nl[0].finish(Outcome::Success);
    rig.wait(&next).unwrap();
    assert_eq!(ids(&rig.nl[0].history()), vec![5, 710, 72]);
    rig.assert_clean();
}

#[test]
fn a_successor_task_is_not_staged_while_a_head_task_writes_its_input_untracked() {
    // Task 1 writes `x` as NoDep: the TensorMap does not order it, yet run 2's task must not
    // copy `x` in before task 1 has written it, as no task of run 2 ran before run 1 ended.
    for tag in [Tag::InOut, Tag::NoDep] {
        let rig = Rig::staging(cfg(1, 0));
        let x = whole(buffer(1));
        let (head, next) = head_and_successor(&rig, &x, tag);
        assert!(
            !rig.drive_briefly(|| rig.nl[0].staged().is_some()),
            "task 2 was staged (its input copied in) while task 1 ({tag:?}) still writes it"
        );
        rig.nl[0].finish(Outcome::Success);
        rig.wait(&head).unwrap();
        rig.drive("task 2 to run", || rig.nl[0].running().is_some());
        rig.nl[0].finish(Outcome::Success);
        rig.wait(&next).unwrap();
        rig.assert_clean();
    }
}

#[test]
fn a_stopped_run_whose_staged_task_was_withdrawn_too_late_never_launches_it() {
    let rig = Rig::staging(cfg(1, 0));
    let x = whole(buffer(1));
    let (head, next) = head_and_successor(&rig, &x, Tag::Input);
    rig.drive("task 2 to be staged", || rig.nl[0].staged().is_some());
    // The worker is still preparing it when the run is stopped: withdrawing misses until it
    // is prepared.
    rig.nl[0].set_late_withdraws(usize::MAX);
    assert!(RunHandle::new(next.clone(), &rig.eng).cancel());
    rig.drive("the withdraw", || rig.nl[0].withdraws() >= 1);
    rig.nl[0].finish(Outcome::Success);
    rig.wait(&head).unwrap();
    rig.nl[0].set_late_withdraws(0);
    rig.nl[0].prepare();
    assert!(
        !rig.drive_briefly(|| rig.nl[0].running().is_some()),
        "the cancelled run's staged task was activated once its run was the head"
    );
    let err = err_of(rig.wait(&next));
    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err:?}");
    assert_eq!(ids(&rig.nl[0].history()), vec![1], "the cancelled run's task ran");
    rig.assert_clean();
}

#[test]
fn the_staged_task_of_a_run_whose_orchestration_failed_is_withdrawn_and_never_runs() {
    let rig = Rig::staging(cfg(1, 0));
    let x = whole(buffer(1));
    let head = rig.begin();
    let mut orch = rig.orch(&head);
    orch.submit_next_level(&rig.chip, args(1, &[(&x, Tag::Input)]), cc(), 0).unwrap();
    orch.finish(None);
    rig.drive("task 1 to start", || rig.nl[0].running().is_some());
    // Run 2's task is staged while its orchestration function still runs; then it fails.
    let next = rig.begin();
    let mut orch = rig.orch(&next);
    orch.submit_next_level(&rig.chip, args(2, &[(&x, Tag::Input)]), cc(), 0).unwrap();
    rig.drive("task 2 to be staged", || rig.nl[0].staged().is_some());
    rig.nl[0].prepare();
    orch.finish(Some(&Error::invalid("the orchestration says no")));
    // As at depth 1, its run ends without waiting for the head, and its task never runs.
    let err = err_of(rig.wait(&next));
    assert!(err.message().contains("the orchestration says no"), "{err:?}");
    assert!(rig.nl[0].withdraws() >= 1, "the staged task was withdrawn");
    assert!(!head.is_done(), "run 2 ended before the head");
    rig.nl[0].finish(Outcome::Success);
    rig.wait(&head).unwrap();
    assert!(!rig.drive_briefly(|| rig.nl[0].running().is_some()), "the failed run's task was activated");
    assert_eq!(ids(&rig.nl[0].history()), vec![1], "the failed run's task ran");
    rig.assert_clean();
}

#[test]
fn the_staged_task_of_a_run_abandoned_after_a_panic_is_withdrawn_and_the_lane_serves_on() {
    let rig = Rig::staging(cfg(1, 0));
    let x = whole(buffer(1));
    let (head, next) = head_and_successor(&rig, &x, Tag::Input);
    rig.drive("task 2 to be staged", || rig.nl[0].staged().is_some());
    rig.nl[0].prepare();
    inject(&rig, Inject::Pass);
    rig.drive("both runs to be abandoned", || head.is_done() && next.is_done());
    assert!(err_of(next.result()).message().contains("panicked during a pass"));
    rig.nl[0].finish(Outcome::Success);
    rig.drive("the abandoned run's staged task to end", || rig.in_flight() == 0);
    assert_eq!(ids(&rig.nl[0].history()), vec![1], "the abandoned run's staged task ran");
    assert_eq!(rig.nl[0].withdraws(), 1);
    // The lane stages again.
    let (head, next) = head_and_successor(&rig, &x, Tag::Input);
    rig.drive("the new task 2 to be staged", || rig.nl[0].staged().is_some());
    rig.nl[0].prepare();
    rig.nl[0].finish(Outcome::Success);
    rig.wait(&head).unwrap();
    rig.drive("task 2 to be activated", || rig.nl[0].running().is_some());
    rig.nl[0].finish(Outcome::Success);
    rig.wait(&next).unwrap();
}

#[test]
fn the_staged_task_of_a_lane_that_left_service_after_a_panic_fails_instead_of_hanging() {
    let rig = Rig::staging(cfg(1, 0));
    // The poll that reports task 1's end panics: worker 0 leaves service holding task 2.
    sync::lock(&rig.faults.poll).insert(1);
    let x = whole(buffer(1));
    let (head, next) = head_and_successor(&rig, &x, Tag::Input);
    rig.drive("task 2 to be staged", || rig.nl[0].staged().is_some());
    rig.nl[0].prepare();
    rig.nl[0].finish(Outcome::Success);
    assert!(err_of(rig.wait(&head)).message().contains("panicked in poll"));
    let err = err_of(rig.wait(&next));
    assert_eq!(err.kind(), ErrorKind::WorkerDied, "{err:?}");
    assert_mentions(
        &err,
        &["task 0 ", "worker 0", "out of service", "panicked in poll", "staged", "not launched"],
    );
    assert_eq!(next.staged.load(Ordering::Relaxed), 0);
    assert_eq!(rig.in_flight(), 0);
    rig.assert_clean();
}

#[test]
fn a_staging_lane_whose_endpoint_panics_fails_its_staged_task_and_leaves_service() {
    for fault in ["activate", "withdraw"] {
        let rig = Rig::staging(cfg(1, 0));
        let set = if fault == "activate" { &rig.faults.activate } else { &rig.faults.withdraw };
        sync::lock(set).insert(2);
        let x = whole(buffer(1));
        let (head, next) = head_and_successor(&rig, &x, Tag::Input);
        rig.drive("task 2 to be staged", || rig.nl[0].staged().is_some());
        rig.nl[0].prepare();
        if fault == "withdraw" {
            assert!(RunHandle::new(next.clone(), &rig.eng).cancel());
        }
        rig.nl[0].finish(Outcome::Success);
        rig.wait(&head).unwrap();
        let err = err_of(rig.wait(&next));
        if fault == "activate" {
            assert!(err.message().contains("panicked in activate"), "{err:?}");
        } else {
            assert_eq!(err.kind(), ErrorKind::Cancelled, "{err:?}");
        }
        assert_eq!(rig.in_flight(), 0);
        // Worker 0 is out of service.
        let run = rig.begin();
        let mut orch = rig.orch(&run);
        orch.submit_next_level(&rig.chip, args(3, &[]), cc(), 0).unwrap();
        orch.finish(None);
        let err = err_of(rig.wait(&run));
        assert!(err.message().contains(&format!("its endpoint panicked in {fault}")), "{fault}: {err:?}");
        rig.assert_clean();
    }
}
