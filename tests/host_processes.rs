//! Processes that user code makes inside the Worker's processes: a fork whose child returns
//! into the worker (a host function, a chip kernel, an orchestration function of a nested
//! Worker), and processes a host function starts and leaves running.

mod common;

use std::time::Duration;

use common::*;
use simpler::{
    DataType, ErrorKind, HostArgs, HostFn, HostResult, OrchFn, Orchestrator, Result, TaskArgs, Worker,
    chip::CallConfig, chip::ChipFn, status::Level,
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

/// Forks and returns in both processes: the parent does not wait for its child, and writes
/// `[its child's process id, its own]` to tensor 0 (two `u32`s).
#[expect(unsafe_code, reason = "fork(2) has no safe wrapper in std")]
fn fork_and_forget(args: &HostArgs<'_>) -> HostResult {
    // SAFETY: fork(2) in a SUB worker; both processes return into the worker, which is what
    // the test exercises. The child is left to the worker process (its zombie goes with it).
    match unsafe { libc::fork() } {
        p if p < 0 => Err(std::io::Error::last_os_error().into()),
        0 => Ok(()),
        child => {
            args.output::<u32>(0)?.copy_from_slice(&[child as u32, std::process::id()]);
            Ok(())
        }
    }
}

fn u32s(b: &simpler::Buffer) -> simpler::Tensor {
    b.tensor(&[(b.nbytes() / 4) as u32], DataType::Uint32).expect("tensor")
}

/// A host function whose forked child returns into the SUB worker's loop: the child leaves at
/// once (status 0) without touching the worker's mailbox, the task's result is the parent's,
/// and the same SUB worker runs every later task.
#[isolated_test]
fn a_host_function_whose_forked_child_returns_leaves_its_sub_worker_serving() {
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
    let mut forgotten = Vec::new();
    for _ in 0..3 {
        run_one(&forget).expect("a task whose fork is not waited for succeeds");
        let [copy, parent] = read_u32(&status, 0, 2)[..] else { unreachable!() };
        assert_eq!(parent, sub, "the SUB worker forked");
        forgotten.push(copy as i32);
    }
    for i in 0..20 {
        run_one(&record).unwrap_or_else(|e| panic!("task {i} after the forks: {e}"));
        assert_eq!(read_u32(&status, 0, 2), vec![0, sub], "task {i} ran on the SUB worker itself");
    }
    assert_eq!(rig.child_pids(), pids, "the same SUB worker serves on");
    assert!(rig.workers().iter().all(|w| w.is_alive()), "{:?}", rig.workers());
    // The copies leave on their own, when the kernel runs them (under load, maybe after the
    // tasks above): until then they map the buffers, which the rig's last check finds.
    wait_for("the forked copies to leave", Duration::from_secs(10), || {
        forgotten.iter().all(|&p| !process_alive(p))
    });
}

/// A chip kernel whose forked child returns into the chip process: the same, for a chip.
#[isolated_test]
fn a_chip_kernel_whose_forked_child_returns_leaves_its_chip_serving() {
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
#[isolated_test]
fn an_orchestration_whose_forked_child_returns_leaves_its_nested_worker_serving() {
    let mut l3 = Worker::builder().sub_workers(1).build().unwrap();
    l3.register(HostFn::new("noop", noop)).unwrap();
    let mut rig = Rig::new(Worker::builder().level(Level::Network1).worker(l3));
    let f = rig.register_orch(OrchFn::new("l3_fork", l3_fork)).unwrap();
    rig.init();
    let pids = rig.child_pids();
    for i in 0..5 {
        rig.run(|orch| orch.submit_next_level(&f, TaskArgs::new(), CallConfig::default(), 0).map(|_| ()))
            .unwrap_or_else(|e| panic!("task {i}: {e}"));
    }
    assert_eq!(rig.child_pids(), pids, "the same nested Worker serves on");
}

/// Starts `sleep 1000` and leaves it running; writes its process id to tensor 0 (one `u32`).
fn spawn_sleep(args: &HostArgs<'_>) -> HostResult {
    let child = std::process::Command::new("sleep").arg("1000").spawn()?;
    args.output::<u32>(0)?[0] = child.id();
    Ok(()) // dropping `Child` neither waits for the process nor kills it
}

/// A process this test did not start, watched through a pidfd (which names that process and
/// no other, whatever happens to its pid); killed on drop, so a failing test leaves none.
struct Watched {
    pid: i32,
    fd: std::os::fd::OwnedFd,
}

#[expect(unsafe_code, reason = "pidfd_open(2), pidfd_send_signal(2) and poll(2) have no safe wrappers")]
impl Watched {
    /// Watches `pid`, which must be running.
    fn new(pid: i32) -> Watched {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open(2) takes a pid and flags; it returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        assert!(fd >= 0, "pidfd_open({pid}): {}", std::io::Error::last_os_error());
        // SAFETY: `fd` is the new descriptor pidfd_open returned; nothing else owns it.
        Watched { pid, fd: unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) } }
    }

    /// Whether the process has ended (exited, or killed) within `limit`.
    fn ends_within(&self, limit: Duration) -> bool {
        use std::os::fd::AsRawFd;
        let end = std::time::Instant::now() + limit;
        loop {
            let mut pfd = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            let left = end.saturating_duration_since(std::time::Instant::now()).as_millis() as i32;
            // SAFETY: one live `pollfd` naming our own pidfd; `left` is a timeout in ms.
            match unsafe { libc::poll(&mut pfd, 1, left) } {
                n if n > 0 => return true,
                0 => return false,
                _ => assert_eq!(std::io::Error::last_os_error().kind(), std::io::ErrorKind::Interrupted),
            }
        }
    }
}

#[expect(unsafe_code, reason = "pidfd_send_signal(2) has no safe wrapper")]
impl Drop for Watched {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: pidfd_send_signal(2) on our own pidfd with a plain signal and no siginfo; it
        // fails harmlessly once the process is gone.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.fd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<()>(),
                0,
            )
        };
    }
}

/// A process a host function starts and leaves running does not outlive `close`: it is in its
/// SUB worker's process group, which close ends.
#[isolated_test]
fn a_process_a_host_function_leaves_running_ends_with_close() {
    let (rig, [spawn]) = Rig::start(subs(1), [("spawn_sleep", spawn_sleep)]);
    let out = u32_buffer(&rig, 1);
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.output(&u32s(&out))?;
        orch.submit_sub(&spawn, a).map(|_| ())
    })
    .expect("the host function starts its process");
    let sleep = Watched::new(read_u32(&out, 0, 1)[0] as i32);
    assert!(!sleep.ends_within(Duration::ZERO), "process {} runs while the Worker does", sleep.pid);
    drop(out);
    rig.close().unwrap();
    assert!(sleep.ends_within(Duration::from_secs(10)), "process {} outlived close", sleep.pid);
}

/// On an L3 Worker: starts `sleep 1000` on its SUB worker, its process id into tensor 0.
fn l3_spawn_sleep(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> Result<()> {
    let mut a = TaskArgs::new();
    a.output(args.tensor(0).expect("tensor 0"))?;
    orch.submit_sub(&HostFn::new("spawn_sleep", spawn_sleep).handle(), a).map(|_| ())
}

/// The same below a nested Worker: the process ends when the nested Worker's tree does.
#[isolated_test]
fn a_process_a_host_function_leaves_running_below_a_nested_worker_ends_with_close() {
    let mut l3 = Worker::builder().sub_workers(1).build().unwrap();
    l3.register(HostFn::new("spawn_sleep", spawn_sleep)).unwrap();
    let mut rig = Rig::new(Worker::builder().level(Level::Network1).worker(l3));
    let f = rig.register_orch(OrchFn::new("l3_spawn_sleep", l3_spawn_sleep)).unwrap();
    rig.init();
    let out = u32_buffer(&rig, 1);
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.output(&u32s(&out))?;
        orch.submit_next_level(&f, a, CallConfig::default(), 0).map(|_| ())
    })
    .expect("the host function starts its process");
    let sleep = Watched::new(read_u32(&out, 0, 1)[0] as i32);
    assert!(!sleep.ends_within(Duration::ZERO), "process {} runs while the Worker does", sleep.pid);
    drop(out);
    rig.close().unwrap();
    assert!(sleep.ends_within(Duration::from_secs(10)), "process {} outlived close", sleep.pid);
}
