//! Where `orch.alloc` carves intermediates from: one trait, [`IntermediateHeap`], with two
//! implementations: a level's host heap rings ([`HostRings`], here, over `ring.rs`'s `HeapRing`), and, inside a chip,
//! the chip's device memory (`ChipHeap`, in `chip/runtime/heap.rs`). The engine knows only the trait.

use crate::data::buffer::{Backing, Identity};
use crate::engine::ring::{HEAP_RINGS, HeapRing};
use crate::error::Result;
use crate::sys::mem::SharedSpan;

/// A block an [`IntermediateHeap`] handed out: what it needs to take the block back. `ring` is
/// the scope ring it came from (heap rings) and `id` names the block in it (a ring block id, or
/// a device pointer).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeapBlock {
    pub(crate) ring: usize,
    pub(crate) id: u64,
}

/// Where `orch.alloc` takes memory from.
pub(crate) trait IntermediateHeap: Send + Sync {
    /// A block of `bytes` for an allocation at scope ring `ring`, and where its bytes live:
    /// `Ok(None)` when no block is free now (a release may make room), an error when the
    /// request can never be met. `id` is the identity the allocation will have: device memory
    /// is checked by it at dispatch.
    fn alloc(&self, ring: usize, bytes: u64, id: Identity) -> Result<Option<(HeapBlock, Backing)>>;

    /// Takes a block back (its allocation's slot was consumed).
    fn release(&self, block: HeapBlock);

    /// Whether this heap hands out memory with `backing` (so a buffer of the engine's own
    /// nonce there is one of its intermediates).
    fn hands_out(&self, backing: &Backing) -> bool;

    /// What ran out when an allocation at ring `ring` waited in vain: a description, the
    /// `WorkerBuilder` setting that sizes it, and its size now.
    fn exhausted(&self, ring: usize) -> (String, &'static str, u64);

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
    fn alloc(&self, ring: usize, bytes: u64, _id: Identity) -> Result<Option<(HeapBlock, Backing)>> {
        Ok(self.rings[ring].try_alloc(bytes)?.map(|(id, backing)| (HeapBlock { ring, id }, backing)))
    }

    fn release(&self, block: HeapBlock) {
        self.rings[block.ring].release(block.id);
    }

    fn hands_out(&self, backing: &Backing) -> bool {
        matches!(backing, Backing::HeapSlab { .. })
    }

    fn exhausted(&self, ring: usize) -> (String, &'static str, u64) {
        (format!("heap ring {ring} exhausted"), "heap_ring_size", self.rings[ring].size())
    }

    fn spans(&self) -> Vec<SharedSpan> {
        self.rings.iter().filter_map(HeapRing::span).collect()
    }
}
