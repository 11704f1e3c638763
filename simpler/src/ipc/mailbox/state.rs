//! A frame's state word as a type: each method is one step of the protocols in the parent
//! module's doc, with the ordering its "Memory ordering" section gives it, so no other code
//! stores a state value or compares-and-exchanges one (the rules cited are the parent
//! module's, M3, M4, M7, M8 and M11).
//!
//! A claim (M3) moves the word to `BUSY` by compare-exchange (Acquire); a hand-over (M4) is a
//! Release store of the next state, made by a [`Handover`] guard where the owner runs code that
//! may fail or unwind between the two, so a claimed frame is never left `BUSY`. The word is
//! generic over the atomic ([`Atomic32`]): the shared mapping's `AtomicU32`, or in the `loom`
//! models the sync facade's, so the models check these very steps.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::{
    ACTIVATE, BUSY, CONTROL_DONE, CONTROL_REQUEST, FRAME_STAGED, IDLE, INIT_FAILED, INIT_READY,
    PREPARE_READY, TASK_DONE, TASK_LAUNCHED, TASK_READY, WITHDRAW,
};
use crate::sys::futex::{futex_wait, futex_wake};

/// The atomic a [`StateWord`] is made of: the shared mapping's `AtomicU32`, or (in the `loom`
/// models) the sync facade's.
pub(super) trait Atomic32 {
    fn load(&self, order: Ordering) -> u32;
    fn store(&self, value: u32, order: Ordering);
    fn compare_exchange(
        &self,
        current: u32,
        new: u32,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u32, u32>;
}

macro_rules! atomic32 {
    ($t:ty) => {
        impl Atomic32 for $t {
            fn load(&self, order: Ordering) -> u32 {
                <$t>::load(self, order)
            }
            fn store(&self, value: u32, order: Ordering) {
                <$t>::store(self, value, order)
            }
            fn compare_exchange(
                &self,
                current: u32,
                new: u32,
                success: Ordering,
                failure: Ordering,
            ) -> Result<u32, u32> {
                <$t>::compare_exchange(self, current, new, success, failure)
            }
        }
    };
}
atomic32!(AtomicU32);
#[cfg(all(test, loom))]
atomic32!(crate::sys::sync::checked::AtomicU32);

/// A frame's state word: which party owns the frame's fields (rule M2). In the mapping it is a
/// bare `u32` (`repr(transparent)`; all-zero is `IDLE`, rule M1).
#[repr(transparent)]
pub(super) struct StateWord<A: Atomic32 = AtomicU32>(A);

/// What the parent said of a staged task ([`TaskRequest::activation`](super::TaskRequest::activation)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activation {
    /// Nothing yet: the task stays staged.
    Waiting,
    /// Launch it (the frame is `TASK_LAUNCHED` now).
    Activate,
    /// Give it up unlaunched and answer with an error (the frame is `BUSY` now).
    Withdraw,
}

impl<A: Atomic32> StateWord<A> {
    /// A word over `atomic` (the `loom` models' frames; the mapping's words are never made).
    #[cfg(all(test, loom))]
    pub(super) fn over(atomic: A) -> StateWord<A> {
        StateWord(atomic)
    }

    /// The state (Acquire: a party that sees a hand-over sees the fields written before it,
    /// M4).
    pub(super) fn get(&self) -> u32 {
        self.0.load(Ordering::Acquire)
    }

    /// Claims the frame by moving it from `from` to `BUSY` (rule M3). `Err` holds the state
    /// found instead.
    fn claim(&self, from: u32) -> Result<(), u32> {
        self.0.compare_exchange(from, BUSY, Ordering::Acquire, Ordering::Acquire).map(drop)
    }

    /// Claims a frame that a peer hands over as `from` (M3, M4), if it is there: a cheap Relaxed
    /// look first, then the Acquire claim.
    fn claim_if(&self, from: u32) -> bool {
        self.0.load(Ordering::Relaxed) == from && self.claim(from).is_ok()
    }

    /// A guard over this claimed word that hands it over as `next` when dropped (M4).
    fn handover(&self, next: u32) -> Handover<'_, A> {
        Handover { state: self, next }
    }

    // ---- the parent's steps ----

    /// Parent, posting a task or a control request: `IDLE → BUSY` (M3). The guard hands the
    /// frame back as `IDLE` unless told what was posted. `Err` holds the state found instead.
    pub(super) fn claim_to_post(&self) -> Result<Handover<'_, A>, u32> {
        self.claim(IDLE)?;
        Ok(self.handover(IDLE))
    }

    /// Parent, collecting a finished task: `TASK_DONE → BUSY`, if the child handed it over
    /// (M3, M4). The guard hands the frame back as `IDLE` when dropped.
    pub(super) fn collect_task(&self) -> Option<Handover<'_, A>> {
        self.claim_if(TASK_DONE).then(|| self.handover(IDLE))
    }

    /// Parent, collecting a control reply: `CONTROL_DONE → BUSY` (M3, M4). The guard hands the
    /// frame back as `IDLE` when dropped.
    pub(super) fn collect_control(&self) -> Option<Handover<'_, A>> {
        self.claim_if(CONTROL_DONE).then(|| self.handover(IDLE))
    }

    /// Parent, letting a staged task launch: `FRAME_STAGED → ACTIVATE` by compare-exchange
    /// (M11). `Err` holds the state found instead.
    pub(super) fn activate(&self) -> Result<(), u32> {
        self.0.compare_exchange(FRAME_STAGED, ACTIVATE, Ordering::AcqRel, Ordering::Acquire).map(drop)
    }

    /// Parent, withdrawing a staged task the child has not taken: `PREPARE_READY → BUSY →
    /// IDLE` (M3, M11). False when it is not there.
    pub(super) fn take_back_posted(&self) -> bool {
        if self.claim(PREPARE_READY).is_err() {
            return false;
        }
        self.0.store(IDLE, Ordering::Release);
        true
    }

    /// Parent, withdrawing a staged task the child holds prepared: `FRAME_STAGED → WITHDRAW` by
    /// compare-exchange (M11). `Err` holds the state found instead.
    pub(super) fn ask_withdraw(&self) -> Result<(), u32> {
        self.0.compare_exchange(FRAME_STAGED, WITHDRAW, Ordering::AcqRel, Ordering::Acquire).map(drop)
    }

    /// Whether the frame holds a prepared staged task (`FRAME_STAGED`, Acquire: the child's
    /// words written before it are visible, M12).
    pub(super) fn is_staged(&self) -> bool {
        self.get() == FRAME_STAGED
    }

    /// Parent, collecting the startup report: `INIT_READY → IDLE` by compare-exchange.
    pub(super) fn accept_ready(&self) -> bool {
        self.0.compare_exchange(INIT_READY, IDLE, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Parent, for a new child on the mailbox (M8): back to `IDLE` (Release), whatever it was.
    pub(super) fn reset(&self) {
        self.0.store(IDLE, Ordering::Release);
    }

    // ---- the child's steps ----

    /// Child, taking a posted task to run: `TASK_READY → BUSY` (M3, M5).
    pub(super) fn take_task(&self) -> bool {
        self.claim_if(TASK_READY)
    }

    /// Child, taking a posted successor to prepare: `PREPARE_READY → BUSY` (M3, M11).
    pub(super) fn take_staged(&self) -> bool {
        self.claim_if(PREPARE_READY)
    }

    /// Child: whether the frame is still `BUSY`, as its claim left it (Relaxed: only the
    /// claimer moves it from there).
    pub(super) fn still_claimed(&self) -> bool {
        self.0.load(Ordering::Relaxed) == BUSY
    }

    /// Child, publishing a prepared successor: `BUSY → FRAME_STAGED` (Release, M11), keeping the
    /// fields. Only on a frame it claimed and still holds `BUSY`.
    pub(super) fn publish_staged(&self) {
        self.0.store(FRAME_STAGED, Ordering::Release);
    }

    /// Child, reading the parent's word on a staged task (M11): `ACTIVATE → TASK_LAUNCHED` or
    /// `WITHDRAW → BUSY`, each by compare-exchange.
    pub(super) fn take_activation(&self) -> Activation {
        if self.0.compare_exchange(ACTIVATE, TASK_LAUNCHED, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            return Activation::Activate;
        }
        if self.0.compare_exchange(WITHDRAW, BUSY, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            return Activation::Withdraw;
        }
        Activation::Waiting
    }

    /// Child, about to answer a task it took: a staged frame the parent may still move
    /// (`FRAME_STAGED → ACTIVATE | WITHDRAW`) is taken back to `BUSY` first, so no move of the
    /// parent's is lost (M11); a frame already `BUSY` stays so.
    pub(super) fn reclaim_to_reply(&self) {
        loop {
            let now = self.get();
            if !matches!(now, FRAME_STAGED | ACTIVATE | WITHDRAW | TASK_LAUNCHED) {
                break;
            }
            if self.claim(now).is_ok() {
                break;
            }
        }
    }

    /// Child, answering a task: `BUSY → TASK_DONE` (Release, M4).
    pub(super) fn reply_task(&self) {
        self.0.store(TASK_DONE, Ordering::Release);
    }

    /// Child: whether a control request is posted (`CONTROL_REQUEST`, Acquire; the child reads
    /// it in place, M5).
    pub(super) fn control_posted(&self) -> bool {
        self.get() == CONTROL_REQUEST
    }

    /// Child, about to answer a control request: `CONTROL_REQUEST → BUSY` (M3).
    pub(super) fn claim_to_reply_control(&self) -> bool {
        self.claim(CONTROL_REQUEST).is_ok()
    }

    /// Child, answering a control request: `BUSY → CONTROL_DONE` (Release, M4).
    pub(super) fn reply_control(&self) {
        self.0.store(CONTROL_DONE, Ordering::Release);
    }

    /// Child, reporting startup: `IDLE → INIT_READY` by compare-exchange (Release); nothing when
    /// the base frame is not `IDLE`.
    pub(super) fn report_ready(&self) {
        let _ = self.0.compare_exchange(IDLE, INIT_READY, Ordering::Release, Ordering::Relaxed);
    }

    /// Child, about to report a failed startup: `IDLE → BUSY` (M3).
    pub(super) fn claim_to_report_failure(&self) -> bool {
        self.claim(IDLE).is_ok()
    }

    /// Child, reporting a failed startup: `BUSY → INIT_FAILED` (Release, M4; terminal).
    pub(super) fn report_failed(&self) {
        self.0.store(INIT_FAILED, Ordering::Release);
    }

    // ---- a peer that ignores the protocol (the fuzz harness, tests) ----

    /// Claims the frame from whatever state it is in (M3).
    #[cfg(feature = "fuzz")]
    pub(super) fn claim_as_found(&self) -> Result<(), u32> {
        self.claim(self.get())
    }

    /// Stores any value, as a peer that ignores the protocol would (Release).
    #[cfg(any(test, feature = "fuzz"))]
    pub(super) fn plant(&self, raw: u32) {
        self.0.store(raw, Ordering::Release);
    }
}

impl StateWord {
    /// Sleeps on the word while it holds `seen`, at most `timeout` (the futex of rule M7).
    pub(super) fn wait_while(&self, seen: u32, timeout: Duration) {
        futex_wait(&self.0, seen, Some(timeout));
    }

    /// Wakes every sleeper of [`wait_while`](StateWord::wait_while) (M7).
    pub(super) fn wake_all(&self) {
        futex_wake(&self.0, i32::MAX);
    }
}

/// A claimed frame's hand-over (rule M4): stores `next` into the state word (Release) when
/// dropped, also when the code filling or draining the frame unwinds.
pub(super) struct Handover<'f, A: Atomic32 = AtomicU32> {
    state: &'f StateWord<A>,
    next: u32,
}

impl<A: Atomic32> Handover<'_, A> {
    /// Parent: hands a posted task to the child (`TASK_READY`).
    pub(super) fn post_task(mut self) {
        self.next = TASK_READY;
    }

    /// Parent: hands a successor to prepare to the child (`PREPARE_READY`, M11).
    pub(super) fn post_staged(mut self) {
        self.next = PREPARE_READY;
    }

    /// Parent: hands a control request to the child (`CONTROL_REQUEST`).
    pub(super) fn post_control(mut self) {
        self.next = CONTROL_REQUEST;
    }
}

impl<A: Atomic32> Drop for Handover<'_, A> {
    fn drop(&mut self) {
        self.state.0.store(self.next, Ordering::Release);
    }
}
