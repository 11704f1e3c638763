//! A run as a picture: an L4 Worker drives a nested L3 Worker (two simulated chips with two
//! cores each, and two SUB workers) and a SUB worker of its own; a run submitted with capture
//! on is drawn three ways from one call: a Chrome trace (open it in <https://ui.perfetto.dev>),
//! a self-contained SVG, and a Graphviz DOT with each task's worker and times and each edge's
//! tensor by name. The timeline has a lane per worker at every level: the L4's, the nested
//! L3's chips and SUB workers, and each chip's cores. The records are also printed.
//!
//! Run it with `cargo run --example timeline` (files go to `target/timeline/`, or to the
//! folder given as the first argument).

#![allow(clippy::print_stdout)] // An example talks to its user.

use std::process::ExitCode;

use simpler::prelude::*;
use simpler::{status::Level, trace::TaskStatus};

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

/// The L3's part, run on the nested Worker: the inputs checked on a SUB worker, a square per
/// tile on alternating chips, the tiles accumulated on SUB workers.
#[callable(orch)]
fn tiles_on_l3(
    orch: &mut Orchestrator<'_>,
    x: In<f32>,
    total: InOut<f32>,
    ys: Out<f32>,
) -> simpler::Result<()> {
    let mut total = total;
    let mut tiles = ys.split(TILES as u32)?; // one piece per tile, written in parallel
    check_inputs::call(&x)?.on(orch, sub())?;
    for (i, y) in tiles.iter_mut().enumerate() {
        square::call(&x, y)?.on(orch, chip(i as u32 % 2))?; // alternate chips
    }
    for y in &tiles {
        accumulate::call(y, &mut total)?.on(orch, sub())?; // ordered by `total`
    }
    Ok(())
}

/// The L4's own SUB worker: a checksum of the inputs, in parallel with the L3's task.
#[callable(sub)]
fn checksum(x: In<f32>, mut sum: Out<f32>) {
    sum[0] = x.iter().sum();
}

fn main() -> simpler::Result<ExitCode> {
    let out_dir = std::env::args().nth(1).unwrap_or_else(|| "target/timeline".to_string());
    let l3 = Worker::builder().chips(2).chip_cores(2).chip_memory(64 << 20).sub_workers(2).build()?;
    let mut worker = Worker::builder().level(Level::Network1).sub_workers(1).worker(l3).build()?;
    let l3_id = 0; // the first nested Worker
    worker.init()?;
    let n = N as usize;
    let bx = worker.create_buffer(4 * n)?;
    bx.set_name("x")?;
    bx.write(0, &(0..n).map(|i| (i % 100) as f32 * 0.01).collect::<Vec<_>>())?;
    let x: TensorOf<f32> = bx.typed(&[N])?;
    let bt = worker.create_buffer(4 * n)?;
    bt.set_name("total")?;
    let mut total: TensorOf<f32> = bt.typed(&[N])?;
    let by = worker.create_buffer(4 * n * TILES)?;
    by.set_name("tiles")?;
    let mut ys: TensorOf<f32> = by.typed(&[N * TILES as u32])?;
    let bs = worker.create_buffer(4)?;
    bs.set_name("checksum")?;
    let mut sum: TensorOf<f32> = bs.typed(&[1])?;
    let run = worker.submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
        tiles_on_l3::call(&x, &mut total, &mut ys)?.on(orch, simpler::dsl::worker(l3_id))?;
        checksum::call(&x, &mut sum)?.on(orch, sub())?;
        Ok(())
    })?;
    run.wait()?;

    let got = bt.read::<f32>(0, n)?;
    let want = |i: usize| TILES as f32 * (((i % 100) as f32 * 0.01).powi(2) + 1.0);
    let worst = (0..n).map(|i| (got[i] - want(i)).abs()).fold(0.0f32, f32::max);
    let timeline = run.timeline().expect("captured and ended");
    println!("{} tasks at L4, {} inside them:", timeline.records().len(), timeline.inner_records().len());
    for r in timeline.records().iter().chain(timeline.inner_records()) {
        println!(
            "  {} {:>2} {:<16} on {:<26} waited {:>9.1?}, ran {:>9.1?}: {}",
            r.level,
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
    let all_done =
        timeline.records().iter().chain(timeline.inner_records()).all(|r| r.status == TaskStatus::Completed);
    // Lanes at three levels: the L4's (worker 0, sub worker 0), the L3's (chips, SUB workers),
    // the chips' cores.
    let levels: std::collections::BTreeSet<Level> = timeline.lanes().iter().map(|(l, _)| *l).collect();
    if worst > 1e-3 || !all_done || levels.len() != 3 {
        eprintln!("FAILED: largest error {worst}, all completed: {all_done}, lanes {:?}", timeline.lanes());
        return Ok(ExitCode::FAILURE);
    }
    println!("result check: total = {TILES} * (x^2 + 1), largest error {worst}: correct");
    Ok(ExitCode::SUCCESS)
}
