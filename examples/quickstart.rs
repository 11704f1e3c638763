//! The whole stack in one run: an L3 Worker with two simulated chips and two SUB workers runs a
//! `task_graph!` whose kernels (`#[callable(chip)]`) run on the chips and whose host functions
//! (`#[callable(sub)]`) run on the SUB workers, through two runtime-managed intermediates. It
//! prints where each task ran and what waited for what, checks the result, and prints the run's
//! timing.
//!
//! Run it with `cargo run --example quickstart`.

#![allow(clippy::print_stdout)] // An example talks to its user.

use std::process::ExitCode;
use std::time::Instant;

use simpler::prelude::*;

const N: u32 = 1024;

/// `s = a + b`: a kernel, run by one core of a chip on copies in the chip's memory.
#[callable(chip)]
fn vadd(a: In<f32>, b: In<f32>, mut s: Out<f32>) {
    for i in 0..s.len() {
        s[i] = a[i] + b[i];
    }
}

/// `p = a * b`: another kernel.
#[callable(chip)]
fn vmul(a: In<f32>, b: In<f32>, mut p: Out<f32>) {
    for i in 0..p.len() {
        p[i] = a[i] * b[i];
    }
}

/// `y = s + p`: a host function, run by a SUB worker on the shared memory itself.
#[callable(sub)]
fn combine(s: In<f32>, p: In<f32>, mut y: Out<f32>) {
    for i in 0..y.len() {
        y[i] = s[i] + p[i];
    }
}

/// `y *= k` in place.
#[callable(sub)]
fn scale(mut y: InOut<f32>, k: f32) {
    y.iter_mut().for_each(|v| *v *= k);
}

task_graph! {
    /// `y = (a + b + a * b) * k`: the two kernels run in parallel on two chips, then the host
    /// steps run on SUB workers; `s` and `p` live only as long as the run needs them.
    fn pipeline(a: In<f32>, b: In<f32>, y: Out<f32>, n: u32, k: f32) {
        let s = alloc::<f32>([n]);
        let p = alloc::<f32>([n]);
        vadd(a, b, &mut s).on(chip(0));
        vmul(a, b, &mut p).on(chip(1));
        combine(s, p, &mut y).on(sub());
        scale(&mut y, k).on(sub());
    }
}

fn main() -> simpler::Result<ExitCode> {
    let mut worker = Worker::builder().chips(2).chip_memory(16 << 20).sub_workers(2).build()?;
    worker.init()?; // starts the chips and the SUB workers; registers every #[callable]

    let n = N as usize;
    let (ba, bb, by) =
        (worker.create_buffer(4 * n)?, worker.create_buffer(4 * n)?, worker.create_buffer(4 * n)?);
    let av: Vec<f32> = (0..n).map(|i| i as f32 / 8.0).collect();
    let bv: Vec<f32> = (0..n).map(|i| (1 + i % 4) as f32).collect();
    ba.write(0, &av)?;
    bb.write(0, &bv)?;
    let (a, b, mut y) = (ba.typed::<f32>(&[N])?, bb.typed::<f32>(&[N])?, by.typed::<f32>(&[N])?);

    let started = Instant::now();
    let run = pipeline::call(&a, &b, &mut y, N, 0.5)?
        .submit_with(&worker, simpler::RunOptions::new().capture_dag())?;
    run.wait()?;
    let elapsed = started.elapsed();

    // What ran where: the captured DAG's nodes (a chip is next-level worker N of this Worker).
    let dag = run.dag().expect("submitted with capture");
    let g = dag.graph();
    println!("run {}:", run.id());
    for node in g.node_weights() {
        println!("  task {}: {:<8} on {}", node.index, node.callable, node.target);
    }
    for e in g.edge_indices() {
        let (from, to) = g.edge_endpoints(e).expect("an edge has two ends");
        println!("  task {} waits for task {}", g[to].index, g[from].index);
    }

    let got = by.read::<f32>(0, n)?;
    let bad = (0..n).filter(|&i| got[i] != (av[i] + bv[i] + av[i] * bv[i]) * 0.5).count();
    let stats = run.stats().expect("finished");
    println!(
        "{} tasks ({} failed): {:?} from submit to the last completion, {:?} until wait returned",
        stats.tasks, stats.failed, stats.wall, elapsed
    );
    worker.close()?;
    if bad != 0 || stats.tasks != 4 {
        eprintln!("FAILED: {bad} of {n} elements are wrong ({} tasks ran)", stats.tasks);
        return Ok(ExitCode::FAILURE); // a return, not `exit`: the buffers are dropped and closed
    }
    println!("result check: all {n} elements of (a + b + a * b) / 2 are correct");
    Ok(ExitCode::SUCCESS)
}
