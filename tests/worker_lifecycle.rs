//! The Worker's lifecycle: builder validation, init, close (explicit, on drop, on panic), and the
//! errors of calls made in the wrong phase.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use common::*;
use simpler::{ErrorKind, HostFn, RunOptions, TaskArgs, Worker, status::Level};

#[isolated_test]
fn builder_rejects_invalid_configurations() {
    let cases = [
        (Worker::builder().task_window(0), "task_window"),
        (Worker::builder().pipeline_depth(0), "pipeline_depth"),
        (Worker::builder().startup_timeout(Duration::ZERO), "startup_timeout"),
        (Worker::builder().level(Level::Chip).sub_workers(1), "no SUB workers"),
        (Worker::builder().level(Level::Network1).chips(1), "WorkerBuilder::worker"),
        (Worker::builder().worker(Worker::builder().build().unwrap()), "not Workers"),
    ];
    for (builder, needle) in cases {
        expect_err(builder.build(), ErrorKind::InvalidArgument, &[needle]);
    }
    let w = Worker::builder().sub_workers(3).build().unwrap();
    assert_eq!((w.level(), w.sub_workers(), w.is_ready()), (Level::Node, 3, false));
    assert!(w.child_pids().is_empty(), "building forks nothing");
}

#[isolated_test]
fn calls_before_init_are_refused() {
    let mut rig = Rig::new(subs(1));
    let fill = rig.register(HostFn::new("fill", fill)).unwrap();
    let nop = |_: &mut simpler::Orchestrator<'_>| Ok(());
    expect_err(rig.submit(nop), ErrorKind::InvalidState, &["Worker.submit", "not initialized", "init()"]);
    expect_err(rig.run(nop), ErrorKind::InvalidState, &["Worker.run", "not initialized"]);
    expect_err(rig.create_buffer(64), ErrorKind::InvalidState, &["create_buffer", "not initialized"]);
    // init still works afterwards.
    rig.init();
    expect_err(Worker::init(&mut rig), ErrorKind::InvalidState, &["already initialized"]);
    let out = u64_buffer(&rig, 1);
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.output(&u64s(&out, 0, 1))?.scalar(4);
        orch.submit_sub(&fill, a).map(|_| ())
    })
    .unwrap();
    assert_eq!(read_u64(&out, 0, 1), vec![4]);
}

#[isolated_test]
fn calls_after_close_are_refused() {
    let (mut rig, [fill]) = Rig::start(subs(2), [("fill", fill)]);
    let out = u64_buffer(&rig, 1);
    let done = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.output(&u64s(&out, 0, 1))?.scalar(9);
            orch.submit_sub(&fill, a).map(|_| ())
        })
        .unwrap();
    rig.close().expect("close drains the run in flight");
    assert!(done.is_done());
    done.wait().expect("a run that finished before close keeps its result");
    assert_eq!(done.stats().unwrap().tasks, 1);
    assert_eq!(read_u64(&out, 0, 1), vec![9]);
    assert!(!rig.is_ready());
    assert!(rig.child_pids().is_empty());
    for &pid in rig.pids() {
        assert!(!process_exists(pid), "close reaped child {pid}");
    }
    let nop = |_: &mut simpler::Orchestrator<'_>| Ok(());
    expect_err(rig.submit(nop), ErrorKind::InvalidState, &["submit", "closed"]);
    expect_err(rig.run(nop), ErrorKind::InvalidState, &["closed"]);
    expect_err(rig.create_buffer(8), ErrorKind::InvalidState, &["create_buffer", "closed"]);
    expect_err(Worker::init(&mut rig), ErrorKind::InvalidState, &["init", "closed"]);
    rig.close().expect("close is idempotent");
}

#[isolated_test]
fn waiting_on_a_run_abandoned_by_close_reports_it() {
    let (rig, [block]) =
        Rig::start(subs(1).close_timeout(Duration::from_millis(200)), [("block_on_flag", block_on_flag)]);
    let flag = u32_buffer(&rig, 2);
    let run = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.untracked(&words_of(&flag))?.scalar(20_000);
            orch.submit_sub(&block, a).map(|_| ())
        })
        .unwrap();
    wait_blocked(&flag);
    let (closed, waited) = std::thread::scope(|s| {
        // Another thread waits on the run while the Worker closes.
        let waiter = run.clone();
        let waiting = s.spawn(move || waiter.wait_timeout(Duration::from_secs(10)));
        // Once close has given up on the run, let the blocked task end so the child can exit.
        let watcher = run.clone();
        let flag = &flag;
        s.spawn(move || {
            wait_for("close to abandon the run", Duration::from_secs(10), || watcher.is_done());
            release(flag);
        });
        (rig.close(), waiting.join().unwrap())
    });
    // Depending on when it started, the wait saw the run abandoned or the Worker closed.
    let err = waited.expect_err("a wait across close ends with an error");
    assert_err(&err, ErrorKind::InvalidState, &[&format!("run {}", run.id()), "closed"]);
    let err = closed.expect_err("the run did not finish within close_timeout");
    assert_err(&err, ErrorKind::Timeout, &["Worker.close", "1 run(s)", "abandoned"]);
    assert!(run.is_done());
    let err = run.wait().expect_err("the run was abandoned");
    assert_err(&err, ErrorKind::InvalidState, &[&format!("run {}", run.id()), "abandoned", "closed"]);
    expect_err(run.wait_timeout(Duration::from_millis(1)), ErrorKind::InvalidState, &["abandoned"]);
}

#[isolated_test]
fn close_with_a_stuck_task_takes_close_timeout_not_more() {
    let timeout = Duration::from_millis(300);
    let (rig, [block]) = Rig::start(subs(2).close_timeout(timeout), [("block_on_flag", block_on_flag)]);
    let flag = u32_buffer(&rig, 2);
    let run = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.untracked(&words_of(&flag))?.scalar(60_000); // never released
            orch.submit_sub(&block, a).map(|_| ())
        })
        .unwrap();
    let stuck = wait_blocked(&flag);
    let started = std::time::Instant::now();
    let err = rig.close().expect_err("the run did not finish within close_timeout");
    let took = started.elapsed();
    assert_err(&err, ErrorKind::Timeout, &["Worker.close", "1 run(s)", "abandoned"]);
    // The documented bound is close_timeout + 1.1 s; what a stuck task costs is far less.
    assert!(took >= timeout, "close gave the run its close_timeout: {took:?}");
    assert!(
        took < timeout + Duration::from_millis(1100),
        "close took {took:?} with close_timeout {timeout:?}"
    );
    assert!(!process_exists(stuck), "the stuck worker {stuck} was killed and reaped");
    assert!(run.wait().is_err(), "abandoned");
    // The rig checks at drop that no process and no buffer is left.
}

#[isolated_test]
fn dropping_a_worker_closes_it() {
    let pids;
    {
        let mut worker = subs(2).build().unwrap();
        let fill = worker.register(HostFn::new("fill", fill)).unwrap();
        worker.init().unwrap();
        pids = worker.child_pids();
        assert_eq!(pids.len(), 2);
        let out = u64_buffer(&worker, 1);
        worker
            .run(|orch| {
                let mut a = TaskArgs::new();
                a.output(&u64s(&out, 0, 1))?.scalar(1);
                orch.submit_sub(&fill, a).map(|_| ())
            })
            .unwrap();
        assert_eq!(leftover_shm().len(), 1, "the buffer exists while it is alive");
        for &pid in &pids {
            assert!(process_exists(pid));
        }
    }
    // No close: dropping the Worker (and then the buffer) must have cleaned up.
    assert_left_nothing(&pids);
}

/// One run of `fill` writing `value` into `out[0]`.
fn fill_one(
    w: &Worker,
    fill: &simpler::CallableHandle,
    out: &simpler::Buffer,
    value: u64,
) -> simpler::Result<()> {
    w.run(|orch| {
        let mut a = TaskArgs::new();
        a.output(&u64s(out, 0, 1))?.scalar(value);
        orch.submit_sub(fill, a).map(|_| ())
    })
}

#[isolated_test]
fn close_through_a_shared_handle_refuses_other_threads_later_calls_by_name() {
    let (rig, [fill]) = Rig::start(subs(2), [("fill", fill)]);
    let out = u64_buffer(&rig, 1);
    fill_one(&rig, &fill, &out, 7).unwrap();
    assert_eq!(read_u64(&out, 0, 1), vec![7]);
    // The Worker is shared, as in a threaded or async program: no `&mut` to close it with.
    let shared = std::sync::Arc::new(rig);
    let (closed_tx, closed_rx) = std::sync::mpsc::channel();
    let closer = {
        let w = std::sync::Arc::clone(&shared);
        std::thread::spawn(move || {
            let r = w.close();
            closed_tx.send(()).unwrap();
            r
        })
    };
    let user = {
        let (w, out) = (std::sync::Arc::clone(&shared), out.clone());
        std::thread::spawn(move || {
            closed_rx.recv().unwrap(); // runs after the other thread's close returned
            let run = fill_one(&w, &fill, &out, 8);
            let submit = w.submit(|_| Ok(())).map(|_| ());
            let buffer = w.create_buffer(8).map(|_| ());
            (run, submit, buffer, w.close(), w.child_pids())
        })
    };
    closer.join().unwrap().expect("close through a shared handle");
    let (run, submit, buffer, again, pids) = user.join().unwrap();
    // The error names the closed Worker: its level and children.
    let named = ["the Worker is closed", "L3 (node) Worker (2 SUB workers, 0 chips", "Worker::close"];
    expect_err(run, ErrorKind::InvalidState, &[&["Worker.run"][..], &named].concat());
    expect_err(submit, ErrorKind::InvalidState, &[&["Worker.submit"][..], &named].concat());
    expect_err(buffer, ErrorKind::InvalidState, &[&["Worker.create_buffer"][..], &named].concat());
    again.expect("close is idempotent through any handle");
    assert!(pids.is_empty(), "the children were reaped by the first close");
    assert!(!shared.is_ready());
    for &pid in shared.pids() {
        assert!(!process_exists(pid), "child {pid} was reaped by close");
    }
    assert_eq!(read_u64(&out, 0, 1), vec![7], "the refused run wrote nothing");
    drop(out); // before the rig's check, which the last handle runs
    // The rig checks at drop, with the last handle, that no process and no buffer is left.
}

#[isolated_test]
fn close_while_other_threads_run_ends_each_of_them_with_an_error() {
    const THREADS: usize = 4;
    let (rig, [fill]) = Rig::start(subs(2), [("fill", fill)]);
    let shared = std::sync::Arc::new(rig);
    // Every thread has run once before the close, then runs until it is refused.
    let ran_once = std::sync::Arc::new(std::sync::Barrier::new(THREADS + 1));
    let users: Vec<_> = (0..THREADS)
        .map(|t| {
            let (w, ran_once) = (std::sync::Arc::clone(&shared), std::sync::Arc::clone(&ran_once));
            let fill = fill.clone();
            std::thread::spawn(move || {
                let out = u64_buffer(&w, 1);
                let mut runs = 0u64;
                loop {
                    let r = fill_one(&w, &fill, &out, runs);
                    if runs == 0 {
                        ran_once.wait();
                    }
                    match r {
                        Ok(()) => runs += 1,
                        Err(e) => return (t, runs, e),
                    }
                }
            })
        })
        .collect();
    ran_once.wait();
    shared.close().expect("close through one of the handles");
    for user in users {
        let (t, runs, err) = user.join().unwrap();
        assert!(runs >= 1, "thread {t} ran before the close");
        // Refused at the Worker or at admission, or its run was stopped by close: always the
        // closed state, never a hang.
        assert_eq!(err.kind(), ErrorKind::InvalidState, "thread {t}: {err}");
        assert!(err.message().contains("closed"), "thread {t}: {err}");
    }
    assert!(shared.child_pids().is_empty());
}

#[isolated_test]
fn the_last_shared_handle_to_drop_closes_the_worker() {
    let mut worker = subs(2).build().unwrap();
    let fill = worker.register(HostFn::new("fill", fill)).unwrap();
    worker.init().unwrap();
    let pids = worker.child_pids();
    let shared = std::sync::Arc::new(worker);
    let users: Vec<_> = (0..3)
        .map(|i| {
            let (w, fill) = (std::sync::Arc::clone(&shared), fill.clone());
            std::thread::spawn(move || {
                let out = u64_buffer(&w, 1);
                fill_one(&w, &fill, &out, i).unwrap();
                read_u64(&out, 0, 1)[0]
            })
        })
        .collect();
    drop(shared);
    let got: Vec<u64> = users.into_iter().map(|u| u.join().unwrap()).collect();
    assert_eq!(got, vec![0, 1, 2]);
    // Whichever thread dropped the last handle closed the Worker.
    assert_left_nothing(&pids);
}

#[isolated_test]
fn a_panic_unwinding_through_a_worker_reaps_its_children() {
    let mut pids = Vec::new();
    let caught = catch_unwind(AssertUnwindSafe(|| {
        let mut worker = subs(2).build().unwrap();
        worker.init().unwrap();
        pids = worker.child_pids();
        let _buf = worker.create_buffer(64).unwrap();
        panic!("test body failed");
    }));
    assert!(caught.is_err());
    assert_eq!(pids.len(), 2);
    assert_left_nothing(&pids);
}

#[isolated_test]
fn submit_from_inside_an_orchestration_function_is_refused() {
    let (rig, [fill]) = Rig::start(subs(1), [("fill", fill)]);
    let out = u64_buffer(&rig, 1);
    rig.run(|orch| {
        let inner = rig.submit(|_| Ok(()));
        expect_err(inner, ErrorKind::InvalidState, &["inside an orchestration function", "Orchestrator"]);
        let mut a = TaskArgs::new();
        a.output(&u64s(&out, 0, 1))?.scalar(2);
        orch.submit_sub(&fill, a).map(|_| ())
    })
    .unwrap();
    assert_eq!(read_u64(&out, 0, 1), vec![2]);
}

#[isolated_test]
fn sub_work_on_a_worker_without_sub_workers_is_rejected() {
    let mut rig = Rig::new(Worker::builder());
    // Registering is refused (no SUB workers); a handle computed elsewhere still reaches submit.
    expect_err(rig.register(HostFn::new("fill", fill)), ErrorKind::InvalidArgument, &["no SUB workers"]);
    let fill = HostFn::new("fill", fill).handle();
    rig.init();
    assert!(rig.pids().is_empty());
    rig.run(|orch| {
        let err = orch.submit_sub(&fill, TaskArgs::new()).expect_err("no SUB workers");
        assert_err(&err, ErrorKind::Callable, &["fill", "no SUB workers", "WorkerBuilder::sub_workers"]);
        Ok(())
    })
    .unwrap();
}

#[isolated_test]
fn empty_run_finishes_at_once() {
    let mut rig = Rig::new(subs(1));
    rig.init();
    let run = rig.submit_with(RunOptions::new().capture_dag(), |_, _, _| Ok(())).unwrap();
    run.wait().unwrap();
    assert!(run.is_done());
    let stats = run.stats().unwrap();
    assert_eq!((stats.tasks, stats.failed), (0, 0));
    assert_eq!(run.dag().unwrap().graph().node_count(), 0);
}

/// `Duration::MAX` is how one says "for ever": every timeout and deadline takes it as such
/// (each used to overflow `Instant` and panic, a `close_timeout` of it leaving the children
/// running).
#[isolated_test]
fn every_timeout_and_deadline_takes_duration_max_as_for_ever() {
    let forever = Duration::MAX;
    let builder = subs(1)
        .task_window(2)
        .startup_timeout(forever)
        .close_timeout(forever)
        .backpressure_timeout(forever)
        .run_deadline(forever);
    let (rig, [affine]) = Rig::start(builder, [("affine", affine)]);
    let buf = u64_buffer(&rig, 2);
    buf.write(0, &[1u64]).unwrap();
    // Eight chained tasks, each in a scope of its own, through a window of two: a submit waits
    // for room.
    let run = rig
        .submit_with(RunOptions::new().deadline(forever), |orch, _, _| {
            for i in 0..8 {
                let (from, to) = if i % 2 == 0 { (0, 1) } else { (1, 0) };
                orch.scope(|orch| {
                    let mut a = TaskArgs::new();
                    a.input(&u64s(&buf, from, 1))?.output(&u64s(&buf, to, 1))?.scalar(1).scalar(1);
                    orch.submit_sub(&affine, a).map(|_| ())
                })?;
            }
            Ok(())
        })
        .unwrap();
    run.wait_timeout(forever).unwrap();
    run.wait_timeout(forever).unwrap(); // a finished run too
    assert_eq!(read_u64(&buf, 0, 1), vec![9]);
}

/// The program forks (a helper, a daemonizing step) and the child drops its copy of a started
/// Worker: the parent's workers are left alone, and every call on the copy is refused, naming
/// both processes.
#[isolated_test]
fn a_forked_copy_of_a_worker_neither_uses_nor_shuts_down_the_owners_workers() {
    let (mut rig, [fill]) = Rig::start(subs(2), [("fill", common::fill)]);
    let out = u64_buffer(&rig, 1);
    let run_fill = |w: &Worker, v: u64| {
        w.run(|orch| {
            let mut a = TaskArgs::new();
            a.output(&u64s(&out, 0, 1))?.scalar(v);
            orch.submit_sub(&fill, a).map(|_| ())
        })
    };
    run_fill(&rig, 1).unwrap();
    let child = fork_process(|| {
        // The copy in the forked child: refused, then closed and dropped.
        let w: &mut Worker = &mut rig;
        let refused = run_fill(w, 9).err().is_some_and(|e| {
            e.kind() == ErrorKind::InvalidState && e.message().contains("forked copy of the Worker")
        });
        let closed = w.close().is_ok();
        if refused && closed { 0 } else { 3 }
    });
    assert_eq!(wait_process(child, Duration::from_secs(20)), Some(0), "the forked copy's calls");
    for &pid in rig.pids() {
        assert!(process_exists(pid), "worker {pid} was ended by the forked copy's close");
    }
    assert!(rig.workers().iter().all(|w| w.is_alive()), "{:?}", rig.workers());
    run_fill(&rig, 2).expect("the owner's Worker still runs tasks");
    assert_eq!(read_u64(&out, 0, 1), vec![2], "and the copy's refused run wrote nothing");
}

/// This process's open file descriptors, each with what it opens (`/proc/self/fd`), less the
/// one that reads the directory.
fn open_fds() -> Vec<String> {
    let reading = std::path::PathBuf::from(format!("/proc/{}/fd", std::process::id()));
    let mut fds: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let target = std::fs::read_link(e.path()).ok().filter(|t| *t != reading)?;
            Some(format!("{} -> {}", e.file_name().to_string_lossy(), target.display()))
        })
        .collect();
    fds.sort();
    fds
}

/// A `RunHandle` kept after `close` holds none of the Worker's resources: its mailboxes' and
/// heap rings' memfds and its children's pidfds are closed by `close`, and the handle still
/// answers with the run's result and statistics.
#[isolated_test]
fn a_run_handle_kept_after_close_holds_no_descriptor_of_the_worker() {
    let session = |keep: bool| {
        let (rig, [fill]) = Rig::start(subs(2), [("fill", fill)]);
        let out = u64_buffer(&rig, 1);
        let run = rig
            .submit(|orch| {
                let mut a = TaskArgs::new();
                a.output(&u64s(&out, 0, 1))?.scalar(7);
                orch.submit_sub(&fill, a).map(|_| ())
            })
            .unwrap();
        run.wait().unwrap();
        rig.close().unwrap();
        assert_eq!(read_u64(&out, 0, 1), vec![7]);
        drop(out);
        keep.then_some((rig, run))
    };
    // A first session opens what stays for the life of the process (the tree's trace log).
    session(false);
    let before = open_fds();
    let (rig, run) = session(true).expect("kept");
    let after = open_fds();
    let new: Vec<&String> = after.iter().filter(|f| !before.contains(f)).collect();
    assert!(new.is_empty(), "descriptors held after close while a RunHandle is kept: {new:#?}");
    assert_eq!(before, after, "the same descriptors, to the same files");
    // The handle still answers.
    assert!(run.is_done());
    run.wait().expect("the run's result");
    run.wait_timeout(Duration::from_millis(1)).expect("the run's result");
    assert_eq!(run.stats().expect("done").tasks, 1);
    assert!(!run.cancel(), "nothing to cancel");
    drop(run);
    drop(rig);
}

/// The CPUs process (or thread) `who` may run on (`/proc/<who>/status`, `Cpus_allowed_list`).
fn cpus_of(who: &str) -> Vec<usize> {
    let status = std::fs::read_to_string(format!("/proc/{who}/status")).expect("read status");
    let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).expect("Cpus_allowed_list");
    let mut cpus = Vec::new();
    for range in list.trim().split(',') {
        let (a, b) = range.split_once('-').unwrap_or((range, range));
        cpus.extend(a.parse::<usize>().expect("cpu")..=b.parse::<usize>().expect("cpu"));
    }
    cpus
}

/// Restricts the calling thread to `cpu`.
#[expect(unsafe_code, reason = "sched_setaffinity(2) has no safe wrapper in std")]
fn run_only_on(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and sched_setaffinity read and write
    // only that local set, alive for the calls.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(rc, 0, "sched_setaffinity: {}", std::io::Error::last_os_error());
}

/// (On a machine with one usable CPU, bound and unbound workers look the same here.)
#[isolated_test]
fn bound_sub_workers_take_the_usable_cpus_in_turn_and_a_replacement_keeps_its_cpu() {
    let usable = cpus_of("thread-self");
    let mut rig = Rig::new(Worker::builder().sub_workers(3).bind_sub_workers(true));
    let noop = rig.register(HostFn::new("noop", noop)).unwrap();
    rig.init();
    let pids = rig.pids().to_vec();
    for (i, pid) in pids.iter().enumerate() {
        assert_eq!(cpus_of(&pid.to_string()), [usable[i % usable.len()]], "SUB worker {i}");
    }
    sigkill(pids[1]);
    wait_for("the Worker to see SUB worker 1 die", Duration::from_secs(10), || {
        rig.workers().get(1).is_some_and(|s| !s.is_alive())
    });
    let new = rig.replace_worker(simpler::status::WorkerKind::Sub, 1).expect("replace SUB worker 1");
    assert_eq!(cpus_of(&new.pid.to_string()), [usable[1 % usable.len()]], "the replacement's CPU");
    for _ in 0..6 {
        rig.run(|orch| orch.submit_sub(&noop, TaskArgs::new()).map(|_| ())).expect("a task on bound workers");
    }
    drop(rig);
    assert!(!process_exists(new.pid), "the replacement was reaped at close");

    // Unbound (the default), the workers may run wherever the caller may.
    let (plain, _) = Rig::start(subs(2), [("noop", common::noop)]);
    for pid in plain.pids() {
        assert_eq!(cpus_of(&pid.to_string()), usable, "an unbound SUB worker");
    }
}

/// The CPUs are those of the thread that calls `init`, not the process's (nor those of the
/// thread that starts the children, made by an earlier Worker here).
#[isolated_test]
fn bound_sub_workers_take_the_cpus_of_the_thread_that_calls_init() {
    let usable = cpus_of("thread-self");
    drop(Rig::start(subs(1), [("noop", noop)])); // the process's child starter exists now
    let cpu = usable[usable.len() / 2];
    let pids = std::thread::spawn(move || {
        run_only_on(cpu);
        let mut rig = Rig::new(Worker::builder().sub_workers(2).bind_sub_workers(true));
        rig.init();
        rig.pids().iter().map(|pid| cpus_of(&pid.to_string())).collect::<Vec<_>>()
    })
    .join()
    .expect("the pinned thread");
    assert_eq!(pids, [[cpu], [cpu]], "both workers on the one CPU the calling thread may use");
}
