//! The long run of the decoder fuzz harness (`simpler::fuzzing`; the short run is the test
//! `tests/hostile_bytes.rs`): every decoder that reads bytes another process wrote (the wire
//! codec, callable and chip descriptors, mailbox frames and their error tails) on generated and
//! mutated inputs, each under `catch_unwind`, with this binary's allocator counting every
//! request. Stops at the first finding (a panic, an unnamed refusal, a value that does not
//! survive a re-encode, an allocation larger than the input justifies) and exits with status 1.
//!
//! `cargo bench -p simpler-benches --bench fuzz_decoders --profile fuzz -- 10000000` runs ten
//! million inputs, split evenly over the decoders (the default is one million); the `fuzz`
//! profile is the release build with overflow checks and debug assertions on. `FUZZ_SEED`
//! picks another seed. Figures: `fuzz_inputs` (all decoders), `fuzz_inputs_<decoder>`,
//! `fuzz_seconds`.

#![expect(unsafe_code, reason = "a counting global allocator that forwards every call to `System`")]
#![allow(clippy::print_stdout)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Instant;

use common::figure;
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

fn main() {
    // `cargo bench` adds `--bench`; the first numeric argument is the input count.
    let total: u64 = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(1_000_000);
    let seed: u64 = std::env::var("FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let mut harness = Harness::new().expect("a private mailbox");
    let targets = Target::ALL;
    let each = total / targets.len() as u64;
    let start = Instant::now();
    let mut done = 0;
    for (i, target) in targets.into_iter().enumerate() {
        let n = if i == 0 { total - each * (targets.len() as u64 - 1) } else { each };
        let t0 = Instant::now();
        match harness.run(target, seed, n, Some(&probe)) {
            Ok(r) => {
                let secs = t0.elapsed().as_secs_f64();
                println!(
                    "{}: {} inputs ({} accepted, {} refused) in {secs:.1} s, seed {seed}",
                    target.name(),
                    r.inputs,
                    r.accepted,
                    r.rejected
                );
                figure(&format!("fuzz_inputs_{}", target.name()), r.inputs as f64, "inputs");
                done += r.inputs;
            }
            Err(finding) => {
                println!("FINDING {finding}");
                std::process::exit(1);
            }
        }
    }
    figure("fuzz_inputs", done as f64, "inputs");
    figure("fuzz_seconds", start.elapsed().as_secs_f64(), "s");
}
