//! Starting workers in a program that has threads: a lock another thread holds at `init`
//! (stdout, a tracing subscriber's, the panic machinery's) never reaches a worker, and the
//! workers live as long as their Worker whichever thread made it.
//!
//! Each test holds the lock on a thread of its own across `init`, then runs a task that needs
//! it in the worker. A worker forked at that moment inherits the lock held by a thread that does
//! not exist in it and hangs for ever the first time it takes it (the bound on each run turns
//! such a hang into a failure); a worker started by exec does not inherit it.

mod common;

use std::io::{Read, Write};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use common::*;
use simpler::{
    DataType, ErrorKind, HostArgs, HostFn, HostResult, RunOptions, StartMethod, TaskArgs, Worker,
    chip::CallConfig, chip::ChipFn,
};

/// How long one run may take before the test calls it a hang.
const BOUND: Duration = Duration::from_secs(20);

/// Runs `hold` on a thread of its own, which takes a lock, reports it holds it, and keeps it
/// until the returned sender is dropped or sent to.
fn hold_on_other_thread(
    hold: impl FnOnce(mpsc::Receiver<()>, mpsc::Sender<()>) + Send + 'static,
) -> (mpsc::Sender<()>, JoinHandle<()>) {
    let (release, released) = mpsc::channel();
    let (held, is_held) = mpsc::channel();
    let t = std::thread::spawn(move || hold(released, held));
    is_held.recv().expect("the holder thread took its lock");
    (release, t)
}

#[expect(clippy::print_stdout, reason = "printing in a worker is what the test checks")]
fn prints(_args: &HostArgs<'_>) -> HostResult {
    println!("a line from a SUB worker");
    std::io::stdout().flush()?;
    eprintln!("and one on stderr");
    Ok(())
}

fn traces(_args: &HostArgs<'_>) -> HostResult {
    tracing::info!(target: "simpler_test", "an event from a SUB worker");
    Ok(())
}

fn panics(_args: &HostArgs<'_>) -> HostResult {
    panic!("on purpose")
}

/// Runs one task of `f` on `w` and returns its result, failing the test if it takes longer
/// than [`BOUND`].
fn run_one(w: &Worker, f: &simpler::CallableHandle) -> simpler::Result<()> {
    let run = w.submit(|orch| orch.submit_sub(f, TaskArgs::new()).map(|_| ())).expect("submit");
    match run.wait_timeout(BOUND) {
        Err(e) if e.kind() == ErrorKind::Timeout => panic!("the task hung: {e}"),
        other => other,
    }
}

#[isolated_test]
fn a_worker_started_while_another_thread_holds_stdout_can_print() {
    let mut rig = Rig::new(subs(2));
    let print = rig.register(HostFn::new("prints", prints)).unwrap();
    let (release, holder) = hold_on_other_thread(|released, held| {
        let out = std::io::stdout().lock();
        let err = std::io::stderr().lock();
        held.send(()).unwrap();
        let _ = released.recv();
        drop((out, err));
    });
    rig.init();
    release.send(()).unwrap();
    holder.join().unwrap();
    for _ in 0..4 {
        run_one(&rig, &print).expect("the SUB worker prints");
    }
}

/// A subscriber that takes a mutex for every event (as a writer to a shared sink does).
struct Locking {
    sink: Arc<Mutex<Vec<String>>>,
}

impl tracing::Subscriber for Locking {
    fn enabled(&self, meta: &tracing::Metadata<'_>) -> bool {
        meta.target() == "simpler_test"
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        self.sink.lock().unwrap().push(event.metadata().target().to_string());
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[isolated_test]
fn a_worker_started_while_another_thread_holds_the_subscribers_lock_can_trace() {
    let sink = Arc::new(Mutex::new(Vec::new()));
    tracing::subscriber::set_global_default(Locking { sink: sink.clone() })
        .expect("one subscriber per process");
    let mut rig = Rig::new(subs(1));
    let trace = rig.register(HostFn::new("traces", traces)).unwrap();
    let held_sink = sink.clone();
    let (release, holder) = hold_on_other_thread(move |released, held| {
        let guard = held_sink.lock().unwrap();
        held.send(()).unwrap();
        let _ = released.recv();
        drop(guard);
    });
    rig.init();
    release.send(()).unwrap();
    holder.join().unwrap();
    for _ in 0..4 {
        run_one(&rig, &trace).expect("the SUB worker traces");
    }
    // The subscriber is live here: the parent's own event reaches it.
    tracing::info!(target: "simpler_test", "an event from the parent");
    assert_eq!(sink.lock().unwrap().as_slice(), ["simpler_test"]);
}

#[isolated_test]
fn a_worker_started_while_another_thread_is_panicking_can_panic() {
    let mut rig = Rig::new(subs(1));
    let panic = rig.register(HostFn::new("panics", panics)).unwrap();
    // Another thread stays inside the panic machinery (in the hook) across `init`.
    let (in_hook, hook_entered) = mpsc::channel::<()>();
    let (leave_hook, may_leave) = mpsc::channel::<()>();
    let gate = Mutex::new((Some(in_hook), may_leave));
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let mut g = gate.lock().unwrap();
        if let Some(tx) = g.0.take() {
            tx.send(()).unwrap();
            let _ = g.1.recv();
        }
        drop(g);
        default(info);
    }));
    let panicker = std::thread::spawn(|| {
        let _ = std::panic::catch_unwind(|| panic!("a panic of the program's own"));
    });
    hook_entered.recv().unwrap();
    rig.init();
    leave_hook.send(()).unwrap();
    panicker.join().unwrap();
    let _ = std::panic::take_hook();
    for _ in 0..2 {
        let err = run_one(&rig, &panic).expect_err("the host function panics");
        assert_err(&err, ErrorKind::TaskFailed, &["panicked", "on purpose"]);
    }
}

#[isolated_test]
fn a_worker_made_on_a_short_lived_thread_keeps_its_workers() {
    let (worker, print) = std::thread::spawn(|| {
        let mut w = subs(2).build().unwrap();
        let f = w.register(HostFn::new("prints", prints)).unwrap();
        w.init().unwrap();
        (w, f)
    })
    .join()
    .unwrap();
    // The thread that started the children has ended.
    let pids = worker.child_pids();
    assert_eq!(pids.len(), 2);
    for _ in 0..4 {
        run_one(&worker, &print).expect("the workers outlive the thread that made them");
    }
    assert!(worker.workers().iter().all(|w| w.is_alive()), "{:?}", worker.workers());
    worker.close().unwrap();
    assert_left_nothing(&pids);
}

#[isolated_test]
fn workers_are_new_processes_of_this_binary_unless_fork_is_asked_for() {
    let cmdline = |pid: i32| std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let (rig, _) = Rig::start(subs(1), [("noop", noop)]);
    let started = cmdline(rig.pids()[0]);
    assert!(String::from_utf8_lossy(&started).starts_with("simpler: sub worker 0"), "{started:?}");
    drop(rig);
    let (rig, _) = Rig::start(subs(1).start_method(StartMethod::Fork), [("noop", noop)]);
    assert_eq!(
        cmdline(rig.pids()[0]),
        cmdline(std::process::id() as i32),
        "a fork keeps the parent's command line"
    );
}

#[test]
fn a_closure_is_refused_under_exec_naming_it_and_the_way_out() {
    let mut w = subs(1).build().unwrap();
    let err = w.register(HostFn::closure("scaled", |_: &HostArgs<'_>| Ok(()))).unwrap_err();
    assert_err(&err, ErrorKind::Callable, &["scaled", "closure", "HostFn::new", "StartMethod::Fork"]);
    let mut forked = subs(1).start_method(StartMethod::Fork).build().unwrap();
    forked
        .register(HostFn::closure("scaled", |_: &HostArgs<'_>| Ok(())))
        .expect("a closure reaches forked workers");
}

/// The CPUs `pid` may run on, as `/proc/<pid>/status` lists them.
fn cpus_allowed(pid: i32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")).unwrap();
    line.split(':').nth(1).unwrap().trim().to_string()
}

#[isolated_test]
#[expect(unsafe_code, reason = "sched_getaffinity/sched_setaffinity have no safe wrapper")]
fn workers_run_where_the_thread_that_started_them_may_run() {
    // Start the spawner thread first, with every CPU allowed.
    drop(Rig::start(subs(1), [("noop", noop)]));
    let pinned = std::thread::spawn(|| {
        let mut set = std::mem::MaybeUninit::<libc::cpu_set_t>::zeroed();
        // SAFETY: writes at most size_of::<cpu_set_t>() bytes into the zeroed set.
        assert_eq!(unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), set.as_mut_ptr()) }, 0);
        // SAFETY: zeroed, then written by sched_getaffinity.
        let set = unsafe { set.assume_init() };
        // SAFETY: CPU_ISSET reads the set in bounds for a cpu below CPU_SETSIZE.
        let cpu = (0..libc::CPU_SETSIZE as usize).find(|&c| unsafe { libc::CPU_ISSET(c, &set) }).unwrap();
        // SAFETY: an all-zero cpu_set_t is the empty set.
        let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `cpu` is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu, &mut one) };
        // SAFETY: pins this thread only, with a valid set.
        assert_eq!(unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &one) }, 0);
        let (rig, _) = Rig::start(subs(1), [("noop", noop)]);
        (rig, cpu)
    });
    let (rig, cpu) = pinned.join().unwrap();
    assert_eq!(cpus_allowed(rig.pids()[0]), cpu.to_string(), "the worker inherits its starter's CPUs");
}

/// The state of thread `tid` of this process (`R`, `S`, `Z`, ...), from its `stat`.
fn thread_state(tid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{}/task/{tid}/stat", std::process::id())).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// In a process whose main thread has exited: a Worker started before, then host buffers made
/// before and after, each run through two tasks, and a captured run whose chip kernel leaves
/// its record in the trace log. `leave` tells the main thread to exit.
fn after_the_main_thread(leave: mpsc::Sender<()>) -> Result<(), String> {
    let e = |what: &'static str| move |err: simpler::Error| format!("{what}: {err}");
    let mut w = subs(2).chips(1).chip_memory(1 << 20).chip_cores(1).build().map_err(e("build"))?;
    let fill = w.register(HostFn::new("fill", fill)).map_err(e("register"))?;
    let affine = w.register(HostFn::new("affine", affine)).map_err(e("register"))?;
    let double = w.register_chip(ChipFn::kernel("double", double)).map_err(e("register"))?;
    w.init().map_err(e("init"))?;
    let early = u64_buffer(&w, 4);
    leave.send(()).map_err(|_| "the main thread is gone before it was told to go")?;
    let main = std::process::id() as i32;
    wait_for("the main thread to exit", BOUND, || thread_state(main) == Some('Z'));
    // Linux shows no descriptor of a process whose main thread has exited under
    // `/proc/<pid>/fd`: the workers must reach its buffers another way.
    let listed = std::fs::read_dir(format!("/proc/{main}/fd")).map(|d| d.count()).unwrap_or(0);
    if listed != 0 {
        return Err(format!("/proc/{main}/fd lists {listed} descriptors after the main thread exited"));
    }
    let late = u64_buffer(&w, 4);
    for (name, x) in [("a buffer made before the main thread exited", &early), ("one made after", &late)] {
        let y = u64_buffer(&w, 4);
        let run = w
            .submit(|orch| {
                let mut a = TaskArgs::new();
                a.output(&u64s(x, 0, 4))?.scalar(7);
                orch.submit_sub(&fill, a)?;
                let mut b = TaskArgs::new();
                b.input(&u64s(x, 0, 4))?.output(&u64s(&y, 0, 4))?.scalar(2).scalar(1);
                orch.submit_sub(&affine, b).map(|_| ())
            })
            .map_err(e(name))?;
        run.wait_timeout(BOUND).map_err(e(name))?;
        let got = read_u64(&y, 0, 4);
        if got != [15; 4] {
            return Err(format!("{name}: the tasks left {got:?}"));
        }
    }
    // The chip opens the trace log this process holds, and this process reads it back.
    let (x, y) = (w.create_buffer(16).map_err(e("x"))?, w.create_buffer(16).map_err(e("y"))?);
    x.write(0, &[1.5f32; 4]).map_err(e("x"))?;
    let (xt, yt) = (x.tensor(&[4], DataType::Float32).unwrap(), y.tensor(&[4], DataType::Float32).unwrap());
    let run = w
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            let mut a = TaskArgs::new();
            a.input(&xt)?.output(&yt)?;
            orch.submit_next_level(&double, a, CallConfig::default(), 0).map(|_| ())
        })
        .map_err(e("a captured run"))?;
    run.wait_timeout(BOUND).map_err(e("a captured run"))?;
    if y.read::<f32>(0, 4).map_err(e("y"))? != [3.0; 4] {
        return Err("the kernel did not double x".to_string());
    }
    let timeline = run.timeline().ok_or("a captured run has a timeline")?;
    let inner: Vec<&str> = timeline.inner_records().iter().map(|r| r.worker.as_str()).collect();
    if inner != ["chip 0 / core 0"] {
        return Err(format!("the timeline shows {inner:?} inside the chip's task, not its kernel"));
    }
    w.close().map_err(e("close"))
}

#[isolated_test]
fn host_buffers_work_after_the_programs_main_thread_has_exited() {
    let (mut report, report_w) = std::io::pipe().unwrap();
    // A program of its own, whose main thread (the forked thread) exits while another runs on.
    let child = fork_process(move || {
        let (leave, go) = mpsc::channel();
        let mut report_w = report_w;
        std::thread::spawn(move || {
            let outcome = std::panic::catch_unwind(|| after_the_main_thread(leave))
                .unwrap_or_else(|_| Err("panicked (see above)".to_string()));
            let code = match &outcome {
                Ok(()) => 0,
                Err(msg) => {
                    let _ = report_w.write_all(msg.as_bytes());
                    1
                }
            };
            exit_process(code);
        });
        if go.recv().is_ok() {
            exit_this_thread(); // as `pthread_exit` from `main`
        }
        102 // the other thread failed before it let this one go; it `_exit`s the process
    });
    let code = wait_process(child, 2 * BOUND);
    let mut said = String::new();
    report.read_to_string(&mut said).unwrap();
    assert_eq!(code, Some(0), "the program whose main thread exited failed: {said}");
}
