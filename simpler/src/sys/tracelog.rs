//! The trace log: one append-only memfd per tree of Worker processes, where worker processes
//! leave the records of the captured runs they ran inside a task of their parent (a chip's
//! kernels on its cores, a nested Worker's tasks), for the root to merge into its timeline.
//!
//! The first Worker a process starts without an inherited log creates it (the process is a
//! root); its key (creator pid, descriptor number, inode) travels to every child in its start
//! spec ([`inherit`]), or with a fork. Writers open `/proc/<pid>/fd/<fd>` (or a live thread's
//! view of it, `sys::peer_fd`) for appending and check the inode; each entry is one `write(2)`
//! to an `O_APPEND` file, which the kernel keeps whole among concurrent writers. The log stops taking entries past [`CAP`] bytes (the entries
//! are dropped, and timelines miss those levels); it dies with its processes.

use std::fs::File;
use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::{Mutex, OnceLock};

use nix::sys::memfd::{MemFdCreateFlag, memfd_create};

use crate::error::{Error, Result};
use crate::sys::peer_fd;

/// The most bytes the log holds.
pub(crate) const CAP: u64 = 64 << 20;

/// Where the log is: its creator, the creator's descriptor of it, and its inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogKey {
    pub(crate) pid: u32,
    pub(crate) fd: u32,
    pub(crate) ino: u64,
}

struct Log {
    key: LogKey,
    /// The creator's descriptor, which keeps the log alive (`None` in the other processes).
    _creator: Option<File>,
    /// A descriptor opened to append (and read), lazily, in every process that uses the log:
    /// positional writes on the creator's would overwrite what others appended.
    file: Mutex<Option<File>>,
}

static LOG: OnceLock<Log> = OnceLock::new();

/// The log of this process's tree: the inherited one, or one made now (this process is a
/// root). Idempotent.
pub(crate) fn ensure() -> Result<LogKey> {
    if let Some(log) = LOG.get() {
        return Ok(log.key);
    }
    let fd = memfd_create(c"simpler-trace", MemFdCreateFlag::MFD_CLOEXEC)
        .map_err(|e| Error::os("creating the trace log (memfd_create)", e))?;
    let file = File::from(fd);
    let ino = file.metadata().map_err(|e| Error::os("reading the trace log's inode", e))?.ino();
    let key = LogKey { pid: std::process::id(), fd: file.as_raw_fd() as u32, ino };
    let _ = LOG.set(Log { key, _creator: Some(file), file: Mutex::new(None) });
    Ok(LOG.get().expect("set above or by a racing thread").key)
}

/// This process belongs to the tree whose log is `key` (a child, from its start spec).
pub(crate) fn inherit(key: LogKey) {
    let _ = LOG.set(Log { key, _creator: None, file: Mutex::new(None) });
}

/// The log's key, if this process has one.
pub(crate) fn key() -> Option<LogKey> {
    LOG.get().map(|l| l.key)
}

/// Runs `f` on this process's descriptor of the log, opening it to append first if needed.
fn with_file<T>(f: impl FnOnce(&File) -> Result<T>) -> Result<T> {
    let log = LOG.get().ok_or_else(|| Error::state("this process has no trace log"))?;
    let mut file = log.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if file.is_none() {
        let LogKey { pid, fd, ino } = log.key;
        // Through `/proc/<pid>/fd/<fd>`, or a live thread's view of it when the main thread of
        // the log's creator has exited (`sys::peer_fd`).
        let (opened, path) = peer_fd::open(pid, fd, std::fs::OpenOptions::new().read(true).append(true))
            .map_err(|e| Error::os("opening the trace log", e))?;
        let got = opened.metadata().map_err(|e| Error::os("reading the trace log's inode", e))?.ino();
        if got != ino {
            return Err(Error::invalid(format!("{path} is not the trace log (inode {got}, expected {ino})")));
        }
        *file = Some(opened);
    }
    f(file.as_ref().expect("opened above"))
}

/// Appends one entry in one write; an entry that would take the log past [`CAP`] is dropped
/// (`Ok(false)`).
pub(crate) fn append(entry: &[u8]) -> Result<bool> {
    with_file(|file| {
        let len = file.metadata().map_err(|e| Error::os("reading the trace log's size", e))?.len();
        if len + entry.len() as u64 > CAP {
            return Ok(false);
        }
        let mut w: &File = file;
        w.write_all(entry).map_err(|e| Error::os("appending to the trace log", e))?;
        Ok(true)
    })
}

/// Everything in the log now.
pub(crate) fn read_all() -> Result<Vec<u8>> {
    with_file(|file| {
        let len = file.metadata().map_err(|e| Error::os("reading the trace log's size", e))?.len().min(CAP);
        let mut out = vec![0u8; len as usize];
        let mut got = 0;
        while got < out.len() {
            match file.read_at(&mut out[got..], got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::os("reading the trace log", e)),
            }
        }
        out.truncate(got);
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[crate::test_support::isolated_test(crate = crate)]
    fn entries_appended_are_read_back_whole_and_in_order() {
        let key = ensure().unwrap();
        assert_eq!(ensure().unwrap(), key, "one log per process");
        assert_eq!(key.pid, std::process::id());
        assert!(append(b"first;").unwrap());
        assert!(append(b"second;").unwrap());
        assert_eq!(read_all().unwrap(), b"first;second;");
        // Past the cap: dropped, not written.
        assert!(!append(&vec![0u8; CAP as usize]).unwrap());
        assert_eq!(read_all().unwrap().len(), 13);
    }
}
