//! Per-target callable registry: digest -> private local slot, with reference counts.
//!
//! Each target process (a chip, a SUB child, a nested-`Worker` dispatch loop) keeps one
//! [`Registry`]. Senders address callables by [`Digest`]; the registry maps each digest to a
//! small local slot number that never leaves the process, counts how many registrations refer to
//! it, and refuses a digest that arrives with a descriptor other than the one already installed,
//! or with a different function than the one installed under it ([`Installable`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::identity::Digest;
use crate::error::{Error, ErrorKind, Result};

/// What a registry holds: a callable that can say whether it runs the same code as another.
///
/// A plain-API identity is the callable's kind and name, so two different functions can share
/// one digest; the registry refuses the second ([`Registry::install`]) rather than silently
/// counting it as another reference to the first.
pub(crate) trait Installable {
    /// Whether `self` runs the same code as `other` (the same function pointer, or the same
    /// closure instance).
    fn same_code(&self, other: &Self) -> bool;
    /// How a refusal names it: its name, where it was made and its code.
    fn describe(&self) -> String;
}

/// Where a callable value was made, for messages that must tell two of one name apart.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Origin {
    /// By a plain-API constructor called here.
    Made(&'static std::panic::Location<'static>),
    /// By `#[callable]` (or `task_graph!`), with the path its descriptor records.
    Macro(&'static str),
    /// Rebuilt in a child from what its parent sent.
    Sent,
}

impl Origin {
    /// Whether both callables come from `#[callable]`: their digests hash their signature and
    /// body tokens, so one digest is one source text, taken as one callable (as upstream takes
    /// one payload hash) even where two copies of it sit at different addresses.
    pub(crate) fn both_macro(a: Origin, b: Origin) -> bool {
        matches!((a, b), (Origin::Macro(_), Origin::Macro(_)))
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Made(at) => write!(f, "made at {at}"),
            Origin::Macro(path) => write!(f, "#[callable] {path}"),
            Origin::Sent => f.write_str("sent by the parent"),
        }
    }
}

/// One installed callable.
#[derive(Debug, Clone)]
struct Entry<T> {
    digest: Digest,
    descriptor: Box<[u8]>,
    refs: u32,
    value: T,
}

/// Per-target registry: digest -> private local slot, with refcounts.
///
/// Lookups by digest are one hash-map probe plus one vector index. Freed slot numbers are reused,
/// lowest first. Cloning copies every entry (used for the fork snapshot).
#[derive(Debug, Clone)]
pub(crate) struct Registry<T> {
    /// Digest -> slot number (an index into `slots`).
    index: HashMap<Digest, u32>,
    /// Slot number -> entry; `None` for freed slots.
    slots: Vec<Option<Entry<T>>>,
    /// Freed slot numbers, lowest first.
    free: BinaryHeap<Reverse<u32>>,
    /// The most slots that may be in use at once.
    max_slots: usize,
}

impl<T> Registry<T> {
    /// Creates an empty registry with room for at most `max_slots` callables at once.
    pub(crate) fn new(max_slots: usize) -> Registry<T> {
        Registry {
            index: HashMap::new(),
            slots: Vec::new(),
            free: BinaryHeap::new(),
            // Slot numbers are u32: 0..=u32::MAX.
            max_slots: max_slots.min(u32::MAX as usize + 1),
        }
    }
}

impl<T: Installable> Registry<T> {
    /// Installs `value` under the descriptor's digest.
    ///
    /// `digest` is what the sender claims; it must equal sha256(`descriptor`), else an
    /// [`ErrorKind::Callable`] error starting with `HASHID_DESCRIPTOR_MISMATCH`. If the digest is
    /// already installed with the same descriptor bytes and the same code, its refcount goes up
    /// (the new value is dropped) and the existing slot is returned; with different descriptor
    /// bytes, or a different function ([`Installable::same_code`]), it is a
    /// `HASHID_DESCRIPTOR_MISMATCH` error that names both. When all slots are in use it is an
    /// [`ErrorKind::Callable`] error starting with `LOCAL_SLOT_EXHAUSTED`. Returns the local slot
    /// number. [`check`](Registry::check) tells beforehand, without installing.
    pub(crate) fn install(&mut self, digest: Digest, descriptor: &[u8], value: T) -> Result<u32> {
        self.check(digest, descriptor, &value)?;
        if let Some(&slot) = self.index.get(&digest) {
            let entry = self.entry_mut(slot);
            entry.refs += 1; // `check` ruled out an overflow
            return Ok(slot);
        }
        let entry = Entry { digest, descriptor: descriptor.into(), refs: 1, value };
        let slot = if let Some(Reverse(slot)) = self.free.pop() {
            self.slots[slot as usize] = Some(entry);
            slot
        } else {
            // `check` saw room, and `max_slots <= u32::MAX + 1`, so the index fits in a u32.
            let slot = u32::try_from(self.slots.len()).map_err(|_| self.exhausted(&digest))?;
            self.slots.push(Some(entry));
            slot
        };
        self.index.insert(digest, slot);
        Ok(slot)
    }

    /// Whether [`install`](Registry::install) of `value` under `digest` would succeed: the same
    /// checks and errors, with nothing installed. A Worker checks its own registry this way
    /// before it sends a registration to any target.
    pub(crate) fn check(&self, digest: Digest, descriptor: &[u8], value: &T) -> Result<()> {
        let actual = Digest::of(descriptor);
        if actual != digest {
            return Err(Error::new(
                ErrorKind::Callable,
                format!(
                    "HASHID_DESCRIPTOR_MISMATCH: claimed digest {digest} but the {}-byte \
                     descriptor hashes to {actual}",
                    descriptor.len()
                ),
            ));
        }
        if let Some(entry) = self.entry(&digest) {
            if *entry.descriptor != *descriptor {
                return Err(Error::new(
                    ErrorKind::Callable,
                    format!(
                        "HASHID_DESCRIPTOR_MISMATCH: {digest} is already installed with a \
                         different descriptor ({} bytes installed, {} bytes offered)",
                        entry.descriptor.len(),
                        descriptor.len()
                    ),
                ));
            }
            if !entry.value.same_code(value) {
                return Err(Error::new(
                    ErrorKind::Callable,
                    format!(
                        "HASHID_DESCRIPTOR_MISMATCH: {} is a different function under the identity \
                         {digest} of {}; one identity names one function (give the second its own \
                         name)",
                        value.describe(),
                        entry.value.describe()
                    ),
                ));
            }
            if entry.refs == u32::MAX {
                return Err(Error::new(
                    ErrorKind::Callable,
                    format!("{digest} is installed too many times (refcount overflow)"),
                ));
            }
            return Ok(());
        }
        if self.free.is_empty() && self.slots.len() >= self.max_slots {
            return Err(self.exhausted(&digest));
        }
        Ok(())
    }
}

impl<T> Registry<T> {
    /// The error for a full registry.
    fn exhausted(&self, digest: &Digest) -> Error {
        Error::new(
            ErrorKind::Callable,
            format!(
                "LOCAL_SLOT_EXHAUSTED: all {} local callable slots are in use; cannot install {}",
                self.max_slots,
                digest.short()
            ),
        )
    }

    /// The entry in an occupied `slot` (one the index points at).
    fn entry_mut(&mut self, slot: u32) -> &mut Entry<T> {
        self.slots[slot as usize].as_mut().expect("indexed slot is occupied")
    }

    /// The entry installed under `digest`.
    fn entry(&self, digest: &Digest) -> Option<&Entry<T>> {
        let slot = *self.index.get(digest)?;
        self.slots[slot as usize].as_ref()
    }

    /// Drops one reference to `digest`; frees its slot at zero (slot numbers are reused).
    ///
    /// Returns true when the slot was freed. An unknown digest is an [`ErrorKind::Callable`]
    /// error naming the digest.
    pub(crate) fn release(&mut self, digest: &Digest) -> Result<bool> {
        let Some(&slot) = self.index.get(digest) else {
            return Err(Error::new(
                ErrorKind::Callable,
                format!("cannot release {digest}: it is not installed in this registry"),
            ));
        };
        let entry = self.entry_mut(slot);
        entry.refs -= 1;
        if entry.refs > 0 {
            return Ok(false);
        }
        self.slots[slot as usize] = None;
        self.index.remove(digest);
        self.free.push(Reverse(slot));
        Ok(true)
    }

    /// The value installed under `digest`.
    pub(crate) fn get(&self, digest: &Digest) -> Option<&T> {
        self.entry(digest).map(|e| &e.value)
    }

    #[cfg(test)] // only tests need it
    /// The local slot of `digest`.
    pub(crate) fn slot_of(&self, digest: &Digest) -> Option<u32> {
        self.index.get(digest).copied()
    }

    #[cfg(test)] // only tests need it
    /// The value installed in local `slot`.
    pub(crate) fn by_slot(&self, slot: u32) -> Option<&T> {
        let entry = self.slots.get(usize::try_from(slot).ok()?)?.as_ref()?;
        Some(&entry.value)
    }

    /// The reference count of `digest`; 0 when it is not installed.
    pub(crate) fn refs(&self, digest: &Digest) -> u32 {
        self.entry(digest).map_or(0, |e| e.refs)
    }

    /// Whether `digest` is installed.
    pub(crate) fn contains(&self, digest: &Digest) -> bool {
        self.index.contains_key(digest)
    }

    #[cfg(test)] // only tests need it
    /// The number of installed callables (occupied slots).
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    #[cfg(test)] // only tests need it
    /// Whether no callable is installed.
    pub(crate) fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The installed callables as `(digest, descriptor bytes, value)`, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Digest, &[u8], &T)> {
        self.slots.iter().flatten().map(|e| (&e.digest, &*e.descriptor, &e.value))
    }
}

#[cfg(test)]
mod tests;
