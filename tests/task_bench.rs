//! The task_bench example's graph (`examples/task_bench/graph.rs`, included as is): the counts
//! of the Task Bench spec, every pattern run on SUB workers with the edges it must have (and no
//! others than the ordering that reusing two output generations adds), and a corrupted input
//! failing the run.

mod common;

#[path = "../examples/task_bench/graph.rs"]
mod graph;

use std::collections::{HashMap, HashSet};

use common::*;
use graph::{Graph, Kernel, Pattern, Slots};
use simpler::{ErrorKind, RunOptions};

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
                    g.submit(orch, &point, &slots, None)
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
    let err = rig
        .run(|orch| g.submit(orch, &point, &slots, Some((3, 1))))
        .expect_err("a corrupted record must fail the run");
    assert_err(&err, ErrorKind::TaskFailed, &["input from point 1", "expected (3, 1)"]);
    // The same graph without the corruption passes on the same Worker.
    rig.run(|orch| g.submit(orch, &point, &slots, None)).expect("clean run");
}
