//! The default backend: a chip simulated on the CPU ([`SimChip`]), and its [`DeviceMemory`].
//!
//! What a native kernel touches is [`DeviceMemory`], which only this crate can make: a
//! simulated backend hands out one it owns (a [`SimChip`]'s) through
//! [`ChipBackend::host_memory`], and the runtime checks every pointer a backend returns against
//! the blocks it holds, so no backend written in safe code can make two kernels see one byte as
//! two buffers. A `SimChip` runs a launch on the calling thread (the chip's core thread),
//! holding its memory's kernel gate (rules A3, A6 of `chip::arena`).

use std::sync::Arc;

use crate::chip::arena::Arena;
use crate::chip::backend::{ChipBackend, Completion, KernelDef, KernelLaunch, check_cores};
use crate::error::{Error, ErrorKind, Result};

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

    /// Its device memory (what [`ChipBackend::host_memory`] returns).
    ///
    /// ```
    /// use simpler::chip::SimChip;
    /// let chip = SimChip::new(1 << 20, 1)?;
    /// assert_eq!(chip.memory().size(), 1 << 20);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn memory(&self) -> &DeviceMemory {
        &self.memory
    }
}

impl ChipBackend for SimChip {
    fn cores(&self) -> usize {
        self.cores
    }

    fn load_kernel(&self, kernel: &KernelDef<'_>) -> Result<()> {
        kernel.require_native("a SimChip")
    }

    fn host_memory(&self) -> Option<&DeviceMemory> {
        Some(&self.memory)
    }
}

/// Runs a launch of a native kernel on the calling thread, on `memory`: takes the kernel gate,
/// then makes the views (rules A3, A6 of `chip::arena`), calls the kernel and catches its panic.
/// A kernel without a native body is refused, naming it.
pub(crate) fn run_native(memory: &DeviceMemory, launch: KernelLaunch<'_>) -> Result<Completion> {
    let Some(f) = launch.kernel.native else {
        return Err(launch.kernel.no_native("a SimChip"));
    };
    let arena = memory.arena();
    // The gate before the views (rule A6 of `chip::arena`).
    let _running = arena.kernel_gate();
    let tensors = launch
        .tensors
        .iter()
        .map(|t| arena.tensor(t.ptr(), *t.view(), t.access()))
        .collect::<Result<Vec<_>>>()?;
    crate::chip::runtime::call_kernel(f, tensors, launch.scalars, launch.core)
        .map_err(|msg| Error::new(ErrorKind::TaskFailed, msg))?;
    Ok(Completion::Done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chip::backend::MAX_CORES;

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
        let mem = chip.host_memory().expect("a SimChip's memory is in this process");
        assert!(mem.is_live(p, 1000));
        chip.free(p).unwrap();
        assert!(!mem.is_live(p, 1));
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
