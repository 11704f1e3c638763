//! The TensorMap: who last wrote, and who read since, which bytes, per run.
//!
//! Keyed by (run, buffer identity); each key holds one list of footprints: the live writers'
//! views and the readers' since those writes ([`Footprints`]). A task's tensor finds every
//! footprint that overlaps its view (see [`overlap`](crate::data::tensor::overlap)), so disjoint
//! views of one buffer stay independent: a reader waits for the overlapping writers (read after
//! write), a writer for the overlapping writers (write after write) and readers (write after
//! read), so no two unordered tasks are handed aliasing slices (only `Tag::NoDep` is untracked,
//! and needs `unsafe`). A writer drops the footprints its view covers wholly and keeps partially
//! covered ones (they still touched some bytes); a reader drops the finished readers. Keys never
//! match across runs. The creator of an `orch.alloc` buffer stays under its key with a
//! whole-buffer footprint until it is consumed, so every task that names the allocation can
//! retain it.
//!
//! Submitting stays linear in the readers of one buffer: past [`FEW`] footprints a key's further
//! readers go to a side log ([`Readers`]) that a reader never scans (a reader waits only for
//! writers), that sheds finished readers when it has doubled since it last did, and that a
//! consumed reader does not search: it only counts itself, and the log sweeps out consumed
//! readers once they are half of its tasks. A writer scans it, as it must (write after read).
//!
//! # Ordering: a divergence from upstream
//!
//! Upstream's TensorMap orders a task only after the earlier writers of what it reads (read
//! after write) and leaves write-after-write and write-after-read to explicit dependencies.
//! Here host functions and kernels receive `&mut [T]` / `&[T]`, chip cores are threads of one
//! process and SUB workers share memory across processes, so two unordered tasks touching the
//! same bytes would alias a `&mut` from safe code. So every overlap is ordered, as StarPU and
//! Legion do; disjoint views of one buffer stay parallel, and the cost at submit is one map
//! entry per read tensor. The DAG capture records the extra edges as
//! `EdgeReason::WriteAfterWrite` / `WriteAfterRead`.
//!
//! The same promise reaches the host and the levels below: each task holds the `Buffer`s of its
//! tracked tensors from submit until its slot is consumed (`slot::BufferHolds`,
//! `BufferInner::hold`: no reference counting, the task's own tensors keep the buffers alive),
//! and host writes are refused meanwhile; a run serving a task of the level above is confined
//! to that task's tensors (`Orchestrator::confine_to`). Two ways out, both marked: `Tag::NoDep`,
//! added only by the `unsafe` `TaskArgs::no_dep`, is untracked; and a `task_graph!` marks its
//! own intermediates *static* (`TaskArgs::set_static`, crate-private, reached through hidden
//! `Call` methods of generated code): their edges arrive as the task's deps, computed by the
//! graph's `StaticEdges`, and the TensorMap only looks up the allocation's creator (retained as
//! usual).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use smallvec::SmallVec;

use crate::data::buffer::Identity;
use crate::data::footprint::touches_and_covers;
use crate::data::task_args::Tag;
use crate::data::tensor::TensorView;
use crate::engine::slot::{Slot, State};
use crate::sys::sync;

/// A multiply-rotate hasher (FxHash's mixing step) for maps keyed by buffer identities and
/// other plain integers that this process tree mints (not attacker-chosen): SipHash was a
/// visible share of submit cost here, and of a worker's per-task mapping lookups.
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

/// One footprint: a task (or an allocation's creator) and which of its tensors touched the
/// buffer. The view is read from the task's arguments (immutable once submitted), so an entry
/// stays 16 bytes and a map bucket within a cache line: submit touches one bucket per tensor.
struct Entry {
    who: Arc<Slot>,
    /// The member whose tensor this is; `CREATOR` for an allocation's creator (whole buffer).
    member: u32,
    /// The tensor's index in that member's arguments, with `READER` set for a reader.
    arg: u32,
}

const CREATOR: u32 = u32::MAX;
const READER: u32 = 1 << 31;
/// In `arg`: an untracked writer (a `NoDep` tensor, or a static one that writes), which orders
/// nothing and is never replaced; it is there only for [`TensorMap::writer_pending`].
const UNTRACKED: u32 = 1 << 30;

impl Entry {
    fn is_creator(&self) -> bool {
        self.member == CREATOR
    }

    fn is_reader(&self) -> bool {
        self.arg & READER != 0
    }

    fn is_untracked(&self) -> bool {
        !self.is_creator() && self.arg & UNTRACKED != 0
    }

    /// The view this entry recorded (not for a creator).
    fn view(&self) -> &TensorView {
        self.who.task().args[self.member as usize].tensors[(self.arg & !(READER | UNTRACKED)) as usize].view()
    }
}

/// How many footprints a key keeps in its short list before further readers go to its
/// [`Readers`] log.
const FEW: usize = 16;

/// The footprints of one buffer (see `data::footprint` for the rules).
#[derive(Default)]
struct Footprints {
    /// The creator, the writers, the untracked writers, and the readers while there are few.
    list: SmallVec<[Entry; 1]>,
    /// Readers beyond [`FEW`], when there are any.
    many: Option<Box<Readers>>,
}

/// A key's readers beyond [`FEW`]. One submit's entries for the key are pushed together, so
/// the entries of one task are adjacent (sweeps keep the order).
#[derive(Default)]
struct Readers {
    entries: Vec<Entry>,
    /// Tasks with entries here (as of the last push or sweep; an upper bound).
    tasks: usize,
    /// Of those, how many were consumed since the last sweep (an upper bound: a sweep may have
    /// taken a task's entries before its consumption was counted).
    consumed: usize,
    /// `entries.len()` after the last sweep of finished readers.
    swept: usize,
}

impl Readers {
    /// Appends a reader's entry; returns how many entries it looked at.
    fn push(&mut self, e: Entry) -> usize {
        if self.entries.last().is_none_or(|last| !Arc::ptr_eq(&last.who, &e.who)) {
            self.tasks += 1;
        }
        self.entries.push(e);
        if self.entries.len() >= 2 * self.swept.max(FEW) {
            return self.retain(|e| !matches!(e.who.state(), State::Completed | State::Consumed));
        }
        0
    }

    /// Keeps the entries `keep` accepts, in order, and recounts; returns how many it looked at.
    fn retain(&mut self, mut keep: impl FnMut(&Entry) -> bool) -> usize {
        let looked = self.entries.len();
        self.entries.retain(|e| keep(e));
        self.tasks = self.entries.windows(2).filter(|w| !Arc::ptr_eq(&w[0].who, &w[1].who)).count()
            + usize::from(!self.entries.is_empty());
        self.consumed = 0;
        self.swept = self.entries.len();
        looked
    }

    /// One of its tasks was consumed: counted, and once they are half
    /// of its tasks, every consumed task's entries are swept out. Returns how many entries it
    /// looked at.
    fn consumed_one(&mut self) -> usize {
        self.consumed += 1;
        if 2 * self.consumed >= self.tasks {
            return self.retain(|e| e.who.state() != State::Consumed);
        }
        0
    }
}

type Map = HashMap<(u64, Identity), Footprints, BuildHasherDefault<KeyHasher>>;

/// The map; one mutex (the Orchestrator inserts and looks up, consumption erases).
#[derive(Default)]
pub(crate) struct TensorMap {
    map: Mutex<Map>,
    /// Footprints looked at by walks and erasures (tests: submitting is linear).
    #[cfg(test)]
    pub(crate) scanned: std::sync::atomic::AtomicUsize,
}

/// Counts `n` footprints looked at (tests only).
#[cfg(test)]
fn scanned(map: &TensorMap, n: usize) {
    map.scanned.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
}

#[cfg(not(test))]
fn scanned(_: &TensorMap, _: usize) {}

/// The map, locked for one submit's whole tag walk.
pub(crate) struct Walk<'a> {
    map: MutexGuard<'a, Map>,
    owner: &'a TensorMap,
}

impl Walk<'_> {
    /// One tensor of a submitting task (argument `arg` of member `member`), in one map access:
    /// fills `found` with what the task waits for under `tag` and records it as a writer or
    /// reader of `view`. Returns whether it recorded an entry (everything but `NoDep`), which
    /// the slot erases when it is consumed.
    #[expect(clippy::too_many_arguments, reason = "one call per tensor on the submit path")]
    pub(crate) fn visit(
        &mut self,
        run: u64,
        id: Identity,
        view: &TensorView,
        tag: Tag,
        slot: &Arc<Slot>,
        (member, arg): (usize, usize),
        found: &mut Found,
    ) -> bool {
        if tag == Tag::NoDep {
            // Untracked: only the allocation's creator, so the task retains its memory.
            if let Some(fp) = self.map.get(&(run, id)) {
                found.creator = fp.list.iter().find(|e| e.is_creator()).map(|e| e.who.clone());
            }
            return false;
        }
        let writes = tag.writes();
        let entry = Entry {
            who: slot.clone(),
            member: member as u32,
            arg: arg as u32 | if writes { 0 } else { READER },
        };
        let fp = match self.map.entry((run, id)) {
            // Most tensors name a buffer nothing else touches yet: one write of the new bucket.
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(Footprints { list: smallvec::smallvec![entry], many: None });
                return true;
            }
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
        };
        // The log of many readers: a writer waits for those it touches and drops those it
        // covers; a reader does not look at them.
        if writes && let Some(many) = &mut fp.many {
            let looked = many.retain(|e| {
                if e.who.state() == State::Consumed {
                    return false;
                }
                let (touched, covered) = touches_and_covers(view, e.view());
                if touched {
                    found.readers.push(e.who.clone());
                }
                !covered
            });
            scanned(self.owner, looked);
            if many.entries.is_empty() {
                fp.many = None;
            }
        }
        let list = &mut fp.list;
        scanned(self.owner, list.len());
        // One pass, removing in place (order does not matter here): this runs for every tensor
        // of every submit.
        let mut i = 0;
        while i < list.len() {
            let e = &list[i];
            let drop = if e.is_creator() {
                found.creator = Some(e.who.clone());
                false
            } else if e.is_untracked() {
                // Orders nothing; erased when its task is consumed.
                false
            } else if e.is_reader() && !writes {
                // Finished readers order nothing: drop them, so a buffer that many tasks read
                // does not grow a long list.
                matches!(e.who.state(), State::Completed | State::Consumed)
            } else {
                let (touched, covered) = touches_and_covers(view, e.view());
                if touched {
                    if e.is_reader() { &mut found.readers } else { &mut found.writers }.push(e.who.clone());
                }
                // A writer replaces what it covers wholly.
                writes && covered
            };
            if drop {
                list.swap_remove(i);
            } else {
                i += 1;
            }
        }
        if writes || list.len() < FEW {
            list.push(entry);
        } else {
            let looked = fp.many.get_or_insert_default().push(entry);
            scanned(self.owner, looked);
        }
        true
    }

    /// Records an untracked tensor that writes (tagged `NoDep`, or static and writing),
    /// argument `arg` of member `member`, so that [`TensorMap::writer_pending`] sees its task;
    /// it orders nothing. Returns true: the slot erases it when it is consumed.
    pub(crate) fn untracked_writer(
        &mut self,
        run: u64,
        id: Identity,
        slot: &Arc<Slot>,
        (member, arg): (usize, usize),
    ) -> bool {
        let entry = Entry { who: slot.clone(), member: member as u32, arg: arg as u32 | UNTRACKED };
        self.map.entry((run, id)).or_default().list.push(entry);
        true
    }
}

/// What one tensor of a submitting task found.
#[derive(Default)]
pub(crate) struct Found {
    /// Live writers whose bytes overlap the view.
    pub(crate) writers: SmallVec<[Arc<Slot>; 2]>,
    /// For a writer: the live readers whose bytes overlap the view.
    pub(crate) readers: SmallVec<[Arc<Slot>; 2]>,
    /// The allocation that owns the buffer, if it is an `orch.alloc` buffer of this run.
    pub(crate) creator: Option<Arc<Slot>>,
}

impl TensorMap {
    /// Locks the map for one submit's tag walk.
    pub(crate) fn walk(&self) -> Walk<'_> {
        Walk { map: sync::lock(&self.map), owner: self }
    }

    /// True while the allocation `id` of `run` is live (its creator not yet consumed).
    pub(crate) fn has_creator(&self, run: u64, id: Identity) -> bool {
        let map = sync::lock(&self.map);
        map.get(&(run, id))
            .is_some_and(|fp| fp.list.iter().any(|e| e.is_creator() && e.who.state() != State::Consumed))
    }

    /// True while a task of `run` that writes `id` has not ended (neither completed, failed
    /// nor consumed): bytes of `id` read now may not be what `run` leaves there. Untracked
    /// writers count when they were recorded ([`Walk::untracked_writer`]: on a level whose
    /// lanes stage).
    pub(crate) fn writer_pending(&self, run: u64, id: Identity) -> bool {
        let map = sync::lock(&self.map);
        map.get(&(run, id)).is_some_and(|fp| {
            fp.list.iter().any(|e| {
                !e.is_creator()
                    && !e.is_reader()
                    && !matches!(e.who.state(), State::Completed | State::Failed | State::Consumed)
            })
        })
    }

    /// Whether an unfinished task (neither completed, failed nor consumed) of one of `runs`
    /// touches one of `buffers` (identities, each with whether the asking run writes it) in a
    /// way that conflicts: it writes the buffer, or the asking run does. Whole buffers: views
    /// are not compared, so disjoint views of one buffer in two runs count as a conflict.
    /// Untracked writers count where they are recorded (a level whose lanes stage); `NoDep`
    /// tensors elsewhere order nothing, across runs as within one. One lock, one lookup per
    /// buffer and run.
    pub(crate) fn conflicts(&self, runs: &[u64], buffers: &[(Identity, bool)]) -> bool {
        if runs.is_empty() || buffers.is_empty() {
            return false;
        }
        let unfinished =
            |e: &Entry| !matches!(e.who.state(), State::Completed | State::Failed | State::Consumed);
        let map = sync::lock(&self.map);
        buffers.iter().any(|&(id, writes)| {
            runs.iter().any(|&run| {
                map.get(&(run, id)).is_some_and(|fp| {
                    fp.list.iter().any(|e| !e.is_creator() && (writes || !e.is_reader()) && unfinished(e))
                        || (writes && fp.many.as_ref().is_some_and(|m| m.entries.iter().any(unfinished)))
                })
            })
        })
    }

    /// Records an allocation's creator with a whole-buffer footprint.
    pub(crate) fn insert_creator(&self, run: u64, id: Identity, slot: Arc<Slot>) {
        let mut map = sync::lock(&self.map);
        map.entry((run, id)).or_default().list.push(Entry { who: slot, member: CREATOR, arg: 0 });
    }

    /// Removes every entry still owned by `slot` (consumed) under the given keys: from the
    /// short lists at once; from a log of many readers in bulk ([`Readers::consumed_one`]).
    pub(crate) fn erase(&self, run: u64, keys: &[Identity], slot: &Arc<Slot>) {
        let mut map = sync::lock(&self.map);
        for id in keys {
            // One hash lookup per key, also when the key goes.
            if let std::collections::hash_map::Entry::Occupied(mut entry) = map.entry((run, *id)) {
                let fp = entry.get_mut();
                scanned(self, fp.list.len());
                let mut i = 0;
                while i < fp.list.len() {
                    if Arc::ptr_eq(&fp.list[i].who, slot) {
                        fp.list.swap_remove(i);
                    } else {
                        i += 1;
                    }
                }
                if let Some(many) = &mut fp.many {
                    let looked = many.consumed_one();
                    scanned(self, looked);
                    if many.entries.is_empty() {
                        fp.many = None;
                    }
                }
                if fp.list.is_empty() && fp.many.is_none() {
                    entry.remove();
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
