//! The TensorMap: who last wrote which bytes, per run.
//!
//! Keyed by (run, buffer identity); each key holds the live writers' view footprints. A lookup
//! returns every live writer whose footprint overlaps the view (see [`overlap`](crate::data::tensor::overlap)), so
//! disjoint views of one buffer stay independent. An insert drops the entries the new view
//! covers wholly and keeps partially covered ones (they still wrote some bytes). Keys never match
//! across runs. The creator of an `orch.alloc` buffer stays under its key with a whole-buffer
//! footprint until it is consumed, so every task that names the allocation can retain it.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use smallvec::SmallVec;

use crate::data::buffer::Identity;
use crate::data::footprint::{Footprint, record_writer};
use crate::data::tensor::TensorView;
use crate::engine::slot::Slot;
use crate::sys::sync;

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
        Walk { map: sync::lock(&self.map) }
    }

    /// True while the allocation `id` of `run` is live (its creator not yet consumed).
    pub(crate) fn has_creator(&self, run: u64, id: Identity) -> bool {
        let map = sync::lock(&self.map);
        map.get(&(run, id)).is_some_and(|entries| entries.iter().any(|e| e.view.is_none()))
    }

    /// Records an allocation's creator with a whole-buffer footprint.
    pub(crate) fn insert_creator(&self, run: u64, id: Identity, slot: Arc<Slot>) {
        let mut map = sync::lock(&self.map);
        map.entry((run, id)).or_default().push(Entry { view: None, who: slot });
    }

    /// Removes every entry still owned by `slot` under the given keys.
    pub(crate) fn erase(&self, run: u64, keys: &[Identity], slot: &Arc<Slot>) {
        let mut map = sync::lock(&self.map);
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
