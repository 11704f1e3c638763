//! Fault injection across many runs: SUB workers SIGKILLed at random moments of long DAGs, and
//! host functions that panic, fail or end their process at random. Every run must end, within
//! a bound, with success or a named error; the Worker must then close cleanly and leave no
//! process and no shared-memory name (the rig checks that when it drops).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use simpler::{ErrorKind, HostArgs, HostResult, TaskArgs};

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

#[test]
fn sub_workers_killed_at_random_during_long_dags_end_every_run_with_a_named_error() {
    if !in_own_process() {
        return;
    }
    let seed = 0x5eed_0001;
    let (rig, [fill, affine]) = Rig::start(subs(4), [("fill", fill), ("affine", affine)]);
    // Four independent chains, so every SUB worker is busy when the killer strikes.
    let bufs: Vec<_> = (0..8).map(|_| u64_buffer(&rig, 4096)).collect();
    let views: Vec<_> = bufs.iter().map(|b| u64s(b, 0, 4096)).collect();
    let (ba, ta) = (&bufs[0], &views[0]);
    let victims: Vec<i32> = rig.child_pids();
    let done = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(Mutex::new(Vec::new()));
    // The killer: every few milliseconds, maybe one SUB worker, at random; it spares one, so
    // some runs can still finish.
    let killer = {
        let (done, killed, victims) = (done.clone(), killed.clone(), victims.clone());
        std::thread::spawn(move || {
            let mut rng = Rng(seed);
            while !done.load(Ordering::SeqCst) {
                let wait = Instant::now() + Duration::from_micros(500 + rng.below(4_000));
                while Instant::now() < wait && !done.load(Ordering::SeqCst) {
                    std::thread::yield_now();
                }
                let mut k = killed.lock().unwrap();
                if k.len() + 1 < victims.len() && rng.below(3) == 0 {
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
    done.store(true, Ordering::SeqCst);
    killer.join().unwrap();
    let killed = killed.lock().unwrap().len();
    eprintln!(
        "seed {seed:#x}: {ok} runs succeeded, {failed} ended with a named error, {killed} SUB workers killed"
    );
    assert!(ok + failed == 40);
    // The survivors still work: a run on them succeeds.
    let mut check = TaskArgs::new();
    check.output(ta).unwrap().scalar(5);
    rig.run(|orch| orch.submit_sub(&fill, check).map(|_| ())).unwrap();
    assert_eq!(read_u64(ba, 0, 4096), vec![5; 4096]);
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

#[test]
fn host_functions_that_fail_panic_or_exit_at_random_end_runs_with_named_errors() {
    if !in_own_process() {
        return;
    }
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

#[test]
fn chip_children_killed_at_random_during_kernel_chains_end_every_run_with_a_named_error() {
    if !in_own_process() {
        return;
    }
    let seed = 0x5eed_0003;
    let mut rig = Rig::new(simpler::Worker::builder().chips(3).chip_memory(16 << 20).chip_cores(1));
    let k = rig.register_chip(simpler::ChipFn::kernel("double", double)).unwrap();
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
                    orch.submit_next_level(&k, args, simpler::CallConfig::default(), chip)?;
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
