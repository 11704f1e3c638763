//! The chip engine's level parts: its `orch.alloc` memory ([`ChipHeap`]: the chip's device
//! memory) and its device rule ([`OneChip`]).

use super::*;

/// The chip's device memory as the chip engine's [`IntermediateHeap`]: `orch.alloc` inside a chip
/// orchestration carves its intermediates from it, so they count against the chip's memory
/// and kernels only ever touch device memory.
pub(super) struct ChipHeap {
    pub(super) chip: u32,
    pub(super) device: Arc<Device>,
}

impl IntermediateHeap for ChipHeap {
    /// The chip's memory wherever asked for: it is the only memory a chip has.
    fn alloc(
        &self,
        _place: Place,
        _ring: usize,
        bytes: u64,
        id: Identity,
    ) -> Result<Option<(HeapBlock, Backing)>> {
        // `None`: no free block large enough now; a release may make room.
        let ptr = self
            .device
            .try_malloc(bytes, id)
            .map_err(|e| e.context(format!("orch.alloc on chip {}", self.chip)))?;
        Ok(ptr.map(|ptr| {
            (
                HeapBlock { place: Place::Chip(self.chip), ring: 0, id: ptr },
                Backing::Device { ptr, chip: self.chip },
            )
        }))
    }

    fn release(&self, block: HeapBlock) {
        if let Err(e) = self.device.free(block.id) {
            // The engine frees each allocation once, when its slot is consumed.
            debug_assert!(false, "freeing an orch.alloc block: {e}");
            tracing::error!(target: "simpler::chip", chip = self.chip, "freeing an orch.alloc block: {e}");
        }
    }

    fn hands_out(&self, backing: &Backing) -> bool {
        matches!(backing, Backing::Device { chip, .. } if *chip == self.chip)
    }

    fn exhausted(&self, _place: Place, _ring: usize) -> (String, &'static str, u64) {
        (format!("out of device memory on chip {}", self.chip), "chip_memory", self.device.size())
    }
}

/// The chip engine's device rule: device memory of this chip may go to any of its cores (the
/// core checks the allocation is live when it starts the kernel); another chip's never.
pub(super) struct OneChip {
    pub(super) chip: u32,
}

impl DeviceRules for OneChip {
    fn check(&self, u: &DeviceUse<'_>) -> Result<()> {
        if u.chip == self.chip {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "{}: tensor {} is device memory of chip {}, but this orchestration runs on chip {}; device memory is usable only by its own chip",
            u.callable, u.tensor, u.chip, self.chip
        )))
    }
}
