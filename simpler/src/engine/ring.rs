//! The task window and the four heap rings.
//!
//! The task window bounds how many slots may be live (submitted and not yet consumed) at once;
//! a submit that finds it full waits (driving the scheduler) and then fails with an error that
//! names `WorkerBuilder::task_window`.
//!
//! Each heap ring is one `MAP_SHARED` memfd mapping made before any child starts, so every child
//! sees its slabs (at the same address when forked; elsewhere, translated by the ring's memfd
//! inode, when started by exec). Allocation is a bump allocator with wrap-around over a FIFO of
//! blocks; blocks are released in any order but reclaimed in FIFO order (the released prefix of
//! the FIFO is dropped), so one long-lived block holds back only its own ring. The ring is chosen
//! by scope depth: `min(depth, 3)`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::data::buffer::Backing;
use crate::error::{Error, Result};
use crate::sys::mem::{SharedRegion, SharedSpan};
use crate::sys::sync;

/// Every heap allocation is rounded up to this many bytes.
pub(crate) const HEAP_ALIGN: u64 = 1024;

/// Number of heap rings (scope depths 0, 1, 2 and 3+).
pub(crate) const HEAP_RINGS: usize = 4;

/// Counts live slots against the task window.
pub(crate) struct TaskWindow {
    live: AtomicUsize,
    capacity: usize,
}

impl TaskWindow {
    pub(crate) fn new(capacity: usize) -> TaskWindow {
        TaskWindow { live: AtomicUsize::new(0), capacity }
    }

    /// Claims one slot if the window has room.
    pub(crate) fn try_claim(&self) -> bool {
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.capacity).then_some(n + 1))
            .is_ok()
    }

    pub(crate) fn release(&self) {
        self.live.fetch_sub(1, Ordering::AcqRel);
    }

    #[cfg(test)] // only tests need it
    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }
}

struct Block {
    id: u64,
    start: u64,
    end: u64,
    released: bool,
}

struct RingState {
    blocks: VecDeque<Block>,
    next_id: u64,
}

/// The allocator of one ring over offsets `0..size`: bump with wrap-around over a FIFO of
/// blocks, released in any order, reclaimed in FIFO order.
pub(crate) struct RingAlloc {
    size: u64,
    state: Mutex<RingState>,
}

impl RingAlloc {
    pub(crate) fn new(size: u64) -> RingAlloc {
        RingAlloc { size, state: Mutex::new(RingState { blocks: VecDeque::new(), next_id: 1 }) }
    }

    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// A block of `size` bytes (a multiple of [`HEAP_ALIGN`]): its id and offset, or `None`
    /// when the ring has no room for it now. A size larger than the whole ring is never given
    /// room (its callers refuse it first, as it could never fit): no block reaches past the ring.
    pub(crate) fn try_alloc(&self, size: u64) -> Option<(u64, u64)> {
        if size > self.size {
            return None;
        }
        let mut st = sync::lock(&self.state);
        let start = match (st.blocks.front(), st.blocks.back()) {
            (Some(first), Some(last)) => {
                let (head, top) = (first.start, last.end);
                if top > head {
                    // Live region [head, top): room after top, else wrap to 0 before head.
                    if self.size - top >= size {
                        Some(top)
                    } else if head >= size {
                        Some(0)
                    } else {
                        None
                    }
                } else if head - top >= size {
                    // Wrapped: free gap is [top, head).
                    Some(top)
                } else {
                    None
                }
            }
            _ => Some(0),
        }?;
        let id = st.next_id;
        st.next_id += 1;
        st.blocks.push_back(Block { id, start, end: start + size, released: false });
        Some((id, start))
    }

    /// Marks block `id` released and reclaims the released FIFO prefix. Idempotent.
    pub(crate) fn release(&self, id: u64) {
        let mut st = sync::lock(&self.state);
        let Some(front) = st.blocks.front() else { return };
        let Some(idx) = id.checked_sub(front.id) else { return };
        if let Some(b) = st.blocks.get_mut(idx as usize) {
            b.released = true;
        }
        while st.blocks.front().is_some_and(|b| b.released) {
            st.blocks.pop_front();
        }
    }

    /// Bytes currently held by live blocks.
    #[cfg(test)] // only tests need it
    pub(crate) fn used(&self) -> u64 {
        let st = sync::lock(&self.state);
        st.blocks.iter().map(|b| b.end - b.start).sum()
    }
}

/// `bytes` rounded up to a whole number of [`HEAP_ALIGN`] units (at least one).
pub(crate) fn heap_size_of(bytes: u64) -> u64 {
    bytes.max(1).div_ceil(HEAP_ALIGN) * HEAP_ALIGN
}

/// One heap ring.
pub(crate) struct HeapRing {
    region: Option<Arc<SharedRegion>>,
    alloc: RingAlloc,
}

impl HeapRing {
    /// Maps `size` bytes lazily (0 disables the ring).
    pub(crate) fn new(size: u64) -> Result<HeapRing> {
        let region = if size == 0 {
            None
        } else {
            let len = usize::try_from(size).map_err(|_| Error::invalid("heap_ring_size too large"))?;
            Some(Arc::new(SharedRegion::new(len, true)?))
        };
        Ok(HeapRing { region, alloc: RingAlloc::new(size) })
    }

    pub(crate) fn size(&self) -> u64 {
        self.alloc.size()
    }

    /// The mapping, when the ring is enabled.
    pub(crate) fn span(&self) -> Option<SharedSpan> {
        self.region.as_ref().map(|r| SharedSpan::here(r.clone()))
    }

    #[cfg(test)] // only tests need it
    /// True when `[addr, addr + len)` lies inside this ring's mapping.
    pub(crate) fn contains(&self, addr: u64, len: u64) -> bool {
        self.region.as_ref().is_some_and(|r| r.contains(addr, len))
    }

    /// Allocates `bytes` (rounded up to [`HEAP_ALIGN`]): the block's id and where it lives;
    /// `Ok(None)` when the ring is full now, `Err` when the request can never fit.
    pub(crate) fn try_alloc(&self, bytes: u64) -> Result<Option<(u64, Backing)>> {
        let Some(region) = &self.region else {
            return Err(Error::invalid(
                "orch.alloc: the heap is disabled (heap_ring_size = 0); set WorkerBuilder::heap_ring_size",
            ));
        };
        let size = heap_size_of(bytes);
        if size > self.size() {
            return Err(Error::invalid(format!(
                "orch.alloc of {bytes} bytes can never fit a heap ring of {} bytes; raise WorkerBuilder::heap_ring_size",
                self.size()
            )));
        }
        Ok(self
            .alloc
            .try_alloc(size)
            .map(|(id, start)| (id, Backing::HeapSlab { addr: region.addr() + start, ino: region.ino() })))
    }

    /// Marks block `id` released and reclaims the released FIFO prefix. Idempotent.
    pub(crate) fn release(&self, id: u64) {
        self.alloc.release(id);
    }

    #[cfg(test)] // only tests need it
    /// Bytes currently held by live blocks (for tests and statistics).
    pub(crate) fn used(&self) -> u64 {
        self.alloc.used()
    }
}

/// The ring a scope depth allocates from.
pub(crate) fn ring_for_depth(depth: usize) -> usize {
    depth.min(HEAP_RINGS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_claims_up_to_capacity() {
        let w = TaskWindow::new(2);
        assert!(w.try_claim());
        assert!(w.try_claim());
        assert!(!w.try_claim());
        w.release();
        assert!(w.try_claim());
    }

    #[test]
    fn heap_wraps_and_reclaims_fifo() {
        let h = HeapRing::new(4 * HEAP_ALIGN).unwrap();
        let (a, _) = h.try_alloc(1024).unwrap().unwrap();
        let (b, _) = h.try_alloc(2000).unwrap().unwrap(); // 2 blocks of 1024
        let (c, _) = h.try_alloc(1).unwrap().unwrap();
        assert!(h.try_alloc(1).unwrap().is_none(), "ring is full");
        // Releasing b alone reclaims nothing (a is still live at the FIFO head).
        h.release(b);
        assert!(h.try_alloc(1).unwrap().is_none());
        h.release(a);
        // a and b reclaimed: 3 blocks free before c, wrap to 0.
        let (_, backing) = h.try_alloc(3 * 1024).unwrap().unwrap();
        let Backing::HeapSlab { addr, ino } = backing else { panic!("{backing:?}") };
        assert_eq!(addr % HEAP_ALIGN, 0);
        assert_eq!(Some(ino), h.span().map(|s| s.region.ino()), "the slab names its ring");
        h.release(c);
        assert_eq!(h.used(), 3 * 1024);
        assert!(h.try_alloc(5 * 1024).is_err(), "larger than the ring");
    }

    #[test]
    fn disabled_heap_errors() {
        let h = HeapRing::new(0).unwrap();
        assert!(h.try_alloc(8).is_err());
    }
}
