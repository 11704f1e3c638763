//! The heap rings behind `orch.alloc`: scopes reclaim them, a full ring applies back-pressure,
//! and requests that can never be served fail with errors that name `heap_ring_size`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use simpler::{DataType, ErrorKind, TaskArgs, memory::TensorView};

const RING: u64 = 64 * 1024;

fn small_ring() -> simpler::WorkerBuilder {
    subs(2).heap_ring_size(RING)
}

/// Many rounds, so that allocation often waits for room while the background scheduler thread
/// holds the scheduler role: that path must not lose blocks either.
#[isolated_test]
fn scopes_reclaim_heap_under_a_small_ring() {
    const ROUNDS: usize = 2000;
    const ELEMS: u32 = 2048; // 16 KiB per allocation: 2000 rounds move 500x the ring
    let (rig, [fill, affine]) = Rig::start(
        small_ring().backpressure_timeout(Duration::from_secs(2)),
        [("fill", fill), ("affine", affine)],
    );
    let out = u64_buffer(&rig, ROUNDS + 1);
    let run = rig
        .submit(|orch| {
            // A long-lived outer allocation fills most of ring 0; the inner scopes use ring 1
            // and never wait for it.
            let outer = orch.alloc(&[6 * 1024], DataType::Uint64)?;
            let mut a = TaskArgs::new();
            a.output(&outer)?.scalar(1000);
            orch.submit_sub(&fill, a)?;
            for i in 0..ROUNDS {
                orch.scope(|o| {
                    assert_eq!(o.scope_depth(), 1);
                    let tmp = o.alloc(&[ELEMS], DataType::Uint64)?;
                    let mut a = TaskArgs::new();
                    a.output(&tmp)?.scalar(i as u64);
                    o.submit_sub(&fill, a)?;
                    // A one-element view of the allocation still depends on its writer.
                    let first = tmp.reshape(TensorView::new(0, &[1], None, DataType::Uint64)?)?;
                    let mut a = TaskArgs::new();
                    a.input(&first)?.output(&u64s(&out, i, 1))?.scalar(2).scalar(1);
                    o.submit_sub(&affine, a)?;
                    Ok(())
                })?;
            }
            let last = outer.reshape(TensorView::new(8 * 1024, &[1], None, DataType::Uint64)?)?;
            let mut a = TaskArgs::new();
            a.input(&last)?.output(&u64s(&out, ROUNDS, 1))?.scalar(1).scalar(0);
            orch.submit_sub(&affine, a)?;
            Ok(())
        })
        .expect("allocations far beyond the ring succeed once scopes release them");
    run.wait().unwrap();
    let mut expect: Vec<u64> = (0..ROUNDS as u64).map(|i| 2 * i + 1).collect();
    expect.push(1000);
    assert_eq!(read_u64(&out, 0, ROUNDS + 1), expect);
    assert_eq!(run.stats().unwrap().tasks, 2 * ROUNDS as u64 + 2, "allocations are not tasks");
}

#[isolated_test]
fn nested_scopes_reclaim_their_own_rings() {
    let (rig, [fill]) = Rig::start(small_ring(), [("fill", fill)]);
    let out = u64_buffer(&rig, 4);
    rig.run(|orch| {
        for round in 0..24u64 {
            // Depths 1, 2, 3 and 4 (rings 1, 2, 3, 3): 16 KiB each per round.
            fn nest(
                o: &mut simpler::Orchestrator<'_>,
                left: u32,
                fill: &simpler::CallableHandle,
                v: u64,
            ) -> simpler::Result<()> {
                if left == 0 {
                    return Ok(());
                }
                o.scope(|o| {
                    let t = o.alloc(&[2048], DataType::Uint64)?;
                    let mut a = TaskArgs::new();
                    a.output(&t)?.scalar(v);
                    o.submit_sub(fill, a)?;
                    nest(o, left - 1, fill, v)
                })
            }
            nest(orch, 4, &fill, round)?;
        }
        let mut a = TaskArgs::new();
        a.output(&u64s(&out, 0, 4))?.scalar(3);
        orch.submit_sub(&fill, a)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(read_u64(&out, 0, 4), vec![3; 4]);
}

#[isolated_test]
fn allocation_larger_than_the_ring_fails_at_once() {
    let (rig, [_fill]) =
        Rig::start(small_ring().backpressure_timeout(Duration::from_secs(10)), [("fill", fill)]);
    let started = Instant::now();
    let err = rig
        .run(|orch| {
            orch.alloc(&[RING as u32 / 8 + 1], DataType::Uint64)?;
            Ok(())
        })
        .expect_err("an allocation larger than a ring can never succeed");
    assert_err(&err, ErrorKind::InvalidArgument, &["heap_ring_size", &RING.to_string()]);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "failed at once, not after the back-pressure timeout"
    );
}

#[isolated_test]
fn full_outer_ring_times_out() {
    let timeout = Duration::from_millis(200);
    let (rig, [fill]) = Rig::start(small_ring().backpressure_timeout(timeout), [("fill", fill)]);
    let out = u64_buffer(&rig, 1);
    let mut served = 0;
    let mut waited = Duration::ZERO;
    let err = rig
        .run(|orch| {
            // Nothing in the outer scope is reclaimed before the run ends.
            for _ in 0..16 {
                let started = Instant::now();
                let r = orch.alloc(&[2048], DataType::Uint64);
                waited = started.elapsed();
                r?;
                served += 1;
            }
            Ok(())
        })
        .expect_err("the fifth 16 KiB block does not fit a 64 KiB ring");
    assert_err(&err, ErrorKind::Timeout, &["heap_ring_size", "orch.alloc"]);
    assert!((3..=4).contains(&served), "{served} blocks of 16 KiB fit a 64 KiB ring");
    assert!(waited >= timeout, "the failing alloc waited for room ({waited:?})");
    // The failed run released its allocations: the Worker is usable and the ring is empty again.
    rig.run(|orch| {
        let t = orch.alloc(&[4 * 2048], DataType::Uint64)?;
        let mut a = TaskArgs::new();
        a.output(&t)?.scalar(1);
        orch.submit_sub(&fill, a)?;
        let mut a = TaskArgs::new();
        a.output(&u64s(&out, 0, 1))?.scalar(2);
        orch.submit_sub(&fill, a)?;
        Ok(())
    })
    .expect("a whole-ring allocation fits once the failed run released its blocks");
    assert_eq!(read_u64(&out, 0, 1), vec![2]);
    rig.close().unwrap();
}

#[isolated_test]
fn disabled_heap_refuses_allocations() {
    let (rig, [_fill]) = Rig::start(subs(1).heap_ring_size(0), [("fill", fill)]);
    let err =
        rig.run(|orch| orch.alloc(&[8], DataType::Uint64).map(|_| ())).expect_err("the heap is disabled");
    assert_err(&err, ErrorKind::InvalidArgument, &["heap_ring_size"]);
}

#[isolated_test]
fn host_buffers_are_bounds_checked_and_never_empty() {
    let mut rig = Rig::new(subs(1));
    rig.init();
    expect_err(rig.create_buffer(0), ErrorKind::InvalidArgument, &["nbytes"]);
    let b = rig.create_buffer(16).unwrap();
    assert_eq!(b.nbytes(), 16);
    b.write(0, &[1u32, 2, 3, 4]).unwrap();
    expect_err(b.write(1, &[0u32; 4]), ErrorKind::InvalidArgument, &["16"]);
    expect_err(b.read::<u64>(1, 2), ErrorKind::InvalidArgument, &["16"]);
    assert_eq!(b.read::<u32>(1, 3).unwrap(), vec![2, 3, 4], "a refused write changed nothing");
    let clone = b.clone();
    drop(b);
    assert_eq!(leftover_shm().len(), 1, "a clone keeps the buffer alive");
    assert_eq!(clone.read::<u32>(0, 1).unwrap(), vec![1]);
    drop(clone);
    assert!(leftover_shm().is_empty(), "the last clone unlinks it");
}

#[isolated_test]
fn a_buffer_dropped_while_a_run_uses_it_lives_until_the_run_is_done() {
    let (rig, [block, affine]) = Rig::start(subs(2), [("block_on_flag", block_on_flag), ("affine", affine)]);
    let flag = u32_buffer(&rig, 2);
    let out = u64_buffer(&rig, 4);
    let input = u64_buffer(&rig, 4);
    input.write(0, &[5u64; 4]).unwrap();
    let run = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.untracked(&words_of(&flag))?.scalar(10_000);
            let gate = orch.submit_sub(&block, a)?;
            let mut a = TaskArgs::new();
            a.input(&u64s(&input, 0, 4))?.output(&u64s(&out, 0, 4))?.scalar(1).scalar(1).add_dep_wait(gate);
            orch.submit_sub(&affine, a).map(|_| ())
        })
        .unwrap();
    let name = input.desc().backing();
    drop(input);
    assert_eq!(leftover_shm().len(), 3, "the pending task keeps the dropped buffer ({name:?})");
    release(&flag);
    run.wait().unwrap();
    assert_eq!(read_u64(&out, 0, 4), vec![6; 4], "the task read the dropped buffer's data");
    // The thread that completed the last task drops its record (and the buffer's last
    // reference) just after the run is done: the name goes within moments, not with the run.
    wait_for("the dropped buffer to be unlinked once the run is done", Duration::from_secs(10), || {
        leftover_shm().len() == 2
    });
}

#[isolated_test]
fn more_buffers_than_a_worker_keeps_mapped() {
    // A SUB worker caches a bounded number of mappings; buffers evicted from its cache are
    // mapped again when a later task names them.
    const N: usize = 100;
    let (rig, [fill, affine]) = Rig::start(subs(1), [("fill", fill), ("affine", affine)]);
    let bufs: Vec<_> = (0..N).map(|_| u64_buffer(&rig, 1)).collect();
    let out = u64_buffer(&rig, N);
    for pass in 0..2u64 {
        rig.run(|orch| {
            for (i, b) in bufs.iter().enumerate() {
                let mut a = TaskArgs::new();
                if pass == 0 {
                    a.output(&u64s(b, 0, 1))?.scalar(i as u64);
                    orch.submit_sub(&fill, a)?;
                } else {
                    a.input(&u64s(b, 0, 1))?.output(&u64s(&out, i, 1))?.scalar(3).scalar(0);
                    orch.submit_sub(&affine, a)?;
                }
            }
            Ok(())
        })
        .unwrap();
    }
    assert_eq!(read_u64(&out, 0, N), (0..N as u64).map(|i| 3 * i).collect::<Vec<_>>());
}
