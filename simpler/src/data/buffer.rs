//! Buffers: owned backing memory with a canonical identity.
//!
//! A [`BufferDesc`] is the self-describing, address-free description that travels with every
//! tensor: who minted the buffer ([`Identity`]), where its bytes live ([`Backing`]), what access it
//! grants ([`Access`]) and how large it is. Each receiving process resolves a descriptor to a
//! local address itself (map-once per identity); no address crosses a process boundary except
//! a [`Backing::HeapSlab`]'s address in the process that created its heap ring, which travels
//! with the ring's inode so each process can find the ring among its own mappings.
//!
//! An [`Identity`] (owner nonce, buffer id, generation) is the same in every process; an
//! [`IdentityMinter`] makes them. A [`Backing`] is `HeapSlab { addr, ino }` (an address in the
//! process that made heap ring `ino`), `Memfd { pid, fd, ino }` (a host buffer's memfd in its
//! creator) or `Device { ptr, chip }` (memory of one chip). [`BufferDesc::new`] refuses a null
//! slab address or ring, and an out-of-range memfd key.
//!
//! A [`Buffer`] owns the backing of a host buffer made by `Worker::create_buffer` (an anonymous
//! memfd object, see `sys::shm`), or stands for a chip's device buffer; dropping the last clone
//! of a host buffer closes it. A submitted task holds the host buffers of its tracked tensors
//! ([`BufferInner::hold`], paired `SeqCst` with [`Buffer::write`], which is refused meanwhile;
//! a submit waits for a host write under way), so no host write races a worker's slices.

use std::fmt;
use std::sync::Arc;

use crate::data::dtype::{DataType, Element};
use crate::data::tensor::{Tensor, TensorView};
use crate::error::{Error, Result};
use crate::sys::mem::{as_bytes, as_bytes_mut};
use crate::sys::shm::{SharedKey, SharedMem, buffer_label};

/// The canonical identity of a buffer: invariant across every process and level it travels to.
///
/// `owner` is a random nonce minted when the owning Worker starts, `buffer_id` counts up per
/// owner (0 is reserved) and `generation` starts at 1 (0 is invalid).
///
/// Only the library mints identities (a Worker for its buffers and intermediates): a
/// descriptor can never describe a buffer under a second identity.
///
/// ```
/// # let buffer = simpler::__private::doc_buffer(64)?;
/// // `buffer`: a host buffer (`worker.create_buffer(64)?`).
/// let id = buffer.desc().identity();
/// assert_eq!(id.generation(), 1);
/// # Ok::<(), simpler::Error>(())
/// ```
///
/// User code cannot make one:
///
/// ```compile_fail
/// let forged = simpler::memory::Identity::new(0xfeed, 1, 1); // error: `new` is private
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    owner: u64,
    buffer_id: u64,
    generation: u32,
}

impl Identity {
    /// Builds an identity; a zero `buffer_id` (reserved) or `generation` (invalid) is an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error. Crate-private:
    /// identities are minted by the library only ([`IdentityMinter`]).
    pub(crate) fn new(owner: u64, buffer_id: u64, generation: u32) -> Result<Identity> {
        if buffer_id == 0 {
            return Err(Error::invalid("buffer identity: buffer_id 0 is reserved"));
        }
        if generation == 0 {
            return Err(Error::invalid("buffer identity: generation 0 is invalid"));
        }
        Ok(Identity { owner, buffer_id, generation })
    }

    /// The owner nonce.
    ///
    /// ```
    /// use simpler::memory::Identity;
    /// # let (a, b) = (simpler::__private::doc_buffer(8)?, simpler::__private::doc_buffer(8)?);
    /// // Two buffers of one Worker.
    /// assert_eq!(a.desc().identity().owner(), b.desc().identity().owner());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn owner(&self) -> u64 {
        self.owner
    }

    /// The per-owner buffer number (never 0).
    ///
    /// ```
    /// use simpler::memory::Identity;
    /// # let (a, b) = (simpler::__private::doc_buffer(8)?, simpler::__private::doc_buffer(8)?);
    /// // Two buffers of one Worker.
    /// assert_ne!(a.desc().identity().buffer_id(), b.desc().identity().buffer_id());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn buffer_id(&self) -> u64 {
        self.buffer_id
    }

    /// The generation (starts at 1).
    ///
    /// ```
    /// use simpler::memory::Identity;
    /// # let buffer = simpler::__private::doc_buffer(8)?;
    /// assert_eq!(buffer.desc().identity().generation(), 1);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn generation(&self) -> u32 {
        self.generation
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}:{}:{}", self.owner, self.buffer_id, self.generation)
    }
}

/// Mints the identities of one owner: its nonce and a counter (buffer ids from 1). Each level
/// that makes buffers owns one (a Worker for its host and device buffers and its engine's
/// `orch.alloc` intermediates; a chip for its own).
#[derive(Debug)]
pub(crate) struct IdentityMinter {
    owner: u64,
    next: std::sync::atomic::AtomicU64,
}

impl IdentityMinter {
    /// A minter for owner nonce `owner`.
    pub(crate) fn new(owner: u64) -> IdentityMinter {
        IdentityMinter { owner, next: std::sync::atomic::AtomicU64::new(1) }
    }

    /// The owner nonce of every identity it mints.
    pub(crate) fn owner(&self) -> u64 {
        self.owner
    }

    /// A fresh identity (generation 1).
    pub(crate) fn mint(&self) -> Result<Identity> {
        Identity::new(self.owner, self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed), 1)
    }
}

/// The access a buffer (or a view of it handed to a task) grants.
///
/// ```
/// use simpler::memory::Access;
/// assert!(Access::ReadWrite.allows(Access::Read));
/// assert!(!Access::Read.allows(Access::Write));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Access {
    /// Read only.
    Read = 0,
    /// Write only.
    Write = 1,
    /// Read and write.
    ReadWrite = 2,
}

impl Access {
    /// True when holding `self` permits an access of kind `needed`: `ReadWrite` permits
    /// everything, `Read` and `Write` only themselves.
    ///
    /// ```
    /// use simpler::memory::Access;
    /// assert!(Access::ReadWrite.allows(Access::Write));
    /// assert!(Access::Write.allows(Access::Write));
    /// assert!(!Access::Write.allows(Access::Read));
    /// assert!(!Access::Read.allows(Access::ReadWrite));
    /// ```
    pub fn allows(self, needed: Access) -> bool {
        self == Access::ReadWrite || self == needed
    }

    /// True when this access may write.
    ///
    /// ```
    /// use simpler::memory::Access;
    /// assert!(Access::Write.can_write() && Access::ReadWrite.can_write());
    /// assert!(!Access::Read.can_write());
    /// ```
    pub fn can_write(self) -> bool {
        self != Access::Read
    }

    /// The access an orchestration function has to a tensor it received with `self`: an output
    /// belongs to the orchestration for its whole run, so its own tasks may read back what an
    /// earlier one wrote (as with any intermediate). Nothing is copied in for it: the tag stays
    /// `Output`.
    pub(crate) fn within_orchestration(self) -> Access {
        if self == Access::Write { Access::ReadWrite } else { self }
    }

    /// True when this access may read.
    ///
    /// ```
    /// use simpler::memory::Access;
    /// assert!(Access::Read.can_read() && Access::ReadWrite.can_read());
    /// assert!(!Access::Write.can_read());
    /// ```
    pub fn can_read(self) -> bool {
        self != Access::Write
    }

    /// Parses a wire value (the discriminant: 0 = read, 1 = write, 2 = read-write).
    ///
    /// # Errors
    ///
    /// Values above 2 are an [`ErrorKind::Decode`](crate::ErrorKind::Decode) error.
    ///
    /// ```
    /// use simpler::{memory::Access, ErrorKind};
    /// assert_eq!(Access::from_u8(2).unwrap(), Access::ReadWrite);
    /// assert_eq!(Access::from_u8(Access::Write as u8).unwrap(), Access::Write);
    /// assert_eq!(Access::from_u8(3).unwrap_err().kind(), ErrorKind::Decode);
    /// ```
    pub fn from_u8(v: u8) -> Result<Access> {
        match v {
            0 => Ok(Access::Read),
            1 => Ok(Access::Write),
            2 => Ok(Access::ReadWrite),
            _ => Err(Error::decode(format!("unknown access {v} (known: 0..=2)"))),
        }
    }
}

/// Where a buffer's bytes live.
///
/// ```
/// # use simpler::__private::Backing;
/// let host = Backing::Memfd { pid: 4242, fd: 7, ino: 1234 };
/// let slab = Backing::HeapSlab { addr: 0x7f00_0000_0000, ino: 77 };
/// assert_ne!(host.kind_u8(), slab.kind_u8());
/// if let Backing::Memfd { pid, fd, .. } = host {
///     assert_eq!((pid, fd), (4242, 7)); // /proc/4242/fd/7
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backing {
    /// A slab carved from a heap ring, a `MAP_SHARED` memfd mapping made before any child
    /// started. `addr` is the slab's address in the process that created the ring; a child maps
    /// the ring wherever its kernel puts it and translates. `ino` says which ring: the
    /// addresses of different processes' rings may coincide, their inodes do not.
    HeapSlab {
        /// Base virtual address of the slab in the ring's creator.
        addr: u64,
        /// The inode number of the ring's memfd (non-zero).
        ino: u64,
    },
    /// An anonymous memfd object held by the process that created it, mapped once per identity
    /// by each process that uses it through `/proc/<pid>/fd/<fd>` (or a live thread's
    /// `/proc/<pid>/task/<tid>/fd/<fd>` once the main thread of `pid` has exited); the opener
    /// checks that the object there has inode `ino` and the buffer's memfd name, so a
    /// descriptor number reused for another object is refused, never mapped.
    Memfd {
        /// The creating process (1..=`i32::MAX`).
        pid: u32,
        /// The creator's descriptor of the object (0..=`i32::MAX`).
        fd: u32,
        /// The object's inode number (non-zero).
        ino: u64,
    },
    /// Device memory owned by one chip: only tasks on that chip may name it.
    Device {
        /// Offset of the allocation in the chip's device memory (not a host address).
        ptr: u64,
        /// The worker id of the owning chip.
        chip: u32,
    },
}

impl Backing {
    /// The wire number of this backend kind: 0 for [`Backing::HeapSlab`], 2 for
    /// [`Backing::Memfd`], 4 for [`Backing::Device`] (1 was the named POSIX shm objects of
    /// earlier versions).
    ///
    /// ```
    /// # use simpler::__private::Backing;
    /// assert_eq!(Backing::HeapSlab { addr: 0x1000, ino: 5 }.kind_u8(), 0);
    /// assert_eq!(Backing::Memfd { pid: 1, fd: 3, ino: 9 }.kind_u8(), 2);
    /// ```
    pub fn kind_u8(&self) -> u8 {
        match self {
            Backing::HeapSlab { .. } => 0,
            Backing::Memfd { .. } => 2,
            Backing::Device { .. } => 4,
        }
    }
}

/// The address-free description of a buffer that travels with every tensor: its identity, the
/// access it grants and its size (where the bytes live is internal).
///
/// ```
/// use simpler::{memory::Access, memory::BufferDesc, memory::Identity};
/// # use simpler::__private::Backing;
/// # let buf = simpler::__private::doc_buffer(4096).unwrap();
/// # let desc = *buf.desc();
/// // `desc`: the descriptor of a 4096-byte buffer (`buffer.desc()`).
/// assert_eq!(desc.nbytes(), 4096);
/// ```
///
/// Only the library makes descriptors, from the buffers it creates, so no descriptor can name a
/// buffer's bytes under a second identity:
///
/// ```compile_fail
/// # use simpler::{memory::Access, memory::BufferDesc};
/// # let desc: BufferDesc = todo!();
/// let alias = BufferDesc::new(desc.identity(), desc.backing(), Access::ReadWrite, 64); // error: private
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferDesc {
    identity: Identity,
    backing: Backing,
    access: Access,
    nbytes: u64,
}

impl BufferDesc {
    /// Builds a descriptor, validating the backing (a [`Backing::HeapSlab`] at address 0 or of
    /// inode 0, or a
    /// [`Backing::Memfd`] with a pid of 0 or above `i32::MAX`, a descriptor above `i32::MAX` or
    /// inode 0, is an [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error).
    /// Crate-private:
    /// descriptors come from buffers the library made, so none can describe a buffer's bytes
    /// under a second identity.
    pub(crate) fn new(
        identity: Identity,
        backing: Backing,
        access: Access,
        nbytes: u64,
    ) -> Result<BufferDesc> {
        if let Backing::HeapSlab { addr, ino } = backing
            && (addr == 0 || ino == 0)
        {
            return Err(Error::invalid(format!(
                "heap slab buffer: base address {addr:#x} or ring inode {ino} is 0"
            )));
        }
        if let Backing::Memfd { pid, fd, ino } = backing {
            let max = i32::MAX as u32;
            if pid == 0 || pid > max || fd > max || ino == 0 {
                return Err(Error::invalid(format!(
                    "memfd host buffer: pid {pid} (1..={max}), descriptor {fd} (0..={max}) or inode {ino} (non-zero) out of range"
                )));
            }
        }
        Ok(BufferDesc { identity, backing, access, nbytes })
    }

    /// The canonical identity.
    ///
    /// ```
    /// # use simpler::{memory::Access, memory::BufferDesc, memory::Identity};
    /// # use simpler::__private::Backing;
    /// # let buf = simpler::__private::doc_buffer(4096).unwrap();
    /// # let desc = *buf.desc();
    /// assert_eq!(desc.identity(), buf.desc().identity());
    /// ```
    pub fn identity(&self) -> Identity {
        self.identity
    }

    /// The backing.
    ///
    /// ```
    /// # use simpler::{memory::Access, memory::BufferDesc, memory::Identity};
    /// # use simpler::__private::Backing;
    /// # let buf = simpler::__private::doc_buffer(4096).unwrap();
    /// # let desc = *buf.desc();
    /// assert!(matches!(desc.backing(), Backing::Memfd { .. }));
    /// ```
    #[doc(hidden)]
    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// The chip whose device memory this is (`None` for host memory); read in place, without
    /// copying the backing (the submit path asks it of every tensor).
    pub(crate) fn device_chip(&self) -> Option<u32> {
        match &self.backing {
            Backing::Device { chip, .. } => Some(*chip),
            _ => None,
        }
    }

    /// The granted access.
    ///
    /// ```
    /// # use simpler::{memory::Access, memory::BufferDesc, memory::Identity};
    /// # use simpler::__private::Backing;
    /// # let buf = simpler::__private::doc_buffer(4096).unwrap();
    /// # let desc = *buf.desc();
    /// assert_eq!(desc.access(), Access::ReadWrite);
    /// ```
    pub fn access(&self) -> Access {
        self.access
    }

    /// Size in bytes.
    ///
    /// ```
    /// # use simpler::{memory::Access, memory::BufferDesc, memory::Identity};
    /// # use simpler::__private::Backing;
    /// # let buf = simpler::__private::doc_buffer(4096).unwrap();
    /// # let desc = *buf.desc();
    /// assert_eq!(desc.nbytes(), 4096);
    /// ```
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// A copy with the access narrowed to `access` (used when a view is handed to a task).
    pub(crate) fn with_access(mut self, access: Access) -> BufferDesc {
        self.access = access;
        self
    }
}

/// A host buffer in memory shared with the Worker's processes, owned by the caller.
///
/// Made by `Worker::create_buffer`. Clones share the backing; the last drop unmaps it and
/// closes it. Tensors made from it keep it alive while tasks use them.
///
/// A buffer belongs to the Worker that created it: only that Worker's runs (and the runs of the
/// Workers nested below it, which receive its tensors) may name it; a task of another Worker
/// naming it is refused at submit, and another Worker's `copy_to` / `copy_from` refuse it, with
/// an [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error that says so. Its
/// bytes are the caller's memory: `read` and `write` keep working after its Worker closed,
/// though no run can name it any more (a closed Worker refuses every run).
///
/// It has no name in `/dev/shm` or anywhere else: it is an anonymous memfd object that this
/// process holds and the Worker's processes map. Its memory goes back to the system when the
/// last clone drops (and the processes that mapped it notice, within a few tasks) or when the
/// program and its Worker's processes end, however they end: `SIGKILL`, `SIGTERM`, Ctrl-C,
/// `abort` and `std::process::exit` leave nothing behind. `/proc/<pid>/maps` shows it as
/// `/memfd:sp-<8 hex>-<pid>-b<N> (deleted)`. Each live buffer holds one file descriptor of this
/// process (the first buffer raises the soft limit to the hard one).
///
/// ```no_run
/// # fn main() -> simpler::Result<()> {
/// use simpler::{DataType, ErrorKind, HostArgs, HostFn, HostResult, TaskArgs, Worker};
/// fn noop(_: &HostArgs<'_>) -> HostResult {
///     Ok(())
/// }
/// let (mut a, mut b) = (Worker::builder().sub_workers(1).build()?, Worker::builder().sub_workers(1).build()?);
/// let h = b.register(HostFn::new("noop", noop))?;
/// a.init()?;
/// b.init()?;
/// let buf = a.create_buffer(16)?;
/// let t = buf.tensor(&[4], DataType::Float32)?;
/// let err = b
///     .run(|orch| {
///         let mut args = TaskArgs::new();
///         args.input(&t)?;
///         orch.submit_sub(&h, args).map(|_| ())
///     })
///     .unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::InvalidArgument); // `buf` is `a`'s
/// a.close()?;
/// buf.write(0, &[1.0f32; 4])?; // still the caller's memory
/// assert_eq!(buf.read::<f32>(0, 4)?, vec![1.0; 4]);
/// # Ok(()) }
/// ```
///
/// ```no_run
/// # fn main() -> simpler::Result<()> {
/// use simpler::{DataType, Worker};
/// let mut worker = Worker::builder().sub_workers(1).build()?;
/// worker.init()?;
/// let buf = worker.create_buffer(16)?;
/// buf.write(0, &[1.0f32, 2.0, 3.0, 4.0])?;
/// let t = buf.tensor(&[4], DataType::Float32)?;
/// assert_eq!(t.view().shape(), &[4]);
/// assert_eq!(buf.read::<f32>(0, 4)?, vec![1.0, 2.0, 3.0, 4.0]);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Buffer {
    inner: Arc<BufferInner>,
}

pub(crate) struct BufferInner {
    desc: BufferDesc,
    mem: Mem,
    /// What timelines and DOT exports call it ([`Buffer::set_name`]).
    name: std::sync::Mutex<Option<std::sync::Arc<str>>>,
    /// Submitted tasks that name the buffer and have not ended ([`BufferInner::hold`]).
    tasks: std::sync::atomic::AtomicU32,
    /// Host writes ([`Buffer::write`]) under way.
    writers: std::sync::atomic::AtomicU32,
}

impl BufferInner {
    /// A submitted task names the buffer, until [`release`](BufferInner::release): host
    /// writes are refused meanwhile, since the task's worker may hold slices of it. Waits for
    /// a host write under way to end (a bounded copy), so the task sees all of it or none.
    pub(crate) fn hold(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        // SeqCst, paired with `Buffer::write`: either the write sees this hold and is refused,
        // or this sees the write and waits for it.
        self.tasks.fetch_add(1, SeqCst);
        while self.writers.load(SeqCst) != 0 {
            std::thread::yield_now();
        }
    }

    /// How messages name the buffer: its name and identity, or the identity alone.
    pub(crate) fn label(&self) -> String {
        match self.name() {
            Some(name) => format!("`{name}` ({})", self.desc.identity()),
            None => self.desc.identity().to_string(),
        }
    }

    /// The task that [`hold`](BufferInner::hold) counted has ended.
    pub(crate) fn release(&self) {
        self.tasks.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// The buffer's name, if it was given one.
    pub(crate) fn name(&self) -> Option<std::sync::Arc<str>> {
        self.name.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// Where an owned buffer's bytes are.
enum Mem {
    /// Host memory in a memfd object, held and mapped by this process.
    Shm(SharedMem),
    /// Device memory of one chip, reached only through the Worker (`copy_to` / `copy_from`).
    Device { freed: std::sync::atomic::AtomicBool },
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer").field("desc", &self.inner.desc).finish()
    }
}

impl Buffer {
    /// A host buffer of `nbytes` under `identity`: a fresh memfd object named
    /// [`host_label`] of the identity and this process.
    pub(crate) fn create_host(identity: Identity, nbytes: usize) -> Result<Buffer> {
        let shm = SharedMem::create(&host_label(identity, std::process::id()), nbytes)?;
        let SharedKey { pid, fd, ino } = shm.key();
        let desc =
            BufferDesc::new(identity, Backing::Memfd { pid, fd, ino }, Access::ReadWrite, shm.len() as u64)?;
        Ok(Buffer {
            inner: Arc::new(BufferInner {
                desc,
                mem: Mem::Shm(shm),
                name: Default::default(),
                tasks: Default::default(),
                writers: Default::default(),
            }),
        })
    }

    /// A buffer naming device memory of one chip (made by `Worker::alloc_child_tensor`).
    pub(crate) fn device(identity: Identity, chip: u32, ptr: u64, nbytes: u64) -> Result<Buffer> {
        let desc = BufferDesc::new(identity, Backing::Device { ptr, chip }, Access::ReadWrite, nbytes)?;
        let mem = Mem::Device { freed: std::sync::atomic::AtomicBool::new(false) };
        Ok(Buffer {
            inner: Arc::new(BufferInner {
                desc,
                mem,
                name: Default::default(),
                tasks: Default::default(),
                writers: Default::default(),
            }),
        })
    }

    /// Marks device memory freed; false when it already was (or is not device memory).
    pub(crate) fn mark_freed(&self) -> bool {
        match &self.inner.mem {
            Mem::Device { freed } => !freed.swap(true, std::sync::atomic::Ordering::AcqRel),
            Mem::Shm(_) => false,
        }
    }

    /// True for device memory that was freed.
    pub(crate) fn is_freed(&self) -> bool {
        matches!(&self.inner.mem, Mem::Device { freed } if freed.load(std::sync::atomic::Ordering::Acquire))
    }

    /// The shared memory of a host buffer; refused for device memory (the caller names itself
    /// in the error).
    fn shm(&self) -> Result<&SharedMem> {
        match &self.inner.mem {
            Mem::Shm(shm) => Ok(shm),
            Mem::Device { .. } => Err(Error::invalid(format!(
                "{} is device memory of a chip; use Worker::copy_to / Worker::copy_from",
                self.inner.desc.identity()
            ))),
        }
    }

    /// The descriptor: a fresh identity, a [`Backing::Memfd`] backing and
    /// [`Access::ReadWrite`].
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// # let mut worker = simpler::Worker::builder().sub_workers(1).build()?;
    /// # worker.init()?;
    /// use simpler::memory::Access;
    /// # use simpler::__private::Backing;
    /// let buf = worker.create_buffer(64)?;
    /// assert_eq!(buf.desc().access(), Access::ReadWrite);
    /// assert_eq!(buf.desc().nbytes(), 64);
    /// // Each buffer gets its own identity.
    /// assert_ne!(worker.create_buffer(64)?.desc().identity(), buf.desc().identity());
    /// # Ok(()) }
    /// ```
    pub fn desc(&self) -> &BufferDesc {
        &self.inner.desc
    }

    /// Size in bytes.
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// # let mut worker = simpler::Worker::builder().sub_workers(1).build()?;
    /// # worker.init()?;
    /// let buf = worker.create_buffer(4 * 16)?;
    /// assert_eq!(buf.nbytes(), 64);
    /// # Ok(()) }
    /// ```
    pub fn nbytes(&self) -> usize {
        self.inner.desc.nbytes() as usize
    }

    /// Names the buffer: captured runs' DAGs, timelines and DOT exports then call its tensors
    /// by this name instead of by buffer number. Every clone of the buffer, and every tensor on
    /// it, shares the name; naming it again renames it.
    ///
    /// # Errors
    ///
    /// An empty name, or one longer than 256 bytes, is an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error.
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// # let mut worker = simpler::Worker::builder().sub_workers(1).build()?;
    /// # worker.init()?;
    /// let weights = worker.create_buffer(1024)?;
    /// weights.set_name("weights")?;
    /// assert_eq!(weights.name().as_deref(), Some("weights"));
    /// assert!(weights.set_name("").is_err());
    /// # Ok(()) }
    /// ```
    pub fn set_name(&self, name: impl Into<String>) -> Result<()> {
        let name = name.into();
        if name.is_empty() || name.len() > 256 {
            return Err(Error::invalid(format!(
                "Buffer::set_name: a name of {} bytes (between 1 and 256, please)",
                name.len()
            )));
        }
        *self.inner.name.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(name.into());
        Ok(())
    }

    /// The buffer's name ([`set_name`](Buffer::set_name)), if it has one.
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// # let mut worker = simpler::Worker::builder().sub_workers(1).build()?;
    /// # worker.init()?;
    /// let b = worker.create_buffer(8)?;
    /// assert_eq!(b.name(), None);
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> Option<String> {
        self.inner.name().map(|n| n.to_string())
    }

    /// A contiguous row-major tensor starting at byte 0 of the buffer.
    ///
    /// # Errors
    ///
    /// An invalid shape (see [`TensorView::new`]) or a tensor larger than the buffer is an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error.
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// # let mut worker = simpler::Worker::builder().sub_workers(1).build()?;
    /// # worker.init()?;
    /// use simpler::DataType;
    /// let buf = worker.create_buffer(4 * 6)?;
    /// let t = buf.tensor(&[2, 3], DataType::Float32)?;
    /// assert_eq!(t.view().strides(), &[3, 1]);
    /// assert_eq!(t.desc(), buf.desc());
    /// assert!(buf.tensor(&[7], DataType::Float32).is_err()); // 28 bytes > 24
    /// # Ok(()) }
    /// ```
    pub fn tensor(&self, shape: &[u32], dtype: DataType) -> Result<Tensor> {
        self.view(TensorView::new(0, shape, None, dtype)?)
    }

    /// A tensor with an explicit view (byte offset, shape, element strides).
    ///
    /// # Errors
    ///
    /// A view reaching past the end of the buffer is an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error.
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// # let mut worker = simpler::Worker::builder().sub_workers(1).build()?;
    /// # worker.init()?;
    /// use simpler::{DataType, memory::TensorView};
    /// let buf = worker.create_buffer(4 * 16)?; // a 4x4 f32 matrix
    /// // Column 1: four elements, one per row.
    /// let col = buf.view(TensorView::new(4, &[4], Some(&[4]), DataType::Float32)?)?;
    /// assert_eq!(col.view().byte_range(), (4, 4 + 13 * 4));
    /// assert!(buf.view(TensorView::new(60, &[2], None, DataType::Float32)?).is_err());
    /// # Ok(()) }
    /// ```
    pub fn view(&self, view: TensorView) -> Result<Tensor> {
        Tensor::with_keepalive(self.inner.desc, view, Some(self.inner.clone()))
    }

    /// Copies `values` into the buffer starting at element index `offset` (in units of `T`).
    ///
    /// # Errors
    ///
    /// A range reaching past the end of the buffer is an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error; nothing is
    /// written then. While a submitted task that names the buffer (through any tensor of it,
    /// except an untracked `NoDep` one) has not ended, the write is refused with an
    /// [`ErrorKind::InvalidState`](crate::ErrorKind::InvalidState) error naming the buffer:
    /// the task's worker may hold slices of it, which must not change under it. Wait for the
    /// task's run, then write. (Reading is always allowed: it copies whatever the bytes are.)
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// # let mut worker = simpler::Worker::builder().sub_workers(1).build()?;
    /// # worker.init()?;
    /// let buf = worker.create_buffer(4 * 4)?;
    /// buf.write(2, &[7u32, 8])?; // elements 2 and 3
    /// assert_eq!(buf.read::<u32>(0, 4)?, vec![0, 0, 7, 8]);
    /// assert!(buf.write(3, &[1u32, 2]).is_err()); // would end at element 5
    /// # Ok(()) }
    /// ```
    pub fn write<T: Element>(&self, offset: usize, values: &[T]) -> Result<()> {
        let start = offset.checked_mul(size_of::<T>()).ok_or_else(|| Error::invalid("offset overflows"))?;
        let shm = self.shm().map_err(|e| e.context("Buffer.write"))?;
        let _writing = self.host_write().map_err(|e| e.context("Buffer.write"))?;
        shm.write_bytes(start, as_bytes(values))
    }

    /// Admits a write of the buffer's bytes from this process for as long as the guard lives:
    /// refused while a submitted task names the buffer, or in a process other than the
    /// buffer's creator, where those tasks are not counted (the caller names itself in the
    /// error). Paired with `BufferInner::hold` (SeqCst both sides): a submit meanwhile waits
    /// for the guard to go.
    pub(crate) fn host_write(&self) -> Result<impl Drop + '_> {
        use std::sync::atomic::Ordering::SeqCst;
        let inner = &*self.inner;
        if let Backing::Memfd { pid, .. } = inner.desc.backing()
            && pid != std::process::id()
        {
            return Err(Error::state(format!(
                "buffer {} belongs to process {pid}, and this is process {}: a worker process receives buffers as task tensors, and writes them through those",
                inner.label(),
                std::process::id()
            )));
        }
        struct Writing<'a>(&'a std::sync::atomic::AtomicU32);
        impl Drop for Writing<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, SeqCst);
            }
        }
        inner.writers.fetch_add(1, SeqCst);
        let writing = Writing(&inner.writers);
        match inner.tasks.load(SeqCst) {
            0 => Ok(writing),
            n => Err(Error::state(format!(
                "buffer {} is named by {n} submitted task(s) that have not ended; their workers may be reading or writing it now, so wait for their run before writing",
                inner.label()
            ))),
        }
    }

    /// Reads `len` elements of `T` starting at element index `offset`.
    ///
    /// # Errors
    ///
    /// A range reaching past the end of the buffer is an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error.
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// # let mut worker = simpler::Worker::builder().sub_workers(1).build()?;
    /// # worker.init()?;
    /// let buf = worker.create_buffer(8)?;
    /// buf.write(0, &[1u8, 2, 3, 4, 5, 6, 7, 8])?;
    /// assert_eq!(buf.read::<u8>(6, 2)?, vec![7, 8]);
    /// assert_eq!(buf.read::<u32>(1, 1)?, vec![u32::from_ne_bytes([5, 6, 7, 8])]);
    /// assert!(buf.read::<u64>(1, 1).is_err());
    /// assert!(buf.read::<u8>(0, usize::MAX).is_err()); // checked before anything is allocated
    /// # Ok(()) }
    /// ```
    pub fn read<T: Element>(&self, offset: usize, len: usize) -> Result<Vec<T>> {
        let start = offset.checked_mul(size_of::<T>()).ok_or_else(|| Error::invalid("offset overflows"))?;
        // The range is checked before anything is allocated for it.
        let in_bounds = len
            .checked_mul(size_of::<T>())
            .and_then(|n| start.checked_add(n))
            .is_some_and(|end| end as u64 <= self.desc().nbytes());
        if !in_bounds {
            return Err(Error::invalid(format!(
                "Buffer.read of {len} elements of {} at element {offset} reaches past the end of the {}-byte buffer",
                T::DTYPE,
                self.desc().nbytes()
            )));
        }
        let mut out = vec![T::ZERO; len];
        self.shm().map_err(|e| e.context("Buffer.read"))?.read_bytes(start, as_bytes_mut(&mut out))?;
        Ok(out)
    }

    /// Fills `count` bytes at byte `offset` straight from a socket (a remote node's tensors
    /// arrive this way, without an intermediate copy). Host buffers only.
    pub(crate) fn read_from_fd(
        &self,
        offset: usize,
        count: usize,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> std::io::Result<()> {
        self.shm()
            .map_err(|e| e.context("Buffer.read_from_fd"))
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?
            .read_from_fd(offset, count, fd)
    }

    /// Sends `count` bytes at byte `offset` straight to a socket. Host buffers only.
    pub(crate) fn send_to_fd(
        &self,
        offset: usize,
        count: usize,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> std::io::Result<()> {
        self.shm()
            .map_err(|e| e.context("Buffer.send_to_fd"))
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?
            .send_to_fd(offset, count, fd)
    }
}

/// The memfd name of the host buffer `identity` made by process `pid` (rule N5 of `sys::shm`):
/// what a process mapping it checks.
pub(crate) fn host_label(identity: Identity, pid: u32) -> String {
    buffer_label(identity.owner(), pid, identity.buffer_id())
}
