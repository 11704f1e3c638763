//! `Lanes`: which children a Worker has, where each callable kind goes, and what messages call
//! each child.
//!
//! A Worker's children sit in one mailbox region, in fork order: the SUB workers `0..sub`, then
//! the NEXT_LEVEL workers `sub..sub + next` (chips at L3, nested Workers above). What a Worker
//! has is fixed by its builder, so the same `Lanes` answer before and after
//! `init`: registration refuses a kind with no target by the same rule either way.
//! [`Lanes::targets`] is the one place a kind's target mailboxes are computed, [`Lanes::label`]
//! the one place a child is named in messages (a remote Worker is "remote worker N (ADDR)";
//! remote lanes come after the mailbox lanes).

use crate::callable::identity::CallableKind;
use crate::level::Level;
use crate::worker::status::WorkerKind;

/// A Worker's children, by mailbox index.
#[derive(Debug, Clone)]
pub(super) struct Lanes {
    /// SUB workers: mailboxes `0..sub`.
    sub: usize,
    /// NEXT_LEVEL workers: mailboxes `sub..sub + next`.
    next: usize,
    /// Whether the NEXT_LEVEL workers are nested Workers (L4 and up) rather than chips.
    nested: bool,
    /// For each nested Worker, whether chip callables run below it.
    chips_below: Vec<bool>,
    /// Remote L3 Workers (their addresses), NEXT_LEVEL ids `next..next + remote.len()`, lanes
    /// after the mailboxes.
    remote: Vec<String>,
}

impl Lanes {
    /// The lanes a Worker of `level` starts with: `sub` SUB workers and `chips` chips (nested
    /// Workers come with [`add_nested`](Lanes::add_nested)).
    pub(super) fn new(level: Level, sub: usize, chips: usize) -> Lanes {
        Lanes { sub, next: chips, nested: level > Level::Node, chips_below: Vec::new(), remote: Vec::new() }
    }

    /// One more remote L3 Worker, at `addr`; returns its NEXT_LEVEL id.
    pub(super) fn add_remote(&mut self, addr: String) -> u32 {
        self.remote.push(addr);
        (self.next + self.remote.len() - 1) as u32
    }

    /// The number of mailboxes (SUB workers, then local NEXT_LEVEL workers).
    pub(super) fn mailboxes(&self) -> usize {
        self.sub + self.next
    }

    /// The name of remote L3 Worker `j` (its address, or its rank in a launched job).
    pub(super) fn remote_name(&self, j: usize) -> &str {
        &self.remote[j]
    }

    /// The number of remote L3 Workers.
    pub(super) fn remotes(&self) -> usize {
        self.remote.len()
    }

    /// Which remote Worker NEXT_LEVEL id `id` names, if it names one.
    pub(super) fn remote_index(&self, id: u32) -> Option<usize> {
        (id as usize).checked_sub(self.next).filter(|&j| j < self.remote.len())
    }

    /// One more nested Worker; `runs_chips`: whether chip callables run below it.
    pub(super) fn add_nested(&mut self, runs_chips: bool) {
        self.next += 1;
        self.chips_below.push(runs_chips);
    }

    /// The mailboxes that hold callables of `kind`: SUB workers hold host functions; chips hold
    /// chip callables (above L3, the nested Workers with chips below them pass them on); nested
    /// Workers hold orchestration functions. Empty when no child can run the kind.
    pub(super) fn targets(&self, kind: CallableKind) -> Vec<usize> {
        let (sub, next) = (self.sub, self.next);
        match kind {
            CallableKind::HostFn => (0..sub).collect(),
            CallableKind::Chip if self.nested => {
                (0..next).filter(|&j| self.chips_below.get(j) == Some(&true)).map(|j| sub + j).collect()
            }
            _ => (sub..sub + next).collect(),
        }
    }

    /// The kind and id of the child behind lane `i` (mailboxes first, then remote Workers).
    pub(super) fn kind_of(&self, i: usize) -> (WorkerKind, u32) {
        if i >= self.mailboxes() {
            return (WorkerKind::Remote, (i - self.sub) as u32);
        }
        match (i < self.sub, self.nested) {
            (true, _) => (WorkerKind::Sub, i as u32),
            (false, false) => (WorkerKind::Chip, (i - self.sub) as u32),
            (false, true) => (WorkerKind::Nested, (i - self.sub) as u32),
        }
    }

    /// How messages name the child behind lane `i`.
    pub(super) fn label(&self, i: usize) -> String {
        if let Some(addr) = i.checked_sub(self.mailboxes()).and_then(|j| self.remote.get(j)) {
            return format!("remote worker {} ({addr})", i - self.sub);
        }
        match (i < self.sub, self.nested) {
            (true, _) => format!("sub worker {i}"),
            (false, false) => format!("chip {}", i - self.sub),
            (false, true) => format!("worker {}", i - self.sub),
        }
    }

    /// The number of NEXT_LEVEL workers (chips at L3, nested and remote Workers above).
    pub(super) fn next_level(&self) -> usize {
        self.next + self.remote.len()
    }

    /// The number of chips (0 above L3, whose NEXT_LEVEL workers are Workers).
    pub(super) fn chips(&self) -> usize {
        if self.nested { 0 } else { self.next }
    }

    /// The mailbox of chip `id`, if there is one.
    pub(super) fn chip(&self, id: u32) -> Option<usize> {
        ((id as usize) < self.chips()).then(|| self.sub + id as usize)
    }
}
