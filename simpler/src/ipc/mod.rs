//! The IPC layer: the memory and wake-ups that connect a Worker to its forked child processes.
//!
//! Everything a parent shares with its children is mapped *before* fork, so each child inherits
//! it at the same address, or is a named POSIX shared-memory object that any process can open:
//!
//! * [`mem`]: anonymous `MAP_SHARED` regions ([`mem::SharedRegion`]), used for the mailboxes and
//!   the heap rings, plus the byte views of element slices.
//! * [`shm`]: named POSIX shared-memory objects ([`shm::PosixShm`]), the backing of host buffers
//!   made by `Worker::create_buffer`.
//! * [`futex`]: shared (cross-process) futexes and the [`futex::Doorbell`] every wait sleeps on:
//!   spin a few microseconds, yield, then sleep in the kernel. Never a fixed sleep, never an
//!   endless spin, so an idle tree uses ~0% CPU.
//! * [`mailbox`]: the local endpoint wire contract: one region holding a parent doorbell and one
//!   mailbox per child (child doorbell, shutdown word, a base frame for startup and control, a
//!   task frame), with the state-word protocol that hands each frame back and forth.
//! * [`process`]: forking children, watching for their exit, and reaping them.
//! * [`endpoint`]: the engine's endpoint for a forked child, driving its mailbox's task frame.
//! * [`child`]: the loop a forked SUB worker runs until shutdown; [`host_args`]: the typed
//!   slices a host function sees of its mapped tensors.
//!
//! Each module states its protocol as numbered rules and every `unsafe` block cites the rule it
//! relies on: `F*` / `D*` in `futex`, `R*` in `mem`, `N*` in `shm`, `M*` in `mailbox`, `P*` in
//! `process`, `C*` in `child`, `H*` in `host_args`, `T*` in the test-only `test_fork`. The layer
//! knows the wire format but not the scheduler: the engine drives it through its endpoint
//! trait.

pub(crate) mod child;
pub(crate) mod endpoint;
pub(crate) mod futex;
pub(crate) mod host_args;
pub(crate) mod mailbox;
pub(crate) mod mem;
pub(crate) mod process;
pub(crate) mod shm;

#[cfg(test)]
pub(crate) mod test_fork {
    //! Forking for cross-process unit tests.
    //!
    //! * **T1 (one test per process).** Forking tests run one per process, so no other test
    //!   thread holds a lock (allocator, output capture, a registry mutex) that the child would
    //!   need: each starts with `if !crate::test_support::in_own_process() { return; }`, which
    //!   holds under `cargo nextest` and reruns the test alone under `cargo test`.
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
}
