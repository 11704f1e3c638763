//! Errors that name the real cause, each met as a new user would meet it: a placement the
//! Worker has no worker for, a chip id out of range, device memory exhausted, task arguments
//! too big for a worker's mailbox, a host buffer named in a Worker that did not create it, an
//! orchestration callable placed on a chip, overlapping tensors of a named buffer, a chip or
//! nested Worker that fails to start, and a task whose arguments do not match the parameters
//! its kernel's OpenCL C source declares (refused at submit, on any chip).

mod common;

use common::{Rig, expect_err, isolated_test, noop, vadd};
use simpler::{
    DataType, ErrorKind, HostFn, Orchestrator, TaskArgs, Worker, callable, chip::CallConfig, chip::ChipFn,
    chip::KernelSource, dsl::In, dsl::InOut, dsl::Out, dsl::TensorOf, dsl::chip, dsl::sub, status::Level,
    task_graph,
};

task_graph! {
    /// Copies on a chip: a graph a user may try to place on a chip of an L3 Worker.
    fn copy_graph(a: In<f32>, out: Out<f32>) {
        copy_kernel(a, &mut out).on(chip(0));
    }
}

/// `out = a` on a SUB worker.
#[callable(sub)]
fn copy_host(a: In<f32>, mut out: Out<f32>) {
    out.copy_from_slice(&a);
}

/// `out = a` on one chip core.
#[callable(chip)]
fn copy_kernel(a: In<f32>, mut out: Out<f32>) {
    out.copy_from_slice(&a);
}

fn f32s(w: &Worker, n: usize) -> (simpler::Buffer, TensorOf<f32>) {
    let b = w.create_buffer(n * 4).unwrap();
    let t = TensorOf::<f32>::new(b.tensor(&[n as u32], DataType::Float32).unwrap()).unwrap();
    (b, t)
}

// ------------------------------------------------------------------------------- placements

#[isolated_test]
fn a_sub_call_on_a_worker_without_sub_workers_names_the_builder_call() {
    let mut rig = Rig::new(Worker::builder().chips(1).chip_memory(1 << 20).chip_cores(1));
    rig.init();
    let (_a, a) = f32s(&rig, 16);
    let (_b, mut b) = f32s(&rig, 16);
    let err = rig.run(|orch| copy_host::call(&a, &mut b)?.on(orch, sub()).map(|_| ())).unwrap_err();
    assert!(
        err.message().contains("no SUB workers") && err.message().contains("WorkerBuilder::sub_workers"),
        "{err}"
    );
    assert!(!err.message().contains("register it first"), "{err}");
    // The same through the plain API, with a handle the Worker refused to register.
    let h = HostFn::new("h", noop).handle();
    let err = rig.run(|orch| orch.submit_sub(&h, TaskArgs::new()).map(|_| ())).unwrap_err();
    assert!(
        err.message().contains("no SUB workers") && err.message().contains("WorkerBuilder::sub_workers"),
        "{err}"
    );
}

#[isolated_test]
fn a_chip_kernel_placed_at_l4_says_chips_are_reached_through_a_nested_worker() {
    let mut l3 = Worker::builder().chips(1).chip_memory(1 << 20).chip_cores(1).build().unwrap();
    l3.register(HostFn::new("noop", noop)).unwrap_err(); // (no SUB workers: refused)
    let mut rig = Rig::new(Worker::builder().level(Level::Network1).sub_workers(1).worker(l3));
    rig.init();
    let (_a, a) = f32s(&rig, 16);
    let (_b, mut b) = f32s(&rig, 16);
    let err = rig.run(|orch| copy_kernel::call(&a, &mut b)?.on(orch, chip(0)).map(|_| ())).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Callable, "{err:?}");
    assert!(!err.message().contains("register it first"), "{err}");
    assert!(err.message().contains("chip callable") && err.message().contains("nested Worker"), "{err}");
    // A chip kernel the L4 Worker never saw (its L3 has chips; an L4 without them alike).
    let k = ChipFn::kernel("k", vadd).handle();
    let err = rig
        .run(|orch| orch.submit_next_level(&k, TaskArgs::new(), CallConfig::default(), 0).map(|_| ()))
        .unwrap_err();
    assert!(!err.message().contains("register it first"), "{err}");
    assert!(err.message().contains("nested Worker"), "{err}");
}

#[isolated_test]
fn a_chip_id_out_of_range_says_chip_and_the_builder_call() {
    let mut rig = Rig::new(Worker::builder().chips(2).chip_memory(1 << 20).chip_cores(1));
    rig.init();
    let (_a, a) = f32s(&rig, 16);
    let (_b, mut b) = f32s(&rig, 16);
    let err = rig.run(|orch| copy_kernel::call(&a, &mut b)?.on(orch, chip(5)).map(|_| ())).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("chip 5")
            && err.message().contains("2 chips")
            && err.message().contains("WorkerBuilder::chips"),
        "{err}"
    );
    assert!(!err.message().contains("NEXT_LEVEL"), "{err}");
}

// --------------------------------------------------------------------------------- methods

/// `err` starts with `method: `, and names `method` only there.
fn names_itself_once(err: &simpler::Error, method: &str) {
    assert!(err.message().starts_with(&format!("{method}: ")), "should start with {method}: {err:?}");
    assert_eq!(err.message().matches(method).count(), 1, "{method} said once: {err:?}");
}

/// A refusal of a `Worker` method starts with the method, once, whichever part of the Worker
/// refused: the Worker itself, its runtime, a chip, the registry.
#[isolated_test]
fn a_worker_method_names_itself_once_at_the_start_of_its_errors() {
    let builder = common::subs(1).chips(1).chip_memory(1 << 20).chip_cores(1);
    let mut rig = Rig::new(builder);
    names_itself_once(&rig.create_buffer(64).unwrap_err(), "Worker.create_buffer"); // before init
    let h = rig.register(HostFn::new("noop", noop)).unwrap();
    rig.init();
    names_itself_once(&rig.create_buffer(1 << 50).unwrap_err(), "Worker.create_buffer");
    let err = rig.alloc_child_tensor(0, &[1 << 20], DataType::Float32).unwrap_err();
    names_itself_once(&err, "Worker.alloc_child_tensor");
    let dev = rig.alloc_child_tensor(0, &[16], DataType::Float32).unwrap();
    let small = rig.create_buffer(4).unwrap(); // the device buffer has 64 bytes
    names_itself_once(&rig.copy_to(&dev, &small).unwrap_err(), "Worker.copy_to");
    names_itself_once(&rig.copy_from(&small, &dev).unwrap_err(), "Worker.copy_from");
    rig.free(&dev).unwrap();
    names_itself_once(&rig.free(&dev).unwrap_err(), "Worker.free");
    let err = rig.replace_worker(simpler::status::WorkerKind::Sub, 0).unwrap_err();
    names_itself_once(&err, "Worker.replace_worker");

    fn other(_: &simpler::HostArgs<'_>) -> simpler::HostResult {
        Err("not noop".into())
    }
    let err = rig.register(HostFn::new("noop", other)).unwrap_err();
    names_itself_once(&err, "Worker.register");
    assert!(err.message().contains("`noop`") && err.message().contains("different function"), "{err}");
    rig.unregister(&h).unwrap();
    names_itself_once(&rig.unregister(&h).unwrap_err(), "Worker.unregister");
}

// ------------------------------------------------------------------------------- resources

#[isolated_test]
fn device_memory_exhausted_is_a_resource_error_naming_chip_memory() {
    let mut rig = Rig::new(Worker::builder().chips(1).chip_memory(1 << 20).chip_cores(1));
    rig.init();
    // An input larger than the chip's memory: the kernel's device copy cannot be made.
    let n = (2 << 20) / 4;
    let (_a, a) = f32s(&rig, n);
    let (_b, mut b) = f32s(&rig, n);
    let err = rig.run(|orch| copy_kernel::call(&a, &mut b)?.on(orch, chip(0)).map(|_| ())).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("chip_memory"), "{err}");
    assert!(err.message().matches("chip 0").count() <= 1, "{err}");
    // Chip memory asked for directly.
    let err = expect_err(
        rig.alloc_child_tensor(0, &[n as u32], DataType::Float32),
        ErrorKind::ResourceExhausted,
        &["chip_memory"],
    );
    assert!(err.message().matches("chip 0").count() <= 1, "{err}");
}

#[isolated_test]
fn task_args_over_the_mailbox_capacity_are_refused_at_submit() {
    let (rig, [h]) = Rig::start(common::subs(1), [("noop", noop)]);
    let buf = rig.create_buffer(4 * 444).unwrap();
    let tensors: Vec<_> = (0..444u64)
        .map(|i| {
            buf.view(simpler::memory::TensorView::new(4 * i, &[1], None, DataType::Float32).unwrap()).unwrap()
        })
        .collect();
    let mut submitted = false;
    let err = rig
        .run(|orch| {
            let mut args = TaskArgs::new();
            for t in &tensors {
                args.input(t)?;
            }
            let r = orch.submit_sub(&h, args);
            submitted = r.is_ok();
            r.map(|_| ())
        })
        .unwrap_err();
    assert!(!submitted, "a task of 444 tensors was accepted at submit: {err}");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err:?}");
    assert!(err.message().contains("444 tensors") && err.message().contains("mailbox"), "{err}");

    let mut submitted = false;
    let err = rig
        .run(|orch| {
            let mut args = TaskArgs::new();
            for i in 0..7976u64 {
                args.scalar(i);
            }
            let r = orch.submit_sub(&h, args);
            submitted = r.is_ok();
            r.map(|_| ())
        })
        .unwrap_err();
    assert!(!submitted, "a task of 7976 scalars was accepted at submit: {err}");
    assert!(err.message().contains("7976 scalars") && err.message().contains("mailbox"), "{err}");

    // The largest that fits still runs.
    rig.run(|orch| {
        let mut args = TaskArgs::new();
        for t in &tensors[..443] {
            args.input(t)?;
        }
        orch.submit_sub(&h, args).map(|_| ())
    })
    .unwrap();
}

// ------------------------------------------------------------------------------- host buffers

/// `h` names tensor 0 of `t` in a run of `w`.
fn run_naming(w: &Worker, h: &simpler::CallableHandle, t: &simpler::Tensor) -> simpler::Result<()> {
    w.run(|orch| {
        let mut args = TaskArgs::new();
        args.input(t)?;
        orch.submit_sub(h, args).map(|_| ())
    })
}

#[isolated_test]
fn a_buffer_belongs_to_its_worker_and_its_bytes_outlive_it() {
    let (rig, [h]) = Rig::start(common::subs(1), [("noop", noop)]);
    let (other, [other_h]) = Rig::start(common::subs(1), [("noop", noop)]);
    let foreign = other.create_buffer(64).unwrap();
    let t = foreign.tensor(&[16], DataType::Float32).unwrap();
    run_naming(&other, &other_h, &t).unwrap(); // its own Worker's runs may name it
    // Another Worker's runs may not.
    let err = run_naming(&rig, &h, &t).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err:?}");
    assert!(err.message().contains("another Worker") && err.message().contains("create_buffer"), "{err}");

    other.close().unwrap();
    // The bytes are the user's: still readable and writable after the Worker closed.
    foreign.write(0, &[2.0f32; 16]).unwrap();
    assert_eq!(foreign.read::<f32>(0, 16).unwrap(), vec![2.0; 16]);
    // But no run names it: its Worker is closed, and it is still not the other's.
    expect_err(run_naming(&other, &other_h, &t), ErrorKind::InvalidState, &["closed"]);
    expect_err(run_naming(&rig, &h, &t), ErrorKind::InvalidArgument, &["another Worker"]);
    drop(t);
    drop(foreign);
}

#[isolated_test]
fn a_host_buffer_larger_than_memory_can_hold_is_refused_at_once() {
    let mut rig = Rig::new(Worker::builder().sub_workers(1));
    rig.init();
    // A petabyte: more than this machine can back. Refused when asked for, not created
    // sparsely and left to crash the first process that touches a page past the memory left.
    let err = expect_err(
        rig.create_buffer(1 << 50),
        ErrorKind::ResourceExhausted,
        &["bytes asked for", "bytes of memory are left"],
    );
    assert!(err.message().contains(&(1u64 << 50).to_string()), "names the size asked for: {err}");
    assert!(common::leftover_shm().is_empty(), "nothing was created");
    // A buffer that fits is created as usual.
    rig.create_buffer(4096).unwrap();
}

/// The bytes of memory a host buffer may still take, as the refusal of a petabyte says.
fn memory_left(rig: &Worker) -> u64 {
    let err =
        expect_err(rig.create_buffer(1 << 50), ErrorKind::ResourceExhausted, &["bytes of memory are left"]);
    let msg = err.message();
    let before = msg.split(" bytes of memory are left").next().unwrap();
    before.rsplit(' ').next().unwrap().parse().unwrap_or_else(|_| panic!("no figure in {msg}"))
}

#[isolated_test]
fn host_buffers_together_larger_than_memory_can_hold_are_refused() {
    let mut rig = Rig::new(Worker::builder().sub_workers(1));
    rig.init();
    // Each buffer is backed lazily, so none of these takes memory until written (and none is):
    // each fits what is left alone, but a third would commit more than the machine can back,
    // and writing them all would get a worker OOM-killed. 40% each leaves a fifth of the
    // memory left as margin both ways, for other programs of the machine.
    let left = memory_left(&rig);
    let part = (left / 10 * 4) as usize & !4095;
    let a = rig.create_buffer(part).unwrap();
    let b = rig.create_buffer(part).unwrap();
    let err = expect_err(
        rig.create_buffer(part),
        ErrorKind::ResourceExhausted,
        &[
            &format!("{part} bytes asked for"),
            "2 live host buffers",
            &format!("{} bytes", 2 * part),
            "not yet backed",
            "drop buffers",
        ],
    );
    assert!(common::leftover_shm().len() == 2, "the refused one was not created: {err}");
    // Dropping one makes room again.
    drop(a);
    let c = rig.create_buffer(part).unwrap();
    drop((b, c));
}

#[isolated_test]
fn running_out_of_file_descriptors_names_the_limit() {
    // Each live host buffer holds one descriptor of its creator; with the hard limit low, the
    // soft one cannot be raised past it.
    common::limit_fds(96);
    let mut rig = Rig::new(Worker::builder().sub_workers(1));
    rig.init();
    let mut live = Vec::new();
    let err = loop {
        match rig.create_buffer(4096) {
            Ok(buf) => live.push(buf),
            Err(e) => break e,
        }
        assert!(live.len() < 96, "more buffers than descriptors");
    };
    assert!(!live.is_empty(), "some buffers fit: {err}");
    common::assert_err(&err, ErrorKind::ResourceExhausted, &["RLIMIT_NOFILE", "96", "drop buffers"]);
    // Dropping one gives its descriptor back.
    live.pop();
    let again = rig.create_buffer(4096).unwrap();
    drop((again, live));
}

#[isolated_test]
fn an_orchestration_callable_placed_on_a_chip_says_how_to_run_it() {
    let mut rig = Rig::new(Worker::builder().chips(1).chip_memory(1 << 20).chip_cores(1));
    rig.init();
    let (_a, a) = f32s(&rig, 16);
    let (_b, mut b) = f32s(&rig, 16);
    // `chip(0)` would not compile; `worker(0)` (a Worker one level down, at L4) compiles.
    let err = rig
        .run(|orch| copy_graph::call(&a, &mut b)?.on(orch, simpler::dsl::worker(0)).map(|_| ()))
        .unwrap_err();
    expect_err(
        Err::<(), _>(err),
        ErrorKind::Callable,
        &["copy_graph", "is an orchestration callable", "chips run chip callables", ".run(&worker)"],
    );
    // Run as a run of the Worker, it works.
    copy_graph::call(&a, &mut b).unwrap().run(&rig).unwrap();
}

#[isolated_test]
fn overlapping_written_tensors_name_the_buffer_by_its_name() {
    let (rig, [h]) = Rig::start(Worker::builder().sub_workers(1), [("noop", noop)]);
    let buf = rig.create_buffer(64).unwrap();
    buf.set_name("weights").unwrap();
    let t = buf.tensor(&[16], DataType::Float32).unwrap();
    let err = rig
        .run(|orch| {
            let mut a = TaskArgs::new();
            a.output(&t)?.output(&t)?;
            orch.submit_sub(&h, a).map(|_| ())
        })
        .unwrap_err();
    assert!(err.message().contains("overlap in buffer `weights`"), "{err}");
}

// ------------------------------------------------------------------------------- startup

/// Chip 0's backend factory fails for it.
fn no_device_0(spec: &simpler::chip::ChipSpec) -> simpler::Result<Box<dyn simpler::chip::ChipBackend>> {
    if spec.chip_id() == 0 {
        return Err(simpler::Error::new(ErrorKind::InvalidArgument, "the device is not there"));
    }
    Ok(Box::new(simpler::chip::SimChip::new(spec.memory_bytes(), spec.cores())?))
}

/// A chip that cannot start fails `init` with an error that names it once, then says what
/// failed: its backend (the factory's own message), or its memory; so does a nested Worker.
#[isolated_test]
fn a_child_that_fails_to_start_is_named_once() {
    let cases = [
        (
            Worker::builder().chips(2).chip_memory(1 << 20).chip_cores(1).chip_backend(no_device_0),
            "making its backend",
        ),
        (Worker::builder().chips(1).chip_memory(0).chip_cores(1), "memory size"),
    ];
    for (builder, what) in cases {
        let mut w = builder.build().unwrap();
        let err = w.init().unwrap_err();
        let msg = err.message();
        assert!(msg.contains("chip 0 (process") && msg.contains("failed to start"), "{err}");
        assert!(msg.contains(what), "{err}");
        assert_eq!(msg.matches("chip 0").count(), 1, "{err}");
        assert!(common::leftover_shm().is_empty());
    }
    // One level up: the nested Worker is named once too (its chip's failure follows).
    let mut l3 = Worker::builder()
        .chips(1)
        .chip_memory(1 << 20)
        .chip_cores(1)
        .chip_backend(no_device_0)
        .build()
        .unwrap();
    l3.register_chip(ChipFn::kernel("copy", |_| Ok(()))).unwrap();
    let mut l4 = Worker::builder().level(Level::Network1).worker(l3).build().unwrap();
    let err = l4.init().unwrap_err();
    let msg = err.message();
    assert!(msg.contains("worker 0 (process") && msg.contains("making its backend"), "{err}");
    assert_eq!(msg.matches("worker 0").count(), 1, "{err}");
    assert_eq!(msg.matches("chip 0").count(), 1, "{err}");
}

// ------------------------------------------------------------------------- kernel arguments

/// The OpenCL C of `vadd` (the Rust body in `common`): three `float` tensors.
const VADD_CL: &str = "
__kernel void vadd(__global const float* a, __global const float* b, __global float* out) {
    size_t i = get_global_id(0);
    out[i] = a[i] + b[i];
}";

/// `vadd` with both bodies: a simulated chip runs the Rust one, an OpenCL chip the source.
fn vadd_both() -> ChipFn {
    ChipFn::kernel("vadd", vadd).with_source(KernelSource::opencl(VADD_CL, "vadd")).unwrap()
}

/// `(a, b, out)` over `n` elements of `dtype` each, `a` and `b` read, `out` written, then
/// `scalars` scalars.
fn vadd_args(t: &[simpler::Tensor], scalars: u64) -> TaskArgs {
    let mut args = TaskArgs::new();
    for (i, x) in t.iter().enumerate() {
        if i < 2 {
            args.input(x).unwrap()
        } else {
            args.output(x).unwrap()
        };
    }
    for s in 0..scalars {
        args.scalar(s);
    }
    args
}

const DECLARED: &str = "`vadd(__global const float* a, __global const float* b, __global float* out)`";

/// One program runs on either chip, so a simulated chip (which would run the Rust body, and
/// happily ignore an extra scalar) refuses what an OpenCL one could not launch, before anything
/// runs: on an L2 Worker at `run_callable`.
#[isolated_test]
fn an_l2_task_that_does_not_match_its_kernels_opencl_parameters_is_refused_before_it_runs() {
    let mut l2 = Worker::builder().level(Level::Chip).chip_memory(1 << 20).build().unwrap();
    let k = l2.register_chip(vadd_both()).unwrap();
    l2.init().unwrap();
    let bufs: Vec<_> = (0..3).map(|_| l2.create_buffer(64).unwrap()).collect();
    bufs[0].write(0, &[1.0f32; 16]).unwrap();
    bufs[1].write(0, &[2.0f32; 16]).unwrap();
    let f32s: Vec<_> = bufs.iter().map(|b| b.tensor(&[16], DataType::Float32).unwrap()).collect();
    let run = |args| l2.run_callable(&k, args, CallConfig::default());

    expect_err(
        run(vadd_args(&f32s[..2], 0)),
        ErrorKind::InvalidArgument,
        &[
            "kernel `vadd` (sha256:",
            "the task passed 2 tensors (f32, f32) and 0 scalars",
            DECLARED,
            "3 tensors (f32, f32, f32), then 0 scalars",
        ],
    );
    expect_err(
        run(vadd_args(&f32s, 1)),
        ErrorKind::InvalidArgument,
        &["3 tensors (f32, f32, f32) and 1 scalar,", DECLARED],
    );
    let ints = bufs[2].tensor(&[16], DataType::Int32).unwrap();
    expect_err(
        run(vadd_args(&[f32s[0].clone(), f32s[1].clone(), ints], 0)),
        ErrorKind::InvalidArgument,
        &["kernel `vadd`", "tensor 2 holds i32 elements", "whose tensor 2 (`__global float* out`) holds f32"],
    );
    assert_eq!(bufs[2].read::<f32>(0, 16).unwrap(), [0.0; 16], "nothing ran");
    run(vadd_args(&f32s, 0)).unwrap();
    assert_eq!(bufs[2].read::<f32>(0, 16).unwrap(), [3.0; 16]);
    drop((f32s, bufs));
    l2.close().unwrap();
}

/// Submits `vadd` on core 0 with two of its three tensors (a chip orchestration).
fn vadd_short(orch: &mut Orchestrator<'_>, args: &TaskArgs, cfg: &CallConfig) -> simpler::Result<()> {
    let mut short = TaskArgs::new();
    short.input(args.tensor(0).unwrap())?.output(args.tensor(1).unwrap())?;
    orch.submit_next_level(&vadd_both().handle(), short, cfg.clone(), 0).map(|_| ())
}

/// On an L3 Worker the parent, which never loads OpenCL, refuses the task at
/// `submit_next_level` and `submit_next_level_group`; a chip orchestration's submit to a core is
/// refused the same way.
#[isolated_test]
fn an_l3_task_that_does_not_match_its_kernels_opencl_parameters_is_refused_at_submit() {
    let mut rig = Rig::new(Worker::builder().chips(2).chip_memory(1 << 20).chip_cores(1));
    let k = rig.register_chip(vadd_both()).unwrap();
    let orch = rig.register_chip(ChipFn::orchestration("vadd_short", vadd_short)).unwrap();
    rig.init();
    let bufs: Vec<_> = (0..3).map(|_| rig.create_buffer(64).unwrap()).collect();
    let f32s: Vec<_> = bufs.iter().map(|b| b.tensor(&[16], DataType::Float32).unwrap()).collect();

    let mut submitted = false;
    let err = rig
        .run(|o| {
            let r = o.submit_next_level(&k, vadd_args(&f32s[..2], 0), CallConfig::default(), 0);
            submitted = r.is_ok();
            r.map(|_| ())
        })
        .unwrap_err();
    assert!(!submitted, "a task of 2 tensors for a kernel of 3 was accepted at submit: {err}");
    common::assert_err(
        &err,
        ErrorKind::InvalidArgument,
        &["kernel `vadd`", "the task passed 2 tensors", DECLARED],
    );

    let err = rig
        .run(|o| {
            let members = vec![vadd_args(&f32s, 0), vadd_args(&f32s, 2)];
            let r = o.submit_next_level_group(&k, members, CallConfig::default(), &[0, 1]);
            submitted = r.is_ok();
            r.map(|_| ())
        })
        .unwrap_err();
    assert!(!submitted, "a group with a mismatched member was accepted at submit: {err}");
    common::assert_err(
        &err,
        ErrorKind::InvalidArgument,
        &["kernel `vadd`", "3 tensors (f32, f32, f32) and 2 scalars"],
    );

    let err = rig
        .run(|o| {
            let mut args = TaskArgs::new();
            args.input(&f32s[0])?.output(&f32s[2])?;
            o.submit_next_level(&orch, args, CallConfig::default(), 1).map(|_| ())
        })
        .unwrap_err();
    assert!(
        err.message().contains("kernel `vadd`") && err.message().contains("the task passed 2 tensors"),
        "{err}"
    );

    // A matching task runs.
    bufs[0].write(0, &[1.0f32; 16]).unwrap();
    bufs[1].write(0, &[0.5f32; 16]).unwrap();
    rig.run(|o| o.submit_next_level(&k, vadd_args(&f32s, 0), CallConfig::default(), 1).map(|_| ())).unwrap();
    assert_eq!(bufs[2].read::<f32>(0, 16).unwrap(), [1.5; 16]);
}

/// `saxpy`'s OpenCL C (`kernels/saxpy.cl`: `x`, `y`, `float a`, `int plus`) given to a Rust
/// body that forgot `plus`: the typed call is refused, naming both.
#[callable(chip, opencl = "kernels/saxpy.cl", entry = "saxpy")]
fn saxpy_without_plus(x: In<f32>, mut y: InOut<f32>, a: f32) {
    for (yi, xi) in y.iter_mut().zip(x.iter()) {
        *yi += a * xi;
    }
}

#[isolated_test]
fn a_typed_call_that_does_not_match_its_kernels_opencl_source_is_refused() {
    let mut l2 = Worker::builder().level(Level::Chip).chip_memory(1 << 20).build().unwrap();
    l2.init().unwrap();
    let (_bx, x) = f32s(&l2, 16);
    let (_by, mut y) = f32s(&l2, 16);
    expect_err(
        saxpy_without_plus::call(&x, &mut y, 2.0).unwrap().run(&l2),
        ErrorKind::InvalidArgument,
        &[
            "kernel `saxpy_without_plus`",
            "the task passed 2 tensors (f32, f32) and 1 scalar,",
            "`saxpy(__global const float* x, __global float* y, float a, int plus)`",
            "then 2 scalars",
        ],
    );
    drop((x, y));
    l2.close().unwrap();
}
