//! The chip backend trait and the default backend, a chip simulated on the CPU.

use std::sync::Arc;

use crate::chip::arena::Arena;
use crate::error::{Error, Result};

/// The most simulated cores one chip may have.
pub(crate) const MAX_CORES: usize = 1024;

/// The device side of an L2 chip: its memory and its cores.
///
/// Device pointers are offsets into the chip's own memory (`0..memory_size()`), never host
/// addresses. [`SimChip`] is the default implementation; the trait leaves room for real
/// accelerator backends.
///
/// ```
/// use simpler::{ChipBackend, SimChip};
///
/// fn upload(chip: &mut dyn ChipBackend, bytes: &[u8]) -> simpler::Result<u64> {
///     let ptr = chip.malloc(bytes.len() as u64)?;
///     chip.copy_to_device(ptr, bytes)?;
///     Ok(ptr)
/// }
///
/// let mut chip = SimChip::new(1 << 20, 2)?;
/// let ptr = upload(&mut chip, b"hello")?;
/// let mut back = [0u8; 5];
/// chip.copy_from_device(ptr, &mut back)?;
/// assert_eq!(&back, b"hello");
/// chip.free(ptr)?;
/// # Ok::<(), simpler::Error>(())
/// ```
pub trait ChipBackend: Send {
    /// The size of the chip's device memory in bytes.
    ///
    /// ```
    /// use simpler::{ChipBackend, SimChip};
    /// assert_eq!(SimChip::new(64 << 20, 4)?.memory_size(), 64 << 20);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn memory_size(&self) -> u64;

    /// The number of cores kernels can run on (ids `0..cores()`).
    ///
    /// ```
    /// use simpler::{ChipBackend, SimChip};
    /// assert_eq!(SimChip::new(1 << 20, 4)?.cores(), 4);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn cores(&self) -> usize;

    /// Allocates `nbytes` of device memory and returns its device pointer (an offset,
    /// 64-byte aligned). The memory is not cleared.
    ///
    /// # Errors
    ///
    /// `nbytes == 0`, or more than [`memory_size`](Self::memory_size), is an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error; when the chip
    /// has no free block large enough it is an
    /// [`ErrorKind::InvalidState`](crate::ErrorKind::InvalidState) error. Both messages say
    /// "out of device memory" (except for 0 bytes) and name the request and the memory size.
    ///
    /// ```
    /// use simpler::{ChipBackend, ErrorKind, SimChip};
    /// let mut chip = SimChip::new(4096, 1)?;
    /// let a = chip.malloc(100)?;
    /// let b = chip.malloc(100)?;
    /// assert_eq!((a % 64, b % 64), (0, 0));
    /// let err = chip.malloc(8192).unwrap_err();
    /// assert!(err.message().contains("8192") && err.message().contains("4096"));
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn malloc(&mut self, nbytes: u64) -> Result<u64>;

    /// Frees an allocation made by [`malloc`](Self::malloc); `ptr` must be its start.
    ///
    /// # Errors
    ///
    /// An unknown pointer, a pointer into the middle of an allocation, or a double free is an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error that says which.
    ///
    /// ```
    /// use simpler::{ChipBackend, SimChip};
    /// let mut chip = SimChip::new(4096, 1)?;
    /// let p = chip.malloc(256)?;
    /// chip.free(p)?;
    /// assert!(chip.free(p).unwrap_err().message().contains("double free"));
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn free(&mut self, ptr: u64) -> Result<()>;

    /// Copies `src` to device memory at `dst` (host to device).
    ///
    /// # Errors
    ///
    /// The range `dst..dst + src.len()` must lie inside one live allocation; otherwise an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error naming the range.
    ///
    /// ```
    /// use simpler::{ChipBackend, SimChip};
    /// let mut chip = SimChip::new(4096, 1)?;
    /// let p = chip.malloc(8)?;
    /// chip.copy_to_device(p, &[1, 2, 3, 4, 5, 6, 7, 8])?;
    /// assert!(chip.copy_to_device(p + 4, &[0; 8]).is_err()); // runs past the allocation
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn copy_to_device(&mut self, dst: u64, src: &[u8]) -> Result<()>;

    /// Copies device memory at `src` into `dst` (device to host).
    ///
    /// # Errors
    ///
    /// As [`copy_to_device`](Self::copy_to_device): the range must lie inside one live
    /// allocation.
    ///
    /// ```
    /// use simpler::{ChipBackend, SimChip};
    /// let mut chip = SimChip::new(4096, 1)?;
    /// let p = chip.malloc(4)?;
    /// chip.copy_to_device(p, &[9, 8, 7, 6])?;
    /// let mut two = [0u8; 2];
    /// chip.copy_from_device(p + 2, &mut two)?; // any range inside the allocation
    /// assert_eq!(two, [7, 6]);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn copy_from_device(&self, src: u64, dst: &mut [u8]) -> Result<()>;

    /// True when `ptr..ptr + len` lies inside one live allocation (as requested, not counting
    /// alignment padding).
    ///
    /// ```
    /// use simpler::{ChipBackend, SimChip};
    /// let mut chip = SimChip::new(4096, 1)?;
    /// let p = chip.malloc(100)?;
    /// assert!(chip.is_live(p, 100) && chip.is_live(p + 10, 90));
    /// assert!(!chip.is_live(p, 101));
    /// chip.free(p)?;
    /// assert!(!chip.is_live(p, 1));
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn is_live(&self, ptr: u64, len: u64) -> bool;
}

/// A chip simulated on the CPU: device memory is a lazily backed anonymous mapping of this
/// process with a first-fit allocator (64-byte aligned blocks, frees coalesce), and each core
/// is a thread of the process that runs it.
///
/// Only touched pages use memory, so a large `memory_bytes` is cheap.
///
/// ```
/// use simpler::{ChipBackend, SimChip};
///
/// let mut chip = SimChip::new(1 << 30, 4)?; // 1 GiB, backed on first touch
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
    arena: Arc<Arena>,
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
    /// use simpler::{ChipBackend, SimChip};
    /// let chip = SimChip::new(64 << 20, 8)?;
    /// assert_eq!((chip.memory_size(), chip.cores()), (64 << 20, 8));
    /// assert!(SimChip::new(0, 1).is_err());
    /// assert!(SimChip::new(4096, 0).is_err());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn new(memory_bytes: u64, cores: usize) -> Result<SimChip> {
        if cores == 0 || cores > MAX_CORES {
            return Err(Error::invalid(format!("a simulated chip needs 1..={MAX_CORES} cores, got {cores}")));
        }
        Ok(SimChip { arena: Arc::new(Arena::new(memory_bytes)?), cores })
    }

    /// The device memory, shared with the core threads.
    pub(crate) fn arena(&self) -> &Arc<Arena> {
        &self.arena
    }
}

impl ChipBackend for SimChip {
    fn memory_size(&self) -> u64 {
        self.arena.size()
    }

    fn cores(&self) -> usize {
        self.cores
    }

    fn malloc(&mut self, nbytes: u64) -> Result<u64> {
        self.arena.malloc(nbytes)
    }

    fn free(&mut self, ptr: u64) -> Result<()> {
        self.arena.free(ptr)
    }

    fn copy_to_device(&mut self, dst: u64, src: &[u8]) -> Result<()> {
        self.arena.copy_to(dst, src)
    }

    fn copy_from_device(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.arena.copy_from(src, dst)
    }

    fn is_live(&self, ptr: u64, len: u64) -> bool {
        self.arena.is_live(ptr, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn sim_chip_through_the_trait_object() {
        let mut chip: Box<dyn ChipBackend> = Box::new(SimChip::new(1 << 16, 3).unwrap());
        assert_eq!((chip.memory_size(), chip.cores()), (1 << 16, 3));
        let p = chip.malloc(1000).unwrap();
        let data: Vec<u8> = (0..1000).map(|i| (i % 251) as u8).collect();
        chip.copy_to_device(p, &data).unwrap();
        let mut back = vec![0; 1000];
        chip.copy_from_device(p, &mut back).unwrap();
        assert_eq!(back, data);
        assert!(chip.is_live(p, 1000));
        chip.free(p).unwrap();
        assert!(!chip.is_live(p, 1));
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
        let mut chip = SimChip::new(8 << 30, 1).unwrap();
        let a = chip.malloc(4096).unwrap();
        let b = chip.malloc((8 << 30) - 8192).unwrap();
        chip.copy_to_device(a, &[1; 4096]).unwrap();
        chip.copy_to_device(b + (8 << 30) - 8192 - 1, &[2]).unwrap();
        let mut one = [0u8];
        chip.copy_from_device(b + (8 << 30) - 8192 - 1, &mut one).unwrap();
        assert_eq!(one, [2]);
    }
}
