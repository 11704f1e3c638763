//! (i) Tiles: one 256-tile graph (split `x` into 256 pieces, a kernel per tile on chip `i % 2`
//! writing its piece of an intermediate, then one combine on a SUB worker that reads the whole
//! intermediate) submitted through a `task_graph!` loop and through the plain API (`split`,
//! `TaskArgs`, `submit_next_level`, `submit_sub`).
//!
//! As in `dsl`, what is timed is the orchestration function alone (the generated
//! `tiles256(orch, ..)` or the hand-written `plain_tiles256(orch, ..)`), inside `Worker::run`,
//! while an untimed `gate` task holds `x` (as its writer) for `GATE`, so no task of the graph
//! can be dispatched while it is built; a pair whose timed region ended after the gate may have
//! released is dropped. The two versions alternate (the first of each pair swapped every pair).
//! Before timing, one captured run of each is compared with `tiles256::graph()` and both must
//! compute the same output.
//!
//! Figures: `tiles256_submit_macro_us`, `tiles256_submit_plain_us` (medians) and
//! `tiles256_submit_ratio`. Target: the macro graph at most 0.7x the plain one.

#![allow(clippy::print_stdout)]

mod common;

use std::time::{Duration, Instant};

use common::{figure, percentile, spread, target, us};
use simpler::{
    CallableHandle, DataType, Orchestrator, RunOptions, TaskArgs, Tensor, Worker, callable, chip::CallConfig,
    dsl::In, dsl::InOut, dsl::Out, dsl::TensorOf, task_graph, trace::RunDag,
};

/// Tiles.
const TILES: u32 = 256;
/// Elements per tile.
const TILE: u32 = 16;
const WARMUP: usize = 50;
const PAIRS: usize = 400;
/// How long the gate task holds `x`.
const GATE: Duration = Duration::from_millis(20);
const RATIO_TARGET: f64 = 0.7;

/// `y = 2x` on one chip core.
#[callable(chip)]
fn tile_kernel(x: In<f32>, mut y: Out<f32>) {
    for (o, v) in y.iter_mut().zip(x.iter()) {
        *o = 2.0 * v;
    }
}

/// `out[0] = Σ parts`.
#[callable(sub)]
fn combine(parts: In<f32>, mut out: Out<f32>) {
    out[0] = parts.iter().sum();
}

/// Holds `x` (as its writer) for `micros` microseconds.
#[callable(sub)]
fn gate(x: InOut<f32>, micros: u64) {
    let _ = x;
    std::thread::sleep(Duration::from_micros(micros));
}

task_graph! {
    /// 256 kernels over two chips, then one combine.
    fn tiles256(x: In<f32>, out: Out<f32>) {
        let parts = alloc::<f32>([TILES * TILE]);
        let ps = parts.split(TILES);
        let xs = x.split(TILES);
        for i in 0..TILES {
            tile_kernel(xs[i], &mut ps[i]).on(chip(i % 2));
        }
        combine(parts, &mut out).on(sub());
    }
}

/// `tiles256` by hand with the plain API.
fn plain_tiles256(
    o: &mut Orchestrator<'_>,
    kernel: &CallableHandle,
    combine: &CallableHandle,
    x: &Tensor,
    out: &Tensor,
) -> simpler::Result<()> {
    let parts = o.alloc(&[TILES * TILE], DataType::Float32)?;
    let ps = parts.split(TILES)?;
    let xs = x.split(TILES)?;
    for (i, (xt, pt)) in xs.iter().zip(&ps).enumerate() {
        let mut args = TaskArgs::new();
        args.input(xt)?.output(pt)?;
        o.submit_next_level(kernel, args, CallConfig::new(), i as u32 % 2)?;
    }
    let mut args = TaskArgs::new();
    args.input(&parts)?.output(out)?;
    o.submit_sub(combine, args)?;
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Api {
    Macro,
    Plain,
}

struct Graph {
    x: TensorOf<f32>,
    out: TensorOf<f32>,
}

impl Graph {
    fn build(
        &mut self,
        o: &mut Orchestrator<'_>,
        api: Api,
        gated: bool,
    ) -> simpler::Result<(Duration, bool)> {
        let held = Instant::now();
        if gated {
            gate::call(&mut self.x, GATE.as_micros() as u64)?.on(o, simpler::dsl::sub())?;
        }
        let elapsed = match api {
            Api::Macro => {
                let (x, out) = (self.x.read_only(), self.out.share());
                let start = Instant::now();
                tiles256(o, x, out)?;
                start.elapsed()
            }
            Api::Plain => {
                let (x, out) = (self.x.tensor(), self.out.tensor());
                let (k, c) = (tile_kernel::INFO.handle(), combine::INFO.handle());
                let start = Instant::now();
                plain_tiles256(o, k, c, x, out)?;
                start.elapsed()
            }
        };
        Ok((elapsed, !gated || held.elapsed() < GATE))
    }

    fn timed(&mut self, worker: &Worker, api: Api) -> simpler::Result<(Duration, bool)> {
        let mut result = None;
        worker.run(|o| {
            result = Some(self.build(o, api, true)?);
            Ok(())
        })?;
        Ok(result.expect("the run built the graph"))
    }

    fn checked(
        &mut self,
        worker: &Worker,
        out: &simpler::Buffer,
        api: Api,
    ) -> simpler::Result<(RunDag, f32)> {
        out.write(0, &[0.0f32])?;
        let run = worker
            .submit_with(RunOptions::new().capture_dag(), |o, _, _| self.build(o, api, false).map(|_| ()))?;
        run.wait()?;
        Ok((run.dag().expect("captured"), out.read::<f32>(0, 1)?[0]))
    }
}

fn main() -> simpler::Result<()> {
    let mut worker = Worker::builder().chips(2).sub_workers(1).build()?;
    worker.init()?;
    let n = (TILES * TILE) as usize;
    let (bx, bo) = (worker.create_buffer(4 * n)?, worker.create_buffer(4)?);
    bx.write(0, &vec![1.0f32; n])?;
    let mut g = Graph { x: bx.typed::<f32>(&[TILES * TILE])?, out: bo.typed::<f32>(&[1])? };

    let (macro_dag, macro_out) = g.checked(&worker, &bo, Api::Macro)?;
    let (plain_dag, plain_out) = g.checked(&worker, &bo, Api::Plain)?;
    let graph = tiles256::graph();
    assert!(graph.matches(&macro_dag), "the macro run differs from tiles256::graph()");
    assert!(graph.matches(&plain_dag), "the plain run differs from tiles256::graph()");
    assert_eq!(macro_dag.graph().node_count(), TILES as usize + 1);
    assert_eq!((macro_out, plain_out), (2.0 * n as f32, 2.0 * n as f32), "wrong sums");
    println!(
        "graph: {} tasks, {} edges; both versions match tiles256::graph() and sum to {macro_out}",
        macro_dag.graph().node_count(),
        macro_dag.graph().edge_count()
    );

    let order =
        |i: usize| if i.is_multiple_of(2) { [Api::Macro, Api::Plain] } else { [Api::Plain, Api::Macro] };
    for i in 0..WARMUP {
        for api in order(i) {
            g.timed(&worker, api)?;
        }
    }
    let (mut macro_us, mut plain_us, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
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

    spread("macro (task_graph! loop) submit", &mut macro_us);
    spread("plain (split + TaskArgs) submit", &mut plain_us);
    let (m, p) = (percentile(&mut macro_us, 50.0), percentile(&mut plain_us, 50.0));
    println!(
        "{} pairs ({dropped} dropped), alternating order; per-pair ratio p10/p50/p90 = {:.3}/{:.3}/{:.3}; per task {:.3} us macro, {:.3} us plain",
        macro_us.len(),
        percentile(&mut ratios, 10.0),
        percentile(&mut ratios, 50.0),
        percentile(&mut ratios, 90.0),
        m / f64::from(TILES + 1),
        p / f64::from(TILES + 1),
    );
    figure("tiles256_submit_macro_us", m, "us");
    figure("tiles256_submit_plain_us", p, "us");
    figure("tiles256_submit_ratio", m / p, "x");
    target("tiles256_submit_ratio", m / p, "<=", RATIO_TARGET, "x");
    Ok(())
}
