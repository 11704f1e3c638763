//! Named POSIX shared-memory objects: the backing of host buffers.
//!
//! A [`PosixShm`] is an object under `/dev/shm` (`shm_open("/{name}")`) mapped `MAP_SHARED`
//! read-write. The side that creates it owns the name and unlinks it on drop; a side that opens
//! an existing object (a child resolving a buffer descriptor, map-once per identity) only maps
//! and unmaps it.
//!
//! # Rules
//!
//! * **N1 (the mapping).** The whole object (`len` bytes) is mapped `MAP_SHARED` read-write by a
//!   `memmap2::MmapRaw` owned by the [`PosixShm`]; it stays mapped until the value drops.
//! * **N2 (bounds).** Every copy into or out of the mapping is checked against `len` first:
//!   `offset + count <= len`, computed without overflow.
//! * **N3 (plain shared bytes).** Other processes may access the same bytes at any time. This
//!   module never creates a reference into the mapping: it copies through raw pointers with
//!   `ptr::copy`, which also tolerates a caller slice that itself points into a mapping. Every
//!   byte pattern is a valid `u8`, so a racing writer can make a reader see stale or torn bytes,
//!   never an invalid value. Ordering between a task's writes and a later reader's copies comes
//!   from the task protocol (a completion is published through the mailbox state word).
//! * **N4 (size).** The creator sets the size with `ftruncate` before mapping; an opener maps the
//!   size `fstat` reports and refuses an object smaller than it needs. Nothing in this crate
//!   shrinks an object; a foreign process that did would make accesses fault (`SIGBUS`), a crash
//!   rather than silent corruption.
//! * **N5 (the name).** Only the owner (the creating side) unlinks the name, once, on drop; a
//!   creation that fails after `shm_open` unlinks before returning the error, so no name leaks.
//!   Two exceptions, both for names whose owner can no longer drop them: the exit hook (N6)
//!   unlinks the names of the process that is exiting, and [`sweep_stale_buffers`] those of dead
//!   processes (see its documentation for the rule).
//! * **N6 (the exit hook).** [`install_exit_hook`] registers one `atexit` handler per process
//!   tree (forked children inherit it). It runs in whichever process calls `exit`, so it unlinks
//!   only names that carry the calling process's id; it takes no lock (it reads `/dev/shm`), and
//!   never unwinds (`catch_unwind`), so it cannot deadlock on a lock a dead thread held or
//!   unwind into C. The sweep's other system calls (`sysconf`, `geteuid`) pass no memory.
//!
//! # Memory ordering
//!
//! No atomics here: the copies are plain memory accesses, ordered by whatever protocol tells the
//! reader that the writer is done (rule N3).

#![expect(
    unsafe_code,
    reason = "raw copies into and out of a mapping other processes share; the exit hook; rules N1-N6"
)]

use std::fmt;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::ptr;
use std::sync::Once;
use std::time::{Duration, SystemTime};

use memmap2::{MmapOptions, MmapRaw};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::mman::{shm_open, shm_unlink};
use nix::sys::stat::Mode;

use crate::error::{Error, ErrorKind, Result};

/// A POSIX shared-memory object mapped `MAP_SHARED` read-write.
///
/// The creating side (owner) unlinks the name on drop; an opener does not (rule N5).
/// `Send + Sync`: it holds only the mapping, and access to the bytes is by copy (rule N3).
pub(crate) struct PosixShm {
    name: ShmName,
    map: MmapRaw,
    owner: bool,
}

impl PosixShm {
    /// Creates `/{name}` exclusively (`O_CREAT | O_EXCL | O_RDWR`, mode 0600), sizes it to `len`
    /// bytes (zero-filled) and maps it.
    ///
    /// `len` must be greater than 0 ([`ErrorKind::InvalidArgument`](crate::error::ErrorKind)
    /// otherwise); an existing name or a refused system call is an
    /// [`ErrorKind::Os`](crate::error::ErrorKind) error. On any failure after the object was
    /// created it is unlinked before the error returns.
    pub(crate) fn create(name: &ShmName, len: usize) -> Result<PosixShm> {
        if len == 0 {
            return Err(Error::invalid(format!(
                "shared memory object {name}: length must be greater than 0"
            )));
        }
        let size = i64::try_from(len)
            .map_err(|_| Error::invalid(format!("shared memory object {name}: length {len} is too large")))?;
        // The object is backed lazily: one larger than the space left would be created, then
        // crash the first process that touches a page past it (SIGBUS). Refuse it here.
        if let Some(free) = shm_space_left()
            && len as u64 > free
        {
            return Err(Error::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "shared memory object {name}: {len} bytes asked for, but {SHM_DIR} has only {free} bytes free; drop buffers that are no longer needed, or make {SHM_DIR} larger"
                ),
            ));
        }
        let fd = shm_open(
            path(name).as_str(),
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )
        .map_err(|e| Error::os(&format!("creating shared memory object {name} ({len} bytes)"), e))?;
        let mapped = nix::unistd::ftruncate(&fd, size)
            .map_err(|e| Error::os(&format!("sizing shared memory object {name} to {len} bytes"), e))
            .and_then(|()| {
                MmapOptions::new()
                    .len(len)
                    .map_raw(&File::from(fd))
                    .map_err(|e| Error::os(&format!("mapping shared memory object {name} ({len} bytes)"), e))
            });
        match mapped {
            Ok(map) => Ok(PosixShm { name: *name, map, owner: true }),
            Err(e) => {
                unlink_quietly(name);
                Err(e)
            }
        }
    }

    /// Opens the existing object `/{name}` read-write and maps all of it.
    ///
    /// Refuses ([`ErrorKind::InvalidArgument`](crate::error::ErrorKind)) an object smaller than
    /// `min_len` bytes or empty (rule N4); a missing object or a refused system call is an
    /// [`ErrorKind::Os`](crate::error::ErrorKind) error.
    pub(crate) fn open(name: &ShmName, min_len: usize) -> Result<PosixShm> {
        let fd = shm_open(path(name).as_str(), OFlag::O_RDWR, Mode::empty())
            .map_err(|e| Error::os(&format!("opening shared memory object {name}"), e))?;
        let file = File::from(fd);
        let size = file
            .metadata()
            .map_err(|e| Error::os(&format!("reading the size of shared memory object {name}"), e))?
            .len();
        let len = usize::try_from(size).map_err(|_| {
            Error::invalid(format!("shared memory object {name}: size {size} does not fit in memory"))
        })?;
        if len < min_len || len == 0 {
            return Err(Error::invalid(format!(
                "shared memory object {name} holds {len} bytes, but {} are needed",
                min_len.max(1)
            )));
        }
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&file)
            .map_err(|e| Error::os(&format!("mapping shared memory object {name} ({len} bytes)"), e))?;
        Ok(PosixShm { name: *name, map, owner: false })
    }

    /// The object's name (without the leading `/`).
    pub(crate) fn name(&self) -> &ShmName {
        &self.name
    }

    /// The mapped length in bytes (never 0).
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The base address of the mapping. Dereferencing it is subject to rules N2 and N3.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// Copies `src` into the object at byte `offset`.
    ///
    /// [`ErrorKind::InvalidArgument`](crate::error::ErrorKind), naming the offset, the length and
    /// the size, when the range does not fit.
    pub(crate) fn write_bytes(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check_range("write", offset, src.len())?;
        // SAFETY: rule N2 — `offset + src.len() <= len`, checked above, and the mapping is live
        // (N1); rule N3 — a raw copy that creates no reference into the mapping and tolerates
        // overlap; any bytes are valid there.
        unsafe { ptr::copy(src.as_ptr(), self.as_ptr().add(offset), src.len()) };
        Ok(())
    }

    /// Copies bytes of the object starting at byte `offset` into `dst` (all of it).
    ///
    /// [`ErrorKind::InvalidArgument`](crate::error::ErrorKind), naming the offset, the length and
    /// the size, when the range does not fit.
    pub(crate) fn read_bytes(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_range("read", offset, dst.len())?;
        // SAFETY: rule N2 — `offset + dst.len() <= len`, checked above, and the mapping is live
        // (N1); rule N3 — a raw copy that creates no reference into the mapping and tolerates
        // overlap; any bytes are valid `u8`s in `dst`.
        unsafe { ptr::copy(self.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Rule N2: `offset + count <= len` without overflow.
    fn check_range(&self, what: &str, offset: usize, count: usize) -> Result<()> {
        let len = self.len();
        if offset <= len && count <= len - offset {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "shm object {}: {what} of {count} bytes at offset {offset} exceeds its size of {len} bytes",
                self.name
            )))
        }
    }
}

impl Drop for PosixShm {
    fn drop(&mut self) {
        // Rule N5: only the owner unlinks. The mapping itself is unmapped by `MmapRaw`.
        if self.owner {
            unlink_quietly(&self.name);
        }
    }
}

impl fmt::Debug for PosixShm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PosixShm")
            .field("name", &self.name)
            .field("len", &self.len())
            .field("owner", &self.owner)
            .finish()
    }
}

impl PosixShm {
    /// Whether the object still has its name (its creator has not unlinked it yet).
    pub(crate) fn is_linked(&self) -> bool {
        std::fs::metadata(format!("{SHM_DIR}/{}", self.name)).is_ok()
    }
}

/// Where POSIX shared-memory objects live on Linux.
const SHM_DIR: &str = "/dev/shm";

/// Bytes an unprivileged process may still allocate in [`SHM_DIR`], if the file system says.
fn shm_space_left() -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(SHM_DIR).ok()?;
    Some(st.blocks_available().saturating_mul(st.fragment_size()))
}

/// Unlinks `/{name}`, ignoring failures (a name that no longer exists is the common one).
///
/// For cleanup paths, where the object may never have been created or was already unlinked.
pub(crate) fn unlink_quietly(name: &ShmName) {
    match shm_unlink(path(name).as_str()) {
        Ok(()) | Err(Errno::ENOENT) => {}
        // Nothing useful to do on a cleanup path; the name is reported by whoever leaks it.
        Err(_) => {}
    }
}

/// The `shm_open` path of a name: a leading `/` and the name.
fn path(name: &ShmName) -> String {
    format!("/{name}")
}

// ------------------------------------------------------------------ names nobody will drop

/// The id of the process that made `name`, when `name` is one this library makes:
/// `sp-<8 hex>-<pid>-b<N>` (`Worker::create_buffer`) or `sp-doc-<pid>-<N>`
/// (`__private::doc_buffer`).
pub(crate) fn creator_pid(name: &str) -> Option<i32> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let parts: Vec<&str> = name.split('-').collect();
    let pid = match parts.as_slice() {
        ["sp", "doc", pid, n] if digits(n) => *pid,
        ["sp", nonce, pid, b]
            if nonce.len() == 8
                && nonce.bytes().all(|c| c.is_ascii_hexdigit())
                && b.strip_prefix('b').is_some_and(digits) =>
        {
            *pid
        }
        _ => return None,
    };
    if !digits(pid) {
        return None;
    }
    pid.parse::<i32>().ok().filter(|&p| p > 0)
}

/// What [`sweep_stale_buffers`] did.
///
/// ```
/// let report = simpler::sweep_stale_buffers()?;
/// assert_eq!(report.bytes_freed == 0, report.removed.is_empty());
/// println!("{} stale buffer(s) removed, {} bytes given back", report.removed.len(), report.bytes_freed);
/// # Ok::<(), simpler::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SweepReport {
    /// The names it unlinked (as listed in `/dev/shm`), each made by a process that is gone.
    pub removed: Vec<String>,
    /// The bytes those objects held: given back to the system once no process maps them.
    pub bytes_freed: u64,
    /// How many of this library's names it left alone because the process that made them is
    /// alive.
    pub kept: usize,
}

/// How much earlier than a process started an object must have last changed for the sweep to
/// take the object for one of an earlier process with the same id: the two times compared (the
/// object's `ctime`, and the process's start from `/proc`) have 10 ms resolution, and the wall
/// clock may be adjusted while a process runs.
pub(crate) const PID_REUSE_MARGIN: Duration = Duration::from_secs(1);

/// Whether the process that made an object last changed at `changed` is gone, given the start
/// time of the process that has its id now (`None`: no process has it).
///
/// A process creates its objects after it starts, and an object's `ctime` only moves forward,
/// so an object that last changed (by more than [`PID_REUSE_MARGIN`]) before the current
/// holder of the id started was made by an earlier process that had the same id.
pub(crate) fn creator_is_gone(changed: SystemTime, holder_started: Option<SystemTime>) -> bool {
    match holder_started {
        None => true,
        Some(started) => changed.checked_add(PID_REUSE_MARGIN).is_some_and(|c| c < started),
    }
}

/// When the process with id `pid` started (on the wall clock): `Ok(None)` when no such process
/// exists (`/proc/<pid>` is missing; a zombie still exists); an error when it cannot be told.
fn process_start(pid: i32) -> std::io::Result<Option<SystemTime>> {
    let stat = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let unreadable = || std::io::Error::other(format!("unreadable /proc/{pid}/stat"));
    // Field 22, `starttime`, in clock ticks since boot; the fields after the parenthesized
    // command name start at field 3.
    let ticks: u64 = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(19))
        .and_then(|t| t.parse().ok())
        .ok_or_else(unreadable)?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")?
        .split_whitespace()
        .next()
        .and_then(|t| t.parse().ok())
        .ok_or_else(unreadable)?;
    // SAFETY: rule N6 — sysconf takes and returns plain integers, no memory.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz <= 0 {
        return Err(unreadable());
    }
    let age = (uptime - ticks as f64 / hz as f64).max(0.0);
    Ok(SystemTime::now().checked_sub(Duration::from_secs_f64(age)))
}

/// Unlinks the `/dev/shm` names this library made (host buffers of `Worker::create_buffer`)
/// whose creating process has ended, and reports what it removed.
///
/// A process that ends without dropping its buffers leaves their names, and the memory behind
/// them, until reboot: killed by `SIGKILL` (or by any signal it does not handle, `SIGTERM` and
/// Ctrl-C included), or ended by `abort`. (A normal exit, `std::process::exit` and a panic
/// under `panic = "abort"` unlink them: see the book's chapter on failures.) Every
/// [`Worker::init`](crate::Worker::init) runs this sweep first, so the names left by a killed
/// program go when the next program using `simpler` starts; call it yourself to clean up at any
/// other time, for example from a cron job or after a crash.
///
/// **The rule.** A name `sp-<8 hex>-<pid>-b<N>` (or `sp-doc-<pid>-<N>`) belongs to process
/// `pid`. It is stale, and unlinked, when no process `pid` exists (`/proc/<pid>` is missing), or
/// when the process that has that id now started more than one second after the object last
/// changed (its `ctime`): the id was reused by a later process. A zombie still exists, so its
/// names go once its parent reaps it. Only objects owned by this user are considered. Processes
/// are looked up in this process's `/proc`: do not share `/dev/shm` between containers with
/// separate process-id namespaces while one of them sweeps.
///
/// Unlinking removes the name at once; the memory goes back when no process maps it any more.
///
/// # Errors
///
/// [`ErrorKind::Os`](crate::ErrorKind::Os) when `/dev/shm` cannot be listed. A name that cannot
/// be checked or unlinked is left alone and not reported.
///
/// # Examples
///
/// ```
/// use simpler::Worker;
///
/// # fn main() -> simpler::Result<()> {
/// let mut worker = Worker::builder().sub_workers(1).build()?;
/// worker.init()?; // sweeps too
/// let buf = worker.create_buffer(4096)?;
/// let report = simpler::sweep_stale_buffers()?;
/// // This process is alive: its buffer is kept.
/// assert!(report.removed.iter().all(|name| !name.contains(&format!("-{}-", std::process::id()))));
/// assert!(report.kept >= 1);
/// drop(buf);
/// worker.close()
/// # }
/// ```
pub fn sweep_stale_buffers() -> Result<SweepReport> {
    let dir = std::fs::read_dir(SHM_DIR).map_err(|e| Error::os(&format!("listing {SHM_DIR}"), e))?;
    // SAFETY: rule N6 — geteuid takes no arguments and cannot fail.
    let me = unsafe { libc::geteuid() };
    let mut report = SweepReport::default();
    for entry in dir.flatten() {
        let file = entry.file_name();
        let Some(pid) = file.to_str().and_then(creator_pid) else { continue };
        let Ok(meta) = entry.metadata() else { continue }; // unlinked meanwhile
        if meta.uid() != me || !meta.file_type().is_file() {
            continue;
        }
        let changed = ctime(&meta);
        let gone = pid as u32 != std::process::id()
            && match process_start(pid) {
                Ok(started) => creator_is_gone(changed, started),
                Err(_) => false, // cannot tell: keep it
            };
        if !gone {
            report.kept += 1;
            continue;
        }
        let Ok(name) = ShmName::from_bytes(file.as_encoded_bytes()) else { continue };
        // Another sweep may have unlinked it first (ENOENT); anything else leaves it.
        if shm_unlink(path(&name).as_str()).is_ok() {
            report.removed.push(name.to_string());
            report.bytes_freed += meta.len();
        }
    }
    Ok(report)
}

/// The time an object's status last changed (`ctime`).
fn ctime(meta: &std::fs::Metadata) -> SystemTime {
    let at = Duration::new(meta.ctime().max(0) as u64, meta.ctime_nsec().clamp(0, 999_999_999) as u32);
    SystemTime::UNIX_EPOCH + at
}

/// Unlinks every name of this library that carries this process's id (rule N6): what the exit
/// hook does.
fn unlink_own() {
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else { return };
    let me = std::process::id();
    for entry in dir.flatten() {
        let file = entry.file_name();
        if file.to_str().and_then(creator_pid).is_some_and(|pid| pid as u32 == me)
            && let Ok(name) = ShmName::from_bytes(file.as_encoded_bytes())
        {
            unlink_quietly(&name);
        }
    }
}

/// The `atexit` handler (rule N6).
extern "C" fn unlink_own_at_exit() {
    let _ = std::panic::catch_unwind(unlink_own);
}

/// Makes a process that ends by `exit` (returning from `main`, `std::process::exit`) or, in a
/// program built with `panic = "abort"`, by a panic, unlink the host buffers it made and did
/// not drop. Installed once per process tree, by the first `Worker::init`; a later call does
/// nothing.
///
/// Under `panic = "abort"` it wraps the panic hook installed at that moment (the wrapper
/// unlinks, then calls it); a hook the program installs later replaces the wrapper.
pub(crate) fn install_exit_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: rule N6 — the handler is an `extern "C" fn()` that catches every panic, takes
        // no lock and touches only names carrying the id of the process it runs in.
        unsafe { libc::atexit(unlink_own_at_exit) };
        if cfg!(panic = "abort") && !std::thread::panicking() {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                unlink_own();
                previous(info);
            }));
        }
    });
}

/// The longest POSIX shared-memory name a [`ShmName`] holds (without the leading `/`).
pub(crate) const SHM_NAME_MAX: usize = 31;

/// A POSIX shared-memory object name: 1..=31 printable ASCII bytes, no `/`, no space.
///
/// ```
/// # use simpler::__private::ShmName;
/// assert_eq!(ShmName::new("sp-1234-b1").unwrap().as_str(), "sp-1234-b1");
/// assert!(ShmName::new("a/b").is_err());
/// assert!(ShmName::new("").is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShmName {
    len: u8,
    bytes: [u8; SHM_NAME_MAX],
}

impl ShmName {
    /// Validates and stores a name.
    ///
    /// # Errors
    ///
    /// An empty name, one longer than [`SHM_NAME_MAX`] bytes, or one holding `/`, a space or
    /// any byte that is not printable ASCII is an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error.
    ///
    /// ```
    /// use simpler::ErrorKind;
    /// # use simpler::__private::ShmName;
    /// let name = ShmName::new("sp-42-b7").unwrap();
    /// assert_eq!(name.to_string(), "sp-42-b7");
    /// assert_eq!(ShmName::new("has space").unwrap_err().kind(), ErrorKind::InvalidArgument);
    /// assert!(ShmName::new("/leading-slash").is_err());
    /// ```
    pub fn new(name: &str) -> Result<ShmName> {
        ShmName::from_bytes(name.as_bytes())
    }

    /// Validates and stores a name given as bytes; the rules are those of [`ShmName::new`].
    ///
    /// ```
    /// # use simpler::__private::ShmName;
    /// assert_eq!(ShmName::from_bytes(b"sp-1").unwrap(), ShmName::new("sp-1").unwrap());
    /// assert!(ShmName::from_bytes(b"tab\there").is_err());
    /// assert!(ShmName::from_bytes(&[0xff]).is_err());
    /// ```
    pub fn from_bytes(name: &[u8]) -> Result<ShmName> {
        if name.is_empty() || name.len() > SHM_NAME_MAX {
            return Err(Error::invalid(format!(
                "shm name must be 1..={SHM_NAME_MAX} bytes, got {}",
                name.len()
            )));
        }
        if let Some(bad) = name.iter().find(|b| !b.is_ascii_graphic() || **b == b'/') {
            return Err(Error::invalid(format!(
                "shm name may hold only printable ASCII without '/' or space, found byte {bad:#04x}"
            )));
        }
        let mut bytes = [0u8; SHM_NAME_MAX];
        bytes[..name.len()].copy_from_slice(name);
        Ok(ShmName { len: name.len() as u8, bytes })
    }

    /// The name as a string.
    ///
    /// ```
    /// # use simpler::__private::ShmName;
    /// assert_eq!(ShmName::new("sp-1").unwrap().as_str(), "sp-1");
    /// ```
    pub fn as_str(&self) -> &str {
        // Validated as ASCII at construction.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }

    /// The name as bytes.
    ///
    /// ```
    /// # use simpler::__private::ShmName;
    /// assert_eq!(ShmName::new("sp-1").unwrap().as_bytes(), b"sp-1");
    /// ```
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl fmt::Debug for ShmName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ShmName({:?})", self.as_str())
    }
}

impl fmt::Display for ShmName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    /// A name unique to this test process.
    fn test_name(tag: &str) -> ShmName {
        ShmName::new(&format!("sp-t{}-{tag}", std::process::id())).unwrap()
    }

    /// Unlinks the name on drop, so a failing test leaks nothing.
    struct Cleanup(ShmName);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            unlink_quietly(&self.0);
        }
    }

    #[test]
    fn names_of_this_library_name_their_creator() {
        assert_eq!(creator_pid("sp-0a1b2c3d-4242-b17"), Some(4242));
        assert_eq!(creator_pid("sp-doc-77-3"), Some(77));
        for other in [
            "sp-0a1b2c3d-4242-c17",
            "sp-0a1b2c3-4242-b1",
            "sp-0a1b2c3g-4242-b1",
            "sp-0a1b2c3d-42x-b1",
            "sp-0a1b2c3d--b1",
            "sp-0a1b2c3d-0-b1",
            "sp-0a1b2c3d-4242-b",
            "sp-doc-77-",
            "sp-t4242-rw",
            "sp-c4242-x",
            "other-0a1b2c3d-4242-b1",
            "sp-0a1b2c3d-4242-b1-x",
        ] {
            assert_eq!(creator_pid(other), None, "{other}");
        }
    }

    #[test]
    fn a_reused_pid_does_not_keep_an_older_object() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert!(creator_is_gone(t, None), "no process has the id");
        assert!(!creator_is_gone(t, Some(t - Duration::from_secs(60))), "its creator, started before");
        assert!(!creator_is_gone(t, Some(t + Duration::from_millis(500))), "within the margin: kept");
        assert!(creator_is_gone(t, Some(t + PID_REUSE_MARGIN + Duration::from_millis(1))), "a later process");
    }

    #[test]
    fn this_process_starts_before_it_creates() {
        let started = process_start(std::process::id() as i32).unwrap().expect("this process exists");
        let name = test_name("start");
        let _cleanup = Cleanup(name);
        let _shm = PosixShm::create(&name, 8).unwrap();
        let changed = ctime(&std::fs::metadata(format!("{SHM_DIR}/{name}")).unwrap());
        assert!(!creator_is_gone(changed, Some(started)), "{changed:?} vs start {started:?}");
        assert!(started <= SystemTime::now());
        assert_eq!(process_start(i32::MAX).unwrap(), None, "no such process");
    }

    #[test]
    fn create_open_write_read() {
        let name = test_name("rw");
        let _cleanup = Cleanup(name);
        let owner = PosixShm::create(&name, 4096).unwrap();
        assert_eq!(owner.len(), 4096);
        assert_eq!(owner.name(), &name);
        let mut zeros = [1u8; 16];
        owner.read_bytes(4080, &mut zeros).unwrap();
        assert_eq!(zeros, [0; 16]);
        owner.write_bytes(100, b"hello").unwrap();

        let opener = PosixShm::open(&name, 4096).unwrap();
        assert_eq!(opener.len(), 4096);
        let mut got = [0u8; 5];
        opener.read_bytes(100, &mut got).unwrap();
        assert_eq!(&got, b"hello");
        opener.write_bytes(4091, b"tail!").unwrap();
        owner.read_bytes(4091, &mut got).unwrap();
        assert_eq!(&got, b"tail!");

        // Dropping an opener does not unlink.
        drop(opener);
        assert!(PosixShm::open(&name, 1).is_ok());
    }

    #[test]
    fn out_of_range_copies_are_refused() {
        let name = test_name("oob");
        let _cleanup = Cleanup(name);
        let shm = PosixShm::create(&name, 64).unwrap();
        let err = shm.write_bytes(60, &[0; 5]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.message().contains("offset 60"), "{err}");
        assert!(err.message().contains("64 bytes"), "{err}");
        assert!(shm.read_bytes(usize::MAX, &mut [0; 2]).is_err());
        assert!(shm.read_bytes(65, &mut []).is_err());
        assert!(shm.read_bytes(64, &mut []).is_ok());
        assert!(shm.write_bytes(0, &[7; 64]).is_ok());
    }

    #[test]
    fn open_refuses_smaller_objects_and_missing_names() {
        let name = test_name("small");
        let _cleanup = Cleanup(name);
        let _owner = PosixShm::create(&name, 100).unwrap();
        let err = PosixShm::open(&name, 101).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.message().contains("100 bytes"), "{err}");
        assert!(PosixShm::open(&name, 100).is_ok());

        let missing = test_name("missing");
        assert_eq!(PosixShm::open(&missing, 1).unwrap_err().kind(), ErrorKind::Os);
    }

    #[test]
    fn owner_drop_unlinks() {
        let name = test_name("unlink");
        let _cleanup = Cleanup(name);
        let owner = PosixShm::create(&name, 8).unwrap();
        drop(owner);
        assert_eq!(PosixShm::open(&name, 1).unwrap_err().kind(), ErrorKind::Os);
        // Unlinking again is quiet.
        unlink_quietly(&name);
    }

    #[test]
    fn create_refuses_existing_names_and_zero_length() {
        let name = test_name("excl");
        let _cleanup = Cleanup(name);
        let first = PosixShm::create(&name, 8).unwrap();
        let err = PosixShm::create(&name, 8).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Os);
        // The failed create must not have unlinked the first object's name.
        assert!(PosixShm::open(&name, 8).is_ok());
        drop(first);

        let zero = test_name("zero");
        assert_eq!(PosixShm::create(&zero, 0).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert!(PosixShm::open(&zero, 0).is_err());
    }
}
