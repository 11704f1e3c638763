//! The task_bench example's graph and Workers (`examples/task_bench/graph.rs` and
//! `examples/task_bench/setup.rs`, included as they are): the counts of the Task Bench spec,
//! every pattern run on SUB workers with the edges it must have (and no others than the ordering
//! that reusing two output generations adds), a corrupted input failing the run, and every
//! pattern and a corrupted input on each other placement (`chips`, `l4`, `remote`), the remote
//! one with its nodes in processes of this test binary that end with the run.

mod common;

#[path = "../examples/task_bench/graph.rs"]
mod graph;
#[path = "../examples/task_bench/setup.rs"]
mod setup;

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::time::Duration;

use common::*;
use graph::{Graph, Kernel, Pattern, Placement, Slots};
use setup::{Nodes, Plan, Workers};
use simpler::{CallableHandle, ErrorKind, RunOptions};

fn graph(pattern: Pattern, steps: i64, width: i64) -> Graph {
    Graph { steps, width, pattern, ..Graph::default() }
}

fn deps(g: &Graph, t: i64, p: i64) -> Vec<i64> {
    let mut v = Vec::new();
    g.for_each_dep(t, p, |q| v.push(q));
    v
}

#[test]
fn counts_match_the_spec() {
    // (pattern, dependencies at W = 2, at W = 4), T = 1000: the table of the spec.
    let table = [
        (Pattern::Trivial, 0, 0),
        (Pattern::NoComm, 1998, 3996),
        (Pattern::Stencil1d, 3996, 9990),
        (Pattern::Fft, 3996, 8992),
        (Pattern::Tree, 1998, 3994),
        (Pattern::AllToAll, 3996, 15984),
    ];
    for (pattern, w2, w4) in table {
        assert_eq!(graph(pattern, 1000, 2).dependencies(), w2, "{pattern:?} W=2");
        assert_eq!(graph(pattern, 1000, 4).dependencies(), w4, "{pattern:?} W=4");
    }
    assert_eq!(graph(Pattern::Tree, 1000, 2).tasks(), 1999);
    assert_eq!(graph(Pattern::Tree, 1000, 4).tasks(), 3995);
    assert_eq!(graph(Pattern::Stencil1d, 1000, 4).tasks(), 4000);

    let fft = graph(Pattern::Fft, 10, 4);
    assert_eq!((fft.dset(1), fft.dset(2), fft.dset(3)), (0, 1, 0));
    assert_eq!(deps(&fft, 1, 1), [0, 1, 2]);
    assert_eq!(deps(&fft, 2, 1), [1, 3]);
    assert_eq!(deps(&fft, 0, 1), [] as [i64; 0]);
    let stencil = graph(Pattern::Stencil1d, 10, 5);
    assert_eq!(
        (deps(&stencil, 3, 0), deps(&stencil, 3, 2), deps(&stencil, 3, 4)),
        (vec![0, 1], vec![1, 2, 3], vec![3, 4])
    );
    let tree = graph(Pattern::Tree, 10, 8);
    assert_eq!((tree.width_at(0), tree.width_at(2), tree.width_at(5)), (1, 4, 8));
    assert_eq!((deps(&tree, 3, 5), deps(&tree, 1, 1)), (vec![2], vec![0]));

    let mut k = Graph { kernel: Kernel::ComputeBound, iter: 10, ..graph(Pattern::NoComm, 3, 2) };
    assert_eq!(k.flops(), 6 * (128 * 10 + 64));
    k.kernel = Kernel::Empty;
    assert_eq!(k.flops(), 0);
    assert!(graph(Pattern::Fft, 4, 1).validate().is_err());
    assert!(Graph { output: 24, ..Graph::default() }.validate().is_err());
}

/// The task index of every point, in submission order.
fn task_indices(g: &Graph) -> HashMap<(i64, i64), u32> {
    let mut map = HashMap::new();
    for t in 0..g.steps {
        for p in g.offset_at(t)..g.offset_at(t) + g.width_at(t) {
            let n = map.len() as u32;
            map.insert((t, p), n);
        }
    }
    map
}

#[isolated_test]
fn every_pattern_runs_with_its_edges() {
    let (rig, [point]) = Rig::start(subs(2), [("task_bench_point", graph::point)]);
    for pattern in Pattern::ALL {
        for (width, kernel) in [(5, Kernel::Empty), (4, Kernel::ComputeBound)] {
            let g = Graph { kernel, iter: 16, output: 48, ..graph(pattern, 9, width) };
            let slots = Slots::new(&rig, &g).expect("slots");
            let run = rig
                .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
                    g.submit(orch, Placement::Sub { point: &point }, &slots, None)
                })
                .expect("submit");
            run.wait().unwrap_or_else(|e| panic!("{pattern:?} W={width}: {e}"));

            // The last step's outputs: 3 records of (T - 1, p) each.
            let last = g.steps - 1;
            for p in 0..g.width_at(last) {
                let v = slots.get(last, p).view();
                let got = slots.buffer.read::<i64>(v.byte_range().0 as usize / 8, 6).expect("read");
                assert_eq!(got, [last, p, last, p, last, p], "{pattern:?} W={width} point {p}");
            }

            // Every dataflow edge is there; any other edge only orders the reuse of a slot.
            let index = task_indices(&g);
            let point_of: HashMap<u32, (i64, i64)> = index.iter().map(|(&k, &v)| (v, k)).collect();
            let dag = run.dag().expect("captured");
            let dg = dag.graph();
            let edges: HashSet<(u32, u32)> = dg
                .edge_indices()
                .map(|e| {
                    let (a, b) = dg.edge_endpoints(e).expect("ends");
                    (dg[a].index, dg[b].index)
                })
                .collect();
            for (&(t, p), &to) in &index {
                for q in deps(&g, t, p) {
                    assert!(
                        edges.contains(&(index[&(t - 1, q)], to)),
                        "{pattern:?} W={width}: ({}, {q}) -> ({t}, {p}) missing",
                        t - 1
                    );
                }
            }
            for &(from, to) in &edges {
                let ((ta, a), (tb, b)) = (point_of[&from], point_of[&to]);
                let dataflow = ta == tb - 1 && deps(&g, tb, b).contains(&a);
                let write_after_read = ta == tb - 1 && deps(&g, ta, a).contains(&b);
                let write_after_write = ta == tb - 2 && a == b;
                assert!(
                    dataflow || write_after_read || write_after_write,
                    "{pattern:?} W={width}: extra edge ({ta}, {a}) -> ({tb}, {b})"
                );
            }
        }
    }
}

#[isolated_test]
fn a_corrupted_input_fails_the_run() {
    let (rig, [point]) = Rig::start(subs(2), [("task_bench_point", graph::point)]);
    let g = graph(Pattern::Stencil1d, 8, 4);
    let slots = Slots::new(&rig, &g).expect("slots");
    // Task (3, 1) writes a wrong point number; its consumers at step 4 (points 0, 1, 2) check it.
    let sub = Placement::Sub { point: &point };
    let err = rig
        .run(|orch| g.submit(orch, sub, &slots, Some((3, 1))))
        .expect_err("a corrupted record must fail the run");
    assert_err(&err, ErrorKind::TaskFailed, &["input from point 1", "expected (3, 1)"]);
    // The same graph without the corruption passes on the same Worker.
    rig.run(|orch| g.submit(orch, sub, &slots, None)).expect("clean run");
}

// ------------------------------------------------------------------------ the other placements

/// The Worker of `plan` (the remote placement's nodes already started), as the example builds
/// it, in a leak-checking rig, with the handle its tasks are submitted under.
fn start(plan: &Plan, nodes: &Nodes) -> (Rig, CallableHandle) {
    let mut rig = Rig::new(plan.builder(4096, nodes).expect("the placement's builder"));
    let handle = plan.register(&mut rig).expect("register");
    rig.init();
    (rig, handle)
}

/// Runs every pattern (the kernels alternating) on the Worker of `plan` and checks the last
/// step's outputs; then a run where task (3, 1) writes a wrong record, which must fail naming
/// the task that read it, and the clean graph again on the same Worker.
fn every_pattern_and_a_corrupted_record(rig: &Rig, plan: &Plan, handle: &CallableHandle) {
    let placement = plan.placement(handle);
    for (i, pattern) in Pattern::ALL.into_iter().enumerate() {
        let kernel = if i % 2 == 0 { Kernel::Empty } else { Kernel::ComputeBound };
        let g = Graph { kernel, iter: 8, output: 32, ..graph(pattern, 6, 3) };
        let slots = Slots::new(rig, &g).expect("slots");
        rig.run(|orch| g.submit(orch, placement, &slots, None))
            .unwrap_or_else(|e| panic!("{:?} {pattern:?}: {e}", plan.workers));
        let last = g.steps - 1;
        for p in 0..g.width_at(last) {
            let v = slots.get(last, p).view();
            let got = slots.buffer.read::<i64>(v.byte_range().0 as usize / 8, 4).expect("read");
            assert_eq!(got, [last, p, last, p], "{:?} {pattern:?}: point {p}", plan.workers);
        }
    }
    let g = graph(Pattern::Stencil1d, 6, 3);
    let slots = Slots::new(rig, &g).expect("slots");
    let err = rig
        .run(|orch| g.submit(orch, placement, &slots, Some((3, 1))))
        .expect_err("a corrupted record must fail the run");
    // Point 1 of step 3 feeds points 0, 1 and 2 of step 4; whichever reads it first fails.
    assert_err(
        &err,
        ErrorKind::TaskFailed,
        &["task (4, ", "input from point 1", "got (3, 23131), expected (3, 1)"],
    );
    rig.run(|orch| g.submit(orch, placement, &slots, None)).expect("the clean graph on the same Worker");
}

#[isolated_test]
fn chips_run_every_pattern_and_fail_on_a_corrupted_record() {
    let plan = Plan { workers: Workers::Chips, count: 2, bind: false };
    let (rig, handle) = start(&plan, &Nodes::none());
    assert_eq!(rig.chips(), 2);
    every_pattern_and_a_corrupted_record(&rig, &plan, &handle);
}

#[isolated_test]
fn l4_runs_every_pattern_and_fails_on_a_corrupted_record() {
    let plan = Plan { workers: Workers::L4, count: 3, bind: false };
    assert_eq!((plan.l3_sub_workers(0), plan.l3_sub_workers(1)), (2, 1));
    assert_eq!(Plan { count: 1, ..plan }.l3_sub_workers(1), 1, "at least one SUB worker each");
    let (rig, handle) = start(&plan, &Nodes::none());
    assert_eq!(rig.nested_workers(), 2);
    every_pattern_and_a_corrupted_record(&rig, &plan, &handle);
}

/// The env var that makes `task_bench_node` serve as a node.
const NODE_ENV: &str = "SIMPLER_TEST_TASK_BENCH_NODE";

/// Not a test of its own: the body of a node process of the remote placement (this test binary
/// started by `Nodes::start` with `NODE_ENV`), as the example's `--node` role. Ignored, so it
/// runs only when a test starts it.
#[test]
#[ignore = "the body of a node process that a test starts"]
fn task_bench_node() {
    assert!(std::env::var_os(NODE_ENV).is_some(), "task_bench_node runs only in a process a test started");
    setup::serve_node().expect("the node served its session");
}

/// Starts the remote placement's two nodes as processes of this test binary.
fn start_nodes(plan: &Plan) -> Nodes {
    Nodes::start(plan, || {
        let mut node = Command::new(std::env::current_exe().expect("current_exe"));
        node.args(["--exact", "task_bench_node", "--ignored", "--nocapture", "--test-threads=1"])
            .env(NODE_ENV, "1");
        node
    })
    .expect("the nodes listen")
}

/// The node processes and every process below them (their SUB workers).
fn node_tree(nodes: &Nodes) -> Vec<i32> {
    nodes.pids().into_iter().flat_map(descendants).collect()
}

#[isolated_test]
fn remote_runs_every_pattern_and_fails_on_a_corrupted_record() {
    let plan = Plan { workers: Workers::Remote, count: 2, bind: false };
    // Declared before the rig: on a panic the rig closes the root first, then the nodes are
    // killed and reaped.
    let nodes = start_nodes(&plan);
    let (rig, handle) = start(&plan, &nodes);
    assert_eq!(rig.remote_workers(), 2);
    let tree = node_tree(&nodes);
    assert_eq!(tree.len(), 4, "two nodes of one SUB worker each: {tree:?}");
    every_pattern_and_a_corrupted_record(&rig, &plan, &handle);
    // Closing the root ends both sessions; the nodes exit by themselves, successfully, and
    // nothing of theirs is left.
    drop(rig);
    nodes.wait().expect("both nodes end their sessions and exit 0");
    assert_descendants_dead(&tree);
}

#[isolated_test]
fn remote_nodes_exit_when_their_root_is_gone() {
    let plan = Plan { workers: Workers::Remote, count: 2, bind: false };
    let mut nodes = start_nodes(&plan);
    let (rig, _handle) = start(&plan, &nodes);
    let tree = node_tree(&nodes);
    // What a node sees when its root dies without closing: its stdin pipe closes. The root
    // Worker is still connected, so only the pipe can have ended them.
    nodes.hang_up();
    for pid in nodes.pids() {
        wait_for("a node to exit once its pipe closed", Duration::from_secs(10), || !process_alive(pid));
    }
    let codes = nodes.exit_codes().expect("the nodes are reaped");
    assert_eq!(codes, [Some(3), Some(3)], "each node exits on its own when the pipe closes");
    assert_descendants_dead(&tree);
    drop(rig); // closing a root whose nodes are gone still succeeds (the rig checks it)
}
