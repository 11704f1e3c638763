//! Processes that user code makes inside the Worker's processes: a fork whose child returns
//! into the worker (a host function, a chip kernel, an orchestration function of a nested
//! Worker), and processes a host function starts and leaves running.

mod common;

use std::time::Duration;

use common::*;
use simpler::{
    CallConfig, ChipFn, DataType, ErrorKind, HostArgs, HostFn, HostResult, Level, OrchFn, Orchestrator,
    Result, TaskArgs, Worker,
};

/// What [`fork_and_wait`] writes when the forked copy did not end within its time.
const STILL_RUNNING: u32 = 255;

/// Forks, and returns `Ok(())` in the child (into the worker, as returning from a fork in any
/// function does); the parent waits up to 5 s for the child to end, and returns how it ended:
/// its exit status, or [`STILL_RUNNING`] (it is then killed and reaped).
#[expect(unsafe_code, reason = "fork(2) has no safe wrapper in std")]
fn fork_then_return() -> std::result::Result<Option<u32>, String> {
    // SAFETY: fork(2) in a worker process; the child returns from here into the worker, which
    // is what the tests below exercise, and the parent reaps it (`wait_process`).
    let pid = unsafe { libc::fork() };
    match pid {
        p if p < 0 => Err(format!("fork: {}", std::io::Error::last_os_error())),
        0 => Ok(None),
        child => Ok(Some(wait_process(child, Duration::from_secs(5)).map_or(STILL_RUNNING, |c| c as u32))),
    }
}

/// A host function (or chip kernel) that forks: the child returns `Ok(())`; the parent writes
/// how the child ended and its own process id to tensor 0 (two `u32`s).
fn fork_and_wait(args: &HostArgs<'_>) -> HostResult {
    let out = args.output::<u32>(0)?;
    if let Some(status) = fork_then_return()? {
        out[0] = status;
        out[1] = std::process::id();
    }
    Ok(())
}

/// Writes `[0, its process id]` to tensor 0 (two `u32`s).
fn record_pid(args: &HostArgs<'_>) -> HostResult {
    args.output::<u32>(0)?.copy_from_slice(&[0, std::process::id()]);
    Ok(())
}

/// Forks and returns in both processes: the parent does not wait for its child.
#[expect(unsafe_code, reason = "fork(2) has no safe wrapper in std")]
fn fork_and_forget(_args: &HostArgs<'_>) -> HostResult {
    // SAFETY: fork(2) in a SUB worker; both processes return into the worker, which is what
    // the test exercises. The child is left to the worker process (its zombie goes with it).
    if unsafe { libc::fork() } < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

fn u32s(b: &simpler::Buffer) -> simpler::Tensor {
    b.tensor(&[(b.nbytes() / 4) as u32], DataType::Uint32).expect("tensor")
}

/// A host function whose forked child returns into the SUB worker's loop: the child leaves at
/// once (status 0) without touching the worker's mailbox, the task's result is the parent's,
/// and the same SUB worker runs every later task.
#[test]
fn a_host_function_whose_forked_child_returns_leaves_its_sub_worker_serving() {
    if !in_own_process() {
        return;
    }
    let (rig, [wait, forget, record]) = Rig::start(
        subs(1),
        [("fork_and_wait", fork_and_wait), ("fork_and_forget", fork_and_forget), ("record_pid", record_pid)],
    );
    let pids = rig.child_pids();
    let sub = pids[0] as u32;
    let status = u32_buffer(&rig, 2);
    let run_one = |f: &simpler::CallableHandle| {
        status.write(0, &[7u32, 7]).unwrap();
        rig.run(|orch| {
            let mut a = TaskArgs::new();
            a.output(&u32s(&status))?;
            orch.submit_sub(f, a).map(|_| ())
        })
    };
    run_one(&wait).expect("the task that forked succeeds");
    assert_eq!(read_u32(&status, 0, 2), vec![0, sub], "the forked copy ended at once, with status 0");
    for _ in 0..3 {
        run_one(&forget).expect("a task whose fork is not waited for succeeds");
    }
    for i in 0..20 {
        run_one(&record).unwrap_or_else(|e| panic!("task {i} after the forks: {e}"));
        assert_eq!(read_u32(&status, 0, 2), vec![0, sub], "task {i} ran on the SUB worker itself");
    }
    assert_eq!(rig.child_pids(), pids, "the same SUB worker serves on");
    assert!(rig.workers().iter().all(|w| w.is_alive()), "{:?}", rig.workers());
}

/// A chip kernel whose forked child returns into the chip process: the same, for a chip.
#[test]
fn a_chip_kernel_whose_forked_child_returns_leaves_its_chip_serving() {
    if !in_own_process() {
        return;
    }
    let mut rig = Rig::new(Worker::builder().chips(1).chip_memory(1 << 20).chip_cores(1));
    let k = rig.register_chip(ChipFn::kernel("fork_and_wait", fork_and_wait)).unwrap();
    rig.init();
    let pids = rig.child_pids();
    let chip = pids[0] as u32;
    let status = u32_buffer(&rig, 2);
    for i in 0..5 {
        status.write(0, &[7u32, 7]).unwrap();
        rig.run(|orch| {
            let mut a = TaskArgs::new();
            a.output(&u32s(&status))?;
            orch.submit_next_level(&k, a, CallConfig::default(), 0).map(|_| ())
        })
        .unwrap_or_else(|e| panic!("kernel {i}: {e}"));
        let got = read_u32(&status, 0, 2);
        assert_eq!(
            got,
            vec![0, chip],
            "kernel {i} ran on the chip itself, and its forked copy ended at once"
        );
    }
    assert_eq!(rig.child_pids(), pids, "the same chip serves on");
}

/// An orchestration function that forks: its child returns `Ok(())` into the nested Worker;
/// the parent fails its task unless the child ended at once with status 0.
fn l3_fork(orch: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> Result<()> {
    let failed = |m: String| simpler::Error::new(ErrorKind::TaskFailed, m);
    match fork_then_return().map_err(failed)? {
        None => Ok(()), // the child returns at once
        Some(0) => orch.submit_sub(&HostFn::new("noop", noop).handle(), TaskArgs::new()).map(|_| ()),
        Some(other) => Err(failed(format!("the forked copy ended with {other}"))),
    }
}

/// An orchestration function whose forked child returns into a nested Worker's process: the
/// same, for a nested Worker.
#[test]
fn an_orchestration_whose_forked_child_returns_leaves_its_nested_worker_serving() {
    if !in_own_process() {
        return;
    }
    let mut rig = Rig::new(Worker::builder().level(Level::Network1));
    let mut l3 = Worker::builder().sub_workers(1).build().unwrap();
    l3.register(HostFn::new("noop", noop)).unwrap();
    rig.add_worker(l3).unwrap();
    let f = rig.register_orch(OrchFn::new("l3_fork", l3_fork)).unwrap();
    rig.init();
    let pids = rig.child_pids();
    for i in 0..5 {
        rig.run(|orch| orch.submit_next_level(&f, TaskArgs::new(), CallConfig::default(), 0).map(|_| ()))
            .unwrap_or_else(|e| panic!("task {i}: {e}"));
    }
    assert_eq!(rig.child_pids(), pids, "the same nested Worker serves on");
}
