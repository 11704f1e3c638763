//! Registering host functions: before and after `init`, closures, handles of other Workers,
//! unregistering.

mod common;

use common::*;
use simpler::{
    CallableHandle, DataType, ErrorKind, HostArgs, HostFn, HostResult, Tag, TaskArgs, TensorView, Worker,
};

/// Group of `n` `member` tasks; member `i` writes its worker index into `who[i]`.
fn group_args(scratch: &simpler::Buffer, who: &simpler::Buffer, n: usize) -> Vec<TaskArgs> {
    (0..n)
        .map(|i| {
            let slot =
                who.view(TensorView::new(4 * i as u64, &[1], None, DataType::Uint32).unwrap()).unwrap();
            let mut a = TaskArgs::new();
            a.add_tensor(&words_of(scratch), Tag::NoDep).unwrap().output(&slot).unwrap();
            a.scalar(n as u64).scalar(5_000).scalar(0);
            a
        })
        .collect()
}

#[test]
fn fn_registered_after_init_runs_on_every_sub_worker() {
    if !in_own_process() {
        return;
    }
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

#[test]
fn closure_after_init_is_refused() {
    if !in_own_process() {
        return;
    }
    let mut rig = Rig::new(subs(1));
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

#[test]
fn closure_registered_before_init_runs_with_its_captures() {
    if !in_own_process() {
        return;
    }
    let base = 1000 + u64::from(std::process::id() % 7); // a value only known at run time
    let mut rig = Rig::new(subs(2));
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

#[test]
fn handle_of_another_worker_is_rejected() {
    if !in_own_process() {
        return;
    }
    let mut other = Rig::new(Worker::builder());
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

#[test]
fn same_function_registers_to_the_same_handle_and_counts_references() {
    if !in_own_process() {
        return;
    }
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

#[test]
fn registering_needs_a_live_worker_with_sub_workers() {
    if !in_own_process() {
        return;
    }
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
    let mut other = Rig::new(Worker::builder());
    let handle = other.register(h).unwrap();
    expect_err(none.unregister(&handle), ErrorKind::InvalidState, &["unregister", "closed"]);
}

#[test]
fn registering_while_a_run_is_in_flight() {
    if !in_own_process() {
        return;
    }
    // The new function reaches the worker between two tasks of the running run.
    let (mut rig, [exclusive]) = Rig::start(subs(1), [("exclusive", exclusive)]);
    let scratch = u32_buffer(&rig, 2);
    let run = rig
        .submit(|orch| {
            for _ in 0..3 {
                let mut a = TaskArgs::new();
                a.add_tensor(&words_of(&scratch), Tag::NoDep)?.scalar(30_000);
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

#[test]
fn closures_that_differ_only_in_their_captures_are_not_confused() {
    if !in_own_process() {
        return;
    }
    // Two closures made by one factory under one name: the same type, different state. The
    // second registration must either get a callable that runs *its* closure or be refused
    // clearly; silently running the first closure for both would compute wrong results.
    let mut rig = Rig::new(subs(1));
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
