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
//! Run it with `cargo run --example tiled_matmul`.

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
#[callable(chip)]
fn partial_matmul(at: In<f32>, b: In<f32>, mut p: Out<f32>, m: u32, n: u32) {
    let (m, n) = (m as usize, n as usize);
    let kt = b.len() / n;
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
        let bs = b.split(TILES);
        for (t, at_t) in at.split(TILES) {
            partial_matmul(at_t, bs[t], &mut ps[t], M, N).on(chip(t % 2));
        }
        reduce(parts, &mut c).on(sub());
    }
}

fn main() -> simpler::Result<ExitCode> {
    let mut worker = Worker::builder().chips(2).sub_workers(1).build()?;
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
