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
//! 1. Only the role holder touches the scheduler's queues and lanes. A thread without the role
//!    never waits for its lock, which the holder keeps while it sleeps (for as long as a task
//!    hangs): a change it needs (a replaced worker's lane back in service, a rejoined node's new
//!    endpoint) is queued and rung for, and the holder applies it at the start of its next pass
//!    ([`Engine::with_sched`]). Waiting for the lock instead hung a submit that replaced a dead
//!    worker while the background thread drove a hung run.
//! 2. Anything that makes work for the scheduler (a published READY task, a child's completion, a
//!    child's death) rings the engine doorbell; the holder sleeps on it only after a pass that
//!    made no progress (spin, yield, then futex: never a fixed sleep). A watched endpoint (a
//!    remote worker) is the exception while the holder keeps checking: the holder also checks
//!    its `ready` hint, and tells it (`unwatched`) before it sleeps, after which it rings too.
//! 3. A thread that wants the role and cannot take it announces itself
//!    ([`RoleState::announce`], through a [`WaiterIntent`]) and rings the doorbell; the background
//!    holder gives the role up at its next wake. Every release of the role and every finished run
//!    rings `events`, on which such threads sleep. The role is held through a [`Role`](drive::Role) guard and
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
//!    endpoint's `start` or `poll` that panics fails its task with an [`ErrorKind::Internal`](crate::error::ErrorKind::Internal)
//!    error and takes its lane out of service (what the worker does is unknown from then on); a
//!    panic while completing a task fails that task's run (the task is completed again as failed
//!    when the panic came before it changed, else the run is abandoned: it ends and leaves the
//!    FIFO at once, and what the panic cut off stays allocated); any other panic in a pass fails
//!    every live run. Each error names the run, the task and where it panicked. The engine stays
//!    usable, the background thread lives on, and the role is given up (rule 3).
//!
//! # Files
//!
//! `mod.rs` holds the [`Engine`] and the registered callables' kinds (and kernels' signatures); beside it, `parts.rs`
//! (what the level gives the engine: [`LevelParts`], [`DeviceRules`], [`EngineConfig`],
//! [`Bell`]), `admission.rs` (the run FIFO, building a run, deadlines, cancels, leases),
//! `drive.rs` (the role and the driving loops: rules 1-5), `completion.rs` (completion,
//! poisoning, consumption) and `role.rs` (the role's flags, model-checked). The other modules
//! are the engine's nouns: `orchestrator`, `scheduler`, `slot`, `run`, `tensor_map`, `ring`,
//! `heap`, `lease`, `endpoint`, `orch_fn`.

mod admission;
mod completion;
mod drive;
pub(crate) mod endpoint;
pub(crate) mod heap;
pub(crate) mod lease;
pub(crate) mod orch_fn;
pub(crate) mod orchestrator;
mod parts;
pub(crate) mod ring;
mod role;
pub(crate) mod run;
pub(crate) mod scheduler;
pub(crate) mod slot;
pub(crate) mod tensor_map;
#[cfg(test)]
mod tests;

pub(crate) use admission::{BuildFailed, Reservation};
pub(crate) use completion::CapacityWait;
pub(crate) use drive::WaiterIntent;
#[cfg(any(test, feature = "bench-support"))]
pub(crate) use parts::NoDevices;
pub(crate) use parts::{Bell, DeviceRules, DeviceUse, EngineConfig, LevelParts};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

use crossbeam_channel::Sender;

use crate::callable::identity::{CallableKind, Digest};
use crate::callable::signature::KernelSignature;
use crate::data::buffer::IdentityMinter;
use crate::engine::admission::Runs;
use crate::engine::heap::IntermediateHeap;
use crate::engine::orchestrator::OrchBuffers;
use crate::engine::ring::TaskWindow;
use crate::engine::role::RoleState;
use crate::engine::scheduler::Scheduler;
use crate::engine::slot::Slot;
use crate::engine::tensor_map::TensorMap;
use crate::error::{Error, Result};
use crate::sys::futex::Doorbell;
use crate::sys::sync;
use crate::sys::sync::checked;

/// A hook the engine calls at its fault points (tests only): `phase` names the point
/// (`"complete"`: `Engine::complete` is entered for a slot; `"dispatch"`: a pass starts
/// dispatching), `slot` the slot concerned, if any. A hook that panics injects a panic there.
#[cfg(test)]
pub(crate) type FaultHook = Box<dyn Fn(&'static str, Option<&Slot>) + Send + Sync>;

/// A callable registered on one level, as a submit checks it: its kind; for a kernel whose
/// OpenCL C source declares its parameters, those (`callable::signature`), which a task's
/// arguments must match; for an orchestration function placed on some NEXT_LEVEL workers only
/// (`Worker::register_orch_on`, or a linked one that some remote nodes lack), their ids, the
/// only workers a task of it may be placed on.
#[derive(Clone, Debug)]
pub(crate) struct Registered {
    pub(crate) kind: CallableKind,
    pub(crate) signature: Option<Arc<KernelSignature>>,
    /// `None`: every NEXT_LEVEL worker has it. Sorted.
    pub(crate) placed: Option<Arc<[u32]>>,
}

impl From<CallableKind> for Registered {
    /// A callable of `kind` with no declared parameters, on every worker of its kind.
    fn from(kind: CallableKind) -> Registered {
        Registered { kind, signature: None, placed: None }
    }
}

/// The callables registered on one level, with their kind: a `RwLock`ed map whose every write
/// bumps a generation, so an Orchestrator may keep the kinds it checked from one run to the next
/// and look them up again only after a registration changed.
#[derive(Default)]
pub(crate) struct CallableKinds {
    map: RwLock<HashMap<Digest, Registered>>,
    generation: AtomicU64,
}

/// Write access to [`CallableKinds`]; dropping it bumps the generation (before the lock is
/// released).
pub(crate) struct KindsWrite<'a> {
    map: RwLockWriteGuard<'a, HashMap<Digest, Registered>>,
    generation: &'a AtomicU64,
}

impl std::ops::Deref for KindsWrite<'_> {
    type Target = HashMap<Digest, Registered>;
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
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, HashMap<Digest, Registered>> {
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

/// A change to the scheduler from a thread without the role ([`Engine::with_sched`]).
type SchedRequest = Box<dyn FnOnce(&mut Scheduler) + Send>;

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
    /// Some lane takes chained tasks ([`Endpoint::chains`](endpoint::Endpoint::chains)): a
    /// task published behind a running SUB task makes the scheduler look
    /// ([`Engine::chain_chance`]).
    chaining: AtomicBool,
    /// A chance to chain came ([`Engine::chain_chance`]) since the holder last looked.
    chain_chance: AtomicBool,
    /// The scheduler role (rule 1), flagged in `role`.
    sched: checked::Mutex<Scheduler>,
    /// Changes to the scheduler asked by threads that do not hold the role (a lane revived or
    /// given a new endpoint), which the holder applies at its next pass ([`Engine::with_sched`]):
    /// the holder may sleep on the doorbell with the lock held for as long as its tasks run.
    sched_tx: Sender<SchedRequest>,
    /// Where the holder takes them (an empty check is a load, no lock).
    sched_rx: crossbeam_channel::Receiver<SchedRequest>,
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
    /// The engine doorbell's count when a builder last made an inline pass for a PENDING
    /// submit (`Engine::submitted_pending`): another such pass waits until it rang since.
    pending_passed_at: std::sync::atomic::AtomicU32,
    /// Threads waiting for room in the task window or a heap ring.
    capacity_waiters: AtomicUsize,
    /// Admitted runs (FIFO; the front one dispatches).
    runs: Mutex<Runs>,
    head_run: AtomicU64,
    /// Changes whenever a run is admitted, closes its submission behind another, or leaves the
    /// FIFO: the scheduler checks again whether a run behind the head is independent of the
    /// runs ahead of it only when this or its own count of ended tasks moved.
    runs_epoch: AtomicU64,
    /// The pipeline leases (rules L1-L5 of `lease`), handed to the FIFO head and its first
    /// successor as they take those roles, returned when they finish, or quarantined when
    /// they are abandoned with a task that may still run (see [`admission::Leases`]).
    leases: Mutex<admission::Leases>,
    /// How many quarantined leases wait for their workers' confirmation (one load per pass).
    quarantined: AtomicUsize,
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
        let (sched_tx, sched_rx) = crossbeam_channel::unbounded();
        Ok(Engine {
            // Random, so that engines of other processes (a worker replaced under a reused pid
            // included) do not share one either.
            id: crate::sys::random::u64() | 1,
            window: TaskWindow::new(cfg.task_window),
            heap,
            tensor_map: TensorMap::default(),
            staging: AtomicBool::new(false),
            sched: checked::Mutex::new(Scheduler::new(&cfg, inbox_rx)),
            sched_tx,
            sched_rx,
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
            pending_passed_at: std::sync::atomic::AtomicU32::new(0),
            chaining: AtomicBool::new(false),
            chain_chance: AtomicBool::new(false),
            capacity_waiters: AtomicUsize::new(0),
            runs: Mutex::new(Runs::default()),
            head_run: AtomicU64::new(0),
            runs_epoch: AtomicU64::new(0),
            leases: Mutex::new(admission::Leases::new(
                u32::try_from(cfg.pipeline_depth).unwrap_or(u32::MAX),
                0,
                1,
            )?),
            quarantined: AtomicUsize::new(0),
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
        if lanes.iter().any(scheduler::Lane::chains) {
            self.chaining.store(true, Ordering::Relaxed);
        }
        self.with_sched(move |s| s.attach(lanes));
    }

    /// Puts lane `i` back in service after a new worker replaced its dead one (the caller
    /// made sure the new worker is ready), and wakes the scheduler: tasks waiting for it run.
    pub(crate) fn revive_lane(&self, i: usize) {
        if !self.with_sched(move |s| s.revive(i)) {
            return;
        }
        self.idle_lanes.fetch_add(1, Ordering::Relaxed);
        // Whoever drives (a waiter or the background thread) sleeps on the doorbell or its bell.
        self.doorbell().ring();
        self.bg_bell.ring();
    }

    /// Whether lane `i` still holds a task ([`Engine::replace_endpoint`] refuses it then): a
    /// cheap look before a replacement is built. A lane out of service takes no new task, so
    /// one found holding none stays so.
    pub(crate) fn lane_holds_task(&self, i: usize) -> bool {
        self.with_sched(move |s| s.holds_task(i))
    }

    /// Puts lane `i` back in service with a new endpoint in place of its lost one's (a remote
    /// Worker's new session), and wakes the scheduler. Refused (false, nothing changed) while
    /// the lane still holds a task, or once the endpoints were shut down. The old endpoint is
    /// dropped.
    pub(crate) fn replace_endpoint(&self, i: usize, endpoint: Box<dyn endpoint::Endpoint>) -> bool {
        let Some(was_dead) = self.with_sched(move |s| s.replace_endpoint(i, endpoint)) else { return false };
        if was_dead {
            self.idle_lanes.fetch_add(1, Ordering::Relaxed);
        }
        self.doorbell().ring();
        self.bg_bell.ring();
        true
    }

    /// Runs `f` on the scheduler: at once when nobody holds the role, else by the holder at its
    /// next pass, which the doorbell asks for. Never waits for the role's lock itself: its holder
    /// may sleep with it for as long as its tasks run (the background thread driving a hung run
    /// nobody waits for), and would never be woken by a thread blocked on the lock. A panic of
    /// `f` reaches the caller either way. (The wait is `drive_until`'s without announcing a
    /// waiter: take the role, or ring and sleep on `events`.)
    pub(crate) fn with_sched<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Scheduler) -> R + Send + 'static,
    ) -> R {
        if let Some(mut role) = self.try_role() {
            return f(&mut role);
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        let request: SchedRequest = Box::new(move |s: &mut Scheduler| {
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(s))));
        });
        self.sched_tx.send(request).expect("the engine holds the receiver");
        // Applying requests rings `events`, and so does every release of the role: a holder
        // either applies this one at its next pass (the doorbell wakes it) or gives the role
        // up, and then this thread takes it. The seq is read before each look, so neither is
        // missed.
        loop {
            let seen = self.events.seq();
            if let Ok(done) = rx.try_recv() {
                return done.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            }
            match self.try_role() {
                Some(mut role) => self.apply_sched_requests(&mut role),
                None => {
                    self.doorbell().ring();
                    self.events.wait(seen, None);
                }
            }
        }
    }

    /// Applies the scheduler requests of threads without the role (the holder, `sched`). Each
    /// catches its own panic for its requester, so one that panics leaves the others applied.
    pub(crate) fn apply_sched_requests(&self, sched: &mut Scheduler) {
        // Every pass comes here: an empty queue costs two loads (`try_recv` on an empty
        // channel fences).
        if self.sched_rx.is_empty() {
            return;
        }
        let mut applied = false;
        while let Ok(request) = self.sched_rx.try_recv() {
            request(sched);
            applied = true;
        }
        if applied {
            self.events.ring();
        }
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

    /// Closes the engine: no run is admitted from now on (one waiting for room, blocking or
    /// async, is woken to be refused); runs already admitted go on until their Worker's close
    /// stops them.
    pub(crate) fn mark_closed(&self) {
        self.closed.store(true, Ordering::Release);
        // Under the FIFO's lock: an admission either went in before (and `close` sees its
        // run) or sees the flag.
        let wakers = std::mem::take(&mut sync::lock(&self.runs).room_wakers);
        wakers.into_iter().for_each(std::task::Waker::wake);
        self.events.ring();
        self.doorbell().ring();
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
}
