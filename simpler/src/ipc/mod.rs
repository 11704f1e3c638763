//! The IPC layer: the mailboxes that connect a Worker to its child processes, and the
//! parent and child ends of each.
//!
//! It builds on the OS layer ([`crate::sys`]): the mailbox region is a `sys::mem` mapping made
//! before fork, host buffers are `sys::shm` objects, and every wait sleeps on a `sys::futex`
//! doorbell.
//!
//! * [`mailbox`]: the local endpoint wire contract: one region holding a parent doorbell and one
//!   mailbox per child (child doorbell, shutdown word, a base frame for startup and control, two
//!   task frames, the second for a chip's staged successor), with the state-word protocol that
//!   hands each frame back and forth.
//! * [`endpoint`]: the engine's endpoint for a child process, driving its mailbox's task frames.
//! * [`child`]: the child end: the loop every child process runs until shutdown ([`child::serve`],
//!   over a [`child::Serve`] handler), and the resolver that maps a task's buffers by identity.
//!   What each kind of child serves (SUB worker, chip, nested Worker) lives with the Worker,
//!   in `worker::serve`.
//!
//! Each module states its protocol as numbered rules and every `unsafe` block cites the rule it
//! relies on: `M*` in `mailbox`, `C*` in `child`. The layer knows the wire format but not the
//! scheduler: the engine drives it through its endpoint trait.

pub(crate) mod child;
pub(crate) mod endpoint;
pub(crate) mod mailbox;
#[cfg(test)]
mod tests;
