//! L3 Workers with simulated chips: chip kernels, groups, chip orchestration, chip-resident
//! memory, placement errors and a killed chip child. Every chip runs in its own forked process.

mod common;

use common::{fail_kernel, isolated_test};

use common::{Rig, TempFiles, expect_err, process_exists, sigkill};
use simpler::{
    DataType, ErrorKind, HostArgs, HostFn, HostResult, Orchestrator, Result, TaskArgs, Worker, WorkerBuilder,
    chip::CallConfig, chip::ChipFn,
};

const N: usize = 256;

/// `x += k` in place (scalar 0 is `k` as f32 bits).
/// `add_scalar` with its OpenCL C source (`tests/kernels/add_scalar.cl`).
fn add_scalar_kernel() -> ChipFn {
    ChipFn::kernel("add_scalar", add_scalar)
        .with_source(simpler::chip::KernelSource::opencl(include_str!("kernels/add_scalar.cl"), "add_scalar"))
        .expect("a kernel")
}

fn add_scalar(args: &HostArgs<'_>) -> HostResult {
    let k = args.scalar_f32(0)?;
    for v in args.output::<f32>(0)? {
        *v += k;
    }
    Ok(())
}

/// Announces its chip process id (marker `chips-block` of the test, the chip's parent), then
/// waits until the process is killed.
fn block_kernel(_args: &HostArgs<'_>) -> HostResult {
    common::announce_to_parent("chips-block", &std::process::id().to_string())?;
    common::park_until_killed()
}

fn host_noop(_: &HostArgs<'_>) -> HostResult {
    Ok(())
}

/// A chip orchestration: `tmp = a + b` on core 0, `out = tmp * 2` on core 1 (RAW across cores,
/// through a device intermediate passed as tensor 3).
fn chip_pipeline(orch: &mut Orchestrator<'_>, args: &TaskArgs, _cfg: &CallConfig) -> Result<()> {
    let (a, b, out, tmp) =
        (args.tensor(0).unwrap(), args.tensor(1).unwrap(), args.tensor(2).unwrap(), args.tensor(3).unwrap());
    let vadd_h = common::vadd_kernel().handle();
    let double_h = common::double_kernel().handle();
    let mut first = TaskArgs::new();
    first.input(a)?.input(b)?.output(tmp)?;
    orch.submit_next_level(&vadd_h, first, CallConfig::default(), 0)?;
    let mut second = TaskArgs::new();
    second.input(tmp)?.output(out)?;
    orch.submit_next_level(&double_h, second, CallConfig::default(), 1)?;
    Ok(())
}

fn chips(n: usize) -> WorkerBuilder {
    common::builder().chips(n).chip_memory(64 << 20).chip_cores(2)
}

fn inputs(w: &Worker) -> (simpler::Buffer, simpler::Buffer, Vec<f32>, Vec<f32>) {
    let a = w.create_buffer(N * 4).unwrap();
    let b = w.create_buffer(N * 4).unwrap();
    let av: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let bv: Vec<f32> = (0..N).map(|i| 1000.0 + i as f32).collect();
    a.write(0, &av).unwrap();
    b.write(0, &bv).unwrap();
    (a, b, av, bv)
}

fn f32s(b: &simpler::Buffer) -> simpler::Tensor {
    b.tensor(&[(b.nbytes() / 4) as u32], DataType::Float32).unwrap()
}

#[isolated_test]
fn vector_add_on_one_chip() {
    let mut rig = Rig::new(chips(1));
    let k = rig.register_chip(common::vadd_kernel()).unwrap();
    rig.init();
    let (a, b, av, bv) = inputs(&rig);
    let out = rig.create_buffer(N * 4).unwrap();
    let (ta, tb, to) = (f32s(&a), f32s(&b), f32s(&out));
    rig.run(|orch| {
        let mut args = TaskArgs::new();
        args.input(&ta)?.input(&tb)?.output(&to)?;
        orch.submit_next_level(&k, args, CallConfig::default(), 0).map(|_| ())
    })
    .unwrap();
    let got = out.read::<f32>(0, N).unwrap();
    assert!(got.iter().enumerate().all(|(i, v)| *v == av[i] + bv[i]), "vector add result");
}

#[isolated_test]
fn the_same_kernel_on_four_chips_as_a_group_and_as_singles() {
    let mut rig = Rig::new(chips(4));
    let k = rig.register_chip(common::vadd_kernel()).unwrap();
    rig.init();
    let (a, b, av, bv) = inputs(&rig);
    let outs: Vec<_> = (0..8).map(|_| rig.create_buffer(N * 4).unwrap()).collect();
    let (ta, tb) = (f32s(&a), f32s(&b));
    let touts: Vec<_> = outs.iter().map(f32s).collect();
    rig.run(|orch| {
        let mut list = Vec::new();
        for t in &touts[..4] {
            let mut args = TaskArgs::new();
            args.input(&ta)?.input(&tb)?.output(t)?;
            list.push(args);
        }
        orch.submit_next_level_group(&k, list, CallConfig::default(), &[0, 1, 2, 3])?;
        for (w, t) in touts[4..].iter().enumerate() {
            let mut args = TaskArgs::new();
            args.input(&ta)?.input(&tb)?.output(t)?;
            orch.submit_next_level(&k, args, CallConfig::default(), w as u32)?;
        }
        Ok(())
    })
    .unwrap();
    for out in &outs {
        let got = out.read::<f32>(0, N).unwrap();
        assert!(got.iter().enumerate().all(|(i, v)| *v == av[i] + bv[i]));
    }
}

#[isolated_test]
fn chip_orchestration_runs_dependent_kernels_on_its_cores() {
    let mut rig = Rig::new(chips(1));
    rig.register_chip(common::vadd_kernel()).unwrap();
    rig.register_chip(common::double_kernel()).unwrap();
    let pipe = rig.register_chip(ChipFn::orchestration("pipeline", chip_pipeline)).unwrap();
    rig.init();
    let (a, b, av, bv) = inputs(&rig);
    let out = rig.create_buffer(N * 4).unwrap();
    let tmp = rig.alloc_child_tensor(0, &[N as u32], DataType::Float32).unwrap();
    let (ta, tb, to, tt) =
        (f32s(&a), f32s(&b), f32s(&out), tmp.tensor(&[N as u32], DataType::Float32).unwrap());
    rig.run(|orch| {
        let mut args = TaskArgs::new();
        args.input(&ta)?.input(&tb)?.output(&to)?.add_tensor(&tt, simpler::Tag::InOut)?;
        orch.submit_next_level(&pipe, args, CallConfig::default(), 0).map(|_| ())
    })
    .unwrap();
    let got = out.read::<f32>(0, N).unwrap();
    assert!(got.iter().enumerate().all(|(i, v)| *v == 2.0 * (av[i] + bv[i])), "pipeline result");
    rig.free(&tmp).unwrap();
}

#[isolated_test]
fn chip_resident_memory_round_trip() {
    let mut rig = Rig::new(chips(2));
    let k = rig.register_chip(add_scalar_kernel()).unwrap();
    rig.init();
    let host = rig.create_buffer(N * 4).unwrap();
    let start: Vec<f32> = (0..N).map(|i| i as f32).collect();
    host.write(0, &start).unwrap();
    let dev = rig.alloc_child_tensor(1, &[N as u32], DataType::Float32).unwrap();
    rig.copy_to(&dev, &host).unwrap();
    let td = dev.tensor(&[N as u32], DataType::Float32).unwrap();
    // Two kernels chained on the device-resident tensor, then a third in a later run.
    for k_value in [1.0f32, 10.0] {
        rig.run(|orch| {
            let mut args = TaskArgs::new();
            args.inout(&td)?.scalar_f32(k_value);
            orch.submit_next_level(&k, args, CallConfig::default(), 1)?;
            let mut again = TaskArgs::new();
            again.inout(&td)?.scalar_f32(k_value);
            orch.submit_next_level(&k, again, CallConfig::default(), 1).map(|_| ())
        })
        .unwrap();
    }
    // The host buffer was not touched by the runs (device memory is not copied back).
    assert_eq!(host.read::<f32>(0, N).unwrap(), start);
    let back = rig.create_buffer(N * 4).unwrap();
    rig.copy_from(&back, &dev).unwrap();
    let got = back.read::<f32>(0, N).unwrap();
    assert!(
        got.iter().enumerate().all(|(i, v)| *v == i as f32 + 22.0),
        "two +1 and two +10: {:?}",
        &got[..4]
    );

    // Misuse: another chip, a SUB-less host task, a too-small host buffer, use after free, double free.
    let err = rig
        .run(|orch| {
            let mut args = TaskArgs::new();
            args.inout(&td)?.scalar_f32(1.0);
            orch.submit_next_level(&k, args, CallConfig::default(), 0).map(|_| ())
        })
        .unwrap_err();
    common::assert_err(&err, ErrorKind::InvalidArgument, &["lives on chip 1", "runs on chip 0"]);
    let small = rig.create_buffer(16).unwrap();
    expect_err(rig.copy_to(&dev, &small), ErrorKind::InvalidArgument, &["host buffer has 16 bytes"]);
    expect_err(rig.copy_to(&host, &small), ErrorKind::InvalidArgument, &["host memory"]);
    rig.free(&dev).unwrap();
    expect_err(rig.free(&dev), ErrorKind::InvalidState, &["already freed"]);
    let err = rig
        .run(|orch| {
            let mut args = TaskArgs::new();
            args.inout(&td)?.scalar_f32(1.0);
            orch.submit_next_level(&k, args, CallConfig::default(), 1).map(|_| ())
        })
        .unwrap_err();
    common::assert_err(&err, ErrorKind::InvalidArgument, &["was freed"]);
    expect_err(
        rig.alloc_child_tensor(7, &[4], DataType::Float32),
        ErrorKind::InvalidArgument,
        &["chip 7 does not exist", "WorkerBuilder::chips"],
    );
}

#[isolated_test]
fn copies_of_a_device_buffer_are_refused_while_a_submitted_task_names_it() {
    let mut rig = Rig::new(chips(1));
    let k = rig.register_chip(add_scalar_kernel()).unwrap();
    rig.init();
    let host = rig.create_buffer(N * 4).unwrap();
    host.write(0, &vec![1.0f32; N]).unwrap();
    let dev = rig.alloc_child_tensor(0, &[N as u32], DataType::Float32).unwrap();
    rig.copy_to(&dev, &host).unwrap();
    let td = dev.tensor(&[N as u32], DataType::Float32).unwrap();
    let other = rig.alloc_child_tensor(0, &[N as u32], DataType::Float32).unwrap();
    let worker: &Worker = &rig;
    worker
        .run(|orch| {
            let mut args = TaskArgs::new();
            args.inout(&td)?.scalar_f32(1.0);
            orch.submit_next_level(&k, args, CallConfig::default(), 0)?;
            // The kernel may run before or after this line: either way the copy is refused
            // instead of landing before or after the kernel by chance.
            let err = worker.copy_to(&dev, &host).unwrap_err();
            common::assert_err(&err, ErrorKind::InvalidState, &["copy_to", "named by 1 submitted task"]);
            let err = worker.copy_from(&host, &dev).unwrap_err();
            common::assert_err(&err, ErrorKind::InvalidState, &["copy_from", "named by 1 submitted task"]);
            // A buffer no task names copies as usual.
            worker.copy_to(&other, &host)?;
            Ok(())
        })
        .unwrap();
    // Once the run is over, the buffer is free to copy again and holds the kernel's result.
    let back = rig.create_buffer(N * 4).unwrap();
    rig.copy_from(&back, &dev).unwrap();
    assert_eq!(back.read::<f32>(0, N).unwrap(), vec![2.0f32; N]);
    rig.copy_to(&dev, &host).unwrap();
    rig.free(&dev).unwrap();
    rig.free(&other).unwrap();
}

#[isolated_test]
fn wrong_kind_handles_and_bad_worker_ids_are_refused_at_submit() {
    let mut rig = Rig::new(chips(2).sub_workers(1));
    let k = rig.register_chip(common::vadd_kernel()).unwrap();
    let h = rig.register(HostFn::new("noop", host_noop)).unwrap();
    rig.init();
    let dev = rig.alloc_child_tensor(0, &[4], DataType::Float32).unwrap();
    let td = dev.tensor(&[4], DataType::Float32).unwrap();
    let attempt = |f: &dyn Fn(&mut Orchestrator<'_>) -> Result<()>| rig.run(|orch| f(orch)).unwrap_err();
    let e = attempt(&|o| o.submit_next_level(&h, TaskArgs::new(), CallConfig::default(), 0).map(|_| ()));
    common::assert_err(&e, ErrorKind::Callable, &["noop", "host function"]);
    let e = attempt(&|o| o.submit_sub(&k, TaskArgs::new()).map(|_| ()));
    common::assert_err(&e, ErrorKind::Callable, &["vadd", "chip"]);
    let e = attempt(&|o| o.submit_next_level(&k, TaskArgs::new(), CallConfig::default(), 2).map(|_| ()));
    common::assert_err(
        &e,
        ErrorKind::InvalidArgument,
        &["chip 2 does not exist", "has 2 chips", "WorkerBuilder::chips"],
    );
    // Arguments the kernel takes (its OpenCL C source declares three f32 tensors, checked at
    // submit too), so that only the worker ids are wrong.
    let sum = rig.alloc_child_tensor(0, &[4], DataType::Float32).unwrap();
    let ts = sum.tensor(&[4], DataType::Float32).unwrap();
    let vadd_args = || {
        let mut a = TaskArgs::new();
        a.input(&td).unwrap().input(&td).unwrap().output(&ts).unwrap();
        a
    };
    let e = attempt(&|o| {
        o.submit_next_level_group(&k, vec![vadd_args(), vadd_args()], CallConfig::default(), &[1, 1])
            .map(|_| ())
    });
    common::assert_err(&e, ErrorKind::InvalidArgument, &["worker 1 is named twice"]);
    let e = attempt(&|o| {
        o.submit_next_level_group(&k, vec![vadd_args(), vadd_args()], CallConfig::default(), &[0]).map(|_| ())
    });
    common::assert_err(&e, ErrorKind::InvalidArgument, &["1 workers for 2 argument sets"]);
    let e = attempt(&|o| {
        let mut args = TaskArgs::new();
        args.input(&td)?;
        o.submit_sub(&h, args).map(|_| ())
    });
    common::assert_err(&e, ErrorKind::InvalidArgument, &["memory of chip 0", "SUB"]);
    rig.free(&dev).unwrap();
    rig.free(&sum).unwrap();
}

#[isolated_test]
fn a_failing_kernel_names_the_chip_and_the_callable() {
    if common::needs_rust_kernels() {
        return;
    }
    let mut rig = Rig::new(chips(2));
    let k = rig.register_chip(ChipFn::kernel("fail_kernel", fail_kernel)).unwrap();
    rig.init();
    let err = rig
        .run(|orch| orch.submit_next_level(&k, TaskArgs::new(), CallConfig::default(), 1).map(|_| ()))
        .unwrap_err();
    common::assert_err(&err, ErrorKind::TaskFailed, &["fail_kernel", "failed on chip 1", "kernel says no"]);
    assert_eq!(err.message().matches("failed on chip 1").count(), 1, "said once: {err}");
}

#[isolated_test]
fn a_killed_chip_child_fails_its_task_and_later_work_for_it() {
    if common::needs_rust_kernels() {
        return;
    }
    let mut rig = Rig::new(chips(2));
    let block = rig.register_chip(ChipFn::kernel("block", block_kernel)).unwrap();
    let k = rig.register_chip(common::vadd_kernel()).unwrap();
    rig.init();
    let marker = common::marker_file("chips-block", std::process::id());
    let _files = TempFiles::new([marker.clone()]);
    let run = rig
        .submit(|orch| orch.submit_next_level(&block, TaskArgs::new(), CallConfig::default(), 0).map(|_| ()))
        .unwrap();
    let pid: i32 = common::wait_for_marker(&marker, "the blocking kernel to start").trim().parse().unwrap();
    assert_eq!(pid, rig.pids()[0], "the kernel runs inside chip 0's process");
    sigkill(pid);
    let err = run.wait().unwrap_err();
    common::assert_err(&err, ErrorKind::WorkerDied, &["died", "signal 9"]);
    // Later work aimed at chip 0 fails clearly; chip 1 still works.
    let (a, b, _, _) = inputs(&rig);
    let out = rig.create_buffer(N * 4).unwrap();
    let (ta, tb, to) = (f32s(&a), f32s(&b), f32s(&out));
    let err = rig
        .run(|orch| {
            let mut args = TaskArgs::new();
            args.input(&ta)?.input(&tb)?.output(&to)?;
            orch.submit_next_level(&k, args, CallConfig::default(), 0).map(|_| ())
        })
        .unwrap_err();
    common::assert_err(&err, ErrorKind::WorkerDied, &["chip 0 is dead"]);
    rig.run(|orch| {
        let mut args = TaskArgs::new();
        args.input(&ta)?.input(&tb)?.output(&to)?;
        orch.submit_next_level(&k, args, CallConfig::default(), 1).map(|_| ())
    })
    .unwrap();
    assert!(!process_exists(pid), "the killed chip was reaped");
}
