//! The retained staging buffer of one pipeline slot: where a run's host tensors live on the
//! device.
//!
//! A run's host tensors (the `Host` arguments of a chip run) are copied into device memory
//! before its kernels run and copied back after. Instead of one device allocation per tensor
//! per run, each pipeline slot keeps one block across runs:
//!
//! * **grow-only**: a run that needs more than the block holds frees it and allocates one of
//!   the size it needs *before* anything is copied in; a run that needs less reuses it. So
//!   once the largest run has been seen, a run costs no device allocation at all.
//! * **bump-sliced**: each host tensor gets the next slice aligned to the device's
//!   alignment (`ChipBackend::alignment`, 64 bytes on a simulated chip; [`layout`]).
//! * **counted against chip memory**: the block is an ordinary allocation of the chip's memory
//!   (internal, so no user sees it), so a grow that does not fit fails the run with the chip's
//!   out-of-memory error, naming the bytes, before the run touches the chip.
//! * **fenced while idle**: the block is fenced (rule A6 of `chip::arena`) except while its
//!   slot's run executes, so the next run's copy-in overlaps the running run's kernels.
//! * **freed at close** ([`Staging::release`]), or earlier when another slot's run cannot grow
//!   its block for want of chip memory while this block serves no run
//!   ([`Staging::reclaimable`]): a run that fits the chip alone never fails because another
//!   slot kept an earlier, larger run's block.

use crate::chip::device::Device;
use crate::error::{Error, Result};

/// The slices of a run's host tensors, each at a multiple of `align`: each tensor's offset into
/// the block, and the bytes the block must hold. An overflow is an `InvalidArgument` error.
pub(crate) fn layout(sizes: impl IntoIterator<Item = u64>, align: u64) -> Result<(Vec<u64>, u64)> {
    let mut offsets = Vec::new();
    let mut end = 0u64;
    for size in sizes {
        let at = end
            .checked_next_multiple_of(align)
            .ok_or_else(|| Error::invalid("host tensors too large to stage"))?;
        offsets.push(at);
        end = at.checked_add(size).ok_or_else(|| Error::invalid("host tensors too large to stage"))?;
    }
    Ok((offsets, end))
}

/// One slot's retained staging block (see the [module docs](self)).
#[derive(Debug, Default)]
pub(crate) struct Staging {
    /// The block: its device pointer and size.
    block: Option<(u64, u64)>,
    /// Bytes of it the slot's current run uses (0 once that run is finalized).
    used: u64,
}

impl Staging {
    /// The block's size (0 when there is none).
    pub(crate) fn capacity(&self) -> u64 {
        self.block.map_or(0, |(_, size)| size)
    }

    /// The block's device pointer, once there is one.
    pub(crate) fn ptr(&self) -> Option<u64> {
        self.block.map(|(ptr, _)| ptr)
    }

    /// Makes the block hold at least `need` bytes and returns its pointer (`None` when `need`
    /// is 0 and there is no block). Growing frees the old block and allocates a fenced one of
    /// exactly `need` bytes; its failure (the chip's out-of-memory error) leaves no block.
    /// Call it only while no run uses the block.
    pub(crate) fn reserve(&mut self, device: &Device, need: u64) -> Result<Option<u64>> {
        if need > self.capacity() {
            self.release(device)?;
            self.block = Some((device.malloc_internal(need)?, need));
        }
        self.used = need;
        Ok(self.ptr())
    }

    /// The slot's run was finalized: no run uses the block until the next `reserve`.
    pub(crate) fn idle(&mut self) {
        self.used = 0;
    }

    /// Whether the block may be freed now: there is one, and no run uses any of it.
    pub(crate) fn reclaimable(&self) -> bool {
        self.block.is_some() && self.used == 0
    }

    /// Frees the block, if any.
    pub(crate) fn release(&mut self, device: &Device) -> Result<()> {
        self.used = 0;
        if let Some((ptr, _)) = self.block.take() {
            device.free(ptr)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chip::backend::ChipBackend;
    use crate::chip::sim::SimChip;

    fn device(bytes: u64) -> Device {
        let sim: Box<dyn ChipBackend> = Box::new(SimChip::new(bytes, 1).unwrap());
        Device::new(0, sim).unwrap()
    }

    #[test]
    fn slices_are_bump_allocated_at_64_byte_alignment() {
        let (offsets, total) = layout([10, 64, 1, 0, 3], 64).unwrap();
        assert_eq!(offsets, vec![0, 64, 128, 192, 192]);
        assert_eq!(total, 195);
        assert_eq!(layout([], 64).unwrap(), (vec![], 0));
        assert!(layout([u64::MAX, 1], 64).is_err());
    }

    #[test]
    fn slices_follow_the_device_alignment() {
        // An OpenCL device on PoCL needs 128-byte sub-buffer origins.
        let (offsets, total) = layout([10, 200, 1], 128).unwrap();
        assert_eq!(offsets, vec![0, 128, 384]);
        assert_eq!(total, 385);
    }

    #[test]
    fn the_block_only_grows_and_is_reused() {
        let dev = device(1 << 20);
        let mut s = Staging::default();
        assert_eq!(s.reserve(&dev, 0).unwrap(), None, "nothing to stage, nothing allocated");
        let p = s.reserve(&dev, 1000).unwrap().unwrap();
        assert_eq!(dev.allocations(), 1);
        assert_eq!(s.reserve(&dev, 500).unwrap(), Some(p), "a smaller run reuses it");
        assert_eq!(s.reserve(&dev, 1000).unwrap(), Some(p));
        assert_eq!(dev.allocations(), 1, "no allocation for a run that fits");
        s.reserve(&dev, 4000).unwrap().unwrap();
        assert_eq!((dev.allocations(), s.capacity()), (2, 4000), "grown once to what the run needs");
        assert_eq!(dev.held_bytes(), 4000, "the old block was freed; the new one counts");
        s.release(&dev).unwrap();
        assert_eq!(dev.held_bytes(), 0, "freed at close");
    }

    #[test]
    fn a_grow_that_does_not_fit_fails_with_the_chips_error_and_leaves_no_block() {
        let dev = device(4096);
        let mut s = Staging::default();
        s.reserve(&dev, 1024).unwrap();
        let err = s.reserve(&dev, 8192).unwrap_err();
        assert!(err.message().contains("out of device memory") && err.message().contains("8192"), "{err}");
        assert_eq!((s.capacity(), dev.held_bytes()), (0, 0));
    }

    #[test]
    fn staging_blocks_are_invisible_to_users() {
        let dev = device(4096);
        let mut s = Staging::default();
        let p = s.reserve(&dev, 256).unwrap().unwrap();
        assert!(!dev.is_live(p, 256), "no user tensor or memory control may name it");
        let scratch = crate::data::buffer::Identity::new(1, 1, 1).unwrap();
        assert!(!dev.is_live_as(p, 256, scratch), "whatever identity a tensor claims");
        assert!(dev.usable_by_kernels(p, 256, scratch), "the run's scratch tensors reach the cores");
    }
}
