//! Where `orch.alloc` carves intermediates from: one trait, [`IntermediateHeap`], with three
//! implementations: a level's host heap rings ([`HostRings`], here, over `ring.rs`'s
//! `HeapRing`); an L3 Worker's host rings beside device heap rings on its chips ([`DeviceRings`],
//! here, combined in `worker::tree`), which `orch.alloc_on(chip, ..)` uses so that an
//! intermediate only that chip's kernels touch stays in its memory; and, inside a chip, the
//! chip's device memory (`ChipHeap`, in `chip/runtime/heap.rs`). The engine knows only the
//! trait.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::data::buffer::{Backing, Identity};
use crate::engine::ring::{HEAP_RINGS, HeapRing, RingAlloc, heap_size_of};
use crate::error::{Error, Result};
use crate::sys::mem::SharedSpan;

/// Where an intermediate should live: the level's host memory, or the memory of one of its
/// chips (a hint: a level without a device heap on that chip gives host memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    Host,
    Chip(u32),
}

/// A block an [`IntermediateHeap`] handed out: what it needs to take the block back. `place` is
/// where it lives, `ring` the scope ring it came from (heap rings) and `id` names the block in
/// it (a ring block id, or a device pointer).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeapBlock {
    pub(crate) place: Place,
    pub(crate) ring: usize,
    pub(crate) id: u64,
}

/// Where `orch.alloc` takes memory from.
pub(crate) trait IntermediateHeap: Send + Sync {
    /// A block of `bytes` for an allocation at scope ring `ring`, preferably at `place`, and
    /// where its bytes live: `Ok(None)` when no block is free now (a release may make room), an
    /// error when the request can never be met. `id` is the identity the allocation will have:
    /// device memory is checked by it at dispatch.
    fn alloc(
        &self,
        place: Place,
        ring: usize,
        bytes: u64,
        id: Identity,
    ) -> Result<Option<(HeapBlock, Backing)>>;

    /// Takes a block back (its allocation's slot was consumed).
    fn release(&self, block: HeapBlock);

    /// Whether this heap hands out memory with `backing` (so a buffer of the engine's own
    /// nonce there is one of its intermediates).
    fn hands_out(&self, backing: &Backing) -> bool;

    /// What ran out when an allocation at `place` and ring `ring` waited in vain: a
    /// description, the `WorkerBuilder` setting that sizes it, and its size now.
    fn exhausted(&self, place: Place, ring: usize) -> (String, &'static str, u64);

    /// The host mappings children map too (heap rings), for their resolvers.
    fn spans(&self) -> Vec<SharedSpan> {
        Vec::new()
    }
}

/// A level's host heap rings: [`HEAP_RINGS`] lazily backed `MAP_SHARED` mappings made before
/// fork, one per scope depth (FIFO reclamation in each).
pub(crate) struct HostRings {
    rings: Vec<HeapRing>,
}

impl HostRings {
    /// Maps the rings, `size` bytes each (0 disables `orch.alloc`).
    pub(crate) fn new(size: u64) -> Result<HostRings> {
        Ok(HostRings { rings: (0..HEAP_RINGS).map(|_| HeapRing::new(size)).collect::<Result<Vec<_>>>()? })
    }

    /// Ring `i` (for tests).
    #[cfg(test)]
    pub(crate) fn ring(&self, i: usize) -> &HeapRing {
        &self.rings[i]
    }
}

impl IntermediateHeap for HostRings {
    /// Host memory wherever asked for: this level has no device heap.
    fn alloc(
        &self,
        _place: Place,
        ring: usize,
        bytes: u64,
        _id: Identity,
    ) -> Result<Option<(HeapBlock, Backing)>> {
        Ok(self.rings[ring]
            .try_alloc(bytes)?
            .map(|(id, backing)| (HeapBlock { place: Place::Host, ring, id }, backing)))
    }

    fn release(&self, block: HeapBlock) {
        self.rings[block.ring].release(block.id);
    }

    fn hands_out(&self, backing: &Backing) -> bool {
        matches!(backing, Backing::HeapSlab { .. })
    }

    fn exhausted(&self, _place: Place, ring: usize) -> (String, &'static str, u64) {
        (format!("heap ring {ring} exhausted"), "heap_ring_size", self.rings[ring].size())
    }

    fn spans(&self) -> Vec<SharedSpan> {
        self.rings.iter().filter_map(HeapRing::span).collect()
    }
}

/// No device heap on a chip (yet, or any more).
const NO_BASE: u64 = u64::MAX;

/// Device heap rings on a level's chips: per chip, one block of its device memory (allocated by
/// the level once the chip runs, [`DeviceRings::set_base`]) cut into [`HEAP_RINGS`] rings of
/// `size` bytes, one per scope depth, allocated like the host rings. An allocation on a chip
/// without a block is `Ok(None)` from [`DeviceRings::try_alloc`]'s `Option` in the outer
/// layer: the caller falls back to host memory.
pub(crate) struct DeviceRings {
    size: u64,
    chips: Vec<ChipRings>,
}

struct ChipRings {
    /// The device pointer of the chip's block; [`NO_BASE`] when it has none.
    base: AtomicU64,
    rings: Vec<RingAlloc>,
}

impl DeviceRings {
    /// Rings of `size` bytes each on `chips` chips (none has a block yet).
    pub(crate) fn new(chips: usize, size: u64) -> DeviceRings {
        DeviceRings {
            size,
            chips: (0..chips)
                .map(|_| ChipRings {
                    base: AtomicU64::new(NO_BASE),
                    rings: (0..HEAP_RINGS).map(|_| RingAlloc::new(size)).collect(),
                })
                .collect(),
        }
    }

    /// The bytes of the block each chip needs (0: device heaps are off).
    pub(crate) fn block_bytes(&self) -> u64 {
        self.size * HEAP_RINGS as u64
    }

    /// Chip `chip`'s block starts at device pointer `base` (`None`: it has none, and its
    /// allocations fall back to host memory from now on).
    pub(crate) fn set_base(&self, chip: u32, base: Option<u64>) {
        if let Some(c) = self.chips.get(chip as usize) {
            c.base.store(base.unwrap_or(NO_BASE), Ordering::Release);
        }
    }

    /// The block's base on `chip`, if it has one.
    pub(crate) fn base(&self, chip: u32) -> Option<u64> {
        let base = self.chips.get(chip as usize)?.base.load(Ordering::Acquire);
        (base != NO_BASE).then_some(base)
    }

    /// A block of `bytes` in ring `ring` on `chip`: `None` when the chip has no device heap
    /// (allocate elsewhere), `Some(Ok(None))` when the ring is full now, an error when the
    /// request can never fit the ring.
    pub(crate) fn try_alloc(
        &self,
        chip: u32,
        ring: usize,
        bytes: u64,
    ) -> Option<Result<Option<(HeapBlock, Backing)>>> {
        let base = self.base(chip)?;
        let size = heap_size_of(bytes);
        if size > self.size {
            return Some(Err(Error::invalid(format!(
                "orch.alloc_on(chip {chip}) of {bytes} bytes can never fit a device heap ring of {} bytes; raise WorkerBuilder::chip_heap_ring_size",
                self.size
            ))));
        }
        let rings = &self.chips[chip as usize].rings;
        let at = base + self.size * ring as u64;
        Some(Ok(rings[ring].try_alloc(size).map(|(id, start)| {
            (HeapBlock { place: Place::Chip(chip), ring, id }, Backing::Device { ptr: at + start, chip })
        })))
    }

    /// Takes back a block [`try_alloc`](Self::try_alloc) gave.
    pub(crate) fn release(&self, block: HeapBlock) {
        if let Place::Chip(chip) = block.place
            && let Some(c) = self.chips.get(chip as usize)
        {
            c.rings[block.ring].release(block.id);
        }
    }

    /// Whether `backing` lies in a chip's device heap block.
    pub(crate) fn hands_out(&self, backing: &Backing) -> bool {
        match *backing {
            Backing::Device { ptr, chip } => {
                self.base(chip).is_some_and(|base| ptr >= base && ptr - base < self.block_bytes())
            }
            _ => false,
        }
    }

    /// The size of each ring.
    pub(crate) fn ring_size(&self) -> u64 {
        self.size
    }
}
