//! A captured run as it happened: per-task records (where, when, how it ended), the Chrome
//! trace, SVG and DOT pictures written from one call, and a run's progress while in flight.

mod common;

use std::time::Duration;

use common::*;
use simpler::{DataType, ErrorKind, RunOptions, TaskArgs, chip::CallConfig, chip::ChipFn, trace::TaskStatus};

const N: usize = 1024;

fn f32s(b: &simpler::Buffer) -> simpler::Tensor {
    b.tensor(&[(b.nbytes() / 4) as u32], DataType::Float32).unwrap()
}

#[isolated_test]
fn a_captured_run_records_where_and_when_each_task_ran_and_draws_it() {
    let mut rig = Rig::new(common::builder().chips(2).chip_memory(16 << 20).sub_workers(2));
    let double = rig.register_chip(common::double_kernel()).unwrap();
    let add = rig.register(simpler::HostFn::new("vadd", vadd)).unwrap();
    let boom = rig.register(simpler::HostFn::new("fail", fail_once_released)).unwrap();
    let after = rig.register(simpler::HostFn::new("noop", noop)).unwrap();
    rig.init();
    let bufs: Vec<simpler::Buffer> = (0..4).map(|_| rig.create_buffer(N * 4).unwrap()).collect();
    for (b, name) in bufs.iter().zip(["x", "y0", "y1", "sum"]) {
        b.set_name(name).unwrap();
    }
    bufs[0].write(0, &vec![1.5f32; N]).unwrap();
    let [x, y0, y1, s] = [0, 1, 2, 3].map(|i| f32s(&bufs[i]));
    let flag = u32_buffer(&rig, 2);
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            // Two chips double x in parallel; a SUB worker adds the halves; a failing task and
            // a task that depends on it (so it never runs).
            for (chip, y) in [(0u32, &y0), (1, &y1)] {
                let mut a = TaskArgs::new();
                a.input(&x)?.output(y)?;
                orch.submit_next_level(&double, a, CallConfig::default(), chip)?;
            }
            let mut a = TaskArgs::new();
            a.input(&y0)?.input(&y1)?.output(&s)?;
            orch.submit_sub(&add, a)?;
            // It fails only once released, after its dependent is submitted: a failure
            // before that would refuse the dependent's submit (the run has failed).
            let mut f = TaskArgs::new();
            f.untracked(&words_of(&flag))?.scalar(7);
            let failed = orch.submit_sub(&boom, f)?;
            let mut n = TaskArgs::new();
            n.add_dep(failed).untracked(&words_of(&flag))?;
            orch.submit_sub(&after, n).map(|_| ())
        })
        .unwrap();
    release(&flag);
    expect_err(run.wait(), ErrorKind::TaskFailed, &["boom 7"]);
    assert_eq!(bufs[3].read::<f32>(0, N).unwrap(), vec![6.0f32; N]);

    let timeline = run.timeline().expect("captured and ended");
    let r = timeline.records();
    assert_eq!(r.len(), 5, "{r:#?}");
    let names: Vec<&str> = r.iter().map(|t| t.callable.as_str()).collect();
    assert_eq!(names, ["double", "double", "vadd", "fail", "noop"]);
    assert_eq!((r[0].worker.as_str(), r[1].worker.as_str()), ("chip 0", "chip 1"));
    assert!(r[2].worker.starts_with("sub worker ") && r[3].worker.starts_with("sub worker "));
    for t in &r[..4] {
        let (ready, start, end) = (t.ready_ns.unwrap(), t.started_ns.unwrap(), t.ended_ns.unwrap());
        assert!(t.submitted_ns <= ready && ready <= start && start <= end, "{t:?}");
        assert_eq!(t.level, simpler::status::Level::Node);
    }
    // The adder became ready only when both chips were done, and started after that.
    assert!(r[2].ready_ns.unwrap() >= r[0].ended_ns.unwrap().max(r[1].ended_ns.unwrap()));
    assert_eq!([r[0].status, r[1].status, r[2].status], [TaskStatus::Completed; 3]);
    assert_eq!(r[3].status, TaskStatus::Failed);
    assert!(r[3].error.as_deref().unwrap().contains("boom 7"));
    assert_eq!((r[4].status, r[4].started_ns, r[4].worker.as_str()), (TaskStatus::NotRun, None, ""));
    assert!(r[4].error.as_deref().unwrap().contains("did not run"), "{:?}", r[4].error);

    // The three pictures, written by one call and read back.
    let dir = std::env::temp_dir().join(format!("simpler-timeline-{}", std::process::id()));
    let files = timeline.write_files(dir.join("run")).unwrap();
    let read = |i: usize| std::fs::read_to_string(&files[i]).unwrap();
    let (json, svg, dot) = (read(0), read(1), read(2));
    std::fs::remove_dir_all(&dir).unwrap();
    for lane in ["chip 0", "chip 1"] {
        assert!(json.contains(&format!("\"args\":{{\"name\":\"{lane}\"}}")), "a lane for {lane}");
        assert!(svg.contains(&format!(">L3 {lane}</text>")), "an SVG lane for {lane}");
    }
    // A box per task that ran, and one per kernel the chips ran for them on their cores.
    assert_eq!(json.matches("\"ph\":\"X\"").count(), 6);
    let inner: Vec<&str> = timeline.inner_records().iter().map(|r| r.worker.as_str()).collect();
    assert_eq!(inner, ["chip 0 / core 0", "chip 1 / core 0"]);
    assert_eq!(json.matches("\"ph\":\"s\"").count(), 2, "the chips' outputs flow into the adder");
    assert!(svg.contains("<title>2: vadd on sub worker"), "{svg}");
    assert!(svg.contains("fill=\"#e53935\""), "the failed task is red");
    assert!(dot.contains("t0 -> t2 [label=\"arg 0 (y0)\"];"), "{dot}");
    assert!(dot.contains("t1 -> t2 [label=\"arg 1 (y1)\"];"), "{dot}");
    assert!(dot.contains("0: double\\nchip 0\\nat "), "{dot}");
    // Not captured: nothing recorded.
    let plain = rig.submit(|_| Ok(())).unwrap();
    plain.wait().unwrap();
    assert!(plain.timeline().is_none());
}

#[isolated_test]
fn progress_counts_tasks_while_the_run_is_in_flight() {
    let (rig, [block, noop]) = Rig::start(subs(2), [("block_on_flag", block_on_flag), ("noop", noop)]);
    let flag = u32_buffer(&rig, 2);
    let run = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.untracked(&words_of(&flag))?.scalar(30_000);
            let gate = orch.submit_sub(&block, a)?;
            for _ in 0..9 {
                let mut n = TaskArgs::new();
                n.add_dep(gate);
                orch.submit_sub(&noop, n)?;
            }
            Ok(())
        })
        .unwrap();
    wait_blocked(&flag);
    wait_for("submission to close", Duration::from_secs(10), || !run.progress().submitting);
    let p = run.progress();
    assert_eq!((p.submitted, p.completed, p.failed, p.remaining()), (10, 0, 0, 10), "{p:?}");
    release(&flag);
    run.wait().unwrap();
    let p = run.progress();
    assert_eq!((p.submitted, p.completed, p.failed, p.fraction()), (10, 10, 0, 1.0));
}

/// A subscriber that keeps each span's name, fields and parent, and each event's fields.
mod recorder {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use tracing::field::{Field, Visit};
    use tracing::{Event, Metadata, Subscriber, span};

    #[derive(Default)]
    pub struct Seen {
        /// (id, name, parent id, fields)
        pub spans: Vec<(u64, String, Option<u64>, String)>,
        /// (parent span id, fields)
        pub events: Vec<(Option<u64>, String)>,
    }

    #[derive(Clone, Default)]
    pub struct Recorder(pub Arc<Mutex<Seen>>, Arc<AtomicU64>);

    struct Fields(String);
    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!("{}={:?} ", field.name(), value));
        }
    }

    impl Subscriber for Recorder {
        fn enabled(&self, meta: &Metadata<'_>) -> bool {
            meta.target().starts_with("simpler::run") || meta.target().starts_with("simpler::task")
        }
        fn new_span(&self, span: &span::Attributes<'_>) -> span::Id {
            let id = self.1.fetch_add(1, Ordering::SeqCst) + 1;
            let mut f = Fields(String::new());
            span.record(&mut f);
            let parent = span.parent().map(span::Id::into_u64);
            self.0.lock().unwrap().spans.push((id, span.metadata().name().to_string(), parent, f.0));
            span::Id::from_u64(id)
        }
        fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
        fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut f = Fields(String::new());
            event.record(&mut f);
            self.0.lock().unwrap().events.push((event.parent().map(span::Id::into_u64), f.0));
        }
        fn enter(&self, _: &span::Id) {}
        fn exit(&self, _: &span::Id) {}
    }
}

#[isolated_test]
fn each_task_has_a_span_under_its_runs_and_its_end_says_what_and_how_long() {
    let rec = recorder::Recorder::default();
    // Global: the scheduler's role may be taken by the Worker's background thread.
    tracing::subscriber::set_global_default(rec.clone()).expect("the first subscriber of this process");
    let (rig, [noop, fail]) = Rig::start(subs(1), [("noop", noop), ("fail", fail)]);
    rig.run(|orch| orch.submit_sub(&noop, TaskArgs::new()).map(|_| ())).unwrap();
    let mut a = TaskArgs::new();
    a.scalar(3);
    expect_err(
        rig.run(|orch| orch.submit_sub(&fail, a.clone()).map(|_| ())),
        ErrorKind::TaskFailed,
        &["boom 3"],
    );
    let seen = rec.0.lock().unwrap();
    let runs: Vec<_> = seen.spans.iter().filter(|s| s.1 == "run").collect();
    let tasks: Vec<_> = seen.spans.iter().filter(|s| s.1 == "task").collect();
    assert_eq!((runs.len(), tasks.len()), (2, 2), "{:?}", seen.spans);
    for (task, run) in tasks.iter().zip(&runs) {
        assert_eq!(task.2, Some(run.0), "a task's span is a child of its run's");
        assert!(task.3.contains("worker=sub worker 0"), "{}", task.3);
    }
    assert!(tasks[0].3.contains("callable=\"noop\"") && tasks[1].3.contains("callable=\"fail\""));
    let ends: Vec<_> = seen.events.iter().filter(|e| e.1.contains("duration_us=")).collect();
    assert_eq!(ends.len(), 2, "{:?}", seen.events);
    assert_eq!(ends[0].0, Some(tasks[0].0), "the end event is inside the task's span");
    assert!(ends[0].1.contains("task completed") && ends[0].1.contains("ok=true"), "{}", ends[0].1);
    assert!(ends[1].1.contains("task failed") && ends[1].1.contains("boom 3"), "{}", ends[1].1);
}

/// `c = a + b`, with a scalar the kernel ignores (the diagnostics show it): `common::vadd` and
/// its OpenCL C source with a fourth, scalar, parameter.
fn tagged_vadd() -> ChipFn {
    const SOURCE: &str = "__kernel void vadd_tagged(__global const float* a, __global const float* b, __global float* c, int tag) { size_t i = get_global_id(0); c[i] = a[i] + b[i]; }";
    ChipFn::kernel("vadd", vadd)
        .with_source(simpler::chip::KernelSource::opencl(SOURCE, "vadd_tagged"))
        .unwrap()
}

/// A chip orchestration: in a scope, `t = a + b` on core 0 into an `orch.alloc` intermediate,
/// then `out = 2 t` on core 1.
fn add_then_double(
    orch: &mut simpler::Orchestrator<'_>,
    args: &TaskArgs,
    _: &CallConfig,
) -> simpler::Result<()> {
    let (a, b, out) = (args.tensor(0).unwrap(), args.tensor(1).unwrap(), args.tensor(2).unwrap());
    orch.scope(|orch| {
        let t = orch.alloc(&[N as u32], DataType::Float32)?;
        let mut first = TaskArgs::new();
        first.input(a)?.input(b)?.output(&t)?.scalar(5);
        orch.submit_next_level(&tagged_vadd().handle(), first, CallConfig::default(), 0)?;
        let mut second = TaskArgs::new();
        second.input(&t)?.output(out)?;
        orch.submit_next_level(&common::double_kernel().handle(), second, CallConfig::default(), 1)?;
        Ok(())
    })
}

#[isolated_test]
fn call_config_diagnostics_write_the_chips_timeline_arguments_dag_and_scopes() {
    let mut rig = Rig::new(common::builder().chips(1).chip_cores(2).chip_memory(16 << 20));
    rig.register_chip(tagged_vadd()).unwrap();
    let double = rig.register_chip(common::double_kernel()).unwrap();
    let orch = rig.register_chip(ChipFn::orchestration("add_then_double", add_then_double)).unwrap();
    rig.init();
    let bufs: Vec<simpler::Buffer> = (0..3).map(|_| rig.create_buffer(N * 4).unwrap()).collect();
    bufs[0].write(0, &vec![1.0f32; N]).unwrap();
    bufs[1].write(0, &vec![2.0f32; N]).unwrap();
    let [a, b, out] = [0, 1, 2].map(|i| f32s(&bufs[i]));
    let dir = std::env::temp_dir().join(format!("simpler-diag-{}", std::process::id()));
    let all = CallConfig::new()
        .swimlane(simpler::chip::Swimlane::Level1)
        .dump_args(true)
        .dep_gen(true)
        .scope_stats(true)
        .output_prefix(dir.to_str().unwrap());
    rig.run(|o| {
        let mut args = TaskArgs::new();
        args.input(&a)?.input(&b)?.output(&out)?;
        o.submit_next_level(&orch, args, all.clone(), 0)?;
        let mut k = TaskArgs::new();
        k.input(&a)?.output(&f32s(&bufs[1]))?;
        // Only the arguments of this bare kernel (after the orchestration: it overwrites b).
        o.submit_next_level(
            &double,
            k,
            CallConfig::new().dump_args(true).output_prefix(dir.to_str().unwrap()),
            0,
        )
        .map(|_| ())
    })
    .unwrap();
    assert_eq!(bufs[2].read::<f32>(0, N).unwrap(), vec![6.0f32; N]);
    let mut names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    let read = |suffix: &str| {
        let f = names.iter().find(|n| n.contains("add_then_double") && n.ends_with(suffix)).expect(suffix);
        std::fs::read_to_string(dir.join(f)).unwrap()
    };
    // The swimlane: one lane per core, a box per kernel.
    let json = read(".swimlane.json");
    for lane in ["core 0", "core 1"] {
        assert!(json.contains(&format!("\"args\":{{\"name\":\"{lane}\"}}")), "{lane}: {json}");
    }
    assert!(json.contains("\"name\":\"vadd\"") && json.contains("\"name\":\"double\""), "{json}");
    assert!(read(".swimlane.svg").contains(">L2 core 1</text>"));
    // The DAG: the kernel reading the intermediate waits for the one writing it.
    assert!(read(".deps.dot").contains("t0 -> t1"), "{}", read(".deps.dot"));
    // The arguments, decoded.
    let args = read(".args.txt");
    assert!(args.contains("task 0: `vadd` on core 0"), "{args}");
    assert!(args.contains("arg 2: Output f32 [1024]") && args.contains("scalar 0: 5"), "{args}");
    // The scopes: the inner one had two tasks and one allocation, the outer none.
    let scopes = read(".scopes.txt");
    assert!(scopes.contains("0\t2\t2\t1\n") && scopes.contains("1\t1\t0\t0\n"), "{scopes}");
    // The bare kernel: its arguments only.
    let bare: Vec<&String> = names.iter().filter(|n| n.contains("-double-")).collect();
    assert_eq!(bare.len(), 1, "{names:?}");
    assert!(bare[0].ends_with(".args.txt"));
    let text = std::fs::read_to_string(dir.join(bare[0])).unwrap();
    assert!(text.contains("task 0: `double` on core 0") && text.contains("arg 1: "), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An L3 orchestration: `add_then_double` on chip 0 (its kernels on the chip's two cores),
/// then `out += 1` on a SUB worker... here `noop` with the output, to keep it short.
fn l3_chip_then_sub(
    orch: &mut simpler::Orchestrator<'_>,
    args: &TaskArgs,
    _: &CallConfig,
) -> simpler::Result<()> {
    let (a, b, out) = (args.tensor(0).unwrap(), args.tensor(1).unwrap(), args.tensor(2).unwrap());
    let mut c = TaskArgs::new();
    c.input(a)?.input(b)?.output(out)?;
    let pipe = ChipFn::orchestration("add_then_double", add_then_double).handle();
    orch.submit_next_level(&pipe, c, CallConfig::default(), 0)?;
    let mut s = TaskArgs::new();
    s.input(out)?;
    orch.submit_sub(&simpler::HostFn::new("noop", noop).handle(), s).map(|_| ())
}

#[isolated_test]
fn a_timeline_shows_every_level_of_the_tree_chip_cores_included() {
    let mut l3 =
        common::builder().chips(1).chip_cores(2).chip_memory(16 << 20).sub_workers(1).build().unwrap();
    l3.register_chip(tagged_vadd()).unwrap();
    l3.register_chip(common::double_kernel()).unwrap();
    l3.register_chip(ChipFn::orchestration("add_then_double", add_then_double)).unwrap();
    l3.register(simpler::HostFn::new("noop", noop)).unwrap();
    let mut rig = Rig::new(common::builder().level(simpler::status::Level::Network1).worker(l3));
    let w = 0;
    let step = rig.register_orch(simpler::OrchFn::new("l3_chip_then_sub", l3_chip_then_sub)).unwrap();
    rig.init();
    let bufs: Vec<simpler::Buffer> = (0..3).map(|_| rig.create_buffer(N * 4).unwrap()).collect();
    bufs[0].write(0, &vec![1.0f32; N]).unwrap();
    bufs[1].write(0, &vec![2.0f32; N]).unwrap();
    let [a, b, out] = [0, 1, 2].map(|i| f32s(&bufs[i]));
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            let mut x = TaskArgs::new();
            x.input(&a)?.input(&b)?.output(&out)?;
            orch.submit_next_level(&step, x, CallConfig::default(), w).map(|_| ())
        })
        .unwrap();
    run.wait().unwrap();
    assert_eq!(bufs[2].read::<f32>(0, N).unwrap(), vec![6.0f32; N]);
    let timeline = run.timeline().unwrap();
    assert_eq!(timeline.records().len(), 1);
    assert_eq!(
        (timeline.records()[0].worker.as_str(), timeline.records()[0].level),
        ("worker 0", simpler::status::Level::Network1)
    );
    let inner: Vec<(String, simpler::status::Level, String, Vec<u32>)> = timeline
        .inner_records()
        .iter()
        .map(|r| (r.callable.clone(), r.level, r.worker.clone(), r.within.clone()))
        .collect();
    let has = |callable: &str, level: simpler::status::Level, worker: &str, within: &[u32]| {
        inner.iter().any(|(c, l, w, p)| c == callable && *l == level && w == worker && p == within)
    };
    // The nested L3's two tasks, inside task 0 of the L4 run.
    assert!(has("add_then_double", simpler::status::Level::Node, "worker 0 / chip 0", &[0]), "{inner:#?}");
    assert!(has("noop", simpler::status::Level::Node, "worker 0 / sub worker 0", &[0]), "{inner:#?}");
    // The chip's kernels on its cores, inside the L3's task 0 inside the L4's task 0.
    assert!(has("vadd", simpler::status::Level::Chip, "worker 0 / chip 0 / core 0", &[0, 0]), "{inner:#?}");
    assert!(has("double", simpler::status::Level::Chip, "worker 0 / chip 0 / core 1", &[0, 0]), "{inner:#?}");
    // Inner times lie within their host task's.
    let host = &timeline.records()[0];
    for r in timeline.inner_records() {
        assert!(r.started_ns >= host.started_ns && r.ended_ns <= host.ended_ns, "{r:?} within {host:?}");
    }
    // One process per level in the Chrome trace, and every lane drawn in the SVG.
    let json = timeline.to_chrome_trace();
    for (pid, name) in [(4, "L4 (network"), (3, "L3 (node)"), (2, "L2 (chip)")] {
        assert!(
            json.contains(&format!("\"name\":\"process_name\",\"pid\":{pid},\"args\":{{\"name\":\"{name}")),
            "{pid} in {json}"
        );
    }
    let svg = timeline.to_svg();
    for lane in
        ["L4 worker 0", "L3 worker 0 / chip 0", "L3 worker 0 / sub worker 0", "L2 worker 0 / chip 0 / core 1"]
    {
        assert!(svg.contains(&format!(">{lane}</text>")), "{lane} in {svg}");
    }
    // Runs that are not captured leave nothing: the nested Worker captures only for a captured parent.
    rig.run(|orch| {
        let mut x = TaskArgs::new();
        x.input(&a)?.input(&b)?.output(&out)?;
        orch.submit_next_level(&step, x, CallConfig::default(), w).map(|_| ())
    })
    .unwrap();
}

#[isolated_test]
fn a_second_worker_of_the_process_sees_only_its_own_runs_records() {
    // Run numbers restart in every Worker: the trace log's keys name the engine too, so the
    // second Worker's run 1 does not pick up what the first Worker's run 1 left there.
    for round in 0..2 {
        let mut rig = Rig::new(common::builder().chips(1).chip_memory(16 << 20));
        let double = rig.register_chip(common::double_kernel()).unwrap();
        rig.init();
        let (x, y) = (rig.create_buffer(N * 4).unwrap(), rig.create_buffer(N * 4).unwrap());
        let (tx, ty) = (f32s(&x), f32s(&y));
        let run = rig
            .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
                let mut a = TaskArgs::new();
                a.input(&tx)?.output(&ty)?;
                orch.submit_next_level(&double, a, CallConfig::default(), 0).map(|_| ())
            })
            .unwrap();
        run.wait().unwrap();
        assert_eq!(run.id(), 1, "round {round}: the first run of its Worker");
        let inner = run.timeline().unwrap().inner_records().len();
        assert_eq!(inner, 1, "round {round}: one kernel ran inside the run's one task");
        drop((tx, ty, x, y));
        rig.close().unwrap();
    }
}

#[isolated_test]
fn each_member_of_a_group_has_its_kernels_on_its_own_chips_lane() {
    let mut rig = Rig::new(common::builder().chips(2).chip_memory(16 << 20));
    let double = rig.register_chip(common::double_kernel()).unwrap();
    rig.init();
    let bufs: Vec<simpler::Buffer> = (0..3).map(|_| rig.create_buffer(N * 4).unwrap()).collect();
    let [x, y0, y1] = [0, 1, 2].map(|i| f32s(&bufs[i]));
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            let members = [&y0, &y1]
                .into_iter()
                .map(|y| {
                    let mut a = TaskArgs::new();
                    a.input(&x)?.output(y)?;
                    Ok(a)
                })
                .collect::<simpler::Result<Vec<_>>>()?;
            orch.submit_next_level_group(&double, members, CallConfig::default(), &[0, 1]).map(|_| ())
        })
        .unwrap();
    run.wait().unwrap();
    let timeline = run.timeline().unwrap();
    assert_eq!(timeline.records()[0].worker, "chip 0, chip 1");
    let mut lanes: Vec<&str> = timeline.inner_records().iter().map(|r| r.worker.as_str()).collect();
    lanes.sort();
    assert_eq!(lanes, ["chip 0 / core 0", "chip 1 / core 0"], "one kernel per member, each on its chip");
}
