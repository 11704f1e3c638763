//! Child processes: forking, watching for their exit, and reaping.
//!
//! Rules (cited by the `SAFETY` comments below):
//!
//! P1. `fork_child` is called only while the calling process runs no engine thread of this
//!     Worker (the Worker forks every child in `init` before it starts any thread), so the child
//!     cannot inherit a lock held by one of ours.
//! P2. A forked child never returns into the parent's frames and never unwinds out of its body:
//!     the body runs under `catch_unwind` and the child leaves with `_exit`, so the parent's
//!     destructors and buffered output are not run twice.
//! P3. Each child is reaped exactly once, by the monitor thread, after its pidfd reports exit;
//!     nobody else in this crate calls `waitpid` on it. A child is signalled through its pidfd
//!     (`pidfd_send_signal`) and reaped through it (`waitid(P_PIDFD)`), which name that process
//!     and no other: should the program reap it first (it ignores `SIGCHLD`, or waits for every
//!     child) and its pid go to another child of the program, that one is never signalled,
//!     asked about or reaped.
//! P4. File descriptors passed to `poll` stay open for the whole call (the monitor owns them).
//! P5. A child forked outside a Worker (by a test or a benchmark) is held by a [`ChildGuard`],
//!     which reaps it exactly once: when a wait sees it exit, or on drop after `SIGKILL`, so a
//!     failing test or benchmark leaves no zombie and no orphan.

#![expect(unsafe_code, reason = "fork, pidfd, poll and eventfd have no safe wrappers; rules P1-P4")]

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
#[cfg(any(test, feature = "bench-support"))]
use nix::{sys::wait::waitpid, unistd::Pid};

use crate::error::{Error, Result};
use crate::sys::sync;

/// Forks a child that runs `body` and exits with its return value. Returns the child's pid.
///
/// The child asks the kernel to kill it when the parent dies (`PR_SET_PDEATHSIG`) and exits at
/// once if the parent is already gone.
pub(crate) fn fork_child(body: impl FnOnce() -> i32) -> Result<i32> {
    let parent = std::process::id() as i32;
    // SAFETY: rule P1 — no engine thread runs in this process during fork.
    match unsafe { nix::unistd::fork() } {
        Err(e) => Err(Error::os("fork", e)),
        Ok(nix::unistd::ForkResult::Parent { child }) => Ok(child.as_raw()),
        Ok(nix::unistd::ForkResult::Child) => {
            // SAFETY: rule P2 — prctl with PR_SET_PDEATHSIG takes a plain signal number, and
            // ignore_terminal_signals calls only signal(2).
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
                crate::sys::spawn::ignore_terminal_signals();
            }
            let code = if nix::unistd::getppid().as_raw() != parent {
                0
            } else {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(101)
            };
            // SAFETY: rule P2 — leave without running the parent's destructors or atexit hooks.
            unsafe { libc::_exit(code) }
        }
    }
}

/// How a child ended, as its wait status said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// It exited with this status.
    Exited(i32),
    /// A signal (this number) killed it.
    Signaled(i32),
    /// It could not be waited for (its status is unknown).
    Unknown,
}

/// Each child's pid now, and how each child ended, filled by the monitor thread.
pub(crate) struct ExitBoard {
    /// The pid of child `i` now (a replacement takes the index of the child it replaces).
    pids: Vec<std::sync::atomic::AtomicI32>,
    state: Mutex<Vec<Option<(String, Ended)>>>,
    /// Lock-free "has exited" flags, for the scheduler's per-poll check.
    exited: Vec<std::sync::atomic::AtomicBool>,
    changed: Condvar,
    /// Held by the monitor from its `waitpid` of a child until that child's exit is recorded,
    /// and by [`ExitBoard::kill`] from its check to its signal: a child seen not exited under
    /// it is not reaped yet by us (rule P3).
    reaping: Mutex<()>,
    /// Child `i`'s pidfd (also held by the monitor), through which it is signalled (rule P3);
    /// `None` on a board no monitor watches.
    pidfds: Mutex<Vec<Option<Arc<OwnedFd>>>>,
}

impl ExitBoard {
    pub(crate) fn new(pids: &[i32]) -> ExitBoard {
        let n = pids.len();
        ExitBoard {
            pids: pids.iter().map(|&p| std::sync::atomic::AtomicI32::new(p)).collect(),
            state: Mutex::new(vec![None; n]),
            exited: (0..n).map(|_| std::sync::atomic::AtomicBool::new(false)).collect(),
            changed: Condvar::new(),
            reaping: Mutex::new(()),
            pidfds: Mutex::new(vec![None; n]),
        }
    }

    /// Child `i`, which has ended, is replaced by `pid` (whose pidfd is `fd`): forgets how the
    /// old one ended.
    fn replace(&self, i: usize, pid: i32, fd: Option<Arc<OwnedFd>>) {
        let _no_kill_meanwhile = sync::lock(&self.reaping);
        let mut st = sync::lock(&self.state);
        sync::lock(&self.pidfds)[i] = fd;
        self.pids[i].store(pid, std::sync::atomic::Ordering::Release);
        st[i] = None;
        self.exited[i].store(false, std::sync::atomic::Ordering::Release);
    }

    /// The pid of child `i` now.
    pub(crate) fn pid(&self, i: usize) -> i32 {
        self.pids[i].load(std::sync::atomic::Ordering::Acquire)
    }

    /// Sends `SIGKILL` to child `i` unless it has exited (and been reaped): the monitor then
    /// reaps it and records how it ended, as for any death. Returns whether the signal was sent.
    pub(crate) fn kill(&self, i: usize) -> bool {
        let _not_reaped_meanwhile = sync::lock(&self.reaping);
        if self.has_exited(i) {
            return false;
        }
        let Some(fd) = sync::lock(&self.pidfds)[i].clone() else { return false };
        // SAFETY: rule P3 — pidfd_send_signal on a pidfd this board holds open (the Arc), with
        // a plain signal number and no siginfo; it signals that process only, and fails (ESRCH)
        // once it is gone.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0u32,
            )
        };
        rc == 0
    }

    fn set(&self, i: usize, how: String, ended: Ended) {
        let mut st = sync::lock(&self.state);
        st[i] = Some((how, ended));
        self.exited[i].store(true, std::sync::atomic::Ordering::Release);
        self.changed.notify_all();
    }

    /// Records that child `i` ended (`how`), as the monitor does (tests).
    #[cfg(test)]
    pub(crate) fn record_exit_for_test(&self, i: usize, how: &str) {
        self.set(i, how.to_string(), Ended::Signaled(9));
    }

    /// Child `i` is replaced by `pid`, as [`Monitor::watch`] does (tests).
    #[cfg(test)]
    pub(crate) fn replace_for_test(&self, i: usize, pid: i32) {
        self.replace(i, pid, None);
    }

    /// True once child `i` has exited (no lock).
    pub(crate) fn has_exited(&self, i: usize) -> bool {
        self.exited[i].load(std::sync::atomic::Ordering::Acquire)
    }

    /// How child `i` ended, if it has.
    pub(crate) fn exit_of(&self, i: usize) -> Option<String> {
        sync::lock(&self.state)[i].as_ref().map(|(how, _)| how.clone())
    }

    /// How child `i` ended (its status), if it has.
    pub(crate) fn ended(&self, i: usize) -> Option<Ended> {
        sync::lock(&self.state)[i].as_ref().map(|&(_, e)| e)
    }

    /// Waits until every child in `which` has exited or the deadline passes; true if all did.
    pub(crate) fn wait_all(&self, which: &[usize], deadline: Instant) -> bool {
        let mut st = sync::lock(&self.state);
        loop {
            if which.iter().all(|&i| st[i].is_some()) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            st = sync::wait_timeout(&self.changed, st, deadline - now);
        }
    }
}

fn describe(status: WaitStatus) -> Option<(String, Ended)> {
    match status {
        WaitStatus::Exited(_, code) => Some((format!("exited with status {code}"), Ended::Exited(code))),
        WaitStatus::Signaled(_, sig, core) => Some((
            format!(
                "was killed by signal {} ({sig:?}){}",
                sig as i32,
                if core { ", core dumped" } else { "" }
            ),
            Ended::Signaled(sig as i32),
        )),
        _ => None,
    }
}

/// Watches a set of children on a thread of its own; reaps each one when it exits (rule P3).
///
/// Child `i` may be replaced once it ended ([`watch`](Monitor::watch)): its entry on the board
/// is cleared and the new process watched under the same index.
pub(crate) struct Monitor {
    wake_fd: OwnedFd,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    pub(crate) board: Arc<ExitBoard>,
}

/// What the monitor thread takes from the others: children to watch, and the stop flag.
struct Shared {
    added: Mutex<Vec<(usize, i32, Arc<OwnedFd>)>>,
    stopping: std::sync::atomic::AtomicBool,
}

/// A pidfd of our own child `pid`.
fn pidfd(pid: i32) -> Result<OwnedFd> {
    // SAFETY: rule P3 — pidfd_open on our own unreaped child; returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(Error::os("pidfd_open", std::io::Error::last_os_error()));
    }
    // SAFETY: rule P4 — `fd` is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

impl Monitor {
    /// Starts watching `pids`; `on_exit(i)` runs (on the monitor thread) after child `i` is
    /// reaped and its exit recorded.
    pub(crate) fn start(pids: Vec<i32>, on_exit: impl Fn(usize) + Send + 'static) -> Result<Monitor> {
        let board = Arc::new(ExitBoard::new(&pids));
        let mut live = Vec::with_capacity(pids.len());
        for (i, &pid) in pids.iter().enumerate() {
            let fd = Arc::new(pidfd(pid)?);
            sync::lock(&board.pidfds)[i] = Some(fd.clone());
            live.push((i, pid, fd));
        }
        // SAFETY: eventfd with valid flags returns a new fd or -1 (rule P4: owned below).
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(Error::os("eventfd", std::io::Error::last_os_error()));
        }
        // SAFETY: rule P4 — `efd` is a fresh descriptor we own.
        let wake_fd = unsafe { OwnedFd::from_raw_fd(efd) };
        // A second descriptor of the eventfd for the thread (close-on-exec like the first);
        // failing to make one is an error, never an `OwnedFd` of -1.
        let wake_thread = wake_fd.try_clone().map_err(|e| Error::os("dup of the monitor's eventfd", e))?;
        let shared = Arc::new(Shared { added: Mutex::new(Vec::new()), stopping: false.into() });
        let (b, sh) = (board.clone(), shared.clone());
        let thread = std::thread::Builder::new()
            .name("simpler-monitor".into())
            .spawn(move || monitor_loop(live, wake_thread, sh, b, on_exit))
            .map_err(|e| Error::os("spawn monitor thread", e))?;
        Ok(Monitor { wake_fd, shared, thread: Some(thread), board })
    }

    /// Watches `pid`, a new child that replaces child `i` (which has ended), under index `i`:
    /// the board forgets how the old one ended.
    pub(crate) fn watch(&self, i: usize, pid: i32) -> Result<()> {
        let fd = Arc::new(pidfd(pid)?);
        self.board.replace(i, pid, Some(fd.clone()));
        sync::lock(&self.shared.added).push((i, pid, fd));
        self.wake();
        Ok(())
    }

    /// The pid of child `i` now.
    pub(crate) fn pid(&self, i: usize) -> i32 {
        self.board.pid(i)
    }

    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: rule P4 — writing 8 bytes from a live u64 to our own eventfd.
        unsafe { libc::write(self.wake_fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Sends `SIGKILL` to every child that has not exited.
    pub(crate) fn kill_all(&self) {
        for i in 0..self.board.pids.len() {
            self.board.kill(i);
        }
    }

    /// Stops the monitor thread (children still alive stay unreaped: kill and wait first).
    pub(crate) fn stop(&mut self) {
        self.shared.stopping.store(true, std::sync::atomic::Ordering::Release);
        self.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Monitor {
    /// Children still running when the monitor goes without `stop` (its owner unwound before
    /// it could end them) are killed and reaped first: none outlives its Worker.
    fn drop(&mut self) {
        if self.thread.is_some() {
            // Kills only the unreaped; waits not at all when every child has ended.
            self.kill_all();
            let all: Vec<usize> = (0..self.board.pids.len()).collect();
            self.board.wait_all(&all, Instant::now() + std::time::Duration::from_secs(1));
        }
        self.stop();
    }
}

fn monitor_loop(
    mut live: Vec<(usize, i32, Arc<OwnedFd>)>,
    wake: OwnedFd,
    shared: Arc<Shared>,
    board: Arc<ExitBoard>,
    on_exit: impl Fn(usize),
) {
    loop {
        let mut polls: Vec<libc::pollfd> = live
            .iter()
            .map(|(_, _, fd)| libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 })
            .collect();
        polls.push(libc::pollfd { fd: wake.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        // SAFETY: rule P4 — every fd in `polls` is owned by this thread for the whole call.
        let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if polls.last().is_some_and(|p| p.revents != 0) {
            let mut count = 0u64;
            // SAFETY: rule P4 — reading 8 bytes into a live u64 from our own eventfd.
            unsafe { libc::read(wake.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
            if shared.stopping.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
        }
        let mut still = Vec::with_capacity(live.len());
        for (k, (i, pid, fd)) in live.into_iter().enumerate() {
            if polls.get(k).is_none_or(|p| p.revents == 0) {
                still.push((i, pid, fd));
                continue;
            }
            let _reaping = sync::lock(&board.reaping);
            // By its pidfd, not its pid (rule P3): the pid may already name another process.
            match waitid(Id::PIDFd(fd.as_fd()), WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG) {
                Ok(status) => match describe(status) {
                    Some((how, ended)) => {
                        board.set(i, how, ended);
                        on_exit(i);
                    }
                    None => still.push((i, pid, fd)),
                },
                Err(nix::errno::Errno::ECHILD) => {
                    // Its exit was reaped before ours: the program ignores SIGCHLD, or reaps
                    // every child itself (`waitpid(-1)`). It ended; how is lost.
                    let how = "ended, but its exit status was taken before this Worker could read it \
                               (does the program ignore SIGCHLD, or reap every child with waitpid(-1)?)";
                    board.set(i, how.to_string(), Ended::Unknown);
                    on_exit(i);
                }
                Err(e) => {
                    board.set(i, format!("could not be waited for ({e})"), Ended::Unknown);
                    on_exit(i);
                }
            }
        }
        still.append(&mut sync::lock(&shared.added));
        live = still;
    }
}

/// A child forked outside a Worker (tests, benchmarks): killed (`SIGKILL`) and reaped on drop
/// unless a wait already reaped it (rule P5). The one kill-and-reap guard of the crate.
#[cfg(any(test, feature = "bench-support"))]
pub(crate) struct ChildGuard {
    pid: Pid,
    reaped: bool,
}

#[cfg(any(test, feature = "bench-support"))]
impl ChildGuard {
    /// Forks a child that runs `body` (see [`fork_child`]) and guards it.
    pub(crate) fn fork(body: impl FnOnce() -> i32) -> Result<ChildGuard> {
        Ok(ChildGuard { pid: Pid::from_raw(fork_child(body)?), reaped: false })
    }

    /// The child's process id.
    pub(crate) fn pid(&self) -> Pid {
        self.pid
    }

    /// Blocks until the child ends, reaps it, and returns how it ended.
    #[cfg(feature = "bench-support")]
    pub(crate) fn wait(&mut self) -> Result<WaitStatus> {
        assert!(!self.reaped, "child {} was already reaped", self.pid);
        let status = waitpid(self.pid, None).map_err(|e| Error::os("waitpid", e))?;
        self.reaped = true;
        Ok(status)
    }

    /// Waits up to `limit` for the child to exit, reaps it, and returns its exit code.
    ///
    /// Panics if the child was killed by a signal or still runs at the limit (the drop then
    /// kills and reaps it).
    #[cfg(test)]
    pub(crate) fn wait_timeout(&mut self, limit: std::time::Duration) -> i32 {
        assert!(!self.reaped, "child {} was already reaped", self.pid);
        let end = Instant::now() + limit;
        loop {
            match waitpid(self.pid, Some(WaitPidFlag::WNOHANG)).expect("waitpid failed") {
                WaitStatus::Exited(_, code) => {
                    self.reaped = true;
                    return code;
                }
                WaitStatus::Signaled(_, signal, _) => {
                    self.reaped = true;
                    panic!("child {} was killed by {signal:?}", self.pid);
                }
                _ => {}
            }
            assert!(Instant::now() < end, "child {} still runs after {limit:?}", self.pid);
            // Test-only polling of a process exit; the IPC layer itself never sleeps fixed.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

#[cfg(any(test, feature = "bench-support"))]
impl Drop for ChildGuard {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGKILL);
            let _ = waitpid(self.pid, None);
            self.reaped = true;
        }
    }
}

/// The calling thread's kernel thread id.
pub(crate) fn thread_id() -> i32 {
    nix::unistd::gettid().as_raw()
}

/// Keeps thread `tid` (of this process) off the CPU the calling thread runs on, among the CPUs
/// the caller may use: a thread the caller wakes and then keeps its CPU busy (a chip's executor,
/// woken to run a kernel while the caller copies the next run in) otherwise often waits on the
/// waker's CPU while another is idle. Does nothing when the caller may use one CPU only or its
/// CPU is unknown; a hint, so failures are ignored.
pub(crate) fn keep_off_my_cpu(tid: i32) {
    use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
    use nix::unistd::Pid;
    let Ok(cpu) = nix::sched::sched_getcpu() else { return };
    let Ok(mut allowed) = sched_getaffinity(Pid::from_raw(0)) else { return };
    let others = (0..CpuSet::count()).filter(|&c| c != cpu && allowed.is_set(c).unwrap_or(false)).count();
    if others == 0 || allowed.unset(cpu).is_err() {
        return;
    }
    let _ = sched_setaffinity(Pid::from_raw(tid), &allowed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::sys::test_fork::fork_child;
    use std::time::Duration;

    #[crate::test_support::isolated_test(crate = crate)] // rule T1
    fn a_monitor_that_cannot_copy_its_eventfd_fails_to_start() {
        // In a child (the descriptor limit is per process): allow exactly one more descriptor,
        // so the eventfd opens and its copy for the monitor thread cannot.
        let mut child = fork_child(|| {
            // SAFETY: eventfd with valid flags returns a new fd or -1; closed at once.
            let lowest = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
            // SAFETY: `lowest` is the descriptor just opened, or -1 (close then fails harmlessly).
            unsafe { libc::close(lowest) };
            let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            // SAFETY: getrlimit writes one live `rlimit`.
            if lowest < 0 || unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
                return 2;
            }
            limit.rlim_cur = lowest as libc::rlim_t + 1;
            // SAFETY: setrlimit reads one live `rlimit`; lowering the soft limit is allowed.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
                return 2;
            }
            match Monitor::start(Vec::new(), |_| {}) {
                Err(e) if e.kind() == ErrorKind::Os && e.message().contains("dup") => 0,
                Err(_) => 3,
                Ok(_) => 4,
            }
        });
        assert_eq!(child.wait_timeout(Duration::from_secs(10)), 0);
    }

    /// A child that waits for ever, watched by a monitor (which alone reaps it, rule P3, so it
    /// is forked without a guard).
    fn watched_child() -> (i32, Monitor) {
        let pid = super::fork_child(|| {
            loop {
                std::thread::park();
            }
        })
        .unwrap();
        (pid, Monitor::start(vec![pid], |_| {}).unwrap())
    }

    #[crate::test_support::isolated_test(crate = crate)] // rule T1
    fn a_child_is_killed_through_its_pidfd_and_its_death_recorded_once() {
        let (_, m) = watched_child();
        assert!(m.board.kill(0), "a live child is signalled");
        assert!(m.board.wait_all(&[0], Instant::now() + Duration::from_secs(10)));
        assert_eq!(m.board.ended(0), Some(Ended::Signaled(libc::SIGKILL)));
        assert!(!m.board.kill(0), "a child that ended is not signalled again");
    }

    #[crate::test_support::isolated_test(crate = crate)] // rule T1
    fn a_monitor_dropped_without_stop_kills_and_reaps_its_children() {
        let (pid, m) = watched_child();
        drop(m);
        // Reaped: the pid names no process (not even a zombie) any more.
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "child {pid} outlived its monitor");
    }

    #[test]
    fn a_monitor_starts_and_stops() {
        let mut m = Monitor::start(Vec::new(), |_| {}).unwrap();
        m.stop();
    }
}
