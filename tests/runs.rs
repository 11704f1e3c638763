//! Runs: pipelining, run order, independence of results, `wait_timeout`, statistics and the
//! captured DAG.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use simpler::{
    CallableHandle, DataType, ErrorKind, RunHandle, RunOptions, TaskArgs, Tensor, Worker, memory::TensorView,
};

/// Submits a run of one `block_on_flag` task (released through `flag`) that then writes
/// `value` into `out[0]`.
fn blocked_run(
    w: &Worker,
    block: &CallableHandle,
    flag: &simpler::Buffer,
    out: &simpler::Buffer,
    value: u64,
) -> RunHandle {
    w.submit(|orch| {
        let mut a = TaskArgs::new();
        a.untracked(&words_of(flag))?.output(&u64s(out, 0, 1))?.scalar(10_000).scalar(value);
        orch.submit_sub(block, a).map(|_| ())
    })
    .unwrap()
}

/// Submits a run of one `fill` task writing `value` into `out[at]`.
fn fill_run(w: &Worker, fill: &CallableHandle, out: &simpler::Buffer, at: usize, value: u64) -> RunHandle {
    w.submit(|orch| {
        let mut a = TaskArgs::new();
        a.output(&u64s(out, at, 1))?.scalar(value);
        orch.submit_sub(fill, a).map(|_| ())
    })
    .unwrap()
}

#[isolated_test]
fn two_pipelined_runs_are_both_correct() {
    const N: usize = 16;
    let (rig, [affine]) = Rig::start(subs(2), [("affine", affine)]);
    let x = u64_buffer(&rig, N + 1);
    let y = u64_buffer(&rig, N + 1);
    x.write(0, &[1u64]).unwrap();
    y.write(0, &[2u64]).unwrap();
    let chain = |buf: &simpler::Buffer, k: u64| {
        rig.submit(|orch| {
            for i in 0..N {
                let mut a = TaskArgs::new();
                a.input(&u64s(buf, i, 1))?.output(&u64s(buf, i + 1, 1))?.scalar(k).scalar(1);
                orch.submit_sub(&affine, a)?;
            }
            Ok(())
        })
        .unwrap()
    };
    let r1 = chain(&x, 2);
    let r2 = chain(&y, 3);
    assert_eq!(r2.id(), r1.id() + 1);
    // The runs name no buffer in common, so run 2 may finish first (issue 31).
    r2.wait().unwrap();
    r1.wait().unwrap();
    let expect = |start: u64, k: u64| {
        (0..N).fold(vec![start], |mut v, _| {
            v.push(v.last().unwrap() * k + 1);
            v
        })
    };
    assert_eq!(read_u64(&x, 0, N + 1), expect(1, 2));
    assert_eq!(read_u64(&y, 0, N + 1), expect(2, 3));
}

#[isolated_test]
fn a_host_write_to_a_buffer_a_running_task_names_is_refused_until_the_task_ends() {
    let (rig, [block]) = Rig::start(subs(1), [("block_on_flag", block_on_flag)]);
    let flag = u32_buffer(&rig, 2);
    let out = u64_buffer(&rig, 2);
    out.set_name("out").unwrap();
    let r = blocked_run(&rig, &block, &flag, &out, 7);
    wait_blocked(&flag);
    // The task names element 0 of `out`; its worker may hold a slice of it now.
    expect_err(
        out.write(1, &[5u64]),
        ErrorKind::InvalidState,
        &["`out`", "1 submitted task", "wait for their run"],
    );
    assert_eq!(read_u64(&out, 0, 2), vec![0, 0], "reading stays allowed");
    // `flag` is untracked (`NoDep`) in that task: the host still writes it (that releases it).
    release(&flag);
    r.wait().unwrap();
    out.write(1, &[5u64]).unwrap();
    assert_eq!(read_u64(&out, 0, 2), vec![7, 5]);
}

#[isolated_test]
fn every_public_way_to_make_a_tensor_of_a_host_buffer_holds_it_while_a_task_runs() {
    let (rig, [block]) = Rig::start(subs(1), [("block_on_flag", block_on_flag)]);
    let out = u64_buffer(&rig, 8);
    out.set_name("out").unwrap();
    let whole = || TensorView::new(0, &[8], None, DataType::Uint64).unwrap();

    // Every public way to make a tensor of the buffer: each tensor, submitted, must hold the
    // buffer until its task ends, so that no host write changes the `&mut [u64]` the task has.
    // (A tensor of the bare descriptor, `Tensor::new(*out.desc(), ..)`, which held nothing, no
    // longer compiles: `ui/fail/tensor_of_a_bare_descriptor.rs`.)
    let t = out.tensor(&[8], DataType::Uint64).unwrap();
    let ways: Vec<(&str, Tensor)> = vec![
        ("Tensor::new", Tensor::new(&out, whole()).unwrap()),
        ("Buffer::tensor", t.clone()),
        ("Buffer::view", out.view(whole()).unwrap()),
        ("Tensor::reshape", t.reshape(TensorView::new(8, &[1], None, DataType::Uint64).unwrap()).unwrap()),
        ("Tensor::rows", t.rows(0..1).unwrap()),
        ("Tensor::slice", t.slice(0, 2..3).unwrap()),
        ("Tensor::split", t.split(8).unwrap().remove(3)),
        ("Tensor::tiles", t.tiles(&[2]).unwrap().remove(1)),
        ("Tensor::grid", t.grid(&[4]).unwrap().remove(2)),
        ("Tensor::narrowed", t.narrowed(simpler::memory::Access::Write).unwrap()),
    ];
    for (way, tensor) in ways {
        let flag = u32_buffer(&rig, 2);
        let r = rig
            .submit(|orch| {
                let mut a = TaskArgs::new();
                a.untracked(&words_of(&flag))?.output(&tensor)?.scalar(10_000).scalar(9);
                orch.submit_sub(&block, a).map(|_| ())
            })
            .unwrap();
        wait_blocked(&flag);
        let written = out.write(0, &[1u64; 8]);
        release(&flag);
        r.wait().unwrap();
        match written {
            Ok(()) => panic!("a write was accepted while a task held a tensor made by {way} of the buffer"),
            Err(e) => assert_err(&e, ErrorKind::InvalidState, &["`out`", "1 submitted task"]),
        }
        let written = read_u64(&out, 0, 8).iter().filter(|&&v| v == 9).count() as u64;
        assert_eq!(written, tensor.view().num_elements(), "{way}: the task wrote its elements");
        out.write(0, &[0u64; 8]).unwrap();
    }
}

#[isolated_test]
fn a_copy_from_a_chip_into_a_buffer_a_running_task_names_is_refused_until_the_task_ends() {
    let mut rig = Rig::new(subs(1).chips(1).chip_memory(1 << 20).chip_cores(1));
    let block = rig.register(simpler::HostFn::new("block_on_flag", block_on_flag)).unwrap();
    rig.init();
    let dev = rig.alloc_child_tensor(0, &[2], simpler::DataType::Uint64).unwrap();
    let flag = u32_buffer(&rig, 2);
    let out = u64_buffer(&rig, 2);
    let r = blocked_run(&rig, &block, &flag, &out, 7);
    wait_blocked(&flag);
    expect_err(rig.copy_from(&out, &dev), ErrorKind::InvalidState, &["Worker.copy_from", "1 submitted task"]);
    release(&flag);
    r.wait().unwrap();
    rig.copy_from(&out, &dev).unwrap();
    assert_eq!(read_u64(&out, 0, 2), vec![0, 0], "the device buffer's zeros");
    rig.free(&dev).unwrap();
}

/// Reads `x[0]` (an input) twice, a spin apart, through one `&[u64]`, into `out[0..2]`.
fn read_twice(args: &simpler::HostArgs<'_>) -> simpler::HostResult {
    let x = args.input::<u64>(0)?;
    let first = x[0];
    for _ in 0..20_000 {
        std::hint::spin_loop();
    }
    let second = std::hint::black_box(x)[0];
    args.output::<u64>(1)?.copy_from_slice(&[first, second]);
    Ok(())
}

#[isolated_test]
fn host_writes_from_another_thread_never_change_an_input_under_a_running_task() {
    let (rig, [h]) = Rig::start(subs(1), [("read_twice", read_twice)]);
    let x = u64_buffer(&rig, 1);
    let out = u64_buffer(&rig, 2);
    let stop = AtomicBool::new(false);
    let (accepted, refused) = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let (mut accepted, mut refused, mut v) = (0u64, 0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                v += 1;
                match x.write(0, &[v]) {
                    Ok(()) => accepted += 1,
                    Err(e) if e.kind() == ErrorKind::InvalidState => refused += 1,
                    Err(e) => panic!("{e}"),
                }
            }
            (accepted, refused)
        });
        for _ in 0..300 {
            rig.run(|orch| {
                let mut a = TaskArgs::new();
                a.input(&u64s(&x, 0, 1))?.output(&u64s(&out, 0, 2))?;
                orch.submit_sub(&h, a).map(|_| ())
            })
            .unwrap();
            let seen = read_u64(&out, 0, 2);
            assert_eq!(seen[0], seen[1], "an input changed under the task that held it");
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap()
    });
    assert!(accepted > 0 && refused > 0, "both happened: {accepted} writes, {refused} refused");
}

/// The buffer a forked SUB worker inherits as a static (set before `init`).
static INHERITED: std::sync::Mutex<Option<simpler::Buffer>> = std::sync::Mutex::new(None);

/// Succeeds only if writing the inherited buffer from this worker process is refused.
fn write_inherited(_: &simpler::HostArgs<'_>) -> simpler::HostResult {
    let inherited = INHERITED.lock().map_err(|_| "poisoned")?;
    match inherited.as_ref().ok_or("no inherited buffer")?.write(0, &[9u64]) {
        Err(e) if e.message().contains("belongs to process") => Ok(()),
        other => Err(format!("the inherited buffer's write was not refused: {other:?}").into()),
    }
}

#[isolated_test]
fn a_forked_worker_cannot_write_a_buffer_it_inherited() {
    let mut rig = Rig::new(subs(1).start_method(simpler::StartMethod::Fork));
    let h = rig.register(simpler::HostFn::new("write_inherited", write_inherited)).unwrap();
    // A buffer needs an initialized Worker; a second Worker makes one before `rig` forks.
    let mut maker = Worker::builder().sub_workers(1).build().unwrap();
    maker.init().unwrap();
    let buf = maker.create_buffer(8).unwrap();
    *INHERITED.lock().unwrap() = Some(buf.clone());
    rig.init();
    rig.run(|orch| orch.submit_sub(&h, TaskArgs::new()).map(|_| ())).unwrap();
    assert_eq!(read_u64(&buf, 0, 1), vec![0]);
    INHERITED.lock().unwrap().take();
    maker.close().unwrap();
}

#[isolated_test]
fn a_later_run_does_not_start_before_the_earlier_one_finished() {
    let (rig, [block, fill]) = Rig::start(subs(2), [("block_on_flag", block_on_flag), ("fill", fill)]);
    let flag = u32_buffer(&rig, 2);
    let out = u64_buffer(&rig, 2);
    let r1 = blocked_run(&rig, &block, &flag, &out, 1);
    wait_blocked(&flag);
    let r2 = fill_run(&rig, &fill, &out, 1, 2);
    // A SUB worker is idle, yet run 2's task waits for run 1.
    expect_err(r2.wait_timeout(Duration::from_millis(50)), ErrorKind::Timeout, &["still running"]);
    assert_eq!(read_u64(&out, 0, 2), vec![0, 0]);
    release(&flag);
    r2.wait().unwrap();
    r1.wait().unwrap();
    assert_eq!(read_u64(&out, 0, 2), vec![1, 2]);
}

#[isolated_test]
fn a_third_submit_waits_for_the_first_run_at_pipeline_depth_2() {
    let (rig, [block, fill]) =
        Rig::start(subs(2).pipeline_depth(2), [("block_on_flag", block_on_flag), ("fill", fill)]);
    let flag = u32_buffer(&rig, 2);
    let out = u64_buffer(&rig, 3);
    let r1 = blocked_run(&rig, &block, &flag, &out, 1);
    wait_blocked(&flag);
    let r2 = fill_run(&rig, &fill, &out, 1, 2);
    let building = AtomicBool::new(false);
    let r3 = std::thread::scope(|s| {
        let third = s.spawn(|| {
            rig.submit(|orch| {
                building.store(true, Ordering::SeqCst);
                assert!(r1.is_done(), "run 3 was admitted while run 1 was still in flight");
                let mut a = TaskArgs::new();
                a.output(&u64s(&out, 2, 1))?.scalar(3);
                orch.submit_sub(&fill, a).map(|_| ())
            })
        });
        // Run 1 is stuck, so the third submit must still be waiting for admission.
        expect_err(r1.wait_timeout(Duration::from_millis(100)), ErrorKind::Timeout, &["still running"]);
        assert!(!building.load(Ordering::SeqCst), "run 3 started building while 2 runs were in flight");
        release(&flag);
        third.join().expect("the third submit")
    })
    .unwrap();
    assert!(building.load(Ordering::SeqCst));
    r3.wait().unwrap();
    r2.wait().unwrap();
    r1.wait().unwrap();
    assert_eq!(read_u64(&out, 0, 3), vec![1, 2, 3]);
    assert_eq!((r2.id(), r3.id()), (r1.id() + 1, r1.id() + 2));
}

#[isolated_test]
fn run_results_are_independent() {
    let (rig, [fail, fill]) = Rig::start(subs(2), [("fail_fn", fail), ("fill", fill)]);
    let out = u64_buffer(&rig, 1);
    let r1 = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.scalar(1);
            orch.submit_sub(&fail, a).map(|_| ())
        })
        .unwrap();
    let r2 = fill_run(&rig, &fill, &out, 0, 8);
    let e1 = r1.wait().expect_err("run 1 fails");
    assert_err(&e1, ErrorKind::TaskFailed, &["fail_fn", "boom 1"]);
    r2.wait().expect("run 2 is not affected by run 1's failure");
    assert_eq!(read_u64(&out, 0, 1), vec![8]);
    assert_eq!(r1.stats().unwrap().failed, 1);
    assert_eq!(r2.stats().unwrap().failed, 0);
}

#[isolated_test]
fn wait_timeout_expiry_leaves_the_run_intact() {
    let (rig, [block]) = Rig::start(subs(1), [("block_on_flag", block_on_flag)]);
    let flag = u32_buffer(&rig, 2);
    let out = u64_buffer(&rig, 1);
    let run = blocked_run(&rig, &block, &flag, &out, 6);
    let started = Instant::now();
    let err = run.wait_timeout(Duration::from_millis(50)).expect_err("the task is blocked");
    assert!(started.elapsed() >= Duration::from_millis(50));
    assert_err(&err, ErrorKind::Timeout, &[&format!("run {}", run.id()), "still running"]);
    assert!(!run.is_done());
    assert!(run.stats().is_none(), "no statistics before the run is done");
    release(&flag);
    run.wait().expect("the same run finishes after the flag is set");
    assert!(run.is_done());
    assert_eq!(read_u64(&out, 0, 1), vec![6]);
    run.wait_timeout(Duration::ZERO).expect("a finished run reports at once");
}

#[isolated_test]
fn a_dropped_run_handle_does_not_cancel_the_run() {
    // A chain of three: after the first task the engine must keep going with nobody waiting.
    let (rig, [affine]) = Rig::start(subs(1), [("affine", affine)]);
    let buf = u64_buffer(&rig, 4);
    buf.write(0, &[1u64]).unwrap();
    let run = rig
        .submit(|orch| {
            for i in 0..3 {
                let mut a = TaskArgs::new();
                a.input(&u64s(&buf, i, 1))?.output(&u64s(&buf, i + 1, 1))?.scalar(2).scalar(0);
                orch.submit_sub(&affine, a)?;
            }
            Ok(())
        })
        .unwrap();
    drop(run);
    wait_for("the run to finish without anybody waiting", Duration::from_secs(10), || {
        read_u64(&buf, 3, 1) == [8]
    });
    assert_eq!(read_u64(&buf, 0, 4), vec![1, 2, 4, 8]);
}

#[isolated_test]
fn a_run_keeps_going_after_a_wait_timed_out() {
    let (rig, [block, affine]) = Rig::start(subs(1), [("block_on_flag", block_on_flag), ("affine", affine)]);
    let flag = u32_buffer(&rig, 2);
    let buf = u64_buffer(&rig, 2);
    let run = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.untracked(&words_of(&flag))?.output(&u64s(&buf, 0, 1))?.scalar(10_000).scalar(20);
            orch.submit_sub(&block, a)?;
            let mut a = TaskArgs::new();
            a.input(&u64s(&buf, 0, 1))?.output(&u64s(&buf, 1, 1))?.scalar(1).scalar(1);
            orch.submit_sub(&affine, a).map(|_| ())
        })
        .unwrap();
    expect_err(run.wait_timeout(Duration::from_millis(30)), ErrorKind::Timeout, &["still running"]);
    release(&flag);
    // Nobody waits now: the engine still runs the consumer and finishes the run.
    wait_for("the consumer to run", Duration::from_secs(10), || read_u64(&buf, 1, 1) == [21]);
    wait_for("the run to be done", Duration::from_secs(10), || run.is_done());
    run.wait().unwrap();
}

#[isolated_test]
fn at_pipeline_depth_1_a_second_submit_waits_for_the_first_run() {
    let (rig, [block, fill]) =
        Rig::start(subs(2).pipeline_depth(1), [("block_on_flag", block_on_flag), ("fill", fill)]);
    let flag = u32_buffer(&rig, 2);
    let out = u64_buffer(&rig, 2);
    let r1 = blocked_run(&rig, &block, &flag, &out, 1);
    wait_blocked(&flag);
    let building = AtomicBool::new(false);
    let r2 = std::thread::scope(|s| {
        let second = s.spawn(|| {
            rig.submit(|orch| {
                building.store(true, Ordering::SeqCst);
                assert!(r1.is_done(), "run 2 was admitted while run 1 was in flight");
                let mut a = TaskArgs::new();
                a.output(&u64s(&out, 1, 1))?.scalar(2);
                orch.submit_sub(&fill, a).map(|_| ())
            })
        });
        expect_err(r1.wait_timeout(Duration::from_millis(100)), ErrorKind::Timeout, &["still running"]);
        assert!(!building.load(Ordering::SeqCst), "run 2 started building while run 1 was in flight");
        release(&flag);
        second.join().expect("the second submit")
    })
    .unwrap();
    r2.wait().unwrap();
    r1.wait().unwrap();
    assert_eq!(read_u64(&out, 0, 2), vec![1, 2]);
}

#[isolated_test]
fn statistics_and_dot_export_cover_every_task() {
    let (rig, [fill, sum, noop]) = Rig::start(subs(2), [("fill", fill), ("sum", sum), ("noop", noop)]);
    let a = u64_buffer(&rig, 4);
    let b = u64_buffer(&rig, 4);
    let c = u64_buffer(&rig, 4);
    let started = Instant::now();
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            assert_eq!(orch.run_id(), 1, "run ids count from 1");
            assert_eq!(orch.run_id(), 1, "run ids count from 1");
            let mut t = TaskArgs::new(); // 0
            t.output(&u64s(&a, 0, 4))?.scalar(1);
            orch.submit_sub(&fill, t)?;
            let mut t = TaskArgs::new(); // 1
            t.output(&u64s(&b, 0, 4))?.scalar(2);
            orch.submit_sub(&fill, t)?;
            let mut t = TaskArgs::new(); // 2: waits for 0 and 1
            t.input(&u64s(&a, 0, 4))?.input(&u64s(&b, 0, 4))?.output(&u64s(&c, 0, 4))?;
            let s = orch.submit_sub(&sum, t)?;
            let mut t = TaskArgs::new(); // 3: explicit
            t.add_dep_wait(s);
            orch.submit_sub(&noop, t)?;
            orch.submit_sub(&noop, TaskArgs::new())?; // 4: alone
            assert_eq!(orch.task_count(), 5);
            Ok(())
        })
        .unwrap();
    run.wait().unwrap();
    let elapsed = started.elapsed();
    assert_eq!(read_u64(&c, 0, 4), vec![3; 4]);
    let stats = run.stats().unwrap();
    assert_eq!((stats.tasks, stats.failed), (5, 0));
    assert!(stats.wall > Duration::ZERO && stats.wall <= elapsed, "{stats:?} vs {elapsed:?}");

    let dag = run.dag().unwrap();
    assert_eq!(dag.graph().node_count(), 5);
    assert_eq!(dag.graph().edge_count(), 3);
    let dot = dag.to_dot();
    assert!(dot.starts_with("digraph run {") && dot.trim_end().ends_with('}'), "{dot}");
    for (i, name) in ["fill", "fill", "sum", "noop", "noop"].iter().enumerate() {
        assert!(dot.contains(&format!("t{i} [label=\"{i}: {name}\\nsub\"]")), "task {i} missing:\n{dot}");
    }
    for edge in ["t0 -> t2 [label=\"arg 0", "t1 -> t2 [label=\"arg 1", "t2 -> t3 [label=\"add_dep_wait\"]"] {
        assert!(dot.contains(edge), "{edge} missing:\n{dot}");
    }

    let plain = fill_run(&rig, &fill, &a, 0, 1);
    plain.wait().unwrap();
    assert!(plain.dag().is_none(), "only a run with capture_dag records the DAG");
    assert_eq!(plain.id(), run.id() + 1);
}

#[isolated_test]
fn many_small_runs_on_one_worker() {
    let (rig, [affine]) = Rig::start(subs(2), [("affine", affine)]);
    let buf = u64_buffer(&rig, 2);
    buf.write(0, &[1u64]).unwrap();
    for round in 0..64u64 {
        rig.run(|orch| {
            let mut a = TaskArgs::new();
            a.input(&u64s(&buf, 0, 1))?.output(&u64s(&buf, 1, 1))?.scalar(1).scalar(round);
            orch.submit_sub(&affine, a)?;
            let mut a = TaskArgs::new();
            a.input(&u64s(&buf, 1, 1))?.output(&u64s(&buf, 0, 1))?.scalar(1).scalar(1);
            orch.submit_sub(&affine, a)?;
            Ok(())
        })
        .unwrap();
    }
    assert_eq!(read_u64(&buf, 0, 1), vec![1 + (0..64).sum::<u64>() + 64]);
}

#[isolated_test]
fn several_threads_wait_on_one_run() {
    let (rig, [block, fill]) = Rig::start(subs(2), [("block_on_flag", block_on_flag), ("fill", fill)]);
    let flag = u32_buffer(&rig, 2);
    let out = u64_buffer(&rig, 1);
    let run = blocked_run(&rig, &block, &flag, &out, 4);
    wait_blocked(&flag);
    let results = std::thread::scope(|s| {
        let waiters: Vec<_> = (0..3)
            .map(|i| {
                let run = run.clone();
                s.spawn(move || if i == 0 { run.wait_timeout(Duration::from_secs(20)) } else { run.wait() })
            })
            .collect();
        // Meanwhile this thread polls the run without blocking, then lets it finish.
        assert!(!run.is_done());
        release(&flag);
        waiters.into_iter().map(|t| t.join().unwrap()).collect::<Vec<_>>()
    });
    for r in results {
        r.expect("every waiter sees the run succeed");
    }
    assert_eq!(read_u64(&out, 0, 1), vec![4]);
    // The Worker still runs work after the concurrent waits.
    fill_run(&rig, &fill, &out, 0, 5).wait().unwrap();
    assert_eq!(read_u64(&out, 0, 1), vec![5]);
}

/// Four threads build and wait for runs on one Worker at once (`run`, and `submit` then
/// `wait`), each run a chain of two tasks over the thread's own buffer: every run is correct
/// and nobody hangs.
#[isolated_test]
fn runs_submitted_from_several_threads_at_once_are_each_correct() {
    let (rig, [affine]) = Rig::start(subs(2).pipeline_depth(2), [("affine", affine)]);
    let bufs: Vec<_> = (0..4).map(|_| u64_buffer(&rig, 2)).collect();
    std::thread::scope(|s| {
        for (k, buf) in bufs.iter().enumerate() {
            let rig = &rig;
            let affine = &affine;
            s.spawn(move || {
                buf.write(0, &[k as u64]).unwrap();
                for round in 0..300u64 {
                    let go = |orch: &mut simpler::Orchestrator<'_>| {
                        let mut a = TaskArgs::new();
                        a.input(&u64s(buf, 0, 1))?.output(&u64s(buf, 1, 1))?.scalar(1).scalar(1);
                        orch.submit_sub(affine, a)?;
                        let mut a = TaskArgs::new();
                        a.input(&u64s(buf, 1, 1))?.output(&u64s(buf, 0, 1))?.scalar(1).scalar(0);
                        orch.submit_sub(affine, a).map(|_| ())
                    };
                    if round % 3 == 0 {
                        rig.submit(go).unwrap().wait().unwrap()
                    } else {
                        rig.run(go).unwrap()
                    }
                }
            });
        }
    });
    for (k, buf) in bufs.iter().enumerate() {
        assert_eq!(read_u64(buf, 0, 1), vec![k as u64 + 300]);
    }
}
