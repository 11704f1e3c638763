//! Footprints: who wrote and who read which bytes of one buffer, and the overlap rule every
//! lookup follows.
//!
//! The engine's TensorMap keeps one [`Footprints`] per (run, buffer) key, and the DAG capture
//! keeps its own per buffer; both record writers and readers and find overlapping ones through
//! the functions here, so the two can never disagree on what overlaps or on which edges a task
//! gets: a reader waits for the overlapping writers (read after write); a writer waits for the
//! overlapping writers (write after write) and for the overlapping readers since them (write
//! after read).

use std::collections::VecDeque;

use smallvec::SmallVec;

use crate::data::tensor::{Overlap, TensorView, overlap};

/// One footprint under a buffer's key: who wrote (or read) which bytes.
pub(crate) struct Footprint<W> {
    /// `None`: the whole buffer (an allocation's creator, neither a writer nor a reader).
    pub(crate) view: Option<TensorView>,
    pub(crate) who: W,
}

impl<W> Footprint<W> {
    /// Whether this footprint names bytes (not a creator's) that overlap `view`.
    pub(crate) fn touches(&self, view: &TensorView) -> bool {
        self.view.as_ref().is_some_and(|v| overlap(v, view) != Overlap::None)
    }

    /// Whether `view` covers this footprint's bytes wholly (never a creator's).
    fn covered_by(&self, view: &TensorView) -> bool {
        self.view.as_ref().is_some_and(|old| overlap(view, old) == Overlap::Covered)
    }
}

/// The footprints of one buffer: its live writers (and, in the TensorMap, the allocation's
/// creator) and the readers since the writes that covered them.
pub(crate) struct Footprints<W> {
    pub(crate) writers: SmallVec<[Footprint<W>; 1]>,
    /// In submit order (the TensorMap prunes finished readers from the front).
    pub(crate) readers: VecDeque<Footprint<W>>,
}

impl<W> Default for Footprints<W> {
    fn default() -> Self {
        Footprints { writers: SmallVec::new(), readers: VecDeque::new() }
    }
}

impl<W> Footprints<W> {
    /// True when no footprint is left.
    pub(crate) fn is_empty(&self) -> bool {
        self.writers.is_empty() && self.readers.is_empty()
    }

    /// The writers whose bytes overlap `view` (what a reader waits for, and a writer too).
    pub(crate) fn writers_of<'a>(&'a self, view: &'a TensorView) -> impl Iterator<Item = &'a W> {
        self.writers.iter().filter(move |e| e.touches(view)).map(|e| &e.who)
    }

    /// The readers whose bytes overlap `view` (what a writer waits for besides the writers).
    pub(crate) fn readers_of<'a>(&'a self, view: &'a TensorView) -> impl Iterator<Item = &'a W> {
        self.readers.iter().filter(move |e| e.touches(view)).map(|e| &e.who)
    }

    /// Records `who` as the writer of `view`, dropping the writers and readers it covers wholly
    /// (a later task that waits for `who` waits for them through it) and keeping partially
    /// covered ones (they still wrote or read some bytes).
    pub(crate) fn record_writer(&mut self, view: TensorView, who: W) {
        self.writers.retain(|e| !e.covered_by(&view));
        if !self.readers.is_empty() {
            self.readers.retain(|e| !e.covered_by(&view));
        }
        self.writers.push(Footprint { view: Some(view), who });
    }

    /// Records `who` as a reader of `view`: later writers of overlapping bytes wait for it.
    pub(crate) fn record_reader(&mut self, view: TensorView, who: W) {
        self.readers.push_back(Footprint { view: Some(view), who });
    }
}
