//! `ChipRuntime`: the L2 leaf an L3 chip child (or an in-process L2 Worker) drives.
//!
//! A runtime owns a [`SimChip`] (device memory), a registry of chip callables and an
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
//! 3. give every host tensor a device scratch block laid out like its view (offset 0), and copy
//!    the view's elements in when the tensor is readable (`Read`, `ReadWrite`);
//! 4. run: a kernel on the calling thread as core 0; a chip orchestration as one run of the
//!    chip engine, with every tensor handed over as device memory (`Backing::Device`) tagged
//!    from its access (`Read` -> `Input`, `Write` -> `Output`, `ReadWrite` -> `InOut`);
//! 5. on success, copy the elements of every writable host tensor back (on failure the host
//!    tensors are left as they were);
//! 6. free the scratch blocks, whatever happened.
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
use crate::chip::arena::Arena;
use crate::chip::sim::SimChip;
use crate::chip::{ChipBackend, ChipBody, ChipFn, ChipOrchFnPtr};
use crate::data::buffer::{Access, Backing, BufferDesc, Identity};
use crate::data::call_config::CallConfig;
use crate::data::host_args::{HostArgs, MappedTensor};
use crate::data::task_args::{Tag, TaskArgs};
use crate::data::tensor::{Tensor, TensorView};
use crate::engine::endpoint::{Dispatch, Endpoint, Outcome};
use crate::engine::orchestrator::Orchestrator;
use crate::engine::scheduler::{Lane, LaneKind};
use crate::engine::{Bell, DeviceHeap, Engine, EngineConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::sys::futex::Doorbell;
use crate::sys::sync;

/// The chip's device memory as the chip engine's [`DeviceHeap`]: `orch.alloc` inside a chip
/// orchestration carves its intermediates from it, so they count against the chip's memory
/// and kernels only ever touch device memory.
struct ChipHeap {
    chip: u32,
    arena: Arc<Arena>,
}

impl DeviceHeap for ChipHeap {
    fn chip(&self) -> u32 {
        self.chip
    }

    fn size(&self) -> u64 {
        self.arena.size()
    }

    fn alloc(&self, bytes: u64) -> Result<Option<u64>> {
        match self.arena.malloc(bytes) {
            Ok(ptr) => Ok(Some(ptr)),
            // No free block large enough now: a release may make room.
            Err(e) if e.kind() == ErrorKind::InvalidState => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn release(&self, ptr: u64) {
        if let Err(e) = self.arena.free(ptr) {
            // The engine frees each allocation once, when its slot is consumed.
            debug_assert!(false, "freeing an orch.alloc block: {e}");
            tracing::error!(target: "simpler::chip", chip = self.chip, "freeing an orch.alloc block: {e}");
        }
    }
}

/// How a chip is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChipConfig {
    /// The chip's NEXT_LEVEL worker id in its parent (what `Backing::Device::chip` names).
    pub(crate) chip_id: u32,
    /// Device memory in bytes (backed on first touch).
    pub(crate) memory_bytes: u64,
    /// Simulated cores (one thread each).
    pub(crate) cores: usize,
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
/// tensor overlaps another) and catches its panic. `Err` carries the failure message.
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

/// The L2 leaf: a simulated chip, its callables, and the engine that runs chip orchestrations
/// on its cores (see the [module docs](self)).
pub(crate) struct ChipRuntime {
    chip: u32,
    sim: SimChip,
    registry: SharedRegistry,
    engine: Engine,
    closed: bool,
    /// Set for the duration of a run; still set at the next call only if a run unwound out of
    /// the runtime itself (user code is caught), after which the chip refuses further runs.
    in_run: bool,
    /// Owner nonce of the host scratch buffers' identities.
    scratch_nonce: u64,
}

impl std::fmt::Debug for ChipRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChipRuntime")
            .field("chip", &self.chip)
            .field("cores", &self.sim.cores())
            .field("memory", &self.sim.memory_size())
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
        let chip = cfg.chip_id;
        let in_chip = |e: Error| e.context(format!("chip {chip}"));
        let sim = SimChip::new(cfg.memory_bytes, cfg.cores).map_err(in_chip)?;
        let bell = Arc::new(Doorbell::new());
        let engine_cfg = EngineConfig {
            heap_ring_size: 0, // `orch.alloc` uses the chip's memory (`ChipHeap`)
            pipeline_depth: 1,
            next_level_workers: cfg.cores,
            sub_workers: 0,
            next_level_kind: CallableKind::Chip,
            local_chip: Some(chip),
            ..EngineConfig::default()
        };
        // Owner nonces of the buffers this chip mints, `orch.alloc` intermediates (the engine's)
        // and host scratch (its own, so the engine never takes scratch for a reclaimed
        // intermediate): random, so they never collide with identities minted by the parent.
        let nonce = RandomState::new().hash_one((chip, std::process::id()));
        let scratch_nonce = RandomState::new().hash_one((chip, std::process::id(), "scratch"));
        let mut engine =
            Engine::new(engine_cfg, Bell::Shared(Arc::new(BellRef(bell.clone()))), nonce).map_err(in_chip)?;
        engine.device_heap = Some(Arc::new(ChipHeap { chip, arena: sim.arena().clone() }));
        {
            let mut kinds = engine.callables.write();
            for (digest, _, _) in registry.iter() {
                kinds.insert(*digest, CallableKind::Chip);
            }
        }
        let registry = Arc::new(RwLock::new(registry));
        let shared = Arc::new(CoreShared { chip, arena: sim.arena().clone(), registry: registry.clone() });
        let mut lanes = Vec::with_capacity(cfg.cores);
        for core in 0..cfg.cores as u32 {
            // On failure, the endpoints made so far stop their threads as `lanes` drops.
            let ep = CoreEndpoint::spawn(core, shared.clone(), bell.clone()).map_err(in_chip)?;
            lanes.push(Lane::new(LaneKind::NextLevel(core), Box::new(ep)));
        }
        engine.attach_lanes(lanes);
        tracing::debug!(target: "simpler::chip", chip, cores = cfg.cores, memory = cfg.memory_bytes, "chip ready");
        Ok(ChipRuntime { chip, sim, registry, engine, closed: false, in_run: false, scratch_nonce })
    }

    fn read_registry(&self) -> std::sync::RwLockReadGuard<'_, Registry<ChipFn>> {
        sync::read(&self.registry)
    }

    /// Installs a chip callable under `digest` (which must be the sha256 of `descriptor`; see
    /// `Registry::install`) and makes it submittable by chip orchestrations. Returns its local
    /// slot.
    pub(crate) fn install(&mut self, digest: Digest, descriptor: &[u8], f: ChipFn) -> Result<u32> {
        let slot = sync::write(&self.registry).install(digest, descriptor, f)?;
        self.engine.callables.write().insert(digest, CallableKind::Chip);
        Ok(slot)
    }

    /// Drops one reference to `digest`; returns true when that removed it.
    pub(crate) fn release(&mut self, digest: &Digest) -> Result<bool> {
        let freed = sync::write(&self.registry).release(digest)?;
        if freed {
            self.engine.callables.write().remove(digest);
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
        let mut scratch = Vec::new();
        let result = self.run_with(&f, &args, scalars, config, &mut scratch);
        for ptr in scratch {
            if let Err(e) = self.sim.arena().free(ptr) {
                tracing::error!(target: "simpler::chip", chip = self.chip, "freeing device scratch: {e}");
            }
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
        scratch: &mut Vec<u64>,
    ) -> Result<()> {
        let prepared = self.prepare(f, args, scratch)?;
        match f.body() {
            ChipBody::Kernel(k) => self.run_kernel(f.name(), k, &prepared, scalars)?,
            ChipBody::Orchestration(o) => self.run_orchestration(f.name(), o, &prepared, scalars, config)?,
        }
        let arena = self.sim.arena();
        for (i, (arg, p)) in args.iter().zip(&prepared).enumerate() {
            if let ChipArg::Host(m) = arg
                && m.access().can_write()
            {
                arena.copy_view_out(p.ptr, &p.view, m).map_err(|e| {
                    e.context(format!("chip {}: copying back host tensor {i} of `{}`", self.chip, f.name()))
                })?;
            }
        }
        Ok(())
    }

    /// Steps 2 and 3: device tensors checked, host tensors given (and, when readable, copied
    /// into) device scratch. Scratch pointers are pushed to `scratch` as soon as they exist.
    fn prepare(&mut self, f: &ChipFn, args: &[ChipArg<'_>], scratch: &mut Vec<u64>) -> Result<Vec<Prepared>> {
        let chip = self.chip;
        let arena = self.sim.arena().clone();
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
                    if !arena.is_live(*ptr, *nbytes) {
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
                    let ptr = arena
                        .malloc(size)
                        .map_err(|e| bad(format!("device scratch for a host tensor: {}", e.message())))?;
                    scratch.push(ptr);
                    if m.access().can_read() {
                        arena.copy_view_in(m, ptr, &view).map_err(|e| bad(e.message().to_string()))?;
                    }
                    let id = self.engine.next_buffer_id.fetch_add(1, Ordering::Relaxed);
                    let identity = Identity::new(self.scratch_nonce, id, 1)?;
                    out.push(Prepared { ptr, view, access: m.access(), identity, nbytes: size });
                }
            }
        }
        Ok(out)
    }

    fn run_kernel(&self, name: &str, k: HostFnPtr, prepared: &[Prepared], scalars: &[u64]) -> Result<()> {
        let arena = self.sim.arena();
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
        let _building = sync::lock(&eng.building);
        let run = eng.begin_run(false)?;
        let mut orch = Orchestrator::new(eng, run.clone());
        let outcome = catch_unwind(AssertUnwindSafe(|| o(&mut orch, &args, config)));
        let error = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(panic) => Some(Error::new(
                ErrorKind::TaskFailed,
                format!("panicked: {}", crate::error::panic_message(&*panic)),
            )),
        };
        orch.finish(error.as_ref());
        eng.drive_until(|| run.is_done(), None);
        let context = format!("chip orchestration `{name}` on chip {chip}");
        match error {
            Some(e) => Err(e.context(context)),
            None => run.result().map_err(|e| e.context(context)),
        }
    }

    /// Allocates device memory (see [`ChipBackend::malloc`]).
    pub(crate) fn malloc(&mut self, nbytes: u64) -> Result<u64> {
        self.sim.malloc(nbytes).map_err(|e| e.context(format!("chip {}", self.chip)))
    }

    /// Frees device memory (see [`ChipBackend::free`]).
    pub(crate) fn free(&mut self, ptr: u64) -> Result<()> {
        self.sim.free(ptr).map_err(|e| e.context(format!("chip {}", self.chip)))
    }

    /// Host to device (see [`ChipBackend::copy_to_device`]).
    pub(crate) fn copy_to_device(&mut self, dst: u64, src: &[u8]) -> Result<()> {
        self.sim.copy_to_device(dst, src).map_err(|e| e.context(format!("chip {}", self.chip)))
    }

    /// Device to host (see [`ChipBackend::copy_from_device`]).
    pub(crate) fn copy_from_device(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.sim.copy_from_device(src, dst).map_err(|e| e.context(format!("chip {}", self.chip)))
    }

    /// Stops the core threads (waits for a running kernel to return). Idempotent; also done on
    /// drop. Memory operations keep working afterwards; runs are refused.
    pub(crate) fn shutdown(&mut self) {
        if !self.closed {
            self.closed = true;
            self.engine.mark_closed();
            self.engine.shutdown_lanes();
        }
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
    arena: Arc<Arena>,
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
                if !self.arena.is_live(ptr, n) {
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
            Backing::PosixShm { name } => Err(format!(
                "tensor {i} is host memory (shm {name}); kernels on a chip's cores use device memory only"
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
        let arena = shared.arena.clone();
        let handle = thread::Builder::new()
            .name(format!("chip{}-core{core}", shared.chip))
            .spawn(move || {
                for job in jobs {
                    cpu_w.store(crate::sys::futex::current_cpu(), Ordering::Relaxed);
                    let tensors =
                        job.tensors.iter().map(|&(ptr, view, access)| arena.tensor(ptr, view, access));
                    let called = match tensors.collect::<Result<Vec<_>>>() {
                        Ok(tensors) => call_kernel(job.kernel, tensors, &job.scalars, core),
                        Err(e) => Err(e.message().to_string()),
                    };
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
mod tests {
    use std::sync::{Condvar, Mutex};
    use std::time::{Duration, Instant};

    use super::*;
    use crate::callable::host::HostResult;
    use crate::data::dtype::DataType;

    const CHIP: u32 = 3;

    fn vadd(args: &HostArgs<'_>) -> HostResult {
        let (a, b, out) = (args.input::<f32>(0)?, args.input::<f32>(1)?, args.output::<f32>(2)?);
        for i in 0..out.len() {
            out[i] = a[i] + b[i];
        }
        Ok(())
    }

    /// `x += k` in place (scalar 0 is `k` as f32 bits).
    fn add_scalar(args: &HostArgs<'_>) -> HostResult {
        let k = args.scalar_f32(0)?;
        for v in args.output::<f32>(0)? {
            *v += k;
        }
        Ok(())
    }

    /// `out = 2 * x`
    fn double(args: &HostArgs<'_>) -> HostResult {
        let (x, out) = (args.input::<f32>(0)?, args.output::<f32>(1)?);
        for i in 0..out.len() {
            out[i] = 2.0 * x[i];
        }
        Ok(())
    }

    /// Fills its only (output) tensor with 1.0.
    fn ones(args: &HostArgs<'_>) -> HostResult {
        args.output::<f32>(0)?.fill(1.0);
        Ok(())
    }

    /// Copies what it sees in tensor 0 (tagged NoDep, so readable) into tensor 1.
    fn probe(args: &HostArgs<'_>) -> HostResult {
        let seen = args.input::<f32>(0)?.to_vec();
        args.output::<f32>(1)?.copy_from_slice(&seen);
        Ok(())
    }

    fn fail_kernel(_: &HostArgs<'_>) -> HostResult {
        Err("kernel says no".into())
    }

    fn panic_kernel(_: &HostArgs<'_>) -> HostResult {
        panic!("kernel exploded")
    }

    /// Both instances must be running at once: each arrives, then waits (10 s at most) for the
    /// other; then each writes the index of its core into its output.
    fn rendezvous(args: &HostArgs<'_>) -> HostResult {
        static MET: (Mutex<u32>, Condvar) = (Mutex::new(0), Condvar::new());
        let (lock, cv) = &MET;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut n = lock.lock().unwrap();
        *n += 1;
        cv.notify_all();
        while *n < 2 {
            let left = deadline.checked_duration_since(Instant::now()).ok_or("the partner never arrived")?;
            n = cv.wait_timeout(n, left).unwrap().0;
        }
        drop(n);
        args.output::<u32>(0)?.fill(args.worker_index());
        Ok(())
    }

    fn kernels() -> Vec<ChipFn> {
        vec![
            ChipFn::kernel("vadd", vadd),
            ChipFn::kernel("add_scalar", add_scalar),
            ChipFn::kernel("double", double),
            ChipFn::kernel("ones", ones),
            ChipFn::kernel("probe", probe),
            ChipFn::kernel("fail_kernel", fail_kernel),
            ChipFn::kernel("panic_kernel", panic_kernel),
            ChipFn::kernel("rendezvous", rendezvous),
        ]
    }

    fn h(name: &str) -> CallableHandle {
        kernels().into_iter().find(|k| k.name() == name).expect("known kernel").handle()
    }

    /// A chip with the test kernels in its startup registry and `extra` installed afterwards.
    fn chip(cores: usize, extra: &[ChipFn]) -> ChipRuntime {
        let mut reg = Registry::new(64);
        for k in kernels() {
            reg.install(k.handle().digest(), k.descriptor().bytes(), k.clone()).unwrap();
        }
        let cfg = ChipConfig { chip_id: CHIP, memory_bytes: 16 << 20, cores };
        let mut rt = ChipRuntime::new(cfg, reg).unwrap();
        for f in extra {
            rt.install(f.handle().digest(), f.descriptor().bytes(), f.clone()).unwrap();
        }
        rt
    }

    fn f32_view(n: u32) -> TensorView {
        TensorView::new(0, &[n], None, DataType::Float32).unwrap()
    }

    /// A host tensor over a vector, borrowed for the run (rule H1).
    fn host(v: &mut [f32], access: Access) -> ChipArg<'_> {
        let view = f32_view(v.len() as u32);
        host_view(v, view, access)
    }

    /// A host tensor `view` of a vector, borrowed for the run (rule H1).
    fn host_view<T: crate::sys::mem::Pod>(v: &mut [T], view: TensorView, access: Access) -> ChipArg<'_> {
        ChipArg::Host(MappedTensor::from_slice(crate::sys::mem::as_bytes_mut(v), view, access).unwrap())
    }

    fn id(n: u64) -> Identity {
        Identity::new(0xdef1ce, n, 1).unwrap()
    }

    /// A device buffer of `n` f32 on the chip, filled with `values`.
    fn device(rt: &mut ChipRuntime, values: &[f32]) -> u64 {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let ptr = rt.malloc(bytes.len() as u64).unwrap();
        rt.copy_to_device(ptr, &bytes).unwrap();
        ptr
    }

    fn dev_arg(ptr: u64, n: u32, access: Access, identity: Identity) -> ChipArg<'static> {
        ChipArg::Device { ptr, view: f32_view(n), access, identity, nbytes: u64::from(n) * 4 }
    }

    fn read_device(rt: &ChipRuntime, ptr: u64, n: usize) -> Vec<f32> {
        let mut bytes = vec![0u8; n * 4];
        rt.copy_from_device(ptr, &mut bytes).unwrap();
        bytes.chunks(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect()
    }

    fn run(rt: &mut ChipRuntime, f: &ChipFn, args: Vec<ChipArg<'_>>, scalars: &[u64]) -> Result<()> {
        rt.run(&f.handle().digest(), args, scalars, &CallConfig::default())
    }

    fn kernel(name: &str) -> ChipFn {
        kernels().into_iter().find(|k| k.name() == name).expect("known kernel")
    }

    #[test]
    fn vector_add_with_host_tensors() {
        let mut rt = chip(2, &[]);
        let mut a: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        let mut b: Vec<f32> = (0..1000).map(|i| 0.5 * i as f32).collect();
        let mut out = vec![-7.0f32; 1000];
        let (a0, b0) = (a.clone(), b.clone());
        let before = rt.sim.arena().used();
        run(
            &mut rt,
            &kernel("vadd"),
            vec![host(&mut a, Access::Read), host(&mut b, Access::Read), host(&mut out, Access::Write)],
            &[],
        )
        .unwrap();
        assert!(out.iter().enumerate().all(|(i, v)| *v == 1.5 * i as f32), "vector add result");
        assert_eq!((a, b), (a0, b0), "inputs unchanged");
        assert_eq!(rt.sim.arena().used(), before, "device scratch freed");
    }

    #[test]
    fn inout_and_output_host_tensors_round_trip() {
        let mut rt = chip(1, &[]);
        let mut x = vec![1.0f32, 2.0, 3.0];
        run(
            &mut rt,
            &kernel("add_scalar"),
            vec![host(&mut x, Access::ReadWrite)],
            &[u64::from(10f32.to_bits())],
        )
        .unwrap();
        assert_eq!(x, vec![11.0, 12.0, 13.0]);
        let mut y = vec![0.0f32; 3];
        run(&mut rt, &kernel("double"), vec![host(&mut x, Access::Read), host(&mut y, Access::Write)], &[])
            .unwrap();
        assert_eq!(y, vec![22.0, 24.0, 26.0]);
    }

    #[test]
    fn a_failed_run_leaves_host_tensors_as_they_were() {
        let mut rt = chip(1, &[]);
        // Every other element of 8: the gaps keep their sentinel.
        let mut buf = vec![-1.0f32; 8];
        let view = TensorView::new(4, &[4], Some(&[2]), DataType::Float32).unwrap();
        let arg = host_view(&mut buf, view, Access::Write);
        // Kernels get typed slices of contiguous views only: `ones` fails on this one.
        let err = run(&mut rt, &kernel("ones"), vec![arg], &[]).unwrap_err();
        assert!(err.message().contains("strided"), "{err}");
        assert_eq!(buf, vec![-1.0; 8], "a failed run leaves host tensors as they were");
    }

    #[test]
    fn output_only_host_tensors_are_not_copied_in() {
        let plan = ChipFn::orchestration("peek", peek_plan);
        let mut rt = chip(2, std::slice::from_ref(&plan));
        let mut out = vec![7.0f32; 16]; // a sentinel the device never sees
        let mut seen = vec![-1.0f32; 16];
        run(&mut rt, &plan, vec![host(&mut out, Access::Write), host(&mut seen, Access::Write)], &[])
            .unwrap();
        assert!(seen.iter().all(|v| *v == 0.0), "fresh device scratch, not the host's 7.0: {seen:?}");
        assert!(out.iter().all(|v| *v == 0.0), "and the untouched scratch is copied back: {out:?}");
    }

    /// Tensor 0 (Output) read through a NoDep tag by `probe`, which copies it to tensor 1.
    fn peek_plan(orch: &mut Orchestrator<'_>, args: &TaskArgs, cfg: &CallConfig) -> Result<()> {
        let mut a = TaskArgs::new();
        a.add_tensor(args.tensor(0).unwrap(), Tag::NoDep)?.output(args.tensor(1).unwrap())?;
        orch.submit_next_level(&h("probe"), a, *cfg, 1).map(|_| ())
    }

    #[test]
    fn device_tensors_chain_across_runs() {
        let mut rt = chip(2, &[]);
        let x = device(&mut rt, &[1.0, 2.0, 3.0, 4.0]);
        let y = rt.malloc(16).unwrap();
        let k = u64::from(0.5f32.to_bits());
        run(&mut rt, &kernel("add_scalar"), vec![dev_arg(x, 4, Access::ReadWrite, id(1))], &[k]).unwrap();
        run(
            &mut rt,
            &kernel("double"),
            vec![dev_arg(x, 4, Access::Read, id(1)), dev_arg(y, 4, Access::Write, id(2))],
            &[],
        )
        .unwrap();
        assert_eq!(read_device(&rt, y, 4), vec![3.0, 5.0, 7.0, 9.0]);
        assert_eq!(read_device(&rt, x, 4), vec![1.5, 2.5, 3.5, 4.5], "device tensors stay on the device");
        // Host and device tensors mix.
        let mut out = vec![0.0f32; 4];
        let mut ones = vec![1.0f32; 4];
        run(
            &mut rt,
            &kernel("vadd"),
            vec![
                dev_arg(y, 4, Access::Read, id(2)),
                host(&mut ones, Access::Read),
                host(&mut out, Access::Write),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(out, vec![4.0, 6.0, 8.0, 10.0]);
        rt.free(x).unwrap();
        rt.free(y).unwrap();
    }

    #[test]
    fn dead_or_out_of_bounds_device_tensors_are_refused() {
        let mut rt = chip(1, &[]);
        let x = device(&mut rt, &[1.0; 4]);
        let mut out = vec![0.0f32; 4];
        // A view past the end of its buffer.
        let bad_view =
            ChipArg::Device { ptr: x, view: f32_view(8), access: Access::Read, identity: id(1), nbytes: 16 };
        let err =
            run(&mut rt, &kernel("double"), vec![bad_view, host(&mut out, Access::Write)], &[]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.message().contains("past its 16-byte device buffer"), "{err}");
        // A buffer larger than the allocation.
        let too_big =
            ChipArg::Device { ptr: x, view: f32_view(4), access: Access::Read, identity: id(1), nbytes: 64 };
        let err =
            run(&mut rt, &kernel("double"), vec![too_big, host(&mut out, Access::Write)], &[]).unwrap_err();
        assert!(err.message().contains("not a live allocation"), "{err}");
        assert!(err.message().contains("chip 3") && err.message().contains("`double` tensor 0"), "{err}");
        // A freed buffer.
        rt.free(x).unwrap();
        let err = run(
            &mut rt,
            &kernel("double"),
            vec![dev_arg(x, 4, Access::Read, id(1)), host(&mut out, Access::Write)],
            &[],
        )
        .unwrap_err();
        assert!(err.message().contains("not a live allocation"), "{err}");
        // A pointer that was never allocated.
        let err = run(
            &mut rt,
            &kernel("double"),
            vec![dev_arg(1 << 20, 4, Access::Read, id(1)), host(&mut out, Access::Write)],
            &[],
        )
        .unwrap_err();
        assert!(err.message().contains("not a live allocation"), "{err}");
        assert_eq!(rt.sim.arena().used(), 0, "the scratch of refused runs is freed");
        // Still usable.
        let mut a = vec![2.0f32; 4];
        run(&mut rt, &kernel("double"), vec![host(&mut a, Access::Read), host(&mut out, Access::Write)], &[])
            .unwrap();
        assert_eq!(out, vec![4.0; 4]);
    }

    #[test]
    fn memory_operations_name_the_chip() {
        let mut rt = chip(1, &[]);
        let err = rt.malloc(1 << 30).unwrap_err();
        assert!(err.message().starts_with("chip 3: out of device memory"), "{err}");
        assert!(err.message().contains(&(16u64 << 20).to_string()), "{err}");
        let p = rt.malloc(8).unwrap();
        assert!(rt.copy_to_device(p, &[0; 9]).unwrap_err().message().starts_with("chip 3: "));
        assert!(rt.copy_from_device(p + 4, &mut [0; 8]).is_err());
        rt.free(p).unwrap();
        let err = rt.free(p).unwrap_err();
        assert!(err.message().starts_with("chip 3: ") && err.message().contains("double free"), "{err}");
    }

    #[test]
    fn host_scratch_counts_against_device_memory() {
        let cfg = ChipConfig { chip_id: 0, memory_bytes: 4096, cores: 1 };
        let mut reg = Registry::new(4);
        let k = kernel("double");
        reg.install(k.handle().digest(), k.descriptor().bytes(), k.clone()).unwrap();
        let mut rt = ChipRuntime::new(cfg, reg).unwrap();
        let mut a = vec![1.0f32; 1024];
        let mut out = vec![0.0f32; 1024];
        let err = run(&mut rt, &k, vec![host(&mut a, Access::Read), host(&mut out, Access::Write)], &[])
            .unwrap_err();
        assert!(
            err.message().contains("device scratch") && err.message().contains("out of device memory"),
            "{err}"
        );
        assert_eq!(rt.sim.arena().used(), 0, "the first scratch block was freed");
    }

    /// `tmp = a + b` on core 0, then `out = 2 * tmp` on core 1: read-after-write across cores
    /// through the device intermediate passed as tensor 3.
    fn pipeline(orch: &mut Orchestrator<'_>, args: &TaskArgs, cfg: &CallConfig) -> Result<()> {
        let t = |i| args.tensor(i).expect("four tensors");
        let mut first = TaskArgs::new();
        first.input(t(0))?.input(t(1))?.output(t(3))?;
        orch.submit_next_level(&h("vadd"), first, *cfg, 0)?;
        let mut second = TaskArgs::new();
        second.input(t(3))?.output(t(2))?;
        orch.submit_next_level(&h("double"), second, *cfg, 1)?;
        Ok(())
    }

    #[test]
    fn chip_orchestration_chains_kernels_across_cores() {
        let plan = ChipFn::orchestration("pipeline", pipeline);
        let mut rt = chip(2, std::slice::from_ref(&plan));
        let n = 4096usize;
        let mut a: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let mut b = vec![1.0f32; n];
        let mut out = vec![0.0f32; n];
        let tmp = device(&mut rt, &vec![-100.0; n]);
        run(
            &mut rt,
            &plan,
            vec![
                host(&mut a, Access::Read),
                host(&mut b, Access::Read),
                host(&mut out, Access::Write),
                dev_arg(tmp, n as u32, Access::ReadWrite, id(9)),
            ],
            &[],
        )
        .unwrap();
        assert!(out.iter().enumerate().all(|(i, v)| *v == 2.0 * (i as f32 + 1.0)), "pipeline result");
        assert_eq!(read_device(&rt, tmp, 3), vec![1.0, 2.0, 3.0]);
    }

    /// As [`pipeline`], with the intermediate from `orch.alloc`.
    fn pipeline_alloc(orch: &mut Orchestrator<'_>, args: &TaskArgs, cfg: &CallConfig) -> Result<()> {
        let t = |i| args.tensor(i).expect("three tensors");
        let tmp = orch.alloc(t(0).view().shape(), DataType::Float32)?;
        let mut first = TaskArgs::new();
        first.input(t(0))?.input(t(1))?.output(&tmp)?;
        orch.submit_next_level(&h("vadd"), first, *cfg, 1)?;
        let mut second = TaskArgs::new();
        second.input(&tmp)?.output(t(2))?;
        orch.submit_next_level(&h("double"), second, *cfg, 0)?;
        Ok(())
    }

    #[test]
    fn chip_orchestration_intermediates_from_orch_alloc() {
        let plan = ChipFn::orchestration("pipeline_alloc", pipeline_alloc);
        let mut rt = chip(2, std::slice::from_ref(&plan));
        let mut a = vec![1.0f32; 256];
        let mut b = vec![2.0f32; 256];
        let mut out = vec![0.0f32; 256];
        for _ in 0..3 {
            run(
                &mut rt,
                &plan,
                vec![host(&mut a, Access::Read), host(&mut b, Access::Read), host(&mut out, Access::Write)],
                &[],
            )
            .unwrap();
            assert_eq!(out, vec![6.0; 256]);
            assert_eq!(rt.sim.arena().used(), 0, "the intermediate and the scratch were freed");
            out.fill(0.0);
        }
    }

    /// Allocates an intermediate of `scalar 0` f32 and checks where it lives.
    fn alloc_sized(orch: &mut Orchestrator<'_>, args: &TaskArgs, cfg: &CallConfig) -> Result<()> {
        let n = u32::try_from(args.scalars[0]).expect("a small count");
        let tmp = orch.alloc(&[n], DataType::Float32)?;
        let Backing::Device { chip, .. } = tmp.desc().backing() else {
            return Err(Error::invalid(format!("orch.alloc on a chip gave {:?}", tmp.desc().backing())));
        };
        assert_eq!(chip, CHIP, "the intermediate is this chip's memory");
        let mut a = TaskArgs::new();
        a.output(&tmp)?;
        orch.submit_next_level(&h("ones"), a, *cfg, 0)?;
        Ok(())
    }

    /// `steps` scopes in a row, each with a 4 MiB intermediate that one kernel fills: together
    /// they need more than the chip's 16 MiB, so each waits for the previous one to be freed.
    fn alloc_in_turn(orch: &mut Orchestrator<'_>, args: &TaskArgs, cfg: &CallConfig) -> Result<()> {
        for _ in 0..args.scalars[0] {
            orch.scope(|orch| {
                let tmp = orch.alloc(&[1 << 20], DataType::Float32)?;
                let mut a = TaskArgs::new();
                a.output(&tmp)?;
                orch.submit_next_level(&h("ones"), a, *cfg, 0)?;
                Ok(())
            })?;
        }
        Ok(())
    }

    #[test]
    fn orch_alloc_inside_a_chip_takes_device_memory() {
        let sized = ChipFn::orchestration("alloc_sized", alloc_sized);
        let in_turn = ChipFn::orchestration("alloc_in_turn", alloc_in_turn);
        let mut rt = chip(1, &[sized.clone(), in_turn.clone()]);
        run(&mut rt, &sized, vec![], &[1024]).unwrap();
        assert_eq!(rt.sim.arena().used(), 0, "freed when the run ended");

        // More than the chip has: refused at once, naming the chip and its memory.
        let err = run(&mut rt, &sized, vec![], &[8 << 20]).unwrap_err();
        assert!(
            err.message().contains("orch.alloc on chip 3") && err.message().contains("out of device memory"),
            "{err}"
        );

        // Device memory a caller holds leaves less for intermediates.
        let held = rt.malloc(14 << 20).unwrap();
        rt.engine.cfg.backpressure_timeout = std::time::Duration::from_millis(200);
        let err = run(&mut rt, &sized, vec![], &[1 << 20]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
        assert!(
            err.message().contains("out of device memory on chip 3") && err.message().contains("chip_memory"),
            "{err}"
        );
        rt.free(held).unwrap();

        // Freed as their scopes end: five 4 MiB intermediates in turn fit 16 MiB.
        run(&mut rt, &in_turn, vec![], &[5]).unwrap();
        assert_eq!(rt.sim.arena().used(), 0);
    }

    /// Two independent kernels, one per core, that must overlap in time.
    fn side_by_side(orch: &mut Orchestrator<'_>, args: &TaskArgs, cfg: &CallConfig) -> Result<()> {
        for core in 0..2u32 {
            let mut a = TaskArgs::new();
            a.output(args.tensor(core as usize).unwrap())?;
            orch.submit_next_level(&h("rendezvous"), a, *cfg, core)?;
        }
        Ok(())
    }

    #[test]
    fn independent_kernels_run_concurrently_on_two_cores() {
        let plan = ChipFn::orchestration("side_by_side", side_by_side);
        let mut rt = chip(2, std::slice::from_ref(&plan));
        let (mut w0, mut w1) = (vec![u32::MAX; 4], vec![u32::MAX; 4]);
        let view = TensorView::new(0, &[4], None, DataType::Uint32).unwrap();
        let args = vec![host_view(&mut w0, view, Access::Write), host_view(&mut w1, view, Access::Write)];
        run(&mut rt, &plan, args, &[]).unwrap();
        assert_eq!((w0, w1), (vec![0; 4], vec![1; 4]), "each kernel ran on its own core");
    }

    /// Submits `kernel` (scalar 0 names it: 0 fail, 1 panic) on core 1, then a dependent
    /// `double` on core 0.
    fn failing_plan(orch: &mut Orchestrator<'_>, args: &TaskArgs, cfg: &CallConfig) -> Result<()> {
        let which = if args.scalar_at(0) == Some(0) { "fail_kernel" } else { "panic_kernel" };
        let x = args.tensor(0).unwrap();
        let mut first = TaskArgs::new();
        first.inout(x)?;
        orch.submit_next_level(&h(which), first, *cfg, 1)?;
        let mut second = TaskArgs::new();
        second.input(x)?.output(args.tensor(1).unwrap())?;
        orch.submit_next_level(&h("double"), second, *cfg, 0)?;
        Ok(())
    }

    #[test]
    fn failing_and_panicking_kernels_give_clear_errors() {
        let plan = ChipFn::orchestration("failing_plan", failing_plan);
        let mut rt = chip(2, std::slice::from_ref(&plan));
        let mut x = vec![1.0f32; 8];
        let mut y = vec![5.0f32; 8];
        for (f, what) in
            [(kernel("fail_kernel"), "kernel says no"), (kernel("panic_kernel"), "panicked: kernel exploded")]
        {
            let err = run(&mut rt, &f, vec![host(&mut x, Access::ReadWrite)], &[]).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::TaskFailed);
            assert!(err.message().contains(what), "{err}");
            assert!(
                err.message().contains(&format!("`{}`", f.name())) && err.message().contains("chip 3"),
                "{err}"
            );
        }
        for (which, what) in [(0u64, "kernel says no"), (1, "panicked: kernel exploded")] {
            let err = run(
                &mut rt,
                &plan,
                vec![host(&mut x, Access::ReadWrite), host(&mut y, Access::Write)],
                &[which],
            )
            .unwrap_err();
            assert!(err.message().contains(what), "{err}");
            assert!(err.message().contains("chip orchestration `failing_plan` on chip 3"), "{err}");
            assert_eq!(y, vec![5.0; 8], "host outputs untouched by a failed run");
        }
        assert_eq!(rt.sim.arena().used(), 0);
        // Still usable, cores included.
        let ok = ChipFn::orchestration("pipeline", pipeline);
        rt.install(ok.handle().digest(), ok.descriptor().bytes(), ok.clone()).unwrap();
        let tmp = rt.malloc(32).unwrap();
        let mut x2 = x.clone();
        run(
            &mut rt,
            &ok,
            vec![
                host(&mut x, Access::Read),
                host(&mut x2, Access::Read),
                host(&mut y, Access::Write),
                dev_arg(tmp, 8, Access::ReadWrite, id(4)),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(y, vec![4.0; 8]);
    }

    fn bad_plan(orch: &mut Orchestrator<'_>, args: &TaskArgs, cfg: &CallConfig) -> Result<()> {
        match args.scalar_at(0) {
            // An error after a submitted task: the task still settles, the error is returned.
            Some(0) => {
                let mut a = TaskArgs::new();
                a.inout(args.tensor(0).unwrap())?.scalar_f32(1.0);
                orch.submit_next_level(&h("add_scalar"), a, *cfg, 0)?;
                Err(Error::invalid("the plan gives up"))
            }
            Some(1) => panic!("the plan exploded"),
            // A kernel that is not registered on the chip.
            Some(2) => {
                let stray = ChipFn::kernel("stray", ones).handle();
                orch.submit_next_level(&stray, TaskArgs::new(), *cfg, 0).map(|_| ())
            }
            // A core that does not exist.
            Some(3) => orch.submit_next_level(&h("ones"), TaskArgs::new(), *cfg, 9).map(|_| ()),
            // Device memory of another chip.
            Some(4) => {
                let desc =
                    BufferDesc::new(id(77), Backing::Device { ptr: 0, chip: 7 }, Access::ReadWrite, 16)?;
                let t = Tensor::new(desc, f32_view(4))?;
                let mut a = TaskArgs::new();
                a.output(&t)?;
                orch.submit_next_level(&h("ones"), a, *cfg, 0).map(|_| ())
            }
            // An orchestration submitted to a core.
            _ => orch
                .submit_next_level(
                    &ChipFn::orchestration("bad_plan", bad_plan).handle(),
                    TaskArgs::new(),
                    *cfg,
                    0,
                )
                .map(|_| ()),
        }
    }

    #[test]
    fn orchestration_errors_are_reported_and_the_chip_stays_usable() {
        let plan = ChipFn::orchestration("bad_plan", bad_plan);
        let mut rt = chip(2, std::slice::from_ref(&plan));
        let mut x = vec![1.0f32; 4];
        let mut go = |rt: &mut ChipRuntime, case: u64| {
            run(rt, &plan, vec![host(&mut x, Access::ReadWrite)], &[case]).unwrap_err()
        };
        let err = go(&mut rt, 0);
        assert!(
            err.message().contains("chip orchestration `bad_plan` on chip 3: the plan gives up"),
            "{err}"
        );
        let err = go(&mut rt, 1);
        assert!(err.message().contains("panicked: the plan exploded"), "{err}");
        let err = go(&mut rt, 2);
        assert_eq!(err.kind(), ErrorKind::Callable);
        assert!(err.message().contains("`stray`") && err.message().contains("not registered"), "{err}");
        let err = go(&mut rt, 3);
        assert!(err.message().contains("worker id 9"), "{err}");
        let err = go(&mut rt, 4);
        assert!(err.message().contains("chip 7"), "{err}");
        let err = go(&mut rt, 5);
        assert!(err.message().contains("only kernels run on a core"), "{err}");
        assert_eq!(x, vec![1.0; 4], "no failed run copied back");
        assert_eq!(rt.sim.arena().used(), 0);
        let mut y = vec![0.0f32; 4];
        run(&mut rt, &kernel("double"), vec![host(&mut x, Access::Read), host(&mut y, Access::Write)], &[])
            .unwrap();
        assert_eq!(y, vec![2.0; 4]);
    }

    #[test]
    fn unknown_callables_and_registration() {
        let mut rt = chip(1, &[]);
        let stray = ChipFn::kernel("stray", ones);
        let err = run(&mut rt, &stray, Vec::new(), &[]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Callable);
        assert!(
            err.message().starts_with("UNKNOWN_CALLABLE: ")
                && err.message().ends_with("not registered on chip 3"),
            "{err}"
        );
        let d = stray.handle().digest();
        assert!(!rt.contains(&d));
        assert_eq!(rt.install(d, stray.descriptor().bytes(), stray.clone()).unwrap(), 8);
        assert_eq!(rt.install(d, stray.descriptor().bytes(), stray.clone()).unwrap(), 8, "refcounted");
        assert!(rt.contains(&d));
        let mut out = vec![0.0f32; 2];
        run(&mut rt, &stray, vec![host(&mut out, Access::Write)], &[]).unwrap();
        assert_eq!(out, vec![1.0; 2]);
        assert!(!rt.release(&d).unwrap());
        assert!(rt.release(&d).unwrap());
        assert!(!rt.contains(&d));
        assert!(!rt.engine.callables.read().contains_key(&d));
        assert!(rt.release(&d).is_err());
        // A digest that does not match its descriptor.
        assert!(rt.install(d, kernel("ones").descriptor().bytes(), stray).is_err());
    }

    #[test]
    fn shutdown_stops_runs_but_not_memory_operations() {
        let mut rt = chip(4, &[]);
        rt.shutdown();
        rt.shutdown();
        let err = run(&mut rt, &kernel("ones"), Vec::new(), &[]).unwrap_err();
        assert!(err.message().contains("shut down"), "{err}");
        let p = rt.malloc(64).unwrap();
        rt.free(p).unwrap();
        drop(rt); // and dropping after shutdown is fine
        drop(chip(3, &[])); // as is dropping without one
    }

    #[test]
    fn runtime_and_backend_can_move_between_threads() {
        fn send<T: Send>() {}
        fn sync<T: Sync>() {}
        send::<ChipRuntime>();
        send::<SimChip>();
        sync::<SimChip>();
        send::<ChipFn>();
        sync::<ChipFn>();
    }

    #[test]
    fn a_bad_configuration_is_an_error() {
        let cfg = ChipConfig { chip_id: 1, memory_bytes: 1 << 20, cores: 0 };
        let err = ChipRuntime::new(cfg, Registry::new(1)).unwrap_err();
        assert!(err.message().starts_with("chip 1: ") && err.message().contains("cores"), "{err}");
        let cfg = ChipConfig { chip_id: 1, memory_bytes: 0, cores: 1 };
        assert!(ChipRuntime::new(cfg, Registry::new(1)).is_err());
    }
}
