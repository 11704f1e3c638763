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
    /// The lease it was dispatched under.
    pub(crate) lease: Option<crate::engine::lease::Lease>,
    /// Handed over to start on the worker's own (`chain` or `chain_after`), not started.
    pub(crate) chained: bool,
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
            lease: d.lease,
            chained: false,
        }
    }

    fn chained(lane: LaneKind, d: &Dispatch<'_>) -> Started {
        Started { chained: true, ..Started::new(lane, d) }
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

    fn chains(&self) -> bool {
        self.inner.chains()
    }

    fn chain(&mut self, d: &Dispatch<'_>, after: Option<u32>) -> Result<()> {
        self.inner.chain(d, after)
    }

    fn withdraw_chained(&mut self) {
        self.inner.withdraw_chained();
    }

    fn chain_key(&self) -> Option<u32> {
        self.inner.chain_key()
    }

    fn chain_after(&mut self, d: &Dispatch<'_>, key: u32) -> Result<()> {
        self.inner.chain_after(d, key)
    }

    fn settle_after(&mut self, go: bool) {
        self.inner.settle_after(go);
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
    /// The chained task's id: the running one once the running one's end was polled.
    chained: Option<u64>,
}

impl Faulty {
    pub(crate) fn new(plan: Arc<FaultPlan>, inner: Box<dyn Endpoint>) -> Faulty {
        Faulty { inner, plan, running: None, staged: None, chained: None }
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
        let ended = std::mem::replace(&mut self.running, self.chained.take());
        if let Some(id) = ended
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

    fn chains(&self) -> bool {
        self.inner.chains()
    }

    fn chain(&mut self, d: &Dispatch<'_>, after: Option<u32>) -> Result<()> {
        self.inner.chain(d, after)?;
        self.chained = Some(d.args.scalar_at(0).unwrap_or(0));
        Ok(())
    }

    fn withdraw_chained(&mut self) {
        self.inner.withdraw_chained();
    }

    fn chain_key(&self) -> Option<u32> {
        self.inner.chain_key()
    }

    fn chain_after(&mut self, d: &Dispatch<'_>, key: u32) -> Result<()> {
        self.inner.chain_after(d, key)?;
        self.running = Some(d.args.scalar_at(0).unwrap_or(0));
        Ok(())
    }

    fn settle_after(&mut self, go: bool) {
        self.inner.settle_after(go);
    }
}

/// A wait of a chaining lane's task for a task on another lane (`chain_after`, or `chain`
/// with a key), as the scheduler settles it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Wait {
    /// It waits for nothing (or its wait was settled: go).
    #[default]
    None,
    /// It waits for the task whose key this is ([`Endpoint::chain_key`]: its id).
    On(u32),
    /// Settled before the task ahead of it ended: it may start once that one succeeded.
    Go,
    /// Settled: it must not start.
    NoGo,
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
    /// A chaining lane's (as a SUB worker's) tasks handed over behind the running one, in
    /// order, each with its wait for a task on another lane (the first only).
    chained: VecDeque<(Started, Wait)>,
    /// `withdraw_chained` was called for the chained tasks.
    chained_withdrawn: bool,
    /// The running task waits for a task on another lane and has not started (it cannot be
    /// finished until settled).
    running_waits: Wait,
}

/// An endpoint whose tasks end only when the test says so ([`ManualControl::finish`]).
/// Everything happens on the scheduler's thread, so tests are fully deterministic.
pub(crate) struct ManualEndpoint {
    lane: LaneKind,
    state: Arc<Mutex<ManualState>>,
    /// It takes staged tasks (as a chip with two task frames).
    stages: bool,
    /// It takes chained tasks, up to [`CHAIN_DEPTH`](crate::engine::scheduler::CHAIN_DEPTH)
    /// (as a SUB worker's mailbox does, rule M13 of `ipc::mailbox`): it starts each itself when
    /// the task ahead of it succeeds and its wait for another lane's task, if any, is settled
    /// to go.
    chains: bool,
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
        (
            ManualEndpoint { lane, state: state.clone(), stages: false, chains: false },
            ManualControl { state, bell },
        )
    }

    /// One that takes chained tasks, as a SUB worker's mailbox does.
    pub(crate) fn chaining(lane: LaneKind, bell: Arc<Doorbell>) -> (ManualEndpoint, ManualControl) {
        let (mut ep, ctl) = ManualEndpoint::new(lane, bell);
        ep.chains = true;
        (ep, ctl)
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

    /// Ends the running task with `outcome` and rings the engine doorbell. On a chaining lane,
    /// the chained task then starts if that one succeeded, it was not withdrawn and its wait is
    /// not settled against it (if still unsettled, it waits, unstarted, as the running task);
    /// otherwise its worker answers it unrun ([`Outcome::NotRun`]).
    pub(crate) fn finish(&self, outcome: Outcome) -> Started {
        let started = {
            let mut st = self.lock();
            assert_eq!(
                st.running_waits,
                Wait::None,
                "ManualControl::finish: the running task has not started"
            );
            let t = st.running.take().expect("ManualControl::finish: no task is running on this lane");
            let ok = matches!(outcome, Outcome::Success);
            st.outcomes.push_back(outcome);
            // Each chained task starts behind its predecessor's success; behind a failure, a
            // withdraw or a wait settled against it, it and every one behind it are unrun.
            if let Some((next, wait)) = st.chained.pop_front() {
                if ok && !st.chained_withdrawn && wait != Wait::NoGo {
                    st.running_waits = if wait == Wait::Go { Wait::None } else { wait };
                    st.running = Some(next);
                } else {
                    let unrun = 1 + std::mem::take(&mut st.chained).len();
                    for _ in 0..unrun {
                        st.outcomes.push_back(Outcome::NotRun("not run: the task ahead of it failed".into()));
                    }
                }
            }
            if st.chained.is_empty() {
                st.chained_withdrawn = false;
            }
            t
        };
        self.bell.ring();
        started
    }

    /// The task chained behind the running one, with its wait.
    pub(crate) fn chained(&self) -> Option<(Started, Wait)> {
        self.lock().chained.front().cloned()
    }

    /// The ids of the tasks chained behind the running one, in order.
    pub(crate) fn chained_ids(&self) -> Vec<u64> {
        self.lock().chained.iter().map(|(s, _)| s.id()).collect()
    }

    /// Ends the test reported with `finish` that the scheduler has not yet polled.
    pub(crate) fn ends_unpolled(&self) -> usize {
        self.lock().outcomes.len()
    }

    /// What the running task waits for before it starts ([`Wait::None`]: it runs).
    pub(crate) fn running_waits(&self) -> Wait {
        self.lock().running_waits
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
            st.running_waits = Wait::None;
        }
        for _ in std::mem::take(&mut st.chained) {
            st.outcomes.push_back(Outcome::EndpointFailure(format!("{} was stopped", self.lane)));
        }
        true
    }

    fn chains(&self) -> bool {
        self.chains
    }

    fn chain(&mut self, d: &Dispatch<'_>, after: Option<u32>) -> Result<()> {
        let mut st = sync::lock(&self.state);
        let waits =
            st.running_waits != Wait::None || st.chained.iter().any(|(_, w)| matches!(w, Wait::On(_)));
        if !self.chains
            || st.running.is_none()
            || st.chained.len() >= crate::engine::scheduler::CHAIN_DEPTH
            || waits
            || (after.is_some() && !st.chained.is_empty())
        {
            return Err(crate::error::Error::state(format!("{} cannot take a chained task now", self.lane)));
        }
        let s = Started::chained(self.lane, d);
        st.history.push(s.clone());
        st.chained.push_back((s, after.map_or(Wait::None, Wait::On)));
        Ok(())
    }

    fn withdraw_chained(&mut self) {
        let mut st = sync::lock(&self.state);
        if !st.chained.is_empty() {
            st.chained_withdrawn = true;
        }
    }

    /// The running task's id: what a task chained after it on another lane waits on.
    fn chain_key(&self) -> Option<u32> {
        let st = sync::lock(&self.state);
        st.running.as_ref().filter(|_| self.chains).map(|s| s.id() as u32)
    }

    fn chain_after(&mut self, d: &Dispatch<'_>, key: u32) -> Result<()> {
        let mut st = sync::lock(&self.state);
        if !self.chains || st.running.is_some() || !st.chained.is_empty() || !st.outcomes.is_empty() {
            return Err(crate::error::Error::state(format!(
                "{} cannot take a task to run after another now",
                self.lane
            )));
        }
        let s = Started::chained(self.lane, d);
        st.history.push(s.clone());
        st.running = Some(s);
        st.running_waits = Wait::On(key);
        Ok(())
    }

    /// Settles the running task's wait if it has one (go: it starts; otherwise it ends
    /// unrun), else the chained task's. A chained task already answered unrun (the task ahead
    /// of it failed) has nothing left to settle, as a mailbox frame that ended.
    fn settle_after(&mut self, go: bool) {
        let mut st = sync::lock(&self.state);
        if let Wait::On(_) = st.running_waits {
            st.running_waits = Wait::None;
            if !go {
                st.running = None;
                st.outcomes.push_back(Outcome::NotRun("not run: it was withdrawn".into()));
            }
            return;
        }
        if let Some((_, wait @ Wait::On(_))) = st.chained.front_mut() {
            *wait = if go { Wait::Go } else { Wait::NoGo };
        }
    }

    fn stages(&self) -> bool {
        self.stages
    }

    fn stage(&mut self, d: &Dispatch<'_>) -> Result<()> {
        let mut st = sync::lock(&self.state);
        let s = Started::new(self.lane, d);
        assert!(self.stages, "{} cannot stage {s:?}", self.lane);
        assert!(st.staged.is_none(), "{} was given {s:?} to stage while it holds {:?}", self.lane, st.staged);
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
