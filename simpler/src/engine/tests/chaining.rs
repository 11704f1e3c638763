//! Chaining on SUB lanes (rule 5 of `slot`): a task whose unfinished producers run on SUB
//! workers is handed to one of them behind its running task (two deep when its producers are
//! all on that worker), and that worker starts it itself; behind a failure, a stopped
//! orchestration or a group, it does not.

use super::*;

/// Tasks `ids` on the lanes' histories and whether each was chained rather than started.
fn handed(ctl: &ManualControl) -> Vec<(u64, bool)> {
    ctl.history().iter().map(|s| (s.id(), s.chained)).collect()
}

/// Task 1 writes `x`, 2 reads it and writes `y`, 3 reads `y`: a chain on one SUB worker.
fn three_in_a_row<'r>(rig: &'r Rig, run: &Arc<RunState>) -> Orchestrator<'r> {
    let (x, y) = (whole(buffer(1)), whole(buffer(2)));
    let mut orch = rig.orch(run);
    orch.submit_sub(&rig.host, args(1, &[(&x, Tag::Output)])).unwrap();
    orch.submit_sub(&rig.host, args(2, &[(&x, Tag::Input), (&y, Tag::Output)])).unwrap();
    orch.submit_sub(&rig.host, args(3, &[(&y, Tag::Input)])).unwrap();
    orch
}

#[test]
fn each_task_of_a_chain_is_handed_behind_the_running_one_and_started_by_the_worker() {
    let rig = Rig::chaining(cfg(0, 1));
    let run = rig.begin();
    three_in_a_row(&rig, &run).finish(None);
    let sub = &rig.sub[0];
    rig.drive("task 2 to be chained behind 1", || sub.chained().is_some_and(|(s, _)| s.id() == 2));
    assert_eq!(sub.running().map(|s| s.id()), Some(1));
    assert!(sub.chained().is_some_and(|(_, w)| w == Wait::None), "2 waits for nothing else");
    sub.finish(Outcome::Success);
    assert_eq!(sub.running().map(|s| s.id()), Some(2), "the worker started 2 itself");
    rig.drive("task 3 to be chained behind 2", || sub.chained().is_some_and(|(s, _)| s.id() == 3));
    sub.finish(Outcome::Success);
    sub.finish(Outcome::Success);
    rig.wait(&run).unwrap();
    assert_eq!(handed(sub), [(1, false), (2, true), (3, true)]);
    assert_eq!(ids(&rig.dispatched()), [1], "the scheduler started only the first");
    rig.assert_clean();
}

#[test]
fn a_failed_orchestration_withdraws_its_chained_task() {
    let rig = Rig::chaining(cfg(0, 1));
    let run = rig.begin();
    let orch = three_in_a_row(&rig, &run);
    rig.drive("task 2 to be chained", || rig.sub[0].chained().is_some());
    orch.finish(Some(&Error::new(ErrorKind::TaskFailed, "the orchestration gave up")));
    rig.drive_briefly(|| false); // a pass sees the failure and withdraws 2
    rig.sub[0].finish(Outcome::Success);
    assert!(rig.sub[0].running().is_none(), "the withdrawn task did not start");
    let err = rig.wait(&run).unwrap_err();
    assert_mentions(&err, &["the orchestration gave up"]);
    rig.assert_clean();
}

/// Task 1 on worker 0 writes `x`, 2 on worker 1 writes `y`, and 3 reads both: chained behind
/// 1 on worker 0, waiting for 2 (its key, which is its id here).
fn two_producers(rig: &Rig) -> Arc<RunState> {
    let (x, y) = (whole(buffer(1)), whole(buffer(2)));
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.submit_sub(&rig.host, args(1, &[(&x, Tag::Output)])).unwrap();
    orch.submit_sub(&rig.host, args(2, &[(&y, Tag::Output)])).unwrap();
    orch.submit_sub(&rig.host, args(3, &[(&x, Tag::Input), (&y, Tag::Input)])).unwrap();
    orch.finish(None);
    rig.drive("task 3 to be chained behind 1, after 2", || {
        rig.sub[0].chained().is_some_and(|(s, w)| s.id() == 3 && w == Wait::On(2))
    });
    assert_eq!(rig.sub[1].running().map(|s| s.id()), Some(2));
    run
}

#[test]
fn a_task_behind_two_producers_starts_once_both_succeeded_in_either_order() {
    for other_first in [true, false] {
        let rig = Rig::chaining(cfg(0, 2));
        let run = two_producers(&rig);
        let (ahead, other) = (&rig.sub[0], &rig.sub[1]);
        if other_first {
            other.finish(Outcome::Success);
            rig.drive("the wait for 2 to be settled", || ahead.chained().is_some_and(|(_, w)| w == Wait::Go));
            ahead.finish(Outcome::Success);
        } else {
            ahead.finish(Outcome::Success);
            assert_eq!(ahead.running_waits(), Wait::On(2), "3 waits for 2 before it starts");
            assert!(!rig.drive_briefly(|| ahead.running_waits() == Wait::None), "started before 2 ended");
            other.finish(Outcome::Success);
            rig.drive("3 to start once 2 succeeded", || ahead.running_waits() == Wait::None);
        }
        assert_eq!(ahead.running().map(|s| s.id()), Some(3));
        ahead.finish(Outcome::Success);
        rig.wait(&run).unwrap_or_else(|e| panic!("other first {other_first}: {e}"));
        assert_eq!(ids(&rig.dispatched()), [1, 2], "other first {other_first}: 3 was not dispatched");
        rig.assert_clean();
    }
}

#[test]
fn a_task_behind_two_producers_does_not_start_when_the_other_fails() {
    for other_first in [true, false] {
        let rig = Rig::chaining(cfg(0, 2));
        let run = two_producers(&rig);
        let (ahead, other) = (&rig.sub[0], &rig.sub[1]);
        if other_first {
            other.finish(Outcome::TaskFailure("boom 2".into()));
            rig.drive("the wait for 2 to be settled", || {
                ahead.chained().is_some_and(|(_, w)| w == Wait::NoGo)
            });
            ahead.finish(Outcome::Success);
        } else {
            ahead.finish(Outcome::Success);
            other.finish(Outcome::TaskFailure("boom 2".into()));
        }
        let err = rig.wait(&run).unwrap_err();
        assert_mentions(&err, &["boom 2"]);
        assert!(ahead.running().is_none(), "other first {other_first}: 3 started behind a failure");
        assert_eq!(run.stats().unwrap().failed, 2, "other first {other_first}: 2 and 3");
        rig.assert_clean();
    }
}

/// A task whose other producer is a running SUB group is not chained after one member: a
/// member's end is not the group's. It is dispatched once the whole group ended.
#[test]
fn a_task_after_a_running_group_is_not_chained_after_one_of_its_members() {
    let rig = Rig::chaining(cfg(0, 4));
    let (x, y, z) = (whole(buffer(1)), whole(buffer(2)), whole(buffer(3)));
    let (y0, y1) = (view(buffer(2), 0, 8), view(buffer(2), 8, 8));
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.submit_sub(&rig.host, args(1, &[(&x, Tag::Output)])).unwrap();
    orch.submit_sub_group(&rig.host, vec![args(20, &[(&y0, Tag::Output)]), args(21, &[(&y1, Tag::Output)])])
        .unwrap();
    orch.submit_sub(&rig.host, args(3, &[(&x, Tag::Input), (&y, Tag::Input)])).unwrap();
    orch.submit_sub(&rig.host, args(4, &[(&z, Tag::Output)])).unwrap();
    orch.finish(None);
    rig.drive("every task but 3 to start", || rig.sub.iter().all(|s| s.running().is_some()));
    // One member ends, then an unrelated task, whose end makes the scheduler look for chains
    // while 1 and the other member run.
    rig.sub[1].finish(Outcome::Success);
    rig.sub[3].finish(Outcome::Success);
    assert!(
        !rig.drive_briefly(|| rig.sub[0].chained().is_some()),
        "3 was chained behind 1 to wait for one member of the group"
    );
    rig.sub[0].finish(Outcome::Success);
    assert!(!rig.drive_briefly(|| rig.was_dispatched(3)), "3 started while a member of the group ran");
    rig.sub[2].finish(Outcome::Success);
    rig.drive("3 to be dispatched", || rig.was_dispatched(3));
    let lane = rig.sub.iter().find(|s| s.running().is_some()).expect("3 runs");
    lane.finish(Outcome::Success);
    rig.wait(&run).unwrap();
    assert!(rig.sub.iter().all(|s| s.history().iter().all(|t| !t.chained)), "nothing was chained");
    rig.assert_clean();
}

#[test]
fn two_tasks_wait_chained_behind_the_running_one_and_the_worker_starts_each() {
    let rig = Rig::chaining(cfg(0, 1));
    let run = rig.begin();
    three_in_a_row(&rig, &run).finish(None);
    let sub = &rig.sub[0];
    rig.drive("tasks 2 and 3 to be chained behind 1", || sub.chained_ids() == [2, 3]);
    sub.finish(Outcome::Success);
    assert_eq!((sub.running().map(|s| s.id()), sub.chained_ids()), (Some(2), vec![3]));
    sub.finish(Outcome::Success);
    assert_eq!(sub.running().map(|s| s.id()), Some(3));
    sub.finish(Outcome::Success);
    rig.wait(&run).unwrap();
    assert_eq!(ids(&rig.dispatched()), [1], "the scheduler started only the first");
    rig.assert_clean();
}

/// A chain of `CHAIN_DEPTH + 2` tasks on one worker: as many as the mailbox has frames for wait
/// behind the running one, chained in one pass; the last once the first ended; the scheduler
/// starts only the first.
#[test]
fn a_chain_waits_chain_depth_deep_and_refills_as_each_task_ends() {
    let depth = crate::engine::scheduler::CHAIN_DEPTH as u64;
    let last = depth + 2;
    let rig = Rig::chaining(cfg(0, 1));
    let run = rig.begin();
    let bufs: Vec<_> = (1..=last).map(|n| whole(buffer(n))).collect();
    let mut orch = rig.orch(&run);
    orch.submit_sub(&rig.host, args(1, &[(&bufs[0], Tag::Output)])).unwrap();
    for id in 2..=last {
        let (i, o) = (&bufs[id as usize - 2], &bufs[id as usize - 1]);
        orch.submit_sub(&rig.host, args(id, &[(i, Tag::Input), (o, Tag::Output)])).unwrap();
    }
    orch.finish(None);
    let sub = &rig.sub[0];
    let behind = |first: u64| (first..first + depth).collect::<Vec<_>>();
    rig.drive("the lane to fill behind task 1 in one pass", || sub.chained_ids() == behind(2));
    sub.finish(Outcome::Success);
    rig.drive("the last task to be chained once task 1 ended", || sub.chained_ids() == behind(3));
    for id in 2..=last {
        assert_eq!(sub.running().map(|s| s.id()), Some(id), "the worker started {id} itself");
        sub.finish(Outcome::Success);
    }
    rig.wait(&run).unwrap();
    assert_eq!(ids(&rig.dispatched()), [1], "the scheduler started only the first");
    rig.assert_clean();
}

#[test]
fn behind_a_failure_both_chained_tasks_are_answered_unrun() {
    let rig = Rig::chaining(cfg(0, 1));
    let run = rig.begin();
    three_in_a_row(&rig, &run).finish(None);
    let sub = &rig.sub[0];
    rig.drive("tasks 2 and 3 to be chained", || sub.chained_ids() == [2, 3]);
    sub.finish(Outcome::TaskFailure("boom 1".into()));
    assert!(sub.running().is_none(), "nothing started behind the failure");
    let err = rig.wait(&run).unwrap_err();
    assert_mentions(&err, &["boom 1"]);
    assert_eq!(handed(sub), [(1, false), (2, true), (3, true)]);
    assert_eq!(run.stats().unwrap().failed, 3);
    rig.assert_clean();
}

/// A task that also waits for a task on another lane is chained only as the first behind the
/// running task: 3 reads what 2 (chained behind 1) and 4 (on worker 1) write, so it is chained
/// behind 2 once 2 runs, not while 1 does.
#[test]
fn a_task_that_waits_for_another_lane_is_not_chained_two_deep() {
    let rig = Rig::chaining(cfg(0, 2));
    let (x, y, z) = (whole(buffer(1)), whole(buffer(2)), whole(buffer(3)));
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.submit_sub(&rig.host, args(1, &[(&x, Tag::Output)])).unwrap();
    orch.submit_sub(&rig.host, args(4, &[(&z, Tag::Output)])).unwrap();
    orch.submit_sub(&rig.host, args(2, &[(&x, Tag::Input), (&y, Tag::Output)])).unwrap();
    orch.submit_sub(&rig.host, args(3, &[(&y, Tag::Input), (&z, Tag::Input)])).unwrap();
    orch.finish(None);
    let (w0, w1) = (&rig.sub[0], &rig.sub[1]);
    rig.drive("task 2 to be chained behind 1", || w0.chained_ids() == [2]);
    assert!(!rig.drive_briefly(|| w0.chained_ids().len() > 1), "3 was chained two deep");
    w0.finish(Outcome::Success);
    rig.drive("task 3 to be chained behind 2, after 4", || {
        w0.chained().is_some_and(|(s, w)| s.id() == 3 && w == Wait::On(4))
    });
    w1.finish(Outcome::Success);
    w0.finish(Outcome::Success);
    rig.drive("task 3 to start", || {
        w0.running().is_some_and(|s| s.id() == 3) && w0.running_waits() == Wait::None
    });
    w0.finish(Outcome::Success);
    rig.wait(&run).unwrap();
    rig.assert_clean();
}

/// Nothing is chained behind a chained task whose wait for another lane is not settled: 2 is
/// chained behind 1 and after 4, and 3, which reads only what 2 writes, waits until 2 runs.
#[test]
fn nothing_is_chained_behind_a_task_that_waits_for_another_lane() {
    let rig = Rig::chaining(cfg(0, 2));
    let (x, y, z) = (whole(buffer(1)), whole(buffer(2)), whole(buffer(3)));
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.submit_sub(&rig.host, args(1, &[(&x, Tag::Output)])).unwrap();
    orch.submit_sub(&rig.host, args(4, &[(&z, Tag::Output)])).unwrap();
    orch.submit_sub(&rig.host, args(2, &[(&x, Tag::Input), (&z, Tag::Input), (&y, Tag::Output)])).unwrap();
    orch.submit_sub(&rig.host, args(3, &[(&y, Tag::Input)])).unwrap();
    orch.finish(None);
    let (w0, w1) = (&rig.sub[0], &rig.sub[1]);
    rig.drive("task 2 to be chained behind 1, after 4", || {
        w0.chained().is_some_and(|(s, w)| s.id() == 2 && w == Wait::On(4))
    });
    assert!(!rig.drive_briefly(|| w0.chained_ids().len() > 1), "3 was chained behind 2, which waits for 4");
    w1.finish(Outcome::Success);
    w0.finish(Outcome::Success);
    rig.drive("task 3 to be chained behind 2", || w0.chained_ids() == [3]);
    w0.finish(Outcome::Success);
    w0.finish(Outcome::Success);
    rig.wait(&run).unwrap();
    rig.assert_clean();
}

/// An endpoint that panics reporting the running task's end cannot be trusted with the two
/// chained behind it: both fail, the lane leaves service, and the run ends.
#[test]
fn a_lost_endpoint_fails_both_chained_tasks() {
    let rig = Rig::chaining(cfg(0, 1));
    sync::lock(&rig.faults.poll).insert(1);
    let run = rig.begin();
    three_in_a_row(&rig, &run).finish(None);
    rig.drive("tasks 2 and 3 to be chained", || rig.sub[0].chained_ids() == [2, 3]);
    rig.sub[0].finish(Outcome::Success);
    let err = rig.wait(&run).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    assert_eq!(run.stats().unwrap().failed, 3);
    assert_eq!(rig.in_flight(), 0, "nothing counted in flight after the lane was lost");
}

/// A cancelled run's tasks chained two deep each say that they did not run because the run
/// was cancelled, the second one too (not that the first one failed).
#[test]
fn the_chained_tasks_of_a_cancelled_run_say_it_was_cancelled() {
    let rig = Rig::chaining(cfg(0, 1));
    let run = rig.begin();
    three_in_a_row(&rig, &run).finish(None);
    rig.drive("tasks 2 and 3 to be chained", || rig.sub[0].chained_ids() == [2, 3]);
    assert!(RunHandle::new(run.clone(), &rig.eng).cancel());
    let err = rig.wait(&run).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
    let timeline = run.timeline().expect("captured");
    for r in timeline.records().iter().filter(|r| r.index > 0) {
        let e = r.error.as_deref().expect("it did not run");
        assert!(
            e.contains("did not run") && e.contains("cancelled") && !e.contains("failed"),
            "task {}: {e}",
            r.index
        );
    }
}

/// A scheduler panic during a pass abandons the run; a task chained behind one producer and
/// after another, told not to start, says that it did not run because of the panic, whichever
/// producer ends first.
#[test]
fn a_chained_task_of_a_run_abandoned_after_a_panic_says_why_it_did_not_run() {
    for other_first in [true, false] {
        chained_task_of_an_abandoned_run(other_first);
    }
}

fn chained_task_of_an_abandoned_run(other_first: bool) {
    let rig = Rig::chaining(cfg(0, 2));
    let run = two_producers(&rig);
    inject(&rig, Inject::Pass);
    rig.drive("the pass to panic and the run to be abandoned", || run.is_done());
    assert_eq!(rig.sub[0].chained().map(|(_, w)| w), Some(Wait::NoGo), "3 was told not to start");
    let (first, last) = if other_first { (1, 0) } else { (0, 1) };
    rig.sub[first].finish(Outcome::Success);
    rig.drive("the first producer's end to be polled", || rig.sub[first].ends_unpolled() == 0);
    rig.sub[last].finish(Outcome::Success);
    let err = rig.wait(&run).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    rig.drive("every slot of the run to be released", || rig.eng.window.live() == 0);
    let timeline = run.timeline().expect("captured");
    let third = timeline.records().iter().find(|r| r.index == 2).cloned().expect("task 3's record");
    let e = third.error.expect("it did not run");
    assert!(e.contains("did not run") && e.contains("panicked"), "{e}");
}
