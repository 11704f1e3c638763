//! The DSL end to end: the engine and chip workloads written with `#[callable]` and
//! `task_graph!` give the same results and the same DAG as the hand-written versions, a graph's
//! static structure matches its captured run, write-after-read is ordered, and digests are
//! rebuilt from their documented bytes.

mod common;

use std::time::Duration;

use common::{Rig, assert_err, isolated_test};
use simpler::{
    DataType, ErrorKind, Orchestrator, RunOptions, TaskArgs, Tensor, Worker, callable,
    callable::CallableKind, callable::Digest, chip::CallConfig, dsl::In, dsl::InOut, dsl::Out, dsl::TensorOf,
    status::Level, task_graph, trace::EdgeReason, trace::RunDag,
};
// The registry and signature types are what generated code uses (`__private`); this suite checks them.
use simpler::__private::{CallableInfo, ParamMode};

const N: u32 = 64;

// ------------------------------------------------------------------------------- the callables

/// `out = (a + b) * k` on a SUB worker.
#[callable(sub)]
fn add(a: In<f32>, b: In<f32>, mut out: Out<f32>, k: f32) {
    for i in 0..out.len() {
        out[i] = (a[i] + b[i]) * k;
    }
}

/// `x += 1` in place on a SUB worker.
#[callable(sub)]
fn inc(mut x: InOut<f32>) {
    for v in x.iter_mut() {
        *v += 1.0;
    }
}

/// `out = a + b` on one chip core.
#[callable(chip)]
fn vadd(a: In<f32>, b: In<f32>, mut out: Out<f32>) -> Result<(), String> {
    if a.len() != out.len() {
        return Err(format!("length {} vs {}", a.len(), out.len()));
    }
    for i in 0..out.len() {
        out[i] = a[i] + b[i];
    }
    Ok(())
}

/// `x *= 2` on one chip core.
#[callable(chip)]
fn twice(mut x: InOut<f32>) {
    for v in x.iter_mut() {
        *v *= 2.0;
    }
}

/// A chip orchestration: `y = 2 * (a + b)` as two dependent kernels on the chip's cores.
#[callable(chip)]
fn add_then_double(o: &mut Orchestrator<'_>, a: In<f32>, b: In<f32>, y: Out<f32>) -> simpler::Result<()> {
    vadd::call(&a, &b, &mut y)?.on(o, simpler::dsl::chip(0))?;
    twice::call(&mut y)?.on(o, simpler::dsl::chip(1))?;
    Ok(())
}

// ---------------------------------------------------------------------------------- the graphs

task_graph! {
    /// A chain: `y = ((a + b) * 1 + 1) ...` through two intermediates.
    fn chain(a: In<f32>, b: In<f32>, y: Out<f32>) {
        let t1 = alloc::<f32>([64]);
        add(a, b, &mut t1, 1.0).on(sub());
        inc(&mut t1).on(sub());
        add(t1, t1, &mut y, 0.5).on(sub());
    }
}

task_graph! {
    /// A diamond: two independent halves, then their sum.
    fn diamond(a: In<f32>, b: In<f32>, y: Out<f32>, n: u32) {
        let t1 = alloc::<f32>([n]);
        let t2 = alloc::<f32>([n]);
        add(a, b, &mut t1, 1.0).on(sub());
        add(b, a, &mut t2, 2.0).on(sub());
        add(t1, t2, &mut y, 1.0).on(sub());
    }
}

task_graph! {
    /// The same kernel on four chips as one group.
    fn four_chips(a: In<f32>, b: In<f32>, y0: Out<f32>, y1: Out<f32>, y2: Out<f32>, y3: Out<f32>) {
        group(|| {
            vadd(a, b, &mut y0).on(chip(0));
            vadd(a, b, &mut y1).on(chip(1));
            vadd(a, b, &mut y2).on(chip(2));
            vadd(a, b, &mut y3).on(chip(3));
        });
    }
}

task_graph! {
    /// Write after read: `h` is read by the first `add` and then overwritten by `inc`.
    fn war(a: In<f32>, y: Out<f32>, h: InOut<f32>) {
        add(a, h, &mut y, 1.0).on(sub());
        inc(&mut h).on(sub());
    }
}

task_graph! {
    /// Scopes: the intermediate lives in the inner scope only.
    fn scoped(a: In<f32>, y: Out<f32>) {
        scope(|| {
            let t = alloc::<f32>([64]);
            add(a, a, &mut t, 1.0).on(sub());
            add(t, a, &mut y, 1.0).on(sub());
        });
        inc(&mut y).on(sub());
    }
}

// ------------------------------------------------------------------------------------- helpers

fn filled(w: &Worker, v: f32) -> (simpler::Buffer, TensorOf<f32>) {
    let b = w.create_buffer(N as usize * 4).unwrap();
    b.write(0, &vec![v; N as usize]).unwrap();
    let t = b.typed::<f32>(&[N]).unwrap();
    (b, t)
}

fn read(b: &simpler::Buffer) -> Vec<f32> {
    b.read::<f32>(0, N as usize).unwrap()
}

/// A DAG's structure: (index, callable, target) nodes and (from, to, tensor arg) edges.
type Shape = (Vec<(u32, String, String)>, Vec<(u32, u32, Option<u32>)>);

/// The captured DAG's structure.
fn shape(dag: &RunDag) -> Shape {
    let g = dag.graph();
    let mut nodes: Vec<_> =
        g.node_weights().map(|n| (n.index, n.callable.clone(), n.target.clone())).collect();
    let mut edges: Vec<_> = g
        .edge_indices()
        .map(|e| {
            let (a, b) = g.edge_endpoints(e).unwrap();
            let arg = match g[e] {
                EdgeReason::Tensor { arg, .. }
                | EdgeReason::WriteAfterWrite { arg, .. }
                | EdgeReason::WriteAfterRead { arg, .. } => Some(arg),
                EdgeReason::Explicit { .. } => None,
            };
            (g[a].index, g[b].index, arg)
        })
        .collect();
    nodes.sort();
    edges.sort();
    (nodes, edges)
}

/// A DOT export's node and edge lines, with what names a tensor removed from edge labels (the
/// graph names it, the run gives its buffer id).
fn dot_lines(dot: &str) -> Vec<String> {
    let mut lines: Vec<String> = dot
        .lines()
        .skip(1)
        .map(|l| match l.find(" (") {
            Some(i) if l.contains("->") => format!("{}\"];", &l[..i]),
            _ => l.to_string(),
        })
        .collect();
    lines.sort();
    lines
}

/// `add` submitted with the plain API: the tags written by hand.
fn plain_add(o: &mut Orchestrator<'_>, a: &Tensor, b: &Tensor, out: &Tensor, k: f32) -> simpler::Result<()> {
    let mut x = TaskArgs::new();
    x.input(a)?.input(b)?.output(out)?.scalar_f32(k);
    o.submit_sub(add::handle(), x).map(|_| ())
}

/// `inc` submitted with the plain API.
fn plain_inc(o: &mut Orchestrator<'_>, t: &Tensor) -> simpler::Result<()> {
    let mut x = TaskArgs::new();
    x.inout(t)?;
    o.submit_sub(inc::handle(), x).map(|_| ())
}

// --------------------------------------------------------------------------------------- tests

/// A graph call's arguments and config are its own: options that carry others are refused,
/// naming the graph, and nothing runs.
#[isolated_test]
fn a_graph_call_refuses_options_with_arguments_of_their_own() {
    let mut rig = Rig::new(Worker::builder().sub_workers(2));
    rig.init();
    let (_ba, a) = filled(&rig, 1.0);
    let (_bb, b) = filled(&rig, 2.0);
    let (by, mut y) = filled(&rig, 0.0);
    let mut extra = TaskArgs::new();
    extra.scalar(1);
    let err = chain::call(&a, &b, &mut y).unwrap().run_with(&rig, RunOptions::new().args(extra)).unwrap_err();
    assert_err(&err, ErrorKind::InvalidArgument, &["chain", "arguments and config are its own"]);
    assert_eq!(read(&by), vec![0.0; N as usize], "nothing ran");
    chain::call(&a, &b, &mut y)
        .unwrap()
        .run_with(&rig, RunOptions::new().deadline(Duration::from_secs(60)))
        .unwrap();
    assert_eq!(read(&by), vec![4.0; N as usize]);
}

#[isolated_test]
fn chain_matches_the_hand_written_run() {
    let mut rig = Rig::new(Worker::builder().sub_workers(2));
    rig.init();
    let (_ba, a) = filled(&rig, 1.0);
    let (_bb, b) = filled(&rig, 2.0);
    let (by, mut y) = filled(&rig, 0.0);
    let macro_run = chain::call(&a, &b, &mut y)
        .unwrap()
        .submit_with(&rig, simpler::RunOptions::new().capture_dag())
        .unwrap();
    macro_run.wait().unwrap();
    assert_eq!(read(&by), vec![4.0; N as usize]); // ((1 + 2) + 1) * 2 * 0.5
    let macro_dag = macro_run.dag().unwrap();
    assert!(chain::graph().matches(&macro_dag), "{}\n{}", chain::graph().to_dot(), macro_dag.to_dot());

    by.write(0, &vec![0.0f32; N as usize]).unwrap();
    let (ta, tb, ty) = (a.tensor().clone(), b.tensor().clone(), y.tensor().clone());
    let plain_run = rig
        .submit_with(RunOptions::new().capture_dag(), |o, _, _| {
            let t1 = o.alloc(&[64], DataType::Float32)?;
            plain_add(o, &ta, &tb, &t1, 1.0)?;
            plain_inc(o, &t1)?;
            plain_add(o, &t1, &t1, &ty, 0.5)
        })
        .unwrap();
    plain_run.wait().unwrap();
    assert_eq!(read(&by), vec![4.0; N as usize]);
    assert_eq!(shape(&macro_dag), shape(&plain_run.dag().unwrap()));
}

#[isolated_test]
fn diamond_matches_the_hand_written_run_and_runs_at_top_level() {
    let mut rig = Rig::new(Worker::builder().sub_workers(2));
    rig.init();
    let (_ba, a) = filled(&rig, 1.0);
    let (_bb, b) = filled(&rig, 2.0);
    let (by, mut y) = filled(&rig, 0.0);
    let run = diamond::call(&a, &b, &mut y, N)
        .unwrap()
        .submit_with(&rig, simpler::RunOptions::new().capture_dag())
        .unwrap();
    run.wait().unwrap();
    assert_eq!(read(&by), vec![9.0; N as usize]); // 3 * 1 + 3 * 2
    let dag = run.dag().unwrap();
    assert!(diamond::graph().matches(&dag));
    assert_eq!(dot_lines(&diamond::graph().to_dot()), dot_lines(&dag.to_dot()), "the two DOT exports");
    assert_eq!(dag.graph().edge_count(), 2);
    assert!(dag.has_edge(0, 2) && dag.has_edge(1, 2) && !dag.has_edge(0, 1));

    let (ta, tb, ty) = (a.tensor().clone(), b.tensor().clone(), y.tensor().clone());
    let plain = rig
        .submit_with(RunOptions::new().capture_dag(), |o, _, _| {
            let t1 = o.alloc(&[N], DataType::Float32)?;
            let t2 = o.alloc(&[N], DataType::Float32)?;
            plain_add(o, &ta, &tb, &t1, 1.0)?;
            plain_add(o, &tb, &ta, &t2, 2.0)?;
            plain_add(o, &t1, &t2, &ty, 1.0)
        })
        .unwrap();
    plain.wait().unwrap();
    assert_eq!(shape(&dag), shape(&plain.dag().unwrap()));

    // `run` waits for the run to end.
    by.write(0, &vec![0.0f32; N as usize]).unwrap();
    diamond::call(&a, &b, &mut y, N).unwrap().run(&rig).unwrap();
    assert_eq!(read(&by), vec![9.0; N as usize]);
}

#[isolated_test]
fn a_group_on_four_chips_matches_the_hand_written_group() {
    let mut rig = Rig::new(Worker::builder().chips(4).chip_memory(4 << 20));
    rig.init();
    let (_ba, a) = filled(&rig, 1.5);
    let (_bb, b) = filled(&rig, 2.0);
    let outs: Vec<_> = (0..4).map(|_| filled(&rig, 0.0)).collect();
    let mut ys: Vec<TensorOf<f32>> = outs.iter().map(|(_, t)| t.share()).collect();
    let [y0, y1, y2, y3] = &mut ys[..] else { unreachable!() };
    let run = four_chips::call(&a, &b, y0, y1, y2, y3)
        .unwrap()
        .submit_with(&rig, simpler::RunOptions::new().capture_dag())
        .unwrap();
    run.wait().unwrap();
    for (buf, _) in &outs {
        assert_eq!(read(buf), vec![3.5; N as usize]);
    }
    let dag = run.dag().unwrap();
    assert!(four_chips::graph().matches(&dag), "{}", dag.to_dot());
    let node = &dag.graph()[dag.node(0).unwrap()];
    assert_eq!((node.members, node.target.as_str()), (4, "worker 0, worker 1, worker 2, worker 3"));

    let (ta, tb) = (a.tensor().clone(), b.tensor().clone());
    let touts: Vec<_> = ys.iter().map(|t| t.tensor().clone()).collect();
    let plain = rig
        .submit_with(RunOptions::new().capture_dag(), |o, _, _| {
            let mut members = Vec::new();
            for t in &touts {
                let mut x = TaskArgs::new();
                x.input(&ta)?.input(&tb)?.output(t)?;
                members.push(x);
            }
            o.submit_next_level_group(vadd::handle(), members, CallConfig::default(), &[0, 1, 2, 3])?;
            Ok(())
        })
        .unwrap();
    plain.wait().unwrap();
    assert_eq!(shape(&dag), shape(&plain.dag().unwrap()));
}

#[isolated_test]
fn singles_on_four_chips_and_a_chip_orchestration() {
    let mut rig = Rig::new(Worker::builder().chips(2).chip_memory(4 << 20).chip_cores(2));
    rig.init();
    let (_ba, a) = filled(&rig, 1.0);
    let (_bb, b) = filled(&rig, 2.0);
    let (by0, mut y0) = filled(&rig, 0.0);
    let (by1, mut y1) = filled(&rig, 0.0);
    rig.run(|o| {
        vadd::call(&a, &b, &mut y0)?.on(o, simpler::dsl::chip(0))?;
        add_then_double::call(&a, &b, &mut y1)?.on(o, simpler::dsl::chip(1))?;
        Ok(())
    })
    .unwrap();
    assert_eq!(read(&by0), vec![3.0; N as usize]);
    assert_eq!(read(&by1), vec![6.0; N as usize]);
}

#[isolated_test]
fn write_after_read_is_ordered_by_the_engine_in_graphs_and_plain_calls() {
    let mut rig = Rig::new(Worker::builder().sub_workers(2));
    rig.init();
    let (_ba, a) = filled(&rig, 1.0);
    let (by, mut y) = filled(&rig, 0.0);
    let (bh, mut h) = filled(&rig, 10.0);
    let run = war::call(&a, &mut y, &mut h)
        .unwrap()
        .submit_with(&rig, simpler::RunOptions::new().capture_dag())
        .unwrap();
    run.wait().unwrap();
    assert_eq!(read(&by), vec![11.0; N as usize], "the reader saw h before the write");
    assert_eq!(read(&bh), vec![11.0; N as usize]);
    let dag = run.dag().unwrap();
    let e = dag.graph().find_edge(dag.node(0).unwrap(), dag.node(1).unwrap()).expect("a WaR edge 0 -> 1");
    assert!(matches!(dag.graph()[e], EdgeReason::WriteAfterRead { arg: 0, .. }), "{:?}", dag.graph()[e]);
    assert!(war::graph().matches(&dag));

    // The same two calls with tags only: the engine orders the write after the read itself.
    let (ta, ty, th) = (a.tensor().clone(), y.tensor().clone(), h.tensor().clone());
    let plain = rig
        .submit_with(RunOptions::new().capture_dag(), |o, _, _| {
            plain_add(o, &ta, &th, &ty, 1.0)?;
            plain_inc(o, &th)
        })
        .unwrap();
    plain.wait().unwrap();
    assert_eq!(shape(&plain.dag().unwrap()), shape(&dag));
}

#[isolated_test]
fn scopes_lower_to_scope_calls() {
    let mut rig = Rig::new(Worker::builder().sub_workers(1));
    rig.init();
    let (_ba, a) = filled(&rig, 1.0);
    let (by, mut y) = filled(&rig, 0.0);
    let run = scoped::call(&a, &mut y)
        .unwrap()
        .submit_with(&rig, simpler::RunOptions::new().capture_dag())
        .unwrap();
    run.wait().unwrap();
    assert_eq!(read(&by), vec![4.0; N as usize]); // (1 + 1) + 1, then + 1
    assert!(scoped::graph().matches(&run.dag().unwrap()));
}

// ------------------------------------------------------------------------------------ L4 / L3

task_graph! {
    /// Runs on the L3 with chips.
    fn l3_add(a: In<f32>, b: In<f32>, y: Out<f32>) {
        vadd(a, b, &mut y).on(chip(0));
    }
}

task_graph! {
    /// Runs on the L3 with SUB workers.
    fn l3_inc(x: InOut<f32>) {
        inc(&mut x).on(sub());
    }
}

task_graph! {
    /// Spans both L3 Workers: the second waits for the first through `y`.
    fn l4_graph(a: In<f32>, b: In<f32>, y: Out<f32>) {
        l3_add(a, b, &mut y).on(worker(0));
        l3_inc(&mut y).on(worker(1));
    }
}

#[isolated_test]
fn an_l4_graph_over_two_l3_workers() {
    let chips = Worker::builder().chips(1).chip_memory(4 << 20).build().unwrap();
    let subs = Worker::builder().sub_workers(1).build().unwrap();
    let mut rig = Rig::new(Worker::builder().level(Level::Network1).worker(chips).worker(subs)); // workers 0 and 1
    rig.init();
    let (_ba, a) = filled(&rig, 1.0);
    let (_bb, b) = filled(&rig, 2.0);
    let (by, mut y) = filled(&rig, 0.0);
    let run = l4_graph::call(&a, &b, &mut y)
        .unwrap()
        .submit_with(&rig, simpler::RunOptions::new().capture_dag())
        .unwrap();
    run.wait().unwrap();
    assert_eq!(read(&by), vec![4.0; N as usize]);
    let dag = run.dag().unwrap();
    assert!(l4_graph::graph().matches(&dag), "{}", dag.to_dot());
    assert!(dag.has_edge(0, 1));
}

// ------------------------------------------------------------------------------------- digests

#[test]
fn the_digest_is_rebuilt_from_the_documented_bytes() {
    let info = add::INFO;
    let d = info.descriptor;
    let u32_at = |at: usize| u32::from_le_bytes(d[at..at + 4].try_into().unwrap());
    let mut at = 0;
    let mut take_u32 = || {
        let v = u32_at(at);
        at += 4;
        v
    };
    assert_eq!(take_u32(), 1, "schema_version");
    assert_eq!(take_u32(), CallableKind::HostFn as u32, "kind");
    assert_eq!(take_u32(), 2, "payload_format_version");
    let mut rebuilt: Vec<u8> = Vec::new();
    for v in [1u32, CallableKind::HostFn as u32, 2] {
        rebuilt.extend_from_slice(&v.to_le_bytes());
    }
    let push_str = |out: &mut Vec<u8>, s: &str| {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    };
    push_str(&mut rebuilt, "dsl::add");
    rebuilt.extend_from_slice(&0u32.to_le_bytes()); // subkind
    rebuilt.extend_from_slice(&(add::PARAMS.len() as u32).to_le_bytes());
    for p in &add::PARAMS {
        push_str(&mut rebuilt, p.name);
        rebuilt.extend_from_slice(&(p.mode as u32).to_le_bytes());
        push_str(&mut rebuilt, p.ty);
    }
    // The token hash: the last 32 bytes, after their length.
    rebuilt.extend_from_slice(&32u32.to_le_bytes());
    rebuilt.extend_from_slice(&d[d.len() - 32..]);
    assert_eq!(rebuilt, d, "the descriptor follows the documented layout");
    assert_eq!(Digest::of(&rebuilt), add::DIGEST);
    assert_eq!(info.path, "dsl::add");
    assert_eq!(
        add::PARAMS.map(|p| (p.name, p.mode, p.ty)),
        [
            ("a", ParamMode::In, "f32"),
            ("b", ParamMode::In, "f32"),
            ("out", ParamMode::Out, "f32"),
            ("k", ParamMode::Scalar, "f32")
        ]
    );
}

mod first {
    include!("dsl_digest_fixture.rs");
}

mod second {
    include!("dsl_digest_fixture.rs");
}

mod changed_body {
    use simpler::{callable, dsl::In, dsl::Out};

    #[callable(sub)]
    pub fn fixture(x: In<u32>, mut y: Out<u32>) {
        for (o, i) in y.iter_mut().zip(x.iter()) {
            *o = i + 2;
        }
    }
}

mod changed_signature {
    use simpler::{callable, dsl::In, dsl::Out};

    #[callable(sub)]
    pub fn fixture(x: In<u64>, mut y: Out<u32>) {
        for (o, i) in y.iter_mut().zip(x.iter()) {
            *o = *i as u32 + 1;
        }
    }
}

#[test]
fn same_source_same_digest_and_any_change_a_new_one() {
    assert_eq!(first::fixture::DIGEST, second::fixture::DIGEST);
    assert_eq!(first::fixture::DESCRIPTOR, second::fixture::DESCRIPTOR);
    assert_ne!(first::fixture::DIGEST, changed_body::fixture::DIGEST);
    assert_ne!(first::fixture::DIGEST, changed_signature::fixture::DIGEST);
    assert_ne!(changed_body::fixture::DIGEST, changed_signature::fixture::DIGEST);
    for d in [first::fixture::DIGEST, changed_body::fixture::DIGEST, add::DIGEST, l4_graph::DIGEST] {
        assert_eq!(
            CallableInfo::find(d).map(|c| c.digest),
            Some(d),
            "every callable is in the link-time registry"
        );
    }
}

#[isolated_test]
fn a_kernel_alone_on_a_level_2_worker() {
    let mut chip = Worker::builder().level(Level::Chip).chip_memory(1 << 20).build().unwrap();
    chip.init().unwrap();
    let (_ba, a) = filled(&chip, 1.0);
    let (_bb, b) = filled(&chip, 2.0);
    let (by, mut y) = filled(&chip, 0.0);
    vadd::call(&a, &b, &mut y).unwrap().run(&chip).unwrap();
    assert_eq!(read(&by), vec![3.0; N as usize]);
    twice::call(&mut y).unwrap().run(&chip).unwrap();
    assert_eq!(read(&by), vec![6.0; N as usize]);
    chip.close().unwrap();
}

#[isolated_test]
fn a_kernel_error_names_the_callable() {
    let mut rig = Rig::new(Worker::builder().chips(1).chip_memory(1 << 20));
    rig.init();
    let (_ba, a) = filled(&rig, 1.0);
    let (_bb, b) = filled(&rig, 2.0);
    let short = rig.create_buffer(16).unwrap();
    let mut y = short.typed::<f32>(&[4]).unwrap();
    let err = rig.run(|o| vadd::call(&a, &b, &mut y)?.on(o, simpler::dsl::chip(0)).map(|_| ())).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("vadd") && text.contains("length 64 vs 4"), "{text}");
}

#[isolated_test]
fn tensor_of_checks_the_element_type() {
    let mut w = Worker::builder().level(Level::Chip).build().unwrap();
    w.init().unwrap();
    let buf = w.create_buffer(64).unwrap();
    let err = TensorOf::<f32>::new(buf.tensor(&[16], DataType::Int32).unwrap()).unwrap_err();
    assert!(err.to_string().contains("i32 elements cannot be typed as TensorOf<f32>"), "{err}");
}

/// The digest of the fixture, as every build computes it: a build that hashed anything but
/// the source (an address, a time, a random seed) would change it. Recompute it only when the
/// fixture, its module path (`dsl::first::fixture`: the name of this test file is part of it),
/// the descriptor layout or the pinned toolchain changes.
const FIXTURE_DIGEST: &str = "sha256:f668a1cfdadb8517028865c2b874fcceb7ad70a7fa32c4cd75dd2d6d803b994c";

#[test]
fn the_digest_is_the_same_in_every_build() {
    assert_eq!(first::fixture::DIGEST.to_string(), FIXTURE_DIGEST);
}

#[callable(orch)]
fn l3_add_then_inc(o: &mut Orchestrator<'_>, a: In<f32>, b: In<f32>, y: Out<f32>) -> simpler::Result<()> {
    add::call(&a, &b, &mut y, 1.0)?.on(o, simpler::dsl::sub())?;
    inc::call(&mut y)?.on(o, simpler::dsl::sub())?; // reads back the output this run wrote
    Ok(())
}

#[isolated_test]
fn an_orchestration_reads_back_its_own_output_one_level_down() {
    let subs = Worker::builder().sub_workers(1).build().unwrap();
    let mut rig = Rig::new(Worker::builder().level(Level::Network1).worker(subs));
    rig.init();
    let (_ba, a) = filled(&rig, 1.0);
    let (_bb, b) = filled(&rig, 2.0);
    let (by, mut y) = filled(&rig, 0.0);
    rig.run(|o| l3_add_then_inc::call(&a, &b, &mut y)?.on(o, simpler::dsl::worker(0)).map(|_| ())).unwrap();
    assert_eq!(read(&by), vec![4.0; N as usize]);
}

#[isolated_test]
fn a_config_on_a_sub_placement_is_refused() {
    let mut rig = Rig::new(Worker::builder().sub_workers(1));
    rig.init();
    let (_bx, mut x) = filled(&rig, 1.0);
    let cfg = CallConfig::new().aicpu_threads(4);
    let err = rig.run(|o| inc::call(&mut x)?.config(cfg).on(o, simpler::dsl::sub()).map(|_| ())).unwrap_err();
    assert!(err.to_string().contains("takes no CallConfig"), "{err}");
}

task_graph! {
    /// A name declared inside a scope ends with it: the outer `t` and `k` are used afterwards.
    fn shadowed(a: In<f32>, y: Out<f32>, z: Out<f32>, k: f32) {
        let t = alloc::<f32>([64]);
        add(a, a, &mut t, 1.0).on(sub());
        scope(|| {
            let t = alloc::<f32>([64]);
            let k = 100.0f32;
            add(a, a, &mut t, k).on(sub());
            add(t, a, &mut y, 1.0).on(sub());
        });
        add(t, a, &mut z, k).on(sub());
    }
}

#[isolated_test]
fn names_inside_a_scope_end_with_it() {
    let mut rig = Rig::new(Worker::builder().sub_workers(2));
    rig.init();
    let (_ba, a) = filled(&rig, 1.0);
    let (by, mut y) = filled(&rig, 0.0);
    let (bz, mut z) = filled(&rig, 0.0);
    let run = shadowed::call(&a, &mut y, &mut z, 3.0)
        .unwrap()
        .submit_with(&rig, simpler::RunOptions::new().capture_dag())
        .unwrap();
    run.wait().unwrap();
    assert_eq!(read(&by), vec![201.0; N as usize]); // (1 + 1) * 100 + 1
    assert_eq!(read(&bz), vec![9.0; N as usize]); // ((1 + 1) + 1) * 3: the outer t and k
    assert!(shadowed::graph().matches(&run.dag().unwrap()));
}

#[isolated_test]
fn graph_parameters_naming_one_buffer_are_refused() {
    let mut rig = Rig::new(Worker::builder().sub_workers(1));
    rig.init();
    let (_bh, mut h) = filled(&rig, 1.0);
    let (_by, mut y) = filled(&rig, 0.0);
    let alias = h.read_only();
    let err = war::call(&alias, &mut y, &mut h).unwrap().run(&rig).unwrap_err();
    assert!(err.to_string().contains("overlap"), "{err}");
}

task_graph! {
    /// A SUB group, and chips chosen at run time.
    fn placed(a: In<f32>, y0: Out<f32>, y1: Out<f32>, y2: Out<f32>, c: u32) {
        group(|| {
            add(a, a, &mut y0, 1.0).on(sub());
            add(a, a, &mut y1, 1.0).on(sub());
        });
        vadd(y0, y1, &mut y2).on(chip(c));
    }
}

#[isolated_test]
fn a_sub_group_and_run_time_placements_match_the_run() {
    let mut rig = Rig::new(Worker::builder().sub_workers(2).chips(2).chip_memory(1 << 20));
    rig.init();
    let (_ba, a) = filled(&rig, 1.0);
    let outs: Vec<_> = (0..3).map(|_| filled(&rig, 0.0)).collect();
    let mut ys: Vec<TensorOf<f32>> = outs.iter().map(|(_, t)| t.share()).collect();
    let [y0, y1, y2] = &mut ys[..] else { unreachable!() };
    let run = placed::call(&a, y0, y1, y2, 1)
        .unwrap()
        .submit_with(&rig, simpler::RunOptions::new().capture_dag())
        .unwrap();
    run.wait().unwrap();
    assert_eq!(read(&outs[2].0), vec![4.0; N as usize]);
    let dag = run.dag().unwrap();
    assert!(placed::graph().matches(&dag), "{}\n{}", placed::graph().to_dot(), dag.to_dot());
    assert!(placed::graph().to_dot().contains("worker ?"));
}

#[isolated_test]
fn the_captured_dag_keeps_edges_to_tasks_that_already_finished() {
    // A task window of 2: the third task can only be claimed once the first (the scoped
    // writer of `y`) has finished and been reclaimed (and left the TensorMap), so the reader
    // of `y` is submitted after that.
    let mut rig = Rig::new(Worker::builder().sub_workers(1).task_window(2));
    rig.init();
    let (_ba, a) = filled(&rig, 1.0);
    let (by, y) = filled(&rig, 0.0);
    let (_bz, z) = filled(&rig, 0.0);
    let (_bw, w) = filled(&rig, 0.0);
    let (ta, ty, tz, tw) = (a.tensor().clone(), y.tensor().clone(), z.tensor().clone(), w.tensor().clone());
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |o, _, _| {
            o.scope(|o| plain_add(o, &ta, &ta, &ty, 1.0))?; // task 0 writes y
            o.scope(|o| plain_add(o, &ta, &ta, &tw, 1.0))?; // task 1
            o.scope(|o| plain_add(o, &ta, &ta, &tw, 1.0))?; // task 2: waits for task 0's slot
            plain_add(o, &ty, &ta, &tz, 1.0) // task 3 reads y
        })
        .unwrap();
    run.wait().unwrap();
    assert_eq!(read(&by), vec![2.0; N as usize]);
    assert!(run.dag().unwrap().has_edge(0, 3), "{}", run.dag().unwrap().to_dot());
}

// ------------------------------------------------------------------ scalars before tensors

/// `y *= k`, its scalar first in the signature.
#[callable(sub)]
fn scale_first(k: f32, mut y: InOut<f32>) {
    y.iter_mut().for_each(|v| *v *= k);
}

task_graph! {
    /// `y *= k` twice, the scalar first here too.
    fn scale_first_twice(k: f32, y: InOut<f32>) {
        scale_first(k, &mut y).on(sub());
        scale_first(k, &mut y).on(sub());
    }
}

/// A signature may put scalars before tensors: a call passes the tensors first, as a task
/// takes them, and each parameter still gets its own argument.
#[isolated_test]
fn a_scalar_before_a_tensor_in_a_signature_reaches_its_parameter() {
    let mut rig = Rig::new(Worker::builder().sub_workers(1));
    rig.init();
    let b = rig.create_buffer(16).unwrap();
    b.write(0, &[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let mut y = b.typed::<f32>(&[4]).unwrap();
    rig.run(|o| scale_first::call(2.0, &mut y)?.on(o, simpler::dsl::sub()).map(|_| ())).unwrap();
    assert_eq!(b.read::<f32>(0, 4).unwrap(), vec![2.0, 4.0, 6.0, 8.0]);
    scale_first_twice::call(0.5, &mut y).unwrap().run(&rig).unwrap();
    assert_eq!(b.read::<f32>(0, 4).unwrap(), vec![0.5, 1.0, 1.5, 2.0]);
}

/// `y = x * x + k` in double precision, on a SUB worker and on a chip core.
#[callable(sub)]
fn square_plus_f64(x: In<f64>, mut y: Out<f64>, k: f64) {
    for (o, v) in y.iter_mut().zip(x.iter()) {
        *o = v * v + k;
    }
}

/// `y += x` in double precision on a chip core.
#[callable(chip)]
fn accumulate_f64(x: In<f64>, mut y: InOut<f64>) {
    for (o, v) in y.iter_mut().zip(x.iter()) {
        *o += v;
    }
}

/// f64 tensors end to end: typed buffers, a SUB function and a kernel, values that need the
/// precision (1e-12 steps), and an f64 view refused as another type.
#[isolated_test]
fn f64_tensors_work_on_sub_workers_and_chips() {
    let mut rig = Rig::new(Worker::builder().sub_workers(1).chips(1).chip_memory(1 << 20));
    rig.init();
    let (bx, by) = (rig.create_buffer(8 * 4).unwrap(), rig.create_buffer(8 * 4).unwrap());
    let xs = [1.0f64 + 1e-12, 2.0, 3.0, 1e-300];
    bx.write(0, &xs).unwrap();
    let x = bx.typed::<f64>(&[4]).unwrap();
    let mut y = by.typed::<f64>(&[4]).unwrap();
    rig.run(|o| {
        square_plus_f64::call(&x, &mut y, 0.5)?.on(o, simpler::dsl::sub())?;
        accumulate_f64::call(&x, &mut y)?.on(o, simpler::dsl::chip(0))?;
        Ok(())
    })
    .unwrap();
    let want: Vec<f64> = xs.iter().map(|v| v * v + 0.5 + v).collect();
    assert_eq!(by.read::<f64>(0, 4).unwrap(), want);
    assert_eq!(x.tensor().view().dtype(), DataType::Float64);
    let err = TensorOf::<f32>::new(bx.tensor(&[4], DataType::Float64).unwrap()).unwrap_err();
    assert!(err.to_string().contains("f64 elements cannot be typed as TensorOf<f32>"), "{err}");
}

/// `out[0]` = the rank of `m`, `out[1..]` = its shape, then the core running the call.
#[callable(chip)]
fn describe(m: In<f32>, mut out: Out<u32>) {
    let shape = m.shape();
    out[0] = shape.len() as u32;
    out[1..1 + shape.len()].copy_from_slice(shape);
    out[1 + shape.len()] = simpler::dsl::worker_index().expect("inside a call");
}

/// The same on a SUB worker, for its worker index.
#[callable(sub)]
fn describe_sub(m: In<f32>, mut out: Out<u32>) {
    let shape = m.shape();
    out[0] = shape.len() as u32;
    out[1..1 + shape.len()].copy_from_slice(shape);
    out[1 + shape.len()] = simpler::dsl::worker_index().expect("inside a call");
}

/// A `#[callable]` kernel or host function sees its tensors' shapes and which core or SUB
/// worker runs it.
#[isolated_test]
fn callables_see_their_tensors_shapes_and_their_worker() {
    let mut rig = Rig::new(Worker::builder().sub_workers(2).chips(1).chip_cores(2).chip_memory(1 << 20));
    rig.init();
    let bm = rig.create_buffer(4 * 24).unwrap();
    let m = TensorOf::<f32>::new(bm.tensor(&[2, 3, 4], DataType::Float32).unwrap()).unwrap();
    let outs: Vec<simpler::Buffer> = (0..3).map(|_| rig.create_buffer(4 * 8).unwrap()).collect();
    let mut o: Vec<TensorOf<u32, simpler::dsl::ReadWrite>> =
        outs.iter().map(|b| b.typed::<u32>(&[8]).unwrap()).collect();
    rig.run(|orch| {
        let [o0, o1, o2] = &mut o[..] else { unreachable!() };
        describe::call(&m, o0)?.on(orch, simpler::dsl::chip(0))?;
        describe_sub::call(&m, o1)?.on(orch, simpler::dsl::sub())?;
        describe_sub::call(&m, o2)?.on(orch, simpler::dsl::sub())?;
        Ok(())
    })
    .unwrap();
    let got: Vec<Vec<u32>> = outs.iter().map(|b| b.read::<u32>(0, 5).unwrap()).collect();
    for g in &got {
        assert_eq!(g[..4], [3, 2, 3, 4], "rank and shape: {got:?}");
    }
    assert!(got[0][4] < 2, "a core of the chip: {got:?}");
    assert!(got[1][4] < 2 && got[2][4] < 2, "a SUB worker: {got:?}");
    assert_eq!(simpler::dsl::worker_index(), None, "not inside a call here");
}
