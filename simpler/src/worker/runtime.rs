//! `Runtime`: the seam between a `Worker` and what `init` started.
//!
//! Two implementations: [`Tree`](super::tree::Tree) (an engine and child processes: SUB
//! workers, then chips at L3 or nested Workers at L4 and up) and [`L2Chip`](super::l2::L2Chip)
//! (an L2 Worker: one chip in this process). The `Worker` keeps the configuration and what is
//! registered ([`Callables`](super::callables::Callables)) and checks what holds for both; each
//! runtime does, or refuses, the rest: install / uninstall, the minter, the engine,
//! `run_callable`, chip memory (`alloc_device`, `copy_to`, `copy_from`, `free`), `replace`,
//! `close`.

use std::sync::Arc;
use std::time::Duration;

use crate::callable::identity::CallableHandle;
use crate::data::buffer::{Buffer, Identity, IdentityMinter};
use crate::data::call_config::CallConfig;
use crate::data::dtype::DataType;
use crate::data::task_args::TaskArgs;
use crate::engine::Engine;
use crate::error::Result;
use crate::worker::callables::{Callable, Callables};
use crate::worker::status::WorkerStatus;

/// A started Worker.
///
/// Its errors do not name the `Worker` method they serve: that method prefixes them
/// (`Worker.copy_to: ...`, [`in_method`](crate::error::in_method)). `run_callable` is the
/// exception: what it refuses names `Worker.run_callable` itself, and the callable's own
/// result comes back as it is.
pub(super) trait Runtime: Send + Sync {
    /// Process ids of the child processes that are alive.
    fn child_pids(&self) -> Vec<i32>;

    /// Every child process, and whether it lives.
    fn workers(&self) -> Vec<WorkerStatus>;

    /// Whether what is registered from now on reaches other processes by address (so a closure
    /// cannot be registered).
    fn ships_by_address(&self) -> bool;

    /// Installs `c` (already checked against the Worker's record) on every target that runs
    /// its kind, all or nothing, and lets runs name it.
    fn install(&self, c: &Callable) -> Result<()>;

    /// Drops one reference to `handle` on every target; `last`: the Worker drops its last
    /// reference, so runs may no longer name it.
    fn uninstall(&self, handle: &CallableHandle, last: bool) -> Result<()>;

    /// Where buffer identities come from: this Worker's nonce and its counter of buffer ids.
    fn minter(&self) -> Result<&IdentityMinter>;

    /// The engine runs are built on (an L2 Worker has none).
    fn engine(&self) -> Result<&Arc<Engine>>;

    /// Runs one chip callable in this process and waits for it (an L2 Worker only).
    fn run_callable(&self, callable: &CallableHandle, args: TaskArgs, config: CallConfig) -> Result<()>;

    /// Allocates `shape` elements of `dtype` in the memory of chip `chip`.
    fn alloc_device(&self, chip: u32, shape: &[u32], dtype: DataType) -> Result<Buffer>;

    /// Copies `nbytes` from host buffer `src` to device address `ptr` of chip `chip`.
    fn copy_to(&self, chip: u32, ptr: u64, dev: Identity, src: &Buffer, nbytes: u64) -> Result<()>;

    /// Copies `nbytes` from device address `ptr` of chip `chip` into host buffer `dst`.
    fn copy_from(&self, dst: &Buffer, chip: u32, ptr: u64, dev: Identity, nbytes: u64) -> Result<()>;

    /// Frees device buffer `buf` (at `ptr` on chip `chip`).
    fn free(&self, buf: &Buffer, chip: u32, ptr: u64) -> Result<()>;

    /// Whether some child process has died (atomic loads only: asked on every submit of a
    /// Worker that replaces dead workers).
    fn any_dead(&self) -> bool {
        false
    }

    /// Starts a new worker in place of dead child `i` (its mailbox index) with the callables of
    /// `callables`, and puts its lane back in service once it is ready; returns its pid.
    fn replace(&self, i: usize, callables: &Callables) -> Result<i32>;

    /// Shuts down: waits up to `timeout` for runs in flight, then stops everything. Called
    /// once (`Worker::close` sees to it), through `&self`: another thread may still be inside
    /// a call on this runtime, which then fails (the engine is closed) rather than hangs.
    fn close(&self, timeout: Duration) -> Result<()>;
}
