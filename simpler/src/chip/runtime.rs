//! `ChipRuntime`: the L2 leaf an L3 chip child (or an in-process L2 Worker) drives.
//!
//! A runtime owns its chip's [`Device`] (the backend a [`ChipBackend`](super::ChipBackend)
//! factory made, a [`SimChip`](super::SimChip) by default, with the checks of `device.rs`), a
//! registry of chip callables and an
//! in-process [`Engine`] whose NEXT_LEVEL workers are the chip's cores. Each core is an
//! [`Endpoint`] backed by one thread; the engine has no background thread: the thread that
//! calls [`ChipRuntime::run`] builds the chip orchestration's graph and then drives the engine
//! until the run is done (the scheduler role, see the engine's module docs).
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
//! 4. run: a kernel on the calling thread as core 0; a chip orchestration as one run of the
//!    chip engine, with every tensor handed over as device memory (`Backing::Device`) tagged
//!    from its access (`Read` -> `Input`, `Write` -> `Output`, `ReadWrite` -> `InOut`);
//! 5. on success, copy the elements of every writable host tensor back (on failure the host
//!    tensors are left as they were);
//! 6. fence the staging buffer again (rule A6 of `chip::arena`), whatever happened; it is
//!    freed when the chip shuts down.
//!
//! Nothing here trusts its input: bad tensors, unknown callables, failing or panicking kernels
//! and orchestrations all come back as errors, and the runtime stays usable.

use std::hash::{BuildHasher, RandomState};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU32, Ordering};
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
use crate::data::host_args::{HostArgs, MappedTensor};
use crate::data::task_args::{Tag, TaskArgs};
use crate::data::tensor::{Tensor, TensorView};
use crate::engine::endpoint::{Dispatch, Endpoint, Outcome};
use crate::engine::heap::{HeapBlock, IntermediateHeap};
use crate::engine::scheduler::{Lane, LaneKind};
use crate::engine::{Bell, DeviceRules, DeviceUse, Engine, EngineConfig, LevelParts};
use crate::error::{Error, ErrorKind, Result};
use crate::sys::futex::Doorbell;
use crate::sys::sync;

/// The chip's device memory as the chip engine's [`IntermediateHeap`]: `orch.alloc` inside a chip
/// orchestration carves its intermediates from it, so they count against the chip's memory
/// and kernels only ever touch device memory.
struct ChipHeap {
    chip: u32,
    device: Arc<Device>,
}

impl IntermediateHeap for ChipHeap {
    fn alloc(&self, _ring: usize, bytes: u64) -> Result<Option<(HeapBlock, Backing)>> {
        // `None`: no free block large enough now; a release may make room.
        let ptr = self
            .device
            .try_malloc(bytes)
            .map_err(|e| e.context(format!("orch.alloc on chip {}", self.chip)))?;
        Ok(ptr.map(|ptr| (HeapBlock { ring: 0, id: ptr }, Backing::Device { ptr, chip: self.chip })))
    }

    fn release(&self, block: HeapBlock) {
        if let Err(e) = self.device.free(block.id) {
            // The engine frees each allocation once, when its slot is consumed.
            debug_assert!(false, "freeing an orch.alloc block: {e}");
            tracing::error!(target: "simpler::chip", chip = self.chip, "freeing an orch.alloc block: {e}");
        }
    }

    fn hands_out(&self, backing: &Backing) -> bool {
        matches!(backing, Backing::Device { chip, .. } if *chip == self.chip)
    }

    fn exhausted(&self, _ring: usize) -> (String, &'static str, u64) {
        (format!("out of device memory on chip {}", self.chip), "chip_memory", self.device.size())
    }
}

/// The chip engine's device rule: device memory of this chip may go to any of its cores (the
/// core checks the allocation is live when it starts the kernel); another chip's never.
struct OneChip {
    chip: u32,
}

impl DeviceRules for OneChip {
    fn check(&self, u: &DeviceUse<'_>) -> Result<()> {
        if u.chip == self.chip {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "{}: tensor {} is device memory of chip {}, but this orchestration runs on chip {}; device memory is usable only by its own chip",
            u.callable, u.tensor, u.chip, self.chip
        )))
    }
}

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
    engine: Engine,
    closed: bool,
    /// Set for the duration of a run; still set at the next call only if a run unwound out of
    /// the runtime itself (user code is caught), after which the chip refuses further runs.
    in_run: bool,
    /// Mints the host scratch buffers' identities (a nonce of their own).
    scratch: IdentityMinter,
    /// The retained staging buffer of each pipeline slot (`chip::staging`).
    staging: Vec<Staging>,
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
    pub(crate) fn new(cfg: ChipConfig, registry: Registry<ChipFn>) -> Result<ChipRuntime> {
        let chip = cfg.spec.chip_id;
        let in_chip = |e: Error| e.context(format!("chip {chip}"));
        let backend =
            cfg.backend.make(&cfg.spec).map_err(|e| e.context(format!("chip {chip}: making its backend")))?;
        let device = Arc::new(Device::new(chip, backend).map_err(in_chip)?);
        let cores = device.cores();
        let bell = Arc::new(Doorbell::new());
        let engine_cfg = EngineConfig {
            heap_ring_size: 0, // `orch.alloc` uses the chip's memory (`ChipHeap`)
            pipeline_depth: 1,
            next_level_workers: cores,
            sub_workers: 0,
            next_level_kind: CallableKind::Chip,
            next_level_names: ("core", "WorkerBuilder::chip_cores(n)"),
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
        let engine =
            Engine::new(engine_cfg, Bell::Shared(Arc::new(BellRef(bell.clone()))), parts).map_err(in_chip)?;
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
            let ep = CoreEndpoint::spawn(core, shared.clone(), bell.clone()).map_err(in_chip)?;
            lanes.push(Lane::named(LaneKind::NextLevel(core), Box::new(ep), format!("core {core}")));
        }
        engine.attach_lanes(lanes);
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

    /// Runs a chip callable with `args` (see the [module docs](self) for the steps).
    ///
    /// A kernel runs on the calling thread as core 0 (`worker_index() == 0`) and ignores
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
        if self.closed {
            return Err(Error::state(format!("chip {} is shut down", self.chip)));
        }
        if self.in_run {
            return Err(Error::state(format!(
                "chip {} is unusable: an earlier run broke off inside the chip runtime",
                self.chip
            )));
        }
        let Some(f) = self.read_registry().get(digest).cloned() else {
            return Err(Error::new(
                ErrorKind::Callable,
                format!("UNKNOWN_CALLABLE: {digest} is not registered on chip {}", self.chip),
            ));
        };
        let _span =
            tracing::debug_span!(target: "simpler::chip", "chip run", chip = self.chip, callable = f.name())
                .entered();
        self.in_run = true;
        let mut unfenced = None;
        let result = self.run_with(&f, &args, scalars, config, &mut unfenced);
        if let Some(ptr) = unfenced
            && let Err(e) = self.device.arena().fence(ptr)
        {
            tracing::error!(target: "simpler::chip", chip = self.chip, "fencing the staging buffer: {e}");
        }
        self.in_run = false;
        result
    }

    fn run_with(
        &mut self,
        f: &ChipFn,
        args: &[ChipArg<'_>],
        scalars: &[u64],
        config: &CallConfig,
        unfenced: &mut Option<u64>,
    ) -> Result<()> {
        let prepared = self.prepare(f, args, 0)?;
        if let Some(ptr) = self.staging[0].ptr() {
            self.device.arena().unfence(ptr)?;
            *unfenced = Some(ptr);
        }
        match f.body() {
            ChipBody::Kernel(k) => self.run_kernel(f.name(), k, &prepared, scalars)?,
            ChipBody::Orchestration(o) => self.run_orchestration(f.name(), o, &prepared, scalars, config)?,
        }
        for (i, (arg, p)) in args.iter().zip(&prepared).enumerate() {
            if let ChipArg::Host(m) = arg
                && m.access().can_write()
            {
                self.device.copy_out(p.ptr, &p.view, m).map_err(|e| {
                    e.context(format!("chip {}: copying back host tensor {i} of `{}`", self.chip, f.name()))
                })?;
            }
        }
        Ok(())
    }

    /// Steps 2 and 3: device tensors checked, host tensors given a slice of slot `slot`'s
    /// staging buffer (grown first when the run needs more, before anything is copied) and,
    /// when readable, copied into it.
    fn prepare(&mut self, f: &ChipFn, args: &[ChipArg<'_>], slot: usize) -> Result<Vec<Prepared>> {
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
        let base = self.staging[slot].reserve(&device, need).map_err(|e| {
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
                    if !device.is_live(*ptr, *nbytes) {
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
                    if m.access().can_read() {
                        device.copy_in(m, ptr, &view).map_err(|e| bad(e.message().to_string()))?;
                    }
                    let identity = self.scratch.mint()?;
                    out.push(Prepared { ptr, view, access: m.access(), identity, nbytes: size });
                }
            }
        }
        Ok(out)
    }

    fn run_kernel(&self, name: &str, k: HostFnPtr, prepared: &[Prepared], scalars: &[u64]) -> Result<()> {
        let arena = self.device.arena();
        // The gate before the views (rule A6 of `chip::arena`).
        let _running = arena.kernel_gate();
        let tensors =
            prepared.iter().map(|p| arena.tensor(p.ptr, p.view, p.access)).collect::<Result<Vec<_>>>()?;
        call_kernel(k, tensors, scalars, 0).map_err(|msg| {
            Error::new(ErrorKind::TaskFailed, format!("kernel `{name}` failed on chip {}: {msg}", self.chip))
        })
    }

    fn run_orchestration(
        &self,
        name: &str,
        o: ChipOrchFnPtr,
        prepared: &[Prepared],
        scalars: &[u64],
        config: &CallConfig,
    ) -> Result<()> {
        let chip = self.chip;
        let mut args = TaskArgs::new();
        for p in prepared {
            let access = p.access.within_orchestration();
            let desc = BufferDesc::new(p.identity, Backing::Device { ptr: p.ptr, chip }, access, p.nbytes)?;
            args.add_tensor(&Tensor::new(desc, p.view)?, tag_for(p.access))?;
        }
        for &s in scalars {
            args.scalar(s);
        }
        let eng = &self.engine;
        let context = format!("chip orchestration `{name}` on chip {chip}");
        let built = eng
            .build_run(false, None, false, |orch| o(orch, &args, config))
            .map_err(|f| f.into_error().context(&context))?;
        eng.drive_until(|| built.run.is_done(), None);
        built.run.result().map_err(|e| e.context(context))
    }

    /// Allocates device memory through the backend (see [`ChipBackend::malloc`]).
    pub(crate) fn malloc(&mut self, nbytes: u64) -> Result<u64> {
        self.device.malloc(nbytes).map_err(|e| e.context(format!("chip {}", self.chip)))
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
    #[cfg_attr(not(test), expect(dead_code, reason = "read by the pipeline benchmark, next"))]
    pub(crate) fn device_allocations(&self) -> u64 {
        self.device.allocations()
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

/// A tensor ready to run: device memory of this chip.
struct Prepared {
    ptr: u64,
    view: TensorView,
    access: Access,
    identity: Identity,
    nbytes: u64,
}

// ---------------------------------------------------------------------------------- cores

/// What every core endpoint of a chip shares.
struct CoreShared {
    chip: u32,
    device: Arc<Device>,
    registry: SharedRegistry,
}

impl CoreShared {
    /// The device pointer of tensor `i`'s buffer, after checking it may be used on this chip.
    fn resolve(&self, i: usize, t: &Tensor) -> std::result::Result<u64, String> {
        let desc = t.desc();
        let n = desc.nbytes();
        match desc.backing() {
            Backing::Device { ptr, chip } => {
                if chip != self.chip {
                    return Err(format!(
                        "tensor {i} is device memory of chip {chip}, not of chip {}",
                        self.chip
                    ));
                }
                if !self.device.usable_by_kernels(ptr, n) {
                    return Err(format!(
                        "tensor {i}: device buffer {} at {ptr:#x} (+{n} bytes) is not a live allocation of chip {chip}",
                        desc.identity()
                    ));
                }
                Ok(ptr)
            }
            Backing::HeapSlab { addr } => Err(format!(
                "tensor {i} is host memory (a heap slab at {addr:#x}); kernels on a chip's cores use device memory only"
            )),
            Backing::Memfd { .. } => Err(format!(
                "tensor {i} is host memory (a host buffer, {}); kernels on a chip's cores use device memory only",
                desc.identity()
            )),
        }
    }
}

/// One kernel for a core thread: the function, its tensors as `(device pointer, view, access)`
/// and its scalars.
struct CoreJob {
    kernel: HostFnPtr,
    tensors: Vec<(u64, TensorView, Access)>,
    scalars: Vec<u64>,
}

/// One core: runs the kernels the chip engine dispatches to it on its own thread and rings the
/// engine doorbell when one ends.
struct CoreEndpoint {
    core: u32,
    shared: Arc<CoreShared>,
    tx: Option<mpsc::Sender<CoreJob>>,
    rx: mpsc::Receiver<Outcome>,
    handle: Option<thread::JoinHandle<()>>,
    /// The CPU (plus one) the thread last ran a kernel on; 0 when unknown.
    cpu: Arc<AtomicU32>,
}

impl CoreEndpoint {
    fn spawn(core: u32, shared: Arc<CoreShared>, bell: Arc<Doorbell>) -> Result<CoreEndpoint> {
        let (tx, jobs) = mpsc::channel::<CoreJob>();
        let (done_tx, rx) = mpsc::channel();
        let cpu = Arc::new(AtomicU32::new(0));
        let cpu_w = cpu.clone();
        let device = shared.device.clone();
        let handle = thread::Builder::new()
            .name(format!("chip{}-core{core}", shared.chip))
            .spawn(move || {
                for job in jobs {
                    cpu_w.store(crate::sys::futex::current_cpu(), Ordering::Relaxed);
                    // The gate before the views (rule A6 of `chip::arena`).
                    let running = device.arena().kernel_gate();
                    let tensors = job
                        .tensors
                        .iter()
                        .map(|&(ptr, view, access)| device.arena().tensor(ptr, view, access));
                    let called = match tensors.collect::<Result<Vec<_>>>() {
                        Ok(tensors) => call_kernel(job.kernel, tensors, &job.scalars, core),
                        Err(e) => Err(e.message().to_string()),
                    };
                    drop(running);
                    let out = match called {
                        Ok(()) => Outcome::Success,
                        Err(msg) => Outcome::TaskFailure(msg),
                    };
                    if done_tx.send(out).is_err() {
                        break;
                    }
                    bell.ring();
                }
            })
            .map_err(|e| Error::os(&format!("starting the thread of core {core}"), e))?;
        Ok(CoreEndpoint { core, shared, tx: Some(tx), rx, handle: Some(handle), cpu })
    }

    fn kernel_of(&self, callable: &CallableHandle) -> Result<HostFnPtr> {
        let reg = sync::read(&self.shared.registry);
        match reg.get(&callable.digest()).map(ChipFn::body) {
            Some(ChipBody::Kernel(k)) => Ok(k),
            Some(ChipBody::Orchestration(_)) => {
                Err(Error::invalid(format!("{callable} is a chip orchestration; only kernels run on a core")))
            }
            None => Err(Error::new(
                ErrorKind::Callable,
                format!("UNKNOWN_CALLABLE: {callable} is not registered on chip {}", self.shared.chip),
            )),
        }
    }
}

impl Endpoint for CoreEndpoint {
    fn start(&mut self, d: &Dispatch<'_>) -> Result<()> {
        let kernel = self.kernel_of(d.callable)?;
        let mut tensors = Vec::with_capacity(d.args.tensors.len());
        for (i, (t, tag)) in d.args.tensors.iter().zip(&d.args.tags).enumerate() {
            let base = self.shared.resolve(i, t).map_err(Error::invalid)?;
            tensors.push((base, *t.view(), tag.access()));
        }
        let job = CoreJob { kernel, tensors, scalars: d.args.scalars.to_vec() };
        let sent = self.tx.as_ref().is_some_and(|tx| tx.send(job).is_ok());
        if !sent {
            return Err(Error::state(format!("core {} of chip {} has stopped", self.core, self.shared.chip)));
        }
        Ok(())
    }

    fn poll(&mut self) -> Option<Outcome> {
        match self.rx.try_recv() {
            Ok(out) => Some(out),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(Outcome::EndpointFailure(format!(
                "core {} of chip {} has stopped",
                self.core, self.shared.chip
            ))),
        }
    }

    fn shutdown(&mut self) {
        self.tx = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }

    fn peer_cpu(&self) -> Option<u32> {
        match self.cpu.load(Ordering::Relaxed) {
            0 => None,
            c => Some(c),
        }
    }
}

impl Drop for CoreEndpoint {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests;
