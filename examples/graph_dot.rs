//! A `task_graph!` program and its DAG as Graphviz DOT, twice: the graph's static structure
//! (`g::graph()`, known before anything runs, with tensor names on the edges) and the DAG the
//! engine captured while running it (`submit_with(.., RunOptions::new().capture_dag())`, then `run.dag()`, with buffer ids on the
//! edges). `TaskGraph::matches` checks that they are the same DAG: the same tasks in the same
//! places, the same edges for the same reasons. The graph has both kinds of edge: reads of
//! what a task wrote (from the tags), and a write after reads, which `task_graph!` orders itself
//! (`add_dep_wait`).
//!
//! Run it with `cargo run --example graph_dot`.

#![allow(clippy::print_stdout)] // An example talks to its user.

use std::process::ExitCode;

use simpler::dsl::GraphEdge;
use simpler::prelude::*;

const N: u32 = 256;

/// `out = a + b`
#[callable(sub)]
fn add(a: In<f32>, b: In<f32>, mut out: Out<f32>) {
    for i in 0..out.len() {
        out[i] = a[i] + b[i];
    }
}

/// `out = a * b`
#[callable(sub)]
fn mul(a: In<f32>, b: In<f32>, mut out: Out<f32>) {
    for i in 0..out.len() {
        out[i] = a[i] * b[i];
    }
}

/// `x += 1`
#[callable(sub)]
fn inc(mut x: InOut<f32>) {
    x.iter_mut().for_each(|v| *v += 1.0);
}

task_graph! {
    /// A diamond, `out = (x + x) + x * x`, then `x += 1` once both readers of `x` are done.
    fn diamond(x: InOut<f32>, out: Out<f32>, n: u32) {
        let s = alloc::<f32>([n]);
        let p = alloc::<f32>([n]);
        add(x, x, &mut s).on(sub());
        mul(x, x, &mut p).on(sub());
        add(s, p, &mut out).on(sub());
        inc(&mut x).on(sub());
    }
}

fn main() -> simpler::Result<ExitCode> {
    // The static structure needs no Worker.
    let graph = diamond::graph();
    println!("diamond::graph().to_dot():\n{}", graph.to_dot());
    let g = graph.graph();
    let afters = g.edge_weights().filter(|e| matches!(e, GraphEdge::WriteAfterRead { .. })).count();

    let mut worker = Worker::builder().sub_workers(2).build()?;
    worker.init()?;
    let n = N as usize;
    let (bx, bout) = (worker.create_buffer(4 * n)?, worker.create_buffer(4 * n)?);
    bx.write(0, &vec![3.0f32; n])?;
    let (mut x, mut out) = (bx.typed::<f32>(&[N])?, bout.typed::<f32>(&[N])?);

    let run =
        diamond::call(&mut x, &mut out, N)?.submit_with(&worker, simpler::RunOptions::new().capture_dag())?;
    run.wait()?;
    let dag = run.dag().expect("submitted with capture");
    println!("the captured run's DAG, run.dag().to_dot():\n{}", dag.to_dot());
    let matches = graph.matches(&dag);
    let values = (bout.read::<f32>(0, n)?, bx.read::<f32>(0, n)?);
    worker.close()?;

    let shape = (g.node_count(), g.edge_count(), afters);
    let values_ok = values.0.iter().all(|&v| v == 15.0) && values.1.iter().all(|&v| v == 4.0);
    if !matches || shape != (4, 4, 2) || !values_ok {
        eprintln!(
            "FAILED: matches {matches}, (nodes, edges, write-after-read edges) {shape:?}, values {values_ok}"
        );
        return Ok(ExitCode::FAILURE);
    }
    println!(
        "result check: the run's DAG matches the graph ({} tasks, {} edges, {} of them write-after-read); out = 3 + 3 + 3 * 3, then x = 4",
        shape.0, shape.1, shape.2
    );
    Ok(ExitCode::SUCCESS)
}
