//! Runs: the state of one `Worker::submit`, and the handle the caller waits on.
//!
//! [`RunState`] is one run; [`RunHandle`] (`wait`, `wait_timeout`, `cancel`, `stats`, `dag`,
//! `timeline`, `progress`) holds its run strongly and the engine weakly: the Worker's runtime
//! holds the one strong reference to the engine, so `close` releases the mailboxes, heap rings
//! and pidfds behind it even while handles are kept, and those answer from the run's own state.
//!
//! Runs are admitted FIFO up to `pending_run_depth` (`pipeline_depth` when 0); the head run
//! dispatches (and a staged successor, `scheduler`), and so does a run behind it that is
//! independent of every run ahead ([`Footprint`], `Scheduler::dispatch_independent`). So a task
//! that never returns holds, until its run is **stopped**, its worker, its run's lease and
//! admission place, and the later runs that name its buffers; independent runs go on. The lifecycle: admitted -> building (the orchestration function; tasks
//! dispatch meanwhile) -> submission closed -> done once every slot is consumed (or abandoned:
//! a panic, `close`, a worker that cannot be stopped).
//!
//! A run is stopped when its deadline passes (`RunOptions::deadline`,
//! `WorkerBuilder::run_deadline`; counted from the submit) or `RunHandle::cancel` asks: the role
//! holder (`Scheduler::stop_run`, at the start of a pass whenever `Engine::next_check` is due)
//! records the run's `Timeout` / `Cancelled` error naming the tasks still running, their
//! callables, workers and the deadline; marks the run stopped (from then on a task of it that
//! becomes READY is failed instead of queued); fails its queued READY tasks (their consumers
//! are poisoned as usual); and calls `Endpoint::stop` on each lane running one of its tasks. A
//! child process is SIGKILLed there, and its death completes the task and takes the lane out of
//! service by the usual path, after which the run ends normally; an endpoint that cannot stop
//! its worker (a thread) makes the run be abandoned. `next_check` (the earliest deadline of a
//! live run, or now for a cancel) bounds every driver's sleep, the background thread's
//! included, so deadlines hold while nobody waits, without polling.
//!
//! A captured run (`RunOptions::capture_dag`) keeps its DAG and its timeline records
//! ([`RunState::note`], one branch when not captured); see `dfx`.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::dfx::graph::{DagCapture, RunDag};
use crate::engine::Engine;
use crate::error::{Error, ErrorKind, Result};
use crate::sys::sync;

/// Statistics of a finished run, from [`RunHandle::stats`].
///
/// ```no_run
/// use simpler::{DataType, HostArgs, HostFn, HostResult, TaskArgs, Worker};
///
/// fn touch(_args: &HostArgs<'_>) -> HostResult {
///     Ok(())
/// }
///
/// # fn main() -> simpler::Result<()> {
/// let mut worker = Worker::builder().sub_workers(2).build()?;
/// let touch = worker.register(HostFn::new("touch", touch))?;
/// worker.init()?;
/// let handle = worker.submit(|orch| {
///     let tmp = orch.alloc(&[256], DataType::Float32)?; // not counted in `tasks`
///     for _ in 0..3 {
///         let mut args = TaskArgs::new();
///         args.inout(&tmp)?;
///         orch.submit_sub(&touch, args)?;
///     }
///     Ok(())
/// })?;
/// handle.wait()?;
/// let stats = handle.stats().expect("finished runs have statistics");
/// assert_eq!((stats.tasks, stats.failed), (3, 0));
/// println!("{} tasks in {:?}", stats.tasks, stats.wall);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunStats {
    /// Tasks submitted (allocations not counted).
    pub tasks: u64,
    /// Tasks that failed or were poisoned.
    pub failed: u64,
    /// Time from `submit` to the last task's completion.
    pub wall: Duration,
}

/// Why the scheduler stopped a run before its tasks ended (see [`RunState::due`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopCause {
    /// It passed its deadline, this long after its submit.
    Deadline(Duration),
    /// [`RunHandle::cancel`].
    Cancelled,
    /// [`RunHandle::cancel_gracefully`]: no task starts any more, running ones may end within
    /// this long.
    CancelledGracefully(Duration),
    /// A graceful cancel's grace is over with tasks still running: they are stopped.
    GraceOver(Duration),
}

const NOT_STOPPED: u8 = 0;
const STOPPED_BY_DEADLINE: u8 = 1;
const STOPPED_BY_CANCEL: u8 = 2;

/// The engine-side state of one run.
pub(crate) struct RunState {
    pub(crate) id: u64,
    /// Live slots (submitted, not yet consumed), allocations included.
    active: AtomicU64,
    submission_closed: AtomicBool,
    done: AtomicBool,
    first_error: OnceLock<Error>,
    pub(crate) tasks: AtomicU64,
    /// Tasks that completed successfully.
    pub(crate) completed: AtomicU64,
    pub(crate) failed: AtomicU64,
    /// The level of the Worker that runs it (task records name it).
    level: crate::level::Level,
    /// The number of the engine that runs it ([`Engine::id`](crate::engine::Engine)).
    pub(crate) engine: u64,
    /// The run's span (`simpler::run`, `run`): entered while its orchestration builds it, the
    /// parent of its tasks' spans.
    pub(crate) span: tracing::Span,
    started: Instant,
    finished: OnceLock<Instant>,
    pub(crate) capture: Option<Mutex<DagCapture>>,
    /// When the run must have ended, and the limit it was given (for messages).
    deadline: Option<(Instant, Duration)>,
    /// [`RunHandle::cancel`] asked the scheduler to stop the run.
    cancel_requested: AtomicBool,
    /// The grace of a graceful cancel (asked for before `cancel_requested` is set), and once the
    /// scheduler stopped the run that way, when its running tasks are to be stopped (taken when
    /// they are).
    grace: Mutex<(Option<Duration>, Option<Instant>)>,
    /// Whether (and why) the scheduler stopped the run: from then on none of its tasks is
    /// dispatched (one of the `STOPPED_*` values).
    stopped: AtomicU8,
    /// The pipeline lease the run holds (`engine::lease`), from its first dispatch (as the FIFO
    /// head or before its turn) until it finished.
    pub(crate) lease: OnceLock<crate::engine::lease::Lease>,
    /// Its tasks staged on a worker now (handed over to prepare, not yet activated or ended).
    pub(crate) staged: AtomicU64,
    /// Its orchestration function failed (or panicked): its tasks not started never start,
    /// staged ones included.
    build_failed: AtomicBool,
    /// Submitted by a caller that goes on without waiting (`Worker::submit`): more runs are
    /// likely to follow it, so a chip keeps itself free to prepare one beside its tasks.
    pub(crate) ahead: AtomicBool,
    /// The wakers of the futures awaiting it ([`RunHandle`]'s `IntoFuture`), woken once when it
    /// finishes.
    wakers: Mutex<Vec<std::task::Waker>>,
    /// What its tasks name, set when its submission closes behind an earlier live run (see
    /// [`Footprint`]): how the scheduler tells whether it is independent of the runs ahead.
    pub(crate) footprint: OnceLock<Footprint>,
    /// The next-level workers its tasks were submitted to, one bit each (bit 63: worker 63 or
    /// any above), and whether one of them is a group (`note_next_level`): a head whose
    /// submission closed keeps no lease of a chip it never uses for itself
    /// (`Leases::may_take`).
    next_level: AtomicU64,
    next_level_groups: AtomicBool,
    /// Its leases on chips, by next-level worker index (`Engine::chip_lease_for`): set under
    /// the engine's lease lock, read by the scheduler on each chip dispatch.
    pub(crate) chip_leases: Mutex<smallvec::SmallVec<[(u32, crate::engine::lease::Lease); 2]>>,
    /// The scheduler found it independent of every earlier live run and gave it a lease: it
    /// dispatches its tasks before it is the FIFO head (only the role holder sets it).
    pub(crate) independent: AtomicBool,
}

/// The buffers a run's tasks name, by identity, each with whether a task writes it, sorted
/// and without repeats. Set when a run's submission closes
/// while an earlier run is live: the scheduler dispatches such a run ahead of its turn once none
/// of these buffers is touched by an unfinished task of an earlier live run in a way that
/// conflicts (a write on either side), [`TensorMap::conflicts`](crate::engine::tensor_map::TensorMap::conflicts).
pub(crate) struct Footprint {
    pub(crate) buffers: Box<[(crate::data::buffer::Identity, bool)]>,
}

impl RunState {
    pub(crate) fn new(id: u64, capture: bool) -> RunState {
        RunState {
            id,
            active: AtomicU64::new(0),
            submission_closed: AtomicBool::new(false),
            done: AtomicBool::new(false),
            first_error: OnceLock::new(),
            tasks: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            level: crate::level::Level::Node,
            engine: 0,
            span: tracing::Span::none(),
            started: Instant::now(),
            finished: OnceLock::new(),
            capture: capture.then(|| Mutex::new(DagCapture::default())),
            deadline: None,
            cancel_requested: AtomicBool::new(false),
            grace: Mutex::new((None, None)),
            stopped: AtomicU8::new(NOT_STOPPED),
            lease: OnceLock::new(),
            staged: AtomicU64::new(0),
            build_failed: AtomicBool::new(false),
            ahead: AtomicBool::new(false),
            wakers: Mutex::new(Vec::new()),
            footprint: OnceLock::new(),
            chip_leases: Mutex::new(smallvec::SmallVec::new()),
            next_level: AtomicU64::new(0),
            next_level_groups: AtomicBool::new(false),
            independent: AtomicBool::new(false),
        }
    }

    /// Notes a task submitted to next-level `workers` (a group when `group`).
    pub(crate) fn note_next_level(&self, workers: &[u32], group: bool) {
        let bits = workers.iter().fold(0u64, |b, &w| b | 1 << w.min(63));
        if self.next_level.load(Ordering::Relaxed) & bits != bits {
            self.next_level.fetch_or(bits, Ordering::Relaxed);
        }
        if group {
            self.next_level_groups.store(true, Ordering::Relaxed);
        }
    }

    /// Whether it may still submit, or has submitted, a task to next-level worker `w`.
    pub(crate) fn may_use_next_level(&self, w: u32) -> bool {
        !self.submission_closed() || self.next_level.load(Ordering::Relaxed) & (1 << w.min(63)) != 0
    }

    /// The next-level workers, of `n`, it may have submitted a task to (those of 63 and up all
    /// count once one of them was: bit 63 stands for them all).
    pub(crate) fn next_level_workers(&self, n: usize) -> impl Iterator<Item = u32> + '_ {
        let bits = self.next_level.load(Ordering::Relaxed);
        (0..n as u32).filter(move |&w| bits & (1 << w.min(63)) != 0)
    }

    /// Whether one of its tasks is a next-level group (which waits for its run's turn).
    pub(crate) fn has_next_level_groups(&self) -> bool {
        self.next_level_groups.load(Ordering::Relaxed)
    }

    /// Its lease on chip `w`, if it holds one.
    pub(crate) fn chip_lease(&self, w: u32) -> Option<crate::engine::lease::Lease> {
        crate::sys::sync::lock(&self.chip_leases).iter().find(|(c, _)| *c == w).map(|(_, l)| *l)
    }

    /// Wakes the futures awaiting the run (it has just finished).
    fn wake_awaiters(&self) {
        let wakers = std::mem::take(&mut *crate::sys::sync::lock(&self.wakers));
        for w in wakers {
            w.wake();
        }
    }

    /// Registers `waker` to be woken when the run finishes; false when it has finished already
    /// (checked after registering, so a finish in between is never missed).
    fn wake_when_done(&self, waker: &std::task::Waker) -> bool {
        {
            let mut wakers = crate::sys::sync::lock(&self.wakers);
            if !wakers.iter().any(|w| w.will_wake(waker)) {
                wakers.push(waker.clone());
            }
        }
        !self.is_done()
    }

    /// Whether its orchestration function returned (no task of it is submitted any more).
    pub(crate) fn submission_closed(&self) -> bool {
        self.submission_closed.load(Ordering::SeqCst)
    }

    /// The captured run as it happened, once it is done (see [`RunHandle::timeline`]).
    pub(crate) fn timeline(&self) -> Option<crate::dfx::timeline::Timeline> {
        let timeline = self.own_timeline()?;
        // What ran inside its tasks in other processes of the tree (chips' kernels, nested
        // Workers' runs): in the trace log, if this process has one.
        match crate::sys::tracelog::key().map(|_| crate::sys::tracelog::read_all()) {
            Some(Ok(bytes)) => {
                if bytes.len() as u64 + (1 << 20) > crate::sys::tracelog::CAP {
                    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
                    if !SAID.swap(true, Ordering::Relaxed) {
                        tracing::warn!(target: "simpler::run", "the trace log is (nearly) full ({} bytes): timelines of later captured runs miss what ran in worker processes", bytes.len());
                    }
                }
                let entries = crate::dfx::timeline::decode_entries(&bytes);
                Some(timeline.with_inner(&entries, (std::process::id(), self.engine, self.id)))
            }
            _ => Some(timeline),
        }
    }

    /// The captured run's own records, without what ran inside its tasks in other processes
    /// (no look at the trace log), once it is done.
    pub(crate) fn own_timeline(&self) -> Option<crate::dfx::timeline::Timeline> {
        let cap = sync::lock(self.capture.as_ref()?);
        if !self.is_done() {
            return None;
        }
        let dag = cap.to_dag();
        let records = cap.times.records(&dag, self.level);
        Some(crate::dfx::timeline::Timeline::new(dag, records))
    }

    /// The run is `engine`'s.
    pub(crate) fn in_engine(mut self, engine: u64) -> RunState {
        self.engine = engine;
        self
    }

    /// The run belongs to a Worker of `level`.
    pub(crate) fn at_level(mut self, level: crate::level::Level) -> RunState {
        self.level = level;
        self.span =
            tracing::debug_span!(target: "simpler::run", "run", run_id = self.id, level = level.number());
        self
    }

    /// Records what happened to task `index` now, when the run is captured (one branch
    /// otherwise).
    #[inline]
    pub(crate) fn note(&self, index: u32, event: crate::dfx::timeline::TaskEvent<'_>) {
        if self.capture.is_some() {
            self.note_at(index, event, crate::sys::clock::monotonic_ns());
        }
    }

    /// Records what happened to task `index` at `now`, when the run is captured.
    pub(crate) fn note_at(&self, index: u32, event: crate::dfx::timeline::TaskEvent<'_>, now: u64) {
        if let Some(cap) = &self.capture {
            sync::lock(cap).times.note(index, event, now);
        }
    }

    /// The run must end by `at`, `limit` after its submit.
    pub(crate) fn with_deadline(mut self, at: Instant, limit: Duration) -> RunState {
        self.deadline = Some((at, limit));
        self
    }

    /// When the scheduler must look at this run again: now when a cancel waits, at its deadline
    /// otherwise; `None` once it was stopped (or without a deadline).
    pub(crate) fn next_check(&self) -> Option<Instant> {
        if self.is_done() {
            return None;
        }
        if self.is_stopped() {
            return sync::lock(&self.grace).1;
        }
        if self.cancel_requested.load(Ordering::SeqCst) {
            return Some(self.started);
        }
        self.deadline.map(|(at, _)| at)
    }

    /// Why the scheduler must stop the run now (a cancel, else a deadline passed by `now`), if
    /// it must and has not yet.
    pub(crate) fn due(&self, now: Instant) -> Option<StopCause> {
        if self.is_done() {
            return None;
        }
        if self.is_stopped() {
            let mut grace = sync::lock(&self.grace);
            return match *grace {
                (Some(limit), Some(at)) if at <= now => {
                    grace.1 = None;
                    Some(StopCause::GraceOver(limit))
                }
                _ => None,
            };
        }
        if self.cancel_requested.load(Ordering::SeqCst) {
            return Some(match sync::lock(&self.grace).0 {
                Some(limit) => StopCause::CancelledGracefully(limit),
                None => StopCause::Cancelled,
            });
        }
        match self.deadline {
            Some((at, limit)) if at <= now => Some(StopCause::Deadline(limit)),
            _ => None,
        }
    }

    /// Asks the scheduler to stop the run; false when a cancel was asked for already.
    pub(crate) fn request_cancel(&self) -> bool {
        !self.cancel_requested.swap(true, Ordering::SeqCst)
    }

    /// Asks the scheduler to stop the run gracefully, giving running tasks `grace`; false when
    /// a cancel was asked for already.
    pub(crate) fn request_graceful_cancel(&self, grace: Duration) -> bool {
        // The grace is set only by the request that wins, under the lock `due` takes once it
        // sees the request: a plain `cancel` that won stays plain, and the scheduler never sees
        // this request without its grace.
        let mut g = sync::lock(&self.grace);
        if !self.request_cancel() {
            return false;
        }
        g.0 = Some(grace);
        true
    }

    /// The scheduler stops the run (the holder only): none of its tasks is dispatched any more.
    pub(crate) fn mark_stopped(&self, cause: StopCause) {
        let v = match cause {
            StopCause::Deadline(_) => STOPPED_BY_DEADLINE,
            StopCause::Cancelled | StopCause::GraceOver(_) => STOPPED_BY_CANCEL,
            StopCause::CancelledGracefully(limit) => {
                sync::lock(&self.grace).1 = Some(crate::sys::clock::after(limit));
                STOPPED_BY_CANCEL
            }
        };
        let _ = self.stopped.compare_exchange(NOT_STOPPED, v, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Its orchestration function failed: a task of it that is staged and not launched is
    /// withdrawn, as its queued tasks are failed.
    pub(crate) fn mark_build_failed(&self) {
        self.build_failed.store(true, Ordering::SeqCst);
    }

    /// Whether its orchestration function failed ([`mark_build_failed`](Self::mark_build_failed)).
    pub(crate) fn build_failed(&self) -> bool {
        self.build_failed.load(Ordering::SeqCst)
    }

    /// Whether the scheduler stopped the run (deadline or cancel).
    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst) != NOT_STOPPED
    }

    /// Whether its tasks may still start: it is not done, not stopped, and its orchestration
    /// function did not fail.
    pub(crate) fn takes_tasks(&self) -> bool {
        !self.is_done() && !self.is_stopped() && !self.build_failed()
    }

    /// Whether the scheduler stopped the run because it was cancelled.
    pub(crate) fn was_cancelled(&self) -> bool {
        self.stopped.load(Ordering::SeqCst) == STOPPED_BY_CANCEL
    }

    /// Records the run's error; the first one wins.
    pub(crate) fn record_error(&self, err: Error) {
        let _ = self.first_error.set(err);
    }

    pub(crate) fn first_error(&self) -> Option<&Error> {
        self.first_error.get()
    }

    pub(crate) fn slot_created(&self) {
        self.active.fetch_add(1, Ordering::SeqCst);
    }

    /// Returns true when this consumption finished the run.
    pub(crate) fn slot_consumed(&self) -> bool {
        let left = self.active.fetch_sub(1, Ordering::SeqCst) - 1;
        left == 0 && self.try_finish()
    }

    /// Closes submission; returns true when that finished the run.
    pub(crate) fn close_submission(&self) -> bool {
        self.submission_closed.store(true, Ordering::SeqCst);
        self.try_finish()
    }

    fn try_finish(&self) -> bool {
        if self.submission_closed.load(Ordering::SeqCst) && self.active.load(Ordering::SeqCst) == 0 {
            // The end time first: whoever sees `done` may read the statistics at once.
            let _ = self.finished.set(Instant::now());
            let finished =
                self.done.compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst).is_ok();
            if finished {
                self.wake_awaiters();
            }
            return finished;
        }
        false
    }

    /// Marks the run finished without waiting for its tasks (only when closing a Worker that
    /// could not drain it).
    pub(crate) fn abandon(&self, err: Error) {
        self.record_error(err);
        if !self.done.load(Ordering::SeqCst) {
            // The end time first, as in `try_finish`.
            let _ = self.finished.set(Instant::now());
            if self.done.compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                self.wake_awaiters();
            }
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    pub(crate) fn result(&self) -> Result<()> {
        match self.first_error.get() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    pub(crate) fn stats(&self) -> Option<RunStats> {
        let end = self.finished.get()?;
        Some(RunStats {
            tasks: self.tasks.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            wall: end.duration_since(self.started),
        })
    }
}

/// A submitted run: wait on it, poll it, read its statistics and captured DAG.
///
/// Dropping the handle does not cancel the run ([`cancel`](RunHandle::cancel) does). The
/// handle does not keep its Worker's resources alive: once the Worker is closed (every run then
/// finished or abandoned), a kept handle holds the run's result, statistics and captured DAG,
/// and nothing of the Worker (its processes' mailboxes, heap rings and pidfds are released by
/// `close`).
///
/// ```no_run
/// # fn demo(worker: &simpler::Worker) -> simpler::Result<()> {
/// use std::time::Duration;
/// use simpler::TaskArgs;
/// let run = worker.submit(|_orch| Ok(()))?;
/// if run.wait_timeout(Duration::from_secs(1)).is_err() {
///     // still running: the run is intact, wait again later
///     run.wait()?;
/// }
/// assert!(run.is_done());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RunHandle {
    pub(crate) run: Arc<RunState>,
    /// The engine while its Worker holds it: `close` drops the last strong reference, with the
    /// mailboxes, heap rings and pidfds the engine's lanes and heap hold.
    engine: Weak<Engine>,
}

/// A run as a future: `run.await` (or `run.into_future()`) ends with the run's result, as
/// [`RunHandle::wait`] does, without blocking a thread. The Worker's background thread drives
/// the run meanwhile and the run's end wakes the future: it works under any executor (tokio's
/// current-thread and multi-thread runtimes included) and the library depends on none.
///
/// Dropping the future before the run ended cancels the run ([`RunHandle::cancel`]); keep a
/// clone of the handle to let a run go on unwatched.
///
/// ```no_run
/// use simpler::{HostArgs, HostFn, HostResult, TaskArgs, Worker};
///
/// fn step(_args: &HostArgs<'_>) -> HostResult {
///     Ok(())
/// }
///
/// async fn serve(worker: &Worker, step: &simpler::CallableHandle) -> simpler::Result<()> {
///     let run = worker.submit(|orch| orch.submit_sub(step, TaskArgs::new()).map(|_| ()))?;
///     run.await // no thread blocks meanwhile
/// }
/// ```
#[must_use = "a run future does nothing unless awaited; dropping it cancels the run"]
pub struct RunFuture {
    handle: RunHandle,
    settled: bool,
}

impl std::fmt::Debug for RunFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunFuture").field("run", &self.handle.run.id).finish()
    }
}

impl std::future::Future for RunFuture {
    type Output = Result<()>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<()>> {
        if self.handle.run.wake_when_done(cx.waker()) {
            if self.handle.engine().is_none() {
                self.settled = true;
                return std::task::Poll::Ready(Err(Error::state(format!(
                    "run {} cannot be awaited: its Worker is closed",
                    self.handle.run.id
                ))));
            }
            return std::task::Poll::Pending;
        }
        self.settled = true;
        std::task::Poll::Ready(self.handle.run.result())
    }
}

impl Drop for RunFuture {
    fn drop(&mut self) {
        if !self.settled && !self.handle.run.is_done() {
            self.handle.cancel();
        }
    }
}

impl std::future::IntoFuture for RunHandle {
    type Output = Result<()>;
    type IntoFuture = RunFuture;

    fn into_future(self) -> RunFuture {
        RunFuture { handle: self, settled: false }
    }
}

impl std::fmt::Debug for RunHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunHandle").field("id", &self.run.id).field("done", &self.is_done()).finish()
    }
}

impl RunHandle {
    /// The handle of `run`, built on `engine`.
    pub(crate) fn new(run: Arc<RunState>, engine: &Arc<Engine>) -> RunHandle {
        RunHandle { run, engine: Arc::downgrade(engine) }
    }

    /// The engine, unless its Worker has closed and let it go.
    fn engine(&self) -> Option<Arc<Engine>> {
        self.engine.upgrade().filter(|e| !e.is_closed())
    }

    /// The run's id (counts up from 1 per Worker).
    ///
    /// The same id is [`Orchestrator::run_id`](crate::Orchestrator::run_id) while the run is
    /// built, and appears in the run's error messages.
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// use simpler::Worker;
    /// let mut worker = Worker::builder().sub_workers(1).build()?;
    /// worker.init()?;
    /// let mut seen = 0;
    /// let first = worker.submit(|orch| {
    ///     seen = orch.run_id();
    ///     Ok(())
    /// })?;
    /// assert_eq!((first.id(), seen), (1, 1));
    /// let second = worker.submit(|_| Ok(()))?;
    /// assert_eq!(second.id(), 2);
    /// # Ok(()) }
    /// ```
    pub fn id(&self) -> u64 {
        self.run.id
    }

    /// Blocks until every task of the run is terminal; returns the run's first error.
    ///
    /// The waiting thread drives the scheduler itself while it waits. Waiting again on a
    /// finished run returns the same result at once.
    ///
    /// ```no_run
    /// use simpler::{ErrorKind, HostArgs, HostFn, HostResult, TaskArgs, Worker};
    ///
    /// fn fails(_args: &HostArgs<'_>) -> HostResult {
    ///     Err("out of widgets".into())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(1).build()?;
    /// let fails = worker.register(HostFn::new("fails", fails))?;
    /// worker.init()?;
    /// let run = worker.submit(|orch| orch.submit_sub(&fails, TaskArgs::new()).map(|_| ()))?;
    /// let err = run.wait().unwrap_err(); // the host function's error fails the run
    /// assert_eq!(err.kind(), ErrorKind::TaskFailed);
    /// assert!(err.message().contains("out of widgets"));
    /// assert_eq!(run.wait().unwrap_err().message(), err.message()); // same result again
    /// assert_eq!(run.stats().unwrap().failed, 1);
    /// # Ok(()) }
    /// ```
    pub fn wait(&self) -> Result<()> {
        self.wait_until(None)
    }

    /// Like [`wait`](Self::wait) with a time limit. On expiry returns an error of kind
    /// [`ErrorKind::Timeout`] and leaves the run intact.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use simpler::{HostArgs, HostFn, HostResult, TaskArgs, Worker};
    ///
    /// fn slow(_args: &HostArgs<'_>) -> HostResult {
    ///     std::thread::sleep(Duration::from_secs(2));
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(1).build()?;
    /// let slow = worker.register(HostFn::new("slow", slow))?;
    /// worker.init()?;
    /// let run = worker.submit(|orch| orch.submit_sub(&slow, TaskArgs::new()).map(|_| ()))?;
    /// // Report progress while waiting.
    /// loop {
    ///     match run.wait_timeout(Duration::from_millis(500)) {
    ///         Err(e) if e.kind() == simpler::ErrorKind::Timeout => eprintln!("run {} still running", run.id()),
    ///         other => break other?,
    ///     }
    /// }
    /// assert!(run.is_done());
    /// # Ok(()) }
    /// ```
    pub fn wait_timeout(&self, timeout: Duration) -> Result<()> {
        self.wait_until(Some(crate::sys::clock::after(timeout)))
    }

    fn wait_until(&self, deadline: Option<Instant>) -> Result<()> {
        if !self.run.is_done() {
            let Some(engine) = self.engine() else {
                return Err(Error::state(format!(
                    "run {} cannot be waited on: its Worker is closed",
                    self.run.id
                )));
            };
            let _span = tracing::debug_span!(target: "simpler::run", "wait", run_id = self.run.id).entered();
            let run = &self.run;
            if !engine.drive_until(|| run.is_done(), deadline) {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("run {} did not finish in time; it is still running", run.id),
                ));
            }
        }
        self.run.result()
    }

    /// True once every task of the run is terminal.
    ///
    /// Only reads the state: unlike [`wait`](Self::wait) it does not drive the scheduler (a
    /// background thread does that while nobody waits).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use simpler::{HostArgs, HostFn, HostResult, TaskArgs, Worker};
    ///
    /// fn step(_args: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(1).build()?;
    /// let step = worker.register(HostFn::new("step", step))?;
    /// worker.init()?;
    /// let run = worker.submit(|orch| orch.submit_sub(&step, TaskArgs::new()).map(|_| ()))?;
    /// while !run.is_done() {
    ///     std::thread::sleep(Duration::from_millis(1)); // do other work meanwhile
    /// }
    /// run.wait()?; // returns at once: collect the result
    /// # Ok(()) }
    /// ```
    pub fn is_done(&self) -> bool {
        if !self.run.is_done()
            && let Some(engine) = self.engine()
        {
            // Polling drives: collect what finished and dispatch what is ready, if nobody else
            // is driving right now.
            engine.try_pass();
        }
        self.run.is_done()
    }

    /// Cancels the run: it fails now with an [`ErrorKind::Cancelled`] error naming it.
    ///
    /// Its tasks not yet started never run (they fail without being dispatched), and the workers
    /// running its tasks are stopped: each such child process is killed (`SIGKILL`), its lane
    /// leaves service as for any worker death (see [`Worker::workers`](crate::Worker::workers)),
    /// and later runs go to the workers left. A remote Worker running one of its tasks is asked
    /// to cancel it on its node, answers, and stays in service. When this returns true, no task of the run
    /// starts any more; [`wait`](Self::wait) returns as soon as the stopped workers' deaths are
    /// collected (milliseconds).
    ///
    /// Returns true when this call cancelled the run; false, doing nothing, when the run had
    /// finished already or was stopped already (cancelled before, or past its
    /// [deadline](crate::RunOptions::deadline)), or the Worker is closed. As with every run
    /// error, the first one wins: when a task of the run had failed before, `wait` returns that
    /// failure.
    ///
    /// ```no_run
    /// use simpler::{ErrorKind, HostArgs, HostFn, HostResult, TaskArgs, Worker};
    ///
    /// fn forever(_args: &HostArgs<'_>) -> HostResult {
    ///     loop {
    ///         std::thread::park(); // never returns
    ///     }
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(2).build()?;
    /// let forever = worker.register(HostFn::new("forever", forever))?;
    /// worker.init()?;
    /// let run = worker.submit(|orch| orch.submit_sub(&forever, TaskArgs::new()).map(|_| ()))?;
    /// assert!(run.cancel());
    /// let err = run.wait().unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::Cancelled);
    /// assert!(err.message().contains(&format!("run {}", run.id())));
    /// assert!(!run.cancel()); // finished: nothing to cancel
    /// worker.run(|_orch| Ok(()))?; // later runs proceed (on the SUB worker left)
    /// # Ok(()) }
    /// ```
    pub fn cancel(&self) -> bool {
        self.engine().is_some_and(|engine| engine.cancel_run(&self.run))
    }

    /// Cancels the run gracefully: it fails with an [`ErrorKind::Cancelled`] error naming it,
    /// none of its tasks starts any more, and the tasks it has running may end on their own
    /// for up to `grace`; those still running then are stopped as by [`cancel`](Self::cancel)
    /// (their workers killed). The workers whose tasks ended in time stay in service.
    ///
    /// Returns true when this call cancelled the run (it has stopped dispatching when this
    /// returns; [`wait`](Self::wait) returns once its running tasks ended or were stopped);
    /// false, doing nothing, as for `cancel`.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use simpler::{ErrorKind, HostArgs, HostFn, HostResult, TaskArgs, Worker};
    ///
    /// fn step(_args: &HostArgs<'_>) -> HostResult {
    ///     std::thread::sleep(Duration::from_millis(50));
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(2).build()?;
    /// let step = worker.register(HostFn::new("step", step))?;
    /// worker.init()?;
    /// let run = worker.submit(|orch| {
    ///     for _ in 0..100 {
    ///         orch.submit_sub(&step, TaskArgs::new())?;
    ///     }
    ///     Ok(())
    /// })?;
    /// assert!(run.cancel_gracefully(Duration::from_secs(1)));
    /// assert_eq!(run.wait().unwrap_err().kind(), ErrorKind::Cancelled);
    /// assert_eq!(worker.workers().iter().filter(|w| w.is_alive()).count(), 2); // none was killed
    /// # Ok(()) }
    /// ```
    pub fn cancel_gracefully(&self, grace: Duration) -> bool {
        self.engine().is_some_and(|engine| engine.cancel_run_gracefully(&self.run, grace))
    }

    /// Statistics, once the run is done (`None` before).
    ///
    /// ```no_run
    /// use simpler::{HostArgs, HostFn, HostResult, TaskArgs, Worker};
    ///
    /// fn step(_args: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(2).build()?;
    /// let step = worker.register(HostFn::new("step", step))?;
    /// worker.init()?;
    /// let run = worker.submit(|orch| {
    ///     let group: Vec<TaskArgs> = vec![TaskArgs::new(), TaskArgs::new()];
    ///     orch.submit_sub_group(&step, group)?; // one task, two members
    ///     orch.submit_sub(&step, TaskArgs::new())?;
    ///     Ok(())
    /// })?;
    /// run.wait()?;
    /// let stats = run.stats().expect("done");
    /// assert_eq!(stats.tasks, 2);
    /// assert_eq!(stats.failed, 0);
    /// assert!(stats.wall > std::time::Duration::ZERO);
    /// # Ok(()) }
    /// ```
    pub fn stats(&self) -> Option<RunStats> {
        self.run.stats()
    }

    /// The captured DAG, when the run was submitted with capture on
    /// (`RunOptions::capture_dag`) and has finished building.
    ///
    /// ```no_run
    /// use simpler::{HostArgs, HostFn, HostResult, RunOptions, TaskArgs, Worker};
    ///
    /// fn step(_args: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(1).build()?;
    /// let step = worker.register(HostFn::new("step", step))?;
    /// worker.init()?;
    /// let chain = |orch: &mut simpler::Orchestrator<'_>| {
    ///     let first = orch.submit_sub(&step, TaskArgs::new())?;
    ///     let mut args = TaskArgs::new();
    ///     args.add_dep_wait(first);
    ///     orch.submit_sub(&step, args)?;
    ///     Ok(())
    /// };
    /// let plain = worker.submit(chain)?;
    /// assert!(plain.dag().is_none()); // not captured
    /// let captured = worker.submit_with(RunOptions::new().capture_dag(), |orch, _, _| chain(orch))?;
    /// let dag = captured.dag().expect("captured");
    /// assert_eq!(dag.graph().node_count(), 2);
    /// assert!(dag.has_edge(0, 1));
    /// println!("{}", dag.to_dot());
    /// # Ok(()) }
    /// ```
    pub fn dag(&self) -> Option<RunDag> {
        let cap = self.run.capture.as_ref()?;
        Some(sync::lock(cap).to_dag())
    }

    /// The run as it happened, once it has ended, when it was submitted with capture on
    /// (`RunOptions::capture_dag`): a [`TaskRecord`](crate::trace::TaskRecord) per task (where it
    /// ran; when it was submitted, became ready, started and ended; how it ended), and the
    /// Chrome trace, SVG and DOT pictures made from them. `None` before the run ends.
    ///
    /// ```no_run
    /// use simpler::{HostArgs, HostFn, HostResult, RunOptions, TaskArgs, trace::TaskStatus, Worker};
    ///
    /// fn step(_args: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(2).build()?;
    /// let step = worker.register(HostFn::new("step", step))?;
    /// worker.init()?;
    /// let run = worker.submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
    ///     let first = orch.submit_sub(&step, TaskArgs::new())?;
    ///     let mut args = TaskArgs::new();
    ///     args.add_dep(first);
    ///     orch.submit_sub(&step, args).map(|_| ())
    /// })?;
    /// run.wait()?;
    /// let timeline = run.timeline().expect("captured and ended");
    /// let [a, b] = timeline.records() else { panic!("two tasks") };
    /// assert!(a.worker.starts_with("sub worker") && a.status == TaskStatus::Completed);
    /// assert!(b.started_ns >= a.ended_ns); // b waited for a
    /// timeline.write_files("target/two-steps")?; // .json (Perfetto), .svg, .dot
    /// # Ok(()) }
    /// ```
    pub fn timeline(&self) -> Option<crate::dfx::timeline::Timeline> {
        self.run.timeline()
    }

    /// [`timeline`](Self::timeline) without what ran in other processes.
    pub(crate) fn own_timeline(&self) -> Option<crate::dfx::timeline::Timeline> {
        self.run.own_timeline()
    }

    /// The number of the engine that runs it.
    pub(crate) fn engine_id(&self) -> u64 {
        self.run.engine
    }

    /// How far the run has got, now: tasks submitted so far, completed and failed (including
    /// those that did not run), and whether the orchestration has finished submitting.
    /// Cheap (a few atomic loads): poll it from another thread for a progress bar.
    ///
    /// ```no_run
    /// # fn demo(worker: &simpler::Worker, f: &simpler::CallableHandle) -> simpler::Result<()> {
    /// use simpler::TaskArgs;
    /// let run = worker.submit(|orch| {
    ///     for _ in 0..1000 {
    ///         orch.submit_sub(f, TaskArgs::new())?;
    ///     }
    ///     Ok(())
    /// })?;
    /// loop {
    ///     let p = run.progress();
    ///     eprint!("\r{}/{} done, {} failed", p.completed, p.submitted, p.failed);
    ///     match run.wait_timeout(std::time::Duration::from_millis(100)) {
    ///         Err(e) if e.kind() == simpler::ErrorKind::Timeout => continue, // still running: report again
    ///         other => break other?,
    ///     }
    /// }
    /// let p = run.progress();
    /// assert_eq!((p.submitted, p.completed, p.failed, p.submitting), (1000, 1000, 0, false));
    /// # Ok(()) }
    /// ```
    pub fn progress(&self) -> RunProgress {
        RunProgress {
            submitted: self.run.tasks.load(Ordering::Relaxed),
            completed: self.run.completed.load(Ordering::Relaxed),
            failed: self.run.failed.load(Ordering::Relaxed),
            staged: self.run.staged.load(Ordering::Relaxed),
            submitting: !self.run.submission_closed.load(Ordering::SeqCst),
        }
    }
}

/// How far a run has got ([`RunHandle::progress`]).
///
/// ```
/// let p = simpler::status::RunProgress { submitted: 10, completed: 7, failed: 1, staged: 0, submitting: false };
/// assert_eq!(p.remaining(), 2);
/// assert!((p.fraction() - 0.8).abs() < 1e-9);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunProgress {
    /// Tasks submitted so far (allocations not counted).
    pub submitted: u64,
    /// Tasks that completed successfully.
    pub completed: u64,
    /// Tasks that failed, or did not run because a task they depend on failed or the run was
    /// stopped.
    pub failed: u64,
    /// Tasks staged now: prepared on a chip (their inputs copied in) while another run's task
    /// executes there; they start when this run is the oldest unfinished one or, for a run
    /// that dispatches before its turn (independent of the runs ahead), once the chip is free.
    pub staged: u64,
    /// Whether the orchestration is still submitting (the total may still grow).
    pub submitting: bool,
}

impl RunProgress {
    /// Tasks submitted and not ended yet.
    ///
    /// ```
    /// assert_eq!(simpler::status::RunProgress::default().remaining(), 0);
    /// ```
    pub fn remaining(&self) -> u64 {
        self.submitted.saturating_sub(self.completed + self.failed)
    }

    /// The share of the submitted tasks that have ended, from 0 to 1 (1 when none were
    /// submitted).
    ///
    /// ```
    /// let p = simpler::status::RunProgress { submitted: 4, completed: 1, failed: 0, staged: 0, submitting: true };
    /// assert_eq!(p.fraction(), 0.25);
    /// ```
    pub fn fraction(&self) -> f64 {
        if self.submitted == 0 {
            return 1.0;
        }
        (self.completed + self.failed) as f64 / self.submitted as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_seen_done_already_has_its_statistics() {
        // Another thread spins on `is_done` and reads the statistics the moment it sees it:
        // they must be there (the end time is set before `done` is published).
        for _ in 0..20_000 {
            let run = Arc::new(RunState::new(1, false));
            let seen = run.clone();
            let reader = std::thread::spawn(move || {
                while !seen.is_done() {
                    std::hint::spin_loop();
                }
                seen.stats().is_some()
            });
            assert!(run.close_submission(), "closing an empty run finishes it");
            assert!(reader.join().unwrap(), "a run seen done had no statistics yet");
        }
    }
}
