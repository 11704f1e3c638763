//! One level's engine: Orchestrator, Scheduler and the lanes to its workers.
//!
//! The engine is the same at every level. It talks to its workers only through the
//! [`Endpoint`](endpoint::Endpoint) trait; it never names a mailbox or a process.
//!
//! # The scheduler role
//!
//! The Scheduler is a role, not a thread: whoever holds the `sched` mutex runs the loop
//! (drain completions, then dispatch). A thread that waits — on a run
//! ([`RunHandle::wait`](run::RunHandle::wait)), on ring back-pressure, on pipeline admission —
//! takes the role and drives until its condition holds ([`Engine::drive_until`]). A background
//! thread holds the role only while work is outstanding and nobody waits, or for one pass when a
//! run is due to be stopped (its deadline passed, or a cancel waits). Every driver's sleep is
//! bounded by the next such moment ([`Engine::next_check`]). The rules:
//!
//! 1. Only the role holder touches the scheduler's queues and lanes.
//! 2. Anything that makes work for the scheduler (a published READY task, a child's completion, a
//!    child's death) rings the engine doorbell; the holder sleeps on it only after a pass that
//!    made no progress (spin, yield, then futex: never a fixed sleep). A watched endpoint (a
//!    remote worker) is the exception while the holder keeps checking: the holder also checks
//!    its `ready` hint, and tells it (`unwatched`) before it sleeps, after which it rings too.
//! 3. A thread that wants the role and cannot take it announces itself
//!    ([`RoleState::announce`], through a [`WaiterIntent`]) and rings the doorbell; the background
//!    holder gives the role up at its next wake. Every release of the role and every finished run
//!    rings `events`, on which such threads sleep. The role is held through a [`Role`] guard and
//!    the announcement through the intent: both are given up by dropping them, never by hand, so
//!    every way out (a return, a panic) gives them up and applies rule 4.
//! 4. When the role is released or an announcement withdrawn with work outstanding and nobody
//!    holding or wanting the role, or when work is published while nobody holds it, `bg_bell`
//!    wakes the background thread. Both sides use sequentially consistent operations (publish,
//!    then check the holder; release or withdraw, then check the work), so one of them always
//!    sees the other. The background thread sleeps on `bg_bell` alone, which completions do not
//!    ring (they ring the doorbell), so a missed wake-up here is a run nobody drives: a waiter
//!    that announced itself, found its run done and left by decrementing the count of waiters by
//!    hand (without the check) left a later run, which nobody waited on, stalled for ever. The
//!    flags and these checks are [`RoleState`]'s (`engine/role.rs`), whose `loom` models race
//!    the hand-off, the take and release, and the withdrawal.
//! 5. A panic ends runs, never the role or a waiter's wait. It is contained where it happens: an
//!    endpoint's `start` or `poll` that panics fails its task with an [`ErrorKind::Internal`]
//!    error and takes its lane out of service (what the worker does is unknown from then on); a
//!    panic while completing a task fails that task's run (the task is completed again as failed
//!    when the panic came before it changed, else the run is abandoned: it ends and leaves the
//!    FIFO at once, and what the panic cut off stays allocated); any other panic in a pass fails
//!    every live run. Each error names the run, the task and where it panicked. The engine stays
//!    usable, the background thread lives on, and the role is given up (rule 3).

pub(crate) mod endpoint;
pub(crate) mod heap;
pub(crate) mod lease;
pub(crate) mod orch_fn;
pub(crate) mod orchestrator;
pub(crate) mod ring;
mod role;
pub(crate) mod run;
pub(crate) mod scheduler;
pub(crate) mod slot;
pub(crate) mod tensor_map;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::callable::identity::CallableHandle;
use crate::callable::identity::{CallableKind, Digest};
use crate::data::buffer::{Identity, IdentityMinter};
use crate::dfx::timeline::TaskEvent;
use crate::engine::heap::IntermediateHeap;
use crate::engine::orchestrator::{OrchBuffers, Orchestrator};
use crate::engine::ring::TaskWindow;
use crate::engine::role::RoleState;
use crate::engine::run::{RunState, StopCause};
use crate::engine::scheduler::Scheduler;
use crate::engine::slot::{Slot, State};
use crate::engine::tensor_map::TensorMap;
use crate::error::{Error, ErrorKind, Result};
use crate::sys::futex::Doorbell;
use crate::sys::sync;
use crate::sys::sync::checked;

/// With every worker busy, a submit runs an inline scheduler pass only once per this many
/// READY publications.
const INLINE_PASS_EVERY: usize = 16;

/// Sizing and limits of one engine.
#[derive(Debug, Clone)]
pub(crate) struct EngineConfig {
    /// Live slots at most (submitted, not yet consumed).
    pub(crate) task_window: usize,
    /// Bytes per heap ring (0 disables `orch.alloc`).
    pub(crate) heap_ring_size: u64,
    /// Runs that may hold per-run resources at once (the lease grant); also the admission
    /// bound when `pending_run_depth` is 0.
    pub(crate) pipeline_depth: usize,
    /// Runs admitted at once (non-terminal runs in the FIFO: one executing, the rest built and
    /// waiting); 0: `pipeline_depth`.
    pub(crate) pending_run_depth: usize,
    /// How long a full task window or heap ring waits before failing.
    pub(crate) backpressure_timeout: Duration,
    /// Number of NEXT_LEVEL workers (ids 0..n).
    pub(crate) next_level_workers: usize,
    /// Number of SUB workers.
    pub(crate) sub_workers: usize,
    /// The kind of callable NEXT_LEVEL workers run (chips run chip callables, nested Workers
    /// run orchestration functions).
    pub(crate) next_level_kind: CallableKind,
    /// How messages name one NEXT_LEVEL worker ("chip", "nested Worker", "core") and the call
    /// that adds them ("WorkerBuilder::chips(n)", ...).
    pub(crate) next_level_names: (&'static str, &'static str),
    /// The most bytes one member's encoded `TaskArgs` may take (the mailbox a task crosses);
    /// `None` when tasks never leave the process.
    pub(crate) args_capacity: Option<usize>,
    /// The owner nonces whose buffers this engine's tasks may name: the Worker's own and its
    /// ancestors' (a `Buffer` belongs to the Worker that created it). `None`: any (engines
    /// whose tensors come from their parent, such as a chip's).
    pub(crate) owners: Option<Vec<u64>>,
    /// The level of the Worker this engine schedules for (task records name it).
    pub(crate) level: crate::level::Level,
}

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        EngineConfig {
            task_window: 65536,
            heap_ring_size: 1 << 30,
            pipeline_depth: 2,
            pending_run_depth: 0,
            backpressure_timeout: Duration::from_secs(10),
            next_level_workers: 0,
            sub_workers: 0,
            next_level_kind: CallableKind::Chip,
            next_level_names: ("NEXT_LEVEL worker", "the level's builder"),
            args_capacity: None,
            owners: None,
            level: crate::level::Level::Node,
        }
    }
}

/// Where the engine doorbell lives: in the shared mailbox region (children ring it), or
/// wherever an in-process engine keeps it.
pub(crate) enum Bell {
    Shared(Arc<dyn AsRef<Doorbell> + Send + Sync>),
}

impl Bell {
    fn get(&self) -> &Doorbell {
        match self {
            Bell::Shared(r) => (**r).as_ref(),
        }
    }
}

/// A thread waiting for room in the task window or a heap ring (see `Engine::consume`).
pub(crate) struct CapacityWait<'a> {
    eng: &'a Engine,
}

impl<'a> CapacityWait<'a> {
    pub(crate) fn new(eng: &'a Engine) -> CapacityWait<'a> {
        eng.capacity_waiters.fetch_add(1, Ordering::SeqCst);
        CapacityWait { eng }
    }
}

impl Drop for CapacityWait<'_> {
    fn drop(&mut self) {
        self.eng.capacity_waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

/// See [`Engine::announce_waiter`].
pub(crate) struct WaiterIntent<'a> {
    eng: &'a Engine,
}

impl Drop for WaiterIntent<'_> {
    fn drop(&mut self) {
        if self.eng.role.withdraw(|| self.eng.outstanding()) {
            self.eng.wake_background();
        }
    }
}

/// The scheduler role, held (rule 1): the `sched` lock flagged held in `role`, taken by
/// [`Engine::try_role`]. Dropping it gives the role up (rule 3) — on every way out, a panic's
/// unwinding included (rule 5): the flag is cleared while the lock is still held, so it can never
/// overwrite the flag of a thread that took the role right after; then `events` rings and the
/// background thread is woken if work is left and nobody else drives (rule 4).
pub(crate) struct Role<'a> {
    eng: &'a Engine,
    /// `Some` until the drop.
    sched: Option<checked::MutexGuard<'a, Scheduler>>,
}

impl std::ops::Deref for Role<'_> {
    type Target = Scheduler;
    fn deref(&self) -> &Scheduler {
        self.sched.as_ref().expect("the role is held until it drops")
    }
}

impl std::ops::DerefMut for Role<'_> {
    fn deref_mut(&mut self) -> &mut Scheduler {
        self.sched.as_mut().expect("the role is held until it drops")
    }
}

impl Role<'_> {
    /// One scheduler pass (see [`Scheduler::pass`]); returns whether anything happened. A panic
    /// that escapes the pass is caught here and fails every live run (rule 5); that counts as
    /// progress when it ended a run (a pass that panics every time then waits for the doorbell
    /// like one that did nothing, instead of spinning).
    pub(crate) fn pass(&mut self) -> bool {
        let eng = self.eng;
        let sched = self.sched.as_mut().expect("the role is held until it drops");
        match catch_unwind(AssertUnwindSafe(|| sched.pass(eng))) {
            Ok(progressed) => progressed,
            Err(panic) => {
                let msg = crate::error::panic_message(&*panic);
                tracing::error!(target: "simpler::scheduler", "the scheduler panicked during a pass: {msg}; every live run fails");
                sched.recover(eng, &msg)
            }
        }
    }
}

impl Drop for Role<'_> {
    fn drop(&mut self) {
        if let Some(sched) = self.sched.take() {
            self.eng.role.release(sched);
        }
        self.eng.events.ring();
        self.eng.wake_background_if_needed();
    }
}

/// A hook the engine calls at its fault points (tests only): `phase` names the point
/// (`"complete"`: `Engine::complete` is entered for a slot; `"dispatch"`: a pass starts
/// dispatching), `slot` the slot concerned, if any. A hook that panics injects a panic there.
#[cfg(test)]
pub(crate) type FaultHook = Box<dyn Fn(&'static str, Option<&Slot>) + Send + Sync>;

/// The callables registered on one level, with their kind: a `RwLock`ed map whose every write
/// bumps a generation, so an Orchestrator may keep the kinds it checked from one run to the next
/// and look them up again only after a registration changed.
#[derive(Default)]
pub(crate) struct CallableKinds {
    map: RwLock<HashMap<Digest, CallableKind>>,
    generation: AtomicU64,
}

/// Write access to [`CallableKinds`]; dropping it bumps the generation (before the lock is
/// released).
pub(crate) struct KindsWrite<'a> {
    map: RwLockWriteGuard<'a, HashMap<Digest, CallableKind>>,
    generation: &'a AtomicU64,
}

impl std::ops::Deref for KindsWrite<'_> {
    type Target = HashMap<Digest, CallableKind>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl std::ops::DerefMut for KindsWrite<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.map
    }
}

impl Drop for KindsWrite<'_> {
    fn drop(&mut self) {
        self.generation.fetch_add(1, Ordering::Release);
    }
}

impl CallableKinds {
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, HashMap<Digest, CallableKind>> {
        sync::read(&self.map)
    }

    pub(crate) fn write(&self) -> KindsWrite<'_> {
        KindsWrite { map: sync::write(&self.map), generation: &self.generation }
    }

    /// Changes whenever a write guard is dropped.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

/// What the level that owns an engine gives it: the engine mints, allocates and checks device
/// memory through these, and knows nothing of the level itself.
pub(crate) struct LevelParts {
    /// Mints the identities of `orch.alloc` intermediates.
    pub(crate) minter: Arc<IdentityMinter>,
    /// Where `orch.alloc` takes memory from.
    pub(crate) heap: Arc<dyn IntermediateHeap>,
    /// How device tensors are checked at submit.
    pub(crate) devices: Arc<dyn DeviceRules>,
}

/// One device tensor of a task being submitted, as [`DeviceRules::check`] sees it.
pub(crate) struct DeviceUse<'a> {
    /// The task's callable (for messages).
    pub(crate) callable: &'a CallableHandle,
    /// The tensor's index in the task's arguments.
    pub(crate) tensor: usize,
    /// The chip whose memory it is.
    pub(crate) chip: u32,
    /// The buffer's identity.
    pub(crate) id: Identity,
    /// The NEXT_LEVEL worker the task (member) runs on; `None` for a SUB task.
    pub(crate) runs_on: Option<u32>,
}

/// How a level checks a device tensor a task names at submit: whose chip it is, and whether it
/// is still allocated. (An L3 Worker knows the buffers it allocated on its chips; a chip, that
/// its memory is its own.)
pub(crate) trait DeviceRules: Send + Sync {
    /// Checks one device tensor of a task; the error names the callable and the tensor.
    fn check(&self, used: &DeviceUse<'_>) -> Result<()>;

    /// A submitted task names device buffer `id` (once per naming tensor), from its submit
    /// until its slot is consumed: a level may refuse to copy over the buffer meanwhile.
    fn hold(&self, _id: Identity) {}

    /// The task that [`hold`](DeviceRules::hold) counted is gone.
    fn release(&self, _id: Identity) {}
}

/// A level without device memory: every device tensor is refused (tests and benchmarks).
#[cfg(any(test, feature = "bench-support"))]
pub(crate) struct NoDevices;

#[cfg(any(test, feature = "bench-support"))]
impl DeviceRules for NoDevices {
    fn check(&self, u: &DeviceUse<'_>) -> Result<()> {
        Err(Error::invalid(format!(
            "{}: tensor {} is device memory of chip {}, and this level has none",
            u.callable, u.tensor, u.chip
        )))
    }
}

/// A run an orchestration function built (see [`Engine::build_run`]).
pub(crate) struct Built<'e> {
    pub(crate) run: Arc<RunState>,
    /// The announcement that the builder will wait on the run (when it asked for one).
    pub(crate) intent: Option<WaiterIntent<'e>>,
}

/// Why [`Engine::build_run`] built no run: the orchestration function's error, or its panic
/// (the run was wound down first, so a caller may resume the panic).
pub(crate) enum BuildFailed {
    Error(Error),
    Panic(Box<dyn std::any::Any + Send>),
}

impl BuildFailed {
    /// The error a panic becomes when it is not resumed.
    fn panic_error(panic: &(dyn std::any::Any + Send)) -> Error {
        Error::new(
            ErrorKind::TaskFailed,
            format!("the orchestration function panicked: {}", crate::error::panic_message(panic)),
        )
    }

    /// As an error (a panic becomes a [`ErrorKind::TaskFailed`] error with its message).
    pub(crate) fn into_error(self) -> Error {
        match self {
            BuildFailed::Error(e) => e,
            BuildFailed::Panic(panic) => BuildFailed::panic_error(&*panic),
        }
    }
}

/// Admitted runs, and a finished one kept for reuse.
#[derive(Default)]
struct Runs {
    /// Admitted runs in FIFO order; the front one dispatches.
    live: VecDeque<Arc<RunState>>,
    /// The last finished run: reused by the next `begin_run` when nobody holds it any more (its
    /// handle, tasks and Orchestrator are gone), so a run allocates no state of its own.
    spare: Option<Arc<RunState>>,
}

/// One level's engine.
pub(crate) struct Engine {
    /// This engine's number in its process (run numbers restart in every engine, so trace-log
    /// keys name the engine too).
    pub(crate) id: u64,
    cfg: EngineConfig,
    window: TaskWindow,
    /// Where `orch.alloc` takes memory from: the level's host heap rings, or a chip's memory.
    heap: Arc<dyn IntermediateHeap>,
    tensor_map: TensorMap,
    /// Some lane stages successor tasks: untracked writers are recorded in the TensorMap, so
    /// that a successor's input is never copied in while one of the head's may still write it.
    staging: AtomicBool,
    /// The scheduler role (rule 1), flagged in `role`.
    sched: checked::Mutex<Scheduler>,
    inbox_tx: Sender<Arc<Slot>>,
    inbox_len: AtomicUsize,
    bell: Bell,
    events: Doorbell,
    bg_bell: Doorbell,
    /// How many times the background thread was woken to drive (a waiter that drives its own
    /// run never wakes it).
    bg_wakes: AtomicU64,
    /// Who holds the role and who wants it (rules 1, 3, 4).
    role: RoleState,
    /// Tasks dispatched and not yet completed (kept by the holder, read by anyone).
    in_flight: AtomicUsize,
    /// READY tasks waiting in the scheduler's queues (kept by the holder).
    queued: AtomicUsize,
    /// Lanes idle at the end of the last pass (a hint for inline dispatch).
    idle_lanes: AtomicUsize,
    /// READY publications since the last inline pass.
    unpassed: AtomicUsize,
    /// Threads waiting for room in the task window or a heap ring.
    capacity_waiters: AtomicUsize,
    /// Admitted runs (FIFO; the front one dispatches).
    runs: Mutex<Runs>,
    head_run: AtomicU64,
    /// The pipeline leases (rules L1-L5 of `lease`), handed to the FIFO head and its first
    /// successor as they take those roles, returned when they finish.
    leases: Mutex<lease::LeaseArena>,
    /// Time zero of `next_check`.
    epoch: Instant,
    /// When the scheduler must next stop a run (the earliest deadline of a live run, or now for
    /// a cancel), in nanoseconds since `epoch`; `u64::MAX` when no run asks. Written under the
    /// `runs` lock; read by every pass (one load while no run has a deadline).
    next_check: AtomicU64,
    next_run_id: AtomicU64,
    /// Serializes graph building (one orchestration function at a time).
    building: Mutex<()>,
    /// The thread building right now (to refuse a re-entrant submit instead of deadlocking).
    builder: AtomicUsize,
    closed: AtomicBool,
    stopping: AtomicBool,
    /// Callables registered on this level, with their kind.
    callables: CallableKinds,
    /// The Orchestrator's buffers between runs (see [`OrchBuffers`]).
    orch_spare: Mutex<OrchBuffers>,
    /// Mints the identities of `orch.alloc` intermediates (the level's minter).
    minter: Arc<IdentityMinter>,
    /// How the level checks the device memory tasks name.
    devices: Arc<dyn DeviceRules>,
    /// Injects panics at the engine's fault points (tests only; see [`FaultHook`]).
    #[cfg(test)]
    pub(crate) faults: RwLock<Option<FaultHook>>,
}

impl Engine {
    /// An engine for the level that gives it `parts`.
    pub(crate) fn new(cfg: EngineConfig, bell: Bell, parts: LevelParts) -> Result<Engine> {
        if cfg.task_window == 0 {
            return Err(Error::invalid("task_window must be at least 1"));
        }
        if cfg.pipeline_depth == 0 {
            return Err(Error::invalid("pipeline_depth must be at least 1"));
        }
        let LevelParts { minter, heap, devices } = parts;
        let (inbox_tx, inbox_rx) = crossbeam_channel::unbounded();
        Ok(Engine {
            // Random, so that engines of other processes (a worker replaced under a reused pid
            // included) do not share one either.
            id: crate::sys::random::u64() | 1,
            window: TaskWindow::new(cfg.task_window),
            heap,
            tensor_map: TensorMap::default(),
            staging: AtomicBool::new(false),
            sched: checked::Mutex::new(Scheduler::new(&cfg, inbox_rx)),
            inbox_tx,
            inbox_len: AtomicUsize::new(0),
            bell,
            events: Doorbell::new(),
            bg_bell: Doorbell::new(),
            bg_wakes: AtomicU64::new(0),
            role: RoleState::new(),
            in_flight: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            idle_lanes: AtomicUsize::new(0),
            unpassed: AtomicUsize::new(0),
            capacity_waiters: AtomicUsize::new(0),
            runs: Mutex::new(Runs::default()),
            head_run: AtomicU64::new(0),
            leases: Mutex::new(lease::LeaseArena::new(
                u32::try_from(cfg.pipeline_depth).unwrap_or(u32::MAX),
            )?),
            epoch: Instant::now(),
            next_check: AtomicU64::new(u64::MAX),
            next_run_id: AtomicU64::new(1),
            building: Mutex::new(()),
            builder: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            callables: CallableKinds::default(),
            orch_spare: Mutex::new(OrchBuffers::default()),
            minter,
            devices,
            cfg,
            #[cfg(test)]
            faults: RwLock::new(None),
        })
    }

    /// Gives the scheduler its lanes (before any run).
    pub(crate) fn attach_lanes(&self, lanes: Vec<scheduler::Lane>) {
        self.idle_lanes.fetch_add(lanes.len(), Ordering::Relaxed);
        if lanes.iter().any(scheduler::Lane::stages) {
            self.staging.store(true, Ordering::Relaxed);
        }
        self.lock_sched().attach(lanes);
    }

    /// Puts lane `i` back in service after a new worker replaced its dead one (the caller
    /// made sure the new worker is ready), and wakes the scheduler: tasks waiting for it run.
    pub(crate) fn revive_lane(&self, i: usize) {
        self.lock_sched().revive(i);
        self.idle_lanes.fetch_add(1, Ordering::Relaxed);
        // Whoever drives (a waiter or the background thread) sleeps on the doorbell or its bell.
        self.doorbell().ring();
        self.bg_bell.ring();
    }

    fn lock_sched(&self) -> checked::MutexGuard<'_, Scheduler> {
        checked::lock(&self.sched)
    }

    /// Calls the test fault hook, if one is set, at fault point `phase` (a no-op outside tests).
    #[inline(always)]
    pub(crate) fn fault_point(&self, phase: &'static str, slot: Option<&Slot>) {
        #[cfg(test)]
        if let Some(hook) = sync::read(&self.faults).as_ref() {
            hook(phase, slot);
        }
        #[cfg(not(test))]
        let _ = (phase, slot);
    }

    pub(crate) fn doorbell(&self) -> &Doorbell {
        self.bell.get()
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(crate) fn mark_closed(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// The engine's sizing and limits, to change (tests only).
    #[cfg(test)]
    pub(crate) fn config_mut(&mut self) -> &mut EngineConfig {
        &mut self.cfg
    }

    /// The callables registered on this level, with their kind.
    pub(crate) fn callables(&self) -> &CallableKinds {
        &self.callables
    }

    /// Where `orch.alloc` takes memory from.
    pub(crate) fn heap(&self) -> &Arc<dyn IntermediateHeap> {
        &self.heap
    }

    // ------------------------------------------------------------------ runs and admission

    /// Admits a new run, waiting (and driving) while `pending_run_depth` (or, when that is 0,
    /// `pipeline_depth`) runs are live, for at most
    /// the back-pressure timeout; `deadline`: when the run must end, and the limit it was given.
    pub(crate) fn begin_run(
        &self,
        capture: bool,
        deadline: Option<(Instant, Duration)>,
    ) -> Result<Arc<RunState>> {
        let (depth, knob) = match self.cfg.pending_run_depth {
            0 => (self.cfg.pipeline_depth, "pipeline_depth"),
            n => (n, "pending_run_depth"),
        };
        let room = || sync::lock(&self.runs).live.len() < depth;
        if !room() {
            let limit = self.cfg.backpressure_timeout;
            if !self.drive_until(room, Some(crate::sys::clock::after(limit))) {
                let head = self.head_run();
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "Worker.submit: no room for a new run within the backpressure timeout of {limit:?}: \
                         {depth} run(s) are admitted ({knob} {depth}) and run {head}, the first, \
                         has not finished; a task that never returns holds every later run: give runs a \
                         deadline (RunOptions::deadline, WorkerBuilder::run_deadline) or cancel them \
                         (RunHandle::cancel)"
                    ),
                ));
            }
        }
        let id = self.next_run_id.fetch_add(1, Ordering::Relaxed);
        let make = || {
            let state = RunState::new(id, capture).at_level(self.cfg.level).in_engine(self.id);
            match deadline {
                Some((at, limit)) => state.with_deadline(at, limit),
                None => state,
            }
        };
        let mut runs = sync::lock(&self.runs);
        let run = match runs.spare.take() {
            Some(mut spare) => match Arc::get_mut(&mut spare) {
                Some(state) => {
                    *state = make();
                    spare
                }
                None => Arc::new(make()),
            },
            None => Arc::new(make()),
        };
        runs.live.push_back(run.clone());
        self.head_run.store(runs.live.front().map_or(0, |r| r.id), Ordering::Release);
        if let Some((at, _)) = deadline {
            self.next_check.fetch_min(self.since_epoch(at), Ordering::SeqCst);
            drop(runs);
            // Whoever drives (or sleeps waiting to) bounds its sleep by the new deadline.
            self.doorbell().ring();
            self.bg_bell.ring();
        }
        Ok(run)
    }

    /// `t` in nanoseconds since the engine's epoch (for `next_check`).
    fn since_epoch(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX - 1)
    }

    /// When the scheduler must next stop a run (see `next_check`); `None` when no run asks.
    pub(crate) fn next_check(&self) -> Option<Instant> {
        match self.next_check.load(Ordering::SeqCst) {
            u64::MAX => None,
            n => Some(self.epoch + Duration::from_nanos(n)),
        }
    }

    /// True when a run is to be stopped now (its deadline passed, or a cancel waits).
    pub(crate) fn stop_due(&self) -> bool {
        self.next_check().is_some_and(|at| at <= Instant::now())
    }

    /// `min(deadline, next_check)`: how long a driver may sleep.
    fn sleep_bound(&self, deadline: Option<Instant>) -> Option<Instant> {
        match (deadline, self.next_check()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The live runs the scheduler must stop now, and why (the role holder, when
    /// [`stop_due`](Engine::stop_due)); recomputes `next_check` from the others.
    pub(crate) fn runs_to_stop(&self, now: Instant) -> Vec<(Arc<RunState>, StopCause)> {
        let runs = sync::lock(&self.runs);
        let due: Vec<_> = runs.live.iter().filter_map(|r| r.due(now).map(|c| (r.clone(), c))).collect();
        let next = runs
            .live
            .iter()
            .filter(|r| !due.iter().any(|(d, _)| Arc::ptr_eq(d, r)))
            .filter_map(|r| r.next_check())
            .map(|at| self.since_epoch(at))
            .min()
            .unwrap_or(u64::MAX);
        self.next_check.store(next, Ordering::SeqCst);
        due
    }

    /// [`RunHandle::cancel`](run::RunHandle::cancel): asks the scheduler to stop `run` and drives
    /// until it did (or the run ended first); true when this call cancelled it.
    pub(crate) fn cancel_run(&self, run: &Arc<RunState>) -> bool {
        if run.is_done() || run.is_stopped() || self.is_closed() || !run.request_cancel() {
            return false;
        }
        {
            let _runs = sync::lock(&self.runs);
            self.next_check.store(0, Ordering::SeqCst);
        }
        let _span = tracing::debug_span!(target: "simpler::run", "cancel", run_id = run.id).entered();
        self.doorbell().ring();
        self.bg_bell.ring();
        self.drive_until(|| run.is_done() || run.is_stopped(), None);
        run.was_cancelled()
    }

    /// Builds one run: refuses a build from inside an orchestration function of this engine
    /// (it would deadlock on the build lock), takes the build lock (one orchestration
    /// function at a time), admits the run, runs `f` on its Orchestrator with panics caught, and
    /// ends the build. `will_wait` announces, once this thread builds, that it will wait on the
    /// run, so the background thread leaves it the scheduler role. `deadline`: the run must end
    /// within this long of this call, or the scheduler stops it (see [`StopCause`]). When `f`
    /// fails or panics,
    /// the run's unstarted tasks are cancelled and the run is driven to its end before this
    /// returns the error or the panic.
    ///
    /// The one place a run is built: the Worker, the chip runtime and the benchmarks call it.
    pub(crate) fn build_run<F>(
        &self,
        capture: bool,
        deadline: Option<Duration>,
        will_wait: bool,
        f: F,
    ) -> std::result::Result<Built<'_>, BuildFailed>
    where
        F: FnOnce(&mut Orchestrator<'_>) -> Result<()>,
    {
        // A token unique to this thread (the address of a thread-local), to refuse a
        // re-entrant build instead of deadlocking on `building`.
        thread_local!(static TOKEN: u8 = const { 0 });
        let me = TOKEN.with(|t| t as *const u8 as usize);
        // The deadline counts from the submit, admission and building included.
        let deadline = deadline.map(|limit| (crate::sys::clock::after(limit), limit));
        if self.builder.load(Ordering::Acquire) == me {
            return Err(BuildFailed::Error(Error::state(
                "Worker.submit: called from inside an orchestration function of the same Worker; \
                 submit tasks through the Orchestrator instead",
            )));
        }
        let _building = sync::lock(&self.building);
        // Only once this thread builds (not while it queues behind another builder).
        let intent = will_wait.then(|| self.announce_waiter());
        self.builder.store(me, Ordering::Release);
        struct ClearBuilder<'a>(&'a AtomicUsize);
        impl Drop for ClearBuilder<'_> {
            fn drop(&mut self) {
                self.0.store(0, Ordering::Release);
            }
        }
        let _clear = ClearBuilder(&self.builder);
        let run = self.begin_run(capture, deadline).map_err(BuildFailed::Error)?;
        run.ahead.store(!will_wait, Ordering::Relaxed);
        let _span = run.span.clone().entered();
        let mut orch = Orchestrator::new(self, run.clone());
        match catch_unwind(AssertUnwindSafe(|| f(&mut orch))) {
            Ok(Ok(())) => {
                orch.finish(None);
                Ok(Built { run, intent })
            }
            Ok(Err(e)) => {
                orch.finish(Some(&e));
                self.drive_until(|| run.is_done(), None);
                Err(BuildFailed::Error(e))
            }
            Err(panic) => {
                orch.finish(Some(&BuildFailed::panic_error(&*panic)));
                self.drive_until(|| run.is_done(), None);
                Err(BuildFailed::Panic(panic))
            }
        }
    }

    /// Sets how many runs hold pipeline leases at once (before any run): the smallest depth
    /// the level's chips granted, at most `pipeline_depth`.
    pub(crate) fn set_lease_depth(&self, depth: u32) -> Result<()> {
        *sync::lock(&self.leases) = lease::LeaseArena::new(depth)?;
        Ok(())
    }

    /// The lease of `run`, minted now if it holds none yet (`None`: every lease is held; at a
    /// depth of 1, the head's is the only one). Called for the FIFO head and its first
    /// successor only, so only those hold leases.
    ///
    /// A run that is done gets none: `run_finished` may run on another thread (the
    /// orchestration's, when it fails the task this lease was for), and it returns only a lease
    /// set before it looked. Both look under the arena's lock, and `done` is set before
    /// `run_finished` runs, so a lease is either returned there or never minted.
    pub(crate) fn lease_for(&self, run: &RunState) -> Option<lease::Lease> {
        if let Some(l) = run.lease.get() {
            return Some(*l);
        }
        let mut leases = sync::lock(&self.leases);
        if let Some(l) = run.lease.get() {
            return Some(*l);
        }
        if run.is_done() {
            return None;
        }
        let minted = leases.acquire()?;
        match run.lease.set(minted) {
            Ok(()) => Some(minted),
            Err(_) => unreachable!("a run's lease is set only under the arena's lock"),
        }
    }

    /// The pipeline leases' free / live / quarantined counts (tests).
    #[cfg(test)]
    pub(crate) fn lease_counts(&self) -> lease::LeaseCounts {
        sync::lock(&self.leases).counts()
    }

    /// The FIFO head run, if any.
    pub(crate) fn live_head(&self) -> Option<Arc<RunState>> {
        sync::lock(&self.runs).live.front().cloned()
    }

    /// The first run behind the FIFO head, if any.
    pub(crate) fn successor_run(&self) -> Option<Arc<RunState>> {
        sync::lock(&self.runs).live.get(1).cloned()
    }

    /// Whether a task of `run` that writes `id` has not ended yet (see
    /// [`TensorMap::writer_pending`]).
    pub(crate) fn writer_pending(&self, run: u64, id: crate::data::buffer::Identity) -> bool {
        self.tensor_map.writer_pending(run, id)
    }

    /// Called by whoever finished a run: drop it from the FIFO, wake waiters.
    pub(crate) fn run_finished(&self, run: &Arc<RunState>) {
        // Under the arena's lock: `lease_for` mints none for a run that is done (see there).
        {
            let mut leases = sync::lock(&self.leases);
            if let Some(&l) = run.lease.get()
                && let Err(e) = leases.release(l)
            {
                tracing::error!(target: "simpler::run", run_id = run.id, "returning its pipeline lease: {e}");
            }
        }
        {
            let mut runs = sync::lock(&self.runs);
            if let Some(at) = runs.live.iter().position(|r| Arc::ptr_eq(r, run)) {
                runs.spare = runs.live.remove(at);
            }
            self.head_run.store(runs.live.front().map_or(0, |r| r.id), Ordering::Release);
        }
        tracing::debug!(target: "simpler::run", run_id = run.id, ok = run.first_error().is_none(), "run finished");
        self.events.ring();
        // A new head may have ready tasks: make sure someone drives.
        self.doorbell().ring();
        self.wake_background_if_needed();
    }

    pub(crate) fn head_run(&self) -> u64 {
        self.head_run.load(Ordering::Acquire)
    }

    /// Live runs (for close).
    pub(crate) fn live_runs(&self) -> Vec<Arc<RunState>> {
        sync::lock(&self.runs).live.iter().cloned().collect()
    }

    // ------------------------------------------------------------------ the role

    /// Publishes a READY task from a non-holder thread (rule 4).
    pub(crate) fn publish_ready(&self, slot: Arc<Slot>) {
        self.inbox_len.fetch_add(1, Ordering::SeqCst);
        // The receiver lives as long as the engine, so this cannot fail.
        let _ = self.inbox_tx.send(slot);
        if self.role.held() {
            // The holder may be asleep on the doorbell.
            self.doorbell().ring();
        } else {
            // Nobody drives. Dispatch inline when a worker is idle (so work starts while the
            // graph is still being built), else only every few submits: a pass per submit
            // would dominate the cost of building large graphs.
            let unpassed = self.unpassed.fetch_add(1, Ordering::Relaxed);
            if (self.idle_lanes.load(Ordering::Relaxed) > 0 || unpassed >= INLINE_PASS_EVERY)
                && let Some(mut role) = self.try_role()
            {
                self.unpassed.store(0, Ordering::Relaxed);
                role.pass();
            } else {
                self.wake_background_if_needed();
            }
        }
    }

    /// True when READY tasks may wait in the inbox (a hint: the holder skips an empty inbox).
    pub(crate) fn inbox_pending(&self) -> bool {
        self.inbox_len.load(Ordering::SeqCst) > 0
    }

    pub(crate) fn inbox_taken(&self, n: usize) {
        self.inbox_len.fetch_sub(n, Ordering::SeqCst);
    }

    /// Published by the holder after each pass: tasks running, READY tasks queued, idle lanes.
    pub(crate) fn set_outstanding(&self, in_flight: usize, queued: usize, idle_lanes: usize) {
        self.in_flight.store(in_flight, Ordering::SeqCst);
        self.queued.store(queued, Ordering::SeqCst);
        self.idle_lanes.store(idle_lanes, Ordering::Relaxed);
    }

    fn outstanding(&self) -> bool {
        self.inbox_len.load(Ordering::SeqCst) > 0
            || self.in_flight.load(Ordering::SeqCst) > 0
            || self.queued.load(Ordering::SeqCst) > 0
    }

    /// Announces that this thread will soon wait (and drive): until the guard drops, published
    /// work does not wake the background thread, so the waiter does not have to take the role
    /// back from it.
    pub(crate) fn announce_waiter(&self) -> WaiterIntent<'_> {
        self.role.announce();
        WaiterIntent { eng: self }
    }

    /// Takes the scheduler role if nobody holds it (see [`Role`]; dropping it gives it up).
    fn try_role(&self) -> Option<Role<'_>> {
        let sched = self.role.try_take(&self.sched)?;
        Some(Role { eng: self, sched: Some(sched) })
    }

    /// One non-blocking pass if nobody holds the role (for pollers such as `RunHandle::is_done`,
    /// so a run makes progress even while the background thread stands aside for a waiter).
    pub(crate) fn try_pass(&self) {
        if !self.role.held()
            && let Some(mut role) = self.try_role()
        {
            role.pass();
        }
    }

    fn wake_background_if_needed(&self) {
        if self.role.needs_background_wake(|| self.outstanding() || self.stop_due()) {
            self.wake_background();
        }
    }

    /// Wakes the background thread to drive (rule 4), and counts it.
    fn wake_background(&self) {
        self.bg_wakes.fetch_add(1, Ordering::Relaxed);
        self.bg_bell.ring();
    }

    /// Drives the scheduler until `cond` holds or `deadline` passes; returns whether `cond` held.
    /// `cond` is not evaluated again once it has returned true (it may take a resource).
    ///
    /// The calling thread takes the scheduler role when it is free (rule 3), so a waiter pays
    /// no thread handoff per task.
    pub(crate) fn drive_until(&self, cond: impl Fn() -> bool, deadline: Option<Instant>) -> bool {
        // Once this thread has announced that it wants the role, it keeps the announcement until
        // it returns, whichever way: dropping it wakes the background thread if work is left
        // and nobody drives (rule 4). A bare decrement on the way out lost that wake-up.
        let mut intent: Option<WaiterIntent<'_>> = None;
        loop {
            if cond() {
                return true;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return false;
            }
            let seen_events = self.events.seq();
            match self.try_role() {
                Some(mut role) => {
                    return loop {
                        let seen = self.doorbell().seq();
                        let progressed = role.pass();
                        if cond() {
                            break true;
                        }
                        if deadline.is_some_and(|d| Instant::now() >= d) {
                            break false;
                        }
                        if !progressed {
                            let how = role.peer_wait(crate::sys::futex::current_cpu());
                            // Also woken by the next run deadline: the holder stops that run.
                            let bound = self.sleep_bound(deadline);
                            if role.watching() {
                                // A watched endpoint's outcome shows in `ready`, not the
                                // doorbell, until it is told the holder sleeps.
                                let role = &role;
                                let (ready, unwatch) = (|| role.ready(), || role.unwatch());
                                self.doorbell().wait_watching(seen, bound, how, ready, unwatch);
                            } else {
                                self.doorbell().wait_for_peer(seen, bound, how);
                            }
                        }
                    };
                    // `role` drops (rule 3), then `intent` (rule 4).
                }
                None => {
                    intent.get_or_insert_with(|| self.announce_waiter());
                    self.doorbell().ring();
                    if cond() {
                        return true;
                    }
                    self.events.wait(seen_events, deadline);
                }
            }
        }
    }

    /// The background thread's loop: hold the role while work is outstanding and nobody waits.
    /// Passes contain their own panics (rule 5); should anything else in the loop panic, the
    /// loop is entered again, so the background thread lives until `stop_background`.
    pub(crate) fn background_loop(&self) {
        while let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.background_loop_inner())) {
            tracing::error!(
                target: "simpler::scheduler",
                "the background scheduler thread panicked ({}); it carries on",
                crate::error::panic_message(&*panic)
            );
        }
    }

    fn background_loop_inner(&self) {
        loop {
            let seen = self.bg_bell.seq();
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            let wanted = self.role.wanted() > 0;
            // A run deadline is enforced also while nobody waits and nothing runs (a run still
            // being built): this thread wakes at the earliest one and stops that run. Also while
            // a waiter announced itself but does not drive yet (it is still building its run):
            // one pass, after which the role is given back to it (below).
            if ((!wanted && self.outstanding()) || self.stop_due())
                && let Some(mut role) = self.try_role()
            {
                loop {
                    let bell_seen = self.doorbell().seq();
                    let progressed = role.pass();
                    if self.stopping.load(Ordering::SeqCst)
                        || self.role.wanted() > 0
                        || !(self.outstanding() || self.stop_due())
                    {
                        break;
                    }
                    if !progressed {
                        role.unwatch(); // nobody checks watched endpoints while this one sleeps
                        self.doorbell().wait(bell_seen, self.next_check());
                    }
                }
                continue;
            }
            // Past the next check, whoever holds or wants the role stops that run, and the
            // role's release wakes this thread if it is still due (rule 4): no spinning here.
            let bound = self.next_check().filter(|&at| at > Instant::now());
            self.bg_bell.sleep(seen, bound);
        }
    }

    /// How many times the background thread has been woken to drive.
    #[cfg(test)]
    pub(crate) fn background_wakes(&self) -> u64 {
        self.bg_wakes.load(Ordering::Relaxed)
    }

    /// Stops the background thread (close).
    pub(crate) fn stop_background(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.bg_bell.ring();
        self.doorbell().ring();
    }

    /// Shuts every lane down (close), after the background thread stopped.
    pub(crate) fn shutdown_lanes(&self) {
        self.lock_sched().shutdown();
    }

    // ------------------------------------------------------------------ completion side

    /// A task finished (or was failed without running): settle it, release or poison its
    /// consumers, drop its references. Newly ready consumers are appended to `ready`.
    pub(crate) fn complete(
        &self,
        slot: &Arc<Slot>,
        result: std::result::Result<(), Error>,
        ready: &mut Vec<Arc<Slot>>,
    ) {
        self.fault_point("complete", Some(slot));
        let (fanout, retained) = slot.settle(&result);
        slot.run.note(slot.index, TaskEvent::Ended(result.as_ref().map(|_| ())));
        tracing::trace!(target: "simpler::scheduler", run_id = slot.run.id, task_index = slot.index, ok = result.is_ok(), "completion");
        match result {
            Ok(()) => {
                slot.run.completed.fetch_add(1, Ordering::Relaxed);
                for consumer in fanout {
                    self.release_fanin(&consumer, ready);
                }
            }
            Err(err) => {
                slot.run.failed.fetch_add(1, Ordering::Relaxed);
                slot.run.record_error(err.clone());
                self.poison_all(fanout, slot, &err);
            }
        }
        for p in retained {
            self.release_ref(&p);
        }
        self.release_ref(slot);
    }

    /// [`Engine::complete`] of `slot` panicked (rule 5). The slot's run fails with an
    /// [`ErrorKind::Internal`] error naming the task and the panic. When the panic came before
    /// the slot changed (it is still `Running`), the slot is completed again as failed, so its
    /// consumers are poisoned and the run settles normally; when that panics too, or the slot
    /// had changed already, the run's bookkeeping cannot be trusted and it is abandoned
    /// (see [`Engine::abandon_run`]).
    pub(crate) fn completion_panicked(
        &self,
        slot: &Arc<Slot>,
        panic: &(dyn std::any::Any + Send),
        ready: &mut Vec<Arc<Slot>>,
    ) {
        let run = slot.run.clone();
        let err = Error::new(
            ErrorKind::Internal,
            format!(
                "run {}: the scheduler panicked while completing {}: {}",
                run.id,
                slot.describe(),
                crate::error::panic_message(panic)
            ),
        );
        tracing::error!(target: "simpler::scheduler", "{}", err.message());
        // First, so the run's error names the panic rather than what it led to.
        run.record_error(err.clone());
        if slot.state() == State::Running
            && catch_unwind(AssertUnwindSafe(|| self.complete(slot, Err(err.clone()), ready))).is_ok()
        {
            return;
        }
        tracing::error!(target: "simpler::scheduler", run_id = run.id, "completing it as failed was not possible; the run is abandoned");
        self.abandon_run(&run, err);
    }

    /// Ends `run` now with `err`, without waiting for its tasks (rule 5): it is marked done and
    /// leaves the run FIFO, so its waiters return and later runs dispatch. Its tasks still
    /// running end and are released as usual; its READY ones are failed when the scheduler
    /// retires its queues; what the panic cut off (the panicking task and the consumers only
    /// it would have released) stays allocated.
    /// Returns false, doing nothing, when the run was done already.
    pub(crate) fn abandon_run(&self, run: &Arc<RunState>, err: Error) -> bool {
        if run.is_done() {
            return false;
        }
        run.abandon(err);
        self.run_finished(run);
        true
    }

    fn release_fanin(&self, consumer: &Arc<Slot>, ready: &mut Vec<Arc<Slot>>) {
        if consumer.release_fanin() {
            consumer.run.note(consumer.index, TaskEvent::Ready);
            ready.push(consumer.clone());
        }
    }

    /// Fails `slot`, which has not started, with `err`: the one way a task fails without
    /// running. A `Building` slot belongs to the submitting thread, which calls this at
    /// publication; a `Pending` or `Ready` one moves to `Failed` only if this call wins the CAS
    /// (rule 1 of the slot module). Its members are skipped, the run counts it failed, its
    /// consumers are poisoned (rule 3, over the whole downstream cone), and its references are
    /// dropped. Returns false, doing nothing, when the slot was past that (running or done).
    pub(crate) fn fail_unstarted(&self, slot: &Arc<Slot>, err: Error) -> bool {
        let Some(fanout) = self.fail_one(slot, err.clone()) else { return false };
        self.poison_all(fanout, slot, &err);
        true
    }

    /// The state change and bookkeeping of [`Engine::fail_unstarted`] for one slot; returns
    /// its consumers for the caller to poison.
    fn fail_one(&self, slot: &Arc<Slot>, err: Error) -> Option<smallvec::SmallVec<[Arc<Slot>; 4]>> {
        let (fanout, retained) = slot.fail_unstarted(err.clone())?;
        slot.run.note(slot.index, TaskEvent::NotRun(&err));
        slot.run.failed.fetch_add(1, Ordering::Relaxed);
        for p in retained {
            self.release_ref(&p);
        }
        self.release_ref(slot);
        Some(fanout)
    }

    /// Rule 3 of the slot module, over the whole downstream cone (iteratively): a consumer
    /// still being built is marked (its submitting thread fails it at publication); a pending
    /// or ready one fails now.
    fn poison_all(&self, first: smallvec::SmallVec<[Arc<Slot>; 4]>, producer: &Arc<Slot>, cause: &Error) {
        let mut work: Vec<(Arc<Slot>, String)> =
            first.into_iter().map(|c| (c, producer.describe())).collect();
        while let Some((victim, by)) = work.pop() {
            let poison = Error::new(
                ErrorKind::Poisoned,
                format!("{} did not run: {by} failed: {}", victim.describe(), cause.message()),
            );
            if victim.mark_poisoned(&poison) {
                continue;
            }
            let name = victim.describe();
            if let Some(fanout) = self.fail_one(&victim, poison) {
                work.extend(fanout.into_iter().map(|c| (c, name.clone())));
            }
        }
    }

    /// Fails every not-yet-running task of a run (the orchestration function returned an
    /// error): they never run, and are released and consumed normally.
    pub(crate) fn cancel_unstarted(&self, slots: &[Arc<Slot>], cause: &Error) {
        for s in slots {
            if s.state() != State::Building {
                self.fail_unstarted(s, cause.clone());
            }
        }
    }

    /// Drops one reference on `slot`; consumes it when it was the last (rule 4).
    pub(crate) fn release_ref(&self, slot: &Arc<Slot>) {
        if slot.release() {
            self.consume(slot);
        }
    }

    fn consume(&self, slot: &Arc<Slot>) {
        if !slot.claim_consumption() {
            return;
        }
        let (written, retained) = {
            let mut l = slot.lock();
            (std::mem::take(&mut l.written), std::mem::take(&mut l.retained))
        };
        for p in retained {
            self.release_ref(&p);
        }
        if !written.is_empty() {
            self.tensor_map.erase(slot.run.id, &written, slot);
        }
        if let Some(task) = slot.task.as_ref() {
            task.holds.release(&task.args);
            if task.names_device {
                for id in task.device_buffers() {
                    self.devices.release(id);
                }
            }
        }
        if let Some(hold) = slot.heap {
            self.tensor_map.erase(slot.run.id, &[hold.identity], slot);
            self.heap.release(hold.block);
        }
        self.window.release();
        if slot.run.slot_consumed() {
            self.run_finished(&slot.run);
        } else {
            // Room in the window or a heap ring: wake whoever waits on back-pressure. Pairs
            // with `CapacityWait::new` (announce, then try): one of the two sees the other.
            std::sync::atomic::fence(Ordering::SeqCst);
            if self.capacity_waiters.load(Ordering::SeqCst) > 0 {
                self.events.ring();
                self.doorbell().ring();
            }
        }
    }
}
