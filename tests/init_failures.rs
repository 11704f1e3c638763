//! Worker::init error paths.

mod common;

use std::time::Duration;

use common::*;
use simpler::{Level, Worker};

/// A chip whose runtime cannot start (`chip_memory(0)`) fails `init`; nothing is left behind.
#[test]
fn a_chip_with_zero_memory_fails_init_cleanly() {
    if !in_own_process() {
        return;
    }
    let mut w = Worker::builder().chips(1).chip_memory(0).chip_cores(1).build().unwrap();
    let err = w.init().unwrap_err();
    eprintln!("{err:?}");
    assert!(!w.is_ready());
    assert!(w.child_pids().is_empty());
    assert!(leftover_shm().is_empty());
}

/// `init` moves the nested Workers out of `self.children` before forking; when `init` fails
/// the Worker stays new (so `init` may be called again) but has lost them: a
/// second `init` silently starts an L4 Worker with no NEXT_LEVEL workers at all.
#[test]
fn a_failed_l4_init_does_not_lose_its_nested_workers() {
    if !in_own_process() {
        return;
    }
    let slow = Worker::builder().sub_workers(1).__startup_delay(Duration::from_secs(2)).build().unwrap();
    let mut l4 =
        Worker::builder().level(Level::Network1).startup_timeout(Duration::from_millis(300)).build().unwrap();
    l4.add_worker(slow).unwrap();
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
    _: &simpler::CallConfig,
) -> simpler::Result<()> {
    Ok(())
}

/// `Worker::unregister` only knows host functions and chip callables: an orchestration
/// function's handle (from `register_orch`) is "not registered", so it can never be removed.
#[test]
fn an_orchestration_function_can_be_unregistered() {
    if !in_own_process() {
        return;
    }
    let mut l4 = Worker::builder().level(Level::Network1).build().unwrap();
    let h = l4.register_orch(simpler::OrchFn::new("step", step)).unwrap();
    l4.unregister(&h).expect("unregister of a registered OrchFn");
}
