//! `Worker`: one level of the hierarchy, and every method a user calls on it.
//!
//! A `Worker` holds its configuration ([`WorkerBuilder`]), what is registered on it
//! ([`callables::Callables`], one record for every kind), its children's lanes
//! ([`lanes::Lanes`]: where each kind of callable goes) and a state: new, started or closed.
//! `init` starts one of two runtimes behind one seam ([`runtime::Runtime`]):
//!
//! * [`tree::Tree`] (L3 and up): an engine and child processes: SUB workers, then chips (L3)
//!   or nested Workers (L4 and up);
//! * [`l2::L2Chip`] (L2): one chip in this process.
//!
//! The methods below check what holds for every runtime, then hand the rest to the started
//! one. The child side of each lane (what a child process serves) is [`serve`].
//!
//! One way to run an orchestration: `worker.run(|orch| ...)` (build and wait) or `submit` (a
//! `RunHandle`); with options, `run_with` / `submit_with(RunOptions::new().args(..).config(..)
//! .capture_dag(), |orch, args, cfg| ...)`. All four go through `Worker::submit_inner`, which
//! validates the config and calls `Engine::build_run` on the started runtime's engine. One way
//! to do each thing besides: a nested scope is `orch.scope(|orch| ...)` (`scope_begin` /
//! `scope_end` are crate-private, for the engine's tests and a graph's `scope { }` block through
//! `__private`), and what failed is asked with `Error::kind()`.

use std::panic::resume_unwind;
use std::sync::{Arc, Mutex, RwLock};

use crate::callable::host::{Body, HostFn};
use crate::callable::identity::{CallableHandle, CallableKind};
use crate::chip::ChipFn;
use crate::data::buffer::{Backing, Buffer, IdentityMinter};
use crate::data::call_config::CallConfig;
use crate::data::dtype::DataType;
use crate::data::task_args::TaskArgs;
use crate::engine::orch_fn::OrchFn;
use crate::engine::orchestrator::Orchestrator;
use crate::engine::run::RunHandle;
use crate::engine::{BuildFailed, Engine};
use crate::error::{Error, ErrorKind, Result, in_method};
use crate::level::Level;
use crate::sys::sync;
use crate::worker::callables::{Callable, Callables, Placement};
use crate::worker::lanes::Lanes;
use crate::worker::runtime::Runtime;

mod builder;
mod callables;
mod l2;
mod lanes;
mod options;
pub(crate) mod remote;
mod runtime;
mod serve;
mod start;
mod status;
mod tree;

pub use builder::WorkerBuilder;
pub use options::RunOptions;
pub use remote::RemoteWorker;
pub use remote::launch::Launch;
pub use remote::node::{BoundNode, Node, SessionLimits};
pub use start::StartMethod;
pub use status::{WorkerKind, WorkerState, WorkerStatus};

/// Where a Worker is in its life.
///
/// `close` works through `&self` (a Worker shared by threads is closed through any handle), so
/// the state sits behind a lock, and a call takes a handle of the runtime ([`Worker::started`])
/// for its duration instead of borrowing it: `close` takes the runtime out, shuts it down
/// (a call still inside it then fails, its engine being closed), and it is freed with the
/// last handle, at once when no other call is in flight.
#[derive(Clone)]
enum State {
    /// Built, not initialized: registrations go into the start snapshot.
    New,
    /// Initialized: the runtime `init` started.
    Started(Arc<dyn Runtime>),
    /// Closed (or its startup failed): only `close` still succeeds.
    Closed,
}

/// One level of the hierarchy: its engine and its worker processes.
///
/// Lifecycle: [`Worker::builder`] → [`register`](Worker::register) host functions →
/// [`init`](Worker::init) (maps shared memory, forks the children) → [`submit`](Worker::submit)
/// / [`run`](Worker::run) orchestration functions → [`close`](Worker::close) (or drop).
///
/// ```no_run
/// use simpler::{HostArgs, HostFn, HostResult, TaskArgs, Worker};
///
/// fn hello(_args: &HostArgs<'_>) -> HostResult {
///     Ok(())
/// }
///
/// # fn main() -> simpler::Result<()> {
/// let mut worker = Worker::builder().sub_workers(1).build()?;
/// let hello = worker.register(HostFn::new("hello", hello))?;
/// worker.init()?;
/// worker.run(|orch| orch.submit_sub(&hello, TaskArgs::new()).map(|_| ()))?;
/// worker.close()?;
/// # Ok(()) }
/// ```
pub struct Worker {
    cfg: builder::Config,
    /// Its children, by mailbox: fixed by the builder.
    lanes: Lanes,
    /// What is registered, of every kind, with reference counts.
    callables: Callables,
    /// Nested Workers (`WorkerBuilder::worker`), handed to their processes by `init` (L4 and up).
    children: Vec<Worker>,
    /// Remote L3 Workers (`WorkerBuilder::remote_worker`), connected by `init` (L4 and up).
    remote: Vec<remote::RemoteWorker>,
    /// Heap rings of the ancestors of a nested Worker (their slabs reach this Worker's tasks).
    extra_heaps: Vec<crate::sys::mem::SharedSpan>,
    /// Owner nonces of the ancestors of a nested Worker (their buffers reach this Worker's
    /// tasks).
    extra_owners: Vec<u64>,
    /// Read briefly by every call (see [`State`]); written by `init` and `close`.
    state: RwLock<State>,
    /// Held by the `close` that shuts the runtime down: a concurrent `close` returns once that
    /// one is done.
    close_lock: Mutex<()>,
    /// The process that started it (`init`; 0 before): a copy of the Worker in a process forked
    /// from that one neither uses nor shuts down the workers, which are the owner's.
    owner: u32,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let phase = match self.current() {
            State::New => "new",
            State::Started(_) => "ready",
            State::Closed => "closed",
        };
        f.debug_struct("Worker")
            .field("level", &self.cfg.level)
            .field("sub_workers", &self.cfg.engine.sub_workers)
            .field("phase", &phase)
            .finish()
    }
}

/// Whether `w` is a dead worker this Worker can start again (a SUB worker or a chip; a nested
/// Worker's subtree and a remote Worker's session are not restarted from here).
fn replaceable(w: &WorkerStatus) -> bool {
    !w.is_alive() && matches!(w.kind, WorkerKind::Sub | WorkerKind::Chip)
}

/// The bytes of `shape` elements of `dtype` (for `alloc_child_tensor`).
fn device_extent(shape: &[u32], dtype: DataType) -> Result<u64> {
    Ok(crate::data::tensor::TensorView::new(0, shape, None, dtype)?.extent_bytes())
}

/// The chip and device address of device buffer `buf`: refused for a host buffer and for a
/// device buffer already freed.
fn device_of(buf: &Buffer) -> Result<(u32, u64)> {
    match buf.desc().backing() {
        Backing::Device { ptr, chip } => {
            if buf.is_freed() {
                return Err(Error::state(format!(
                    "device buffer {} of chip {chip} was already freed",
                    buf.desc().identity()
                )));
            }
            Ok((chip, ptr))
        }
        _ => Err(Error::invalid(format!(
            "buffer {} is host memory, not chip memory from alloc_child_tensor",
            buf.desc().identity()
        ))),
    }
}

/// Checks the host side of a copy with a device buffer of `nbytes`: host memory, and at least
/// `nbytes` of it.
fn check_host(host: &Buffer, nbytes: u64) -> Result<()> {
    if matches!(host.desc().backing(), Backing::Device { .. }) {
        return Err(Error::invalid("the host side must be a host buffer (create_buffer)"));
    }
    if (host.nbytes() as u64) < nbytes {
        return Err(Error::invalid(format!(
            "the host buffer has {} bytes but the device buffer has {nbytes}",
            host.nbytes()
        )));
    }
    Ok(())
}

/// Refuses a host buffer another Worker created (its identity has another owner than
/// `minter`'s): a buffer belongs to its Worker.
fn check_host_owner(minter: &IdentityMinter, host: &Buffer) -> Result<()> {
    let id = host.desc().identity();
    if id.owner() != minter.owner() {
        return Err(Error::invalid(format!(
            "host buffer {id} belongs to another Worker; a buffer is used by the Worker that created it"
        )));
    }
    Ok(())
}

impl Worker {
    /// A builder with the defaults.
    ///
    /// Defaults: L3 ([`Level::Node`]), no SUB workers, four 1 GiB heap rings, a task window of
    /// 65536, a pipeline depth of 2, and timeouts of 10 s (back-pressure), 300 s (startup) and
    /// 10 s (close).
    ///
    /// ```
    /// use simpler::{status::Level, Worker};
    ///
    /// let worker = Worker::builder().build()?; // all defaults
    /// assert_eq!(worker.level(), Level::Node);
    /// assert_eq!(worker.sub_workers(), 0);
    /// assert!(!worker.is_ready());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn builder() -> WorkerBuilder {
        WorkerBuilder::of(builder::Config::defaults())
    }

    /// A Worker of the configuration `cfg` (validated), with nothing registered.
    fn new(cfg: builder::Config) -> Worker {
        let lanes = Lanes::new(cfg.level, cfg.engine.sub_workers, cfg.engine.next_level_workers);
        Worker {
            cfg,
            lanes,
            callables: Callables::new(),
            children: Vec::new(),
            remote: Vec::new(),
            extra_heaps: Vec::new(),
            extra_owners: Vec::new(),
            state: RwLock::new(State::New),
            close_lock: Mutex::new(()),
            owner: 0,
        }
    }

    /// How this Worker starts its children ([`WorkerBuilder::start_method`]).
    ///
    /// ```
    /// use simpler::{StartMethod, Worker};
    ///
    /// assert_eq!(Worker::builder().build()?.start_method(), StartMethod::Exec);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn start_method(&self) -> StartMethod {
        self.cfg.start
    }

    /// The level this Worker runs at.
    ///
    /// ```
    /// use simpler::{status::Level, Worker};
    ///
    /// let worker = Worker::builder().sub_workers(1).build()?;
    /// assert_eq!(worker.level(), Level::Node);
    /// assert_eq!(worker.level().number(), 3);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn level(&self) -> Level {
        self.cfg.level
    }

    /// Number of SUB workers.
    ///
    /// ```
    /// use simpler::{TaskArgs, Worker};
    ///
    /// let worker = Worker::builder().sub_workers(3).build()?;
    /// assert_eq!(worker.sub_workers(), 3);
    /// // E.g. size a `submit_sub_group` to use every SUB worker: one member each.
    /// let members: Vec<TaskArgs> = (0..worker.sub_workers()).map(|_| TaskArgs::new()).collect();
    /// assert_eq!(members.len(), 3);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn sub_workers(&self) -> usize {
        self.cfg.engine.sub_workers
    }

    /// Number of simulated chips (the NEXT_LEVEL workers, ids `0..n`).
    ///
    /// ```
    /// assert_eq!(simpler::Worker::builder().chips(4).build().unwrap().chips(), 4);
    /// ```
    pub fn chips(&self) -> usize {
        self.cfg.engine.next_level_workers
    }

    /// Number of nested Workers ([`WorkerBuilder::worker`]).
    ///
    /// ```
    /// let l4 = simpler::Worker::builder().level(simpler::status::Level::Network1).build()?;
    /// assert_eq!(l4.nested_workers(), 0);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn nested_workers(&self) -> usize {
        match self.current() {
            State::Started(_) if self.cfg.level > Level::Node => {
                self.lanes.next_level() - self.lanes.remotes()
            }
            _ => self.children.len(),
        }
    }

    /// Process ids of the worker processes that are alive (empty before `init` and after
    /// `close`); a worker that died leaves the list once its exit is seen (see
    /// [`workers`](Worker::workers)).
    ///
    /// For tests and diagnostics: e.g. to check that `close` reaped every child.
    ///
    /// ```
    /// let worker = simpler::Worker::builder().sub_workers(1).build().unwrap();
    /// assert!(worker.child_pids().is_empty()); // nothing started before init
    /// ```
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = simpler::Worker::builder().sub_workers(2).build()?;
    /// worker.init()?;
    /// let pids = worker.child_pids();
    /// assert_eq!(pids.len(), 2); // one process per SUB worker
    /// assert!(pids.iter().all(|&pid| pid > 0 && pid as u32 != std::process::id()));
    /// worker.close()?;
    /// assert!(worker.child_pids().is_empty()); // every child reaped
    /// # Ok(()) }
    /// ```
    pub fn child_pids(&self) -> Vec<i32> {
        match self.current() {
            State::Started(rt) => rt.child_pids(),
            _ => Vec::new(),
        }
    }

    /// Every worker process of this Worker (SUB workers, then chips or nested Workers), with
    /// whether it lives and, for a dead one, how it ended (empty before `init`, after `close`,
    /// and for an L2 Worker, which forks nothing).
    ///
    /// A worker's death is seen as soon as its process ends: from then on the scheduler gives
    /// it no task (SUB tasks go to the live SUB workers; a task placed on a dead chip or nested
    /// Worker fails at once with [`ErrorKind::WorkerDied`](crate::ErrorKind::WorkerDied)) and
    /// [`child_pids`](Worker::child_pids) no longer lists it. A dead SUB worker or chip can be
    /// replaced: by a call ([`replace_worker`](Worker::replace_worker),
    /// [`replace_dead_workers`](Worker::replace_dead_workers)), or at each submit when the
    /// Worker was built with
    /// [`WorkerBuilder::replace_dead_workers`](crate::WorkerBuilder::replace_dead_workers).
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// use simpler::{status::WorkerKind, status::WorkerState};
    /// let mut worker = simpler::Worker::builder().sub_workers(2).build()?;
    /// assert!(worker.workers().is_empty()); // nothing started before init
    /// worker.init()?;
    /// let all = worker.workers();
    /// assert_eq!(all.len(), 2);
    /// assert!(all.iter().all(|w| w.kind == WorkerKind::Sub && w.state == WorkerState::Alive));
    /// // Had sub worker 1 been SIGKILLed: `all[1].state == WorkerState::Killed(9)`.
    /// worker.close()?;
    /// # Ok(()) }
    /// ```
    pub fn workers(&self) -> Vec<WorkerStatus> {
        match self.current() {
            State::Started(rt) => rt.workers(),
            _ => Vec::new(),
        }
    }

    /// Starts a new worker in place of dead worker `id` of `kind` (a SUB worker or a chip),
    /// with everything registered now, and puts it back in service once it reported ready;
    /// returns its status (its new pid).
    ///
    /// A lost remote Worker ([`WorkerKind::Remote`]) rejoins: the root connects to its node's
    /// address again (the node restarted by hand, or serving its next session), authenticates,
    /// checks the orchestration functions placed on it, and later runs send it tasks again.
    /// Its node-resident buffers died with the old session. A node of a launched job
    /// (`mpirun`, `srun`) connects to the root only at `init` and is not rejoined; a node that
    /// does not answer is a [`ErrorKind::WorkerDied`](crate::ErrorKind::WorkerDied) error, and
    /// the Worker stays as it was.
    ///
    /// Refused for a live worker ([`ErrorKind::InvalidState`](crate::ErrorKind::InvalidState)),
    /// a nested Worker (its whole subtree would start again: close and rebuild), a Worker started with
    /// [`StartMethod::Fork`] (a fork of a process running the engine's threads could inherit a
    /// lock they hold), and an L2 Worker. A replaced chip starts with empty
    /// device memory: device buffers of the dead chip are lost, and using one is an error that
    /// says so. A new worker that fails to start is a
    /// [`ErrorKind::WorkerDied`](crate::ErrorKind::WorkerDied) error naming it.
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// use simpler::{ErrorKind, status::WorkerKind};
    /// let mut worker = simpler::Worker::builder().sub_workers(2).build()?;
    /// worker.init()?;
    /// // A live worker is not replaced.
    /// let err = worker.replace_worker(WorkerKind::Sub, 1).unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidState);
    /// // Had sub worker 1 died (`worker.workers()[1].is_alive()` false):
    /// // let new = worker.replace_worker(WorkerKind::Sub, 1)?; assert!(new.is_alive());
    /// worker.close()?;
    /// # Ok(()) }
    /// ```
    pub fn replace_worker(&self, kind: WorkerKind, id: u32) -> Result<WorkerStatus> {
        in_method("Worker.replace_worker", || {
            let rt = self.started()?;
            let i = match kind {
                WorkerKind::Sub if (id as usize) < self.sub_workers() => Some(id as usize),
                WorkerKind::Chip => self.lanes.chip(id),
                WorkerKind::Nested if (id as usize) < self.nested_workers() => {
                    Some(self.sub_workers() + id as usize)
                }
                WorkerKind::Remote => self.lanes.remote_index(id).map(|_| self.sub_workers() + id as usize),
                _ => None,
            }
            .ok_or_else(|| Error::invalid(format!("this Worker has no {kind:?} worker {id}")))?;
            rt.replace(i, &self.callables)?;
            Ok(rt.workers()[i])
        })
    }

    /// Replaces every dead SUB worker and chip ([`replace_worker`](Worker::replace_worker));
    /// returns the new workers' statuses (empty when none was dead). Stops at the first that
    /// cannot be replaced, with its error.
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = simpler::Worker::builder().sub_workers(2).build()?;
    /// worker.init()?;
    /// assert!(worker.replace_dead_workers()?.is_empty()); // all alive
    /// worker.close()?;
    /// # Ok(()) }
    /// ```
    pub fn replace_dead_workers(&self) -> Result<Vec<WorkerStatus>> {
        in_method("Worker.replace_dead_workers", || {
            let rt = self.started()?;
            let mut replaced = Vec::new();
            for (i, w) in rt.workers().into_iter().enumerate() {
                if replaceable(&w) {
                    rt.replace(i, &self.callables)?;
                    replaced.push(rt.workers()[i]);
                }
            }
            Ok(replaced)
        })
    }

    /// True between a successful `init` and `close`.
    ///
    /// ```
    /// let worker = simpler::Worker::builder().sub_workers(1).build()?;
    /// assert!(!worker.is_ready()); // built, not initialized
    /// # Ok::<(), simpler::Error>(())
    /// ```
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = simpler::Worker::builder().sub_workers(1).build()?;
    /// worker.init()?;
    /// assert!(worker.is_ready());
    /// worker.close()?;
    /// assert!(!worker.is_ready());
    /// # Ok(()) }
    /// ```
    pub fn is_ready(&self) -> bool {
        matches!(self.current(), State::Started(_))
    }

    /// The state now (a handle of the runtime when started).
    fn current(&self) -> State {
        sync::read(&self.state).clone()
    }

    /// A handle of the started runtime, for one call: refused before `init`, after `close`, and
    /// in a forked copy of the Worker ([`owned`](Worker::owned)).
    fn started(&self) -> Result<Arc<dyn Runtime>> {
        match self.current() {
            State::Started(rt) => self.owned().map(|()| rt),
            State::New => Err(Error::state("the Worker is not initialized; call init() first")),
            State::Closed => Err(self.closed_error()),
        }
    }

    /// The error of every call on a closed Worker. It names the Worker (its level, its
    /// children, the process that started it): the `close` may have been called through
    /// another handle, on another thread.
    fn closed_error(&self) -> Error {
        let started = match self.owner {
            0 => String::new(),
            pid => format!(", started by process {pid}"),
        };
        let below = if self.cfg.level > Level::Node { "Workers below it" } else { "chips" };
        Error::state(format!(
            "the Worker is closed: this {} Worker ({} SUB workers, {} {below}{started}) was closed by Worker::close, through this or another handle (or its startup failed); build and init a new Worker to run more",
            self.cfg.level,
            self.cfg.engine.sub_workers,
            self.lanes.next_level(),
        ))
    }

    /// Refuses a call in a process other than the one that started the Worker (a copy of it in
    /// a forked process): its workers' mailboxes, pids and threads are the owner's.
    fn owned(&self) -> Result<()> {
        let me = std::process::id();
        if self.owner == 0 || self.owner == me {
            return Ok(());
        }
        Err(Error::state(format!(
            "this Worker was started by process {}, and this is process {me}, forked from it: the workers are the owner's, so a forked copy of the Worker can neither use nor shut them down",
            self.owner
        )))
    }

    /// The level of the Workers this one takes, for messages (`"lower"` below L2).
    fn level_below(&self) -> String {
        Level::from_number(self.cfg.level.number() - 1).map_or("lower".to_string(), |l| l.to_string())
    }

    /// Attaches a nested Worker ([`WorkerBuilder::worker`]) as the next NEXT_LEVEL worker.
    fn attach_nested(&mut self, child: Worker) -> Result<()> {
        if self.cfg.level <= Level::Node {
            return Err(Error::invalid(format!(
                "WorkerBuilder::worker: an {} Worker takes chips and SUB workers, not Workers; add Workers to an L4 (or higher) Worker",
                self.cfg.level
            )));
        }
        if !matches!(child.current(), State::New) {
            return Err(Error::state(
                "WorkerBuilder::worker: the child must not be initialized (the parent starts it)",
            ));
        }
        if child.cfg.level.number() + 1 != self.cfg.level.number() {
            return Err(Error::invalid(format!(
                "WorkerBuilder::worker: an {} Worker takes {} Workers, not {}",
                self.cfg.level,
                self.level_below(),
                child.cfg.level
            )));
        }
        if self.lanes.remotes() > 0 {
            // A remote Worker's id follows the nested Workers' ids: another nested Worker
            // would take the id it was given.
            return Err(Error::invalid(format!(
                "WorkerBuilder::worker: add nested Workers before remote ones ({} has id {} already; its id would change)",
                self.lanes.label(self.lanes.mailboxes()),
                self.children.len()
            )));
        }
        self.lanes.add_nested(child.runs_chip_callables());
        self.children.push(child);
        Ok(())
    }

    /// Attaches a remote L3 Worker ([`WorkerBuilder::remote_worker`]) under `name`.
    fn attach_remote(&mut self, node: RemoteWorker, name: String) -> Result<()> {
        if self.cfg.level <= Level::Node {
            return Err(Error::invalid(format!(
                "WorkerBuilder::remote_worker: an {} Worker takes chips and SUB workers; add remote L3 Workers to an L4 (or higher) Worker",
                self.cfg.level
            )));
        }
        if self.cfg.level != Level::Network1 {
            return Err(Error::invalid(format!(
                "WorkerBuilder::remote_worker: a remote Worker is an L3 Worker; an {} Worker takes {} Workers",
                self.cfg.level,
                self.level_below()
            )));
        }
        let least = 2 * remote::node::HEARTBEAT;
        if node.health_timeout < least {
            return Err(Error::invalid(format!(
                "WorkerBuilder::remote_worker: the node at {name} has a health timeout of {:?}, under {least:?} (twice the node's heartbeat of {:?}): it would be lost between two heartbeats",
                node.health_timeout,
                remote::node::HEARTBEAT
            )));
        }
        if node.launch_rank.is_none()
            && let Some(i) = self.remote.iter().position(|r| r.launch_rank.is_none() && r.addr == node.addr)
        {
            return Err(Error::invalid(format!(
                "WorkerBuilder::remote_worker: the node at {name} is added twice (remote Workers {i} and {}); a node serves one root session, so each remote Worker needs a node of its own",
                self.remote.len()
            )));
        }
        self.lanes.add_remote(name);
        self.remote.push(node);
        Ok(())
    }

    /// Number of remote L3 Workers ([`WorkerBuilder::remote_worker`],
    /// [`WorkerBuilder::launched_workers`]).
    ///
    /// ```
    /// let l4 = simpler::Worker::builder().level(simpler::status::Level::Network1).build()?;
    /// assert_eq!(l4.remote_workers(), 0);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn remote_workers(&self) -> usize {
        self.remote.len()
    }

    /// Registers a host function; returns the handle tasks use to name it.
    ///
    /// Before `init` the function goes into the snapshot every SUB worker starts with. After
    /// `init` it is sent to every live SUB worker, and this returns once all of them installed it; if one refuses, the others drop
    /// it again and nothing is registered. Registering the same function twice returns the
    /// same handle and counts a second reference; a different function under the name of a
    /// registered one is refused ([`ErrorKind::Callable`](crate::ErrorKind::Callable), naming
    /// both). The same rules hold before and after `init`: a Worker without SUB workers (an
    /// L2 Worker among them) refuses a host function
    /// ([`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)).
    ///
    /// A closure ([`HostFn::closure`]) reaches SUB workers only under
    /// [`StartMethod::Fork`], and only before `init`; under the default
    /// [`StartMethod::Exec`] each SUB worker is a new process of the binary and runs functions
    /// of the binary only, so registering a closure is refused, naming it.
    ///
    /// Before `init` (nothing is started):
    ///
    /// ```
    /// use simpler::{HostArgs, HostFn, HostResult, Worker};
    ///
    /// fn negate(args: &HostArgs<'_>) -> HostResult {
    ///     for v in args.output::<f32>(0)? {
    ///         *v = -*v;
    ///     }
    ///     Ok(())
    /// }
    ///
    /// let mut worker = Worker::builder().sub_workers(2).build()?;
    /// let negate_h = worker.register(HostFn::new("negate", negate))?;
    /// assert_eq!(negate_h.name(), "negate");
    /// // The same function again: the same handle, a second reference.
    /// assert_eq!(worker.register(HostFn::new("negate", negate))?, negate_h);
    /// // Another function under that name is refused.
    /// fn keep(_: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    /// let err = worker.register(HostFn::new("negate", keep)).unwrap_err();
    /// assert_eq!(err.kind(), simpler::ErrorKind::Callable);
    ///
    /// // Closures capture state: a SUB worker started by exec cannot run one.
    /// let bias = 0.5f32;
    /// let add_bias = HostFn::closure("add_bias", move |args: &HostArgs<'_>| {
    ///     for v in args.output::<f32>(0)? {
    ///         *v += bias;
    ///     }
    ///     Ok(())
    /// });
    /// let err = worker.register(add_bias).unwrap_err();
    /// assert!(err.message().contains("StartMethod::Fork"));
    /// # Ok::<(), simpler::Error>(())
    /// ```
    ///
    /// After `init`, a plain `fn` is sent to the live SUB workers; a closure is refused. Each
    /// worker installs it between two tasks, so the call waits for the task each one is
    /// running: a task that never returns holds it up for as long (give such runs a deadline,
    /// which ends the task and replaces its worker).
    ///
    /// ```no_run
    /// use simpler::{ErrorKind, HostArgs, HostFn, HostResult, TaskArgs, Worker};
    ///
    /// fn late(_args: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(2).build()?;
    /// worker.init()?;
    /// let late = worker.register(HostFn::new("late", late))?; // both SUB workers have it now
    /// worker.run(|orch| orch.submit_sub(&late, TaskArgs::new()).map(|_| ()))?;
    ///
    /// let err = worker.register(HostFn::closure("c", |_: &HostArgs<'_>| Ok(()))).unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::Callable);
    /// worker.close()?;
    /// # Ok(()) }
    /// ```
    pub fn register(&mut self, f: HostFn) -> Result<CallableHandle> {
        in_method("Worker.register", || self.register_callable(Callable::Host(f)))
    }

    /// Registers a chip callable (a kernel or a chip orchestration) on every chip.
    ///
    /// Before `init` it goes into the snapshot every chip prepares before reporting ready;
    /// after `init` it is sent to every live chip and this returns once all of them installed
    /// it; if one refuses, the others drop it again and nothing is registered. Above L3 it goes
    /// to every chip of the tree below (nested Workers without chips are skipped).
    ///
    /// The same rules hold before and after `init`: a Worker with no chip (below it) refuses a
    /// chip callable ([`ErrorKind::InvalidArgument`]), and a different function under the
    /// sub-kind and name of a registered one is refused ([`ErrorKind::Callable`]). Submit it with `Orchestrator::submit_next_level` (one chip) or
    /// `submit_next_level_group` (several chips at once).
    ///
    /// ```
    /// use simpler::{chip::ChipFn, HostArgs, HostResult, Worker};
    ///
    /// fn vadd(args: &HostArgs<'_>) -> HostResult {
    ///     let (a, b, out) = (args.input::<f32>(0)?, args.input::<f32>(1)?, args.output::<f32>(2)?);
    ///     for i in 0..out.len() {
    ///         out[i] = a[i] + b[i];
    ///     }
    ///     Ok(())
    /// }
    /// let mut worker = Worker::builder().chips(2).build()?;
    /// let vadd = worker.register_chip(ChipFn::kernel("vadd", vadd))?;
    /// assert_eq!(vadd.kind(), simpler::callable::CallableKind::Chip);
    ///
    /// fn vsub(_: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    /// let err = worker.register_chip(ChipFn::kernel("vadd", vsub)).unwrap_err(); // another fn
    /// assert_eq!(err.kind(), simpler::ErrorKind::Callable);
    /// let mut hosts = Worker::builder().sub_workers(1).build()?; // no chips
    /// let err = hosts.register_chip(ChipFn::kernel("vsub", vsub)).unwrap_err();
    /// assert_eq!(err.kind(), simpler::ErrorKind::InvalidArgument);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn register_chip(&mut self, f: ChipFn) -> Result<CallableHandle> {
        in_method("Worker.register_chip", || self.register_callable(Callable::Chip(f)))
    }

    /// Registers an orchestration function that this Worker (L4 and up) dispatches by digest to
    /// its nested Workers with `submit_next_level`; the nested Worker runs it as a run of its own.
    ///
    /// After `init` it is sent to every nested Worker, all or nothing (if one refuses, the others
    /// drop it again). A different function under the name of a registered one is refused,
    /// before and after `init`.
    ///
    /// ```
    /// use simpler::{chip::CallConfig, status::Level, OrchFn, Orchestrator, TaskArgs, Worker};
    /// fn step(_: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    ///     Ok(())
    /// }
    /// let mut l4 = Worker::builder().level(Level::Network1).build()?;
    /// let h = l4.register_orch(OrchFn::new("step", step))?;
    /// assert_eq!(h.kind(), simpler::callable::CallableKind::Orch);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn register_orch(&mut self, f: OrchFn) -> Result<CallableHandle> {
        in_method("Worker.register_orch", || self.register_orch_placed(f, Placement::Everywhere))
    }

    /// Registers an orchestration function on the nested and remote Workers `workers` only
    /// (their worker ids, as `submit_next_level` takes them), for a cluster whose nodes serve
    /// different work.
    ///
    /// Only the remote Workers among `workers` are asked for it (at `init`, or now when the
    /// Worker runs), so a node whose program does not have it is no obstacle as long as it is
    /// not named. A task of it placed on any other worker is refused at submit
    /// ([`ErrorKind::Callable`], naming the callable, the worker and the workers that have it).
    /// Local nested Workers run this program and hold it anyway; the list is where its tasks
    /// may go. Registering it again must name the same workers (or unregister it first).
    /// `workers` must be distinct ids this Worker has ([`ErrorKind::InvalidArgument`]
    /// otherwise). A linked `#[callable(orch)]` registered here keeps this placement.
    ///
    /// ```
    /// use simpler::{chip::CallConfig, status::Level, ErrorKind, OrchFn, Orchestrator, TaskArgs, Worker};
    /// fn step(_: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    ///     Ok(())
    /// }
    /// let mut l4 = Worker::builder()
    ///     .level(Level::Network1)
    ///     .worker(Worker::builder().sub_workers(1).build()?) // worker 0
    ///     .worker(Worker::builder().sub_workers(1).build()?) // worker 1
    ///     .build()?;
    /// let step = l4.register_orch_on(OrchFn::new("step", step), &[1])?;
    /// l4.init()?;
    /// l4.run(|orch| orch.submit_next_level(&step, TaskArgs::new(), CallConfig::default(), 1).map(|_| ()))?;
    /// let err = l4
    ///     .run(|orch| orch.submit_next_level(&step, TaskArgs::new(), CallConfig::default(), 0).map(|_| ()))
    ///     .unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::Callable); // "... is not on worker 0: only workers 1 have it ..."
    /// l4.close()?;
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn register_orch_on(&mut self, f: OrchFn, workers: &[u32]) -> Result<CallableHandle> {
        in_method("Worker.register_orch_on", || {
            let handle = f.handle();
            let n = self.lanes.next_level();
            let mut ids = workers.to_vec();
            ids.sort_unstable();
            if ids.is_empty() {
                return Err(Error::invalid(format!("{handle}: no workers named; name at least one")));
            }
            if let Some(w) = ids.iter().find(|&&w| w as usize >= n) {
                return Err(Error::invalid(format!(
                    "{handle}: worker {w} does not exist: this Worker has {n} nested and remote Workers"
                )));
            }
            if let Some(w) = ids.windows(2).find(|p| p[0] == p[1]) {
                return Err(Error::invalid(format!("{handle}: worker {} is named twice", w[0])));
            }
            self.register_orch_placed(f, Placement::On(ids.into()))
        })
    }

    /// [`register_orch`](Self::register_orch) with a placement.
    fn register_orch_placed(&mut self, f: OrchFn, placement: Placement) -> Result<CallableHandle> {
        if self.cfg.level <= Level::Node {
            return Err(Error::invalid(format!(
                "an {} Worker has no nested Workers to run orchestration functions",
                self.cfg.level
            )));
        }
        self.register_callable(Callable::Orch(f, placement))
    }

    /// Registers `c`: the same rules for every kind, before and after `init`; after `init` the
    /// runtime installs it on its targets (all or nothing) first. Errors from the registry's
    /// check and from the targets name the callable; the public method names itself.
    fn register_callable(&mut self, c: Callable) -> Result<CallableHandle> {
        let handle = c.handle();
        let state = self.current();
        match (&state, &c) {
            (State::Closed, _) => return Err(self.closed_error()),
            (_, Callable::Host(f))
                if self.cfg.start == StartMethod::Exec && matches!(f.body(), Body::Closure(_)) =>
            {
                return Err(Error::new(
                    ErrorKind::Callable,
                    format!(
                        "{handle} is a closure; SUB workers started by exec (StartMethod::Exec, the default) run only functions of the binary: register a fn with HostFn::new, or build the Worker with start_method(StartMethod::Fork) (see its hazards)"
                    ),
                ));
            }
            (State::Started(rt), Callable::Host(f))
                if rt.ships_by_address() && matches!(f.body(), Body::Closure(_)) =>
            {
                return Err(Error::new(
                    ErrorKind::Callable,
                    format!(
                        "{handle} is a closure; closures can be registered only before init() (use HostFn::new with a fn)"
                    ),
                ));
            }
            _ => {}
        }
        self.needs_target(c.kind(), &handle)?;
        let context = |e: Error| e.context(&handle);
        self.callables.check(&c).map_err(context)?;
        if let State::Started(rt) = &state {
            self.owned()?;
            rt.install(&c).map_err(context)?;
        }
        self.callables.install(c)?;
        Ok(handle)
    }

    /// Refuses a registration of `kind` that no worker of this Worker could run: the same rule
    /// before and after `init` (what a Worker has is fixed by its builder).
    fn needs_target(&self, kind: CallableKind, handle: &CallableHandle) -> Result<()> {
        let missing = match kind {
            CallableKind::HostFn if self.cfg.level == Level::Chip => {
                "{handle} is a host function but an L2 (chip) Worker has no SUB workers"
            }
            CallableKind::HostFn if self.cfg.engine.sub_workers == 0 => {
                "{handle} is a host function but this Worker has no SUB workers"
            }
            CallableKind::Chip if !self.runs_chip_callables() => {
                if self.cfg.level > Level::Node {
                    "{handle} is a chip callable but this Worker has no chips below it"
                } else {
                    "{handle} is a chip callable but this Worker has no chips"
                }
            }
            _ => return Ok(()),
        };
        Err(Error::invalid(missing.replace("{handle}", &handle.to_string())))
    }

    /// Whether chip callables run here: an L2 Worker is a chip, an L3 Worker needs chips, and
    /// a Worker above L3 needs a nested Worker that runs them.
    fn runs_chip_callables(&self) -> bool {
        self.cfg.level == Level::Chip || !self.lanes.targets(CallableKind::Chip).is_empty()
    }

    /// Registers every `#[callable]` of the binary that this Worker can run: host functions
    /// when it has SUB workers, chip callables when it has chips (or is a chip), orchestration
    /// callables when it drives nested Workers. `init` calls it before forking anything.
    fn register_linked(&mut self) -> Result<()> {
        use crate::callable::identity::CallableKind;
        let linked = crate::callable::linked::CallableInfo::linked_unambiguous()?;
        for info in linked {
            let what = |e: crate::error::Error| e.context(format!("registering #[callable] `{}`", info.path));
            match info.kind {
                CallableKind::HostFn if self.sub_workers() > 0 => {
                    self.register(crate::callable::host::HostFn::from_linked(info)?).map_err(what)?;
                }
                CallableKind::Chip if self.chips() > 0 || self.level() == crate::level::Level::Chip => {
                    self.register_chip(crate::chip::ChipFn::from_linked(info)?).map_err(what)?;
                }
                CallableKind::Orch if self.level() > crate::level::Level::Node => {
                    let f = crate::engine::orch_fn::OrchFn::from_linked(info)?;
                    self.register_orch_placed(f, Placement::Found).map_err(what)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Drops one registration of `handle`. The caller must not unregister a callable that a
    /// run in flight may still use.
    ///
    /// Each [`register`](Self::register) of a function counts one reference; the callable goes
    /// away with the last one. Unregistering a callable that is not registered is an
    /// [`ErrorKind::Callable`](crate::ErrorKind::Callable) error.
    ///
    /// ```
    /// use simpler::{ErrorKind, HostArgs, HostFn, HostResult, Worker};
    ///
    /// fn noop(_: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    ///
    /// let mut worker = Worker::builder().sub_workers(1).build()?;
    /// let h = worker.register(HostFn::new("noop", noop))?;
    /// worker.register(HostFn::new("noop", noop))?; // a second reference
    /// worker.unregister(&h)?; // one reference left
    /// worker.unregister(&h)?; // gone
    /// assert_eq!(worker.unregister(&h).unwrap_err().kind(), ErrorKind::Callable);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    ///
    /// After `init`, every SUB worker drops it too; later submits naming it fail:
    ///
    /// ```no_run
    /// use simpler::{ErrorKind, HostArgs, HostFn, HostResult, TaskArgs, Worker};
    ///
    /// fn step(_args: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(2).build()?;
    /// let step = worker.register(HostFn::new("step", step))?;
    /// worker.init()?;
    /// let submit_step = |orch: &mut simpler::Orchestrator<'_>| {
    ///     orch.submit_sub(&step, TaskArgs::new()).map(|_| ())
    /// };
    /// worker.run(submit_step)?; // finished: safe to drop
    /// worker.unregister(&step)?;
    /// let err = worker.run(submit_step).unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::Callable); // not registered any more
    /// # Ok(()) }
    /// ```
    pub fn unregister(&mut self, handle: &CallableHandle) -> Result<()> {
        in_method("Worker.unregister", || {
            let state = self.current();
            if matches!(state, State::Closed) {
                return Err(self.closed_error());
            }
            let refs = self.callables.refs(handle);
            if refs == 0 {
                return Err(Error::new(ErrorKind::Callable, format!("{handle} is not registered")));
            }
            if let State::Started(rt) = &state {
                self.owned()?;
                rt.uninstall(handle, refs == 1).map_err(|e| e.context(handle))?;
            }
            self.callables.release(handle)?;
            Ok(())
        })
    }

    /// Starts the Worker: maps the heap rings and mailboxes, forks every SUB worker (before any
    /// engine thread exists), waits until each reports ready, then starts the engine.
    ///
    /// Host functions registered before this call are in every SUB worker from the start.
    /// Calling `init` twice, or after `close`, is an
    /// [`ErrorKind::InvalidState`](crate::ErrorKind::InvalidState) error; a child that fails
    /// or does not report ready within `startup_timeout` is an
    /// [`ErrorKind::WorkerDied`](crate::ErrorKind::WorkerDied) error naming it (one that hung
    /// is killed at the deadline; the others are asked to leave, and reaped).
    ///
    /// First it unlinks the host buffers that killed programs of earlier versions of this
    /// library left in `/dev/shm` ([`sweep_stale_buffers`](crate::memory::sweep_stale_buffers)); the
    /// buffers of this version have no name (see [`create_buffer`](Worker::create_buffer)).
    ///
    /// ```no_run
    /// use simpler::{ErrorKind, HostArgs, HostFn, HostResult, Worker};
    ///
    /// fn noop(_: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(2).build()?;
    /// worker.register(HostFn::new("noop", noop))?; // in the snapshot both children start with
    /// worker.init()?; // forks two SUB workers and waits until both are ready
    /// assert!(worker.is_ready());
    /// assert_eq!(worker.child_pids().len(), 2);
    /// assert_eq!(worker.init().unwrap_err().kind(), ErrorKind::InvalidState);
    /// worker.close()?;
    /// # Ok(()) }
    /// ```
    pub fn init(&mut self) -> Result<()> {
        let was_new = matches!(self.current(), State::New);
        let result = self.init_inner();
        if result.is_err() && was_new && self.cfg.level > Level::Node {
            // Its nested Workers went to their (now reaped) processes: like the upstream FAILED
            // state, a Worker whose startup failed can only be closed, not started again.
            *sync::write(&self.state) = State::Closed;
        }
        result
    }

    fn init_inner(&mut self) -> Result<()> {
        match self.current() {
            State::New => {}
            State::Started(_) => return Err(Error::state("Worker.init: already initialized")),
            State::Closed => return Err(self.closed_error().context("Worker.init")),
        }
        let _span = tracing::debug_span!(target: "simpler::worker", "init", level = self.cfg.level.number())
            .entered();
        // Names left in /dev/shm by killed programs of earlier versions (this one makes none).
        if let Err(e) = crate::sys::shm::sweep_stale_buffers() {
            tracing::debug!(target: "simpler::worker", "sweeping stale buffers: {e}");
        }
        // Every #[callable] of the binary that this Worker can run, before anything forks.
        self.register_linked()?;
        let runtime: Box<dyn Runtime> = if self.cfg.level == Level::Chip {
            // L2: the chip runs in this process; nothing is started.
            Box::new(l2::L2Chip::start(&self.cfg, self.callables.chip())?)
        } else {
            Box::new(tree::Tree::start(
                &self.cfg,
                &self.lanes,
                &self.callables,
                &mut self.children,
                &self.remote,
                &self.extra_heaps,
                &self.extra_owners,
            )?)
        };
        *sync::write(&self.state) = State::Started(Arc::from(runtime));
        self.owner = std::process::id();
        Ok(())
    }

    /// Creates a host buffer of `nbytes` in memory shared with every process of the Worker's tree.
    ///
    /// The buffer is an anonymous `memfd` object that this process holds (one file descriptor
    /// per live buffer; the first buffer raises this process's soft `RLIMIT_NOFILE` to its hard
    /// limit) and that the Worker's processes map through `/proc/<pid>/fd` when a task names it.
    /// It is closed when the last clone (and the last tensor made from it) drops; the memory
    /// goes back to the system once the processes that mapped it notice (large buffers within a
    /// few tasks) or end.
    ///
    /// Needs an initialized Worker; `nbytes` must be greater than zero. A buffer takes memory
    /// only as its bytes are first written, so `nbytes` plus the bytes this process's live host
    /// buffers have not written yet must be no more than the memory the machine can still back
    /// (`MemAvailable + SwapFree`, or less under a memory cgroup limit; it already leaves out
    /// what the live buffers have written): a larger request fails at once with
    /// [`ErrorKind::ResourceExhausted`](crate::ErrorKind::ResourceExhausted), naming the size,
    /// what is left and what the live buffers hold, rather than crashing the task that writes
    /// the last of them. Buffers of other programs are not counted. Running out of file
    /// descriptors is `ResourceExhausted` too, naming the limit.
    ///
    /// **If the program ends without dropping it.** Nothing is left: the buffer has no name in
    /// `/dev/shm` or anywhere else, so its memory goes back when this process and the Worker's
    /// processes end, however they end (returning from `main`, `std::process::exit`, a panic,
    /// `abort`, `SIGKILL`, `SIGTERM`, Ctrl-C). The Worker's processes follow this one within
    /// milliseconds of its death (they ignore the terminal's own signals, Ctrl-C's included, so
    /// a program that handles Ctrl-C keeps them). `/proc/<pid>/maps` of a process that maps it shows
    /// `/memfd:sp-<8 hex>-<pid>-b<N> (deleted)`.
    ///
    /// The Worker's processes open `/proc/<this pid>/fd/<fd>` (or, once this program's main
    /// thread has exited, which empties that directory, the same descriptor under a live thread,
    /// `/proc/<this pid>/task/<tid>/fd/<fd>`), which Linux allows a process of the same user
    /// while this one is dumpable (the default; not after `prctl(PR_SET_DUMPABLE, 0)` or a change
    /// of credentials, and a security module may forbid it): a task naming the buffer then fails
    /// with an error that names the path and says so.
    ///
    /// ```
    /// use simpler::{ErrorKind, Worker};
    ///
    /// let worker = Worker::builder().sub_workers(1).build()?;
    /// let err = worker.create_buffer(64).unwrap_err(); // not initialized yet
    /// assert_eq!(err.kind(), ErrorKind::InvalidState);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    ///
    /// ```no_run
    /// use simpler::{DataType, HostArgs, HostFn, HostResult, TaskArgs, Worker};
    ///
    /// fn square(args: &HostArgs<'_>) -> HostResult {
    ///     for v in args.output::<i32>(0)? {
    ///         *v *= *v;
    ///     }
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(1).build()?;
    /// let square = worker.register(HostFn::new("square", square))?;
    /// worker.init()?;
    /// let buf = worker.create_buffer(4 * 8)?; // eight i32
    /// buf.write(0, &[1i32, 2, 3, 4, 5, 6, 7, 8])?;
    /// let t = buf.tensor(&[8], DataType::Int32)?;
    /// worker.run(|orch| {
    ///     let mut args = TaskArgs::new();
    ///     args.inout(&t)?;
    ///     orch.submit_sub(&square, args)?;
    ///     Ok(())
    /// })?;
    /// assert_eq!(buf.read::<i32>(0, 8)?, vec![1, 4, 9, 16, 25, 36, 49, 64]);
    /// assert!(worker.create_buffer(0).is_err());
    /// # Ok(()) }
    /// ```
    pub fn create_buffer(&self, nbytes: usize) -> Result<Buffer> {
        in_method("Worker.create_buffer", || {
            let rt = self.started()?;
            let minter = rt.minter()?;
            if nbytes == 0 {
                return Err(Error::invalid("nbytes must be greater than zero"));
            }
            Buffer::create_host(minter.mint()?, nbytes)
        })
    }

    /// Calls `orch_fn` on this thread to build a run, closes its submission, and returns a
    /// handle without waiting. Building is serialized; while `pipeline_depth` runs are in
    /// flight this first waits for the oldest to finish: by default for as long as it takes,
    /// bounded by the [`submit_timeout`](WorkerBuilder::submit_timeout) and by the run's own
    /// deadline, past which it fails with an [`ErrorKind::Timeout`](crate::ErrorKind::Timeout)
    /// error naming the run ahead (a run stuck on a task that never returns is ended by a
    /// [deadline](crate::RunOptions::deadline) or [`RunHandle::cancel`]).
    ///
    /// If `orch_fn` returns an error, every task of the run that has not started is failed,
    /// the run settles, and the error is returned; except the error of a submit the run
    /// refused because it had failed already, passed on (as `?` does): that is the run's own
    /// error, so it fails nothing more, and the run is returned (waiting for it gives its first
    /// error). To pass the run arguments and a config, or to record its DAG, use
    /// [`submit_with`](Worker::submit_with).
    ///
    /// Until someone waits, the Worker's background thread drives the run's tasks, so a thread
    /// that submits one run and at once waits for it pays a wake-up of that thread: use
    /// [`run`](Worker::run) then, which drives the run on the calling thread from the start.
    ///
    /// Pipelining two runs:
    ///
    /// ```no_run
    /// use simpler::{DataType, HostArgs, HostFn, HostResult, TaskArgs, Tensor, Worker};
    ///
    /// fn fill(args: &HostArgs<'_>) -> HostResult {
    ///     let value = args.scalar(0)?;
    ///     args.output::<u64>(0)?.fill(value);
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(2).build()?;
    /// let fill = worker.register(HostFn::new("fill", fill))?;
    /// worker.init()?;
    /// let (a, b) = (worker.create_buffer(8 * 64)?, worker.create_buffer(8 * 64)?);
    /// let (ta, tb) = (a.tensor(&[64], DataType::Uint64)?, b.tensor(&[64], DataType::Uint64)?);
    ///
    /// // The arguments of one `fill` task: fill `t` with `value`.
    /// let fill_args = |t: &Tensor, value: u64| -> simpler::Result<TaskArgs> {
    ///     let mut task = TaskArgs::new();
    ///     task.output(t)?.scalar(value);
    ///     Ok(task)
    /// };
    /// // Neither call waits for its run: the second is built while the first executes.
    /// let r1 = worker.submit(|orch| orch.submit_sub(&fill, fill_args(&ta, 1)?).map(|_| ()))?;
    /// let r2 = worker.submit(|orch| orch.submit_sub(&fill, fill_args(&tb, 2)?).map(|_| ()))?;
    /// r1.wait()?;
    /// r2.wait()?;
    /// assert_eq!(a.read::<u64>(0, 64)?, vec![1; 64]);
    /// assert_eq!(b.read::<u64>(0, 64)?, vec![2; 64]);
    /// worker.close()?;
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn submit<F>(&self, orch_fn: F) -> Result<RunHandle>
    where
        F: FnOnce(&mut Orchestrator<'_>) -> Result<()>,
    {
        let eng = self.run_engine("Worker.submit")?;
        self.submit_inner(&eng, |o, _, _| orch_fn(o), RunOptions::new(), false).map(|(h, _)| h)
    }

    /// Like [`submit`](Worker::submit), with [`RunOptions`]: `orch_fn` receives the options'
    /// arguments and config (the signature of an [`OrchFn`](crate::OrchFn), so a plain
    /// orchestration function can be passed as is), and with
    /// [`capture_dag`](RunOptions::capture_dag) the run records its DAG ([`RunHandle::dag`]).
    ///
    /// ```no_run
    /// use simpler::{chip::CallConfig, DataType, trace::EdgeReason, HostArgs, HostFn, HostResult, Orchestrator};
    /// use simpler::{RunOptions, TaskArgs, Worker};
    ///
    /// fn inc(args: &HostArgs<'_>) -> HostResult {
    ///     for v in args.output::<u32>(0)? {
    ///         *v += 1;
    ///     }
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(2).build()?;
    /// let inc = worker.register(HostFn::new("inc", inc))?;
    /// worker.init()?;
    /// let buf = worker.create_buffer(4 * 32)?;
    /// let t = buf.tensor(&[32], DataType::Uint32)?;
    ///
    /// // Increment tensor 0 of the run's arguments, scalar 0 times.
    /// let inc_n = |orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig| {
    ///     for _ in 0..args.scalar_at(0).unwrap_or(0) {
    ///         let mut task = TaskArgs::new();
    ///         task.inout(args.tensor(0).expect("a tensor"))?; // each waits for the previous
    ///         orch.submit_sub(&inc, task)?;
    ///     }
    ///     Ok(())
    /// };
    /// let mut args = TaskArgs::new();
    /// args.inout(&t)?.scalar(3);
    /// let run = worker.submit_with(RunOptions::new().args(args).capture_dag(), inc_n)?;
    /// run.wait()?;
    /// let dag = run.dag().expect("captured");
    /// assert!(dag.has_edge(0, 1) && dag.has_edge(1, 2));
    /// let e = dag.graph().edge_indices().next().unwrap();
    /// assert!(matches!(dag.graph()[e], EdgeReason::Tensor { arg: 0, .. }));
    /// assert_eq!(buf.read::<u32>(0, 32)?, vec![3; 32]);
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn submit_with<F>(&self, options: RunOptions, orch_fn: F) -> Result<RunHandle>
    where
        F: FnOnce(&mut Orchestrator<'_>, &TaskArgs, &CallConfig) -> Result<()>,
    {
        let eng = self.run_engine("Worker.submit")?;
        self.submit_inner(&eng, orch_fn, options, false).map(|(h, _)| h)
    }

    /// [`submit_with`](Self::submit_with) for async code: a future that waits, without
    /// blocking a thread, until the Worker may admit another run (fewer than
    /// [`pending_run_depth`](crate::WorkerBuilder::pending_run_depth) runs are admitted), then
    /// builds the run and resolves to its handle, which is itself a future of the run's result.
    ///
    /// The place it waited for is held for this run alone, so another submit cannot take it in
    /// between. Building runs `orch_fn` on the polling thread, as `submit_with` does (it may
    /// wait there only for room in the task window or a heap ring). Dropping the future before
    /// it resolved submits nothing. It needs no particular async runtime.
    ///
    /// ```no_run
    /// use simpler::{HostArgs, HostFn, HostResult, RunOptions, TaskArgs, Worker};
    ///
    /// fn step(_args: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    ///
    /// # async fn serve() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(2).pending_run_depth(4).build()?;
    /// let step = worker.register(HostFn::new("step", step))?;
    /// worker.init()?;
    /// for _ in 0..100 {
    ///     let run = worker
    ///         .submit_async(RunOptions::new(), |orch, _, _| orch.submit_sub(&step, TaskArgs::new()).map(|_| ()))
    ///         .await?; // waits (without blocking) while 4 runs are admitted
    ///     run.await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn submit_async<F>(&self, options: RunOptions, orch_fn: F) -> SubmitFuture<'_, F>
    where
        F: FnOnce(&mut Orchestrator<'_>, &TaskArgs, &CallConfig) -> Result<()>,
    {
        SubmitFuture { worker: self, options: Some(options), orch_fn: Some(orch_fn) }
    }

    /// Builds a run; the orchestration function's panic reaches the caller (the run was wound
    /// down first).
    fn submit_inner<'e, F>(
        &self,
        eng: &'e Arc<Engine>,
        orch_fn: F,
        options: RunOptions,
        will_wait: bool,
    ) -> Result<(RunHandle, Option<crate::engine::WaiterIntent<'e>>)>
    where
        F: FnOnce(&mut Orchestrator<'_>, &TaskArgs, &CallConfig) -> Result<()>,
    {
        match self.build_as(eng, orch_fn, options, will_wait, None) {
            Ok(built) => Ok(built),
            Err(BuildFailed::Error(e)) => Err(e),
            Err(BuildFailed::Panic(panic)) => resume_unwind(panic),
        }
    }

    /// The engine a run of `method` (as the caller knows it: `Worker.run` waits,
    /// `Worker.submit` does not) is built on, after the dead workers were replaced (when the
    /// builder asked for it). The caller holds it for the whole call: a `close` through another
    /// handle meanwhile closes it (a run not yet admitted is refused) but does not free it.
    fn run_engine(&self, method: &str) -> Result<Arc<Engine>> {
        in_method(method, || {
            let rt = self.started()?;
            if self.cfg.replace_dead {
                self.replace_dead_before_submit(rt.as_ref());
            }
            rt.engine().cloned()
        })
    }

    /// Builds a run on `eng` ([`run_engine`](Self::run_engine)); given a `reservation`, the run
    /// takes the place [`submit_async`](Self::submit_async) holds for it (any error before the
    /// run is admitted gives it back, as the reservation drops).
    fn build_as<'e, F>(
        &self,
        eng: &'e Arc<Engine>,
        orch_fn: F,
        options: RunOptions,
        will_wait: bool,
        reservation: Option<crate::engine::Reservation<'_>>,
    ) -> std::result::Result<(RunHandle, Option<crate::engine::WaiterIntent<'e>>), BuildFailed>
    where
        F: FnOnce(&mut Orchestrator<'_>, &TaskArgs, &CallConfig) -> Result<()>,
    {
        let RunOptions { args, config, capture, deadline } = options;
        config.validate().map_err(BuildFailed::Error)?;
        let deadline = deadline.or(self.cfg.run_deadline);
        let built = eng
            .build_run_as(capture, deadline, will_wait, reservation, |orch| orch_fn(orch, &args, &config))?;
        Ok((RunHandle::new(built.run, eng), built.intent))
    }

    /// Replaces the dead SUB workers and chips before a run is built (the builder's
    /// `replace_dead_workers`). A worker whose replacement fails stays out of service, and the
    /// run goes on without it (its tasks fail naming the dead worker).
    fn replace_dead_before_submit(&self, rt: &dyn Runtime) {
        if !rt.any_dead() {
            return; // the common case: one atomic load per child, no allocation
        }
        for (i, w) in rt.workers().into_iter().enumerate() {
            if replaceable(&w)
                && let Err(e) = rt.replace(i, &self.callables)
            {
                tracing::warn!(target: "simpler::worker", "replacing a dead worker before a submit: {e}");
            }
        }
    }

    /// `submit` then `wait`: builds the run and drives it to completion on this thread.
    ///
    /// Returns the orchestration function's error, or else the run's first task error (also
    /// when the function passed on a submit the failed run refused: see
    /// [`submit`](Worker::submit)). With
    /// arguments and a config for the function, see [`run_with`](Worker::run_with).
    ///
    /// ```no_run
    /// use simpler::{CallableHandle, DataType, HostArgs, HostFn, HostResult};
    /// use simpler::{Orchestrator, TaskArgs, Tensor, Worker};
    ///
    /// fn add(args: &HostArgs<'_>) -> HostResult {
    ///     let (a, b, out) = (args.input::<f32>(0)?, args.input::<f32>(1)?, args.output::<f32>(2)?);
    ///     for i in 0..out.len() {
    ///         out[i] = a[i] + b[i];
    ///     }
    ///     Ok(())
    /// }
    ///
    /// /// out = x + x + x, through a runtime-managed intermediate.
    /// fn triple(
    ///     orch: &mut Orchestrator<'_>,
    ///     add: &CallableHandle,
    ///     x: &Tensor,
    ///     out: &Tensor,
    /// ) -> simpler::Result<()> {
    ///     let twice = orch.alloc(&[16], DataType::Float32)?;
    ///     let mut first = TaskArgs::new();
    ///     first.input(x)?.input(x)?.output(&twice)?;
    ///     orch.submit_sub(add, first)?;
    ///     let mut second = TaskArgs::new();
    ///     second.input(&twice)?.input(x)?.output(out)?; // waits for `first`
    ///     orch.submit_sub(add, second)?;
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(2).build()?;
    /// let add = worker.register(HostFn::new("add", add))?;
    /// worker.init()?;
    /// let (x, out) = (worker.create_buffer(4 * 16)?, worker.create_buffer(4 * 16)?);
    /// x.write(0, &[1.5f32; 16])?;
    /// let (tx, tout) = (x.tensor(&[16], DataType::Float32)?, out.tensor(&[16], DataType::Float32)?);
    /// worker.run(|orch| triple(orch, &add, &tx, &tout))?;
    /// assert_eq!(out.read::<f32>(0, 16)?, vec![4.5; 16]);
    /// worker.close()?;
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn run<F>(&self, orch_fn: F) -> Result<()>
    where
        F: FnOnce(&mut Orchestrator<'_>) -> Result<()>,
    {
        self.run_with(RunOptions::new(), |o, _, _| orch_fn(o))
    }

    /// `submit_with` then `wait`: [`run`](Worker::run) with [`RunOptions`], whose arguments and
    /// config `orch_fn` receives.
    ///
    /// ```no_run
    /// use simpler::{chip::CallConfig, DataType, HostArgs, HostFn, HostResult, Orchestrator};
    /// use simpler::{RunOptions, TaskArgs, Worker};
    ///
    /// fn negate(args: &HostArgs<'_>) -> HostResult {
    ///     args.output::<i32>(0)?.iter_mut().for_each(|v| *v = -*v);
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(2).build()?;
    /// let negate = worker.register(HostFn::new("negate", negate))?;
    /// worker.init()?;
    /// // Negates every tensor of the run's arguments.
    /// let negate_all = |orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig| {
    ///     for i in 0..args.tensor_count() {
    ///         let mut task = TaskArgs::new();
    ///         task.inout(args.tensor(i).expect("in range"))?;
    ///         orch.submit_sub(&negate, task)?;
    ///     }
    ///     Ok(())
    /// };
    /// let buf = worker.create_buffer(16)?;
    /// buf.write(0, &[1i32, 2, 3, 4])?;
    /// let mut args = TaskArgs::new();
    /// args.inout(&buf.tensor(&[4], DataType::Int32)?)?;
    /// worker.run_with(RunOptions::new().args(args), negate_all)?;
    /// assert_eq!(buf.read::<i32>(0, 4)?, [-1, -2, -3, -4]);
    /// worker.close()
    /// # }
    /// ```
    #[track_caller]
    pub fn run_with<F>(&self, options: RunOptions, orch_fn: F) -> Result<()>
    where
        F: FnOnce(&mut Orchestrator<'_>, &TaskArgs, &CallConfig) -> Result<()>,
    {
        // This thread will drive the run: from the moment it may build until it has waited,
        // published work does not wake the background thread (`RunHandle::is_done` and other
        // waiters still drive other runs meanwhile).
        let eng = self.run_engine("Worker.run")?;
        let (handle, _intent) = self.submit_inner(&eng, orch_fn, options, true)?;
        handle.wait()
    }

    /// [`run_with`](Worker::run_with) for a task a parent (a Worker above, or a remote root)
    /// sent: returns the run's handle (for its timeline) and shows it to `submitted` before it
    /// waits (so another thread may cancel the run). The orchestration function's panic is
    /// this task's error (`TaskFailed`, with the panic's message), as a SUB worker's is: it
    /// neither ends the serving process nor its session. `Err` only when the run could not be
    /// submitted; the run's own result is the inner one.
    pub(crate) fn run_for_parent<F>(
        &self,
        options: RunOptions,
        orch_fn: F,
        submitted: impl FnOnce(&RunHandle),
    ) -> Result<(crate::engine::run::RunHandle, Result<()>)>
    where
        F: FnOnce(&mut Orchestrator<'_>, &TaskArgs, &CallConfig) -> Result<()>,
    {
        // Driven by this thread from the start, as in `run_with`. Confined to the task's
        // tensors (`Orchestrator::confine_to`).
        let confined = |orch: &mut Orchestrator<'_>, a: &TaskArgs, c: &CallConfig| {
            orch.confine_to(a);
            orch_fn(orch, a, c)
        };
        let eng = self.run_engine("Worker.run")?;
        let (handle, _intent) =
            self.build_as(&eng, confined, options, true, None).map_err(BuildFailed::into_error)?;
        submitted(&handle);
        let result = handle.wait();
        Ok((handle, result))
    }

    /// Runs one chip callable (a kernel or a chip orchestration) on an L2 Worker, in this
    /// process, and waits for it: how one tests a kernel alone.
    ///
    /// Host-backed tensors are copied into the chip's device memory before the run (when the
    /// tag reads them) and back after it (when the tag writes them); device buffers from
    /// [`alloc_child_tensor`](Worker::alloc_child_tensor) stay on the chip.
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// use simpler::{chip::CallConfig, chip::ChipFn, DataType, HostArgs, HostResult, status::Level, TaskArgs, Worker};
    ///
    /// fn scale(args: &HostArgs<'_>) -> HostResult {
    ///     for v in args.output::<f32>(0)? {
    ///         *v *= 2.0;
    ///     }
    ///     Ok(())
    /// }
    /// let mut chip = Worker::builder().level(Level::Chip).chip_memory(16 << 20).build()?;
    /// let scale = chip.register_chip(ChipFn::kernel("scale", scale))?;
    /// chip.init()?; // no fork: the chip runs in this process
    /// let x = chip.create_buffer(16)?;
    /// x.write(0, &[1.0f32, 2.0, 3.0, 4.0])?;
    /// let mut args = TaskArgs::new();
    /// args.inout(&x.tensor(&[4], DataType::Float32)?)?;
    /// chip.run_callable(&scale, args, CallConfig::default())?;
    /// assert_eq!(x.read::<f32>(0, 4)?, vec![2.0, 4.0, 6.0, 8.0]);
    /// # Ok(()) }
    /// ```
    pub fn run_callable(&self, callable: &CallableHandle, args: TaskArgs, config: CallConfig) -> Result<()> {
        in_method("Worker.run_callable", || self.started())?.run_callable(callable, args, config)
    }

    /// Allocates `shape` elements of `dtype` in the device memory of chip `worker` (at L3 and
    /// L2), or in the memory of remote L3 Worker `worker` (at L4: a node-resident buffer).
    ///
    /// The buffer lives on that chip (or node): only tasks on it may name it (aiming it at
    /// another worker is an error at submit), and it is never copied in or out around a run.
    /// One exception: a task on another remote Worker may *read* a node-resident buffer, whose
    /// bytes then go straight from node to node (the book's "Across hosts", "From node to
    /// node"); writing it from there is refused at submit.
    /// Move bytes with [`copy_to`](Worker::copy_to) / [`copy_from`](Worker::copy_from); release
    /// it with [`free`](Worker::free). A node-resident buffer also ends with its node's session.
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// use simpler::{DataType, Worker};
    /// let mut worker = Worker::builder().chips(1).build()?;
    /// worker.init()?;
    /// let weights = worker.alloc_child_tensor(0, &[1024], DataType::Float32)?;
    /// let host = worker.create_buffer(4096)?;
    /// host.write(0, &vec![0.5f32; 1024])?;
    /// worker.copy_to(&weights, &host)?; // host -> chip 0
    /// worker.free(&weights)?;
    /// # Ok(()) }
    /// ```
    pub fn alloc_child_tensor(&self, worker: u32, shape: &[u32], dtype: DataType) -> Result<Buffer> {
        in_method("Worker.alloc_child_tensor", || self.started()?.alloc_device(worker, shape, dtype))
    }

    /// Copies the device buffer's size in bytes from host buffer `src` into device buffer `dst`.
    ///
    /// A copy never reorders data around tasks: while a submitted task that names `dst` has not
    /// finished (its run is still in flight, or this is called from the orchestration function
    /// that submitted it), the copy is refused with an
    /// [`ErrorKind::InvalidState`](crate::ErrorKind::InvalidState) error naming the buffer and
    /// how many tasks hold it; wait for the run first.
    ///
    /// ```no_run
    /// # fn demo(worker: &simpler::Worker, dev: &simpler::Buffer, host: &simpler::Buffer) -> simpler::Result<()> {
    /// worker.copy_to(dev, host)?;
    /// # Ok(()) }
    /// ```
    pub fn copy_to(&self, dst: &Buffer, src: &Buffer) -> Result<()> {
        in_method("Worker.copy_to", || {
            let (chip, ptr) = device_of(dst)?;
            let nbytes = dst.desc().nbytes();
            check_host(src, nbytes)?;
            let rt = self.started()?;
            check_host_owner(rt.minter()?, src)?;
            rt.copy_to(chip, ptr, dst.desc().identity(), src, nbytes)
        })
    }

    /// Copies device buffer `src` (its whole size) into host buffer `dst`. Refused, like
    /// [`copy_to`](Worker::copy_to), while a submitted task that names `src` has not finished,
    /// and, like [`Buffer::write`], while one that names `dst` has not ended.
    ///
    /// ```no_run
    /// # fn demo(worker: &simpler::Worker, dev: &simpler::Buffer, host: &simpler::Buffer) -> simpler::Result<()> {
    /// worker.copy_from(host, dev)?;
    /// let values = host.read::<f32>(0, 4)?;
    /// # Ok(()) }
    /// ```
    pub fn copy_from(&self, dst: &Buffer, src: &Buffer) -> Result<()> {
        in_method("Worker.copy_from", || {
            let (chip, ptr) = device_of(src)?;
            let nbytes = src.desc().nbytes();
            check_host(dst, nbytes)?;
            let rt = self.started()?;
            check_host_owner(rt.minter()?, dst)?;
            // The chip writes `dst`'s bytes: as a host write, refused while a task names it.
            let _writing = dst.host_write()?;
            rt.copy_from(dst, chip, ptr, src.desc().identity(), nbytes)
        })
    }

    /// Frees device memory from [`alloc_child_tensor`](Worker::alloc_child_tensor). Freeing
    /// twice, or freeing while a run is in flight, is an error; tasks submitted afterwards that
    /// name the buffer are refused at submit.
    ///
    /// ```no_run
    /// # fn demo(worker: &simpler::Worker, dev: &simpler::Buffer) -> simpler::Result<()> {
    /// worker.free(dev)?;
    /// assert!(worker.free(dev).is_err()); // already freed
    /// # Ok(()) }
    /// ```
    pub fn free(&self, buf: &Buffer) -> Result<()> {
        in_method("Worker.free", || {
            let (chip, ptr) = device_of(buf)?;
            self.started()?.free(buf, chip, ptr)
        })
    }

    /// Shuts the Worker down: waits (up to `close_timeout`) for runs in flight, stops the
    /// engine, shuts every child down and reaps it. Idempotent; dropping a Worker closes it.
    ///
    /// It takes `&self`, so a Worker shared by threads (an `Arc<Worker>`, a `&'static Worker`)
    /// is closed through any handle, without `Arc::try_unwrap`; dropping the last handle
    /// closes it too. From the moment `close` begins, every other call on the Worker (a `run`
    /// or `submit` on another thread, `create_buffer`, ...) is refused with an
    /// [`ErrorKind::InvalidState`](crate::ErrorKind::InvalidState) error that names the closed
    /// Worker ("the Worker is closed: this L3 (node) Worker (2 SUB workers, 0 chips, ...) was closed by
    /// Worker::close ..."); a run admitted before that is waited for as above, and its waiter
    /// gets its result or the abandon error. A `close` called while another runs returns once
    /// that one has shut everything down.
    ///
    /// A closed Worker cannot be initialized again; closing one that was never initialized
    /// forks nothing.
    ///
    /// Its only error is [`ErrorKind::Timeout`](crate::ErrorKind::Timeout), when runs were
    /// abandoned at the deadline: a run that failed is not reported again, waited for or not;
    /// its [`RunHandle`] keeps its error.
    ///
    /// In a process forked from the one that started the Worker, its copy of the Worker is not
    /// the owner of the workers: closing or dropping the copy leaves them alone (nothing is
    /// asked of them, signalled or joined), and every other call on the copy is refused with an
    /// [`ErrorKind::InvalidState`](crate::ErrorKind::InvalidState) error naming both processes.
    ///
    /// ```
    /// use simpler::{ErrorKind, Worker};
    ///
    /// let mut worker = Worker::builder().sub_workers(1).build()?;
    /// worker.close()?; // never initialized: nothing to shut down
    /// assert_eq!(worker.init().unwrap_err().kind(), ErrorKind::InvalidState);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    ///
    /// ```no_run
    /// use simpler::{ErrorKind, HostArgs, HostFn, HostResult, TaskArgs, Worker};
    ///
    /// fn work(_args: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(2).build()?;
    /// let work = worker.register(HostFn::new("work", work))?;
    /// worker.init()?;
    /// let run = worker.submit(|orch| orch.submit_sub(&work, TaskArgs::new()).map(|_| ()))?;
    /// worker.close()?; // lets the run finish first (up to `close_timeout`)
    /// assert!(run.is_done());
    /// assert!(worker.child_pids().is_empty());
    /// worker.close()?; // idempotent
    /// let err = worker.create_buffer(64).unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidState);
    /// # Ok(()) }
    /// ```
    ///
    /// Through a shared handle, from another thread:
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use simpler::{ErrorKind, Worker};
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(1).build()?;
    /// worker.init()?;
    /// let worker = Arc::new(worker);
    /// let other = Arc::clone(&worker);
    /// std::thread::spawn(move || other.close()).join().unwrap()?;
    /// let err = worker.run(|_orch| Ok(())).unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidState);
    /// assert!(err.message().contains("the Worker is closed: this L3 (node) Worker"));
    /// # Ok(()) }
    /// ```
    pub fn close(&self) -> Result<()> {
        // One close shuts the runtime down; a concurrent one waits for it, then finds it closed.
        let _closing = sync::lock(&self.close_lock);
        // Taken out first: from here every new call is refused, naming this Worker.
        let taken = std::mem::replace(&mut *sync::write(&self.state), State::Closed);
        match taken {
            // A forked copy: nothing of the owner's is asked, signalled or joined; the copy's
            // descriptors and mappings go when this process exits.
            State::Started(runtime) if self.owned().is_err() => {
                std::mem::forget(runtime);
                Ok(())
            }
            // A call still inside the runtime holds a handle: the runtime is freed with the
            // last one, once that call has failed or finished (its engine is closed now).
            State::Started(runtime) => in_method("Worker.close", || runtime.close(self.cfg.close_timeout)),
            _ => Ok(()),
        }
    }
}

/// The future [`Worker::submit_async`] returns: resolves to the run's handle once the run was
/// admitted and built.
///
/// ```no_run
/// # async fn f(worker: &simpler::Worker) -> simpler::Result<()> {
/// let submit: simpler::SubmitFuture<'_, _> =
///     worker.submit_async(simpler::RunOptions::new(), |_orch, _args, _cfg| Ok(()));
/// let run = submit.await?;
/// run.await
/// # }
/// ```
#[must_use = "a future does nothing unless awaited"]
pub struct SubmitFuture<'a, F> {
    worker: &'a Worker,
    options: Option<RunOptions>,
    orch_fn: Option<F>,
}

// Nothing of it is pinned structurally: `orch_fn` is moved out by value.
impl<F> Unpin for SubmitFuture<'_, F> {}

impl<F> std::fmt::Debug for SubmitFuture<'_, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubmitFuture").field("submitted", &self.orch_fn.is_none()).finish()
    }
}

impl<F> std::future::Future for SubmitFuture<'_, F>
where
    F: FnOnce(&mut Orchestrator<'_>, &TaskArgs, &CallConfig) -> Result<()>,
{
    type Output = Result<RunHandle>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = &mut *self;
        let (Some(orch_fn), Some(options)) = (this.orch_fn.take(), this.options.take()) else {
            return std::task::Poll::Ready(Err(Error::state("SubmitFuture polled after it resolved")));
        };
        let eng = match this.worker.run_engine("Worker.submit_async") {
            Ok(eng) => eng,
            Err(e) => return std::task::Poll::Ready(Err(e)),
        };
        // The place is taken and built on in this one poll: a future dropped while it waits
        // holds none.
        let Some(place) = eng.poll_room(cx.waker()) else {
            (this.orch_fn, this.options) = (Some(orch_fn), Some(options));
            return std::task::Poll::Pending;
        };
        std::task::Poll::Ready(match this.worker.build_as(&eng, orch_fn, options, false, Some(place)) {
            Ok((handle, _)) => Ok(handle),
            Err(BuildFailed::Error(e)) => Err(e),
            Err(BuildFailed::Panic(panic)) => resume_unwind(panic),
        })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.close();
    }
}
