//! Recursion: L4 Workers driving L3 Workers (each in its own process), and one level up.

mod common;

use common::{fail_kernel, isolated_test, vadd};

use std::time::{Duration, Instant};

use common::{Rig, process_exists};
use simpler::{
    DataType, ErrorKind, HostArgs, HostFn, HostResult, OrchFn, Orchestrator, Result, RunOptions, StartMethod,
    TaskArgs, Worker, chip::CallConfig, chip::ChipFn, remote::ClusterKey, remote::NodeAddr,
    remote::RemoteWorker, status::Level,
};

const N: usize = 128;

/// `out = x * 3` on a SUB worker.
fn triple(args: &HostArgs<'_>) -> HostResult {
    let (x, out) = (args.input::<f32>(0)?, args.output::<f32>(1)?);
    for i in 0..out.len() {
        out[i] = 3.0 * x[i];
    }
    Ok(())
}

/// L3 orchestration on a Worker with chips: `out = a + b` on chip 1.
fn l3_chip_add(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> Result<()> {
    let k = ChipFn::kernel("vadd", vadd).handle();
    let mut a = TaskArgs::new();
    a.input(args.tensor(0).unwrap())?.input(args.tensor(1).unwrap())?.output(args.tensor(2).unwrap())?;
    orch.submit_next_level(&k, a, CallConfig::default(), 1).map(|_| ())
}

/// L3 orchestration on a Worker with SUB workers: `out = x * 3`.
fn l3_sub_triple(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> Result<()> {
    let handle = HostFn::new("triple", triple).handle();
    let mut a = TaskArgs::new();
    a.input(args.tensor(0).unwrap())?.output(args.tensor(1).unwrap())?;
    orch.submit_sub(&handle, a).map(|_| ())
}

/// L3 orchestration that runs a failing kernel on chip 0.
fn l3_fail(orch: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> Result<()> {
    let k = ChipFn::kernel("fail_kernel", fail_kernel).handle();
    orch.submit_next_level(&k, TaskArgs::new(), CallConfig::default(), 0).map(|_| ())
}

/// L4 orchestration for the L5 smoke test: forwards its args to its L3 child 0.
fn l4_forward(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> Result<()> {
    let h = OrchFn::new("l3_sub_triple", l3_sub_triple).handle();
    let mut a = TaskArgs::new();
    a.input(args.tensor(0).unwrap())?.output(args.tensor(1).unwrap())?;
    orch.submit_next_level(&h, a, CallConfig::default(), 0).map(|_| ())
}

/// An L3 Worker with one SUB worker that runs `triple`.
fn l3_tripling() -> Worker {
    let mut l3 = Worker::builder().sub_workers(1).build().unwrap();
    l3.register(HostFn::new("triple", triple)).unwrap();
    l3
}

fn f32s(b: &simpler::Buffer) -> simpler::Tensor {
    b.tensor(&[(b.nbytes() / 4) as u32], DataType::Float32).unwrap()
}

#[isolated_test]
fn l4_over_two_l3_workers_runs_a_dag_spanning_both() {
    let mut l3_chips = Worker::builder().chips(2).chip_memory(16 << 20).chip_cores(2).build().unwrap();
    l3_chips.register_chip(ChipFn::kernel("vadd", vadd)).unwrap();
    let mut l3_subs = Worker::builder().sub_workers(2).build().unwrap();
    l3_subs.register(HostFn::new("triple", triple)).unwrap();
    let mut rig = Rig::new(Worker::builder().level(Level::Network1).worker(l3_chips).worker(l3_subs));
    let (w_chips, w_subs) = (0, 1);
    let add = rig.register_orch(OrchFn::new("l3_chip_add", l3_chip_add)).unwrap();
    let tri = rig.register_orch(OrchFn::new("l3_sub_triple", l3_sub_triple)).unwrap();
    rig.init();
    let (a, b, mid, out) = (
        rig.create_buffer(N * 4).unwrap(),
        rig.create_buffer(N * 4).unwrap(),
        rig.create_buffer(N * 4).unwrap(),
        rig.create_buffer(N * 4).unwrap(),
    );
    let av: Vec<f32> = (0..N).map(|i| i as f32).collect();
    a.write(0, &av).unwrap();
    b.write(0, &vec![1.0f32; N]).unwrap();
    let (ta, tb, tm, to) = (f32s(&a), f32s(&b), f32s(&mid), f32s(&out));
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            // mid = a + b on the chips' L3, then out = mid * 3 on the SUB workers' L3: the
            // edge between the two L3 tasks is inferred at L4 from `mid`.
            let mut x = TaskArgs::new();
            x.input(&ta)?.input(&tb)?.output(&tm)?;
            orch.submit_next_level(&add, x, CallConfig::default(), w_chips)?;
            let mut y = TaskArgs::new();
            y.input(&tm)?.output(&to)?;
            orch.submit_next_level(&tri, y, CallConfig::default(), w_subs)?;
            Ok(())
        })
        .unwrap();
    run.wait().unwrap();
    assert!(run.dag().unwrap().has_edge(0, 1), "the L4 DAG orders the two L3 tasks");
    let got = out.read::<f32>(0, N).unwrap();
    assert!(got.iter().enumerate().all(|(i, v)| *v == 3.0 * (av[i] + 1.0)), "{:?}", &got[..4]);
}

#[isolated_test]
fn l5_over_l4_over_l3_smoke() {
    let mut l4 = Worker::builder().level(Level::Network1).worker(l3_tripling()).build().unwrap();
    l4.register_orch(OrchFn::new("l3_sub_triple", l3_sub_triple)).unwrap();
    let mut rig = Rig::new(Worker::builder().level(Level::Network2).worker(l4));
    let fwd = rig.register_orch(OrchFn::new("l4_forward", l4_forward)).unwrap();
    rig.init();
    let (x, out) = (rig.create_buffer(N * 4).unwrap(), rig.create_buffer(N * 4).unwrap());
    x.write(0, &vec![2.0f32; N]).unwrap();
    let (tx, to) = (f32s(&x), f32s(&out));
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.input(&tx)?.output(&to)?;
        orch.submit_next_level(&fwd, a, CallConfig::default(), 0).map(|_| ())
    })
    .unwrap();
    assert_eq!(out.read::<f32>(0, N).unwrap(), vec![6.0f32; N]);
}

#[isolated_test]
fn a_failing_kernel_two_levels_down_names_the_path() {
    let mut l3 = Worker::builder().chips(1).chip_memory(16 << 20).chip_cores(1).build().unwrap();
    l3.register_chip(ChipFn::kernel("fail_kernel", fail_kernel)).unwrap();
    let mut rig = Rig::new(
        Worker::builder()
            .level(Level::Network1)
            .worker(Worker::builder().sub_workers(1).build().unwrap())
            .worker(l3),
    );
    let w = 1;
    let fail = rig.register_orch(OrchFn::new("l3_fail", l3_fail)).unwrap();
    rig.init();
    let err = rig
        .run(|orch| orch.submit_next_level(&fail, TaskArgs::new(), CallConfig::default(), w).map(|_| ()))
        .unwrap_err();
    common::assert_err(
        &err,
        ErrorKind::TaskFailed,
        &["l3_fail", "worker 1", "fail_kernel", "chip 0", "kernel says no"],
    );
}

#[isolated_test]
fn chip_callables_registered_at_l4_reach_the_chips_of_its_l3_children() {
    chip_callables_at_l4(false);
}

#[isolated_test]
fn chip_callables_and_orchestrations_registered_at_l4_after_init_reach_the_tree() {
    chip_callables_at_l4(true);
}

fn chip_callables_at_l4(after_init: bool) {
    let l3 = Worker::builder().chips(2).chip_memory(16 << 20).chip_cores(1).build().unwrap();
    let mut rig = Rig::new(Worker::builder().level(Level::Network1).worker(l3));
    if after_init {
        rig.init();
    }
    rig.register_chip(ChipFn::kernel("vadd", vadd)).unwrap();
    let add = rig.register_orch(OrchFn::new("l3_chip_add", l3_chip_add)).unwrap();
    if !after_init {
        rig.init();
    }
    let (a, b, out) = (
        rig.create_buffer(N * 4).unwrap(),
        rig.create_buffer(N * 4).unwrap(),
        rig.create_buffer(N * 4).unwrap(),
    );
    a.write(0, &vec![1.5f32; N]).unwrap();
    b.write(0, &vec![2.0f32; N]).unwrap();
    let (ta, tb, to) = (f32s(&a), f32s(&b), f32s(&out));
    rig.run(|orch| {
        let mut x = TaskArgs::new();
        x.input(&ta)?.input(&tb)?.output(&to)?;
        orch.submit_next_level(&add, x, CallConfig::default(), 0).map(|_| ())
    })
    .unwrap();
    assert_eq!(out.read::<f32>(0, N).unwrap(), vec![3.5f32; N]);
}

/// L4 orchestration: `l3_chip_add` on its L3 child 0.
fn l4_chip_add(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> Result<()> {
    let h = OrchFn::new("l3_chip_add", l3_chip_add).handle();
    let mut a = TaskArgs::new();
    a.input(args.tensor(0).unwrap())?.input(args.tensor(1).unwrap())?.output(args.tensor(2).unwrap())?;
    orch.submit_next_level(&h, a, CallConfig::default(), 0).map(|_| ())
}

/// The L4 runs in a process started by exec (the default), which rebuilds it from its start
/// spec: with its nested Worker as a lane that runs chip callables, so a kernel registered at
/// the L5 after `init` reaches the chips two levels down.
#[isolated_test]
fn chip_callables_registered_at_l5_after_init_reach_the_chips_two_levels_down() {
    let l3 = Worker::builder().chips(2).chip_memory(16 << 20).chip_cores(1).build().unwrap();
    let mut l4 = Worker::builder().level(Level::Network1).worker(l3).build().unwrap();
    l4.register_orch(OrchFn::new("l3_chip_add", l3_chip_add)).unwrap();
    let mut rig = Rig::new(Worker::builder().level(Level::Network2).worker(l4));
    let add = rig.register_orch(OrchFn::new("l4_chip_add", l4_chip_add)).unwrap();
    rig.init();
    rig.register_chip(ChipFn::kernel("vadd", vadd)).expect("the kernel reaches the L4 and its L3's chips");
    let (a, b, out) = (
        rig.create_buffer(N * 4).unwrap(),
        rig.create_buffer(N * 4).unwrap(),
        rig.create_buffer(N * 4).unwrap(),
    );
    a.write(0, &vec![1.5f32; N]).unwrap();
    b.write(0, &vec![2.0f32; N]).unwrap();
    let (ta, tb, to) = (f32s(&a), f32s(&b), f32s(&out));
    rig.run(|orch| {
        let mut x = TaskArgs::new();
        x.input(&ta)?.input(&tb)?.output(&to)?;
        orch.submit_next_level(&add, x, CallConfig::default(), 0).map(|_| ())
    })
    .unwrap();
    assert_eq!(out.read::<f32>(0, N).unwrap(), vec![3.5f32; N]);
}

/// A process that started workers by exec has a thread that starts them; a Worker forked from
/// it (`StartMethod::Fork`) does not inherit that thread, and must start its own children
/// anyway (it used to wait for the missing thread until its startup timeout).
#[isolated_test]
fn a_forked_l3_starts_its_children_after_this_process_started_workers_by_exec() {
    let mut first = Rig::new(Worker::builder().sub_workers(1));
    first.init();
    drop(first);
    let mut rig = Rig::new(
        Worker::builder()
            .level(Level::Network1)
            .start_method(StartMethod::Fork)
            .startup_timeout(Duration::from_secs(30))
            .worker(l3_tripling()), // starts its SUB worker by exec, in the forked process
    );
    let tri = rig.register_orch(OrchFn::new("l3_sub_triple", l3_sub_triple)).unwrap();
    let started = Instant::now();
    rig.init();
    assert!(started.elapsed() < Duration::from_secs(20), "init took {:?}", started.elapsed());
    let (x, out) = (rig.create_buffer(N * 4).unwrap(), rig.create_buffer(N * 4).unwrap());
    x.write(0, &vec![2.0f32; N]).unwrap();
    let (tx, to) = (f32s(&x), f32s(&out));
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.input(&tx)?.output(&to)?;
        orch.submit_next_level(&tri, a, CallConfig::default(), 0).map(|_| ())
    })
    .unwrap();
    assert_eq!(out.read::<f32>(0, N).unwrap(), vec![6.0f32; N]);
}

/// A closure registered on a nested Worker cannot reach that Worker's process when its parent
/// starts it by exec, even if the nested Worker forks its own children: the error names the
/// closure, the nested Worker and the setting to change (the parent's start method).
#[isolated_test]
fn a_closure_on_a_nested_worker_started_by_exec_is_refused_naming_the_worker_and_the_remedy() {
    let k = 5.0f32;
    let mut l3 = Worker::builder().sub_workers(1).start_method(StartMethod::Fork).build().unwrap();
    l3.register(HostFn::closure("times_k", move |_: &HostArgs<'_>| {
        let _ = k;
        Ok(())
    }))
    .unwrap();
    let mut l4 = Worker::builder().level(Level::Network1).worker(l3).build().unwrap();
    let err = l4.init().unwrap_err();
    common::assert_err(
        &err,
        ErrorKind::Callable,
        &["times_k", "registered on worker 0", "L3", "build this Worker with StartMethod::Fork"],
    );
    assert!(l4.child_pids().is_empty(), "nothing was started");
}

/// A remote Worker's id follows the nested Workers': a nested Worker added after it would
/// take that id, so it is refused, naming the remote Worker.
#[test]
fn a_nested_worker_added_after_a_remote_one_is_refused() {
    let key = ClusterKey::new([1u8; 16]).unwrap();
    let err = Worker::builder()
        .level(Level::Network1)
        .worker(l3_tripling())
        .remote_worker(RemoteWorker::new(NodeAddr::loopback(7601), key))
        .worker(l3_tripling())
        .build()
        .unwrap_err();
    common::assert_err(
        &err,
        ErrorKind::InvalidArgument,
        &["before remote ones", "remote worker 1 (127.0.0.1:7601)"],
    );
}

#[isolated_test]
fn a_nested_child_that_hangs_at_startup_fails_init_and_nothing_is_left() {
    let slow = Worker::builder().sub_workers(1).__startup_delay(Duration::from_secs(30)).build().unwrap();
    let mut l4 = Worker::builder()
        .level(Level::Network1)
        .startup_timeout(Duration::from_millis(500))
        .worker(Worker::builder().sub_workers(1).build().unwrap())
        .worker(slow)
        .build()
        .unwrap();
    let started = Instant::now();
    let err = l4.init().unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(20), "init gave up at the deadline");
    common::assert_err(&err, ErrorKind::WorkerDied, &["worker 1", "did not report ready"]);
    assert!(!l4.is_ready());
    assert!(l4.child_pids().is_empty());
    assert!(common::leftover_shm().is_empty());
}

/// Announces itself in marker `nested-block` of its parent, the L3 Worker's process (a
/// grandchild of the test), then waits: the test kills the L3 process meanwhile.
fn block_host(_: &HostArgs<'_>) -> HostResult {
    common::announce_to_parent("nested-block", "running")?;
    common::park_until_killed()
}

fn l3_block(orch: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> Result<()> {
    orch.submit_sub(&HostFn::new("block_host", block_host).handle(), TaskArgs::new()).map(|_| ())
}

#[isolated_test]
fn a_nested_worker_killed_mid_task_fails_the_task_and_close_reaps_the_tree() {
    let mut l3 = Worker::builder().sub_workers(1).build().unwrap();
    l3.register(HostFn::new("block_host", block_host)).unwrap();
    l3.register(HostFn::new("triple", triple)).unwrap();
    let spare = l3_tripling();
    let mut rig = Rig::new(Worker::builder().level(Level::Network1).worker(l3).worker(spare));
    let block = rig.register_orch(OrchFn::new("l3_block", l3_block)).unwrap();
    let tri = rig.register_orch(OrchFn::new("l3_sub_triple", l3_sub_triple)).unwrap();
    rig.init();
    let l3_pid = rig.pids()[0];
    let marker = common::marker_file("nested-block", l3_pid as u32);
    let _files = common::TempFiles::new([marker.clone()]);
    let run = rig
        .submit(|orch| orch.submit_next_level(&block, TaskArgs::new(), CallConfig::default(), 0).map(|_| ()))
        .unwrap();
    common::wait_for_marker(&marker, "the L3 task to be running");
    common::sigkill(l3_pid);
    let err = run.wait().unwrap_err();
    common::assert_err(&err, ErrorKind::WorkerDied, &["l3_block", "worker 0", "died", "signal 9"]);
    // The other nested Worker still runs work; work aimed at the dead one fails clearly.
    let (x, out) = (rig.create_buffer(16).unwrap(), rig.create_buffer(16).unwrap());
    x.write(0, &[1.0f32; 4]).unwrap();
    let (tx, to) = (f32s(&x), f32s(&out));
    let submit_to = |w: u32| {
        rig.run(|orch| {
            let mut a = TaskArgs::new();
            a.input(&tx)?.output(&to)?;
            orch.submit_next_level(&tri, a, CallConfig::default(), w).map(|_| ())
        })
    };
    common::expect_err(submit_to(0), ErrorKind::WorkerDied, &["worker 0 is dead"]);
    submit_to(1).unwrap();
    assert_eq!(out.read::<f32>(0, 4).unwrap(), vec![3.0f32; 4]);
    drop(run);
    rig.close().unwrap();
    assert!(!process_exists(l3_pid));
}

/// An L3 orchestration function with a bug.
fn l3_panics(_: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> Result<()> {
    panic!("the L3 orchestration panicked on purpose")
}

/// A panic in an orchestration function that a nested L3 Worker runs fails that task alone,
/// with the panic's message, as a SUB worker's panic does; the L3 process and its children
/// live on and run the next task.
#[isolated_test]
fn an_l3_orchestration_that_panics_fails_its_task_and_the_l3_worker_serves_on() {
    let mut rig = Rig::new(Worker::builder().level(Level::Network1).worker(l3_tripling()));
    let bad = rig.register_orch(OrchFn::new("l3_panics", l3_panics)).unwrap();
    let tri = rig.register_orch(OrchFn::new("l3_sub_triple", l3_sub_triple)).unwrap();
    rig.init();
    let pids = rig.child_pids();
    let err = rig
        .run(|orch| orch.submit_next_level(&bad, TaskArgs::new(), CallConfig::default(), 0).map(|_| ()))
        .expect_err("the task whose orchestration panicked fails");
    assert_eq!(err.kind(), ErrorKind::TaskFailed, "{err}");
    let msg = err.message();
    assert!(msg.contains("`l3_panics`") && msg.contains("worker 0"), "{msg}");
    assert!(msg.contains("panicked: the L3 orchestration panicked on purpose"), "{msg}");
    let (x, out) = (rig.create_buffer(N * 4).unwrap(), rig.create_buffer(N * 4).unwrap());
    x.write(0, &[2.0f32; N]).unwrap();
    let (tx, tout) = (f32s(&x), f32s(&out));
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.input(&tx)?.output(&tout)?;
        orch.submit_next_level(&tri, a, CallConfig::default(), 0).map(|_| ())
    })
    .expect("the same L3 Worker runs the next task");
    assert_eq!(out.read::<f32>(0, N).unwrap(), vec![6.0; N]);
    assert_eq!(rig.child_pids(), pids, "no worker was lost or replaced");
}

/// An L4 over two nested L3 Workers with an explicit `pipeline_depth` (nested Workers grant no
/// depth of their own, so any depth is allowed), driven by four threads at once, each running
/// its own runs over its own buffers on both L3 Workers: every run is correct.
#[isolated_test]
fn an_l4_over_nested_workers_runs_runs_from_several_threads_at_any_pipeline_depth() {
    let mut rig = Rig::new(
        Worker::builder()
            .level(Level::Network1)
            .pipeline_depth(4)
            .worker(l3_tripling())
            .worker(l3_tripling()),
    );
    let tri = rig.register_orch(OrchFn::new("l3_sub_triple", l3_sub_triple)).unwrap();
    rig.init();
    let bufs: Vec<_> =
        (0..4).map(|_| (rig.create_buffer(N * 4).unwrap(), rig.create_buffer(N * 4).unwrap())).collect();
    std::thread::scope(|s| {
        for (k, (x, out)) in bufs.iter().enumerate() {
            let (rig, tri) = (&rig, &tri);
            s.spawn(move || {
                let (tx, tout) = (f32s(x), f32s(out));
                for round in 0..50u32 {
                    let v = (k as u32 * 100 + round) as f32;
                    x.write(0, &vec![v; N]).unwrap();
                    rig.run(|orch| {
                        let mut a = TaskArgs::new();
                        a.input(&tx)?.output(&tout)?;
                        orch.submit_next_level(tri, a, CallConfig::default(), round % 2).map(|_| ())
                    })
                    .unwrap();
                    assert_eq!(out.read::<f32>(0, N).unwrap(), vec![3.0 * v; N], "thread {k}, round {round}");
                }
            });
        }
    });
}

#[expect(unsafe_code, reason = "prctl(2) has no safe wrapper in std")]
fn become_child_subreaper() {
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) sets a flag of this process; no memory involved.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong) };
    assert_eq!(rc, 0, "PR_SET_CHILD_SUBREAPER: {}", std::io::Error::last_os_error());
}

/// This process's children that have exited and that nobody reaped (zombies).
fn zombie_children() -> Vec<i32> {
    let children = common::descendants(std::process::id() as i32);
    let me = std::process::id().to_string();
    children
        .into_iter()
        .filter(|&p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let fields: Vec<&str> =
                stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
            fields.first() == Some(&"Z") && fields.get(1) == Some(&me.as_str())
        })
        .collect()
}

/// A program that is a child subreaper adopts what its killed nested Worker leaves: that
/// Worker's SUB workers and chip, killed with it, are reaped by the Worker (they are in the
/// nested Worker's process group), not left as zombies of the program; the program's own
/// children are left alone.
#[isolated_test]
fn a_subreaper_program_is_left_no_zombie_by_a_killed_nested_worker() {
    become_child_subreaper();
    // A child of the program's own, which exits and which the program reaps itself, later.
    let own = common::fork_process(|| 0);
    let mut l4 = Worker::builder().level(Level::Network1);
    for _ in 0..3 {
        let mut l3 =
            Worker::builder().sub_workers(2).chips(1).chip_memory(1 << 20).chip_cores(1).build().unwrap();
        l3.register(HostFn::new("triple", triple)).unwrap();
        l4 = l4.worker(l3);
    }
    let mut rig = Rig::new(l4);
    let tri = rig.register_orch(OrchFn::new("l3_sub_triple", l3_sub_triple)).unwrap();
    rig.init();
    let (x, out) = (rig.create_buffer(16).unwrap(), rig.create_buffer(16).unwrap());
    x.write(0, &[1.0f32; 4]).unwrap();
    let (tx, to) = (f32s(&x), f32s(&out));
    let submit_to = |w: u32| {
        rig.run(|orch| {
            let mut a = TaskArgs::new();
            a.input(&tx)?.output(&to)?;
            orch.submit_next_level(&tri, a, CallConfig::default(), w).map(|_| ())
        })
    };
    for (w, &l3_pid) in rig.pids()[..2].iter().enumerate() {
        submit_to(w as u32).expect("the nested Worker runs its task");
        common::sigkill(l3_pid);
        common::wait_for("the dead nested Worker to be seen", Duration::from_secs(10), || {
            rig.workers().get(w).is_some_and(|s| !s.is_alive())
        });
        common::expect_err(submit_to(w as u32), ErrorKind::WorkerDied, &[&format!("worker {w} is dead")]);
        let zombies: Vec<i32> = zombie_children().into_iter().filter(|&p| p != own).collect();
        assert!(zombies.is_empty(), "killed nested Worker {w} left zombies {zombies:?}");
    }
    submit_to(2).expect("the third nested Worker runs on");
    drop((tx, to, x, out));
    rig.close().unwrap();
    let zombies: Vec<i32> = zombie_children().into_iter().filter(|&p| p != own).collect();
    assert!(zombies.is_empty(), "zombies left after close: {zombies:?}");
    assert_eq!(
        common::wait_process(own, Duration::from_secs(10)),
        Some(0),
        "the program's own child is its to reap"
    );
}
