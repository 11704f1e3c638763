//! The L2 chip: chip callables ([`ChipFn`]), the device backend ([`ChipBackend`], simulated by
//! [`SimChip`]) and the runtime an L3 chip child drives (`ChipRuntime`).
//!
//! A chip callable is either a **kernel**, a plain function over typed slices of its tensors
//! (the same [`HostArgs`](crate::HostArgs) host functions get) that runs on one core, or a
//! **chip orchestration**, a function that submits kernels to the chip's cores through an
//! [`Orchestrator`], with the same tag-driven dependency rules as every other level: the chip
//! runs its own in-process engine whose NEXT_LEVEL workers are its cores (threads).
//!
//! Around a run, host-backed tensors are copied into the device (readable ones in before,
//! writable ones back after), into the retained staging buffer of the run's pipeline slot;
//! device-resident tensors (from `alloc_child_tensor`) stay where they are.
//!
//! Files: `arena.rs` (device memory and every raw-pointer operation), `sim.rs` (the backend
//! trait, [`DeviceMemory`] and [`SimChip`]), `discrete.rs` ([`DiscreteSim`], a simulated chip
//! whose memory the host cannot read), `device.rs` (the backend as the runtime uses it,
//! checking what it returns), `staging.rs` (a pipeline slot's staging buffer), `runtime.rs` and
//! `runtime/` (`ChipRuntime`: its run phases, executor thread, core threads and level parts),
//! `diag.rs` (the diagnostics a `CallConfig` asks for). The chip child that serves a chip at
//! L3 is `worker::serve::chip`.

mod arena;
mod backend;
mod device;
mod diag;
mod discrete;
#[cfg(feature = "opencl")]
mod opencl;
mod runtime;
mod sim;
mod staging;

use std::sync::Arc;

use crate::callable::host::HostFnPtr;
use crate::callable::identity::{CallableHandle, CallableKind, Descriptor, DescriptorWriter};
use crate::callable::linked::{CallableInfo, MACRO_PAYLOAD_FORMAT_VERSION};
use crate::callable::registry::{Installable, Origin};
use crate::callable::signature::KernelSignature;
use crate::data::task_args::TaskArgs;
use crate::engine::Registered;
use crate::engine::orchestrator::Orchestrator;
use crate::error::{Error, ErrorKind, Result};
use crate::sys::fn_address::FnAddress;

pub use crate::data::call_config::{CallConfig, RingSizes, Swimlane};
pub(crate) use backend::BackendFactory;
pub use backend::{
    ChipBackend, ChipBackendFn, ChipSpec, Completion, DeviceTensor, KernelDef, KernelLaunch, KernelSource,
    Pending,
};
pub use discrete::DiscreteSim;
#[cfg(feature = "opencl")]
pub use opencl::OpenClChip;
pub(crate) use runtime::{
    ChipArg, ChipCall, ChipConfig, ChipRun, ChipRuntime, CopyBack, CopyIn, END_WINDOW, RunOn, Trace,
};
pub use sim::{DeviceMemory, SimChip};

/// A chip orchestration as a plain `fn` pointer; what [`ChipFn::orchestration`] takes.
///
/// It receives the chip's [`Orchestrator`] (whose NEXT_LEVEL workers are the chip's cores),
/// the run's arguments (every tensor is device memory of the chip, tagged from its access) and
/// the run's [`CallConfig`].
///
/// ```
/// use simpler::{chip::CallConfig, chip::ChipFn, chip::ChipOrchFnPtr, Orchestrator, Result, TaskArgs};
///
/// fn nothing(_orch: &mut Orchestrator<'_>, _args: &TaskArgs, _cfg: &CallConfig) -> Result<()> {
///     Ok(())
/// }
/// let f: ChipOrchFnPtr = nothing;
/// assert!(!ChipFn::orchestration("nothing", f).is_kernel());
/// ```
pub type ChipOrchFnPtr = for<'a, 'b> fn(&'a mut Orchestrator<'b>, &TaskArgs, &CallConfig) -> Result<()>;

/// Payload format version of chip callable descriptors.
const CHIP_PAYLOAD_FORMAT_VERSION: u32 = 1;
/// Descriptor sub-kind of a kernel.
const SUBKIND_KERNEL: u32 = 1;
/// Descriptor sub-kind of a chip orchestration.
const SUBKIND_ORCHESTRATION: u32 = 2;
/// Descriptor sub-kind of a kernel with device source (and perhaps a native body).
const SUBKIND_SOURCE_KERNEL: u32 = 3;

/// The body a kernel with device source only is sent with: what a simulated chip would run,
/// were the runtime not refusing it first (`KernelDef::require_native`).
fn no_native_body(_: &crate::data::host_args::HostArgs<'_>) -> crate::callable::host::HostResult {
    Err("this kernel has only device source".into())
}

/// What a core runs for a kernel: its name, digest and code, cheap to clone per task.
#[derive(Clone, Debug)]
pub(crate) struct KernelRef {
    name: Arc<str>,
    digest: crate::callable::identity::Digest,
    native: Option<HostFnPtr>,
    source: Option<Arc<KernelSource>>,
}

/// What a chip run runs: a kernel (on core 0) or a chip orchestration.
#[derive(Clone, Debug)]
pub(crate) enum RunBody {
    Kernel(KernelRef),
    Orchestration(ChipOrchFnPtr),
}

impl KernelRef {
    /// The kernel as a backend sees it.
    pub(crate) fn def(&self) -> KernelDef<'_> {
        KernelDef {
            name: &self.name,
            digest: self.digest,
            native: self.native,
            source: self.source.as_deref(),
        }
    }
}

/// What a chip callable runs.
#[derive(Clone, Copy)]
pub(crate) enum ChipBody {
    /// Runs on one core with typed slices of its tensors.
    Kernel(HostFnPtr),
    /// Submits kernels to the chip's cores.
    Orchestration(ChipOrchFnPtr),
}

/// A chip callable: a kernel that runs on one core of a chip, or a chip orchestration that
/// submits kernels to the chip's cores.
///
/// Its identity is the sha256 of a canonical descriptor made of its sub-kind and name, so it is
/// the same in every process of this binary. Give each chip callable its own name: registering
/// a different function under a sub-kind and name already registered is refused. A chip
/// orchestration names its kernels by [`CallableHandle`]: build the kernel's `ChipFn` and take
/// [`handle`](ChipFn::handle) (the kernels must also be registered on the chip).
///
/// ```
/// use simpler::{chip::CallConfig, callable::CallableKind, chip::ChipFn, HostArgs, HostResult, Orchestrator, Result, TaskArgs};
///
/// /// `x *= k` in place.
/// fn scale(args: &HostArgs<'_>) -> HostResult {
///     let k = args.scalar_f32(0)?;
///     for v in args.output::<f32>(0)? {
///         *v *= k;
///     }
///     Ok(())
/// }
///
/// fn scale_kernel() -> ChipFn {
///     ChipFn::kernel("scale", scale)
/// }
///
/// /// `x *= 6`, as two dependent kernels on cores 0 and 1.
/// fn times_six(orch: &mut Orchestrator<'_>, args: &TaskArgs, cfg: &CallConfig) -> Result<()> {
///     let x = args.tensor(0).expect("one tensor");
///     let scale = scale_kernel().handle();
///     for (core, k) in [(0, 2.0f32), (1, 3.0)] {
///         let mut step = TaskArgs::new();
///         step.inout(x)?.scalar_f32(k); // the second waits for the first
///         orch.submit_next_level(&scale, step, cfg.clone(), core)?;
///     }
///     Ok(())
/// }
///
/// let kernel = scale_kernel();
/// let orch = ChipFn::orchestration("times_six", times_six);
/// assert!(kernel.is_kernel() && !orch.is_kernel());
/// assert_eq!(kernel.handle().kind(), CallableKind::Chip);
/// assert_eq!(kernel.handle(), scale_kernel().handle()); // same function, same identity
/// assert_ne!(kernel.handle().digest(), orch.handle().digest());
/// ```
#[derive(Clone)]
pub struct ChipFn {
    name: Arc<str>,
    body: ChipBody,
    descriptor: Descriptor,
    origin: Origin,
    /// A kernel's device source, if any.
    source: Option<Arc<KernelSource>>,
    /// Whether a kernel's body is its own (false for a kernel with device source only).
    native: bool,
}

impl std::fmt::Debug for ChipFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChipFn")
            .field("name", &self.name)
            .field("kernel", &self.is_kernel())
            .field("digest", &self.descriptor.digest())
            .finish()
    }
}

/// The canonical descriptor: header (`schema_version`, `kind = Chip`), then
/// `u32 payload_format_version = 1`, `u32 subkind` (1 kernel, 2 orchestration), string `name`,
/// and nothing else: the identity must not depend on where the compiler put the function (a
/// small function can have several copies in one binary).
fn chip_descriptor(subkind: u32, name: &str) -> Descriptor {
    let mut w = DescriptorWriter::new(CallableKind::Chip);
    w.u32(CHIP_PAYLOAD_FORMAT_VERSION).u32(subkind).str(name);
    w.finish()
}

/// The descriptor of a kernel with device source: as [`chip_descriptor`] with sub-kind 3, then
/// `u32 native` (1 when it has a Rust body too), strings `language`, `entry` and the source
/// `text`: the identity covers the source, as upstream's covers the kernel binary.
fn source_descriptor(name: &str, native: bool, source: &KernelSource) -> Descriptor {
    let mut w = DescriptorWriter::new(CallableKind::Chip);
    w.u32(CHIP_PAYLOAD_FORMAT_VERSION)
        .u32(SUBKIND_SOURCE_KERNEL)
        .str(name)
        .u32(u32::from(native))
        .str(source.language())
        .str(source.entry())
        .str(source.text());
    w.finish()
}

/// Reads the canonical encoding back (bounds-checked).
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let field = self.at.checked_add(n).and_then(|end| self.bytes.get(self.at..end)).ok_or_else(|| {
            Error::decode(format!("chip callable descriptor truncated at byte {}", self.at))
        })?;
        self.at += n;
        Ok(field)
    }

    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn str(&mut self, what: &str) -> Result<&'a str> {
        std::str::from_utf8(self.bytes()?)
            .map_err(|_| Error::decode(format!("chip callable {what} is not UTF-8")))
    }
}

impl ChipFn {
    /// A kernel: runs on one core of the chip with typed slices of its tensors.
    ///
    /// `args.worker_index()` is the index of the core it runs on. Its tensors are device
    /// memory of the chip (host tensors are copied in and out around the run).
    ///
    /// ```
    /// use simpler::{chip::ChipFn, HostArgs, HostResult};
    ///
    /// fn vadd(args: &HostArgs<'_>) -> HostResult {
    ///     let (a, b, out) = (args.input::<f32>(0)?, args.input::<f32>(1)?, args.output::<f32>(2)?);
    ///     for i in 0..out.len() {
    ///         out[i] = a[i] + b[i];
    ///     }
    ///     Ok(())
    /// }
    /// let k = ChipFn::kernel("vadd", vadd);
    /// assert_eq!(k.name(), "vadd");
    /// assert!(k.is_kernel());
    /// ```
    #[track_caller]
    pub fn kernel(name: &str, f: HostFnPtr) -> ChipFn {
        let descriptor = chip_descriptor(SUBKIND_KERNEL, name);
        let origin = Origin::Made(std::panic::Location::caller());
        ChipFn {
            name: name.into(),
            body: ChipBody::Kernel(f),
            descriptor,
            origin,
            source: None,
            native: true,
        }
    }

    /// A kernel given as device source only (OpenCL C): it runs on a device backend (an
    /// OpenCL chip), which compiles it when it is registered; a simulated chip refuses it at
    /// registration, naming it. Its identity covers the source text.
    ///
    /// Its tensors are the kernel function's first parameters, in order (`__global` pointers
    /// to each view's first element), then its scalars. The parameters are read from the
    /// source when it is registered, so a task whose tensor count, scalar count or tensor
    /// element types (`__global float*` takes `f32` tensors) do not match them is refused at
    /// submit, an [`ErrorKind::InvalidArgument`] error naming the kernel, what its source
    /// declares and what the task passed. A source whose parameters hide behind macros is
    /// checked only by the device, at launch.
    ///
    /// ```
    /// use simpler::chip::{ChipFn, KernelSource};
    ///
    /// const VADD: &str = "__kernel void vadd(__global const float* a, __global const float* b,
    ///                                        __global float* c) {
    ///     size_t i = get_global_id(0);
    ///     c[i] = a[i] + b[i];
    /// }";
    /// let k = ChipFn::opencl("vadd", KernelSource::opencl(VADD, "vadd"));
    /// assert!(k.is_kernel());
    /// let other = ChipFn::opencl("vadd", KernelSource::opencl(&VADD.replace('+', "-"), "vadd"));
    /// assert_ne!(k.handle().digest(), other.handle().digest()); // the source counts
    /// ```
    #[track_caller]
    pub fn opencl(name: &str, source: KernelSource) -> ChipFn {
        let descriptor = source_descriptor(name, false, &source);
        let origin = Origin::Made(std::panic::Location::caller());
        ChipFn {
            name: name.into(),
            body: ChipBody::Kernel(no_native_body),
            descriptor,
            origin,
            source: Some(Arc::new(source)),
            native: false,
        }
    }

    /// This kernel with device source beside its Rust body: a simulated chip runs the body, a
    /// device backend the source, so one program runs on either. Its identity covers the
    /// source. A chip orchestration is refused ([`ErrorKind::Callable`]).
    ///
    /// A task must match the parameters the source declares on a simulated chip too (see
    /// [`ChipFn::opencl`]): what a device could not launch is refused at submit everywhere.
    ///
    /// ```
    /// use simpler::{chip::CallConfig, chip::ChipFn, chip::KernelSource, status::Level};
    /// use simpler::{DataType, ErrorKind, HostArgs, HostResult, TaskArgs, Worker};
    ///
    /// fn scale(args: &HostArgs<'_>) -> HostResult {
    ///     let k = args.scalar_f32(0)?;
    ///     args.output::<f32>(0)?.iter_mut().for_each(|v| *v *= k);
    ///     Ok(())
    /// }
    /// const SCALE: &str = "__kernel void scale(__global float* x, float k) { x[get_global_id(0)] *= k; }";
    /// let k = ChipFn::kernel("scale", scale).with_source(KernelSource::opencl(SCALE, "scale"))?;
    /// let def = k.kernel_def().expect("a kernel");
    /// assert!(def.has_native() && def.source().is_some());
    ///
    /// // On a simulated chip, a task without the scalar `k` is refused before it runs.
    /// let mut chip = Worker::builder().level(Level::Chip).chip_memory(1 << 20).build()?;
    /// let k = chip.register_chip(k)?;
    /// chip.init()?;
    /// let buf = chip.create_buffer(64)?;
    /// let mut args = TaskArgs::new();
    /// args.inout(&buf.tensor(&[16], DataType::Float32)?)?;
    /// let err = chip.run_callable(&k, args, CallConfig::default()).unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    /// assert!(err.message().contains("the task passed 1 tensor (f32) and 0 scalars"));
    /// drop(buf);
    /// chip.close()?;
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn with_source(self, source: KernelSource) -> Result<ChipFn> {
        if !self.is_kernel() {
            return Err(Error::new(
                ErrorKind::Callable,
                format!("chip orchestration `{}` cannot take kernel source; only a kernel can", self.name),
            ));
        }
        let descriptor = source_descriptor(&self.name, self.native, &source);
        Ok(ChipFn { descriptor, source: Some(Arc::new(source)), ..self })
    }

    /// The kernel as a backend sees it ([`ChipBackend::load_kernel`]); `None` for a chip
    /// orchestration.
    ///
    /// ```
    /// use simpler::{chip::ChipFn, HostArgs, HostResult};
    /// fn noop(_: &HostArgs<'_>) -> HostResult { Ok(()) }
    /// let k = ChipFn::kernel("noop", noop);
    /// assert_eq!(k.kernel_def().expect("a kernel").name(), "noop");
    /// ```
    pub fn kernel_def(&self) -> Option<KernelDef<'_>> {
        match self.body {
            ChipBody::Kernel(f) => Some(KernelDef {
                name: &self.name,
                digest: self.descriptor.digest(),
                native: self.native.then_some(f),
                source: self.source.as_deref(),
            }),
            ChipBody::Orchestration(_) => None,
        }
    }

    /// What a run of this callable runs.
    pub(crate) fn run_body(&self) -> RunBody {
        match (self.body, self.kernel_ref()) {
            (ChipBody::Orchestration(o), _) => RunBody::Orchestration(o),
            (ChipBody::Kernel(_), k) => RunBody::Kernel(k.expect("a kernel has a kernel ref")),
        }
    }

    /// Whether it is a `#[callable(chip)]`, which every Worker of the binary registers.
    pub(crate) fn is_linked(&self) -> bool {
        matches!(self.origin, Origin::Macro(_))
    }

    /// The parameters a kernel's OpenCL C source declares, when it has source plain enough to
    /// read them from (`callable::signature`): what a submit checks a task's arguments against.
    pub(crate) fn signature(&self) -> Option<&Arc<KernelSignature>> {
        self.source.as_deref().and_then(KernelSource::signature)
    }

    /// What a submit checks a task of this callable against: its kind and signature.
    pub(crate) fn registered(&self) -> Registered {
        Registered { kind: CallableKind::Chip, signature: self.signature().cloned(), placed: None }
    }

    /// What a core runs for this kernel; `None` for a chip orchestration.
    pub(crate) fn kernel_ref(&self) -> Option<KernelRef> {
        match self.body {
            ChipBody::Kernel(f) => Some(KernelRef {
                name: self.name.clone(),
                digest: self.descriptor.digest(),
                native: self.native.then_some(f),
                source: self.source.clone(),
            }),
            ChipBody::Orchestration(_) => None,
        }
    }

    /// A chip orchestration: submits kernels to the chip's cores with
    /// [`Orchestrator::submit_next_level`] (core ids `0..cores`), with the usual tag-driven
    /// dependencies. Every tensor it receives is device memory of the chip.
    ///
    /// `orch.alloc` works inside it and carves intermediates from the chip's device memory
    /// (they count against `chip_memory`, wait for room like any allocation under
    /// back-pressure, and are freed as their scopes end). `submit_sub` does not: a chip has no
    /// SUB workers.
    ///
    /// ```
    /// use simpler::{chip::CallConfig, chip::ChipFn, HostArgs, HostResult, Orchestrator, Result, TaskArgs};
    ///
    /// fn relu(args: &HostArgs<'_>) -> HostResult {
    ///     for v in args.output::<f32>(0)? {
    ///         *v = v.max(0.0);
    ///     }
    ///     Ok(())
    /// }
    ///
    /// /// Splits tensor 0 (a contiguous f32 vector) in halves, one per core.
    /// fn split_relu(orch: &mut Orchestrator<'_>, args: &TaskArgs, cfg: &CallConfig) -> Result<()> {
    ///     let x = args.tensor(0).expect("one tensor");
    ///     let n = x.view().shape()[0] / 2;
    ///     let relu = ChipFn::kernel("relu", relu).handle();
    ///     for core in 0..2u32 {
    ///         let half = x.reshape(simpler::memory::TensorView::new(
    ///             u64::from(core * n) * 4,
    ///             &[n],
    ///             None,
    ///             simpler::DataType::Float32,
    ///         )?)?;
    ///         let mut a = TaskArgs::new();
    ///         a.inout(&half)?; // disjoint halves: the two tasks run at once
    ///         orch.submit_next_level(&relu, a, cfg.clone(), core)?;
    ///     }
    ///     Ok(())
    /// }
    /// let f = ChipFn::orchestration("split_relu", split_relu);
    /// assert_eq!(f.name(), "split_relu");
    /// ```
    #[track_caller]
    pub fn orchestration(name: &str, f: ChipOrchFnPtr) -> ChipFn {
        let descriptor = chip_descriptor(SUBKIND_ORCHESTRATION, name);
        let origin = Origin::Made(std::panic::Location::caller());
        ChipFn {
            name: name.into(),
            body: ChipBody::Orchestration(f),
            descriptor,
            origin,
            source: None,
            native: true,
        }
    }

    /// The name given at construction.
    ///
    /// ```
    /// use simpler::{chip::ChipFn, HostArgs, HostResult};
    /// fn noop(_: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    /// assert_eq!(ChipFn::kernel("noop", noop).name(), "noop");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True for a kernel, false for a chip orchestration.
    ///
    /// ```
    /// use simpler::{chip::CallConfig, chip::ChipFn, HostArgs, HostResult, Orchestrator, TaskArgs};
    /// fn noop(_: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    /// fn plan(_: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    ///     Ok(())
    /// }
    /// assert!(ChipFn::kernel("noop", noop).is_kernel());
    /// assert!(!ChipFn::orchestration("plan", plan).is_kernel());
    /// ```
    pub fn is_kernel(&self) -> bool {
        matches!(self.body, ChipBody::Kernel(_))
    }

    /// The handle that names this callable: its digest, [`CallableKind::Chip`] and its name.
    ///
    /// The same handle `Worker::register_chip` returns, computed without a Worker; this is how
    /// a chip orchestration names the kernels it submits.
    ///
    /// ```
    /// use simpler::{callable::CallableKind, chip::ChipFn, HostArgs, HostResult, callable::Namespace};
    /// fn noop(_: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    /// let h = ChipFn::kernel("noop", noop).handle();
    /// assert_eq!((h.kind(), h.namespace(), h.name()), (CallableKind::Chip, Namespace::LocalChip, "noop"));
    /// assert_ne!(h.digest(), ChipFn::kernel("other", noop).handle().digest()); // the name counts
    /// ```
    pub fn handle(&self) -> CallableHandle {
        CallableHandle::new(self.descriptor.digest(), CallableKind::Chip, &self.name)
    }

    /// The canonical descriptor (kind [`CallableKind::Chip`]).
    pub(crate) fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    /// The function's address, as a `REGISTER_CHIP` (kernel) or `REGISTER_CHIP_ORCH` control
    /// carries it to a child process.
    pub(crate) fn fn_address(&self) -> u64 {
        match self.body {
            ChipBody::Kernel(f) => FnAddress::of(f).to_wire(),
            ChipBody::Orchestration(f) => FnAddress::of(f).to_wire(),
        }
    }

    /// What it runs.
    pub(crate) fn body(&self) -> ChipBody {
        self.body
    }

    /// A `#[callable(chip)]` kernel or chip orchestration from the link-time registry, with the
    /// descriptor the macro computed. A kernel declared with `opencl = "file.cl"` keeps its Rust
    /// body and gains the file's source, so a simulated chip runs the one and a device backend
    /// the other.
    pub(crate) fn from_linked(info: &CallableInfo) -> Result<ChipFn> {
        let body = match (info.entry::<HostFnPtr>(), info.entry::<ChipOrchFnPtr>()) {
            (Some(f), _) if info.kind == CallableKind::Chip => ChipBody::Kernel(f),
            (_, Some(f)) => ChipBody::Orchestration(f),
            _ => return Err(info.wrong_kind("a chip callable")),
        };
        let source = match (body, info.source) {
            (_, None) => None,
            (ChipBody::Kernel(_), Some((text, entry))) => Some(Arc::new(KernelSource::opencl(text, entry))),
            (ChipBody::Orchestration(_), Some(_)) => {
                return Err(Error::new(
                    ErrorKind::Callable,
                    format!(
                        "chip orchestration `{}` cannot take kernel source; only a kernel can",
                        info.name
                    ),
                ));
            }
        };
        Ok(ChipFn {
            name: info.name.into(),
            body,
            descriptor: info.descriptor_checked()?,
            origin: Origin::Macro(info.path),
            source,
            native: true,
        })
    }

    /// Rebuilds a chip callable in a child process of the one that made it (same binary), from the
    /// function `body` sent with it and its descriptor.
    ///
    /// The descriptor must be a well-formed chip descriptor whose sub-kind is known and names
    /// the kind of `body` (a kernel or an orchestration); anything else is an error
    /// ([`ErrorKind::Decode`] for malformed bytes, [`ErrorKind::Callable`] otherwise). A
    /// `#[callable(chip)]` descriptor is found by digest in the link-time registry instead.
    pub(crate) fn from_parts(body: ChipBody, descriptor: Descriptor) -> Result<ChipFn> {
        let callable = |msg: String| Error::new(ErrorKind::Callable, msg);
        if descriptor.kind() != CallableKind::Chip {
            return Err(callable(format!(
                "{}: a {} descriptor is not a chip callable",
                descriptor.digest(),
                descriptor.kind().name()
            )));
        }
        let mut r = Reader { bytes: descriptor.bytes(), at: 8 };
        let version = r.u32()?;
        if version == MACRO_PAYLOAD_FORMAT_VERSION {
            // A `#[callable(chip)]`: this process, a fork of the same binary, finds it by digest
            // in the link-time registry.
            let info = CallableInfo::find(descriptor.digest()).ok_or_else(|| {
                callable(format!("{}: no #[callable] with this digest is linked", descriptor.digest()))
            })?;
            return ChipFn::from_linked(info);
        }
        if version != CHIP_PAYLOAD_FORMAT_VERSION {
            return Err(Error::decode(format!(
                "chip callable payload format {version} is unsupported (expected {CHIP_PAYLOAD_FORMAT_VERSION})"
            )));
        }
        let subkind = r.u32()?;
        let name = r.str("name")?.to_string();
        let source = if subkind == SUBKIND_SOURCE_KERNEL {
            let native = match r.u32()? {
                0 => false,
                1 => true,
                other => {
                    return Err(Error::decode(format!(
                        "chip kernel `{name}`: native flag {other} is not 0 or 1"
                    )));
                }
            };
            let (language, entry, text) = (r.str("language")?, r.str("entry")?, r.str("source")?);
            Some((native, KernelSource::from_parts(language, text, entry)))
        } else {
            None
        };
        if r.at != r.bytes.len() {
            return Err(Error::decode(format!(
                "chip callable descriptor has {} trailing bytes",
                r.bytes.len() - r.at
            )));
        }
        let f = match (subkind, body, source) {
            (SUBKIND_KERNEL, ChipBody::Kernel(k), _) => ChipFn::kernel(&name, k),
            (SUBKIND_ORCHESTRATION, ChipBody::Orchestration(o), _) => ChipFn::orchestration(&name, o),
            (SUBKIND_SOURCE_KERNEL, ChipBody::Kernel(k), Some((true, src))) => {
                ChipFn::kernel(&name, k).with_source(src)?
            }
            (SUBKIND_SOURCE_KERNEL, ChipBody::Kernel(_), Some((false, src))) => ChipFn::opencl(&name, src),
            (SUBKIND_KERNEL | SUBKIND_ORCHESTRATION | SUBKIND_SOURCE_KERNEL, _, _) => {
                return Err(callable(format!(
                    "chip callable `{name}`: sub-kind {subkind} does not match the function sent (1 = kernel, 2 = orchestration, 3 = kernel with source)"
                )));
            }
            (other, _, _) => {
                return Err(callable(format!(
                    "chip callable `{name}`: unknown sub-kind {other} (1 = kernel, 2 = orchestration, 3 = kernel with source)"
                )));
            }
        };
        if f.descriptor != descriptor {
            // A language other than OpenCL C re-encodes the same; only the canonical form is
            // accepted.
            return Err(Error::decode(format!("chip callable `{name}`: the descriptor is not canonical")));
        }
        Ok(ChipFn { origin: Origin::Sent, ..f })
    }
}

impl Installable for ChipFn {
    fn same_code(&self, other: &ChipFn) -> bool {
        if Origin::both_macro(self.origin, other.origin) {
            return true;
        }
        if self.source != other.source || self.native != other.native {
            return false;
        }
        match (self.body, other.body) {
            (ChipBody::Kernel(_), ChipBody::Kernel(_)) if !self.native => true,
            (ChipBody::Kernel(a), ChipBody::Kernel(b)) => std::ptr::fn_addr_eq(a, b),
            (ChipBody::Orchestration(a), ChipBody::Orchestration(b)) => std::ptr::fn_addr_eq(a, b),
            _ => false,
        }
    }

    fn describe(&self) -> String {
        // The address in this process (the wire word is an offset, see `sys::fn_address`).
        let addr = match self.body {
            ChipBody::Kernel(f) => f as usize,
            ChipBody::Orchestration(f) => f as usize,
        };
        format!("`{}` ({}, fn at {addr:#x})", self.name, self.origin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::callable::identity::Digest;
    use crate::data::host_args::HostArgs;

    fn noop(_: &HostArgs<'_>) -> crate::callable::host::HostResult {
        Ok(())
    }

    fn plan(_: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> Result<()> {
        Ok(())
    }

    fn le(v: u32) -> [u8; 4] {
        v.to_le_bytes()
    }

    #[test]
    fn descriptor_matches_canonical_bytes() {
        let k = ChipFn::kernel("vadd", noop);
        let addr = crate::sys::fn_address::FnAddress::of(noop as HostFnPtr).to_wire();
        let mut b = Vec::new();
        b.extend_from_slice(&le(1)); // schema_version
        b.extend_from_slice(&le(1)); // kind = Chip
        b.extend_from_slice(&le(1)); // payload_format_version
        b.extend_from_slice(&le(1)); // subkind = kernel
        b.extend_from_slice(&le(4));
        b.extend_from_slice(b"vadd");
        assert_eq!(k.descriptor().bytes(), &b[..]);
        assert_eq!(k.descriptor().kind(), CallableKind::Chip);
        assert_eq!(k.handle().digest(), Digest::of(&b));
        assert_eq!(k.fn_address(), addr, "the wire word of the kernel");

        let o = ChipFn::orchestration("vadd", plan);
        assert_eq!(o.descriptor().bytes()[12..16], le(2));
        assert_ne!(o.handle().digest(), k.handle().digest());
        assert_eq!(
            format!("{k:?}"),
            format!("ChipFn {{ name: \"vadd\", kernel: true, digest: {} }}", k.handle().digest())
        );
    }

    #[test]
    fn from_parts_round_trips() {
        for f in [ChipFn::kernel("k", noop), ChipFn::orchestration("o", plan)] {
            let back = ChipFn::from_parts(f.body(), f.descriptor().clone()).unwrap();
            assert_eq!(back.name(), f.name());
            assert_eq!(back.is_kernel(), f.is_kernel());
            assert_eq!(back.handle(), f.handle());
            assert_eq!(back.fn_address(), f.fn_address());
        }
        // The rebuilt kernel really is the function.
        let back = ChipFn::from_parts(ChipBody::Kernel(noop), ChipFn::kernel("k", noop).descriptor().clone())
            .unwrap();
        let ChipBody::Kernel(f) = back.body() else { panic!("kernel") };
        assert!(f(&HostArgs::new(Vec::new(), &[], 0).unwrap()).is_ok());
    }

    #[test]
    fn from_parts_refuses_bad_descriptors() {
        let k = ChipFn::kernel("k", noop);
        let addr = k.body();
        let host = crate::callable::identity::host_fn_descriptor("k", "fn", k.fn_address());
        assert_eq!(ChipFn::from_parts(addr, host).unwrap_err().kind(), ErrorKind::Callable);

        let bad_sub = chip_descriptor(7, "k");
        assert!(ChipFn::from_parts(addr, bad_sub).unwrap_err().message().contains("sub-kind 7"));

        // A kernel descriptor sent with an orchestration, or the reverse, is refused.
        let o = ChipFn::orchestration("o", plan);
        let e = ChipFn::from_parts(o.body(), k.descriptor().clone()).unwrap_err();
        assert!(e.message().contains("does not match"), "{e}");
        assert!(ChipFn::from_parts(addr, o.descriptor().clone()).is_err());

        let mut w = DescriptorWriter::new(CallableKind::Chip);
        w.u32(9).u32(1).str("k");
        assert_eq!(ChipFn::from_parts(addr, w.finish()).unwrap_err().kind(), ErrorKind::Decode);

        for cut in 8..k.descriptor().bytes().len() {
            let d = Descriptor::from_bytes(k.descriptor().bytes()[..cut].to_vec()).unwrap();
            assert_eq!(ChipFn::from_parts(addr, d).unwrap_err().kind(), ErrorKind::Decode, "cut at {cut}");
        }
        let mut long = k.descriptor().bytes().to_vec();
        long.push(0);
        let d = Descriptor::from_bytes(long).unwrap();
        assert!(ChipFn::from_parts(addr, d).unwrap_err().message().contains("trailing"));

        // Two copies of one function (different addresses) are one callable: the identity is
        // the name and sub-kind.
        assert_eq!(ChipFn::kernel("k", noop).handle(), ChipFn::kernel("k", other_noop).handle());
    }

    fn other_noop(_: &HostArgs<'_>) -> crate::callable::host::HostResult {
        Ok(())
    }
}
