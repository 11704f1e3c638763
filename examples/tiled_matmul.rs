//! A tiled matrix product over two chips and SUB reduces: `c = a · b` with the inner
//! dimension cut into 64 tiles. Each tile's partial product `a[:, k-tile] · b[k-tile, :]` is one
//! kernel, placed on chip `t % 2`, written into its own piece of a `parts` intermediate; then
//! the output is cut into a 2x2 grid of 2-D tiles, and one host function per output tile, on
//! the SUB workers, adds that tile of the 64 partial products. The `task_graph!` checker proves
//! that the 64 kernels write disjoint pieces and so do the 4 reduces (so each loop runs in
//! parallel), and the result is checked against a reference computed on the host.
//!
//! Most pieces here are strided: a k-tile of `a` is a column block (`a.grid([1, TILES])`,
//! shape `[M, KT]`, rows `K` elements apart), an output tile of `c` is a quarter of the matrix
//! (`c.grid([2, 2])`), and the piece of `parts` a reduce reads is a 3-D block. A chip copies a
//! strided piece in packed, so the kernel indexes it as a plain row-major `[M, KT]` matrix
//! (`a[(i, k)]`), and a host function gets a packed copy; what they write goes back into the
//! piece.
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
/// Columns of `a` (and rows of `b`) per tile.
const KT: u32 = 4;
const K: u32 = TILES * KT;
/// The output tiles: a `GRID` x `GRID` grid of `c`.
const GRID: u32 = 2;

/// One partial product: `p[M, N] = a_tile[M, KT] · b_tile[KT, N]`, on one chip core.
///
/// On an OpenCL chip the source in `kernels/partial_matmul.cl` (relative to this crate's
/// `Cargo.toml`) runs instead, one work-item per element of `p`, with the same parameters:
/// the tensors as `__global float*`, then `m`, `n` and `kt` as `uint`.
#[callable(chip, opencl = "kernels/partial_matmul.cl")]
fn partial_matmul(a: In<f32>, b: In<f32>, mut p: Out<f32>, m: u32, n: u32, kt: u32) {
    let (m, n, kt) = (m as usize, n as usize, kt as usize);
    assert_eq!(
        (a.shape(), b.shape(), p.len()),
        (&[m as u32, kt as u32][..], &[kt as u32, n as u32][..], m * n)
    );
    for i in 0..m {
        for j in 0..n {
            // `a` is a column block of the whole `a`, packed: `[M, KT]`, row-major.
            p[(i, j)] = (0..kt).map(|k| a[(i, k)] * b[(k, j)]).sum();
        }
    }
}

/// One output tile: `c_tile = Σ parts_tile[t]` over the partial products, on a SUB worker.
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
    /// `c = a · b`: 64 partial products over two chips, then one reduce per 2-D output tile.
    pub fn tiled_matmul(a: In<f32>, b: In<f32>, c: Out<f32>) {
        let parts = alloc::<f32>([TILES, M, N]);
        let ps = parts.split(TILES);
        let bs = b.split(TILES);
        for (t, a_t) in a.grid([1, TILES]) {
            partial_matmul(a_t, bs[t], &mut ps[t], M, N, KT).on(chip(t % 2));
        }
        // Output tile `t` of `c` and the same tile of every partial product.
        let cs = c.grid([GRID, GRID]);
        let pcs = parts.grid([1, GRID, GRID]);
        for (t, part_t) in pcs {
            reduce(part_t, &mut cs[t]).on(sub());
        }
    }
}

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
    let builder = Worker::builder().chips(2).sub_workers(2);
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
    let av: Vec<f32> = (0..m * k).map(|v| (v % 7) as f32 - 3.0).collect();
    let bv: Vec<f32> = (0..k * n).map(|v| (v % 5) as f32 - 2.0).collect();
    let (ba, bb, bc) = (
        worker.create_buffer(4 * m * k)?,
        worker.create_buffer(4 * k * n)?,
        worker.create_buffer(4 * m * n)?,
    );
    ba.write(0, &av)?;
    bb.write(0, &bv)?;
    let (ta, tb, mut tc) = (ba.typed::<f32>(&[M, K])?, bb.typed::<f32>(&[K, N])?, bc.typed::<f32>(&[M, N])?);

    let run = tiled_matmul::call(&ta, &tb, &mut tc)?
        .submit_with(&worker, simpler::RunOptions::new().capture_dag())?;
    run.wait()?;
    let got = bc.read::<f32>(0, m * n)?;
    let want: Vec<f32> =
        (0..m * n).map(|ij| (0..k).map(|kk| av[(ij / n) * k + kk] * bv[kk * n + ij % n]).sum()).collect();

    let dag = run.dag().expect("captured");
    let graph = tiled_matmul::graph();
    let on_chip = |c: u32| dag.graph().node_weights().filter(|t| t.target == format!("worker {c}")).count();
    let reduces = (GRID * GRID) as usize;
    println!(
        "{} tasks: {} partial products on chip 0, {} on chip 1, {reduces} reduces of 2-D output tiles; {} edges (each partial product feeds every reduce)",
        dag.graph().node_count(),
        on_chip(0),
        on_chip(1),
        dag.graph().edge_count()
    );
    let ok = got == want && graph.matches(&dag) && dag.graph().edge_count() == TILES as usize * reduces;
    worker.close()?;
    if !ok {
        eprintln!(
            "FAILED: the product differs from the reference, or the run's DAG from tiled_matmul::graph()"
        );
        return Ok(ExitCode::FAILURE);
    }
    println!(
        "result check: c = a · b matches the host reference ({m}x{n} in {GRID}x{GRID} output tiles, K = {k} in {TILES} tiles)"
    );
    Ok(ExitCode::SUCCESS)
}
