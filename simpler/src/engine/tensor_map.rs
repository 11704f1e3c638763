//! The TensorMap: who last wrote which bytes, per run.
//!
//! Keyed by (run, buffer identity); each key holds the live writers' view footprints. A lookup
//! returns every live writer whose footprint overlaps the view (see [`crate::overlap`]), so
//! disjoint views of one buffer stay independent. An insert drops the entries the new view
//! covers wholly and keeps partially covered ones (they still wrote some bytes). Keys never match
//! across runs. The creator of an `orch.alloc` buffer stays under its key with a whole-buffer
//! footprint until it is consumed, so every task that names the allocation can retain it.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use smallvec::SmallVec;

use crate::data::buffer::Identity;
use crate::data::tensor::{Overlap, TensorView, overlap};
use crate::engine::slot::Slot;

/// One footprint under a buffer's key: who wrote which bytes.
pub(crate) struct Footprint<W> {
    /// `None`: the whole buffer (an allocation's creator, not a writer).
    pub(crate) view: Option<TensorView>,
    pub(crate) who: W,
}

/// The footprints of one buffer.
pub(crate) type Footprints<W> = SmallVec<[Footprint<W>; 1]>;

/// The writers whose bytes overlap `view` (the rule every lookup follows).
pub(crate) fn overlapping<'a, W>(
    entries: &'a [Footprint<W>],
    view: &'a TensorView,
) -> impl Iterator<Item = &'a W> {
    entries.iter().filter(move |e| e.writes_into(view)).map(|e| &e.who)
}

impl<W> Footprint<W> {
    /// Whether this footprint is a writer's and overlaps `view`.
    fn writes_into(&self, view: &TensorView) -> bool {
        self.view.as_ref().is_some_and(|v| overlap(v, view) != Overlap::None)
    }
}

/// Records `who` as the writer of `view`, dropping the footprints it covers wholly and keeping
/// partially covered ones (they still wrote some bytes).
pub(crate) fn record_writer<W>(entries: &mut Footprints<W>, view: TensorView, who: W) {
    entries.retain(|e| match &e.view {
        None => true,
        Some(old) => overlap(&view, old) != Overlap::Covered,
    });
    entries.push(Footprint { view: Some(view), who });
}

type Entry = Footprint<Arc<Slot>>;

/// A multiply-rotate hasher (FxHash's mixing step) for the map's plain-integer keys: keys are
/// minted by this process (not attacker-chosen), and SipHash was a visible share of submit cost.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
}

type Map = HashMap<(u64, Identity), SmallVec<[Entry; 1]>, BuildHasherDefault<KeyHasher>>;

/// The map; one mutex (the Orchestrator inserts and looks up, consumption erases).
#[derive(Default)]
pub(crate) struct TensorMap {
    map: Mutex<Map>,
}

/// The map, locked for one submit's whole tag walk.
pub(crate) struct Walk<'a> {
    map: MutexGuard<'a, Map>,
}

impl Walk<'_> {
    /// Looks up the writers of `view` (when `want_writers`) and the buffer's creator.
    pub(crate) fn lookup(&self, run: u64, id: Identity, view: &TensorView, want_writers: bool) -> Found {
        lookup_in(&self.map, run, id, view, want_writers)
    }

    /// Records `slot` as the writer of `view`, dropping entries it covers wholly.
    pub(crate) fn insert(&mut self, run: u64, id: Identity, view: TensorView, slot: Arc<Slot>) {
        insert_in(&mut self.map, run, id, view, slot);
    }
}

fn lookup_in(map: &Map, run: u64, id: Identity, view: &TensorView, want_writers: bool) -> Found {
    let mut found = Found::default();
    if let Some(entries) = map.get(&(run, id)) {
        // One pass: this runs for every tensor of every submit.
        for e in entries {
            if e.view.is_none() {
                found.creator = Some(e.who.clone());
            } else if want_writers && e.writes_into(view) {
                found.writers.push(e.who.clone());
            }
        }
    }
    found
}

fn insert_in(map: &mut Map, run: u64, id: Identity, view: TensorView, slot: Arc<Slot>) {
    record_writer(map.entry((run, id)).or_default(), view, slot);
}

/// What a lookup found for one tensor.
#[derive(Default)]
pub(crate) struct Found {
    /// Live writers whose bytes overlap the view.
    pub(crate) writers: SmallVec<[Arc<Slot>; 2]>,
    /// The allocation that owns the buffer, if it is an `orch.alloc` buffer of this run.
    pub(crate) creator: Option<Arc<Slot>>,
}

impl TensorMap {
    /// Locks the map for one submit's tag walk.
    pub(crate) fn walk(&self) -> Walk<'_> {
        Walk { map: self.map.lock().unwrap_or_else(|e| e.into_inner()) }
    }

    /// True while the allocation `id` of `run` is live (its creator not yet consumed).
    pub(crate) fn has_creator(&self, run: u64, id: Identity) -> bool {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&(run, id)).is_some_and(|entries| entries.iter().any(|e| e.view.is_none()))
    }

    /// Records an allocation's creator with a whole-buffer footprint.
    pub(crate) fn insert_creator(&self, run: u64, id: Identity, slot: Arc<Slot>) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.entry((run, id)).or_default().push(Entry { view: None, who: slot });
    }

    /// Removes every entry still owned by `slot` under the given keys.
    pub(crate) fn erase(&self, run: u64, keys: &[Identity], slot: &Arc<Slot>) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        for id in keys {
            if let Some(entries) = map.get_mut(&(run, *id)) {
                entries.retain(|e| !Arc::ptr_eq(&e.who, slot));
                if entries.is_empty() {
                    map.remove(&(run, *id));
                }
            }
        }
    }

    /// Number of keys (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }
}
