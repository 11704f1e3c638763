//! Runs at the engine: admission into the run FIFO (`pending_run_depth`, back-pressure),
//! building a run ([`Engine::build_run`], the one place a run is built), deadlines and cancels
//! (`next_check`), the pipeline leases (of the level, and of each chip at an L3), and a finished
//! run leaving the FIFO.
//!
//! [`Engine::build_run`] refuses a re-entrant build (a submit from inside an orchestration
//! function of the same Worker), takes the build lock, admits the run (waiting for room in the
//! pipeline as long as `submit_timeout` and the run's deadline allow, by default for ever; the
//! error names the run ahead), runs the
//! function on an `Orchestrator` with panics caught and finishes the run; on failure it cancels
//! the unstarted tasks and drives the run to its end (a refused submit's error passed on is
//! not a failure of the function: `Orchestrator::ended_by_refusal`). The Worker, the chip
//! runtime and the benchmarks call it.
//!
//! Async submits ([`Engine::poll_room`], `Worker::submit_async`) never wait in `build_run`: a
//! poll that finds room takes a place (`Runs::reserved`, counted as an admitted run by every
//! submit) and builds at once with it ([`Engine::build_run_as`]); a poll that finds none leaves
//! its waker, woken when a run finishes or a place is given back (a [`Reservation`] dropped).
//!
//! Cancels: `cancel` stops a run at once (its running tasks' workers are stopped); a graceful
//! cancel (`StopCause::CancelledGracefully`) stops its dispatch and sets a moment, the end of its
//! grace, at which `RunState::due` reports `StopCause::GraceOver` and the scheduler stops what
//! still runs.
//!
//! Leases: the engine hands a lease (`engine::lease`) to a run when it dispatches: the FIFO
//! head (at its first dispatch) and a run found independent of the runs ahead
//! ([`Engine::lease_for`], [`Engine::leases_for_all`]). The head keeps one of each arena for
//! itself: another run takes a lease only while one more stays free or the head holds one
//! there, or, on a chip, when the head's graph is built without a task there and the taker has
//! no group (`Leases::may_take`); so the head waits for a lease only while one is quarantined
//! or held by runs that end by themselves. A run holds its
//! leases until it ends: `run_finished` releases them, so a run whose orchestration failed
//! returns its leases too; a run that is done is given none (both look under the arena's lock).
//! The level's arena has as many slots as runs are admitted ([`Engine::set_lease_depth`]): SUB
//! workers and nested Workers keep no per-run resources by lease. At an L3 each chip keeps an
//! arena of its own, as deep as the chips' grant: a chip task carries its run's lease
//! on that chip ([`Engine::chip_lease_for`], minted at the run's first task there), the
//! successor staged on a chip takes only that chip's, and a run dispatching before its turn
//! takes its lease and its lease on every chip it uses at once or none
//! ([`Engine::leases_for_all`]), so it never waits for a lease while holding one the head or
//! another such run waits for; a run hung on one chip leaves the other chips' leases free.
//! A run abandoned with tasks it did not wait for ([`Engine::abandon_run`]) quarantines its
//! lease instead (rule L4 of `lease`): the scheduler frees it once no lane holds a task of that
//! run ([`Engine::confirm_quarantined`], each pass while one waits), so a later run never
//! stages a task on a chip under the slot a task still running there uses. Every task carries
//! a lease (children refuse the invalid one): while every lease is quarantined the head waits
//! for one, as it waits for a worker busy with a task that never returns, until that task ends
//! or the head is stopped (its deadline or a cancel; the stop's error names the leases it
//! waited for).

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::engine::orchestrator::Orchestrator;
use crate::engine::run::{RunState, StopCause};
use crate::engine::{Engine, WaiterIntent, lease};
use crate::error::{Error, ErrorKind, Result};
use crate::sys::sync;

/// The engine's pipeline leases: the arena (rules L1-L4 of `lease`) and the leases it holds
/// in quarantine, each with the abandoned run whose tasks may still be on workers (rule L4:
/// the scheduler frees one once no lane holds a task of its run, [`Engine::confirm_quarantined`]).
pub(crate) struct Leases {
    arena: lease::LeaseArena,
    /// One arena per chip (by next-level worker index) at a level whose next-level workers
    /// are chips: a chip task carries its run's lease on that chip, so runs on different chips
    /// never compete for one chip's per-run resources (empty elsewhere: every task carries the
    /// run's lease from `arena`).
    chips: Vec<lease::LeaseArena>,
    /// Each quarantined lease: the chip whose arena it is of (`None`: `arena`), the lease, and
    /// the abandoned run.
    quarantined: Vec<(Option<u32>, lease::Lease, Arc<RunState>)>,
}

impl Leases {
    /// `depth` leases for the level and, for each of `chips` chips, `chip_depth` of its own.
    pub(crate) fn new(depth: u32, chips: usize, chip_depth: u32) -> Result<Leases> {
        Ok(Leases {
            arena: lease::LeaseArena::new(depth)?,
            chips: (0..chips).map(|_| lease::LeaseArena::new(chip_depth)).collect::<Result<_>>()?,
            quarantined: Vec::new(),
        })
    }

    /// Where a lease for `chip` comes from: that chip's arena where chips keep leases of their
    /// own, else the level's (`None`).
    fn key(&self, chip: Option<u32>) -> Option<u32> {
        chip.filter(|_| !self.chips.is_empty())
    }

    /// The lease `run` holds in arena `key`, if any.
    fn held(run: &RunState, key: Option<u32>) -> Option<lease::Lease> {
        match key {
            Some(w) => run.chip_lease(w),
            None => run.lease.get().copied(),
        }
    }

    /// Whether `run` may take a lease of arena `key` now; `head` is the FIFO head, read under
    /// the lock that guards `self` ([`Engine::head_under`]). The head keeps one of each arena
    /// for itself: it takes one whenever one is free; another run only while another stays
    /// free, or once the head holds one there. So whenever the head holds no lease of an arena
    /// one is free for it (but for quarantined ones), and the runs that hold the others (a
    /// staged successor waiting for its turn, a run dispatching before its turn whose groups
    /// wait for it) never hold what the head waits for.
    ///
    /// One exception, for a chip the head will never use (its submission closed without a task
    /// there, say it hangs on another chip): a run with no group (which waits for nothing of
    /// the runs ahead, so it ends by itself) may take the chip's last lease. The next head
    /// finds one free again before any other run may take it: the head that ended held none
    /// there, and once the new head may need the chip the rule above holds again, while such
    /// runs end.
    fn may_take(&self, head: Option<&RunState>, run: &RunState, key: Option<u32>) -> bool {
        let arena = match key {
            Some(w) => self.chips.get(w as usize),
            None => Some(&self.arena),
        };
        let Some(free) = arena.map(|a| a.counts().free) else { return false };
        let Some(h) = head.filter(|h| h.id != run.id) else { return free >= 1 };
        let (holds, needs, groups) = match key {
            Some(w) => (h.chip_lease(w).is_some(), h.may_use_next_level(w), run.has_next_level_groups()),
            None => (h.lease.get().is_some(), true, true),
        };
        free >= 1 && (holds || free >= 2 || (!needs && !groups))
    }

    /// Mints `run`'s lease of arena `key` and records it on the run (after [`may_take`]).
    ///
    /// [`may_take`]: Leases::may_take
    fn mint(&mut self, run: &RunState, key: Option<u32>) -> Option<lease::Lease> {
        let minted = self.arena_of(key).acquire()?;
        match key {
            Some(w) => sync::lock(&run.chip_leases).push((w, minted)),
            None => {
                if run.lease.set(minted).is_err() {
                    unreachable!("a run's lease is set only under the arena's lock")
                }
            }
        }
        Some(minted)
    }

    /// The arena of chip `chip` (`None`: the level's own).
    fn arena_of(&mut self, chip: Option<u32>) -> &mut lease::LeaseArena {
        match chip {
            Some(w) => &mut self.chips[w as usize],
            None => &mut self.arena,
        }
    }
}

/// A run an orchestration function built (see [`Engine::build_run`]).
pub(crate) struct Built<'e> {
    pub(crate) run: Arc<RunState>,
    /// The announcement that the builder will wait on the run (when it asked for one).
    pub(crate) intent: Option<WaiterIntent<'e>>,
}

/// Why [`Engine::build_run`] built no run: the orchestration function's error, or its panic
/// (the run was wound down first, so a caller may resume the panic).
pub(crate) enum BuildFailed {
    Error(Error),
    Panic(Box<dyn std::any::Any + Send>),
}

impl BuildFailed {
    /// The error a panic becomes when it is not resumed.
    fn panic_error(panic: &(dyn std::any::Any + Send)) -> Error {
        Error::new(
            ErrorKind::TaskFailed,
            format!("the orchestration function panicked: {}", crate::error::panic_message(panic)),
        )
    }

    /// As an error (a panic becomes a [`ErrorKind::TaskFailed`] error with its message).
    pub(crate) fn into_error(self) -> Error {
        match self {
            BuildFailed::Error(e) => e,
            BuildFailed::Panic(panic) => BuildFailed::panic_error(&*panic),
        }
    }
}

/// Admitted runs, and a finished one kept for reuse.
#[derive(Default)]
pub(super) struct Runs {
    /// Admitted runs in FIFO order; the front one dispatches.
    pub(super) live: VecDeque<Arc<RunState>>,
    /// The last finished run: reused by the next `begin_run` when nobody holds it any more (its
    /// handle, tasks and Orchestrator are gone), so a run allocates no state of its own.
    pub(super) spare: Option<Arc<RunState>>,
    /// Places an async submit holds for the run it is about to build
    /// ([`Engine::poll_room`]): they count as admitted runs.
    pub(super) reserved: usize,
    /// Async submits waiting for room, woken when a run finishes or a place is given back.
    pub(super) room_wakers: Vec<std::task::Waker>,
}

impl Runs {
    /// Whether another run may be admitted under a depth of `depth`: the places async submits
    /// hold count as admitted runs.
    fn has_room(&self, depth: usize) -> bool {
        self.live.len() + self.reserved < depth
    }
}

/// A place among the admitted runs, taken by [`Engine::poll_room`] for one run: the run
/// [`Engine::build_run_as`] admits takes it over; dropped before that, it is given back.
pub(crate) struct Reservation<'a>(&'a Engine);

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.0.unreserve();
    }
}

impl Engine {
    /// Admits a new run, waiting (and driving) while `pending_run_depth` (or, when that is 0,
    /// `pipeline_depth`) runs are live: for as long as the submit timeout (by default for
    /// ever) and the run's own deadline allow; `deadline`: when the run must end, and the limit
    /// it was given.
    #[cfg(test)]
    pub(crate) fn begin_run(
        &self,
        capture: bool,
        deadline: Option<(Instant, Duration)>,
    ) -> Result<Arc<RunState>> {
        self.begin_run_as(capture, deadline, None)
    }

    /// How many runs may be admitted at once, and the setting that says so.
    fn run_depth(&self) -> (usize, &'static str) {
        match self.cfg.pending_run_depth {
            0 => (self.cfg.pipeline_depth, "pipeline_depth"),
            n => (n, "pending_run_depth"),
        }
    }

    /// Admits a run as `begin_run` does; given a `reservation`, the run takes that place
    /// ([`Engine::poll_room`]) instead of waiting for one. The room is checked and the run
    /// admitted under one hold of the FIFO's lock: an async submit that reserves a place while
    /// this waits cannot make both count.
    fn begin_run_as(
        &self,
        capture: bool,
        deadline: Option<(Instant, Duration)>,
        reservation: Option<Reservation<'_>>,
    ) -> Result<Arc<RunState>> {
        let (depth, knob) = self.run_depth();
        let limit = self.cfg.submit_timeout;
        let by_timeout = crate::sys::clock::after(limit);
        let until = match deadline {
            Some((at, _)) if at < by_timeout => at,
            _ => by_timeout,
        };
        let mut runs = loop {
            let runs = sync::lock(&self.runs);
            if self.is_closed() {
                // Checked under the FIFO's lock that `mark_closed` takes after setting the
                // flag: a run admitted here is one the closing Worker waits for.
                return Err(Error::state(format!(
                    "Worker.submit: the {} Worker is closed (Worker::close, possibly through another handle): no run is admitted",
                    self.cfg.level
                )));
            }
            if reservation.is_some() || runs.has_room(depth) {
                break runs;
            }
            drop(runs);
            let room = || self.is_closed() || sync::lock(&self.runs).has_room(depth);
            if !self.drive_until(room, Some(until)) {
                let head = self.head_run();
                let what = match deadline {
                    Some((at, given)) if at <= by_timeout => {
                        format!("the run's deadline of {given:?} passed while it waited for room")
                    }
                    _ => format!("no room for a new run within the submit timeout of {limit:?}"),
                };
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "Worker.submit: {what}: \
                         {depth} run(s) are admitted ({knob} {depth}) and run {head}, the first, \
                         has not finished; a task that never returns holds every later run: give runs a \
                         deadline (RunOptions::deadline, WorkerBuilder::run_deadline) or cancel them \
                         (RunHandle::cancel)"
                    ),
                ));
            }
        };
        if let Some(taken) = reservation {
            // The place becomes this run's (under the lock, so it is never free in between).
            runs.reserved -= 1;
            std::mem::forget(taken);
        }
        let id = self.next_run_id.fetch_add(1, Ordering::Relaxed);
        let make = || {
            let state = RunState::new(id, capture).at_level(self.cfg.level).in_engine(self.id);
            match deadline {
                Some((at, limit)) => state.with_deadline(at, limit),
                None => state,
            }
        };
        let run = match runs.spare.take() {
            Some(mut spare) => match Arc::get_mut(&mut spare) {
                Some(state) => {
                    *state = make();
                    spare
                }
                None => Arc::new(make()),
            },
            None => Arc::new(make()),
        };
        runs.live.push_back(run.clone());
        self.head_run.store(runs.live.front().map_or(0, |r| r.id), Ordering::Release);
        self.runs_epoch.fetch_add(1, Ordering::Release);
        if let Some((at, _)) = deadline {
            self.next_check.fetch_min(self.since_epoch(at), Ordering::SeqCst);
            drop(runs);
            // Whoever drives (or sleeps waiting to) bounds its sleep by the new deadline.
            self.doorbell().ring();
            self.bg_bell.ring();
        }
        Ok(run)
    }

    /// `t` in nanoseconds since the engine's epoch (for `next_check`).
    fn since_epoch(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX - 1)
    }

    /// When the scheduler must next stop a run (see `next_check`); `None` when no run asks.
    pub(crate) fn next_check(&self) -> Option<Instant> {
        match self.next_check.load(Ordering::SeqCst) {
            u64::MAX => None,
            n => Some(self.epoch + Duration::from_nanos(n)),
        }
    }

    /// True when a run is to be stopped now (its deadline passed, or a cancel waits).
    pub(crate) fn stop_due(&self) -> bool {
        self.next_check().is_some_and(|at| at <= Instant::now())
    }

    /// `min(deadline, next_check)`: how long a driver may sleep.
    pub(super) fn sleep_bound(&self, deadline: Option<Instant>) -> Option<Instant> {
        match (deadline, self.next_check()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The live runs the scheduler must stop now, and why (the role holder, when
    /// [`stop_due`](Engine::stop_due)); recomputes `next_check` from the others.
    pub(crate) fn runs_to_stop(&self, now: Instant) -> Vec<(Arc<RunState>, StopCause)> {
        let runs = sync::lock(&self.runs);
        let due: Vec<_> = runs.live.iter().filter_map(|r| r.due(now).map(|c| (r.clone(), c))).collect();
        let next = runs
            .live
            .iter()
            .filter(|r| !due.iter().any(|(d, _)| Arc::ptr_eq(d, r)))
            .filter_map(|r| r.next_check())
            .map(|at| self.since_epoch(at))
            .min()
            .unwrap_or(u64::MAX);
        self.next_check.store(next, Ordering::SeqCst);
        due
    }

    /// Recomputes when the scheduler must look at the live runs again, after it stopped some
    /// (a graceful cancel sets a new moment: the end of its grace).
    pub(crate) fn refresh_next_check(&self) {
        let runs = sync::lock(&self.runs);
        let next = runs
            .live
            .iter()
            .filter_map(|r| r.next_check())
            .map(|at| self.since_epoch(at))
            .min()
            .unwrap_or(u64::MAX);
        self.next_check.store(next, Ordering::SeqCst);
    }

    /// [`RunHandle::cancel`](crate::engine::run::RunHandle::cancel): asks the scheduler to stop `run` and drives
    /// until it did (or the run ended first); true when this call cancelled it.
    pub(crate) fn cancel_run(&self, run: &Arc<RunState>) -> bool {
        if run.is_done() || run.is_stopped() || self.is_closed() || !run.request_cancel() {
            return false;
        }
        self.stop_requested(run)
    }

    /// [`RunHandle::cancel_gracefully`](crate::engine::run::RunHandle::cancel_gracefully): as
    /// [`cancel_run`](Self::cancel_run), but the run's running tasks get `grace` to end.
    pub(crate) fn cancel_run_gracefully(&self, run: &Arc<RunState>, grace: Duration) -> bool {
        if run.is_done() || run.is_stopped() || self.is_closed() || !run.request_graceful_cancel(grace) {
            return false;
        }
        self.stop_requested(run)
    }

    /// Makes the scheduler stop `run`, whose cancel was just requested, and drives until it did
    /// (or the run ended first); true when it was stopped as cancelled.
    fn stop_requested(&self, run: &Arc<RunState>) -> bool {
        {
            let _runs = sync::lock(&self.runs);
            self.next_check.store(0, Ordering::SeqCst);
        }
        let _span = tracing::debug_span!(target: "simpler::run", "cancel", run_id = run.id).entered();
        self.doorbell().ring();
        self.bg_bell.ring();
        self.drive_until(|| run.is_done() || run.is_stopped(), None);
        run.was_cancelled()
    }

    /// Builds one run: refuses a build from inside an orchestration function of this engine
    /// (it would deadlock on the build lock), takes the build lock (one orchestration
    /// function at a time), admits the run, runs `f` on its Orchestrator with panics caught, and
    /// ends the build. `will_wait` announces, once this thread builds, that it will wait on the
    /// run, so the background thread leaves it the scheduler role. `deadline`: the run must end
    /// within this long of this call, or the scheduler stops it (see [`StopCause`]). When `f`
    /// fails or panics, the run's unstarted tasks are cancelled and the run is driven to its
    /// end before this returns the error or the panic; except when `f`'s error is a refused
    /// submit's passed on ([`Orchestrator::ended_by_refusal`]), which builds the run as `Ok`
    /// does.
    ///
    /// The one place a run is built: the Worker, the chip runtime and the benchmarks call it.
    pub(crate) fn build_run<F>(
        &self,
        capture: bool,
        deadline: Option<Duration>,
        will_wait: bool,
        f: F,
    ) -> std::result::Result<Built<'_>, BuildFailed>
    where
        F: FnOnce(&mut Orchestrator<'_>) -> Result<()>,
    {
        self.build_run_as(capture, deadline, will_wait, None, f)
    }

    /// [`build_run`](Self::build_run); given a `reservation` ([`Engine::poll_room`]), the run
    /// takes that place instead of waiting for one (an error before it is admitted gives the
    /// place back, as the reservation drops).
    pub(crate) fn build_run_as<F>(
        &self,
        capture: bool,
        deadline: Option<Duration>,
        will_wait: bool,
        reservation: Option<Reservation<'_>>,
        f: F,
    ) -> std::result::Result<Built<'_>, BuildFailed>
    where
        F: FnOnce(&mut Orchestrator<'_>) -> Result<()>,
    {
        // A token unique to this thread (the address of a thread-local), to refuse a
        // re-entrant build instead of deadlocking on `building`.
        thread_local!(static TOKEN: u8 = const { 0 });
        let me = TOKEN.with(|t| t as *const u8 as usize);
        // The deadline counts from the submit, admission and building included.
        let deadline = deadline.map(|limit| (crate::sys::clock::after(limit), limit));
        if self.builder.load(Ordering::Acquire) == me {
            return Err(BuildFailed::Error(Error::state(
                "Worker.submit: called from inside an orchestration function of the same Worker; \
                 submit tasks through the Orchestrator instead",
            )));
        }
        let _building = sync::lock(&self.building);
        // Only once this thread builds (not while it queues behind another builder).
        let intent = will_wait.then(|| self.announce_waiter());
        self.builder.store(me, Ordering::Release);
        struct ClearBuilder<'a>(&'a AtomicUsize);
        impl Drop for ClearBuilder<'_> {
            fn drop(&mut self) {
                self.0.store(0, Ordering::Release);
            }
        }
        let _clear = ClearBuilder(&self.builder);
        let run = self.begin_run_as(capture, deadline, reservation).map_err(BuildFailed::Error)?;
        run.ahead.store(!will_wait, Ordering::Relaxed);
        let _span = run.span.clone().entered();
        let mut orch = Orchestrator::new(self, run.clone());
        let result = catch_unwind(AssertUnwindSafe(|| f(&mut orch)));
        // A refused submit's error passed on adds nothing to the run's own (see
        // `Orchestrator::ended_by_refusal`): the run ends as one whose function returned Ok.
        let result = match result {
            Ok(Err(e)) if orch.ended_by_refusal(&e) => Ok(Ok(())),
            r => r,
        };
        // In a worker process, a child of a fork the orchestration function made returned
        // here: it leaves (rule P6 of `sys::process`).
        crate::sys::process::leave_if_forked_copy(matches!(result, Ok(Ok(()))));
        match result {
            Ok(Ok(())) => {
                orch.finish(None);
                Ok(Built { run, intent })
            }
            Ok(Err(e)) => {
                orch.finish(Some(&e));
                self.drive_until(|| run.is_done(), None);
                Err(BuildFailed::Error(e))
            }
            Err(panic) => {
                orch.finish(Some(&BuildFailed::panic_error(&*panic)));
                self.drive_until(|| run.is_done(), None);
                Err(BuildFailed::Panic(panic))
            }
        }
    }

    /// Sets how many runs hold pipeline leases at once (before any run), `depth`; and how many
    /// chips keep leases of their own, `chip_depth` on each ([`Engine::chip_lease_for`]: the
    /// smallest depth the chips granted, at most `pipeline_depth`; no chips where the
    /// next-level workers are not chips).
    pub(crate) fn set_lease_depth(&self, depth: u32, chips: usize, chip_depth: u32) -> Result<()> {
        *sync::lock(&self.leases) = Leases::new(depth, chips, chip_depth)?;
        self.quarantined.store(0, Ordering::SeqCst);
        Ok(())
    }

    /// The lease of `run`, minted now if it holds none yet (`None`: every lease is held,
    /// live or quarantined, or the last free one is kept for the head, `Leases::may_take`; at a
    /// depth of 1, the head's is the only one). A run dispatches only once it holds one.
    ///
    /// A run that is done gets none: `run_finished` may run on another thread (the
    /// orchestration's, when it fails the task this lease was for), and it returns only a lease
    /// set before it looked. Both look under the arena's lock, and `done` is set before
    /// `run_finished` runs, so a lease is either returned there or never minted.
    pub(crate) fn lease_for(&self, run: &RunState) -> Option<lease::Lease> {
        match run.lease.get() {
            Some(l) => Some(*l),
            None => self.mint_for(run, None),
        }
    }

    /// The lease a task of `run` carries to next-level worker `w`: at a level whose next-level
    /// workers are chips, the run's lease on that chip, minted now if it holds none there yet
    /// (`None` as for [`lease_for`](Self::lease_for)); elsewhere the run's own lease.
    pub(crate) fn chip_lease_for(&self, run: &RunState, w: u32) -> Option<lease::Lease> {
        match run.chip_lease(w) {
            Some(l) => Some(l),
            None => self.mint_for(run, Some(w)),
        }
    }

    /// `run`'s lease for `chip` (see [`chip_lease_for`](Self::chip_lease_for)), minted under
    /// the arena's lock if it holds none.
    fn mint_for(&self, run: &RunState, chip: Option<u32>) -> Option<lease::Lease> {
        let mut leases = sync::lock(&self.leases);
        let key = leases.key(chip);
        if let Some(l) = Leases::held(run, key) {
            return Some(l);
        }
        if run.is_done() {
            return None;
        }
        let head = self.head_under(&leases);
        if !leases.may_take(head.as_deref(), run, key) {
            return None;
        }
        leases.mint(run, key)
    }

    /// The FIFO head, read while `_leases` is held: a run leaves the FIFO under that lock too
    /// ([`run_ended`](Self::run_ended)), so the head seen holds the leases it is seen to hold.
    /// (The one lock order: the leases, then the FIFO.)
    fn head_under(&self, _leases: &std::sync::MutexGuard<'_, Leases>) -> Option<Arc<RunState>> {
        sync::lock(&self.runs).live.front().cloned()
    }

    /// Gives `run` its lease and its lease on each chip in `chips` at once, or none of them
    /// when one is not free to it (`Leases::may_take`: the head keeps one of each for itself).
    /// A run dispatching before its turn so never waits for a lease it lacks while holding
    /// others: two such runs could each hold what the other waits for. Returns whether it
    /// holds them all.
    pub(crate) fn leases_for_all(&self, run: &RunState, chips: &[u32]) -> bool {
        let mut leases = sync::lock(&self.leases);
        if run.is_done() {
            return false;
        }
        let head = self.head_under(&leases);
        let mut wanted: smallvec::SmallVec<[Option<u32>; 4]> = smallvec::SmallVec::new();
        for key in std::iter::once(None).chain(chips.iter().map(|&w| leases.key(Some(w)))) {
            if Leases::held(run, key).is_none() && !wanted.contains(&key) {
                wanted.push(key);
            }
        }
        if !wanted.iter().all(|&key| leases.may_take(head.as_deref(), run, key)) {
            return false;
        }
        wanted.iter().all(|&key| leases.mint(run, key).is_some())
    }

    /// The pipeline leases' free / live / quarantined counts (tests).
    #[cfg(test)]
    pub(crate) fn lease_counts(&self) -> lease::LeaseCounts {
        let leases = sync::lock(&self.leases);
        let mut c = leases.arena.counts();
        for chip in &leases.chips {
            let n = chip.counts();
            c.free += n.free;
            c.live += n.live;
            c.quarantined += n.quarantined;
        }
        c
    }

    /// Whether a quarantined lease waits for its workers' confirmation (one load; the role
    /// holder asks on every pass).
    pub(crate) fn has_quarantined(&self) -> bool {
        self.quarantined.load(Ordering::Acquire) != 0
    }

    /// Frees each quarantined lease (rule L4 of `lease`) whose run has no task on a worker any
    /// more, as `on_worker` (the role holder's view of its lanes) says: every task of it that
    /// was on a worker has ended (its end reported) or its worker left service. Returns whether
    /// it freed any.
    pub(crate) fn confirm_quarantined(&self, on_worker: impl Fn(Option<u32>, &RunState) -> bool) -> bool {
        let mut leases = sync::lock(&self.leases);
        let before = leases.quarantined.len();
        let mut quarantined = std::mem::take(&mut leases.quarantined);
        quarantined.retain(|(chip, l, run)| {
            if on_worker(*chip, run) {
                return true;
            }
            match leases.arena_of(*chip).confirm(*l) {
                Ok(()) => tracing::debug!(target: "simpler::run", run_id = run.id, "{l} back in service: no task of the abandoned run is on a worker any more"),
                Err(e) => tracing::error!(target: "simpler::run", run_id = run.id, "ending the quarantine of its lease: {e}"),
            }
            false
        });
        let after = quarantined.len();
        leases.quarantined = quarantined;
        self.quarantined.store(after, Ordering::Release);
        after != before
    }

    /// The quarantined leases and their runs, for a message ("lease {..} on chip 1 of run 4").
    pub(crate) fn quarantined_leases(&self) -> Vec<String> {
        sync::lock(&self.leases)
            .quarantined
            .iter()
            .map(|(chip, l, r)| match chip {
                Some(w) => format!("{l} on chip {w} of run {}", r.id),
                None => format!("{l} of run {}", r.id),
            })
            .collect()
    }

    /// The FIFO head run, if any.
    pub(crate) fn live_head(&self) -> Option<Arc<RunState>> {
        sync::lock(&self.runs).live.front().cloned()
    }

    /// The first run behind the FIFO head, if any.
    pub(crate) fn successor_run(&self) -> Option<Arc<RunState>> {
        sync::lock(&self.runs).live.get(1).cloned()
    }

    /// Whether a task of `run` that writes `id` has not ended yet (see
    /// [`TensorMap::writer_pending`](crate::engine::tensor_map::TensorMap::writer_pending)).
    pub(crate) fn writer_pending(&self, run: u64, id: crate::data::buffer::Identity) -> bool {
        self.tensor_map.writer_pending(run, id)
    }

    /// A place for one run if a run may be admitted now without waiting (give it to
    /// [`build_run_as`](Self::build_run_as); dropped, it goes back). When none is free,
    /// `waker` is woken once a run finished or a place was given back (then ask again).
    pub(crate) fn poll_room(&self, waker: &std::task::Waker) -> Option<Reservation<'_>> {
        let (depth, _) = self.run_depth();
        let mut runs = sync::lock(&self.runs);
        if runs.has_room(depth) {
            runs.reserved += 1;
            return Some(Reservation(self));
        }
        if !runs.room_wakers.iter().any(|w| w.will_wake(waker)) {
            runs.room_wakers.push(waker.clone());
        }
        None
    }

    /// Gives back a place a [`Reservation`] held, and tells whoever waits for room: async
    /// submits (their wakers) and blocking ones (which drive or sleep on `events` and the
    /// doorbell).
    fn unreserve(&self) {
        let wakers = {
            let mut runs = sync::lock(&self.runs);
            runs.reserved -= 1;
            std::mem::take(&mut runs.room_wakers)
        };
        wakers.into_iter().for_each(std::task::Waker::wake);
        self.events.ring();
        self.doorbell().ring();
    }

    /// Called by whoever finished a run: drop it from the FIFO, wake waiters.
    pub(crate) fn run_finished(&self, run: &Arc<RunState>) {
        self.run_ended(run, false);
    }

    /// [`run_finished`](Self::run_finished) of a run that ended without waiting for its tasks
    /// (`abandoned`: [`Engine::abandon_run`]): one of them may still be on a worker, so its
    /// lease is quarantined instead of released (rule L4 of `lease`), until the scheduler sees
    /// no task of it on a worker ([`Engine::confirm_quarantined`]).
    pub(crate) fn run_ended(&self, run: &Arc<RunState>, abandoned: bool) {
        // Under the arena's lock: `lease_for` mints none for a run that is done (see there), and
        // the run leaves the FIFO before the lock is let go (`head_under`).
        let wakers = {
            let mut leases = sync::lock(&self.leases);
            let chip_leases = sync::lock(&run.chip_leases).clone();
            let held = run.lease.get().map(|&l| (None, l)).into_iter();
            for (chip, l) in held.chain(chip_leases.into_iter().map(|(w, l)| (Some(w), l))) {
                let kept = if abandoned {
                    leases.arena_of(chip).quarantine(l).map(|()| {
                        leases.quarantined.push((chip, l, run.clone()));
                        self.quarantined.store(leases.quarantined.len(), Ordering::Release);
                        tracing::debug!(target: "simpler::run", run_id = run.id, ?chip, "{l} quarantined: the run was abandoned and a task of it may still be on a worker");
                    })
                } else {
                    leases.arena_of(chip).release(l)
                };
                if let Err(e) = kept {
                    tracing::error!(target: "simpler::run", run_id = run.id, ?chip, "returning its pipeline lease: {e}");
                }
            }
            let mut runs = sync::lock(&self.runs);
            if let Some(at) = runs.live.iter().position(|r| Arc::ptr_eq(r, run)) {
                runs.spare = runs.live.remove(at);
            }
            self.head_run.store(runs.live.front().map_or(0, |r| r.id), Ordering::Release);
            self.runs_epoch.fetch_add(1, Ordering::Release);
            std::mem::take(&mut runs.room_wakers)
        };
        wakers.into_iter().for_each(std::task::Waker::wake);
        tracing::debug!(target: "simpler::run", run_id = run.id, ok = run.first_error().is_none(), "run finished");
        self.events.ring();
        // A new head may have ready tasks: make sure someone drives.
        self.doorbell().ring();
        self.wake_background_if_needed();
    }

    pub(crate) fn head_run(&self) -> u64 {
        self.head_run.load(Ordering::Acquire)
    }

    /// A run closed its submission behind the head (its footprint is set): the scheduler is
    /// to check again whether it is independent of the runs ahead, and someone must drive.
    pub(crate) fn runs_changed(&self) {
        self.runs_epoch.fetch_add(1, Ordering::Release);
        self.doorbell().ring();
        self.wake_background_if_needed();
    }

    /// See `runs_epoch`.
    pub(crate) fn runs_epoch(&self) -> u64 {
        self.runs_epoch.load(Ordering::Acquire)
    }

    /// Replaces `into`'s contents with the live runs, in FIFO order (the scheduler's reused
    /// list: no allocation in steady state).
    pub(crate) fn live_runs_into(&self, into: &mut Vec<Arc<RunState>>) {
        into.clear();
        into.extend(sync::lock(&self.runs).live.iter().cloned());
    }

    /// Whether `run`, behind the head, is independent of every run ahead of it that is still
    /// live (`ahead`, in FIFO order, stops at `run`): its submission closed with a footprint,
    /// and no unfinished task of a run ahead touches a buffer it names in a way that conflicts
    /// ([`TensorMap::conflicts`](crate::engine::tensor_map::TensorMap::conflicts)).
    pub(crate) fn independent_of(&self, run: &RunState, ahead: &[Arc<RunState>]) -> bool {
        if !run.submission_closed() {
            return false;
        }
        let Some(fp) = run.footprint.get() else { return false };
        let earlier = ahead.iter().take_while(|r| r.id < run.id).filter(|r| !r.is_done());
        // Every run ahead closed its submission before this one was admitted (builds are
        // serialized), so what they will ever touch is in the TensorMap now; checked anyway.
        let mut ids: smallvec::SmallVec<[u64; 8]> = smallvec::SmallVec::new();
        for r in earlier {
            if !r.submission_closed() {
                return false;
            }
            ids.push(r.id);
        }
        !self.tensor_map.conflicts(&ids, &fp.buffers)
    }

    /// Live runs (for close).
    pub(crate) fn live_runs(&self) -> Vec<Arc<RunState>> {
        sync::lock(&self.runs).live.iter().cloned().collect()
    }
}
