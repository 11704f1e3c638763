//! Pipelined runs: `submit` starts a run and returns its `RunHandle` at once, so the next run is
//! built while the first executes; each handle is waited on separately and has its own result
//! and stats. `pipeline_depth(2)` allows two runs in flight: the third `submit` waits until
//! the first is done. A failing run does not affect the others.
//!
//! What overlaps across runs, exactly: building a run's graph (its orchestration function)
//! overlaps the execution of the runs before it, and the *execution* of a run overlaps the runs
//! before it once it is independent of them: its graph is built, its tasks are SUB work, and it
//! names no buffer an unfinished task of theirs touches where either side writes. Runs that
//! share a buffer execute one after another. (On chips, preparation overlaps too: a chip copies
//! the inputs of the next run's task into the chip while the current run's kernels execute and
//! their outputs go back, and launches it once the current run has finished:
//! `tests/chip_pipelining.rs`, `benches/chip_pipeline.rs`.) The part after the runs shows 8
//! batches of a 3-stage pipeline as 8 runs on buffers of their own (independent, so their
//! stages overlap) and as one run (where nothing orders the batches either).
//!
//! Run it with `cargo run --example pipelined_runs`.

#![allow(clippy::print_stdout)] // An example talks to its user.

use std::process::ExitCode;

use simpler::prelude::*;

const N: u32 = 64;

/// `x = 2x + 1`, in place.
#[callable(sub)]
fn step(mut x: InOut<u64>) {
    x.iter_mut().for_each(|v| *v = *v * 2 + 1);
}

/// One stage of a batch: `x += 1`, after `ms` milliseconds standing in for the stage's work.
#[callable(sub)]
fn stage(mut x: InOut<u64>, ms: u64) {
    std::thread::sleep(std::time::Duration::from_millis(ms));
    x.iter_mut().for_each(|v| *v += 1);
}

/// Checks that `x` is all `want`; fails its task when asked to.
#[callable(sub)]
fn verify(x: In<u64>, want: u64, fail: bool) -> Result<(), String> {
    if fail {
        return Err("asked to fail".to_string());
    }
    match x.iter().position(|&v| v != want) {
        Some(i) => Err(format!("x[{i}] = {}, want {want}", x[i])),
        None => Ok(()),
    }
}

task_graph! {
    /// Four steps in a chain (each updates what the one before wrote), then a check.
    fn four_steps(x: InOut<u64>, fail: bool) {
        step(&mut x).on(sub());
        step(&mut x).on(sub());
        step(&mut x).on(sub());
        step(&mut x).on(sub());
        verify(x, 15, fail).on(sub());
    }
}

fn main() -> simpler::Result<ExitCode> {
    let mut worker = Worker::builder().sub_workers(2).pipeline_depth(2).build()?;
    worker.init()?;

    let buffers: Vec<_> =
        (0..3).map(|_| worker.create_buffer(8 * N as usize)).collect::<simpler::Result<_>>()?;
    // Three runs, one buffer each; run 1 fails on purpose, after its chain.
    let mut handles = Vec::new();
    for (r, buf) in buffers.iter().enumerate() {
        let mut x = buf.typed::<u64>(&[N])?;
        handles.push(four_steps::call(&mut x, r == 1)?.submit(&worker)?); // returns at once
    }

    let mut ok = true;
    for (r, handle) in handles.iter().enumerate() {
        let result = handle.wait().map_err(|e| e.to_string());
        let stats = handle.stats().expect("finished");
        let (id, wall) = (handle.id(), stats.wall);
        println!("run {r} (id {id}): {} tasks, {} failed, {wall:?}: {result:?}", stats.tasks, stats.failed);
        ok &= match r {
            1 => result.is_err_and(|e| e.contains("asked to fail")),
            _ => result.is_ok(),
        };
    }
    for b in &buffers {
        // 0 -> 1 -> 3 -> 7 -> 15 in every run, the failing one included (its chain ran first).
        ok &= b.read::<u64>(0, N as usize)?.iter().all(|&v| v == 15);
    }

    // 8 batches of a 3-stage pipeline (each stage depends on the one before, in its batch).
    const BATCHES: usize = 8;
    const STAGE_MS: u64 = 5;
    let batches: Vec<_> =
        (0..BATCHES).map(|_| worker.create_buffer(8 * N as usize)).collect::<simpler::Result<_>>()?;
    // As 8 runs: each run's stages are a chain, and each run is independent of the ones before
    // it (a buffer of its own), so a run's stages run beside the run before it on the other
    // SUB worker.
    let start = std::time::Instant::now();
    let mut handles = Vec::new();
    for buf in &batches {
        let mut x = buf.typed::<u64>(&[N])?;
        handles.push(worker.submit(|orch| {
            for _ in 0..3 {
                stage::call(&mut x, STAGE_MS)?.on(orch, sub())?;
            }
            Ok(())
        })?);
    }
    for h in &handles {
        h.wait()?;
    }
    let as_runs = start.elapsed();
    // As one run: the batches are independent, so stage k of one batch runs beside stage k of
    // another on the two SUB workers.
    let start = std::time::Instant::now();
    worker.run(|orch| {
        for buf in &batches {
            let mut x = buf.typed::<u64>(&[N])?;
            for _ in 0..3 {
                stage::call(&mut x, STAGE_MS)?.on(orch, sub())?;
            }
        }
        Ok(())
    })?;
    let as_one_run = start.elapsed();
    println!(
        "{BATCHES} batches x 3 stages of {STAGE_MS} ms on 2 SUB workers: as {BATCHES} runs {as_runs:?}, as one run {as_one_run:?}"
    );
    for b in &batches {
        ok &= b.read::<u64>(0, N as usize)?.iter().all(|&v| v == 6);
    }
    worker.close()?;
    if !ok {
        eprintln!("FAILED: unexpected results");
        return Ok(ExitCode::FAILURE);
    }
    println!("result check: runs 0 and 2 passed, run 1 failed alone, and every chain ran");
    Ok(ExitCode::SUCCESS)
}
