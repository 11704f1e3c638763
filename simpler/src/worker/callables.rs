//! `Callables`: the one record of what a Worker has registered, of every kind.
//!
//! A Worker keeps its host functions, chip callables and orchestration functions here, with
//! their reference counts, before and after `init`. The per-kind registries are also what the
//! child processes start with (the start snapshot). What each *target* installed lives on the
//! target (a child's own registry, the in-process chip's runtime); the engine's map of callable
//! kinds (what a submit may name) follows this record.
//!
//! `Worker::register`, `register_chip` and `register_orch` share `register_callable`: refused
//! when closed, or for a closure once a tree runs; refused when no child runs the kind
//! (`needs_target`, the same rule before and after `init`); checked against this record; after
//! `init` installed by the runtime on every target, all or nothing; then recorded. `init` first
//! registers the linked `#[callable]`s the Worker can run (`register_linked`).

use crate::callable::host::HostFn;
use crate::callable::identity::{CallableHandle, CallableKind, Descriptor, Digest};
use crate::callable::registry::Registry;
use crate::chip::ChipFn;
use crate::engine::Registered;
use crate::engine::orch_fn::OrchFn;
use crate::error::Result;

/// Most callables one target keeps installed at once.
pub(super) const MAX_CALLABLES: usize = 1024;

/// One callable of any kind, as a Worker registers it.
pub(super) enum Callable {
    /// A host function, for the SUB workers.
    Host(HostFn),
    /// A chip callable (kernel or chip orchestration), for the chips.
    Chip(ChipFn),
    /// An orchestration function, for the nested Workers (L4 and up).
    Orch(OrchFn),
}

impl Callable {
    /// The kind of callable.
    pub(super) fn kind(&self) -> CallableKind {
        match self {
            Callable::Host(_) => CallableKind::HostFn,
            Callable::Chip(_) => CallableKind::Chip,
            Callable::Orch(_) => CallableKind::Orch,
        }
    }

    /// What a submit checks a task of it against: its kind, and a kernel's signature.
    pub(super) fn registered(&self) -> Registered {
        match self {
            Callable::Chip(f) => f.registered(),
            _ => self.kind().into(),
        }
    }

    /// Its descriptor (whose digest is its identity).
    pub(super) fn descriptor(&self) -> &Descriptor {
        match self {
            Callable::Host(f) => f.descriptor(),
            Callable::Chip(f) => f.descriptor(),
            Callable::Orch(f) => f.descriptor(),
        }
    }

    /// The handle tasks name it by.
    pub(super) fn handle(&self) -> CallableHandle {
        let name = match self {
            Callable::Host(f) => f.name(),
            Callable::Chip(f) => f.name(),
            Callable::Orch(f) => f.name(),
        };
        CallableHandle::new(self.descriptor().digest(), self.kind(), name)
    }
}

/// What a Worker has registered: one registry per kind, each with reference counts.
pub(super) struct Callables {
    host: Registry<HostFn>,
    chip: Registry<ChipFn>,
    orch: Registry<OrchFn>,
}

impl Callables {
    /// Nothing registered.
    pub(super) fn new() -> Callables {
        Callables {
            host: Registry::new(MAX_CALLABLES),
            chip: Registry::new(MAX_CALLABLES),
            orch: Registry::new(MAX_CALLABLES),
        }
    }

    /// The registries a start spec carried (a nested Worker started by exec).
    pub(super) fn restore(&mut self, host: Registry<HostFn>, chip: Registry<ChipFn>, orch: Registry<OrchFn>) {
        (self.host, self.chip, self.orch) = (host, chip, orch);
    }

    /// Whether [`install`](Callables::install) of `c` would succeed (the registry's own rules:
    /// one function per digest, room for it), with nothing installed.
    pub(super) fn check(&self, c: &Callable) -> Result<()> {
        let desc = c.descriptor();
        match c {
            Callable::Host(f) => self.host.check(desc.digest(), desc.bytes(), f),
            Callable::Chip(f) => self.chip.check(desc.digest(), desc.bytes(), f),
            Callable::Orch(f) => self.orch.check(desc.digest(), desc.bytes(), f),
        }
    }

    /// Installs `c`, or counts one more reference to it.
    pub(super) fn install(&mut self, c: Callable) -> Result<()> {
        let desc = c.descriptor().clone();
        match c {
            Callable::Host(f) => self.host.install(desc.digest(), desc.bytes(), f),
            Callable::Chip(f) => self.chip.install(desc.digest(), desc.bytes(), f),
            Callable::Orch(f) => self.orch.install(desc.digest(), desc.bytes(), f),
        }
        .map(|_| ())
    }

    /// The references held to the callable `handle` names (of its kind); 0 when it is not
    /// registered.
    pub(super) fn refs(&self, handle: &CallableHandle) -> u32 {
        let digest = handle.digest();
        match handle.kind() {
            CallableKind::HostFn => self.host.refs(&digest),
            CallableKind::Chip => self.chip.refs(&digest),
            CallableKind::Orch => self.orch.refs(&digest),
        }
    }

    /// Drops one reference to the callable `handle` names; true when that was the last.
    pub(super) fn release(&mut self, handle: &CallableHandle) -> Result<bool> {
        let digest = handle.digest();
        match handle.kind() {
            CallableKind::HostFn => self.host.release(&digest),
            CallableKind::Chip => self.chip.release(&digest),
            CallableKind::Orch => self.orch.release(&digest),
        }
    }

    /// Every registered callable's digest, kind and (a kernel's) signature.
    pub(super) fn kinds(&self) -> impl Iterator<Item = (Digest, Registered)> + '_ {
        let host = self.host.iter().map(|(d, _, _)| (*d, CallableKind::HostFn.into()));
        let chip = self.chip.iter().map(|(d, _, f)| (*d, f.registered()));
        let orch = self.orch.iter().map(|(d, _, _)| (*d, CallableKind::Orch.into()));
        host.chain(chip).chain(orch)
    }

    /// The host functions (the snapshot a SUB worker starts with).
    pub(super) fn host(&self) -> &Registry<HostFn> {
        &self.host
    }

    /// The chip callables (the snapshot a chip starts with).
    pub(super) fn chip(&self) -> &Registry<ChipFn> {
        &self.chip
    }

    /// The orchestration functions (the snapshot a nested Worker's process starts with).
    pub(super) fn orch(&self) -> &Registry<OrchFn> {
        &self.orch
    }
}
