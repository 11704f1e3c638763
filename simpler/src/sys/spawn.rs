//! Starting a child by exec of this same binary: the start method that is safe whatever other
//! threads the program runs.
//!
//! [`spawn_self`] forks on the one long-lived *spawner* thread and execs `/proc/self/exe` at
//! once, so the child inherits no lock another thread held (the hazard of a plain fork in a
//! threaded program) and its parent-death signal is tied to a thread that lives as long as the
//! process (a plain fork ties it to the forking thread: a Worker made on a short-lived thread
//! lost its children when that thread ended). What the child is to do travels in a *start
//! spec*: bytes in a memfd, plus the descriptors the spec refers to (the mailbox region, heap
//! rings), all inherited across the exec. Each process has a spawner of its own: one forked
//! (`StartMethod::Fork`) from a process that had one starts another when it first needs it.
//!
//! In the child, [`START_HOOK`] runs from `.init_array`, before `main` (also before a test
//! harness's `main`): when the environment names a start spec, it takes the spec and the
//! descriptors, calls the one registered [`CHILD_ENTRY`] (the worker layer's), and leaves with
//! its exit code. Without that variable it returns at once and the program starts as usual.
//!
//! Rules (cited by the `SAFETY` comments below):
//!
//! S1. Between fork and exec the child runs only async-signal-safe calls (`setpgid`, `prctl`,
//!     `signal`, `sched_setaffinity`, `getppid`, `fcntl`, `_exit`) on values prepared before
//!     the fork: no allocation, no lock. The child takes the CPU affinity of the thread that
//!     asked for it (as a fork from that thread would), not the spawner thread's, ignores the
//!     terminal's signals ([`ignore_terminal_signals`]), and, when asked, leads a process group
//!     of its own (rule P7 of `sys::process`).
//! S2. The descriptors named in [`CHILD_ENV`] are the ones the parent cleared close-on-exec on
//!     between fork and exec (S1): in the fresh image they are open and owned by nothing else,
//!     so the hook may take ownership of each exactly once; it checks each is open first.
//! S3. The hook runs before `main`, while the process has one thread: removing the variable
//!     from the environment races with no reader.
//! S4. The hook never returns into `main` once it took a spec: it leaves through `_exit`, so
//!     the program's own `main`, destructors and `atexit` hooks never run in a child.

#![expect(unsafe_code, reason = "fork/exec hooks, the .init_array entry and inherited fds; rules S1-S4")]

use std::io::Write;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::sys::sync;

/// The environment variable that makes a process of this binary a child:
/// `<spec fd>:<fd>,<fd>,...`. Reserved: a program must not set it itself.
pub(crate) const CHILD_ENV: &str = "SIMPLER_START_SPEC";

/// The most bytes a start spec may have.
const MAX_SPEC: u64 = 64 << 20;

/// What a child started by [`spawn_self`] receives: the spec bytes and the descriptors its
/// parent passed, in the order the parent listed them.
pub(crate) struct ChildStart {
    pub(crate) spec: Vec<u8>,
    pub(crate) fds: Vec<Option<OwnedFd>>,
}

impl ChildStart {
    /// Takes descriptor `i` of the list; an error if there is none or it was taken.
    pub(crate) fn take_fd(&mut self, i: usize) -> Result<OwnedFd> {
        self.fds
            .get_mut(i)
            .and_then(Option::take)
            .ok_or_else(|| Error::invalid(format!("start spec: descriptor {i} was not passed or was taken")))
    }
}

/// The function a child runs with its start; returns the exit code. Registered once, by the
/// worker layer.
#[linkme::distributed_slice]
pub(crate) static CHILD_ENTRY: [fn(ChildStart) -> i32];

/// One spawn request for the spawner thread.
struct Job {
    command: Command,
    reply: mpsc::Sender<std::io::Result<u32>>,
}

/// The spawner thread's queue (started on first use in each process, lives as long as the
/// process). A process forked from one that had a spawner inherits its queue but not its
/// thread: it starts a spawner of its own (the inherited queue is forgotten, never dropped, as
/// the thread it would signal is not here).
fn spawner() -> Result<mpsc::Sender<Job>> {
    static SPAWNER: Mutex<Option<(u32, mpsc::Sender<Job>)>> = Mutex::new(None);
    let me = std::process::id();
    let mut spawner = sync::lock(&SPAWNER);
    match spawner.take() {
        Some((pid, tx)) if pid == me => {
            *spawner = Some((pid, tx.clone()));
            return Ok(tx);
        }
        Some((_, inherited)) => std::mem::forget(inherited),
        None => {}
    }
    let (tx, rx) = mpsc::channel::<Job>();
    let started = std::thread::Builder::new().name("simpler-spawner".into()).spawn(move || {
        for mut job in rx {
            let pid = job.command.spawn().map(|child| child.id());
            let _ = job.reply.send(pid);
        }
    });
    match started {
        Ok(_) => {}
        Err(e) => return Err(Error::os("starting the spawner thread", e)),
    }
    *spawner = Some((me, tx.clone()));
    Ok(tx)
}

/// Starts a child running this binary, which calls [`CHILD_ENTRY`] with `spec` and `pass`
/// (the descriptors, inherited). `label` is the child's `argv[0]`. Returns its pid.
///
/// The child is killed when this process dies (`PR_SET_PDEATHSIG`, tied to the spawner thread,
/// which lives as long as the process) and exits at once if this process is already gone.
/// With `new_group` it leads a process group of its own (rule P7 of `sys::process`).
pub(crate) fn spawn_self(label: &str, spec: &[u8], pass: &[BorrowedFd<'_>], new_group: bool) -> Result<i32> {
    if !hook_in_executable() {
        return Err(Error::state(format!(
            "starting {label}: simpler is not linked into this program's executable (a shared library?), so a new process of the executable would not become a worker; build the Worker with StartMethod::Fork"
        )));
    }
    let what = |e: &dyn std::fmt::Display| Error::os(&format!("starting {label}"), e);
    let spec_fd = spec_memfd(spec).map_err(|e| what(&e))?;
    let mut fds: Vec<RawFd> = vec![spec_fd.as_raw_fd()];
    fds.extend(pass.iter().map(|f| f.as_raw_fd()));
    let list: Vec<String> = fds[1..].iter().map(|f| f.to_string()).collect();
    let parent = std::process::id() as libc::pid_t;
    // The child runs where the calling thread may run (as a fork from it would), not where the
    // spawner thread may.
    let mut cpus = std::mem::MaybeUninit::<libc::cpu_set_t>::zeroed();
    // SAFETY: rule S1 does not apply yet (before the fork); sched_getaffinity writes at most
    // `size_of::<cpu_set_t>()` bytes into the zeroed set.
    let have_cpus =
        unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), cpus.as_mut_ptr()) } == 0;
    // SAFETY: zero-initialized above, and written by sched_getaffinity when it succeeded.
    let cpus = unsafe { cpus.assume_init() };
    let mut command = Command::new("/proc/self/exe");
    command.arg0(label).env(CHILD_ENV, format!("{}:{}", fds[0], list.join(",")));
    if new_group {
        command.process_group(0); // setpgid(0, 0) between fork and exec (rule S1)
    }
    let keep = fds.clone();
    // SAFETY: rule S1 — the closure runs between fork and exec and calls only prctl, signal,
    // sched_setaffinity, getppid, fcntl and _exit on the values captured above.
    unsafe {
        command.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            ignore_terminal_signals();
            if have_cpus {
                libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &cpus);
            }
            if libc::getppid() != parent {
                libc::_exit(0); // the parent died before we could ask to follow it
            }
            for &fd in &keep {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        })
    };
    let (reply, answer) = mpsc::channel();
    spawner()?.send(Job { command, reply }).map_err(|_| what(&"the spawner thread is gone"))?;
    let pid = answer.recv().map_err(|_| what(&"the spawner thread is gone"))?.map_err(|e| what(&e))?;
    drop(spec_fd);
    Ok(pid as i32)
}

/// The signals a terminal sends: to the whole foreground process group, `SIGINT` (Ctrl-C),
/// `SIGQUIT` (Ctrl-Backslash), and `SIGHUP` when it hangs up; to a process of a background
/// group that reads from it, `SIGTTIN`, or writes to it while it is set `tostop`, `SIGTTOU`.
const TERMINAL_SIGNALS: [libc::c_int; 5] =
    [libc::SIGINT, libc::SIGQUIT, libc::SIGHUP, libc::SIGTTIN, libc::SIGTTOU];

/// Makes the calling process (a new worker child, between fork and exec) ignore
/// [`TERMINAL_SIGNALS`]; an ignored disposition survives `exec`. A worker is in a background
/// process group (rule P7 of `sys::process`), so a terminal's `SIGTTIN` or `SIGTTOU` would stop
/// it for good where it reads from or writes to the terminal (reading fails instead, writing
/// proceeds); and the foreground group's signals would end the workers of a program that
/// handles them to finish its work and close, were a worker ever in that group. The program
/// decides what they do, and its workers follow it when it dies (`PR_SET_PDEATHSIG`).
///
/// # Safety
///
/// Async-signal-safe (`signal` only), so callable between fork and exec (rule S1, and P2 of
/// `sys::process`); it changes the dispositions of the whole calling process.
pub(crate) unsafe fn ignore_terminal_signals() {
    for sig in TERMINAL_SIGNALS {
        // SAFETY: signal(2) with a valid signal number and SIG_IGN; async-signal-safe.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
}

/// Whether [`START_HOOK`] is in the program's executable (so a new process of it runs the
/// hook), rather than in a shared library (`/proc/self/exe` would then be another program, a
/// Python interpreter for instance). Looked up once, in `/proc/self/maps`.
fn hook_in_executable() -> bool {
    static IN_EXE: OnceLock<bool> = OnceLock::new();
    *IN_EXE.get_or_init(|| {
        let hook = start_hook as extern "C" fn() as usize;
        let (Ok(exe), Ok(maps)) =
            (std::fs::read_link("/proc/self/exe"), std::fs::read_to_string("/proc/self/maps"))
        else {
            return true; // cannot tell: let exec try
        };
        let exe = exe.to_string_lossy().trim_end_matches(" (deleted)").to_string();
        maps.lines().any(|line| {
            // "lo-hi perms offset dev inode path": the path is what follows the fifth field.
            let mut rest = line;
            let mut fields = [""; 5];
            for f in &mut fields {
                let t = rest.trim_start();
                let end = t.find(char::is_whitespace).unwrap_or(t.len());
                *f = &t[..end];
                rest = &t[end..];
            }
            let path = rest.trim().trim_end_matches(" (deleted)");
            let Some((lo, hi)) = fields[0].split_once('-') else { return false };
            let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)) else {
                return false;
            };
            (lo..hi).contains(&hook) && path == exe
        })
    })
}

/// A close-on-exec memfd holding `spec`.
fn spec_memfd(spec: &[u8]) -> std::io::Result<OwnedFd> {
    // SAFETY: rule S2 — memfd_create takes a NUL-terminated name and flags and returns a new
    // descriptor nothing else owns, or -1.
    let raw = unsafe { libc::memfd_create(c"simpler-start".as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: rule S2 — `raw` is the new descriptor memfd_create returned.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut file = std::fs::File::from(fd);
    file.write_all(spec)?;
    Ok(OwnedFd::from(file))
}

/// Runs before `main` in every process of this binary (rule S4).
#[used]
// SAFETY: rule S4 — `.init_array` entries are `extern "C" fn()` called once by the loader
// before `main`; `start_hook` takes no arguments and unwinds nothing out (it catches panics).
#[unsafe(link_section = ".init_array")]
pub(crate) static START_HOOK: extern "C" fn() = start_hook;

extern "C" fn start_hook() {
    let Some(value) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    // SAFETY: rule S3 — before `main`, one thread: nothing reads the environment concurrently.
    unsafe { std::env::remove_var(CHILD_ENV) };
    let code = std::panic::catch_unwind(|| match take_start(&value.to_string_lossy()) {
        Ok(start) => match CHILD_ENTRY.first() {
            Some(entry) => entry(start),
            None => {
                eprintln!("simpler: {CHILD_ENV} is set but this binary registers no child entry");
                2
            }
        },
        Err(e) => {
            eprintln!("simpler: {CHILD_ENV} is set but names no valid start spec ({e}); it is reserved for simpler's workers");
            2
        }
    })
    .unwrap_or(101);
    // SAFETY: rule S4 — a child never returns into the program's `main`.
    unsafe { libc::_exit(code) }
}

/// Takes the spec and descriptors [`CHILD_ENV`]'s `value` names (rule S2).
fn take_start(value: &str) -> Result<ChildStart> {
    let bad = || Error::invalid(format!("malformed value {value:?}"));
    let (spec, rest) = value.split_once(':').ok_or_else(bad)?;
    let parse = |s: &str| s.parse::<RawFd>().ok().filter(|&fd| fd > 2).ok_or_else(bad);
    let spec_fd = parse(spec)?;
    let others: Vec<RawFd> =
        if rest.is_empty() { Vec::new() } else { rest.split(',').map(parse).collect::<Result<_>>()? };
    let mut seen = Vec::new();
    let mut take = |fd: RawFd| -> Result<OwnedFd> {
        // SAFETY: rule S2 — F_GETFD only reads the descriptor's flags.
        if seen.contains(&fd) || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(Error::invalid(format!("descriptor {fd} is not open or named twice")));
        }
        seen.push(fd);
        // Close-on-exec again, so nothing this child starts inherits it.
        // SAFETY: rule S2 — F_SETFD on a descriptor just checked to be open.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        // SAFETY: rule S2 — an inherited descriptor the parent passed, open (checked above),
        // taken once (`seen`), owned by nothing else in this fresh image.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let spec_file = std::fs::File::from(take(spec_fd)?);
    let len = spec_file.metadata().map_err(|e| Error::os("reading the start spec", e))?.len();
    if len > MAX_SPEC {
        return Err(Error::invalid(format!("start spec of {len} bytes is over the {MAX_SPEC}-byte limit")));
    }
    let mut spec = vec![0u8; len as usize];
    spec_file.read_exact_at(&mut spec, 0).map_err(|e| Error::os("reading the start spec", e))?;
    let fds = others.into_iter().map(|fd| take(fd).map(Some)).collect::<Result<_>>()?;
    Ok(ChildStart { spec, fds })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hook_is_found_in_this_executable() {
        assert!(hook_in_executable());
    }

    #[test]
    fn a_malformed_variable_is_refused_without_taking_anything() {
        for value in ["", "x", "3", "1:4", "5:abc", "-1:"] {
            assert!(take_start(value).is_err(), "{value}");
        }
    }
}
