//! `ChipRuntime`: the L2 leaf an L3 chip child (or an in-process L2 Worker) drives.
//!
//! A runtime owns its chip's [`Device`] (the backend a [`ChipBackend`](super::ChipBackend)
//! factory made, a [`SimChip`](super::SimChip) by default, with the checks of `device.rs`), a
//! registry of chip callables, an
//! in-process [`Engine`] whose NEXT_LEVEL workers are the chip's cores, and an executor thread.
//! Each core is an [`Endpoint`] backed by one thread; the engine has no background thread: the
//! executor thread builds a chip orchestration's graph and then drives the engine until the run
//! is done (the scheduler role, see the engine's module docs).
//!
//! # The L2 lifecycle
//!
//! A run goes through four phases, and [`ChipRuntime::run`] is their blocking composition:
//!
//! * [`prepare`](ChipRuntime::prepare) (steps 1-3 below, on the caller's thread): admit the
//!   run's [`Lease`] (its slot's generation high-water mark refuses a stale one, rule L5 of
//!   `engine::lease`), look the callable up, check the tensors, grow the slot's staging buffer
//!   if needed and copy the host inputs in. Nothing reaches the cores: the slot's staging
//!   buffer is fenced (rule A6 of `chip::arena`), so this overlaps the kernels of the run that
//!   executes.
//! * [`launch_traced`](ChipRuntime::launch_traced): hands the run to the executor thread and returns at once.
//!   Refused while another run is launched and not finalized: runs execute one at a time.
//! * [`poll`](ChipRuntime::poll) / [`wait`](ChipRuntime::wait): whether / until it is done.
//! * [`finalize`](ChipRuntime::finalize) (steps 5-6): copy the outputs back on success, fence
//!   the staging buffer, and give the run's result.
//!
//! A chip holds at most one launched (active) run and one prepared, unlaunched run: a second
//! prepare is refused until the prepared run launches, and a prepared run's slot must differ
//! from the active one's (each slot has its own staging buffer: resource class `HostPerRun`;
//! the chip engine and its `orch.alloc` memory are the one `DeviceScratch`, used only by the
//! active run).
//!
//! One run, end to end:
//!
//! 1. look the callable up by digest (`UNKNOWN_CALLABLE` when absent);
//! 2. check every device tensor: its view lies inside its buffer, and the buffer is a live
//!    allocation of this chip;
//! 3. give every host tensor a slice of the pipeline slot's retained staging buffer
//!    (`chip::staging`: grow-only, 64-byte bump slices, no device allocation once it is large
//!    enough) laid out like its view (offset 0), and copy the view's elements in when the
//!    tensor is readable (`Read`, `ReadWrite`);
//! 4. run, on the executor thread: a kernel there as core 0; a chip orchestration as one run of the
//!    chip engine, with every tensor handed over as device memory (`Backing::Device`) tagged
//!    from its access (`Read` -> `Input`, `Write` -> `Output`, `ReadWrite` -> `InOut`);
//! 5. on success, copy the elements of every writable host tensor back (on failure the host
//!    tensors are left as they were);
//! 6. fence the staging buffer again (rule A6 of `chip::arena`), whatever happened; it is
//!    freed when the chip shuts down.
//!
//! Nothing here trusts its input: bad tensors, unknown callables, failing or panicking kernels
//! and orchestrations all come back as errors, and the runtime stays usable.

use crate::dfx::timeline::TaskRecord;
use crate::engine::lease::{HighWater, Lease, LeaseArena};
use std::hash::{BuildHasher, RandomState};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, RwLock};
use std::thread;

use crate::callable::host::HostFnPtr;
use crate::callable::identity::{CallableHandle, CallableKind, Digest};
use crate::callable::registry::Registry;
use crate::chip::device::Device;
use crate::chip::sim::{BackendFactory, ChipSpec};
use crate::chip::staging::{self, Staging};
use crate::chip::{ChipBody, ChipFn, ChipOrchFnPtr};
use crate::data::buffer::{Access, Backing, BufferDesc, Identity, IdentityMinter};
use crate::data::call_config::CallConfig;
use crate::data::host_args::{HostArgs, KeptTensor, MappedTensor};
use crate::data::task_args::{Tag, TaskArgs};
use crate::data::tensor::{Tensor, TensorView};
use crate::engine::endpoint::{Dispatch, Endpoint, Outcome};
use crate::engine::heap::{HeapBlock, IntermediateHeap};
use crate::engine::scheduler::{Lane, LaneKind};
use crate::engine::{Bell, DeviceRules, DeviceUse, Engine, EngineConfig, LevelParts};
use crate::error::{Error, ErrorKind, Result};
use crate::sys::futex::Doorbell;
use crate::sys::sync;

/// The most runs a chip holds per-run resources for: one launched and one prepared.
pub(crate) const MAX_PIPELINE_DEPTH: u32 = 2;

/// How a chip is built: the spec its backend factory receives (its id is what
/// `Backing::Device::chip` names), and the factory.
#[derive(Clone)]
pub(crate) struct ChipConfig {
    pub(crate) spec: ChipSpec,
    pub(crate) backend: BackendFactory,
}

/// One tensor argument of a chip run.
pub(crate) enum ChipArg<'a> {
    /// Host memory mapped in this process (copied in before, out after; rule H1 of
    /// `data::host_args` holds by construction).
    Host(MappedTensor<'a>),
    /// Device memory of this chip.
    Device {
        /// Device pointer (offset) of the buffer.
        ptr: u64,
        /// The view, relative to the buffer's first byte.
        view: TensorView,
        /// The access the task holds.
        access: Access,
        /// The buffer's identity (its key for dependency tracking inside the chip).
        identity: Identity,
        /// The buffer's size in bytes.
        nbytes: u64,
    },
}

/// The callables installed on a chip, shared with its core threads.
type SharedRegistry = Arc<RwLock<Registry<ChipFn>>>;

/// The engine doorbell, shared with the core threads that ring it.
struct BellRef(Arc<Doorbell>);

impl AsRef<Doorbell> for BellRef {
    fn as_ref(&self) -> &Doorbell {
        &self.0
    }
}

/// The tag a chip orchestration sees for an argument with `access`.
fn tag_for(access: Access) -> Tag {
    match access {
        Access::Read => Tag::Input,
        Access::Write => Tag::Output,
        Access::ReadWrite => Tag::InOut,
    }
}

/// Calls a kernel on `core`'s behalf: builds its `HostArgs` (which checks that no writable
/// tensor overlaps another) and catches its panic. `Err` carries the failure message. The
/// caller holds the arena's kernel gate from before it made `tensors` (rules A3, A6 of
/// `chip::arena`).
fn call_kernel(
    f: HostFnPtr,
    tensors: Vec<MappedTensor<'_>>,
    scalars: &[u64],
    core: u32,
) -> std::result::Result<(), String> {
    let args = HostArgs::new(tensors, scalars, core).map_err(|e| format!("bad arguments: {e}"))?;
    match catch_unwind(AssertUnwindSafe(|| f(&args))) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(panic) => Err(format!("panicked: {}", crate::error::panic_message(&*panic))),
    }
}

/// The L2 leaf: a chip's device, its callables, and the engine that runs chip orchestrations
/// on its cores (see the [module docs](self)).
pub(crate) struct ChipRuntime {
    chip: u32,
    device: Arc<Device>,
    registry: SharedRegistry,
    engine: Arc<Engine>,
    closed: bool,
    /// Set for the duration of a run; still set at the next call only if a run unwound out of
    /// the runtime itself (user code is caught), after which the chip refuses further runs.
    in_run: bool,
    /// Mints the host scratch buffers' identities (a nonce of their own).
    scratch: IdentityMinter,
    /// The retained staging buffer of each pipeline slot (`chip::staging`).
    staging: Vec<Staging>,
    /// Per-slot generation high-water marks of the leases runs came with (rule L5).
    marks: HighWater,
    /// Leases for callers in this process that mint none of their own ([`ChipRuntime::run`],
    /// an L2 Worker, benchmarks).
    leases: LeaseArena,
    /// The launched, unfinalized run's lease.
    active: Option<Lease>,
    /// The prepared, unlaunched run's lease.
    waiting: Option<Lease>,
    /// The thread runs execute on.
    exec: Executor,
    /// What the executor thread calls after each run.
    notify: RunDone,
}

impl std::fmt::Debug for ChipRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChipRuntime")
            .field("chip", &self.chip)
            .field("cores", &self.device.cores())
            .field("memory", &self.device.size())
            .field("closed", &self.closed)
            .finish()
    }
}

impl ChipRuntime {
    /// Builds the chip: its device memory, its engine with one NEXT_LEVEL lane per core, and
    /// one thread per core (started here: create the runtime only after any fork, inside the
    /// process that will drive it). Every callable of `registry` is available at once.
    ///
    /// Zero cores or memory is an [`ErrorKind::InvalidArgument`] error; failing to map the
    /// memory or to start a thread is an [`ErrorKind::Os`] error.
    /// Its errors name the chip; [`build`](Self::build)'s do not.
    pub(crate) fn new(cfg: ChipConfig, registry: Registry<ChipFn>) -> Result<ChipRuntime> {
        let chip = cfg.spec.chip_id;
        ChipRuntime::build(cfg, registry).map_err(|e| e.context(format!("chip {chip}")))
    }

    /// [`new`](Self::new) for a caller that names the chip itself (a chip child, whose parent
    /// names it in `init`'s error): its errors say what failed, not on which chip.
    pub(crate) fn build(cfg: ChipConfig, registry: Registry<ChipFn>) -> Result<ChipRuntime> {
        let chip = cfg.spec.chip_id;
        let backend = cfg.backend.make(&cfg.spec).map_err(|e| e.context("making its backend"))?;
        let device = Arc::new(Device::new(chip, backend)?);
        let cores = device.cores();
        let bell = Arc::new(Doorbell::new());
        let engine_cfg = EngineConfig {
            heap_ring_size: 0, // `orch.alloc` uses the chip's memory (`ChipHeap`)
            pipeline_depth: 1,
            next_level_workers: cores,
            sub_workers: 0,
            next_level_kind: CallableKind::Chip,
            next_level_names: ("core", "WorkerBuilder::chip_cores(n)"),
            level: crate::level::Level::Chip,
            ..EngineConfig::default()
        };
        // Owner nonces of the buffers this chip mints, `orch.alloc` intermediates (the engine's)
        // and host scratch (its own, so the engine never takes scratch for a reclaimed
        // intermediate): random, so they never collide with identities minted by the parent.
        let nonce = RandomState::new().hash_one((chip, std::process::id()));
        let scratch = IdentityMinter::new(RandomState::new().hash_one((chip, std::process::id(), "scratch")));
        let parts = LevelParts {
            minter: Arc::new(IdentityMinter::new(nonce)),
            heap: Arc::new(ChipHeap { chip, device: device.clone() }),
            devices: Arc::new(OneChip { chip }),
        };
        let engine = Arc::new(Engine::new(engine_cfg, Bell::Shared(Arc::new(BellRef(bell.clone()))), parts)?);
        {
            let mut kinds = engine.callables().write();
            for (digest, _, _) in registry.iter() {
                kinds.insert(*digest, CallableKind::Chip);
            }
        }
        let registry = Arc::new(RwLock::new(registry));
        let shared = Arc::new(CoreShared { chip, device: device.clone(), registry: registry.clone() });
        let mut lanes = Vec::with_capacity(cores);
        for core in 0..cores as u32 {
            // On failure, the endpoints made so far stop their threads as `lanes` drops.
            let ep = CoreEndpoint::spawn(core, shared.clone(), bell.clone())?;
            lanes.push(Lane::named(LaneKind::NextLevel(core), Box::new(ep), format!("core {core}")));
        }
        engine.attach_lanes(lanes);
        let notify = RunDone::default();
        let exec = Executor::spawn(
            ExecCtx { chip, device: device.clone(), engine: engine.clone() },
            notify.clone(),
        )?;
        tracing::debug!(target: "simpler::chip", chip, cores, memory = device.size(), "chip ready");
        Ok(ChipRuntime {
            chip,
            device,
            registry,
            engine,
            closed: false,
            in_run: false,
            scratch,
            staging: vec![Staging::default()],
            marks: HighWater::new(1),
            leases: LeaseArena::new(1)?,
            active: None,
            waiting: None,
            exec,
            notify,
        })
    }

    fn read_registry(&self) -> std::sync::RwLockReadGuard<'_, Registry<ChipFn>> {
        sync::read(&self.registry)
    }

    /// Installs a chip callable under `digest` (which must be the sha256 of `descriptor`; see
    /// `Registry::install`) and makes it submittable by chip orchestrations. Returns its local
    /// slot.
    pub(crate) fn install(&mut self, digest: Digest, descriptor: &[u8], f: ChipFn) -> Result<u32> {
        let slot = sync::write(&self.registry).install(digest, descriptor, f)?;
        self.engine.callables().write().insert(digest, CallableKind::Chip);
        Ok(slot)
    }

    /// Drops one reference to `digest`; returns true when that removed it.
    pub(crate) fn release(&mut self, digest: &Digest) -> Result<bool> {
        let freed = sync::write(&self.registry).release(digest)?;
        if freed {
            self.engine.callables().write().remove(digest);
        }
        Ok(freed)
    }

    /// Whether `digest` is installed.
    pub(crate) fn contains(&self, digest: &Digest) -> bool {
        self.read_registry().contains(digest)
    }

    /// Has the executor thread call `f` after each run it finished (once per runtime; later
    /// calls are ignored): a driver that sleeps while a launched run executes wakes up to
    /// finalize it.
    pub(crate) fn on_run_done(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.notify.set(f);
    }

    /// Sets the granted pipeline depth (at least 1). Only while no run is prepared or
    /// launched: the staging buffers of slots past the new depth are freed, the marks and the
    /// chip's own leases start over.
    pub(crate) fn set_pipeline_depth(&mut self, depth: u32) -> Result<()> {
        if depth == 0 {
            return Err(Error::invalid(format!("chip {}: a pipeline depth of 0; use at least 1", self.chip)));
        }
        if self.active.is_some() || self.waiting.is_some() {
            return Err(Error::state(format!(
                "chip {}: the pipeline depth changes only while no run is in flight",
                self.chip
            )));
        }
        while self.staging.len() > depth as usize {
            if let Some(mut s) = self.staging.pop() {
                s.release(&self.device)?;
            }
        }
        self.staging.resize_with(depth as usize, Staging::default);
        self.marks = HighWater::new(depth);
        self.leases = LeaseArena::new(depth)?;
        Ok(())
    }

    /// Grants a pipeline depth of at most [`MAX_PIPELINE_DEPTH`] (`requested`, 0 counted as 1)
    /// and sizes the chip's per-run resources to it; returns the grant.
    pub(crate) fn grant_pipeline_depth(&mut self, requested: u32) -> Result<u32> {
        let granted = requested.clamp(1, MAX_PIPELINE_DEPTH);
        self.set_pipeline_depth(granted)?;
        Ok(granted)
    }

    /// A lease from the chip's own arena, for a test that drives the phases itself (`None`:
    /// every slot is taken by a run in flight).
    #[cfg(test)]
    pub(crate) fn acquire_lease(&mut self) -> Option<Lease> {
        self.leases.acquire()
    }

    /// A lease for a task that came with none: the current generation of the lowest slot
    /// other than `avoid` (the slot of the run the chip holds besides), which its high-water
    /// mark admits as is.
    pub(crate) fn local_lease(&self, avoid: Option<u32>) -> Lease {
        let slot = (0..self.marks.depth()).find(|&s| Some(s) != avoid).unwrap_or(0);
        Lease { slot, generation: self.marks.mark(slot).max(1) }
    }

    /// Raises `lease`'s slot mark to its generation (rule L5 of `engine::lease`), as if a run
    /// under it had been admitted: a chip that replaces a dead one starts from the leases its
    /// predecessor was given. Errors as [`HighWater::admit`] (a slot outside the grant).
    pub(crate) fn inherit_mark(&mut self, lease: Lease) -> Result<()> {
        self.marks.admit(lease)
    }

    /// Returns a lease of the chip's own arena (rule L3 of `engine::lease`; tests).
    #[cfg(test)]
    pub(crate) fn release_lease(&mut self, lease: Lease) -> Result<()> {
        self.leases.release(lease)
    }

    /// Records the prepared, unlaunched run (the executor thread, finishing a run, looks out
    /// for the next one only while there is one).
    fn set_waiting(&mut self, waiting: Option<Lease>) {
        self.waiting = waiting;
        self.exec.next_waits.store(waiting.is_some(), Ordering::Relaxed);
    }

    fn usable(&self) -> Result<()> {
        if self.closed {
            return Err(Error::state(format!("chip {} is shut down", self.chip)));
        }
        if self.in_run {
            return Err(Error::state(format!(
                "chip {} is unusable: an earlier run broke off inside the chip runtime",
                self.chip
            )));
        }
        Ok(())
    }

    /// Runs a chip callable with `args` (see the [module docs](self) for the steps): the
    /// blocking composition of [`prepare`](Self::prepare), [`launch_traced`](Self::launch_traced),
    /// [`wait`](Self::wait) and [`finalize`](Self::finalize), under a lease of the chip's own.
    ///
    /// It executes on the calling thread ([`launch_traced`](Self::launch_traced) hands a run to the chip's
    /// executor thread instead, for a caller that prepares the next run meanwhile). A kernel
    /// runs as core 0 (`worker_index() == 0`) and ignores
    /// `config`; a chip orchestration receives `config` and runs its kernels on the core
    /// threads. Device tensors must belong to this chip (the caller checks the owner; this
    /// checks liveness and bounds). Errors: an unknown digest is an [`ErrorKind::Callable`]
    /// error starting `UNKNOWN_CALLABLE`; a bad tensor an [`ErrorKind::InvalidArgument`] error;
    /// a failing or panicking kernel an [`ErrorKind::TaskFailed`] error with its message; a
    /// chip orchestration's own error, or else the first error of its run. Never panics on bad
    /// input. Returns once every kernel of the run has returned (a kernel that never returns
    /// blocks the chip, as on a device).
    pub(crate) fn run(
        &mut self,
        digest: &Digest,
        args: Vec<ChipArg<'_>>,
        scalars: &[u64],
        config: &CallConfig,
    ) -> Result<()> {
        self.run_traced(digest, args, scalars, config, false).0
    }

    /// [`run`](Self::run), and with `trace` the records of what it ran (its kernels on the
    /// cores, or a bare kernel as one task on core 0), for a task of a captured parent run;
    /// `None` when it ran nothing (it failed before its launch) or `trace` is off.
    pub(crate) fn run_traced(
        &mut self,
        digest: &Digest,
        args: Vec<ChipArg<'_>>,
        scalars: &[u64],
        config: &CallConfig,
        trace: bool,
    ) -> (Result<()>, Option<Vec<TaskRecord>>) {
        let mut records = None;
        let result = self.run_inner(digest, args, scalars, config, trace.then_some(&mut records));
        (result, records)
    }

    fn run_inner(
        &mut self,
        digest: &Digest,
        args: Vec<ChipArg<'_>>,
        scalars: &[u64],
        config: &CallConfig,
        records: Option<&mut Option<Vec<TaskRecord>>>,
    ) -> Result<()> {
        self.usable()?;
        let lease = self.leases.acquire().ok_or_else(|| {
            Error::state(format!(
                "chip {}: every pipeline slot is held by a run in flight; finalize one first",
                self.chip
            ))
        })?;
        self.in_run = true;
        let result = match self.prepare(lease, digest, args, scalars, config) {
            Err(e) => Err(e),
            Ok(mut run) => {
                // A kernel's failure is its own message (a parent's engine names the task and
                // the chip); called directly, this names them.
                let kernel = matches!(run.body, ChipBody::Kernel(_)).then(|| run.name.clone());
                let result = match self.launch_here(&mut run, records) {
                    Ok(()) => self.finalize(run),
                    Err(e) => {
                        let _ = self.finalize(run);
                        Err(e)
                    }
                };
                result.map_err(|e| match kernel {
                    Some(name) if e.kind() == ErrorKind::TaskFailed => {
                        e.context(format!("kernel `{name}` failed on chip {}", self.chip))
                    }
                    _ => e,
                })
            }
        };
        if let Err(e) = self.leases.release(lease) {
            tracing::error!(target: "simpler::chip", chip = self.chip, "returning {lease}: {e}");
        }
        self.in_run = false;
        result
    }

    /// Phase 1: admits `lease`, looks the callable up, checks the tensors, and stages the host
    /// tensors in the lease's slot (see the [module docs](self)). Overlaps the executing run.
    ///
    /// Refused (an [`ErrorKind::InvalidState`] error) while another run is prepared and not
    /// launched, for the slot of the executing run, or for a stale lease; otherwise errors as
    /// [`run`](Self::run)'s steps 1-3. A failed prepare leaves no run behind and nothing else
    /// changed: the executing run goes on.
    pub(crate) fn prepare<'a>(
        &mut self,
        lease: Lease,
        digest: &Digest,
        args: Vec<ChipArg<'a>>,
        scalars: &[u64],
        config: &CallConfig,
    ) -> Result<ChipRun<'a>> {
        self.prepare_inner(lease, digest, args, scalars, config, (false, false))
    }

    /// [`prepare`](Self::prepare), but the host inputs are not copied in yet: only checked and
    /// given their staging slices. Copy them with [`copy_in_some`](Self::copy_in_some), a piece
    /// at a time, so that a caller who copies also answers the executing run's end meanwhile;
    /// the run launches only once they are all in.
    pub(crate) fn prepare_deferred<'a>(
        &mut self,
        lease: Lease,
        digest: &Digest,
        args: Vec<ChipArg<'a>>,
        scalars: &[u64],
        config: &CallConfig,
    ) -> Result<ChipRun<'a>> {
        self.prepare_inner(lease, digest, args, scalars, config, (false, true))
    }

    /// Copies up to `budget` more bytes of the host inputs of a run prepared with
    /// [`prepare_deferred`](Self::prepare_deferred) into its staging slices (a budget of 0
    /// counts as 1); true once they are all in (at once for any other run). `args` are the
    /// run's tensors, mapped anew, as given to [`finalize_traced`](Self::finalize_traced); a
    /// tensor that differs from the one prepared is an [`ErrorKind::InvalidArgument`] error,
    /// and the run should then be finalized. A backend sees one `copy_to_device` per piece of
    /// a contiguous run the budget cuts.
    pub(crate) fn copy_in_some(
        &mut self,
        run: &mut ChipRun<'_>,
        args: &[ChipArg<'_>],
        budget: u64,
    ) -> Result<bool> {
        let Some((mut i, mut done)) = run.copying else { return Ok(true) };
        if !matches!(run.phase, Phase::Prepared) || args.len() != run.prepared.len() {
            return Err(Error::new(
                ErrorKind::Internal,
                format!(
                    "chip {}: copying in `{}` ({} tensors prepared, {} given) after it was launched or with other tensors",
                    self.chip,
                    run.name,
                    run.prepared.len(),
                    args.len()
                ),
            ));
        }
        // At least a byte per call, so a caller's loop always ends.
        let mut left = budget.max(1);
        while i < args.len() && left > 0 {
            let n = match &args[i] {
                ChipArg::Host(m) if m.access().can_read() => {
                    let p = &run.prepared[i];
                    self.device.copy_in_part(m, p.ptr, &p.view, (done, left)).map_err(|e| {
                        Error::invalid(format!(
                            "chip {}: `{}` tensor {i}: {}",
                            self.chip,
                            run.name,
                            e.message()
                        ))
                    })?
                }
                _ => 0,
            };
            if n < left {
                (i, done) = (i + 1, 0);
            } else {
                done += n;
            }
            left -= n;
        }
        run.copying = (i < args.len()).then_some((i, done));
        Ok(run.copying.is_none())
    }

    /// [`prepare`](Self::prepare) and [`launch_traced`](Self::launch_traced) at once, also while
    /// another run is prepared and waits (a successor staged before this run arrived): the run
    /// is never a prepared, unlaunched one, so the chip still holds at most one of those. Where
    /// it executes is `on`'s (on the calling thread, done when this returns).
    /// Refused while another run is launched and not finalized, or for the waiting run's slot.
    /// `launching` is called once the run is prepared, just before it is launched (a caller
    /// that must tell whether the run got as far as executing, should its process die).
    #[expect(clippy::too_many_arguments, reason = "prepare's arguments and how to launch")]
    pub(crate) fn start<'a>(
        &mut self,
        lease: Lease,
        digest: &Digest,
        args: Vec<ChipArg<'a>>,
        (scalars, config): (&[u64], &CallConfig),
        on: RunOn,
        trace: bool,
        launching: impl FnOnce(),
    ) -> Result<ChipRun<'a>> {
        if let Some(a) = self.active {
            return Err(Error::state(format!(
                "chip {}: starting a run under {lease} while the run under {a} executes; finalize it first",
                self.chip
            )));
        }
        let mut run = self.prepare_inner(lease, digest, args, scalars, config, (true, false))?;
        launching();
        let launched = match on {
            RunOn::Here => {
                let mut records = None;
                let r = self.launch_here(&mut run, trace.then_some(&mut records));
                if let Phase::Done(_, kept) = &mut run.phase {
                    *kept = records;
                }
                r
            }
            RunOn::Executor(back) => {
                run.copy_back_into(back);
                self.launch_traced(&mut run, trace)
            }
        };
        match launched {
            Ok(()) => Ok(run),
            Err(e) => {
                let _ = self.finalize(run);
                Err(e)
            }
        }
    }

    fn prepare_inner<'a>(
        &mut self,
        lease: Lease,
        digest: &Digest,
        args: Vec<ChipArg<'a>>,
        scalars: &[u64],
        config: &CallConfig,
        (ahead, deferred): (bool, bool),
    ) -> Result<ChipRun<'a>> {
        if self.closed {
            return Err(Error::state(format!("chip {} is shut down", self.chip)));
        }
        if let Some(w) = self.waiting
            && (!ahead || w.slot == lease.slot)
        {
            return Err(Error::state(format!(
                "chip {}: preparing a run under {lease} while the run under {w} is prepared and not launched; a chip holds one prepared run",
                self.chip
            )));
        }
        if let Some(a) = self.active
            && a.slot == lease.slot
        {
            return Err(Error::state(format!(
                "chip {}: preparing a run under {lease} while the run under {a} executes in the same slot",
                self.chip
            )));
        }
        self.marks.admit(lease).map_err(|e| e.context(format!("chip {}", self.chip)))?;
        let Some(f) = self.read_registry().get(digest).cloned() else {
            return Err(Error::new(
                ErrorKind::Callable,
                format!("UNKNOWN_CALLABLE: {digest} is not registered on chip {}", self.chip),
            ));
        };
        let _span = tracing::debug_span!(target: "simpler::chip", "chip prepare", chip = self.chip, callable = f.name(), slot = lease.slot, generation = lease.generation)
            .entered();
        let prepared = self.stage(&f, &args, lease.slot as usize, !deferred)?;
        if !ahead {
            self.set_waiting(Some(lease));
        }
        Ok(ChipRun {
            lease,
            name: f.name().to_string(),
            body: f.body(),
            args,
            prepared,
            scalars: scalars.to_vec(),
            config: config.clone(),
            phase: Phase::Prepared,
            ahead,
            copying: deferred.then_some((0, 0)),
            back: None,
            backed: false,
        })
    }

    /// [`launch_traced`](Self::launch_traced) of a run that is not traced (tests).
    #[cfg(test)]
    pub(crate) fn launch(&mut self, run: &mut ChipRun<'_>) -> Result<()> {
        self.launch_traced(run, false)
    }

    /// Phase 2: hands the prepared `run` to the executor thread and returns; with `trace` the
    /// run records what it runs (given back by [`finalize_traced`](Self::finalize_traced)).
    /// Refused (an [`ErrorKind::InvalidState`] error) while another run is launched and not
    /// finalized, or for a run that is not this chip's prepared one.
    pub(crate) fn launch_traced(&mut self, run: &mut ChipRun<'_>, trace: bool) -> Result<()> {
        let job = self.launchable(run, trace)?;
        self.exec.send(job).map_err(|e| e.context(format!("chip {}", self.chip)))?;
        if self.waiting == Some(run.lease) {
            self.set_waiting(None);
        }
        self.active = Some(run.lease);
        run.phase = Phase::Launched;
        Ok(())
    }

    /// [`launch_traced`](Self::launch_traced), but the run executes here, on the calling thread, and is done
    /// when this returns: what the blocking [`run`](Self::run) does when no other run of the
    /// chip is prepared to overlap it (a hop to the executor thread and back would cost two
    /// wake-ups per chip task for nothing).
    fn launch_here(
        &mut self,
        run: &mut ChipRun<'_>,
        records: Option<&mut Option<Vec<TaskRecord>>>,
    ) -> Result<()> {
        let mut job = self.launchable(run, records.is_some())?;
        if self.waiting == Some(run.lease) {
            self.set_waiting(None);
        }
        self.active = Some(run.lease);
        let ctx = ExecCtx { chip: self.chip, device: self.device.clone(), engine: self.engine.clone() };
        let mut traced = None;
        // On this thread, which would be the one to shut the chip down.
        let result = ctx.run_job(&mut job, &mut traced, &AtomicBool::new(false));
        if let Some(out) = records {
            *out = traced;
            run.phase = Phase::Done(result, None);
        } else {
            run.phase = Phase::Done(result, traced);
        }
        Ok(())
    }

    /// The checks of a launch, the run's staging buffer unfenced, and the job to execute (with
    /// the host tensors its outputs go back to, when the run was given them).
    fn launchable(&mut self, run: &mut ChipRun<'_>, trace: bool) -> Result<ExecJob> {
        if !matches!(run.phase, Phase::Prepared) || !(run.ahead || self.waiting == Some(run.lease)) {
            return Err(Error::state(format!(
                "chip {}: the run under {} is not this chip's prepared run",
                self.chip, run.lease
            )));
        }
        if let Some(a) = self.active {
            return Err(Error::state(format!(
                "chip {}: launching the run under {} while the run under {a} executes; finalize it first",
                self.chip, run.lease
            )));
        }
        if !run.copied() {
            return Err(Error::state(format!(
                "chip {}: launching the run under {} before its host inputs are all copied in",
                self.chip, run.lease
            )));
        }
        if let Some(ptr) = self.staging[run.lease.slot as usize].ptr() {
            self.device.arena().unfence(ptr)?;
        }
        let back = run.back.take();
        run.backed = back.is_some();
        Ok(ExecJob {
            lease: run.lease,
            name: run.name.clone(),
            body: run.body,
            prepared: run.prepared.clone(),
            scalars: run.scalars.clone(),
            config: run.config.clone(),
            trace,
            back,
        })
    }

    /// Phase 3, without blocking: true once the launched `run` is done (or when it is not
    /// launched at all).
    pub(crate) fn poll(&mut self, run: &mut ChipRun<'_>) -> bool {
        if matches!(run.phase, Phase::Launched)
            && let Some((result, records)) = self.exec.try_take(run.lease, self.chip)
        {
            run.phase = Phase::Done(result, records);
        }
        !matches!(run.phase, Phase::Launched)
    }

    /// Phase 3: blocks until the launched `run` is done.
    pub(crate) fn wait(&mut self, run: &mut ChipRun<'_>) {
        if matches!(run.phase, Phase::Launched) {
            let (result, records) = self.exec.take(run.lease, self.chip);
            run.phase = Phase::Done(result, records);
        }
    }

    /// Phase 4: waits for `run` if needed, copies its writable host tensors back on success,
    /// fences its staging buffer and returns its result. A run finalized before it was
    /// launched gives up its prepared place and fails with an [`ErrorKind::InvalidState`]
    /// error saying so.
    pub(crate) fn finalize(&mut self, run: ChipRun<'_>) -> Result<()> {
        self.finalize_traced(run, None).0
    }

    /// [`finalize`](Self::finalize), copying the outputs back into `outputs` (the run's host
    /// tensors, mapped again: a [`detach`](ChipRun::detach)ed run holds none) when given, and
    /// with the records of what the run ran when it was launched traced.
    pub(crate) fn finalize_traced(
        &mut self,
        mut run: ChipRun<'_>,
        outputs: Option<&[ChipArg<'_>]>,
    ) -> (Result<()>, Option<Vec<TaskRecord>>) {
        self.wait(&mut run);
        let slot = run.lease.slot as usize;
        // The run gives its slot's block up (after this call, which holds the runtime, nobody
        // may take it meanwhile: the copy-back below still reads it).
        if let Some(s) = self.staging.get_mut(slot) {
            s.idle();
        }
        let (result, records) = match std::mem::replace(&mut run.phase, Phase::Finished) {
            Phase::Prepared => {
                if self.waiting == Some(run.lease) {
                    self.set_waiting(None);
                }
                let err = Error::state(format!(
                    "chip {}: the run under {} was finalized before it was launched",
                    self.chip, run.lease
                ));
                return (Err(err), None);
            }
            Phase::Done(result, records) => (result, records),
            Phase::Launched | Phase::Finished => unreachable!("waited for above"),
        };
        let args = std::mem::take(&mut run.args);
        let targets = outputs.unwrap_or(&args);
        // Copied back already, by whoever executed it, when the run was given its outputs.
        let result = result.and_then(|()| {
            if run.backed {
                return Ok(());
            }
            if targets.len() != run.prepared.len() {
                return Err(Error::new(
                    ErrorKind::Internal,
                    format!(
                        "chip {}: `{}` was prepared with {} tensors and finalized with {}",
                        self.chip,
                        run.name,
                        run.prepared.len(),
                        targets.len()
                    ),
                ));
            }
            for (i, (arg, p)) in targets.iter().zip(&run.prepared).enumerate() {
                if let ChipArg::Host(m) = arg
                    && m.access().can_write()
                {
                    self.device.copy_out(p.ptr, &p.view, m).map_err(|e| {
                        e.context(format!(
                            "chip {}: copying back host tensor {i} of `{}`",
                            self.chip, run.name
                        ))
                    })?;
                }
            }
            Ok(())
        });
        if let Some(ptr) = self.staging.get(slot).and_then(Staging::ptr)
            && let Err(e) = self.device.arena().fence(ptr)
        {
            tracing::error!(target: "simpler::chip", chip = self.chip, "fencing the staging buffer: {e}");
        }
        if self.active == Some(run.lease) {
            self.active = None;
        }
        (result, records)
    }

    /// Steps 2 and 3: device tensors checked, host tensors given a slice of slot `slot`'s
    /// staging buffer (grown first when the run needs more, before anything is copied) and,
    /// when readable and `copy`, copied into it.
    fn stage(&mut self, f: &ChipFn, args: &[ChipArg<'_>], slot: usize, copy: bool) -> Result<Vec<Prepared>> {
        let chip = self.chip;
        let device = self.device.clone();
        let host_sizes = args.iter().filter_map(|a| match a {
            ChipArg::Host(m) => {
                let (start, end) = m.view().byte_range();
                Some(end - start)
            }
            ChipArg::Device { .. } => None,
        });
        let (offsets, need) =
            staging::layout(host_sizes).map_err(|e| e.context(format!("chip {chip}: `{}`", f.name())))?;
        let mut reserved = self.staging[slot].reserve(&device, need);
        if reserved.as_ref().is_err_and(|e| e.kind() == ErrorKind::ResourceExhausted) {
            // Another slot's block that serves no run now gives its memory back, and the
            // grow is tried again.
            let mut freed = false;
            for (i, other) in self.staging.iter_mut().enumerate() {
                if i != slot && other.reclaimable() {
                    other.release(&device)?;
                    freed = true;
                }
            }
            if freed {
                reserved = self.staging[slot].reserve(&device, need);
            }
        }
        let base = reserved.map_err(|e| {
            e.context(format!(
                "chip {chip}: `{}`: device scratch for its host tensors ({need} bytes in the staging buffer of pipeline slot {slot})",
                f.name()
            ))
        })?;
        let mut offsets = offsets.into_iter();
        let mut out = Vec::with_capacity(args.len());
        for (i, arg) in args.iter().enumerate() {
            let bad = |msg: String| Error::invalid(format!("chip {chip}: `{}` tensor {i}: {msg}", f.name()));
            match arg {
                ChipArg::Device { ptr, view, access, identity, nbytes } => {
                    let (_, end) = view.byte_range();
                    if end > *nbytes {
                        return Err(bad(format!(
                            "its view ends at byte {end}, past its {nbytes}-byte device buffer"
                        )));
                    }
                    if !device.is_live_as(*ptr, *nbytes, *identity) {
                        return Err(bad(format!(
                            "device buffer {identity} at {ptr:#x} (+{nbytes} bytes) is not a live allocation of this chip (freed, or never allocated here)"
                        )));
                    }
                    out.push(Prepared {
                        ptr: *ptr,
                        view: *view,
                        access: *access,
                        identity: *identity,
                        nbytes: *nbytes,
                    });
                }
                ChipArg::Host(m) => {
                    let (start, end) = m.view().byte_range();
                    let size = end - start;
                    let view =
                        TensorView::new(0, m.view().shape(), Some(m.view().strides()), m.view().dtype())
                            .map_err(|e| bad(e.message().to_string()))?;
                    let at = offsets.next().expect("one slice per host tensor");
                    let ptr = base.expect("a staging block when a host tensor is staged") + at;
                    // A write-only tensor is not copied in: its slice holds what an earlier run
                    // left there, as freshly allocated device memory would (never the host's
                    // bytes).
                    if copy && m.access().can_read() {
                        device.copy_in(m, ptr, &view).map_err(|e| bad(e.message().to_string()))?;
                    }
                    let identity = self.scratch.mint()?;
                    out.push(Prepared { ptr, view, access: m.access(), identity, nbytes: size });
                }
            }
        }
        Ok(out)
    }

    /// Allocates device memory through the backend (see [`ChipBackend::malloc`]).
    pub(crate) fn malloc(&mut self, nbytes: u64, id: Identity) -> Result<u64> {
        self.device.malloc(nbytes, id).map_err(|e| e.context(format!("chip {}", self.chip)))
    }

    /// Frees device memory through the backend (see [`ChipBackend::free`]).
    pub(crate) fn free(&mut self, ptr: u64) -> Result<()> {
        self.device.free(ptr).map_err(|e| e.context(format!("chip {}", self.chip)))
    }

    /// Host to device, through the backend (see [`ChipBackend::copy_to_device`]); only into a
    /// block this chip holds.
    pub(crate) fn copy_to_device(&mut self, dst: u64, src: &[u8]) -> Result<()> {
        self.check_held("copy to device", dst, src.len() as u64)?;
        self.device.copy_to_device(dst, src).map_err(|e| e.context(format!("chip {}", self.chip)))
    }

    /// Device to host, through the backend (see [`ChipBackend::copy_from_device`]); only from a
    /// block this chip holds.
    pub(crate) fn copy_from_device(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.check_held("copy from device", src, dst.len() as u64)?;
        self.device.copy_from_device(src, dst).map_err(|e| e.context(format!("chip {}", self.chip)))
    }

    fn check_held(&self, what: &str, ptr: u64, len: u64) -> Result<()> {
        if self.device.is_live(ptr, len) {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "chip {}: {what}: device range {ptr:#x}..+{len} does not lie inside one live allocation (of this chip's {} bytes)",
            self.chip,
            self.device.size()
        )))
    }

    /// Stops the core threads (waits for a running kernel to return). Idempotent; also done on
    /// drop. Memory operations keep working afterwards; runs are refused.
    pub(crate) fn shutdown(&mut self) {
        if !self.closed {
            self.closed = true;
            self.exec.stop();
            self.engine.mark_closed();
            self.engine.shutdown_lanes();
            for s in &mut self.staging {
                if let Err(e) = s.release(&self.device) {
                    tracing::error!(target: "simpler::chip", chip = self.chip, "freeing a staging buffer: {e}");
                }
            }
        }
    }

    /// Device allocations made through the backend so far (`chip_staging_allocs_per_run`, for
    /// the pipeline benchmark and the tests).
    #[cfg(any(test, feature = "bench-support"))]
    pub(crate) fn device_allocations(&self) -> u64 {
        self.device.allocations()
    }

    /// Changes the chip engine's configuration (tests only): stops the executor thread, which
    /// shares the engine, and starts a new one.
    #[cfg(test)]
    pub(crate) fn tune_engine(&mut self, f: impl FnOnce(&mut EngineConfig)) {
        self.exec.stop();
        f(Arc::get_mut(&mut self.engine).expect("only the runtime holds the engine").config_mut());
        let ctx = ExecCtx { chip: self.chip, device: self.device.clone(), engine: self.engine.clone() };
        self.exec = Executor::spawn(ctx, self.notify.clone()).expect("restarting the executor thread");
    }

    /// Bytes of device memory held outside the staging buffers (what users and `orch.alloc`
    /// hold), rounded to blocks.
    #[cfg(test)]
    pub(crate) fn used_outside_staging(&self) -> u64 {
        let staged: u64 = self
            .staging
            .iter()
            .map(|s| s.capacity().next_multiple_of(crate::chip::arena::DEVICE_ALIGN))
            .sum();
        self.device.arena().used() - staged
    }
}

impl Drop for ChipRuntime {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Where [`ChipRuntime::start`] executes a run.
pub(crate) enum RunOn {
    /// On the calling thread: done when `start` returns.
    Here,
    /// On the chip's executor thread, which also copies the run's outputs back into the given
    /// host tensors ([`ChipRun::copy_back_into`]).
    Executor(CopyBack),
}

/// Where a [`ChipRun`] is.
enum Phase {
    Prepared,
    Launched,
    /// Its result, and the records of what it ran when it was launched traced.
    Done(Result<()>, Option<Vec<TaskRecord>>),
    Finished,
}

/// One chip run between [`ChipRuntime::prepare`] and [`ChipRuntime::finalize`]: its lease, its
/// callable, its arguments (host tensors borrowed until their outputs are copied back) and
/// where it is. Give every run to `finalize`: a launched run dropped unfinalized leaves the
/// chip refusing further launches.
pub(crate) struct ChipRun<'a> {
    lease: Lease,
    name: String,
    body: ChipBody,
    args: Vec<ChipArg<'a>>,
    prepared: Vec<Prepared>,
    scalars: Vec<u64>,
    config: CallConfig,
    phase: Phase,
    /// Prepared by [`ChipRuntime::start`], to launch at once (not the chip's prepared run).
    ahead: bool,
    /// Host inputs still to copy in (a run prepared with its copy-in deferred): the next
    /// tensor's index and the bytes of it already in. `None` once all are in.
    copying: Option<(usize, u64)>,
    /// The host tensors its outputs go back to as soon as it has executed, given by
    /// [`ChipRun::copy_back_into`], until it launches.
    back: Option<CopyBack>,
    /// Launched with `back`: its executor copies its outputs back, not `finalize`.
    backed: bool,
}

impl std::fmt::Debug for ChipRun<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChipRun").field("lease", &self.lease).field("callable", &self.name).finish()
    }
}

impl ChipRun<'_> {
    /// The run without its host tensors, which it needs only to copy its outputs back: give
    /// them to [`ChipRuntime::finalize_traced`] again, mapped anew. For a caller that keeps a
    /// run across requests (a two-frame chip child), while the mappings it borrowed change.
    pub(crate) fn detach(self) -> ChipRun<'static> {
        ChipRun {
            lease: self.lease,
            name: self.name,
            body: self.body,
            args: Vec::new(),
            prepared: self.prepared,
            scalars: self.scalars,
            config: self.config,
            phase: self.phase,
            ahead: self.ahead,
            copying: self.copying,
            back: self.back,
            backed: self.backed,
        }
    }

    /// Has the run's outputs copied back into `back` by whoever executes it, as soon as it
    /// has executed successfully, rather than by [`ChipRuntime::finalize_traced`]: a
    /// pipelined chip's executor thread then copies them back while the chip thread goes on
    /// copying the next run in. `back` holds every writable host tensor of the run, each with
    /// its index among the run's tensors. Only before the run launches.
    pub(crate) fn copy_back_into(&mut self, back: CopyBack) {
        self.back = Some(back);
    }

    /// Whether its outputs go back through [`copy_back_into`](Self::copy_back_into)'s tensors.
    pub(crate) fn copies_back(&self) -> bool {
        self.back.is_some() || self.backed
    }

    /// Whether every host input of the run is in its staging slice (only a run prepared with
    /// [`ChipRuntime::prepare_deferred`] may still lack some).
    pub(crate) fn copied(&self) -> bool {
        self.copying.is_none()
    }

    /// The lease the run holds.
    pub(crate) fn lease(&self) -> Lease {
        self.lease
    }
}

/// A tensor ready to run: device memory of this chip.
#[derive(Clone)]
struct Prepared {
    ptr: u64,
    view: TensorView,
    access: Access,
    identity: Identity,
    nbytes: u64,
}

mod cores;
mod executor;
mod heap;
#[cfg(test)]
mod tests;

use cores::{CoreEndpoint, CoreShared};
pub(crate) use executor::{CopyBack, END_WINDOW, RunDone};
use executor::{ExecCtx, ExecJob, Executor};
use heap::{ChipHeap, OneChip};
