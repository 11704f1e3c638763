//! `WorkerBuilder`: a Worker's configuration, validated by `build`. `chip_backend` takes a
//! `ChipBackendFn`, a plain `fn(&ChipSpec) -> Result<Box<dyn ChipBackend>>` (default: `SimChip`),
//! so it can reach a chip process started by exec; `start_method` is `StartMethod::Exec` by
//! default, or `Fork` (see `start.rs`).

use std::time::Duration;

use crate::chip::{BackendFactory, ChipBackendFn};
use crate::engine::EngineConfig;
use crate::error::{Error, Result};
use crate::level::Level;
use crate::net::auth::ClusterKey;
use crate::worker::Worker;
use crate::worker::remote::RemoteWorker;
use crate::worker::remote::launch::Launch;
use crate::worker::start::StartMethod;

/// Configures a [`Worker`]. Construction never forks or maps anything; `init` does.
///
/// ```
/// use std::time::Duration;
/// use simpler::{status::Level, Worker};
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
#[derive(Debug)]
pub struct WorkerBuilder {
    cfg: Config,
    /// The nested and remote Workers, in the order added (their worker ids follow it).
    added: Vec<Added>,
    /// The first thing an adding method refused (returned by `build`).
    refused: Option<Error>,
}

/// A Worker added to a builder, attached by `build` in the order added.
#[derive(Debug)]
enum Added {
    Nested(Box<Worker>),
    /// A remote L3 Worker and the name its messages use (its address, or its launch rank).
    Remote(RemoteWorker, String),
}

/// A Worker's configuration: what the builder sets, kept by the Worker (and sent to a nested
/// Worker's process).
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(super) level: Level,
    pub(super) engine: EngineConfig,
    pub(super) chip_memory: u64,
    pub(super) chip_cores: usize,
    pub(super) chip_backend: BackendFactory,
    /// Bytes per device heap ring on each chip (`None`: `chip_memory / 64`).
    pub(super) chip_heap_ring_size: Option<u64>,
    /// Test hook: a nested Worker's process waits this long before starting (to exercise the
    /// startup deadline).
    pub(super) startup_delay: Duration,
    pub(super) startup_timeout: Duration,
    pub(super) close_timeout: Duration,
    /// How the children start.
    pub(super) start: StartMethod,
    /// Whether each submit first replaces dead SUB workers and chips.
    pub(super) replace_dead: bool,
    /// Whether SUB worker `i` is bound to the `i`-th usable CPU.
    pub(super) bind_sub_workers: bool,
    /// The deadline of every run submitted without one of its own (`None`: no deadline).
    pub(super) run_deadline: Option<Duration>,
    /// Whether `pipeline_depth` was set (then chips that grant less fail `init`).
    pub(super) explicit_depth: bool,
}

impl Config {
    /// Bytes per device heap ring on each chip (see `WorkerBuilder::chip_heap_ring_size`).
    pub(super) fn chip_heap_ring(&self) -> u64 {
        self.chip_heap_ring_size.unwrap_or(self.chip_memory / 64 / 1024 * 1024)
    }

    /// The defaults [`Worker::builder`] starts from.
    pub(super) fn defaults() -> Config {
        Config {
            level: Level::Node,
            engine: EngineConfig::default(),
            chip_memory: 1 << 30,
            chip_cores: 4,
            chip_backend: BackendFactory::sim(),
            chip_heap_ring_size: None,
            startup_delay: Duration::ZERO,
            startup_timeout: Duration::from_secs(300),
            close_timeout: Duration::from_secs(10),
            start: StartMethod::Exec,
            replace_dead: false,
            bind_sub_workers: false,
            explicit_depth: false,
            run_deadline: None,
        }
    }
}

impl WorkerBuilder {
    /// A builder of the configuration `cfg`, with no Workers added.
    pub(super) fn of(cfg: Config) -> WorkerBuilder {
        WorkerBuilder { cfg, added: Vec::new(), refused: None }
    }

    /// The level this Worker runs at (default [`Level::Node`], L3).
    ///
    /// * [`Level::Chip`] (L2): one simulated chip in this process; run chip callables with
    ///   [`Worker::run_callable`].
    /// * [`Level::Node`] (L3): SUB workers and chips, each in a process of its own.
    /// * [`Level::Network1`] and up (L4+): Workers one level down, added with
    ///   [`WorkerBuilder::worker`], each in a process of its own.
    ///
    /// ```
    /// use simpler::{ErrorKind, status::Level, Worker};
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
        self.cfg.level = level;
        self
    }

    /// Number of simulated chips, each in its own process (default 0). Chips are the
    /// NEXT_LEVEL workers of an L3 Worker, with worker ids `0..n`.
    ///
    /// ```
    /// let worker = simpler::Worker::builder().chips(2).build().unwrap();
    /// assert_eq!(worker.chips(), 2);
    /// ```
    pub fn chips(mut self, n: usize) -> Self {
        self.cfg.engine.next_level_workers = n;
        self
    }

    /// Device memory of each simulated chip in bytes (default 1 GiB, backed on first touch).
    ///
    /// ```
    /// let worker = simpler::Worker::builder().chips(1).chip_memory(64 << 20).build().unwrap();
    /// # drop(worker);
    /// ```
    pub fn chip_memory(mut self, bytes: u64) -> Self {
        self.cfg.chip_memory = bytes;
        self
    }

    /// Simulated cores (threads) per chip (default 4).
    ///
    /// ```
    /// let worker = simpler::Worker::builder().chips(1).chip_cores(8).build().unwrap();
    /// # drop(worker);
    /// ```
    pub fn chip_cores(mut self, n: usize) -> Self {
        self.cfg.chip_cores = n;
        self
    }

    /// How each chip's device is made (default: a [`SimChip`](crate::chip::SimChip) of `chip_memory`
    /// bytes and `chip_cores` cores). The factory runs in the process that drives the chip (a
    /// chip child started at `init` at L3, the calling process at L2), once per chip, with that
    /// chip's [`ChipSpec`](crate::chip::ChipSpec); its error fails `init`, naming the chip. Every
    /// device operation of the chip (allocation, frees, copies in both directions) then goes
    /// through the [`ChipBackend`](crate::chip::ChipBackend) it returns.
    ///
    /// The factory is a [`ChipBackendFn`](crate::chip::ChipBackendFn): a plain `fn`, or a closure
    /// that captures nothing, since at L3 it runs in a chip process started from this program's
    /// binary (state it needs comes from statics, the environment or the spec).
    ///
    /// ```
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use simpler::{chip::ChipBackend, chip::ChipSpec, chip::DeviceMemory, status::Level, chip::SimChip, Worker};
    ///
    /// static COPIED_IN: AtomicUsize = AtomicUsize::new(0);
    ///
    /// /// A SimChip that counts the bytes copied to it.
    /// struct Counting {
    ///     sim: SimChip,
    /// }
    ///
    /// impl ChipBackend for Counting {
    ///     fn cores(&self) -> usize {
    ///         self.sim.cores()
    ///     }
    ///     fn host_memory(&self) -> Option<&DeviceMemory> {
    ///         self.sim.host_memory()
    ///     }
    ///     fn copy_to_device(&self, dst: u64, src: &[u8]) -> simpler::Result<()> {
    ///         COPIED_IN.fetch_add(src.len(), Ordering::Relaxed);
    ///         self.sim.copy_to_device(dst, src)
    ///     }
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut chip = Worker::builder()
    ///     .level(Level::Chip)
    ///     .chip_memory(1 << 20)
    ///     .chip_backend(|spec: &ChipSpec| {
    ///         let sim = SimChip::new(spec.memory_bytes(), spec.cores())?;
    ///         Ok(Box::new(Counting { sim }) as Box<dyn ChipBackend>)
    ///     })
    ///     .build()?;
    /// chip.init()?;
    /// let dev = chip.alloc_child_tensor(0, &[16], simpler::DataType::Float32)?;
    /// let host = chip.create_buffer(64)?;
    /// chip.copy_to(&dev, &host)?;
    /// assert_eq!(COPIED_IN.load(Ordering::Relaxed), 64);
    /// chip.free(&dev)?;
    /// chip.close()
    /// # }
    /// ```
    pub fn chip_backend(mut self, factory: ChipBackendFn) -> Self {
        self.cfg.chip_backend = BackendFactory::Fn(factory);
        self
    }

    /// Number of SUB worker processes that run host functions (default 0).
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
        self.cfg.engine.sub_workers = n;
        self
    }

    /// Whether SUB worker `i` runs only on the `i`-th CPU (modulo their count) of those the
    /// thread calling `init` may use (default `false`: the kernel places the workers). A
    /// replacement keeps its worker's CPU.
    ///
    /// On a machine this program has to itself, binding keeps two busy workers from sharing
    /// one CPU while another idles: on 2 vCPUs a Task Bench step of two tasks otherwise takes
    /// twice as long in some runs (StarPU and Open MPI bind their workers by default for the
    /// same reason). Leave it off where other busy programs, or other bound Workers of this
    /// program, share the CPUs: a bound worker cannot move away from them. Leave it off too for
    /// host functions that start threads or processes (a thread pool, a BLAS library): they
    /// inherit the worker's one CPU, and `available_parallelism` says 1 there. A worker that
    /// cannot be bound fails `init` (or its replacement), naming the CPU and why.
    ///
    /// ```
    /// use simpler::Worker;
    ///
    /// // A Task Bench-like program that has the machine: one bound worker per CPU.
    /// let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    /// let mut worker = Worker::builder().sub_workers(cpus).bind_sub_workers(true).build()?;
    /// worker.init()?;
    /// worker.close()?;
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn bind_sub_workers(mut self, bind: bool) -> Self {
        self.cfg.bind_sub_workers = bind;
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
        self.cfg.engine.heap_ring_size = bytes;
        self
    }

    /// Bytes per device heap ring on each chip of an L3 Worker, for
    /// [`Orchestrator::alloc_on`](crate::Orchestrator::alloc_on) and the `alloc`s of a
    /// `task_graph!` that only one chip's kernels use (default `chip_memory / 64`: four rings,
    /// one per scope depth, take a sixteenth of each chip's memory, allocated at `init`; 0 turns
    /// device intermediates off, and they come from the host heap).
    ///
    /// ```
    /// use simpler::Worker;
    /// let worker = Worker::builder().chips(2).chip_memory(256 << 20).chip_heap_ring_size(8 << 20).build()?;
    /// # drop(worker);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn chip_heap_ring_size(mut self, bytes: u64) -> Self {
        self.cfg.chip_heap_ring_size = Some(bytes);
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
        self.cfg.engine.task_window = n;
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
    ///
    /// On a Worker with chips this is also the depth asked of every chip (a simulated chip
    /// grants at most 2: one run executing and one prepared). An explicit `pipeline_depth` above
    /// what a chip grants fails [`Worker::init`](crate::Worker::init) with an error naming both
    /// numbers; to let more runs wait, use [`pending_run_depth`](Self::pending_run_depth).
    /// Nested and remote Workers grant no depth of their own: a Worker over them takes any.
    pub fn pipeline_depth(mut self, n: usize) -> Self {
        self.cfg.engine.pipeline_depth = n;
        self.cfg.explicit_depth = true;
        self
    }

    /// How many runs may be admitted at once, waiting in the run FIFO (one executing, the rest
    /// built and waiting), apart from how many hold per-run resources
    /// ([`pipeline_depth`](Self::pipeline_depth)). 0, the default, means `pipeline_depth`.
    /// Further `submit`s wait for the oldest run to finish (by default for as long as it takes;
    /// see [`submit_timeout`](Self::submit_timeout)).
    ///
    /// ```
    /// use simpler::Worker;
    ///
    /// // Eight runs may be built ahead while chips hold resources for two at most.
    /// let worker = Worker::builder().chips(1).pending_run_depth(8).build()?;
    /// # drop(worker);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn pending_run_depth(mut self, n: usize) -> Self {
        self.cfg.engine.pending_run_depth = n;
        self
    }

    /// How long a full task window or heap ring waits before the submit fails (default 10 s).
    /// (How long `Worker::submit` waits for room among the admitted runs is
    /// [`submit_timeout`](Self::submit_timeout).)
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
        self.cfg.engine.backpressure_timeout = t;
        self
    }

    /// How long `Worker::submit` (and `run`) waits for room when `pending_run_depth` runs are
    /// admitted (default `Duration::MAX`: until a run finishes, however long, as upstream's
    /// back-pressure does). A run's own deadline ([`RunOptions::deadline`](crate::RunOptions::deadline),
    /// [`run_deadline`](Self::run_deadline)) bounds the wait too. Past either, the submit fails
    /// with an [`ErrorKind::Timeout`](crate::ErrorKind::Timeout) error naming the run ahead.
    ///
    /// ```
    /// use std::time::Duration;
    /// use simpler::Worker;
    ///
    /// // A service that would rather refuse a request than queue it for more than 2 s.
    /// let worker = Worker::builder().sub_workers(2).submit_timeout(Duration::from_secs(2)).build()?;
    /// # drop(worker);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn submit_timeout(mut self, t: Duration) -> Self {
        self.cfg.engine.submit_timeout = t;
        self
    }

    /// One deadline for starting every child process (default 300 s).
    ///
    /// `init` fails with [`ErrorKind::WorkerDied`](crate::ErrorKind::WorkerDied) when a child
    /// has not reported ready by then: it (and every other child that has not) is killed at
    /// once, and the error names it. Must be greater than zero.
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
        self.cfg.startup_timeout = t;
        self
    }

    /// How long `close` waits for runs in flight before abandoning them (default 10 s).
    ///
    /// When it abandons any, `close` still shuts everything down and then returns an error of
    /// kind [`ErrorKind::Timeout`](crate::ErrorKind::Timeout).
    ///
    /// This bounds the whole `close`: a worker still busy at the deadline (a task that never
    /// returns) is killed with `SIGKILL` rather than waited for, so `close` returns within
    /// `close_timeout` plus at most 1.1 s (0.1 s for idle workers to exit on their own, then up
    /// to 1 s for the kernel to reap the killed ones; usually a few milliseconds). In a program
    /// that adopts orphans (a child subreaper), a process of a worker's process group that
    /// `SIGKILL` cannot end (one of another user) adds up to 1 s more while the Worker waits
    /// to reap it.
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
        self.cfg.close_timeout = t;
        self
    }

    /// How `init` starts the child processes (default [`StartMethod::Exec`]: a new process of
    /// this binary per child, safe whatever other threads run). See [`StartMethod`] for what
    /// each method lets reach the children.
    ///
    /// ```
    /// use simpler::{HostArgs, HostFn, StartMethod, Worker};
    ///
    /// // A closure reaches SUB workers only by fork, and only before other threads exist.
    /// let bias = 2.0f32;
    /// let mut worker = Worker::builder().sub_workers(1).start_method(StartMethod::Fork).build()?;
    /// worker.register(HostFn::closure("add_bias", move |args: &HostArgs<'_>| {
    ///     let mut out = args.output::<f32>(0)?;
    ///     out.iter_mut().for_each(|x| *x += bias);
    ///     Ok(())
    /// }))?;
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn start_method(mut self, method: StartMethod) -> Self {
        self.cfg.start = method;
        self
    }

    /// Whether every `submit` (and `run`) first replaces the SUB workers and chips that died
    /// (default `false`: a dead worker stays out of service until
    /// [`Worker::replace_worker`](crate::Worker::replace_worker) or
    /// [`Worker::replace_dead_workers`](crate::Worker::replace_dead_workers)). A replacement
    /// that fails is logged and the run goes on without that worker. Needs
    /// [`StartMethod::Exec`], the default.
    ///
    /// ```
    /// let worker = simpler::Worker::builder().sub_workers(4).replace_dead_workers(true).build()?;
    /// # drop(worker);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn replace_dead_workers(mut self, replace: bool) -> Self {
        self.cfg.replace_dead = replace;
        self
    }

    /// A deadline for every run of this Worker that sets none of its own (default: none).
    ///
    /// A run still running `limit` after its submit is stopped and fails with an
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout) error naming the tasks still running,
    /// their callables, their workers and the deadline; the workers running them are killed and
    /// leave service (see [`RunOptions::deadline`](crate::RunOptions::deadline), which overrides
    /// this per run). Must be greater than zero. An L2 (chip) Worker has no runs: this does not
    /// apply to [`Worker::run_callable`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use simpler::{ErrorKind, Worker};
    ///
    /// let worker = Worker::builder().sub_workers(2).run_deadline(Duration::from_secs(30)).build()?;
    /// # drop(worker);
    /// let err = Worker::builder().run_deadline(Duration::ZERO).build().unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn run_deadline(mut self, limit: Duration) -> Self {
        self.cfg.run_deadline = Some(limit);
        self
    }

    /// Adds a Worker one level down as a NEXT_LEVEL worker of this one (L4 and up). Worker ids
    /// follow the order added: nested Workers get `0, 1, ...`, and remote Workers
    /// ([`remote_worker`](WorkerBuilder::remote_worker)) the ids after theirs, so every nested
    /// Worker must be added before the first remote one (`build` refuses otherwise).
    ///
    /// The child is built but not initialized: register its callables on it first; the
    /// parent's `init` starts one process per child, in which the child starts its own subtree.
    /// `build` refuses a child of the wrong level, a child that was initialized, and children
    /// on an L3 (or L2) Worker, which takes chips and SUB workers instead.
    ///
    /// ```
    /// use simpler::{status::Level, ErrorKind, Worker};
    /// let l3 = Worker::builder().sub_workers(1).build()?;
    /// let l4 = Worker::builder().level(Level::Network1).worker(l3).build()?;
    /// assert_eq!(l4.nested_workers(), 1); // worker id 0
    /// // An L3 Worker takes chips, not Workers:
    /// let err = Worker::builder().worker(Worker::builder().build()?).build().unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn worker(mut self, child: Worker) -> Self {
        self.added.push(Added::Nested(Box::new(child)));
        self
    }

    /// Adds a remote L3 Worker (L4): a node on another host, or another process of this one,
    /// started in the node role ([`Node`](crate::remote::Node)). Its worker id follows the nested
    /// Workers' ids ([`worker`](WorkerBuilder::worker)), in the order added.
    ///
    /// `init` connects to it and authenticates with the cluster key; the node must run every
    /// orchestration function registered here (the same program registers the same ones in
    /// both roles), or `init` fails naming the function and the node. Tasks reach it like a
    /// nested Worker's (`submit_next_level(.., id)`): their tensors' bytes travel with the task
    /// and what the task writes comes back with its completion. A node that dies, closes its
    /// session or stays silent past its health timeout fails its task naming its address, and
    /// leaves service. `build` refuses a health timeout under twice the node's heartbeat, and
    /// remote Workers on anything but an L4 Worker.
    ///
    /// ```
    /// use simpler::remote::{ClusterKey, NodeAddr, RemoteWorker};
    /// use simpler::{status::Level, ErrorKind, Worker};
    ///
    /// let key = ClusterKey::new([9u8; 32])?;
    /// let l4 = Worker::builder()
    ///     .level(Level::Network1)
    ///     .worker(Worker::builder().sub_workers(1).build()?) // worker 0: local
    ///     .remote_worker(RemoteWorker::new(NodeAddr::loopback(7411), key.clone())) // worker 1
    ///     .build()?;
    /// assert_eq!((l4.nested_workers(), l4.remote_workers()), (1, 1));
    ///
    /// let l3 = Worker::builder().remote_worker(RemoteWorker::new(NodeAddr::loopback(7411), key));
    /// assert_eq!(l3.build().unwrap_err().kind(), ErrorKind::InvalidArgument);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn remote_worker(mut self, node: RemoteWorker) -> Self {
        let name = node.addr.to_string();
        self.added.push(Added::Remote(node, name));
        self
    }

    /// Adds the nodes of a launched job (`mpirun`, `srun`) as remote L3 Workers (L4, on rank
    /// 0): one per rank from 1 to `launch.size() - 1`, in rank order, with the worker ids after
    /// those added before. `init` listens at `launch.root()`, waits for every rank to connect
    /// and authenticate (within the default connect timeout of 10 s, counted from `init`), and
    /// then runs as with [`remote_worker`](WorkerBuilder::remote_worker). On any other rank
    /// (a node), `build` refuses.
    ///
    /// ```
    /// use simpler::remote::{ClusterKey, Launch, NodeAddr};
    /// use simpler::{status::Level, Worker};
    ///
    /// let launch = Launch::new(0, 3, NodeAddr::loopback(7510))?;
    /// let l4 = Worker::builder()
    ///     .level(Level::Network1)
    ///     .launched_workers(&launch, ClusterKey::new([3u8; 16])?)
    ///     .build()?;
    /// assert_eq!(l4.remote_workers(), 2); // worker ids 0 and 1
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn launched_workers(mut self, launch: &Launch, key: ClusterKey) -> Self {
        if !launch.is_root() {
            self.refused.get_or_insert_with(|| {
                Error::invalid(format!(
                    "WorkerBuilder::launched_workers: rank {} is a node; only rank 0 (the root) adds the others",
                    launch.rank()
                ))
            });
            return self;
        }
        for rank in 1..launch.size() {
            let mut node = RemoteWorker::new(launch.root().clone(), key.clone());
            node.launch_rank = Some(rank);
            self.added.push(Added::Remote(node, format!("rank {rank}")));
        }
        self
    }

    /// A remote Worker under the name its messages use (a nested Worker's start spec).
    pub(super) fn named_remote_worker(mut self, node: RemoteWorker, name: String) -> Self {
        self.added.push(Added::Remote(node, name));
        self
    }

    #[doc(hidden)]
    /// Test hook: when this Worker runs nested under a parent, its process waits `delay`
    /// before it starts its own children (to exercise the parent's startup deadline).
    pub fn __startup_delay(mut self, delay: Duration) -> Self {
        self.cfg.startup_delay = delay;
        self
    }

    /// Validates the configuration and returns an uninitialized Worker.
    ///
    /// # Errors
    ///
    /// An [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error for a level
    /// other than [`Level::Node`], a `task_window` or `pipeline_depth` of 0, or a zero
    /// `startup_timeout` or `run_deadline`.
    ///
    /// ```
    /// use simpler::{ErrorKind, Worker};
    ///
    /// let worker = Worker::builder().sub_workers(2).build()?;
    /// // Nothing is started or mapped yet: that is `init`'s job.
    /// assert!(!worker.is_ready());
    /// assert!(worker.child_pids().is_empty());
    /// drop(worker); // dropping an uninitialized Worker does nothing
    ///
    /// let err = Worker::builder().task_window(0).build().unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn build(self) -> Result<Worker> {
        if self.cfg.level == Level::Chip
            && (self.cfg.engine.sub_workers > 0 || self.cfg.engine.next_level_workers > 0)
        {
            return Err(Error::invalid(
                "an L2 (chip) Worker is one chip run in-process: it has no SUB workers and no chips of its own",
            ));
        }
        if self.cfg.level == Level::Chip && self.cfg.chip_cores == 0 {
            return Err(Error::invalid("chip_cores must be at least 1"));
        }
        if self.cfg.level > Level::Node && self.cfg.engine.next_level_workers > 0 {
            return Err(Error::invalid(format!(
                "an {} Worker has no chips of its own: its NEXT_LEVEL workers are Workers one level down (WorkerBuilder::worker)",
                self.cfg.level
            )));
        }
        if self.cfg.engine.task_window == 0 {
            return Err(Error::invalid("task_window must be at least 1"));
        }
        if self.cfg.engine.pipeline_depth == 0 {
            return Err(Error::invalid("pipeline_depth must be at least 1"));
        }
        if self.cfg.startup_timeout.is_zero() {
            return Err(Error::invalid("startup_timeout must be greater than zero"));
        }
        if self.cfg.run_deadline.is_some_and(|d| d.is_zero()) {
            return Err(Error::invalid("run_deadline must be greater than zero"));
        }
        if self.cfg.engine.next_level_workers > 0 && self.cfg.chip_cores == 0 {
            return Err(Error::invalid("chip_cores must be at least 1"));
        }
        if let Some(refused) = self.refused {
            return Err(refused);
        }
        let mut worker = Worker::new(self.cfg);
        for added in self.added {
            match added {
                Added::Nested(child) => worker.attach_nested(*child)?,
                Added::Remote(node, name) => worker.attach_remote(node, name)?,
            }
        }
        Ok(worker)
    }
}
