//! Child processes: forking, watching for their exit, and reaping.
//!
//! * [`fork_child`]: `PR_SET_PDEATHSIG`, the body under `catch_unwind`, `_exit` (P1, P2), and
//!   with `new_group` a process group of its own (P7).
//! * The [`Monitor`] thread watches the children through pidfds, reaps each once and records
//!   how it ended on an [`ExitBoard`] (P3), whose `kill` signals a child only while it is
//!   unreaped, through its pidfd, so a recycled pid is never signalled, not even when the
//!   program reaps our children itself by ignoring `SIGCHLD`. A monitor dropped without `stop`
//!   (its Worker unwound out of `close`) kills and reaps the children still running.
//! * `ChildGuard` holds a child forked outside a Worker (a test or a benchmark): it SIGKILLs
//!   and reaps the child on drop unless a wait reaped it (P5).
//! * A worker process records its pid when it starts serving ([`become_worker`], from
//!   `ChildPlan::run`); wherever user code returns into the library there (`SubChild::task`,
//!   `chip::runtime::call_kernel`, `Engine::build_run`), [`leave_if_forked_copy`] ends a child
//!   of a fork the code made with `_exit` (status 0, or 1 when the code failed) before it
//!   touches the worker's mailbox (P6), so the worker serves on and its task's result is its own.
//! * Each child the program itself starts (not a worker process: [`in_worker`]) leads a process
//!   group that holds everything below it; [`end_group`] kills what is left of it when the child
//!   exits (P7: through the pidfd with `PIDFD_SIGNAL_PROCESS_GROUP`, Linux 6.9, or else by the
//!   group's number while a `WNOWAIT` wait sees the child unreaped). So a process a host function
//!   left running ends with its worker (at `close`, or when the worker dies or is killed),
//!   unless it left the group (`setsid`, a daemon). In a program that adopts orphans,
//!   [`reap_adopted`] reaps them before the child (P8), waiting at most 1 s
//!   ([`ADOPTED_GRACE`]: only a process `SIGKILL` cannot end takes that long).
//! * [`keep_off_my_cpu`]: keeps a thread off the caller's CPU (a chip's executor, at each
//!   launch, so it does not wait on the CPU of the thread that woke it and stays busy).
//! * [`usable_cpus`] and [`bind_to_cpu`]: the CPUs the calling thread may run on, and binding
//!   the calling process to one of them (a bound SUB worker, `WorkerBuilder::bind_sub_workers`).
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
//! P6. A worker process records its process id when it starts serving ([`become_worker`]).
//!     User code it runs (a host function, a chip kernel, an orchestration function) may fork,
//!     and the child of that fork may return into the library: it is a copy of the worker that
//!     shares its mailbox, so it must never touch it (nor anything else of the worker). At each
//!     return from user code the library calls [`leave_if_forked_copy`], which compares the
//!     current process id with the recorded one and, in a copy, leaves with `_exit` at once:
//!     no destructor, `atexit` hook or buffered output of the worker runs twice, and the worker
//!     stays the one process that serves its mailbox. The comparison costs a `getpid` system
//!     call, so it is made only in the child of a fork (a `pthread_atfork` child handler that
//!     [`become_worker`] installs sets a flag); a fork by a raw `clone` system call, which runs
//!     no such handler, is not caught.
//! P7. A child that a process which is not a worker starts (the program's own children: SUB
//!     workers, chips, nested Workers) leads a process group of its own (`setpgid(0, 0)` before
//!     it runs anything, [`fork_child`] or `sys::spawn`), and everything below it stays in that
//!     group: the processes a nested Worker starts, and what user code in any of them starts
//!     (a worker process never starts a group). When the monitor sees such a child exit, it
//!     kills what is left of its group ([`end_group`]) before it reaps the child: through the
//!     child's pidfd (`PIDFD_SIGNAL_PROCESS_GROUP`), which names that group and no other however
//!     pids are reused; on kernels before 6.9, which lack it, by the group's number (`kill(-pid)`)
//!     and only after a `WNOWAIT` wait saw the child unreaped, so that number still names its
//!     group (a group's number is its leader's pid, which no other process can take while the
//!     leader is unreaped). Only the program reaping our child itself between that wait and the
//!     kill, and its pid then going to a new group leader, could misdirect it.
//! P8. In a process that adopts orphans (a child subreaper, `PR_SET_CHILD_SUBREAPER`, or the
//!     first process of a pid namespace), what is left of a dead child's group (rule P7)
//!     becomes this process's children as their parents die, and would stay zombies: before
//!     it reaps the child, the monitor reaps them ([`reap_adopted`]). Each is found among this
//!     process's children by its pid, and reaped through a pidfd opened on that pid and kept
//!     only if `/proc/<pid>/stat`, read after the pidfd was opened, shows it a child of this
//!     process in the dead child's group, and a `WNOWAIT` wait through the pidfd then shows it
//!     still an unreaped child of ours: a pid names one process until that process is reaped,
//!     so the pidfd is the process that `/proc` described. The group's number is the dead
//!     child's pid, which it holds while unreaped (rule P7): the program's own children are in
//!     other groups, and are never waited for.

#![expect(
    unsafe_code,
    reason = "fork, pidfd, poll, eventfd, prctl, setpgid and _exit have no safe wrappers; rules P1-P8"
)]

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
/// once if the parent is already gone. With `new_group` it first leads a process group of its
/// own (rule P7).
pub(crate) fn fork_child(new_group: bool, body: impl FnOnce() -> i32) -> Result<i32> {
    let parent = std::process::id() as i32;
    // SAFETY: rule P1 — no engine thread runs in this process during fork.
    match unsafe { nix::unistd::fork() } {
        Err(e) => Err(Error::os("fork", e)),
        Ok(nix::unistd::ForkResult::Parent { child }) => Ok(child.as_raw()),
        Ok(nix::unistd::ForkResult::Child) => {
            // SAFETY: rules P2, P7 — setpgid and prctl with PR_SET_PDEATHSIG take plain
            // numbers, and ignore_terminal_signals calls only signal(2).
            unsafe {
                if new_group {
                    libc::setpgid(0, 0);
                }
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

/// This process's id when it became a worker process (rule P6); 0 in a process that is not one.
static WORKER_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Records that this process is a worker process, serving a mailbox from now on (rule P6).
pub(crate) fn become_worker() {
    WORKER_PID.store(std::process::id(), std::sync::atomic::Ordering::Release);
    // A worker started by a fork of a worker (a nested Worker's children) is not a copy.
    FORKED.store(false, std::sync::atomic::Ordering::Release);
    static HANDLER: std::sync::Once = std::sync::Once::new();
    HANDLER.call_once(|| {
        // SAFETY: rule P6 — the handler only stores to an atomic, which is async-signal-safe
        // in the child of a fork; it stays registered for the life of the process image.
        unsafe { libc::pthread_atfork(None, None, Some(note_fork)) };
    });
}

/// Set in the child of every `fork` this process makes once it is a worker (the
/// `pthread_atfork` child handler [`become_worker`] installs): [`leave_if_forked_copy`] asks
/// for the process id, a system call, only in such a child, not at every task.
static FORKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn note_fork() {
    FORKED.store(true, std::sync::atomic::Ordering::Release);
}

/// Whether this process is a worker process (or a copy of one): the children it starts stay in
/// its process group, while the program's own lead one each (rule P7).
pub(crate) fn in_worker() -> bool {
    WORKER_PID.load(std::sync::atomic::Ordering::Acquire) != 0
}

/// Called where user code returns into the library in a worker process: in a copy of the
/// worker that the user code forked (the child of its fork returned), leaves at once with
/// status 0 when the code returned `ok`, 1 otherwise (its parent may wait for it); does
/// nothing in the worker itself, and in a process that is not a worker (rule P6).
pub(crate) fn leave_if_forked_copy(ok: bool) {
    if !FORKED.load(std::sync::atomic::Ordering::Acquire) {
        return;
    }
    let worker = WORKER_PID.load(std::sync::atomic::Ordering::Acquire);
    if worker != 0 && std::process::id() != worker {
        // SAFETY: rule P6 — a copy of a worker leaves without running the worker's
        // destructors or atexit hooks and without touching its mailbox.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) }
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
    pub(crate) fn exit_status(&self, i: usize) -> Option<Ended> {
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
    /// The monitor thread until `stop` joins it (behind a lock: its owner may stop it through
    /// `&self`, as `Worker::close` does).
    thread: Mutex<Option<JoinHandle<()>>>,
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
        Ok(Monitor { wake_fd, shared, thread: Mutex::new(Some(thread)), board })
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
    pub(crate) fn stop(&self) {
        self.shared.stopping.store(true, std::sync::atomic::Ordering::Release);
        self.wake();
        if let Some(t) = sync::lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

impl Drop for Monitor {
    /// Children still running when the monitor goes without `stop` (its owner unwound before
    /// it could end them) are killed and reaped first: none outlives its Worker.
    fn drop(&mut self) {
        if sync::lock(&self.thread).is_some() {
            // Kills only the unreaped; waits not at all when every child has ended.
            self.kill_all();
            let all: Vec<usize> = (0..self.board.pids.len()).collect();
            self.board.wait_all(&all, Instant::now() + std::time::Duration::from_secs(1));
        }
        self.stop();
    }
}

/// `pidfd_send_signal`'s flag that signals the process group the pidfd's process leads
/// (Linux 6.9; `linux/pidfd.h`).
const PIDFD_SIGNAL_PROCESS_GROUP: libc::c_uint = 1 << 2;

/// Kills what is left of the process group that child `pid` (exited, not reaped by us; `fd` is
/// its pidfd) leads, if it leads one (rule P7): what its host functions started and left
/// running, a nested Worker's processes.
fn end_group(pid: i32, fd: &OwnedFd) {
    // SAFETY: rule P7 — pidfd_send_signal on the child's pidfd, held open by the caller, with a
    // plain signal, no siginfo and the flag that names the group the pidfd's process leads.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            PIDFD_SIGNAL_PROCESS_GROUP,
        )
    };
    if rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
        return; // ended, or there is no such group (ESRCH)
    }
    end_group_by_number(pid, fd);
}

/// [`end_group`] on a kernel before 6.9: by the group's number, while child `pid` (pidfd `fd`)
/// is seen unreaped (rule P7).
fn end_group_by_number(pid: i32, fd: &OwnedFd) {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    if waitid(Id::PIDFd(fd.as_fd()), flags).is_ok_and(|status| describe(status).is_some()) {
        // SAFETY: rule P7 — `pid` is our child, exited and unreaped a moment ago, so `-pid`
        // names the group it leads (if any) and no other; the signal is a plain number.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }
}

/// How long [`reap_adopted`] waits for the processes of a dead child's group to exit (they
/// were killed, rule P7: the kernel tears down their memory first, milliseconds per GiB).
const ADOPTED_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether orphans come to this process: it is a child subreaper, or the first process of its
/// pid namespace (rule P8).
fn adopts_orphans() -> bool {
    let mut flag: libc::c_int = 0;
    // SAFETY: rule P8 — prctl(PR_GET_CHILD_SUBREAPER) writes one c_int through the pointer,
    // which points to a live local.
    let rc = unsafe { libc::prctl(libc::PR_GET_CHILD_SUBREAPER, &mut flag as *mut libc::c_int) };
    (rc == 0 && flag != 0) || std::process::id() == 1
}

/// The pids of this process's children (every thread's, as orphans go to any thread of a
/// subreaper): from `/proc/self/task/*/children`, or, where the kernel has no such file, from
/// every process's `stat`.
fn children_of_this_process() -> Vec<i32> {
    let parse =
        |text: &str| text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()).collect::<Vec<_>>();
    let mut out = Vec::new();
    let mut have_files = false;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.filter_map(|t| t.ok()) {
            if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
                have_files = true;
                out.extend(parse(&text));
            }
        }
    }
    if !have_files {
        let me = std::process::id() as i32;
        let Ok(procs) = std::fs::read_dir("/proc") else { return out };
        for p in procs.filter_map(|e| e.ok()) {
            let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
            if stat_of(pid).is_some_and(|(ppid, _)| ppid == me) {
                out.push(pid);
            }
        }
    }
    out
}

/// Process `pid`'s parent and process group, from `/proc/<pid>/stat`.
fn stat_of(pid: i32) -> Option<(i32, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid pgrp ...": the name may hold anything, so split after its last ')'.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(1);
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}

/// Reaps the processes of the group child `leader` (exited, not reaped by us) led that were
/// left to this process, which adopts orphans (rule P8): those still running were killed (rule
/// P7), and each is waited for up to [`ADOPTED_GRACE`] in all. Does nothing in a process that
/// adopts no orphans.
fn reap_adopted(leader: i32) {
    if !adopts_orphans() {
        return;
    }
    let me = std::process::id() as i32;
    let deadline = Instant::now() + ADOPTED_GRACE;
    loop {
        // A member whose own children outlived it leaves them to us too by the time it has
        // exited: look again until none is left.
        let mut members = Vec::new();
        for pid in children_of_this_process() {
            if pid == leader {
                continue;
            }
            let Ok(fd) = pidfd(pid) else { continue };
            // After the pidfd, so while the pidfd's process is unreaped (checked next) the pid
            // named it when /proc was read.
            if stat_of(pid) != Some((me, leader)) {
                continue;
            }
            let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
            if waitid(Id::PIDFd(fd.as_fd()), flags).is_ok() {
                members.push(fd);
            }
        }
        if members.is_empty() {
            return;
        }
        for fd in &members {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: rule P4 — one live pollfd of a pidfd this function holds for the call.
            unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
            // Through the pidfd (rules P3, P8): that process and no other.
            let _ = waitid(Id::PIDFd(fd.as_fd()), WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG);
        }
        if Instant::now() >= deadline {
            return;
        }
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
            // What is left of its process group ends with it, before it is reaped (rule P7),
            // and is reaped here if it was left to this process (rule P8).
            end_group(pid, &fd);
            reap_adopted(pid);
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
        Ok(ChildGuard { pid: Pid::from_raw(fork_child(false, body)?), reaped: false })
    }

    /// Forks a child that leads a process group of its own and runs `body`, and guards it.
    #[cfg(test)]
    pub(crate) fn fork_group_leader(body: impl FnOnce() -> i32) -> Result<ChildGuard> {
        Ok(ChildGuard { pid: Pid::from_raw(fork_child(true, body)?), reaped: false })
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

/// The CPUs the calling thread may run on, in increasing order.
pub(crate) fn usable_cpus() -> Result<Vec<usize>> {
    use nix::sched::{CpuSet, sched_getaffinity};
    let allowed = sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map_err(|e| Error::os("reading the CPUs this thread may use", e))?;
    Ok((0..CpuSet::count()).filter(|&c| allowed.is_set(c).unwrap_or(false)).collect())
}

/// Binds the calling process's thread to `cpu` alone; threads it starts later inherit the
/// binding.
pub(crate) fn bind_to_cpu(cpu: usize) -> Result<()> {
    use nix::sched::{CpuSet, sched_setaffinity};
    let mut one = CpuSet::new();
    let what = format!("binding to CPU {cpu} (offline now, or no longer among this process's CPUs?)");
    one.set(cpu).map_err(|e| Error::os(&what, e))?;
    sched_setaffinity(nix::unistd::Pid::from_raw(0), &one).map_err(|e| Error::os(&what, e))
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
        let pid = super::fork_child(false, || {
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
        assert_eq!(m.board.exit_status(0), Some(Ended::Signaled(libc::SIGKILL)));
        assert!(!m.board.kill(0), "a child that ended is not signalled again");
    }

    #[crate::test_support::isolated_test(crate = crate)] // rule T1
    fn a_monitor_dropped_without_stop_kills_and_reaps_its_children() {
        let (pid, m) = watched_child();
        drop(m);
        // Reaped: the pid names no process (not even a zombie) any more.
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "child {pid} outlived its monitor");
    }

    /// A process this test did not start, watched through a pidfd and killed on drop, so a
    /// failing test leaves none.
    struct Stray(OwnedFd);

    impl Drop for Stray {
        fn drop(&mut self) {
            // SAFETY: rule P3 — a pidfd this test holds; a plain signal, no siginfo; it fails
            // harmlessly once the process is gone.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    self.0.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0u32,
                )
            };
        }
    }

    /// Whether the process of pidfd `fd` has exited within `ms` milliseconds.
    fn exits_within(fd: &OwnedFd, ms: i32) -> bool {
        let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: rule P4 — one live pollfd of a pidfd the caller holds.
        unsafe { libc::poll(&mut p, 1, ms) == 1 }
    }

    /// A group leader whose member outlives it: where the kernel cannot signal the group
    /// through a pidfd, the group is ended by its number while the leader is unreaped.
    #[test]
    fn a_group_is_ended_by_its_number_while_its_leader_is_unreaped() {
        if !crate::test_support::in_own_process() {
            return; // rule T1
        }
        let (read, write) = nix::unistd::pipe().unwrap();
        // The leader starts a member of its group that waits for ever (without the parent-death
        // signal, so it outlives the leader), sends its pid, and exits.
        let mut leader = ChildGuard::fork_group_leader(move || {
            // SAFETY: rule P2 — the member only parks; the leader leaves through `_exit`.
            match unsafe { libc::fork() } {
                0 => loop {
                    std::thread::park();
                },
                member if member > 0 => {
                    let sent = nix::unistd::write(&write, &member.to_ne_bytes());
                    if sent == Ok(4) { 0 } else { 2 }
                }
                _ => 3,
            }
        })
        .unwrap();
        let mut bytes = [0u8; 4];
        assert_eq!(nix::unistd::read(read.as_raw_fd(), &mut bytes), Ok(4), "the member's pid");
        let member = Stray(pidfd(i32::from_ne_bytes(bytes)).expect("the member runs"));
        let leader_fd = pidfd(leader.pid().as_raw()).unwrap();
        assert!(exits_within(&leader_fd, 10_000), "the leader exits");
        assert!(!exits_within(&member.0, 0), "the member outlives its leader");
        end_group_by_number(leader.pid().as_raw(), &leader_fd);
        assert!(exits_within(&member.0, 10_000), "the member of the leader's group was killed");
        assert_eq!(leader.wait_timeout(Duration::from_secs(10)), 0, "the leader's status");
    }

    #[test]
    fn a_monitor_starts_and_stops() {
        let m = Monitor::start(Vec::new(), |_| {}).unwrap();
        m.stop();
    }
}
