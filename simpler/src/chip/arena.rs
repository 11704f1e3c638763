//! Device memory of a simulated chip: one lazily backed anonymous mapping, a first-fit
//! allocator over offsets into it, and every raw-pointer operation of the `chip` module.
//!
//! A device pointer is an *offset* into the arena (0 is a valid offset), never a host address.
//! Allocations are rounded up to [`DEVICE_ALIGN`] bytes and placed first-fit (lowest offset
//! first); a free merges with free neighbours, so the arena never fragments into adjacent free
//! blocks. A byte range is *live* when it lies inside one allocation as requested (the rounding
//! slack is not part of it).
//!
//! This file is the only place in `chip/` that turns integers into pointers it dereferences.
//!
//! # Rules
//!
//! * **A1 (the mapping).** `Arena::region` is a live read-write mapping of `Arena::size` bytes,
//!   owned by the arena alone (rule R1 of `sys::mem`); it is unmapped only when the last `Arc`
//!   of the arena drops, so every holder of the arena (the [`SimChip`](super::SimChip), each
//!   core thread) may use addresses inside it.
//! * **A2 (device ranges are checked).** Every access to device memory in this module first
//!   checks, under the allocator lock, that the whole byte range lies inside one live
//!   allocation, hence inside the mapping (A1).
//! * **A3 (no concurrent writers).** The arena is written only (a) by the copy functions here,
//!   each of which holds the arena's `gate` exclusively for the whole copy, and (b) by kernels
//!   through `HostArgs` (rules H1-H4 there), each of which runs holding the `gate` shared
//!   ([`Arena::kernel_gate`]), so no copy ever overlaps a running kernel, whoever calls it (a
//!   backend may hand its memory to code of its own). Kernels themselves are ordered by the
//!   chip engine by the tensors' tags like any other task. Tags waived with
//!   `Tag::NoDep`, or two identities naming the same bytes, leave the ordering to the
//!   orchestration, as for shared host buffers at L3.
//! * **A4 (raw copies only).** This module never creates a reference into the arena or into
//!   host memory it is handed: it copies with `ptr::copy_nonoverlapping` between a host range
//!   and a device range, which never overlap. The arena is a mapping of its own; the only
//!   references into it are a running kernel's `HostArgs` slices, and no copy runs while a
//!   kernel runs (A3), so the slice `copy_to` / `copy_from` take is other memory.
//! * **A5 (host views).** [`Arena::copy_view_in_part`] and [`Arena::copy_view_out`] take host memory
//!   as a [`MappedTensor`], whose construction guarantees rule H1 of `data::host_args`: its
//!   view's bytes lie inside memory mapped in this process while it lives, and no other thread
//!   writes those bytes meanwhile (they belong to the running task). They lend those bytes, run
//!   by run, to the backend's copy functions, for the length of one call each.
//! * **A6 (fenced blocks).** A block may be *fenced* ([`Arena::fence`]): the chip runtime's
//!   retained staging buffer of a pipeline slot whose run is not executing. No kernel view
//!   reaches into a fenced block ([`Arena::tensor`] refuses one; views are made only while their
//!   maker holds the kernel gate, so fencing, which takes the gate exclusively, waits for every
//!   view made before it). A copy whose device range lies in a fenced block therefore cannot
//!   overlap a kernel's view of it and does not take the gate exclusively: it holds the
//!   `staging` gate shared instead, so a copy into the next run's staging overlaps the running
//!   run's kernels. [`Arena::unfence`] takes the `staging` gate exclusively (waiting for every
//!   such copy) before a kernel may see the block again. A block fenced as soon as it is
//!   allocated ([`Arena::fence_new`]) needs no wait: views are made only of blocks the runtime
//!   holds (and checked live), and it frees a block only once no task uses it.

#![expect(
    unsafe_code,
    reason = "raw copies into and out of the device mapping, and kernel views of it; rules A1-A5"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, RwLock, RwLockReadGuard};

use crate::data::buffer::Access;
use crate::data::host_args::MappedTensor;
use crate::data::tensor::TensorView;
use crate::error::{Error, ErrorKind, Result};
use crate::sys::mem::SharedRegion;
use crate::sys::sync;

/// Alignment (and rounding unit) of every device allocation, in bytes.
pub(crate) const DEVICE_ALIGN: u64 = 64;

/// One live allocation.
#[derive(Debug, Clone, Copy)]
struct Block {
    /// Bytes reserved (a multiple of [`DEVICE_ALIGN`]).
    size: u64,
    /// Bytes asked for: the live range is `[start, start + requested)`.
    requested: u64,
    /// No kernel view may reach into it (rule A6).
    fenced: bool,
}

/// First-fit allocator over `[0, size)`.
#[derive(Debug)]
struct Allocator {
    size: u64,
    /// Free blocks: start -> length; never two adjacent ones.
    free: BTreeMap<u64, u64>,
    /// Live blocks by start.
    live: BTreeMap<u64, Block>,
    /// Starts of blocks freed and not reused since (to name a double free as such).
    freed: BTreeSet<u64>,
    /// Bytes reserved by live blocks.
    used: u64,
}

impl Allocator {
    fn new(size: u64) -> Allocator {
        let mut free = BTreeMap::new();
        free.insert(0, size);
        Allocator { size, free, live: BTreeMap::new(), freed: BTreeSet::new(), used: 0 }
    }

    fn largest_free(&self) -> u64 {
        self.free.values().copied().max().unwrap_or(0)
    }

    fn alloc(&mut self, nbytes: u64) -> Result<u64> {
        if nbytes == 0 {
            return Err(Error::invalid("device malloc of 0 bytes; ask for at least 1 byte"));
        }
        let Some(size) = nbytes.checked_next_multiple_of(DEVICE_ALIGN).filter(|&s| s <= self.size) else {
            return Err(Error::invalid(format!(
                "out of device memory: {nbytes} bytes were requested but the chip has only {} bytes of memory",
                self.size
            )));
        };
        let Some((&start, &len)) = self.free.iter().find(|&(_, &len)| len >= size) else {
            return Err(Error::new(
                ErrorKind::InvalidState,
                format!(
                    "out of device memory: cannot allocate {nbytes} bytes ({size} with alignment); the chip has {} bytes, {} in use, largest free block {} bytes",
                    self.size,
                    self.used,
                    self.largest_free()
                ),
            ));
        };
        self.free.remove(&start);
        if len > size {
            self.free.insert(start + size, len - size);
        }
        self.live.insert(start, Block { size, requested: nbytes, fenced: false });
        let stale: Vec<u64> = self.freed.range(start..start + size).copied().collect();
        for s in stale {
            self.freed.remove(&s);
        }
        self.used += size;
        Ok(start)
    }

    /// The live block containing `ptr` (its start and itself).
    fn block_at(&self, ptr: u64) -> Option<(u64, Block)> {
        let (&start, &block) = self.live.range(..=ptr).next_back()?;
        (ptr < start + block.size).then_some((start, block))
    }

    fn free(&mut self, ptr: u64) -> Result<()> {
        let Some(block) = self.live.get(&ptr).copied() else {
            let why = if let Some((start, b)) = self.block_at(ptr) {
                format!(
                    "it points inside the allocation at {start:#x} ({} bytes); free the start of an allocation",
                    b.requested
                )
            } else if self.freed.contains(&ptr) {
                "double free: that allocation was already freed".to_string()
            } else {
                "no live allocation starts there (never allocated, or already freed)".to_string()
            };
            return Err(Error::invalid(format!("device free of {ptr:#x}: {why}")));
        };
        self.live.remove(&ptr);
        self.used -= block.size;
        self.freed.insert(ptr);
        // Coalesce with the free neighbours.
        let mut start = ptr;
        let mut len = block.size;
        if let Some((&prev, &plen)) = self.free.range(..ptr).next_back()
            && prev + plen == ptr
        {
            self.free.remove(&prev);
            start = prev;
            len += plen;
        }
        if let Some(&nlen) = self.free.get(&(ptr + block.size)) {
            self.free.remove(&(ptr + block.size));
            len += nlen;
        }
        self.free.insert(start, len);
        Ok(())
    }

    /// True when `[ptr, ptr + len)` lies inside one allocation as requested. An empty range is
    /// live when `ptr` lies in `[start, start + requested]` of a live allocation.
    fn is_live(&self, ptr: u64, len: u64) -> bool {
        self.live_block(ptr, len).is_some()
    }

    /// The live block `[ptr, ptr + len)` lies inside (as requested).
    fn live_block(&self, ptr: u64, len: u64) -> Option<Block> {
        let (&start, block) = self.live.range(..=ptr).next_back()?;
        let end = start + block.requested;
        (ptr <= end && len <= end - ptr).then_some(*block)
    }

    /// Whether any fenced block overlaps `[start, end)`.
    fn touches_fenced(&self, start: u64, end: u64) -> bool {
        let first = self.live.range(..=start).next_back().map_or(start, |(&s, _)| s);
        self.live.range(first..end).any(|(&s, b)| b.fenced && s + b.size > start)
    }
}

/// The device memory of one simulated chip (see the [module docs](self)).
///
/// Shared (`Arc`) between the chip and its core threads; every method takes `&self`.
pub(crate) struct Arena {
    region: SharedRegion,
    size: u64,
    alloc: Mutex<Allocator>,
    /// Held shared by every running kernel, exclusively by every copy of an unfenced block
    /// (rule A3) and by fencing (A6).
    gate: RwLock<()>,
    /// Held shared by every copy of a fenced block, exclusively by unfencing (rule A6).
    staging: RwLock<()>,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = self.lock();
        f.debug_struct("Arena")
            .field("size", &self.size)
            .field("used", &a.used)
            .field("live", &a.live.len())
            .finish()
    }
}

impl Arena {
    /// Maps `size` bytes of device memory, backed on first touch.
    ///
    /// Zero bytes, or more than the address space holds, is an
    /// [`ErrorKind::InvalidArgument`] error; a refused mapping an [`ErrorKind::Os`] error.
    pub(crate) fn new(size: u64) -> Result<Arena> {
        if size == 0 {
            return Err(Error::invalid("chip memory size must be at least 1 byte"));
        }
        let len = usize::try_from(size).ok().filter(|&l| l <= isize::MAX as usize).ok_or_else(|| {
            Error::invalid(format!("chip memory size {size} does not fit this address space"))
        })?;
        let region = SharedRegion::new(len, true).map_err(|e| e.context("mapping chip device memory"))?;
        Ok(Arena {
            region,
            size,
            alloc: Mutex::new(Allocator::new(size)),
            gate: RwLock::new(()),
            staging: RwLock::new(()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Allocator> {
        // No allocator method panics while holding the lock, so a poisoned lock (a panic
        // elsewhere in the holder) never hides a half-done update.
        sync::lock(&self.alloc)
    }

    /// The arena's size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Held by a kernel for as long as it runs, taken before its views are made: copies of
    /// unfenced blocks and fencing wait for it (rules A3, A6).
    pub(crate) fn kernel_gate(&self) -> RwLockReadGuard<'_, ()> {
        sync::read(&self.gate)
    }

    /// Bytes reserved by live allocations (rounded to [`DEVICE_ALIGN`]).
    pub(crate) fn used(&self) -> u64 {
        self.lock().used
    }

    /// Allocates `nbytes` (first fit, [`DEVICE_ALIGN`]-aligned); returns the device offset.
    pub(crate) fn malloc(&self, nbytes: u64) -> Result<u64> {
        self.lock().alloc(nbytes)
    }

    /// Frees the allocation starting at `ptr`; unknown pointers, interior pointers and double
    /// frees are [`ErrorKind::InvalidArgument`] errors that say which.
    pub(crate) fn free(&self, ptr: u64) -> Result<()> {
        self.lock().free(ptr)
    }

    /// True when `[ptr, ptr + len)` lies inside one live allocation.
    pub(crate) fn is_live(&self, ptr: u64, len: u64) -> bool {
        self.lock().is_live(ptr, len)
    }

    /// Fences the live block starting at `ptr` (rule A6): waits for every running kernel, then
    /// no kernel view may reach into it until [`Arena::unfence`]. An error when no live block
    /// starts at `ptr`.
    pub(crate) fn fence(&self, ptr: u64) -> Result<()> {
        let _exclusive = sync::write(&self.gate);
        self.set_fence(ptr, true)
    }

    /// Fences the block at `ptr` that the caller has just allocated, without waiting for
    /// running kernels (rule A6): no kernel view reaches into a block nobody held a moment ago
    /// (views are made only of live blocks the runtime checked, and a block is freed only once
    /// no task uses it).
    pub(crate) fn fence_new(&self, ptr: u64) -> Result<()> {
        self.set_fence(ptr, true)
    }

    /// Lifts the fence of the block at `ptr` (rule A6): waits for every copy into a fenced
    /// block, then kernels may see it.
    pub(crate) fn unfence(&self, ptr: u64) -> Result<()> {
        let _exclusive = sync::write(&self.staging);
        self.set_fence(ptr, false)
    }

    fn set_fence(&self, ptr: u64, fenced: bool) -> Result<()> {
        let mut a = self.lock();
        let Some(block) = a.live.get_mut(&ptr) else {
            return Err(Error::invalid(format!(
                "fencing device block {ptr:#x}: no live allocation starts there"
            )));
        };
        block.fenced = fenced;
        Ok(())
    }

    /// Whether the live block holding `[ptr, ptr + len)` is fenced (`None`: not live).
    fn fenced_at(&self, ptr: u64, len: u64) -> Option<bool> {
        self.lock().live_block(ptr, len).map(|b| b.fenced)
    }

    /// The gate a copy of `[ptr, ptr + len)` holds (rules A3, A6), or the not-live error.
    fn copy_gate(&self, what: &str, ptr: u64, len: u64) -> Result<CopyGate<'_>> {
        match self.fenced_at(ptr, len) {
            None => Err(self.not_live(what, ptr, len)),
            Some(true) => Ok(CopyGate::Fenced(sync::read(&self.staging))),
            Some(false) => Ok(CopyGate::Exclusive(sync::write(&self.gate))),
        }
    }

    fn not_live(&self, what: &str, ptr: u64, len: u64) -> Error {
        Error::invalid(format!(
            "{what}: device range {ptr:#x}..+{len} does not lie inside one live allocation (of this chip's {} bytes)",
            self.size
        ))
    }

    /// Copies `src` into device memory at `dst`, which must be a live range (rule A2).
    pub(crate) fn copy_to(&self, dst: u64, src: &[u8]) -> Result<()> {
        let len = src.len() as u64;
        let _gate = self.copy_gate("copy to device", dst, len)?;
        // SAFETY: rule A2 — `dst..dst + len` lies in a live allocation, hence in the mapping
        // (A1); rules A3, A6 — no kernel runs during a copy of an unfenced block, and none sees
        // a fenced one; rule A4 — `src` is a slice of other
        // memory, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.region.as_ptr().add(dst as usize), src.len());
        }
        Ok(())
    }

    /// Copies device memory at `src`, which must be a live range, into `dst` (rule A2).
    pub(crate) fn copy_from(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        let len = dst.len() as u64;
        let _gate = self.copy_gate("copy from device", src, len)?;
        // SAFETY: rule A2 — the source range lies in a live allocation inside the mapping (A1);
        // rules A3, A6 — no kernel writes it during the copy; rule A4 — `dst` is other memory.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.region.as_ptr().add(src as usize),
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
        Ok(())
    }

    /// Tensor `view` of the device buffer at `ptr`, as a kernel sees it; an error if the view
    /// does not lie inside the arena.
    ///
    /// Whether the buffer is a live allocation is the caller's check (the chip runtime checks
    /// it before it dispatches); the bounds checked here keep every access inside the mapping,
    /// and a view into a fenced block is refused (rule A6). Call it only while holding the
    /// [kernel gate](Arena::kernel_gate).
    pub(crate) fn tensor(&self, ptr: u64, view: TensorView, access: Access) -> Result<MappedTensor<'_>> {
        let (start, end) = view.byte_range();
        if ptr.checked_add(end).is_none_or(|e| e > self.size) {
            return Err(Error::invalid(format!(
                "device view {view:?} at {ptr:#x} ends past the chip's {} bytes",
                self.size
            )));
        }
        if end > start && self.lock().touches_fenced(ptr + start, ptr + end) {
            return Err(Error::invalid(format!(
                "device view {view:?} at {ptr:#x} reaches into another run's staging buffer"
            )));
        }
        // SAFETY: rule A1 — the view's bytes lie inside the mapping (checked above), which lives
        // as long as the `&self` the tensor borrows; rules A3, A6 — nobody else writes them while
        // the kernel runs (the chip engine orders kernels by their tags, no copy of an unfenced
        // block runs meanwhile, and the view reaches into no fenced block).
        Ok(unsafe { MappedTensor::new(self.region.as_ptr().wrapping_add(ptr as usize), view, access) })
    }

    /// Checks that a device buffer at `ptr` holds `dev_view`'s byte range and that the two views
    /// have the same layout.
    fn device_view(&self, what: &str, host: &TensorView, ptr: u64, dev_view: &TensorView) -> Result<()> {
        if host.shape() != dev_view.shape()
            || host.strides() != dev_view.strides()
            || host.dtype() != dev_view.dtype()
        {
            return Err(Error::invalid(format!(
                "{what}: host view {host:?} and device view {dev_view:?} differ"
            )));
        }
        let (start, end) = dev_view.byte_range();
        let at = ptr.checked_add(start).ok_or_else(|| self.not_live(what, ptr, end))?;
        if !self.is_live(at, end - start) {
            return Err(self.not_live(what, at, end - start));
        }
        Ok(())
    }

    /// Copies the elements of host tensor `host` into the device buffer at `ptr`, laid out as
    /// `dev_view` (same shape, strides and type; only the byte offset may differ), by calling
    /// `copy(device pointer, host bytes)` for each contiguous run of the view's elements (the
    /// backend's `copy_to_device`); only the view's elements, not the gaps of a strided view.
    /// Only the element bytes from `from` (an offset into the view's elements in order, gaps
    /// not counted) up to `budget` of them: `(0, u64::MAX)` copies the whole view, a smaller
    /// window a piece of it, cutting a contiguous run where the window does (a copy made in
    /// pieces, between which the caller does other work). Returns the bytes copied (fewer than
    /// `budget` only at the view's end). Stops at the first error.
    pub(crate) fn copy_view_in_part(
        &self,
        host: &MappedTensor<'_>,
        ptr: u64,
        dev_view: &TensorView,
        (from, budget): (u64, u64),
        mut copy: impl FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<u64> {
        self.device_view("copy-in of a host tensor", host.view(), ptr, dev_view)?;
        let dev = ptr + dev_view.byte_offset();
        let src = host.ptr();
        let end = from.saturating_add(budget);
        let (mut pos, mut copied) = (0u64, 0u64);
        let mut result = Ok(());
        host.view().for_each_run(|offset, len| {
            let (lo, hi) = (pos.max(from), (pos + len as u64).min(end));
            if result.is_ok() && lo < hi {
                let (skip, n) = ((lo - pos) as usize, (hi - lo) as usize);
                // SAFETY: rule A5 — `src + offset + skip..+n` lies inside the run
                // `src + offset..+len` of the host view's byte range, mapped while `host` lives
                // and written by nobody else meanwhile (H1); the slice lives only for this call
                // of `copy`, which cannot keep it.
                let bytes = unsafe { std::slice::from_raw_parts(src.add(offset + skip), n) };
                result = copy(dev + (offset + skip) as u64, bytes);
                copied += n as u64;
            }
            pos += len as u64;
        });
        result.map(|()| copied)
    }

    /// Copies the elements of the device view at `ptr` (laid out as `dev_view`) back into host
    /// tensor `host` by calling `copy(device pointer, host bytes)` for each contiguous run (the
    /// backend's `copy_from_device`); the reverse of [`Arena::copy_view_in_part`]. Bytes of the
    /// host buffer outside the view's elements are not touched.
    pub(crate) fn copy_view_out(
        &self,
        ptr: u64,
        dev_view: &TensorView,
        host: &MappedTensor<'_>,
        mut copy: impl FnMut(u64, &mut [u8]) -> Result<()>,
    ) -> Result<()> {
        self.device_view("copy-back of a host tensor", host.view(), ptr, dev_view)?;
        let dev = ptr + dev_view.byte_offset();
        let dst = host.ptr();
        let mut result = Ok(());
        host.view().for_each_run(|offset, len| {
            if result.is_ok() {
                // SAFETY: rule A5 — `dst + offset..+len` lies in the host view's byte range,
                // mapped while `host` lives (H1), and the running task alone may touch those bytes (it
                // holds write access), so this exclusive slice aliases nothing; it lives only
                // for this call of `copy`.
                let bytes = unsafe { std::slice::from_raw_parts_mut(dst.add(offset), len) };
                result = copy(dev + offset as u64, bytes);
            }
        });
        result
    }
}

/// The gate one copy holds (rules A3, A6).
enum CopyGate<'a> {
    Exclusive(#[expect(dead_code, reason = "held, not read")] std::sync::RwLockWriteGuard<'a, ()>),
    Fenced(#[expect(dead_code, reason = "held, not read")] RwLockReadGuard<'a, ()>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::dtype::DataType;
    use crate::sys::mem::as_bytes_mut;

    /// The whole view, as a window of `copy_view_in_part`.
    const WHOLE: (u64, u64) = (0, u64::MAX);

    #[test]
    fn fenced_blocks_copy_beside_a_running_kernel_and_refuse_kernel_views() {
        let a = Arena::new(4096).unwrap();
        let staging = a.malloc(256).unwrap();
        let other = a.malloc(256).unwrap();
        a.fence(staging).unwrap();
        let view = TensorView::new(0, &[64], None, DataType::Float32).unwrap();
        let running = a.kernel_gate();
        assert!(a.tensor(other, view, Access::ReadWrite).is_ok());
        let err = a.tensor(staging, view, Access::Read).unwrap_err();
        assert!(err.message().contains("staging"), "{err}");
        let inside = TensorView::new(64, &[4], None, DataType::Float32).unwrap();
        assert!(a.tensor(staging, inside, Access::Read).is_err(), "an interior view too");
        // A copy into the fenced block does not wait for the running kernel (this would
        // deadlock otherwise: the gate is held on this thread).
        a.copy_to(staging + 8, &[1, 2, 3]).unwrap();
        let mut back = [0u8; 3];
        a.copy_from(staging + 8, &mut back).unwrap();
        assert_eq!(back, [1, 2, 3]);
        drop(running);
        a.unfence(staging).unwrap();
        let running = a.kernel_gate();
        assert!(a.tensor(staging, view, Access::Read).is_ok(), "unfenced: kernels may see it");
        drop(running);
        assert!(a.fence(other + 64).is_err(), "only a block's start can be fenced");
    }

    #[test]
    fn alloc_is_first_fit_and_aligned() {
        let a = Arena::new(1024).unwrap();
        let p0 = a.malloc(1).unwrap();
        let p1 = a.malloc(65).unwrap();
        let p2 = a.malloc(64).unwrap();
        assert_eq!((p0, p1, p2), (0, 64, 192));
        assert!([p0, p1, p2].iter().all(|p| p % DEVICE_ALIGN == 0));
        assert_eq!(a.used(), 256);
        // A hole at 64..192 is reused first for a request that fits it.
        a.free(p1).unwrap();
        assert_eq!(a.malloc(100).unwrap(), 64);
        assert_eq!(a.malloc(10).unwrap(), 256);
    }

    #[test]
    fn frees_coalesce_with_both_neighbours() {
        let a = Arena::new(4 * 64).unwrap();
        let p: Vec<u64> = (0..4).map(|_| a.malloc(64).unwrap()).collect();
        assert!(a.malloc(1).is_err(), "full");
        a.free(p[0]).unwrap();
        a.free(p[2]).unwrap();
        // Two separate 64-byte holes: 128 bytes do not fit.
        assert!(a.malloc(128).is_err());
        a.free(p[1]).unwrap(); // merges 0..64, 64..128 and 128..192
        assert_eq!(a.malloc(192).unwrap(), 0);
        a.free(0).unwrap();
        a.free(p[3]).unwrap();
        assert_eq!(a.used(), 0);
        assert_eq!(a.malloc(256).unwrap(), 0, "everything merged back into one block");
        let al = a.lock();
        assert_eq!(al.free.len(), 0);
    }

    #[test]
    fn out_of_memory_names_the_size_and_the_request() {
        let a = Arena::new(1000).unwrap();
        let err = a.malloc(2000).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.message().contains("2000") && err.message().contains("1000"), "{err}");
        // 1000 bytes cannot hold 1000 rounded up to 1024.
        assert!(a.malloc(1000).is_err());
        let _p = a.malloc(512).unwrap();
        let err = a.malloc(512).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidState);
        assert!(err.message().contains("out of device memory"), "{err}");
        assert!(err.message().contains("512 bytes") && err.message().contains("1000 bytes"), "{err}");
        assert!(a.malloc(0).unwrap_err().message().contains("0 bytes"));
        assert!(a.malloc(u64::MAX).is_err(), "rounding must not overflow");
        assert!(Arena::new(0).is_err());
    }

    #[test]
    fn bad_frees_say_what_is_wrong() {
        let a = Arena::new(4096).unwrap();
        let p = a.malloc(128).unwrap();
        let inner = a.free(p + 64).unwrap_err();
        assert!(inner.message().contains("inside the allocation"), "{inner}");
        a.free(p).unwrap();
        let double = a.free(p).unwrap_err();
        assert_eq!(double.kind(), ErrorKind::InvalidArgument);
        assert!(double.message().contains("double free"), "{double}");
        let never = a.free(2048).unwrap_err();
        assert!(never.message().contains("no live allocation"), "{never}");
        // Reusing the offset makes it live again; freeing it then is fine.
        assert_eq!(a.malloc(8).unwrap(), p);
        a.free(p).unwrap();
    }

    #[test]
    fn liveness_is_the_requested_range_of_one_allocation() {
        let a = Arena::new(4096).unwrap();
        let p = a.malloc(100).unwrap();
        let q = a.malloc(100).unwrap();
        assert!(a.is_live(p, 100));
        assert!(a.is_live(p + 99, 1));
        assert!(a.is_live(p + 100, 0));
        assert!(!a.is_live(p, 101), "past the request (into the alignment slack)");
        assert!(!a.is_live(p + 50, 100), "across two allocations");
        assert!(a.is_live(q, 100));
        assert!(!a.is_live(3000, 1), "never allocated");
        assert!(!a.is_live(p, u64::MAX));
        a.free(p).unwrap();
        assert!(!a.is_live(p, 1), "freed");
    }

    #[test]
    fn copies_are_bounds_checked() {
        let a = Arena::new(4096).unwrap();
        let p = a.malloc(16).unwrap();
        a.copy_to(p, &[7u8; 16]).unwrap();
        let mut back = [0u8; 16];
        a.copy_from(p, &mut back).unwrap();
        assert_eq!(back, [7; 16]);
        let err = a.copy_to(p + 8, &[0u8; 9]).unwrap_err();
        assert!(err.message().contains("live allocation"), "{err}");
        assert!(a.copy_from(p, &mut [0u8; 17]).is_err());
        assert!(a.copy_to(1024, &[1]).is_err(), "not allocated");
        a.free(p).unwrap();
        assert!(a.copy_from(p, &mut [0u8; 1]).is_err(), "freed");
        // Device memory is not cleared between allocations (as on a real device).
        let q = a.malloc(8).unwrap();
        let mut z = [1u8; 8];
        a.copy_from(q, &mut z).unwrap();
        assert_eq!(z, [7, 7, 7, 7, 7, 7, 7, 7], "reused bytes keep their old contents");
    }

    #[test]
    fn strided_views_copy_only_their_elements() {
        let a = Arena::new(4096).unwrap();
        // Host: 12 u32 as a 3x4 matrix; the view is column 1 (stride 4 elements), 3 elements.
        let mut host: Vec<u32> = (0..12).collect();
        let view = TensorView::new(4, &[3], Some(&[4]), DataType::Uint32).unwrap();
        let m = MappedTensor::from_slice(as_bytes_mut(&mut host), view, Access::ReadWrite).unwrap();
        let (start, end) = view.byte_range();
        let dev_view = TensorView::new(0, &[3], Some(&[4]), DataType::Uint32).unwrap();
        let p = a.malloc(end - start).unwrap();
        a.copy_to(p, &[0xff; 36][..(end - start) as usize]).unwrap();
        a.copy_view_in_part(&m, p, &dev_view, WHOLE, |d, s| a.copy_to(d, s)).map(|_| ()).unwrap();
        let mut dev = vec![0u8; (end - start) as usize];
        a.copy_from(p, &mut dev).unwrap();
        let words: Vec<u32> = dev.chunks(4).map(|c| u32::from_ne_bytes(c.try_into().unwrap())).collect();
        assert_eq!(words, vec![1, u32::MAX, u32::MAX, u32::MAX, 5, u32::MAX, u32::MAX, u32::MAX, 9]);
        // Write new values on the device and copy back: only elements 1, 5, 9 change.
        let mut upd = words.clone();
        upd[0] = 100;
        upd[4] = 500;
        upd[8] = 900;
        upd[1] = 4242; // a gap: must not reach the host
        let bytes: Vec<u8> = upd.iter().flat_map(|w| w.to_ne_bytes()).collect();
        a.copy_to(p, &bytes).unwrap();
        a.copy_view_out(p, &dev_view, &m, |d, s| a.copy_from(d, s)).unwrap();
        assert_eq!(host, vec![0, 100, 2, 3, 4, 500, 6, 7, 8, 900, 10, 11]);
    }

    #[test]
    fn a_view_copied_in_pieces_lands_as_if_copied_whole() {
        // A 3x5 window of rows 6 u16 apart (runs of 10 bytes, gaps of 2), copied in pieces of
        // every size from 1 byte (cutting elements and runs) to past the whole.
        let view = TensorView::new(2, &[3, 5], Some(&[6, 1]), DataType::Uint16).unwrap();
        let (start, end) = view.byte_range();
        let dev_view = TensorView::new(0, &[3, 5], Some(&[6, 1]), DataType::Uint16).unwrap();
        let mut host: Vec<u16> = (0..18).map(|i| 1000 + i).collect();
        let m = MappedTensor::from_slice(as_bytes_mut(&mut host), view, Access::Read).unwrap();
        let a = Arena::new(4096).unwrap();
        let (whole, piecewise) = (a.malloc(end - start).unwrap(), a.malloc(end - start).unwrap());
        let read = |p: u64| {
            let mut dev = vec![0u8; (end - start) as usize];
            a.copy_from(p, &mut dev).unwrap();
            dev
        };
        a.copy_to(whole, &vec![0xee; (end - start) as usize]).unwrap();
        a.copy_view_in_part(&m, whole, &dev_view, WHOLE, |d, s| a.copy_to(d, s)).map(|_| ()).unwrap();
        let elements = 3 * 5 * 2;
        for piece in 1..=elements + 3 {
            a.copy_to(piecewise, &vec![0xee; (end - start) as usize]).unwrap();
            let (mut from, mut calls) = (0, 0);
            loop {
                let n = a
                    .copy_view_in_part(&m, piecewise, &dev_view, (from, piece), |d, s| a.copy_to(d, s))
                    .unwrap();
                assert!(n <= piece, "at most the budget");
                calls += 1;
                from += n;
                if n < piece {
                    break;
                }
            }
            assert_eq!(from, elements, "every element byte once, in pieces of {piece}");
            assert_eq!(calls, elements / piece + 1, "pieces of {piece}");
            assert_eq!(read(piecewise), read(whole), "pieces of {piece}");
        }
    }

    /// Element runs (a transposed view) in pieces of every size; `from` at and past the end,
    /// a budget of 0 and `from + budget` past `u64::MAX` copy nothing.
    #[test]
    fn a_transposed_view_in_pieces_and_empty_windows() {
        let view = TensorView::new(4, &[4, 3], Some(&[1, 4]), DataType::Uint16).unwrap();
        let dev_view = TensorView::new(0, &[4, 3], Some(&[1, 4]), DataType::Uint16).unwrap();
        let (s, e) = dev_view.byte_range();
        let mut host: Vec<u16> = (0..16).map(|i| 1000 + i).collect();
        let m = MappedTensor::from_slice(as_bytes_mut(&mut host), view, Access::Read).unwrap();
        let a = Arena::new(4096).unwrap();
        let (whole, part) = (a.malloc(e - s).unwrap(), a.malloc(e - s).unwrap());
        let read = |p: u64| {
            let mut d = vec![0u8; (e - s) as usize];
            a.copy_from(p, &mut d).unwrap();
            d
        };
        a.copy_to(whole, &vec![0xee; (e - s) as usize]).unwrap();
        a.copy_view_in_part(&m, whole, &dev_view, WHOLE, |d, src| a.copy_to(d, src)).map(|_| ()).unwrap();
        let elements = 12 * 2;
        for piece in 1..=elements + 2 {
            a.copy_to(part, &vec![0xee; (e - s) as usize]).unwrap();
            let mut from = 0;
            loop {
                let n = a
                    .copy_view_in_part(&m, part, &dev_view, (from, piece), |d, src| a.copy_to(d, src))
                    .unwrap();
                from += n;
                if n < piece {
                    break;
                }
            }
            assert_eq!(from, elements);
            assert_eq!(read(part), read(whole), "pieces of {piece}");
        }
        let mut calls = 0;
        let mut none = |_: u64, _: &[u8]| {
            calls += 1;
            Ok(())
        };
        assert_eq!(a.copy_view_in_part(&m, part, &dev_view, (elements, 10), &mut none).unwrap(), 0);
        assert_eq!(a.copy_view_in_part(&m, part, &dev_view, (elements + 100, 10), &mut none).unwrap(), 0);
        assert_eq!(a.copy_view_in_part(&m, part, &dev_view, (3, 0), &mut none).unwrap(), 0);
        assert_eq!(a.copy_view_in_part(&m, part, &dev_view, (u64::MAX - 1, u64::MAX), &mut none).unwrap(), 0);
        assert_eq!(
            a.copy_view_in_part(&m, part, &dev_view, (5, u64::MAX), |_, _| Ok(())).unwrap(),
            elements - 5
        );
        assert_eq!(calls, 0);
    }

    #[test]
    fn view_copies_check_layout_and_bounds() {
        let a = Arena::new(4096).unwrap();
        let mut host = vec![0f32; 8];
        let view = TensorView::new(0, &[8], None, DataType::Float32).unwrap();
        let m = MappedTensor::from_slice(as_bytes_mut(&mut host), view, Access::Read).unwrap();
        let small = a.malloc(16).unwrap();
        assert!(
            a.copy_view_in_part(&m, small, &view, WHOLE, |d, s| a.copy_to(d, s)).map(|_| ()).is_err(),
            "32 bytes into a 16-byte allocation"
        );
        let p = a.malloc(32).unwrap();
        let other = TensorView::new(0, &[4, 2], None, DataType::Float32).unwrap();
        assert!(
            a.copy_view_in_part(&m, p, &other, WHOLE, |d, s| a.copy_to(d, s)).map(|_| ()).is_err(),
            "different shape"
        );
        a.copy_view_in_part(&m, p, &view, WHOLE, |d, s| a.copy_to(d, s)).map(|_| ()).unwrap();
    }

    #[test]
    fn runs_of_a_row_strided_matrix() {
        // A 2x3 window of a 4x5 u8 matrix starting at (1, 1): rows of 3 bytes, 5 apart.
        let v = TensorView::new(6, &[2, 3], Some(&[5, 1]), DataType::Uint8).unwrap();
        let mut runs = Vec::new();
        v.for_each_run(|o, l| runs.push((o, l)));
        assert_eq!(runs, vec![(0, 3), (5, 3)]);
        let c = TensorView::new(0, &[2, 3], None, DataType::Int16).unwrap();
        let mut one = Vec::new();
        c.for_each_run(|o, l| one.push((o, l)));
        assert_eq!(one, vec![(0, 12)]);
    }
}
