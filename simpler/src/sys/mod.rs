//! The OS layer, at the bottom of the crate: everything that talks to the kernel directly.
//!
//! Nothing here knows about tasks, tensors or callables; every other layer builds on it.
//!
//! * [`mem`]: `MAP_SHARED` regions of nameless memory ([`mem::SharedRegion`], a memfd) that
//!   children map too, and the byte views of plain-old-data slices.
//! * [`shm`]: memfd objects shared across the process tree ([`shm::SharedMem`]), the backing of
//!   host buffers made by `Worker::create_buffer`, and the sweep of the `/dev/shm` names earlier
//!   versions left.
//! * [`peer_fd`]: another process's descriptor opened through `/proc/<pid>/fd/<fd>`, or
//!   through a live thread's `/proc/<pid>/task/<tid>/fd/<fd>` once the main thread has exited.
//! * [`futex`]: shared (cross-process) futexes, the [`futex::Doorbell`] every wait sleeps on,
//!   and CPU placement ([`futex::current_cpu`], [`futex::PeerWait`]): spin a few microseconds,
//!   yield, then sleep in the kernel. Never a fixed sleep, never an endless spin.
//! * [`fn_address`]: [`fn_address::FnAddress`], a function pointer as the word a control frame
//!   or a start spec carries to a child (its offset in the binary, the same in every process of
//!   it), and back.
//! * [`sock`]: a look at the bytes waiting in a socket without taking them (a driver reads a
//!   node's reply only when it is whole there).
//! * [`process`]: forking children, watching for their exit through pidfds, reaping them and
//!   what is left of their process groups.
//! * [`spawn`]: starting a child by exec of this same binary (safe among threads), and the
//!   `.init_array` hook that turns such a process into the child before `main`.
//! * [`sync`]: the one way the crate takes a lock, with one poison policy.
//! * [`clock`]: `CLOCK_MONOTONIC`, one clock for every process of the host (task records).
//! * [`random`]: random bytes for secrets, and cheap numbers that only must differ.
//! * [`tracelog`]: the append-only log where worker processes leave the records of what they
//!   ran for tasks of captured runs.
//!
//! Each module states its protocol as numbered rules and every `unsafe` block cites the rule it
//! relies on: `R*` in `mem`, `N*` in `shm`, `F*` / `D*` in `futex`, `FA*` in `fn_address`, `P*`
//! in `process`, `K*` in `sock`, `S*` in `spawn`, `T*` in the test-only `test_fork`.

pub(crate) mod clock;
pub(crate) mod fn_address;
pub(crate) mod futex;
pub(crate) mod mem;
pub(crate) mod peer_fd;
pub(crate) mod process;
pub(crate) mod random;
pub(crate) mod shm;
pub(crate) mod sock;
pub(crate) mod spawn;
pub(crate) mod sync;
#[cfg(test)]
pub(crate) mod test_fork;
pub(crate) mod tracelog;
