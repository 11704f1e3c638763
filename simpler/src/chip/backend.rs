//! The chip backend seam: what a chip runtime asks of a device, shaped so that a real device
//! (OpenCL, CUDA, a vendor NPU runtime) fits as well as the simulated [`SimChip`].
//!
//! Device memory is opaque: a device pointer is a `u64` the runtime never dereferences. It
//! only does arithmetic on it (`ptr + k` names byte `k` of the allocation `ptr` starts), so a
//! backend may encode a buffer handle and an offset in it. Allocation, frees, copies in both
//! directions, kernel loading and kernel launch are trait calls; a launch returns a
//! [`Completion`] the chip's core thread waits on.
//!
//! Kernels come in two kinds, and one callable may carry both ([`KernelDef`]): a **native**
//! kernel is a Rust function over typed slices, which only a backend whose memory lives in this
//! process can run ([`SimChip`]); a **source** kernel is device code (OpenCL C) that a device
//! backend compiles in [`ChipBackend::load_kernel`] and runs in [`ChipBackend::launch`].
//!
//! How other device APIs map onto the trait (one row each; the OpenCL backend is
//! `chip::opencl`, behind the `opencl` feature):
//!
//! | trait | OpenCL | CUDA | vendor NPU runtime (e.g. Ascend ACL) |
//! | --- | --- | --- | --- |
//! | a chip | one command queue per core on one device, in the chip's process | one device, a stream per core | one device, a stream per core |
//! | `malloc` / `free`, the `u64` | a `cl_mem` per allocation; handle and offset packed in the word | `cudaMalloc`; the device pointer itself | `aclrtMalloc`; the device pointer |
//! | `copy_to_device` / `copy_from_device` | `clEnqueueWrite/ReadBuffer` | `cudaMemcpyAsync` + event | `aclrtMemcpyAsync` + event |
//! | `load_kernel` | `clBuildProgram` from the source; the build log on failure | NVRTC or `cuModuleLoadData` of PTX | `aclrtBinaryLoadFromData` |
//! | `launch` | `clEnqueueNDRangeKernel` on the core's queue | `cuLaunchKernel` on the core's stream | `aclrtLaunchKernel` on the core's stream |
//! | [`Completion`] | a `cl_event` (`clGetEventInfo` / `clWaitForEvents`) | `cudaEventQuery` / `cudaEventSynchronize` | `aclrtQueryEventStatus` / `aclrtSynchronizeEvent` |
//!
//! Copies return when the bytes have moved: the runtime issues them from the thread that
//! prepares a run while the previous run's kernels execute on the core threads, so a backend
//! with a copy queue beside its core queues overlaps them (the pipelining of `chip::runtime`).
//! Ordering between a copy and the kernels that use its bytes is the runtime's: it launches a
//! run's kernels only after its copy-in returned, and copies back only after they completed.

use std::sync::{Arc, OnceLock};

use crate::callable::host::HostFnPtr;
use crate::callable::identity::Digest;
use crate::callable::signature::KernelSignature;
use crate::chip::sim::{DeviceMemory, SimChip};
use crate::data::buffer::Access;
use crate::data::tensor::TensorView;
use crate::error::{Error, ErrorKind, Result};

/// The most simulated cores one chip may have.
pub(crate) const MAX_CORES: usize = 1024;

/// The device side of an L2 chip: its memory, its cores, how bytes move to and from it, and how
/// kernels are loaded and launched on it.
///
/// A chip runtime reaches its device only through this trait. [`SimChip`] is the default
/// implementation; `chip::opencl::OpenClChip` (feature `opencl`) runs kernels on an OpenCL
/// device; give a Worker another with
/// [`WorkerBuilder::chip_backend`](crate::WorkerBuilder::chip_backend) (for example one that
/// wraps a `SimChip` to count or trace what the runtime does).
///
/// A **simulated** backend gives [`host_memory`](Self::host_memory) and `cores`; every other
/// method has a default that works on that memory (and runs native kernels on the calling
/// thread), so a wrapper that counts or traces overrides only what it watches. A **device**
/// backend returns `None` there and implements every method.
///
/// Device pointers are opaque `u64`s: the runtime never dereferences one, it only offsets it
/// (`ptr + k` is byte `k` of the allocation at `ptr`), so a backend may pack a buffer handle and
/// an offset into it. Whatever a backend returns
/// is checked: a `malloc` result must not overlap a block the runtime already holds (else the
/// runtime refuses it with an [`ErrorKind::Os`] error naming the
/// block).
///
/// ```
/// use simpler::{chip::ChipBackend, chip::SimChip};
///
/// fn upload(chip: &dyn ChipBackend, bytes: &[u8]) -> simpler::Result<u64> {
///     let ptr = chip.malloc(bytes.len() as u64)?;
///     chip.copy_to_device(ptr, bytes)?;
///     Ok(ptr)
/// }
///
/// let chip = SimChip::new(1 << 20, 2)?;
/// let ptr = upload(&chip, b"hello")?;
/// let mut back = [0u8; 5];
/// chip.copy_from_device(ptr, &mut back)?;
/// assert_eq!(&back, b"hello");
/// chip.free(ptr)?;
/// # Ok::<(), simpler::Error>(())
/// ```
pub trait ChipBackend: Send + Sync + 'static {
    /// The number of cores kernels can run on (ids `0..cores()`), 1 to 1024.
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::SimChip};
    /// assert_eq!(SimChip::new(1 << 20, 4)?.cores(), 4);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn cores(&self) -> usize;

    /// The size of the device memory in bytes (what allocations may use in all).
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::SimChip};
    /// assert_eq!(SimChip::new(64 << 20, 4)?.memory_size(), 64 << 20);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn memory_size(&self) -> u64 {
        self.host_memory().map_or(0, DeviceMemory::size)
    }

    /// The alignment, in bytes, a kernel argument's first byte needs on this device: the
    /// runtime places each staged host tensor at a multiple of it. A power of two from 64 to
    /// 65536; 64 by default.
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::SimChip};
    /// assert_eq!(SimChip::new(1 << 20, 1)?.alignment(), 64);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn alignment(&self) -> u64 {
        64
    }

    /// Allocates `nbytes` of device memory and returns its device pointer. No room now (a free
    /// may make some) is an [`ErrorKind::InvalidState`] error; a request larger than the whole
    /// memory an [`ErrorKind::InvalidArgument`] one.
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::SimChip};
    /// let chip = SimChip::new(4096, 1)?;
    /// let p = chip.malloc(100)?;
    /// assert!(chip.memory().is_live(p, 100));
    /// assert!(chip.malloc(8192).is_err());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn malloc(&self, nbytes: u64) -> Result<u64> {
        host_memory(self, "malloc")?.malloc(nbytes)
    }

    /// Frees an allocation made by [`malloc`](Self::malloc); `ptr` must be its start.
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::SimChip};
    /// let chip = SimChip::new(4096, 1)?;
    /// let p = chip.malloc(256)?;
    /// chip.free(p)?;
    /// assert!(chip.free(p).unwrap_err().message().contains("double free"));
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn free(&self, ptr: u64) -> Result<()> {
        host_memory(self, "free")?.free(ptr)
    }

    /// Copies `src` to device memory at `dst` (host to device); returns once the bytes are
    /// there. A strided host tensor arrives packed: its elements gathered on the host, in one
    /// call per window of the copy (one for the whole tensor unless copied in pieces).
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::SimChip};
    /// let chip = SimChip::new(4096, 1)?;
    /// let p = chip.malloc(8)?;
    /// chip.copy_to_device(p, &[1, 2, 3, 4, 5, 6, 7, 8])?;
    /// assert!(chip.copy_to_device(p + 4, &[0; 8]).is_err()); // runs past the allocation
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()> {
        host_memory(self, "copy_to_device")?.copy_to(dst, src)
    }

    /// Copies device memory at `src` into `dst` (device to host); returns once the bytes are
    /// there.
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::SimChip};
    /// let chip = SimChip::new(4096, 1)?;
    /// let p = chip.malloc(4)?;
    /// chip.copy_to_device(p, &[9, 8, 7, 6])?;
    /// let mut two = [0u8; 2];
    /// chip.copy_from_device(p + 2, &mut two)?;
    /// assert_eq!(two, [7, 6]);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn copy_from_device(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        host_memory(self, "copy_from_device")?.copy_from(src, dst)
    }

    /// Makes `kernel` launchable on this device (compiles its source, for a device backend),
    /// when it is registered on the chip: before `init` for callables registered then, else at
    /// registration, on every chip, all or nothing. A build failure is an
    /// [`ErrorKind::Callable`] error that carries the compiler's log.
    ///
    /// The default accepts a kernel with a native (Rust) body and refuses one without, naming
    /// it: right for a backend that delegates launches to a [`SimChip`].
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::SimChip};
    /// // A SimChip runs native kernels: loading one is a no-op. See `KernelDef` for a source one.
    /// let chip = SimChip::new(4096, 1)?;
    /// # let _ = chip;
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn load_kernel(&self, kernel: &KernelDef<'_>) -> Result<()> {
        kernel.require_native("this backend")
    }

    /// Whether this backend has what it needs to run `kernel`: a native body by default (a
    /// simulated backend), OpenCL C source for an OpenCL chip. A `#[callable(chip)]` kernel,
    /// which every Worker of the binary registers, is loaded only where this holds; elsewhere
    /// a task that runs it fails at launch, naming it. A kernel registered by hand is always
    /// loaded, so registering one the chip cannot run is refused at once.
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::ChipFn, chip::KernelSource, chip::SimChip, HostArgs, HostResult};
    /// fn noop(_: &HostArgs<'_>) -> HostResult { Ok(()) }
    /// let sim = SimChip::new(4096, 1)?;
    /// assert!(sim.can_run(&ChipFn::kernel("noop", noop).kernel_def().unwrap()));
    /// let cl_only = ChipFn::opencl("k", KernelSource::opencl("__kernel void k() {}", "k"));
    /// assert!(!sim.can_run(&cl_only.kernel_def().unwrap()));
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn can_run(&self, kernel: &KernelDef<'_>) -> bool {
        kernel.has_native()
    }

    /// Forgets a kernel loaded by [`load_kernel`](Self::load_kernel), when its last
    /// registration is dropped. The default does nothing.
    ///
    /// ```
    /// use simpler::{callable::Digest, chip::ChipBackend, chip::SimChip};
    /// SimChip::new(4096, 1)?.unload_kernel(&Digest::of(b"never loaded")); // nothing to do
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn unload_kernel(&self, digest: &Digest) {
        let _ = digest;
    }

    /// Starts a kernel on core `launch.core()` with its tensors and scalars. Returns
    /// [`Completion::Done`] when it already ran (a simulated chip runs it on the calling thread)
    /// or [`Completion::Pending`] for the runtime to wait on. A kernel's failure is an error
    /// (from here or from the completion) whose message says what failed.
    ///
    /// A [`KernelLaunch`] is made only by the runtime and consumed by one call: a backend that
    /// wraps another passes it on.
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::Completion, chip::DeviceMemory, chip::KernelLaunch, chip::SimChip};
    ///
    /// /// A SimChip that logs every launch.
    /// struct Logged(SimChip);
    /// impl ChipBackend for Logged {
    ///     fn cores(&self) -> usize {
    ///         self.0.cores()
    ///     }
    ///     fn host_memory(&self) -> Option<&DeviceMemory> {
    ///         self.0.host_memory()
    ///     }
    ///     fn launch(&self, l: KernelLaunch<'_>) -> simpler::Result<Completion> {
    ///         eprintln!("`{}` on core {}", l.kernel().name(), l.core());
    ///         self.0.launch(l)
    ///     }
    /// }
    /// # let _ = Logged(SimChip::new(4096, 1)?);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn launch(&self, launch: KernelLaunch<'_>) -> Result<Completion> {
        crate::chip::sim::run_native(host_memory(self, "launch")?, launch)
    }

    /// The device memory as memory of this process, for a simulated backend: the memory native
    /// kernels see, which lets the runtime overlap the next run's copy-in with the running
    /// kernels without ever letting a copy race a kernel. `None` (the default) for a real
    /// device.
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::SimChip};
    /// let chip = SimChip::new(1 << 20, 1)?;
    /// assert_eq!(chip.host_memory().map(|m| m.size()), Some(1 << 20));
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn host_memory(&self) -> Option<&DeviceMemory> {
        None
    }
}

/// The host memory a default method of `backend` works on, or the error that says `method` needs
/// overriding.
fn host_memory<'a, B: ChipBackend + ?Sized>(backend: &'a B, method: &str) -> Result<&'a DeviceMemory> {
    backend.host_memory().ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidState,
            format!(
                "this chip backend has no host memory (ChipBackend::host_memory is None) and does not implement ChipBackend::{method}"
            ),
        )
    })
}

/// A kernel started by [`ChipBackend::launch`]: done already, or pending on the device.
///
/// ```
/// use simpler::chip::Completion;
/// assert!(Completion::Done.wait().is_ok());
/// ```
pub enum Completion {
    /// The kernel has run (successfully: a failure is the launch's error).
    Done,
    /// The kernel runs on the device; wait on it.
    Pending(Box<dyn Pending>),
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Completion::Done => "Done",
            Completion::Pending(_) => "Pending",
        })
    }
}

impl Completion {
    /// Blocks until the kernel has completed; its failure is the error.
    ///
    /// ```
    /// use simpler::chip::{Completion, Pending};
    ///
    /// struct Failed;
    /// impl Pending for Failed {
    ///     fn is_done(&mut self) -> simpler::Result<bool> { Ok(true) }
    ///     fn wait(self: Box<Self>) -> simpler::Result<()> {
    ///         Err(simpler::Error::new(simpler::ErrorKind::TaskFailed, "out of bounds"))
    ///     }
    /// }
    /// assert!(Completion::Pending(Box::new(Failed)).wait().is_err());
    /// ```
    pub fn wait(self) -> Result<()> {
        match self {
            Completion::Done => Ok(()),
            Completion::Pending(p) => p.wait(),
        }
    }
}

/// A kernel running on a device (an OpenCL event, a CUDA event): what
/// [`Completion::Pending`] holds.
///
/// ```
/// use simpler::chip::{Completion, Pending};
///
/// struct AlreadyDone;
/// impl Pending for AlreadyDone {
///     fn is_done(&mut self) -> simpler::Result<bool> { Ok(true) }
///     fn wait(self: Box<Self>) -> simpler::Result<()> { Ok(()) }
/// }
/// let mut p: Box<dyn Pending> = Box::new(AlreadyDone);
/// assert!(p.is_done()?);
/// assert!(Completion::Pending(p).wait().is_ok());
/// # Ok::<(), simpler::Error>(())
/// ```
pub trait Pending: Send {
    /// Whether it completed, without blocking; its failure is the error.
    fn is_done(&mut self) -> Result<bool>;

    /// Blocks (without spinning) until it completed; its failure is the error.
    fn wait(self: Box<Self>) -> Result<()>;
}

/// Device source of a kernel, in the language a device backend compiles (OpenCL C today).
///
/// ```
/// use simpler::chip::KernelSource;
/// let src = KernelSource::opencl("__kernel void k(__global float* x) {}", "k");
/// assert_eq!((src.language(), src.entry()), ("opencl-c", "k"));
/// assert!(src.text().contains("__kernel"));
/// ```
#[derive(Debug, Clone)]
pub struct KernelSource {
    language: Arc<str>,
    text: Arc<str>,
    entry: Arc<str>,
    /// The parameters the text declares, read the first time they are asked for.
    signature: OnceLock<Option<Arc<KernelSignature>>>,
}

/// Two sources are equal when their language, text and entry are (the signature follows).
impl PartialEq for KernelSource {
    fn eq(&self, other: &KernelSource) -> bool {
        (&self.language, &self.text, &self.entry) == (&other.language, &other.text, &other.entry)
    }
}

impl Eq for KernelSource {}

/// The language tag of OpenCL C sources.
pub(crate) const OPENCL_C: &str = "opencl-c";

impl KernelSource {
    /// OpenCL C source `text` whose kernel function is `entry`.
    ///
    /// ```
    /// let src = simpler::chip::KernelSource::opencl("__kernel void k() {}", "k");
    /// assert_eq!(src.entry(), "k");
    /// ```
    pub fn opencl(text: &str, entry: &str) -> KernelSource {
        KernelSource::from_parts(OPENCL_C, text, entry)
    }

    /// Rebuilds a source from its parts (a descriptor's fields).
    pub(crate) fn from_parts(language: &str, text: &str, entry: &str) -> KernelSource {
        KernelSource {
            language: language.into(),
            text: text.into(),
            entry: entry.into(),
            signature: OnceLock::new(),
        }
    }

    /// The language: `"opencl-c"`.
    ///
    /// ```
    /// assert_eq!(simpler::chip::KernelSource::opencl("", "k").language(), "opencl-c");
    /// ```
    pub fn language(&self) -> &str {
        &self.language
    }

    /// The source text.
    ///
    /// ```
    /// assert_eq!(simpler::chip::KernelSource::opencl("text", "k").text(), "text");
    /// ```
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The name of the kernel function in it.
    ///
    /// ```
    /// assert_eq!(simpler::chip::KernelSource::opencl("", "vadd").entry(), "vadd");
    /// ```
    pub fn entry(&self) -> &str {
        &self.entry
    }

    /// The parameters an OpenCL C text declares for its entry, read once; `None` for another
    /// language, or when the text is not plain enough to tell (`callable::signature`).
    pub(crate) fn signature(&self) -> Option<&Arc<KernelSignature>> {
        self.signature
            .get_or_init(|| {
                (&*self.language == OPENCL_C)
                    .then(|| KernelSignature::parse_opencl(&self.text, &self.entry))
                    .flatten()
                    .map(Arc::new)
            })
            .as_ref()
    }
}

/// A kernel as a backend sees it at [`ChipBackend::load_kernel`] and in a launch: its name,
/// digest, and the code it has (a native body, device source, or both).
///
/// ```
/// use simpler::{chip::ChipFn, chip::KernelSource};
/// let f = ChipFn::opencl("noop", KernelSource::opencl("__kernel void noop() {}", "noop"));
/// let def = f.kernel_def().expect("a kernel");
/// assert_eq!(def.name(), "noop");
/// assert!(!def.has_native() && def.source().is_some());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct KernelDef<'a> {
    pub(crate) name: &'a str,
    pub(crate) digest: Digest,
    pub(crate) native: Option<HostFnPtr>,
    pub(crate) source: Option<&'a KernelSource>,
}

impl<'a> KernelDef<'a> {
    /// The callable's name.
    ///
    /// ```
    /// # use simpler::{chip::ChipFn, chip::KernelSource};
    /// let f = ChipFn::opencl("k", KernelSource::opencl("__kernel void k() {}", "k"));
    /// assert_eq!(f.kernel_def().unwrap().name(), "k");
    /// ```
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// The callable's digest (its identity): what a backend keys its loaded kernels by.
    ///
    /// ```
    /// # use simpler::{chip::ChipFn, chip::KernelSource};
    /// let f = ChipFn::opencl("k", KernelSource::opencl("__kernel void k() {}", "k"));
    /// assert_eq!(f.kernel_def().unwrap().digest(), f.handle().digest());
    /// ```
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// Whether it has a native (Rust) body, which only a simulated chip runs.
    ///
    /// ```
    /// # use simpler::{chip::ChipFn, HostArgs, HostResult};
    /// fn noop(_: &HostArgs<'_>) -> HostResult { Ok(()) }
    /// assert!(ChipFn::kernel("noop", noop).kernel_def().unwrap().has_native());
    /// ```
    pub fn has_native(&self) -> bool {
        self.native.is_some()
    }

    /// Its device source, if it has one.
    ///
    /// ```
    /// # use simpler::{chip::ChipFn, chip::KernelSource};
    /// let f = ChipFn::opencl("k", KernelSource::opencl("__kernel void k() {}", "k"));
    /// assert_eq!(f.kernel_def().unwrap().source().map(|s| s.entry()), Some("k"));
    /// ```
    pub fn source(&self) -> Option<&'a KernelSource> {
        self.source
    }

    /// Ok when it has a native body, else the error that says `who` cannot run it.
    pub(crate) fn require_native(&self, who: &str) -> Result<()> {
        if self.native.is_some() {
            return Ok(());
        }
        Err(self.no_native(who))
    }

    /// The error that says `who` cannot run this kernel, which has no native body.
    pub(crate) fn no_native(&self, who: &str) -> Error {
        Error::new(
            ErrorKind::Callable,
            format!(
                "kernel `{}` has only {} source, and {who} runs Rust kernels only; run it on a device backend (for example chip::opencl) or give it a Rust body",
                self.name,
                self.source.map_or("device", |s| s.language())
            ),
        )
    }
}

/// One tensor argument of a launch: the device pointer of its buffer's first byte, its view
/// of that buffer, and the access the task holds.
///
/// ```
/// use simpler::{chip::DeviceTensor, memory::Access, memory::TensorView, DataType};
/// let t = DeviceTensor::new(0x1000, TensorView::new(64, &[16], None, DataType::Float32)?, Access::Read);
/// assert_eq!(t.ptr() + t.view().byte_offset(), 0x1040); // where its first element is
/// # Ok::<(), simpler::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceTensor {
    ptr: u64,
    view: TensorView,
    access: Access,
}

impl DeviceTensor {
    /// A tensor `view` of the device buffer at `ptr`, with `access`.
    ///
    /// ```
    /// # use simpler::{chip::DeviceTensor, memory::Access, memory::TensorView, DataType};
    /// let t = DeviceTensor::new(0, TensorView::new(0, &[4], None, DataType::Int32)?, Access::Write);
    /// assert_eq!(t.access(), Access::Write);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn new(ptr: u64, view: TensorView, access: Access) -> DeviceTensor {
        DeviceTensor { ptr, view, access }
    }

    /// The device pointer of the buffer's first byte (the view's offset is relative to it).
    ///
    /// ```
    /// # use simpler::{chip::DeviceTensor, memory::Access, memory::TensorView, DataType};
    /// # let t = DeviceTensor::new(64, TensorView::new(0, &[4], None, DataType::Int32)?, Access::Read);
    /// assert_eq!(t.ptr(), 64);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The view (shape, strides, element type, byte offset).
    ///
    /// ```
    /// # use simpler::{chip::DeviceTensor, memory::Access, memory::TensorView, DataType};
    /// # let t = DeviceTensor::new(0, TensorView::new(0, &[4], None, DataType::Int32)?, Access::Read);
    /// assert_eq!(t.view().shape(), &[4]);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn view(&self) -> &TensorView {
        &self.view
    }

    /// The access the task holds.
    ///
    /// ```
    /// # use simpler::{chip::DeviceTensor, memory::Access, memory::TensorView, DataType};
    /// # let t = DeviceTensor::new(0, TensorView::new(0, &[4], None, DataType::Int32)?, Access::ReadWrite);
    /// assert!(t.access().can_write());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn access(&self) -> Access {
        self.access
    }
}

/// One kernel launch, made by the runtime and consumed by [`ChipBackend::launch`]: the kernel,
/// the core, the tensors (in the callable's order) and the scalars (64-bit words, in order).
///
/// It cannot be made or copied outside the crate, so every launch a backend sees is one the
/// runtime ordered (its tensors' bytes are not written by anything else while it runs), and
/// runs once.
///
/// ```
/// use simpler::chip::KernelLaunch;
/// fn describe(l: &KernelLaunch<'_>) -> String {
///     format!("`{}` on core {}: {} tensors, {} scalars", l.kernel().name(), l.core(), l.tensors().len(), l.scalars().len())
/// }
/// ```
#[derive(Debug)]
pub struct KernelLaunch<'a> {
    pub(crate) kernel: KernelDef<'a>,
    pub(crate) core: u32,
    pub(crate) tensors: &'a [DeviceTensor],
    pub(crate) scalars: &'a [u64],
}

impl<'a> KernelLaunch<'a> {
    /// The kernel.
    ///
    /// ```
    /// fn name<'a>(l: &'a simpler::chip::KernelLaunch<'_>) -> &'a str { l.kernel().name() }
    /// ```
    pub fn kernel(&self) -> &KernelDef<'a> {
        &self.kernel
    }

    /// The core it runs on (`0..cores()`).
    ///
    /// ```
    /// fn core(l: &simpler::chip::KernelLaunch<'_>) -> u32 { l.core() }
    /// ```
    pub fn core(&self) -> u32 {
        self.core
    }

    /// Its tensors, in the callable's order.
    ///
    /// ```
    /// fn count(l: &simpler::chip::KernelLaunch<'_>) -> usize { l.tensors().len() }
    /// ```
    pub fn tensors(&self) -> &'a [DeviceTensor] {
        self.tensors
    }

    /// Its scalars, as 64-bit words in the callable's order (an `f32` is its bits,
    /// zero-extended, as [`TaskArgs::scalar_f32`](crate::TaskArgs::scalar_f32) stores it).
    ///
    /// ```
    /// fn words<'a>(l: &simpler::chip::KernelLaunch<'a>) -> &'a [u64] { l.scalars() }
    /// ```
    pub fn scalars(&self) -> &'a [u64] {
        self.scalars
    }
}

/// What a Worker asks a backend factory for: one chip's id, memory size and core count, from
/// the builder's `chip_memory` and `chip_cores`.
///
/// ```
/// use simpler::{chip::ChipBackend, chip::ChipSpec, chip::SimChip, Worker};
///
/// let worker = Worker::builder()
///     .chips(2)
///     .chip_backend(|spec: &ChipSpec| {
///         Ok(Box::new(SimChip::new(spec.memory_bytes(), spec.cores())?) as Box<dyn ChipBackend>)
///     })
///     .build()?;
/// # drop(worker);
/// # Ok::<(), simpler::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChipSpec {
    pub(crate) chip_id: u32,
    pub(crate) memory_bytes: u64,
    pub(crate) cores: usize,
}

impl ChipSpec {
    /// The chip's id among its Worker's chips (`chip(N)`); 0 at L2.
    ///
    /// ```
    /// # let spec = simpler::chip::ChipSpec::default_for(3);
    /// assert_eq!(spec.chip_id(), 3);
    /// ```
    pub fn chip_id(&self) -> u32 {
        self.chip_id
    }

    /// The device memory the builder asked for (`chip_memory`).
    ///
    /// ```
    /// # let spec = simpler::chip::ChipSpec::default_for(0);
    /// assert_eq!(spec.memory_bytes(), 1 << 30);
    /// ```
    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    /// The core count the builder asked for (`chip_cores`).
    ///
    /// ```
    /// # let spec = simpler::chip::ChipSpec::default_for(0);
    /// assert_eq!(spec.cores(), 4);
    /// ```
    pub fn cores(&self) -> usize {
        self.cores
    }

    /// The spec of chip `chip_id` under the builder's defaults (1 GiB, 4 cores), for tests of a
    /// factory.
    ///
    /// ```
    /// let spec = simpler::chip::ChipSpec::default_for(1);
    /// assert_eq!((spec.chip_id(), spec.memory_bytes(), spec.cores()), (1, 1 << 30, 4));
    /// ```
    pub fn default_for(chip_id: u32) -> ChipSpec {
        ChipSpec { chip_id, memory_bytes: 1 << 30, cores: 4 }
    }
}

/// A function that makes the backend of one chip from its [`ChipSpec`]; what
/// [`WorkerBuilder::chip_backend`](crate::WorkerBuilder::chip_backend) takes.
///
/// A plain `fn` (or a closure that captures nothing): it runs in the process that drives the
/// chip, which at L3 is a process of its own started from this program's binary, so it cannot
/// carry state from the caller.
///
/// ```
/// use simpler::{chip::ChipBackend, chip::ChipBackendFn, chip::ChipSpec, chip::SimChip};
///
/// fn small(spec: &ChipSpec) -> simpler::Result<Box<dyn ChipBackend>> {
///     Ok(Box::new(SimChip::new(spec.memory_bytes().min(1 << 20), 1)?))
/// }
/// let f: ChipBackendFn = small;
/// assert_eq!(f(&ChipSpec::default_for(0))?.cores(), 1);
/// # Ok::<(), simpler::Error>(())
/// ```
pub type ChipBackendFn = fn(&ChipSpec) -> Result<Box<dyn ChipBackend>>;

// SAFETY: rule FA1 of `sys::fn_address` — a plain `fn` pointer type.
#[expect(unsafe_code, reason = "marks a fn pointer type as one whose address may cross to a child")]
unsafe impl crate::sys::fn_address::FnPointer for ChipBackendFn {}

/// Makes the backend of each chip, in the process that drives it (a chip child at L3, the
/// calling process at L2): see [`WorkerBuilder::chip_backend`](crate::WorkerBuilder::chip_backend).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) enum BackendFactory {
    /// The default: a [`SimChip`] per spec.
    #[default]
    Sim,
    /// A user's function.
    Fn(ChipBackendFn),
}

impl BackendFactory {
    /// The default: a [`SimChip`] per spec.
    pub(crate) fn sim() -> Self {
        BackendFactory::Sim
    }

    /// The factory a start spec carries as `word` (`0` for the default): a child started by
    /// exec rebuilds its parent's factory with it; `None` for a word that names address 0.
    ///
    /// The word must be [`wire`](Self::wire) of a factory of the parent that started this
    /// process (rule FA2 of `sys::fn_address`): the worker layer's start-spec decoder is the one
    /// caller, on a spec its parent wrote.
    pub(crate) fn from_start_spec(word: u64) -> Option<BackendFactory> {
        if word == 0 {
            return Some(BackendFactory::Sim);
        }
        #[expect(unsafe_code, reason = "reading back a factory's address from a start spec; rule FA2")]
        // SAFETY: rule FA2 of `sys::fn_address` — the word is `FnAddress::<ChipBackendFn>::to_wire`
        // written by the parent that started this process, which runs the same binary.
        let f = unsafe { crate::sys::fn_address::FnAddress::<ChipBackendFn>::from_wire(word) }?;
        Some(BackendFactory::Fn(f.get()))
    }

    /// The word a start spec carries for this factory (`0` for the default).
    pub(crate) fn wire(&self) -> u64 {
        match self {
            BackendFactory::Sim => 0,
            BackendFactory::Fn(f) => crate::sys::fn_address::FnAddress::of(*f).to_wire(),
        }
    }

    /// Makes the backend of the chip `spec` describes.
    pub(crate) fn make(&self, spec: &ChipSpec) -> Result<Box<dyn ChipBackend>> {
        match self {
            BackendFactory::Sim => Ok(Box::new(SimChip::new(spec.memory_bytes, spec.cores)?)),
            BackendFactory::Fn(f) => f(spec),
        }
    }
}

/// Refuses a core count outside `1..=MAX_CORES`.
pub(crate) fn check_cores(cores: usize) -> Result<()> {
    if cores == 0 || cores > MAX_CORES {
        return Err(Error::invalid(format!("a chip needs 1..={MAX_CORES} cores, got {cores}")));
    }
    Ok(())
}
