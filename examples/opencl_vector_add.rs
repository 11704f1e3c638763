//! `c = a + b` on an L3 Worker's chips: simulated by default, OpenCL devices with
//! `--device opencl`. The kernel is one `#[callable(chip)]` with a Rust body (for simulated
//! chips) and OpenCL C source (`kernels/vector_add.cl`, for OpenCL devices); the program does
//! not change between the two.
//!
//! ```sh
//! cargo run --example opencl_vector_add                                      # simulated chips
//! cargo run --example opencl_vector_add --features opencl -- --device opencl # OpenCL chips
//! cargo run --example opencl_vector_add --features opencl -- --list-devices  # check a machine
//! ```
//!
//! An OpenCL device needs a driver with an ICD: PoCL on a CPU (`apt-get install
//! pocl-opencl-icd`), or the OpenCL driver of an NVIDIA, AMD or Intel GPU.

#![allow(clippy::print_stdout, clippy::print_stderr)] // An example talks to its user.

use std::process::ExitCode;

use simpler::prelude::*;

const N: u32 = 1 << 16;

/// `c = a + b`, element by element.
#[callable(chip, opencl = "kernels/vector_add.cl")]
fn vector_add(a: In<f32>, b: In<f32>, mut c: Out<f32>) {
    for ((o, x), y) in c.iter_mut().zip(a.iter()).zip(b.iter()) {
        *o = x + y;
    }
}

task_graph! {
    /// Each chip adds its half.
    fn add_halves(a: In<f32>, b: In<f32>, c: Out<f32>) {
        let a2 = a.split(2);
        let b2 = b.split(2);
        let c2 = c.split(2);
        for i in 0..2 {
            vector_add(a2[i], b2[i], &mut c2[i]).on(chip(i));
        }
    }
}

fn main() -> simpler::Result<ExitCode> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opencl = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] | ["--device", "sim"] => false,
        ["--device", "opencl"] => true,
        ["--list-devices"] => return list_devices(),
        _ => {
            eprintln!("usage: opencl_vector_add [--device sim|opencl] [--list-devices]");
            return Ok(ExitCode::from(2));
        }
    };
    let mut builder = Worker::builder().chips(2).chip_memory(256 << 20).chip_cores(1);
    if opencl {
        match opencl_backend() {
            Some(backend) => builder = builder.chip_backend(backend),
            None => {
                eprintln!(
                    "--device opencl needs the `opencl` feature: cargo run --example opencl_vector_add --features opencl -- --device opencl"
                );
                return Ok(ExitCode::from(2));
            }
        }
    }
    let mut worker = builder.build()?;
    worker.init()?;
    let bytes = N as usize * 4;
    let (ba, bb, bc) =
        (worker.create_buffer(bytes)?, worker.create_buffer(bytes)?, worker.create_buffer(bytes)?);
    ba.write(0, &(0..N).map(|i| i as f32).collect::<Vec<_>>())?;
    bb.write(0, &(0..N).map(|i| 2.0 * i as f32).collect::<Vec<_>>())?;
    let (a, b, mut c) = (ba.typed::<f32>(&[N])?, bb.typed::<f32>(&[N])?, bc.typed::<f32>(&[N])?);
    let started = std::time::Instant::now();
    add_halves::call(&a, &b, &mut c)?.run(&worker)?;
    let took = started.elapsed();
    let got = bc.read::<f32>(0, N as usize)?;
    let wrong = got.iter().enumerate().filter(|&(i, &v)| v != 3.0 * i as f32).count();
    println!(
        "c = a + b over {N} floats on two {} chips: {} in {took:?}",
        if opencl { "OpenCL" } else { "simulated" },
        if wrong == 0 { "correct".to_string() } else { format!("{wrong} wrong elements") }
    );
    worker.close()?;
    Ok(if wrong == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

#[cfg(feature = "opencl")]
fn opencl_backend() -> Option<simpler::chip::ChipBackendFn> {
    Some(simpler::chip::OpenClChip::backend)
}

#[cfg(not(feature = "opencl"))]
fn opencl_backend() -> Option<simpler::chip::ChipBackendFn> {
    None
}

#[cfg(feature = "opencl")]
fn list_devices() -> simpler::Result<ExitCode> {
    let devices = simpler::chip::OpenClChip::devices()?;
    if devices.is_empty() {
        println!("OpenCL platforms found, but no device");
        return Ok(ExitCode::FAILURE);
    }
    for (i, d) in devices.iter().enumerate() {
        println!("device {i}: {d}");
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(not(feature = "opencl"))]
fn list_devices() -> simpler::Result<ExitCode> {
    eprintln!(
        "--list-devices needs the `opencl` feature: cargo run --example opencl_vector_add --features opencl -- --list-devices"
    );
    Ok(ExitCode::from(2))
}
