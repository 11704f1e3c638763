//! Worker::init error paths.

mod common;

use std::time::{Duration, Instant};

use common::*;
use simpler::{ErrorKind, Worker, chip::ChipBackend, chip::ChipSpec, chip::SimChip, status::Level};

/// A chip whose runtime cannot start (`chip_memory(0)`) fails `init`; nothing is left behind.
#[isolated_test]
fn a_chip_with_zero_memory_fails_init_cleanly() {
    let mut w = Worker::builder().chips(1).chip_memory(0).chip_cores(1).build().unwrap();
    let err = w.init().unwrap_err();
    eprintln!("{err:?}");
    assert!(!w.is_ready());
    assert!(w.child_pids().is_empty());
    assert!(leftover_shm().is_empty());
}

/// The backends of chips 1 and 2 never come back: their children hang in startup and never
/// report ready.
fn chips_1_and_2_hang(spec: &ChipSpec) -> simpler::Result<Box<dyn ChipBackend>> {
    if spec.chip_id() >= 1 {
        loop {
            std::thread::park();
        }
    }
    Ok(Box::new(SimChip::new(spec.memory_bytes(), spec.cores())?))
}

/// Children that hang during startup fail `init` at its `startup_timeout`: they are killed at
/// once (the children that started get their grace to leave on their own; a hung one used to
/// get it too, 5 s more), the error names them, and nothing is left behind.
#[isolated_test]
fn children_that_hang_in_startup_fail_init_at_the_startup_timeout_naming_them() {
    let timeout = Duration::from_millis(1500);
    let mut w = Worker::builder()
        .sub_workers(1)
        .chips(3)
        .chip_memory(1 << 20)
        .chip_cores(1)
        .chip_backend(chips_1_and_2_hang)
        .startup_timeout(timeout)
        .build()
        .unwrap();
    let started = Instant::now();
    let err = w.init().unwrap_err();
    let took = started.elapsed();
    assert!(
        took < timeout + Duration::from_millis(1500),
        "init took {took:?} with a startup timeout of {timeout:?}: {err}"
    );
    assert_eq!(err.kind(), ErrorKind::WorkerDied, "{err}");
    let msg = err.message();
    assert!(msg.contains("chip 1 (process") && msg.contains("did not report ready"), "{err}");
    assert!(msg.contains("so did chip 2 (process"), "{err}");
    assert!(
        !msg.contains("chip 0") && !msg.contains("sub worker"),
        "only the hung children are named: {err}"
    );
    for chip in ["chip 1", "chip 2"] {
        let pid: i32 = msg
            .split(&format!("{chip} (process "))
            .nth(1)
            .and_then(|r| r.split(')').next())
            .unwrap()
            .parse()
            .unwrap();
        assert!(!process_exists(pid), "the hung {chip} (process {pid}) is gone");
    }
    assert!(!w.is_ready());
    assert!(w.child_pids().is_empty());
    assert!(leftover_shm().is_empty());
}

/// `init` moves the nested Workers out of `self.children` before forking; when `init` fails
/// the Worker stays new (so `init` may be called again) but has lost them: a
/// second `init` silently starts an L4 Worker with no NEXT_LEVEL workers at all.
#[isolated_test]
fn a_failed_l4_init_does_not_lose_its_nested_workers() {
    let slow = Worker::builder().sub_workers(1).__startup_delay(Duration::from_secs(2)).build().unwrap();
    let mut l4 = Worker::builder()
        .level(Level::Network1)
        .startup_timeout(Duration::from_millis(300))
        .worker(slow)
        .build()
        .unwrap();
    assert_eq!(l4.nested_workers(), 1);
    assert!(l4.init().is_err());
    // Either init may not be retried, or the retry keeps the topology.
    match l4.init() {
        Err(_) => {}
        Ok(()) => {
            let n = l4.nested_workers();
            l4.close().unwrap();
            assert_eq!(n, 1, "the retried init started with {n} nested Workers instead of 1");
        }
    }
}

fn step(
    _: &mut simpler::Orchestrator<'_>,
    _: &simpler::TaskArgs,
    _: &simpler::chip::CallConfig,
) -> simpler::Result<()> {
    Ok(())
}

/// `Worker::unregister` only knows host functions and chip callables: an orchestration
/// function's handle (from `register_orch`) is "not registered", so it can never be removed.
#[isolated_test]
fn an_orchestration_function_can_be_unregistered() {
    let mut l4 = Worker::builder().level(Level::Network1).build().unwrap();
    let h = l4.register_orch(simpler::OrchFn::new("step", step)).unwrap();
    l4.unregister(&h).expect("unregister of a registered OrchFn");
}

/// A chip grants at most two runs' worth of per-run resources (one executing, one prepared) and
/// says so before it reports ready: an explicit `pipeline_depth` above that fails `init` naming
/// both numbers and the way out, and leaves nothing behind.
#[isolated_test]
fn a_pipeline_depth_above_what_the_chips_grant_fails_init_naming_both() {
    let mut w =
        Worker::builder().chips(3).chip_memory(1 << 20).chip_cores(1).pipeline_depth(8).build().unwrap();
    let err = w.init().unwrap_err();
    let msg = err.message();
    assert!(
        msg.contains("pipeline_depth(8)") && msg.contains("at most 2") && msg.contains("chip 0"),
        "{err}"
    );
    assert!(msg.contains("pending_run_depth"), "{err}");
    assert_eq!(err.kind(), simpler::ErrorKind::InvalidArgument);
    assert!(!w.is_ready());
    assert!(w.child_pids().is_empty());
    assert!(leftover_shm().is_empty());
}

/// `pending_run_depth` is not limited by what the chips grant: a Worker whose chips grant two
/// starts with eight and runs eight submitted runs (the engine's unit test
/// `pending_run_depth_admits_runs_apart_from_the_pipeline_depth` shows the admission itself).
#[isolated_test]
fn a_pending_run_depth_above_the_chips_grant_is_accepted() {
    let mut w = Worker::builder()
        .chips(1)
        .chip_memory(1 << 20)
        .chip_cores(1)
        .pipeline_depth(2)
        .pending_run_depth(8)
        .backpressure_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    w.init().unwrap();
    let handles: Vec<_> = (0..8).map(|_| w.submit(|_| Ok(())).unwrap()).collect();
    for h in &handles {
        h.wait().unwrap();
    }
    w.close().unwrap();
}
