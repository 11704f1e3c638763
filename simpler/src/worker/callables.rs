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
use crate::error::{Error, ErrorKind, Result};
use std::collections::HashMap;
use std::sync::Arc;

/// Most callables one target keeps installed at once.
pub(super) const MAX_CALLABLES: usize = 1024;

/// One callable of any kind, as a Worker registers it.
pub(super) enum Callable {
    /// A host function, for the SUB workers.
    Host(HostFn),
    /// A chip callable (kernel or chip orchestration), for the chips.
    Chip(ChipFn),
    /// An orchestration function, for the nested Workers (L4 and up), and where it goes.
    Orch(OrchFn, Placement),
}

/// Which NEXT_LEVEL workers (nested and remote Workers) an orchestration function is on.
///
/// Local nested Workers run this program, so each holds every orchestration function; a
/// placement decides which remote nodes are asked for it (at `init`, and when registered after
/// it) and which workers a task of it may be placed on (`Orchestrator::submit_next_level`
/// refuses the others, naming both).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Every nested and remote Worker (SPMD, `Worker::register_orch`): a remote node that lacks
    /// it fails `init` (or the registration after `init`).
    Everywhere,
    /// These workers only (`Worker::register_orch_on`; sorted, distinct, not empty): only the
    /// remote ones among them are asked for it.
    On(Arc<[u32]>),
    /// A linked `#[callable(orch)]`: every local nested Worker, and the remote nodes that
    /// report having it at `init` (a node of another program may lack it).
    Found,
}

impl Callable {
    /// The kind of callable.
    pub(super) fn kind(&self) -> CallableKind {
        match self {
            Callable::Host(_) => CallableKind::HostFn,
            Callable::Chip(_) => CallableKind::Chip,
            Callable::Orch(..) => CallableKind::Orch,
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
            Callable::Orch(f, _) => f.descriptor(),
        }
    }

    /// The handle tasks name it by.
    pub(super) fn handle(&self) -> CallableHandle {
        let name = match self {
            Callable::Host(f) => f.name(),
            Callable::Chip(f) => f.name(),
            Callable::Orch(f, _) => f.name(),
        };
        CallableHandle::new(self.descriptor().digest(), self.kind(), name)
    }
}

/// What a Worker has registered: one registry per kind, each with reference counts, and the
/// placement of each orchestration function.
pub(super) struct Callables {
    host: Registry<HostFn>,
    chip: Registry<ChipFn>,
    orch: Registry<OrchFn>,
    placed: HashMap<Digest, Placement>,
}

impl Callables {
    /// Nothing registered.
    pub(super) fn new() -> Callables {
        Callables {
            host: Registry::new(MAX_CALLABLES),
            chip: Registry::new(MAX_CALLABLES),
            orch: Registry::new(MAX_CALLABLES),
            placed: HashMap::new(),
        }
    }

    /// The registries a start spec carried (a nested Worker started by exec).
    pub(super) fn restore(&mut self, host: Registry<HostFn>, chip: Registry<ChipFn>, orch: Registry<OrchFn>) {
        self.placed = orch.iter().map(|(d, _, _)| (*d, Placement::Everywhere)).collect();
        (self.host, self.chip, self.orch) = (host, chip, orch);
    }

    /// Whether [`install`](Callables::install) of `c` would succeed (the registry's own rules:
    /// one function per digest, room for it), with nothing installed.
    pub(super) fn check(&self, c: &Callable) -> Result<()> {
        let desc = c.descriptor();
        match c {
            Callable::Host(f) => self.host.check(desc.digest(), desc.bytes(), f),
            Callable::Chip(f) => self.chip.check(desc.digest(), desc.bytes(), f),
            Callable::Orch(f, p) => {
                self.orch.check(desc.digest(), desc.bytes(), f)?;
                self.check_placement(&c.handle(), p).map(|_| ())
            }
        }
    }

    /// The placement an orchestration function has once registered again with `p`: `p` when it
    /// is new; what it has when `p` is [`Placement::Found`] (a linked one adds a reference to an
    /// explicit registration) or the same; refused when it names other workers.
    fn check_placement(&self, handle: &CallableHandle, p: &Placement) -> Result<Placement> {
        match self.placed.get(&handle.digest()) {
            None => Ok(p.clone()),
            Some(old) if p == old || *p == Placement::Found => Ok(old.clone()),
            Some(old) => Err(Error::new(
                ErrorKind::Callable,
                format!(
                    "{handle} is registered {} already, and now {}: register it on the same workers, or unregister it first",
                    old.describe(),
                    p.describe()
                ),
            )),
        }
    }

    /// Where the orchestration function `digest` names is placed (`None`: not registered).
    pub(super) fn placement(&self, digest: &Digest) -> Option<&Placement> {
        self.placed.get(digest)
    }

    /// Installs `c`, or counts one more reference to it.
    pub(super) fn install(&mut self, c: Callable) -> Result<()> {
        let desc = c.descriptor().clone();
        match c {
            Callable::Host(f) => self.host.install(desc.digest(), desc.bytes(), f),
            Callable::Chip(f) => self.chip.install(desc.digest(), desc.bytes(), f),
            Callable::Orch(f, p) => {
                let handle = f.handle();
                let p = self.check_placement(&handle, &p)?;
                let slot = self.orch.install(desc.digest(), desc.bytes(), f)?;
                self.placed.insert(handle.digest(), p);
                Ok(slot)
            }
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
            CallableKind::Orch => {
                let last = self.orch.release(&digest)?;
                if last {
                    self.placed.remove(&digest);
                }
                Ok(last)
            }
        }
    }

    /// Every registered callable's digest, kind and (a kernel's) signature.
    pub(super) fn kinds(&self) -> impl Iterator<Item = (Digest, Registered)> + '_ {
        let host = self.host.iter().map(|(d, _, _)| (*d, CallableKind::HostFn.into()));
        let chip = self.chip.iter().map(|(d, _, f)| (*d, f.registered()));
        let orch = self.orch.iter().map(|(d, _, _)| {
            let placed = match self.placed.get(d) {
                Some(Placement::On(ids)) => Some(ids.clone()),
                _ => None,
            };
            (*d, Registered { placed, ..CallableKind::Orch.into() })
        });
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

impl Placement {
    /// How messages say where it is ("on every nested and remote Worker", "on workers 1, 2").
    fn describe(&self) -> String {
        match self {
            Placement::Everywhere => "on every nested and remote Worker".to_string(),
            Placement::On(ids) => {
                format!("on workers {}", ids.iter().map(u32::to_string).collect::<Vec<_>>().join(", "))
            }
            Placement::Found => "wherever it is found (a linked #[callable(orch)])".to_string(),
        }
    }

    /// Whether a remote node with NEXT_LEVEL id `id` must have it (`Found`: asked, not required).
    pub(super) fn requires(&self, id: u32) -> bool {
        match self {
            Placement::Everywhere => true,
            Placement::On(ids) => ids.binary_search(&id).is_ok(),
            Placement::Found => false,
        }
    }
}
