//! Run deadlines and cancellation: a run past its deadline (`RunOptions::deadline`,
//! `WorkerBuilder::run_deadline`) or cancelled (`RunHandle::cancel`) fails naming the task, its
//! callable, its worker and the deadline; the workers running its tasks are killed and leave
//! service; its tasks not started are never dispatched; later runs proceed on the workers left.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use simpler::{
    Buffer, ErrorKind, HostArgs, HostFn, HostResult, OrchFn, Orchestrator, RunHandle, RunOptions, TaskArgs,
    Tensor, Worker, chip::CallConfig, chip::ChipFn, dsl::In, status::Level, status::WorkerState,
};

/// Never returns. Tensor 0: one scratch `u32` word (`NoDep`) that receives this process's id
/// first, so the test knows it runs and where.
fn hang(args: &HostArgs<'_>) -> HostResult {
    words(args, 0)?[0].store(std::process::id(), Ordering::SeqCst);
    loop {
        std::thread::park();
    }
}

/// Word `i` of `b` as a one-element `u32` tensor.
fn word(b: &Buffer, i: usize) -> Tensor {
    b.view(
        simpler::memory::TensorView::new(4 * i as u64, &[1], None, simpler::DataType::Uint32).expect("view"),
    )
    .expect("tensor")
}

/// Submits one `hang` task whose scratch word is word `i` of `flags`.
fn submit_hang(
    orch: &mut Orchestrator<'_>,
    hang: &simpler::CallableHandle,
    flags: &Buffer,
    i: usize,
) -> simpler::Result<simpler::TaskHandle> {
    let mut a = TaskArgs::new();
    a.untracked(&word(flags, i))?;
    orch.submit_sub(hang, a)
}

/// Waits until word `i` of `flags` holds the pid of the `hang` task that runs; returns it.
fn wait_hanging(flags: &Buffer, i: usize) -> i32 {
    let mut pid = 0;
    wait_for("the hanging task to start", Duration::from_secs(10), || {
        pid = read_u32(flags, i, 1)[0];
        pid != 0
    });
    pid as i32
}

/// The SUB worker index of child `pid`.
fn sub_index(rig: &Rig, pid: i32) -> usize {
    rig.pids().iter().position(|&p| p == pid).expect("a child of the rig")
}

/// Asserts that child `i` was killed with SIGKILL and reaped, and that the others live.
#[track_caller]
fn assert_only_killed(rig: &Rig, killed: &[usize]) {
    for (i, w) in rig.workers().iter().enumerate() {
        if killed.contains(&i) {
            assert_eq!(w.state, WorkerState::Killed(libc::SIGKILL), "worker {i} was stopped: {w:?}");
            assert!(!process_exists(w.pid), "the stopped worker {} was reaped", w.pid);
        } else {
            assert!(w.is_alive(), "worker {i} was not stopped: {w:?}");
        }
    }
}

/// Runs `record_worker` once; returns the SUB worker index it ran on.
fn ran_on(rig: &Rig, record: &simpler::CallableHandle) -> u32 {
    let who = u32_buffer(rig, 1);
    who.write(0, &[u32::MAX]).unwrap();
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.output(&word(&who, 0))?;
        orch.submit_sub(record, a).map(|_| ())
    })
    .expect("a later run proceeds");
    read_u32(&who, 0, 1)[0]
}

fn hang_run(rig: &Rig, hang: &simpler::CallableHandle, flags: &Buffer, options: RunOptions) -> RunHandle {
    rig.submit_with(options, |orch, _, _| submit_hang(orch, hang, flags, 0).map(|_| ())).expect("submit")
}

#[isolated_test]
fn a_run_past_its_deadline_fails_naming_task_callable_worker_and_deadline() {
    let (rig, [hang, record]) = Rig::start(subs(2), [("hang", hang), ("record_worker", record_worker)]);
    let flags = u32_buffer(&rig, 1);
    let started = Instant::now();
    let run = hang_run(&rig, &hang, &flags, RunOptions::new().deadline(Duration::from_millis(200)));
    let err = run.wait().expect_err("the task never returns");
    let took = started.elapsed();
    let stuck = sub_index(&rig, wait_hanging(&flags, 0));
    assert_err(
        &err,
        ErrorKind::Timeout,
        &[
            &format!("run {}", run.id()),
            "deadline of 200 ms",
            "task 0",
            "hang",
            &format!("on sub worker {stuck}"),
            "stopped",
        ],
    );
    assert!(took >= Duration::from_millis(200), "the run was stopped before its deadline: {took:?}");
    assert!(took < Duration::from_secs(2), "the run was stopped {took:?} after its submit");
    assert_only_killed(&rig, &[stuck]);
    assert_eq!(run.stats().unwrap().failed, 1);
    assert_eq!(run.wait().unwrap_err().message(), err.message(), "the same result again");
    assert!(!run.cancel(), "a finished run cannot be cancelled");
    // Later runs go to the SUB worker left.
    assert_eq!(ran_on(&rig, &record) as usize, 1 - stuck);
    assert_eq!(ran_on(&rig, &record) as usize, 1 - stuck);
}

#[isolated_test]
fn a_run_behind_a_stuck_one_is_dispatched_to_the_idle_sub_worker_once_the_first_is_stopped() {
    let (rig, [hang, record]) = Rig::start(subs(2), [("hang", hang), ("record_worker", record_worker)]);
    let flags = u32_buffer(&rig, 1);
    let who = u32_buffer(&rig, 1);
    who.write(0, &[u32::MAX]).unwrap();
    // The stuck task also holds `who`, which the second run writes: so the second waits for
    // the first although a SUB worker is idle (runs that share a buffer dispatch in order).
    let first = rig
        .submit_with(RunOptions::new().deadline(Duration::from_millis(300)), |orch, _, _| {
            let mut a = TaskArgs::new();
            a.untracked(&word(&flags, 0))?.inout(&word(&who, 0))?;
            orch.submit_sub(&hang, a).map(|_| ())
        })
        .unwrap();
    let stuck = sub_index(&rig, wait_hanging(&flags, 0));
    let second = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.output(&word(&who, 0))?;
            orch.submit_sub(&record, a).map(|_| ())
        })
        .unwrap();
    second.wait().expect("the second run runs once the first is stopped");
    assert_eq!(read_u32(&who, 0, 1)[0] as usize, 1 - stuck, "it ran on the idle SUB worker");
    expect_err(first.wait(), ErrorKind::Timeout, &["deadline of 300 ms", "hang"]);
    assert_only_killed(&rig, &[stuck]);
}

#[isolated_test]
fn a_third_submit_behind_a_stuck_run_times_out_naming_the_cause_until_the_run_is_cancelled() {
    let backpressure = Duration::from_millis(300);
    let (rig, [hang, fill]) =
        Rig::start(subs(2).pipeline_depth(2).submit_timeout(backpressure), [("hang", hang), ("fill", fill)]);
    let flags = u32_buffer(&rig, 1);
    let out = u64_buffer(&rig, 2);
    let fill_run = |i: usize, v: u64| {
        rig.submit(|orch| {
            let mut a = TaskArgs::new();
            a.output(&u64s(&out, i, 1))?.scalar(v);
            orch.submit_sub(&fill, a).map(|_| ())
        })
    };
    // The stuck task also names `out` (tracked), so the fill runs, which write it, are
    // ordered behind its run (runs that name no buffer in common are not: issue 31).
    let first = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.untracked(&word(&flags, 0))?.output(&u64s(&out, 0, 2))?;
            orch.submit_sub(&hang, a).map(|_| ())
        })
        .expect("submit");
    let stuck = sub_index(&rig, wait_hanging(&flags, 0));
    let second = fill_run(0, 7).unwrap();
    let started = Instant::now();
    let err = fill_run(1, 8).expect_err("two runs are admitted and the first never ends");
    let took = started.elapsed();
    assert_err(
        &err,
        ErrorKind::Timeout,
        &[
            "Worker.submit",
            "submit timeout of 300ms",
            "pipeline_depth 2",
            &format!("run {}", first.id()),
            "RunHandle::cancel",
        ],
    );
    assert!(
        took >= backpressure && took < backpressure + Duration::from_secs(2),
        "the submit waited {took:?}"
    );
    assert_eq!(read_u64(&out, 0, 2), vec![0, 0], "nothing of run 2 ran behind the stuck run");

    assert!(first.cancel());
    expect_err(first.wait(), ErrorKind::Cancelled, &[&format!("run {}", first.id()), "cancelled", "hang"]);
    second.wait().expect("run 2 runs once run 1 is cancelled");
    fill_run(1, 8).unwrap().wait().expect("a new run is admitted");
    assert_eq!(read_u64(&out, 0, 2), vec![7, 8]);
    assert_only_killed(&rig, &[stuck]);
}

#[isolated_test]
fn cancel_stops_a_running_run_and_later_runs_proceed() {
    let (rig, [hang, record]) = Rig::start(subs(2), [("hang", hang), ("record_worker", record_worker)]);
    let flags = u32_buffer(&rig, 1);
    let run = hang_run(&rig, &hang, &flags, RunOptions::new());
    let stuck = sub_index(&rig, wait_hanging(&flags, 0));
    let started = Instant::now();
    assert!(run.cancel(), "a running run is cancelled");
    let err = run.wait().expect_err("cancelled");
    assert!(started.elapsed() < Duration::from_secs(2), "cancel took {:?}", started.elapsed());
    assert_err(
        &err,
        ErrorKind::Cancelled,
        &[&format!("run {}", run.id()), "cancelled", "task 0", "hang", &format!("sub worker {stuck}")],
    );
    assert!(!run.cancel(), "cancelling a finished run does nothing");
    assert_only_killed(&rig, &[stuck]);
    assert_eq!(ran_on(&rig, &record) as usize, 1 - stuck);
}

#[isolated_test]
fn cancel_never_dispatches_a_task_waiting_behind_a_stuck_one() {
    let (rig, [hang, fill, record]) =
        Rig::start(subs(2), [("hang", hang), ("fill", fill), ("record_worker", record_worker)]);
    let flags = u32_buffer(&rig, 2);
    let out = u64_buffer(&rig, 1);
    let run = rig
        .submit(|orch| {
            let first = submit_hang(orch, &hang, &flags, 0)?;
            let mut behind = TaskArgs::new();
            behind.output(&u64s(&out, 0, 1))?.scalar(6);
            behind.add_dep_wait(first);
            orch.submit_sub(&fill, behind).map(|_| ())
        })
        .unwrap();
    let stuck = sub_index(&rig, wait_hanging(&flags, 0));
    assert!(run.cancel());
    let err = run.wait().expect_err("cancelled");
    assert_err(
        &err,
        ErrorKind::Cancelled,
        &["task 0", "hang", &format!("sub worker {stuck}"), "it was stopped"],
    );
    assert_eq!(read_u64(&out, 0, 1), vec![0], "the task behind the stuck one never ran");
    let stats = run.stats().unwrap();
    assert_eq!((stats.tasks, stats.failed), (2, 2));
    assert_only_killed(&rig, &[stuck]);
    assert_eq!(ran_on(&rig, &record) as usize, 1 - stuck, "the live SUB worker was idle all along");
}

#[isolated_test]
fn a_cancelled_run_queued_behind_a_stuck_one_never_dispatches_its_tasks() {
    let (rig, [hang, fill]) = Rig::start(subs(2), [("hang", hang), ("fill", fill)]);
    let flags = u32_buffer(&rig, 2);
    let out = u64_buffer(&rig, 2);
    // The stuck task also holds `out`, which run 2 writes: so run 2 waits for run 1 (runs that
    // share a buffer dispatch in order; an independent run would go to the idle SUB worker).
    let stuck_run = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.untracked(&word(&flags, 0))?.inout(&u64s(&out, 0, 2))?;
            orch.submit_sub(&hang, a).map(|_| ())
        })
        .unwrap();
    let stuck = sub_index(&rig, wait_hanging(&flags, 0));
    // Run 2's first task is READY, its second waits for the first.
    let queued = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.output(&u64s(&out, 0, 1))?.scalar(5);
            let first = orch.submit_sub(&fill, a)?;
            let mut b = TaskArgs::new();
            b.output(&u64s(&out, 1, 1))?.scalar(6);
            b.add_dep_wait(first);
            orch.submit_sub(&fill, b).map(|_| ())
        })
        .unwrap();
    assert!(queued.cancel());
    let err = queued.wait().expect_err("cancelled");
    assert_err(&err, ErrorKind::Cancelled, &[&format!("run {}", queued.id()), "no task of it was running"]);
    assert_eq!(queued.stats().unwrap().failed, 2);
    assert_only_killed(&rig, &[]);
    // Once run 1 is gone, a SUB worker is idle: nothing of run 2 may reach it.
    assert!(stuck_run.cancel());
    expect_err(stuck_run.wait(), ErrorKind::Cancelled, &["hang"]);
    let after = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.output(&u64s(&out, 1, 1))?.scalar(9);
            orch.submit_sub(&fill, a).map(|_| ())
        })
        .unwrap();
    after.wait().expect("a later run runs on the SUB worker left");
    assert_eq!(read_u64(&out, 0, 2), vec![0, 9], "the cancelled run's tasks never ran");
    assert_only_killed(&rig, &[stuck]);
}

#[isolated_test]
fn a_deadline_that_does_not_pass_changes_nothing_then_or_later() {
    let (rig, [fill, block]) = Rig::start(subs(1), [("fill", fill), ("block_on_flag", block_on_flag)]);
    let out = u64_buffer(&rig, 2);
    let deadline = Duration::from_millis(300);
    let fast = rig
        .submit_with(RunOptions::new().deadline(deadline), |orch, _, _| {
            let mut a = TaskArgs::new();
            a.output(&u64s(&out, 0, 1))?.scalar(3);
            orch.submit_sub(&fill, a).map(|_| ())
        })
        .unwrap();
    fast.wait().expect("a fast run meets its deadline");
    assert_eq!(fast.stats().unwrap().failed, 0);
    // A later run without a deadline outlives the first one's: nothing stops it.
    let flag = u32_buffer(&rig, 2);
    let slow = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.untracked(&words_of(&flag))?.output(&u64s(&out, 1, 1))?.scalar(60_000).scalar(4);
            orch.submit_sub(&block, a).map(|_| ())
        })
        .unwrap();
    wait_blocked(&flag);
    expect_err(
        slow.wait_timeout(deadline + Duration::from_millis(200)),
        ErrorKind::Timeout,
        &["still running"],
    );
    release(&flag);
    slow.wait().expect("the slow run is not stopped by another run's deadline");
    assert_eq!(read_u64(&out, 0, 2), vec![3, 4]);
    assert_only_killed(&rig, &[]);
}

#[isolated_test]
fn a_deadline_is_enforced_while_nobody_waits() {
    let (rig, [hang]) = Rig::start(subs(2), [("hang", hang)]);
    let flags = u32_buffer(&rig, 1);
    let started = Instant::now();
    let run = hang_run(&rig, &hang, &flags, RunOptions::new().deadline(Duration::from_millis(200)));
    let stuck = sub_index(&rig, wait_hanging(&flags, 0));
    // Nobody waits on the run nor polls it: the background thread stops it by itself.
    wait_for("the stuck worker to be killed", Duration::from_secs(5), || !rig.workers()[stuck].is_alive());
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_only_killed(&rig, &[stuck]);
    expect_err(
        run.wait(),
        ErrorKind::Timeout,
        &["deadline of 200 ms", "hang", &format!("sub worker {stuck}")],
    );
}

#[isolated_test]
fn the_worker_wide_run_deadline_applies_unless_a_run_sets_its_own() {
    let (rig, [hang, block]) = Rig::start(
        subs(2).run_deadline(Duration::from_millis(200)),
        [("hang", hang), ("block_on_flag", block_on_flag)],
    );
    let flags = u32_buffer(&rig, 1);
    let run = hang_run(&rig, &hang, &flags, RunOptions::new());
    expect_err(run.wait(), ErrorKind::Timeout, &["deadline of 200 ms", "hang"]);
    // A longer deadline of its own: still running well after the Worker's.
    let flag = u32_buffer(&rig, 2);
    let own = rig
        .submit_with(RunOptions::new().deadline(Duration::from_secs(60)), |orch, _, _| {
            let mut a = TaskArgs::new();
            a.untracked(&words_of(&flag))?.scalar(60_000);
            orch.submit_sub(&block, a).map(|_| ())
        })
        .unwrap();
    wait_blocked(&flag);
    expect_err(own.wait_timeout(Duration::from_millis(500)), ErrorKind::Timeout, &["still running"]);
    release(&flag);
    own.wait().expect("its own deadline is far");
}

fn l3_hang(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    let mut a = TaskArgs::new();
    a.untracked(args.tensor(0).expect("the scratch word"))?;
    orch.submit_sub(&HostFn::new("hang", hang).handle(), a).map(|_| ())
}

#[isolated_test]
fn a_deadline_at_l4_kills_the_nested_worker_running_the_stuck_task() {
    let mut l3 = Worker::builder().sub_workers(1).build().unwrap();
    l3.register(HostFn::new("hang", hang)).unwrap();
    let mut rig = Rig::new(
        Worker::builder().level(Level::Network1).backpressure_timeout(Duration::from_secs(5)).worker(l3),
    );
    let l3_hang = rig.register_orch(OrchFn::new("l3_hang", l3_hang)).unwrap();
    rig.init();
    let flags = u32_buffer(&rig, 1);
    let l3_pid = rig.pids()[0];
    let run = rig
        .submit_with(RunOptions::new().deadline(Duration::from_millis(300)), |orch, _, _| {
            let mut a = TaskArgs::new();
            a.untracked(&word(&flags, 0))?;
            orch.submit_next_level(&l3_hang, a, CallConfig::default(), 0).map(|_| ())
        })
        .unwrap();
    let sub_pid = wait_hanging(&flags, 0);
    assert_ne!(sub_pid, l3_pid);
    let err = run.wait().expect_err("the L3's task never returns");
    assert_err(&err, ErrorKind::Timeout, &["deadline of 300 ms", "task 0", "l3_hang", "worker 0"]);
    assert_only_killed(&rig, &[0]);
    wait_for("the L3's SUB worker to die with it", Duration::from_secs(5), || !process_alive(sub_pid));
}

/// A chip kernel that never returns.
fn hang_kernel(_args: &HostArgs<'_>) -> HostResult {
    loop {
        std::thread::park();
    }
}

#[isolated_test]
fn a_deadline_kills_the_chip_running_the_stuck_kernel_and_names_it() {
    let mut rig = Rig::new(Worker::builder().chips(2).chip_memory(16 << 20).chip_cores(1));
    let k = rig.register_chip(ChipFn::kernel("hang_kernel", hang_kernel)).unwrap();
    let ok = rig.register_chip(ChipFn::kernel("noop_kernel", noop)).unwrap();
    rig.init();
    let err = rig
        .run_with(RunOptions::new().deadline(Duration::from_millis(300)), |orch, _, _| {
            orch.submit_next_level(&k, TaskArgs::new(), CallConfig::default(), 1).map(|_| ())
        })
        .expect_err("the kernel never returns");
    assert_err(&err, ErrorKind::Timeout, &["deadline of 300 ms", "task 0 `hang_kernel`", "on chip 1"]);
    assert_only_killed(&rig, &[1]);
    rig.run(|orch| orch.submit_next_level(&ok, TaskArgs::new(), CallConfig::default(), 0).map(|_| ()))
        .expect("chip 0 still runs work");
}

#[isolated_test]
fn a_deadline_is_enforced_while_the_run_is_still_being_built() {
    let (rig, [hang, fill]) = Rig::start(subs(2), [("hang", hang), ("fill", fill)]);
    let flags = u32_buffer(&rig, 1);
    let out = u64_buffer(&rig, 1);
    // `run_with` announces that this thread will wait, but it is still in the orchestration
    // function when the deadline passes: the background thread stops the run all the same.
    let mut refused = None;
    let err = rig
        .run_with(RunOptions::new().deadline(Duration::from_millis(200)), |orch, _, _| {
            submit_hang(orch, &hang, &flags, 0)?;
            let stuck = sub_index(&rig, wait_hanging(&flags, 0));
            wait_for("the stuck worker to be killed during the build", Duration::from_secs(5), || {
                !rig.workers()[stuck].is_alive()
            });
            let mut a = TaskArgs::new();
            a.output(&u64s(&out, 0, 1))?.scalar(1);
            let r = orch.submit_sub(&fill, a).map(|_| ());
            refused = r.clone().err();
            r
        })
        .expect_err("the run was stopped");
    // The submit after the stop was refused with the run's error, and the run gives that error.
    let refused = refused.expect("the submit after the stop is refused");
    assert_err(&refused, ErrorKind::Timeout, &["refused", "deadline of 200 ms", "hang"]);
    assert_err(&err, ErrorKind::Timeout, &["deadline of 200 ms", "hang"]);
    assert!(!err.message().contains("refused"), "{err}");
    assert_eq!(read_u64(&out, 0, 1), vec![0]);
}

#[isolated_test]
fn with_replacement_a_worker_stopped_by_a_deadline_comes_back_for_the_next_run() {
    // One SUB worker: without replacement nothing could run after the stuck task is stopped.
    let (rig, [hang, record]) =
        Rig::start(subs(1).replace_dead_workers(true), [("hang", hang), ("record_worker", record_worker)]);
    let flags = u32_buffer(&rig, 1);
    for round in 0..3 {
        flags.write(0, &[0u32]).unwrap();
        let before = rig.child_pids();
        let run = hang_run(&rig, &hang, &flags, RunOptions::new().deadline(Duration::from_millis(100)));
        let err = run.wait().expect_err("the task never returns");
        assert_err(&err, ErrorKind::Timeout, &["deadline of 100 ms", "hang", "on sub worker 0"]);
        assert_eq!(ran_on(&rig, &record), 0, "round {round}: the next run runs on a new sub worker 0");
        let after = rig.child_pids();
        assert_eq!(after.len(), 1);
        assert_ne!(after, before, "round {round}: a new process");
    }
    let last = rig.child_pids();
    drop(flags);
    drop(rig);
    assert!(last.iter().all(|&p| !process_exists(p)));
}

/// Never returns (a typed callable).
#[simpler::callable(sub)]
fn stuck(_x: In<u32>) {
    loop {
        std::thread::park();
    }
}

simpler::task_graph! {
    /// One task that never returns.
    fn stuck_graph(x: In<u32>) {
        stuck(x).on(sub());
    }
}

#[isolated_test]
fn a_graph_run_past_the_deadline_of_its_call_fails_naming_the_deadline() {
    let mut rig = Rig::new(subs(1));
    rig.init();
    let b = rig.create_buffer(4).unwrap();
    let x = simpler::dsl::TensorOf::<u32>::new(b.tensor(&[1], simpler::DataType::Uint32).unwrap()).unwrap();
    let t = Instant::now();
    let err = stuck_graph::call(&x)
        .unwrap()
        .run_with(&rig, simpler::RunOptions::new().deadline(Duration::from_millis(300)))
        .unwrap_err();
    expect_err(Err::<(), _>(err), ErrorKind::Timeout, &["deadline", "stuck"]);
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

/// A submit past the admitted runs waits until one finishes, by default without a time limit:
/// here well past the back-pressure timeout (which bounds task windows and heaps, not runs),
/// until another thread cancels the stuck run (issue 31: it failed after 10 s).
#[isolated_test]
fn a_submit_behind_a_stuck_run_waits_for_room_by_default() {
    let (rig, [hang, fill]) = Rig::start(
        subs(2).pipeline_depth(1).backpressure_timeout(Duration::from_millis(200)),
        [("hang", hang), ("fill", fill)],
    );
    let flags = u32_buffer(&rig, 1);
    let out = u64_buffer(&rig, 1);
    let first = hang_run(&rig, &hang, &flags, RunOptions::new());
    let stuck = sub_index(&rig, wait_hanging(&flags, 0));
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            // A long run, not a condition: the submit below must still be waiting then.
            std::thread::sleep(Duration::from_millis(1000));
            assert!(first.cancel());
        });
        let second = rig
            .submit(|orch| {
                let mut a = TaskArgs::new();
                a.output(&u64s(&out, 0, 1))?.scalar(9);
                orch.submit_sub(&fill, a).map(|_| ())
            })
            .expect("the submit waits for room instead of failing");
        assert!(started.elapsed() >= Duration::from_millis(900), "admitted after {:?}", started.elapsed());
        second.wait().unwrap();
    });
    assert_eq!(read_u64(&out, 0, 1), vec![9]);
    assert_only_killed(&rig, &[stuck]);
}

/// A run's own deadline bounds its wait for room, with an error that says so.
#[isolated_test]
fn a_runs_deadline_bounds_its_wait_for_room() {
    let (rig, [hang, fill]) = Rig::start(subs(2).pipeline_depth(1), [("hang", hang), ("fill", fill)]);
    let flags = u32_buffer(&rig, 1);
    let out = u64_buffer(&rig, 1);
    let first = hang_run(&rig, &hang, &flags, RunOptions::new());
    let stuck = sub_index(&rig, wait_hanging(&flags, 0));
    let started = Instant::now();
    let err = rig
        .submit_with(RunOptions::new().deadline(Duration::from_millis(300)), |orch, _, _| {
            let mut a = TaskArgs::new();
            a.output(&u64s(&out, 0, 1))?.scalar(9);
            orch.submit_sub(&fill, a).map(|_| ())
        })
        .expect_err("the first run never ends");
    let took = started.elapsed();
    assert_err(
        &err,
        ErrorKind::Timeout,
        &["deadline of 300ms passed while it waited for room", &format!("run {}", first.id())],
    );
    assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(2), "waited {took:?}");
    assert!(first.cancel());
    first.wait().expect_err("cancelled");
    assert_only_killed(&rig, &[stuck]);
}

/// A graceful cancel stops dispatch at once, lets the running task end on its own (its worker
/// stays in service), and fails the tasks behind it unstarted.
#[isolated_test]
fn a_graceful_cancel_lets_running_tasks_end_and_starts_nothing_more() {
    let (rig, [block, fill]) = Rig::start(subs(2), [("block_on_flag", block_on_flag), ("fill", fill)]);
    let flag = u32_buffer(&rig, 2);
    let out = u64_buffer(&rig, 2);
    let run = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.untracked(&words_of(&flag))?.output(&u64s(&out, 0, 1))?.scalar(20_000).scalar(5);
            let first = orch.submit_sub(&block, a)?;
            let mut behind = TaskArgs::new();
            behind.output(&u64s(&out, 1, 1))?.scalar(6);
            behind.add_dep_wait(first);
            orch.submit_sub(&fill, behind).map(|_| ())
        })
        .unwrap();
    wait_blocked(&flag);
    assert!(run.cancel_gracefully(Duration::from_secs(20)), "a running run is cancelled");
    assert!(!run.is_done(), "its running task goes on");
    assert!(!run.cancel(), "a cancelled run cannot be cancelled again");
    release(&flag);
    let err = run.wait().expect_err("cancelled");
    assert_err(
        &err,
        ErrorKind::Cancelled,
        &[&format!("run {}", run.id()), "cancelled gracefully", "block_on_flag", "up to 20s to end"],
    );
    assert_eq!(read_u64(&out, 0, 2), vec![5, 0], "the running task ended its work; the one behind never ran");
    let stats = run.stats().unwrap();
    assert_eq!((stats.tasks, stats.failed), (2, 1), "the running task completed");
    assert_only_killed(&rig, &[]);
}

/// A task still running when a graceful cancel's grace is over is stopped like `cancel` stops
/// it (its worker killed), and the run ends then.
#[isolated_test]
fn a_task_still_running_after_the_grace_is_stopped() {
    let (rig, [hang]) = Rig::start(subs(2), [("hang", hang)]);
    let flags = u32_buffer(&rig, 1);
    let run = hang_run(&rig, &hang, &flags, RunOptions::new());
    let stuck = sub_index(&rig, wait_hanging(&flags, 0));
    let started = Instant::now();
    assert!(run.cancel_gracefully(Duration::from_millis(300)));
    let err = run.wait().expect_err("cancelled");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(300), "stopped before its grace was over: {took:?}");
    assert!(took < Duration::from_secs(5), "the grace bounds it: {took:?}");
    assert_err(&err, ErrorKind::Cancelled, &["cancelled gracefully", "hang", "up to 300 ms to end"]);
    assert_only_killed(&rig, &[stuck]);
}
