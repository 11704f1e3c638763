//! SUB workers reading and writing shared tensors: host functions (`#[callable(sub)]`) run in
//! forked SUB worker processes directly on the Worker's shared-memory buffers, so the parent
//! reads their results without a copy. Four disjoint views of one buffer are written by four
//! tasks that run in parallel (no edge between them); a task reading the whole buffer overlaps
//! all four views, so it waits for all of them.
//!
//! Run it with `cargo run --example sub_workers`.

#![allow(clippy::print_stdout)] // An example talks to its user.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use simpler::memory::TensorView;
use simpler::prelude::*;

const N: u32 = 4096;
const PARTS: u32 = 4;
const NAP: Duration = Duration::from_millis(200);

/// Fills its view with `x[i] = (start + i)^2`, slowly: each call takes at least `NAP`.
#[callable(sub)]
fn fill_squares(mut x: Out<u64>, start: u64) {
    std::thread::sleep(NAP);
    for (i, v) in x.iter_mut().enumerate() {
        *v = (start + i as u64).pow(2);
    }
}

/// `total[0] = sum(x)`, over the whole buffer.
#[callable(sub)]
fn sum(x: In<u64>, mut total: Out<u64>) {
    total[0] = x.iter().sum();
}

fn main() -> simpler::Result<ExitCode> {
    let mut worker = Worker::builder().sub_workers(PARTS as usize).build()?;
    worker.init()?; // forks the SUB workers; registers every #[callable(sub)] in them

    let (bx, btotal) = (worker.create_buffer(8 * N as usize)?, worker.create_buffer(8)?);
    let whole = bx.typed::<u64>(&[N])?;
    let mut total = btotal.typed::<u64>(&[1])?;
    // Part p: elements [p * len, (p + 1) * len) of the same buffer, a view at a byte offset.
    let len = N / PARTS;
    let part = |p: u32| -> simpler::Result<TensorOf<u64>> {
        let view = TensorView::new(8 * u64::from(p * len), &[len], None, DataType::Uint64)?;
        TensorOf::new(bx.view(view)?)
    };
    let mut parts = (0..PARTS).map(part).collect::<simpler::Result<Vec<_>>>()?;

    let started = Instant::now();
    let run = worker.submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
        for (p, part) in parts.iter_mut().enumerate() {
            fill_squares::call(part, p as u64 * u64::from(len))?.on(orch, sub())?;
        }
        sum::call(&whole, &mut total)?.on(orch, sub())?; // overlaps every part: waits for all
        Ok(())
    })?;
    run.wait()?;
    let elapsed = started.elapsed();

    let dag = run.dag().expect("submitted with capture");
    let parallel = (0..PARTS).all(|a| (0..PARTS).all(|b| !dag.has_edge(a, b)));
    let joined = (0..PARTS).all(|p| dag.has_edge(p, PARTS));
    let got = (bx.read::<u64>(0, N as usize)?, btotal.read::<u64>(0, 1)?[0]);
    worker.close()?;

    let want_total: u64 = (0..u64::from(N)).map(|i| i * i).sum();
    let values_ok = got.0.iter().enumerate().all(|(i, &v)| v == (i as u64).pow(2));
    println!(
        "{PARTS} parts of one buffer, {NAP:?} each: done in {elapsed:?} ({:?} one after another)",
        NAP * PARTS
    );
    println!("no edges between the parts: {parallel}; the sum waits for every part: {joined}");
    // The DAG is the check that they may run in parallel; the time shows that they did (it is
    // generous: anything well under four naps).
    if !(values_ok && got.1 == want_total && parallel && joined && elapsed < NAP * 3) {
        eprintln!("FAILED: values {values_ok}, total {} (want {want_total}), time {elapsed:?}", got.1);
        return Ok(ExitCode::FAILURE);
    }
    println!("result check: sum of squares below {N} = {}", got.1);
    Ok(ExitCode::SUCCESS)
}
