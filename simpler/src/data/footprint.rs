//! Footprints: who wrote and who read which bytes of one buffer, and the overlap rule every
//! lookup follows.
//!
//! The engine's TensorMap keeps one list of footprints per (run, buffer) key (compact ones,
//! whose views it reads from the task's arguments), and the DAG capture keeps its own per
//! buffer; both record writers and readers and find overlapping ones through the rules here, so the two can never disagree on what overlaps or on which edges
//! a task gets: a reader waits for the overlapping writers (read after write); a writer waits
//! for the overlapping writers (write after write) and for the overlapping readers since them
//! (write after read).

use smallvec::SmallVec;

use crate::data::tensor::{Overlap, TensorView, overlap};

/// One footprint under a buffer's key: who wrote (or read) which bytes.
pub(crate) struct Footprint<W> {
    /// `None`: the whole buffer (an allocation's creator, neither a writer nor a reader).
    pub(crate) view: Option<TensorView>,
    pub(crate) who: W,
    /// A reader's footprint (since the writes that covered it), not a writer's.
    pub(crate) reader: bool,
}

/// Whether the bytes of a recorded view `old` overlap `view`: the task using `view` waits for
/// the one that recorded `old` (the rule every lookup follows).
pub(crate) fn touches(old: &TensorView, view: &TensorView) -> bool {
    overlap(old, view) != Overlap::None
}

/// Whether a writer's `view` covers the recorded view `old` wholly, so it replaces it.
pub(crate) fn covers(view: &TensorView, old: &TensorView) -> bool {
    overlap(view, old) == Overlap::Covered
}

/// [`touches`]`(old, view)` and [`covers`]`(view, old)` from one overlap computation: whether
/// two views share bytes does not depend on their order, only whether one covers the other does.
pub(crate) fn touches_and_covers(view: &TensorView, old: &TensorView) -> (bool, bool) {
    let o = overlap(view, old);
    (o != Overlap::None, o == Overlap::Covered)
}

impl<W> Footprint<W> {
    /// Whether this footprint names bytes (not a creator's) that overlap `view`.
    pub(crate) fn touches(&self, view: &TensorView) -> bool {
        self.view.as_ref().is_some_and(|v| touches(v, view))
    }

    /// Whether `view` covers this footprint's bytes wholly (never a creator's).
    pub(crate) fn covered_by(&self, view: &TensorView) -> bool {
        self.view.as_ref().is_some_and(|old| covers(view, old))
    }
}

/// The footprints of one buffer, writers and readers in one list (one inline entry: most
/// buffers have a single writer or reader at a time).
pub(crate) type Footprints<W> = SmallVec<[Footprint<W>; 1]>;

/// The writers whose bytes overlap `view` (what a reader waits for, and a writer too).
pub(crate) fn writers_of<'a, W>(
    entries: &'a [Footprint<W>],
    view: &'a TensorView,
) -> impl Iterator<Item = &'a W> {
    entries.iter().filter(move |e| !e.reader && e.touches(view)).map(|e| &e.who)
}

/// The readers whose bytes overlap `view` (what a writer waits for besides the writers).
pub(crate) fn readers_of<'a, W>(
    entries: &'a [Footprint<W>],
    view: &'a TensorView,
) -> impl Iterator<Item = &'a W> {
    entries.iter().filter(move |e| e.reader && e.touches(view)).map(|e| &e.who)
}

/// Records `who` as the writer of `view`, dropping the writers and readers it covers wholly (a
/// later task that waits for `who` waits for them through it) and keeping partially covered
/// ones (they still wrote or read some bytes).
pub(crate) fn record_writer<W>(entries: &mut Footprints<W>, view: TensorView, who: W) {
    entries.retain(|e| !e.covered_by(&view));
    entries.push(Footprint { view: Some(view), who, reader: false });
}

/// Records `who` as a reader of `view`: later writers of overlapping bytes wait for it.
pub(crate) fn record_reader<W>(entries: &mut Footprints<W>, view: TensorView, who: W) {
    entries.push(Footprint { view: Some(view), who, reader: true });
}
