//! A progress bar over a long run: `RunHandle::progress` says, while the run is in flight, how
//! many tasks were submitted, completed and failed; this example polls it from the main thread
//! and draws a bar with the `indicatif` crate while 2000 SUB tasks run on four SUB workers.
//!
//! Run it with `cargo run --example progress_bar`.

#![allow(clippy::print_stdout)] // An example talks to its user.

use std::process::ExitCode;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use simpler::memory::TensorView;
use simpler::prelude::*;

const TASKS: u64 = 2000;

/// Some work: `x[i] = (seed * i)^2 mod 1_000_003` over its row.
#[callable(sub)]
fn busy(mut x: Out<u64>, seed: u64) {
    for (i, v) in x.iter_mut().enumerate() {
        *v = (seed * i as u64).pow(2) % 1_000_003;
    }
}

fn main() -> simpler::Result<ExitCode> {
    let mut worker = Worker::builder().sub_workers(4).build()?;
    worker.init()?;
    let rows = worker.create_buffer(8 * 4096 * TASKS as usize)?;
    let mut views = (0..TASKS)
        .map(|t| TensorOf::new(rows.view(TensorView::new(8 * 4096 * t, &[4096], None, DataType::Uint64)?)?))
        .collect::<simpler::Result<Vec<_>>>()?;

    let run = worker.submit(|orch| {
        for (t, v) in views.iter_mut().enumerate() {
            busy::call(v, t as u64)?.on(orch, sub())?;
        }
        Ok(())
    })?;
    let bar = ProgressBar::new(TASKS);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} tasks, {per_sec}, {msg}")
            .expect("a valid template"),
    );
    // Wait for the run, redrawing the bar every 20 ms until it ends.
    loop {
        let p = run.progress();
        bar.set_length(p.submitted.max(1));
        bar.set_position(p.completed + p.failed);
        bar.set_message(if p.submitting { "submitting" } else { "running" });
        match run.wait_timeout(Duration::from_millis(20)) {
            Err(e) if e.kind() == simpler::ErrorKind::Timeout => continue,
            other => break other?,
        }
    }
    let p = run.progress();
    bar.set_position(p.completed + p.failed);
    bar.finish_with_message("done");
    worker.close()?;
    if (p.submitted, p.completed, p.failed) != (TASKS, TASKS, 0) {
        eprintln!("FAILED: {p:?}");
        return Ok(ExitCode::FAILURE);
    }
    println!("{} tasks completed, none failed", p.completed);
    Ok(ExitCode::SUCCESS)
}
