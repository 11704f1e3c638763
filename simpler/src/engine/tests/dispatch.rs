//! Where tasks go: NEXT_LEVEL singles on their worker in FIFO order, groups that reserve their
//! targets and launch together, SUB tasks on any idle SUB worker.

use super::*;

// ---------------------------------------------------------------------------------- NEXT_LEVEL singles

#[test]
fn singles_run_on_their_worker_in_fifo_order_and_busy_workers_block_only_themselves() {
    let script = Script::new();
    let rig = Rig::threaded(cfg(3, 0), &script);
    script.hold(100); // the first task of worker 0 blocks its lane
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    for k in 0..4u64 {
        for w in 0..3u32 {
            let id = (u64::from(w) + 1) * 100 + k;
            orch.submit_next_level(&rig.chip, args(id, &[]), cc(), w).unwrap();
        }
    }
    orch.finish(None);
    // Workers 1 and 2 drain their whole FIFOs while worker 0 is stuck on its first task.
    rig.drive("workers 1 and 2 to finish", || script.ended(203) && script.ended(303));
    assert!(rig.was_dispatched(100));
    for id in [101, 102, 103] {
        assert!(!rig.was_dispatched(id), "task {id} dispatched while worker 0 was busy");
    }
    script.release(100);
    rig.wait(&run).unwrap();
    for w in 0..3u32 {
        let on_lane: Vec<u64> = rig
            .dispatched()
            .into_iter()
            .filter(|s| s.lane == LaneKind::NextLevel(w))
            .map(|s| s.id())
            .collect();
        let want: Vec<u64> = (0..4).map(|k| (u64::from(w) + 1) * 100 + k).collect();
        assert_eq!(on_lane, want, "worker {w} ran exactly its own tasks, in submit order");
        // And the behaviour really ran them there.
        let ran: Vec<u64> = script
            .events()
            .into_iter()
            .filter_map(|e| match e {
                Ev::Start(l, id, _) if l == LaneKind::NextLevel(w) => Some(id),
                _ => None,
            })
            .collect();
        assert_eq!(ran, want);
    }
    let stats = run.stats().unwrap();
    assert_eq!((stats.tasks, stats.failed), (12, 0));
    rig.assert_clean();
}

// ---------------------------------------------------------------------------------- groups

#[test]
fn group_head_reserves_its_targets_and_launches_all_members_together() {
    let script = Script::new();
    let rig = Rig::threaded(cfg(3, 0), &script);
    let (a, g, s1, s2) = (1, 2, 3, 4);
    script.hold(a);
    script.meet(g, 2); // both members must be running at once
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.submit_next_level(&rig.chip, args(a, &[]), cc(), 0).unwrap();
    script
        .wait_for("A to start on worker 0", |s| s.events.contains(&Ev::Start(LaneKind::NextLevel(0), a, 0)));
    orch.submit_next_level_group(&rig.chip, vec![args(g, &[]), args(g, &[])], cc(), &[0, 1]).unwrap();
    orch.submit_next_level(&rig.chip, args(s1, &[]), cc(), 1).unwrap();
    orch.submit_next_level(&rig.chip, args(s2, &[]), cc(), 2).unwrap();
    orch.finish(None);
    // Worker 2 is not reserved: its single runs and completes while the group waits.
    rig.drive("S2 to run and be drained", || script.ended(s2) && rig.in_flight() == 1);
    assert!(!rig.was_dispatched(g), "the group launched while worker 0 was busy");
    assert!(!rig.was_dispatched(s1), "a single took worker 1, which the waiting group head reserved");
    script.release(a);
    rig.wait(&run).unwrap(); // the rendezvous inside the group would fail if members were not concurrent
    let d = rig.dispatched();
    let order: Vec<(u64, LaneKind, u32)> = d.iter().map(|s| (s.id(), s.lane, s.member)).collect();
    assert_eq!(
        order,
        vec![
            (a, LaneKind::NextLevel(0), 0),
            (s2, LaneKind::NextLevel(2), 0),
            (g, LaneKind::NextLevel(0), 0),
            (g, LaneKind::NextLevel(1), 1),
            (s1, LaneKind::NextLevel(1), 0),
        ]
    );
    // The reserved single ran only after the group member on its worker ended.
    let g_end = script.pos(|e| *e == Ev::End(LaneKind::NextLevel(1), g, 1));
    let s1_start = script.pos(|e| matches!(e, Ev::Start(_, id, _) if *id == s1));
    assert!(g_end < s1_start);
    rig.assert_clean();
}

#[test]
fn group_members_get_their_own_args_on_their_own_workers() {
    let script = Script::new();
    let rig = Rig::threaded(cfg(3, 0), &script);
    let x = buffer(1);
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    let list = (0..3u64).map(|i| args(10 + i, &[(&view(x, i * 4, 4), Tag::Output)])).collect();
    orch.submit_next_level_group(&rig.chip, list, cc(), &[2, 0, 1]).unwrap();
    orch.finish(None);
    rig.wait(&run).unwrap();
    let mut got: Vec<(u64, LaneKind, u32)> =
        rig.dispatched().iter().map(|s| (s.id(), s.lane, s.member)).collect();
    got.sort_by_key(|t| t.0);
    assert_eq!(
        got,
        vec![
            (10, LaneKind::NextLevel(2), 0),
            (11, LaneKind::NextLevel(0), 1),
            (12, LaneKind::NextLevel(1), 2)
        ]
    );
    let mut ran: Vec<Ev> = script.events().into_iter().filter(|e| matches!(e, Ev::Start(..))).collect();
    ran.sort_by_key(|e| match e {
        Ev::Start(_, id, _) | Ev::End(_, id, _) => *id,
    });
    assert_eq!(
        ran,
        vec![
            Ev::Start(LaneKind::NextLevel(2), 10, 0),
            Ev::Start(LaneKind::NextLevel(0), 11, 1),
            Ev::Start(LaneKind::NextLevel(1), 12, 2)
        ]
    );
    let dag = rig.dag(&run);
    assert_eq!(dag.graph().node_count(), 1);
    assert_eq!(dag.graph()[dag.node(0).unwrap()].members, 3);
    rig.assert_clean();
}

#[test]
fn failing_group_member_fails_the_group_and_poisons_its_consumers() {
    let script = Script::new();
    let rig = Rig::threaded(cfg(2, 0), &script);
    let (x, y) = (buffer(1), buffer(2));
    script.fail(1, Some(1)); // member 1 of the group fails, member 0 succeeds
    // The members wait until every task is submitted: a build makes scheduler passes as it
    // goes, and a run that has already failed refuses further submits.
    script.hold(1);
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    let members = vec![args(1, &[(&view(x, 0, 8), Tag::Output)]), args(1, &[(&view(x, 8, 8), Tag::Output)])];
    orch.submit_next_level_group(&rig.chip, members, cc(), &[0, 1]).unwrap();
    orch.submit_next_level(&rig.chip, args(2, &[(&whole(x), Tag::Input), (&whole(y), Tag::Output)]), cc(), 0)
        .unwrap();
    orch.submit_next_level(&rig.chip, args(3, &[(&whole(y), Tag::Input)]), cc(), 1).unwrap();
    orch.finish(None);
    script.release(1);
    let err = rig.wait(&run).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TaskFailed, "{err}");
    assert!(err.message().contains("boom 1.1"), "the run's first error is the member's: {err}");
    assert!(err.message().contains("worker 1"), "{err}");
    assert!(script.ended(1), "member 0 ran");
    assert_eq!(ids(&rig.dispatched()), vec![1, 1], "consumers of the failed group never ran");
    let stats = run.stats().unwrap();
    assert_eq!((stats.tasks, stats.failed), (3, 3));
    rig.assert_clean();
}

/// A task for worker 1 in a new run starts: no reservation from an earlier run holds it.
fn assert_worker_1_free_in_a_new_run(rig: &Rig, held: &str) {
    let run2 = rig.begin();
    let mut orch = rig.orch(&run2);
    orch.submit_next_level(&rig.chip, args(3, &[]), cc(), 1).unwrap();
    orch.finish(None);
    let started =
        rig.eng.drive_until(|| rig.nl[1].running().is_some(), Some(Instant::now() + Duration::from_secs(1)));
    if started {
        rig.nl[1].finish(Outcome::Success);
        rig.wait(&run2).unwrap();
    }
    assert!(started, "{held}");
    rig.assert_clean();
}

#[test]
fn cancelled_waiting_group_releases_its_reservation() {
    // A group waiting at the head reserves its targets. If the run is cancelled while it waits,
    // the reservation must go with it, or later runs can never use those workers.
    let rig = Rig::manual(cfg(2, 0));
    let run1 = rig.begin();
    let mut orch = rig.orch(&run1);
    orch.submit_next_level(&rig.chip, args(1, &[]), cc(), 0).unwrap();
    orch.submit_next_level_group(&rig.chip, vec![args(2, &[]), args(2, &[])], cc(), &[0, 1]).unwrap();
    assert!(rig.nl[1].running().is_none(), "the group must wait for worker 0");
    orch.finish(Some(&Error::invalid("orchestration failed")));
    rig.nl[0].finish(Outcome::Success);
    assert!(rig.wait(&run1).is_err());

    assert_worker_1_free_in_a_new_run(
        &rig,
        "worker 1 stays reserved by a group that was cancelled in an earlier run",
    );
}

#[test]
fn group_failed_for_a_dead_target_releases_its_reservation() {
    // Same reservation, another way out: the busy target dies, the waiting group fails.
    let rig = Rig::manual(cfg(2, 0));
    let run1 = rig.begin();
    let mut orch = rig.orch(&run1);
    orch.submit_next_level(&rig.chip, args(1, &[]), cc(), 0).unwrap();
    orch.submit_next_level_group(&rig.chip, vec![args(2, &[]), args(2, &[])], cc(), &[0, 1]).unwrap();
    orch.finish(None);
    rig.nl[0].finish(Outcome::EndpointFailure("child exited".into()));
    let err = rig.wait(&run1).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WorkerDied);
    assert_eq!(run1.stats().unwrap().failed, 2, "the group failed: one of its targets is dead");

    assert_worker_1_free_in_a_new_run(
        &rig,
        "worker 1 (alive) stays reserved by a group that failed in an earlier run",
    );
}

// ---------------------------------------------------------------------------------- SUB workers

#[test]
fn sub_single_goes_to_any_idle_sub_worker() {
    let rig = Rig::manual(cfg(0, 3));
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    for id in 1..=4 {
        orch.submit_sub(&rig.host, args(id, &[])).unwrap();
    }
    let lanes: Vec<LaneKind> = rig.dispatched().iter().map(|s| s.lane).collect();
    assert_eq!(lanes.len(), 3);
    for (i, l) in lanes.iter().enumerate() {
        assert!(
            !lanes[..i].contains(l),
            "three distinct idle SUB workers took the first three tasks: {lanes:?}"
        );
    }
    assert!(!rig.was_dispatched(4));
    let freed = rig.sub[1].finish(Outcome::Success);
    rig.drive("task 4 to start", || rig.was_dispatched(4));
    assert_eq!(rig.sub[1].running().map(|s| s.id()), Some(4), "task 4 took the freed worker");
    assert_ne!(freed.id(), 4);
    for c in &rig.sub {
        c.finish(Outcome::Success);
    }
    orch.finish(None);
    rig.wait(&run).unwrap();
    rig.assert_clean();
}

#[test]
fn sub_group_takes_distinct_idle_workers_at_once_or_waits() {
    let rig = Rig::manual(cfg(0, 3));
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.submit_sub(&rig.host, args(1, &[])).unwrap(); // sub 0
    orch.submit_sub_group(&rig.host, vec![args(10, &[]), args(11, &[])]).unwrap(); // subs 1, 2
    let members: Vec<(u64, u32, LaneKind)> =
        rig.dispatched().iter().skip(1).map(|s| (s.id(), s.member, s.lane)).collect();
    assert_eq!(members, vec![(10, 0, LaneKind::Sub(1)), (11, 1, LaneKind::Sub(2))]);
    orch.submit_sub_group(&rig.host, vec![args(20, &[]), args(21, &[])]).unwrap(); // waits
    orch.submit_sub(&rig.host, args(30, &[])).unwrap(); // behind the waiting group
    assert_eq!(rig.dispatched().len(), 3);
    rig.sub[1].finish(Outcome::Success); // one idle worker: not enough for the group
    rig.drive("member 10 drained", || rig.in_flight() == 2);
    assert_eq!(rig.dispatched().len(), 3, "a SUB group launches whole or not at all, and blocks the FIFO");
    rig.sub[0].finish(Outcome::Success);
    rig.drive("group 2 to launch", || rig.was_dispatched(20));
    let g2: Vec<(u64, LaneKind)> = rig.dispatched().iter().skip(3).map(|s| (s.id(), s.lane)).collect();
    assert_eq!(g2, vec![(20, LaneKind::Sub(0)), (21, LaneKind::Sub(1))]);
    assert!(!rig.was_dispatched(30));
    rig.sub[2].finish(Outcome::Success);
    rig.drive("task 30", || rig.was_dispatched(30));
    assert_eq!(rig.sub[2].running().map(|s| s.id()), Some(30));
    for c in &rig.sub {
        c.finish(Outcome::Success);
    }
    orch.finish(None);
    rig.wait(&run).unwrap();
    rig.assert_clean();
}

#[test]
fn sub_task_needing_more_workers_than_exist_is_refused_at_submit() {
    let rig = Rig::manual(cfg(0, 2));
    let y = buffer(1);
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    let list = (0..3).map(|i| args(i + 1, &[(&view(y, i * 4, 4), Tag::Output)])).collect();
    let e = err_of(orch.submit_sub_group(&rig.host, list));
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("needs 3 SUB workers at once but this Worker has 2"), "{e}");
    // Nothing was submitted: the run is still usable.
    orch.submit_sub(&rig.host, args(9, &[(&whole(y), Tag::Output)])).unwrap();
    rig.sub[0].finish(Outcome::Success);
    orch.finish(None);
    rig.wait(&run).unwrap();
    rig.assert_clean();

    let rig = Rig::manual(cfg(1, 0));
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    let e = err_of(orch.submit_sub(&rig.host, args(1, &[])));
    assert!(e.message().contains("no SUB workers"), "{e}");
    orch.finish(None);
    rig.wait(&run).unwrap();
    rig.assert_clean();
}

/// A lane holds a task from its dispatch to its end, as a worker's replacement is asked to see
/// (`Engine::lane_holds_task`, the cheap look before a lost remote Worker is rejoined).
#[test]
fn a_lane_holds_its_task_from_dispatch_to_end() {
    let rig = Rig::manual(cfg(0, 1));
    assert!(!rig.eng.lane_holds_task(0), "an idle lane holds none");
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.submit_sub(&rig.host, args(1, &[])).unwrap();
    orch.finish(None);
    rig.drive("task 1 to start", || rig.was_dispatched(1));
    assert!(rig.eng.lane_holds_task(0), "its running task");
    rig.sub[0].finish(Outcome::Success);
    rig.wait(&run).unwrap();
    assert!(!rig.eng.lane_holds_task(0), "none once it ended");
    assert!(!rig.eng.lane_holds_task(7), "nor a lane that does not exist");
    rig.assert_clean();
}
