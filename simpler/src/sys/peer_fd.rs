//! Another process's descriptor, reached through `/proc`: how a worker process opens the
//! memfd of a host buffer ([`shm`](super::shm)) or the trace log ([`tracelog`](super::tracelog))
//! that the process which created it holds.
//!
//! `/proc/<pid>/fd/<fd>` shows the descriptor table of the process's main thread. Once that
//! thread has exited (`pthread_exit` from `main`, or a program whose main thread ended while
//! other threads run on), Linux shows it empty, though the process lives on and its other
//! threads share the very same table. So [`open`] tries `/proc/<pid>/fd/<fd>` first, then the
//! same descriptor as each other live thread of the process sees it,
//! `/proc/<pid>/task/<tid>/fd/<fd>`. Either needs what opening `/proc/<pid>/fd/<fd>` always
//! needed: the same user as the process, which must be dumpable. (`pidfd_getfd(2)` would not
//! do: it needs the right to ptrace the process, which Yama's usual `ptrace_scope = 1` refuses
//! a child towards its parent.)
//!
//! What was opened is whatever has that number now: the caller checks it is the object it
//! expects (an inode, a name), since a descriptor closed by its owner may be reused for another.
//! A failure ([`Unreachable`]) says whether the process has ended, no thread of it holds the
//! descriptor, or the system refused.

use std::fmt;
use std::fs::{File, Metadata, OpenOptions};
use std::io;

/// Why descriptor `fd` of process `pid` could not be reached: the first path tried, and what
/// happened, in words.
#[derive(Debug)]
pub(crate) struct Unreachable {
    /// `/proc/<pid>/fd/<fd>`.
    pub(crate) path: String,
    /// What happened, for messages: the process has ended, no thread of it holds the
    /// descriptor, or the system refused (naming the error).
    pub(crate) why: String,
}

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.why)
    }
}

/// Opens descriptor `fd` of process `pid` with `options`; returns the file and the path that
/// reached it.
pub(crate) fn open(pid: u32, fd: u32, options: &OpenOptions) -> Result<(File, String), Unreachable> {
    reach(pid, fd, |path| options.open(path))
}

/// The status of what descriptor `fd` of process `pid` names, if it can be reached.
pub(crate) fn metadata(pid: u32, fd: u32) -> Option<Metadata> {
    reach(pid, fd, |path| std::fs::metadata(path)).ok().map(|(m, _)| m)
}

/// Runs `op` on `/proc/<pid>/fd/<fd>`, then, while it fails, on the same descriptor under each
/// other live thread of `pid`; the first success and its path.
fn reach<T>(
    pid: u32,
    fd: u32,
    mut op: impl FnMut(&str) -> io::Result<T>,
) -> Result<(T, String), Unreachable> {
    let path = format!("/proc/{pid}/fd/{fd}");
    let first = match op(&path) {
        Ok(v) => return Ok((v, path)),
        Err(e) => e,
    };
    // The main thread may have exited: another thread sees the same table. A thread that
    // exits meanwhile fails its try; the next one is tried.
    let mut others = 0usize;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for tid in tasks.flatten().filter_map(|t| t.file_name().to_str()?.parse::<u32>().ok()) {
            if tid == pid {
                continue;
            }
            others += 1;
            let at = format!("/proc/{pid}/task/{tid}/fd/{fd}");
            if let Ok(v) = op(&at) {
                return Ok((v, at));
            }
        }
    }
    let why = explain(pid, fd, &first, others);
    Err(Unreachable { path, why })
}

/// What a failure to reach descriptor `fd` of `pid` means, given the first error and how many
/// threads other than the main one were tried.
fn explain(pid: u32, fd: u32, first: &io::Error, others: usize) -> String {
    if std::fs::metadata(format!("/proc/{pid}")).is_err() {
        return format!("process {pid} has ended ({first})");
    }
    match first.kind() {
        io::ErrorKind::NotFound => {
            let main_exited = main_thread_state(pid) == Some('Z');
            let threads = match (main_exited, others) {
                (false, 0) => format!("process {pid}"),
                (false, n) => format!("any of the {} threads of process {pid}", n + 1),
                (true, 0) => {
                    format!("process {pid}, whose main thread has exited and no other thread is left")
                }
                (true, n) => format!(
                    "any of the {n} live threads of process {pid} (its main thread has exited, which empties /proc/{pid}/fd)"
                ),
            };
            format!("descriptor {fd} is not open in {threads}: its owner has closed it")
        }
        io::ErrorKind::PermissionDenied => format!(
            "{first}: Linux lets a process open another's descriptors only when both run as the same user and the other is dumpable (not after prctl(PR_SET_DUMPABLE, 0) or a change of credentials), and a security module may forbid it"
        ),
        _ => first.to_string(),
    }
}

/// The state (`R`, `S`, `Z`, ...) of the main thread of `pid`.
fn main_thread_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;

    #[test]
    fn a_descriptor_of_this_process_is_reached_through_its_main_thread() {
        let mut mine = tempfile_in_memory();
        mine.write_all(b"peer").unwrap();
        let (pid, fd) = (std::process::id(), mine.as_raw_fd() as u32);
        let (mut opened, path) = open(pid, fd, OpenOptions::new().read(true)).unwrap();
        assert_eq!(path, format!("/proc/{pid}/fd/{fd}"));
        let mut got = String::new();
        opened.read_to_string(&mut got).unwrap();
        assert_eq!(got, "peer");
        assert_eq!(metadata(pid, fd).unwrap().len(), 4);
    }

    #[test]
    fn a_missing_descriptor_or_process_is_explained() {
        let pid = std::process::id();
        let err = open(pid, i32::MAX as u32, OpenOptions::new().read(true)).unwrap_err();
        assert_eq!(err.path, format!("/proc/{pid}/fd/{}", i32::MAX));
        assert!(err.why.contains(&format!("descriptor {} is not open", i32::MAX)), "{err}");
        assert!(err.why.contains("closed it"), "{err}");
        assert!(metadata(pid, i32::MAX as u32).is_none());
        let err = open(i32::MAX as u32, 3, OpenOptions::new().read(true)).unwrap_err();
        assert!(err.why.contains(&format!("process {} has ended", i32::MAX)), "{err}");
    }

    /// A memfd of this process, for the tests.
    fn tempfile_in_memory() -> File {
        File::from(
            nix::sys::memfd::memfd_create(c"peer-fd-test", nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC)
                .unwrap(),
        )
    }
}
