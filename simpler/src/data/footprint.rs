//! Footprints: who wrote which bytes of one buffer, and the overlap rule every lookup follows.
//!
//! The engine's TensorMap keeps one list of footprints per (run, buffer) key, and the DAG
//! capture keeps its own per buffer; both record writers and find overlapping ones through the
//! functions here, so the two can never disagree on what overlaps.

use smallvec::SmallVec;

use crate::data::tensor::{Overlap, TensorView, overlap};

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
    pub(crate) fn writes_into(&self, view: &TensorView) -> bool {
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
