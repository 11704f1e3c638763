//! OpenCL chip tasks through `Worker::run` against the same OpenCL work done directly with
//! opencl3 in the bench process (`--features opencl`; needs an OpenCL ICD, e.g. PoCL).
//!
//! An L3 Worker with one OpenCL chip (`OpenClChip::backend`, a chip process of its own) and, in
//! the bench process, a context and an in-order queue of its own on the same device (device 0).
//! Measured side by side, in alternating blocks, so a slow patch of the machine spreads over
//! all five:
//!
//! - `opencl_task_p50_us`: one run whose one task is an empty OpenCL kernel with one
//!   `__global float*` parameter, given a one-element chip-resident tensor (no copies), back to
//!   back; `opencl_raw_task_p50_us`: the same kernel (global size 1) enqueued with
//!   `clEnqueueNDRangeKernel` and its event waited on. `opencl_task_overhead_us` is the
//!   difference: what the runtime (orchestration, chip process, core thread) adds per task.
//! - `opencl_copy_gbps`: a chip task with a 1 MiB Input host tensor and a 1 MiB Output host
//!   tensor whose kernel copies one to the other (`ulong` per work-item), against the same
//!   kernel over two 1 MiB chip-resident tensors (no host copies): 2 MiB over the difference of
//!   their median times, which is what moving the bytes in and out costs a task (copy-in,
//!   copy-back, staging). `opencl_raw_copy_gbps`: a blocking `clEnqueueWriteBuffer` of 1 MiB
//!   then a blocking `clEnqueueReadBuffer` of 1 MiB, 2 MiB over their median time.
//!   `opencl_copy_ratio` = `opencl_copy_gbps` / `opencl_raw_copy_gbps`. 1 GB = 1e9 bytes.
//!
//! Every kernel is launched `WARMUP` times first: PoCL compiles a kernel's work-group function
//! on its first launch. Run with `POCL_MAX_PTHREAD_COUNT=1` on a small machine, so PoCL's worker
//! threads do not crowd out the runtime's.

#![allow(clippy::print_stdout)]

mod common;

use std::time::{Duration, Instant};

use common::{figure, percentile, spread, us};
use opencl3::command_queue::CommandQueue;
use opencl3::context::Context;
use opencl3::device::{CL_DEVICE_TYPE_ALL, Device, get_all_devices};
use opencl3::kernel::Kernel;
use opencl3::memory::{Buffer, CL_MEM_READ_WRITE, ClMem};
use opencl3::program::Program;
use opencl3::types::CL_BLOCKING;
use simpler::chip::{CallConfig, ChipFn, KernelSource, OpenClChip};
use simpler::{CallableHandle, DataType, TaskArgs, Tensor, Worker};

/// Bytes of each host tensor of the copy task, and of each raw copy.
const MIB: usize = 1 << 20;
/// Warm-up launches of each kernel and each raw operation before any timing.
const WARMUP: usize = 200;
/// Timed empty tasks, in total, of each kind (runtime, raw).
const ITERATIONS: usize = 2_000;
/// Timed copy tasks, in total, of each kind (runtime, raw).
const COPY_ITERATIONS: usize = 1_000;
/// Blocks the timed runs are split into; the four kinds take turns block by block.
const BLOCKS: usize = 10;
/// Untimed runs at the start of each block.
const BLOCK_WARMUP: usize = 10;

const EMPTY: &str = r"
__kernel void empty(__global float* x) {
}";

const COPY: &str = r"
__kernel void copy(__global const ulong* x, __global ulong* out) {
    size_t i = get_global_id(0);
    out[i] = x[i];
}";

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

/// The bench process's own OpenCL objects on device 0.
struct Raw {
    name: String,
    queue: CommandQueue,
    kernel: Kernel,
    /// The empty kernel's one-element argument (kept alive while the kernel may use it).
    _arg: Buffer<f32>,
    /// 1 MiB of device memory for the raw copies.
    dev: Buffer<u8>,
    _program: Program,
    _context: Context,
}

/// Context, queue, the empty kernel with its argument set, and a 1 MiB buffer on device 0.
#[expect(unsafe_code, reason = "opencl3's buffer creation and kernel arguments are unsafe")]
fn raw_setup() -> AnyResult<Raw> {
    let ids = get_all_devices(CL_DEVICE_TYPE_ALL)?;
    let id = *ids.first().ok_or("the OpenCL platforms list no device")?;
    let device = Device::new(id);
    let name = device.name()?;
    let context = Context::from_device(&device)?;
    let queue = CommandQueue::create_default(&context, 0)?;
    let program = Program::create_and_build_from_source(&context, EMPTY, "")?;
    let kernel = Kernel::create(&program, "empty")?;
    // SAFETY: a new buffer of the context, with no host pointer (none is read or kept).
    let arg = unsafe { Buffer::<f32>::create(&context, CL_MEM_READ_WRITE, 1, std::ptr::null_mut())? };
    // SAFETY: a new buffer of the context, with no host pointer (none is read or kept).
    let dev = unsafe { Buffer::<u8>::create(&context, CL_MEM_READ_WRITE, MIB, std::ptr::null_mut())? };
    let mem = arg.get();
    // SAFETY: parameter 0 of `empty` is a `__global float*`, set to a live buffer of the same
    // context with the size of a `cl_mem`; `arg` lives in `Raw` as long as the kernel.
    unsafe { kernel.set_arg(0, &mem)? };
    Ok(Raw { name, queue, kernel, _arg: arg, dev, _program: program, _context: context })
}

/// One launch of the empty kernel (global size 1) and a wait on its event; its wall time.
#[expect(unsafe_code, reason = "opencl3's enqueue_nd_range_kernel is unsafe")]
fn raw_task(raw: &Raw) -> AnyResult<Duration> {
    let sizes = [1usize];
    let start = Instant::now();
    // SAFETY: the kernel and the queue belong to one live context, its only parameter was set
    // (to a live buffer) in `raw_setup`, and `sizes` outlives the call (one dimension).
    let event = unsafe {
        raw.queue.enqueue_nd_range_kernel(
            raw.kernel.get(),
            1,
            std::ptr::null(),
            sizes.as_ptr(),
            std::ptr::null(),
            &[],
        )?
    };
    event.wait()?;
    Ok(start.elapsed())
}

/// A blocking write of `src` into the 1 MiB device buffer, then a blocking read of it into
/// `dst`; their wall time.
#[expect(unsafe_code, reason = "opencl3's enqueue_write_buffer and enqueue_read_buffer are unsafe")]
fn raw_copy(raw: &mut Raw, src: &[u8], dst: &mut [u8]) -> AnyResult<Duration> {
    assert!(src.len() == MIB && dst.len() == MIB, "raw copies move 1 MiB");
    let start = Instant::now();
    // SAFETY: a blocking write of 1 MiB into a live 1 MiB buffer from offset 0: the call
    // returns after OpenCL is done with `src`.
    unsafe { raw.queue.enqueue_write_buffer(&mut raw.dev, CL_BLOCKING, 0, src, &[])? };
    // SAFETY: a blocking read of 1 MiB from a live 1 MiB buffer at offset 0: the call returns
    // after OpenCL is done writing `dst`.
    unsafe { raw.queue.enqueue_read_buffer(&raw.dev, CL_BLOCKING, 0, dst, &[])? };
    Ok(start.elapsed())
}

/// One run of the Worker: one task of `f` on chip 0 with `args` (made fresh each run).
fn one_task(
    worker: &Worker,
    f: &CallableHandle,
    inputs: &[&Tensor],
    outputs: &[&Tensor],
) -> simpler::Result<Duration> {
    let start = Instant::now();
    worker.run(|orch| {
        let mut args = TaskArgs::new();
        for t in inputs {
            args.input(t)?;
        }
        for t in outputs {
            args.output(t)?;
        }
        orch.submit_next_level(f, args, CallConfig::default(), 0).map(|_| ())
    })?;
    Ok(start.elapsed())
}

/// Gigabytes (1e9 bytes) per second of `bytes` moved in `time_us` microseconds.
fn gbps(bytes: usize, time_us: f64) -> f64 {
    bytes as f64 / (time_us * 1e-6) / 1e9
}

fn main() -> AnyResult<()> {
    let mut worker = Worker::builder()
        .chips(1)
        .chip_cores(1)
        .chip_memory(64 << 20)
        .chip_backend(OpenClChip::backend)
        .build()?;
    let e = worker.register_chip(ChipFn::opencl("empty", KernelSource::opencl(EMPTY, "empty")))?;
    let c = worker.register_chip(ChipFn::opencl("copy", KernelSource::opencl(COPY, "copy")))?;
    worker.init()?;
    let mut raw = raw_setup()?;
    println!("OpenCL device: {} (chip 0 and the raw queue both use device 0)", raw.name);

    // The empty task's argument: one float of chip-resident memory (never copied).
    let dev = worker.alloc_child_tensor(0, &[1], DataType::Float32)?;
    let td = dev.tensor(&[1], DataType::Float32)?;
    // The copy task's host tensors: 1 MiB in, 1 MiB out, as `ulong`s.
    let (src, dst) = (worker.create_buffer(MIB)?, worker.create_buffer(MIB)?);
    let pattern: Vec<u8> = (0..MIB).map(|i| (i * 7 + 3) as u8).collect();
    src.write(0, &pattern)?;
    let words = (MIB / 8) as u32;
    let (ts, tt) = (src.tensor(&[words], DataType::Uint64)?, dst.tensor(&[words], DataType::Uint64)?);
    let mut back = vec![0u8; MIB];
    // The same copy kernel over chip-resident tensors: its own time, without host copies.
    let (rs, rt) = (
        worker.alloc_child_tensor(0, &[words], DataType::Uint64)?,
        worker.alloc_child_tensor(0, &[words], DataType::Uint64)?,
    );
    let (trs, trt) = (rs.tensor(&[words], DataType::Uint64)?, rt.tensor(&[words], DataType::Uint64)?);

    for _ in 0..WARMUP {
        one_task(&worker, &e, &[&td], &[])?;
        raw_task(&raw)?;
        one_task(&worker, &c, &[&ts], &[&tt])?;
        one_task(&worker, &c, &[&trs], &[&trt])?;
        raw_copy(&mut raw, &pattern, &mut back)?;
    }
    assert_eq!(dst.read::<u8>(0, MIB)?, pattern, "the copy kernel's output came back to the host");
    assert_eq!(back, pattern, "the raw copy read back what it wrote");

    let mut task = Vec::with_capacity(ITERATIONS);
    let mut raw_tasks = Vec::with_capacity(ITERATIONS);
    let mut copies = Vec::with_capacity(COPY_ITERATIONS);
    let mut raw_copies = Vec::with_capacity(COPY_ITERATIONS);
    let mut resident = Vec::with_capacity(COPY_ITERATIONS);
    for _ in 0..BLOCKS {
        for _ in 0..BLOCK_WARMUP {
            one_task(&worker, &e, &[&td], &[])?;
        }
        for _ in 0..ITERATIONS / BLOCKS {
            task.push(us(one_task(&worker, &e, &[&td], &[])?));
        }
        for _ in 0..BLOCK_WARMUP {
            raw_task(&raw)?;
        }
        for _ in 0..ITERATIONS / BLOCKS {
            raw_tasks.push(us(raw_task(&raw)?));
        }
        for _ in 0..BLOCK_WARMUP {
            one_task(&worker, &c, &[&ts], &[&tt])?;
        }
        for _ in 0..COPY_ITERATIONS / BLOCKS {
            copies.push(us(one_task(&worker, &c, &[&ts], &[&tt])?));
        }
        for _ in 0..BLOCK_WARMUP {
            one_task(&worker, &c, &[&trs], &[&trt])?;
        }
        for _ in 0..COPY_ITERATIONS / BLOCKS {
            resident.push(us(one_task(&worker, &c, &[&trs], &[&trt])?));
        }
        for _ in 0..BLOCK_WARMUP {
            raw_copy(&mut raw, &pattern, &mut back)?;
        }
        for _ in 0..COPY_ITERATIONS / BLOCKS {
            raw_copies.push(us(raw_copy(&mut raw, &pattern, &mut back)?));
        }
    }
    worker.free(&dev)?;
    worker.free(&rs)?;
    worker.free(&rt)?;
    worker.close()?;

    spread("empty OpenCL task through Worker::run, back to back", &mut task);
    spread("empty kernel enqueued and waited on directly", &mut raw_tasks);
    spread("1 MiB in + 1 MiB out OpenCL copy task through Worker::run", &mut copies);
    spread("the same copy task over 1 MiB chip-resident tensors", &mut resident);
    spread("blocking write + read of 1 MiB directly", &mut raw_copies);
    let p50 = percentile(&mut task, 50.0);
    let raw_p50 = percentile(&mut raw_tasks, 50.0);
    let copy_p50 = percentile(&mut copies, 50.0);
    let raw_copy_p50 = percentile(&mut raw_copies, 50.0);
    let resident_p50 = percentile(&mut resident, 50.0);
    let net_us = copy_p50 - resident_p50;
    assert!(
        net_us > 0.0,
        "the copy task over host tensors (p50 {copy_p50:.2} us) was not slower than over resident ones (p50 {resident_p50:.2} us): the machine was too noisy to measure"
    );
    let copy_gbps = gbps(2 * MIB, net_us);
    let raw_copy_gbps = gbps(2 * MIB, raw_copy_p50);
    println!(
        "opencl_copy_gbps = 2 MiB / (host-tensor copy task p50 {copy_p50:.2} us - resident copy task p50 {resident_p50:.2} us = {net_us:.2} us); \
         opencl_raw_copy_gbps = 2 MiB / write + read p50 {raw_copy_p50:.2} us"
    );
    figure("opencl_task_p50_us", p50, "us");
    figure("opencl_raw_task_p50_us", raw_p50, "us");
    figure("opencl_task_overhead_us", p50 - raw_p50, "us");
    figure("opencl_copy_gbps", copy_gbps, "GB/s");
    figure("opencl_raw_copy_gbps", raw_copy_gbps, "GB/s");
    figure("opencl_copy_ratio", copy_gbps / raw_copy_gbps, "x");
    Ok(())
}
