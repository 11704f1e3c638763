//! A tiled matrix product over two chips and a SUB reduce: `c = a · b` with the inner
//! dimension cut into 64 tiles. Each tile's partial product `a[:, k-tile] · b[k-tile, :]` is one
//! kernel, placed on chip `t % 2`, written into its own piece of a `parts` intermediate; a host
//! function on a SUB worker adds the 64 partial products. The `task_graph!` checker proves that
//! the 64 kernels write disjoint pieces (so they run in parallel), and the result is checked
//! against a reference computed on the host.
//!
//! `a` is passed transposed (`at`, `[K, M]`) so that each k-tile is a run of whole rows: a
//! contiguous piece, which a kernel sees as a plain slice.
//!
//! `partial_matmul` carries both a Rust body and OpenCL C source
//! (`examples/kernels/partial_matmul.cl`): the default simulated chips run the Rust body, and
//! `--device opencl` runs the same graph on OpenCL chips, which compile and launch the source.
//!
//! Run it with `cargo run --example tiled_matmul`, or on an OpenCL device (PoCL's CPU device,
//! or a GPU driver's ICD) with
//! `cargo run --example tiled_matmul --features opencl -- --device opencl`.

#![allow(clippy::print_stdout)] // An example talks to its user.

use std::process::ExitCode;

use simpler::prelude::*;

const M: u32 = 16;
const N: u32 = 16;
/// Tiles of the inner dimension.
const TILES: u32 = 64;
/// Rows of `b` (and of `at`) per tile.
const KT: u32 = 4;
const K: u32 = TILES * KT;

/// One partial product: `p[M, N] = at_tile[KT, M]ᵀ · b_tile[KT, N]`, on one chip core.
///
/// On an OpenCL chip the source in `kernels/partial_matmul.cl` (relative to this crate's
/// `Cargo.toml`) runs instead, one work-item per element of `p`, with the same parameters:
/// the tensors as `__global float*`, then `m`, `n` and `kt` as `uint`.
#[callable(chip, opencl = "kernels/partial_matmul.cl")]
fn partial_matmul(at: In<f32>, b: In<f32>, mut p: Out<f32>, m: u32, n: u32, kt: u32) {
    let (m, n, kt) = (m as usize, n as usize, kt as usize);
    assert_eq!((at.len(), b.len(), p.len()), (kt * m, kt * n, m * n), "tile shapes");
    for i in 0..m {
        for j in 0..n {
            p[i * n + j] = (0..kt).map(|k| at[k * m + i] * b[k * n + j]).sum();
        }
    }
}

/// `c = Σ parts[t]` over the tiles: the reduce, on a SUB worker.
#[callable(sub)]
fn reduce(parts: In<f32>, mut c: Out<f32>) {
    c.fill(0.0);
    for part in parts.chunks(c.len()) {
        for (acc, v) in c.iter_mut().zip(part) {
            *acc += v;
        }
    }
}

task_graph! {
    /// `c = a · b`, given `at = aᵀ`: 64 partial products over two chips, then one reduce.
    pub fn tiled_matmul(at: In<f32>, b: In<f32>, c: Out<f32>) {
        let parts = alloc::<f32>([TILES * M, N]);
        let ps = parts.split(TILES);
        // On an OpenCL chip each piece is a sub-buffer, which must start at a multiple of the
        // device's base address alignment (128 bytes on PoCL): the pieces of `at` and `b` start
        // at multiples of KT * M * 4 = KT * N * 4 = 256 bytes, those of `parts` at M * N * 4.
        let bs = b.split(TILES);
        for (t, at_t) in at.split(TILES) {
            partial_matmul(at_t, bs[t], &mut ps[t], M, N, KT).on(chip(t % 2));
        }
        reduce(parts, &mut c).on(sub());
    }
}

// The pieces of `at`, `b` and `parts` start at multiples of 128 bytes, PoCL's base address
// alignment: an OpenCL chip passes each piece as a sub-buffer, and refuses (naming the kernel
// and the alignment) one that starts elsewhere. Other devices report their own alignment (some
// GPUs 512 bytes or more); size the tiles to it.
const _: () = assert!(
    (KT * M * 4).is_multiple_of(128) && (KT * N * 4).is_multiple_of(128) && (M * N * 4).is_multiple_of(128)
);

/// The chips the example runs on (`--device sim`, the default, or `--device opencl`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Device {
    Sim,
    OpenCl,
}

fn device_from_args() -> Result<Device, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] | ["--device", "sim"] => Ok(Device::Sim),
        ["--device", "opencl"] => Ok(Device::OpenCl),
        _ => Err(format!("usage: tiled_matmul [--device sim|opencl] (got {args:?})")),
    }
}

fn builder(device: Device) -> Result<simpler::WorkerBuilder, String> {
    let builder = Worker::builder().chips(2).sub_workers(1);
    match device {
        Device::Sim => Ok(builder),
        #[cfg(feature = "opencl")]
        Device::OpenCl => Ok(builder.chip_backend(simpler::chip::OpenClChip::backend)),
        #[cfg(not(feature = "opencl"))]
        Device::OpenCl => {
            Err("--device opencl needs the OpenCL backend: build the example with `--features opencl` \
             (`cargo run --example tiled_matmul --features opencl -- --device opencl`)"
                .to_string())
        }
    }
}

fn main() -> simpler::Result<ExitCode> {
    let builder = match device_from_args().and_then(builder) {
        Ok(b) => b,
        Err(msg) => {
            eprintln!("error: {msg}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let mut worker = builder.build()?;
    worker.init()?;
    let (m, n, k) = (M as usize, N as usize, K as usize);
    // Small integers, so the float sums are exact whatever the order.
    let a: Vec<f32> = (0..m * k).map(|v| (v % 7) as f32 - 3.0).collect();
    let bv: Vec<f32> = (0..k * n).map(|v| (v % 5) as f32 - 2.0).collect();
    let mut at = vec![0.0f32; k * m];
    for i in 0..m {
        for kk in 0..k {
            at[kk * m + i] = a[i * k + kk];
        }
    }
    let (bat, bb, bc) = (
        worker.create_buffer(4 * k * m)?,
        worker.create_buffer(4 * k * n)?,
        worker.create_buffer(4 * m * n)?,
    );
    bat.write(0, &at)?;
    bb.write(0, &bv)?;
    let (tat, tb, mut tc) =
        (bat.typed::<f32>(&[K, M])?, bb.typed::<f32>(&[K, N])?, bc.typed::<f32>(&[M, N])?);

    let run = tiled_matmul::call(&tat, &tb, &mut tc)?
        .submit_with(&worker, simpler::RunOptions::new().capture_dag())?;
    run.wait()?;
    let got = bc.read::<f32>(0, m * n)?;
    let want: Vec<f32> =
        (0..m * n).map(|ij| (0..k).map(|kk| a[(ij / n) * k + kk] * bv[kk * n + ij % n]).sum()).collect();

    let dag = run.dag().expect("captured");
    let graph = tiled_matmul::graph();
    let on_chip = |c: u32| dag.graph().node_weights().filter(|t| t.target == format!("worker {c}")).count();
    println!(
        "{} tasks: {} partial products on chip 0, {} on chip 1, 1 reduce; {} edges (each partial product feeds the reduce)",
        dag.graph().node_count(),
        on_chip(0),
        on_chip(1),
        dag.graph().edge_count()
    );
    let ok = got == want && graph.matches(&dag) && dag.graph().edge_count() == TILES as usize;
    worker.close()?;
    if !ok {
        eprintln!(
            "FAILED: the product differs from the reference, or the run's DAG from tiled_matmul::graph()"
        );
        return Ok(ExitCode::FAILURE);
    }
    println!("result check: c = a · b matches the host reference ({m}x{n}, K = {k} in {TILES} tiles)");
    Ok(ExitCode::SUCCESS)
}
