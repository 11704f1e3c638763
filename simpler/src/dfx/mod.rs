//! Observability: DAG capture and export, task records and timelines.
//!
//! # Tracing
//!
//! `tracing` with static targets (`simpler::run`, `simpler::task`, `simpler::scheduler`,
//! `simpler::orchestrator`, `simpler::worker`, `simpler::ipc`, `simpler::chip`,
//! `simpler::remote`), all emitted by the process that schedules the work (worker processes run
//! no subscriber). Each run has a `run` span (`RunState::span`, made when the run is admitted, so
//! its parent is whatever span the submitting thread was in), entered while its orchestration
//! builds it; each task on a worker gets a `task` span, a child of its run's, opened at dispatch
//! and closed at completion by the scheduler (never entered, since the scheduler's thread moves
//! on), with an end event carrying the callable, worker and `duration_us`. A disabled span costs
//! its callsite's interest check only.
//!
//! # Captured runs
//!
//! A run with `RunOptions::capture_dag` records its DAG ([`graph`]: `DagCapture` -> `RunDag` of
//! `TaskNode`s and `EdgeReason`s, a `petgraph` graph with DOT export). The capture keeps its own
//! writers per buffer (`data::footprint`, never forgetting a finished task), so the DAG is the
//! one the tags and deps express, and the names of named buffers (`Buffer::set_name`) for edge
//! labels. It also keeps a [`timeline::Recorder`]: the engine calls `RunState::note` (one branch
//! when not captured) at submit, when a task becomes ready (releasing its last fanin, or at
//! publish), at dispatch (with the lane's name), at completion and when it fails unstarted, with
//! `sys::clock::monotonic_ns` (`CLOCK_MONOTONIC`, one clock for the host's processes).
//! `RunHandle::timeline` turns them into `TaskRecord`s and a `Timeline`, which writes a Chrome
//! trace (a process per level, a thread per lane, flows for edges), a self-contained SVG and a
//! DOT with workers and times. `RunHandle::stats` gives task counts and wall time,
//! `RunHandle::progress` the live counts.
//!
//! What runs inside a task in another process is recorded there: a task of a captured run
//! carries its engine, run and task number and its member of a group in the task frame (rule
//! M10 of `ipc::mailbox`; run numbers restart in every engine, so the key names the engine:
//! `Engine::id`). A chip child records its kernels on its cores (a launch with
//! `chip::Trace::Record`, given back by `ChipRuntime::finalize_traced`), a nested Worker
//! captures its own run, and each appends one entry ([`timeline::Entry`]: writer, parent key,
//! own run, records) to the tree's trace log (`sys::tracelog`: an append-only memfd made by the
//! root's first `Worker::init`, its key in every child's start spec; one `write` per entry;
//! 64 MiB at most). `RunState::timeline` reads the log and nests the entries under the tasks
//! they ran in (`Timeline::inner_records`, lanes named by path). Remote nodes' records stay on
//! their hosts. The `CallConfig` diagnostics (`chip::diag`) write a chip task's swimlane,
//! arguments, DAG and scope counters under the output prefix from the chip run's capture.

pub(crate) mod graph;
pub(crate) mod timeline;
