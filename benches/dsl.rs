//! (h) The DSL adds no cost at run time: one 16-task graph submitted through `task_graph!` /
//! `#[callable]` and through the plain API (`orch.alloc`, `TaskArgs`, `orch.submit_sub`).
//!
//! The graph is a mix of chains and diamonds over two inputs, nine `orch.alloc` intermediates
//! and one output: 16 SUB tasks (ten `add`, six in-place `inc`), 9 allocations. Both versions
//! make the same Orchestrator calls in the same order with the same tensors, tags and scalars;
//! before timing, one captured run of each is checked against the graph's static structure
//! (`graph().matches`) and both must compute the same output.
//!
//! What is timed is the orchestration function alone (the generated `dsl_mix(orch, ..)` or the
//! hand-written `plain_mix(orch, ..)`), inside `Worker::run`, without completing anything. As in
//! `submit` (whose no-op endpoints hold every task until the submit loop ends), no task of the
//! graph may complete while it is built: each run first submits, untimed, a `gate` task that
//! writes both graph inputs and sleeps for `GATE`, so every task of the graph finds a live
//! producer and stays PENDING; no submit routes work to the scheduler, and the timed region is
//! the Orchestrator's own work plus whatever the API in front of it costs. A pair with a sample
//! whose timed region ended later than `GATE` after the gate's submit began is dropped (and
//! counted).
//!
//! The two versions alternate, one run each per pair, the first of the pair swapped every pair
//! (macro, plain | plain, macro | ...), all in one process, so machine noise falls on both alike.
//! Figures: `graph_submit_macro_us`, `graph_submit_plain_us` (medians) and
//! `graph_submit_ratio` (macro median / plain median). Target: the ratio at most 1.1.

#![allow(clippy::print_stdout)]

mod common;

use std::time::{Duration, Instant};

use common::{figure, percentile, spread, target, us};
use simpler::{
    CallableHandle, DataType, Orchestrator, RunOptions, TaskArgs, TaskHandle, Tensor, Worker, callable,
    dsl::In, dsl::InOut, dsl::Out, dsl::TensorOf, task_graph, trace::RunDag,
};

/// Elements per tensor.
const N: u32 = 64;
/// Untimed pairs first (allocator, caches, the callables' handles).
const WARMUP: usize = 200;
/// Timed pairs (one run of each version per pair).
const PAIRS: usize = 1_500;
/// How long the gate task holds the graph's inputs.
const GATE: Duration = Duration::from_millis(1);
/// Most the macro median may be, as a multiple of the plain one.
const RATIO_TARGET: f64 = 1.1;

// ------------------------------------------------------------------------------- the callables

/// `out = (a + b) * k`.
#[callable(sub)]
fn add(a: In<f32>, b: In<f32>, mut out: Out<f32>, k: f32) {
    for i in 0..out.len() {
        out[i] = (a[i] + b[i]) * k;
    }
}

/// `x += 1` in place.
#[callable(sub)]
fn inc(mut x: InOut<f32>) {
    for v in x.iter_mut() {
        *v += 1.0;
    }
}

/// Holds `a` and `b` (as their writer) for `micros` microseconds, changing nothing: every task
/// of a graph submitted after it depends on it and stays PENDING meanwhile.
#[callable(sub)]
fn gate(a: InOut<f32>, b: InOut<f32>, micros: u64) {
    let _ = (a, b);
    std::thread::sleep(Duration::from_micros(micros));
}

// --------------------------------------------------------------------------- the graph, twice

task_graph! {
    /// 16 tasks: two chains of `add` + `inc` joined in diamonds, down to `y`.
    fn dsl_mix(a: In<f32>, b: In<f32>, y: Out<f32>, n: u32) {
        let t1 = alloc::<f32>([n]);
        let t2 = alloc::<f32>([n]);
        let t3 = alloc::<f32>([n]);
        let t4 = alloc::<f32>([n]);
        let t5 = alloc::<f32>([n]);
        let t6 = alloc::<f32>([n]);
        let t7 = alloc::<f32>([n]);
        let t8 = alloc::<f32>([n]);
        let t9 = alloc::<f32>([n]);
        add(a, b, &mut t1, 1.0).on(sub());
        add(b, a, &mut t2, 2.0).on(sub());
        inc(&mut t1).on(sub());
        inc(&mut t2).on(sub());
        add(t1, t2, &mut t3, 1.0).on(sub());
        add(t1, a, &mut t4, 0.5).on(sub());
        add(t2, b, &mut t5, 0.5).on(sub());
        inc(&mut t3).on(sub());
        add(t3, t4, &mut t6, 1.0).on(sub());
        add(t3, t5, &mut t7, 1.0).on(sub());
        inc(&mut t6).on(sub());
        inc(&mut t7).on(sub());
        add(t6, t7, &mut t8, 1.0).on(sub());
        add(t4, t5, &mut t9, 1.0).on(sub());
        inc(&mut t9).on(sub());
        add(t8, t9, &mut y, 0.25).on(sub());
    }
}

/// The handles a plain-API user holds (what `Worker::register` returns), looked up once.
struct Handles {
    add: &'static CallableHandle,
    inc: &'static CallableHandle,
}

fn add_plain(
    o: &mut Orchestrator<'_>,
    h: &Handles,
    a: &Tensor,
    b: &Tensor,
    out: &Tensor,
    k: f32,
) -> simpler::Result<TaskHandle> {
    let mut x = TaskArgs::new();
    x.input(a)?.input(b)?.output(out)?.scalar_f32(k);
    o.submit_sub(h.add, x)
}

fn inc_plain(o: &mut Orchestrator<'_>, h: &Handles, t: &Tensor) -> simpler::Result<TaskHandle> {
    let mut x = TaskArgs::new();
    x.inout(t)?;
    o.submit_sub(h.inc, x)
}

/// `dsl_mix` by hand: the same allocations and submits in the same order.
fn plain_mix(
    o: &mut Orchestrator<'_>,
    h: &Handles,
    a: &Tensor,
    b: &Tensor,
    y: &Tensor,
    n: u32,
) -> simpler::Result<()> {
    let t1 = o.alloc(&[n], DataType::Float32)?;
    let t2 = o.alloc(&[n], DataType::Float32)?;
    let t3 = o.alloc(&[n], DataType::Float32)?;
    let t4 = o.alloc(&[n], DataType::Float32)?;
    let t5 = o.alloc(&[n], DataType::Float32)?;
    let t6 = o.alloc(&[n], DataType::Float32)?;
    let t7 = o.alloc(&[n], DataType::Float32)?;
    let t8 = o.alloc(&[n], DataType::Float32)?;
    let t9 = o.alloc(&[n], DataType::Float32)?;
    add_plain(o, h, a, b, &t1, 1.0)?;
    add_plain(o, h, b, a, &t2, 2.0)?;
    inc_plain(o, h, &t1)?;
    inc_plain(o, h, &t2)?;
    add_plain(o, h, &t1, &t2, &t3, 1.0)?;
    add_plain(o, h, &t1, a, &t4, 0.5)?;
    add_plain(o, h, &t2, b, &t5, 0.5)?;
    inc_plain(o, h, &t3)?;
    add_plain(o, h, &t3, &t4, &t6, 1.0)?;
    add_plain(o, h, &t3, &t5, &t7, 1.0)?;
    inc_plain(o, h, &t6)?;
    inc_plain(o, h, &t7)?;
    add_plain(o, h, &t6, &t7, &t8, 1.0)?;
    add_plain(o, h, &t4, &t5, &t9, 1.0)?;
    inc_plain(o, h, &t9)?;
    add_plain(o, h, &t8, &t9, y, 0.25)?;
    Ok(())
}

// ------------------------------------------------------------------------------------ the runs

#[derive(Clone, Copy, PartialEq, Eq)]
enum Api {
    Macro,
    Plain,
}

/// The graph's tensors and the handles the plain version submits to.
struct Graph {
    handles: Handles,
    a: TensorOf<f32>,
    b: TensorOf<f32>,
    y: TensorOf<f32>,
}

impl Graph {
    /// Submits the graph through `api` as one orchestration; returns the time of the graph's
    /// submits and whether all of them were made while the gate still held (always, ungated).
    fn build(
        &mut self,
        o: &mut Orchestrator<'_>,
        api: Api,
        gated: bool,
    ) -> simpler::Result<(Duration, bool)> {
        // Taken before the gate is submitted: the gate cannot end earlier than `GATE` after it.
        let held = Instant::now();
        if gated {
            gate::call(&mut self.a, &mut self.b, GATE.as_micros() as u64)?.on(o, simpler::dsl::sub())?;
        }
        let elapsed = match api {
            Api::Macro => {
                // The generated function takes its tensors as typed handles by value: they are
                // made before the clock starts, as the plain version's `&Tensor`s are, and
                // dropped inside the timed region (the function owns them).
                let (a, b, y) = (self.a.read_only(), self.b.read_only(), self.y.share());
                let start = Instant::now();
                dsl_mix(o, a, b, y, N)?;
                start.elapsed()
            }
            Api::Plain => {
                let (a, b, y) = (self.a.tensor(), self.b.tensor(), self.y.tensor());
                let start = Instant::now();
                plain_mix(o, &self.handles, a, b, y, N)?;
                start.elapsed()
            }
        };
        Ok((elapsed, !gated || held.elapsed() < GATE))
    }

    /// One gated run of the graph through `api`: the submit time and whether the sample counts.
    fn timed(&mut self, worker: &Worker, api: Api) -> simpler::Result<(Duration, bool)> {
        let mut got = None;
        worker.run(|o| {
            got = Some(self.build(o, api, true)?);
            Ok(())
        })?;
        Ok(got.expect("the orchestration ran"))
    }

    /// One ungated, captured run through `api`: its DAG and the output `y` it computed.
    fn checked(
        &mut self,
        worker: &Worker,
        y: &simpler::Buffer,
        api: Api,
    ) -> simpler::Result<(RunDag, Vec<f32>)> {
        y.write(0, &vec![0.0f32; N as usize])?;
        let run = worker
            .submit_with(RunOptions::new().capture_dag(), |o, _, _| self.build(o, api, false).map(|_| ()))?;
        run.wait()?;
        let dag = run.dag().expect("a captured run has a DAG");
        Ok((dag, y.read::<f32>(0, N as usize)?))
    }
}

fn main() -> simpler::Result<()> {
    // One SUB worker: the gate occupies it, and the graph's tasks run after the timed region.
    let mut worker = Worker::builder().sub_workers(1).build()?;
    worker.init()?; // registers `add`, `inc`, `gate` (the link-time registry)
    let bytes = N as usize * 4;
    let (ba, bb, by) =
        (worker.create_buffer(bytes)?, worker.create_buffer(bytes)?, worker.create_buffer(bytes)?);
    ba.write(0, &vec![1.0f32; N as usize])?;
    bb.write(0, &vec![2.0f32; N as usize])?;
    let mut g = Graph {
        handles: Handles { add: add::INFO.handle(), inc: inc::INFO.handle() },
        a: ba.typed::<f32>(&[N])?,
        b: bb.typed::<f32>(&[N])?,
        y: by.typed::<f32>(&[N])?,
    };

    // Both versions build the graph the macro describes and compute the same output.
    let (macro_dag, macro_y) = g.checked(&worker, &by, Api::Macro)?;
    let (plain_dag, plain_y) = g.checked(&worker, &by, Api::Plain)?;
    assert!(dsl_mix::graph().matches(&macro_dag), "the macro run differs from dsl_mix::graph()");
    assert!(dsl_mix::graph().matches(&plain_dag), "the plain run differs from dsl_mix::graph()");
    assert_eq!(macro_dag.graph().node_count(), 16);
    assert_eq!(macro_y, plain_y, "the two versions computed different outputs");
    assert!(macro_y.iter().all(|&v| v > 0.0), "the graph computed nothing: {macro_y:?}");
    println!(
        "graph: {} tasks, {} edges, 9 allocs; both versions match dsl_mix::graph() and give y[0] = {}",
        macro_dag.graph().node_count(),
        macro_dag.graph().edge_count(),
        macro_y[0]
    );

    let order =
        |i: usize| if i.is_multiple_of(2) { [Api::Macro, Api::Plain] } else { [Api::Plain, Api::Macro] };
    for i in 0..WARMUP {
        for api in order(i) {
            g.timed(&worker, api)?;
        }
    }
    let (mut macro_us, mut plain_us, mut ratios) =
        (Vec::with_capacity(PAIRS), Vec::with_capacity(PAIRS), Vec::with_capacity(PAIRS));
    let mut dropped = 0usize;
    for i in 0..PAIRS {
        let mut pair = [0.0f64; 2];
        let mut ok = true;
        for api in order(i) {
            let (d, held) = g.timed(&worker, api)?;
            ok &= held;
            pair[usize::from(api == Api::Plain)] = us(d);
        }
        if !ok {
            dropped += 1;
            continue;
        }
        macro_us.push(pair[0]);
        plain_us.push(pair[1]);
        ratios.push(pair[0] / pair[1]);
    }
    worker.close()?;
    assert!(!macro_us.is_empty(), "every pair was dropped: the gate never held");

    spread("macro (task_graph!) submit", &mut macro_us);
    spread("plain (TaskArgs + submit_sub) submit", &mut plain_us);
    let (m, p) = (percentile(&mut macro_us, 50.0), percentile(&mut plain_us, 50.0));
    let ratio = m / p;
    println!(
        "{} pairs ({dropped} dropped: gate released early), alternating order; per-pair ratio p10/p50/p90 = {:.3}/{:.3}/{:.3}; per task {:.3} us macro, {:.3} us plain",
        macro_us.len(),
        percentile(&mut ratios, 10.0),
        percentile(&mut ratios, 50.0),
        percentile(&mut ratios, 90.0),
        m / 16.0,
        p / 16.0,
    );
    figure("graph_submit_macro_us", m, "us");
    figure("graph_submit_plain_us", p, "us");
    figure("graph_submit_ratio", ratio, "x");
    target("graph_submit_ratio", ratio, "<=", RATIO_TARGET, "x");
    Ok(())
}
