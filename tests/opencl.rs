//! Chips on an OpenCL device (`--features opencl`; CI runs them on PoCL's CPU device): kernels
//! written in OpenCL C compile at registration and run on the device, device memory is opaque
//! `cl_mem` buffers, and one kernel that carries both a Rust body and OpenCL source gives the
//! same results on a simulated chip and on an OpenCL one, whether made with `ChipFn::with_source`
//! or declared with `#[callable(chip, opencl = "kernels/saxpy.cl")]`.
//!
//! Without an OpenCL platform each test says so and passes, unless `SIMPLER_REQUIRE_OPENCL=1`
//! (set in CI, so a broken driver install fails the run).

#![cfg(feature = "opencl")]

mod common;

use common::{Rig, expect_err, isolated_test};
use simpler::chip::{CallConfig, ChipBackend, ChipFn, ChipSpec, KernelSource, OpenClChip};
use simpler::dsl::{In, InOut, Out, chip};
use simpler::{
    DataType, ErrorKind, HostArgs, HostResult, Orchestrator, TaskArgs, Worker, callable, status::Level,
};

const VADD: &str = r"
__kernel void vadd(__global const float* a, __global const float* b, __global float* c) {
    size_t i = get_global_id(0);
    c[i] = a[i] + b[i];
}";

const SCALE: &str = r"
__kernel void scale(__global float* x, float k, int plus) {
    size_t i = get_global_id(0);
    x[i] = x[i] * k + (float)plus;
}";

/// `x = x * k + plus`, the Rust body of the same kernel.
fn scale(args: &HostArgs<'_>) -> HostResult {
    let (k, plus) = (args.scalar_f32(0)?, args.scalar(1)? as i32 as f32);
    for v in args.output::<f32>(0)? {
        *v = *v * k + plus;
    }
    Ok(())
}

/// Whether this machine has an OpenCL platform; without one (and without
/// `SIMPLER_REQUIRE_OPENCL=1`) the test prints why it is skipped.
fn have_opencl() -> bool {
    match OpenClChip::new(&ChipSpec::default_for(0)) {
        Ok(chip) => {
            eprintln!("OpenCL device: {}", chip.device_name());
            true
        }
        Err(e) if std::env::var("SIMPLER_REQUIRE_OPENCL").is_ok_and(|v| v == "1") => {
            panic!("SIMPLER_REQUIRE_OPENCL=1 but no OpenCL chip can be made: {e}")
        }
        Err(e) => {
            eprintln!("skipped: no OpenCL chip on this machine ({e})");
            false
        }
    }
}

fn l2(cores: usize) -> Worker {
    Worker::builder()
        .level(Level::Chip)
        .chip_memory(64 << 20)
        .chip_cores(cores)
        .chip_backend(OpenClChip::backend)
        .build()
        .unwrap()
}

fn f32_args(bufs: &[(&simpler::Buffer, char)], n: u32) -> TaskArgs {
    let mut args = TaskArgs::new();
    for (b, how) in bufs {
        let t = b.tensor(&[n], DataType::Float32).unwrap();
        match how {
            'r' => args.input(&t).unwrap(),
            'w' => args.output(&t).unwrap(),
            _ => args.inout(&t).unwrap(),
        };
    }
    args
}

#[isolated_test]
fn an_opencl_kernel_runs_on_the_device_with_host_tensors() {
    if !have_opencl() {
        return;
    }
    let mut chip = l2(1);
    let add = chip.register_chip(ChipFn::opencl("vadd", KernelSource::opencl(VADD, "vadd"))).unwrap();
    chip.init().unwrap();
    let n = 1000u32;
    let (a, b, c) = (
        chip.create_buffer(4000).unwrap(),
        chip.create_buffer(4000).unwrap(),
        chip.create_buffer(4000).unwrap(),
    );
    a.write(0, &(0..n).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
    b.write(0, &vec![0.5f32; n as usize]).unwrap();
    for _ in 0..3 {
        chip.run_callable(&add, f32_args(&[(&a, 'r'), (&b, 'r'), (&c, 'w')], n), CallConfig::default())
            .unwrap();
        let got = c.read::<f32>(0, n as usize).unwrap();
        assert!(got.iter().enumerate().all(|(i, &v)| v == i as f32 + 0.5), "{:?}", &got[..4]);
    }
    drop((a, b, c));
    chip.close().unwrap();
}

#[isolated_test]
fn scalars_are_narrowed_to_the_kernels_parameter_types() {
    if !have_opencl() {
        return;
    }
    let mut chip = l2(1);
    let k = chip.register_chip(ChipFn::opencl("scale", KernelSource::opencl(SCALE, "scale"))).unwrap();
    chip.init().unwrap();
    let x = chip.create_buffer(64).unwrap();
    x.write(0, &[2.0f32; 16]).unwrap();
    let mut args = f32_args(&[(&x, 'x')], 16);
    args.scalar_f32(1.5).scalar((-3i64) as u64);
    chip.run_callable(&k, args, CallConfig::default()).unwrap();
    assert_eq!(x.read::<f32>(0, 16).unwrap(), vec![0.0f32; 16]);

    // Too few scalars: refused before the launch, naming the kernel, what its source declares
    // and what the task passed.
    let mut short = f32_args(&[(&x, 'x')], 16);
    short.scalar_f32(1.0);
    expect_err(
        chip.run_callable(&k, short, CallConfig::default()),
        ErrorKind::InvalidArgument,
        &["kernel `scale`", "the task passed 1 tensor (f32) and 1 scalar,", "then 2 scalars"],
    );
    drop(x);
    chip.close().unwrap();
}

/// `scale` with its types behind macros: too much for the parser that reads parameters at
/// submit, so the chip checks them at launch, against what the compiled kernel reports.
const SCALE_BY_MACRO: &str = r"
#define REAL float
#define ARGS __global REAL* x, REAL k, int plus
__kernel void scale(ARGS) {
    size_t i = get_global_id(0);
    x[i] = x[i] * k + (REAL)plus;
}";

#[isolated_test]
fn a_kernel_whose_source_hides_its_parameters_is_still_checked_at_launch() {
    if !have_opencl() {
        return;
    }
    let mut chip = l2(1);
    let k =
        chip.register_chip(ChipFn::opencl("scale", KernelSource::opencl(SCALE_BY_MACRO, "scale"))).unwrap();
    chip.init().unwrap();
    let x = chip.create_buffer(64).unwrap();
    x.write(0, &[2.0f32; 16]).unwrap();
    for (tensors, scalars) in [(1, 1), (2, 1), (1, 3)] {
        let mut args = f32_args(&vec![(&x, 'r'); tensors], 16);
        for _ in 0..scalars {
            args.scalar_f32(1.0);
        }
        expect_err(
            chip.run_callable(&k, args, CallConfig::default()),
            ErrorKind::InvalidArgument,
            &["OpenCL kernel `scale` takes 1 tensors (__global pointers, first) and 2 scalars"],
        );
    }
    let mut args = f32_args(&[(&x, 'x')], 16);
    args.scalar_f32(0.5).scalar(1);
    chip.run_callable(&k, args, CallConfig::default()).unwrap();
    assert_eq!(x.read::<f32>(0, 16).unwrap(), vec![2.0f32; 16]);

    // A scalar where the kernel takes a second tensor: the counts add up, the kinds do not.
    let copy = "#define G __global float*\n__kernel void copy(G a, G b) { b[get_global_id(0)] = a[get_global_id(0)]; }";
    let k = chip.register_chip(ChipFn::opencl("copy", KernelSource::opencl(copy, "copy"))).unwrap();
    let mut args = f32_args(&[(&x, 'r')], 16);
    args.scalar(0);
    expect_err(
        chip.run_callable(&k, args, CallConfig::default()),
        ErrorKind::InvalidArgument,
        &["OpenCL kernel `copy` takes 2 tensors (__global pointers, first) and 0 scalars"],
    );
    drop(x);
    chip.close().unwrap();
}

#[isolated_test]
fn a_build_failure_is_a_callable_error_with_the_compilers_log_and_installs_nothing() {
    if !have_opencl() {
        return;
    }
    let broken = "__kernel void broken(__global float* x) { x[0] = undeclared_thing; }";
    // After init: the registration fails.
    let mut chip = l2(1);
    chip.init().unwrap();
    let err = expect_err(
        chip.register_chip(ChipFn::opencl("broken", KernelSource::opencl(broken, "broken"))),
        ErrorKind::Callable,
        &["KERNEL_BUILD_FAILED", "`broken`", "undeclared_thing"],
    );
    assert!(
        err.message().contains("broken.cl:"),
        "the log names the callable's source, not a cache file: {err}"
    );
    // A fixed source of the same name registers: the failed one left nothing behind.
    let fixed = "__kernel void broken(__global float* x) { x[0] = 1.0f; }";
    chip.register_chip(ChipFn::opencl("broken", KernelSource::opencl(fixed, "broken"))).unwrap();
    // A missing entry point is named.
    expect_err(
        chip.register_chip(ChipFn::opencl("nope", KernelSource::opencl(fixed, "nope"))),
        ErrorKind::Callable,
        &["no kernel function `nope`"],
    );
    chip.close().unwrap();

    // Before init: init fails with the log.
    let mut chip = l2(1);
    chip.register_chip(ChipFn::opencl("broken", KernelSource::opencl(broken, "broken"))).unwrap();
    let err = chip.init().unwrap_err();
    assert!(
        err.message().contains("KERNEL_BUILD_FAILED") && err.message().contains("undeclared_thing"),
        "{err}"
    );
}

#[isolated_test]
fn each_kind_of_chip_refuses_a_kernel_it_cannot_run_naming_it() {
    if !have_opencl() {
        return;
    }
    let mut chip = l2(1);
    chip.init().unwrap();
    expect_err(
        chip.register_chip(ChipFn::kernel("rusty", scale)),
        ErrorKind::Callable,
        &["`rusty`", "no OpenCL C source", "ChipFn::with_source"],
    );
    chip.close().unwrap();

    let mut sim = Worker::builder().level(Level::Chip).chip_memory(1 << 20).build().unwrap();
    sim.init().unwrap();
    expect_err(
        sim.register_chip(ChipFn::opencl("vadd", KernelSource::opencl(VADD, "vadd"))),
        ErrorKind::Callable,
        &["`vadd`", "opencl-c source", "SimChip"],
    );
    sim.close().unwrap();
}

/// One callable with a Rust body and OpenCL source: the same results on a simulated chip and on
/// an OpenCL chip.
#[isolated_test]
fn one_kernel_with_both_bodies_runs_alike_on_either_chip() {
    if !have_opencl() {
        return;
    }
    let both = || ChipFn::kernel("scale", scale).with_source(KernelSource::opencl(SCALE, "scale")).unwrap();
    let mut results = Vec::new();
    for opencl in [false, true] {
        let mut chip = if opencl { l2(1) } else { Worker::builder().level(Level::Chip).build().unwrap() };
        let k = chip.register_chip(both()).unwrap();
        chip.init().unwrap();
        let x = chip.create_buffer(256).unwrap();
        x.write(0, &(0..64).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
        let mut args = f32_args(&[(&x, 'x')], 64);
        args.scalar_f32(0.25).scalar(7);
        chip.run_callable(&k, args, CallConfig::default()).unwrap();
        results.push(x.read::<f32>(0, 64).unwrap());
        drop(x);
        chip.close().unwrap();
    }
    assert_eq!(results[0], results[1]);
    assert_eq!(results[1][4], 4.0 * 0.25 + 7.0);
}

/// `t = a + b` on core 0, then `out = t * 2 + 1` on core 1, `t` an `orch.alloc` intermediate in
/// the chip's device memory.
fn add_then_scale(orch: &mut Orchestrator<'_>, args: &TaskArgs, _cfg: &CallConfig) -> simpler::Result<()> {
    let (a, b, out) =
        (args.tensor(0).unwrap().clone(), args.tensor(1).unwrap().clone(), args.tensor(2).unwrap().clone());
    let n = a.view().shape()[0];
    let t = orch.alloc(&[n], DataType::Float32)?;
    let vadd = ChipFn::opencl("vadd", KernelSource::opencl(VADD, "vadd")).handle();
    let scale = ChipFn::opencl("scale", KernelSource::opencl(SCALE, "scale")).handle();
    let mut first = TaskArgs::new();
    first.input(&a)?.input(&b)?.output(&t)?;
    orch.submit_next_level(&vadd, first, CallConfig::default(), 0)?;
    let mut copy = TaskArgs::new();
    copy.input(&t)?.input(&t)?.output(&out)?; // out = t + t
    orch.submit_next_level(&vadd, copy, CallConfig::default(), 1)?;
    let mut second = TaskArgs::new();
    second.inout(&out)?.scalar_f32(0.5).scalar(1); // out = out / 2 + 1 = t + 1
    orch.submit_next_level(&scale, second, CallConfig::default(), 1)?;
    Ok(())
}

/// An L3 Worker with two OpenCL chips (chip processes of their own, sharing one device when
/// there is one): a kernel per chip, chip-resident memory, and a chip orchestration whose
/// kernels and intermediate live on the device.
#[isolated_test]
fn an_l3_worker_runs_kernels_and_orchestrations_on_two_opencl_chips() {
    if !have_opencl() {
        return;
    }
    let builder =
        Worker::builder().chips(2).chip_memory(64 << 20).chip_cores(2).chip_backend(OpenClChip::backend);
    let mut rig = Rig::new(builder);
    let add = rig.register_chip(ChipFn::opencl("vadd", KernelSource::opencl(VADD, "vadd"))).unwrap();
    rig.register_chip(ChipFn::opencl("scale", KernelSource::opencl(SCALE, "scale"))).unwrap();
    let orch = rig.register_chip(ChipFn::orchestration("add_then_scale", add_then_scale)).unwrap();
    rig.init();
    let n = 256u32;
    let bytes = n as usize * 4;
    let (a, b) = (rig.create_buffer(bytes).unwrap(), rig.create_buffer(bytes).unwrap());
    let outs = [rig.create_buffer(bytes).unwrap(), rig.create_buffer(bytes).unwrap()];
    a.write(0, &(0..n).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
    b.write(0, &vec![10.0f32; n as usize]).unwrap();
    let t = |x: &simpler::Buffer| x.tensor(&[n], DataType::Float32).unwrap();
    let (ta, tb, to) = (t(&a), t(&b), [t(&outs[0]), t(&outs[1])]);
    rig.run(|o| {
        for (chip, out) in to.iter().enumerate() {
            let mut args = TaskArgs::new();
            args.input(&ta)?.input(&tb)?.output(out)?;
            o.submit_next_level(&add, args, CallConfig::default(), chip as u32)?;
        }
        Ok(())
    })
    .unwrap();
    for out in &outs {
        let got = out.read::<f32>(0, n as usize).unwrap();
        assert!(got.iter().enumerate().all(|(i, &v)| v == i as f32 + 10.0));
    }

    // The orchestration on chip 1: out = a + b + 1.
    rig.run(|o| {
        let mut args = TaskArgs::new();
        args.input(&ta)?.input(&tb)?.output(&to[0])?;
        o.submit_next_level(&orch, args, CallConfig::default(), 1)?;
        Ok(())
    })
    .unwrap();
    let got = outs[0].read::<f32>(0, n as usize).unwrap();
    assert!(got.iter().enumerate().all(|(i, &v)| v == i as f32 + 11.0), "{:?}", &got[..4]);

    // A device intermediate (the chip's device heap): out = (a + b) + (a + b), `tmp` never on
    // the host.
    let scale_h = ChipFn::opencl("scale", KernelSource::opencl(SCALE, "scale")).handle();
    rig.run(|o| {
        // In a scope of its own: reclaimed when the scope ends and its tasks completed.
        o.scope(|o| {
            let tmp = o.alloc_on(0, &[n], DataType::Float32)?;
            assert!(
                format!("{:?}", tmp.desc().backing()).starts_with("Device"),
                "the intermediate is device memory"
            );
            let mut first = TaskArgs::new();
            first.input(&ta)?.input(&tb)?.output(&tmp)?;
            o.submit_next_level(&add, first, CallConfig::default(), 0)?;
            let mut second = TaskArgs::new();
            second.inout(&tmp)?.scalar_f32(2.0).scalar(0);
            o.submit_next_level(&scale_h, second, CallConfig::default(), 0)?;
            let mut third = TaskArgs::new();
            third.input(&tmp)?.input(&tmp)?.output(&to[1])?;
            o.submit_next_level(&add, third, CallConfig::default(), 0).map(|_| ())
        })
    })
    .unwrap();
    let got = outs[1].read::<f32>(0, n as usize).unwrap();
    assert!(got.iter().enumerate().all(|(i, &v)| v == 4.0 * (i as f32 + 10.0)), "{:?}", &got[..4]);

    // Chip-resident memory on chip 0: in, a kernel on it, out, free.
    let dev = rig.alloc_child_tensor(0, &[n], DataType::Float32).unwrap();
    rig.copy_to(&dev, &a).unwrap();
    let dt = t(&dev);
    rig.run(|o| {
        let mut args = TaskArgs::new();
        args.inout(&dt)?.scalar_f32(3.0).scalar(0);
        o.submit_next_level(
            &ChipFn::opencl("scale", KernelSource::opencl(SCALE, "scale")).handle(),
            args,
            CallConfig::default(),
            0,
        )?;
        Ok(())
    })
    .unwrap();
    rig.copy_from(&outs[1], &dev).unwrap();
    let got = outs[1].read::<f32>(0, n as usize).unwrap();
    assert!(got.iter().enumerate().all(|(i, &v)| v == i as f32 * 3.0));
    rig.free(&dev).unwrap();
}

#[isolated_test]
fn opencl_device_memory_is_opaque_and_checked() {
    if !have_opencl() {
        return;
    }
    let chip = OpenClChip::new(&ChipSpec::default_for(0)).unwrap();
    assert!(chip.alignment() >= 64 && chip.alignment().is_power_of_two());
    assert!(chip.host_memory().is_none(), "an OpenCL device's memory is not this process's");
    let p = chip.malloc(100).unwrap();
    chip.copy_to_device(p + 10, &[7u8; 90]).unwrap();
    let mut back = [0u8; 90];
    chip.copy_from_device(p + 10, &mut back).unwrap();
    assert_eq!(back, [7u8; 90]);
    assert!(chip.copy_to_device(p + 10, &[0u8; 91]).is_err(), "runs past the allocation");
    assert!(chip.free(p + 1).unwrap_err().message().contains("inside an allocation"));
    chip.free(p).unwrap();
    assert!(chip.free(p).unwrap_err().message().contains("double free"));
    assert!(chip.copy_from_device(p, &mut back).is_err(), "a freed buffer takes no copy");
    let err = chip.malloc(u64::MAX / 2).unwrap_err();
    assert!(err.message().contains("out of device memory"), "{err}");
}

/// Groups, pipelined runs and the timeline on OpenCL chips: a group with a member per chip,
/// eight runs submitted back to back (each chip stages the next run's inputs while its queue
/// runs the current one), each captured with its timeline.
#[isolated_test]
fn groups_pipelined_runs_and_timelines_work_on_opencl_chips() {
    if !have_opencl() {
        return;
    }
    let builder =
        Worker::builder().chips(2).chip_memory(64 << 20).chip_cores(1).chip_backend(OpenClChip::backend);
    let mut rig = Rig::new(builder);
    let add = rig.register_chip(ChipFn::opencl("vadd", KernelSource::opencl(VADD, "vadd"))).unwrap();
    rig.init();
    let n = 512u32;
    let bytes = n as usize * 4;
    let (a, b) = (rig.create_buffer(bytes).unwrap(), rig.create_buffer(bytes).unwrap());
    b.write(0, &vec![1.0f32; n as usize]).unwrap();
    let outs: Vec<simpler::Buffer> = (0..16).map(|_| rig.create_buffer(bytes).unwrap()).collect();
    let t = |x: &simpler::Buffer| x.tensor(&[n], DataType::Float32).unwrap();
    a.write(0, &(0..n).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
    let (ta, tb) = (t(&a), t(&b));
    let runs: Vec<_> = outs
        .chunks(2)
        .map(|pair| {
            let (y0, y1) = (t(&pair[0]), t(&pair[1]));
            let (ta, tb, add) = (ta.clone(), tb.clone(), add.clone());
            rig.submit_with(simpler::RunOptions::new().capture_dag(), move |orch, _, _| {
                let members = [&y0, &y1]
                    .into_iter()
                    .map(|y| {
                        let mut args = TaskArgs::new();
                        args.input(&ta)?.input(&tb)?.output(y)?;
                        Ok(args)
                    })
                    .collect::<simpler::Result<Vec<_>>>()?;
                orch.submit_next_level_group(&add, members, CallConfig::default(), &[0, 1]).map(|_| ())
            })
            .unwrap()
        })
        .collect();
    for run in runs {
        run.wait().unwrap();
        let timeline = run.timeline().unwrap();
        assert_eq!(timeline.records()[0].worker, "chip 0, chip 1");
        let mut lanes: Vec<&str> = timeline.inner_records().iter().map(|r| r.worker.as_str()).collect();
        lanes.sort();
        assert_eq!(lanes, ["chip 0 / core 0", "chip 1 / core 0"], "one kernel per member, each on its chip");
    }
    for out in &outs {
        let got = out.read::<f32>(0, n as usize).unwrap();
        assert!(got.iter().enumerate().all(|(i, &v)| v == i as f32 + 1.0));
    }
}

/// On an L3 Worker a kernel that does not build is refused on every chip, the error names the
/// chip and carries the log, and nothing is left installed: a fixed source of the same name
/// registers and runs.
#[isolated_test]
fn an_l3_build_failure_is_refused_everywhere_and_leaves_nothing() {
    if !have_opencl() {
        return;
    }
    let builder =
        Worker::builder().chips(2).chip_memory(16 << 20).chip_cores(1).chip_backend(OpenClChip::backend);
    let mut rig = Rig::new(builder);
    rig.init();
    let broken = "__kernel void fill(__global float* x) { x[get_global_id(0)] = nope; }";
    let err = expect_err(
        rig.register_chip(ChipFn::opencl("fill", KernelSource::opencl(broken, "fill"))),
        ErrorKind::Callable,
        &["chip", "KERNEL_BUILD_FAILED", "`fill`", "nope"],
    );
    drop(err);
    let fixed = "__kernel void fill(__global float* x) { x[get_global_id(0)] = 5.0f; }";
    let fill = rig.register_chip(ChipFn::opencl("fill", KernelSource::opencl(fixed, "fill"))).unwrap();
    let out = rig.create_buffer(64).unwrap();
    let t = out.tensor(&[16], DataType::Float32).unwrap();
    for chip in 0..2 {
        out.write(0, &[0.0f32; 16]).unwrap();
        rig.run(|o| {
            let mut args = TaskArgs::new();
            args.output(&t)?;
            o.submit_next_level(&fill, args, CallConfig::default(), chip)?;
            Ok(())
        })
        .unwrap();
        assert_eq!(out.read::<f32>(0, 16).unwrap(), vec![5.0f32; 16], "chip {chip}");
    }
}

/// A process forked (without exec) from one that used OpenCL refuses to make an OpenCL chip,
/// naming `StartMethod::Exec`, instead of hanging in the driver (rule O5).
#[isolated_test]
fn a_forked_copy_of_an_opencl_process_refuses_opencl_instead_of_hanging() {
    if !have_opencl() {
        return;
    }
    let pid = common::fork_process(|| match OpenClChip::new(&ChipSpec::default_for(0)) {
        Err(e) if e.kind() == ErrorKind::InvalidState && e.message().contains("StartMethod::Exec") => 0,
        Err(_) => 2,
        Ok(_) => 3,
    });
    assert_eq!(common::wait_process(pid, std::time::Duration::from_secs(20)), Some(0));
}

/// `y = a * x + y + plus`: a Rust body for simulated chips, and `kernels/saxpy.cl` (relative to
/// this crate's `Cargo.toml`, function `saxpy`) for OpenCL chips.
#[callable(chip, opencl = "kernels/saxpy.cl", entry = "saxpy")]
fn saxpy_plus(x: In<f32>, mut y: InOut<f32>, a: f32, plus: i32) {
    for (yi, xi) in y.iter_mut().zip(x.iter()) {
        *yi = a * xi + *yi + plus as f32;
    }
}

/// `y` after `saxpy_plus(x = i, y = 1, a = 0.25, plus = 7)` on 64 elements, on an L2 Worker
/// (its one chip in this process) made by `builder`. The values are exact in `f32`, so a fused
/// multiply-add on the device gives the same bits.
fn saxpy_on_l2(builder: simpler::WorkerBuilder) -> Vec<f32> {
    let mut l2 = builder.build().unwrap();
    l2.init().unwrap();
    let (bx, by) = (l2.create_buffer(256).unwrap(), l2.create_buffer(256).unwrap());
    bx.write(0, &(0..64).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
    by.write(0, &[1.0f32; 64]).unwrap();
    let (x, mut y) = (bx.typed::<f32>(&[64]).unwrap(), by.typed::<f32>(&[64]).unwrap());
    saxpy_plus::call(&x, &mut y, 0.25, 7).unwrap().run(&l2).unwrap();
    let got = by.read::<f32>(0, 64).unwrap();
    drop((x, y, bx, by));
    l2.close().unwrap();
    got
}

/// A `#[callable(chip, opencl = ...)]` kernel: the Rust body on a simulated chip, the file's
/// OpenCL C on an OpenCL chip, the same results.
#[isolated_test]
fn a_macro_kernel_with_opencl_source_runs_alike_on_either_chip() {
    if !have_opencl() {
        return;
    }
    let (text, entry) = saxpy_plus::INFO.source.expect("the macro recorded the source");
    assert_eq!((text, entry), (include_str!("kernels/saxpy.cl"), "saxpy"));
    let sim = saxpy_on_l2(Worker::builder().level(Level::Chip).chip_memory(1 << 20));
    let ocl = saxpy_on_l2(
        Worker::builder().level(Level::Chip).chip_memory(1 << 20).chip_backend(OpenClChip::backend),
    );
    assert_eq!(sim, ocl);
    assert_eq!(sim[4], 0.25 * 4.0 + 1.0 + 7.0);
}

/// The same kernel on chip 1 of an L3 Worker with OpenCL chips: the chip process finds it by
/// digest in its link-time registry, source included, and runs the source on the device.
#[isolated_test]
fn a_macro_kernel_with_opencl_source_runs_in_an_l3_chip_process() {
    if !have_opencl() {
        return;
    }
    let mut l3 =
        Worker::builder().chips(2).chip_memory(1 << 20).chip_backend(OpenClChip::backend).build().unwrap();
    l3.init().unwrap();
    let (bx, by) = (l3.create_buffer(256).unwrap(), l3.create_buffer(256).unwrap());
    bx.write(0, &(0..64).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
    by.write(0, &[1.0f32; 64]).unwrap();
    let (x, mut y) = (bx.typed::<f32>(&[64]).unwrap(), by.typed::<f32>(&[64]).unwrap());
    l3.run(|o| saxpy_plus::call(&x, &mut y, 0.5, -1)?.on(o, chip(1)).map(|_| ())).unwrap();
    let got = by.read::<f32>(0, 64).unwrap();
    assert!(got.iter().enumerate().all(|(i, &v)| v == 0.5 * i as f32), "{:?}", &got[..4]);
    drop((x, y, bx, by));
    l3.close().unwrap();
}

/// A Rust-only kernel in the same binary: every Worker registers it, an OpenCL chip does not
/// compile it (the chip still starts), and a task that runs it there fails, naming it.
#[callable(chip)]
fn rust_only(mut y: Out<f32>) {
    y.fill(3.0);
}

#[isolated_test]
fn a_rust_only_macro_kernel_does_not_stop_an_opencl_chip_and_fails_by_name_if_run() {
    if !have_opencl() {
        return;
    }
    let mut chip = l2(1);
    chip.init().unwrap();
    let by = chip.create_buffer(64).unwrap();
    let mut y = by.typed::<f32>(&[16]).unwrap();
    let err = rust_only::call(&mut y).unwrap().run(&chip).unwrap_err();
    assert!(err.message().contains("`rust_only`") && err.message().contains("no OpenCL C source"), "{err}");
    drop((y, by));
    chip.close().unwrap();
}

/// Out of device memory on an OpenCL chip is `ResourceExhausted`, naming the chip and the
/// setting; memory freed is memory again.
#[isolated_test]
fn out_of_device_memory_on_an_opencl_chip_names_the_chip() {
    if !have_opencl() {
        return;
    }
    let builder = Worker::builder()
        .chips(1)
        .chip_memory(8 << 20)
        .chip_heap_ring_size(0)
        .chip_backend(OpenClChip::backend);
    let mut rig = Rig::new(builder);
    rig.init();
    let big = rig.alloc_child_tensor(0, &[1 << 20], DataType::Float32).unwrap(); // 4 MiB
    let err = rig.alloc_child_tensor(0, &[1 << 20, 2], DataType::Float32).unwrap_err(); // 8 MiB more
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted, "{err}");
    assert!(err.message().contains("chip 0") && err.message().contains("chip_memory"), "{err}");
    rig.free(&big).unwrap();
    let again = rig.alloc_child_tensor(0, &[1 << 20], DataType::Float32).unwrap();
    rig.free(&again).unwrap();
}

/// A kernel that demands work-groups of 64 work-items. A launch lets the device pick the
/// work-group size (it passes no local size), which OpenCL forbids for such a kernel: the device
/// refuses every launch of it, with `CL_INVALID_WORK_GROUP_SIZE`.
const FIXED_GROUP: &str = r"
__kernel __attribute__((reqd_work_group_size(64, 1, 1)))
void fixed_group(__global float* x) {
    x[get_global_id(0)] += 1.0f;
}";

/// A kernel the device refuses fails its task alone, the error naming the kernel and the
/// OpenCL error by its name; the chip goes on, and later tasks and runs on it succeed.
#[isolated_test]
fn a_kernel_the_device_refuses_fails_its_task_naming_the_error_and_later_tasks_run() {
    if !have_opencl() {
        return;
    }
    let fixed = || ChipFn::opencl("fixed_group", KernelSource::opencl(FIXED_GROUP, "fixed_group"));
    let vadd = || ChipFn::opencl("vadd", KernelSource::opencl(VADD, "vadd"));
    // L2: the call fails, the next ones run (and the refused kernel is refused the same way).
    let mut chip = l2(1);
    let k = chip.register_chip(fixed()).unwrap();
    let add = chip.register_chip(vadd()).unwrap();
    chip.init().unwrap();
    let (x, y) = (chip.create_buffer(128 * 4).unwrap(), chip.create_buffer(128 * 4).unwrap());
    x.write(0, &[1.0f32; 128]).unwrap();
    for _ in 0..2 {
        let err = expect_err(
            chip.run_callable(&k, f32_args(&[(&x, 'x')], 128), CallConfig::default()),
            ErrorKind::TaskFailed,
            &["kernel `fixed_group`", "refused", "CL_INVALID_WORK_GROUP_SIZE (-54)"],
        );
        eprintln!("L2: {err}");
        chip.run_callable(&add, f32_args(&[(&x, 'r'), (&x, 'r'), (&y, 'w')], 128), CallConfig::default())
            .unwrap();
        assert_eq!(y.read::<f32>(0, 128).unwrap(), vec![2.0f32; 128]);
    }
    assert_eq!(x.read::<f32>(0, 128).unwrap(), vec![1.0f32; 128], "the refused kernel never ran");
    drop((x, y));
    chip.close().unwrap();

    // L3: the failing task fails its run, naming the chip; the next runs on the same chip run.
    let builder =
        Worker::builder().chips(2).chip_memory(16 << 20).chip_cores(1).chip_backend(OpenClChip::backend);
    let mut rig = Rig::new(builder);
    let k = rig.register_chip(fixed()).unwrap();
    let add = rig.register_chip(vadd()).unwrap();
    rig.init();
    let (x, y) = (rig.create_buffer(128 * 4).unwrap(), rig.create_buffer(128 * 4).unwrap());
    let (tx, ty) =
        (x.tensor(&[128], DataType::Float32).unwrap(), y.tensor(&[128], DataType::Float32).unwrap());
    x.write(0, &[1.0f32; 128]).unwrap();
    let err = rig
        .run(|o| {
            let mut bad = TaskArgs::new();
            bad.inout(&tx)?;
            o.submit_next_level(&k, bad, CallConfig::default(), 0).map(|_| ())
        })
        .unwrap_err();
    eprintln!("L3: {err}");
    common::assert_err(
        &err,
        ErrorKind::TaskFailed,
        &["chip 0", "`fixed_group`", "CL_INVALID_WORK_GROUP_SIZE (-54)"],
    );
    for k in [1.0f32, 2.0] {
        x.write(0, &[k; 128]).unwrap();
        rig.run(|o| {
            let mut good = TaskArgs::new();
            good.input(&tx)?.input(&tx)?.output(&ty)?;
            o.submit_next_level(&add, good, CallConfig::default(), 0).map(|_| ())
        })
        .unwrap();
        assert_eq!(y.read::<f32>(0, 128).unwrap(), vec![2.0 * k; 128], "chip 0 ran the later run");
    }
}

/// Set in the child process that [`with_no_opencl_platform_init_fails_naming_what_to_install`]
/// starts: the test body it runs there.
const NO_PLATFORM_CHILD: &str = "SIMPLER_TEST_NO_OPENCL_PLATFORM";

/// With no OpenCL driver where the ICD loader looks (`OCL_ICD_VENDORS`, an empty directory, in a
/// child process of this test binary), starting an OpenCL chip fails, naming what is missing and
/// the package that provides it: on an L2 Worker (in this process) and an L3 one (in a chip
/// process), and when listing the devices.
#[isolated_test]
fn with_no_opencl_platform_init_fails_naming_what_to_install() {
    if std::env::var_os(NO_PLATFORM_CHILD).is_some() {
        let mut l2 = Worker::builder().level(Level::Chip).chip_backend(OpenClChip::backend).build().unwrap();
        eprintln!("L2 INIT: {}", l2.init().unwrap_err());
        let mut l3 = Worker::builder()
            .chips(1)
            .chip_memory(1 << 20)
            .chip_backend(OpenClChip::backend)
            .build()
            .unwrap();
        eprintln!("L3 INIT: {}", l3.init().unwrap_err());
        eprintln!("DEVICES: {}", OpenClChip::devices().unwrap_err());
        return;
    }
    // Whether this machine has the ICD loader at all (without it, that is what is missing).
    let loader = OpenClChip::devices().map_or_else(|e| !e.message().contains("libOpenCL.so.1"), |_| true);
    let name = "with_no_opencl_platform_init_fails_naming_what_to_install";
    let vendors = std::env::temp_dir().join(format!("simpler-no-icd-{}", std::process::id()));
    std::fs::create_dir_all(&vendors).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(NO_PLATFORM_CHILD, "1")
        .env("SIMPLER_TEST_ALONE", name)
        .env("OCL_ICD_VENDORS", &vendors)
        .env_remove("OCL_ICD_FILENAMES")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    std::fs::remove_dir(&vendors).unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("the child's output:\n{stdout}\n{stderr}");
    assert!(out.status.success() && stdout.contains("test result: ok. 1 passed"), "the child failed");
    let wanted: &[&str] = if loader {
        &["no OpenCL platform (CL_PLATFORM_NOT_FOUND_KHR)", "no .icd file in", "pocl-opencl-icd"]
    } else {
        &["libOpenCL.so.1", "ocl-icd-libopencl1"]
    };
    for what in ["L2 INIT: chip 0", "L3 INIT: Worker.init: chip 0", "DEVICES: "] {
        let line = stderr.lines().find(|l| l.contains(what)).unwrap_or_else(|| panic!("no `{what}` line"));
        assert!(wanted.iter().all(|w| line.contains(w)), "{line}");
    }
}

/// Chips made from many threads of a fresh process at once all find the device: the ICD
/// loader and PoCL set themselves up on the first platform query, which two threads racing
/// through it once made see no device.
#[isolated_test]
fn chips_made_from_many_threads_at_once_all_find_a_device() {
    // No `have_opencl()` first: it would make the first query, which this test must race.
    let required = std::env::var("SIMPLER_REQUIRE_OPENCL").is_ok_and(|v| v == "1");
    let threads = 8;
    let start = std::sync::Barrier::new(threads);
    let made: Vec<simpler::Result<OpenClChip>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let start = &start;
                s.spawn(move || {
                    let spec = ChipSpec::default_for(i as u32);
                    start.wait();
                    OpenClChip::new(&spec)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    if !required && made.iter().all(|m| m.as_ref().err().is_some_and(|e| e.message().contains("no OpenCL"))) {
        eprintln!("skipped: no OpenCL chip on this machine");
        return;
    }
    for (i, m) in made.iter().enumerate() {
        assert!(m.is_ok(), "thread {i}: {}", m.as_ref().err().unwrap());
    }
}

/// f64 tensors and a `double` scalar on the device (PoCL has `cl_khr_fp64`; a device without
/// it fails the build, naming the callable).
#[isolated_test]
fn double_precision_tensors_and_scalars_run_on_the_device() {
    if !have_opencl() {
        return;
    }
    const AXPY: &str = r"
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
__kernel void axpy64(__global const double* x, __global double* y, double a) {
    size_t i = get_global_id(0);
    y[i] = a * x[i] + y[i];
}";
    let mut chip = l2(1);
    let k = chip.register_chip(ChipFn::opencl("axpy64", KernelSource::opencl(AXPY, "axpy64"))).unwrap();
    chip.init().unwrap();
    let (x, y) = (chip.create_buffer(8 * 4).unwrap(), chip.create_buffer(8 * 4).unwrap());
    let xs = [1.0f64, 1e-12, 3.0, 1e300];
    x.write(0, &xs).unwrap();
    y.write(0, &[1.0f64; 4]).unwrap();
    let mut args = TaskArgs::new();
    args.input(&x.tensor(&[4], DataType::Float64).unwrap())
        .unwrap()
        .inout(&y.tensor(&[4], DataType::Float64).unwrap())
        .unwrap()
        .scalar(0.5f64.to_bits());
    chip.run_callable(&k, args, CallConfig::default()).unwrap();
    let want: Vec<f64> = xs.iter().map(|v| 0.5 * v + 1.0).collect();
    assert_eq!(y.read::<f64>(0, 4).unwrap(), want, "f64 precision kept (1 + 5e-13 is not 1 in f32)");
    // An f32 tensor where the source declares `double*` is refused at submit.
    let mut wrong = TaskArgs::new();
    wrong
        .input(&x.tensor(&[8], DataType::Float32).unwrap())
        .unwrap()
        .inout(&y.tensor(&[4], DataType::Float64).unwrap())
        .unwrap()
        .scalar(0);
    expect_err(
        chip.run_callable(&k, wrong, CallConfig::default()),
        ErrorKind::InvalidArgument,
        &["axpy64", "f32"],
    );
    drop((x, y));
    chip.close().unwrap();
}
