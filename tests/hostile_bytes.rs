//! Hostile bytes never crash a decoder: a short run of the randomized harness
//! (`simpler::fuzzing`) over every decoder that reads bytes another process wrote (the wire
//! codec, callable and chip descriptors, mailbox frames and their error tails). No panic, every
//! refusal a named error, and no allocation larger than the input justifies (counted by this
//! binary's allocator). The long run is `cargo bench -p simpler-benches --bench fuzz_decoders`.

#![expect(unsafe_code, reason = "a counting global allocator that forwards every call to `System`")]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use simpler::fuzzing::{AllocStats, Harness, Target};

/// Counts, per thread, the largest request and the bytes requested since the last read.
struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static TOTAL: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
    let _ = TOTAL.try_with(|t| t.set(t.get().saturating_add(size)));
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

#[global_allocator]
static ALLOC: Counting = Counting;

/// Reads and resets this thread's counters.
fn probe() -> AllocStats {
    AllocStats { largest: LARGEST.replace(0), total: TOTAL.replace(0) }
}

/// Inputs per decoder: a few seconds in all in a debug build.
const INPUTS: u64 = 10_000;

fn fuzz(target: Target) {
    let mut harness = Harness::new().expect("a private mailbox");
    let report = harness.run(target, 0x5EED, INPUTS, Some(&probe)).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(report.inputs, INPUTS);
    // The generator reaches both sides of every decoder.
    assert!(report.accepted > 0 && report.rejected > 0, "{report:?}");
}

#[test]
fn wire_args() {
    fuzz(Target::Args);
}

#[test]
fn wire_config() {
    fuzz(Target::Config);
}

#[test]
fn wire_desc() {
    fuzz(Target::Desc);
}

#[test]
fn callable_descriptor() {
    fuzz(Target::CallableDescriptor);
}

#[test]
fn chip_descriptor() {
    fuzz(Target::ChipDescriptor);
}

#[test]
fn mailbox_task_frame() {
    fuzz(Target::TaskFrame);
}

#[test]
fn mailbox_base_frame() {
    fuzz(Target::BaseFrame);
}

#[test]
fn remote_frame() {
    fuzz(Target::RemoteFrame);
}

#[test]
fn remote_task() {
    fuzz(Target::RemoteTask);
}

#[test]
fn remote_completion() {
    fuzz(Target::RemoteCompletion);
}
