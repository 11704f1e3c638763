//! A captured run as it happened: one [`TaskRecord`] per task (where it ran; when it was
//! submitted, became ready, started and ended, on one clock for every process of the host;
//! how it ended), and the pictures made from them: a Chrome trace (Perfetto) JSON file, a
//! self-contained SVG timeline and a DOT graph with times and workers.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::dfx::graph::{EdgeReason, RunDag};
use crate::error::{Error, Result};
use crate::level::Level;

/// How a task of a captured run ended.
///
/// ```
/// use simpler::trace::TaskStatus;
/// assert_ne!(TaskStatus::Completed, TaskStatus::Failed);
/// assert_eq!(TaskStatus::NotRun.to_string(), "not run");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskStatus {
    /// It ran and succeeded.
    Completed,
    /// It ran (or was started) and failed.
    Failed,
    /// It never ran: a task it depended on failed, its run was stopped, or the run ended
    /// before it was reached.
    #[default]
    NotRun,
}

impl std::fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::NotRun => "not run",
        })
    }
}

/// One task of a captured run, as it happened.
///
/// Times are nanoseconds of `CLOCK_MONOTONIC`, one clock for every process on the host, so
/// records taken by different Workers of one tree line up.
///
/// ```
/// use simpler::{status::Level, trace::TaskRecord, trace::TaskStatus};
/// let r = TaskRecord {
///     index: 0,
///     callable: "scale".into(),
///     worker: "chip 1".into(),
///     level: Level::Node,
///     submitted_ns: 1_000,
///     ready_ns: Some(1_500),
///     staged_ns: None,
///     started_ns: Some(2_000),
///     ended_ns: Some(9_000),
///     status: TaskStatus::Completed,
///     error: None,
///     within: vec![],
/// };
/// assert_eq!(r.duration(), Some(std::time::Duration::from_nanos(7_000)));
/// assert_eq!(r.waited(), Some(std::time::Duration::from_nanos(500)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRecord {
    /// The task's number within its run.
    pub index: u32,
    /// The callable's name.
    pub callable: String,
    /// Where it ran, as messages name the worker (`"sub worker 0"`, `"chip 1"`, `"worker 2"`,
    /// `"remote worker 3 (10.0.0.7:7400)"`; the members of a group joined by `", "`); empty
    /// when it never started.
    pub worker: String,
    /// The level of the Worker that scheduled it.
    pub level: Level,
    /// When it was submitted.
    pub submitted_ns: u64,
    /// When every task it depends on had completed (`None`: never).
    pub ready_ns: Option<u64>,
    /// When its worker had it prepared beside another run's task running there (a chip's
    /// staged task: its inputs were copied in by then); `None` when it was not staged.
    pub staged_ns: Option<u64>,
    /// When it was handed to its worker (`None`: never); for a staged task, when it was
    /// activated (its run became the head, or, dispatching before its turn, its chip was free).
    pub started_ns: Option<u64>,
    /// When its end was seen (`None` if it never ended).
    pub ended_ns: Option<u64>,
    /// How it ended.
    pub status: TaskStatus,
    /// Why it failed or did not run.
    pub error: Option<String>,
    /// The tasks it ran inside, outermost first, by index in their runs: empty for a task of
    /// the run itself; `[3]` for a kernel a chip ran for the run's task 3; `[3, 0]` for one run
    /// by task 0 of the nested Worker that ran task 3 ([`Timeline::inner_records`]).
    pub within: Vec<u32>,
}

impl TaskRecord {
    /// How long it ran (start to end), if it ran.
    ///
    /// ```
    /// # use simpler::{status::Level, trace::TaskRecord, trace::TaskStatus};
    /// # let r = TaskRecord { index: 0, callable: "f".into(), worker: String::new(), level: Level::Node,
    /// #     submitted_ns: 0, ready_ns: None, staged_ns: None, started_ns: None, ended_ns: Some(5),
    /// #     status: TaskStatus::NotRun, error: Some("a producer failed".into()), within: vec![] };
    /// assert_eq!(r.duration(), None); // never started
    /// ```
    pub fn duration(&self) -> Option<Duration> {
        Some(Duration::from_nanos(self.ended_ns?.saturating_sub(self.started_ns?)))
    }

    /// How long it waited for a worker once ready (ready to start), if it started.
    ///
    /// ```
    /// # use simpler::{status::Level, trace::TaskRecord, trace::TaskStatus};
    /// # let r = TaskRecord { index: 0, callable: "f".into(), worker: "chip 0".into(), level: Level::Node,
    /// #     submitted_ns: 0, ready_ns: Some(10), staged_ns: None, started_ns: Some(40), ended_ns: Some(90),
    /// #     status: TaskStatus::Completed, error: None, within: vec![] };
    /// assert_eq!(r.waited(), Some(std::time::Duration::from_nanos(30)));
    /// ```
    pub fn waited(&self) -> Option<Duration> {
        Some(Duration::from_nanos(self.started_ns?.saturating_sub(self.ready_ns?)))
    }
}

/// What the engine tells a captured run about one of its tasks.
pub(crate) enum TaskEvent<'a> {
    /// Every producer completed.
    Ready,
    /// Prepared by a worker beside its running task (a staged successor), at this time.
    Staged(u64),
    /// Handed to the worker (lane) named so (its name shared, not copied).
    Started(&'a std::sync::Arc<str>),
    /// Its end: success, or the error it failed with.
    Ended(std::result::Result<(), &'a Error>),
    /// Failed without running (poisoned, stopped).
    NotRun(&'a Error),
}

/// The times and outcome of one task while its run is captured.
#[derive(Debug, Clone, Default)]
struct Times {
    submitted: u64,
    ready: Option<u64>,
    staged: Option<u64>,
    started: Option<u64>,
    ended: Option<u64>,
    /// The workers it was handed to (one, or one per group member).
    workers: smallvec::SmallVec<[std::sync::Arc<str>; 1]>,
    status: TaskStatus,
    error: Option<String>,
}

/// The records of a captured run, filled as its tasks move (indexed by task number).
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    times: Vec<Option<Times>>,
}

impl Recorder {
    /// Task `index` was submitted at `now`.
    pub(crate) fn submitted(&mut self, index: u32, now: u64) {
        let i = index as usize;
        if self.times.len() <= i {
            self.times.resize(i + 1, None);
        }
        self.times[i] = Some(Times { submitted: now, ..Times::default() });
    }

    /// Something happened to task `index` at `now` (ignored for tasks not recorded: the
    /// allocations of `orch.alloc`).
    pub(crate) fn note(&mut self, index: u32, event: TaskEvent<'_>, now: u64) {
        let Some(Some(t)) = self.times.get_mut(index as usize) else { return };
        match event {
            TaskEvent::Ready => {
                t.ready.get_or_insert(now);
            }
            TaskEvent::Staged(at) => {
                t.staged.get_or_insert(if at == 0 { now } else { at });
            }
            TaskEvent::Started(worker) => {
                t.started.get_or_insert(now);
                t.workers.push(worker.clone());
            }
            TaskEvent::Ended(result) => {
                t.ended = Some(now);
                match result {
                    Ok(()) => t.status = TaskStatus::Completed,
                    Err(e) => {
                        t.status = if t.started.is_some() { TaskStatus::Failed } else { TaskStatus::NotRun };
                        t.error = Some(e.message().to_string());
                    }
                }
            }
            TaskEvent::NotRun(e) => {
                t.ended = Some(now);
                t.status = TaskStatus::NotRun;
                t.error = Some(e.message().to_string());
            }
        }
    }

    /// The records, with each task's callable name from `dag`.
    pub(crate) fn records(&self, dag: &RunDag, level: Level) -> Vec<TaskRecord> {
        let g = dag.graph();
        g.node_indices()
            .filter_map(|n| {
                let node = &g[n];
                let t = self.times.get(node.index as usize)?.as_ref()?;
                Some(TaskRecord {
                    index: node.index,
                    callable: node.callable.clone(),
                    worker: t.workers.join(", "),
                    level,
                    submitted_ns: t.submitted,
                    ready_ns: t.ready,
                    staged_ns: t.staged,
                    started_ns: t.started,
                    ended_ns: t.ended,
                    status: t.status,
                    error: t.error.clone(),
                    within: Vec::new(),
                })
            })
            .collect()
    }
}

/// A captured run as it happened: its DAG and one [`TaskRecord`] per task, with the pictures
/// made from them. From [`RunHandle::timeline`](crate::RunHandle::timeline) once the run has
/// ended (for runs submitted with `RunOptions::capture_dag`).
///
/// ```no_run
/// # fn demo(worker: &simpler::Worker, f: &simpler::CallableHandle) -> simpler::Result<()> {
/// use simpler::{RunOptions, TaskArgs};
/// let run = worker.submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
///     orch.submit_sub(f, TaskArgs::new())?;
///     orch.submit_sub(f, TaskArgs::new())?;
///     Ok(())
/// })?;
/// run.wait()?;
/// let timeline = run.timeline().expect("captured and ended");
/// for r in timeline.records() {
///     println!("{} {} on {} took {:?}", r.index, r.callable, r.worker, r.duration());
/// }
/// let written = timeline.write_files("target/run")?; // run.json, run.svg, run.dot
/// assert_eq!(written.len(), 3);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Timeline {
    dag: RunDag,
    records: Vec<TaskRecord>,
    /// The records of what ran inside the run's tasks in other processes.
    inner: Vec<TaskRecord>,
}

impl Timeline {
    pub(crate) fn new(dag: RunDag, records: Vec<TaskRecord>) -> Timeline {
        Timeline { dag, records, inner: Vec::new() }
    }

    /// Adds what ran inside this run's tasks in other processes of the tree, as they left it
    /// in the trace log (`entries`, read from it): the kernels a chip ran for a task on its
    /// cores, the tasks of a nested Worker's run, recursively. `key` names this run: its process, engine and run number.
    pub(crate) fn with_inner(mut self, entries: &[Entry], key: (u32, u64, u64)) -> Timeline {
        let mut by_parent: Hosted<'_> = std::collections::HashMap::new();
        for e in entries {
            by_parent.entry(e.parent).or_default().push(e);
        }
        let mut inner = Vec::new();
        collect_inner(&by_parent, key, &self.records, &[], &mut inner, 0);
        self.inner = inner;
        self
    }

    /// The records of what ran inside this run's tasks in other processes of this host: a
    /// chip's kernels on its cores (level 2, lanes `"chip 0 / core 1"`), a nested Worker's tasks
    /// (lanes `"worker 0 / chip 1"`) and, recursively, theirs. Each names the tasks it ran
    /// inside ([`TaskRecord::within`]). The Chrome trace and the SVG draw them in lanes of their
    /// own, by level; the DOT shows the run's own tasks only.
    ///
    /// ```
    /// assert!(simpler::trace::Timeline::default().inner_records().is_empty());
    /// ```
    pub fn inner_records(&self) -> &[TaskRecord] {
        &self.inner
    }

    /// Every record drawn: the run's own, then the inner ones.
    fn drawn(&self) -> impl Iterator<Item = &TaskRecord> {
        self.records.iter().chain(self.inner.iter())
    }

    /// One record per task, in submission order.
    ///
    /// ```
    /// assert!(simpler::trace::Timeline::default().records().is_empty());
    /// ```
    pub fn records(&self) -> &[TaskRecord] {
        &self.records
    }

    /// The run's DAG (the edges the pictures draw as flows).
    ///
    /// ```
    /// assert_eq!(simpler::trace::Timeline::default().dag().graph().node_count(), 0);
    /// ```
    pub fn dag(&self) -> &RunDag {
        &self.dag
    }

    /// The workers that ran tasks, one lane each, in a stable order: by level (highest first),
    /// then SUB workers, chips, Workers and remote Workers by number.
    ///
    /// ```
    /// assert!(simpler::trace::Timeline::default().lanes().is_empty());
    /// ```
    pub fn lanes(&self) -> Vec<(Level, String)> {
        let mut lanes: Vec<(Level, String)> = Vec::new();
        for r in self.drawn() {
            for w in r.worker.split(", ").filter(|w| !w.is_empty()) {
                if !lanes.iter().any(|(l, n)| *l == r.level && n == w) {
                    lanes.push((r.level, w.to_string()));
                }
            }
        }
        lanes.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| lane_order(&a.1).cmp(&lane_order(&b.1))));
        lanes
    }

    /// The earliest time of the run (its first submit), the origin of the pictures' axes.
    fn origin(&self) -> u64 {
        self.records.iter().map(|r| r.submitted_ns).min().unwrap_or(0)
    }

    /// The latest time of the run.
    fn end(&self) -> u64 {
        self.drawn()
            .flat_map(|r| [Some(r.submitted_ns), r.ready_ns, r.started_ns, r.ended_ns])
            .flatten()
            .max()
            .unwrap_or(0)
    }

    /// A Chrome trace (the JSON object format that Perfetto, `chrome://tracing` and Speedscope
    /// read): one process per level, one thread per worker lane, one complete event per task
    /// that ran (its callable, status, index, and when it was submitted and ready, in its
    /// `args`), and one flow arrow per dependency edge between tasks that ran.
    ///
    /// ```
    /// let json = simpler::trace::Timeline::default().to_chrome_trace();
    /// assert!(json.starts_with("{\"traceEvents\":["));
    /// assert!(json.ends_with("],\"displayTimeUnit\":\"ns\"}\n"));
    /// ```
    pub fn to_chrome_trace(&self) -> String {
        let origin = self.origin();
        let us = |ns: u64| ns.saturating_sub(origin) as f64 / 1000.0;
        let lanes = self.lanes();
        let tid = |level: Level, worker: &str| {
            lanes.iter().position(|(l, n)| *l == level && n == worker).map_or(0, |p| p + 1)
        };
        let mut events: Vec<String> = Vec::new();
        let mut levels: Vec<Level> = lanes.iter().map(|(l, _)| *l).collect();
        levels.dedup();
        for level in &levels {
            events.push(format!(
                "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{},\"args\":{{\"name\":\"{}\"}}}}",
                level.number(),
                json_escape(&level.to_string())
            ));
        }
        for (i, (level, name)) in lanes.iter().enumerate() {
            events.push(format!(
                "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":\"{}\"}}}}",
                level.number(),
                i + 1,
                json_escape(name)
            ));
            events.push(format!(
                "{{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":{},\"tid\":{},\"args\":{{\"sort_index\":{}}}}}",
                level.number(),
                i + 1,
                i + 1
            ));
        }
        for r in self.drawn() {
            let (Some(start), Some(end)) = (r.started_ns, r.ended_ns) else { continue };
            for w in r.worker.split(", ") {
                let mut args = format!(
                    "\"index\":{},\"status\":\"{}\",\"submitted_us\":{:.3}",
                    r.index,
                    r.status,
                    us(r.submitted_ns)
                );
                if let Some(ready) = r.ready_ns {
                    let _ = write!(args, ",\"ready_us\":{:.3}", us(ready));
                }
                if !r.within.is_empty() {
                    let _ = write!(args, ",\"within\":{:?}", r.within);
                }
                if let Some(e) = &r.error {
                    let _ = write!(args, ",\"error\":\"{}\"", json_escape(e));
                }
                events.push(format!(
                    "{{\"ph\":\"X\",\"name\":\"{}\",\"cat\":\"{}\",\"pid\":{},\"tid\":{},\"ts\":{:.3},\"dur\":{:.3},\"args\":{{{args}}}}}",
                    json_escape(&r.callable),
                    r.status,
                    r.level.number(),
                    tid(r.level, w),
                    us(start),
                    end.saturating_sub(start) as f64 / 1000.0
                ));
            }
        }
        let index: std::collections::HashMap<u32, &TaskRecord> =
            self.records.iter().map(|r| (r.index, r)).collect();
        let by_index = |i: u32| index.get(&i).copied();
        let g = self.dag.graph();
        for (id, e) in g.edge_indices().enumerate() {
            let (a, b) = g.edge_endpoints(e).expect("edge exists");
            let (Some(from), Some(to)) = (by_index(g[a].index), by_index(g[b].index)) else { continue };
            let (Some(from_end), Some(to_start)) = (from.ended_ns, to.started_ns) else { continue };
            let (from_w, to_w) = (first_worker(&from.worker), first_worker(&to.worker));
            events.push(format!(
                "{{\"ph\":\"s\",\"id\":{id},\"name\":\"dependency\",\"cat\":\"dependency\",\"pid\":{},\"tid\":{},\"ts\":{:.3}}}",
                from.level.number(),
                tid(from.level, from_w),
                // Inside the producer's box, so viewers bind the arrow to it.
                us(from_end.saturating_sub(1).max(from.started_ns.unwrap_or(from_end)))
            ));
            events.push(format!(
                "{{\"ph\":\"f\",\"bp\":\"e\",\"id\":{id},\"name\":\"dependency\",\"cat\":\"dependency\",\"pid\":{},\"tid\":{},\"ts\":{:.3}}}",
                to.level.number(),
                tid(to.level, to_w),
                us(to_start)
            ));
        }
        let mut out = String::from("{\"traceEvents\":[");
        out.push_str(&events.join(",\n"));
        out.push_str("],\"displayTimeUnit\":\"ns\"}\n");
        out
    }

    /// A self-contained SVG picture of the run: one lane per worker (by level), one box per
    /// task from its start to its end, labelled with its callable and coloured by status
    /// (green completed, red failed), a time axis, and a tooltip per box with its index,
    /// status, times and error. No script, font or stylesheet from outside.
    ///
    /// ```
    /// let svg = simpler::trace::Timeline::default().to_svg();
    /// assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    /// ```
    pub fn to_svg(&self) -> String {
        const LEFT: f64 = 210.0;
        const WIDTH: f64 = 960.0;
        const TOP: f64 = 44.0;
        const ROW: f64 = 26.0;
        let lanes = self.lanes();
        let origin = self.origin();
        let span = self.end().saturating_sub(origin).max(1) as f64;
        let x = |ns: u64| LEFT + ns.saturating_sub(origin) as f64 / span * WIDTH;
        let height = TOP + ROW * lanes.len().max(1) as f64 + 16.0;
        let mut s = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0}\" height=\"{height:.0}\" \
             font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
            LEFT + WIDTH + 20.0
        );
        // The axis: about eight ticks at round times.
        let step = nice_step(span / 8.0);
        let _ = writeln!(
            s,
            "<line x1=\"{LEFT}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#444\"/>",
            TOP - 8.0,
            LEFT + WIDTH,
            TOP - 8.0
        );
        let mut t = 0.0;
        while t <= span + 0.5 {
            let tx = LEFT + t / span * WIDTH;
            let _ = writeln!(
                s,
                "<line x1=\"{tx:.1}\" y1=\"{}\" x2=\"{tx:.1}\" y2=\"{height:.0}\" stroke=\"#ddd\"/>\
                 <text x=\"{tx:.1}\" y=\"{}\" text-anchor=\"middle\" fill=\"#444\">{}</text>",
                TOP - 8.0,
                TOP - 14.0,
                show_ns(t)
            );
            t += step;
        }
        for (i, (level, name)) in lanes.iter().enumerate() {
            let y = TOP + ROW * i as f64;
            let _ = writeln!(
                s,
                "<text x=\"8\" y=\"{:.1}\" fill=\"#222\">L{} {}</text>",
                y + ROW * 0.65,
                level.number(),
                xml_escape(name)
            );
        }
        for r in self.drawn() {
            let (Some(start), Some(end)) = (r.started_ns, r.ended_ns) else { continue };
            let colour = match r.status {
                TaskStatus::Completed => "#4caf50",
                TaskStatus::Failed => "#e53935",
                TaskStatus::NotRun => "#9e9e9e",
            };
            for w in r.worker.split(", ") {
                let Some(row) = lanes.iter().position(|(l, n)| *l == r.level && n == w) else { continue };
                let y = TOP + ROW * row as f64 + 3.0;
                let (x0, x1) = (x(start), x(end));
                let w_px = (x1 - x0).max(1.0);
                let mut tip = format!(
                    "{}: {} on {} ({}), {} after submit, ran {}",
                    r.index,
                    r.callable,
                    w,
                    r.status,
                    show_ns(start.saturating_sub(r.submitted_ns) as f64),
                    show_ns(end.saturating_sub(start) as f64)
                );
                if let Some(e) = &r.error {
                    let _ = write!(tip, ": {e}");
                }
                let _ = writeln!(
                    s,
                    "<g><title>{}</title><rect x=\"{x0:.2}\" y=\"{y:.1}\" width=\"{w_px:.2}\" height=\"{:.1}\" \
                     fill=\"{colour}\" stroke=\"#1b5e20\" stroke-width=\"0.5\"/>",
                    xml_escape(&tip),
                    ROW - 6.0
                );
                // The label only where it fits (about 7 px a character).
                if w_px > 7.0 * r.callable.len() as f64 + 6.0 {
                    let _ = writeln!(
                        s,
                        "<text x=\"{:.2}\" y=\"{:.1}\" fill=\"white\">{}</text>",
                        x0 + 3.0,
                        y + ROW * 0.55,
                        xml_escape(&r.callable)
                    );
                }
                s.push_str("</g>\n");
            }
        }
        s.push_str("</svg>\n");
        s
    }

    /// Graphviz DOT of the run: one node per task labelled with its callable, the worker it
    /// ran on, when it started (after the run's first submit) and how long it ran, coloured by
    /// status; one edge per dependency, labelled with the argument and the tensor's name (see
    /// [`Buffer::set_name`](crate::Buffer::set_name)) or buffer number.
    ///
    /// ```
    /// assert_eq!(simpler::trace::Timeline::default().to_dot(), "digraph run {\n  rankdir=LR;\n}\n");
    /// ```
    pub fn to_dot(&self) -> String {
        let origin = self.origin();
        let mut s = String::from("digraph run {\n  rankdir=LR;\n");
        for r in &self.records {
            let when = match (r.started_ns, r.duration()) {
                (Some(start), Some(took)) => format!(
                    "\\nat {}, ran {}",
                    show_ns(start.saturating_sub(origin) as f64),
                    show_ns(took.as_nanos() as f64)
                ),
                _ => String::new(),
            };
            let colour = match r.status {
                TaskStatus::Completed => "palegreen",
                TaskStatus::Failed => "salmon",
                TaskStatus::NotRun => "lightgrey",
            };
            let worker = if r.worker.is_empty() { "(not run)" } else { r.worker.as_str() };
            let _ = writeln!(
                s,
                "  t{} [label=\"{}: {}\\n{}{}\", style=filled, fillcolor={colour}];",
                r.index,
                r.index,
                dot_escape(&r.callable),
                dot_escape(worker),
                when
            );
        }
        let g = self.dag.graph();
        for e in g.edge_indices() {
            let (a, b) = g.edge_endpoints(e).expect("edge exists");
            let label = self.dag.edge_label(&g[e]);
            let _ = writeln!(s, "  t{} -> t{} [label=\"{}\"];", g[a].index, g[b].index, dot_escape(&label));
        }
        s.push_str("}\n");
        s
    }

    /// Writes the three pictures next to `prefix`: `<prefix>.json` (Chrome trace),
    /// `<prefix>.svg` and `<prefix>.dot`, creating the parent folder if needed; returns their
    /// paths.
    ///
    /// ```
    /// let dir = std::env::temp_dir().join(format!("simpler-doc-timeline-{}", std::process::id()));
    /// let files = simpler::trace::Timeline::default().write_files(dir.join("run"))?;
    /// assert_eq!(files[1], dir.join("run.svg"));
    /// assert!(files.iter().all(|f| f.exists()));
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn write_files(&self, prefix: impl AsRef<Path>) -> Result<Vec<PathBuf>> {
        let prefix = prefix.as_ref();
        if let Some(dir) = prefix.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| Error::os(&format!("creating {}", dir.display()), e))?;
        }
        let mut written = Vec::new();
        for (ext, text) in [("json", self.to_chrome_trace()), ("svg", self.to_svg()), ("dot", self.to_dot())]
        {
            let mut path = prefix.as_os_str().to_owned();
            path.push(".");
            path.push(ext);
            let path = PathBuf::from(path);
            std::fs::write(&path, text).map_err(|e| Error::os(&format!("writing {}", path.display()), e))?;
            written.push(path);
        }
        Ok(written)
    }
}

impl Default for Timeline {
    /// The timeline of an empty run.
    fn default() -> Timeline {
        Timeline { dag: RunDag::default(), records: Vec::new(), inner: Vec::new() }
    }
}

/// What a worker process leaves in the trace log for one captured run it ran inside a task of
/// its parent: who wrote it, which task it ran inside (the parent's process, engine, run and
/// task number), its own engine's and run's numbers (the key its own children use) and its
/// records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) writer: u32,
    pub(crate) parent: (u32, u64, u64, u32),
    /// The member of the parent's task (a group), whose lane it ran in.
    pub(crate) member: u32,
    pub(crate) engine: u64,
    pub(crate) run: u64,
    pub(crate) records: Vec<TaskRecord>,
}

/// Trace-log entries by the task they ran inside (process, engine, run, task).
type Hosted<'a> = std::collections::HashMap<(u32, u64, u64, u32), Vec<&'a Entry>>;

/// The first bytes of every entry.
const ENTRY_MAGIC: [u8; 4] = *b"SPTL";

/// Encodes an entry: its length, the magic, then the fields (strings as a `u32` length and
/// bytes, absent times as 0).
pub(crate) fn encode_entry(e: &Entry) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 + 96 * e.records.len());
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&ENTRY_MAGIC);
    b.extend_from_slice(&e.writer.to_le_bytes());
    b.extend_from_slice(&e.parent.0.to_le_bytes());
    b.extend_from_slice(&e.parent.1.to_le_bytes());
    b.extend_from_slice(&e.parent.2.to_le_bytes());
    b.extend_from_slice(&e.parent.3.to_le_bytes());
    b.extend_from_slice(&e.member.to_le_bytes());
    b.extend_from_slice(&e.engine.to_le_bytes());
    b.extend_from_slice(&e.run.to_le_bytes());
    b.extend_from_slice(&(e.records.len() as u32).to_le_bytes());
    let s = |b: &mut Vec<u8>, s: &str| {
        let s = &s.as_bytes()[..s.len().min(4096)];
        b.extend_from_slice(&(s.len() as u32).to_le_bytes());
        b.extend_from_slice(s);
    };
    for r in &e.records {
        b.extend_from_slice(&r.index.to_le_bytes());
        b.push(r.level.number() as u8);
        s(&mut b, &r.callable);
        s(&mut b, &r.worker);
        for t in [Some(r.submitted_ns), r.ready_ns, r.started_ns, r.ended_ns] {
            b.extend_from_slice(&t.unwrap_or(0).to_le_bytes());
        }
        b.push(match r.status {
            TaskStatus::Completed => 0,
            TaskStatus::Failed => 1,
            TaskStatus::NotRun => 2,
        });
        s(&mut b, r.error.as_deref().unwrap_or(""));
    }
    let len = (b.len() - 4) as u32;
    b[..4].copy_from_slice(&len.to_le_bytes());
    b
}

/// Decodes the entries of a trace log, in order. A malformed entry, or one cut short (a writer
/// killed in the middle of its write), is skipped: decoding goes on at the next entry's magic
/// (the log is written by this library's processes, but a reader never trusts bytes it did
/// not write).
pub(crate) fn decode_entries(bytes: &[u8]) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(len) =
        bytes.get(at..at + 4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
    {
        if let Some(e) = bytes.get(at + 4..at + 4 + len).and_then(decode_entry) {
            out.push(e);
            at += 4 + len;
            continue;
        }
        // Resynchronise: the next magic past this entry's own starts the next entry (its
        // length is the four bytes before it).
        let from = at + 5;
        match bytes.get(from..).and_then(|rest| rest.windows(4).position(|w| w == ENTRY_MAGIC)) {
            Some(p) => at = from + p - 4,
            None => break,
        }
    }
    out
}

fn decode_entry(mut b: &[u8]) -> Option<Entry> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (b.get(..n)?, b.get(n..)?);
        *b = rest;
        Some(head)
    }
    let u32_ = |b: &mut &[u8]| take(b, 4).map(|x| u32::from_le_bytes(x.try_into().expect("4 bytes")));
    let u64_ = |b: &mut &[u8]| take(b, 8).map(|x| u64::from_le_bytes(x.try_into().expect("8 bytes")));
    let str_ = |b: &mut &[u8]| -> Option<String> {
        let n = u32_(b)? as usize;
        Some(String::from_utf8_lossy(take(b, n)?).into_owned())
    };
    if take(&mut b, 4)? != ENTRY_MAGIC {
        return None;
    }
    let writer = u32_(&mut b)?;
    let parent = (u32_(&mut b)?, u64_(&mut b)?, u64_(&mut b)?, u32_(&mut b)?);
    let member = u32_(&mut b)?;
    let (engine, run) = (u64_(&mut b)?, u64_(&mut b)?);
    let n = u32_(&mut b)? as usize;
    let mut records = Vec::with_capacity(n.min(b.len() / 40));
    for _ in 0..n {
        let index = u32_(&mut b)?;
        let level = Level::from_number(u32::from(*take(&mut b, 1)?.first()?))?;
        let callable = str_(&mut b)?;
        let worker = str_(&mut b)?;
        let t: Vec<u64> = (0..4).map(|_| u64_(&mut b)).collect::<Option<_>>()?;
        let some = |v: u64| (v != 0).then_some(v);
        let status = match take(&mut b, 1)?.first()? {
            0 => TaskStatus::Completed,
            1 => TaskStatus::Failed,
            2 => TaskStatus::NotRun,
            _ => return None,
        };
        let error = str_(&mut b)?;
        records.push(TaskRecord {
            index,
            callable,
            worker,
            level,
            submitted_ns: t[0],
            ready_ns: some(t[1]),
            staged_ns: None,
            started_ns: some(t[2]),
            ended_ns: some(t[3]),
            status,
            error: (!error.is_empty()).then_some(error),
            within: Vec::new(),
        });
    }
    b.is_empty().then_some(Entry { writer, parent, member, engine, run, records })
}

/// Appends to `out`, in the order of `records`, the records of every entry written for a task
/// of the run `(pid, engine, run)` names (`records`), with the lane of the task it ran inside before its own lane names and the
/// task's index added to `within`, and recursively what ran inside those.
fn collect_inner(
    entries: &Hosted<'_>,
    (pid, engine, run): (u32, u64, u64),
    records: &[TaskRecord],
    within: &[u32],
    out: &mut Vec<TaskRecord>,
    depth: u32,
) {
    if depth > 8 {
        return; // deeper than any tree: a loop in hostile entries
    }
    // By host task, in the run's order (the log holds entries in the order processes wrote
    // them, which varies from run to run).
    let hosted = records.iter().flat_map(|host| {
        entries.get(&(pid, engine, run, host.index)).into_iter().flatten().map(move |e| (host, *e))
    });
    for (host, e) in hosted {
        let mut path = within.to_vec();
        path.push(host.index);
        // The lane of the member it ran for (a group's members ran on their own workers).
        let lane = host
            .worker
            .split(", ")
            .nth(e.member as usize)
            .unwrap_or_else(|| first_worker(&host.worker))
            .to_string();
        let renamed: Vec<TaskRecord> = e
            .records
            .iter()
            .map(|r| TaskRecord {
                worker: r.worker.split(", ").map(|w| format!("{lane} / {w}")).collect::<Vec<_>>().join(", "),
                within: path.clone(),
                ..r.clone()
            })
            .collect();
        collect_inner(entries, (e.writer, e.engine, e.run), &renamed, &path, out, depth + 1);
        out.extend(renamed);
    }
}

/// Where a lane sorts: SUB workers, chips, cores, Workers, remote Workers, by number.
fn lane_order(name: &str) -> (u8, u64, String) {
    let (kind, rest) = name.split_once(' ').unwrap_or((name, ""));
    let rank = match kind {
        "sub" => 0,
        "chip" => 1,
        "core" => 2,
        "worker" => 3,
        "remote" => 4,
        _ => 5,
    };
    let number =
        rest.split(|c: char| !c.is_ascii_digit()).find(|p| !p.is_empty()).and_then(|n| n.parse().ok());
    (rank, number.unwrap_or(0), name.to_string())
}

/// The first worker of a (possibly joined) worker list.
fn first_worker(w: &str) -> &str {
    w.split(", ").next().unwrap_or(w)
}

/// A round step (1, 2 or 5 times a power of ten) of at least `raw` nanoseconds.
fn nice_step(raw: f64) -> f64 {
    let raw = raw.max(1.0);
    let pow = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * pow).find(|&s| s >= raw).unwrap_or(10.0 * pow)
}

/// `ns` in the largest unit that keeps it at least 1 (ns, us, ms, s).
fn show_ns(ns: f64) -> String {
    let (v, unit) = if ns >= 1e9 {
        (ns / 1e9, "s")
    } else if ns >= 1e6 {
        (ns / 1e6, "ms")
    } else if ns >= 1e3 {
        (ns / 1e3, "us")
    } else {
        (ns, "ns")
    };
    let text = format!("{v:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text} {unit}")
}

fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

fn xml_escape(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '&' => "&amp;".to_string(),
            '<' => "&lt;".to_string(),
            '>' => "&gt;".to_string(),
            '"' => "&quot;".to_string(),
            // XML 1.0 allows no other control character, not even as a reference.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => "\u{FFFD}".to_string(),
            c => c.to_string(),
        })
        .collect()
}

fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The label of an edge of `reason`, naming the tensor when its buffer has a name.
pub(crate) fn edge_label(
    reason: &EdgeReason,
    name: impl Fn(&crate::data::buffer::Identity) -> Option<String>,
) -> String {
    let tensor = |arg: &u32, buffer: &crate::data::buffer::Identity| match name(buffer) {
        Some(n) => format!("arg {arg} ({n})"),
        None => format!("arg {arg} (buffer {})", buffer.buffer_id()),
    };
    match reason {
        EdgeReason::Tensor { arg, buffer } => tensor(arg, buffer),
        EdgeReason::WriteAfterWrite { arg, buffer } => format!("{}, write after write", tensor(arg, buffer)),
        EdgeReason::WriteAfterRead { arg, buffer } => format!("{}, write after read", tensor(arg, buffer)),
        EdgeReason::Explicit { retain: true } => "add_dep".to_string(),
        EdgeReason::Explicit { retain: false } => "add_dep_wait".to_string(),
    }
}

#[cfg(test)]
mod tests;
