//! A chip backend on an OpenCL device ([`OpenClChip`], feature `opencl`): kernels written in
//! OpenCL C, compiled when they are registered, launched on the device's command queues.
//!
//! A chip is one OpenCL context on one device, made in the process that drives the chip (a chip
//! process of its own at L3), with one in-order command queue per core and one for copies.
//! Chip `i` of a Worker uses device `i % n` of the `n` devices the ICD loader lists, so two
//! chips may share one device (as on a CI machine with one PoCL CPU device).
//!
//! * **Memory.** Every `malloc` is a `cl_mem` buffer of its own; the device pointer packs the
//!   buffer's handle and a byte offset into it (`handle << 40 | offset`), so the runtime's
//!   pointer arithmetic (`ptr + view offset`) stays valid. The chip's memory size
//!   (`WorkerBuilder::chip_memory`, capped by the device's global memory) is a budget the
//!   backend counts.
//! * **Copies** are blocking `clEnqueueWrite/ReadBuffer` calls on the copy queue: a strided host
//!   tensor (a tile of a matrix) is gathered on the host and moves as one copy, packed into
//!   contiguous device memory of the view's shape, so the kernel indexes it as a plain
//!   row-major array; the copy-back scatters it into the view. A
//!   strided view of device memory (a tile of an `orch.alloc_on` intermediate) is refused at
//!   launch, naming the kernel and the tensor: there is no host copy to pack it.
//! * **Kernels** come from [`KernelSource::opencl`](crate::chip::KernelSource::opencl) (see
//!   [`ChipFn::opencl`](crate::chip::ChipFn::opencl)). [`ChipBackend::load_kernel`] builds the
//!   program (with `-cl-kernel-arg-info`, so the backend can read each parameter's type) and
//!   makes one kernel object per core queue; a build failure is an error that carries the
//!   compiler's log, naming the callable. A launch sets the tensors as the first parameters
//!   (a `__global` pointer to each view's first element: the buffer itself, or a sub-buffer at
//!   the view's offset, which must be a multiple of the device's base address alignment), then
//!   the scalars, each narrowed to the parameter's declared type (`float` from the bits
//!   `TaskArgs::scalar_f32` stores, `int`, `uint`, `long`, `ulong`, `double`, `short`,
//!   `ushort`, `char`, `uchar`). The global work size is one work-item per element
//!   of the first writable tensor (of the first tensor when none is writable), in one
//!   dimension; the device picks the work-group size. The launch returns a pending
//!   completion on the kernel's event, which the core thread waits on without spinning.
//! * **Arguments** are checked twice. When a kernel's source is plain enough to read its
//!   parameters from (`callable::signature`), a task that does not match them (counts, order,
//!   element types) is refused at submit, in the process that submits it, as on any chip; the
//!   launch checks them again against what the compiled kernel reports (rule O4), which is the
//!   only check for a source the parser gives up on (macros for its parameters).
//! * **Faults.** A launch the device refuses (a `reqd_work_group_size` kernel: a launch leaves
//!   the work-group size to the device, which OpenCL forbids for it) and a kernel whose event
//!   ends with a negative status fail that task alone ([`ErrorKind::TaskFailed`]), the message
//!   naming the kernel and the OpenCL error by name and number (`CL_INVALID_WORK_GROUP_SIZE
//!   (-54)`); the chip and its queues go on. A kernel that writes out of bounds is undefined
//!   behaviour on the device, as in any OpenCL program: on a CPU device it may kill the chip
//!   process, which an L3 Worker reports as a dead chip.
//! * **No runtime.** opencl3 loads `libOpenCL.so.1`, the ICD loader, at its first call. The
//!   chip fails to start ([`ErrorKind::Os`]) naming what is missing and the package to install:
//!   the library (`DLOPEN_RUNTIME_LOAD_FAILED`: Debian's `ocl-icd-libopencl1`), a driver (no
//!   platform, `CL_PLATFORM_NOT_FOUND_KHR`: no `.icd` file in `/etc/OpenCL/vendors` or
//!   `$OCL_ICD_VENDORS`; `pocl-opencl-icd` for a CPU, or the GPU vendor's driver), or a device
//!   (platforms that list none, named).
//! * **Processes.** OpenCL does not survive `fork` without `exec`: a process forked from one
//!   that made an `OpenClChip` refuses to make one, naming `StartMethod::Exec` (the default).
//!
//! # Rules
//!
//! * **O1 (live objects).** Every OpenCL object this module passes to a call was made by it
//!   from this chip's context and is alive: buffers stay in the chip's table until freed, and a
//!   launch keeps the buffers and sub-buffers it set as arguments (`Arc`s) in its pending
//!   completion until the kernel's event completed; queues, programs and kernels live as long
//!   as the chip or the loaded kernel that holds them.
//! * **O2 (host bytes).** Host memory is lent to OpenCL only by blocking reads and writes, which
//!   return after the device is done with it, so no call uses a host slice after it returns.
//! * **O3 (device ranges).** Every copy's byte range, and every sub-buffer's region, is checked
//!   to lie inside its buffer before the call.
//! * **O4 (kernel arguments).** A kernel object is used by one thread at a time (a `Mutex` per
//!   core), and every argument is set, before the enqueue, with the size the kernel's own
//!   signature declares (queried at load): a `cl_mem` for a `__global` pointer, a scalar of the
//!   parameter's width otherwise; a launch whose count or kinds do not match is refused.
//! * **O5 (one process).** OpenCL is used only by the process that made the chip: one forked
//!   (without exec) from a process that used OpenCL refuses to start.
//! * **O6 (writes before reads).** A copy to the device is waited for on the device, not the
//!   host: its event is kept with its buffer until it is seen complete, and every kernel that
//!   reads the buffer (or a sub-buffer of it) has the pending ones in its launch's wait list (a
//!   buffer with 16 pending writes waits for them on the host). Copies back run on the copy
//!   queue, in order after the writes, and after the kernels the runtime waited for.

#![expect(
    unsafe_code,
    reason = "OpenCL calls through opencl3's unsafe buffer, queue and kernel API; rules O1-O6"
)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use opencl3::command_queue::CommandQueue;
use opencl3::context::Context;
use opencl3::device::{CL_DEVICE_TYPE_ALL, Device as ClDevice};
use opencl3::error_codes::ClError;
use opencl3::event::CL_COMPLETE;
use opencl3::event::Event;
use opencl3::kernel::{CL_KERNEL_ARG_ADDRESS_GLOBAL, CL_KERNEL_ARG_ADDRESS_PRIVATE, Kernel};
use opencl3::memory::{Buffer, CL_MEM_READ_WRITE, ClMem};
use opencl3::program::Program;
use opencl3::types::{CL_BLOCKING, cl_device_id, cl_mem};

use crate::callable::identity::Digest;
use crate::chip::backend::{ChipBackend, ChipSpec, Completion, KernelDef, KernelLaunch, OPENCL_C, Pending};
use crate::error::{Error, ErrorKind, Result};
use crate::sys::sync;

/// Bits of a device pointer that hold the offset into its buffer (a buffer is at most 1 TiB).
const OFFSET_BITS: u32 = 40;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;

/// Held while this process lists platforms and devices (see [`OpenClChip::new`]).
static DISCOVERY: Mutex<()> = Mutex::new(());

/// Before this process asks OpenCL anything: refuses a process forked (without exec) from one
/// that used OpenCL, and records this one as using it (rule O5); then holds [`DISCOVERY`]. The
/// ICD loader and PoCL set themselves up on the first platform query, and two threads doing it
/// at once may see no device: one discovery at a time.
fn discovery() -> Result<std::sync::MutexGuard<'static, ()>> {
    let me = std::process::id();
    match OPENCL_PID.compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(_) => {}
        Err(pid) if pid == me => {}
        Err(pid) => {
            return Err(Error::state(format!(
                "OpenCL was used by process {pid}, which forked this one without exec; OpenCL does not survive that: start the chip processes with StartMethod::Exec (the default)"
            )));
        }
    }
    Ok(sync::lock(&DISCOVERY))
}

/// The process that first used OpenCL (rule O5); 0 before.
static OPENCL_PID: AtomicU32 = AtomicU32::new(0);

/// Most bytes of a compiler log an error message carries (the frame that reports a chip
/// child's error holds 512 bytes in all); the whole log goes to the chip's `tracing` output.
const LOG_IN_MESSAGE: usize = 300;

/// An OpenCL error as this crate's.
fn cl(what: &str, e: opencl3::error_codes::ClError) -> Error {
    Error::new(ErrorKind::Os, format!("OpenCL {what}: {e} ({})", e.0))
}

/// What to install for a device, in every message that says something is missing.
const DRIVERS: &str = "pocl-opencl-icd for a CPU device, or your GPU vendor's OpenCL driver (NVIDIA's ships with its CUDA driver, AMD's with ROCm, Intel's is intel-opencl-icd)";

/// The error when listing the OpenCL platforms failed with `e`: the ICD loader library itself
/// could not be loaded (`DLOPEN_RUNTIME_LOAD_FAILED`: opencl3 loads `libOpenCL.so.1` when it is
/// first called), or it lists no platform (`CL_PLATFORM_NOT_FOUND_KHR`: no driver's `.icd` file
/// where it looks). Each names what to install; another error is itself.
fn no_platform(e: ClError) -> Error {
    let message = if e.0 == opencl3::error_codes::DLOPEN_RUNTIME_LOAD_FAILED {
        format!(
            "no OpenCL runtime: libOpenCL.so.1, the OpenCL ICD loader, cannot be loaded ({e}); install it (Debian and Ubuntu: ocl-icd-libopencl1) and a driver, {DRIVERS} (OPENCL_DYLIB_PATH may name the library's path)"
        )
    } else if e.0 != opencl3::error_codes::CL_PLATFORM_NOT_FOUND_KHR {
        return cl("listing the platforms", e);
    } else {
        let vendors = std::env::var("OCL_ICD_VENDORS").unwrap_or_else(|_| "/etc/OpenCL/vendors".to_string());
        format!(
            "no OpenCL platform ({e}): the OpenCL ICD loader found no driver (no .icd file in {vendors}); install one: {DRIVERS}"
        )
    };
    Error::new(ErrorKind::Os, message)
}

/// Every OpenCL device of every platform the ICD loader lists, in order, or an error that
/// names what is missing ([`no_platform`]; platforms with no device name themselves).
fn all_devices() -> Result<Vec<cl_device_id>> {
    let platforms = opencl3::platform::get_platforms().map_err(no_platform)?;
    if platforms.is_empty() {
        return Err(no_platform(ClError(opencl3::error_codes::CL_PLATFORM_NOT_FOUND_KHR)));
    }
    let mut ids = Vec::new();
    for p in &platforms {
        match p.get_devices(CL_DEVICE_TYPE_ALL) {
            Ok(found) => ids.extend(found),
            Err(e) if e.0 == opencl3::error_codes::CL_DEVICE_NOT_FOUND => {}
            Err(e) => return Err(cl("listing a platform's devices", e)),
        }
    }
    if ids.is_empty() {
        let names: Vec<String> =
            platforms.iter().map(|p| p.name().unwrap_or_else(|_| "an OpenCL platform".to_string())).collect();
        return Err(Error::new(
            ErrorKind::Os,
            format!(
                "no OpenCL device: the OpenCL platforms ({}) list none; install a driver for your device: {DRIVERS}",
                names.join(", ")
            ),
        ));
    }
    Ok(ids)
}

/// One buffer of device memory.
struct ClBuffer {
    mem: Buffer<u8>,
    len: u64,
    /// Writes to it (on the copy queue) not known to be complete: every kernel that reads it
    /// waits for them on the device (its launch's wait list), so the host does not (rule O6).
    writes: Mutex<Vec<Arc<Event>>>,
}

/// Most writes a buffer keeps pending before the host waits for them (a buffer written again
/// and again with no kernel reading it).
const PENDING_WRITES: usize = 16;

// SAFETY: rule O1 — a `cl_mem` is a reference-counted handle that OpenCL lets any thread use
// (the OpenCL API is thread-safe except `clSetKernelArg` on one kernel, rule O4).
unsafe impl Send for ClBuffer {}
// SAFETY: as for `Send`; the buffer is only read through shared calls.
unsafe impl Sync for ClBuffer {}

/// The chip's buffers: handle -> buffer, the next handle, and the bytes they hold.
#[derive(Default)]
struct Buffers {
    live: HashMap<u64, Arc<ClBuffer>>,
    /// The next handle never used, and the freed ones to use again (a pointer has room for
    /// `2^24` handles, fewer than a long-running chip allocates).
    next: u64,
    spare: Vec<u64>,
    used: u64,
}

/// The largest handle a device pointer can hold beside its offset.
const MAX_HANDLE: u64 = u64::MAX >> OFFSET_BITS;

/// A kernel built for this chip: its per-core kernel objects and what each parameter takes.
struct Loaded {
    /// The program the kernels came from (kept alive with them).
    _program: Program,
    /// One kernel object per core (rule O4).
    per_core: Vec<Mutex<Kernel>>,
    params: Vec<Param>,
}

/// What a kernel parameter takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Param {
    /// A `__global` pointer: a tensor.
    Global,
    /// A scalar of this many bytes; `float` and `double` are read from the word's bits.
    Scalar { bytes: usize, float: bool },
}

/// A chip on an OpenCL device: one context on one device, a command queue per core, `cl_mem`
/// buffers as device memory, and kernels given as OpenCL C source ([`ChipFn::opencl`],
/// [`ChipFn::with_source`], or `#[callable(chip, opencl = "file.cl")]`), compiled when they are
/// registered. Tensors are a kernel's first parameters (`__global` pointers), then its scalars;
/// the global work size is the element count of the first writable tensor.
///
/// [`ChipFn::opencl`]: crate::chip::ChipFn::opencl
/// [`ChipFn::with_source`]: crate::chip::ChipFn::with_source
///
/// ```no_run
/// use simpler::{chip::CallConfig, chip::ChipFn, chip::KernelSource, chip::OpenClChip, status::Level, DataType, TaskArgs, Worker};
///
/// const DOUBLE: &str = "__kernel void double_it(__global float* x) { x[get_global_id(0)] *= 2.0f; }";
///
/// # fn main() -> simpler::Result<()> {
/// let mut chip = Worker::builder().level(Level::Chip).chip_backend(OpenClChip::backend).build()?;
/// let k = chip.register_chip(ChipFn::opencl("double_it", KernelSource::opencl(DOUBLE, "double_it")))?;
/// chip.init()?;
/// let buf = chip.create_buffer(16 * 4)?;
/// buf.write(0, &[1.0f32; 16])?;
/// let x = buf.tensor(&[16], DataType::Float32)?;
/// let mut args = TaskArgs::new();
/// args.inout(&x)?;
/// chip.run_callable(&k, args, CallConfig::default())?;
/// assert_eq!(buf.read::<f32>(0, 16)?, vec![2.0; 16]);
/// chip.close()
/// # }
/// ```
pub struct OpenClChip {
    name: String,
    device: ClDevice,
    context: Context,
    copy: CommandQueue,
    cores: Vec<CommandQueue>,
    memory: u64,
    align: u64,
    buffers: Mutex<Buffers>,
    kernels: Mutex<HashMap<Digest, Arc<Loaded>>>,
}

// SAFETY: rule O1 — OpenCL contexts, queues, programs and device ids may be used from any
// thread; kernel objects are behind a `Mutex` each (rule O4) and buffers are `Send + Sync`.
unsafe impl Send for OpenClChip {}
// SAFETY: as for `Send`.
unsafe impl Sync for OpenClChip {}

impl std::fmt::Debug for OpenClChip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenClChip")
            .field("device", &self.name)
            .field("cores", &self.cores.len())
            .field("memory", &self.memory)
            .finish()
    }
}

impl OpenClChip {
    /// The chip `spec` describes, on OpenCL device `spec.chip_id() % n` of the `n` devices of
    /// every platform the ICD loader lists: `spec.cores()` command queues and
    /// `spec.memory_bytes()` of memory (at most the device's global memory).
    ///
    /// # Errors
    ///
    /// No ICD loader library (Debian's `ocl-icd-libopencl1`), no OpenCL platform or no device
    /// (a driver: `pocl-opencl-icd` for a CPU, or the GPU vendor's) is an [`ErrorKind::Os`]
    /// error that names what is missing and the package to install;
    /// a process forked (without exec) from one that used OpenCL is refused
    /// ([`ErrorKind::InvalidState`], rule O5).
    ///
    /// ```no_run
    /// use simpler::{chip::ChipBackend, chip::ChipSpec, chip::OpenClChip};
    /// let chip = OpenClChip::new(&ChipSpec::default_for(0))?;
    /// assert_eq!(chip.cores(), 4);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn new(spec: &ChipSpec) -> Result<OpenClChip> {
        crate::chip::backend::check_cores(spec.cores())?;
        let ids = {
            let _one = discovery()?;
            all_devices()?
        };
        let device = ClDevice::new(ids[spec.chip_id() as usize % ids.len()]);
        let name = device.name().unwrap_or_else(|_| "an OpenCL device".to_string());
        let global = device.global_mem_size().map_err(|e| cl("reading the device's memory size", e))?;
        let align_bits = device.mem_base_addr_align().map_err(|e| cl("reading the device's alignment", e))?;
        let align = (u64::from(align_bits) / 8).clamp(64, 65536).next_power_of_two();
        let context = Context::from_device(&device).map_err(|e| cl("creating a context", e))?;
        let queue =
            || CommandQueue::create_default(&context, 0).map_err(|e| cl("creating a command queue", e));
        let copy = queue()?;
        let cores = (0..spec.cores()).map(|_| queue()).collect::<Result<Vec<_>>>()?;
        tracing::debug!(target: "simpler::chip", chip = spec.chip_id(), device = %name, "OpenCL chip ready");
        Ok(OpenClChip {
            name,
            device,
            context,
            copy,
            cores,
            memory: spec.memory_bytes().min(global),
            align,
            buffers: Mutex::new(Buffers { next: 1, ..Buffers::default() }),
            kernels: Mutex::new(HashMap::new()),
        })
    }

    /// [`OpenClChip::new`] as a [`ChipBackendFn`](crate::chip::ChipBackendFn), for
    /// [`WorkerBuilder::chip_backend`](crate::WorkerBuilder::chip_backend).
    ///
    /// ```no_run
    /// use simpler::{chip::OpenClChip, Worker};
    /// let worker = Worker::builder().chips(2).chip_backend(OpenClChip::backend).build()?;
    /// # drop(worker);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn backend(spec: &ChipSpec) -> Result<Box<dyn ChipBackend>> {
        Ok(Box::new(OpenClChip::new(spec)?))
    }

    /// Every OpenCL device the ICD loader lists, in the order chips use them (chip `i` is
    /// device `i % n`): one line each, `"<platform>: <device> (<version>, <n> compute units,
    /// <bytes> bytes)"`. The command to check a machine:
    /// `cargo run --example opencl_vector_add --features opencl -- --list-devices`.
    ///
    /// # Errors
    ///
    /// No ICD loader library or no OpenCL platform is an [`ErrorKind::Os`] error naming the
    /// package to install.
    ///
    /// ```no_run
    /// for line in simpler::chip::OpenClChip::devices()? {
    ///     println!("{line}");
    /// }
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn devices() -> Result<Vec<String>> {
        let _one = discovery()?;
        let platforms = opencl3::platform::get_platforms().map_err(no_platform)?;
        if platforms.is_empty() {
            return Err(no_platform(ClError(opencl3::error_codes::CL_PLATFORM_NOT_FOUND_KHR)));
        }
        let mut out = Vec::new();
        for p in platforms {
            let pname = p.name().unwrap_or_else(|_| "an OpenCL platform".to_string());
            for id in p.get_devices(CL_DEVICE_TYPE_ALL).unwrap_or_default() {
                let d = ClDevice::new(id);
                out.push(format!(
                    "{pname}: {} ({}, {} compute units, {} bytes)",
                    d.name().unwrap_or_default(),
                    d.version().unwrap_or_default(),
                    d.max_compute_units().unwrap_or(0),
                    d.global_mem_size().unwrap_or(0)
                ));
            }
        }
        Ok(out)
    }

    /// The device's name, as OpenCL reports it.
    ///
    /// ```no_run
    /// let chip = simpler::chip::OpenClChip::new(&simpler::chip::ChipSpec::default_for(0))?;
    /// println!("{}", chip.device_name());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// The buffer `ptr` points into and the offset there, after checking that `len` bytes from
    /// it lie inside the buffer (rule O3).
    fn resolve(&self, what: &dyn std::fmt::Display, ptr: u64, len: u64) -> Result<(Arc<ClBuffer>, u64)> {
        let (handle, offset) = (ptr >> OFFSET_BITS, ptr & OFFSET_MASK);
        let buffers = sync::lock(&self.buffers);
        let buf =
            buffers.live.get(&handle).filter(|b| offset.checked_add(len).is_some_and(|end| end <= b.len));
        buf.map(|b| (b.clone(), offset)).ok_or_else(|| {
            Error::invalid(format!(
                "{what}: device range {ptr:#x}..+{len} does not lie inside one live allocation of this OpenCL chip"
            ))
        })
    }

    fn loaded(&self, digest: &Digest) -> Option<Arc<Loaded>> {
        sync::lock(&self.kernels).get(digest).cloned()
    }
}

/// `log` without build-cache paths (`/…/tempfile_ab12.cl:2:5:` becomes `name.cl:2:5:`), cut to
/// [`LOG_IN_MESSAGE`] bytes with a note of what was left out.
fn short_log(name: &str, log: &str) -> String {
    let mut out = String::new();
    for word in log.split_inclusive(char::is_whitespace) {
        match word.find(".cl:") {
            Some(at) if word[..at].contains('/') => {
                out.push_str(name);
                out.push_str(&word[at..]);
            }
            _ => out.push_str(word),
        }
    }
    let out = out.trim();
    if out.len() <= LOG_IN_MESSAGE {
        return out.to_string();
    }
    let mut cut = LOG_IN_MESSAGE;
    while !out.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{} ... ({} more bytes)", &out[..cut], out.len() - cut)
}

/// What parameter `i` of `kernel` takes, from its argument info (rule O4).
fn param(kernel: &Kernel, i: u32) -> std::result::Result<Param, String> {
    let space = kernel.get_arg_address_qualifier(i).map_err(|e| format!("parameter {i}: {e}"))?;
    let ty = kernel.get_arg_type_name(i).map_err(|e| format!("parameter {i}: {e}"))?;
    let ty = ty.trim_end_matches('\0').trim();
    if space == CL_KERNEL_ARG_ADDRESS_GLOBAL && ty.ends_with('*') {
        return Ok(Param::Global);
    }
    if space != CL_KERNEL_ARG_ADDRESS_PRIVATE || ty.ends_with('*') {
        return Err(format!("parameter {i} (`{ty}`) is neither a __global pointer (a tensor) nor a scalar"));
    }
    let (bytes, float) = match ty {
        "char" | "uchar" | "unsigned char" => (1, false),
        "short" | "ushort" | "unsigned short" => (2, false),
        "int" | "uint" | "unsigned int" => (4, false),
        "float" => (4, true),
        "long" | "ulong" | "unsigned long" => (8, false),
        "double" => (8, true),
        other => return Err(format!("parameter {i} has type `{other}`, which a scalar word cannot carry")),
    };
    Ok(Param::Scalar { bytes, float })
}

/// A kernel running on the device: its event and the buffers it uses (rule O1).
struct Running {
    name: String,
    event: Event,
    _args: Vec<Arc<ClBuffer>>,
}

// SAFETY: rule O1 — an event and buffers are handles OpenCL lets any thread use.
unsafe impl Send for Running {}

impl Running {
    fn failed(&self, status: i32) -> Error {
        failed_on_device(&self.name, status)
    }
}

/// The error of kernel `name` whose event ended with the negative `status`: its symbolic name
/// (`CL_OUT_OF_RESOURCES`) and number.
fn failed_on_device(name: &str, status: i32) -> Error {
    Error::new(
        ErrorKind::TaskFailed,
        format!("OpenCL kernel `{name}` failed on the device: {} ({status})", ClError(status)),
    )
}

impl Pending for Running {
    fn is_done(&mut self) -> Result<bool> {
        let status = self.event.command_execution_status().map_err(|e| cl("reading a kernel's status", e))?;
        match status.0 {
            s if s == CL_COMPLETE => Ok(true),
            s if s < 0 => Err(self.failed(s)),
            _ => Ok(false),
        }
    }

    fn wait(mut self: Box<Self>) -> Result<()> {
        // `clWaitForEvents` fails when the command did; read the status for the message.
        let waited = self.event.wait();
        match self.is_done() {
            Ok(true) => Ok(()),
            Ok(false) => Err(waited.err().map_or_else(
                || Error::state(format!("OpenCL kernel `{}` did not complete", self.name)),
                |e| cl("waiting for a kernel", e),
            )),
            Err(e) => Err(e),
        }
    }
}

impl ChipBackend for OpenClChip {
    fn cores(&self) -> usize {
        self.cores.len()
    }

    fn memory_size(&self) -> u64 {
        self.memory
    }

    fn alignment(&self) -> u64 {
        self.align
    }

    fn malloc(&self, nbytes: u64) -> Result<u64> {
        if nbytes == 0 {
            return Err(Error::invalid("device malloc of 0 bytes; ask for at least 1 byte"));
        }
        if nbytes > self.memory || nbytes > OFFSET_MASK {
            return Err(Error::invalid(format!(
                "out of device memory: {nbytes} bytes were requested but the chip has only {} bytes of memory",
                self.memory
            )));
        }
        let mut buffers = sync::lock(&self.buffers);
        if buffers.used + nbytes > self.memory {
            return Err(Error::new(
                ErrorKind::InvalidState,
                format!(
                    "out of device memory: cannot allocate {nbytes} bytes; the chip has {} bytes, {} in use",
                    self.memory, buffers.used
                ),
            ));
        }
        let len = usize::try_from(nbytes).map_err(|_| Error::invalid("allocation too large"))?;
        // SAFETY: rule O1 — a buffer of this chip's context; no host pointer is given (rule O2).
        let mem =
            unsafe { Buffer::<u8>::create(&self.context, CL_MEM_READ_WRITE, len, std::ptr::null_mut()) }
                .map_err(|e| match e.0 {
                    opencl3::error_codes::CL_MEM_OBJECT_ALLOCATION_FAILURE
                    | opencl3::error_codes::CL_OUT_OF_RESOURCES
                    | opencl3::error_codes::CL_OUT_OF_HOST_MEMORY => Error::new(
                        ErrorKind::InvalidState,
                        format!("out of device memory: the device refused {nbytes} bytes ({e})"),
                    ),
                    _ => cl("allocating a buffer", e),
                })?;
        let handle = match buffers.spare.pop() {
            Some(h) => h,
            None if buffers.next <= MAX_HANDLE => {
                buffers.next += 1;
                buffers.next - 1
            }
            None => {
                return Err(Error::new(
                    ErrorKind::InvalidState,
                    format!("out of device buffer handles: {MAX_HANDLE} buffers are live; free some"),
                ));
            }
        };
        buffers.used += nbytes;
        buffers.live.insert(handle, Arc::new(ClBuffer { mem, len: nbytes, writes: Mutex::new(Vec::new()) }));
        Ok(handle << OFFSET_BITS)
    }

    fn free(&self, ptr: u64) -> Result<()> {
        let (handle, offset) = (ptr >> OFFSET_BITS, ptr & OFFSET_MASK);
        let mut buffers = sync::lock(&self.buffers);
        let why = match buffers.live.get(&handle) {
            Some(_) if offset != 0 => "it points inside an allocation; free the start of an allocation",
            Some(_) => {
                let buf = buffers.live.remove(&handle).expect("present");
                buffers.used -= buf.len;
                buffers.spare.push(handle);
                return Ok(());
            }
            None if handle > 0 && handle < buffers.next => "double free: that allocation was already freed",
            None => "no live allocation starts there (never allocated, or already freed)",
        };
        Err(Error::invalid(format!("device free of {ptr:#x}: {why}")))
    }

    fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()> {
        let (buf, offset) = self.resolve(&"copy to device", dst, src.len() as u64)?;
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: rules O1, O3 — a live buffer of this context, the range checked inside it;
        // rule O2 — blocking, so `src` is not used after the call.
        unsafe {
            opencl3::command_queue::enqueue_write_buffer(
                self.copy.get(),
                buf.mem.get(),
                CL_BLOCKING,
                offset as usize,
                src.len(),
                src.as_ptr().cast::<c_void>(),
                0,
                std::ptr::null(),
            )
        }
        .map_err(|e| cl("writing to a buffer", opencl3::error_codes::ClError(e)))
        .and_then(|event| {
            // A blocking write only promises that `src` may be reused, not that the bytes are on
            // the device: the next kernel that reads the buffer (on a core's queue) waits for
            // it on the device (rule O6); copies back are on this in-order queue, after it.
            let mut writes = sync::lock(&buf.writes);
            writes.retain(|w| !complete(w));
            writes.push(Arc::new(Event::new(event)));
            if writes.len() >= PENDING_WRITES {
                for w in writes.iter() {
                    w.wait().map_err(|e| cl("waiting for a write to a buffer", e))?;
                }
                writes.clear();
            }
            Ok(())
        })
    }

    fn copy_from_device(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        let (buf, offset) = self.resolve(&"copy from device", src, dst.len() as u64)?;
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: rules O1, O3 — a live buffer, the range checked inside it; rule O2 —
        // blocking, so `dst` is written only during the call.
        unsafe {
            opencl3::command_queue::enqueue_read_buffer(
                self.copy.get(),
                buf.mem.get(),
                CL_BLOCKING,
                offset as usize,
                dst.len(),
                dst.as_mut_ptr().cast::<c_void>(),
                0,
                std::ptr::null(),
            )
        }
        .map(|event| drop(Event::new(event)))
        .map_err(|e| cl("reading from a buffer", opencl3::error_codes::ClError(e)))
    }

    fn load_kernel(&self, kernel: &KernelDef<'_>) -> Result<()> {
        let callable = |msg: String| Error::new(ErrorKind::Callable, msg);
        let name = kernel.name();
        let Some(source) = kernel.source().filter(|s| s.language() == OPENCL_C) else {
            return Err(callable(format!(
                "kernel `{name}` has no OpenCL C source, and this chip is an OpenCL device ({}): give it one with ChipFn::opencl or ChipFn::with_source, or `#[callable(chip, opencl = \"file.cl\")]`",
                self.name
            )));
        };
        if sync::lock(&self.kernels).contains_key(&kernel.digest()) {
            return Ok(());
        }
        if source.entry().contains('\0') || source.entry().is_empty() {
            return Err(callable(format!(
                "kernel `{name}`: entry `{}` is not a function name",
                source.entry()
            )));
        }
        let mut program = Program::create_from_source(&self.context, source.text())
            .map_err(|e| callable(format!("KERNEL_BUILD_FAILED: `{name}`: creating the program: {e}")))?;
        if let Err(e) = program.build(&[self.device.id()], "-cl-kernel-arg-info") {
            let log = program.get_build_log(self.device.id()).unwrap_or_default();
            tracing::error!(target: "simpler::chip", kernel = name, "OpenCL build failed ({e}):\n{log}");
            return Err(callable(format!("KERNEL_BUILD_FAILED: `{name}`: {e}: {}", short_log(name, &log))));
        }
        let make = || {
            Kernel::create(&program, source.entry()).map_err(|e| {
                callable(format!(
                    "kernel `{name}`: no kernel function `{}` in its source ({e})",
                    source.entry()
                ))
            })
        };
        let first = make()?;
        let count = first.num_args().map_err(|e| cl("reading a kernel's parameters", e))?;
        let params = (0..count)
            .map(|i| param(&first, i))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|msg| callable(format!("kernel `{name}`: {msg}")))?;
        let mut per_core = vec![Mutex::new(first)];
        for _ in 1..self.cores.len() {
            per_core.push(Mutex::new(make()?));
        }
        let loaded = Arc::new(Loaded { _program: program, per_core, params });
        sync::lock(&self.kernels).insert(kernel.digest(), loaded);
        Ok(())
    }

    fn can_run(&self, kernel: &KernelDef<'_>) -> bool {
        kernel.source().is_some_and(|s| s.language() == OPENCL_C)
    }

    fn unload_kernel(&self, digest: &Digest) {
        sync::lock(&self.kernels).remove(digest);
    }

    fn launch(&self, launch: KernelLaunch<'_>) -> Result<Completion> {
        let def = launch.kernel();
        let name = def.name();
        let loaded = self.loaded(&def.digest()).ok_or_else(|| {
            let why = if self.can_run(def) {
                "was not loaded on this OpenCL chip".to_string()
            } else {
                "has no OpenCL C source, so it cannot run on an OpenCL chip; give it one with #[callable(chip, opencl = \"file.cl\")] or ChipFn::with_source".to_string()
            };
            Error::new(ErrorKind::Callable, format!("kernel `{name}` {why}"))
        })?;
        let (tensors, scalars) = (launch.tensors(), launch.scalars());
        let wanted = loaded.params.iter().filter(|p| **p == Param::Global).count();
        if loaded.params.len() != tensors.len() + scalars.len()
            || wanted != tensors.len()
            || loaded.params[..tensors.len().min(loaded.params.len())].iter().any(|p| *p != Param::Global)
        {
            return Err(Error::invalid(format!(
                "OpenCL kernel `{name}` takes {wanted} tensors (__global pointers, first) and {} scalars; the task passed {} tensors and {} scalars",
                loaded.params.len() - wanted,
                tensors.len(),
                scalars.len()
            )));
        }
        // The buffers the arguments name: the buffer itself at offset 0, else a sub-buffer; and
        // the writes to them the kernel waits for (rule O6).
        let mut args: Vec<Arc<ClBuffer>> = Vec::with_capacity(tensors.len());
        let mut after: Vec<Arc<Event>> = Vec::new();
        for (i, t) in tensors.iter().enumerate() {
            if !t.view().is_contiguous() {
                // Host tensors arrive packed; only a strided view of device memory is left.
                return Err(Error::invalid(format!(
                    "OpenCL kernel `{name}` tensor {i} is a strided view {:?} of device memory, and an OpenCL kernel indexes a plain array: give it a piece of a host tensor (the chip packs it) or a contiguous piece",
                    t.view()
                )));
            }
            let (start, end) = t.view().byte_range();
            // Named (formatted) only in the error.
            let what = std::fmt::from_fn(|out| write!(out, "`{name}` tensor {i}"));
            let (buf, offset) = self.resolve(&what, t.ptr(), end)?;
            {
                // Every kernel reading the buffer waits for them, not only the first (kernels on
                // other cores may read it too); complete ones are dropped.
                let mut writes = sync::lock(&buf.writes);
                writes.retain(|w| !complete(w));
                after.extend(writes.iter().cloned());
            }
            let origin = offset + start;
            if origin == 0 {
                args.push(buf);
                continue;
            }
            if origin % self.align != 0 {
                return Err(Error::invalid(format!(
                    "OpenCL kernel `{name}` tensor {i}: its first element is at byte {origin} of its buffer, which is not a multiple of the device's {}-byte alignment (a view for an OpenCL kernel must start at such a multiple)",
                    self.align
                )));
            }
            let size = usize::try_from(buf.len - origin).expect("a buffer length fits usize");
            // SAFETY: rules O1, O3 — a sub-buffer of a live buffer, its region inside it.
            let sub = unsafe { buf.mem.create_sub_buffer(CL_MEM_READ_WRITE, origin as usize, size) }
                .map_err(|e| cl(&format!("making a sub-buffer for `{name}` tensor {i}"), e))?;
            args.push(Arc::new(ClBuffer { mem: sub, len: buf.len - origin, writes: Mutex::new(Vec::new()) }));
        }
        let global = tensors
            .iter()
            .find(|t| t.access().can_write())
            .or(tensors.first())
            .map_or(1, |t| t.view().shape().iter().map(|&d| u64::from(d)).product::<u64>());
        if global == 0 {
            return Ok(Completion::Done);
        }
        let core = launch.core() as usize;
        let kernel = sync::lock(loaded.per_core.get(core).ok_or_else(|| {
            Error::invalid(format!("OpenCL kernel `{name}`: core {core} is not a core of this chip"))
        })?);
        let set = |i: usize, r: std::result::Result<(), opencl3::error_codes::ClError>| {
            r.map_err(|e| cl(&format!("setting parameter {i} of `{name}`"), e))
        };
        for (i, buf) in args.iter().enumerate() {
            let mem: cl_mem = buf.mem.get();
            // SAFETY: rule O4 — parameter `i` is a __global pointer (checked above), set to a
            // live buffer (rule O1) while this thread holds the kernel's lock.
            set(i, unsafe { kernel.set_arg(i as u32, &mem) })?;
        }
        for (j, &word) in scalars.iter().enumerate() {
            let i = tensors.len() + j;
            let Param::Scalar { bytes, float } = loaded.params[i] else { unreachable!("checked above") };
            // SAFETY: rule O4 — parameter `i` is a scalar of `bytes` bytes (queried at load),
            // set with a value of exactly that size.
            let r = unsafe {
                match (bytes, float) {
                    (8, true) => kernel.set_arg(i as u32, &f64::from_bits(word)),
                    (4, true) => kernel.set_arg(i as u32, &f32::from_bits(word as u32)),
                    (8, false) => kernel.set_arg(i as u32, &word),
                    (4, false) => kernel.set_arg(i as u32, &(word as u32)),
                    (2, _) => kernel.set_arg(i as u32, &(word as u16)),
                    _ => kernel.set_arg(i as u32, &(word as u8)),
                }
            };
            set(i, r)?;
        }
        let queue = &self.cores[core];
        let sizes = [usize::try_from(global).map_err(|_| Error::invalid("global work size too large"))?];
        let wait: Vec<opencl3::types::cl_event> = after.iter().map(|w| w.get()).collect();
        // SAFETY: rule O4 — every parameter was set above with its declared size, under the
        // lock; rule O1 — the kernel and the queue are this chip's, and the buffers stay alive
        // in the returned completion until the kernel's event completed; rule O6 — `wait`
        // holds live events (in `after`) of writes to those buffers, for the length given.
        let event = unsafe {
            queue.enqueue_nd_range_kernel(
                kernel.get(),
                1,
                std::ptr::null(),
                sizes.as_ptr(),
                std::ptr::null(),
                &wait,
            )
        }
        .map_err(|e| {
            Error::new(
                ErrorKind::TaskFailed,
                format!(
                    "OpenCL kernel `{name}` could not be launched: the device refused it with {e} ({})",
                    e.0
                ),
            )
        })?;
        drop(kernel);
        queue.flush().map_err(|e| cl("flushing a queue", e))?;
        Ok(Completion::Pending(Box::new(Running { name: name.to_string(), event, _args: args })))
    }
}

/// Whether a write's event is known to be complete (an error counts as not: it stays in the
/// wait lists, whose kernels then fail with it).
fn complete(w: &Event) -> bool {
    w.command_execution_status().is_ok_and(|st| st.0 == CL_COMPLETE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_logs_lose_their_cache_paths_and_are_cut() {
        let log = "/root/.cache/pocl/kcache/tempfile_ab12.cl:2:5: error: use of undeclared identifier 'x'\n1 error generated.";
        assert_eq!(
            short_log("scale", log),
            "scale.cl:2:5: error: use of undeclared identifier 'x'\n1 error generated."
        );
        let long = "e".repeat(1000);
        let short = short_log("k", &long);
        assert!(short.len() < 400 && short.ends_with("(700 more bytes)"), "{short}");
    }

    /// A kernel whose event ended in failure names the status by its name and number (PoCL
    /// gives no honest way to make one fail on the device; `tests/opencl.rs` makes the device
    /// refuse a launch instead).
    #[test]
    fn a_failed_kernel_names_the_devices_status() {
        let e = failed_on_device("k", opencl3::error_codes::CL_OUT_OF_RESOURCES);
        assert_eq!(e.kind(), ErrorKind::TaskFailed);
        assert_eq!(e.message(), "OpenCL kernel `k` failed on the device: CL_OUT_OF_RESOURCES (-5)");
    }

    /// Without `libOpenCL.so.1` (opencl3 loads it at the first call, and fails every call with
    /// `DLOPEN_RUNTIME_LOAD_FAILED`) the error names the library and its package. No test makes
    /// it missing: the dynamic loader's system search path cannot be emptied for one process
    /// short of a user and mount namespace, which CI containers may forbid (by hand: `unshare
    /// -rm` with an empty file bind-mounted over the library, then
    /// `with_no_opencl_platform_init_fails_naming_what_to_install` of `tests/opencl.rs`, which
    /// expects this message when the library cannot be loaded).
    #[test]
    fn a_missing_icd_loader_or_driver_names_the_package_to_install() {
        let e = no_platform(ClError(opencl3::error_codes::DLOPEN_RUNTIME_LOAD_FAILED));
        assert_eq!(e.kind(), ErrorKind::Os);
        for needle in [
            "no OpenCL runtime",
            "libOpenCL.so.1",
            "DLOPEN_RUNTIME_LOAD_FAILED",
            "ocl-icd-libopencl1",
            "pocl-opencl-icd",
        ] {
            assert!(e.message().contains(needle), "{needle}: {e}");
        }
        let e = no_platform(ClError(opencl3::error_codes::CL_PLATFORM_NOT_FOUND_KHR));
        for needle in ["no OpenCL platform (CL_PLATFORM_NOT_FOUND_KHR)", ".icd file", "pocl-opencl-icd"] {
            assert!(e.message().contains(needle), "{needle}: {e}");
        }
    }
}
