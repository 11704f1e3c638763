use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::*;
use crate::callable::host::HostResult;
use crate::data::dtype::DataType;
use crate::engine::orchestrator::Orchestrator;

const CHIP: u32 = 3;

/// The backend this copy of the suite runs on: `chip::runtime::tests` on a [`SimChip`], and
/// `chip::runtime::tests_discrete` (the same file) on a [`DiscreteSim`](crate::chip::DiscreteSim),
/// whose memory the host cannot read.
fn backend() -> BackendFactory {
    #[cfg(feature = "opencl")]
    if on_opencl() {
        return BackendFactory::Fn(crate::chip::OpenClChip::backend);
    }
    if module_path!().ends_with("tests_discrete") {
        BackendFactory::Fn(crate::chip::DiscreteSim::backend)
    } else {
        BackendFactory::sim()
    }
}

/// Whether this copy of the suite runs on an OpenCL chip (`chip::runtime::tests_opencl`, with
/// the `opencl` feature): kernels run their OpenCL C source there.
fn on_opencl() -> bool {
    module_path!().ends_with("tests_opencl")
}

/// Ends a test that needs kernels only Rust can write (they fail with a message, panic, or
/// wait on the test), when the suite runs on an OpenCL chip; it runs on the simulated ones.
macro_rules! rust_kernels_only {
    () => {
        if on_opencl() {
            eprintln!("not on an OpenCL chip: this test's kernels fail, panic or wait on the test, which only Rust kernels do");
            return;
        }
    };
}

/// The OpenCL C source of the kernels that have one (the Rust ones above, on a device).
const OPENCL_KERNELS: &[(&str, &str, &str)] = &[
    (
        "vadd",
        "vadd",
        "__kernel void vadd(__global const float* a, __global const float* b, __global float* c) { size_t i = get_global_id(0); c[i] = a[i] + b[i]; }",
    ),
    (
        "add_scalar",
        "add_scalar",
        "__kernel void add_scalar(__global float* x, float k) { x[get_global_id(0)] += k; }",
    ),
    (
        "double",
        "twice",
        "__kernel void twice(__global const float* x, __global float* out) { size_t i = get_global_id(0); out[i] = 2.0f * x[i]; }",
    ),
    ("ones", "ones", "__kernel void ones(__global float* out) { out[get_global_id(0)] = 1.0f; }"),
    (
        "six_tensors",
        "six_tensors",
        "__kernel void six_tensors(__global const float* a, __global const float* b, __global float* c, __global const float* d, __global const float* e, __global float* f) {}",
    ),
    (
        "probe",
        "probe",
        "__kernel void probe(__global const float* seen, __global float* out) { size_t i = get_global_id(0); out[i] = seen[i]; }",
    ),
];

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

/// Takes six tensors (read, read, write, read, read, read-write) and does nothing: a kernel to
/// stage a mix of tensors for.
fn six_tensors(_: &HostArgs<'_>) -> HostResult {
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

/// The suite's kernels, each with its OpenCL C source where it has one; on an OpenCL chip only
/// those.
fn kernels() -> Vec<ChipFn> {
    let all = vec![
        ChipFn::kernel("vadd", vadd),
        ChipFn::kernel("add_scalar", add_scalar),
        ChipFn::kernel("double", double),
        ChipFn::kernel("ones", ones),
        ChipFn::kernel("six_tensors", six_tensors),
        ChipFn::kernel("probe", probe),
        ChipFn::kernel("fail_kernel", fail_kernel),
        ChipFn::kernel("panic_kernel", panic_kernel),
        ChipFn::kernel("rendezvous", rendezvous),
    ];
    all.into_iter()
        .filter_map(|k| match OPENCL_KERNELS.iter().find(|(name, ..)| *name == k.name()) {
            Some((_, entry, text)) => {
                Some(k.with_source(crate::chip::KernelSource::opencl(text, entry)).expect("a kernel"))
            }
            None => (!on_opencl()).then_some(k),
        })
        .collect()
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
    let cfg =
        ChipConfig { spec: ChipSpec { chip_id: CHIP, memory_bytes: 16 << 20, cores }, backend: backend() };
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
fn device(rt: &mut ChipRuntime, values: &[f32], identity: Identity) -> u64 {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let ptr = rt.malloc(bytes.len() as u64, identity).unwrap();
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
    rt.run(ChipCall {
        digest: f.handle().digest(),
        args,
        scalars: scalars.to_vec(),
        config: CallConfig::default(),
    })
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
    let before = rt.used_outside_staging();
    run(
        &mut rt,
        &kernel("vadd"),
        vec![host(&mut a, Access::Read), host(&mut b, Access::Read), host(&mut out, Access::Write)],
        &[],
    )
    .unwrap();
    assert!(out.iter().enumerate().all(|(i, v)| *v == 1.5 * i as f32), "vector add result");
    assert_eq!((a, b), (a0, b0), "inputs unchanged");
    assert_eq!(rt.used_outside_staging(), before, "device scratch freed");
}

#[test]
fn host_tensors_reuse_the_retained_staging_buffer() {
    let mut rt = chip(1, &[]);
    let runs = |rt: &mut ChipRuntime, n: usize| {
        for k in 0..3 {
            let mut a = vec![k as f32; n];
            let mut b = vec![1.0f32; n];
            let mut out = vec![0.0f32; n];
            let args =
                vec![host(&mut a, Access::Read), host(&mut b, Access::Read), host(&mut out, Access::Write)];
            run(rt, &kernel("vadd"), args, &[]).unwrap();
            assert!(out.iter().all(|v| *v == k as f32 + 1.0));
        }
    };
    runs(&mut rt, 1000);
    let after_first = rt.device_allocations();
    assert_eq!(after_first, 1, "one staging block for the three host tensors");
    runs(&mut rt, 1000);
    runs(&mut rt, 10);
    assert_eq!(rt.device_allocations(), after_first, "steady state: no device allocation per run");
    runs(&mut rt, 5000);
    assert_eq!(rt.device_allocations(), after_first + 1, "a larger run grows it once");
    let (_, need) = staging::layout([20_000; 3], rt.device.align()).unwrap();
    assert_eq!(rt.device.held_bytes(), need, "bump slices of one block");
    rt.shutdown();
    assert_eq!(rt.device.held_bytes(), 0, "freed at close");
}

#[test]
fn inout_and_output_host_tensors_round_trip() {
    let mut rt = chip(1, &[]);
    let mut x = vec![1.0f32, 2.0, 3.0];
    run(&mut rt, &kernel("add_scalar"), vec![host(&mut x, Access::ReadWrite)], &[u64::from(10f32.to_bits())])
        .unwrap();
    assert_eq!(x, vec![11.0, 12.0, 13.0]);
    let mut y = vec![0.0f32; 3];
    run(&mut rt, &kernel("double"), vec![host(&mut x, Access::Read), host(&mut y, Access::Write)], &[])
        .unwrap();
    assert_eq!(y, vec![22.0, 24.0, 26.0]);
}

#[test]
fn a_failed_run_leaves_host_tensors_as_they_were() {
    rust_kernels_only!();
    let mut rt = chip(1, &[]);
    // Every other element of 8: the gaps keep their sentinel.
    let mut buf = vec![-1.0f32; 8];
    let view = TensorView::new(4, &[4], Some(&[2]), DataType::Float32).unwrap();
    let arg = host_view(&mut buf, view, Access::Write);
    let err = run(&mut rt, &kernel("fail_kernel"), vec![arg], &[]).unwrap_err();
    assert!(err.message().contains("fail_kernel"), "{err}");
    assert_eq!(buf, vec![-1.0; 8], "a failed run leaves host tensors as they were");
}

#[test]
fn strided_host_views_reach_kernels_packed() {
    let mut rt = chip(1, &[]);
    // A 2x3 tile of a 4x4 matrix (rows 1..3, columns 1..4): the kernel sees 6 contiguous
    // elements, and only the tile's elements change on the host.
    let mut buf: Vec<f32> = (0..16).map(|v| v as f32).collect();
    let view = TensorView::new(4 * 5, &[2, 3], Some(&[4, 1]), DataType::Float32).unwrap();
    let k = u64::from(100f32.to_bits());
    run(&mut rt, &kernel("add_scalar"), vec![host_view(&mut buf, view, Access::ReadWrite)], &[k]).unwrap();
    let want: Vec<f32> = (0..16)
        .map(|v| v as f32 + if (1..3).contains(&(v / 4)) && v % 4 >= 1 { 100.0 } else { 0.0 })
        .collect();
    assert_eq!(buf, want);
    // A column (stride 4, one element per run), written whole.
    let mut buf = vec![-1.0f32; 16];
    let col = TensorView::new(4 * 2, &[4], Some(&[4]), DataType::Float32).unwrap();
    run(&mut rt, &kernel("ones"), vec![host_view(&mut buf, col, Access::Write)], &[]).unwrap();
    let want: Vec<f32> = (0..16).map(|v| if v % 4 == 2 { 1.0 } else { -1.0 }).collect();
    assert_eq!(buf, want, "the gaps belong to others");
}

#[test]
fn strided_device_views_reach_rust_kernels_and_are_refused_by_opencl_ones() {
    let mut rt = chip(1, &[]);
    // Column 1 of a 4x4 matrix in device memory: there is no host copy to pack.
    let ptr = device(&mut rt, &(0..16).map(|v| v as f32).collect::<Vec<_>>(), id(7));
    let col = TensorView::new(4, &[4], Some(&[4]), DataType::Float32).unwrap();
    let arg = ChipArg::Device { ptr, view: col, access: Access::ReadWrite, identity: id(7), nbytes: 64 };
    let k = u64::from(100f32.to_bits());
    let result = run(&mut rt, &kernel("add_scalar"), vec![arg], &[k]);
    if on_opencl() {
        let err = result.unwrap_err();
        assert!(err.message().contains("strided view") && err.message().contains("add_scalar"), "{err}");
        assert_eq!(read_device(&rt, ptr, 16), (0..16).map(|v| v as f32).collect::<Vec<_>>());
    } else {
        // A Rust kernel's `HostArgs` packs it and writes it back (rule H6 of `data::host_args`).
        result.unwrap();
        let want: Vec<f32> = (0..16).map(|v| v as f32 + if v % 4 == 1 { 100.0 } else { 0.0 }).collect();
        assert_eq!(read_device(&rt, ptr, 16), want);
    }
}

#[test]
fn output_only_host_tensors_are_not_copied_in() {
    let plan = ChipFn::orchestration("peek", peek_plan);
    let mut rt = chip(2, std::slice::from_ref(&plan));
    let mut out = vec![7.0f32; 16]; // a sentinel the device never sees
    let mut seen = vec![-1.0f32; 16];
    run(&mut rt, &plan, vec![host(&mut out, Access::Write), host(&mut seen, Access::Write)], &[]).unwrap();
    // Fresh device scratch (zeros on a SimChip, whatever a device holds elsewhere), never the
    // host's 7.0; and the untouched scratch is what is copied back.
    if module_path!().ends_with("runtime::tests") {
        assert!(seen.iter().all(|v| *v == 0.0), "a SimChip's fresh scratch is zeros: {seen:?}");
    }
    assert!(
        seen.iter().all(|v| v.to_bits() != 7.0f32.to_bits()),
        "the host's 7.0 reached the device: {seen:?}"
    );
    assert_eq!(
        out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        seen.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

/// Tensor 0 (Output) read through a NoDep tag by `probe`, which copies it to tensor 1.
fn peek_plan(orch: &mut Orchestrator<'_>, args: &TaskArgs, cfg: &CallConfig) -> Result<()> {
    let mut a = TaskArgs::new();
    a.push_tensor(args.tensor(0).unwrap(), Tag::NoDep)?.output(args.tensor(1).unwrap())?;
    orch.submit_next_level(&h("probe"), a, cfg.clone(), 1).map(|_| ())
}

#[test]
fn device_tensors_chain_across_runs() {
    let mut rt = chip(2, &[]);
    let x = device(&mut rt, &[1.0, 2.0, 3.0, 4.0], id(1));
    let y = rt.malloc(16, id(2)).unwrap();
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
    let x = device(&mut rt, &[1.0; 4], id(1));
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
    let err = run(&mut rt, &kernel("double"), vec![too_big, host(&mut out, Access::Write)], &[]).unwrap_err();
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
    assert_eq!(rt.used_outside_staging(), 0, "the scratch of refused runs is freed");
    // Still usable.
    let mut a = vec![2.0f32; 4];
    run(&mut rt, &kernel("double"), vec![host(&mut a, Access::Read), host(&mut out, Access::Write)], &[])
        .unwrap();
    assert_eq!(out, vec![4.0; 4]);
}

#[test]
fn memory_operations_name_the_chip() {
    let mut rt = chip(1, &[]);
    let err = rt.malloc(1 << 30, id(1)).unwrap_err();
    assert!(err.message().starts_with("chip 3: out of device memory"), "{err}");
    assert!(err.message().contains(&(16u64 << 20).to_string()), "{err}");
    let p = rt.malloc(8, id(2)).unwrap();
    assert!(rt.copy_to_device(p, &[0; 9]).unwrap_err().message().starts_with("chip 3: "));
    assert!(rt.copy_from_device(p + 4, &mut [0; 8]).is_err());
    rt.free(p).unwrap();
    let err = rt.free(p).unwrap_err();
    assert!(err.message().starts_with("chip 3: ") && err.message().contains("double free"), "{err}");
}

#[test]
fn host_scratch_counts_against_device_memory() {
    let cfg = ChipConfig { spec: ChipSpec { chip_id: 0, memory_bytes: 4096, cores: 1 }, backend: backend() };
    let mut reg = Registry::new(4);
    let k = kernel("double");
    reg.install(k.handle().digest(), k.descriptor().bytes(), k.clone()).unwrap();
    let mut rt = ChipRuntime::new(cfg, reg).unwrap();
    let mut a = vec![1.0f32; 1024];
    let mut out = vec![0.0f32; 1024];
    let err =
        run(&mut rt, &k, vec![host(&mut a, Access::Read), host(&mut out, Access::Write)], &[]).unwrap_err();
    assert!(
        err.message().contains("device scratch") && err.message().contains("out of device memory"),
        "{err}"
    );
    assert_eq!(rt.used_outside_staging(), 0, "the first scratch block was freed");
}

/// `tmp = a + b` on core 0, then `out = 2 * tmp` on core 1: read-after-write across cores
/// through the device intermediate passed as tensor 3.
fn pipeline(orch: &mut Orchestrator<'_>, args: &TaskArgs, cfg: &CallConfig) -> Result<()> {
    let t = |i| args.tensor(i).expect("four tensors");
    let mut first = TaskArgs::new();
    first.input(t(0))?.input(t(1))?.output(t(3))?;
    orch.submit_next_level(&h("vadd"), first, cfg.clone(), 0)?;
    let mut second = TaskArgs::new();
    second.input(t(3))?.output(t(2))?;
    orch.submit_next_level(&h("double"), second, cfg.clone(), 1)?;
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
    let tmp = device(&mut rt, &vec![-100.0; n], id(9));
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
    orch.submit_next_level(&h("vadd"), first, cfg.clone(), 1)?;
    let mut second = TaskArgs::new();
    second.input(&tmp)?.output(t(2))?;
    orch.submit_next_level(&h("double"), second, cfg.clone(), 0)?;
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
        assert_eq!(rt.used_outside_staging(), 0, "the intermediate and the scratch were freed");
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
    orch.submit_next_level(&h("ones"), a, cfg.clone(), 0)?;
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
            orch.submit_next_level(&h("ones"), a, cfg.clone(), 0)?;
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
    assert_eq!(rt.used_outside_staging(), 0, "freed when the run ended");

    // More than the chip has: refused at once, naming the chip and its memory.
    let err = run(&mut rt, &sized, vec![], &[8 << 20]).unwrap_err();
    assert!(
        err.message().contains("orch.alloc on chip 3") && err.message().contains("out of device memory"),
        "{err}"
    );

    // Device memory a caller holds leaves less for intermediates.
    let held = rt.malloc(14 << 20, id(3)).unwrap();
    rt.tune_engine(|c| c.backpressure_timeout = std::time::Duration::from_millis(200));
    let err = run(&mut rt, &sized, vec![], &[1 << 20]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(
        err.message().contains("out of device memory on chip 3") && err.message().contains("chip_memory"),
        "{err}"
    );
    rt.free(held).unwrap();
    rt.tune_engine(|c| c.backpressure_timeout = std::time::Duration::from_secs(20));

    // Freed as their scopes end: five 4 MiB intermediates in turn fit 16 MiB.
    run(&mut rt, &in_turn, vec![], &[5]).unwrap();
    assert_eq!(rt.used_outside_staging(), 0);
}

/// Two independent kernels, one per core, that must overlap in time.
fn side_by_side(orch: &mut Orchestrator<'_>, args: &TaskArgs, cfg: &CallConfig) -> Result<()> {
    for core in 0..2u32 {
        let mut a = TaskArgs::new();
        a.output(args.tensor(core as usize).unwrap())?;
        orch.submit_next_level(&h("rendezvous"), a, cfg.clone(), core)?;
    }
    Ok(())
}

#[test]
fn independent_kernels_run_concurrently_on_two_cores() {
    rust_kernels_only!();
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
    orch.submit_next_level(&h(which), first, cfg.clone(), 1)?;
    let mut second = TaskArgs::new();
    second.input(x)?.output(args.tensor(1).unwrap())?;
    orch.submit_next_level(&h("double"), second, cfg.clone(), 0)?;
    Ok(())
}

#[test]
fn failing_and_panicking_kernels_give_clear_errors() {
    rust_kernels_only!();
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
        let err =
            run(&mut rt, &plan, vec![host(&mut x, Access::ReadWrite), host(&mut y, Access::Write)], &[which])
                .unwrap_err();
        assert!(err.message().contains(what), "{err}");
        assert!(err.message().contains("chip orchestration `failing_plan` on chip 3"), "{err}");
        assert_eq!(y, vec![5.0; 8], "host outputs untouched by a failed run");
    }
    assert_eq!(rt.used_outside_staging(), 0);
    // Still usable, cores included.
    let ok = ChipFn::orchestration("pipeline", pipeline);
    rt.install(ok.handle().digest(), ok.descriptor().bytes(), ok.clone()).unwrap();
    let tmp = rt.malloc(32, id(4)).unwrap();
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
            orch.submit_next_level(&h("add_scalar"), a, cfg.clone(), 0)?;
            Err(Error::invalid("the plan gives up"))
        }
        Some(1) => panic!("the plan exploded"),
        // A kernel that is not registered on the chip.
        Some(2) => {
            let stray = ChipFn::kernel("stray", ones).handle();
            orch.submit_next_level(&stray, TaskArgs::new(), cfg.clone(), 0).map(|_| ())
        }
        // A core that does not exist.
        Some(3) => orch.submit_next_level(&h("ones"), TaskArgs::new(), cfg.clone(), 9).map(|_| ()),
        // Device memory of another chip.
        Some(4) => {
            let desc = BufferDesc::new(id(77), Backing::Device { ptr: 0, chip: 7 }, Access::ReadWrite, 16)?;
            let t = Tensor::from_desc(desc, f32_view(4))?;
            let mut a = TaskArgs::new();
            a.output(&t)?;
            orch.submit_next_level(&h("ones"), a, cfg.clone(), 0).map(|_| ())
        }
        // An orchestration submitted to a core.
        _ => orch
            .submit_next_level(
                &ChipFn::orchestration("bad_plan", bad_plan).handle(),
                TaskArgs::new(),
                cfg.clone(),
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
    assert!(err.message().contains("chip orchestration `bad_plan` on chip 3: the plan gives up"), "{err}");
    let err = go(&mut rt, 1);
    assert!(err.message().contains("panicked: the plan exploded"), "{err}");
    let err = go(&mut rt, 2);
    assert_eq!(err.kind(), ErrorKind::Callable);
    assert!(err.message().contains("`stray`") && err.message().contains("not registered"), "{err}");
    let err = go(&mut rt, 3);
    assert!(err.message().contains("core 9 does not exist"), "{err}");
    let err = go(&mut rt, 4);
    assert!(err.message().contains("chip 7"), "{err}");
    let err = go(&mut rt, 5);
    assert!(err.message().contains("only kernels run on a core"), "{err}");
    assert_eq!(x, vec![1.0; 4], "no failed run copied back");
    assert_eq!(rt.used_outside_staging(), 0);
    let mut y = vec![0.0f32; 4];
    run(&mut rt, &kernel("double"), vec![host(&mut x, Access::Read), host(&mut y, Access::Write)], &[])
        .unwrap();
    assert_eq!(y, vec![2.0; 4]);
}

#[test]
fn unknown_callables_and_registration() {
    let mut rt = chip(1, &[]);
    let ones_cl = OPENCL_KERNELS.iter().find(|(name, ..)| *name == "ones").expect("ones");
    let stray = ChipFn::kernel("stray", ones)
        .with_source(crate::chip::KernelSource::opencl(ones_cl.2, ones_cl.1))
        .unwrap();
    let err = run(&mut rt, &stray, Vec::new(), &[]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Callable);
    assert!(
        err.message().starts_with("UNKNOWN_CALLABLE: ")
            && err.message().ends_with("not registered on chip 3"),
        "{err}"
    );
    let d = stray.handle().digest();
    assert!(!rt.contains(&d));
    let next = kernels().len();
    assert_eq!(rt.install(d, stray.descriptor().bytes(), stray.clone()).unwrap() as usize, next);
    assert_eq!(
        rt.install(d, stray.descriptor().bytes(), stray.clone()).unwrap() as usize,
        next,
        "refcounted"
    );
    assert!(rt.contains(&d));
    let mut out = vec![0.0f32; 2];
    run(&mut rt, &stray, vec![host(&mut out, Access::Write)], &[]).unwrap();
    assert_eq!(out, vec![1.0; 2]);
    assert!(!rt.release(&d).unwrap());
    assert!(rt.release(&d).unwrap());
    assert!(!rt.contains(&d));
    assert!(!rt.engine.callables().read().contains_key(&d));
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
    let p = rt.malloc(64, id(5)).unwrap();
    rt.free(p).unwrap();
    drop(rt); // and dropping after shutdown is fine
    drop(chip(3, &[])); // as is dropping without one
}

#[test]
fn runtime_and_backend_can_move_between_threads() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<ChipRuntime>();
    send::<crate::chip::SimChip>();
    sync::<crate::chip::SimChip>();
    send::<ChipFn>();
    sync::<ChipFn>();
}

#[test]
fn a_bad_configuration_is_an_error() {
    let cfg =
        ChipConfig { spec: ChipSpec { chip_id: 1, memory_bytes: 1 << 20, cores: 0 }, backend: backend() };
    let err = ChipRuntime::new(cfg, Registry::new(1)).unwrap_err();
    assert!(err.message().starts_with("chip 1: ") && err.message().contains("cores"), "{err}");
    let cfg = ChipConfig { spec: ChipSpec { chip_id: 1, memory_bytes: 0, cores: 1 }, backend: backend() };
    assert!(ChipRuntime::new(cfg, Registry::new(1)).is_err());
}

// ------------------------------------------------------------------ the pipelined lifecycle

/// Opened by the test: `held` waits for it (10 s at most) after saying it started.
static GATE: (Mutex<(bool, bool)>, Condvar) = (Mutex::new((false, false)), Condvar::new());

/// `out = 2 * x`, once the test opens [`GATE`].
fn held(args: &HostArgs<'_>) -> HostResult {
    let (lock, cv) = &GATE;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut g = lock.lock().unwrap();
    g.0 = true; // started
    cv.notify_all();
    while !g.1 {
        let left = deadline.checked_duration_since(Instant::now()).ok_or("the gate never opened")?;
        g = cv.wait_timeout(g, left).unwrap().0;
    }
    drop(g);
    double(args)
}

fn await_gate(cond: impl Fn(&(bool, bool)) -> bool) {
    let (lock, cv) = &GATE;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut g = lock.lock().unwrap();
    while !cond(&g) {
        let left = deadline.checked_duration_since(Instant::now()).expect("the kernel never started");
        g = cv.wait_timeout(g, left).unwrap().0;
    }
}

fn open_gate() {
    let (lock, cv) = &GATE;
    lock.lock().unwrap().1 = true;
    cv.notify_all();
}

fn digest(name: &str) -> Digest {
    h(name).digest()
}

fn pipelined(cores: usize, extra: &[ChipFn]) -> ChipRuntime {
    let mut rt = chip(cores, extra);
    rt.set_pipeline_depth(2).unwrap();
    rt
}

#[test]
fn a_successor_prepares_while_the_head_runs_and_launches_after_it_finalizes() {
    rust_kernels_only!();
    let k = ChipFn::kernel("held", held);
    let mut rt = pipelined(1, std::slice::from_ref(&k));
    let (mut x, mut y) = (vec![1.0f32; 4096], vec![0.0f32; 4096]);
    let (mut a, mut b, mut out) = (vec![2.0f32; 4096], vec![3.0f32; 4096], vec![0.0f32; 4096]);
    let (l0, l1) = (rt.acquire_lease().unwrap(), rt.acquire_lease().unwrap());
    assert_ne!(l0.slot, l1.slot);
    let head_args = vec![host(&mut x, Access::Read), host(&mut y, Access::Write)];
    let mut head = rt.prepare(l0, ChipCall::new(k.handle().digest(), head_args), CopyIn::Now).unwrap();
    rt.launch(&mut head, Trace::Off).unwrap();
    await_gate(|g| g.0);
    // The head's kernel runs (and holds the kernel gate): the successor's copy-in goes ahead
    // all the same, into its own fenced staging buffer.
    let args = vec![host(&mut a, Access::Read), host(&mut b, Access::Read), host(&mut out, Access::Write)];
    let mut next = rt.prepare(l1, ChipCall::new(digest("vadd"), args), CopyIn::Now).unwrap();
    assert!(!rt.poll(&mut head), "the head still runs while its successor is prepared");
    let err = rt.launch(&mut next, Trace::Off).unwrap_err();
    assert!(err.message().contains("finalize it first") && err.message().contains("generation 1"), "{err}");
    open_gate();
    rt.finalize(head).unwrap();
    rt.launch(&mut next, Trace::Off).unwrap();
    rt.finalize(next).unwrap();
    assert!(y.iter().all(|v| *v == 2.0) && out.iter().all(|v| *v == 5.0));
    rt.release_lease(l0).unwrap();
    rt.release_lease(l1).unwrap();
}

#[test]
fn a_deferred_copy_in_goes_in_pieces_and_its_run_launches_only_once_it_is_all_in() {
    let mut rt = pipelined(1, &[]);
    let mut a: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    let mut b: Vec<f32> = (0..1000).map(|i| 0.5 * i as f32).collect();
    let mut out = vec![-7.0f32; 1000];
    let lease = Lease { slot: 1, generation: 1 };
    let args = vec![host(&mut a, Access::Read), host(&mut b, Access::Read), host(&mut out, Access::Write)];
    let mut run = rt.prepare(lease, ChipCall::new(digest("vadd"), args), CopyIn::InPieces).unwrap().detach();
    assert!(!run.copied());
    let err = rt.launch(&mut run, Trace::Off).unwrap_err();
    assert!(err.message().contains("before its host inputs are all copied in"), "{err}");
    // Mapped anew for every piece, as a chip child does; a piece of 1001 bytes cuts elements.
    let mut pieces = 0;
    loop {
        let args =
            vec![host(&mut a, Access::Read), host(&mut b, Access::Read), host(&mut out, Access::Write)];
        pieces += 1;
        if rt.copy_in_some(&mut run, &args, 1001).unwrap() {
            break;
        }
        assert!(pieces < 20, "8000 input bytes in pieces of 1001 never ended");
    }
    assert!((8..=10).contains(&pieces), "8000 bytes in {pieces} pieces of 1001");
    assert!(run.copied());
    rt.launch(&mut run, Trace::Off).unwrap();
    let args = vec![host(&mut a, Access::Read), host(&mut b, Access::Read), host(&mut out, Access::Write)];
    rt.finalize_traced(run, Some(&args)).0.unwrap();
    assert!(out.iter().enumerate().all(|(i, v)| *v == 1.5 * i as f32), "{:?}", &out[..8]);

    // A tensor mapped anew unlike the one prepared fails the copy, naming it.
    let args = vec![host(&mut a, Access::Read), host(&mut b, Access::Read), host(&mut out, Access::Write)];
    let mut run = rt
        .prepare(Lease { slot: 1, generation: 2 }, ChipCall::new(digest("vadd"), args), CopyIn::InPieces)
        .unwrap()
        .detach();
    let short =
        vec![host(&mut a[..999], Access::Read), host(&mut b, Access::Read), host(&mut out, Access::Write)];
    let err = rt.copy_in_some(&mut run, &short, 1 << 20).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("`vadd` tensor 0") && err.message().contains("differ"), "{err}");
    let err = rt.finalize(run).unwrap_err();
    assert!(err.message().contains("finalized before it was launched"), "{err}");
}

#[test]
fn a_chip_holds_one_active_and_one_prepared_run() {
    let mut rt = pipelined(1, &[]);
    let (mut x, mut y, mut z) = (vec![1.0f32; 8], vec![1.0f32; 8], vec![1.0f32; 8]);
    let l0 = Lease { slot: 0, generation: 1 };
    let l1 = Lease { slot: 1, generation: 1 };
    let mut first = rt
        .prepare(l0, ChipCall::new(digest("ones"), vec![host(&mut x, Access::Write)]), CopyIn::Now)
        .unwrap();
    let err = rt
        .prepare(l1, ChipCall::new(digest("ones"), vec![host(&mut y, Access::Write)]), CopyIn::Now)
        .unwrap_err();
    assert!(err.message().contains("one prepared run"), "{err}");
    rt.launch(&mut first, Trace::Off).unwrap();
    let same_slot = Lease { slot: 0, generation: 2 };
    let err = rt
        .prepare(same_slot, ChipCall::new(digest("ones"), vec![host(&mut y, Access::Write)]), CopyIn::Now)
        .unwrap_err();
    assert!(err.message().contains("same slot"), "{err}");
    let second = rt
        .prepare(l1, ChipCall::new(digest("ones"), vec![host(&mut y, Access::Write)]), CopyIn::Now)
        .unwrap();
    rt.finalize(first).unwrap();
    // A prepared run finalized unlaunched gives its place up.
    let err = rt.finalize(second).unwrap_err();
    assert!(err.message().contains("before it was launched"), "{err}");
    let mut third = rt
        .prepare(same_slot, ChipCall::new(digest("ones"), vec![host(&mut z, Access::Write)]), CopyIn::Now)
        .unwrap();
    rt.launch(&mut third, Trace::Off).unwrap();
    rt.finalize(third).unwrap();
    assert!(x.iter().chain(&z).all(|v| *v == 1.0));
    assert_eq!(y, vec![1.0; 8], "the unlaunched run wrote nothing back");
}

#[test]
fn stale_and_invalid_leases_are_refused() {
    let mut rt = pipelined(1, &[]);
    let mut x = vec![0.0f32; 8];
    let newer = Lease { slot: 0, generation: 3 };
    let mut run = rt
        .prepare(newer, ChipCall::new(digest("ones"), vec![host(&mut x, Access::Write)]), CopyIn::Now)
        .unwrap();
    rt.launch(&mut run, Trace::Off).unwrap();
    rt.finalize(run).unwrap();
    for (lease, says) in [
        (Lease { slot: 0, generation: 2 }, "stale"),
        (Lease { slot: 2, generation: 1 }, "outside the granted pipeline depth 2"),
        (Lease::NONE, "generation 0"),
    ] {
        let err = rt
            .prepare(lease, ChipCall::new(digest("ones"), vec![host(&mut x, Access::Write)]), CopyIn::Now)
            .unwrap_err();
        assert!(err.message().contains(says) && err.message().starts_with("chip 3"), "{err}");
        assert_eq!(err.kind(), ErrorKind::InvalidState);
    }
}

#[test]
fn a_failed_prepare_fails_only_its_run() {
    let mut rt = pipelined(1, &[]);
    let (mut a, mut b, mut out) = (vec![1.0f32; 64], vec![2.0f32; 64], vec![0.0f32; 64]);
    let args = vec![host(&mut a, Access::Read), host(&mut b, Access::Read), host(&mut out, Access::Write)];
    let mut head = rt
        .prepare(Lease { slot: 0, generation: 1 }, ChipCall::new(digest("vadd"), args), CopyIn::Now)
        .unwrap();
    rt.launch(&mut head, Trace::Off).unwrap();
    let next = Lease { slot: 1, generation: 1 };
    let unknown = Digest::from_bytes([7; 32]);
    let err = rt.prepare(next, ChipCall::new(unknown, vec![]), CopyIn::Now).unwrap_err();
    assert!(err.message().contains("UNKNOWN_CALLABLE"), "{err}");
    // More than the chip's 16 MiB: the staging buffer cannot grow, and nothing is copied.
    let mut huge = vec![0.0f32; 5 << 20];
    let err = rt
        .prepare(next, ChipCall::new(digest("ones"), vec![host(&mut huge, Access::Write)]), CopyIn::Now)
        .unwrap_err();
    assert!(err.message().contains("out of device memory") && err.message().contains("staging"), "{err}");
    rt.finalize(head).unwrap();
    assert!(out.iter().all(|v| *v == 3.0), "the head ran as if nothing happened");
    let mut x = vec![0.0f32; 8];
    let mut run = rt
        .prepare(next, ChipCall::new(digest("ones"), vec![host(&mut x, Access::Write)]), CopyIn::Now)
        .unwrap();
    rt.launch(&mut run, Trace::Off).unwrap();
    rt.finalize(run).unwrap();
    assert_eq!(x, vec![1.0; 8]);
}

#[test]
fn a_run_whose_kernel_fails_returns_its_lease() {
    rust_kernels_only!();
    let mut rt = pipelined(1, &[]);
    for _ in 0..3 {
        let err = run(&mut rt, &kernel("fail_kernel"), vec![], &[]).unwrap_err();
        assert!(err.message().contains("kernel says no"), "{err}");
        let err = run(&mut rt, &kernel("panic_kernel"), vec![], &[]).unwrap_err();
        assert!(err.message().contains("kernel exploded"), "{err}");
    }
    // Both slots are free again: the failed runs gave their leases back.
    let (a, b) = (rt.acquire_lease().unwrap(), rt.acquire_lease().unwrap());
    assert_eq!((a.slot, b.slot), (0, 1));
    assert!(rt.acquire_lease().is_none());
    rt.release_lease(a).unwrap();
    rt.release_lease(b).unwrap();
    let mut x = vec![0.0f32; 4];
    run(&mut rt, &kernel("ones"), vec![host(&mut x, Access::Write)], &[]).unwrap();
    assert_eq!(x, vec![1.0; 4], "and the chip runs on");
}

#[test]
fn a_slot_whose_block_serves_no_run_gives_its_memory_to_a_run_that_needs_it() {
    // 16 MiB of chip memory, runs of 10 MiB of host tensors: the two slots' blocks do not fit
    // together.
    let mut rt = pipelined(1, &[]);
    const BIG: usize = (10 << 20) / 4;
    let (mut x, mut y) = (vec![0.0f32; BIG], vec![0.0f32; BIG]);
    fn prepare<'a>(
        rt: &mut ChipRuntime,
        slot: u32,
        generation: u64,
        v: &'a mut [f32],
    ) -> Result<ChipRun<'a>> {
        let args = vec![host(v, Access::Write)];
        rt.prepare(Lease { slot, generation }, ChipCall::new(digest("ones"), args), CopyIn::Now)
    }
    let ones = |rt: &mut ChipRuntime, slot, v: &mut [f32]| {
        let mut run = prepare(rt, slot, 1, v)?;
        rt.launch(&mut run, Trace::Off)?;
        rt.finalize(run)
    };
    ones(&mut rt, 0, &mut x).unwrap();
    // Slot 0 keeps its 10 MiB block, which no run uses now: slot 1 takes the memory.
    ones(&mut rt, 1, &mut y).unwrap();
    assert!(x.iter().chain(&y).all(|v| *v == 1.0));
    // A block a run uses is never taken: while slot 1's run executes over its block, slot 0's
    // run does not fit, and fails before touching anything.
    let mut head = prepare(&mut rt, 1, 2, &mut y).unwrap();
    rt.launch(&mut head, Trace::Off).unwrap();
    let err = prepare(&mut rt, 0, 2, &mut x).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted, "{err}");
    assert!(err.message().contains("pipeline slot 0"), "{err}");
    rt.finalize(head).unwrap();
}

/// `copy_in_some` over mixed tensors (a strided host input, a device tensor, a
/// write-only host tensor, a one-element input, a contiguous in/out), with every budget from 1
/// byte to past the whole, lands exactly what a whole `prepare` lands, in at most
/// `total / budget + 1` calls; a budget of 0 still copies a byte per call.
#[test]
fn a_copy_in_in_pieces_of_any_size_over_mixed_tensors_lands_what_a_whole_prepare_does() {
    let mut rt = pipelined(1, &[]);
    // 3 rows of 5 out of rows of 7 (runs of 20 bytes, gaps of 8) and a transposed 4x3 view
    // (element runs).
    let mut strided: Vec<f32> = (0..21).map(|i| 100.0 + i as f32).collect();
    let sv = TensorView::new(0, &[3, 5], Some(&[7, 1]), DataType::Float32).unwrap();
    let mut transposed: Vec<f32> = (0..12).map(|i| 200.0 + i as f32).collect();
    let tv = TensorView::new(0, &[4, 3], Some(&[1, 4]), DataType::Float32).unwrap();
    let mut write_only = vec![-1.0f32; 9];
    let mut one = vec![42.0f32];
    let mut inout: Vec<f32> = (0..6).map(|i| 300.0 + i as f32).collect();
    let dev = device(&mut rt, &[7.0; 4], id(1));
    let total = (15 + 12 + 1 + 6) * 4u64;
    macro_rules! args {
        () => {
            [
                host_view(&mut strided, sv, Access::Read),
                dev_arg(dev, 4, Access::Read, id(1)),
                host(&mut write_only, Access::Write),
                host_view(&mut transposed, tv, Access::Read),
                host(&mut one, Access::Read),
                host(&mut inout, Access::ReadWrite),
            ]
        };
    }
    let staged = |rt: &ChipRuntime, run: &ChipRun<'_>| -> Vec<Vec<u8>> {
        run.prepared
            .iter()
            .filter(|p| p.access.can_read())
            .map(|p| {
                let (s, e) = p.view.byte_range();
                let mut b = vec![0u8; (e - s) as usize];
                rt.device.copy_from_device(p.ptr + s, &mut b).unwrap();
                // The view's element bytes only (the gaps of a strided view are never copied).
                let mut elements = Vec::new();
                p.view.for_each_run(|off, len| elements.extend_from_slice(&b[off..off + len]));
                elements
            })
            .collect()
    };
    let mut generation = 1;
    let mut lease = || {
        generation += 1;
        Lease { slot: 1, generation }
    };
    // Poison the slot's staging, then a whole prepare: the expected bytes.
    let l = lease();
    let run = rt
        .prepare(l, ChipCall::new(digest("six_tensors"), Vec::from(args!())), CopyIn::Now)
        .unwrap()
        .detach();
    let want = staged(&rt, &run);
    let _ = rt.finalize(run);
    for budget in 1..=total + 3 {
        // Poison what the whole prepare left in the staging slices.
        let l = lease();
        let mut run = rt
            .prepare(l, ChipCall::new(digest("six_tensors"), Vec::from(args!())), CopyIn::InPieces)
            .unwrap()
            .detach();
        for p in run.prepared.iter().filter(|p| p.access.can_read() && p.identity != id(1)) {
            let (s, e) = p.view.byte_range();
            rt.device.copy_to_device(p.ptr + s, &vec![0xee; (e - s) as usize]).unwrap();
        }
        let mut pieces = 0u64;
        while !rt.copy_in_some(&mut run, &args!(), budget).unwrap() {
            pieces += 1;
            assert!(pieces <= total + 10, "budget {budget}: no end after {pieces} pieces");
        }
        assert!(pieces <= total / budget + 1, "budget {budget}: {pieces} pieces");
        assert!(run.copied());
        assert_eq!(staged(&rt, &run), want, "budget {budget}");
        let _ = rt.finalize(run);
    }
    // A budget of 0 counts as 1: every call makes progress.
    let l = lease();
    let mut run = rt
        .prepare(l, ChipCall::new(digest("six_tensors"), Vec::from(args!())), CopyIn::InPieces)
        .unwrap()
        .detach();
    let mut calls = 1;
    while !rt.copy_in_some(&mut run, &args!(), 0).unwrap() {
        calls += 1;
        assert!(calls <= total + 10, "budget 0: no end after {calls} calls");
    }
    let _ = rt.finalize(run);
}

// ------------------------------------------------------------- outputs copied back on the executor

/// The host memory a kept output tensor points into, as f32 (read through its descriptor).
fn region_f32(region: &crate::sys::mem::SharedRegion) -> Vec<f32> {
    use std::os::unix::fs::FileExt;
    let mut bytes = vec![0u8; region.len()];
    std::fs::File::from(region.fd().try_clone_to_owned().unwrap()).read_exact_at(&mut bytes, 0).unwrap();
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// A kept output tensor of `n` f32 over a new region filled with `fill`.
fn kept_output(n: u32, fill: f32) -> (Arc<crate::sys::mem::SharedRegion>, KeptTensor) {
    let region = Arc::new(crate::sys::mem::SharedRegion::new(n as usize * 4, false).unwrap());
    let bytes: Vec<u8> = (0..n).flat_map(|_| fill.to_le_bytes()).collect();
    use std::os::unix::fs::FileExt;
    std::fs::File::from(region.fd().try_clone_to_owned().unwrap()).write_all_at(&bytes, 0).unwrap();
    let kept = KeptTensor::of_region(region.clone(), f32_view(n), Access::Write).unwrap();
    (region, kept)
}

#[test]
fn a_run_given_its_outputs_has_them_copied_back_once_it_has_run_and_finalize_copies_nothing() {
    let mut rt = pipelined(1, &[]);
    let lease = rt.acquire_lease().unwrap();
    // Prepared against a scratch vector; its output goes to the kept tensor instead.
    let mut scratch = vec![-1.0f32; 256];
    let args = vec![host(&mut scratch, Access::Write)];
    let mut run = rt.prepare(lease, ChipCall::new(digest("ones"), args), CopyIn::Now).unwrap().detach();
    let (region, kept) = kept_output(256, -2.0);
    run.copy_back_into(vec![(0, kept)]);
    assert!(run.copies_back());
    rt.launch(&mut run, Trace::Off).unwrap();
    rt.wait(&mut run);
    assert_eq!(region_f32(&region), vec![1.0f32; 256], "copied back by the executor, before finalize");
    // The executor let the kept tensor go before the run's end was reported.
    assert_eq!(Arc::strong_count(&region), 1);
    rt.finalize_traced(run, None).0.unwrap();
    assert!(scratch.iter().all(|v| *v == -1.0), "finalize copied nothing back");
    rt.release_lease(lease).unwrap();
}

#[test]
fn a_run_that_fails_has_nothing_copied_back() {
    rust_kernels_only!();
    let mut rt = pipelined(1, &[]);
    let lease = rt.acquire_lease().unwrap();
    let mut scratch = vec![0.0f32; 64];
    let args = vec![host(&mut scratch, Access::Write)];
    let mut run =
        rt.prepare(lease, ChipCall::new(digest("fail_kernel"), args), CopyIn::Now).unwrap().detach();
    let (region, kept) = kept_output(64, -2.0);
    run.copy_back_into(vec![(0, kept)]);
    rt.launch(&mut run, Trace::Off).unwrap();
    let err = rt.finalize(run).unwrap_err();
    assert!(err.message().contains("kernel says no"), "{err}");
    assert_eq!(region_f32(&region), vec![-2.0f32; 64]);
    rt.release_lease(lease).unwrap();
}

/// Opened once the chip is shutting down: `held_fill` waits for it (10 s at most).
static CLOSING_GATE: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());

/// Fills its output with 7.0, once [`CLOSING_GATE`] is open.
fn held_fill(args: &HostArgs<'_>) -> HostResult {
    let (lock, cv) = &CLOSING_GATE;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut open = lock.lock().unwrap();
    while !*open {
        let left = deadline.checked_duration_since(Instant::now()).ok_or("the gate never opened")?;
        open = cv.wait_timeout(open, left).unwrap().0;
    }
    drop(open);
    args.output::<f32>(0)?.fill(7.0);
    Ok(())
}

#[test]
fn a_run_that_ends_once_the_chip_is_shutting_down_copies_nothing_back() {
    rust_kernels_only!();
    let k = ChipFn::kernel("held_fill", held_fill);
    let mut rt = pipelined(1, std::slice::from_ref(&k));
    let lease = rt.acquire_lease().unwrap();
    let mut scratch = vec![0.0f32; 64];
    let args = vec![host(&mut scratch, Access::Write)];
    let mut run = rt.prepare(lease, ChipCall::new(k.handle().digest(), args), CopyIn::Now).unwrap().detach();
    let (region, kept) = kept_output(64, -2.0);
    run.copy_back_into(vec![(0, kept)]);
    rt.launch(&mut run, Trace::Off).unwrap();
    // The kernel ends only once the shutdown has begun (the parent gave the run up).
    let closing = rt.exec.closing.clone();
    let opener = std::thread::spawn(move || {
        while !closing.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        let (lock, cv) = &CLOSING_GATE;
        *lock.lock().unwrap() = true;
        cv.notify_all();
    });
    rt.shutdown();
    opener.join().unwrap();
    assert_eq!(region_f32(&region), vec![-2.0f32; 64], "nothing copied back after the shutdown began");
    let err = rt.finalize(run).unwrap_err();
    assert!(err.message().contains("shut down before the outputs of `held_fill` were copied back"), "{err}");
}
