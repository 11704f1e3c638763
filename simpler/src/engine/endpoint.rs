//! The boundary between the engine and a worker: the [`Endpoint`] trait.
//!
//! A lane owns one endpoint. The scheduler role holder is the only caller: it starts a task
//! with [`Endpoint::start`] and later collects the outcome with [`Endpoint::poll`], which must
//! never block. An endpoint that has something to report rings the engine doorbell so a sleeping
//! holder wakes up; a [`watched`](Endpoint::watched) one (a remote worker, whose reply sits in
//! a socket) is checked through [`Endpoint::ready`] while the holder keeps checking, and rings
//! only once told the holder sleeps ([`Endpoint::unwatched`]).

use crate::callable::identity::CallableHandle;
use crate::data::call_config::CallConfig;
use crate::data::task_args::TaskArgs;
use crate::error::Result;

/// What a lane hands its endpoint for one task (or one group member).
pub(crate) struct Dispatch<'a> {
    pub(crate) callable: &'a CallableHandle,
    pub(crate) args: &'a TaskArgs,
    /// `None` for the default config (most tasks): an endpoint that encodes the config can
    /// leave its all-zero encoding as is.
    pub(crate) config: Option<&'a CallConfig>,
    pub(crate) run: u64,
    pub(crate) task: u32,
    pub(crate) member: u32,
    /// The run is captured: a worker process that runs a run of its own for the task (a chip
    /// orchestration, a nested Worker) captures it too and leaves its records in the trace log
    /// (`sys::tracelog`), keyed by this process, `engine`, `run` and `task`.
    pub(crate) captured: bool,
    /// The number of the engine that dispatches it.
    pub(crate) engine: u64,
    /// The lease of the task's run (`engine::lease`): the FIFO head's, or the first
    /// successor's for a staged task; `None` where the engine mints none.
    pub(crate) lease: Option<crate::engine::lease::Lease>,
    /// Another run is in flight behind this one: a worker that can prepare a staged successor
    /// beside a running task should run this one where it still watches for one.
    pub(crate) overlap: bool,
}

/// How a dispatched task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The task ran and succeeded.
    Success,
    /// The task ran (or was refused by its target) and failed with this message.
    TaskFailure(String),
    /// The task could not run: its target ran out of a fixed-size resource (device memory).
    ResourceExhausted(String),
    /// The task failed because a worker below its target died (a SUB worker or chip of a
    /// nested Worker); the target itself lives on.
    WorkerDied(String),
    /// The worker itself is gone or broke its protocol; the lane is dead from now on.
    EndpointFailure(String),
}

/// One worker as the engine sees it.
pub(crate) trait Endpoint: Send {
    /// Starts a task. An error fails the task at once (the endpoint stays usable).
    fn start(&mut self, dispatch: &Dispatch<'_>) -> Result<()>;
    /// The outcome of the running task, if it has ended. Never blocks.
    fn poll(&mut self) -> Option<Outcome>;
    /// Stops the worker (close). Must not block for long.
    fn shutdown(&mut self) {}

    /// Stops the worker now, whatever it is doing: its run passed its deadline or was
    /// cancelled. Returns true when the worker was told to stop (a child process is killed); its
    /// end is then reported as for any death (`poll` returns [`Outcome::EndpointFailure`], or
    /// `gone` answers), so the lane leaves service by the usual path. Returns false when this
    /// endpoint cannot stop its worker (a thread of this process): the scheduler then abandons
    /// the run and the task finishes in the background. Must not block.
    fn stop(&mut self) -> bool {
        false
    }

    /// What [`stop`](Endpoint::stop) does to the worker, for the stopped run's error.
    fn stopping(&self) -> &'static str {
        "the worker process is killed"
    }

    /// Why the worker is known to be gone while no task runs on it (`None`: alive, as far as
    /// is known). Called on every pass for each idle lane, so it must be cheap and never
    /// block; a lane whose endpoint answers `Some` leaves service before it is given a task.
    fn gone(&self) -> Option<String> {
        None
    }

    /// The CPU (plus one) the worker last ran on, if known: a hint that lets a waiting driver
    /// keep checking (peer on another CPU) or yield at once (peer on this CPU).
    fn peer_cpu(&self) -> Option<u32> {
        None
    }

    /// Whether the worker's outcome must be looked for (with [`Endpoint::ready`]) while a task
    /// runs: true for an endpoint whose outcome a driver that keeps checking takes itself
    /// (a remote worker's socket), false for one that rings the doorbell (the default).
    fn watched(&self) -> bool {
        false
    }

    /// For a [`watched`](Endpoint::watched) endpoint with a task running: whether `poll` may
    /// have something to take now. A cheap hint a driver checks while it keeps checking; it
    /// must not stay true unless `poll` makes progress. Never blocks.
    fn ready(&self) -> bool {
        false
    }

    /// For a [`watched`](Endpoint::watched) endpoint with a task running: the role holder
    /// stops checking and sleeps on the doorbell, so from now on the endpoint must ring it when
    /// its outcome comes. Never blocks.
    fn unwatched(&self) {}

    // ---- staging: a successor run's task prepared beside the running one (two-frame lanes)

    /// Whether this worker can hold a staged task: one of the FIFO's first successor run,
    /// handed over while a task of the head run may be running, prepared beside it, and
    /// launched only when [`activate`](Endpoint::activate)d. Chips started with a pipeline
    /// depth of 2 can; SUB workers, nested Workers and remote ones cannot.
    fn stages(&self) -> bool {
        false
    }

    /// Hands over a staged task (at most one at a time). An error fails the task at once.
    fn stage(&mut self, _dispatch: &Dispatch<'_>) -> Result<()> {
        Err(crate::error::Error::state("this worker cannot stage a task"))
    }

    /// Lets the staged task launch: its run is the head now and no task runs here. True when
    /// it was activated (it is the running task from now on: [`poll`](Endpoint::poll) reports
    /// its end); false when it is not prepared yet (ask again on a later pass) or ended
    /// already ([`poll_staged`](Endpoint::poll_staged) reports that). Never blocks.
    fn activate(&mut self) -> bool {
        false
    }

    /// When the worker had the staged task prepared (`CLOCK_MONOTONIC` ns), once it has.
    fn prepared(&self) -> Option<u64> {
        None
    }

    /// The end of the staged task before it was activated (it failed to prepare, was
    /// withdrawn, or the worker died), if it ended. Never blocks.
    fn poll_staged(&mut self) -> Option<Outcome> {
        None
    }

    /// Withdraws the staged task (its run was stopped): it ends unlaunched, reported by
    /// [`poll_staged`](Endpoint::poll_staged). Never blocks.
    fn withdraw(&mut self) {}
}

#[cfg(test)]
pub(crate) mod testing {
    //! In-process endpoints for engine tests: each runs tasks on its own thread.

    use std::collections::{HashSet, VecDeque};
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex, MutexGuard};

    use crate::sys::sync;
    use std::thread;

    use super::*;
    use crate::engine::scheduler::LaneKind;
    use crate::sys::futex::Doorbell;

    /// What a test endpoint does with a task: `Ok` or a failure message.
    pub(crate) type Behaviour =
        Arc<dyn Fn(&str, &TaskArgs, u32) -> std::result::Result<(), String> + Send + Sync>;

    /// A task as the test endpoint received it.
    pub(crate) struct Job {
        pub(crate) name: String,
        pub(crate) args: TaskArgs,
        pub(crate) member: u32,
    }

    /// Runs each task on a worker thread and rings `bell` when it ends.
    pub(crate) struct ThreadEndpoint {
        tx: Option<mpsc::Sender<Job>>,
        rx: mpsc::Receiver<Outcome>,
        handle: Option<thread::JoinHandle<()>>,
    }

    impl ThreadEndpoint {
        pub(crate) fn new(bell: Arc<Doorbell>, behaviour: Behaviour) -> ThreadEndpoint {
            let (tx, jobs) = mpsc::channel::<Job>();
            let (done_tx, rx) = mpsc::channel();
            let handle = thread::spawn(move || {
                for job in jobs {
                    let out = match behaviour(&job.name, &job.args, job.member) {
                        Ok(()) => Outcome::Success,
                        Err(m) => Outcome::TaskFailure(m),
                    };
                    let _ = done_tx.send(out);
                    bell.ring();
                }
            });
            ThreadEndpoint { tx: Some(tx), rx, handle: Some(handle) }
        }
    }

    impl Endpoint for ThreadEndpoint {
        fn start(&mut self, d: &Dispatch<'_>) -> Result<()> {
            let job = Job { name: d.callable.name().to_string(), args: d.args.clone(), member: d.member };
            self.tx.as_ref().expect("not shut down").send(job).expect("worker thread alive");
            Ok(())
        }

        fn poll(&mut self) -> Option<Outcome> {
            self.rx.try_recv().ok()
        }

        fn shutdown(&mut self) {
            self.tx = None;
            if let Some(h) = self.handle.take() {
                let _ = h.join();
            }
        }
    }

    /// A task as a lane dispatched it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) struct Started {
        pub(crate) lane: LaneKind,
        pub(crate) name: String,
        pub(crate) run: u64,
        pub(crate) task: u32,
        pub(crate) member: u32,
        pub(crate) scalars: Vec<u64>,
    }

    impl Started {
        fn new(lane: LaneKind, d: &Dispatch<'_>) -> Started {
            Started {
                lane,
                name: d.callable.name().to_string(),
                run: d.run,
                task: d.task,
                member: d.member,
                scalars: d.args.scalars().to_vec(),
            }
        }

        /// The first scalar (tests use it as the task's id).
        pub(crate) fn id(&self) -> u64 {
            self.scalars.first().copied().unwrap_or(0)
        }
    }

    /// Dispatches in the order the scheduler made them, across lanes.
    pub(crate) type StartLog = Arc<Mutex<Vec<Started>>>;

    /// Records every dispatch synchronously (inside the scheduler pass), then forwards it.
    pub(crate) struct Logged {
        inner: Box<dyn Endpoint>,
        lane: LaneKind,
        log: StartLog,
    }

    impl Logged {
        pub(crate) fn new(lane: LaneKind, log: StartLog, inner: Box<dyn Endpoint>) -> Logged {
            Logged { inner, lane, log }
        }
    }

    impl Endpoint for Logged {
        fn start(&mut self, d: &Dispatch<'_>) -> Result<()> {
            sync::lock(&self.log).push(Started::new(self.lane, d));
            self.inner.start(d)
        }

        fn poll(&mut self) -> Option<Outcome> {
            self.inner.poll()
        }

        fn shutdown(&mut self) {
            self.inner.shutdown();
        }

        fn stop(&mut self) -> bool {
            self.inner.stop()
        }

        fn stages(&self) -> bool {
            self.inner.stages()
        }

        fn stage(&mut self, d: &Dispatch<'_>) -> Result<()> {
            self.inner.stage(d)
        }

        fn activate(&mut self) -> bool {
            self.inner.activate()
        }

        fn prepared(&self) -> Option<u64> {
            self.inner.prepared()
        }

        fn poll_staged(&mut self) -> Option<Outcome> {
            self.inner.poll_staged()
        }

        fn withdraw(&mut self) {
            self.inner.withdraw();
        }
    }

    /// Which tasks (by id, their first scalar) make a [`Faulty`] endpoint panic, and where.
    #[derive(Default)]
    pub(crate) struct FaultPlan {
        /// Ids whose `start` panics (before the task reaches the wrapped endpoint).
        pub(crate) start: Mutex<HashSet<u64>>,
        /// Ids whose `poll` panics when it would report the task's end (the outcome is lost).
        pub(crate) poll: Mutex<HashSet<u64>>,
        /// Ids whose `activate` panics while they are staged.
        pub(crate) activate: Mutex<HashSet<u64>>,
        /// Ids whose `withdraw` panics while they are staged.
        pub(crate) withdraw: Mutex<HashSet<u64>>,
    }

    impl FaultPlan {
        fn hits(set: &Mutex<HashSet<u64>>, id: u64) -> bool {
            let set = sync::lock(set);
            set.contains(&id)
        }
    }

    /// Forwards to another endpoint, and panics where its [`FaultPlan`] says.
    pub(crate) struct Faulty {
        inner: Box<dyn Endpoint>,
        plan: Arc<FaultPlan>,
        running: Option<u64>,
        staged: Option<u64>,
    }

    impl Faulty {
        pub(crate) fn new(plan: Arc<FaultPlan>, inner: Box<dyn Endpoint>) -> Faulty {
            Faulty { inner, plan, running: None, staged: None }
        }
    }

    impl Endpoint for Faulty {
        fn start(&mut self, d: &Dispatch<'_>) -> Result<()> {
            let id = d.args.scalar_at(0).unwrap_or(0);
            if FaultPlan::hits(&self.plan.start, id) {
                panic!("injected panic in start of task {id}");
            }
            self.inner.start(d)?;
            self.running = Some(id);
            Ok(())
        }

        fn poll(&mut self) -> Option<Outcome> {
            let outcome = self.inner.poll()?;
            if let Some(id) = self.running.take()
                && FaultPlan::hits(&self.plan.poll, id)
            {
                panic!("injected panic in poll of task {id}");
            }
            Some(outcome)
        }

        fn shutdown(&mut self) {
            self.inner.shutdown();
        }

        fn stop(&mut self) -> bool {
            self.inner.stop()
        }

        fn stages(&self) -> bool {
            self.inner.stages()
        }

        fn stage(&mut self, d: &Dispatch<'_>) -> Result<()> {
            self.inner.stage(d)?;
            self.staged = Some(d.args.scalar_at(0).unwrap_or(0));
            Ok(())
        }

        fn activate(&mut self) -> bool {
            if let Some(id) = self.staged
                && FaultPlan::hits(&self.plan.activate, id)
            {
                panic!("injected panic in activate of task {id}");
            }
            let on = self.inner.activate();
            if on {
                self.running = self.staged.take();
            }
            on
        }

        fn prepared(&self) -> Option<u64> {
            self.inner.prepared()
        }

        fn poll_staged(&mut self) -> Option<Outcome> {
            let outcome = self.inner.poll_staged()?;
            self.staged = None;
            Some(outcome)
        }

        fn withdraw(&mut self) {
            if let Some(id) = self.staged
                && FaultPlan::hits(&self.plan.withdraw, id)
            {
                panic!("injected panic in withdraw of task {id}");
            }
            self.inner.withdraw();
        }
    }

    #[derive(Default)]
    struct ManualState {
        running: Option<Started>,
        outcomes: VecDeque<Outcome>,
        history: Vec<Started>,
        /// `stop` cannot stop this lane's worker (as a thread of this process).
        unstoppable: bool,
        /// Times `stop` was called.
        stops: usize,
        /// The staged task (a staging lane's), until it is activated or ends.
        staged: Option<Started>,
        /// The test said the staged task is prepared.
        prepared: bool,
        /// Ends of staged tasks not yet reported by `poll_staged`.
        staged_outcomes: VecDeque<Outcome>,
        /// Calls of `withdraw` still to come that find the task not yet prepared and do
        /// nothing (as a child that is still preparing it: `Withdrawn::Late`).
        late_withdraws: usize,
        /// Times `withdraw` was called.
        withdraws: usize,
    }

    /// An endpoint whose tasks end only when the test says so ([`ManualControl::finish`]).
    /// Everything happens on the scheduler's thread, so tests are fully deterministic.
    pub(crate) struct ManualEndpoint {
        lane: LaneKind,
        state: Arc<Mutex<ManualState>>,
        /// It takes staged tasks (as a chip with two task frames).
        stages: bool,
    }

    /// The test's side of a [`ManualEndpoint`].
    #[derive(Clone)]
    pub(crate) struct ManualControl {
        state: Arc<Mutex<ManualState>>,
        bell: Arc<Doorbell>,
    }

    impl ManualEndpoint {
        pub(crate) fn new(lane: LaneKind, bell: Arc<Doorbell>) -> (ManualEndpoint, ManualControl) {
            let state = Arc::new(Mutex::new(ManualState::default()));
            (ManualEndpoint { lane, state: state.clone(), stages: false }, ManualControl { state, bell })
        }

        /// One that takes staged tasks: they are prepared when the test says
        /// ([`ManualControl::prepare`]) and run, once activated, like a started task.
        pub(crate) fn staging(lane: LaneKind, bell: Arc<Doorbell>) -> (ManualEndpoint, ManualControl) {
            let (mut ep, ctl) = ManualEndpoint::new(lane, bell);
            ep.stages = true;
            (ep, ctl)
        }
    }

    impl ManualControl {
        fn lock(&self) -> MutexGuard<'_, ManualState> {
            sync::lock(&self.state)
        }

        /// The task this lane runs now (started and not yet finished by the test).
        pub(crate) fn running(&self) -> Option<Started> {
            self.lock().running.clone()
        }

        /// Every task this lane was given, in order.
        pub(crate) fn history(&self) -> Vec<Started> {
            self.lock().history.clone()
        }

        /// Makes `stop` fail to stop this lane's worker (as for a thread of this process).
        pub(crate) fn set_unstoppable(&self) {
            self.lock().unstoppable = true;
        }

        /// Times the scheduler called `stop` on this lane.
        pub(crate) fn stops(&self) -> usize {
            self.lock().stops
        }

        /// The task staged on this lane now (handed over, not yet activated or ended).
        pub(crate) fn staged(&self) -> Option<Started> {
            self.lock().staged.clone()
        }

        /// Reports the staged task prepared and rings the engine doorbell.
        pub(crate) fn prepare(&self) {
            {
                let mut st = self.lock();
                assert!(st.staged.is_some(), "ManualControl::prepare: nothing is staged on this lane");
                st.prepared = true;
            }
            self.bell.ring();
        }

        /// The next `n` calls of `withdraw` come too late to take the staged task back (it is
        /// still being prepared) and do nothing.
        pub(crate) fn set_late_withdraws(&self, n: usize) {
            self.lock().late_withdraws = n;
        }

        /// Times the scheduler called `withdraw` on this lane.
        pub(crate) fn withdraws(&self) -> usize {
            self.lock().withdraws
        }

        /// Ends the running task with `outcome` and rings the engine doorbell.
        pub(crate) fn finish(&self, outcome: Outcome) -> Started {
            let started = {
                let mut st = self.lock();
                let t = st.running.take().expect("ManualControl::finish: no task is running on this lane");
                st.outcomes.push_back(outcome);
                t
            };
            self.bell.ring();
            started
        }
    }

    impl Endpoint for ManualEndpoint {
        fn start(&mut self, d: &Dispatch<'_>) -> Result<()> {
            let mut st = sync::lock(&self.state);
            let s = Started::new(self.lane, d);
            assert!(
                st.running.is_none() && st.outcomes.is_empty(),
                "{} was given {s:?} while still busy with {:?}",
                self.lane,
                st.running
            );
            st.running = Some(s.clone());
            st.history.push(s);
            Ok(())
        }

        fn poll(&mut self) -> Option<Outcome> {
            sync::lock(&self.state).outcomes.pop_front()
        }

        /// Like a killed child: the running task ends as the worker's death (the lane leaves
        /// service); unless the test made this lane unstoppable.
        fn stop(&mut self) -> bool {
            let mut st = sync::lock(&self.state);
            st.stops += 1;
            if st.unstoppable {
                return false;
            }
            if st.running.take().is_some() {
                st.outcomes.push_back(Outcome::EndpointFailure(format!("{} was stopped", self.lane)));
            }
            true
        }

        fn stages(&self) -> bool {
            self.stages
        }

        fn stage(&mut self, d: &Dispatch<'_>) -> Result<()> {
            let mut st = sync::lock(&self.state);
            let s = Started::new(self.lane, d);
            assert!(self.stages, "{} cannot stage {s:?}", self.lane);
            assert!(
                st.staged.is_none(),
                "{} was given {s:?} to stage while it holds {:?}",
                self.lane,
                st.staged
            );
            st.staged = Some(s);
            st.prepared = false;
            Ok(())
        }

        fn activate(&mut self) -> bool {
            let mut st = sync::lock(&self.state);
            if st.staged.is_none() || !st.prepared || st.running.is_some() || !st.outcomes.is_empty() {
                return false;
            }
            let s = st.staged.take();
            st.prepared = false;
            st.history.extend(s.clone());
            st.running = s;
            true
        }

        fn prepared(&self) -> Option<u64> {
            let st = sync::lock(&self.state);
            (st.staged.is_some() && st.prepared).then_some(1)
        }

        fn poll_staged(&mut self) -> Option<Outcome> {
            sync::lock(&self.state).staged_outcomes.pop_front()
        }

        fn withdraw(&mut self) {
            let mut st = sync::lock(&self.state);
            st.withdraws += 1;
            if st.late_withdraws > 0 {
                st.late_withdraws -= 1;
                return;
            }
            if st.staged.take().is_some() {
                st.prepared = false;
                st.staged_outcomes.push_back(Outcome::TaskFailure(format!("{}: withdrawn", self.lane)));
            }
        }
    }
}
