//! A first kernel on a level-2 Worker: one simulated chip in this process, no forking. A
//! `#[callable(chip)]` function is a kernel; its typed `call(...)` runs it on the chip with
//! `Call::run`. This is how one tests a kernel alone before running it under an L3 Worker.
//!
//! Run it with `cargo run --example l2_first_kernel`.

#![allow(clippy::print_stdout)] // An example talks to its user.

use std::process::ExitCode;

use simpler::prelude::*;
use simpler::status::Level;

/// `y = a * x + y` (saxpy) on one simulated core. `x` is read (`&[f32]`), `y` is read and
/// written (`&mut [f32]`), `a` is a scalar; all three come from the signature.
#[callable(chip)]
fn saxpy(x: In<f32>, mut y: InOut<f32>, a: f32) -> Result<(), String> {
    if x.len() != y.len() {
        return Err(format!("x has {} elements, y has {}", x.len(), y.len())); // fails the task
    }
    for (yi, xi) in y.iter_mut().zip(x.iter()) {
        *yi += a * xi;
    }
    Ok(())
}

fn main() -> simpler::Result<ExitCode> {
    let mut chip = Worker::builder().level(Level::Chip).chip_memory(16 << 20).chip_cores(1).build()?;
    chip.init()?; // registers every #[callable(chip)] of this binary on the chip

    let (bx, by) = (chip.create_buffer(4 * 8)?, chip.create_buffer(4 * 8)?);
    bx.write(0, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])?;
    by.write(0, &[10.0f32; 8])?;
    let (x, mut y) = (bx.typed::<f32>(&[8])?, by.typed::<f32>(&[8])?);

    // x and y are copied into the chip's memory, the kernel runs, y (written) is copied back.
    saxpy::call(&x, &mut y, 2.0)?.run(&chip)?;
    let got = by.read::<f32>(0, 8)?;

    // A kernel's error fails its task, and the error names the callable.
    let mut short = chip.create_buffer(4 * 4)?.typed::<f32>(&[4])?;
    let failed = saxpy::call(&x, &mut short, 1.0)?.run(&chip).map_err(|e| e.to_string());

    chip.close()?;
    let want: Vec<f32> = (1..=8).map(|i| 10.0 + 2.0 * i as f32).collect();
    if got != want || !failed.as_ref().is_err_and(|e| e.contains("saxpy")) {
        eprintln!("FAILED: got {got:?}, want {want:?}; the short call gave {failed:?}");
        return Ok(ExitCode::FAILURE);
    }
    println!("saxpy on an L2 chip: {got:?}");
    if let Err(e) = &failed {
        println!("a failing kernel: {e}");
    }
    Ok(ExitCode::SUCCESS)
}
