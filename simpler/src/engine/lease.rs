//! Pipeline resource leases: who may use which set of per-run resources.
//!
//! A level that lets several runs be in flight builds each per-run resource to the *grant*
//! (the pipeline depth it was given) and hands a run a [`Lease`] `{slot, generation}` that
//! selects one set. [`LeaseArena`] mints leases and is the authority on ownership; a receiver
//! downstream of it (a chip runtime) cannot re-derive ownership and keeps a [`HighWater`] mark
//! per slot instead, refusing any generation below the newest it has seen.
//!
//! # Rules
//!
//! * **L1 (generations).** Generation 0 is the invalid lease ([`Lease::NONE`]): never minted,
//!   never admitted, never run: the engine dispatches a run's tasks only once the run holds a
//!   lease, and a child process refuses a task frame carrying generation 0 unrun
//!   (`ipc::child::task_lease`). Each acquisition of a slot mints the slot's next generation
//!   (1, 2, ...), so a lease names one tenure of one slot and no two tenures share a lease.
//! * **L2 (lowest free slot).** [`LeaseArena::acquire`] hands out the lowest free slot, or
//!   nothing when none is free; the arena never holds more slots than its grant.
//! * **L3 (release).** Releasing the current lease of a live slot frees it; releasing it again
//!   (the slot still free, nobody re-leased it) is harmless; releasing a lease whose slot has
//!   since been re-leased (a *stale* lease), or one this arena never minted, is refused with an
//!   error naming both generations.
//! * **L4 (quarantine).** A run that ends without proving what it left behind (abandoned with
//!   a task that may still be on a worker: a deadline or cancel whose worker could not be
//!   stopped, a panic) quarantines its lease instead of releasing it: the slot is not handed
//!   out again until the worker confirms that no task under it runs any more
//!   ([`LeaseArena::confirm`]: each such task's end reported, or its worker out of service),
//!   and meanwhile it still counts against the grant, so failing never buys concurrency.
//!   Releasing a quarantined lease is refused; only the confirmation frees it, once. free +
//!   live + quarantined is always the grant.
//! * **L5 (high-water mark).** A receiver admits a lease only when its slot is inside the
//!   grant and its generation is at least the highest generation it admitted for that slot;
//!   admitting raises the mark. A stale lease (one superseded by a newer tenure the receiver has
//!   seen) is refused. This is weaker than ownership (a released lease whose successor has not
//!   reached the receiver still passes); dispatching only for a run that owns its lease (the
//!   arena's [`LeaseArena::owns`]) is the sender's side of the contract.
//!
//! # Resource classes
//!
//! What one pipeline slot selects, and how many copies a grant of `depth` builds
//! ([`ResourceClass::copies`]): per-run host staging (`HostPerRun`, one per slot: a chip's
//! retained staging buffer), the device scratch every run shares (`DeviceScratch`, one: a
//! chip's engine and its `orch.alloc` memory, used only by the one run that executes), and
//! execution handles (`ExecHandle`, one per slot: a prepared or launched run's token).

#![cfg_attr(
    not(test),
    expect(
        dead_code,
        reason = "`Lease::NONE`, `ResourceClass`, `LeaseCounts` and the arena's queries serve the tests; the engine and the chip runtime use the rest"
    )
)]

use crate::error::{Error, Result};

/// A run's claim on one set of per-run resources: slot `slot`, tenure `generation` (rule L1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Lease {
    /// Which set of per-run resources.
    pub(crate) slot: u32,
    /// Which tenure of that slot; 0 is invalid.
    pub(crate) generation: u64,
}

impl Lease {
    /// The invalid lease (generation 0): carried by a run that holds none.
    pub(crate) const NONE: Lease = Lease { slot: 0, generation: 0 };

    /// Whether this is a minted lease (generation above 0).
    pub(crate) fn is_valid(self) -> bool {
        self.generation != 0
    }
}

impl std::fmt::Display for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "lease {{slot {}, generation {}}}", self.slot, self.generation)
    }
}

/// The per-run resource classes and how many copies a grant builds (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResourceClass {
    /// Per-run host-tensor staging: one per slot, selected by the lease's slot.
    HostPerRun,
    /// Device scratch shared by every run: one, used by the executing run alone.
    DeviceScratch,
    /// Execution handles (prepared or launched runs): one per slot.
    ExecHandle,
}

impl ResourceClass {
    /// Copies of this class a grant of `depth` builds.
    pub(crate) fn copies(self, depth: u32) -> u32 {
        match self {
            ResourceClass::HostPerRun | ResourceClass::ExecHandle => depth,
            ResourceClass::DeviceScratch => 1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    Live,
    Quarantined,
}

/// The three counts that partition a [`LeaseArena`]'s grant (rule L4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct LeaseCounts {
    pub(crate) free: u32,
    pub(crate) live: u32,
    pub(crate) quarantined: u32,
}

/// Mints and takes back [`Lease`]s over a fixed grant of slots (rules L1-L4).
#[derive(Debug)]
pub(crate) struct LeaseArena {
    /// Per slot: its state and the generation of its newest tenure (0: never leased).
    slots: Vec<(SlotState, u64)>,
}

impl LeaseArena {
    /// An arena of `depth` free slots. A depth of 0 is an `InvalidArgument` error.
    pub(crate) fn new(depth: u32) -> Result<LeaseArena> {
        if depth == 0 {
            return Err(Error::invalid("a lease arena needs a grant of at least 1 slot"));
        }
        Ok(LeaseArena { slots: vec![(SlotState::Free, 0); depth as usize] })
    }

    /// The grant: how many slots the arena holds.
    pub(crate) fn depth(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Leases the lowest free slot under its next generation (rules L1, L2); `None` when every
    /// slot is live or quarantined.
    pub(crate) fn acquire(&mut self) -> Option<Lease> {
        let (slot, entry) = self.slots.iter_mut().enumerate().find(|(_, (s, _))| *s == SlotState::Free)?;
        entry.0 = SlotState::Live;
        entry.1 += 1;
        Some(Lease { slot: slot as u32, generation: entry.1 })
    }

    fn entry(&self, lease: Lease) -> Result<(SlotState, u64)> {
        if !lease.is_valid() {
            return Err(Error::invalid(format!("{lease} is the invalid lease (generation 0)")));
        }
        self.slots.get(lease.slot as usize).copied().ok_or_else(|| {
            Error::invalid(format!(
                "{lease}: slot {} is outside the grant of {}",
                lease.slot,
                self.slots.len()
            ))
        })
    }

    /// Whether `lease` is the current tenure of a live slot.
    pub(crate) fn owns(&self, lease: Lease) -> bool {
        self.entry(lease).is_ok_and(|(s, g)| s == SlotState::Live && g == lease.generation)
    }

    /// Returns `lease` (rule L3): its slot becomes free. Releasing the current lease of a slot
    /// that is already free again is harmless. A stale lease, one never minted, the invalid
    /// lease or one of a quarantined slot is an `InvalidState` / `InvalidArgument` error naming
    /// the slot's current generation.
    pub(crate) fn release(&mut self, lease: Lease) -> Result<()> {
        let (state, current) = self.entry(lease)?;
        if lease.generation != current {
            return Err(Error::state(format!(
                "releasing a stale {lease}: slot {} is at generation {current} now",
                lease.slot
            )));
        }
        match state {
            SlotState::Live => {
                self.slots[lease.slot as usize].0 = SlotState::Free;
                Ok(())
            }
            SlotState::Free => Ok(()),
            SlotState::Quarantined => Err(Error::state(format!(
                "releasing {lease}: its slot is quarantined until its worker confirms the end of its task"
            ))),
        }
    }

    /// Quarantines the slot of the current, live `lease` (rule L4): it is not leased again
    /// until [`confirm`](Self::confirm)ed. A stale or free lease is refused as by
    /// [`release`](Self::release).
    pub(crate) fn quarantine(&mut self, lease: Lease) -> Result<()> {
        let (state, current) = self.entry(lease)?;
        if lease.generation != current || state == SlotState::Free {
            return Err(Error::state(format!(
                "quarantining {lease}: slot {} is at generation {current} and {state:?}",
                lease.slot
            )));
        }
        self.slots[lease.slot as usize].0 = SlotState::Quarantined;
        Ok(())
    }

    /// Frees the quarantined slot of `lease` (rule L4): the worker confirmed that no task under
    /// it runs any more. Anything but the current tenure of a quarantined slot is refused, as
    /// by [`release`](Self::release), and the slot stays as it is.
    pub(crate) fn confirm(&mut self, lease: Lease) -> Result<()> {
        let (state, current) = self.entry(lease)?;
        if lease.generation != current || state != SlotState::Quarantined {
            return Err(Error::state(format!(
                "confirming the end of {lease}: slot {} is at generation {current} and {state:?}, not quarantined",
                lease.slot
            )));
        }
        self.slots[lease.slot as usize].0 = SlotState::Free;
        Ok(())
    }

    /// The free, live and quarantined counts; they add up to [`depth`](Self::depth).
    pub(crate) fn counts(&self) -> LeaseCounts {
        let mut c = LeaseCounts::default();
        for (s, _) in &self.slots {
            match s {
                SlotState::Free => c.free += 1,
                SlotState::Live => c.live += 1,
                SlotState::Quarantined => c.quarantined += 1,
            }
        }
        c
    }
}

/// A receiver's per-slot generation high-water marks (rule L5).
#[derive(Debug, Clone)]
pub(crate) struct HighWater {
    marks: Vec<u64>,
}

impl HighWater {
    /// Marks for a grant of `depth` slots, none seen yet.
    pub(crate) fn new(depth: u32) -> HighWater {
        HighWater { marks: vec![0; depth as usize] }
    }

    /// The grant these marks cover.
    pub(crate) fn depth(&self) -> u32 {
        self.marks.len() as u32
    }

    /// The highest generation admitted for `slot` (0: none).
    pub(crate) fn mark(&self, slot: u32) -> u64 {
        self.marks.get(slot as usize).copied().unwrap_or(0)
    }

    /// Admits `lease` and raises its slot's mark, or refuses it: the invalid lease, a slot
    /// outside the grant, or a generation below the mark (a stale lease), each an
    /// `InvalidState` error naming the lease and the mark.
    pub(crate) fn admit(&mut self, lease: Lease) -> Result<()> {
        if !lease.is_valid() {
            return Err(Error::state(format!(
                "{lease} is the invalid lease (generation 0); it runs nothing"
            )));
        }
        let depth = self.marks.len();
        let Some(mark) = self.marks.get_mut(lease.slot as usize) else {
            return Err(Error::state(format!(
                "{lease}: slot {} is outside the granted pipeline depth {depth}",
                lease.slot
            )));
        };
        if lease.generation < *mark {
            return Err(Error::state(format!(
                "stale {lease}: slot {} has already run generation {mark}",
                lease.slot
            )));
        }
        *mark = lease.generation;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_zero_is_never_minted_nor_admitted() {
        let mut a = LeaseArena::new(2).unwrap();
        let l = a.acquire().unwrap();
        assert!(l.is_valid() && l.generation == 1);
        assert!(!Lease::NONE.is_valid());
        assert!(a.release(Lease::NONE).is_err());
        assert!(!a.owns(Lease::NONE));
        let err = HighWater::new(2).admit(Lease::NONE).unwrap_err();
        assert!(err.message().contains("generation 0"), "{err}");
        assert!(LeaseArena::new(0).is_err());
    }

    #[test]
    fn the_lowest_free_slot_goes_first_and_the_grant_is_the_limit() {
        let mut a = LeaseArena::new(2).unwrap();
        let l0 = a.acquire().unwrap();
        let l1 = a.acquire().unwrap();
        assert_eq!((l0.slot, l1.slot), (0, 1));
        assert_eq!(a.acquire(), None, "two live leases fill a grant of two");
        assert_eq!(a.counts(), LeaseCounts { free: 0, live: 2, quarantined: 0 });
        a.release(l0).unwrap();
        let again = a.acquire().unwrap();
        assert_eq!(again, Lease { slot: 0, generation: 2 }, "slot 0 again, under a new generation");
    }

    #[test]
    fn releasing_the_current_lease_twice_is_harmless() {
        let mut a = LeaseArena::new(1).unwrap();
        let l = a.acquire().unwrap();
        a.release(l).unwrap();
        a.release(l).unwrap();
        assert_eq!(a.counts(), LeaseCounts { free: 1, live: 0, quarantined: 0 });
        assert!(!a.owns(l));
    }

    #[test]
    fn releasing_a_stale_lease_is_refused() {
        let mut a = LeaseArena::new(1).unwrap();
        let old = a.acquire().unwrap();
        a.release(old).unwrap();
        let new = a.acquire().unwrap();
        let err = a.release(old).unwrap_err();
        assert!(err.message().contains("stale") && err.message().contains("generation 2"), "{err}");
        assert!(a.owns(new), "the refused release left the new tenure alone");
        assert!(a.release(Lease { slot: 0, generation: 9 }).is_err(), "a generation never minted");
        assert!(a.release(Lease { slot: 5, generation: 1 }).is_err(), "a slot outside the grant");
    }

    #[test]
    fn a_quarantined_slot_is_not_reused_unconfirmed_and_still_counts() {
        let mut a = LeaseArena::new(2).unwrap();
        let l0 = a.acquire().unwrap();
        a.quarantine(l0).unwrap();
        assert_eq!(a.counts(), LeaseCounts { free: 1, live: 0, quarantined: 1 });
        let l1 = a.acquire().unwrap();
        assert_eq!(l1.slot, 1);
        a.release(l1).unwrap();
        for _ in 0..3 {
            let l = a.acquire().unwrap();
            assert_eq!(l.slot, 1, "slot 0 stays out of service");
            a.release(l).unwrap();
        }
        assert!(a.release(l0).is_err(), "a quarantined lease cannot be released back into service");
        let c = a.counts();
        assert_eq!(c.free + c.live + c.quarantined, a.depth());
    }

    #[test]
    fn a_quarantined_slot_returns_to_service_only_on_confirmation() {
        let mut a = LeaseArena::new(1).unwrap();
        let l = a.acquire().unwrap();
        a.quarantine(l).unwrap();
        assert_eq!(a.acquire(), None, "the only slot is quarantined");
        assert!(a.release(l).is_err(), "a release does not end a quarantine");
        assert!(a.confirm(Lease { slot: 0, generation: 2 }).is_err(), "a generation never minted");
        a.confirm(l).unwrap();
        assert_eq!(a.counts(), LeaseCounts { free: 1, live: 0, quarantined: 0 });
        assert!(a.confirm(l).is_err(), "confirmed once");
        let next = a.acquire().unwrap();
        assert_eq!(next, Lease { slot: 0, generation: 2 }, "back in service under a new generation");
        assert!(a.confirm(next).is_err(), "a live lease is not quarantined");
        assert!(a.owns(next));
    }

    #[test]
    fn counts_always_partition_the_grant() {
        let mut a = LeaseArena::new(3).unwrap();
        let mut held = Vec::new();
        for step in 0..30u32 {
            match step % 4 {
                0 | 1 => held.extend(a.acquire()),
                2 => {
                    if let Some(l) = held.pop() {
                        a.release(l).unwrap();
                    }
                }
                _ => {
                    if step == 7
                        && let Some(l) = held.pop()
                    {
                        a.quarantine(l).unwrap();
                    }
                }
            }
            let c = a.counts();
            assert_eq!(c.free + c.live + c.quarantined, 3);
            assert_eq!(c.live as usize, held.len());
        }
    }

    #[test]
    fn the_high_water_mark_refuses_stale_generations() {
        let mut hw = HighWater::new(2);
        assert_eq!(hw.depth(), 2);
        hw.admit(Lease { slot: 1, generation: 3 }).unwrap();
        hw.admit(Lease { slot: 1, generation: 3 }).unwrap(); // the same tenure again (a retry)
        assert_eq!(hw.mark(1), 3);
        let err = hw.admit(Lease { slot: 1, generation: 2 }).unwrap_err();
        assert!(err.message().contains("stale") && err.message().contains("generation 3"), "{err}");
        hw.admit(Lease { slot: 0, generation: 1 }).unwrap();
        let err = hw.admit(Lease { slot: 2, generation: 1 }).unwrap_err();
        assert!(err.message().contains("outside the granted pipeline depth 2"), "{err}");
    }

    #[test]
    fn resource_classes_follow_the_grant() {
        assert_eq!(ResourceClass::HostPerRun.copies(4), 4);
        assert_eq!(ResourceClass::ExecHandle.copies(4), 4);
        assert_eq!(ResourceClass::DeviceScratch.copies(4), 1);
    }
}
