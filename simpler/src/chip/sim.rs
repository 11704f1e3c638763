//! The chip backend seam and the default backend, a chip simulated on the CPU.
//!
//! A chip runtime reaches its device only through [`ChipBackend`]: allocation, frees and both
//! directions of copies are trait calls, and the cores it runs kernels on are the backend's
//! count. What a kernel touches is [`DeviceMemory`], which only this crate can make: a backend
//! hands out one it owns (usually a [`SimChip`]'s), and the runtime checks every pointer a
//! backend returns against it, so no backend written in safe code can make two kernels see one
//! byte as two buffers.
//!
//! [`ChipBackend`] requires `cores` and `memory` and provides `malloc`, `free`,
//! `copy_to_device` and `copy_from_device`, which a backend may override. [`DeviceMemory`]
//! wraps the crate's arena; [`SimChip`] is the default backend; a [`ChipSpec`] (id, memory,
//! cores) is what a [`ChipBackendFn`] receives, in the process that drives the chip.

use std::sync::Arc;

use crate::chip::arena::Arena;
use crate::error::{Error, Result};

/// The most simulated cores one chip may have.
pub(crate) const MAX_CORES: usize = 1024;

/// Device memory that kernels read and write: a lazily backed mapping of this process with a
/// first-fit allocator (64-byte aligned blocks, frees coalesce). Cloning shares it.
///
/// Device pointers are offsets into it (`0..size()`), never host addresses. Only the crate
/// makes one ([`DeviceMemory::new`] maps fresh memory), so a backend can hand kernels no other
/// memory than this.
///
/// ```
/// use simpler::chip::DeviceMemory;
///
/// let mem = DeviceMemory::new(1 << 20)?;
/// let p = mem.malloc(5)?;
/// mem.copy_to(p, b"hello")?;
/// let mut back = [0u8; 5];
/// mem.copy_from(p, &mut back)?;
/// assert_eq!(&back, b"hello");
/// assert!(mem.is_live(p, 5) && !mem.is_live(p, 6));
/// mem.free(p)?;
/// assert_eq!(mem.used(), 0);
/// # Ok::<(), simpler::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct DeviceMemory {
    arena: Arc<Arena>,
}

impl DeviceMemory {
    /// Maps `bytes` of device memory (backed on first touch, so a large size is cheap).
    ///
    /// # Errors
    ///
    /// Zero bytes is an [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)
    /// error; a size the kernel refuses to map is an [`ErrorKind::Os`](crate::ErrorKind::Os)
    /// error.
    ///
    /// ```
    /// use simpler::chip::DeviceMemory;
    /// assert_eq!(DeviceMemory::new(4096)?.size(), 4096);
    /// assert!(DeviceMemory::new(0).is_err());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn new(bytes: u64) -> Result<DeviceMemory> {
        Ok(DeviceMemory { arena: Arc::new(Arena::new(bytes)?) })
    }

    /// Its size in bytes.
    ///
    /// ```
    /// assert_eq!(simpler::chip::DeviceMemory::new(8192)?.size(), 8192);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn size(&self) -> u64 {
        self.arena.size()
    }

    /// Bytes in live allocations (rounded up to their 64-byte blocks).
    ///
    /// ```
    /// let mem = simpler::chip::DeviceMemory::new(8192)?;
    /// let p = mem.malloc(10)?;
    /// assert_eq!(mem.used(), 64);
    /// mem.free(p)?;
    /// assert_eq!(mem.used(), 0);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn used(&self) -> u64 {
        self.arena.used()
    }

    /// Allocates `nbytes` and returns the device pointer (64-byte aligned; not cleared).
    ///
    /// # Errors
    ///
    /// `nbytes == 0`, or more than [`size`](Self::size), is an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error; when no free
    /// block is large enough it is an
    /// [`ErrorKind::InvalidState`](crate::ErrorKind::InvalidState) error (a free may make
    /// room). Both messages say "out of device memory" (except for 0 bytes) and name the
    /// request and the memory size.
    ///
    /// ```
    /// use simpler::{chip::DeviceMemory, ErrorKind};
    /// let mem = DeviceMemory::new(4096)?;
    /// let (a, b) = (mem.malloc(100)?, mem.malloc(100)?);
    /// assert_eq!((a % 64, b % 64), (0, 0));
    /// let err = mem.malloc(8192).unwrap_err();
    /// assert!(err.message().contains("8192") && err.message().contains("4096"));
    /// assert_eq!(mem.malloc(4000).unwrap_err().kind(), ErrorKind::InvalidState);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn malloc(&self, nbytes: u64) -> Result<u64> {
        self.arena.malloc(nbytes)
    }

    /// Frees an allocation made by [`malloc`](Self::malloc); `ptr` must be its start.
    ///
    /// # Errors
    ///
    /// An unknown pointer, a pointer into the middle of an allocation, or a double free is an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error that says which.
    ///
    /// ```
    /// let mem = simpler::chip::DeviceMemory::new(4096)?;
    /// let p = mem.malloc(256)?;
    /// mem.free(p)?;
    /// assert!(mem.free(p).unwrap_err().message().contains("double free"));
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn free(&self, ptr: u64) -> Result<()> {
        self.arena.free(ptr)
    }

    /// Copies `src` into the memory at `dst`; the range must lie inside one live allocation.
    ///
    /// # Errors
    ///
    /// A range outside every live allocation is an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error naming it.
    ///
    /// ```
    /// let mem = simpler::chip::DeviceMemory::new(4096)?;
    /// let p = mem.malloc(8)?;
    /// mem.copy_to(p, &[1, 2, 3, 4, 5, 6, 7, 8])?;
    /// assert!(mem.copy_to(p + 4, &[0; 8]).is_err()); // runs past the allocation
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn copy_to(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.arena.copy_to(dst, src)
    }

    /// Copies the memory at `src` into `dst`; the range must lie inside one live allocation.
    ///
    /// # Errors
    ///
    /// As [`copy_to`](Self::copy_to).
    ///
    /// ```
    /// let mem = simpler::chip::DeviceMemory::new(4096)?;
    /// let p = mem.malloc(4)?;
    /// mem.copy_to(p, &[9, 8, 7, 6])?;
    /// let mut two = [0u8; 2];
    /// mem.copy_from(p + 2, &mut two)?; // any range inside the allocation
    /// assert_eq!(two, [7, 6]);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn copy_from(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.arena.copy_from(src, dst)
    }

    /// True when `ptr..ptr + len` lies inside one live allocation (as requested, not counting
    /// alignment padding).
    ///
    /// ```
    /// let mem = simpler::chip::DeviceMemory::new(4096)?;
    /// let p = mem.malloc(100)?;
    /// assert!(mem.is_live(p, 100) && mem.is_live(p + 10, 90));
    /// assert!(!mem.is_live(p, 101));
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn is_live(&self, ptr: u64, len: u64) -> bool {
        self.arena.is_live(ptr, len)
    }

    /// The arena itself, for the runtime's kernel views and strided copies.
    pub(crate) fn arena(&self) -> &Arc<Arena> {
        &self.arena
    }
}

/// The device side of an L2 chip: its memory, its cores, and how bytes move to and from it.
///
/// A chip runtime reaches its device only through this trait. [`SimChip`] is the default
/// implementation; give a Worker another with
/// [`WorkerBuilder::chip_backend`](crate::WorkerBuilder::chip_backend) (for example one that
/// wraps a `SimChip` to count or trace what the runtime does). Every method but
/// [`cores`](Self::cores) and [`memory`](Self::memory) has a default that works on
/// [`memory`](Self::memory).
///
/// Whatever a backend returns is checked: a `malloc` result must be a live block of
/// [`memory`](Self::memory) that overlaps no block the runtime already holds (else the runtime
/// refuses it with an [`ErrorKind::InvalidState`](crate::ErrorKind::InvalidState) error naming the block), so kernels
/// never see two buffers share a byte.
///
/// ```
/// use simpler::{chip::ChipBackend, chip::SimChip};
///
/// fn upload(chip: &dyn ChipBackend, bytes: &[u8]) -> simpler::Result<u64> {
///     let ptr = chip.malloc(bytes.len() as u64)?;
///     chip.copy_to_device(ptr, bytes)?;
///     Ok(ptr)
/// }
///
/// let chip = SimChip::new(1 << 20, 2)?;
/// let ptr = upload(&chip, b"hello")?;
/// let mut back = [0u8; 5];
/// chip.copy_from_device(ptr, &mut back)?;
/// assert_eq!(&back, b"hello");
/// chip.free(ptr)?;
/// # Ok::<(), simpler::Error>(())
/// ```
pub trait ChipBackend: Send + Sync + 'static {
    /// The number of cores kernels can run on (ids `0..cores()`), 1 to 1024.
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::SimChip};
    /// assert_eq!(SimChip::new(1 << 20, 4)?.cores(), 4);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn cores(&self) -> usize;

    /// The device memory kernels read and write. It must be the same memory at every call
    /// (the runtime keeps what the first call returns).
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::SimChip};
    /// assert_eq!(SimChip::new(64 << 20, 4)?.memory().size(), 64 << 20);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn memory(&self) -> &DeviceMemory;

    /// The size of the device memory in bytes.
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::SimChip};
    /// assert_eq!(SimChip::new(64 << 20, 4)?.memory_size(), 64 << 20);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn memory_size(&self) -> u64 {
        self.memory().size()
    }

    /// Allocates `nbytes` of device memory (see [`DeviceMemory::malloc`] for the errors).
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::SimChip};
    /// let chip = SimChip::new(4096, 1)?;
    /// let p = chip.malloc(100)?;
    /// assert!(chip.memory().is_live(p, 100));
    /// assert!(chip.malloc(8192).is_err());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn malloc(&self, nbytes: u64) -> Result<u64> {
        self.memory().malloc(nbytes)
    }

    /// Frees an allocation made by [`malloc`](Self::malloc) (see [`DeviceMemory::free`]).
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::SimChip};
    /// let chip = SimChip::new(4096, 1)?;
    /// let p = chip.malloc(256)?;
    /// chip.free(p)?;
    /// assert!(chip.free(p).unwrap_err().message().contains("double free"));
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn free(&self, ptr: u64) -> Result<()> {
        self.memory().free(ptr)
    }

    /// Copies `src` to device memory at `dst` (host to device; see [`DeviceMemory::copy_to`]).
    /// A strided host tensor arrives as one call per contiguous run of its elements.
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::SimChip};
    /// let chip = SimChip::new(4096, 1)?;
    /// let p = chip.malloc(8)?;
    /// chip.copy_to_device(p, &[1, 2, 3, 4, 5, 6, 7, 8])?;
    /// assert!(chip.copy_to_device(p + 4, &[0; 8]).is_err()); // runs past the allocation
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.memory().copy_to(dst, src)
    }

    /// Copies device memory at `src` into `dst` (device to host; see
    /// [`DeviceMemory::copy_from`]).
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::SimChip};
    /// let chip = SimChip::new(4096, 1)?;
    /// let p = chip.malloc(4)?;
    /// chip.copy_to_device(p, &[9, 8, 7, 6])?;
    /// let mut two = [0u8; 2];
    /// chip.copy_from_device(p + 2, &mut two)?;
    /// assert_eq!(two, [7, 6]);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn copy_from_device(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.memory().copy_from(src, dst)
    }
}

/// What a Worker asks a backend factory for: one chip's id, memory size and core count, from
/// the builder's `chip_memory` and `chip_cores`.
///
/// ```
/// use simpler::{chip::ChipBackend, chip::ChipSpec, chip::SimChip, Worker};
///
/// let worker = Worker::builder()
///     .chips(2)
///     .chip_backend(|spec: &ChipSpec| {
///         Ok(Box::new(SimChip::new(spec.memory_bytes(), spec.cores())?) as Box<dyn ChipBackend>)
///     })
///     .build()?;
/// # drop(worker);
/// # Ok::<(), simpler::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChipSpec {
    pub(crate) chip_id: u32,
    pub(crate) memory_bytes: u64,
    pub(crate) cores: usize,
}

impl ChipSpec {
    /// The chip's id among its Worker's chips (`chip(N)`); 0 at L2.
    ///
    /// ```
    /// # let spec = simpler::chip::ChipSpec::default_for(3);
    /// assert_eq!(spec.chip_id(), 3);
    /// ```
    pub fn chip_id(&self) -> u32 {
        self.chip_id
    }

    /// The device memory the builder asked for (`chip_memory`).
    ///
    /// ```
    /// # let spec = simpler::chip::ChipSpec::default_for(0);
    /// assert_eq!(spec.memory_bytes(), 1 << 30);
    /// ```
    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    /// The core count the builder asked for (`chip_cores`).
    ///
    /// ```
    /// # let spec = simpler::chip::ChipSpec::default_for(0);
    /// assert_eq!(spec.cores(), 4);
    /// ```
    pub fn cores(&self) -> usize {
        self.cores
    }

    /// The spec of chip `chip_id` under the builder's defaults (1 GiB, 4 cores), for tests of a
    /// factory.
    ///
    /// ```
    /// let spec = simpler::chip::ChipSpec::default_for(1);
    /// assert_eq!((spec.chip_id(), spec.memory_bytes(), spec.cores()), (1, 1 << 30, 4));
    /// ```
    pub fn default_for(chip_id: u32) -> ChipSpec {
        ChipSpec { chip_id, memory_bytes: 1 << 30, cores: 4 }
    }
}

/// A function that makes the backend of one chip from its [`ChipSpec`]; what
/// [`WorkerBuilder::chip_backend`](crate::WorkerBuilder::chip_backend) takes.
///
/// A plain `fn` (or a closure that captures nothing): it runs in the process that drives the
/// chip, which at L3 is a process of its own started from this program's binary, so it cannot
/// carry state from the caller.
///
/// ```
/// use simpler::{chip::ChipBackend, chip::ChipBackendFn, chip::ChipSpec, chip::SimChip};
///
/// fn small(spec: &ChipSpec) -> simpler::Result<Box<dyn ChipBackend>> {
///     Ok(Box::new(SimChip::new(spec.memory_bytes().min(1 << 20), 1)?))
/// }
/// let f: ChipBackendFn = small;
/// assert_eq!(f(&ChipSpec::default_for(0))?.cores(), 1);
/// # Ok::<(), simpler::Error>(())
/// ```
pub type ChipBackendFn = fn(&ChipSpec) -> Result<Box<dyn ChipBackend>>;

// SAFETY: rule FA1 of `sys::fn_address` — a plain `fn` pointer type.
#[expect(unsafe_code, reason = "marks a fn pointer type as one whose address may cross to a child")]
unsafe impl crate::sys::fn_address::FnPointer for ChipBackendFn {}

/// Makes the backend of each chip, in the process that drives it (a chip child at L3, the
/// calling process at L2): see [`WorkerBuilder::chip_backend`](crate::WorkerBuilder::chip_backend).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) enum BackendFactory {
    /// The default: a [`SimChip`] per spec.
    #[default]
    Sim,
    /// A user's function.
    Fn(ChipBackendFn),
}

impl BackendFactory {
    /// The default: a [`SimChip`] per spec.
    pub(crate) fn sim() -> Self {
        BackendFactory::Sim
    }

    /// The factory a start spec carries as `word` (`0` for the default): a child started by
    /// exec rebuilds its parent's factory with it; `None` for a word that names address 0.
    ///
    /// The word must be [`wire`](Self::wire) of a factory of the parent that started this
    /// process (rule FA2 of `sys::fn_address`): the worker layer's start-spec decoder is the one
    /// caller, on a spec its parent wrote.
    pub(crate) fn from_start_spec(word: u64) -> Option<BackendFactory> {
        if word == 0 {
            return Some(BackendFactory::Sim);
        }
        #[expect(unsafe_code, reason = "reading back a factory's address from a start spec; rule FA2")]
        // SAFETY: rule FA2 of `sys::fn_address` — the word is `FnAddress::<ChipBackendFn>::to_wire`
        // written by the parent that started this process, which runs the same binary.
        let f = unsafe { crate::sys::fn_address::FnAddress::<ChipBackendFn>::from_wire(word) }?;
        Some(BackendFactory::Fn(f.get()))
    }

    /// The word a start spec carries for this factory (`0` for the default).
    pub(crate) fn wire(&self) -> u64 {
        match self {
            BackendFactory::Sim => 0,
            BackendFactory::Fn(f) => crate::sys::fn_address::FnAddress::of(*f).to_wire(),
        }
    }

    /// Makes the backend of the chip `spec` describes.
    pub(crate) fn make(&self, spec: &ChipSpec) -> Result<Box<dyn ChipBackend>> {
        match self {
            BackendFactory::Sim => Ok(Box::new(SimChip::new(spec.memory_bytes, spec.cores)?)),
            BackendFactory::Fn(f) => f(spec),
        }
    }
}

/// A chip simulated on the CPU: its [`DeviceMemory`] is a lazily backed anonymous mapping of
/// this process, and each core is a thread of the process that runs it.
///
/// Only touched pages use memory, so a large `memory_bytes` is cheap.
///
/// ```
/// use simpler::{chip::ChipBackend, chip::SimChip};
///
/// let chip = SimChip::new(1 << 30, 4)?; // 1 GiB, backed on first touch
/// let weights = chip.malloc(4 * 1024)?;
/// let values: Vec<u8> = (0..=255).cycle().take(4096).collect();
/// chip.copy_to_device(weights, &values)?;
/// let mut back = vec![0u8; 4096];
/// chip.copy_from_device(weights, &mut back)?;
/// assert_eq!(back, values);
/// # Ok::<(), simpler::Error>(())
/// ```
#[derive(Debug)]
pub struct SimChip {
    memory: DeviceMemory,
    cores: usize,
}

impl SimChip {
    /// A simulated chip with `memory_bytes` of device memory and `cores` cores.
    ///
    /// # Errors
    ///
    /// Zero memory, zero cores or more than 1024 cores is an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error; a memory size
    /// the kernel refuses to map is an [`ErrorKind::Os`](crate::ErrorKind::Os) error.
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::SimChip};
    /// let chip = SimChip::new(64 << 20, 8)?;
    /// assert_eq!((chip.memory_size(), chip.cores()), (64 << 20, 8));
    /// assert!(SimChip::new(0, 1).is_err());
    /// assert!(SimChip::new(4096, 0).is_err());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn new(memory_bytes: u64, cores: usize) -> Result<SimChip> {
        check_cores(cores)?;
        Ok(SimChip { memory: DeviceMemory::new(memory_bytes)?, cores })
    }
}

/// Refuses a core count outside `1..=MAX_CORES`.
pub(crate) fn check_cores(cores: usize) -> Result<()> {
    if cores == 0 || cores > MAX_CORES {
        return Err(Error::invalid(format!("a chip needs 1..={MAX_CORES} cores, got {cores}")));
    }
    Ok(())
}

impl ChipBackend for SimChip {
    fn cores(&self) -> usize {
        self.cores
    }

    fn memory(&self) -> &DeviceMemory {
        &self.memory
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn sim_chip_through_the_trait_object() {
        let chip: Box<dyn ChipBackend> = Box::new(SimChip::new(1 << 16, 3).unwrap());
        assert_eq!((chip.memory_size(), chip.cores()), (1 << 16, 3));
        let p = chip.malloc(1000).unwrap();
        let data: Vec<u8> = (0..1000).map(|i| (i % 251) as u8).collect();
        chip.copy_to_device(p, &data).unwrap();
        let mut back = vec![0; 1000];
        chip.copy_from_device(p, &mut back).unwrap();
        assert_eq!(back, data);
        assert!(chip.memory().is_live(p, 1000));
        chip.free(p).unwrap();
        assert!(!chip.memory().is_live(p, 1));
        assert_eq!(chip.copy_from_device(p, &mut back).unwrap_err().kind(), ErrorKind::InvalidArgument);
    }

    #[test]
    fn construction_limits() {
        assert!(SimChip::new(1, 1).is_ok());
        let err = SimChip::new(4096, MAX_CORES + 1).unwrap_err();
        assert!(err.message().contains("cores"), "{err}");
        assert!(SimChip::new(u64::MAX, 1).is_err());
    }

    #[test]
    fn large_lazy_memory_is_cheap() {
        // 8 GiB of address space, touched at both ends only.
        let chip = SimChip::new(8 << 30, 1).unwrap();
        let a = chip.malloc(4096).unwrap();
        let b = chip.malloc((8 << 30) - 8192).unwrap();
        chip.copy_to_device(a, &[1; 4096]).unwrap();
        chip.copy_to_device(b + (8 << 30) - 8192 - 1, &[2]).unwrap();
        let mut one = [0u8];
        chip.copy_from_device(b + (8 << 30) - 8192 - 1, &mut one).unwrap();
        assert_eq!(one, [2]);
    }
}
