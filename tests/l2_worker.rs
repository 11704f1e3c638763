//! L2 Workers: one simulated chip in the test process, running chip callables directly.

mod common;

use common::isolated_test;

use simpler::{
    DataType, ErrorKind, HostArgs, HostResult, TaskArgs, chip::CallConfig, chip::ChipFn, status::Level,
};

fn bad(_: &HostArgs<'_>) -> HostResult {
    Err("bad input".into())
}

#[isolated_test]
fn a_kernel_runs_alone_on_an_l2_worker() {
    let mut chip = common::builder().level(Level::Chip).chip_memory(16 << 20).chip_cores(2).build().unwrap();
    let add = chip.register_chip(common::vadd_kernel()).unwrap();
    chip.init().unwrap();
    assert!(chip.child_pids().is_empty(), "an L2 Worker forks nothing");
    let (a, b, out) =
        (chip.create_buffer(64).unwrap(), chip.create_buffer(64).unwrap(), chip.create_buffer(64).unwrap());
    a.write(0, &[1.0f32; 16]).unwrap();
    b.write(0, &[2.5f32; 16]).unwrap();
    let t = |x: &simpler::Buffer| x.tensor(&[16], DataType::Float32).unwrap();
    let mut args = TaskArgs::new();
    args.input(&t(&a)).unwrap().input(&t(&b)).unwrap().output(&t(&out)).unwrap();
    chip.run_callable(&add, args, CallConfig::default()).unwrap();
    assert_eq!(out.read::<f32>(0, 16).unwrap(), vec![3.5f32; 16]);

    // Device memory round trip on the same chip.
    let dev = chip.alloc_child_tensor(0, &[16], DataType::Float32).unwrap();
    chip.copy_to(&dev, &a).unwrap();
    // One device tensor both read and written by a kernel: the chip refuses the aliasing.
    let mut args = TaskArgs::new();
    args.input(&t(&dev)).unwrap().input(&t(&b)).unwrap().output(&t(&dev)).unwrap();
    let err = chip.run_callable(&add, args, CallConfig::default()).unwrap_err();
    assert!(err.message().contains("overlap"), "{err}");
    let mut args2 = TaskArgs::new();
    args2.input(&t(&dev)).unwrap().input(&t(&b)).unwrap().output(&t(&out)).unwrap();
    chip.run_callable(&add, args2, CallConfig::default()).unwrap();
    assert_eq!(out.read::<f32>(0, 16).unwrap(), vec![3.5f32; 16]);
    chip.free(&dev).unwrap();
    common::expect_err(chip.free(&dev), ErrorKind::InvalidState, &["already freed"]);
    drop((a, b, out));
    chip.close().unwrap();
    assert!(common::leftover_shm().is_empty(), "host buffers are unlinked when dropped");
}

#[isolated_test]
fn a_failing_kernel_on_l2_reports_and_the_chip_stays_usable() {
    if common::needs_rust_kernels() {
        return;
    }
    let mut chip = common::builder().level(Level::Chip).chip_memory(1 << 20).chip_cores(1).build().unwrap();
    let bad = chip.register_chip(ChipFn::kernel("bad", bad)).unwrap();
    chip.init().unwrap();
    let err = chip.run_callable(&bad, TaskArgs::new(), CallConfig::default()).unwrap_err();
    common::assert_err(&err, ErrorKind::TaskFailed, &["bad", "bad input"]);
    // Registered after init, it is installed at once.
    let add = chip.register_chip(common::vadd_kernel()).unwrap();
    let x = chip.create_buffer(4).unwrap();
    let t = x.tensor(&[1], DataType::Float32).unwrap();
    let mut args = TaskArgs::new();
    args.input(&t).unwrap().input(&t).unwrap();
    let y = chip.create_buffer(4).unwrap();
    args.output(&y.tensor(&[1], DataType::Float32).unwrap()).unwrap();
    chip.run_callable(&add, args, CallConfig::default()).unwrap();
    common::expect_err(chip.run(|_| Ok(())), ErrorKind::InvalidState, &["run_callable"]);
    chip.close().unwrap();
}

#[isolated_test]
fn another_workers_buffers_are_refused_by_copies_and_free() {
    let mut a = common::builder().level(Level::Chip).chip_memory(1 << 20).chip_cores(1).build().unwrap();
    let mut b = common::builder().level(Level::Chip).chip_memory(1 << 20).chip_cores(1).build().unwrap();
    a.init().unwrap();
    b.init().unwrap();
    let host = a.create_buffer(64).unwrap();
    host.write(0, &[7.0f32; 16]).unwrap();
    let dev_a = a.alloc_child_tensor(0, &[16], DataType::Float32).unwrap();
    a.copy_to(&dev_a, &host).unwrap();
    // B has a device buffer of its own at the same offset of its chip's memory.
    let dev_b = b.alloc_child_tensor(0, &[16], DataType::Float32).unwrap();
    let out = b.create_buffer(64).unwrap();
    common::expect_err(
        b.copy_from(&out, &dev_a),
        ErrorKind::InvalidArgument,
        &["copy_from", "another Worker"],
    );
    common::expect_err(b.copy_to(&dev_a, &out), ErrorKind::InvalidArgument, &["copy_to", "another Worker"]);
    common::expect_err(b.free(&dev_a), ErrorKind::InvalidArgument, &["free", "another Worker"]);
    // A's host buffer with B's own device buffer: refused on the host side.
    common::expect_err(
        b.copy_to(&dev_b, &host),
        ErrorKind::InvalidArgument,
        &["copy_to", "host buffer", "another Worker"],
    );
    common::expect_err(
        b.copy_from(&host, &dev_b),
        ErrorKind::InvalidArgument,
        &["copy_from", "host buffer", "another Worker"],
    );
    // Nothing of either Worker was touched: A's buffer still holds its data, B's is still live.
    a.copy_from(&host, &dev_a).unwrap();
    assert_eq!(host.read::<f32>(0, 16).unwrap(), vec![7.0f32; 16]);
    b.free(&dev_b).unwrap();
    a.free(&dev_a).unwrap();
    common::expect_err(a.copy_to(&dev_a, &host), ErrorKind::InvalidState, &["already freed"]);
    drop((host, out));
    a.close().unwrap();
    b.close().unwrap();
}
