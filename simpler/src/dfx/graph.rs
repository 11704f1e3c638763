//! A run's DAG, captured at submit time, as a `petgraph` graph with DOT export.

use std::fmt::Write as _;

use petgraph::graph::{DiGraph, NodeIndex};

use std::sync::Arc;

use smallvec::SmallVec;

use crate::callable::identity::Digest;
use crate::data::buffer::Identity;
use crate::data::footprint::{Footprints, readers_of, record_reader, record_writer, writers_of};

/// One task of a captured run: the node weight of [`RunDag::graph`].
///
/// ```
/// use simpler::{callable::Digest, trace::TaskNode};
/// let node = TaskNode {
///     index: 0,
///     callable: "double".to_string(),
///     digest: Digest::of(b"descriptor bytes"),
///     target: "sub".to_string(),
///     members: 1,
/// };
/// assert_eq!(node.clone(), node);
/// assert_eq!(node.target, "sub");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskNode {
    /// The task's number within its run.
    pub index: u32,
    /// The callable's name.
    pub callable: String,
    /// The callable's digest.
    pub digest: Digest,
    /// Where it was placed (`sub`, `worker 0`, `worker 0, worker 1`, ...).
    pub target: String,
    /// Number of members (1 unless a group).
    pub members: u32,
}

/// Why one task waits for another: the edge weight of [`RunDag::graph`].
///
/// ```
/// use simpler::trace::EdgeReason;
/// # let buffer = simpler::__private::doc_buffer(8)?.desc().identity();
/// // `buffer`: the identity of a buffer (`buffer.desc().identity()`).
/// let reasons = [
///     EdgeReason::Tensor { arg: 1, buffer },
///     EdgeReason::WriteAfterWrite { arg: 0, buffer },
///     EdgeReason::WriteAfterRead { arg: 0, buffer },
///     EdgeReason::Explicit { retain: true },
///     EdgeReason::Explicit { retain: false },
/// ];
/// let labels: Vec<String> = reasons
///     .iter()
///     .map(|r| match r {
///         EdgeReason::Tensor { arg, buffer } => format!("arg {arg} reads buffer {}", buffer.generation()),
///         EdgeReason::WriteAfterWrite { arg, .. } => format!("arg {arg} overwrites"),
///         EdgeReason::WriteAfterRead { arg, .. } => format!("arg {arg} overwrites what was read"),
///         EdgeReason::Explicit { retain: true } => "add_dep".to_string(),
///         EdgeReason::Explicit { retain: false } => "add_dep_wait".to_string(),
///     })
///     .collect();
/// assert_eq!(
///     labels,
///     ["arg 1 reads buffer 1", "arg 0 overwrites", "arg 0 overwrites what was read", "add_dep", "add_dep_wait"]
/// );
/// # Ok::<(), simpler::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EdgeReason {
    /// Read after write: the consumer's tensor argument `arg` reads (`Input` or `InOut`) bytes
    /// the producer writes in `buffer`.
    Tensor {
        /// Argument index in the consumer.
        arg: u32,
        /// The buffer both name.
        buffer: Identity,
    },
    /// Write after write: the consumer's argument `arg` overwrites (`Output` or
    /// `OutputExisting`) bytes the producer writes in `buffer`.
    WriteAfterWrite {
        /// Argument index in the consumer.
        arg: u32,
        /// The buffer both name.
        buffer: Identity,
    },
    /// Write after read: the consumer's argument `arg` writes bytes the producer reads in
    /// `buffer`, so it waits until the producer has read them.
    WriteAfterRead {
        /// Argument index in the consumer.
        arg: u32,
        /// The buffer both name.
        buffer: Identity,
    },
    /// An explicit `add_dep` (`retain: true`) or `add_dep_wait` (`retain: false`).
    Explicit {
        /// Whether the producer is retained until the consumer completes.
        retain: bool,
    },
}

/// The DAG of one run: tasks and the dependency behind every edge.
///
/// Returned by [`RunHandle::dag`](crate::RunHandle::dag) for runs submitted with
/// `RunOptions::capture_dag`; `RunDag::default()` is the empty DAG.
///
/// ```no_run
/// # fn demo(worker: &simpler::Worker, f: &simpler::CallableHandle) -> simpler::Result<()> {
/// use simpler::{RunOptions, TaskArgs};
/// let run = worker.submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
/// let a = orch.submit_sub(f, TaskArgs::new())?;
/// let mut args = TaskArgs::new();
/// args.add_dep(a);
/// orch.submit_sub(f, args)?;
/// Ok(())
/// })?;
/// run.wait()?;
/// let dag = run.dag().unwrap();
/// assert_eq!(dag.graph().edge_count(), 1);
/// println!("{}", dag.to_dot());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct RunDag {
    graph: DiGraph<TaskNode, EdgeReason>,
    /// The names of the named buffers its tasks use ([`Buffer::set_name`](crate::Buffer::set_name)).
    names: std::collections::HashMap<Identity, String>,
}

impl RunDag {
    /// The graph: node weights are tasks, edge weights the reason for each dependency.
    ///
    /// ```no_run
    /// # fn demo(worker: &simpler::Worker, f: &simpler::CallableHandle) -> simpler::Result<()> {
    /// # use simpler::{RunOptions, TaskArgs};
    /// // Task 1 depends on task 0 through `add_dep`; task 2 is independent.
    /// let run = worker.submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
    /// let t0 = orch.submit_sub(f, TaskArgs::new())?;
    /// let mut args = TaskArgs::new();
    /// args.add_dep(t0);
    /// orch.submit_sub(f, args)?;
    /// orch.submit_sub(f, TaskArgs::new())?;
    /// Ok(())
    /// })?;
    /// run.wait()?;
    /// let dag = run.dag().expect("submitted with capture");
    /// use simpler::trace::EdgeReason;
    /// let g = dag.graph();
    /// assert_eq!((g.node_count(), g.edge_count()), (3, 1));
    /// let e = g.edge_indices().next().unwrap();
    /// assert_eq!(g[e], EdgeReason::Explicit { retain: true });
    /// let (from, to) = g.edge_endpoints(e).unwrap();
    /// assert_eq!((g[from].index, g[to].index), (0, 1));
    /// # Ok(()) }
    /// ```
    pub fn graph(&self) -> &DiGraph<TaskNode, EdgeReason> {
        &self.graph
    }

    /// The node of task `index` (its [`TaskNode::index`]), or `None` when the run has no such
    /// task.
    ///
    /// ```no_run
    /// # fn demo(worker: &simpler::Worker, f: &simpler::CallableHandle) -> simpler::Result<()> {
    /// # use simpler::{RunOptions, TaskArgs};
    /// // Task 1 depends on task 0 through `add_dep`; task 2 is independent.
    /// let run = worker.submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
    /// let t0 = orch.submit_sub(f, TaskArgs::new())?;
    /// let mut args = TaskArgs::new();
    /// args.add_dep(t0);
    /// orch.submit_sub(f, args)?;
    /// orch.submit_sub(f, TaskArgs::new())?;
    /// Ok(())
    /// })?;
    /// run.wait()?;
    /// let dag = run.dag().expect("submitted with capture");
    /// let n = dag.node(2).unwrap();
    /// assert_eq!(dag.graph()[n].index, 2);
    /// assert_eq!(dag.graph()[n].target, "sub");
    /// assert!(dag.node(3).is_none());
    /// # Ok(()) }
    /// ```
    pub fn node(&self, index: u32) -> Option<NodeIndex> {
        self.graph.node_indices().find(|&n| self.graph[n].index == index)
    }

    /// True when an edge `from -> to` exists (by task index): `to` waits for `from`.
    ///
    /// ```no_run
    /// # fn demo(worker: &simpler::Worker, f: &simpler::CallableHandle) -> simpler::Result<()> {
    /// # use simpler::{RunOptions, TaskArgs};
    /// // Task 1 depends on task 0 through `add_dep`; task 2 is independent.
    /// let run = worker.submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
    /// let t0 = orch.submit_sub(f, TaskArgs::new())?;
    /// let mut args = TaskArgs::new();
    /// args.add_dep(t0);
    /// orch.submit_sub(f, args)?;
    /// orch.submit_sub(f, TaskArgs::new())?;
    /// Ok(())
    /// })?;
    /// run.wait()?;
    /// let dag = run.dag().expect("submitted with capture");
    /// assert!(dag.has_edge(0, 1));
    /// assert!(!dag.has_edge(1, 0)); // edges point from producer to consumer
    /// assert!(!dag.has_edge(0, 2));
    /// assert!(!dag.has_edge(0, 99)); // unknown tasks have no edges
    /// # Ok(()) }
    /// ```
    pub fn has_edge(&self, from: u32, to: u32) -> bool {
        match (self.node(from), self.node(to)) {
            (Some(a), Some(b)) => self.graph.contains_edge(a, b),
            _ => false,
        }
    }

    /// Graphviz DOT text: one node per task (`t<index>`), one edge per dependency, labelled
    /// with its [`EdgeReason`].
    ///
    /// ```
    /// use simpler::trace::RunDag;
    /// assert_eq!(RunDag::default().to_dot(), "digraph run {\n  rankdir=LR;\n}\n");
    /// ```
    ///
    /// ```no_run
    /// # fn demo(worker: &simpler::Worker, f: &simpler::CallableHandle) -> simpler::Result<()> {
    /// # use simpler::{RunOptions, TaskArgs};
    /// // Task 1 depends on task 0 through `add_dep`; task 2 is independent.
    /// let run = worker.submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
    /// let t0 = orch.submit_sub(f, TaskArgs::new())?;
    /// let mut args = TaskArgs::new();
    /// args.add_dep(t0);
    /// orch.submit_sub(f, args)?;
    /// orch.submit_sub(f, TaskArgs::new())?;
    /// Ok(())
    /// })?;
    /// run.wait()?;
    /// let dag = run.dag().expect("submitted with capture");
    /// let dot = dag.to_dot();
    /// assert!(dot.starts_with("digraph run {"));
    /// assert!(dot.contains("t0 -> t1 [label=\"add_dep\"];"));
    /// std::fs::write("run.dot", dot).unwrap(); // render with `dot -Tsvg run.dot`
    /// # Ok(()) }
    /// ```
    pub fn to_dot(&self) -> String {
        to_dot("run", &self.graph, |reason| self.edge_label(reason))
    }

    /// The name of buffer `buffer` when its tasks used it named
    /// ([`Buffer::set_name`](crate::Buffer::set_name)).
    ///
    /// ```no_run
    /// # fn demo(worker: &simpler::Worker, f: &simpler::CallableHandle) -> simpler::Result<()> {
    /// use simpler::{DataType, RunOptions, TaskArgs};
    /// let x = worker.create_buffer(64)?;
    /// x.set_name("x")?;
    /// let t = x.tensor(&[16], DataType::Float32)?;
    /// let run = worker.submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
    ///     let mut a = TaskArgs::new();
    ///     a.output(&t)?;
    ///     orch.submit_sub(f, a)?;
    ///     let mut b = TaskArgs::new();
    ///     b.input(&t)?;
    ///     orch.submit_sub(f, b).map(|_| ())
    /// })?;
    /// run.wait()?;
    /// let dag = run.dag().unwrap();
    /// assert_eq!(dag.buffer_name(&x.desc().identity()), Some("x"));
    /// assert!(dag.to_dot().contains("t0 -> t1 [label=\"arg 0 (x)\"];"));
    /// # Ok(()) }
    /// ```
    pub fn buffer_name(&self, buffer: &Identity) -> Option<&str> {
        self.names.get(buffer).map(String::as_str)
    }

    /// The label of an edge: the argument and the tensor's name, or its buffer's number.
    pub(crate) fn edge_label(&self, reason: &EdgeReason) -> String {
        crate::dfx::timeline::edge_label(reason, |b| self.buffer_name(b).map(str::to_string))
    }
}

/// DOT text of a task graph named `name`: one node per task (`index: callable` over its
/// target), one edge per dependency labelled by `label`. Shared by run DAGs and task graphs, so
/// the two exports line up.
pub(crate) fn to_dot<E>(name: &str, graph: &DiGraph<TaskNode, E>, label: impl Fn(&E) -> String) -> String {
    let mut s = format!("digraph {name} {{\n  rankdir=LR;\n");
    for n in graph.node_indices() {
        let t = &graph[n];
        let _ = writeln!(s, "  t{} [label=\"{}: {}\\n{}\"];", t.index, t.index, t.callable, t.target);
    }
    for e in graph.edge_indices() {
        let (a, b) = graph.edge_endpoints(e).expect("edge exists");
        let _ = writeln!(s, "  t{} -> t{} [label=\"{}\"];", graph[a].index, graph[b].index, label(&graph[e]));
    }
    s.push_str("}\n");
    s
}

/// Where a captured task was placed; [`TaskNode::target`]'s text is made from it when the
/// DAG is read.
#[derive(Debug, Clone)]
pub(crate) enum Placed {
    /// Any SUB worker (`sub`).
    Sub,
    /// These NEXT_LEVEL workers (`worker 0, worker 1`).
    Workers(SmallVec<[u32; 4]>),
    /// A placement given as text (`core 0`).
    Named(Arc<str>),
}

impl Placed {
    fn text(&self) -> String {
        match self {
            Placed::Sub => "sub".to_string(),
            Placed::Workers(ws) => ws.iter().map(|w| format!("worker {w}")).collect::<Vec<_>>().join(", "),
            Placed::Named(t) => t.to_string(),
        }
    }
}

/// A task as a capture keeps it while its run goes: shared names and the placement, with no
/// text made per task; [`TaskNode`]s are made from it when the DAG is read.
#[derive(Debug, Clone)]
pub(crate) struct CapturedTask {
    pub(crate) index: u32,
    pub(crate) callable: Arc<str>,
    pub(crate) digest: Digest,
    pub(crate) placed: Placed,
    pub(crate) members: u32,
}

impl CapturedTask {
    fn node(&self) -> TaskNode {
        TaskNode {
            index: self.index,
            callable: self.callable.to_string(),
            digest: self.digest,
            target: self.placed.text(),
            members: self.members,
        }
    }
}

impl From<TaskNode> for CapturedTask {
    fn from(n: TaskNode) -> CapturedTask {
        CapturedTask {
            index: n.index,
            callable: Arc::from(n.callable),
            digest: n.digest,
            placed: Placed::Named(Arc::from(n.target)),
            members: n.members,
        }
    }
}

#[derive(Default)]
pub(crate) struct DagCapture {
    nodes: Vec<CapturedTask>,
    edges: Vec<(u32, u32, EdgeReason)>,
    /// The writers and readers of each buffer by the TensorMap's rules, but never forgetting a
    /// finished task.
    footprints: std::collections::HashMap<Identity, Footprints<u32>>,
    /// The names of the named buffers seen.
    names: std::collections::HashMap<Identity, String>,
    /// When each task was submitted, became ready, started and ended.
    pub(crate) times: crate::dfx::timeline::Recorder,
    /// Whether to keep each task's arguments as text (`CallConfig::dump_args` on a chip).
    pub(crate) dump_args: bool,
    /// Each task's arguments as text, when `dump_args` is on.
    pub(crate) args_text: Vec<(u32, String)>,
    /// One entry per scope that ended, in the order they ended.
    pub(crate) scopes: Vec<ScopeStat>,
}

/// The counters of one scope of a captured run (`CallConfig::scope_stats` on a chip).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ScopeStat {
    /// Its depth: 1 for the run's outer scope.
    pub(crate) depth: usize,
    /// Tasks submitted directly in it.
    pub(crate) tasks: usize,
    /// `orch.alloc` allocations made directly in it.
    pub(crate) allocations: usize,
}

/// The arguments of one task as text: one line per tensor (tag, element type, shape, strides,
/// byte offset, and where its buffer is) and per scalar, for each member.
pub(crate) fn describe_args(args: &[crate::data::task_args::TaskArgs]) -> String {
    let mut s = String::new();
    for (m, a) in args.iter().enumerate() {
        if args.len() > 1 {
            let _ = writeln!(s, "  member {m}:");
        }
        let tensors = a.tensors.iter().zip(&a.tags).map(|(t, tag)| {
            let device = match t.desc().backing() {
                crate::data::buffer::Backing::Device { ptr, chip } => Some((chip, ptr)),
                _ => None,
            };
            (
                tag as &dyn std::fmt::Debug,
                *t.view(),
                t.desc().identity().buffer_id(),
                t.desc().nbytes(),
                device,
            )
        });
        describe_tensors(&mut s, tensors, &a.scalars);
    }
    s
}

/// Appends one line per tensor, given as (its tag or access, view, buffer number, buffer
/// bytes, `Some((chip, device address))` for device memory), then one per scalar: the lines of
/// [`describe_args`], also for a chip's bare kernel.
pub(crate) fn describe_tensors<'a>(
    s: &mut String,
    tensors: impl Iterator<
        Item = (&'a dyn std::fmt::Debug, crate::data::tensor::TensorView, u64, u64, Option<(u32, u64)>),
    >,
    scalars: &[u64],
) {
    for (i, (how, v, buffer, nbytes, device)) in tensors.enumerate() {
        let place = match device {
            Some((chip, ptr)) => format!("device memory of chip {chip} at {ptr:#x}"),
            None => "host memory".to_string(),
        };
        let _ = writeln!(
            s,
            "  arg {i}: {how:?} {} {:?} strides {:?} at byte {} of buffer {buffer} ({nbytes} bytes, {place})",
            v.dtype(),
            v.shape(),
            v.strides(),
            v.byte_offset(),
        );
    }
    for (i, v) in scalars.iter().enumerate() {
        let _ = writeln!(s, "  scalar {i}: {v} ({v:#x})");
    }
}

impl DagCapture {
    /// The edges into task `index`, whose members take `args`, by the TensorMap's rules: a
    /// reading tensor gets an edge from every earlier writer of overlapping bytes (read after
    /// write), a writing one from every earlier writer (write after write; an `InOut` tensor's
    /// shows as read after write) and every reader since (write after read); `NoDep` gets none;
    /// then one per explicit dependency. Records `index` as the writer or a reader of its views.
    pub(crate) fn edges_for(
        &mut self,
        index: u32,
        args: &[crate::data::task_args::TaskArgs],
    ) -> Vec<(u32, EdgeReason)> {
        let mut edges = Vec::new();
        for a in args {
            for (i, (t, tag)) in a.tensors.iter().zip(&a.tags).enumerate() {
                if t.desc().nbytes() == 0 || *tag == crate::data::task_args::Tag::NoDep {
                    continue;
                }
                let (arg, buffer) = (i as u32, t.desc().identity());
                // The name is looked up (a `String`) only for a buffer not seen yet.
                if !self.names.contains_key(&buffer)
                    && let Some(name) = t.buffer_name()
                {
                    self.names.insert(buffer, name);
                }
                let fp = self.footprints.entry(buffer).or_default();
                let view = t.view();
                let after_write = if tag.reads() {
                    EdgeReason::Tensor { arg, buffer }
                } else {
                    EdgeReason::WriteAfterWrite { arg, buffer }
                };
                edges.extend(writers_of(fp, view).filter(|&&w| w != index).map(|&w| (w, after_write)));
                if tag.writes() {
                    let war = EdgeReason::WriteAfterRead { arg, buffer };
                    edges.extend(readers_of(fp, view).filter(|&&r| r != index).map(|&r| (r, war)));
                    record_writer(fp, *view, index);
                } else {
                    record_reader(fp, *view, index);
                }
            }
        }
        for a in args {
            for dep in &a.deps {
                edges.push((dep.task.index, EdgeReason::Explicit { retain: dep.retain }));
            }
        }
        edges
    }

    pub(crate) fn record(&mut self, node: impl Into<CapturedTask>, incoming: Vec<(u32, EdgeReason)>) {
        let node = node.into();
        let to = node.index;
        self.nodes.push(node);
        // The first reason for each producer stays (incoming edges all end at `to`, a new
        // task, so only this task's own list can repeat one).
        let first = self.edges.len();
        for (from, why) in incoming {
            if !self.edges[first..].iter().any(|&(a, _, _)| a == from) {
                self.edges.push((from, to, why));
            }
        }
    }

    pub(crate) fn to_dag(&self) -> RunDag {
        let mut graph = DiGraph::new();
        let idx: std::collections::HashMap<u32, NodeIndex> =
            self.nodes.iter().map(|n| (n.index, graph.add_node(n.node()))).collect();
        let find = |i: u32| idx.get(&i).copied();
        for &(a, b, why) in &self.edges {
            if let (Some(x), Some(y)) = (find(a), find(b)) {
                graph.add_edge(x, y, why);
            }
        }
        RunDag { graph, names: self.names.clone() }
    }
}
