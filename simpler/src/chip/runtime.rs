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
//! # Files
//!
//! This file holds the runtime's setup (the device, the engine over the cores, the executor
//! thread), its callables, its pipeline depth and leases, and its memory operations. Beside it
//! in `runtime/`: `phases.rs` (a run's phases, prepare -> launch -> poll / wait -> finalize,
//! and their blocking composition `run`; [`ChipRun`]), `executor.rs` (the executor thread),
//! `cores.rs` (the core threads) and `heap.rs` (the chip engine's level parts).
//!
//! Nothing here trusts its input: bad tensors, unknown callables, failing or panicking kernels
//! and orchestrations all come back as errors, and the runtime stays usable.
//!
//! A run looks the callable up, checks device tensors, copies readable host tensors into
//! slices of its slot's staging buffer, runs a kernel as core 0 or a chip orchestration as one
//! `build_run` on the in-process engine whose NEXT_LEVEL lanes are the core threads
//! (`CoreEndpoint`), copies writable host tensors back on success and fences the staging buffer
//! again (the phases: `runtime/phases.rs`). That engine's `LevelParts` are `ChipHeap`
//! (`orch.alloc` hands out device memory, freed when its slot is consumed) and `OneChip`;
//! scratch identities use their own nonce, so the engine never takes scratch for an
//! intermediate.
//!
//! # Pipelining
//!
//! * **Leases** (`engine::lease`): the runtime keeps one `HighWater` over its granted depth
//!   ([`ChipRuntime::set_pipeline_depth`], default 1) and refuses a stale, invalid or
//!   out-of-grant lease at `prepare` (rule L5 of `engine::lease`); it also owns a `LeaseArena`
//!   of its own for callers that mint none (`run`, the L2 Worker, the benchmark); a chip
//!   child never runs a task frame without a lease (it refuses generation 0 before the
//!   runtime sees the task, rule L1). Before it
//!   reports ready, a chip child admits the leases last posted to its mailbox as its marks (they
//!   survive a replacement, rule M12 of `ipc::mailbox`), so a replacement refuses leases older
//!   than its predecessor's.
//! * **The grant.** Each chip child grants `min(pipeline_depth, 2)`
//!   ([`ChipRuntime::grant_pipeline_depth`]: one launched and one prepared run), sizes its slots
//!   to it and publishes the grant in its mailbox before it reports ready (rule M9).
//! * **Resource classes** per slot: `HostPerRun` = the slot's retained staging buffer
//!   (`chip/staging.rs`), `ExecHandle` = a `ChipRun` token (at most one launched and one
//!   prepared), `DeviceScratch` = the chip engine and its `orch.alloc` memory (one, used by the
//!   launched run alone).
//! * **Measured** (`benches/chip_pipeline.rs`): `chip_pipeline_speedup` through a Worker (the
//!   median over rounds of depth 1's wall time over depth 2's, measured back to back; 1.36-1.77x,
//!   median 1.64x, on a 2-vCPU guest, target 1.5x; the kernel calibrated to the copy-in from the
//!   chip's own records of captured runs), against `chip_pipeline_overlap_ceiling`, what two
//!   threads of the machine overlap at best, and the same runs through the runtime alone
//!   (`bench_support::chip_pipeline`); the README says what a run costs at depth 2.

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
use crate::chip::backend::{BackendFactory, ChipSpec, DeviceTensor};
use crate::chip::device::Device;
use crate::chip::staging::{self, Staging};
use crate::chip::{ChipBody, ChipFn, ChipOrchFnPtr, KernelRef, RunBody};
use crate::data::buffer::{Access, Backing, BufferDesc, Identity, IdentityMinter};
use crate::data::call_config::CallConfig;
use crate::data::host_args::{HostArgs, KeptTensor, MappedTensor};
use crate::data::task_args::{Tag, TaskArgs};
use crate::data::tensor::{Tensor, TensorView};
use crate::engine::endpoint::{Dispatch, Endpoint, Outcome};
use crate::engine::heap::{HeapBlock, IntermediateHeap, Place};
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

/// What a chip run calls: the callable's digest, its tensors, its scalars and its config (a
/// kernel ignores the config).
pub(crate) struct ChipCall<'a> {
    /// The callable.
    pub(crate) digest: Digest,
    /// Its tensor arguments.
    pub(crate) args: Vec<ChipArg<'a>>,
    /// Its scalar arguments.
    pub(crate) scalars: Vec<u64>,
    /// The call's config (a chip orchestration receives it).
    pub(crate) config: CallConfig,
}

impl<'a> ChipCall<'a> {
    /// A call of `digest` on `args`, with no scalars and the default config (tests).
    #[cfg(test)]
    pub(crate) fn new(digest: Digest, args: Vec<ChipArg<'a>>) -> ChipCall<'a> {
        ChipCall { digest, args, scalars: Vec::new(), config: CallConfig::default() }
    }
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
pub(crate) fn call_kernel(
    f: HostFnPtr,
    tensors: Vec<MappedTensor<'_>>,
    scalars: &[u64],
    core: u32,
) -> std::result::Result<(), String> {
    let args = HostArgs::new(tensors, scalars, core).map_err(|e| format!("bad arguments: {e}"))?;
    let result = catch_unwind(AssertUnwindSafe(|| f(&args)));
    // A child of a fork the kernel made returned here: it leaves (rule P6 of `sys::process`).
    crate::sys::process::leave_if_forked_copy(matches!(result, Ok(Ok(()))));
    match result {
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
            for (digest, _, f) in registry.iter() {
                if let Some(def) = f.kernel_def()
                    && (!f.is_linked() || device.can_run(&def))
                {
                    device.load_kernel(&def)?;
                }
                kinds.insert(*digest, f.registered());
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
    /// A kernel new to the chip is loaded on its device first (compiled, for a device
    /// backend): a failure installs nothing and names the chip.
    pub(crate) fn install(&mut self, digest: Digest, descriptor: &[u8], f: ChipFn) -> Result<u32> {
        let fresh = !self.read_registry().contains(&digest);
        // A `#[callable(chip)]` the device cannot run (a Rust-only kernel on an OpenCL chip) is
        // registered, not loaded: every Worker of the binary registers them all, and a task that
        // names it here fails at launch, naming it.
        if fresh
            && let Some(def) = f.kernel_def()
            && (!f.is_linked() || self.device.can_run(&def))
        {
            self.device.load_kernel(&def).map_err(|e| e.context(format!("chip {}", self.chip)))?;
        }
        let registered = f.registered();
        let installed = sync::write(&self.registry).install(digest, descriptor, f);
        if fresh && installed.is_err() {
            self.device.unload_kernel(&digest);
        }
        let slot = installed?;
        self.engine.callables().write().insert(digest, registered);
        Ok(slot)
    }

    /// Drops one reference to `digest`; returns true when that removed it.
    pub(crate) fn release(&mut self, digest: &Digest) -> Result<bool> {
        let freed = sync::write(&self.registry).release(digest)?;
        if freed {
            self.engine.callables().write().remove(digest);
            self.device.unload_kernel(digest);
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

    /// A lease from the chip's own arena, for a caller that mints none (`None`: every slot is
    /// taken by a run in flight).
    #[cfg(test)]
    pub(crate) fn acquire_lease(&mut self) -> Option<Lease> {
        self.leases.acquire()
    }

    /// A lease for a caller that drives the runtime directly and mints none (the benchmarks):
    /// the current generation of the lowest slot other than `avoid` (the slot of the run the
    /// chip holds besides), which its high-water mark admits as is. A task frame never gets
    /// one: the chip child refuses a frame without a lease (rule L1 of `engine::lease`).
    #[cfg(feature = "bench-support")]
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

    /// Returns a lease of the chip's own arena (rule L3 of `engine::lease`).
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

    /// Allocates device memory through the backend (see
    /// [`ChipBackend::malloc`](super::ChipBackend::malloc)).
    pub(crate) fn malloc(&mut self, nbytes: u64, id: Identity) -> Result<u64> {
        self.device.malloc(nbytes, id).map_err(|e| e.context(format!("chip {}", self.chip)))
    }

    /// Allocates a level's device heap block (see `Device::malloc_shared`).
    pub(crate) fn malloc_shared(&mut self, nbytes: u64) -> Result<u64> {
        self.device.malloc_shared(nbytes).map_err(|e| e.context(format!("chip {}", self.chip)))
    }

    /// Frees device memory through the backend (see
    /// [`ChipBackend::free`](super::ChipBackend::free)).
    pub(crate) fn free(&mut self, ptr: u64) -> Result<()> {
        self.device.free(ptr).map_err(|e| e.context(format!("chip {}", self.chip)))
    }

    /// Host to device, through the backend (see
    /// [`ChipBackend::copy_to_device`](super::ChipBackend::copy_to_device)); only into a block
    /// this chip holds.
    pub(crate) fn copy_to_device(&mut self, dst: u64, src: &[u8]) -> Result<()> {
        self.check_held("copy to device", dst, src.len() as u64)?;
        self.device.copy_to_device(dst, src).map_err(|e| e.context(format!("chip {}", self.chip)))
    }

    /// Device to host, through the backend (see
    /// [`ChipBackend::copy_from_device`](super::ChipBackend::copy_from_device)); only from a
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

    /// Device allocations made through the backend so far (`chip_staging_allocs_per_run`).
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
    /// hold).
    #[cfg(test)]
    pub(crate) fn used_outside_staging(&self) -> u64 {
        let staged: u64 = self.staging.iter().map(|s| s.capacity()).sum();
        self.device.held_bytes() - staged
    }
}

impl Drop for ChipRuntime {
    fn drop(&mut self) {
        self.shutdown();
    }
}

mod cores;
mod executor;
mod heap;
mod phases;
#[cfg(test)]
mod tests;
/// The same suite on a chip whose memory the host cannot read (`chip::DiscreteSim`).
#[cfg(test)]
#[expect(clippy::duplicate_mod, reason = "the chip suite runs twice: on a SimChip and on a DiscreteSim")]
#[path = "runtime/tests.rs"]
mod tests_discrete;
/// The same suite on an OpenCL chip (feature `opencl`; CI runs it on PoCL), kernels from their
/// OpenCL C source, less the tests whose kernels only Rust can write.
#[cfg(all(test, feature = "opencl"))]
#[expect(clippy::duplicate_mod, reason = "the chip suite runs on every backend")]
#[path = "runtime/tests.rs"]
mod tests_opencl;

use cores::{CoreEndpoint, CoreShared};
pub(crate) use executor::{CopyBack, END_WINDOW, RunDone};
use executor::{ExecCtx, ExecJob, Executor};
use heap::{ChipHeap, OneChip};
use phases::Prepared;
pub(crate) use phases::{ChipRun, CopyIn, RunOn, Trace};
