//! An allocation probe: a global allocator that forwards every call to `System` and counts,
//! per thread, the largest request and the bytes requested since the last read.

#![expect(unsafe_code, reason = "a global allocator that forwards every call to `System`")]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use crate::AllocStats;

/// The counting allocator. A binary that passes [`Counting::probe`] to
/// [`Harness::run`](crate::Harness::run) installs it as its global allocator:
///
/// ```
/// use simpler_fuzz::{Counting, Harness, Target};
///
/// #[global_allocator]
/// static ALLOC: Counting = Counting;
///
/// # fn main() {
/// let mut h = Harness::new().unwrap();
/// let r = h.run(Target::Args, 1, 20, Some(&Counting::probe)).unwrap();
/// assert_eq!(r.inputs, 20);
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static TOTAL: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
    let _ = TOTAL.try_with(|t| t.set(t.get().saturating_add(size)));
}

impl Counting {
    /// Reads and resets this thread's counters (all zero unless `Counting` is the global
    /// allocator).
    ///
    /// ```
    /// let _ = simpler_fuzz::Counting::probe();
    /// assert_eq!(simpler_fuzz::Counting::probe().total, 0); // nothing counted: not installed
    /// ```
    pub fn probe() -> AllocStats {
        AllocStats { largest: LARGEST.replace(0), total: TOTAL.replace(0) }
    }
}

// SAFETY: every call is forwarded to `System` with the caller's arguments unchanged; the
// counters are thread-local cells with const initializers, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded from this function's contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded from this function's contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded from this function's contract.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: forwarded from this function's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
