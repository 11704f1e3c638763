//! Dead workers: a worker that dies while idle leaves service before it is given a task, the
//! Worker tells which of its workers live (and how the dead ones died), and a death below a
//! nested Worker is reported as a dead worker.

mod common;

use std::time::{Duration, Instant};

use common::*;
use simpler::{
    CallConfig, ChipFn, DataType, ErrorKind, HostArgs, HostFn, HostResult, Level, OrchFn, Orchestrator,
    TaskArgs, TensorView, Worker, WorkerKind, WorkerState,
};

/// Waits until the Worker has seen worker `i` end.
fn wait_seen_dead(w: &Worker, i: usize) {
    wait_for("the Worker to see its worker die", Duration::from_secs(10), || {
        w.workers().get(i).is_some_and(|s| !s.is_alive())
    });
}

#[test]
fn an_idle_sub_worker_killed_gets_no_task_and_the_survivor_runs_them() {
    if !in_own_process() {
        return;
    }
    let (rig, [record]) = Rig::start(subs(2), [("record_worker", record_worker)]);
    let pids = rig.pids().to_vec();
    let all = rig.workers();
    assert_eq!(all.len(), 2);
    assert!(all.iter().all(|w| w.kind == WorkerKind::Sub && w.state == WorkerState::Alive));
    assert_eq!(all.iter().map(|w| (w.id, w.pid)).collect::<Vec<_>>(), vec![(0, pids[0]), (1, pids[1])]);

    sigkill(pids[0]);
    wait_seen_dead(&rig, 0);
    let all = rig.workers();
    assert_eq!(all[0].state, WorkerState::Killed(libc::SIGKILL), "how sub worker 0 died");
    assert_eq!((all[0].kind, all[0].id, all[0].pid), (WorkerKind::Sub, 0, pids[0]));
    assert!(all[1].is_alive());
    assert_eq!(rig.child_pids(), vec![pids[1]], "only the live child is listed");
    assert!(!process_exists(pids[0]), "the dead child was reaped");

    // Both tasks go to the survivor, although sub worker 0 is first in line and idle.
    let who = u32_buffer(&rig, 2);
    who.write(0, &[u32::MAX, u32::MAX]).unwrap();
    rig.run(|orch| {
        for i in 0..2 {
            let mut a = TaskArgs::new();
            a.output(&u32s(&who, i))?;
            orch.submit_sub(&record, a)?;
        }
        Ok(())
    })
    .expect("both tasks run on the surviving SUB worker");
    assert_eq!(read_u32(&who, 0, 2), vec![1, 1]);
}

/// Word `i` of `b` as a one-element `u32` tensor.
fn u32s(b: &simpler::Buffer, i: usize) -> simpler::Tensor {
    b.view(TensorView::new(4 * i as u64, &[1], None, DataType::Uint32).expect("view")).expect("tensor")
}

#[test]
fn a_task_placed_on_a_chip_that_died_idle_fails_at_once_naming_the_chip() {
    if !in_own_process() {
        return;
    }
    let mut rig = Rig::new(Worker::builder().chips(2).chip_memory(64 << 20).chip_cores(2));
    let k = rig.register_chip(ChipFn::kernel("noop_kernel", noop)).unwrap();
    rig.init();
    let pids = rig.pids().to_vec();
    sigkill(pids[0]);
    wait_seen_dead(&rig, 0);
    let all = rig.workers();
    assert_eq!(
        (all[0].kind, all[0].id, all[0].state),
        (WorkerKind::Chip, 0, WorkerState::Killed(libc::SIGKILL))
    );
    assert_eq!((all[1].kind, all[1].id, all[1].state), (WorkerKind::Chip, 1, WorkerState::Alive));
    assert_eq!(rig.child_pids(), vec![pids[1]]);

    let started = Instant::now();
    let err = rig
        .run(|orch| orch.submit_next_level(&k, TaskArgs::new(), CallConfig::default(), 0).map(|_| ()))
        .expect_err("chip 0 is dead");
    assert!(started.elapsed() < Duration::from_secs(5), "the task failed at once");
    assert_err(
        &err,
        ErrorKind::WorkerDied,
        &["noop_kernel", "cannot run", "chip 0", "died while idle", "SIGKILL"],
    );
    rig.run(|orch| orch.submit_next_level(&k, TaskArgs::new(), CallConfig::default(), 1).map(|_| ()))
        .expect("chip 1 still runs work");
}

/// Where [`block_pid`] announces its process id (named after its parent, the L3 Worker).
fn marker_path(l3_pid: u32) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("simpler-rt-dead-block-{l3_pid}"))
}

/// Announces its process id (a SUB worker of the L3 Worker), then blocks for up to 30 s: the
/// test kills it meanwhile.
fn block_pid(_: &HostArgs<'_>) -> HostResult {
    let l3_pid = std::os::unix::process::parent_id();
    let tmp = marker_path(l3_pid).with_extension("tmp");
    std::fs::write(&tmp, std::process::id().to_string())?;
    std::fs::rename(&tmp, marker_path(l3_pid))?;
    spin_until(Instant::now() + Duration::from_secs(30), || false);
    Err("never killed".into())
}

fn l3_block(orch: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    orch.submit_sub(&HostFn::new("block_pid", block_pid).handle(), TaskArgs::new()).map(|_| ())
}

fn l3_noop(orch: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    orch.submit_sub(&HostFn::new("noop", noop).handle(), TaskArgs::new()).map(|_| ())
}

#[test]
fn a_sub_worker_killed_under_a_nested_worker_is_reported_as_a_dead_worker() {
    if !in_own_process() {
        return;
    }
    let mut rig = Rig::new(Worker::builder().level(Level::Network1));
    let mut l3 = Worker::builder().sub_workers(1).build().unwrap();
    l3.register(HostFn::new("block_pid", block_pid)).unwrap();
    l3.register(HostFn::new("noop", noop)).unwrap();
    rig.add_worker(l3).unwrap();
    let block = rig.register_orch(OrchFn::new("l3_block", l3_block)).unwrap();
    let l3_noop = rig.register_orch(OrchFn::new("l3_noop", l3_noop)).unwrap();
    rig.init();
    let l3_pid = rig.pids()[0];
    let marker = marker_path(l3_pid as u32);
    let _ = std::fs::remove_file(&marker);
    let run = rig
        .submit(|orch| orch.submit_next_level(&block, TaskArgs::new(), CallConfig::default(), 0).map(|_| ()))
        .unwrap();
    wait_for("the L3's SUB task to be running", Duration::from_secs(20), || marker.exists());
    let sub_pid: i32 = std::fs::read_to_string(&marker).unwrap().trim().parse().unwrap();
    std::fs::remove_file(&marker).unwrap();
    assert_ne!(sub_pid, l3_pid);
    sigkill(sub_pid);
    let err = run.wait().expect_err("the L3's SUB worker died");
    assert_err(&err, ErrorKind::WorkerDied, &["l3_block", "worker 0", "block_pid", "SIGKILL"]);
    // The nested Worker itself lives on; its work needing a SUB worker fails the same way.
    let all = rig.workers();
    assert_eq!((all[0].kind, all[0].id, all[0].state), (WorkerKind::Nested, 0, WorkerState::Alive));
    let err = rig
        .run(|orch| orch.submit_next_level(&l3_noop, TaskArgs::new(), CallConfig::default(), 0).map(|_| ()))
        .expect_err("the L3 has no live SUB worker");
    assert_err(&err, ErrorKind::WorkerDied, &["l3_noop", "noop", "0 are alive"]);
}
