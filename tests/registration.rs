//! Registering callables: before and after `init`, closures, handles of other Workers,
//! unregistering; one function per identity in every registration path; the same rules before
//! and after `init`; post-init registration all-or-nothing across the targets.

mod common;

use common::*;
use simpler::{
    CallableHandle, DataType, ErrorKind, HostArgs, HostFn, HostResult, OrchFn, Orchestrator, StartMethod,
    TaskArgs, Worker, chip::CallConfig, chip::ChipFn, memory::TensorView, status::Level,
};

/// Group of `n` `member` tasks; member `i` writes its worker index into `who[i]`.
fn group_args(scratch: &simpler::Buffer, who: &simpler::Buffer, n: usize) -> Vec<TaskArgs> {
    (0..n)
        .map(|i| {
            let slot =
                who.view(TensorView::new(4 * i as u64, &[1], None, DataType::Uint32).unwrap()).unwrap();
            let mut a = TaskArgs::new();
            a.untracked(&words_of(scratch)).unwrap().output(&slot).unwrap();
            a.scalar(n as u64).scalar(5_000).scalar(0);
            a
        })
        .collect()
}

#[isolated_test]
fn fn_registered_after_init_runs_on_every_sub_worker() {
    let mut rig = Rig::new(subs(3));
    rig.init();
    let late = rig.register(HostFn::new("late_member", member)).expect("fn pointers register after init");
    let scratch = u32_buffer(&rig, 1);
    let who = u32_buffer(&rig, 3);
    who.write(0, &[u32::MAX; 3]).unwrap();
    rig.run(|orch| orch.submit_sub_group(&late, group_args(&scratch, &who, 3)).map(|_| ()))
        .expect("every SUB worker knows the late function");
    let mut w = read_u32(&who, 0, 3);
    w.sort_unstable();
    assert_eq!(w, vec![0, 1, 2]);
}

#[isolated_test]
fn closure_after_init_is_refused() {
    let mut rig = Rig::new(subs(1).start_method(StartMethod::Fork));
    rig.init();
    let k = 5u64;
    let f = HostFn::closure("late_closure", move |args: &HostArgs<'_>| -> HostResult {
        args.output::<u64>(0)?.fill(k);
        Ok(())
    });
    assert!(f.is_closure());
    let err = rig.register(f).expect_err("closures cannot be sent to live workers");
    assert_err(&err, ErrorKind::Callable, &["late_closure", "closure", "before init"]);
}

#[isolated_test]
fn closure_registered_before_init_runs_with_its_captures() {
    let base = 1000 + u64::from(std::process::id() % 7); // a value only known at run time
    let mut rig = Rig::new(subs(2).start_method(StartMethod::Fork));
    let f = rig
        .register(HostFn::closure("offset_by_worker", move |args: &HostArgs<'_>| -> HostResult {
            args.output::<u64>(0)?.fill(base + u64::from(args.worker_index()));
            Ok(())
        }))
        .unwrap();
    rig.init();
    let out = u64_buffer(&rig, 2);
    rig.run(|orch| {
        let members = (0..2)
            .map(|i| {
                let mut a = TaskArgs::new();
                a.output(&u64s(&out, i, 1))?;
                Ok(a)
            })
            .collect::<simpler::Result<Vec<_>>>()?;
        orch.submit_sub_group(&f, members).map(|_| ())
    })
    .unwrap();
    let mut got = read_u64(&out, 0, 2);
    got.sort_unstable();
    assert_eq!(got, vec![base, base + 1], "both workers ran the closure with its captured value");
}

#[isolated_test]
fn handle_of_another_worker_is_rejected() {
    let mut other = Rig::new(subs(1));
    let foreign = other.register(HostFn::new("only_on_other", fill)).unwrap();
    let (rig, [_fill]) = Rig::start(subs(1), [("fill", fill)]);
    rig.run(|orch| {
        let err = orch.submit_sub(&foreign, TaskArgs::new()).expect_err("unknown here");
        assert_err(&err, ErrorKind::Callable, &["only_on_other", "not registered"]);
        let err = orch.submit_sub_group(&foreign, vec![TaskArgs::new()]).expect_err("unknown here");
        assert_err(&err, ErrorKind::Callable, &["only_on_other", "not registered"]);
        Ok(())
    })
    .unwrap();
}

/// Runs one `fill` task through `f` writing `value` to `out[0]`.
fn run_fill(rig: &Rig, f: &CallableHandle, out: &simpler::Buffer, value: u64) -> simpler::Result<()> {
    rig.run(|orch| {
        let mut t = TaskArgs::new();
        t.output(&u64s(out, 0, 1))?.scalar(value);
        orch.submit_sub(f, t).map(|_| ())
    })
}

#[isolated_test]
fn same_function_registers_to_the_same_handle_and_counts_references() {
    let mut rig = Rig::new(subs(1));
    let a = rig.register(HostFn::new("fill", fill)).unwrap();
    let b = rig.register(HostFn::new("fill", fill)).unwrap();
    assert_eq!(a.digest(), b.digest());
    let other_name = rig.register(HostFn::new("fill2", fill)).unwrap();
    assert_ne!(a.digest(), other_name.digest(), "the name is part of the identity");
    rig.init();
    let out = u64_buffer(&rig, 1);
    run_fill(&rig, &a, &out, 1).unwrap();
    assert_eq!(read_u64(&out, 0, 1), vec![1]);

    rig.unregister(&a).unwrap(); // one of two references
    run_fill(&rig, &a, &out, 2).expect("still registered once");
    assert_eq!(read_u64(&out, 0, 1), vec![2]);
    rig.unregister(&b).unwrap();
    expect_err(run_fill(&rig, &a, &out, 3), ErrorKind::Callable, &["fill", "not registered"]);
    assert_eq!(read_u64(&out, 0, 1), vec![2]);
    expect_err(rig.unregister(&a), ErrorKind::Callable, &["fill", "not registered"]);
    run_fill(&rig, &other_name, &out, 4).expect("the other registration is untouched");
    assert_eq!(read_u64(&out, 0, 1), vec![4]);
}

#[isolated_test]
fn registering_needs_a_live_worker_with_sub_workers() {
    let mut none = Rig::new(Worker::builder());
    none.init();
    expect_err(
        none.register(HostFn::new("fill", fill)),
        ErrorKind::InvalidArgument,
        &["fill", "no SUB workers"],
    );
    none.close().unwrap();
    expect_err(none.register(HostFn::new("fill", fill)), ErrorKind::InvalidState, &["register", "closed"]);
    let h = HostFn::new("fill", fill);
    let mut other = Rig::new(subs(1));
    let handle = other.register(h).unwrap();
    expect_err(none.unregister(&handle), ErrorKind::InvalidState, &["unregister", "closed"]);
}

#[isolated_test]
fn registering_while_a_run_is_in_flight() {
    // The new function reaches the worker between two tasks of the running run.
    let (mut rig, [exclusive]) = Rig::start(subs(1), [("exclusive", exclusive)]);
    let scratch = u32_buffer(&rig, 2);
    let run = rig
        .submit(|orch| {
            for _ in 0..3 {
                let mut a = TaskArgs::new();
                a.untracked(&words_of(&scratch))?.scalar(30_000);
                orch.submit_sub(&exclusive, a)?;
            }
            Ok(())
        })
        .unwrap();
    wait_for("the first task to start", std::time::Duration::from_secs(10), || {
        read_u32(&scratch, 0, 1)[0] == 1
    });
    let late = rig.register(HostFn::new("fill", fill)).expect("register while a task runs");
    let out = u64_buffer(&rig, 1);
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.output(&u64s(&out, 0, 1))?.scalar(3);
        orch.submit_sub(&late, a).map(|_| ())
    })
    .unwrap();
    run.wait().expect("the run in flight was not disturbed");
    assert!(run.is_done());
    assert_eq!(read_u32(&scratch, 0, 2), vec![0, 1]);
    assert_eq!(read_u64(&out, 0, 1), vec![3]);
}

/// A closure host function of one type whatever `k` is: `t0[..] = k`.
fn constant(k: u64) -> HostFn {
    HostFn::closure("constant", move |args: &HostArgs<'_>| -> HostResult {
        args.output::<u64>(0)?.fill(k);
        Ok(())
    })
}

#[isolated_test]
fn closures_that_differ_only_in_their_captures_are_not_confused() {
    // Two closures made by one factory under one name: the same type, different state. The
    // second registration must either get a callable that runs *its* closure or be refused
    // clearly; silently running the first closure for both would compute wrong results.
    let mut rig = Rig::new(subs(1).start_method(StartMethod::Fork));
    let two = rig.register(constant(2)).unwrap();
    let second = rig.register(constant(3));
    rig.init();
    let out = u64_buffer(&rig, 2);
    let three = match second {
        Err(e) => {
            assert_err(&e, ErrorKind::Callable, &["constant"]);
            return;
        }
        Ok(h) => h,
    };
    rig.run(|orch| {
        for (i, h) in [&two, &three].into_iter().enumerate() {
            let mut a = TaskArgs::new();
            a.output(&u64s(&out, i, 1))?;
            orch.submit_sub(h, a)?;
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(read_u64(&out, 0, 2), vec![2, 3], "each handle runs the closure it was registered with");
}

// ------------------------------------------------------------- one function per identity

/// Asserts that `err` refuses a second function under one identity and names both registrations
/// by where their callables were made (`file:line` of this file).
#[track_caller]
fn assert_names_both(err: &simpler::Error, name: &str, first_line: u32, second_line: u32) {
    let here = file!().rsplit('/').next().unwrap();
    assert_err(
        err,
        ErrorKind::Callable,
        &[
            &format!("`{name}`"),
            "different function",
            &format!("{here}:{first_line}:"),
            &format!("{here}:{second_line}:"),
        ],
    );
}

#[isolated_test]
fn a_different_host_fn_under_a_registered_name_is_refused_before_and_after_init() {
    let mut rig = Rig::new(subs(1));
    let (first, first_line) = (HostFn::new("f", fill), line!());
    let h = rig.register(first).unwrap();
    let (other, other_line) = (HostFn::new("f", noop), line!());
    assert_eq!(other.handle(), h, "the plain-API identity is the kind and the name");
    let err = rig.register(other.clone()).expect_err("a second function under `f` before init");
    assert_names_both(&err, "f", first_line, other_line);
    rig.init();
    let err = rig.register(other).expect_err("a second function under `f` after init");
    assert_names_both(&err, "f", first_line, other_line);
    // The same function again is a second reference, wherever its HostFn was made.
    assert_eq!(rig.register(HostFn::new("f", fill)).unwrap(), h);
    let out = u64_buffer(&rig, 1);
    run_fill(&rig, &h, &out, 7).expect("`f` still runs the first function");
    assert_eq!(read_u64(&out, 0, 1), vec![7]);
    rig.unregister(&h).unwrap();
    rig.unregister(&h).unwrap();
    expect_err(rig.unregister(&h), ErrorKind::Callable, &["not registered"]);
}

/// `out[i] = a[i] - b[i]`: a kernel with `vadd`'s signature.
fn vsub(args: &HostArgs<'_>) -> HostResult {
    let (a, b, out) = (args.input::<f32>(0)?, args.input::<f32>(1)?, args.output::<f32>(2)?);
    for i in 0..out.len() {
        out[i] = a[i] - b[i];
    }
    Ok(())
}

fn l2(cores: usize) -> Worker {
    Worker::builder().level(Level::Chip).chip_memory(16 << 20).chip_cores(cores).build().unwrap()
}

/// Runs `k` (a vadd-shaped kernel) on an L2 Worker over `[2.0; 4]` and `[0.5; 4]`.
fn run_l2(chip: &Worker, k: &CallableHandle) -> simpler::Result<Vec<f32>> {
    let (a, b, out) = (chip.create_buffer(16)?, chip.create_buffer(16)?, chip.create_buffer(16)?);
    a.write(0, &[2.0f32; 4])?;
    b.write(0, &[0.5f32; 4])?;
    let t = |x: &simpler::Buffer| x.tensor(&[4], DataType::Float32);
    let mut args = TaskArgs::new();
    args.input(&t(&a)?)?.input(&t(&b)?)?.output(&t(&out)?)?;
    chip.run_callable(k, args, CallConfig::default())?;
    out.read::<f32>(0, 4)
}

#[isolated_test]
fn a_different_chip_kernel_under_a_registered_name_is_refused_before_and_after_init() {
    let mut chip = l2(1);
    let (first, first_line) = (ChipFn::kernel("k", vadd), line!());
    let k = chip.register_chip(first).unwrap();
    let (other, other_line) = (ChipFn::kernel("k", vsub), line!());
    let err = chip.register_chip(other.clone()).expect_err("before init");
    assert_names_both(&err, "k", first_line, other_line);
    chip.init().unwrap();
    let err = chip.register_chip(other).expect_err("after init");
    assert_names_both(&err, "k", first_line, other_line);
    assert_eq!(run_l2(&chip, &k).unwrap(), vec![2.5f32; 4], "`k` still runs vadd");
    chip.close().unwrap();

    // On an L3 Worker the chips (forked) refuse it too, before and after init.
    let mut rig = Rig::new(Worker::builder().chips(2).chip_memory(16 << 20).chip_cores(1));
    let (first, first_line) = (ChipFn::kernel("k", vadd), line!());
    rig.register_chip(first).unwrap();
    let plan = ChipFn::orchestration("k", chip_plan);
    assert_ne!(plan.handle(), ChipFn::kernel("k", vadd).handle(), "the sub-kind is part of the identity");
    rig.register_chip(plan).unwrap();
    let (other, other_line) = (ChipFn::kernel("k", vsub), line!());
    let err = rig.register_chip(other.clone()).expect_err("before init");
    assert_names_both(&err, "k", first_line, other_line);
    rig.init();
    let err = rig.register_chip(other).expect_err("after init");
    assert_names_both(&err, "k", first_line, other_line);
}

/// A chip orchestration that submits nothing.
fn chip_plan(_: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    Ok(())
}

/// An L3 orchestration that submits nothing.
fn l3_nothing(_: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    Ok(())
}

/// An L3 orchestration that fails.
fn l3_refuse(_: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    Err(simpler::Error::new(ErrorKind::InvalidArgument, "l3_refuse says no"))
}

#[isolated_test]
fn a_different_orch_fn_under_a_registered_name_is_refused_before_and_after_init() {
    let mut rig = Rig::new(Worker::builder().level(Level::Network1).worker(subs(1).build().unwrap()));
    let (first, first_line) = (OrchFn::new("o", l3_nothing), line!());
    let o = rig.register_orch(first).unwrap();
    let (other, other_line) = (OrchFn::new("o", l3_refuse), line!());
    let err = rig.register_orch(other.clone()).expect_err("before init");
    assert_names_both(&err, "o", first_line, other_line);
    rig.init();
    let err = rig.register_orch(other).expect_err("after init");
    assert_names_both(&err, "o", first_line, other_line);
    rig.run(|orch| orch.submit_next_level(&o, TaskArgs::new(), CallConfig::default(), 0).map(|_| ()))
        .expect("`o` still runs the first function");
}

// ------------------------------------------------- the same rules before and after init

#[isolated_test]
fn an_l2_worker_refuses_a_host_function_before_and_after_init() {
    let mut chip = l2(1);
    let before = chip.register(HostFn::new("fill", fill)).expect_err("an L2 Worker has no SUB workers");
    chip.init().unwrap();
    let after = chip.register(HostFn::new("fill", fill)).expect_err("an L2 Worker has no SUB workers");
    assert_eq!((before.kind(), before.message()), (after.kind(), after.message()));
    assert_err(&after, ErrorKind::InvalidArgument, &["`fill`", "no SUB workers"]);
}

#[isolated_test]
fn a_worker_without_targets_refuses_before_and_after_init() {
    // No SUB workers: no host functions.
    let mut rig = Rig::new(Worker::builder().chips(1).chip_memory(16 << 20).chip_cores(1));
    let before = rig.register(HostFn::new("fill", fill)).expect_err("no SUB workers");
    // No chips: no chip callables.
    let mut hosts = Rig::new(subs(1));
    let before_chip = hosts.register_chip(ChipFn::kernel("k", vadd)).expect_err("no chips");
    rig.init();
    hosts.init();
    let after = rig.register(HostFn::new("fill", fill)).expect_err("no SUB workers");
    assert_eq!((before.kind(), before.message()), (after.kind(), after.message()));
    assert_err(&after, ErrorKind::InvalidArgument, &["`fill`", "no SUB workers"]);
    let after_chip = hosts.register_chip(ChipFn::kernel("k", vadd)).expect_err("no chips");
    assert_eq!((before_chip.kind(), before_chip.message()), (after_chip.kind(), after_chip.message()));
    assert_err(&after_chip, ErrorKind::InvalidArgument, &["`k`", "no chips"]);
}

/// L3 orchestration: `out = a + b` with the chip kernel `k` on chip 0.
fn l3_run_k(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    let k = ChipFn::kernel("k", vadd).handle();
    let mut a = TaskArgs::new();
    a.input(args.tensor(0).unwrap())?.input(args.tensor(1).unwrap())?.output(args.tensor(2).unwrap())?;
    orch.submit_next_level(&k, a, CallConfig::default(), 0).map(|_| ())
}

/// Runs `l3_run_k` on nested Worker `w` of `rig` over `[2.0; 4]` and `[0.5; 4]`.
fn run_k_on(rig: &Rig, w: u32) -> simpler::Result<Vec<f32>> {
    let (a, b, out) = (rig.create_buffer(16)?, rig.create_buffer(16)?, rig.create_buffer(16)?);
    a.write(0, &[2.0f32; 4])?;
    b.write(0, &[0.5f32; 4])?;
    let t = |x: &simpler::Buffer| x.tensor(&[4], DataType::Float32);
    let (ta, tb, to) = (t(&a)?, t(&b)?, t(&out)?);
    let run_k = OrchFn::new("l3_run_k", l3_run_k).handle();
    rig.run(|orch| {
        let mut x = TaskArgs::new();
        x.input(&ta)?.input(&tb)?.output(&to)?;
        orch.submit_next_level(&run_k, x, CallConfig::default(), w).map(|_| ())
    })?;
    out.read::<f32>(0, 4)
}

/// An L4 Worker over an L3 with a chip (worker 0) and `second` (worker 1).
fn l4_over(second: simpler::WorkerBuilder) -> Rig {
    let first = Worker::builder().chips(1).chip_memory(16 << 20).chip_cores(1).build().unwrap();
    let mut rig =
        Rig::new(Worker::builder().level(Level::Network1).worker(first).worker(second.build().unwrap()));
    rig.register_orch(OrchFn::new("l3_run_k", l3_run_k)).unwrap();
    rig
}

fn mixed_l4_takes_a_chip_kernel(after_init: bool) {
    let mut rig = l4_over(subs(1));
    if after_init {
        rig.init();
    }
    // Registered twice: two references, on every chip of the tree (worker 1 has none).
    let k = rig.register_chip(ChipFn::kernel("k", vadd)).expect("worker 0 has a chip");
    rig.register_chip(ChipFn::kernel("k", vadd)).unwrap();
    if !after_init {
        rig.init();
    }
    assert_eq!(run_k_on(&rig, 0).unwrap(), vec![2.5f32; 4]);
    rig.unregister(&k).unwrap();
    assert_eq!(run_k_on(&rig, 0).unwrap(), vec![2.5f32; 4], "one reference left");
    rig.unregister(&k).unwrap();
    expect_err(run_k_on(&rig, 0), ErrorKind::TaskFailed, &["`k`", "not registered"]);
    expect_err(rig.unregister(&k), ErrorKind::Callable, &["`k`", "not registered"]);
}

#[isolated_test]
fn a_mixed_l4_tree_takes_a_chip_kernel_before_init() {
    mixed_l4_takes_a_chip_kernel(false);
}

#[isolated_test]
fn a_mixed_l4_tree_takes_a_chip_kernel_after_init() {
    mixed_l4_takes_a_chip_kernel(true);
}

#[isolated_test]
fn an_l4_tree_without_chips_refuses_a_chip_kernel_before_and_after_init() {
    let mut rig = Rig::new(Worker::builder().level(Level::Network1).worker(subs(1).build().unwrap()));
    let before = rig.register_chip(ChipFn::kernel("k", vadd)).expect_err("no chips below");
    rig.init();
    let after = rig.register_chip(ChipFn::kernel("k", vadd)).expect_err("no chips below");
    assert_eq!((before.kind(), before.message()), (after.kind(), after.message()));
    assert_err(&after, ErrorKind::InvalidArgument, &["`k`", "no chips"]);
}

// --------------------------------------------------- all-or-nothing after init

#[isolated_test]
fn a_registration_refused_by_one_target_is_removed_from_the_others() {
    // Worker 1's chip already holds another function under `k`: it refuses the L4's `k`.
    let mut second = Worker::builder().chips(1).chip_memory(16 << 20).chip_cores(1).build().unwrap();
    second.register_chip(ChipFn::kernel("k", vsub)).unwrap();
    let first = Worker::builder().chips(1).chip_memory(16 << 20).chip_cores(1).build().unwrap();
    let mut rig = Rig::new(Worker::builder().level(Level::Network1).worker(first).worker(second));
    rig.register_orch(OrchFn::new("l3_run_k", l3_run_k)).unwrap();
    rig.init();
    let k = ChipFn::kernel("k", vadd).handle();
    expect_err(run_k_on(&rig, 0), ErrorKind::TaskFailed, &["`k`", "not registered"]);
    let err = rig.register_chip(ChipFn::kernel("k", vadd)).expect_err("worker 1 refuses it");
    assert_err(&err, ErrorKind::Callable, &["`k`", "worker 1", "different function"]);
    // Nothing of it stays anywhere: worker 0 no longer has it, and the L4 does not list it.
    expect_err(run_k_on(&rig, 0), ErrorKind::TaskFailed, &["`k`", "not registered"]);
    expect_err(rig.unregister(&k), ErrorKind::Callable, &["`k`", "not registered"]);
    // Worker 1 still runs its own `k` (vsub).
    assert_eq!(run_k_on(&rig, 1).unwrap(), vec![1.5f32; 4]);
}

#[isolated_test]
fn unregistering_on_an_l2_worker_removes_the_callable_from_the_chip() {
    let mut chip = l2(1);
    let k = chip.register_chip(ChipFn::kernel("k", vadd)).unwrap();
    chip.init().unwrap();
    assert_eq!(run_l2(&chip, &k).unwrap(), vec![2.5f32; 4]);
    chip.unregister(&k).unwrap();
    expect_err(run_l2(&chip, &k), ErrorKind::Callable, &["not registered"]);
    // Registered again after init, it runs again.
    let k = chip.register_chip(ChipFn::kernel("k", vadd)).unwrap();
    assert_eq!(run_l2(&chip, &k).unwrap(), vec![2.5f32; 4]);
}
