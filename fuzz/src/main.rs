//! The long run of the decoder fuzz harness (the short run is the test `tests/hostile_bytes.rs`):
//! every decoder of `simpler` that reads bytes another process wrote (the wire codec, callable
//! and chip descriptors, mailbox frames and their error tails, the remote session's bodies) on
//! generated and mutated inputs, each under `catch_unwind`, with this binary's allocator
//! counting every request. Stops at the first finding (a panic, an unnamed refusal, a value that
//! does not survive a re-encode, an allocation larger than the input justifies) and exits with
//! status 1.
//!
//! `cargo run -p simpler-fuzz --profile fuzz -- 10000000` runs ten million inputs, split evenly
//! over the decoders (the default is one million); the `fuzz` profile is the release build with
//! overflow checks and debug assertions on. `FUZZ_SEED` picks another seed. Figures, one line
//! each (`figure <name> <value> <unit>`, as the benchmarks print them): `fuzz_inputs` (all
//! decoders), `fuzz_inputs_<decoder>`, `fuzz_seconds`.

#![allow(clippy::print_stdout)]

use std::time::Instant;

use simpler_fuzz::{Counting, Harness, Target};

#[global_allocator]
static ALLOC: Counting = Counting;

/// Prints one figure line.
fn figure(name: &str, value: f64, unit: &str) {
    println!("figure {name} {value:.3} {unit}");
}

fn main() {
    // The first numeric argument is the input count.
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
        match harness.run(target, seed, n, Some(&Counting::probe)) {
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
