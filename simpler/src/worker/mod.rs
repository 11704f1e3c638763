//! `Worker`: builder, registration, `init` (fork ordering), runs, buffers and `close`.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::panic::resume_unwind;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::callable::host::{Body, HostFn};
use crate::callable::identity::{CallableHandle, CallableKind, Digest};
use crate::callable::registry::Registry;
use crate::chip::{BackendFactory, ChipBackend, ChipConfig, ChipFn, ChipSpec};
use crate::data::buffer::IdentityMinter;
use crate::data::buffer::{Buffer, ShmName};
use crate::data::call_config::CallConfig;
use crate::data::task_args::TaskArgs;
use crate::engine::heap::HostRings;
use crate::engine::orch_fn::OrchFn;
use crate::engine::orchestrator::Orchestrator;
use crate::engine::run::RunHandle;
use crate::engine::scheduler::{Lane, LaneKind};
use crate::engine::{Bell, BuildFailed, Engine, EngineConfig, LevelParts};
use crate::error::{Error, ErrorKind, Result};
use crate::ipc::child::{CTRL_REGISTER_FN, CTRL_UNREGISTER, HostResolver};
use crate::ipc::endpoint::MailboxEndpoint;
use crate::ipc::mailbox::{InitStatus, Mailbox, MailboxRegion};
use crate::level::Level;
use crate::sys::futex::Doorbell;
use crate::sys::process::{Monitor, fork_child};
use crate::sys::shm::PosixShm;
use crate::sys::sync;
use crate::worker::serve::chip::ChipChild;
use crate::worker::serve::sub::SubChild;

mod chips;
mod l2;
mod nested;
mod options;
mod serve;

pub use options::RunOptions;

/// Most callables one target keeps installed at once.
const MAX_CALLABLES: usize = 1024;

/// Configures a [`Worker`]. Construction never forks or maps anything; `init` does.
///
/// ```
/// use std::time::Duration;
/// use simpler::{Level, Worker};
/// let worker = Worker::builder()
///     .level(Level::Node)
///     .sub_workers(2)
///     .heap_ring_size(64 << 20)
///     .backpressure_timeout(Duration::from_secs(5))
///     .build()
///     .unwrap();
/// assert_eq!(worker.sub_workers(), 2);
/// assert!(!worker.is_ready());
/// ```
#[derive(Debug, Clone)]
pub struct WorkerBuilder {
    level: Level,
    engine: EngineConfig,
    chip_memory: u64,
    chip_cores: usize,
    chip_backend: BackendFactory,
    /// Test hook: a nested Worker's process waits this long before starting (to exercise the
    /// startup deadline).
    startup_delay: Duration,
    startup_timeout: Duration,
    close_timeout: Duration,
}

impl WorkerBuilder {
    /// The level this Worker runs at (default [`Level::Node`], L3).
    ///
    /// * [`Level::Chip`] (L2): one simulated chip in this process; run chip callables with
    ///   [`Worker::run_callable`].
    /// * [`Level::Node`] (L3): SUB workers and chips, each in a forked process.
    /// * [`Level::Network1`] and up (L4+): Workers one level down, added with
    ///   [`Worker::add_worker`], each in a forked process.
    ///
    /// ```
    /// use simpler::{ErrorKind, Level, Worker};
    ///
    /// let worker = Worker::builder().level(Level::Node).sub_workers(1).build()?;
    /// assert_eq!(worker.level(), Level::Node);
    ///
    /// // A chip has no SUB workers of its own.
    /// let err = Worker::builder().level(Level::Chip).sub_workers(1).build().unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn level(mut self, level: Level) -> Self {
        self.level = level;
        self
    }

    /// Number of simulated chips, each in its own forked process (default 0). Chips are the
    /// NEXT_LEVEL workers of an L3 Worker, with worker ids `0..n`.
    ///
    /// ```
    /// let worker = simpler::Worker::builder().chips(2).build().unwrap();
    /// assert_eq!(worker.chips(), 2);
    /// ```
    pub fn chips(mut self, n: usize) -> Self {
        self.engine.next_level_workers = n;
        self
    }

    /// Device memory of each simulated chip in bytes (default 1 GiB, backed on first touch).
    ///
    /// ```
    /// let worker = simpler::Worker::builder().chips(1).chip_memory(64 << 20).build().unwrap();
    /// # drop(worker);
    /// ```
    pub fn chip_memory(mut self, bytes: u64) -> Self {
        self.chip_memory = bytes;
        self
    }

    /// Simulated cores (threads) per chip (default 4).
    ///
    /// ```
    /// let worker = simpler::Worker::builder().chips(1).chip_cores(8).build().unwrap();
    /// # drop(worker);
    /// ```
    pub fn chip_cores(mut self, n: usize) -> Self {
        self.chip_cores = n;
        self
    }

    /// How each chip's device is made (default: a [`SimChip`](crate::SimChip) of `chip_memory`
    /// bytes and `chip_cores` cores). The factory runs in the process that drives the chip (a
    /// chip child forked at `init` at L3, the calling process at L2), once per chip, with that
    /// chip's [`ChipSpec`](crate::ChipSpec); its error fails `init`, naming the chip. Every
    /// device operation of the chip (allocation, frees, copies in both directions) then goes
    /// through the [`ChipBackend`](crate::ChipBackend) it returns.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use simpler::{ChipBackend, ChipSpec, DeviceMemory, Level, SimChip, Worker};
    ///
    /// /// A SimChip that counts the bytes copied to it.
    /// struct Counting {
    ///     sim: SimChip,
    ///     copied_in: Arc<AtomicUsize>,
    /// }
    ///
    /// impl ChipBackend for Counting {
    ///     fn cores(&self) -> usize {
    ///         self.sim.cores()
    ///     }
    ///     fn memory(&self) -> &DeviceMemory {
    ///         self.sim.memory()
    ///     }
    ///     fn copy_to_device(&self, dst: u64, src: &[u8]) -> simpler::Result<()> {
    ///         self.copied_in.fetch_add(src.len(), Ordering::Relaxed);
    ///         self.sim.copy_to_device(dst, src)
    ///     }
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let copied_in = Arc::new(AtomicUsize::new(0));
    /// let count = copied_in.clone();
    /// let mut chip = Worker::builder()
    ///     .level(Level::Chip)
    ///     .chip_memory(1 << 20)
    ///     .chip_backend(move |spec: &ChipSpec| {
    ///         let sim = SimChip::new(spec.memory_bytes(), spec.cores())?;
    ///         Ok(Box::new(Counting { sim, copied_in: count.clone() }) as Box<dyn ChipBackend>)
    ///     })
    ///     .build()?;
    /// chip.init()?;
    /// let dev = chip.alloc_child_tensor(0, &[16], simpler::DataType::Float32)?;
    /// let host = chip.create_buffer(64)?;
    /// chip.copy_to(&dev, &host)?;
    /// assert_eq!(copied_in.load(Ordering::Relaxed), 64);
    /// chip.free(&dev)?;
    /// chip.close()
    /// # }
    /// ```
    pub fn chip_backend(
        mut self,
        factory: impl Fn(&ChipSpec) -> Result<Box<dyn ChipBackend>> + Send + Sync + 'static,
    ) -> Self {
        self.chip_backend = BackendFactory::new(factory);
        self
    }

    /// Number of forked SUB workers that run host functions (default 0).
    ///
    /// `init` forks one process per SUB worker. A Worker without any can be built, but has
    /// nowhere to run host functions: `submit_sub` then fails.
    ///
    /// ```
    /// use simpler::Worker;
    ///
    /// let worker = Worker::builder().sub_workers(4).build()?;
    /// assert_eq!(worker.sub_workers(), 4);
    /// assert_eq!(Worker::builder().build()?.sub_workers(), 0); // the default
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn sub_workers(mut self, n: usize) -> Self {
        self.engine.sub_workers = n;
        self
    }

    /// Bytes per heap ring for `orch.alloc` (default 1 GiB each, four rings, lazily backed;
    /// 0 disables the heap).
    ///
    /// ```
    /// use simpler::Worker;
    ///
    /// // Intermediates from `orch.alloc` come from four rings of 64 MiB each.
    /// let worker = Worker::builder().sub_workers(2).heap_ring_size(64 << 20).build()?;
    /// assert!(!worker.is_ready()); // nothing is mapped before `init`
    ///
    /// // Runs that only name `create_buffer` buffers need no heap; `orch.alloc` then fails.
    /// let no_heap = Worker::builder().sub_workers(2).heap_ring_size(0).build()?;
    /// # drop(no_heap);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn heap_ring_size(mut self, bytes: u64) -> Self {
        self.engine.heap_ring_size = bytes;
        self
    }

    /// Live tasks at most before `submit` waits (default 65536).
    ///
    /// A task stays live until its scope has ended and it has completed; every `orch.alloc`
    /// takes a place too. At least 1.
    ///
    /// ```
    /// use simpler::{ErrorKind, Worker};
    ///
    /// let worker = Worker::builder().sub_workers(2).task_window(4096).build()?;
    /// # drop(worker);
    /// let err = Worker::builder().task_window(0).build().unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn task_window(mut self, n: usize) -> Self {
        self.engine.task_window = n;
        self
    }

    /// Runs admitted at once: one executing, the others built and waiting (default 2).
    ///
    /// At least 1. With 1, each `submit` first waits for the previous run to finish.
    ///
    /// ```
    /// use simpler::{ErrorKind, Worker};
    ///
    /// // Build up to three runs ahead of the one executing.
    /// let worker = Worker::builder().sub_workers(2).pipeline_depth(4).build()?;
    /// # drop(worker);
    /// let err = Worker::builder().pipeline_depth(0).build().unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn pipeline_depth(mut self, n: usize) -> Self {
        self.engine.pipeline_depth = n;
        self
    }

    /// How long a full task window or heap ring waits before the submit fails (default 10 s).
    ///
    /// The failing `submit_*` or `orch.alloc` returns an error of kind
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout).
    ///
    /// ```
    /// use std::time::Duration;
    /// use simpler::Worker;
    ///
    /// // Give up after half a second without room in a 256-task window.
    /// let worker = Worker::builder()
    ///     .sub_workers(2)
    ///     .task_window(256)
    ///     .backpressure_timeout(Duration::from_millis(500))
    ///     .build()?;
    /// # drop(worker);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn backpressure_timeout(mut self, t: Duration) -> Self {
        self.engine.backpressure_timeout = t;
        self
    }

    /// One deadline for starting every child process (default 300 s).
    ///
    /// `init` fails with [`ErrorKind::WorkerDied`](crate::ErrorKind::WorkerDied) when a child
    /// has not reported ready by then. Must be greater than zero.
    ///
    /// ```
    /// use std::time::Duration;
    /// use simpler::{ErrorKind, Worker};
    ///
    /// let worker = Worker::builder().sub_workers(8).startup_timeout(Duration::from_secs(30)).build()?;
    /// # drop(worker);
    /// let err = Worker::builder().startup_timeout(Duration::ZERO).build().unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn startup_timeout(mut self, t: Duration) -> Self {
        self.startup_timeout = t;
        self
    }

    /// How long `close` waits for runs in flight before abandoning them (default 10 s).
    ///
    /// When it abandons any, `close` still shuts everything down and then returns an error of
    /// kind [`ErrorKind::Timeout`](crate::ErrorKind::Timeout).
    ///
    /// ```
    /// use std::time::Duration;
    /// use simpler::Worker;
    ///
    /// let worker = Worker::builder().sub_workers(2).close_timeout(Duration::from_secs(1)).build()?;
    /// # drop(worker);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn close_timeout(mut self, t: Duration) -> Self {
        self.close_timeout = t;
        self
    }

    #[doc(hidden)]
    /// Test hook: when this Worker runs nested under a parent, its process waits `delay`
    /// before it starts its own children (to exercise the parent's startup deadline).
    pub fn __startup_delay(mut self, delay: Duration) -> Self {
        self.startup_delay = delay;
        self
    }

    /// Validates the configuration and returns an uninitialized Worker.
    ///
    /// # Errors
    ///
    /// An [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error for a level
    /// other than [`Level::Node`], a `task_window` or `pipeline_depth` of 0, or a zero
    /// `startup_timeout`.
    ///
    /// ```
    /// use simpler::{ErrorKind, Worker};
    ///
    /// let worker = Worker::builder().sub_workers(2).build()?;
    /// // Nothing is forked or mapped yet: that is `init`'s job.
    /// assert!(!worker.is_ready());
    /// assert!(worker.child_pids().is_empty());
    /// drop(worker); // dropping an uninitialized Worker does nothing
    ///
    /// let err = Worker::builder().task_window(0).build().unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn build(self) -> Result<Worker> {
        if self.level == Level::Chip && (self.engine.sub_workers > 0 || self.engine.next_level_workers > 0) {
            return Err(Error::invalid(
                "an L2 (chip) Worker is one chip run in-process: it has no SUB workers and no chips of its own",
            ));
        }
        if self.level == Level::Chip && self.chip_cores == 0 {
            return Err(Error::invalid("chip_cores must be at least 1"));
        }
        if self.level > Level::Node && self.engine.next_level_workers > 0 {
            return Err(Error::invalid(format!(
                "an {} Worker has no chips of its own: its NEXT_LEVEL workers are Workers one level down (Worker::add_worker)",
                self.level
            )));
        }
        if self.engine.task_window == 0 {
            return Err(Error::invalid("task_window must be at least 1"));
        }
        if self.engine.pipeline_depth == 0 {
            return Err(Error::invalid("pipeline_depth must be at least 1"));
        }
        if self.startup_timeout.is_zero() {
            return Err(Error::invalid("startup_timeout must be greater than zero"));
        }
        if self.engine.next_level_workers > 0 && self.chip_cores == 0 {
            return Err(Error::invalid("chip_cores must be at least 1"));
        }
        Ok(Worker {
            cfg: self,
            registry: Registry::new(MAX_CALLABLES),
            chip_registry: Registry::new(MAX_CALLABLES),
            orch_registry: Registry::new(MAX_CALLABLES),
            children: Vec::new(),
            nested_chips: Vec::new(),
            extra_heaps: Vec::new(),
            handles: HashMap::new(),
            phase: Phase::New,
        })
    }
}

struct RegionBell(Arc<MailboxRegion>);

impl AsRef<Doorbell> for RegionBell {
    fn as_ref(&self) -> &Doorbell {
        self.0.doorbell()
    }
}

struct Live {
    engine: Arc<Engine>,
    /// Mints this Worker's buffer identities (host buffers, chip buffers, and its engine's
    /// `orch.alloc` intermediates).
    minter: Arc<IdentityMinter>,
    /// The device buffers allocated on this Worker's chips and not yet freed.
    devices: Arc<chips::ChipBuffers>,
    /// Serializes control requests (one per mailbox base frame at a time).
    control_lock: std::sync::Mutex<()>,
    region: Arc<MailboxRegion>,
    pids: Vec<i32>,
    monitor: Monitor,
    background: Option<JoinHandle<()>>,
}

enum Phase {
    New,
    Ready(Box<Live>),
    /// An initialized L2 Worker: one chip in this process.
    Chip(Box<l2::ChipLive>),
    Closed,
}

/// One level of the hierarchy: its engine and its forked workers.
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
    cfg: WorkerBuilder,
    registry: Registry<HostFn>,
    chip_registry: Registry<ChipFn>,
    /// Orchestration functions dispatched to nested Workers (L4 and up).
    orch_registry: Registry<OrchFn>,
    /// Nested Workers added with `add_worker`, forked by `init` (L4 and up).
    children: Vec<Worker>,
    /// For each nested Worker, whether it has chips below it (set by `init`; L4 and up): the
    /// targets of a chip callable registered here.
    nested_chips: Vec<bool>,
    /// Heap rings of the ancestors of a nested Worker (their slabs reach this Worker's tasks).
    extra_heaps: Vec<(u64, u64)>,
    handles: HashMap<Digest, CallableHandle>,
    phase: Phase,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let phase = match self.phase {
            Phase::New => "new",
            Phase::Ready(_) | Phase::Chip(_) => "ready",
            Phase::Closed => "closed",
        };
        f.debug_struct("Worker")
            .field("level", &self.cfg.level)
            .field("sub_workers", &self.cfg.engine.sub_workers)
            .field("phase", &phase)
            .finish()
    }
}

fn random_u64() -> u64 {
    std::collections::hash_map::RandomState::new().hash_one((std::process::id(), Instant::now()))
}

impl Worker {
    /// A builder with the defaults.
    ///
    /// Defaults: L3 ([`Level::Node`]), no SUB workers, four 1 GiB heap rings, a task window of
    /// 65536, a pipeline depth of 2, and timeouts of 10 s (back-pressure), 300 s (startup) and
    /// 10 s (close).
    ///
    /// ```
    /// use simpler::{Level, Worker};
    ///
    /// let worker = Worker::builder().build()?; // all defaults
    /// assert_eq!(worker.level(), Level::Node);
    /// assert_eq!(worker.sub_workers(), 0);
    /// assert!(!worker.is_ready());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn builder() -> WorkerBuilder {
        WorkerBuilder {
            level: Level::Node,
            engine: EngineConfig::default(),
            chip_memory: 1 << 30,
            chip_cores: 4,
            chip_backend: BackendFactory::sim(),
            startup_delay: Duration::ZERO,
            startup_timeout: Duration::from_secs(300),
            close_timeout: Duration::from_secs(10),
        }
    }

    /// The level this Worker runs at.
    ///
    /// ```
    /// use simpler::{Level, Worker};
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

    /// Process ids of the forked workers (empty before `init` and after `close`).
    ///
    /// For tests and diagnostics: e.g. to check that `close` reaped every child.
    ///
    /// ```
    /// let worker = simpler::Worker::builder().sub_workers(1).build().unwrap();
    /// assert!(worker.child_pids().is_empty()); // nothing forked before init
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
        match &self.phase {
            Phase::Ready(live) => live.pids.clone(),
            _ => Vec::new(),
        }
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
        matches!(self.phase, Phase::Ready(_) | Phase::Chip(_))
    }

    fn live(&self, api: &str) -> Result<&Live> {
        match &self.phase {
            Phase::Ready(live) if !live.engine.is_closed() => Ok(live),
            Phase::Chip(_) => Err(Error::state(format!(
                "Worker.{api}: an L2 (chip) Worker runs chip callables in-process; use run_callable"
            ))),
            Phase::New => {
                Err(Error::state(format!("Worker.{api}: the Worker is not initialized; call init() first")))
            }
            _ => Err(Error::state(format!("Worker.{api}: the Worker is closed"))),
        }
    }

    /// Registers a host function; returns the handle tasks use to name it.
    ///
    /// Before `init` the function goes into the snapshot every forked worker starts with.
    /// After `init` (only `fn`-pointer functions, see [`HostFn`]) it is sent to every live SUB
    /// worker, and this returns once all of them installed it; if one refuses, the others drop
    /// it again and nothing is registered. Registering the same function twice returns the
    /// same handle and counts a second reference; a different function under the name of a
    /// registered one is refused ([`ErrorKind::Callable`](crate::ErrorKind::Callable), naming
    /// both). The same rules hold before and after `init`: a Worker without SUB workers (an
    /// L2 Worker among them) refuses a host function
    /// ([`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)).
    ///
    /// Before `init` (nothing is forked):
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
    /// // Closures capture state; they must be registered before `init`.
    /// let bias = 0.5f32;
    /// let add_bias = worker.register(HostFn::closure("add_bias", move |args: &HostArgs<'_>| {
    ///     for v in args.output::<f32>(0)? {
    ///         *v += bias;
    ///     }
    ///     Ok(())
    /// }))?;
    /// assert_ne!(add_bias, negate_h);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    ///
    /// After `init`, a plain `fn` is sent to the live SUB workers; a closure is refused:
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
        let desc = f.descriptor().clone();
        let digest = desc.digest();
        let handle = CallableHandle::new(digest, CallableKind::HostFn, f.name());
        if matches!(self.phase, Phase::Closed) {
            return Err(Error::state("Worker.register: the Worker is closed"));
        }
        if let (Phase::Ready(_), Body::Closure(_)) = (&self.phase, f.body()) {
            return Err(Error::new(
                ErrorKind::Callable,
                format!(
                    "Worker.register: {handle} is a closure; closures can be registered only before init() (use HostFn::new with a fn)"
                ),
            ));
        }
        self.needs_target(CallableKind::HostFn, &handle)?;
        let context = |e: Error| e.context(format!("Worker.register of {handle}"));
        self.registry.check(digest, desc.bytes(), &f).map_err(context)?;
        if let (Phase::Ready(live), Body::Ptr(ptr)) = (&self.phase, f.body()) {
            let addr = crate::sys::fn_address::FnAddress::of(*ptr).to_wire();
            live.register_on(
                &self.targets(live, CallableKind::HostFn),
                |i| self.target_label(i),
                &digest,
                |mb| mb.post_control(CTRL_REGISTER_FN, addr, digest.as_bytes(), desc.bytes()),
            )
            .map_err(context)?;
        }
        self.registry.install(digest, desc.bytes(), f)?;
        self.record(&handle);
        Ok(handle)
    }

    /// Refuses a registration of `kind` that no worker of this Worker could run: the same rule
    /// before and after `init` (what a Worker has is fixed by its builder and `add_worker`).
    fn needs_target(&self, kind: CallableKind, handle: &CallableHandle) -> Result<()> {
        let missing = match kind {
            CallableKind::HostFn if self.cfg.level == Level::Chip => {
                "Worker.register: {handle} is a host function but an L2 (chip) Worker has no SUB workers"
            }
            CallableKind::HostFn if self.cfg.engine.sub_workers == 0 => {
                "Worker.register: {handle} is a host function but this Worker has no SUB workers"
            }
            CallableKind::Chip if !self.runs_chip_callables() => {
                if self.cfg.level > Level::Node {
                    "Worker.register_chip: {handle} is a chip callable but this Worker has no chips below it"
                } else {
                    "Worker.register_chip: {handle} is a chip callable but this Worker has no chips"
                }
            }
            _ => return Ok(()),
        };
        Err(Error::invalid(missing.replace("{handle}", &handle.to_string())))
    }

    /// Whether chip callables run here: an L2 Worker is a chip, an L3 Worker needs chips, and
    /// a Worker above L3 needs a nested Worker that runs them.
    fn runs_chip_callables(&self) -> bool {
        match self.cfg.level {
            Level::Chip => true,
            Level::Node => self.cfg.engine.next_level_workers > 0,
            _ if matches!(self.phase, Phase::New) => self.children.iter().any(Worker::runs_chip_callables),
            _ => self.nested_chips.contains(&true),
        }
    }

    /// The mailboxes that hold callables of `kind` on an initialized Worker: SUB workers hold
    /// host functions; chips hold chip callables (above L3, the nested Workers with chips below
    /// them pass them on); nested Workers hold orchestration functions.
    fn targets(&self, live: &Live, kind: CallableKind) -> Vec<usize> {
        let n_sub = self.cfg.engine.sub_workers;
        let n_next = live.engine.config().next_level_workers;
        match kind {
            CallableKind::HostFn => (0..n_sub).collect(),
            CallableKind::Chip if self.cfg.level > Level::Node => {
                (0..n_next).filter(|&j| self.nested_chips.get(j) == Some(&true)).map(|j| n_sub + j).collect()
            }
            _ => (n_sub..n_sub + n_next).collect(),
        }
    }

    /// How messages name the worker behind mailbox `i`.
    fn target_label(&self, i: usize) -> String {
        let n_sub = self.cfg.engine.sub_workers;
        match (i < n_sub, self.cfg.level > Level::Node) {
            (true, _) => format!("sub worker {i}"),
            (false, false) => format!("chip {}", i - n_sub),
            (false, true) => format!("worker {}", i - n_sub),
        }
    }

    /// Remembers a registered handle; on a live engine, submits may name it from now on.
    fn record(&mut self, handle: &CallableHandle) {
        self.handles.insert(handle.digest(), handle.clone());
        if let Phase::Ready(live) = &self.phase {
            live.engine.callables().write().insert(handle.digest(), handle.kind());
        }
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
        if matches!(self.phase, Phase::Closed) {
            return Err(Error::state("Worker.unregister: the Worker is closed"));
        }
        let digest = handle.digest();
        let kind = handle.kind();
        let known = match kind {
            CallableKind::HostFn => self.registry.contains(&digest),
            CallableKind::Chip => self.chip_registry.contains(&digest),
            CallableKind::Orch => self.orch_registry.contains(&digest),
        };
        if !known {
            return Err(Error::new(
                ErrorKind::Callable,
                format!("Worker.unregister: {handle} is not registered"),
            ));
        }
        match &self.phase {
            Phase::Ready(live) => {
                live.broadcast(
                    self.targets(live, kind),
                    |i| self.target_label(i),
                    |mb| mb.post_control(CTRL_UNREGISTER, 0, digest.as_bytes(), &[]),
                )
                .map_err(|e| e.context(format!("Worker.unregister of {handle}")))?;
            }
            // An L2 Worker's chip runs in this process.
            Phase::Chip(chip) => chip.release(&digest)?,
            _ => {}
        }
        let freed = match kind {
            CallableKind::HostFn => self.registry.release(&digest)?,
            CallableKind::Chip => self.chip_registry.release(&digest)?,
            CallableKind::Orch => self.orch_registry.release(&digest)?,
        };
        if freed {
            self.handles.remove(&digest);
            if let Phase::Ready(live) = &self.phase {
                live.engine.callables().write().remove(&digest);
            }
        }
        Ok(())
    }

    /// Starts the Worker: maps the heap rings and mailboxes, forks every SUB worker (before any
    /// engine thread exists), waits until each reports ready, then starts the engine.
    ///
    /// Host functions registered before this call are in every SUB worker from the start.
    /// Calling `init` twice, or after `close`, is an
    /// [`ErrorKind::InvalidState`](crate::ErrorKind::InvalidState) error; a child that fails
    /// or does not report ready within `startup_timeout` is an
    /// [`ErrorKind::WorkerDied`](crate::ErrorKind::WorkerDied) error (the others are reaped).
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
        let was_new = matches!(self.phase, Phase::New);
        let result = self.init_inner();
        if result.is_err() && was_new && self.cfg.level > Level::Node {
            // Its nested Workers went to their (now reaped) processes: like the upstream FAILED
            // state, a Worker whose startup failed can only be closed, not started again.
            self.phase = Phase::Closed;
        }
        result
    }

    fn init_inner(&mut self) -> Result<()> {
        match self.phase {
            Phase::New => {}
            Phase::Ready(_) | Phase::Chip(_) => return Err(Error::state("Worker.init: already initialized")),
            Phase::Closed => return Err(Error::state("Worker.init: the Worker is closed")),
        }
        let _span = tracing::debug_span!(target: "simpler::worker", "init", level = self.cfg.level.number())
            .entered();
        // Every #[callable] of the binary that this Worker can run, before anything forks.
        self.register_linked()?;
        if self.cfg.level == Level::Chip {
            // L2: the chip runs in this process; nothing is forked.
            let config = ChipConfig {
                spec: ChipSpec { chip_id: 0, memory_bytes: self.cfg.chip_memory, cores: self.cfg.chip_cores },
                backend: self.cfg.chip_backend.clone(),
            };
            let chip = l2::ChipLive::start(config, self.chip_registry.clone())?;
            self.phase = Phase::Chip(Box::new(chip));
            return Ok(());
        }
        let deadline = Instant::now() + self.cfg.startup_timeout;
        let nested = self.cfg.level > Level::Node;
        let mut engine_cfg = self.cfg.engine.clone();
        if nested {
            engine_cfg.next_level_workers = self.children.len();
            engine_cfg.next_level_kind = CallableKind::Orch;
        }
        let n_sub = engine_cfg.sub_workers;
        let n_chip = engine_cfg.next_level_workers;
        let region = Arc::new(MailboxRegion::new(n_sub + n_chip)?);
        let minter = Arc::new(IdentityMinter::new(random_u64()));
        let devices = Arc::new(chips::ChipBuffers::default());
        let parts = LevelParts {
            minter: minter.clone(),
            heap: Arc::new(HostRings::new(engine_cfg.heap_ring_size)?),
            devices: devices.clone(),
        };
        let engine = Engine::new(engine_cfg, Bell::Shared(Arc::new(RegionBell(region.clone()))), parts)?;
        let mut heaps: Vec<(u64, u64)> = engine.heap().spans();
        heaps.extend(self.extra_heaps.iter().copied());
        let label = |i: usize| match (i < n_sub, nested) {
            (true, _) => format!("sub worker {i}"),
            (false, false) => format!("chip {}", i - n_sub),
            (false, true) => format!("worker {}", i - n_sub),
        };
        // Chip callables registered here reach the chips below: hand them (one registration
        // per reference) to each nested Worker with chips below it before it starts, so they
        // are in its chips' startup snapshot.
        self.nested_chips = self.children.iter().map(Worker::runs_chip_callables).collect();
        for w in self.children.iter_mut().filter(|w| w.runs_chip_callables()) {
            for (digest, _, f) in self.chip_registry.iter() {
                for _ in 0..self.chip_registry.refs(digest) {
                    w.register_chip(f.clone())?;
                }
            }
        }
        let mut children = std::mem::take(&mut self.children).into_iter();

        // Fork order: every SUB child, then every chip child, all before any engine thread.
        let mut pids = Vec::with_capacity(n_sub + n_chip);
        let mut failure = None;
        for i in 0..n_sub + n_chip {
            let resolver = HostResolver::new(heaps.clone());
            let forked = if i < n_sub {
                let child =
                    SubChild { region: region.clone(), index: i, registry: self.registry.clone(), resolver };
                fork_child(move || child.run())
            } else if nested {
                let child = serve::nested::NestedChild {
                    region: region.clone(),
                    index: i,
                    id: (i - n_sub) as u32,
                    worker: children.next().expect("one Worker per nested lane"),
                    registry: self.orch_registry.clone(),
                    deadline,
                    heaps: heaps.clone(),
                };
                fork_child(move || child.run())
            } else {
                let config = ChipConfig {
                    spec: ChipSpec {
                        chip_id: (i - n_sub) as u32,
                        memory_bytes: self.cfg.chip_memory,
                        cores: self.cfg.chip_cores,
                    },
                    backend: self.cfg.chip_backend.clone(),
                };
                let child = ChipChild {
                    region: region.clone(),
                    index: i,
                    config,
                    registry: self.chip_registry.clone(),
                    resolver,
                };
                fork_child(move || child.run())
            };
            match forked {
                Ok(pid) => pids.push(pid),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let monitor = Monitor::start(pids.clone(), {
            let region = region.clone();
            move |_| region.doorbell().ring()
        });
        let monitor = match (monitor, failure) {
            (Ok(m), None) => m,
            (Ok(mut m), Some(e)) => {
                abort_children(&region, &mut m, &pids);
                return Err(e);
            }
            (Err(e), _) => {
                for &pid in &pids {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
                }
                return Err(e);
            }
        };
        let mut monitor = monitor;
        for (i, &pid) in pids.iter().enumerate() {
            let board = monitor.board.clone();
            let status = region.mailbox(i).wait_init(deadline, || board.exit_of(i).is_some());
            let who = label(i);
            let err = match status {
                InitStatus::Ready => continue,
                InitStatus::Failed(msg) => format!("{who} (process {pid}) failed to start: {msg}"),
                InitStatus::Pending => match monitor.board.exit_of(i) {
                    Some(how) => format!("{who} (process {pid}) {how} during startup"),
                    None => format!(
                        "{who} (process {pid}) did not report ready within the startup timeout of {:?}",
                        self.cfg.startup_timeout
                    ),
                },
            };
            abort_children(&region, &mut monitor, &pids);
            return Err(Error::new(ErrorKind::WorkerDied, format!("Worker.init: {err}")));
        }

        let lanes = (0..n_sub + n_chip)
            .map(|i| {
                let ep = MailboxEndpoint::new(region.clone(), i, pids[i], monitor.board.clone());
                let kind =
                    if i < n_sub { LaneKind::Sub(i as u32) } else { LaneKind::NextLevel((i - n_sub) as u32) };
                Lane::new(kind, Box::new(ep))
            })
            .collect();
        engine.attach_lanes(lanes);
        {
            let mut known = engine.callables().write();
            for (d, h) in &self.handles {
                known.insert(*d, h.kind());
            }
        }
        let engine = Arc::new(engine);
        let bg_engine = engine.clone();
        let background = match std::thread::Builder::new()
            .name("simpler-scheduler".into())
            .spawn(move || bg_engine.background_loop())
        {
            Ok(t) => t,
            Err(e) => {
                abort_children(&region, &mut monitor, &pids);
                return Err(Error::os("spawn scheduler thread", e));
            }
        };
        self.phase = Phase::Ready(Box::new(Live {
            engine,
            minter,
            devices,
            control_lock: std::sync::Mutex::new(()),
            region,
            pids,
            monitor,
            background: Some(background),
        }));
        tracing::debug!(target: "simpler::worker", sub_workers = n_sub, chips = n_chip, "worker ready");
        Ok(())
    }

    /// Creates a host buffer of `nbytes` in POSIX shared memory, visible to every worker.
    ///
    /// The buffer is unlinked when the last clone (and the last tensor made from it) drops.
    ///
    /// Needs an initialized Worker; `nbytes` must be greater than zero.
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
        let minter = match &self.phase {
            Phase::Chip(chip) => &chip.minter,
            _ => &self.live("create_buffer")?.minter,
        };
        if nbytes == 0 {
            return Err(Error::invalid("Worker.create_buffer: nbytes must be greater than zero"));
        }
        let identity = minter.mint()?;
        let name = ShmName::new(&format!(
            "sp-{:08x}-{}-b{}",
            identity.owner() as u32,
            std::process::id(),
            identity.buffer_id()
        ))?;
        let shm = PosixShm::create(&name, nbytes)?;
        Buffer::from_shm(identity, shm)
    }

    /// Calls `orch_fn` on this thread to build a run, closes its submission, and returns a
    /// handle without waiting. Building is serialized; while `pipeline_depth` runs are in
    /// flight this first waits for the oldest to finish.
    ///
    /// If `orch_fn` returns an error, every task of the run that has not started is failed,
    /// the run settles, and the error is returned. To pass the run arguments and a config, or
    /// to record its DAG, use [`submit_with`](Worker::submit_with).
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
        self.submit_inner(|o, _, _| orch_fn(o), RunOptions::new(), false).map(|(h, _)| h)
    }

    /// Like [`submit`](Worker::submit), with [`RunOptions`]: `orch_fn` receives the options'
    /// arguments and config (the signature of an [`OrchFn`](crate::OrchFn), so a plain
    /// orchestration function can be passed as is), and with
    /// [`capture_dag`](RunOptions::capture_dag) the run records its DAG ([`RunHandle::dag`]).
    ///
    /// ```no_run
    /// use simpler::{CallConfig, DataType, EdgeReason, HostArgs, HostFn, HostResult, Orchestrator};
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
        self.submit_inner(orch_fn, options, false).map(|(h, _)| h)
    }

    fn submit_inner<F>(
        &self,
        orch_fn: F,
        options: RunOptions,
        will_wait: bool,
    ) -> Result<(RunHandle, Option<crate::engine::WaiterIntent<'_>>)>
    where
        F: FnOnce(&mut Orchestrator<'_>, &TaskArgs, &CallConfig) -> Result<()>,
    {
        let live = self.live("submit")?;
        let RunOptions { args, config, capture } = options;
        config.validate()?;
        let eng = &live.engine;
        match eng.build_run(capture, will_wait, |orch| orch_fn(orch, &args, &config)) {
            Ok(built) => Ok((RunHandle { run: built.run, engine: eng.clone() }, built.intent)),
            Err(BuildFailed::Error(e)) => Err(e),
            Err(BuildFailed::Panic(panic)) => resume_unwind(panic),
        }
    }

    /// `submit` then `wait`: builds the run and drives it to completion on this thread.
    ///
    /// Returns the orchestration function's error, or else the run's first task error. With
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
    /// use simpler::{CallConfig, DataType, HostArgs, HostFn, HostResult, Orchestrator};
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
        let (handle, _intent) = self.submit_inner(orch_fn, options, true)?;
        handle.wait()
    }

    /// Shuts the Worker down: waits (up to `close_timeout`) for runs in flight, stops the
    /// engine, shuts every child down and reaps it. Idempotent; dropping a Worker closes it.
    ///
    /// A closed Worker cannot be initialized again; closing one that was never initialized
    /// forks nothing.
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
    pub fn close(&mut self) -> Result<()> {
        let phase = std::mem::replace(&mut self.phase, Phase::Closed);
        let mut live = match phase {
            Phase::Ready(live) => live,
            Phase::Chip(chip) => {
                chip.shutdown();
                return Ok(());
            }
            _ => return Ok(()),
        };
        let _span = tracing::debug_span!(target: "simpler::worker", "close").entered();
        let eng = live.engine.clone();
        eng.mark_closed();
        let deadline = Instant::now() + self.cfg.close_timeout;
        let mut abandoned = 0;
        for run in eng.live_runs() {
            if !eng.drive_until(|| run.is_done(), Some(deadline)) {
                abandoned += 1;
                run.abandon(Error::state(format!(
                    "run {} was abandoned: the Worker closed before it finished",
                    run.id
                )));
            }
        }
        eng.stop_background();
        if let Some(t) = live.background.take() {
            let _ = t.join();
        }
        abort_children(&live.region, &mut live.monitor, &live.pids);
        eng.shutdown_lanes();
        if abandoned > 0 {
            return Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "Worker.close: {abandoned} run(s) did not finish within {:?} and were abandoned",
                    self.cfg.close_timeout
                ),
            ));
        }
        Ok(())
    }
}

impl Live {
    /// Sends one control request to mailbox `i` and waits for the reply (serialized with every
    /// other control of this Worker).
    fn control(&self, i: usize, who: &str, post: impl Fn(Mailbox<'_>) -> Result<()>) -> Result<u64> {
        let _one_at_a_time = sync::lock(&self.control_lock);
        if let Some(how) = self.monitor.board.exit_of(i) {
            return Err(Error::new(
                ErrorKind::WorkerDied,
                format!("{who} is dead: the worker process {how}"),
            ));
        }
        let mb = self.region.mailbox(i);
        post(mb)?;
        let board = self.monitor.board.clone();
        match mb.wait_control_done(None, || board.exit_of(i).is_some()) {
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => Err(Error::new(ErrorKind::Callable, format!("{who} refused: {}", e.message))),
            None => Err(Error::new(ErrorKind::WorkerDied, format!("{who} died during the request"))),
        }
    }

    /// Sends one registration (`post`) of `digest` to every live child in `targets` and waits
    /// for each to install it: all or nothing. When one refuses (or dies), the ones that
    /// installed it drop it again before this returns the error, so no task can run it
    /// anywhere; one that cannot confirm that makes the error `REGISTER_CLEANUP_UNCERTAIN`.
    fn register_on(
        &self,
        targets: &[usize],
        label: impl Fn(usize) -> String,
        digest: &Digest,
        post: impl Fn(Mailbox<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut installed = Vec::with_capacity(targets.len());
        for &i in targets {
            if self.monitor.board.has_exited(i) {
                continue; // a dead worker can run nothing; it needs no copy
            }
            let err = match self.control(i, &label(i), &post) {
                Ok(_) => {
                    installed.push(i);
                    continue;
                }
                Err(e) => e,
            };
            let mut uncertain = Vec::new();
            for &j in installed.iter().rev() {
                let undo = self
                    .control(j, &label(j), |mb| mb.post_control(CTRL_UNREGISTER, 0, digest.as_bytes(), &[]));
                if let Err(u) = undo {
                    uncertain.push(u.message().to_string());
                }
            }
            let names = || installed.iter().map(|&j| label(j)).collect::<Vec<_>>().join(", ");
            let message = if !uncertain.is_empty() {
                format!(
                    "REGISTER_CLEANUP_UNCERTAIN: {}; it may still be installed where it could not be removed again: {}",
                    err.message(),
                    uncertain.join("; ")
                )
            } else if installed.is_empty() {
                err.message().to_string()
            } else {
                format!("{} (removed again from {}: registered nowhere)", err.message(), names())
            };
            return Err(Error::new(err.kind(), message));
        }
        Ok(())
    }

    /// Sends one control request to every live child in `targets` and waits for all replies.
    fn broadcast(
        &self,
        targets: impl IntoIterator<Item = usize>,
        label: impl Fn(usize) -> String,
        post: impl Fn(Mailbox<'_>) -> Result<()>,
    ) -> Result<()> {
        for i in targets {
            if self.monitor.board.has_exited(i) {
                continue; // a dead worker can run nothing; it needs no copy
            }
            self.control(i, &label(i), &post)?;
        }
        Ok(())
    }
}

/// Asks every child to shut down, waits briefly, kills stragglers, and reaps all of them.
fn abort_children(region: &MailboxRegion, monitor: &mut Monitor, pids: &[i32]) {
    for i in 0..pids.len() {
        region.mailbox(i).request_shutdown();
    }
    let all: Vec<usize> = (0..pids.len()).collect();
    if !monitor.board.wait_all(&all, Instant::now() + Duration::from_secs(5)) {
        monitor.kill_all();
        monitor.board.wait_all(&all, Instant::now() + Duration::from_secs(5));
    }
    monitor.stop();
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.close();
    }
}
