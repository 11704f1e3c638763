//! Forking for cross-process unit tests.
//!
//! * **T1 (one test per process).** Forking tests run one per process, so no other test
//!   thread holds a lock (allocator, output capture, a registry mutex) that the child would
//!   need: each is a `#[crate::test_support::isolated_test(crate = crate)]`, whose guard
//!   (`in_own_process`) holds under `cargo nextest` and reruns the test alone under `cargo test`.
//! * **T2 (the child never returns).** The child leaves through `_exit` (rule P2 of
//!   [`process`](super::process)): it never returns or unwinds into the test harness.
//! * **T3 (always reaped).** The parent holds a [`ChildGuard`], which kills and reaps the
//!   child on drop unless a wait reaped it (rule P5), so a failing test leaves no zombie and
//!   no orphan.

pub(crate) use super::process::ChildGuard;

/// Forks a child that runs `body` and exits with its return value (101 if it panics).
pub(crate) fn fork_child(body: impl FnOnce() -> i32) -> ChildGuard {
    ChildGuard::fork(body).expect("fork failed")
}
