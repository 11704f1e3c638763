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
#[allow(unsafe_code)] // fork() and _exit() are unsafe; only the tests of this layer fork through here.
pub(crate) mod test_fork {
    //! Forking for cross-process unit tests.
    //!
    //! * **T1 (one test per process).** Forking tests run one per process, so no other test
    //!   thread holds a lock (allocator, output capture, a registry mutex) that the child would
    //!   need: each starts with `if !crate::test_support::in_own_process() { return; }`, which
    //!   holds under `cargo nextest` and reruns the test alone under `cargo test`.
    //! * **T2 (the child never returns).** The child runs its body under `catch_unwind` and always
    //!   leaves through `_exit`: it never returns or unwinds into the test harness and never runs
    //!   the parent's destructors or flushes its buffers.
    //! * **T3 (always reaped).** The parent holds a [`Child`] guard that kills (SIGKILL) and reaps
    //!   the child on drop unless it was already reaped, so a failing test leaves no zombie and
    //!   no orphan.

    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::time::{Duration, Instant};

    use nix::sys::signal::{Signal, kill};
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    use nix::unistd::{ForkResult, Pid, fork};

    /// A forked test child, killed and reaped on drop unless already reaped (rule T3).
    pub(crate) struct Child {
        pid: Pid,
        reaped: bool,
    }

    /// Forks a child that runs `body` and exits with its return value (101 if it panics).
    pub(crate) fn fork_child(body: impl FnOnce() -> i32) -> Child {
        // SAFETY: rule T1 — the test process runs this one test, so the child inherits no lock
        // held by another thread; rule T2 — the child branch below never returns.
        match unsafe { fork() }.expect("fork failed") {
            ForkResult::Parent { child } => Child { pid: child, reaped: false },
            ForkResult::Child => {
                let code = catch_unwind(AssertUnwindSafe(body)).unwrap_or(101);
                // SAFETY: rule T2 — leave the child without returning, unwinding or running
                // destructors.
                unsafe { libc::_exit(code) }
            }
        }
    }

    impl Child {
        /// The child's process id.
        pub(crate) fn pid(&self) -> Pid {
            self.pid
        }

        /// Waits up to `limit` for the child to exit and returns its exit code.
        ///
        /// Panics if the child was killed by a signal or still runs at the limit (the guard then
        /// kills and reaps it).
        pub(crate) fn wait_timeout(&mut self, limit: Duration) -> i32 {
            assert!(!self.reaped, "child {} was already reaped", self.pid);
            let end = Instant::now() + limit;
            loop {
                match waitpid(self.pid, Some(WaitPidFlag::WNOHANG)).expect("waitpid failed") {
                    WaitStatus::Exited(_, code) => {
                        self.reaped = true;
                        return code;
                    }
                    WaitStatus::Signaled(_, signal, _) => {
                        self.reaped = true;
                        panic!("child {} was killed by {signal:?}", self.pid);
                    }
                    _ => {}
                }
                assert!(Instant::now() < end, "child {} still runs after {limit:?}", self.pid);
                // Test-only polling of a process exit; the IPC layer itself never sleeps fixed.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    impl Drop for Child {
        fn drop(&mut self) {
            if !self.reaped {
                let _ = kill(self.pid, Signal::SIGKILL);
                let _ = waitpid(self.pid, None);
                self.reaped = true;
            }
        }
    }
}
