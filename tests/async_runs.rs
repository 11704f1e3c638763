//! Runs as futures: `run.await` under tokio's runtimes, with no thread blocked per run; the
//! run's end wakes the future; deadlines and cancellation (by `cancel()` or by dropping the
//! future) work as for a blocking wait.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use simpler::dsl::{In, Out};
use simpler::{ErrorKind, HostArgs, HostResult, RunOptions, TaskArgs};

/// `out[0] = k` (the task's scalar).
fn put(args: &HostArgs<'_>) -> HostResult {
    let k = args.scalar(0)?;
    args.output::<u64>(0)?[0] = k;
    Ok(())
}

/// Spins until the test's marker file exists (at most 20 s): a task that runs until it is
/// stopped.
fn spin(_: &HostArgs<'_>) -> HostResult {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        std::thread::yield_now();
    }
    Err("never stopped".into())
}

/// 1000 runs from 100 tokio tasks on a multi-thread runtime with 2 worker threads: every run's
/// result arrives through its future, and no task blocks a runtime thread.
#[isolated_test]
fn a_thousand_runs_awaited_from_a_hundred_tokio_tasks() {
    let (rig, [put]) = Rig::start(subs(2).pending_run_depth(64), [("put", put)]);
    let out = u64_buffer(&rig, 1000);
    let worker = Arc::new(rig);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..100u64 {
            let (worker, out, put) = (worker.clone(), out.clone(), put.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..10u64 {
                    let slot = (t * 10 + i) as usize;
                    let run = worker
                        .submit(|orch| {
                            let mut a = TaskArgs::new();
                            a.output(&u64s(&out, slot, 1))?.scalar(slot as u64 + 1);
                            orch.submit_sub(&put, a).map(|_| ())
                        })
                        .unwrap();
                    run.await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    assert_eq!(read_u64(&out, 0, 1000), (1..=1000).collect::<Vec<u64>>());
    drop(out);
    let rig = Arc::try_unwrap(worker).ok().expect("the tasks are done");
    drop(rig);
}

/// On a current-thread runtime, a run past its deadline ends its future with the deadline's
/// error; a dropped future cancels its run; `cancel()` ends an awaited one.
#[isolated_test]
fn deadlines_and_cancellation_reach_awaited_runs() {
    let (rig, [spin, put]) = Rig::start(subs(2).replace_dead_workers(true), [("spin", spin), ("put", put)]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // A deadline.
        let started = Instant::now();
        let run = rig
            .submit_with(RunOptions::new().deadline(Duration::from_millis(300)), |orch, _, _| {
                orch.submit_sub(&spin, TaskArgs::new()).map(|_| ())
            })
            .unwrap();
        let err = run.await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());

        // cancel() on a clone while the future is awaited.
        let run = rig.submit(|orch| orch.submit_sub(&spin, TaskArgs::new()).map(|_| ())).unwrap();
        let handle = run.clone();
        let canceller = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await; // a while, not a condition
            assert!(handle.cancel());
        });
        let err = run.await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
        canceller.await.unwrap();

        // A future dropped before the run ended cancels the run.
        let run = rig.submit(|orch| orch.submit_sub(&spin, TaskArgs::new()).map(|_| ())).unwrap();
        let watch = run.clone();
        let timed_out = tokio::time::timeout(Duration::from_millis(100), run).await;
        assert!(timed_out.is_err(), "the run spins: {timed_out:?}");
        let err = watch.wait().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
    });
    // The Worker serves on.
    let out = u64_buffer(&rig, 1);
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.output(&u64s(&out, 0, 1))?.scalar(7);
        orch.submit_sub(&put, a).map(|_| ())
    })
    .unwrap();
    assert_eq!(read_u64(&out, 0, 1), vec![7]);
}

/// `Worker::submit_async` waits for room without blocking the runtime: with two runs admitted
/// (`pending_run_depth(2)`) a third submit stays pending while a current-thread runtime's timer
/// still fires, and resolves once a run ends; its run then completes like any other.
#[isolated_test]
fn submit_async_waits_for_room_without_blocking_the_runtime() {
    let (rig, [block, put]) =
        Rig::start(subs(2).pending_run_depth(2), [("block", block_on_flag), ("put", put)]);
    let flag = u32_buffer(&rig, 2);
    let out = u64_buffer(&rig, 3);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let blocking = |i: usize| {
            let (flag, out, block) = (&flag, &out, &block);
            rig.submit_async(RunOptions::new(), move |orch, _, _| {
                let mut a = TaskArgs::new();
                a.untracked(&words_of(flag))?.output(&u64s(out, i, 1))?.scalar(20_000).scalar(7);
                orch.submit_sub(block, a).map(|_| ())
            })
        };
        let first = blocking(0).await.unwrap();
        let second = blocking(1).await.unwrap();
        let mut third = rig.submit_async(RunOptions::new(), |orch, _, _| {
            let mut a = TaskArgs::new();
            a.output(&u64s(&out, 2, 1))?.scalar(9);
            orch.submit_sub(&put, a).map(|_| ())
        });
        let waited = tokio::time::timeout(Duration::from_millis(100), &mut third).await;
        assert!(waited.is_err(), "no room while two runs are admitted, and the runtime's timer fired");
        // Another submit that is dropped while it waits takes nothing with it.
        let mut dropped = rig.submit_async(RunOptions::new(), |_, _, _| Ok(()));
        assert!(tokio::time::timeout(Duration::from_millis(10), &mut dropped).await.is_err());
        drop(dropped);
        release(&flag);
        let third = third.await.expect("admitted once a run ended");
        third.await.unwrap();
        first.await.unwrap();
        second.await.unwrap();
        // Both places are free again: two more submits resolve at once.
        let (a, b) = (
            rig.submit_async(RunOptions::new(), |_, _, _| Ok(())).await.unwrap(),
            rig.submit_async(RunOptions::new(), |_, _, _| Ok(())).await.unwrap(),
        );
        a.await.unwrap();
        b.await.unwrap();
    });
    assert_eq!(read_u64(&out, 0, 3), vec![7, 7, 9]);
}

/// `y = x + k` on a SUB worker.
#[simpler::callable(sub)]
fn add_k(x: In<f32>, mut y: Out<f32>, k: f32) {
    for (o, v) in y.iter_mut().zip(x.iter()) {
        *o = v + k;
    }
}

simpler::task_graph! {
    /// `y = x + 2` on a SUB worker.
    fn add_two(x: In<f32>, y: Out<f32>) {
        add_k(x, &mut y, 2.0).on(sub());
    }
}

/// A `task_graph!` call submitted from tokio tasks with `Call::submit_async` (its future is
/// `Send`, so `tokio::spawn` takes it), each run awaited.
#[isolated_test]
fn graph_calls_are_submitted_and_awaited_from_spawned_tokio_tasks() {
    let (rig, []) = Rig::start(subs(2).pending_run_depth(2), []);
    let worker = Arc::new(rig);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let totals: Vec<f32> = rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..8u32 {
            let worker = worker.clone();
            tasks.push(tokio::spawn(async move {
                let (bx, by) = (worker.create_buffer(16).unwrap(), worker.create_buffer(16).unwrap());
                bx.write(0, &[t as f32; 4]).unwrap();
                let x = bx.typed::<f32>(&[4]).unwrap();
                let mut y = by.typed::<f32>(&[4]).unwrap();
                for _ in 0..5 {
                    add_two::call(&x, &mut y).unwrap().submit_async(&worker).await.unwrap().await.unwrap();
                }
                by.read::<f32>(0, 4).unwrap().iter().sum::<f32>()
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    assert_eq!(totals, (0..8).map(|t| 4.0 * (t as f32 + 2.0)).collect::<Vec<_>>());
}
