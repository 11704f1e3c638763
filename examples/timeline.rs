//! A run as a picture: a graph over two simulated chips and two SUB workers is submitted with
//! capture on, and its timeline is written three ways from one call: a Chrome trace (open it in
//! <https://ui.perfetto.dev>), a self-contained SVG, and a Graphviz DOT with each task's worker
//! and times and each edge's tensor by name. The records are also printed.
//!
//! Run it with `cargo run --example timeline` (files go to `target/timeline/`, or to the
//! folder given as the first argument).

#![allow(clippy::print_stdout)] // An example talks to its user.

use std::process::ExitCode;

use simpler::{In, InOut, Out, RunOptions, TaskStatus, TensorOf, Worker, callable, chip, sub};

const TILES: usize = 6;
const N: u32 = 64 * 1024;

/// `y = x * x + 1` on one simulated core, a few times over so that it takes a visible while.
#[callable(chip)]
fn square(x: In<f32>, mut y: Out<f32>) {
    for _ in 0..20 {
        for i in 0..y.len() {
            y[i] = x[i] * x[i] + 1.0;
        }
    }
}

/// `total[i] += y[i]` on a SUB worker.
#[callable(sub)]
fn accumulate(y: In<f32>, mut total: InOut<f32>) {
    for (t, v) in total.iter_mut().zip(y.iter()) {
        *t += v;
    }
}

/// Checks the inputs on a SUB worker before anything runs (`x[i] >= 0`).
#[callable(sub)]
fn check_inputs(x: In<f32>) -> Result<(), String> {
    match x.iter().position(|v| *v < 0.0) {
        Some(i) => Err(format!("x[{i}] is negative")),
        None => Ok(()),
    }
}

fn main() -> simpler::Result<ExitCode> {
    let out_dir = std::env::args().nth(1).unwrap_or_else(|| "target/timeline".to_string());
    let mut worker = Worker::builder().chips(2).chip_memory(64 << 20).sub_workers(2).build()?;
    worker.init()?;
    let n = N as usize;
    let bx = worker.create_buffer(4 * n)?;
    bx.set_name("x")?;
    bx.write(0, &(0..n).map(|i| (i % 100) as f32 * 0.01).collect::<Vec<_>>())?;
    let x: TensorOf<f32> = bx.typed(&[N])?;
    let bt = worker.create_buffer(4 * n)?;
    bt.set_name("total")?;
    let mut total: TensorOf<f32> = bt.typed(&[N])?;
    let ys: Vec<_> = (0..TILES).map(|_| worker.create_buffer(4 * n)).collect::<simpler::Result<_>>()?;
    for (i, y) in ys.iter().enumerate() {
        y.set_name(format!("y{i}"))?;
    }
    let mut yt: Vec<TensorOf<f32>> = ys.iter().map(|b| b.typed(&[N])).collect::<simpler::Result<_>>()?;

    let run = worker.submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
        check_inputs::call(&x)?.on(orch, sub())?;
        for (i, y) in yt.iter_mut().enumerate() {
            square::call(&x, y)?.on(orch, chip(i as u32 % 2))?; // alternate chips
        }
        for y in &yt {
            accumulate::call(y, &mut total)?.on(orch, sub())?; // ordered by `total`
        }
        Ok(())
    })?;
    run.wait()?;

    let got = bt.read::<f32>(0, n)?;
    let want = |i: usize| TILES as f32 * (((i % 100) as f32 * 0.01).powi(2) + 1.0);
    let worst = (0..n).map(|i| (got[i] - want(i)).abs()).fold(0.0f32, f32::max);
    let timeline = run.timeline().expect("captured and ended");
    println!("{} tasks:", timeline.records().len());
    for r in timeline.records() {
        println!(
            "  {:>2} {:<13} on {:<13} waited {:>9.1?}, ran {:>9.1?}: {}",
            r.index,
            r.callable,
            r.worker,
            r.waited().unwrap_or_default(),
            r.duration().unwrap_or_default(),
            r.status
        );
    }
    let files = timeline.write_files(format!("{out_dir}/run"))?;
    for f in &files {
        println!("wrote {}", f.display());
    }
    worker.close()?;
    let all_done = timeline.records().iter().all(|r| r.status == TaskStatus::Completed);
    if worst > 1e-3 || !all_done || timeline.lanes().len() < 3 {
        eprintln!("FAILED: largest error {worst}, all completed: {all_done}, lanes {:?}", timeline.lanes());
        return Ok(ExitCode::FAILURE);
    }
    println!("result check: total = {TILES} * (x^2 + 1), largest error {worst}: correct");
    Ok(ExitCode::SUCCESS)
}
