//! The diagnostics a [`CallConfig`] asks a chip for, written under its output prefix when the
//! chip task ends: the chip's per-core timeline (`swimlane`), the decoded arguments of each of
//! its tasks (`dump_args`), the DAG its orchestration built (`dep_gen`) and per-scope counters
//! (`scope_stats`). A chip orchestration's run is captured for them (its kernels on the chip's
//! cores are the tasks); a bare kernel is one task on core 0.
//!
//! Files, in the folder the output prefix names (made if missing), all starting
//! `chip<N>-<pid>-<callable>-<K>` (the chip's process, and `K` counting its diagnosed chip tasks
//! from 1):
//! `.swimlane.json` (Chrome trace) and `.swimlane.svg`, `.args.txt`, `.deps.dot`,
//! `.scopes.txt`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::data::call_config::{CallConfig, Swimlane};
use crate::dfx::graph::{DagCapture, TaskNode};
use crate::dfx::timeline::{TaskRecord, TaskStatus, Timeline};
use crate::engine::run::RunState;
use crate::error::{Error, Result};
use crate::sys::sync;

/// Diagnosed chip tasks of this process so far (the `K` of the file names).
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// Whether `config` asks for any diagnostic a chip writes.
pub(crate) fn wanted(config: &CallConfig) -> bool {
    config.get_swimlane() != Swimlane::Off
        || config.get_dump_args()
        || config.get_dep_gen()
        || config.get_scope_stats()
}

/// Writes the diagnostics `config` asks for of a chip orchestration's run `run` (captured,
/// done), named for chip `chip` and callable `name`; returns the files written.
pub(crate) fn write_run(chip: u32, name: &str, config: &CallConfig, run: &RunState) -> Result<Vec<PathBuf>> {
    let timeline = run.own_timeline().unwrap_or_default();
    let (args, scopes) = match &run.capture {
        Some(cap) => {
            let cap = sync::lock(cap);
            (cap.args_text.clone(), cap.scopes.clone())
        }
        None => Default::default(),
    };
    write(chip, name, config, &timeline, &args, &scopes)
}

/// The record of a bare kernel `name` that ran on core 0 from `times.0` to `times.1`
/// (`CLOCK_MONOTONIC` ns) with `result`.
pub(crate) fn kernel_record(
    name: &str,
    times: (u64, u64),
    result: std::result::Result<(), &Error>,
) -> TaskRecord {
    let (status, error) = match result {
        Ok(()) => (TaskStatus::Completed, None),
        Err(e) => (TaskStatus::Failed, Some(e.message().to_string())),
    };
    TaskRecord {
        index: 0,
        callable: name.to_string(),
        worker: "core 0".to_string(),
        level: crate::level::Level::Chip,
        submitted_ns: times.0,
        ready_ns: Some(times.0),
        staged_ns: None,
        started_ns: Some(times.0),
        ended_ns: Some(times.1),
        status,
        error,
        within: Vec::new(),
    }
}

/// Writes the diagnostics of a bare kernel, `record` (see [`kernel_record`]), with its
/// arguments `args` as text.
pub(crate) fn write_kernel(
    chip: u32,
    name: &str,
    config: &CallConfig,
    record: TaskRecord,
    args: String,
) -> Result<Vec<PathBuf>> {
    let mut cap = DagCapture::default();
    cap.record(
        TaskNode {
            index: 0,
            callable: name.to_string(),
            digest: crate::callable::identity::Digest::from_bytes([0; 32]),
            target: "core 0".to_string(),
            members: 1,
        },
        Vec::new(),
    );
    let timeline = Timeline::new(cap.to_dag(), vec![record]);
    write(chip, name, config, &timeline, &[(0, args)], &[])
}

fn write(
    chip: u32,
    name: &str,
    config: &CallConfig,
    timeline: &Timeline,
    args: &[(u32, String)],
    scopes: &[crate::dfx::graph::ScopeStat],
) -> Result<Vec<PathBuf>> {
    let Some(dir) = config.get_output_prefix() else {
        return Ok(Vec::new()); // `CallConfig::validate` asks for one; nothing to write without
    };
    let dir = Path::new(dir);
    std::fs::create_dir_all(dir).map_err(|e| Error::os(&format!("creating {}", dir.display()), e))?;
    let k = SEQUENCE.fetch_add(1, Ordering::Relaxed) + 1;
    let safe: String = name.chars().map(|c| if c.is_alphanumeric() || c == '_' { c } else { '_' }).collect();
    // The process id too: chip children of other Workers, or a replaced chip, may share the
    // folder, the chip's number and `K`.
    let base = format!("chip{chip}-{}-{safe}-{k}", std::process::id());
    let mut files = Vec::new();
    let mut put = |ext: &str, text: String| -> Result<()> {
        let path = dir.join(format!("{base}.{ext}"));
        std::fs::write(&path, text).map_err(|e| Error::os(&format!("writing {}", path.display()), e))?;
        files.push(path);
        Ok(())
    };
    if config.get_swimlane() != Swimlane::Off {
        put("swimlane.json", timeline.to_chrome_trace())?;
        put("swimlane.svg", timeline.to_svg())?;
    }
    if config.get_dep_gen() {
        put("deps.dot", timeline.to_dot())?;
    }
    if config.get_dump_args() {
        let mut s = format!("# arguments of each task of `{name}` on chip {chip}\n");
        for (index, text) in args {
            let r = timeline.records().iter().find(|r| r.index == *index);
            let (callable, worker) = r.map_or(("?", ""), |r| (r.callable.as_str(), r.worker.as_str()));
            let on = if worker.is_empty() { String::new() } else { format!(" on {worker}") };
            let _ = writeln!(s, "task {index}: `{callable}`{on}");
            s.push_str(text);
        }
        put("args.txt", s)?;
    }
    if config.get_scope_stats() {
        let mut s = format!("# scopes of `{name}` on chip {chip}, in the order they ended\n");
        s.push_str("scope\tdepth\ttasks\tallocations\n");
        for (i, st) in scopes.iter().enumerate() {
            let _ = writeln!(s, "{i}\t{}\t{}\t{}", st.depth, st.tasks, st.allocations);
        }
        put("scopes.txt", s)?;
    }
    Ok(files)
}
