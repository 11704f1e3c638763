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
//! * **A5 (host views).** [`copy_runs_in`] and [`copy_runs_out`] take host memory
//!   as a [`MappedTensor`], whose construction guarantees rule H1 of `data::host_args`: its
//!   view's bytes lie inside memory mapped in this process while it lives, and no other thread
//!   writes those bytes meanwhile (they belong to the running task). They lend those bytes (or
//!   a buffer of their own that a strided view's elements are gathered into or scattered
//!   from) to the backend's copy functions, for the length of one call each.
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
    reason = "raw copies into and out of the device mapping, and kernel views of it; rules A1-A6"
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
}

/// Copies the elements of host tensor `host` to the device starting at device pointer `dev`,
/// packed: in row-major order of the view's shape, with no gaps (the device view is contiguous,
/// of the host view's shape and type, which the caller checked, along with the device range),
/// by calling `copy(device pointer, host bytes)` (the backend's `copy_to_device`) once: with
/// the view's bytes in place for a contiguous view, or with a host buffer the elements of a
/// strided view are gathered into (one backend call, not one per row). Only the element bytes
/// from `from` (an offset into the view's elements in order, gaps not counted) up to `budget`
/// of them: `(0, u64::MAX)` copies the whole view, a smaller window a piece of it, cutting a
/// contiguous run where the window does (a copy made in pieces, between which the caller does
/// other work). Returns the bytes copied (fewer than `budget` only at the view's end).
pub(crate) fn copy_runs_in(
    host: &MappedTensor<'_>,
    dev: u64,
    (from, budget): (u64, u64),
    copy: impl FnOnce(u64, &[u8]) -> Result<()>,
) -> Result<u64> {
    let src = host.ptr();
    let total = host.view().num_elements() * host.view().dtype().size() as u64;
    let (lo, hi) = (from.min(total), from.saturating_add(budget).min(total));
    if lo >= hi {
        return Ok(0);
    }
    let n = (hi - lo) as usize;
    if host.view().is_contiguous() {
        // SAFETY: rule A5 — `src + lo..+n` lies inside the contiguous host view's byte range,
        // mapped while `host` lives and written by nobody else meanwhile (H1); the slice lives
        // only for this call of `copy`, which cannot keep it.
        let bytes = unsafe { std::slice::from_raw_parts(src.add(lo as usize), n) };
        return copy(dev + lo, bytes).map(|()| n as u64);
    }
    let mut gathered = Vec::with_capacity(n);
    let mut pos = 0u64;
    host.view().for_each_run(|offset, len| {
        let (a, b) = (pos.max(lo), (pos + len as u64).min(hi));
        if a < b {
            // SAFETY: rule A5 — `src + offset + (a - pos)..+(b - a)` lies inside the run
            // `src + offset..+len` of the host view's byte range, mapped while `host` lives
            // and written by nobody else meanwhile (H1); the slice is copied from at once.
            let run =
                unsafe { std::slice::from_raw_parts(src.add(offset + (a - pos) as usize), (b - a) as usize) };
            gathered.extend_from_slice(run);
        }
        pos += len as u64;
    });
    copy(dev + lo, &gathered).map(|()| n as u64)
}

/// Copies the packed elements at device pointer `dev` back into host tensor `host`'s view by
/// calling `copy(device pointer, host bytes)` (the backend's `copy_from_device`) once: into the
/// view's bytes in place for a contiguous view, or into a host buffer scattered into the
/// elements of a strided view; the reverse of [`copy_runs_in`]. Bytes of the host buffer
/// outside the view's elements are not touched.
pub(crate) fn copy_runs_out(
    dev: u64,
    host: &MappedTensor<'_>,
    copy: impl FnOnce(u64, &mut [u8]) -> Result<()>,
) -> Result<()> {
    let dst = host.ptr();
    let total = (host.view().num_elements() * host.view().dtype().size() as u64) as usize;
    if host.view().is_contiguous() {
        // SAFETY: rule A5 — `dst..+total` is the contiguous host view's byte range, mapped while
        // `host` lives (H1), and the running task alone may touch those bytes (it holds write
        // access), so this exclusive slice aliases nothing; it lives only for this call of
        // `copy`.
        let bytes = unsafe { std::slice::from_raw_parts_mut(dst, total) };
        return copy(dev, bytes);
    }
    let mut packed = vec![0u8; total];
    copy(dev, &mut packed)?;
    let mut pos = 0usize;
    host.view().for_each_run(|offset, len| {
        // SAFETY: rule A5 — `dst + offset..+len` is a run of the host view's elements, mapped
        // while `host` lives (H1) and touched by the running task alone (it holds write
        // access); `packed[pos..pos + len]` is this function's own buffer.
        unsafe { std::ptr::copy_nonoverlapping(packed.as_ptr().add(pos), dst.add(offset), len) };
        pos += len;
    });
    Ok(())
}

/// The gate one copy holds (rules A3, A6).
enum CopyGate<'a> {
    Exclusive(#[expect(dead_code, reason = "held, not read")] std::sync::RwLockWriteGuard<'a, ()>),
    Fenced(#[expect(dead_code, reason = "held, not read")] RwLockReadGuard<'a, ()>),
}

#[cfg(test)]
mod tests;
