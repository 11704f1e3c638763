//! Independent runs (issue 31): runs submitted from several threads that touch no buffer in
//! common proceed side by side, so a run whose task hangs holds only the SUB worker that task
//! occupies and its own admission place; runs that name a buffer an earlier run still uses
//! stay ordered behind it.

mod common;

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use simpler::status::Level;
use simpler::{
    Buffer, CallableHandle, ErrorKind, HostArgs, HostFn, HostResult, OrchFn, Orchestrator, RunHandle,
    TaskArgs, Tensor, Worker, chip::CallConfig, chip::ChipFn,
};

/// Never returns (until its run is cancelled, which kills its worker). Tensor 0: one scratch
/// `u32` word (`NoDep`) that receives this process's id first, so the test knows it runs;
/// further tensors are only named (a buffer the run holds).
fn hang(args: &HostArgs<'_>) -> HostResult {
    words(args, 0)?[0].store(std::process::id(), Ordering::SeqCst);
    loop {
        std::thread::park();
    }
}

/// Word `i` of `b` as a one-element `u32` tensor.
fn word(b: &Buffer, i: usize) -> Tensor {
    b.view(
        simpler::memory::TensorView::new(4 * i as u64, &[1], None, simpler::DataType::Uint32).expect("view"),
    )
    .expect("tensor")
}

/// Submits a run of one `hang` task: its scratch word is word 0 of `flags`; given `holds`, the
/// task also writes it (tracked), so a later run that reads it is ordered behind this one.
fn hang_run(rig: &Rig, hang: &CallableHandle, flags: &Buffer, holds: Option<&Buffer>) -> RunHandle {
    rig.submit(|orch| {
        let mut a = TaskArgs::new();
        a.untracked(&word(flags, 0))?;
        if let Some(b) = holds {
            a.output(&u64s(b, 0, 1))?;
        }
        orch.submit_sub(hang, a).map(|_| ())
    })
    .expect("submit the hanging run")
}

/// Waits until word 0 of `flags` holds the pid of the `hang` task that runs; returns it.
fn wait_hanging(flags: &Buffer) -> i32 {
    let mut pid = 0;
    wait_for("the hanging task to start", Duration::from_secs(10), || {
        pid = read_u32(flags, 0, 1)[0];
        pid != 0
    });
    pid as i32
}

const THREADS: usize = 7;
const RUNS: usize = 20;

/// Seven threads each run `RUNS` runs of two chained `affine` tasks on a buffer of their own
/// (`Worker::run`, so every run waits for itself), each thread reporting on `done` once all its
/// runs finished; the caller's scope joins them.
fn run_independent<'scope, 'env>(
    s: &'scope std::thread::Scope<'scope, 'env>,
    rig: &'env Rig,
    affine: &'env CallableHandle,
    bufs: &'env [Buffer],
    done: mpsc::Sender<usize>,
) {
    for (t, buf) in bufs.iter().enumerate() {
        let done = done.clone();
        s.spawn(move || {
            for r in 0..RUNS as u64 {
                rig.run(|orch| {
                    let mut a = TaskArgs::new();
                    a.input(&u64s(buf, 0, 1))?.output(&u64s(buf, 1, 1))?.scalar(1).scalar(r);
                    orch.submit_sub(affine, a)?;
                    let mut b = TaskArgs::new();
                    b.input(&u64s(buf, 1, 1))?.output(&u64s(buf, 2, 1))?.scalar(2).scalar(0);
                    orch.submit_sub(affine, b).map(|_| ())
                })
                .unwrap_or_else(|e| panic!("thread {t}, run {r}: {e}"));
                assert_eq!(read_u64(buf, 1, 2), vec![r, 2 * r], "thread {t}, run {r}");
            }
            // The receiver may be gone when the test already failed.
            let _ = done.send(t);
        });
    }
}

/// How many of `THREADS` reports arrive on `rx` within `limit`.
fn finished_within(rx: &mpsc::Receiver<usize>, limit: Duration) -> usize {
    let until = std::time::Instant::now() + limit;
    let mut n = 0;
    while n < THREADS {
        match rx.recv_timeout(until.saturating_duration_since(std::time::Instant::now())) {
            Ok(_) => n += 1,
            Err(_) => break,
        }
    }
    n
}

/// Eight threads: one submits a run whose task hangs, seven each run 20 independent runs. The
/// seven finish while the first still hangs (before issue 31's fix none of their runs
/// dispatched: only the head of the run FIFO did, so all waited for the hung run's end).
#[isolated_test]
fn seven_threads_finish_their_runs_while_an_eighth_threads_run_hangs() {
    let (rig, [hang, affine]) = Rig::start(subs(4), [("hang", hang), ("affine", affine)]);
    let flags = u32_buffer(&rig, 1);
    let bufs: Vec<Buffer> = (0..THREADS).map(|_| u64_buffer(&rig, 3)).collect();
    let hung = hang_run(&rig, &hang, &flags, None);
    let stuck = wait_hanging(&flags);
    let (tx, rx) = mpsc::channel();
    let finished = std::thread::scope(|s| {
        run_independent(s, &rig, &affine, &bufs, tx);
        let finished = finished_within(&rx, Duration::from_secs(20));
        let still_hung = !hung.is_done();
        // Always released, so the threads end (also when the fix is missing) and are joined.
        assert!(hung.cancel(), "the hung run is cancelled");
        (finished, still_hung)
    });
    assert_eq!(
        finished,
        (THREADS, true),
        "threads whose {RUNS} runs all finished while the other thread's run hung (and whether it still hung)"
    );
    expect_err(hung.wait(), ErrorKind::Cancelled, &["hang"]);
    let killed: Vec<usize> =
        rig.pids().iter().enumerate().filter(|&(_, &p)| p == stuck).map(|(i, _)| i).collect();
    assert_eq!(killed.len(), 1, "the hung task ran on one of the SUB workers");
    for (i, w) in rig.workers().iter().enumerate() {
        assert_eq!(w.is_alive(), !killed.contains(&i), "only the hung task's worker was stopped: {w:?}");
    }
}

/// A run that reads what a hung run writes waits for it, while independent runs submitted
/// after it go ahead; once the hung run is cancelled, the waiting run runs.
#[isolated_test]
fn a_run_naming_a_buffer_of_a_hung_run_waits_while_independent_ones_proceed() {
    let (rig, [hang, affine, fill]) =
        Rig::start(subs(3).pending_run_depth(8), [("hang", hang), ("affine", affine), ("fill", fill)]);
    let flags = u32_buffer(&rig, 1);
    let held = u64_buffer(&rig, 1);
    let out = u64_buffer(&rig, 1);
    let hung = hang_run(&rig, &hang, &flags, Some(&held));
    wait_hanging(&flags);
    // Reads `held`, which the hung run's task writes.
    let dependent = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.input(&u64s(&held, 0, 1))?.output(&u64s(&out, 0, 1))?.scalar(3).scalar(1);
            orch.submit_sub(&affine, a).map(|_| ())
        })
        .unwrap();
    // Independent runs submitted after it finish (each waited for with a limit, so that the
    // hung run is still cancelled, and the test ends, if they do not).
    let other = u64_buffer(&rig, 5);
    let runs: Vec<RunHandle> = (0..5)
        .map(|i| {
            rig.submit(|orch| {
                let mut a = TaskArgs::new();
                a.output(&u64s(&other, i, 1))?.scalar(i as u64 + 1);
                orch.submit_sub(&fill, a).map(|_| ())
            })
            .expect("submit an independent run")
        })
        .collect();
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let left = || until.saturating_duration_since(std::time::Instant::now());
    let finished = runs.iter().filter(|r| r.wait_timeout(left()).is_ok()).count();
    let dependent_waited = !dependent.is_done() && read_u64(&out, 0, 1) == [0];
    assert!(hung.cancel());
    assert_eq!(finished, 5, "independent runs that finished while the hung run hung");
    assert_eq!(read_u64(&other, 0, 5), vec![1, 2, 3, 4, 5]);
    assert!(dependent_waited, "the run reading the hung run's buffer waited for it, and nothing of it ran");
    expect_err(hung.wait(), ErrorKind::Cancelled, &["hang"]);
    dependent.wait().expect("the dependent run runs once the hung one ended");
    assert_eq!(read_u64(&out, 0, 1), vec![1], "it read the buffer after the hung run ended (3 * 0 + 1)");
}

/// At an L4, runs go to nested L3 Workers: task `l3_hang` runs `hang` on the nested Worker's
/// SUB worker (tensor 0: its scratch word).
fn l3_hang(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    let mut a = TaskArgs::new();
    a.untracked(args.tensor(0).expect("the scratch word"))?;
    orch.submit_sub(&HostFn::new("hang", hang).handle(), a).map(|_| ())
}

/// `affine` on the nested Worker's SUB worker, with the task's tensors and scalars.
fn l3_affine(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    let (x, y) = (args.tensor(0).expect("x"), args.tensor(1).expect("y"));
    let mut a = TaskArgs::new();
    a.input(x)?.output(y)?.scalar(args.scalar_at(0).expect("mul")).scalar(args.scalar_at(1).expect("add"));
    orch.submit_sub(&HostFn::new("affine", affine).handle(), a).map(|_| ())
}

/// Runs `RUNS_BESIDE` runs from each of `THREADS_BESIDE` threads, each run one task `one(orch,
/// buf, r)` on a buffer of the thread's own whose word 1 it sets to `r + 1` (checked), while
/// `hung` hangs; returns how many threads finished within 20 s and whether `hung` still hung
/// then. `hung` is cancelled before the threads are joined, so they end also when they cannot
/// finish.
fn finish_beside_hung(
    rig: &Rig,
    hung: &RunHandle,
    one: &(dyn Fn(&mut Orchestrator<'_>, &Buffer, u64) -> simpler::Result<()> + Sync),
) -> (usize, bool) {
    let bufs: Vec<Buffer> = (0..THREADS_BESIDE).map(|_| u64_buffer(rig, 2)).collect();
    let (tx, rx) = mpsc::channel();
    let outcome = std::thread::scope(|s| {
        for (t, buf) in bufs.iter().enumerate() {
            let tx = tx.clone();
            s.spawn(move || {
                for r in 0..RUNS_BESIDE {
                    rig.run(|orch| one(orch, buf, r)).unwrap_or_else(|e| panic!("thread {t}, run {r}: {e}"));
                    assert_eq!(read_u64(buf, 1, 1), vec![r + 1], "thread {t}, run {r}");
                }
                let _ = tx.send(t);
            });
        }
        drop(tx);
        let until = std::time::Instant::now() + Duration::from_secs(20);
        let mut n = 0;
        while n < THREADS_BESIDE
            && rx.recv_timeout(until.saturating_duration_since(std::time::Instant::now())).is_ok()
        {
            n += 1;
        }
        let still_hung = !hung.is_done();
        // Cancelled before the scope joins the threads (they may wait behind it), asserted after.
        let cancelled = hung.cancel();
        (n, still_hung, cancelled)
    });
    assert!(outcome.2, "the hung run is cancelled");
    (outcome.0, outcome.1)
}

const THREADS_BESIDE: usize = 3;
const RUNS_BESIDE: u64 = 8;

/// `y = x + r + 1` for the task of run `r` of [`finish_beside_hung`], through `affine`.
fn affine_args(buf: &Buffer, r: u64) -> simpler::Result<TaskArgs> {
    let mut a = TaskArgs::new();
    a.input(&u64s(buf, 0, 1))?.output(&u64s(buf, 1, 1))?.scalar(1).scalar(r + 1);
    Ok(a)
}

/// The same at L4, whose workers are nested L3 Workers: while one thread's run hangs on nested
/// Worker 0, three threads' independent runs on nested Worker 1 all finish (before, runs with
/// next-level tasks waited for their turn, so none did until the hung run ended), also beside
/// an independent run waiting for Worker 0, which takes no lease while it cannot start.
#[isolated_test]
fn at_l4_runs_on_one_nested_worker_finish_while_a_run_on_another_hangs() {
    let nested = || {
        let mut l3 = Worker::builder().sub_workers(1).build().unwrap();
        l3.register(HostFn::new("hang", hang)).unwrap();
        l3.register(HostFn::new("affine", affine)).unwrap();
        l3
    };
    let mut rig = Rig::new(
        Worker::builder().level(Level::Network1).pending_run_depth(8).worker(nested()).worker(nested()),
    );
    let l3_hang = rig.register_orch(OrchFn::new("l3_hang", l3_hang)).unwrap();
    let l3_affine = rig.register_orch(OrchFn::new("l3_affine", l3_affine)).unwrap();
    rig.init();
    let flags = u32_buffer(&rig, 1);
    let hung = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.untracked(&word(&flags, 0))?;
            orch.submit_next_level(&l3_hang, a, CallConfig::default(), 0).map(|_| ())
        })
        .unwrap();
    wait_hanging(&flags);
    // An independent run (a buffer of its own) whose task goes to nested Worker 0, which the
    // hung run holds: it must not take the lease the runs on Worker 1 need while it waits.
    let own = u64_buffer(&rig, 2);
    let behind = rig
        .submit(|orch| {
            orch.submit_next_level(&l3_affine, affine_args(&own, 6)?, CallConfig::default(), 0).map(|_| ())
        })
        .unwrap();
    let outcome = finish_beside_hung(&rig, &hung, &|orch, buf, r| {
        orch.submit_next_level(&l3_affine, affine_args(buf, r)?, CallConfig::default(), 1).map(|_| ())
    });
    assert_eq!(
        outcome,
        (THREADS_BESIDE, true),
        "threads whose {RUNS_BESIDE} runs on nested Worker 1 all finished while the run on nested Worker 0 hung"
    );
    expect_err(hung.wait(), ErrorKind::Cancelled, &["l3_hang"]);
    // Its Worker was stopped with the hung task, so it could never run.
    expect_err(behind.wait(), ErrorKind::WorkerDied, &["l3_affine", "worker 0 is dead"]);
    let alive: Vec<bool> = rig.workers().iter().map(|w| w.is_alive()).collect();
    assert_eq!(alive, vec![false, true], "only the nested Worker of the hung task was stopped");
}

/// A chip kernel that announces itself (marker `independent-chip-hang` of the test, the
/// chip's parent), then never returns (its chip is stopped when its run is cancelled).
fn chip_hang(_: &HostArgs<'_>) -> HostResult {
    announce_to_parent("independent-chip-hang", "running")?;
    loop {
        std::thread::park();
    }
}

/// The same at L3, whose workers are chips: while one thread's run hangs on chip 0, three
/// threads' independent runs on chip 1 all finish (before, runs with chip tasks waited for
/// their turn: the chips' two pipeline leases were shared by every chip, and behind a hung head
/// its first successor took the second). Also beside an independent run that waits for chip 0
/// and has run a task on chip 1 (it holds a lease on both until it ends): the hung run never
/// uses chip 1, so the chip's other lease is not kept for it.
#[isolated_test]
fn at_l3_runs_on_one_chip_finish_while_a_run_on_another_hangs() {
    let marker = marker_file("independent-chip-hang", std::process::id());
    let _files = TempFiles::new([marker.clone()]);
    let mut rig = Rig::new(Worker::builder().chips(2).pending_run_depth(8));
    let chip_hang = rig.register_chip(ChipFn::kernel("chip_hang", chip_hang)).unwrap();
    let chip_affine = rig.register_chip(ChipFn::kernel("chip_affine", affine)).unwrap();
    rig.init();
    let hung = rig
        .submit(|orch| {
            orch.submit_next_level(&chip_hang, TaskArgs::new(), CallConfig::default(), 0).map(|_| ())
        })
        .unwrap();
    wait_for("the hanging kernel to start", Duration::from_secs(10), || marker.exists());
    let (own, also) = (u64_buffer(&rig, 2), u64_buffer(&rig, 2));
    let behind = rig
        .submit(|orch| {
            orch.submit_next_level(&chip_affine, affine_args(&own, 6)?, CallConfig::default(), 0)?;
            orch.submit_next_level(&chip_affine, affine_args(&also, 6)?, CallConfig::default(), 1).map(|_| ())
        })
        .unwrap();
    wait_for("the behind run's task on chip 1", Duration::from_secs(10), || behind.progress().completed == 1);
    assert_eq!(read_u64(&also, 1, 1), vec![7], "its task on chip 1 ran (0 + 7)");
    let outcome = finish_beside_hung(&rig, &hung, &|orch, buf, r| {
        orch.submit_next_level(&chip_affine, affine_args(buf, r)?, CallConfig::default(), 1).map(|_| ())
    });
    assert_eq!(
        outcome,
        (THREADS_BESIDE, true),
        "threads whose {RUNS_BESIDE} runs on chip 1 all finished while the run on chip 0 hung"
    );
    expect_err(hung.wait(), ErrorKind::Cancelled, &["chip_hang"]);
    expect_err(behind.wait(), ErrorKind::WorkerDied, &["chip_affine"]);
    let alive: Vec<bool> = rig.workers().iter().map(|w| w.is_alive()).collect();
    assert_eq!(alive, vec![false, true], "only the chip of the hung task was stopped");
}

/// Where `chip_gated` announces that it runs, and the gate it waits for.
fn chip_gate(test_pid: u32, what: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("simpler-rt-independent-chip-{what}-{test_pid}"))
}

/// `affine` once the test opens the gate (at most 30 s); announces that it runs first.
fn chip_gated(args: &HostArgs<'_>) -> HostResult {
    let test = std::os::unix::process::parent_id();
    std::fs::write(chip_gate(test, "gated"), b"running")?;
    if !spin_until(std::time::Instant::now() + Duration::from_secs(30), || chip_gate(test, "gate").exists()) {
        return Err("the gate never opened".into());
    }
    affine(args)
}

/// Runs dispatching before their turn pipeline on a chip as the head and its successor do:
/// while one thread's run hangs on chip 0, run A's task runs on chip 1 (held at a gate), and
/// the task of run B, submitted after it, is prepared on chip 1 meanwhile (staged), then
/// launched once A's ends.
#[isolated_test]
fn at_l3_runs_before_their_turn_prepare_beside_each_other_on_a_chip() {
    let pid = std::process::id();
    let (marker, gated, gate) =
        (marker_file("independent-chip-hang", pid), chip_gate(pid, "gated"), chip_gate(pid, "gate"));
    let _files = TempFiles::new([marker.clone(), gated.clone(), gate.clone()]);
    // One core: run B's task waits for run A's, prepared meanwhile.
    let mut rig = Rig::new(Worker::builder().chips(2).chip_cores(1).pending_run_depth(8));
    let chip_hang = rig.register_chip(ChipFn::kernel("chip_hang", chip_hang)).unwrap();
    let chip_gated = rig.register_chip(ChipFn::kernel("chip_gated", chip_gated)).unwrap();
    let chip_affine = rig.register_chip(ChipFn::kernel("chip_affine", affine)).unwrap();
    rig.init();
    let hung = rig
        .submit(|orch| {
            orch.submit_next_level(&chip_hang, TaskArgs::new(), CallConfig::default(), 0).map(|_| ())
        })
        .unwrap();
    wait_for("the hanging kernel to start", Duration::from_secs(10), || marker.exists());
    let (a_buf, b_buf) = (u64_buffer(&rig, 2), u64_buffer(&rig, 2));
    let a = rig
        .submit(|orch| {
            orch.submit_next_level(&chip_gated, affine_args(&a_buf, 1)?, CallConfig::default(), 1).map(|_| ())
        })
        .unwrap();
    wait_for("run A's kernel to start on chip 1", Duration::from_secs(10), || gated.exists());
    let b = rig
        .submit_with(simpler::RunOptions::new().capture_dag(), |orch, _, _| {
            orch.submit_next_level(&chip_affine, affine_args(&b_buf, 2)?, CallConfig::default(), 1)
                .map(|_| ())
        })
        .unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let staged = spin_until(until, || b.progress().staged >= 1);
    let b_waited = !b.is_done();
    std::fs::write(&gate, b"open").unwrap();
    a.wait().unwrap();
    b.wait().unwrap();
    assert!(hung.cancel());
    assert!(staged && b_waited, "run B's task was prepared on chip 1 while run A's ran there");
    assert_eq!((read_u64(&a_buf, 1, 1), read_u64(&b_buf, 1, 1)), (vec![2], vec![3]));
    let record = b.timeline().unwrap().records()[0].clone();
    assert!(record.staged_ns.is_some() && record.started_ns.is_some(), "{record:?}");
    expect_err(hung.wait(), ErrorKind::Cancelled, &["chip_hang"]);
}
