//! Host memory shared across the process tree, and the sweep of the names older versions left
//! in `/dev/shm`.
//!
//! A [`SharedMem`] is an anonymous `memfd` object (`memfd_create`, `MFD_CLOEXEC`) mapped
//! `MAP_SHARED` read-write. It has no name in any file system: the creating process holds the
//! only descriptor, and another process of the tree (a child or a grandchild resolving a buffer
//! descriptor, map-once per identity) reaches it through `/proc/<creator>/fd/<fd>` (or a live
//! thread's `/proc/<creator>/task/<tid>/fd/<fd>` once the creator's main thread has exited, see
//! `sys::peer_fd`), maps it and closes its own descriptor at once. Its memory is given back when the creator has closed the
//! descriptor and no process maps it any more, so a tree that ends in any way, `SIGKILL`
//! included, leaves nothing behind: children follow a dead parent within milliseconds
//! (`PR_SET_PDEATHSIG`), and the kernel frees the memory once the last of them is gone.
//!
//! # Resources and limits
//!
//! * **Memory.** [`SharedMem::create`] refuses at once, with a `ResourceExhausted` error naming
//!   the size, what is left and what the live buffers hold, a buffer that, with what this
//!   process's live buffers may still take, is more than the machine can back (rule N8):
//!   `MemAvailable + SwapFree`, or the memory cgroup's headroom when smaller. The kernel's
//!   internal tmpfs behind memfds has no size limit of its own, so the size of `/dev/shm` does
//!   not apply.
//! * **Descriptors.** Each live buffer holds a descriptor in its creator: the first `create`
//!   raises the soft `RLIMIT_NOFILE` to the hard limit, and `EMFILE` is a `ResourceExhausted`
//!   error naming the limit.
//! * **Who may open a buffer.** Opening `/proc/<pid>/fd/<fd>` needs the creator to be of the
//!   same user and dumpable (the default; see `sys::peer_fd` for why not `pidfd_getfd`).
//! * **Forks and execs.** A process forked after a buffer was created (the children of a Worker
//!   started with `StartMethod::Fork`) inherits its descriptor and mapping, and keeps the memory
//!   until it exits; a child started by exec inherits nothing (the descriptor is close-on-exec).
//! * **The legacy sweep.** [`sweep_stale_buffers`] (public, run by every `Worker::init`)
//!   unlinks the `/dev/shm` names that earlier versions made and whose process is dead
//!   (`/proc/<pid>` missing, or its process started over a second after the object's `ctime`:
//!   a reused pid). Nothing creates such names any more, and no exit hook unlinks anything.
//!
//! # Rules
//!
//! * **N1 (the mapping).** The whole object (`len` bytes) is mapped `MAP_SHARED` read-write by a
//!   `memmap2::MmapRaw` owned by the [`SharedMem`]; it stays mapped until the value drops.
//! * **N2 (bounds).** Every copy into or out of the mapping is checked against `len` first:
//!   `offset + count <= len`, computed without overflow.
//! * **N3 (plain shared bytes).** Other processes may access the same bytes at any time. This
//!   module never creates a reference into the mapping: it copies through raw pointers with
//!   `ptr::copy`, which also tolerates a caller slice that itself points into a mapping. Every
//!   byte pattern is a valid `u8`, so a racing writer can make a reader see stale or torn bytes,
//!   never an invalid value. Ordering between a task's writes and a later reader's copies comes
//!   from the task protocol (a completion is published through the mailbox state word).
//! * **N4 (size).** The creator sets the size with `ftruncate` before mapping, then seals it
//!   (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`): no process can change it afterwards, so no
//!   access within the size faults. An opener maps the size `fstat` reports and refuses an
//!   object smaller than it needs.
//! * **N5 (identity).** An opener maps only the object its descriptor names: after opening
//!   `/proc/<pid>/fd/<fd>` (or the same descriptor under a live thread of `pid`, `sys::peer_fd`)
//!   it checks, on the descriptor it got, that the object is a memfd named
//!   for the buffer (`/memfd:sp-<8 hex>-<pid>-b<N>`, from the buffer's identity and its
//!   creator) with the inode number the descriptor carries. A descriptor number the creator
//!   closed and reused names another object (another inode, another name): refused with an
//!   error that says so, never mapped.
//! * **N6 (lifetime).** The creator closes its descriptor only when the value drops, after
//!   unmapping; an opener closes its own right after mapping. Nothing else holds the object: no
//!   name exists to outlive the processes.
//! * **N7 (the legacy sweep).** [`sweep_stale_buffers`] removes `/dev/shm` names through
//!   `std::fs`; the only system calls it makes itself (`sysconf`, `geteuid`) take and return
//!   plain integers, no memory.
//! * **N8 (committed memory).** A memfd takes memory only as its pages are first written, so
//!   buffers that each fit what is left when created can together overcommit the machine.
//!   [`SharedMem::create`] admits a buffer of `len` bytes only when `len` plus what this
//!   process's live buffers may still take fits [`memory_left`]: their bytes not yet backed
//!   (size minus the blocks `fstat` reports, which counts pages in memory and in swap), since
//!   the figure of what is left already leaves out the pages they have backed. The live buffers
//!   are those this process created and has not dropped, in one process-wide list ([`LIVE`])
//!   with the bytes of creations under way, reserved under the lock together with the check,
//!   so two threads cannot both take the last room. The list holds a clone of each creator's
//!   descriptor that never leaves its lock, and a value leaves the list at the start of its
//!   `drop`, so its descriptor still closes when it drops (N6). The descriptors are read only
//!   when the sizes alone do not fit. The lock is held for map updates and those reads, never
//!   while waiting; like every lock of the library it must not be held by another thread when
//!   a process forks (rule P1 of `sys::process`). Buffers of other processes (another
//!   program's, or the parent's that a child maps) are not counted.
//!
//! # Memory ordering
//!
//! No atomics here: the copies are plain memory accesses, ordered by whatever protocol tells the
//! reader that the writer is done (rule N3).

#![expect(
    unsafe_code,
    reason = "raw copies into and out of a mapping other processes share; the legacy sweep's system calls; rules N1-N8"
)]

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fmt;
use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;
use std::ptr;
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, SystemTime};

use memmap2::{MmapOptions, MmapRaw};
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MemFdCreateFlag, memfd_create};

use crate::error::{Error, ErrorKind, Result};
use crate::sys::{peer_fd, sync};

/// Where another process finds a [`SharedMem`]: its creator's process id, the creator's
/// descriptor number and the object's inode number (rule N5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SharedKey {
    /// The creating process.
    pub(crate) pid: u32,
    /// The creator's descriptor of the object.
    pub(crate) fd: u32,
    /// The object's inode number.
    pub(crate) ino: u64,
}

/// The memfd name of a host buffer: `sp-<low 32 bits of the owner nonce, 8 hex>-<creator
/// pid>-b<buffer id>`. Shown in `/proc/<pid>/maps` and `/proc/<pid>/fd` (as
/// `/memfd:<name> (deleted)`), and checked by every opener (rule N5).
pub(crate) fn buffer_label(owner: u64, pid: u32, buffer_id: u64) -> String {
    format!("sp-{:08x}-{pid}-b{buffer_id}", owner as u32)
}

/// A memfd object mapped `MAP_SHARED` read-write.
///
/// The creator holds the object's descriptor until the value drops; an opener holds only the
/// mapping (rule N6). `Send + Sync`: it holds the mapping and a descriptor, and access to the
/// bytes is by copy (rule N3).
pub(crate) struct SharedMem {
    map: MmapRaw,
    /// The creator's descriptor; `None` in an opener. Declared after `map`, so it closes after
    /// the unmap (rule N6). Shared only with the list of live buffers ([`LIVE`], rule N8),
    /// which gives its clone back in `drop`, before this one drops.
    file: Option<Arc<File>>,
    key: SharedKey,
    label: String,
}

impl SharedMem {
    /// Creates a memfd object named `label` of `len` bytes (zero-filled, backed lazily), seals
    /// its size and maps it.
    ///
    /// `len` must be greater than 0 ([`ErrorKind::InvalidArgument`](crate::error::ErrorKind)
    /// otherwise). More than the machine can back ([`memory_left`]) once the live buffers of
    /// this process are written (rule N8), or a process out of file descriptors, is an
    /// [`ErrorKind::ResourceExhausted`](crate::error::ErrorKind) error that names the size,
    /// what is left and what the live buffers hold; a refused system call an
    /// [`ErrorKind::Os`](crate::error::ErrorKind) error. Nothing outlives a failure.
    pub(crate) fn create(label: &str, len: usize) -> Result<SharedMem> {
        if len == 0 {
            return Err(Error::invalid(format!("host buffer {label}: length must be greater than 0")));
        }
        let size = i64::try_from(len)
            .map_err(|_| Error::invalid(format!("host buffer {label}: length {len} is too large")))?;
        // The object is backed lazily: one that, with the buffers already live, is more than
        // the machine can back would be created, then fail the process that touches a page
        // past it (SIGBUS, or the OOM killer). Refuse it here (rule N8).
        let reservation = Reservation::admit(label, len as u64)?;
        raise_fd_limit();
        let cname = CString::new(label)
            .map_err(|_| Error::invalid(format!("host buffer label {label:?} holds a NUL")))?;
        let fd = memfd_create(&cname, MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING)
            .map_err(|e| fd_error(label, len, e))?;
        let file = File::from(fd);
        nix::unistd::ftruncate(&file, size)
            .map_err(|e| Error::os(&format!("sizing host buffer {label} to {len} bytes"), e))?;
        // Rule N4: the size never changes again.
        fcntl(
            file.as_raw_fd(),
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL),
        )
        .map_err(|e| Error::os(&format!("sealing the size of host buffer {label}"), e))?;
        let ino = file
            .metadata()
            .map_err(|e| Error::os(&format!("reading the inode of host buffer {label}"), e))?
            .ino();
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&file)
            .map_err(|e| Error::os(&format!("mapping host buffer {label} ({len} bytes)"), e))?;
        let fd = u32::try_from(file.as_raw_fd())
            .map_err(|_| Error::invalid("memfd_create returned a negative descriptor"))?;
        let key = SharedKey { pid: std::process::id(), fd, ino };
        let file = Arc::new(file);
        reservation.hold(ino, file.clone(), len as u64);
        Ok(SharedMem { map, file: Some(file), key, label: label.to_string() })
    }

    /// Opens the object `key` names, checks that it is the memfd `label` with the inode the key
    /// carries (rule N5), and maps all of it; the descriptor opened for it is closed before
    /// this returns.
    ///
    /// A creator that is gone or closed the descriptor is an
    /// [`ErrorKind::Os`](crate::error::ErrorKind) error that says which (`sys::peer_fd`); another object at that descriptor
    /// number (a reused number), or an object smaller than `min_len` bytes, an
    /// [`ErrorKind::InvalidArgument`](crate::error::ErrorKind) error that names both.
    pub(crate) fn open(key: SharedKey, label: &str, min_len: usize) -> Result<SharedMem> {
        let SharedKey { pid, fd, ino } = key;
        // Through `/proc/<pid>/fd/<fd>`, or a live thread's view of it when the creator's main
        // thread has exited (`sys::peer_fd`).
        let (file, path) = peer_fd::open(pid, fd, std::fs::OpenOptions::new().read(true).write(true))
            .map_err(|e| Error::os(&format!("opening host buffer {label} of process {pid}"), e))?;
        // The name of what we opened, read from our own descriptor (as this thread sees it):
        // no race with the creator.
        let link = std::fs::read_link(format!("/proc/thread-self/fd/{}", file.as_raw_fd()))
            .map_err(|e| Error::os(&format!("reading what {path} is"), e))?;
        let meta = file.metadata().map_err(|e| Error::os(&format!("reading the status of {path}"), e))?;
        if !is_memfd_named(&link.to_string_lossy(), label) || meta.ino() != ino {
            return Err(Error::invalid(format!(
                "host buffer {label}: {path} is {} (inode {}), not the memfd {label} with inode {ino}; its creator dropped it and reused the descriptor number",
                link.display(),
                meta.ino()
            )));
        }
        let size = meta.len();
        let len = usize::try_from(size).map_err(|_| {
            Error::invalid(format!("host buffer {label}: size {size} does not fit in memory"))
        })?;
        if len < min_len || len == 0 {
            return Err(Error::invalid(format!(
                "host buffer {label} holds {len} bytes, but {} are needed",
                min_len.max(1)
            )));
        }
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&file)
            .map_err(|e| Error::os(&format!("mapping host buffer {label} ({len} bytes)"), e))?;
        // Rule N6: the opener keeps the mapping only; `file` closes here.
        Ok(SharedMem { map, file: None, key, label: label.to_string() })
    }

    /// Where other processes find the object.
    pub(crate) fn key(&self) -> SharedKey {
        self.key
    }

    /// Whether the creator still holds the object: its descriptor number still names this
    /// object (an opener's view; the creator's own is always true).
    pub(crate) fn is_held(&self) -> bool {
        if self.file.is_some() {
            return true;
        }
        let SharedKey { pid, fd, ino } = self.key;
        peer_fd::metadata(pid, fd).is_some_and(|m| m.ino() == ino)
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

    /// Fills `count` bytes of the object at byte `offset` from the file descriptor `fd` (a
    /// socket), with `read(2)`: the kernel copies straight into the mapping, so bytes arriving
    /// from the network land in the buffer without passing through another one.
    ///
    /// An end of stream before `count` bytes is `io::ErrorKind::UnexpectedEof`; a read timeout
    /// on `fd` comes back as the `WouldBlock` error `read` gives. A range outside the object is
    /// `io::ErrorKind::InvalidInput`, before anything is read.
    pub(crate) fn read_from_fd(
        &self,
        offset: usize,
        count: usize,
        fd: BorrowedFd<'_>,
    ) -> std::io::Result<()> {
        self.transfer("read from a socket", offset, count, |at, n| {
            // SAFETY: rule N2 — `transfer` checked `offset + count <= len` and passes a range
            // inside it, in the live mapping (N1); rule N3 — the kernel writes the bytes through
            // the raw pointer, no reference into the mapping is made, and any byte is a valid
            // `u8` there.
            let got = unsafe { libc::read(fd.as_raw_fd(), at.cast(), n) };
            (got, std::io::ErrorKind::UnexpectedEof)
        })
    }

    /// Sends `count` bytes of the object at byte `offset` to the socket `fd`, with `send(2)`
    /// (`MSG_NOSIGNAL`: a closed peer is an `EPIPE` error, not a signal): the kernel copies
    /// straight out of the mapping. A range outside the object is
    /// `io::ErrorKind::InvalidInput`, before anything is sent.
    pub(crate) fn send_to_fd(&self, offset: usize, count: usize, fd: BorrowedFd<'_>) -> std::io::Result<()> {
        self.transfer("send to a socket", offset, count, |at, n| {
            // SAFETY: rule N2 — `transfer` checked `offset + count <= len` and passes a range
            // inside it, in the live mapping (N1); rule N3 — the kernel reads the bytes through
            // the raw pointer and no reference into the mapping is made.
            let sent = unsafe { libc::send(fd.as_raw_fd(), at.cast_const().cast(), n, libc::MSG_NOSIGNAL) };
            (sent, std::io::ErrorKind::WriteZero)
        })
    }

    /// Moves `count` bytes at `offset` with `op(address, bytes left)`, a system call that
    /// returns how many it moved (0: the other end is done, an error of the kind it returns
    /// with; negative: `errno`, retried when interrupted), until all moved. Checks the range
    /// first (rule N2).
    fn transfer(
        &self,
        what: &str,
        offset: usize,
        count: usize,
        mut op: impl FnMut(*mut u8, usize) -> (isize, std::io::ErrorKind),
    ) -> std::io::Result<()> {
        self.check_range(what, offset, count)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        let mut done = 0;
        while done < count {
            // `offset + done < offset + count <= len`: inside the mapping.
            let at = self.as_ptr().wrapping_add(offset + done);
            match op(at, count - done) {
                (0, ended) => {
                    return Err(std::io::Error::new(
                        ended,
                        format!("{what}: the connection ended after {done} of {count} bytes"),
                    ));
                }
                (n, _) if n > 0 => done += n as usize,
                _ => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }

    /// Rule N2: `offset + count <= len` without overflow.
    fn check_range(&self, what: &str, offset: usize, count: usize) -> Result<()> {
        let len = self.len();
        if offset <= len && count <= len - offset {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "host buffer {}: {what} of {count} bytes at offset {offset} exceeds its size of {len} bytes",
                self.label
            )))
        }
    }
}

impl Drop for SharedMem {
    /// Rule N8: the buffer leaves the list of live buffers before its descriptor closes (the
    /// fields drop after this).
    fn drop(&mut self) {
        if self.file.is_some() {
            let mut live = sync::lock(&LIVE);
            if let Some((_, len)) = live.held.remove(&self.key.ino) {
                live.bytes -= len;
            }
        }
    }
}

impl fmt::Debug for SharedMem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedMem")
            .field("label", &self.label)
            .field("key", &self.key)
            .field("len", &self.len())
            .field("creator", &self.file.is_some())
            .finish()
    }
}

/// Whether `link` (what `/proc/<pid>/fd/<n>` points at) is the memfd named `label`: the kernel
/// shows it as `/memfd:<label> (deleted)`.
fn is_memfd_named(link: &str, label: &str) -> bool {
    link.strip_prefix("/memfd:")
        .and_then(|rest| rest.strip_prefix(label))
        .is_some_and(|rest| rest.is_empty() || rest == " (deleted)")
}

/// The error of a failed `memfd_create`: out of descriptors is `ResourceExhausted`, naming the
/// limit.
fn fd_error(label: &str, len: usize, e: Errno) -> Error {
    match e {
        Errno::EMFILE => Error::new(
            ErrorKind::ResourceExhausted,
            format!(
                "host buffer {label} ({len} bytes): this process has used all {} file descriptors its limit (RLIMIT_NOFILE) allows; each live host buffer holds one: drop buffers that are no longer needed, or raise the hard limit (ulimit -Hn)",
                fd_limit().map_or_else(|| "the".to_string(), |n| n.to_string())
            ),
        ),
        Errno::ENFILE => Error::new(
            ErrorKind::ResourceExhausted,
            format!(
                "host buffer {label} ({len} bytes): the system's table of open files is full (fs.file-max)"
            ),
        ),
        e => Error::os(&format!("creating host buffer {label} ({len} bytes)"), e),
    }
}

/// This process's soft limit on open descriptors.
fn fd_limit() -> Option<u64> {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).ok().map(|(soft, _)| soft)
}

/// Raises the soft limit on open descriptors to the hard limit, once per process (each live
/// host buffer holds a descriptor in its creator), as Go's runtime does. A failure leaves the
/// limit as it was: `memfd_create` then reports `EMFILE` when it is reached.
fn raise_fd_limit() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
            && soft < hard
        {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    });
}

/// The host buffers this process created and holds, and the creations under way (rule N8).
struct Live {
    /// Each live buffer's descriptor and size, by inode.
    held: BTreeMap<u64, (Arc<File>, u64)>,
    /// The sum of the sizes in `held`.
    bytes: u64,
    /// Buffers being created: admitted, not yet in `held`.
    creating: usize,
    /// Their bytes.
    reserved: u64,
}

/// This process's live host buffers (rule N8).
static LIVE: Mutex<Live> = Mutex::new(Live { held: BTreeMap::new(), bytes: 0, creating: 0, reserved: 0 });

/// What this process's live host buffers (and the ones being created) hold, for the check of
/// a new one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Commitment {
    /// How many.
    pub(crate) buffers: usize,
    /// Their sizes, in bytes.
    pub(crate) bytes: u64,
    /// The bytes of them no memory backs yet: what writing them all would still take.
    pub(crate) unbacked: u64,
}

impl Live {
    /// What the live buffers hold, the backed bytes of each read from its descriptor (rule N8:
    /// called with the lock held). A descriptor that cannot be read counts as wholly unbacked.
    fn commitment(&self) -> Commitment {
        let unbacked: u64 = self
            .held
            .values()
            .map(|(file, len)| {
                file.metadata().map_or(*len, |m| m.len().saturating_sub(m.blocks().saturating_mul(512)))
            })
            .sum();
        Commitment {
            buffers: self.held.len() + self.creating,
            bytes: self.bytes + self.reserved,
            unbacked: unbacked + self.reserved,
        }
    }
}

/// Room taken in [`LIVE`] for one buffer being created, given back on drop unless the buffer
/// was created ([`hold`](Reservation::hold)).
struct Reservation {
    len: u64,
}

impl Reservation {
    /// Admits a new buffer of `len` bytes (rule N8) and reserves its room, or refuses it with a
    /// `ResourceExhausted` error (see [`admit`]). When the memory left cannot be told, every
    /// buffer is admitted.
    fn admit(label: &str, len: u64) -> Result<Reservation> {
        let left = memory_left();
        let mut live = sync::lock(&LIVE);
        if let Some(left) = left {
            // Unbacked bytes are at most the sizes: when the sizes fit, the descriptors need
            // not be read.
            let sizes = live.bytes + live.reserved;
            if sizes.saturating_add(len) > left.bytes {
                admit(label, len, &left, &live.commitment())?;
            }
        }
        live.creating += 1;
        live.reserved += len;
        Ok(Reservation { len })
    }

    /// The buffer is created: it takes its place among the live ones, then the reservation
    /// ends (in between it counts twice, which refuses more, never less).
    fn hold(self, ino: u64, file: Arc<File>, len: u64) {
        let mut live = sync::lock(&LIVE);
        live.held.insert(ino, (file, len));
        live.bytes += len;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut live = sync::lock(&LIVE);
        live.creating -= 1;
        live.reserved -= self.len;
    }
}

/// Rule N8: a new buffer of `len` bytes fits when `len` plus what the live buffers may still
/// take (their unbacked bytes) is at most what is left; otherwise a `ResourceExhausted` error
/// naming the size, what is left and what the live buffers hold.
pub(crate) fn admit(label: &str, len: u64, left: &MemoryLeft, live: &Commitment) -> Result<()> {
    let need = len.saturating_add(live.unbacked);
    if need <= left.bytes {
        return Ok(());
    }
    let held = if live.buffers == 0 {
        String::new()
    } else {
        format!(
            ", and the {n} live host {buffers} of this process {hold} {bytes} bytes, {unbacked} of them not yet backed by memory (a buffer takes its memory as its pages are first written): {need} bytes in all",
            n = live.buffers,
            buffers = if live.buffers == 1 { "buffer" } else { "buffers" },
            hold = if live.buffers == 1 { "holds" } else { "hold" },
            bytes = live.bytes,
            unbacked = live.unbacked,
        )
    };
    Err(Error::new(
        ErrorKind::ResourceExhausted,
        format!(
            "host buffer {label}: {len} bytes asked for, but only {} bytes of memory are left ({}){held}; drop buffers that are no longer needed",
            left.bytes, left.source
        ),
    ))
}

/// How much memory a new host buffer may still take, and where that figure comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MemoryLeft {
    /// Bytes.
    pub(crate) bytes: u64,
    /// What limits it, for messages.
    pub(crate) source: String,
}

/// What the machine can still back for a memfd object, if it can be told: `MemAvailable +
/// SwapFree` from `/proc/meminfo`, or less when this process's memory cgroup has less headroom
/// (its limit minus its usage). A memfd lives on the kernel's internal tmpfs, which has no size
/// limit of its own: `/dev/shm`'s size does not bound it.
pub(crate) fn memory_left() -> Option<MemoryLeft> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |key: &str| -> Option<u64> {
        meminfo.lines().find_map(|line| {
            let rest = line.strip_prefix(key)?.strip_prefix(':')?;
            let kb: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
            Some(kb.saturating_mul(1024))
        })
    };
    let system = field("MemAvailable")?.saturating_add(field("SwapFree").unwrap_or(0));
    let mut left =
        MemoryLeft { bytes: system, source: "MemAvailable + SwapFree in /proc/meminfo".to_string() };
    if let Some((headroom, path)) = cgroup_headroom()
        && headroom < left.bytes
    {
        left = MemoryLeft { bytes: headroom, source: format!("the memory limit of cgroup {path}") };
    }
    Some(left)
}

/// The memory this process's cgroup may still charge (limit minus usage), when it has a limit
/// that can be read: cgroup v2 (`memory.max`, `memory.current`), else v1
/// (`memory.limit_in_bytes`, `memory.usage_in_bytes`).
fn cgroup_headroom() -> Option<(u64, String)> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |path: &str| std::fs::read_to_string(path).ok()?.trim().parse::<u64>().ok();
    for line in groups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let (dir, limit, usage) = if controllers.is_empty() {
            (format!("/sys/fs/cgroup{path}"), "memory.max", "memory.current")
        } else if controllers.split(',').any(|c| c == "memory") {
            (format!("/sys/fs/cgroup/memory{path}"), "memory.limit_in_bytes", "memory.usage_in_bytes")
        } else {
            continue;
        };
        // "max" (v2) does not parse: no limit.
        if let (Some(limit), Some(usage)) = (read(&format!("{dir}/{limit}")), read(&format!("{dir}/{usage}")))
        {
            return Some((limit.saturating_sub(usage), dir));
        }
    }
    None
}

// -------------------------------------------------------- names left by older versions

/// Where versions of this library before memfd-backed buffers put them.
const SHM_DIR: &str = "/dev/shm";

/// The id of the process that made `name`, when `name` is one older versions of this library
/// made in `/dev/shm`: `sp-<8 hex>-<pid>-b<N>` (`Worker::create_buffer`) or `sp-doc-<pid>-<N>`
/// (`__private::doc_buffer`). Today's buffers have the first form as their memfd name.
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
/// let report = simpler::memory::sweep_stale_buffers()?;
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
    // SAFETY: rule N7 — sysconf takes and returns plain integers, no memory.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz <= 0 {
        return Err(unreadable());
    }
    let age = (uptime - ticks as f64 / hz as f64).max(0.0);
    Ok(SystemTime::now().checked_sub(Duration::from_secs_f64(age)))
}

/// Unlinks the `/dev/shm` names that earlier versions of this library made (host buffers of
/// `Worker::create_buffer`) and whose creating process has ended, and reports what it removed.
///
/// Host buffers no longer have a name: each is an anonymous `memfd` object that its creating
/// process holds and the processes of its Worker tree map, so its memory goes back to the
/// system when the last of them ends, however it ends (`SIGKILL`, `SIGTERM`, Ctrl-C, `abort`
/// and `std::process::exit` included). What is left to sweep are the names an older program
/// that was killed left behind, which held their memory until reboot. Every
/// [`Worker::init`](crate::Worker::init) runs this sweep first; call it yourself to clean up at
/// any other time.
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
/// let buf = worker.create_buffer(4096)?; // a memfd: nothing in /dev/shm
/// let report = simpler::memory::sweep_stale_buffers()?;
/// // Names of live processes are kept; this process made none.
/// assert!(report.removed.iter().all(|name| !name.contains(&format!("-{}-", std::process::id()))));
/// assert_eq!(report.bytes_freed == 0, report.removed.is_empty());
/// drop(buf);
/// worker.close()
/// # }
/// ```
pub fn sweep_stale_buffers() -> Result<SweepReport> {
    let dir = std::fs::read_dir(SHM_DIR).map_err(|e| Error::os(&format!("listing {SHM_DIR}"), e))?;
    // SAFETY: rule N7 — geteuid takes no arguments and cannot fail.
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
        let Some(name) = file.to_str() else { continue };
        // `shm_unlink` is `unlink` in /dev/shm. Another sweep may have unlinked it first
        // (ENOENT); anything else leaves it.
        if std::fs::remove_file(entry.path()).is_ok() {
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

#[cfg(test)]
mod tests;
