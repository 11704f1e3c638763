//! The static structure of a `task_graph!`: the tasks it submits and the edges between them,
//! computed with the engine's own rules, as a `petgraph` graph with DOT export.
//!
//! `graph()` (or `graph_for(shapes)` for a graph with tiles of a run-time count) yields a
//! [`TaskGraph`], built through a [`GraphBuilder`]; [`TaskGraph::matches`] compares it with a
//! captured `RunDag`. [`StaticEdges`] tracks, in the generated body, the uses of the graph's
//! intermediates, whose edges arrive as deps (the tensors marked static, `engine::tensor_map`).

use std::collections::HashMap;

use petgraph::graph::{DiGraph, NodeIndex};

use crate::callable::linked::{CallableInfo, ParamMode};
use crate::data::task_args::TaskHandle;
use crate::dfx::graph::{EdgeReason, RunDag, TaskNode};

/// Why one task of a [`TaskGraph`] waits for another: the engine's tag rules, as in
/// [`EdgeReason`].
///
/// ```
/// use simpler::dsl::GraphEdge;
/// let e = GraphEdge::Tensor { arg: 0, tensor: "h" };
/// assert_ne!(e, GraphEdge::WriteAfterRead { arg: 0, tensor: "h" });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GraphEdge {
    /// The consumer's tensor argument `arg` reads or updates what the producer wrote
    /// (read-after-write, through an `In` or `InOut` parameter).
    Tensor {
        /// Argument index among the consumer's tensors.
        arg: u32,
        /// The tensor's name in the graph.
        tensor: &'static str,
    },
    /// The consumer's `Out` argument `arg` overwrites what the producer wrote
    /// (write-after-write).
    WriteAfterWrite {
        /// Argument index among the consumer's tensors.
        arg: u32,
        /// The tensor's name in the graph.
        tensor: &'static str,
    },
    /// The consumer's argument `arg` writes what the producer reads (write-after-read): it
    /// waits until the producer has read it.
    WriteAfterRead {
        /// Argument index among the consumer's tensors.
        arg: u32,
        /// The tensor's name in the graph.
        tensor: &'static str,
    },
}

/// The structure of a `task_graph!`: one node per task it submits, one edge per dependency.
///
/// Every `task_graph!` function `g` has `g::graph()`; after a run of it submitted with
/// `RunOptions::capture_dag`, [`matches`](TaskGraph::matches) compares the two.
///
/// ```
/// use simpler::{callable, task_graph, dsl::In, dsl::Out};
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
    /// assert_eq!(simpler::dsl::TaskGraph::default().graph().node_count(), 0);
    /// ```
    pub fn graph(&self) -> &DiGraph<TaskNode, GraphEdge> {
        &self.graph
    }

    /// DOT text in the layout of [`RunDag::to_dot`], with tensor names on the edges.
    ///
    /// ```
    /// assert!(simpler::dsl::TaskGraph::default().to_dot().starts_with("digraph"));
    /// ```
    pub fn to_dot(&self) -> String {
        crate::dfx::graph::to_dot("task_graph", &self.graph, |edge| match edge {
            GraphEdge::Tensor { arg, tensor } => format!("arg {arg} ({tensor})"),
            GraphEdge::WriteAfterWrite { arg, tensor } => format!("arg {arg} ({tensor}, write after write)"),
            GraphEdge::WriteAfterRead { arg, tensor } => format!("arg {arg} ({tensor}, write after read)"),
        })
    }

    /// True when a captured run has exactly this structure: the same tasks (number, callable,
    /// placement, members) and the same edges with the same reason (read-after-write,
    /// write-after-write or write-after-read, through a tensor argument with the same index). A placement the macro cannot evaluate
    /// (`chip(n)` with a run-time `n`) shows as `worker ?` and matches any worker.
    ///
    /// ```
    /// assert!(simpler::dsl::TaskGraph::default().matches(&simpler::trace::RunDag::default()));
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
        let mut my_edges: Vec<(u32, u32, u8, u32)> = g
            .edge_indices()
            .map(|e| {
                let (a, b) = g.edge_endpoints(e).expect("edge exists");
                let (kind, arg) = match g[e] {
                    GraphEdge::Tensor { arg, .. } => (0, arg),
                    GraphEdge::WriteAfterWrite { arg, .. } => (1, arg),
                    GraphEdge::WriteAfterRead { arg, .. } => (2, arg),
                };
                (g[a].index, g[b].index, kind, arg)
            })
            .collect();
        let d = dag.graph();
        let mut their_edges: Vec<(u32, u32, u8, u32)> = d
            .edge_indices()
            .map(|e| {
                let (a, b) = d.edge_endpoints(e).expect("edge exists");
                let (kind, arg) = match d[e] {
                    EdgeReason::Tensor { arg, .. } => (0, arg),
                    EdgeReason::WriteAfterWrite { arg, .. } => (1, arg),
                    EdgeReason::WriteAfterRead { arg, .. } => (2, arg),
                    // A graph has no explicit dependencies: such an edge cannot match.
                    EdgeReason::Explicit { .. } => (u8::MAX, u32::MAX),
                };
                (d[a].index, d[b].index, kind, arg)
            })
            .collect();
        my_edges.sort();
        their_edges.sort();
        my_edges == their_edges
    }
}

/// The part of a tensor a use names, per axis `[lo, hi)` in units of `1/den` of the axis (the
/// whole axis is `(0, 1, 1)`): a piece of a partition in the graph's terms, compared exactly as
/// the engine compares the views (the partitions divide their axes evenly).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Region([(u64, u64, u64); crate::data::tensor::MAX_TENSOR_DIMS]);

impl Region {
    const WHOLE: Region = Region([(0, 1, 1); crate::data::tensor::MAX_TENSOR_DIMS]);

    fn touches(&self, other: &Region) -> bool {
        self.0
            .iter()
            .zip(&other.0)
            .all(|(&(l1, h1, d1), &(l2, h2, d2))| l1 * d2 < h2 * d1 && l2 * d1 < h1 * d2)
    }

    fn covers(&self, other: &Region) -> bool {
        self.0
            .iter()
            .zip(&other.0)
            .all(|(&(l1, h1, d1), &(l2, h2, d2))| l1 * d2 <= l2 * d1 && h2 * d1 <= h1 * d2)
    }
}

/// Who wrote or read which part of one tensor (the engine's footprints).
struct Entry {
    who: u32,
    region: Region,
    reader: bool,
}

/// Builds a [`TaskGraph`] by replaying a `task_graph!` body (what the generated `graph()`
/// does), with the engine's edge rules.
#[doc(hidden)]
#[derive(Default)]
pub struct GraphBuilder {
    graph: DiGraph<TaskNode, GraphEdge>,
    nodes: HashMap<u32, NodeIndex>,
    tensors: Vec<Vec<Entry>>,
    names: Vec<&'static str>,
    /// Partitions: the pieces per axis.
    parts: Vec<Vec<u32>>,
    next: u32,
}

/// One tensor argument of a replayed call: parameter position, tensor id, and the piece
/// (partition number, index) when it names one.
#[doc(hidden)]
pub type ArgUse = (usize, usize, Option<(usize, u32)>);

/// Pieces per axis of each partition, and the region of a piece.
#[derive(Default)]
struct Parts(Vec<Vec<u32>>);

impl Parts {
    fn set(&mut self, id: usize, counts: &[u32]) {
        if self.0.len() <= id {
            self.0.resize(id + 1, Vec::new());
        }
        self.0[id] = counts.to_vec();
    }

    fn region(&self, piece: Option<(usize, u32)>) -> Region {
        let Some((part, mut index)) = piece else { return Region::WHOLE };
        let Some(counts) = self.0.get(part) else { return Region::WHOLE };
        let mut r = Region::WHOLE;
        for (axis, &n) in counts.iter().enumerate().rev() {
            let n = n.max(1);
            let c = u64::from(index % n);
            index /= n;
            if let Some(slot) = r.0.get_mut(axis) {
                *slot = (c, c + 1, u64::from(n));
            }
        }
        r
    }
}

/// One recorded use of an intermediate.
struct Use {
    who: TaskHandle,
    region: Region,
    reader: bool,
}

/// The uses of one intermediate: of the whole (or of pieces of several partitions), and of
/// the pieces of one partition by index, so that a loop over pieces costs O(1) per use.
#[derive(Default)]
struct Uses {
    whole: Vec<Use>,
    /// The partition whose pieces are indexed (the first one used).
    part: Option<usize>,
    pieces: HashMap<u32, Vec<Use>>,
}

/// A use of the task being submitted: (tensor, region, indexable piece, reader).
type Pending = (usize, Region, Option<(usize, u32)>, bool);

/// Static edges: the dependencies among a `task_graph!`'s own tasks through its intermediates
/// (`alloc`s, which nothing outside the graph can name), computed as the graph submits them
/// with the engine's footprint rules and handed to the engine as the tasks' deps, so the
/// TensorMap never looks these tensors up (generated code only).
#[doc(hidden)]
#[derive(Default)]
pub struct StaticEdges {
    tensors: Vec<Uses>,
    parts: Parts,
    /// The uses of the task being submitted.
    pending: Vec<Pending>,
}

impl StaticEdges {
    /// A tracker for `n` tensors (ids as in `graph()`).
    pub fn new(n: usize) -> StaticEdges {
        StaticEdges { tensors: (0..n).map(|_| Uses::default()).collect(), ..StaticEdges::default() }
    }

    /// Tensor `id` is allocated (again): nothing has touched the new buffer.
    pub fn fresh(&mut self, id: usize) {
        if let Some(u) = self.tensors.get_mut(id) {
            *u = Uses::default();
        }
    }

    /// Partition number `id`: `counts[axis]` equal pieces along each axis.
    pub fn partition(&mut self, id: usize, counts: &[u32]) {
        self.parts.set(id, counts);
    }

    /// The uses of one call's intermediates, `(parameter position, tensor, piece)`: marks each
    /// as static in `call` and adds the dependencies the engine's rules give (a reader waits
    /// for the overlapping writers and retains them; a writer waits for the overlapping
    /// writers and readers). [`done`](StaticEdges::done) records them once submitted.
    ///
    /// # Safety
    ///
    /// The tensors named are taken out of the TensorMap's ordering (see `Call::__static`), so
    /// the edges given here must be all of theirs: every use of these intermediates by a task
    /// of the run must go through this tracker ([`uses`](StaticEdges::uses), then
    /// [`done`](StaticEdges::done)) and `uses` must name each one's real parameter, tensor and
    /// piece. `task_graph!` generates exactly that from the checked graph; nothing else
    /// should call it.
    #[expect(
        unsafe_code,
        reason = "takes tensors out of the TensorMap's ordering; the caller states their edges"
    )]
    pub unsafe fn uses<K: crate::dsl::place::kind::Kind>(
        &mut self,
        info: &'static CallableInfo,
        uses: &[ArgUse],
        call: &mut crate::dsl::place::Call<K>,
    ) {
        let mut deps: smallvec::SmallVec<[(TaskHandle, bool); 4]> = smallvec::SmallVec::new();
        for &(pos, id, piece) in uses {
            let mode = info.params.get(pos).map_or(ParamMode::In, |p| p.mode);
            let arg = info.params[..pos.min(info.params.len())].iter().filter(|p| p.mode.is_tensor()).count();
            // SAFETY: this tracker adds every edge of the intermediate below (this function's
            // own contract).
            unsafe { call.__static(arg) };
            let region = self.parts.region(piece);
            let Some(t) = self.tensors.get(id) else { continue };
            let indexed = match piece {
                Some((p, k)) if t.part.is_none_or(|q| q == p) => Some(k),
                _ => None,
            };
            let mut visit = |u: &Use| {
                if u.region.touches(&region) && (!u.reader || mode.writes()) {
                    deps.push((u.who, !u.reader && mode.reads()));
                }
            };
            t.whole.iter().for_each(&mut visit);
            match indexed {
                Some(k) => t.pieces.get(&k).into_iter().flatten().for_each(&mut visit),
                None => t.pieces.values().flatten().for_each(&mut visit),
            }
            self.pending.push((id, region, piece.filter(|_| indexed.is_some()), !mode.writes()));
        }
        if deps.len() > 1 {
            deps.sort_by_key(|(h, retain)| (h.index, !retain));
            deps.dedup_by_key(|(h, _)| h.index);
        }
        for (h, retain) in deps {
            call.__dep(h, retain);
        }
    }

    /// Records the pending uses as task `who`'s.
    pub fn done(&mut self, who: TaskHandle) {
        for (id, region, indexed, reader) in self.pending.drain(..) {
            let Some(t) = self.tensors.get_mut(id) else { continue };
            let u = Use { who, region, reader };
            // The pieces of one partition are indexed (the first one used); pieces of others
            // are kept with the whole-tensor uses and compared by region.
            let indexed = indexed.filter(|&(p, _)| *t.part.get_or_insert(p) == p);
            match indexed {
                Some((_, k)) => {
                    let list = t.pieces.entry(k).or_default();
                    if !reader {
                        list.retain(|e| !region.covers(&e.region));
                    }
                    list.push(u);
                }
                None => {
                    if !reader {
                        t.whole.retain(|e| !region.covers(&e.region));
                        t.pieces.retain(|_, l| {
                            l.retain(|e| !region.covers(&e.region));
                            !l.is_empty()
                        });
                    }
                    t.whole.push(u);
                }
            }
        }
    }
}

impl GraphBuilder {
    /// An empty builder.
    pub fn new() -> GraphBuilder {
        GraphBuilder::default()
    }

    /// A tensor the graph receives or allocates (an allocation takes no task number).
    pub fn tensor(&mut self, name: &'static str) -> usize {
        self.tensors.push(Vec::new());
        self.names.push(name);
        self.tensors.len() - 1
    }

    /// Tensor `id` is allocated (again): a new buffer that no task has touched.
    pub fn fresh(&mut self, id: usize) {
        if let Some(e) = self.tensors.get_mut(id) {
            e.clear();
        }
    }

    /// Partition number `id` of a tensor: `counts[axis]` equal pieces along each axis.
    pub fn partition(&mut self, id: usize, _tensor: usize, counts: &[u32]) {
        if self.parts.len() <= id {
            self.parts.resize(id + 1, Vec::new());
        }
        self.parts[id] = counts.to_vec();
    }

    /// How many pieces partition `id` has.
    pub fn pieces(&self, id: usize) -> u32 {
        self.parts.get(id).map_or(0, |c| c.iter().product())
    }

    fn region(&self, piece: Option<(usize, u32)>) -> Region {
        let Some((part, mut index)) = piece else { return Region::WHOLE };
        let Some(counts) = self.parts.get(part) else { return Region::WHOLE };
        let mut r = Region::WHOLE;
        for (axis, &n) in counts.iter().enumerate().rev() {
            let n = n.max(1);
            let c = u64::from(index % n);
            index /= n;
            if let Some(slot) = r.0.get_mut(axis) {
                *slot = (c, c + 1, u64::from(n));
            }
        }
        r
    }

    /// The next task: one call, or a group of `targets.len()` members of one callable.
    pub fn node(&mut self, info: &'static CallableInfo, targets: &[&str]) -> (u32, NodeIndex) {
        let index = self.next;
        self.next += 1;
        // The engine prints a SUB group's target once.
        let target = if targets.iter().all(|t| *t == "sub") { "sub".to_string() } else { targets.join(", ") };
        let node = self.graph.add_node(TaskNode {
            index,
            callable: info.name.to_string(),
            digest: info.digest,
            target,
            members: targets.len() as u32,
        });
        self.nodes.insert(index, node);
        (index, node)
    }

    /// An edge the `task_graph!` check pass computed: task `to`'s argument at parameter
    /// position `pos` of `info` waits for task `from` (after its write, or, `war`, for a write
    /// after its read). The first reason for a pair of tasks is the one recorded, as in the
    /// engine.
    pub fn edge(
        &mut self,
        from: usize,
        to: usize,
        info: &'static CallableInfo,
        pos: usize,
        tensor: &'static str,
        war: bool,
    ) {
        let (Ok(from), Ok(to)) = (u32::try_from(from), u32::try_from(to)) else { return };
        let (Some(&a), Some(&b)) = (self.nodes.get(&from), self.nodes.get(&to)) else { return };
        if from == to || self.graph.find_edge(a, b).is_some() {
            return;
        }
        let mode = info.params.get(pos).map_or(ParamMode::In, |p| p.mode);
        let arg =
            info.params[..pos.min(info.params.len())].iter().filter(|p| p.mode.is_tensor()).count() as u32;
        let why = if war {
            GraphEdge::WriteAfterRead { arg, tensor }
        } else if mode.reads() {
            GraphEdge::Tensor { arg, tensor }
        } else {
            GraphEdge::WriteAfterWrite { arg, tensor }
        };
        self.graph.add_edge(a, b, why);
    }

    /// One call (or one group of `members` calls of one callable, each with its target),
    /// replayed with the engine's rules.
    pub fn call(&mut self, info: &'static CallableInfo, members: &[(&str, &[ArgUse])]) {
        let targets: Vec<&str> = members.iter().map(|(t, _)| *t).collect();
        let (index, node) = self.node(info, &targets);
        // The TensorMap's walk: argument by argument, in member order; a reader waits for the
        // overlapping writers, a writer for the overlapping writers and readers since; a writer
        // replaces what it covers; the first reason for an edge is the one recorded.
        let mut edges: Vec<(u32, GraphEdge)> = Vec::new();
        for (_, args) in members {
            for &(pos, id, piece) in *args {
                let mode = info.params.get(pos).map_or(ParamMode::In, |p| p.mode);
                let arg =
                    info.params[..pos.min(info.params.len())].iter().filter(|p| p.mode.is_tensor()).count()
                        as u32;
                let tensor = self.names[id];
                let region = self.region(piece);
                let entries = &mut self.tensors[id];
                for e in entries.iter().filter(|e| !e.reader && e.region.touches(&region)) {
                    let why = if mode.reads() {
                        GraphEdge::Tensor { arg, tensor }
                    } else {
                        GraphEdge::WriteAfterWrite { arg, tensor }
                    };
                    edges.push((e.who, why));
                }
                if mode.writes() {
                    edges.extend(
                        entries
                            .iter()
                            .filter(|e| e.reader && e.region.touches(&region))
                            .map(|e| (e.who, GraphEdge::WriteAfterRead { arg, tensor })),
                    );
                    entries.retain(|e| !region.covers(&e.region));
                    entries.push(Entry { who: index, region, reader: false });
                } else {
                    entries.push(Entry { who: index, region, reader: true });
                }
            }
        }
        let mut seen: Vec<u32> = Vec::new();
        for (from, why) in edges {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::callable::identity::CallableKind;
    use crate::callable::linked::{Param, Resolved};
    use crate::dsl::place::Call;
    use crate::dsl::place::kind::HostCallable;

    static PARAMS: [Param; 2] = [
        Param { name: "x", mode: ParamMode::In, ty: "f32", resolved: Resolved::of::<f32>() },
        Param { name: "y", mode: ParamMode::Out, ty: "f32", resolved: Resolved::of::<f32>() },
    ];
    static ENTRY: u8 = 0;
    static INFO: CallableInfo =
        CallableInfo::__new("k", "tests::k", CallableKind::HostFn, &[], [0; 32], &PARAMS, &ENTRY);

    /// Submits one call through the tracker: its uses as `(position, piece)` of tensor 0;
    /// returns the deps it was given, `(task, retain)` in task order.
    fn submit(se: &mut StaticEdges, index: u32, uses: &[(usize, Option<(usize, u32)>)]) -> Vec<(u32, bool)> {
        let mut call: Call<HostCallable> = Call::__new(&INFO);
        let uses: Vec<ArgUse> = uses.iter().map(|&(pos, piece)| (pos, 0, piece)).collect();
        // SAFETY: the test's every use of the intermediates goes through `se`.
        #[expect(unsafe_code, reason = "the test drives the tracker as the generated code does")]
        unsafe {
            se.uses(&INFO, &uses, &mut call)
        };
        for &(pos, _, _) in &uses {
            assert!(call.args().is_static(pos), "argument {pos} is static");
        }
        se.done(TaskHandle { run: 1, index });
        call.args().deps().iter().map(|d| (d.task.index, d.retain)).collect()
    }

    #[test]
    fn static_edges_follow_the_footprint_rules_by_piece() {
        let mut se = StaticEdges::new(1);
        se.partition(0, &[4]);
        se.partition(1, &[2]);
        // Four writers of distinct pieces: independent.
        for i in 0..4 {
            assert_eq!(submit(&mut se, i, &[(1, Some((0, i)))]), vec![]);
        }
        // A reader of the whole waits for all four and retains them.
        assert_eq!(submit(&mut se, 4, &[(0, None)]), vec![(0, true), (1, true), (2, true), (3, true)]);
        // Overwriting piece 1: after its writer (write after write) and the reader (write after
        // read), ordering only.
        assert_eq!(submit(&mut se, 5, &[(1, Some((0, 1)))]), vec![(1, false), (4, false)]);
        // Half 0 of another partition (quarters 0 and 1): their current writers, 0 and 5.
        assert_eq!(submit(&mut se, 6, &[(0, Some((1, 0)))]), vec![(0, true), (5, true)]);
        // A whole write covers everything: the next reader of a piece waits for it alone.
        assert_eq!(submit(&mut se, 7, &[(1, None)]).len(), 6); // writers 0, 2, 3, 5; readers 4, 6
        assert_eq!(submit(&mut se, 8, &[(0, Some((0, 3)))]), vec![(7, true)]);
        // A fresh allocation forgets the tensor's history.
        se.fresh(0);
        assert_eq!(submit(&mut se, 9, &[(0, None)]), vec![]);
    }
}
