//! Dead workers: a worker that dies while idle leaves service before it is given a task, the
//! Worker tells which of its workers live (and how the dead ones died), and a death below a
//! nested Worker is reported as a dead worker.

mod common;

use std::time::{Duration, Instant};

use common::*;
use simpler::{
    DataType, ErrorKind, HostArgs, HostFn, HostResult, OrchFn, Orchestrator, TaskArgs, Worker,
    chip::CallConfig, chip::ChipFn, memory::TensorView, status::Level, status::WorkerKind,
    status::WorkerState,
};

/// Waits until the Worker has seen worker `i` end.
fn wait_seen_dead(w: &Worker, i: usize) {
    wait_for("the Worker to see its worker die", Duration::from_secs(10), || {
        w.workers().get(i).is_some_and(|s| !s.is_alive())
    });
}

#[isolated_test]
fn an_idle_sub_worker_killed_gets_no_task_and_the_survivor_runs_them() {
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

#[isolated_test]
fn a_task_placed_on_a_chip_that_died_idle_fails_at_once_naming_the_chip() {
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

/// Announces its process id (a SUB worker of the L3 Worker) in marker `dead-block` of its
/// parent, the L3 Worker, then waits until the test kills it.
fn block_pid(_: &HostArgs<'_>) -> HostResult {
    announce_to_parent("dead-block", &std::process::id().to_string())?;
    park_until_killed()
}

fn l3_block(orch: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    orch.submit_sub(&HostFn::new("block_pid", block_pid).handle(), TaskArgs::new()).map(|_| ())
}

fn l3_noop(orch: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    orch.submit_sub(&HostFn::new("noop", noop).handle(), TaskArgs::new()).map(|_| ())
}

#[isolated_test]
fn a_sub_worker_killed_under_a_nested_worker_is_reported_as_a_dead_worker() {
    let mut l3 = Worker::builder().sub_workers(1).build().unwrap();
    l3.register(HostFn::new("block_pid", block_pid)).unwrap();
    l3.register(HostFn::new("noop", noop)).unwrap();
    let mut rig = Rig::new(Worker::builder().level(Level::Network1).worker(l3));
    let block = rig.register_orch(OrchFn::new("l3_block", l3_block)).unwrap();
    let l3_noop = rig.register_orch(OrchFn::new("l3_noop", l3_noop)).unwrap();
    rig.init();
    let l3_pid = rig.pids()[0];
    let marker = marker_file("dead-block", l3_pid as u32);
    let _files = TempFiles::new([marker.clone()]);
    let run = rig
        .submit(|orch| orch.submit_next_level(&block, TaskArgs::new(), CallConfig::default(), 0).map(|_| ()))
        .unwrap();
    let sub_pid: i32 = wait_for_marker(&marker, "the L3's SUB task to be running").trim().parse().unwrap();
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
    assert_err(&err, ErrorKind::WorkerDied, &["l3_noop", "noop", "0 are alive", "sub worker 0", "SIGKILL"]);
}

/// `who[0] = 7`: a host function registered only after `init`.
fn late_seven(args: &HostArgs<'_>) -> HostResult {
    args.output::<u32>(0)?[0] = 7;
    Ok(())
}

/// Runs `f` with `who[i]` as its only output.
fn run_into(w: &Worker, f: &simpler::CallableHandle, who: &simpler::Buffer, i: usize) -> simpler::Result<()> {
    w.run(|orch| {
        let mut a = TaskArgs::new();
        a.output(&u32s(who, i))?;
        orch.submit_sub(f, a).map(|_| ())
    })
}

#[isolated_test]
fn a_dead_sub_worker_is_replaced_with_everything_registered_and_runs_tasks_again() {
    let (mut rig, [record]) = Rig::start(subs(1), [("record_worker", record_worker)]);
    let late = rig.register(HostFn::new("late_seven", late_seven)).unwrap(); // after init
    let old = rig.pids()[0];
    sigkill(old);
    wait_seen_dead(&rig, 0);
    let who = u32_buffer(&rig, 2);
    let err = run_into(&rig, &record, &who, 0).expect_err("no live SUB worker");
    assert_err(&err, ErrorKind::WorkerDied, &["record_worker", "0 are alive", "sub worker 0", "SIGKILL"]);

    let new = rig.replace_worker(WorkerKind::Sub, 0).expect("replace sub worker 0");
    assert_eq!((new.kind, new.id, new.state), (WorkerKind::Sub, 0, WorkerState::Alive));
    assert_ne!(new.pid, old);
    assert_eq!(rig.child_pids(), vec![new.pid]);
    // What was registered before init and after it both reach the new worker.
    run_into(&rig, &record, &who, 0).expect("the replacement runs a host function registered before init");
    run_into(&rig, &late, &who, 1).expect("and one registered after init");
    assert_eq!(read_u32(&who, 0, 2), vec![0, 7]);
    // And one registered after the replacement.
    let later = rig.register(HostFn::new("noop", noop)).unwrap();
    rig.run(|orch| orch.submit_sub(&later, TaskArgs::new()).map(|_| ())).unwrap();
    // A live worker is not replaced.
    let err = rig.replace_worker(WorkerKind::Sub, 0).unwrap_err();
    assert_err(&err, ErrorKind::InvalidState, &["sub worker 0", "alive"]);
    rig.close().unwrap();
    assert!(!process_exists(new.pid), "the replacement was reaped at close");
}

#[isolated_test]
fn a_worker_built_to_replace_dead_workers_does_so_at_the_next_submit() {
    let (rig, [record]) = Rig::start(subs(2).replace_dead_workers(true), [("record_worker", record_worker)]);
    let pids = rig.pids().to_vec();
    let who = u32_buffer(&rig, 2);
    for round in 0..3 {
        for &pid in &rig.child_pids() {
            sigkill(pid);
        }
        wait_for("both workers to be seen dead", Duration::from_secs(10), || {
            rig.workers().iter().all(|w| !w.is_alive())
        });
        rig.run(|orch| {
            let members = (0..2)
                .map(|i| {
                    let mut a = TaskArgs::new();
                    a.output(&u32s(&who, i))?;
                    Ok(a)
                })
                .collect::<simpler::Result<Vec<_>>>()?;
            orch.submit_sub_group(&record, members).map(|_| ())
        })
        .unwrap_or_else(|e| panic!("round {round}: the run after both workers died: {e}"));
        let mut got = read_u32(&who, 0, 2);
        got.sort_unstable();
        assert_eq!(got, vec![0, 1], "round {round}: both new workers ran a member");
        let now = rig.child_pids();
        assert_eq!(now.len(), 2);
        assert!(now.iter().all(|p| !pids.contains(p)), "round {round}: new processes");
    }
    let last = rig.child_pids();
    drop(who);
    drop(rig);
    assert!(last.iter().all(|&p| !process_exists(p)), "the replacements were reaped at close");
}

#[isolated_test]
fn a_replaced_chip_runs_kernels_and_refuses_the_device_buffers_lost_with_the_old_one() {
    let mut rig = Rig::new(Worker::builder().chips(2).chip_memory(16 << 20).chip_cores(1));
    let add = rig.register_chip(ChipFn::kernel("vadd", vadd)).unwrap();
    rig.init();
    let lost = rig.alloc_child_tensor(1, &[16], DataType::Float32).unwrap();
    let kept = rig.alloc_child_tensor(0, &[16], DataType::Float32).unwrap();
    sigkill(rig.pids()[1]);
    wait_seen_dead(&rig, 1);
    let new = rig.replace_worker(WorkerKind::Chip, 1).expect("replace chip 1");
    assert_eq!((new.kind, new.id, new.state), (WorkerKind::Chip, 1, WorkerState::Alive));
    let (a, b, out) =
        (rig.create_buffer(64).unwrap(), rig.create_buffer(64).unwrap(), rig.create_buffer(64).unwrap());
    a.write(0, &[1.0f32; 16]).unwrap();
    b.write(0, &[2.0f32; 16]).unwrap();
    let t = |x: &simpler::Buffer| x.tensor(&[16], DataType::Float32).unwrap();
    let (ta, tb, to) = (t(&a), t(&b), t(&out));
    rig.run(|orch| {
        let mut args = TaskArgs::new();
        args.input(&ta)?.input(&tb)?.output(&to)?;
        orch.submit_next_level(&add, args, CallConfig::default(), 1).map(|_| ())
    })
    .expect("the new chip 1 runs a kernel registered before init");
    assert_eq!(out.read::<f32>(0, 16).unwrap(), vec![3.0f32; 16]);
    let err = rig.copy_to(&lost, &a).unwrap_err();
    assert_err(&err, ErrorKind::InvalidState, &["lost with chip 1", "replaced"]);
    rig.copy_to(&kept, &a).expect("chip 0's buffers are untouched");
    rig.free(&kept).unwrap();
    let pid = new.pid;
    rig.close().unwrap();
    assert!(!process_exists(pid));
}

#[isolated_test]
fn replacing_is_refused_where_it_cannot_work_saying_why() {
    let (rig, _) = Rig::start(subs(1).start_method(simpler::StartMethod::Fork), [("noop", noop)]);
    sigkill(rig.pids()[0]);
    wait_seen_dead(&rig, 0);
    let err = rig.replace_worker(WorkerKind::Sub, 0).unwrap_err();
    assert_err(&err, ErrorKind::InvalidState, &["sub worker 0", "StartMethod::Exec"]);
    let err = rig.replace_worker(WorkerKind::Sub, 3).unwrap_err();
    assert_err(&err, ErrorKind::InvalidArgument, &["no Sub worker 3"]);
    drop(rig);

    let l3 = Worker::builder().sub_workers(1).build().unwrap();
    let mut l4 = Rig::new(Worker::builder().level(Level::Network1).worker(l3));
    l4.init();
    sigkill(l4.pids()[0]);
    wait_seen_dead(&l4, 0);
    let err = l4.replace_worker(WorkerKind::Nested, 0).unwrap_err();
    assert_err(&err, ErrorKind::InvalidArgument, &["nested Worker", "close this Worker"]);
}

#[expect(unsafe_code, reason = "signal(2) has no safe wrapper in std")]
fn ignore_sigchld() {
    // SAFETY: signal(2) with a valid signal number and SIG_IGN; no handler runs.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
}

/// A program that ignores SIGCHLD (a common way to have no zombies) makes the kernel reap
/// every child at once, so a dead worker's exit status is gone before the Worker reads it. The
/// death is still seen (the Worker watches each child through a pidfd), a task that needs the
/// worker fails naming it and saying why how it ended is unknown, and close leaves nothing.
#[isolated_test]
fn a_worker_that_dies_in_a_program_ignoring_sigchld_is_seen_and_named() {
    ignore_sigchld();
    let (rig, [record]) = Rig::start(subs(1), [("record_worker", record_worker)]);
    let pid = rig.pids()[0];
    let who = u32_buffer(&rig, 1);
    let record_once = || {
        rig.run(|orch| {
            let mut a = TaskArgs::new();
            a.output(&u32s(&who, 0))?;
            orch.submit_sub(&record, a).map(|_| ())
        })
    };
    record_once().expect("the SUB worker runs");
    sigkill(pid);
    wait_seen_dead(&rig, 0);
    assert_eq!(rig.workers()[0].state, WorkerState::Lost, "how it ended is unknown");
    let err = record_once().expect_err("no SUB worker is left");
    assert_err(&err, ErrorKind::WorkerDied, &["sub worker 0", &format!("process {pid}"), "SIGCHLD"]);
}

/// Writes this worker's process id, then never returns (its run is cancelled).
fn hang_with_pid(args: &HostArgs<'_>) -> HostResult {
    args.output::<u32>(0)?[0] = std::process::id();
    loop {
        std::thread::park();
    }
}

/// A dead worker is replaced at the next submit while the background thread holds the
/// scheduler role and sleeps, driving a run nobody waits for whose task hangs. The replacement
/// used to wait for the scheduler's lock, which that thread keeps while it sleeps, and the
/// submit hung until something woke the scheduler (here: forever).
#[isolated_test]
fn a_dead_worker_is_replaced_while_the_background_thread_drives_a_hung_run() {
    let (rig, [hang, record]) = Rig::start(
        subs(2).replace_dead_workers(true),
        [("hang_with_pid", hang_with_pid), ("record_worker", record_worker)],
    );
    let flag = u32_buffer(&rig, 1);
    let stuck = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.output(&u32s(&flag, 0))?;
            orch.submit_sub(&hang, a).map(|_| ())
        })
        .unwrap();
    wait_for("the hanging task to run", Duration::from_secs(10), || read_u32(&flag, 0, 1)[0] != 0);
    let hung = read_u32(&flag, 0, 1)[0] as i32;
    let other = rig.pids().iter().position(|&p| p != hung).unwrap();
    sigkill(rig.pids()[other]);
    wait_seen_dead(&rig, other);
    let rig = std::sync::Arc::new(rig);
    let (tx, rx) = std::sync::mpsc::channel();
    let submitter = {
        let rig = rig.clone();
        std::thread::spawn(move || {
            let who = u32_buffer(&rig, 1);
            who.write(0, &[u32::MAX]).unwrap();
            let ran = rig.run(|orch| {
                let mut a = TaskArgs::new();
                a.output(&u32s(&who, 0))?;
                orch.submit_sub(&record, a).map(|_| ())
            });
            let _ = tx.send(ran.map(|()| read_u32(&who, 0, 1)[0]));
        })
    };
    let ran = rx.recv_timeout(Duration::from_secs(20)).expect("a submit replacing a dead worker hung");
    assert_eq!(ran.expect("the run on the replacement"), other as u32, "it ran on the new worker");
    submitter.join().unwrap();
    assert!(stuck.cancel());
    assert_eq!(stuck.wait().unwrap_err().kind(), ErrorKind::Cancelled);
    drop((stuck, flag));
}
