//! Dependency inference from tags: RAW chains, WAW and INOUT ordering, NO_DEP, OUTPUT_EXISTING,
//! disjoint versus overlapping views, diamonds; checked by values, by concurrency probes and by
//! the captured DAG.

mod common;

use common::*;
use simpler::{DataType, RunOptions, Tag, TaskArgs, memory::TensorView, trace::EdgeReason};

/// How long an `exclusive` probe holds, giving a wrongly concurrent task time to overlap it.
const HOLD_US: u64 = 15_000;

#[isolated_test]
fn raw_chain_runs_in_order() {
    const N: usize = 24;
    let (rig, [affine]) = Rig::start(subs(2), [("affine", affine)]);
    let buf = u64_buffer(&rig, N + 1);
    buf.write(0, &[1u64]).unwrap();
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            for i in 0..N {
                let mut a = TaskArgs::new();
                a.input(&u64s(&buf, i, 1))?.output(&u64s(&buf, i + 1, 1))?.scalar(3).scalar(i as u64);
                orch.submit_sub(&affine, a)?;
            }
            Ok(())
        })
        .unwrap();
    run.wait().unwrap();

    let mut expect = vec![1u64];
    for i in 0..N as u64 {
        expect.push(expect.last().unwrap().wrapping_mul(3).wrapping_add(i));
    }
    assert_eq!(read_u64(&buf, 0, N + 1), expect, "every link read its predecessor's output");
    let dag = run.dag().unwrap();
    assert_eq!(dag.graph().edge_count(), N - 1);
    for i in 1..N as u32 {
        assert!(dag.has_edge(i - 1, i), "missing RAW edge {} -> {i}", i - 1);
    }
}

#[isolated_test]
fn raw_chain_through_heap_allocations() {
    const N: usize = 16;
    let (rig, [fill, affine]) = Rig::start(subs(2), [("fill", fill), ("affine", affine)]);
    let out = u64_buffer(&rig, 64);
    rig.run(|orch| {
        let mut cur = orch.alloc(&[64], DataType::Uint64)?;
        let mut a = TaskArgs::new();
        a.output(&cur)?.scalar(5);
        orch.submit_sub(&fill, a)?;
        for _ in 0..N {
            let next = orch.alloc(&[64], DataType::Uint64)?;
            let mut a = TaskArgs::new();
            a.input(&cur)?.output(&next)?.scalar(1).scalar(2);
            orch.submit_sub(&affine, a)?;
            cur = next;
        }
        let mut a = TaskArgs::new();
        a.input(&cur)?.output(&u64s(&out, 0, 64))?.scalar(1).scalar(0);
        orch.submit_sub(&affine, a)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(read_u64(&out, 0, 64), vec![5 + 2 * N as u64; 64]);
}

#[isolated_test]
fn waw_later_writer_wins() {
    // The later writer is tagged InOut: it looks up the current writer (RaW + WaW) and waits.
    let (rig, [exclusive]) = Rig::start(subs(2), [("exclusive", exclusive)]);
    let data = u64_buffer(&rig, 8);
    let scratch = u32_buffer(&rig, 2);
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            for (tag, value) in [(Tag::Output, 1u64), (Tag::InOut, 2)] {
                let mut a = TaskArgs::new();
                a.untracked(&words_of(&scratch))?.add_tensor(&u64s(&data, 0, 8), tag)?;
                a.scalar(HOLD_US).scalar(1).scalar(value);
                orch.submit_sub(&exclusive, a)?;
            }
            Ok(())
        })
        .unwrap();
    run.wait().unwrap();
    assert_eq!(read_u64(&data, 0, 8), vec![2; 8], "the later writer's value wins");
    assert_eq!(read_u32(&scratch, 1, 1)[0], 1, "the two writers never ran at once");
    let dag = run.dag().unwrap();
    assert!(dag.has_edge(0, 1), "WAW edge 0 -> 1 missing:\n{}", dag.to_dot());
}

#[isolated_test]
fn plain_output_writers_are_ordered() {
    // Write after write: the second Output waits for the first (a deliberate divergence from the
    // upstream, which leaves them unordered), so they never hold the bytes at once.
    let (rig, [exclusive]) = Rig::start(subs(2), [("exclusive", exclusive)]);
    let data = u64_buffer(&rig, 8);
    let scratch = u32_buffer(&rig, 2);
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            for value in [1u64, 2] {
                let mut a = TaskArgs::new();
                a.untracked(&words_of(&scratch))?.output(&u64s(&data, 0, 8))?;
                a.scalar(HOLD_US).scalar(1).scalar(value);
                orch.submit_sub(&exclusive, a)?;
            }
            Ok(())
        })
        .unwrap();
    run.wait().unwrap();
    assert_eq!(read_u64(&data, 0, 8), vec![2; 8], "the later writer's value wins");
    assert_eq!(read_u32(&scratch, 1, 1)[0], 1, "the two writers never ran at once");
    let dag = run.dag().unwrap();
    assert!(dag.has_edge(0, 1), "WaW edge 0 -> 1 missing:\n{}", dag.to_dot());
    let e = dag.graph().edge_indices().next().unwrap();
    assert!(matches!(dag.graph()[e], EdgeReason::WriteAfterWrite { arg: 1, .. }), "{:?}", dag.graph()[e]);
    assert!(dag.to_dot().contains("write after write"), "{}", dag.to_dot());
}

#[isolated_test]
fn inout_accumulates_in_submission_order() {
    let (rig, [exclusive]) = Rig::start(subs(2), [("exclusive", exclusive)]);
    let data = u64_buffer(&rig, 4);
    let scratch = u32_buffer(&rig, 2);
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            for digit in 1..=5u64 {
                let mut a = TaskArgs::new();
                a.untracked(&words_of(&scratch))?.inout(&u64s(&data, 0, 4))?;
                a.scalar(HOLD_US / 2).scalar(2).scalar(digit);
                orch.submit_sub(&exclusive, a)?;
            }
            Ok(())
        })
        .unwrap();
    run.wait().unwrap();
    assert_eq!(read_u64(&data, 0, 4), vec![12345; 4], "x = x * 10 + d applied for d = 1..=5 in order");
    assert_eq!(read_u32(&scratch, 1, 1)[0], 1, "INOUT updates of one tensor never overlap");
    let dag = run.dag().unwrap();
    for i in 1..5 {
        assert!(dag.has_edge(i - 1, i), "missing INOUT edge {} -> {i}", i - 1);
    }
}

#[isolated_test]
fn no_dep_reader_does_not_wait_for_the_writer() {
    // The writer blocks until the NO_DEP reader releases it: if the reader waited for the
    // writer, neither could finish.
    let (rig, [block, release]) =
        Rig::start(subs(2), [("block_on_flag", block_on_flag), ("release_flag", release_flag)]);
    let data = u64_buffer(&rig, 4);
    let flag = u32_buffer(&rig, 2);
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            let mut w = TaskArgs::new();
            w.untracked(&words_of(&flag))?.output(&u64s(&data, 0, 4))?.scalar(5_000).scalar(7);
            orch.submit_sub(&block, w)?;
            let mut r = TaskArgs::new();
            r.untracked(&words_of(&flag))?.untracked(&u64s(&data, 0, 4))?;
            orch.submit_sub(&release, r)?;
            Ok(())
        })
        .unwrap();
    run.wait().unwrap();
    assert_eq!(read_u64(&data, 0, 4), vec![7; 4]);
    let dag = run.dag().unwrap();
    assert_eq!(dag.graph().node_count(), 2);
    assert_eq!(dag.graph().edge_count(), 0, "NO_DEP adds no edge:\n{}", dag.to_dot());
}

#[isolated_test]
fn no_dep_writer_is_not_waited_for() {
    // A NO_DEP "writer" does not become the tensor's writer: a later Input reader does not wait
    // for it. The writer blocks until that reader releases it.
    let (rig, [block, release]) =
        Rig::start(subs(2), [("block_on_flag", block_on_flag), ("release_flag", release_flag)]);
    let data = u64_buffer(&rig, 4);
    let flag = u32_buffer(&rig, 2);
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            let mut w = TaskArgs::new();
            w.untracked(&words_of(&flag))?.untracked(&u64s(&data, 0, 4))?;
            w.scalar(5_000).scalar(3);
            orch.submit_sub(&block, w)?;
            let mut r = TaskArgs::new();
            r.untracked(&words_of(&flag))?.input(&u64s(&data, 0, 4))?;
            orch.submit_sub(&release, r)?;
            Ok(())
        })
        .unwrap();
    run.wait().expect("the Input reader ran while the NO_DEP writer was still running");
    assert_eq!(read_u64(&data, 0, 4), vec![3; 4]);
    assert_eq!(run.dag().unwrap().graph().edge_count(), 0);
}

#[isolated_test]
fn output_existing_orders_later_readers() {
    let (rig, [exclusive, affine]) = Rig::start(subs(2), [("exclusive", exclusive), ("affine", affine)]);
    let data = u64_buffer(&rig, 4);
    let out = u64_buffer(&rig, 4);
    let scratch = u32_buffer(&rig, 2);
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            let mut w = TaskArgs::new();
            w.untracked(&words_of(&scratch))?.add_tensor(&u64s(&data, 0, 4), Tag::OutputExisting)?;
            w.scalar(HOLD_US).scalar(1).scalar(7);
            orch.submit_sub(&exclusive, w)?;
            let mut r = TaskArgs::new();
            r.input(&u64s(&data, 0, 4))?.output(&u64s(&out, 0, 4))?.scalar(10).scalar(1);
            orch.submit_sub(&affine, r)?;
            Ok(())
        })
        .unwrap();
    run.wait().unwrap();
    assert_eq!(read_u64(&out, 0, 4), vec![71; 4], "the reader saw the OUTPUT_EXISTING write");
    let dag = run.dag().unwrap();
    assert!(dag.has_edge(0, 1), "OUTPUT_EXISTING -> Input edge missing:\n{}", dag.to_dot());
    let e = dag.graph().edge_indices().next().unwrap();
    assert!(matches!(dag.graph()[e], EdgeReason::Tensor { arg: 0, .. }), "{:?}", dag.graph()[e]);
}

#[isolated_test]
fn output_waits_for_earlier_readers_and_inout_for_writers() {
    // Write after read: the overwrite waits for the reader (a deliberate divergence from the
    // upstream), so the reader sees the old value. InOut waits for the writer.
    let (rig, [fill, affine]) = Rig::start(subs(2), [("fill", fill), ("affine", affine)]);
    let data = u64_buffer(&rig, 4);
    let out = u64_buffer(&rig, 4);
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            let mut r = TaskArgs::new(); // 0: reads data (zeros)
            r.input(&u64s(&data, 0, 4))?.output(&u64s(&out, 0, 4))?.scalar(1).scalar(5);
            orch.submit_sub(&affine, r)?;
            let mut w = TaskArgs::new(); // 1: overwrites data; waits for the reader
            w.output(&u64s(&data, 0, 4))?.scalar(3);
            orch.submit_sub(&fill, w)?;
            let mut u = TaskArgs::new(); // 2: InOut on data waits for writer 1 and nothing else
            u.inout(&u64s(&data, 0, 4))?.scalar(4);
            orch.submit_sub(&fill, u)?;
            Ok(())
        })
        .unwrap();
    run.wait().unwrap();
    let dag = run.dag().unwrap();
    let g = dag.graph();
    let reason =
        |from: u32, to: u32| g.find_edge(dag.node(from).unwrap(), dag.node(to).unwrap()).map(|e| g[e]);
    assert!(matches!(reason(0, 1), Some(EdgeReason::WriteAfterRead { arg: 0, .. })), "{}", dag.to_dot());
    assert!(matches!(reason(1, 2), Some(EdgeReason::Tensor { arg: 0, .. })), "{}", dag.to_dot());
    assert_eq!(g.edge_count(), 2, "{}", dag.to_dot()); // 2 waits for 1, which waited for 0
    assert!(dag.to_dot().contains("write after read"), "{}", dag.to_dot());
    assert_eq!(read_u64(&out, 0, 4), vec![5; 4], "the reader saw data before the overwrite");
    assert_eq!(read_u64(&data, 0, 4), vec![4; 4]);
}

#[isolated_test]
fn disjoint_views_of_one_buffer_run_in_parallel() {
    let (rig, [rendezvous]) = Rig::start(subs(2), [("rendezvous", rendezvous)]);
    let data = u64_buffer(&rig, 16);
    let scratch = u32_buffer(&rig, 1);
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            for (half, value) in [(0usize, 10u64), (8, 20)] {
                let mut a = TaskArgs::new();
                a.untracked(&words_of(&scratch))?.output(&u64s(&data, half, 8))?;
                a.scalar(2).scalar(5_000).scalar(value);
                orch.submit_sub(&rendezvous, a)?;
            }
            Ok(())
        })
        .unwrap();
    run.wait().expect("both writers of disjoint halves must run at the same time");
    let mut expect = vec![10u64; 8];
    expect.extend([20u64; 8]);
    assert_eq!(read_u64(&data, 0, 16), expect);
    let dag = run.dag().unwrap();
    assert_eq!(dag.graph().edge_count(), 0, "disjoint views add no edge:\n{}", dag.to_dot());
}

#[isolated_test]
fn disjoint_column_blocks_run_in_parallel() {
    // The left and right column blocks of a 4x4 matrix interleave in bytes but share no element.
    let (rig, [rendezvous]) = Rig::start(subs(2), [("rendezvous", rendezvous)]);
    let data = u64_buffer(&rig, 16);
    let scratch = u32_buffer(&rig, 1);
    let block = |col: u64| {
        data.view(TensorView::new(8 * col, &[4, 2], Some(&[4, 1]), DataType::Uint64).unwrap()).unwrap()
    };
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            for col in [0u64, 2] {
                let mut a = TaskArgs::new();
                a.untracked(&words_of(&scratch))?.output(&block(col))?;
                a.scalar(2).scalar(5_000);
                orch.submit_sub(&rendezvous, a)?;
            }
            Ok(())
        })
        .unwrap();
    run.wait().expect("writers of disjoint column blocks must run at the same time");
    assert_eq!(run.dag().unwrap().graph().edge_count(), 0);
}

#[isolated_test]
fn overlapping_views_serialize() {
    let (rig, [exclusive]) = Rig::start(subs(2), [("exclusive", exclusive)]);
    let data = u64_buffer(&rig, 12);
    let scratch = u32_buffer(&rig, 2);
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            for (start, tag, value) in [(0usize, Tag::Output, 1u64), (4, Tag::InOut, 2)] {
                let mut a = TaskArgs::new();
                a.untracked(&words_of(&scratch))?.add_tensor(&u64s(&data, start, 8), tag)?;
                a.scalar(HOLD_US).scalar(1).scalar(value);
                orch.submit_sub(&exclusive, a)?;
            }
            // A reader of [2, 6) overlaps both writers.
            let mut r = TaskArgs::new();
            r.untracked(&words_of(&scratch))?.input(&u64s(&data, 2, 4))?.scalar(HOLD_US);
            orch.submit_sub(&exclusive, r)?;
            Ok(())
        })
        .unwrap();
    run.wait().unwrap();
    assert_eq!(read_u32(&scratch, 1, 1)[0], 1, "tasks on overlapping views never run at once");
    let mut expect = vec![1u64; 4];
    expect.extend([2u64; 8]);
    assert_eq!(read_u64(&data, 0, 12), expect, "the later writer wins where the views overlap");
    let dag = run.dag().unwrap();
    for (from, to) in [(0, 1), (0, 2), (1, 2)] {
        assert!(dag.has_edge(from, to), "overlap edge {from} -> {to} missing:\n{}", dag.to_dot());
    }
}

#[isolated_test]
fn partially_covered_writer_is_still_waited_for() {
    // w0 writes [0, 8); w1 updates [0, 4) in place (covers only part of w0). A reader of [4, 8)
    // must still wait for w0, and a reader of [0, 8) for both.
    let (rig, [fill, sum]) = Rig::start(subs(2), [("fill", fill), ("sum", sum)]);
    let data = u64_buffer(&rig, 8);
    let out = u64_buffer(&rig, 12);
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            let mut w0 = TaskArgs::new();
            w0.output(&u64s(&data, 0, 8))?.scalar(1);
            orch.submit_sub(&fill, w0)?;
            let mut w1 = TaskArgs::new();
            w1.inout(&u64s(&data, 0, 4))?.scalar(2);
            orch.submit_sub(&fill, w1)?;
            let mut r2 = TaskArgs::new();
            r2.input(&u64s(&data, 4, 4))?.output(&u64s(&out, 0, 4))?;
            orch.submit_sub(&sum, r2)?;
            let mut r3 = TaskArgs::new();
            r3.input(&u64s(&data, 0, 8))?.output(&u64s(&out, 4, 8))?;
            orch.submit_sub(&sum, r3)?;
            Ok(())
        })
        .unwrap();
    run.wait().unwrap();
    let dag = run.dag().unwrap();
    assert!(dag.has_edge(0, 1), "WAW on the overlap:\n{}", dag.to_dot());
    assert!(dag.has_edge(0, 2), "the reader of [4, 8) waits for w0:\n{}", dag.to_dot());
    assert!(!dag.has_edge(1, 2), "w1 does not touch [4, 8):\n{}", dag.to_dot());
    assert!(dag.has_edge(0, 3) && dag.has_edge(1, 3), "the full reader waits for both:\n{}", dag.to_dot());
    assert_eq!(read_u64(&out, 0, 12), vec![1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1]);
}

#[isolated_test]
fn diamond() {
    let (rig, [affine, sum]) = Rig::start(subs(2), [("affine", affine), ("sum", sum)]);
    let x = u64_buffer(&rig, 32);
    let d = u64_buffer(&rig, 32);
    let xs: Vec<u64> = (0..32).collect();
    x.write(0, &xs).unwrap();
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            let a = orch.alloc(&[32], DataType::Uint64)?;
            let b = orch.alloc(&[32], DataType::Uint64)?;
            let c = orch.alloc(&[32], DataType::Uint64)?;
            let mut ta = TaskArgs::new(); // a = x + 1
            ta.input(&u64s(&x, 0, 32))?.output(&a)?.scalar(1).scalar(1);
            orch.submit_sub(&affine, ta)?;
            let mut tb = TaskArgs::new(); // b = 2a
            tb.input(&a)?.output(&b)?.scalar(2).scalar(0);
            orch.submit_sub(&affine, tb)?;
            let mut tc = TaskArgs::new(); // c = 3a + 5
            tc.input(&a)?.output(&c)?.scalar(3).scalar(5);
            orch.submit_sub(&affine, tc)?;
            let mut td = TaskArgs::new(); // d = b + c
            td.input(&b)?.input(&c)?.output(&u64s(&d, 0, 32))?;
            orch.submit_sub(&sum, td)?;
            Ok(())
        })
        .unwrap();
    run.wait().unwrap();
    let expect: Vec<u64> = xs.iter().map(|v| 5 * (v + 1) + 5).collect();
    assert_eq!(read_u64(&d, 0, 32), expect);
    let dag = run.dag().unwrap();
    for (from, to) in [(0, 1), (0, 2), (1, 3), (2, 3)] {
        assert!(dag.has_edge(from, to), "missing edge {from} -> {to}:\n{}", dag.to_dot());
    }
    assert!(!dag.has_edge(0, 3) && !dag.has_edge(1, 2) && !dag.has_edge(2, 1), "{}", dag.to_dot());
    assert_eq!(dag.graph().edge_count(), 4);
    assert_eq!(run.stats().unwrap().tasks, 4);
}

#[isolated_test]
fn read_only_overlap_in_one_task_is_allowed() {
    let (rig, [sum]) = Rig::start(subs(1), [("sum", sum)]);
    let x = u64_buffer(&rig, 8);
    let out = u64_buffer(&rig, 4);
    x.write(0, &[1u64, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.input(&u64s(&x, 0, 4))?.input(&u64s(&x, 2, 4))?.output(&u64s(&out, 0, 4))?;
        orch.submit_sub(&sum, a)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(read_u64(&out, 0, 4), vec![4, 6, 8, 10]);
}

#[isolated_test]
fn runs_never_share_edges_but_run_in_order() {
    // Keys never match across runs; still, a later run starts only after the earlier one
    // finished, so it sees the earlier run's writes.
    let (rig, [exclusive, affine]) = Rig::start(subs(2), [("exclusive", exclusive), ("affine", affine)]);
    let data = u64_buffer(&rig, 4);
    let out = u64_buffer(&rig, 4);
    let scratch = u32_buffer(&rig, 2);
    let r1 = rig
        .submit(|orch| {
            let mut w = TaskArgs::new();
            w.untracked(&words_of(&scratch))?.output(&u64s(&data, 0, 4))?;
            w.scalar(HOLD_US).scalar(1).scalar(9);
            orch.submit_sub(&exclusive, w).map(|_| ())
        })
        .unwrap();
    let r2 = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            let mut r = TaskArgs::new();
            r.input(&u64s(&data, 0, 4))?.output(&u64s(&out, 0, 4))?.scalar(1).scalar(1);
            orch.submit_sub(&affine, r).map(|_| ())
        })
        .unwrap();
    r1.wait().unwrap();
    r2.wait().unwrap();
    assert_eq!(read_u64(&out, 0, 4), vec![10; 4], "run 2 ran after run 1 finished");
    assert_eq!(r2.dag().unwrap().graph().edge_count(), 0);
}
