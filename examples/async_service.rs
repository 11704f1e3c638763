//! A service on tokio: many concurrent requests, each answered by a run of a small graph on
//! SUB workers, with no thread blocked per request.
//!
//! Twenty client tasks send ten requests each. A request writes its input into the client's
//! buffer, submits a run with [`Worker::submit_async`] (which waits, without blocking, while
//! `pending_run_depth` runs are admitted) and awaits the run's handle (a future of its result),
//! then checks the answer. A progress line counts the requests served. Run it with
//! `cargo run --example async_service`.

#![allow(clippy::print_stdout, clippy::print_stderr)] // An example talks to its user.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use simpler::prelude::*;

const CLIENTS: usize = 20;
const REQUESTS: usize = 10;
const N: u32 = 256;

/// `y = x * x + k`, one half of a request's answer.
#[callable(sub)]
fn score(x: In<f32>, mut y: Out<f32>, k: f32) {
    for (o, v) in y.iter_mut().zip(x.iter()) {
        *o = v * v + k;
    }
}

/// One request's graph: both halves of the input scored in parallel.
fn answer(
    orch: &mut Orchestrator<'_>,
    x: &TensorOf<f32>,
    y: &mut TensorOf<f32>,
    k: f32,
) -> simpler::Result<()> {
    let xs = x.split(2)?;
    let mut ys = y.split(2)?;
    for (xh, yh) in xs.iter().zip(ys.iter_mut()) {
        score::call(xh, yh, k)?.on(orch, sub())?;
    }
    Ok(())
}

fn main() -> simpler::Result<ExitCode> {
    let mut worker = Worker::builder().sub_workers(2).pending_run_depth(4).build()?;
    worker.init()?;
    let worker = Arc::new(worker);
    let served = Arc::new(AtomicUsize::new(0));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| simpler::Error::new(simpler::ErrorKind::Os, format!("tokio runtime: {e}")))?;
    let started = Instant::now();
    let wrong = runtime.block_on(async {
        // The progress line, refreshed while requests are served.
        let progress = {
            let served = served.clone();
            tokio::spawn(async move {
                loop {
                    eprint!("\rserved {}/{}", served.load(Ordering::Relaxed), CLIENTS * REQUESTS);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        };
        let mut clients = Vec::new();
        for c in 0..CLIENTS {
            let (worker, served) = (worker.clone(), served.clone());
            clients.push(tokio::spawn(async move { client(&worker, c, &served).await }));
        }
        let mut wrong = 0;
        for c in clients {
            wrong += c
                .await
                .map_err(|e| simpler::Error::new(simpler::ErrorKind::Internal, format!("client: {e}")))??;
        }
        progress.abort();
        Ok::<usize, simpler::Error>(wrong)
    })?;
    eprintln!("\rserved {}/{}", served.load(Ordering::Relaxed), CLIENTS * REQUESTS);
    println!(
        "{} requests from {CLIENTS} clients in {:.1?}, each a run of two SUB tasks; {wrong} wrong answers",
        CLIENTS * REQUESTS,
        started.elapsed()
    );
    drop(runtime);
    // Closes through the shared handle: no `Arc::try_unwrap` needed.
    worker.close()?;
    Ok(if wrong == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// One client: `REQUESTS` requests in turn, through buffers of its own; returns how many
/// answers were wrong.
async fn client(worker: &Worker, c: usize, served: &AtomicUsize) -> simpler::Result<usize> {
    let (bx, by) = (worker.create_buffer(4 * N as usize)?, worker.create_buffer(4 * N as usize)?);
    let x = bx.typed::<f32>(&[N])?;
    let mut y = by.typed::<f32>(&[N])?;
    let mut wrong = 0;
    for r in 0..REQUESTS {
        let input: Vec<f32> = (0..N).map(|i| (c * 1000 + r * 10) as f32 + i as f32 * 0.001).collect();
        bx.write(0, &input)?;
        let k = r as f32;
        let run = worker.submit_async(RunOptions::new(), |orch, _, _| answer(orch, &x, &mut y, k)).await?;
        run.await?;
        let got = by.read::<f32>(0, N as usize)?;
        wrong += usize::from(got.iter().zip(&input).any(|(g, v)| *g != v * v + k));
        served.fetch_add(1, Ordering::Relaxed);
    }
    Ok(wrong)
}
