//! Fault injection across many runs: SUB workers SIGKILLed at random moments of long DAGs;
//! host functions that panic, fail, end their process or hang past their run's deadline at
//! random; chip children, nested L3 Workers and the SUB workers and chip below them
//! (grandchildren of this process) SIGKILLed at random under an L4 Worker. Every run must end,
//! within a bound, with success or a named error; the Worker keeps running what does not need
//! the dead parts (or replaces them, when built to); it must then close cleanly and leave no
//! process and no host buffer (the rig checks that when it drops), and this process no file
//! descriptor or mapping more than before. Each test has its seed, so a failure can be
//! replayed (the kill times follow the machine's speed, the choices the seed).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use simpler::{ErrorKind, HostArgs, HostResult, RunOptions, TaskArgs};

/// A small seedable generator (xorshift64*), so a failure can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Kills one of its victims now and then, at random (seeded), sparing one so that some runs
/// can still finish, until it is stopped (also when the test panics: it stops when dropped).
struct Killer {
    done: Arc<AtomicBool>,
    /// The processes it may kill: the test adds the replacements of dead workers.
    victims: Arc<Mutex<Vec<i32>>>,
    killed: Arc<Mutex<Vec<i32>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Killer {
    /// Every 0.5-4.5 ms, one chance in `odds` to SIGKILL one of `victims` not killed yet, while
    /// two or more are left.
    fn start(seed: u64, victims: Vec<i32>, odds: u64) -> Killer {
        let done = Arc::new(AtomicBool::new(false));
        let victims = Arc::new(Mutex::new(victims));
        let killed = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (done, victims, killed) = (done.clone(), victims.clone(), killed.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(seed);
                while !done.load(Ordering::SeqCst) {
                    let wait = Instant::now() + Duration::from_micros(500 + rng.below(4_000));
                    while Instant::now() < wait && !done.load(Ordering::SeqCst) {
                        std::thread::yield_now();
                    }
                    let mut k = killed.lock().unwrap();
                    let left: Vec<i32> =
                        victims.lock().unwrap().iter().copied().filter(|p| !k.contains(p)).collect();
                    if left.len() >= 2 && rng.below(odds) == 0 {
                        let pid = left[rng.below(left.len() as u64) as usize];
                        sigkill(pid);
                        k.push(pid);
                    }
                }
            })
        };
        Killer { done, victims, killed, thread: Some(thread) }
    }

    /// Adds processes it may kill (replacements of the ones it killed).
    fn also(&self, pids: impl IntoIterator<Item = i32>) {
        let mut v = self.victims.lock().unwrap();
        for p in pids {
            if !v.contains(&p) {
                v.push(p);
            }
        }
    }

    /// Stops it; returns the processes it killed (its thread's panic, if any, goes on).
    fn stop(mut self) -> Vec<i32> {
        if let Err(panic) = self.end() {
            std::panic::resume_unwind(panic);
        }
        self.killed.lock().unwrap().clone()
    }

    fn end(&mut self) -> std::thread::Result<()> {
        self.done.store(true, Ordering::SeqCst);
        self.thread.take().map_or(Ok(()), std::thread::JoinHandle::join)
    }
}

impl Drop for Killer {
    fn drop(&mut self) {
        // (Only when the test panicked first: `stop` reports the thread's own panic.)
        let _ = self.end();
    }
}

/// The errors a run may end with when its workers die or its functions fail.
const NAMED: [ErrorKind; 4] =
    [ErrorKind::WorkerDied, ErrorKind::Poisoned, ErrorKind::TaskFailed, ErrorKind::InvalidState];

/// A chain of `n` tasks over one buffer: fill, then `n - 1` affine steps, each waiting for the
/// one before (read after write).
fn chain(
    orch: &mut simpler::Orchestrator<'_>,
    fill: &simpler::CallableHandle,
    affine: &simpler::CallableHandle,
    a: &simpler::Tensor,
    b: &simpler::Tensor,
    n: usize,
) -> simpler::Result<()> {
    let mut first = TaskArgs::new();
    first.output(a)?.scalar(1);
    orch.submit_sub(fill, first)?;
    for i in 1..n {
        let (src, dst) = if i % 2 == 1 { (a, b) } else { (b, a) };
        let mut step = TaskArgs::new();
        step.input(src)?.output(dst)?.scalar(1).scalar(1);
        orch.submit_sub(affine, step)?;
    }
    Ok(())
}

#[isolated_test]
fn sub_workers_killed_at_random_during_long_dags_end_every_run_with_a_named_error() {
    let seed = 0x5eed_0001;
    let (rig, [fill, affine]) = Rig::start(subs(4), [("fill", fill), ("affine", affine)]);
    // Four independent chains, so every SUB worker is busy when the killer strikes.
    let bufs: Vec<_> = (0..8).map(|_| u64_buffer(&rig, 4096)).collect();
    let views: Vec<_> = bufs.iter().map(|b| u64s(b, 0, 4096)).collect();
    let (ba, ta) = (&bufs[0], &views[0]);
    let killer = Killer::start(seed, rig.child_pids(), 3);
    let (mut ok, mut failed) = (0, 0);
    for run in 0..40 {
        let start = Instant::now();
        let handle = rig.submit(|orch| {
            for c in 0..4 {
                chain(orch, &fill, &affine, &views[2 * c], &views[2 * c + 1], 50)?;
            }
            Ok(())
        });
        let result = handle.and_then(|h| h.wait_timeout(Duration::from_secs(20)));
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "run {run} (seed {seed:#x}) took {:?}",
            start.elapsed()
        );
        match result {
            Ok(()) => ok += 1,
            Err(e) => {
                assert!(
                    NAMED.contains(&e.kind()),
                    "run {run} (seed {seed:#x}) ended with an unnamed error: {e:?}"
                );
                assert!(!e.message().is_empty());
                failed += 1;
            }
        }
    }
    let killed = killer.stop().len();
    eprintln!(
        "seed {seed:#x}: {ok} runs succeeded, {failed} ended with a named error, {killed} SUB workers killed"
    );
    // The survivors still work: a run on them succeeds.
    let mut check = TaskArgs::new();
    check.output(ta).unwrap().scalar(5);
    rig.run(|orch| orch.submit_sub(&fill, check).map(|_| ())).unwrap();
    assert_eq!(read_u64(ba, 0, 4096), vec![5; 4096]);
}

/// `out = a + b` (tensors 0, 1 and 2, `u64`, element by element, wrapping).
fn sum2(args: &HostArgs<'_>) -> HostResult {
    let (a, b) = (args.input::<u64>(0)?.to_vec(), args.input::<u64>(1)?.to_vec());
    for ((o, x), y) in args.output::<u64>(2)?.iter_mut().zip(a).zip(b) {
        *o = x.wrapping_add(y);
    }
    Ok(())
}

/// Stencil steps of two points, each reading both points of the step before (the graph of a
/// width-2 Task Bench stencil: a task waits for two running producers and is chained behind
/// one and after the other), on three SUB workers killed at random and replaced at the next
/// submit: every run ends in time, with success or a named error, and the workers then run a
/// stencil to its right result.
#[isolated_test]
fn sub_workers_killed_at_random_during_stencils_end_every_run_with_a_named_error() {
    let seed = 0x5eed_0005;
    const STEPS: usize = 40;
    let (rig, [fill, sum]) = Rig::start(subs(3).replace_dead_workers(true), [("fill", fill), ("sum2", sum2)]);
    // Generation g of point p: buffer 2g + p.
    let bufs: Vec<_> = (0..4).map(|_| u64_buffer(&rig, 512)).collect();
    let views: Vec<_> = bufs.iter().map(|b| u64s(b, 0, 512)).collect();
    let stencil = |orch: &mut simpler::Orchestrator<'_>| -> simpler::Result<()> {
        for v in &views[..2] {
            let mut a = TaskArgs::new();
            a.output(v)?.scalar(1);
            orch.submit_sub(&fill, a)?;
        }
        for s in 1..STEPS {
            let (prev, now) = ((s - 1) % 2, s % 2);
            for p in 0..2 {
                let mut a = TaskArgs::new();
                a.input(&views[2 * prev])?.input(&views[2 * prev + 1])?.output(&views[2 * now + p])?;
                orch.submit_sub(&sum, a)?;
            }
        }
        Ok(())
    };
    let killer = Killer::start(seed, rig.child_pids(), 8);
    let (mut ok, mut failed) = (0, 0);
    for run in 0..200 {
        let start = Instant::now();
        let result = rig.submit(stencil).and_then(|h| h.wait_timeout(Duration::from_secs(20)));
        killer.also(rig.child_pids());
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "run {run} (seed {seed:#x}) took {:?}",
            start.elapsed()
        );
        match result {
            Ok(()) => ok += 1,
            Err(e) => {
                assert!(
                    NAMED.contains(&e.kind()),
                    "run {run} (seed {seed:#x}) ended with an unnamed error: {e:?}"
                );
                failed += 1;
            }
        }
    }
    let killed = killer.stop();
    eprintln!(
        "seed {seed:#x}: {ok} stencils succeeded, {failed} ended with a named error, {} SUB workers killed",
        killed.len()
    );
    assert!(!killed.is_empty(), "the killer struck during the runs");
    // The last one killed may have died after the last run ended: once the Worker has seen
    // it die (its monitor reaps it), it is replaced.
    wait_for("the Worker to see the killed workers dead", Duration::from_secs(10), || {
        rig.workers().iter().all(|w| !killed.contains(&w.pid) || !w.is_alive())
    });
    rig.replace_dead_workers().expect("the dead workers are replaced");
    rig.run(stencil).expect("the workers run a stencil");
    let last = 2 * ((STEPS - 1) % 2);
    assert_eq!(read_u64(&bufs[last], 0, 512), vec![1u64 << (STEPS - 1); 512], "2^(steps-1) at each point");
}

/// Succeeds, fails, panics or ends its process, by scalar 0 (0, 1, 2, 3).
fn flaky(args: &HostArgs<'_>) -> HostResult {
    match args.scalar(0)? {
        0 => Ok(()),
        1 => Err("flaky says no".into()),
        2 => panic!("flaky panicked"),
        _ => std::process::exit(3),
    }
}

#[isolated_test]
fn host_functions_that_fail_panic_or_exit_at_random_end_runs_with_named_errors() {
    let seed = 0x5eed_0002;
    let mut rng = Rng(seed);
    let (rig, [flaky]) = Rig::start(subs(3), [("flaky", flaky)]);
    let mut exits = 0;
    for run in 0..40 {
        // At most two workers may end their process, so one is left for the rest.
        let mut choices: Vec<u64> = (0..8).map(|_| [0, 0, 0, 1, 2, 3][rng.below(6) as usize]).collect();
        for c in choices.iter_mut() {
            if *c == 3 {
                if exits < 2 {
                    exits += 1;
                } else {
                    *c = 0;
                }
            }
        }
        let start = Instant::now();
        let result = rig.run(|orch| {
            for &c in &choices {
                let mut a = TaskArgs::new();
                a.scalar(c);
                orch.submit_sub(&flaky, a)?;
            }
            Ok(())
        });
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "run {run} (seed {seed:#x}) took {:?}",
            start.elapsed()
        );
        let expect_ok = choices.iter().all(|&c| c == 0);
        match result {
            Ok(()) => assert!(expect_ok, "run {run}: {choices:?} cannot all succeed"),
            Err(e) => {
                assert!(!expect_ok, "run {run}: {choices:?} should succeed, got {e:?}");
                assert!(NAMED.contains(&e.kind()), "run {run} (seed {seed:#x}): unnamed error {e:?}");
                let said = e.message();
                assert!(
                    said.contains("flaky says no")
                        || said.contains("panicked")
                        || said.contains("exit")
                        || said.contains("dead")
                        || said.contains("died"),
                    "run {run}: the error names no cause: {said}"
                );
            }
        }
    }
    // One SUB worker is left at least; a clean run still succeeds on it.
    let mut a = TaskArgs::new();
    a.scalar(0);
    rig.run(|orch| orch.submit_sub(&flaky, a).map(|_| ())).unwrap();
}

#[isolated_test]
fn chip_children_killed_at_random_during_kernel_chains_end_every_run_with_a_named_error() {
    let seed = 0x5eed_0003;
    let mut rig = Rig::new(simpler::Worker::builder().chips(3).chip_memory(16 << 20).chip_cores(1));
    let k = rig.register_chip(simpler::chip::ChipFn::kernel("double", double)).unwrap();
    rig.init();
    let bufs: Vec<_> = (0..6).map(|_| rig.create_buffer(4 * 1024).unwrap()).collect();
    let views: Vec<_> = bufs.iter().map(|b| b.tensor(&[1024], simpler::DataType::Float32).unwrap()).collect();
    let victims = rig.child_pids();
    let done = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(Mutex::new(Vec::new()));
    let killer = {
        let (done, killed, victims) = (done.clone(), killed.clone(), victims.clone());
        std::thread::spawn(move || {
            let mut rng = Rng(seed);
            while !done.load(Ordering::SeqCst) {
                let wait = Instant::now() + Duration::from_micros(1_000 + rng.below(8_000));
                while Instant::now() < wait && !done.load(Ordering::SeqCst) {
                    std::thread::yield_now();
                }
                let mut k = killed.lock().unwrap();
                if k.len() + 1 < victims.len() && rng.below(4) == 0 {
                    let pid = victims[rng.below(victims.len() as u64) as usize];
                    if !k.contains(&pid) {
                        sigkill(pid);
                        k.push(pid);
                    }
                }
            }
        })
    };
    let (mut ok, mut failed) = (0, 0);
    for run in 0..30 {
        let start = Instant::now();
        // One chain of 20 kernels per chip, ping-ponging between two host buffers.
        let handle = rig.submit(|orch| {
            for chip in 0..3u32 {
                let (a, b) = (&views[2 * chip as usize], &views[2 * chip as usize + 1]);
                for i in 0..20 {
                    let (src, dst) = if i % 2 == 0 { (a, b) } else { (b, a) };
                    let mut args = TaskArgs::new();
                    args.input(src)?.output(dst)?;
                    orch.submit_next_level(&k, args, simpler::chip::CallConfig::default(), chip)?;
                }
            }
            Ok(())
        });
        let result = handle.and_then(|h| h.wait_timeout(Duration::from_secs(20)));
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "run {run} (seed {seed:#x}) took {:?}",
            start.elapsed()
        );
        match result {
            Ok(()) => ok += 1,
            Err(e) => {
                assert!(
                    NAMED.contains(&e.kind()),
                    "run {run} (seed {seed:#x}) ended with an unnamed error: {e:?}"
                );
                assert!(e.message().contains("chip"), "run {run}: the error names no chip: {e}");
                failed += 1;
            }
        }
    }
    done.store(true, Ordering::SeqCst);
    killer.join().unwrap();
    eprintln!(
        "seed {seed:#x}: {ok} runs succeeded, {failed} ended with a named error, {} chips killed",
        killed.lock().unwrap().len()
    );
    assert_eq!(ok + failed, 30);
}

// ------------------------------------------------------------------ a tree of nested Workers

/// `t0[i] += 1` (tensor 0: `u64`, `InOut`).
fn bump(args: &HostArgs<'_>) -> HostResult {
    for x in args.output::<u64>(0)? {
        *x += 1;
    }
    Ok(())
}

/// `t0[0] = this process's id` (tensor 0: one writable `u32`): a chip kernel that tells which
/// process runs the chip.
fn chip_pid(args: &HostArgs<'_>) -> HostResult {
    args.output::<u32>(0)?[0] = std::process::id();
    Ok(())
}

/// L3 orchestration: `s0` `bump` tasks on tensor 0, and as many on tensor 1: two chains, one
/// per SUB worker.
fn l3_bumps(
    orch: &mut simpler::Orchestrator<'_>,
    args: &TaskArgs,
    _: &simpler::chip::CallConfig,
) -> simpler::Result<()> {
    let bump = simpler::HostFn::new("bump", bump).handle();
    let n = args.scalar_at(0).expect("a count");
    for _ in 0..n {
        for t in 0..2 {
            let mut a = TaskArgs::new();
            a.inout(args.tensor(t).expect("two tensors"))?;
            orch.submit_sub(&bump, a)?;
        }
    }
    Ok(())
}

/// L3 orchestration: `s0` `double` kernels on chip 0, ping-ponging between tensors 0 and 1
/// (`f32`), so an even count leaves `t0 * 2^s0` in tensor 0.
fn l3_doubles(
    orch: &mut simpler::Orchestrator<'_>,
    args: &TaskArgs,
    _: &simpler::chip::CallConfig,
) -> simpler::Result<()> {
    let double = simpler::chip::ChipFn::kernel("double", double).handle();
    let (a, b) = (args.tensor(0).expect("tensor 0"), args.tensor(1).expect("tensor 1"));
    for i in 0..args.scalar_at(0).expect("a count") {
        let (src, dst) = if i % 2 == 0 { (a, b) } else { (b, a) };
        let mut k = TaskArgs::new();
        k.input(src)?.output(dst)?;
        orch.submit_next_level(&double, k, simpler::chip::CallConfig::default(), 0)?;
    }
    Ok(())
}

/// L3 orchestration: `t_last = sum of the earlier tensors` on a SUB worker.
fn l3_sum(
    orch: &mut simpler::Orchestrator<'_>,
    args: &TaskArgs,
    _: &simpler::chip::CallConfig,
) -> simpler::Result<()> {
    let sum = simpler::HostFn::new("sum", sum).handle();
    let n = args.tensor_count();
    let mut a = TaskArgs::new();
    for i in 0..n - 1 {
        a.input(args.tensor(i).expect("an input"))?;
    }
    a.output(args.tensor(n - 1).expect("the output"))?;
    orch.submit_sub(&sum, a).map(|_| ())
}

/// L3 orchestration: chip 0 writes its process id into tensor 0 (one `u32`).
fn l3_chip_pid(
    orch: &mut simpler::Orchestrator<'_>,
    args: &TaskArgs,
    _: &simpler::chip::CallConfig,
) -> simpler::Result<()> {
    let k = simpler::chip::ChipFn::kernel("chip_pid", chip_pid).handle();
    let mut a = TaskArgs::new();
    a.output(args.tensor(0).expect("tensor 0"))?;
    orch.submit_next_level(&k, a, simpler::chip::CallConfig::default(), 0).map(|_| ())
}

/// The parent of process `pid` (`/proc/<pid>/stat`), while it has not exited.
fn live_parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut rest = stat.rsplit_once(')')?.1.split_whitespace();
    let state = rest.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    rest.next()?.parse().ok()
}

/// One process of the tree under the L4: a nested L3 Worker, or one of its SUB workers or its
/// chip; what the test knows of it.
#[derive(Clone, Copy, Debug)]
struct Part {
    pid: i32,
    /// The process it is a child of.
    parent: i32,
    /// The nested Worker it belongs to (is, or is below).
    l3: usize,
    kind: PartKind,
    dead: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum PartKind {
    L3,
    Sub,
    Chip,
}

struct TreeModel(Vec<Part>);

impl TreeModel {
    fn live(&self, l3: usize, kind: PartKind) -> usize {
        self.0.iter().filter(|p| p.l3 == l3 && p.kind == kind && !p.dead).count()
    }

    /// True while nested Worker `l3` is alive with a SUB worker: it can run `l3_bumps`.
    fn subs_usable(&self, l3: usize) -> bool {
        self.live(l3, PartKind::L3) == 1 && self.live(l3, PartKind::Sub) > 0
    }

    fn chip_usable(&self, l3: usize) -> bool {
        self.live(l3, PartKind::L3) == 1 && self.live(l3, PartKind::Chip) > 0
    }

    /// Kills part `i` (and, for a nested Worker, marks what is below it dead too), unless that
    /// would leave no nested Worker able to run SUB tasks. Returns the pid killed.
    fn kill(&mut self, i: usize) -> Option<i32> {
        let victim = self.0[i];
        if victim.dead {
            return None;
        }
        let mut after: Vec<Part> = self.0.clone();
        for p in after.iter_mut() {
            if p.pid == victim.pid || (victim.kind == PartKind::L3 && p.l3 == victim.l3) {
                p.dead = true;
            }
        }
        let after = TreeModel(after);
        if !(0..2).any(|l3| after.subs_usable(l3)) {
            return None;
        }
        // Only a process still a child of its parent (so its pid is not reused): SIGKILL.
        if live_parent(victim.pid) != Some(victim.parent) {
            return None;
        }
        sigkill(victim.pid);
        *self = after;
        Some(victim.pid)
    }
}

#[isolated_test]
fn nested_workers_and_grandchildren_killed_at_random_end_every_run_with_a_named_error() {
    use simpler::{DataType, HostFn, OrchFn, Worker, chip::CallConfig, chip::ChipFn, status::Level};
    let seed = 0x5eed_0046;
    let mut rng = Rng(seed);
    // L3 0: two SUB workers and a chip; L3 1: two SUB workers.
    let mut l3_chip =
        Worker::builder().sub_workers(2).chips(1).chip_memory(16 << 20).chip_cores(1).build().unwrap();
    let mut l3_subs = Worker::builder().sub_workers(2).build().unwrap();
    for l3 in [&mut l3_chip, &mut l3_subs] {
        l3.register(HostFn::new("bump", bump)).unwrap();
        l3.register(HostFn::new("sum", sum)).unwrap();
    }
    l3_chip.register_chip(ChipFn::kernel("double", double)).unwrap();
    l3_chip.register_chip(ChipFn::kernel("chip_pid", chip_pid)).unwrap();
    let mut rig = Rig::new(
        Worker::builder()
            .level(Level::Network1)
            .backpressure_timeout(Duration::from_secs(5))
            .worker(l3_chip)
            .worker(l3_subs),
    );
    let bumps = rig.register_orch(OrchFn::new("l3_bumps", l3_bumps)).unwrap();
    let doubles = rig.register_orch(OrchFn::new("l3_doubles", l3_doubles)).unwrap();
    let summed = rig.register_orch(OrchFn::new("l3_sum", l3_sum)).unwrap();
    let whoami = rig.register_orch(OrchFn::new("l3_chip_pid", l3_chip_pid)).unwrap();
    rig.init();

    // Which process is what: the chip of L3 0 tells its pid; the rest below each L3 are SUB
    // workers.
    let pid_word = u32_buffer(&rig, 1);
    let pid_t = words_of(&pid_word);
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.output(&pid_t)?;
        orch.submit_next_level(&whoami, a, CallConfig::default(), 0).map(|_| ())
    })
    .unwrap();
    let chip = read_u32(&pid_word, 0, 1)[0] as i32;
    let mut parts = Vec::new();
    for (l3, &pid) in rig.pids().iter().enumerate() {
        parts.push(Part { pid, parent: std::process::id() as i32, l3, kind: PartKind::L3, dead: false });
        let below: Vec<i32> = descendants(pid).into_iter().skip(1).collect();
        assert_eq!(below.len(), if l3 == 0 { 3 } else { 2 }, "the processes below L3 {l3}: {below:?}");
        for p in below {
            let kind = if p == chip { PartKind::Chip } else { PartKind::Sub };
            parts.push(Part { pid: p, parent: pid, l3, kind, dead: false });
        }
    }
    assert!(parts.iter().any(|p| p.kind == PartKind::Chip), "the chip {chip} is below L3 0: {parts:?}");
    let mut tree = TreeModel(parts);

    const N: usize = 16384;
    const BUMPS: u64 = 6; // SUB tasks per chain per L3 task
    const RUNS: usize = 40;
    // Per L3: two u64 tensors bumped by its SUB workers; L3 0 also two f32 tensors for its chip.
    let ints: Vec<_> = (0..4).map(|_| u64_buffer(&rig, N)).collect();
    let int_t: Vec<_> = ints.iter().map(|b| u64s(b, 0, N)).collect();
    let floats: Vec<_> = (0..2).map(|_| rig.create_buffer(N * 4).unwrap()).collect();
    let float_t: Vec<_> = floats.iter().map(|b| b.tensor(&[N as u32], DataType::Float32).unwrap()).collect();
    let total = u64_buffer(&rig, N);
    let total_t = u64s(&total, 0, N);

    // One run: per usable L3, three L3 tasks in a chain (each bumping both its tensors BUMPS
    // times, on its two SUB workers); L3 0's chip doubles four times; then one L3 task sums the
    // first tensor of each.
    let submit = |tree: &TreeModel, at: usize| {
        for b in ints.iter().chain([&total]) {
            b.write(0, &[0u64; N]).unwrap();
        }
        floats[0].write(0, &[1.0f32; N]).unwrap();
        let subs: Vec<usize> = (0..2).filter(|&l3| tree.subs_usable(l3)).collect();
        let chip_ok = tree.chip_usable(0);
        let handle = rig.submit(|orch| {
            for &l3 in &subs {
                for _ in 0..3 {
                    let mut a = TaskArgs::new();
                    a.inout(&int_t[2 * l3])?.inout(&int_t[2 * l3 + 1])?.scalar(BUMPS);
                    orch.submit_next_level(&bumps, a, CallConfig::default(), l3 as u32)?;
                }
            }
            if chip_ok {
                let mut a = TaskArgs::new();
                a.inout(&float_t[0])?.inout(&float_t[1])?.scalar(4);
                orch.submit_next_level(&doubles, a, CallConfig::default(), 0)?;
            }
            let mut a = TaskArgs::new();
            for &l3 in &subs {
                a.input(&int_t[2 * l3])?;
            }
            a.output(&total_t)?;
            orch.submit_next_level(&summed, a, CallConfig::default(), subs[at % subs.len()] as u32)?;
            Ok(())
        });
        (handle, subs, chip_ok)
    };
    // How long a whole run takes here and now: the kills fall within that time.
    let started = Instant::now();
    submit(&tree, 0).0.and_then(|h| h.wait()).expect("a run before any kill");
    let span = started.elapsed();

    let (mut ok, mut failed, mut kills) = (0, 0, Vec::new());
    for run in 0..RUNS {
        let start = Instant::now();
        let (handle, subs, chip_ok) = submit(&tree, run);
        // Now and then, at a random moment of the run, SIGKILL a random process of the tree:
        // up to three SUB workers or chips of either nested Worker in the first half, and
        // then maybe a nested Worker itself.
        let mut killed = None;
        let below = kills.iter().filter(|p: &&Part| p.kind != PartKind::L3).count();
        let candidates: Vec<usize> = (0..tree.0.len())
            .filter(|&i| !tree.0[i].dead)
            .filter(|&i| if tree.0[i].kind == PartKind::L3 { run >= RUNS / 2 } else { below < 3 })
            .collect();
        if !candidates.is_empty() && rng.below(4) == 0 {
            let at = start + span.mul_f64(rng.below(1_000) as f64 / 1_000.0);
            let victim = candidates[rng.below(candidates.len() as u64) as usize];
            while Instant::now() < at {
                std::thread::yield_now();
            }
            killed = tree.kill(victim).map(|pid| (pid, tree.0[victim]));
        }
        let result = handle.and_then(|h| h.wait_timeout(Duration::from_secs(10)));
        let took = start.elapsed();
        assert!(took < Duration::from_secs(10), "run {run} (seed {seed:#x}) took {took:?}");
        match (&result, killed) {
            (Ok(()), _) => {
                ok += 1;
                let expect = 3 * BUMPS;
                for &l3 in &subs {
                    assert_eq!(read_u64(&ints[2 * l3], 0, N), vec![expect; N], "run {run}: L3 {l3}'s tensor");
                }
                assert_eq!(read_u64(&total, 0, N), vec![expect * subs.len() as u64; N], "run {run}: the sum");
                if chip_ok {
                    assert_eq!(floats[0].read::<f32>(0, N).unwrap(), vec![16.0f32; N], "run {run}: the chip");
                }
            }
            (Err(e), None) => panic!(
                "run {run} (seed {seed:#x}) killed nothing and avoided the dead parts, yet failed: {e:?}"
            ),
            (Err(e), Some((_, part))) => {
                failed += 1;
                assert_names(e, &part, &format!("run {run} (seed {seed:#x})"));
                eprintln!("run {run}: {:?}: {e}", e.kind());
            }
        }
        if let Some((pid, part)) = killed {
            eprintln!("run {run}: killed {part:?}");
            kills.push(part);
            // Before the next run, its parent has seen it die: the L4 a nested Worker, the
            // nested Worker its SUB worker or chip (it reaped it).
            match part.kind {
                PartKind::L3 => {
                    wait_for("the L4 to see its nested Worker die", Duration::from_secs(10), || {
                        !rig.workers()[part.l3].is_alive()
                    })
                }
                _ => wait_for("the nested Worker to reap its child", Duration::from_secs(10), || {
                    !process_exists(pid)
                }),
            }
        }
    }
    eprintln!("seed {seed:#x}: {ok} runs succeeded, {failed} ended with a named error, killed {kills:?}");
    assert_eq!(ok + failed, RUNS);
    assert!(!kills.is_empty(), "seed {seed:#x} killed nothing");
    // What was killed stays out of service, and work sent to it fails naming it.
    for l3 in 0..2 {
        let bump_on = |l3: usize| {
            rig.run(|orch| {
                let mut a = TaskArgs::new();
                a.inout(&int_t[2 * l3])?.inout(&int_t[2 * l3 + 1])?.scalar(1);
                orch.submit_next_level(&bumps, a, CallConfig::default(), l3 as u32).map(|_| ())
            })
        };
        let dead = if tree.live(l3, PartKind::L3) == 0 {
            Some((bump_on(l3), vec![format!("worker {l3} is dead"), "SIGKILL".into()]))
        } else if !tree.subs_usable(l3) {
            Some((bump_on(l3), vec![format!("on worker {l3}"), "only 0 are alive".into()]))
        } else {
            None
        };
        let chip_dead = (l3 == 0 && tree.live(0, PartKind::L3) == 1 && !tree.chip_usable(0)).then(|| {
            let r = rig.run(|orch| {
                let mut a = TaskArgs::new();
                a.inout(&float_t[0])?.inout(&float_t[1])?.scalar(2);
                orch.submit_next_level(&doubles, a, CallConfig::default(), 0).map(|_| ())
            });
            (r, vec!["on worker 0".into(), "chip 0".into(), "SIGKILL".into()])
        });
        for (result, needles) in dead.into_iter().chain(chip_dead) {
            let e = result.expect_err("work for a dead part of the tree");
            assert_eq!(e.kind(), ErrorKind::WorkerDied, "seed {seed:#x}: {e:?}");
            for n in &needles {
                assert!(
                    e.message().contains(n.as_str()),
                    "seed {seed:#x}: the error does not say {n:?}: {e}"
                );
            }
        }
    }
}

/// Asserts that `e`, the error of a run during which `part` was killed, is a named error that
/// names the nested Worker the part is or is below (the L4's worker index), and the part itself
/// with its process id.
#[track_caller]
fn assert_names(e: &simpler::Error, part: &Part, what: &str) {
    assert!(
        matches!(e.kind(), ErrorKind::WorkerDied | ErrorKind::TaskFailed),
        "{what}: killing {part:?} ended it with {e:?}"
    );
    let said = e.message();
    let l3 = part.l3;
    assert!(
        said.contains(&format!("on worker {l3}:")) || said.contains(&format!("worker {l3} is dead")),
        "{what}: the error for killing {part:?} does not name worker {l3}: {said}"
    );
    let process = format!("(process {})", part.pid);
    let named = match part.kind {
        PartKind::L3 => said.contains(&format!("worker {l3} {process} died")) && said.contains("SIGKILL"),
        PartKind::Chip => said.contains(&format!("chip 0 {process} died")) && said.contains("SIGKILL"),
        // The last SUB worker, killed before its nested Worker gave it a task, shows as none
        // being alive.
        PartKind::Sub => {
            (said.contains("sub worker") && said.contains(&format!("{process} died")))
                || said.contains("SUB workers but only 0 are alive")
        }
    };
    assert!(named, "{what}: the error for killing {part:?} does not name it: {said}");
}

// ------------------------------------------------------------------------ hangs past deadlines

/// `t0[i] += 1` (tensor 0: `u64`, `InOut`); then, when scalar 0 is 1, never returns.
fn maybe_hang(args: &HostArgs<'_>) -> HostResult {
    bump(args)?;
    if args.scalar(0)? == 1 {
        loop {
            std::thread::park();
        }
    }
    Ok(())
}

#[isolated_test]
fn host_functions_that_hang_at_random_past_run_deadlines_are_stopped_and_replaced() {
    const CHAINS: usize = 3;
    const STEPS: usize = 4;
    const RUNS: usize = 30;
    let deadline = Duration::from_millis(250);
    let seed = 0x5eed_0005;
    let mut rng = Rng(seed);
    let (rig, [hang]) = Rig::start(subs(CHAINS).replace_dead_workers(true), [("maybe_hang", maybe_hang)]);
    let bufs: Vec<_> = (0..CHAINS).map(|_| u64_buffer(&rig, 64)).collect();
    let views: Vec<_> = bufs.iter().map(|b| u64s(b, 0, 64)).collect();
    let mut seen: std::collections::BTreeSet<i32> = rig.child_pids().into_iter().collect();
    let (mut clean, mut stopped, mut hung_total) = (0, 0, 0);
    for run in 0..RUNS {
        for b in &bufs {
            b.write(0, &[0u64; 64]).unwrap();
        }
        // A third of the runs have a task that hangs, and some of those a second one (in
        // another chain): task `c * STEPS + s` is step `s` of chain `c`.
        let mut hangs: Vec<usize> = Vec::new();
        if rng.below(3) == 0 {
            let first = rng.below(CHAINS as u64) as usize;
            hangs.push(first * STEPS + rng.below(STEPS as u64) as usize);
            if rng.below(3) == 0 {
                let second = (first + 1 + rng.below(CHAINS as u64 - 1) as usize) % CHAINS;
                hangs.push(second * STEPS + rng.below(STEPS as u64) as usize);
            }
        }
        let start = Instant::now();
        let handle = rig.submit_with(RunOptions::new().deadline(deadline), |orch, _, _| {
            for (c, view) in views.iter().enumerate() {
                for s in 0..STEPS {
                    let mut a = TaskArgs::new();
                    a.inout(view)?.scalar(u64::from(hangs.contains(&(c * STEPS + s))));
                    orch.submit_sub(&hang, a)?;
                }
            }
            Ok(())
        });
        // Every worker is alive (dead ones were replaced at this submit).
        let now: Vec<i32> = rig.child_pids();
        assert_eq!(
            now.len(),
            CHAINS,
            "run {run} (seed {seed:#x}): the live workers at its submit: {:?}",
            rig.workers()
        );
        seen.extend(&now);
        let result = handle.and_then(|h| h.wait());
        let took = start.elapsed();
        assert!(
            took < deadline + Duration::from_secs(2),
            "run {run} (seed {seed:#x}) ended {took:?} after its submit"
        );
        if hangs.is_empty() {
            result.unwrap_or_else(|e| panic!("run {run} (seed {seed:#x}) hangs nowhere, yet: {e:?}"));
            for (c, b) in bufs.iter().enumerate() {
                assert_eq!(read_u64(b, 0, 64), vec![STEPS as u64; 64], "run {run}: chain {c}");
            }
            clean += 1;
            continue;
        }
        let e = result.expect_err("a task hangs");
        assert!(took >= deadline, "run {run} (seed {seed:#x}) was stopped {took:?} after its submit");
        let mut needles = vec!["deadline of 250 ms".to_string()];
        needles.extend(hangs.iter().map(|t| format!("task {t} `maybe_hang`")));
        assert_err(&e, ErrorKind::Timeout, &needles.iter().map(String::as_str).collect::<Vec<_>>());
        // Only the hung tasks were still running: the others had ended, or wait behind them.
        assert_eq!(
            e.message().matches("`maybe_hang`").count(),
            hangs.len(),
            "run {run} (seed {seed:#x}): {e}"
        );
        // The workers running them were killed; the next submit replaces them.
        let killed = rig
            .workers()
            .iter()
            .filter(|w| w.state == simpler::status::WorkerState::Killed(libc::SIGKILL))
            .count();
        assert_eq!(killed, hangs.len(), "run {run} (seed {seed:#x}): {:?}", rig.workers());
        stopped += 1;
        hung_total += hangs.len();
    }
    eprintln!(
        "seed {seed:#x}: {clean} runs succeeded, {stopped} were stopped at their deadline, {hung_total} workers replaced"
    );
    assert!(stopped > 0 && clean > 0, "seed {seed:#x}: {stopped} runs stopped, {clean} clean");
    // One more run brings the last stopped workers back; every process ever started was new.
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.inout(&views[0])?.scalar(0);
        orch.submit_sub(&hang, a).map(|_| ())
    })
    .expect("a run after the last replacement");
    seen.extend(rig.child_pids());
    assert_eq!(seen.len(), CHAINS + hung_total, "one new process per stopped worker: {seen:?}");
    drop((views, bufs));
    drop(rig);
    let left: Vec<i32> = seen.into_iter().filter(|&p| process_exists(p)).collect();
    assert!(left.is_empty(), "workers {left:?} outlived the Worker");
}

// ------------------------------------------------------------------ nothing left in this process

/// This process's open file descriptors (`/proc/self/fd`, less the one reading it).
fn open_fds() -> Vec<String> {
    let mut fds: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| e.ok())
        .map(|e| {
            let target = std::fs::read_link(e.path()).map(|t| t.display().to_string()).unwrap_or_default();
            format!("{} -> {target}", e.file_name().to_string_lossy())
        })
        .collect();
    fds.sort();
    fds
}

/// This process's memory mappings (`/proc/self/maps`, one a line).
fn mappings() -> Vec<String> {
    std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps").lines().map(str::to_string).collect()
}

/// Panics, showing what differs, unless `after` has as many lines as `before`.
#[track_caller]
fn assert_as_many(what: &str, before: &[String], after: &[String]) {
    if before.len() != after.len() {
        let gone: Vec<_> = before.iter().filter(|x| !after.contains(x)).collect();
        let new: Vec<_> = after.iter().filter(|x| !before.contains(x)).collect();
        panic!("{} {what} before, {} after; gone: {gone:#?}\nnew: {new:#?}", before.len(), after.len());
    }
}

/// A Worker through faults of every kind: `runs` runs of three chains on three SUB workers,
/// each with a deadline; in each run a SUB worker is SIGKILLed during the run, a task hangs
/// past the deadline, fails, panics or ends its process, or nothing happens: each of these in
/// turn in the first six runs, then at random. Dead workers are replaced at each submit.
fn fault_session(seed: u64, runs: usize) {
    let mut rng = Rng(seed);
    let (rig, [hang, flaky]) =
        Rig::start(subs(3).replace_dead_workers(true), [("maybe_hang", maybe_hang), ("flaky", flaky)]);
    let bufs: Vec<_> = (0..3).map(|_| u64_buffer(&rig, 512)).collect();
    let views: Vec<_> = bufs.iter().map(|b| u64s(b, 0, 512)).collect();
    let mut seen: std::collections::BTreeSet<i32> = rig.child_pids().into_iter().collect();
    let mut last_kill: Option<i32> = None;
    for run in 0..runs {
        // 0: SIGKILL, 1: hang, 2, 3, 4: fail, panic, exit (flaky's 1, 2, 3), 5: none.
        let fault = if run < 6 { run as u64 } else { rng.below(6) };
        let at = rng.below(12) as usize;
        let start = Instant::now();
        let options = RunOptions::new().deadline(Duration::from_millis(400));
        let handle = rig.submit_with(options, |orch, _, _| {
            for t in 0..12 {
                let mut a = TaskArgs::new();
                if (2..=4).contains(&fault) && t == at {
                    a.scalar(fault - 1);
                    orch.submit_sub(&flaky, a)?;
                } else {
                    a.inout(&views[t / 4])?.scalar(u64::from(fault == 1 && t == at));
                    orch.submit_sub(&hang, a)?;
                }
            }
            Ok(())
        });
        let pids = rig.child_pids();
        seen.extend(&pids);
        let killed = (fault == 0).then(|| pids[rng.below(pids.len() as u64) as usize]);
        if let Some(pid) = killed {
            sigkill(pid);
        }
        let result = handle.and_then(|h| h.wait());
        let took = start.elapsed();
        assert!(took < Duration::from_secs(3), "run {run} (seed {seed:#x}) took {took:?}");
        let names_death_of = |e: &simpler::Error, p: i32| {
            e.kind() == ErrorKind::WorkerDied && e.to_string().contains(&format!("process {p})"))
        };
        // A run can end before the SIGKILL aimed at it lands (all its tasks were quick), or
        // with another error (its deadline): then the next run may be the one that meets the
        // dead worker, and it must name that process.
        let met_last_kill = |e: &simpler::Error| last_kill.is_some_and(|p| names_death_of(e, p));
        let met_own_kill = killed.is_some_and(|p| result.as_ref().is_err_and(|e| names_death_of(e, p)));
        match (fault, result) {
            (0 | 5, Ok(())) => {}
            (_, Err(e)) if met_last_kill(&e) => {}
            (1, Err(e)) => assert_err(&e, ErrorKind::Timeout, &["maybe_hang", "deadline of 400 ms"]),
            // A panic's report (a backtrace, resolved in a debug build) can outlast the deadline
            // on a loaded machine: then the run is stopped, naming the task.
            (2..=4, Err(e)) if e.kind() == ErrorKind::Timeout => {
                assert_err(&e, ErrorKind::Timeout, &["`flaky`"])
            }
            // On a loaded machine the run's submissions can outlast the deadline too (a
            // replacement worker starting after a SIGKILL): then the run is stopped, naming it.
            (0 | 5, Err(e)) if e.kind() == ErrorKind::Timeout => {
                assert_err(&e, ErrorKind::Timeout, &["deadline of 400 ms"])
            }
            (0 | 2..=4, Err(e)) => {
                assert!(NAMED.contains(&e.kind()), "run {run} (seed {seed:#x}), fault {fault}: {e:?}")
            }
            (_, r) => panic!("run {run} (seed {seed:#x}), fault {fault}: {r:?}"),
        }
        last_kill = killed.filter(|_| !met_own_kill);
    }
    // The rig checks the first workers; the replacements must be gone too.
    drop((views, bufs));
    drop(rig);
    let left: Vec<i32> = seen.into_iter().filter(|&p| process_exists(p)).collect();
    assert!(left.is_empty(), "workers {left:?} outlived the Worker");
}

#[isolated_test]
fn after_faults_and_close_this_process_has_the_fds_and_mappings_it_had_before() {
    // A first session starts what stays for the life of the process, not a leak: the spawner
    // thread that starts children (its stack), and the allocator's arenas and cached thread
    // stacks for as many threads as a Worker runs at once.
    fault_session(0x5eed_0006, 6);
    let (fds, maps) = (open_fds(), mappings());
    fault_session(0x5eed_0007, 30);
    let (fds_after, maps_after) = (open_fds(), mappings());
    eprintln!(
        "{} fds, {} mappings; after 30 runs with faults: {}, {}",
        fds.len(),
        maps.len(),
        fds_after.len(),
        maps_after.len()
    );
    assert_eq!(fds, fds_after, "the same file descriptors, to the same files");
    assert_as_many("mappings", &maps, &maps_after);
    let memfds: Vec<&String> = maps_after.iter().filter(|m| m.contains("/memfd:")).collect();
    assert!(memfds.is_empty(), "memfds still mapped: {memfds:?}");
}
