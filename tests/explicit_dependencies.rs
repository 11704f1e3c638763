//! Explicit dependencies (`add_dep`, `add_dep_wait`) between tasks that share no tensor.
//!
//! Every task appends its id to a shared log (a `NoDep` scratch buffer, so the log itself adds
//! no edge) at an atomic index. A task that has a successor holds before appending, so a
//! successor that wrongly ran alongside it would append first.

mod common;

use common::*;
use simpler::{DataType, ErrorKind, RunOptions, TaskArgs, TaskHandle, memory::TensorView, trace::EdgeReason};

const HOLD_US: u64 = 15_000;

/// Arguments of a `log_append` task: the log, its id and hold time.
fn log_args(log: &simpler::Buffer, id: u64, hold_us: u64) -> TaskArgs {
    let mut a = TaskArgs::new();
    a.untracked(&words_of(log)).unwrap().scalar(id).scalar(hold_us);
    a
}

/// The ids appended so far, in append order.
fn log_entries(log: &simpler::Buffer) -> Vec<u32> {
    let n = read_u32(log, 1, 1)[0] as usize;
    read_u32(log, 2, n)
}

fn edge_reason(dag: &simpler::trace::RunDag, from: u32, to: u32) -> EdgeReason {
    let (a, b) = (dag.node(from).unwrap(), dag.node(to).unwrap());
    let e =
        dag.graph().find_edge(a, b).unwrap_or_else(|| panic!("no edge {from} -> {to}:\n{}", dag.to_dot()));
    dag.graph()[e]
}

#[isolated_test]
fn add_dep_and_add_dep_wait_order_tasks_without_tensors() {
    let (rig, [log_fn]) = Rig::start(subs(2), [("log", log_append)]);
    let log = u32_buffer(&rig, 16);
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            let t0 = orch.submit_sub(&log_fn, log_args(&log, 0, HOLD_US))?;
            let mut a1 = log_args(&log, 1, HOLD_US);
            a1.add_dep(t0);
            let t1 = orch.submit_sub(&log_fn, a1)?;
            let mut a2 = log_args(&log, 2, HOLD_US);
            a2.add_dep_wait(t1);
            let t2 = orch.submit_sub(&log_fn, a2)?;
            let mut a3 = log_args(&log, 3, 0);
            a3.add_dep(t2).add_dep_wait(t0);
            orch.submit_sub(&log_fn, a3)?;
            Ok(())
        })
        .unwrap();
    run.wait().unwrap();
    assert_eq!(log_entries(&log), vec![0, 1, 2, 3]);
    let dag = run.dag().unwrap();
    assert_eq!(edge_reason(&dag, 0, 1), EdgeReason::Explicit { retain: true });
    assert_eq!(edge_reason(&dag, 1, 2), EdgeReason::Explicit { retain: false });
    assert_eq!(edge_reason(&dag, 2, 3), EdgeReason::Explicit { retain: true });
    assert_eq!(edge_reason(&dag, 0, 3), EdgeReason::Explicit { retain: false });
    assert_eq!(dag.graph().edge_count(), 4);
    let dot = dag.to_dot();
    assert!(
        dot.contains("t0 -> t1 [label=\"add_dep\"]") && dot.contains("t1 -> t2 [label=\"add_dep_wait\"]"),
        "{dot}"
    );
}

#[isolated_test]
fn fan_in_waits_for_every_producer_while_producers_run_in_parallel() {
    let (rig, [log_fn]) = Rig::start(subs(2), [("log", log_append)]);
    let log = u32_buffer(&rig, 16);
    rig.run(|orch| {
        // Two independent producers; each holds until the other arrives (or the hold ends).
        let p0 = orch.submit_sub(&log_fn, log_args(&log, 0, HOLD_US))?;
        let p1 = orch.submit_sub(&log_fn, log_args(&log, 1, HOLD_US))?;
        let mut c = log_args(&log, 2, 0);
        c.add_dep(p0).add_dep_wait(p1);
        orch.submit_sub(&log_fn, c)?;
        Ok(())
    })
    .unwrap();
    let entries = log_entries(&log);
    assert_eq!(entries.len(), 3);
    assert_eq!(entries[2], 2, "the consumer runs after both producers: {entries:?}");
}

#[isolated_test]
fn dependency_on_a_retired_producer_is_skipped() {
    // With a window of one task, the second submit can only proceed once task 0 completed and
    // was reclaimed (its scope ended): the dependency then names a retired task.
    let (rig, [log_fn]) = Rig::start(subs(1).task_window(1), [("log", log_append)]);
    let log = u32_buffer(&rig, 16);
    rig.run(|orch| {
        let t0 = orch.scope(|o| o.submit_sub(&log_fn, log_args(&log, 0, 0)))?;
        let mut a = log_args(&log, 1, 0);
        a.add_dep(t0).add_dep_wait(t0);
        orch.submit_sub(&log_fn, a)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(log_entries(&log), vec![0, 1]);
}

#[isolated_test]
fn task_handle_of_another_run_is_rejected() {
    let (rig, [log_fn]) = Rig::start(subs(1), [("log", log_append)]);
    let log = u32_buffer(&rig, 16);
    let mut first: Option<TaskHandle> = None;
    rig.run(|orch| {
        first = Some(orch.submit_sub(&log_fn, log_args(&log, 0, 0))?);
        Ok(())
    })
    .unwrap();
    let first = first.unwrap();
    let mut second_run = 0;
    rig.run(|orch| {
        second_run = orch.run_id();
        let mut a = log_args(&log, 1, 0);
        a.add_dep(first);
        let err = orch.submit_sub(&log_fn, a).expect_err("a handle of another run");
        assert_err(
            &err,
            ErrorKind::InvalidArgument,
            &["log", &format!("of run {}", first.run_id()), &format!("this is run {}", orch.run_id())],
        );
        let mut b = log_args(&log, 2, 0);
        b.add_dep_wait(first);
        expect_err(orch.submit_sub(&log_fn, b), ErrorKind::InvalidArgument, &["same run"]);
        assert_eq!(orch.task_count(), 0, "a refused submit adds no task");
        // The run itself is still usable.
        orch.submit_sub(&log_fn, log_args(&log, 3, 0))?;
        Ok(())
    })
    .unwrap();
    assert_ne!(first.run_id(), second_run);
    assert_eq!(log_entries(&log), vec![0, 3]);
}

#[isolated_test]
fn explicit_dependency_on_a_group_waits_for_every_member() {
    let (rig, [member, snapshot]) = Rig::start(subs(2), [("member", member), ("snapshot", snapshot)]);
    let scratch = u32_buffer(&rig, 1);
    let who = u32_buffer(&rig, 2);
    who.write(0, &[u32::MAX; 2]).unwrap();
    let seen = u32_buffer(&rig, 2);
    rig.run(|orch| {
        let members = (0..2u64)
            .map(|i| {
                let slot = who.view(TensorView::new(4 * i, &[1], None, DataType::Uint32)?)?;
                let mut a = TaskArgs::new();
                a.untracked(&words_of(&scratch))?.untracked(&slot)?;
                // Member 1 holds after the rendezvous, so it finishes well after member 0.
                a.scalar(2).scalar(5_000).scalar(if i == 1 { HOLD_US } else { 0 });
                Ok(a)
            })
            .collect::<simpler::Result<Vec<_>>>()?;
        let g = orch.submit_sub_group(&member, members)?;
        // No tensor links the snapshot to the group: only the explicit dependency orders it.
        let mut a = TaskArgs::new();
        a.untracked(&words_of(&who))?.output(&words_of(&seen))?;
        a.add_dep_wait(g);
        orch.submit_sub(&snapshot, a)?;
        Ok(())
    })
    .unwrap();
    let mut w = read_u32(&seen, 0, 2);
    w.sort_unstable();
    assert_eq!(w, vec![0, 1], "the dependent task saw both members' results (distinct workers)");
}
