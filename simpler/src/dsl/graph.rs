//! The static structure of a `task_graph!`: the tasks it submits and the edges between them,
//! computed with the engine's own rules, as a `petgraph` graph with DOT export.

use std::collections::HashMap;

use petgraph::graph::{DiGraph, NodeIndex};

use crate::callable::linked::{CallableInfo, ParamMode};
use crate::dfx::graph::{EdgeReason, RunDag, TaskNode};

/// Why one task of a [`TaskGraph`] waits for another.
///
/// ```
/// use simpler::GraphEdge;
/// let e = GraphEdge::Tensor { arg: 0, tensor: "h" };
/// assert_ne!(e, GraphEdge::After);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GraphEdge {
    /// The consumer's tensor argument `arg` reads or updates what the producer wrote
    /// (read-after-write, or write-after-write through an `InOut` parameter): the engine
    /// infers it from the tags.
    Tensor {
        /// Argument index among the consumer's tensors.
        arg: u32,
        /// The tensor's name in the graph.
        tensor: &'static str,
    },
    /// A write after a read: `task_graph!` orders it with `add_dep_wait`, because tags alone
    /// do not.
    After,
}

/// The structure of a `task_graph!`: one node per task it submits, one edge per dependency.
///
/// Every `task_graph!` function `g` has `g::graph()`; after a run of it submitted with
/// `RunOptions::capture_dag`, [`matches`](TaskGraph::matches) compares the two.
///
/// ```
/// use simpler::{callable, task_graph, In, Out};
///
/// #[callable(sub)]
/// fn copy(a: In<f32>, mut b: Out<f32>) {
///     b.copy_from_slice(&a);
/// }
///
/// task_graph! {
///     fn twice(x: In<f32>, y: Out<f32>) {
///         let t = alloc::<f32>([16]);
///         copy(x, &mut t).on(sub());
///         copy(t, &mut y).on(sub());
///     }
/// }
///
/// let g = twice::graph();
/// assert_eq!(g.graph().node_count(), 2);
/// assert_eq!(g.graph().edge_count(), 1);
/// println!("{}", g.to_dot());
/// ```
#[derive(Debug, Clone, Default)]
pub struct TaskGraph {
    graph: DiGraph<TaskNode, GraphEdge>,
}

impl TaskGraph {
    /// The graph: node weights are tasks, edge weights the reason for each dependency.
    ///
    /// ```
    /// assert_eq!(simpler::TaskGraph::default().graph().node_count(), 0);
    /// ```
    pub fn graph(&self) -> &DiGraph<TaskNode, GraphEdge> {
        &self.graph
    }

    /// DOT text in the layout of [`RunDag::to_dot`], with tensor names on the edges.
    ///
    /// ```
    /// assert!(simpler::TaskGraph::default().to_dot().starts_with("digraph"));
    /// ```
    pub fn to_dot(&self) -> String {
        crate::dfx::graph::to_dot("task_graph", &self.graph, |edge| match edge {
            GraphEdge::Tensor { arg, tensor } => format!("arg {arg} ({tensor})"),
            GraphEdge::After => "add_dep_wait".to_string(),
        })
    }

    /// True when a captured run has exactly this structure: the same tasks (number, callable,
    /// placement, members) and the same edges with the same kind of reason (a tensor argument
    /// with the same index, or an `add_dep_wait`). A placement the macro cannot evaluate
    /// (`chip(n)` with a run-time `n`) shows as `worker ?` and matches any worker.
    ///
    /// ```
    /// assert!(simpler::TaskGraph::default().matches(&simpler::RunDag::default()));
    /// ```
    pub fn matches(&self, dag: &RunDag) -> bool {
        let key = |n: &TaskNode| (n.index, n.callable.clone(), n.members);
        let mut mine: Vec<_> = self.graph.node_weights().map(|n| (key(n), n.target.clone())).collect();
        let mut theirs: Vec<_> = dag.graph().node_weights().map(|n| (key(n), n.target.clone())).collect();
        mine.sort();
        theirs.sort();
        // A target known only at run time (`worker ?`) matches any worker.
        let same_target = |a: &str, b: &str| {
            a.split(", ").count() == b.split(", ").count()
                && a.split(", ")
                    .zip(b.split(", "))
                    .all(|(x, y)| x == y || (x == "worker ?" && y.starts_with("worker ")))
        };
        if mine.len() != theirs.len()
            || mine.iter().zip(&theirs).any(|((k1, t1), (k2, t2))| k1 != k2 || !same_target(t1, t2))
        {
            return false;
        }
        let g = &self.graph;
        let mut my_edges: Vec<(u32, u32, Option<u32>)> = g
            .edge_indices()
            .map(|e| {
                let (a, b) = g.edge_endpoints(e).expect("edge exists");
                let arg = match g[e] {
                    GraphEdge::Tensor { arg, .. } => Some(arg),
                    GraphEdge::After => None,
                };
                (g[a].index, g[b].index, arg)
            })
            .collect();
        let d = dag.graph();
        let mut their_edges: Vec<(u32, u32, Option<u32>)> = d
            .edge_indices()
            .map(|e| {
                let (a, b) = d.edge_endpoints(e).expect("edge exists");
                let arg = match d[e] {
                    EdgeReason::Tensor { arg, .. } => Some(arg),
                    EdgeReason::Explicit { retain: false } => None,
                    // A graph never retains: an `add_dep` edge cannot match.
                    EdgeReason::Explicit { retain: true } => return (u32::MAX, u32::MAX, None),
                };
                (d[a].index, d[b].index, arg)
            })
            .collect();
        my_edges.sort();
        their_edges.sort();
        my_edges == their_edges
    }
}

/// A tensor's state while the builder replays a graph.
#[derive(Default)]
struct Track {
    writer: Option<u32>,
    readers: Vec<u32>,
}

/// Builds a [`TaskGraph`] by replaying a `task_graph!` body (what the generated `graph()`
/// does): the engine's edge rules plus the write-after-read edges the macro adds.
#[doc(hidden)]
#[derive(Default)]
pub struct GraphBuilder {
    graph: DiGraph<TaskNode, GraphEdge>,
    nodes: HashMap<u32, NodeIndex>,
    tensors: Vec<Track>,
    names: Vec<&'static str>,
    next: u32,
}

/// One tensor argument of a replayed call: parameter position, tensor id.
#[doc(hidden)]
pub type ArgUse = (usize, usize);

impl GraphBuilder {
    /// An empty builder.
    pub fn new() -> GraphBuilder {
        GraphBuilder::default()
    }

    /// A tensor the graph receives or allocates (an allocation takes no task number).
    pub fn tensor(&mut self, name: &'static str) -> usize {
        self.tensors.push(Track::default());
        self.names.push(name);
        self.tensors.len() - 1
    }

    /// One call (or one group of `members` calls of one callable, each with its target).
    pub fn call(&mut self, info: &'static CallableInfo, members: &[(&str, &[ArgUse])]) {
        let index = self.next;
        self.next += 1;
        // The engine prints a SUB group's target once.
        let target = if members.iter().all(|(t, _)| *t == "sub") {
            "sub".to_string()
        } else {
            members.iter().map(|(t, _)| *t).collect::<Vec<_>>().join(", ")
        };
        let node = self.graph.add_node(TaskNode {
            index,
            callable: info.name.to_string(),
            digest: info.digest,
            target,
            members: members.len() as u32,
        });
        self.nodes.insert(index, node);
        let mut tensor_edges: Vec<(u32, GraphEdge)> = Vec::new();
        let mut after: Vec<u32> = Vec::new();
        let mut writes: Vec<usize> = Vec::new();
        for (_, args) in members {
            for &(pos, id) in *args {
                let mode = info.params.get(pos).map_or(ParamMode::In, |p| p.mode);
                let arg =
                    info.params[..pos.min(info.params.len())].iter().filter(|p| p.mode.is_tensor()).count();
                let track = &self.tensors[id];
                if mode.reads()
                    && let Some(w) = track.writer
                {
                    tensor_edges.push((w, GraphEdge::Tensor { arg: arg as u32, tensor: self.names[id] }));
                }
                if mode.writes() {
                    after.extend(track.readers.iter().copied().filter(|&r| r != index));
                    writes.push(id);
                } else {
                    self.tensors[id].readers.push(index);
                }
            }
        }
        for id in writes {
            self.tensors[id] = Track { writer: Some(index), readers: Vec::new() };
        }
        let mut seen: Vec<u32> = Vec::new();
        for (from, why) in tensor_edges.into_iter().chain(after.into_iter().map(|r| (r, GraphEdge::After))) {
            if from == index || seen.contains(&from) {
                continue;
            }
            seen.push(from);
            self.graph.add_edge(self.nodes[&from], node, why);
        }
    }

    /// The graph.
    pub fn finish(self) -> TaskGraph {
        TaskGraph { graph: self.graph }
    }
}
