//! `WorkerStatus`: which of a Worker's worker processes live, and how the dead ones died.

/// What kind of worker a [`WorkerStatus`] describes.
///
/// ```
/// use simpler::status::WorkerKind;
/// assert_ne!(WorkerKind::Sub, WorkerKind::Chip);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WorkerKind {
    /// A SUB worker (host functions); its `id` is its index, from 0.
    Sub,
    /// A chip (L3); its `id` is the chip id `chip(id)` names.
    Chip,
    /// A nested Worker (L4 and up); its `id` is the worker id `worker(id)` names, in
    /// `WorkerBuilder::worker` order.
    Nested,
    /// A remote L3 Worker (L4 and up) on another host or process, reached over a session; its
    /// `id` is the worker id `worker(id)` names (after the nested Workers, in
    /// `WorkerBuilder::remote_worker` order), its `pid` 0, and its state `Alive` or `Lost`.
    Remote,
}

/// Whether a worker process lives, and if not, how it ended.
///
/// ```
/// use simpler::status::WorkerState;
/// assert!(WorkerState::Alive.is_alive());
/// assert!(!WorkerState::Killed(9).is_alive());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WorkerState {
    /// The process runs (no exit was seen yet).
    Alive,
    /// The process exited with this status.
    Exited(i32),
    /// A signal (this number, e.g. 9 for `SIGKILL`) killed the process.
    Killed(i32),
    /// The process is gone but could not be waited for: how it ended is unknown.
    Lost,
}

impl WorkerState {
    /// True while the process runs.
    ///
    /// ```
    /// assert!(!simpler::status::WorkerState::Exited(0).is_alive());
    /// ```
    pub fn is_alive(&self) -> bool {
        matches!(self, WorkerState::Alive)
    }
}

/// One worker process of a started Worker, as [`Worker::workers`](crate::Worker::workers)
/// reports it.
///
/// ```
/// use simpler::{status::WorkerKind, status::WorkerState, status::WorkerStatus};
/// fn dead_subs(all: &[WorkerStatus]) -> Vec<u32> {
///     all.iter().filter(|w| w.kind == WorkerKind::Sub && !w.is_alive()).map(|w| w.id).collect()
/// }
/// assert!(dead_subs(&[]).is_empty());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct WorkerStatus {
    /// SUB worker, chip, or nested Worker.
    pub kind: WorkerKind,
    /// Its id within its kind (SUB index, chip id, nested worker id).
    pub id: u32,
    /// Its process id (for a remote Worker, the node's process id on its own host).
    pub pid: i32,
    /// Whether it lives, or how it ended.
    pub state: WorkerState,
}

impl WorkerStatus {
    /// True while the worker's process runs.
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = simpler::Worker::builder().sub_workers(2).build()?;
    /// worker.init()?;
    /// assert!(worker.workers().iter().all(|w| w.is_alive()));
    /// # Ok(()) }
    /// ```
    pub fn is_alive(&self) -> bool {
        self.state.is_alive()
    }
}
