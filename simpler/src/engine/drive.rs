//! The scheduler role and the loops that drive it (rules 1-5 of the module doc): publishing
//! READY work, taking the role ([`Role`], a guard) or announcing a wait for it
//! ([`WaiterIntent`]), a waiter's driving loop ([`Engine::drive_until`]) and the background
//! thread's. The flags the role is taken and given up by are [`RoleState`](super::role::RoleState)'s (`role.rs`, with
//! its `loom` models).
//!
//! The role and the announcement are given up only by dropping them (a panic included), and
//! panics are contained where they happen (rule 5): in an endpoint's `start` or `poll` the task
//! fails and the lane leaves service; while completing a task its run fails or is abandoned;
//! anywhere else in a pass every live run fails. The background thread outlives them.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::engine::Engine;
use crate::engine::scheduler::Scheduler;
use crate::engine::slot::Slot;
use crate::sys::sync::checked;

/// With every worker busy, a submit runs an inline scheduler pass only once per this many
/// READY publications.
const INLINE_PASS_EVERY: usize = 16;

/// See [`Engine::announce_waiter`].
pub(crate) struct WaiterIntent<'a> {
    eng: &'a Engine,
}

impl Drop for WaiterIntent<'_> {
    fn drop(&mut self) {
        if self.eng.role.withdraw(|| self.eng.outstanding()) {
            self.eng.wake_background();
        }
    }
}

/// The scheduler role, held (rule 1): the `sched` lock flagged held in `role`, taken by
/// [`Engine::try_role`]. Dropping it gives the role up (rule 3) — on every way out, a panic's
/// unwinding included (rule 5): the flag is cleared while the lock is still held, so it can never
/// overwrite the flag of a thread that took the role right after; then `events` rings and the
/// background thread is woken if work is left and nobody else drives (rule 4).
pub(crate) struct Role<'a> {
    eng: &'a Engine,
    /// `Some` until the drop.
    sched: Option<checked::MutexGuard<'a, Scheduler>>,
}

impl std::ops::Deref for Role<'_> {
    type Target = Scheduler;
    fn deref(&self) -> &Scheduler {
        self.sched.as_ref().expect("the role is held until it drops")
    }
}

impl std::ops::DerefMut for Role<'_> {
    fn deref_mut(&mut self) -> &mut Scheduler {
        self.sched.as_mut().expect("the role is held until it drops")
    }
}

impl Role<'_> {
    /// One scheduler pass (see [`Scheduler::pass`]); returns whether anything happened. A panic
    /// that escapes the pass is caught here and fails every live run (rule 5); that counts as
    /// progress when it ended a run (a pass that panics every time then waits for the doorbell
    /// like one that did nothing, instead of spinning).
    pub(crate) fn pass(&mut self) -> bool {
        let eng = self.eng;
        let sched = self.sched.as_mut().expect("the role is held until it drops");
        match catch_unwind(AssertUnwindSafe(|| {
            eng.apply_sched_requests(sched);
            sched.pass(eng)
        })) {
            Ok(progressed) => progressed,
            Err(panic) => {
                let msg = crate::error::panic_message(&*panic);
                tracing::error!(target: "simpler::scheduler", "the scheduler panicked during a pass: {msg}; every live run fails");
                sched.recover(eng, &msg)
            }
        }
    }
}

impl Drop for Role<'_> {
    fn drop(&mut self) {
        if let Some(sched) = self.sched.take() {
            self.eng.role.release(sched);
        }
        self.eng.events.ring();
        self.eng.wake_background_if_needed();
    }
}

impl Engine {
    /// Publishes a READY task from a non-holder thread (rule 4).
    pub(crate) fn publish_ready(&self, slot: Arc<Slot>) {
        self.inbox_len.fetch_add(1, Ordering::SeqCst);
        // The receiver lives as long as the engine, so this cannot fail.
        let _ = self.inbox_tx.send(slot);
        if self.role.held() {
            // The holder may be asleep on the doorbell.
            self.doorbell().ring();
        } else {
            // Nobody drives. Dispatch inline when a worker is idle (so work starts while the
            // graph is still being built), else only every few submits: a pass per submit
            // would dominate the cost of building large graphs.
            let unpassed = self.unpassed.fetch_add(1, Ordering::Relaxed);
            if (self.idle_lanes.load(Ordering::Relaxed) > 0 || unpassed >= INLINE_PASS_EVERY)
                && let Some(mut role) = self.try_role()
            {
                self.unpassed.store(0, Ordering::Relaxed);
                role.pass();
            } else {
                self.wake_background_if_needed();
            }
        }
    }

    /// A task was submitted that waits for others (PENDING): when nobody drives and the engine
    /// doorbell rang since the last such pass (a completion, a child's death or published work
    /// arrived), the building thread makes a pass, so the tasks it waits for complete, their
    /// consumers start and their slots are consumed while the graph is still being built. (A
    /// builder that will wait does not wake the background thread, and without these passes
    /// nothing ran until the whole graph was built.) With nothing new, it costs two loads.
    pub(crate) fn submitted_pending(&self) {
        let rung = self.doorbell().seq();
        if rung == self.pending_passed_at.load(Ordering::Relaxed) || self.role.held() {
            return;
        }
        if let Some(mut role) = self.try_role() {
            self.pending_passed_at.store(rung, Ordering::Relaxed);
            role.pass();
        }
    }

    /// A single SUB task was published PENDING behind one or two producers, each a single SUB
    /// task that runs (rule 5 of `slot`): when a lane chains tasks, the next pass may hand it
    /// to a producer's worker, so the doorbell rings (a sleeping role holder, or the background
    /// thread, makes that pass; a holder that is passing makes another).
    pub(crate) fn chain_chance(&self) {
        if self.chaining.load(Ordering::Relaxed) {
            // Release: what the caller did before (a failed orchestration's mark) is seen by
            // the holder that takes the chance.
            self.chain_chance.store(true, Ordering::Release);
            self.doorbell().ring();
        }
    }

    /// Whether a [`chain_chance`](Self::chain_chance) came since the last call.
    pub(crate) fn take_chain_chance(&self) -> bool {
        self.chain_chance.load(Ordering::Relaxed) && self.chain_chance.swap(false, Ordering::Acquire)
    }

    /// True when READY tasks may wait in the inbox (a hint: the holder skips an empty inbox).
    pub(crate) fn inbox_pending(&self) -> bool {
        self.inbox_len.load(Ordering::SeqCst) > 0
    }

    pub(crate) fn inbox_taken(&self, n: usize) {
        self.inbox_len.fetch_sub(n, Ordering::SeqCst);
    }

    /// Published by the holder after each pass: tasks running, READY tasks queued, idle lanes.
    pub(crate) fn set_outstanding(&self, in_flight: usize, queued: usize, idle_lanes: usize) {
        self.in_flight.store(in_flight, Ordering::SeqCst);
        self.queued.store(queued, Ordering::SeqCst);
        self.idle_lanes.store(idle_lanes, Ordering::Relaxed);
    }

    fn outstanding(&self) -> bool {
        self.inbox_len.load(Ordering::SeqCst) > 0
            || self.in_flight.load(Ordering::SeqCst) > 0
            || self.queued.load(Ordering::SeqCst) > 0
    }

    /// Announces that this thread will soon wait (and drive): until the guard drops, published
    /// work does not wake the background thread, so the waiter does not have to take the role
    /// back from it.
    pub(crate) fn announce_waiter(&self) -> WaiterIntent<'_> {
        self.role.announce();
        WaiterIntent { eng: self }
    }

    /// Takes the scheduler role if nobody holds it (see [`Role`]; dropping it gives it up).
    pub(super) fn try_role(&self) -> Option<Role<'_>> {
        let sched = self.role.try_take(&self.sched)?;
        Some(Role { eng: self, sched: Some(sched) })
    }

    /// One non-blocking pass if nobody holds the role (for pollers such as `RunHandle::is_done`,
    /// so a run makes progress even while the background thread stands aside for a waiter).
    pub(crate) fn try_pass(&self) {
        if !self.role.held()
            && let Some(mut role) = self.try_role()
        {
            role.pass();
        }
    }

    pub(super) fn wake_background_if_needed(&self) {
        if self.role.needs_background_wake(|| self.outstanding() || self.stop_due()) {
            self.wake_background();
        }
    }

    /// Wakes the background thread to drive (rule 4), and counts it.
    fn wake_background(&self) {
        self.bg_wakes.fetch_add(1, Ordering::Relaxed);
        self.bg_bell.ring();
    }

    /// Drives the scheduler until `cond` holds or `deadline` passes; returns whether `cond` held.
    /// `cond` is not evaluated again once it has returned true (it may take a resource).
    ///
    /// The calling thread takes the scheduler role when it is free (rule 3), so a waiter pays
    /// no thread handoff per task.
    pub(crate) fn drive_until(&self, cond: impl Fn() -> bool, deadline: Option<Instant>) -> bool {
        // Once this thread has announced that it wants the role, it keeps the announcement until
        // it returns, whichever way: dropping it wakes the background thread if work is left
        // and nobody drives (rule 4). A bare decrement on the way out lost that wake-up.
        let mut intent: Option<WaiterIntent<'_>> = None;
        loop {
            if cond() {
                return true;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return false;
            }
            let seen_events = self.events.seq();
            match self.try_role() {
                Some(mut role) => {
                    return loop {
                        let seen = self.doorbell().seq();
                        let progressed = role.pass();
                        if cond() {
                            break true;
                        }
                        if deadline.is_some_and(|d| Instant::now() >= d) {
                            break false;
                        }
                        if !progressed {
                            let how = role.peer_wait(crate::sys::futex::current_cpu());
                            // Also woken by the next run deadline: the holder stops that run.
                            let bound = self.sleep_bound(deadline);
                            if role.watching() {
                                // A watched endpoint's outcome shows in `ready`, not the
                                // doorbell, until it is told the holder sleeps.
                                let role = &role;
                                let (ready, unwatch) = (|| role.ready(), || role.unwatch());
                                self.doorbell().wait_watching(seen, bound, how, ready, unwatch);
                            } else {
                                self.doorbell().wait_for_peer(seen, bound, how);
                            }
                        }
                    };
                    // `role` drops (rule 3), then `intent` (rule 4).
                }
                None => {
                    intent.get_or_insert_with(|| self.announce_waiter());
                    self.doorbell().ring();
                    if cond() {
                        return true;
                    }
                    self.events.wait(seen_events, deadline);
                }
            }
        }
    }

    /// The background thread's loop: hold the role while work is outstanding and nobody waits.
    /// Passes contain their own panics (rule 5); should anything else in the loop panic, the
    /// loop is entered again, so the background thread lives until `stop_background`.
    pub(crate) fn background_loop(&self) {
        while let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.background_loop_inner())) {
            tracing::error!(
                target: "simpler::scheduler",
                "the background scheduler thread panicked ({}); it carries on",
                crate::error::panic_message(&*panic)
            );
        }
    }

    fn background_loop_inner(&self) {
        loop {
            let seen = self.bg_bell.seq();
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            let wanted = self.role.wanted() > 0;
            // A run deadline is enforced also while nobody waits and nothing runs (a run still
            // being built): this thread wakes at the earliest one and stops that run. Also while
            // a waiter announced itself but does not drive yet (it is still building its run):
            // one pass, after which the role is given back to it (below).
            if ((!wanted && self.outstanding()) || self.stop_due())
                && let Some(mut role) = self.try_role()
            {
                loop {
                    let bell_seen = self.doorbell().seq();
                    let progressed = role.pass();
                    if self.stopping.load(Ordering::SeqCst)
                        || self.role.wanted() > 0
                        || !(self.outstanding() || self.stop_due())
                    {
                        break;
                    }
                    if !progressed {
                        role.unwatch(); // nobody checks watched endpoints while this one sleeps
                        self.doorbell().wait(bell_seen, self.next_check());
                    }
                }
                continue;
            }
            // Past the next check, whoever holds or wants the role stops that run, and the
            // role's release wakes this thread if it is still due (rule 4): no spinning here.
            let bound = self.next_check().filter(|&at| at > Instant::now());
            self.bg_bell.sleep(seen, bound);
        }
    }

    /// How many times the background thread has been woken to drive.
    #[cfg(test)]
    pub(crate) fn background_wakes(&self) -> u64 {
        self.bg_wakes.load(Ordering::Relaxed)
    }

    /// Stops the background thread (close).
    pub(crate) fn stop_background(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.bg_bell.ring();
        self.doorbell().ring();
    }

    /// Shuts every lane down (close), after the background thread stopped.
    pub(crate) fn shutdown_lanes(&self) {
        self.with_sched(Scheduler::shutdown);
    }
}
