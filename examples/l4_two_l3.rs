//! An L4 Worker driving two L3 Workers, each in its own process: one with a chip, one with SUB
//! workers. The L4 graph places an orchestration callable on each L3 with `worker(N)`: a
//! `task_graph!` on the first, a `#[callable(orch)]` function (which may loop) on the second.
//! Each runs as one task of the L4 run and as a run of its own on its L3. The second waits for
//! the first because it updates what the first wrote: an edge inferred like any other.
//!
//! Run it with `cargo run --example l4_two_l3`.

#![allow(clippy::print_stdout)] // An example talks to its user.

use std::process::ExitCode;

use simpler::prelude::*;
use simpler::status::Level;

const N: u32 = 1024;

/// `out = a + b` on a chip.
#[callable(chip)]
fn vadd(a: In<f32>, b: In<f32>, mut out: Out<f32>) {
    for i in 0..out.len() {
        out[i] = a[i] + b[i];
    }
}

/// `x = x * x` on a SUB worker.
#[callable(sub)]
fn square(mut x: InOut<f32>) {
    x.iter_mut().for_each(|v| *v *= *v);
}

/// `x += 1` on a SUB worker.
#[callable(sub)]
fn inc(mut x: InOut<f32>) {
    x.iter_mut().for_each(|v| *v += 1.0);
}

task_graph! {
    /// Runs on the L3 with a chip.
    fn add_on_chip(a: In<f32>, b: In<f32>, out: Out<f32>) {
        vadd(a, b, &mut out).on(chip(0));
    }
}

/// Runs on the L3 with SUB workers: `x = x * x + times`, with a loop, which a graph cannot have.
#[callable(orch)]
fn square_then_inc(o: &mut Orchestrator<'_>, x: InOut<f32>, times: u32) -> simpler::Result<()> {
    square::call(&mut x)?.on(o, sub())?;
    for _ in 0..times {
        inc::call(&mut x)?.on(o, sub())?; // each waits for the one before: InOut after InOut
    }
    Ok(())
}

task_graph! {
    /// The L4 graph: `y = (a + b)^2 + 3`, across both L3 Workers.
    fn across(a: In<f32>, b: In<f32>, y: Out<f32>) {
        add_on_chip(a, b, &mut y).on(worker(0));
        square_then_inc(&mut y, 3).on(worker(1));
    }
}

fn main() -> simpler::Result<ExitCode> {
    let chips = Worker::builder().chips(1).chip_memory(16 << 20).build()?;
    let hosts = Worker::builder().sub_workers(2).build()?;
    let mut l4 = Worker::builder()
        .level(Level::Network1)
        .worker(chips) // worker(0)
        .worker(hosts) // worker(1)
        .build()?;
    l4.init()?; // forks both L3 Workers; each forks its own children and registers every #[callable]

    let n = N as usize;
    let (ba, bb, by) = (l4.create_buffer(4 * n)?, l4.create_buffer(4 * n)?, l4.create_buffer(4 * n)?);
    ba.write(0, &vec![1.0f32; n])?;
    bb.write(0, &vec![2.0f32; n])?;
    let (a, b, mut y) = (ba.typed::<f32>(&[N])?, bb.typed::<f32>(&[N])?, by.typed::<f32>(&[N])?);

    let run = across::call(&a, &b, &mut y)?.submit_with(&l4, simpler::RunOptions::new().capture_dag())?;
    run.wait()?;
    let dag = run.dag().expect("submitted with capture");
    println!("the L4 run's DAG:\n{}", dag.to_dot());
    let matches = across::graph().matches(&dag);
    let got = by.read::<f32>(0, n)?;
    l4.close()?; // closes both L3 Workers and their children

    if !matches || got.iter().any(|&v| v != 12.0) {
        eprintln!("FAILED: the DAG matches the graph: {matches}; expected (1 + 2)^2 + 3 = 12 everywhere");
        return Ok(ExitCode::FAILURE);
    }
    println!("result check: (1 + 2)^2 + 3 = 12 in all {n} elements, computed across two L3 Workers");
    Ok(ExitCode::SUCCESS)
}
