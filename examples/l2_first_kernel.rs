//! A first kernel on a level-2 Worker: one simulated chip in this process, no forking. This is
//! how one tests a kernel alone before running it under an L3 Worker.
//!
//! Run it with `cargo run --example l2_first_kernel`.

#![allow(clippy::print_stdout)] // An example talks to its user.

use simpler::{CallConfig, ChipFn, DataType, HostArgs, HostResult, Level, TaskArgs, Worker};

/// `y[i] = a * x[i] + y[i]` (saxpy) on one simulated core; scalar 0 is `a`.
fn saxpy(args: &HostArgs<'_>) -> HostResult {
    let a = args.scalar_f32(0)?;
    let x = args.input::<f32>(0)?;
    let y = args.output::<f32>(1)?;
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
    Ok(())
}

fn main() -> simpler::Result<()> {
    let mut chip = Worker::builder().level(Level::Chip).chip_memory(16 << 20).chip_cores(1).build()?;
    let saxpy = chip.register_chip(ChipFn::kernel("saxpy", saxpy))?;
    chip.init()?;

    let x = chip.create_buffer(4 * 8)?;
    let y = chip.create_buffer(4 * 8)?;
    x.write(0, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])?;
    y.write(0, &[10.0f32; 8])?;
    let mut args = TaskArgs::new();
    args.input(&x.tensor(&[8], DataType::Float32)?)?
        .inout(&y.tensor(&[8], DataType::Float32)?)?
        .scalar_f32(2.0);
    // x and y are copied into the chip's memory, the kernel runs, y is copied back.
    chip.run_callable(&saxpy, args, CallConfig::default())?;

    let got = y.read::<f32>(0, 8)?;
    chip.close()?;
    let want: Vec<f32> = (1..=8).map(|i| 10.0 + 2.0 * i as f32).collect();
    if got != want {
        eprintln!("FAILED: got {got:?}, want {want:?}");
        std::process::exit(1);
    }
    println!("saxpy on an L2 chip: {got:?}");
    Ok(())
}
