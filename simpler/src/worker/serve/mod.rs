//! The child end of each kind of lane: what a child process serves, one module per kind.
//!
//! SUB and nested children run the same loop, `ipc::child::serve` (sleep on its doorbell, then
//! shutdown, a control, or a task), with a handler that says what it serves; a chip child runs a
//! loop of its own over its two task frames (rule M11 of `ipc::mailbox`):
//!
//! * [`sub`]: a SUB worker runs host functions;
//! * [`chip`]: a chip child runs chip callables on its chip and serves its memory;
//! * [`nested`]: a nested Worker runs orchestration functions on the whole Worker it starts.

pub(crate) mod chip;
pub(crate) mod nested;
pub(crate) mod sub;

use crate::chip::ChipBody;
use crate::error::{Error, ErrorKind};
use crate::ipc::child::{ERR_RESOURCE, ERR_WORKER_DIED, ReceivedFn};

/// A chip callable's body from the function a `REGISTER_CHIP` / `REGISTER_CHIP_ORCH` control
/// carries.
pub(crate) fn chip_body(f: ReceivedFn) -> ChipBody {
    match f {
        ReceivedFn::Host(k) => ChipBody::Kernel(k),
        ReceivedFn::Orch(o) => ChipBody::Orchestration(o),
    }
}

/// The frame error code for `e`: [`ERR_RESOURCE`] for a resource error and
/// [`ERR_WORKER_DIED`] for a dead worker (so the parent reports the same kind), `otherwise` for
/// every other error.
fn frame_code(e: &Error, otherwise: i32) -> i32 {
    match e.kind() {
        ErrorKind::ResourceExhausted => ERR_RESOURCE,
        ErrorKind::WorkerDied => ERR_WORKER_DIED,
        _ => otherwise,
    }
}

/// Leaves `records`, what this process ran for task `trace` (its parent's engine, run and task
/// number and the member, rule M10 of the mailbox) as run `run` of its engine `engine`, in the trace log for
/// the root's timeline. Best effort: a log that cannot take it costs the timeline those
/// records, never the task.
fn leave_trace(
    trace: (u64, u64, u32, u32),
    engine: u64,
    run: u64,
    records: Vec<crate::dfx::timeline::TaskRecord>,
) {
    let (parent_engine, parent_run, task, member) = trace;
    let entry = crate::dfx::timeline::Entry {
        writer: std::process::id(),
        parent: (std::os::unix::process::parent_id(), parent_engine, parent_run, task),
        member,
        engine,
        run,
        records,
    };
    if crate::sys::tracelog::key().is_some()
        && let Err(e) = crate::sys::tracelog::append(&crate::dfx::timeline::encode_entry(&entry))
    {
        tracing::warn!(target: "simpler::worker", "the records of a captured task were not kept: {e}");
    }
}
