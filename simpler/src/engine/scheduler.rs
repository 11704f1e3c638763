//! The Scheduler: ready queues, lanes, dispatch and completion.
//!
//! Queues are partitioned by run; the run at the head of the admission FIFO dispatches, and a
//! run behind it only once it is *independent* of every live run ahead of it (its submission
//! closed, no buffer in common with an unfinished task ahead where either side writes, and
//! the leases it needs free; [`Scheduler::dispatch_independent`], issue 31), so two runs' effects on one buffer
//! never interleave while a hung run holds only its own workers, lease and admission place. Per pass: drain completions first (which may make
//! consumers READY), stop the runs whose deadline passed or whose cancel waits
//! ([`Scheduler::stop_run`]), take newly published READY tasks from the inbox, then dispatch: the
//! NEXT_LEVEL group FIFO head (all targets idle, or it reserves them against new singles), each
//! idle and unreserved NEXT_LEVEL worker's own FIFO head, then SUB work on any idle SUB worker
//! (a SUB group takes N distinct idle ones at once). No work stealing, no rebinding.
//!
//! One exception to "only the head dispatches", which changes no result: a lane whose endpoint
//! stages (a chip with two task frames) may hold one task of the first run behind the head,
//! handed over to be *prepared* (its inputs copied in) while the lane runs the head's task, and
//! launched only when it is activated, once its run is the head, or, for a run dispatching
//! before its turn, once the lane is free ([`Scheduler::stage_successor`],
//! [`Scheduler::activate_staged`]). It is staged only on a lane running a task of the head
//! (under the chip's other lease), and only when its inputs are final (the head has
//! closed its submission and none of its tasks that write those inputs is still to end) and no
//! READY group of its run needs that lane: a group reserves its targets for staging too, so
//! a staged single never overtakes it.
//!
//! Staging in detail (chip lanes when the lease depth is 2; groups, SUB work, nested and remote
//! Workers keep the single-frame path):
//!
//! * `stage_successor`, after the head's dispatch, gives each staging lane that holds none and
//!   runs a task of the head the first READY single task queued for it in the first successor
//!   run; `stage_independent` then gives each busy staging lane still without one the first
//!   READY single queued for it by a run dispatching before its turn (not of the running
//!   task's run, nor ahead of a READY group of its own run). "Inputs final" is
//!   `Engine::writer_pending`, from the TensorMap, which at a level whose lanes stage also
//!   records untracked writers (`NoDep` and static tensors that write, which order nothing);
//!   device tensors are read at launch, after the head, so they need no check. The task is
//!   RUNNING from then on, counted in flight.
//! * `activate_staged` (first in each pass) counts a staged task once the worker reports it
//!   prepared (`Endpoint::prepared`: `RunProgress::staged`, `TaskRecord::staged_ns`), and once
//!   its run is the head and nothing runs on the lane, activates it (`Endpoint::activate`),
//!   which makes it the lane's running task; until then the lane takes no other task of the
//!   head. A staged task of a run dispatching before its turn activates as soon as nothing runs
//!   on the lane, and the lane takes no other task of that run before it.
//! * A stopped run, and a run whose orchestration function failed (its tasks not started never
//!   start, as at depth 1), withdraws its staged tasks (`Endpoint::withdraw`, asked again each
//!   pass until the task ends: a worker still preparing it cannot give it back yet); a staged
//!   task of a stopped run, or of one abandoned after a panic, is never activated.
//! * A staged task that ends before activation (failed prepare, withdrawn, the child died) is
//!   reported by `Endpoint::poll_staged` and completes like any task; one on a lane that left
//!   service otherwise (its endpoint panicked) fails with `WorkerDied` at once.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::callable::identity::CallableKind;
use crate::engine::endpoint::{Dispatch, Endpoint, Outcome};
use crate::engine::run::{RunState, StopCause};
use crate::engine::slot::{Member, Slot, State, Target, TaskData};
use crate::engine::{Engine, EngineConfig};
use crate::error::{Error, ErrorKind, panic_message};
use crate::sys::futex::PeerWait;

/// What kind of worker a lane drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LaneKind {
    /// A SUB worker (host functions), numbered from 0.
    Sub(u32),
    /// A NEXT_LEVEL worker with this stable id.
    NextLevel(u32),
}

impl std::fmt::Display for LaneKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LaneKind::Sub(i) => write!(f, "sub worker {i}"),
            LaneKind::NextLevel(i) => write!(f, "worker {i}"),
        }
    }
}

/// The error of a task that never started because the scheduler stopped its run.
fn not_started(slot: &Slot) -> Error {
    let (kind, why) = match slot.run.first_error() {
        Some(e) => (e.kind(), e.message()),
        None => (ErrorKind::Cancelled, "its run was stopped"),
    };
    Error::new(kind, format!("{} did not run: {why}", slot.describe()))
}

/// `message` without a leading `"{name}: "` (the lane's name, which the caller says already).
fn strip_lane_name(name: &str, message: String) -> String {
    match message.strip_prefix(name).and_then(|rest| rest.strip_prefix(": ")) {
        Some(rest) => rest.to_string(),
        None => message,
    }
}

/// A duration as messages show it: whole milliseconds under a second as "200 ms", anything
/// else in `Duration`'s `Debug` form ("1.5s", "2.000001ms").
fn format_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) && d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{d:?}")
    }
}

/// One worker as the scheduler drives it.
pub(crate) struct Lane {
    pub(crate) kind: LaneKind,
    /// How messages name the worker ("sub worker 1", "chip 0", "remote worker 2 (ADDR)").
    name: Arc<str>,
    endpoint: Box<dyn Endpoint>,
    busy: Option<(Arc<Slot>, u32)>,
    dead: Option<String>,
    /// The task in flight's span (`simpler::task`, child of its run's span) and when it
    /// started, when a subscriber wants it.
    span: Option<(tracing::Span, std::time::Instant)>,
    /// The endpoint takes staged tasks ([`Endpoint::stages`]).
    stages: bool,
    /// The endpoint is [`watched`](Endpoint::watched) (asked once, at attach: a property of
    /// its kind).
    watched: bool,
    /// The staged task: one of the first successor run's, prepared beside the running one
    /// until its run is the head and it is activated.
    staged: Option<(Arc<Slot>, u32)>,
    /// The staged task's run is the head now and it waits for activation: the lane takes no
    /// other task meanwhile (set each pass).
    held: bool,
    /// The worker reported the staged task prepared (counted in its run's `staged`).
    prepared: bool,
    /// The endpoint takes chained tasks ([`Endpoint::chains`]: a SUB worker).
    chains: bool,
    /// The chained tasks, in order, at most [`CHAIN_DEPTH`]: each of the running task's run,
    /// whose unfinished producers are tasks ahead of it here (the first: the running task, and
    /// at most one task running on another lane, `chained_after`) (CHAINED, rule 5 of `slot`).
    /// The worker starts each itself once the one ahead succeeded; the first is the running
    /// task once the running one's end was polled.
    chained: VecDeque<Arc<Slot>>,
    /// The running task is a chained one that did not launch (the task ahead of it failed:
    /// it is still CHAINED): its end, whatever it says, fails it as poisoned by this error.
    unlaunched: Option<Error>,
    /// The running task is CHAINED after this task on another SUB worker (handed over with
    /// [`Endpoint::chain_after`], or chained with `chained_after` behind a task that ended
    /// first): the lane is not polled until that one's end settled it.
    after: Option<Arc<Slot>>,
    /// The chained task also waits for this task on another SUB worker (handed over with
    /// [`Endpoint::chain`] and its key), and whether that one's end settled it yet; unsettled
    /// when the running task ends, it becomes `after`.
    chained_after: Option<(Arc<Slot>, bool)>,
}

impl Lane {
    /// A lane that messages call `name` (what the worker is to the user: "chip 0").
    pub(crate) fn named(kind: LaneKind, endpoint: Box<dyn Endpoint>, name: String) -> Lane {
        let (stages, watched, chains) = (endpoint.stages(), endpoint.watched(), endpoint.chains());
        Lane {
            kind,
            name: Arc::from(name),
            endpoint,
            busy: None,
            dead: None,
            span: None,
            stages,
            watched,
            staged: None,
            held: false,
            prepared: false,
            chains,
            chained: VecDeque::new(),
            unlaunched: None,
            after: None,
            chained_after: None,
        }
    }

    // (A chained task is always behind a running one: `busy` covers it.)
    fn idle(&self) -> bool {
        self.busy.is_none() && self.dead.is_none() && !self.held
    }

    /// Whether it holds a task: running (and maybe some chained behind it) or staged.
    fn holds_any(&self) -> bool {
        self.busy.is_some() || self.staged.is_some()
    }

    /// Whether a task of `run` runs or is staged here (a lane out of service holds none: its
    /// worker is dead or cannot be trusted, and it takes no task until a new worker replaces it).
    fn holds_task_of(&self, run: &RunState) -> bool {
        self.runs_task_of(run) || self.stages_task_of(run)
    }

    /// Whether its running task is one of `run`'s.
    /// (A chained task is always of the running task's run.)
    fn runs_task_of(&self, run: &RunState) -> bool {
        self.busy.as_ref().is_some_and(|(s, _)| std::ptr::eq(Arc::as_ptr(&s.run), run))
    }

    /// Whether its staged task is one of `run`'s.
    fn stages_task_of(&self, run: &RunState) -> bool {
        self.staged.as_ref().is_some_and(|(s, _)| std::ptr::eq(Arc::as_ptr(&s.run), run))
    }

    /// Lets its worker start the task that waits for another lane's, or not
    /// ([`Endpoint::settle_after`]); a panic there takes the lane out of service (its task's
    /// end, when polled, says what happened).
    fn settle_after(&mut self, go: bool) {
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.endpoint.settle_after(go))) {
            let why = format!("its endpoint panicked in settle_after: {}", panic_message(&*panic));
            tracing::error!(target: "simpler::scheduler", worker = %self.name, "{why}; out of service");
            self.dead = Some(why);
        }
    }

    /// Asks its worker not to start its chained tasks ([`Endpoint::withdraw_chained`]); a
    /// panic there is logged (each chained task's end, when polled, says what happened).
    fn withdraw_chained(&mut self) {
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.endpoint.withdraw_chained())) {
            tracing::error!(target: "simpler::scheduler", worker = %self.name, "its endpoint panicked in withdraw_chained: {}", panic_message(&*panic));
        }
    }

    /// Whether it can take a task to stage now: its endpoint stages, it holds none staged,
    /// and it is in service.
    fn takes_staged(&self) -> bool {
        self.stages && self.staged.is_none() && self.dead.is_none()
    }

    /// Its endpoint takes staged tasks.
    pub(crate) fn stages(&self) -> bool {
        self.stages
    }

    /// Its endpoint takes chained tasks.
    pub(crate) fn chains(&self) -> bool {
        self.chains
    }
}

#[derive(Default)]
struct Partition {
    sub: VecDeque<Arc<Slot>>,
    single: Vec<VecDeque<Arc<Slot>>>,
    groups: VecDeque<Arc<Slot>>,
}

impl Partition {
    /// Whether a READY group of it needs next-level worker `w` (it reserves `w` against the
    /// run's singles and staging: a single never overtakes it).
    fn group_needs(&self, w: usize) -> bool {
        self.groups.iter().any(|g| {
            g.state() == State::Ready
                && matches!(&g.task().target, Target::NextLevel(ws) if ws.contains(&(w as u32)))
        })
    }

    fn len(&self) -> usize {
        self.sub.len() + self.groups.len() + self.single.iter().map(VecDeque::len).sum::<usize>()
    }

    /// Empties the queues (keeping their memory, for the next run) and returns how many
    /// entries it dropped.
    fn clear(&mut self) -> usize {
        let n = self.len();
        self.sub.clear();
        self.groups.clear();
        self.single.iter_mut().for_each(VecDeque::clear);
        n
    }
}

/// Emptied partitions kept for later runs (one per admitted run is the most ever needed at
/// once in steady state; a few more cover bursts).
const SPARE_PARTITIONS: usize = 4;

/// The chained tasks a SUB lane holds behind its running one, at most: as many as its worker's
/// mailbox has task frames besides the running task's (rule M13 of `ipc::mailbox`). A worker
/// that has `n` queued runs out of work every `n + 1`-th task, and so needs the driver that
/// much less often: in a chain on one worker (Task Bench's `no_comm` at W=2) the driver's
/// context switches fell from 10 000 to 6 700 (two deep) and 4 800 (three) per 20 000 steps,
/// and a step takes 0.91-0.97x the time three deep against two.
pub(crate) const CHAIN_DEPTH: usize = 3;

/// The scheduler's state; owned by the role holder.
pub(crate) struct Scheduler {
    lanes: Vec<Lane>,
    /// Lane index of each NEXT_LEVEL worker id.
    next_level: Vec<usize>,
    /// Lane indices of SUB workers.
    sub: Vec<usize>,
    /// NEXT_LEVEL workers are nested Workers (they run orchestration functions on children of
    /// their own).
    nested_next_level: bool,
    reserved: Vec<bool>,
    /// One partition per run with queued work, in run id order (the head run's first). A run
    /// has at most a few live partitions at once, so a short sorted deque beats a map; emptied
    /// partitions go to `spare` and are reused, so a run allocates no queues in steady state.
    parts: VecDeque<(u64, Partition)>,
    spare: Vec<Partition>,
    inbox: Receiver<Arc<Slot>>,
    in_flight: usize,
    /// READY entries in the partitions (stale ones included until popped).
    queued: usize,
    ready: Vec<Arc<Slot>>,
    /// Some lane takes staged tasks ([`Endpoint::stages`]).
    staging: bool,
    /// Some lane takes chained tasks ([`Endpoint::chains`]).
    chaining: bool,
    /// Lanes whose running task waits for a task on another lane (`Lane::after`).
    waiting_after: usize,
    /// Its endpoints were shut down (the Worker closed): no lane comes back into service.
    shut: bool,
    /// The head run last seen waiting for a pipeline lease (logged once).
    lease_wait: u64,
    /// Passes whose completions or stops changed some task's state (the TensorMap's answer to
    /// [`Engine::independent_of`] can change only then, or when `Engine::runs_epoch` moves).
    settled: u64,
    /// `(runs_epoch, settled)` when the runs behind the head were last checked for independence.
    checked: (u64, u64),
    /// The live runs, for one pass of [`Scheduler::dispatch_independent`] (kept empty between
    /// passes, so a finished run's state is reused; the memory is kept).
    live: Vec<Arc<RunState>>,
    /// A run behind the head was found independent and still dispatches ahead of its turn
    /// (as of the last pass of [`Scheduler::dispatch_independent`] that looked).
    ahead_of_turn: bool,
    /// Partitions made so far, and as of the end of that pass.
    parts_made: u64,
    parts_seen: u64,
}

impl Scheduler {
    pub(crate) fn new(cfg: &EngineConfig, inbox: Receiver<Arc<Slot>>) -> Scheduler {
        Scheduler {
            lanes: Vec::new(),
            next_level: Vec::new(),
            sub: Vec::new(),
            nested_next_level: cfg.next_level_kind == CallableKind::Orch,
            reserved: vec![false; cfg.next_level_workers],
            parts: VecDeque::new(),
            spare: Vec::new(),
            inbox,
            in_flight: 0,
            queued: 0,
            ready: Vec::new(),
            staging: false,
            chaining: false,
            waiting_after: 0,
            shut: false,
            lease_wait: 0,
            settled: 0,
            checked: (u64::MAX, 0),
            live: Vec::new(),
            ahead_of_turn: false,
            parts_made: 0,
            parts_seen: 0,
        }
    }

    /// How messages name the worker of lane `i`: its lane's name ("sub worker 1", "chip 0",
    /// "worker 2", "remote worker 3 (ADDR)"), as every other message and the timeline do.
    fn label(&self, i: usize) -> &str {
        &self.lanes[i].name
    }

    pub(crate) fn attach(&mut self, lanes: Vec<Lane>) {
        for lane in lanes {
            let idx = self.lanes.len();
            match lane.kind {
                LaneKind::Sub(_) => self.sub.push(idx),
                LaneKind::NextLevel(id) => {
                    let id = id as usize;
                    if self.next_level.len() <= id {
                        self.next_level.resize(id + 1, usize::MAX);
                        self.reserved.resize(id + 1, false);
                    }
                    self.next_level[id] = idx;
                }
            }
            self.staging |= lane.stages;
            self.chaining |= lane.chains;
            self.lanes.push(lane);
        }
    }

    /// Shuts every endpoint down; one that panics is logged and the others are still shut down.
    pub(crate) fn shutdown(&mut self) {
        self.shut = true;
        for lane in &mut self.lanes {
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| lane.endpoint.shutdown())) {
                tracing::error!(target: "simpler::scheduler", worker = %lane.name, "its endpoint panicked in shutdown: {}", panic_message(&*panic));
            }
        }
    }

    /// After a panic escaped a pass (rule 5 of the engine), with message `panic`: not one in an
    /// endpoint or in completion processing, which are contained where they happen, but in the
    /// scheduler's own bookkeeping. Which run it concerned is unknown and the queues may have
    /// lost entries, so every live run is abandoned with an [`ErrorKind::Internal`] error; the
    /// counts are rebuilt from the queues and the lanes, and the READY tasks of the abandoned
    /// runs are failed as their queues retire. Returns whether a run was abandoned.
    pub(crate) fn recover(&mut self, eng: &Engine, panic: &str) -> bool {
        self.queued = self.parts.iter().map(|(_, p)| p.len()).sum();
        self.in_flight = self
            .lanes
            .iter()
            .map(|l| usize::from(l.busy.is_some()) + usize::from(l.staged.is_some()) + l.chained.len())
            .sum();
        self.reserved.iter_mut().for_each(|r| *r = false);
        // A lane waiting for another's task may never be settled now (the panic may have cut
        // that end off): its worker is told not to start it, and its end fails it.
        for lane in &mut self.lanes {
            // Likewise a chained task's wait: it is asked not to start, and fails at its end.
            if let Some((_, settled @ false)) = &mut lane.chained_after {
                *settled = true;
                lane.settle_after(false);
            }
            if lane.after.take().is_some() {
                let (slot, _) = lane.busy.as_ref().expect("a lane waiting for another runs a task");
                let err = Error::new(
                    ErrorKind::Internal,
                    format!(
                        "run {}: {} did not run: the scheduler panicked: {panic}",
                        slot.run.id,
                        slot.describe()
                    ),
                );
                lane.unlaunched = Some(err);
                lane.settle_after(false);
            }
        }
        self.waiting_after = 0;
        let mut abandoned = false;
        for run in eng.live_runs() {
            let err = Error::new(
                ErrorKind::Internal,
                format!("run {}: the scheduler panicked during a pass: {panic}", run.id),
            );
            abandoned |= eng.abandon_run(&run, err);
        }
        let idle = self.lanes.iter().filter(|l| l.idle()).count();
        eng.set_outstanding(self.in_flight, self.queued, idle);
        abandoned
    }

    /// One scheduler pass. Returns whether anything happened.
    pub(crate) fn pass(&mut self, eng: &Engine) -> bool {
        let mut progress = self.drain_completions(eng);
        let mut taken = 0;
        // The count goes up before a send, so a send it does not show yet is taken next pass
        // (the publisher rings the doorbell after sending).
        if eng.stop_due() {
            progress |= self.stop_runs(eng);
        }
        if progress {
            self.settled = self.settled.wrapping_add(1);
        }
        // A quarantined lease comes back once no lane holds a task of its abandoned run (rule
        // L4 of `lease`): each one's end was reported (drained above), or its lane left service.
        if eng.has_quarantined() {
            let (lanes, next_level) = (&self.lanes, &self.next_level);
            progress |= eng.confirm_quarantined(|chip, run| match chip {
                // A chip's lease: only that chip's lane can hold a task under it.
                Some(w) => next_level.get(w as usize).is_some_and(|&l| lanes[l].holds_task_of(run)),
                None => lanes.iter().any(|l| l.holds_task_of(run)),
            });
        }
        if eng.inbox_pending() {
            let head = eng.head_run();
            while let Ok(slot) = self.inbox.try_recv() {
                taken += 1;
                // A task of a run behind the head may make it startable: checked again
                // (`dispatch_independent`), also when its queue was there already.
                if slot.run.id != head {
                    self.settled = self.settled.wrapping_add(1);
                }
                self.route_or_fail(eng, slot);
            }
        }
        if taken > 0 {
            eng.inbox_taken(taken);
            progress = true;
        }
        progress |= self.dispatch(eng);
        // Chains are looked for only when something changed (an end, new work, a dispatch, a
        // task published behind a running one): a driver's idle passes stay two loads.
        if self.chaining {
            let chance = eng.take_chain_chance();
            // A failed orchestration function raises a chance too: its chained tasks are
            // asked not to start (its tasks not started never do; a stopped run's were asked in
            // `stop_run`).
            if chance {
                self.withdraw_chains(RunState::build_failed);
            }
            if chance || progress {
                progress |= self.chain_successors(eng);
            }
        }
        let idle = self.lanes.iter().filter(|l| l.idle()).count();
        eng.set_outstanding(self.in_flight, self.queued, idle);
        progress
    }

    /// How a driver on `cpu` waits for its busy workers: keep checking when some may run on
    /// another CPU (unknown counts as other) and fewer are busy on this machine than it has
    /// CPUs; sleep
    /// at once when every one shares this CPU and is a nested Worker (its own children need the
    /// CPU); yield otherwise ([`PeerWait::for_peers`]).
    pub(crate) fn peer_wait(&self, cpu: u32) -> PeerWait {
        let busy = self.lanes.iter().filter(|l| l.busy.is_some());
        let has_children = |l: &Lane| self.nested_next_level && matches!(l.kind, LaneKind::NextLevel(_));
        // A hint only: an endpoint that panics giving it counts as one whose CPU is unknown.
        let cpu_of = |l: &Lane| catch_unwind(AssertUnwindSafe(|| l.endpoint.peer_cpu())).unwrap_or(None);
        PeerWait::for_peers(
            cpu,
            crate::sys::futex::available_cpus(),
            busy.map(|l| (cpu_of(l), has_children(l))),
        )
    }

    /// Whether a busy lane's endpoint is [`watched`](Endpoint::watched): its outcome is found
    /// by checking [`Scheduler::ready`], not only by the doorbell.
    pub(crate) fn watching(&self) -> bool {
        self.lanes.iter().any(|l| l.watched && l.busy.is_some())
    }

    /// Whether a busy, watched lane's endpoint may have an outcome to take (a pass polls it).
    pub(crate) fn ready(&self) -> bool {
        self.lanes.iter().any(|l| l.watched && l.busy.is_some() && Self::hint(|| l.endpoint.ready()))
    }

    /// The role holder is about to sleep on the doorbell: each busy, watched lane's endpoint
    /// must ring it from now on. One that panics is logged (its next `poll` decides its fate).
    pub(crate) fn unwatch(&self) {
        for l in self.lanes.iter().filter(|l| l.watched && l.busy.is_some()) {
            let told = catch_unwind(AssertUnwindSafe(|| l.endpoint.unwatched()));
            if let Err(panic) = told {
                tracing::error!(target: "simpler::scheduler", worker = %l.name, "its endpoint panicked in unwatched: {}", panic_message(&*panic));
            }
        }
    }

    /// A hint from an endpoint; one that panics giving it counts as false.
    fn hint(f: impl FnOnce() -> bool) -> bool {
        catch_unwind(AssertUnwindSafe(f)).unwrap_or(false)
    }

    /// The partition of run `id`, made (or taken from the spares) if it has none.
    fn partition(&mut self, id: u64) -> &mut Partition {
        // Newer runs are at the back; most routes go to the newest run or the head.
        let at = match self.parts.iter().rposition(|(r, _)| *r <= id) {
            Some(i) if self.parts[i].0 == id => i,
            found => {
                let at = found.map_or(0, |i| i + 1);
                let n_next = self.next_level.len();
                let mut part = self.spare.pop().unwrap_or_default();
                part.single.resize_with(n_next, VecDeque::new);
                self.parts.insert(at, (id, part));
                self.parts_made = self.parts_made.wrapping_add(1);
                at
            }
        };
        &mut self.parts[at].1
    }

    /// Drops a partition's (stale) entries and keeps its memory for a later run. The partition
    /// of a run that finished holds no READY task; one of a run abandoned after a panic
    /// (rule 5 of the engine) may: such tasks are failed (never run), so they are released.
    fn retire(&mut self, eng: &Engine, mut part: Partition) {
        let leftover = part.sub.iter().chain(&part.groups).chain(part.single.iter().flatten());
        for slot in leftover.filter(|s| s.state() == State::Ready) {
            let why = slot.run.first_error().map_or("its run was abandoned", |e| e.message());
            let err = Error::new(ErrorKind::Poisoned, format!("{} did not run: {why}", slot.describe()));
            eng.fail_unstarted(slot, err);
        }
        self.queued -= part.clear();
        if self.spare.len() < SPARE_PARTITIONS {
            self.spare.push(part);
        }
    }

    /// Queues a READY task, or fails it at once when the scheduler stopped its run (deadline
    /// or cancel): nothing of a stopped run is dispatched.
    fn route_or_fail(&mut self, eng: &Engine, slot: Arc<Slot>) {
        if !slot.run.is_stopped() {
            self.route(slot);
            return;
        }
        let err = not_started(&slot);
        eng.fail_unstarted(&slot, err);
    }

    /// Stops every live run whose deadline passed or whose cancel waits (see
    /// [`Scheduler::stop_run`]); returns whether it stopped any.
    fn stop_runs(&mut self, eng: &Engine) -> bool {
        let due = eng.runs_to_stop(Instant::now());
        for (run, cause) in &due {
            self.stop_run(eng, run, *cause);
        }
        if !due.is_empty() {
            eng.refresh_next_check();
        }
        !due.is_empty()
    }

    /// Stops `run` before its tasks ended: records its error (a [`ErrorKind::Timeout`] naming
    /// the deadline, or [`ErrorKind::Cancelled`]; each names the tasks still running, their
    /// callables and workers), marks it stopped so none of its tasks is dispatched any more,
    /// fails its queued READY tasks (never dispatched; their consumers are poisoned), and stops
    /// the workers running its tasks ([`Endpoint::stop`]): their deaths complete those tasks
    /// as failed and take the lanes out of service by the usual path, and then the run ends.
    /// A worker that cannot be stopped keeps its task; the run is abandoned (it ends now).
    fn stop_run(&mut self, eng: &Engine, run: &Arc<RunState>, cause: StopCause) {
        // (A chained task that did not launch is not running: its worker answers it unrun. One
        // waiting for another worker's task may have started: its worker sees that task's end
        // before this thread does.)
        let running: Vec<usize> = (0..self.lanes.len())
            .filter(|&i| {
                self.lanes[i].unlaunched.is_none()
                    && self.lanes[i].busy.as_ref().is_some_and(|(s, _)| Arc::ptr_eq(&s.run, run))
            })
            .collect();
        let names: Vec<String> = running
            .iter()
            .map(|&i| {
                let (slot, member) = self.lanes[i].busy.as_ref().expect("busy lane");
                let member = if slot.task().group { format!(" (member {member})") } else { String::new() };
                format!("{}{member} on {}", slot.describe(), self.label(i))
            })
            .collect();
        let (kind, what) = match cause {
            StopCause::Deadline(limit) => (
                ErrorKind::Timeout,
                format!("run {} did not finish within its deadline of {}", run.id, format_duration(limit)),
            ),
            StopCause::Cancelled => {
                (ErrorKind::Cancelled, format!("run {} was cancelled (RunHandle::cancel)", run.id))
            }
            StopCause::CancelledGracefully(_) => (
                ErrorKind::Cancelled,
                format!("run {} was cancelled gracefully (RunHandle::cancel_gracefully)", run.id),
            ),
            StopCause::GraceOver(limit) => {
                // The run's error was recorded when it was cancelled; its tasks still running
                // had their grace: stop them now.
                tracing::warn!(target: "simpler::scheduler", run_id = run.id, still_running = ?names, "the grace of a graceful cancel ({}) is over; stopping the run's tasks still running", format_duration(limit));
                let err = Error::new(
                    ErrorKind::Cancelled,
                    format!(
                        "run {} was cancelled gracefully and its tasks still running after {} were stopped: {}",
                        run.id,
                        format_duration(limit),
                        names.join(", ")
                    ),
                );
                if !self.stop_lanes(&running) {
                    eng.abandon_run(run, err);
                }
                return;
            }
        };
        let graceful = match cause {
            StopCause::CancelledGracefully(limit) => Some(limit),
            _ => None,
        };
        let staged: Vec<String> = (0..self.lanes.len())
            .filter_map(|i| {
                let (slot, _) = self.lanes[i].staged.as_ref()?;
                Arc::ptr_eq(&slot.run, run).then(|| format!("{} on {}", slot.describe(), self.label(i)))
            })
            .collect();
        let mut message = what;
        if let (Some(limit), false) = (graceful, names.is_empty()) {
            message.push_str(&format!(
                "; still running: {}; {} up to {} to end, then {} stopped",
                names.join(", "),
                if names.len() == 1 { "it has" } else { "they have" },
                format_duration(limit),
                if names.len() == 1 { "it is" } else { "they are" }
            ));
        } else if !names.is_empty() {
            let how: Vec<&str> = running.iter().map(|&i| self.lanes[i].endpoint.stopping()).collect();
            let how = if how.iter().all(|h| *h == how[0]) { how[0].to_string() } else { how.join("; ") };
            message.push_str(&format!(
                "; still running: {}; {} stopped ({how})",
                names.join(", "),
                if names.len() == 1 { "it was" } else { "they were" }
            ));
        }
        if !staged.is_empty() {
            message.push_str(&format!("; staged and not launched: {}; withdrawn", staged.join(", ")));
        }
        if names.is_empty() && staged.is_empty() {
            message.push_str("; no task of it was running");
            if run.lease.get().is_none() && eng.has_quarantined() {
                let held = eng.quarantined_leases();
                message.push_str(&format!(
                    " (it waited for a pipeline lease: every lease is quarantined until the tasks of abandoned runs end: {})",
                    held.join(", ")
                ));
            }
        }
        message.push_str("; its tasks not started do not run");
        let err = Error::new(kind, message);
        tracing::warn!(target: "simpler::scheduler", run_id = run.id, "{}", err.message());
        // First, so the run's error is this one rather than what the stopped tasks report.
        run.record_error(err.clone());
        run.mark_stopped(cause);
        // A `cancel` waiting for the stop while another thread holds the role sleeps on
        // `events`.
        eng.events.ring();
        // A graceful cancel lets its running tasks end (until `due` says the grace is over).
        let unstoppable = graceful.is_none() && !self.stop_lanes(&running);
        // Its chained tasks are asked not to start (one that started already runs on, as a
        // running task of a graceful cancel does; the others end unrun, as `NotRun`).
        self.withdraw_chains(|r| std::ptr::eq(r, Arc::as_ptr(run)));
        // Its staged tasks are given back unlaunched (their ends come through `poll_staged`;
        // `activate_staged` asks again for one the worker was still preparing).
        for i in 0..self.lanes.len() {
            if self.lanes[i].staged.as_ref().is_some_and(|(s, _)| Arc::ptr_eq(&s.run, run)) {
                self.withdraw_on(eng, i);
            }
        }
        let queued: Vec<Arc<Slot>> = self
            .parts
            .iter()
            .filter(|(id, _)| *id == run.id)
            .flat_map(|(_, p)| p.sub.iter().chain(&p.groups).chain(p.single.iter().flatten()))
            .filter(|s| s.state() == State::Ready)
            .cloned()
            .collect();
        for slot in queued {
            let err = not_started(&slot);
            eng.fail_unstarted(&slot, err);
        }
        if unstoppable {
            eng.abandon_run(run, err);
        }
    }

    /// Stops the workers of lanes `running` ([`Endpoint::stop`]); false when one could not be
    /// stopped (it keeps its task) or its endpoint panicked (it leaves service).
    fn stop_lanes(&mut self, running: &[usize]) -> bool {
        let mut stopped = true;
        for &i in running {
            match catch_unwind(AssertUnwindSafe(|| self.lanes[i].endpoint.stop())) {
                Ok(true) => {}
                Ok(false) => stopped = false,
                Err(panic) => {
                    let why = format!("its endpoint panicked in stop: {}", panic_message(&*panic));
                    tracing::error!(target: "simpler::scheduler", worker = %self.lanes[i].name, "{why}; out of service");
                    self.lanes[i].dead = Some(why);
                    stopped = false;
                }
            }
        }
        stopped
    }

    fn route(&mut self, slot: Arc<Slot>) {
        self.queued += 1;
        let part = self.partition(slot.run.id);
        let task = slot.task();
        match &task.target {
            Target::Sub => part.sub.push_back(slot),
            Target::NextLevel(_) if task.group => part.groups.push_back(slot),
            Target::NextLevel(ws) => {
                let w = ws[0] as usize;
                part.single[w].push_back(slot);
            }
        }
    }

    fn drain_completions(&mut self, eng: &Engine) -> bool {
        let mut progress = false;
        for i in 0..self.lanes.len() {
            // Its task waits for another lane's: polled once that one's end settled it.
            if self.lanes[i].after.is_some() {
                continue;
            }
            if self.lanes[i].staged.is_some() {
                let outcome = match catch_unwind(AssertUnwindSafe(|| self.lanes[i].endpoint.poll_staged())) {
                    Ok(None) => None,
                    Ok(Some(outcome)) => Some(Ok(outcome)),
                    Err(panic) => {
                        Some(Err(format!("its endpoint panicked in poll_staged: {}", panic_message(&*panic))))
                    }
                };
                if let Some(outcome) = outcome {
                    progress = true;
                    let (slot, member) = self.lanes[i].staged.take().expect("staged lane");
                    if std::mem::take(&mut self.lanes[i].prepared) {
                        slot.run.staged.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    self.in_flight -= 1;
                    self.record_outcome(eng, i, &slot, member, outcome, None);
                }
            }
            if self.lanes[i].busy.is_none() {
                if self.lanes[i].staged.is_none() {
                    progress |= self.check_idle(i);
                }
                continue;
            }
            // A chained task behind the one that ended is the running one now, and may have
            // ended too: polled again.
            // (Until a task it now waits for on another lane settled it.)
            while self.lanes[i].after.is_none() {
                let outcome = match catch_unwind(AssertUnwindSafe(|| self.lanes[i].endpoint.poll())) {
                    Ok(None) => break,
                    Ok(Some(outcome)) => Ok(outcome),
                    Err(panic) => Err(format!("its endpoint panicked in poll: {}", panic_message(&*panic))),
                };
                let outcome_lost = outcome.is_err();
                progress = true;
                let (slot, member) = self.lanes[i].busy.take().expect("busy lane");
                self.in_flight -= 1;
                let span = self.lanes[i].span.take();
                match self.lanes[i].unlaunched.take() {
                    Some(poison) => self.end_unlaunched(eng, i, &slot, &outcome, poison),
                    None => self.record_outcome(eng, i, &slot, member, outcome, span),
                }
                if self.waiting_after > 0 {
                    self.settle_waiters(&slot);
                }
                let lost = outcome_lost.then(|| self.lanes[i].dead.clone()).flatten();
                match (self.lanes[i].chained.pop_front(), lost) {
                    // The endpoint cannot be trusted to report the chained task's end.
                    (Some(next), Some(why)) => {
                        self.in_flight -= 1;
                        if let Some((_, false)) = self.lanes[i].chained_after.take() {
                            self.waiting_after -= 1;
                        }
                        self.lose_chained(eng, i, &next, &why);
                        while let Some(next) = self.lanes[i].chained.pop_front() {
                            self.in_flight -= 1;
                            self.lose_chained(eng, i, &next, &why);
                        }
                        break;
                    }
                    (Some(next), None) => self.promote_chained(i, &slot, next),
                    (None, _) => break,
                }
            }
        }
        progress |= !self.ready.is_empty();
        let mut ready = std::mem::take(&mut self.ready);
        for slot in ready.drain(..) {
            self.route_or_fail(eng, slot);
        }
        // Keep the memory; a failure above may have refilled `ready` (it is routed next pass).
        if self.ready.is_empty() {
            self.ready = ready;
        }
        progress
    }

    /// Task `slot` (member `member`) ended on lane `i` with `outcome` (`Err`: the endpoint
    /// panicked reporting it, with why): its result, its span's end event, its completion.
    fn record_outcome(
        &mut self,
        eng: &Engine,
        i: usize,
        slot: &Arc<Slot>,
        member: u32,
        outcome: std::result::Result<Outcome, String>,
        span: Option<(tracing::Span, std::time::Instant)>,
    ) {
        let lane_name = self.lanes[i].name.clone();
        // A worker's own message may start with its name ("chip 0: ..."): say it once.
        let outcome = outcome.map(|o| match o {
            Outcome::TaskFailure(m) => Outcome::TaskFailure(strip_lane_name(&lane_name, m)),
            Outcome::ResourceExhausted(m) => Outcome::ResourceExhausted(strip_lane_name(&lane_name, m)),
            Outcome::WorkerDied(m) => Outcome::WorkerDied(strip_lane_name(&lane_name, m)),
            other => other,
        });
        let result = match outcome {
            // Whether the task ended, and how, is lost, and the endpoint cannot be trusted:
            // the task fails and the lane leaves service (rule 5 of the engine).
            Err(why) => {
                tracing::error!(target: "simpler::scheduler", worker = %lane_name, "{why}; out of service");
                self.lanes[i].dead = Some(why.clone());
                Err(Error::new(
                    ErrorKind::Internal,
                    format!(
                        "run {}: {} failed on {lane_name}: {why}; {lane_name} is out of service",
                        slot.run.id,
                        slot.describe()
                    ),
                ))
            }
            Ok(Outcome::Success) => Ok(()),
            Ok(Outcome::TaskFailure(msg)) => Err(Error::new(
                ErrorKind::TaskFailed,
                format!("{} failed on {lane_name}: {msg}", slot.describe()),
            )),
            Ok(Outcome::ResourceExhausted(msg)) => Err(Error::new(
                ErrorKind::ResourceExhausted,
                format!("{} failed on {lane_name}: {msg}", slot.describe()),
            )),
            Ok(Outcome::WorkerDied(msg)) => Err(Error::new(
                ErrorKind::WorkerDied,
                format!("{} failed on {lane_name}: {msg}", slot.describe()),
            )),
            Ok(Outcome::EndpointFailure(msg)) => {
                self.lanes[i].dead = Some(msg.clone());
                Err(Error::new(
                    ErrorKind::WorkerDied,
                    format!("{} failed on {lane_name}: {msg}", slot.describe()),
                ))
            }
            // A chained task launched here and withdrawn before it started: its run was
            // stopped, or its orchestration function failed, or it was abandoned (a scheduler
            // panic: the run is done while its tasks still end).
            Ok(Outcome::NotRun(_)) if !slot.run.takes_tasks() => Err(not_started(slot)),
            Ok(Outcome::NotRun(msg)) => Err(Error::new(
                ErrorKind::Poisoned,
                format!("{} did not run on {lane_name}: {msg}", slot.describe()),
            )),
        };
        if let Some((span, since)) = span {
            let us = since.elapsed().as_secs_f64() * 1e6;
            let callable = slot.task().callable.name();
            match &result {
                Ok(()) => {
                    tracing::debug!(target: "simpler::task", parent: &span, callable, worker = %lane_name, duration_us = us, ok = true, "task completed")
                }
                Err(e) => {
                    tracing::debug!(target: "simpler::task", parent: &span, callable, worker = %lane_name, duration_us = us, ok = false, error = e.message(), "task failed")
                }
            }
        }
        self.finish_member(eng, slot, member, result);
    }

    /// The task ahead of chained task `next` on lane `i`, `ahead`, ended and was completed:
    /// `next` is the lane's running task now. It launched if `ahead` succeeded, which released
    /// its last fanin (CHAINED -> RUNNING, rule 5 of `slot`); otherwise it is still CHAINED and
    /// the worker does not run it (rule M13 of `ipc::mailbox`): its end fails it as poisoned.
    ///
    /// A chained task that also waits for a task on another lane (`Lane::chained_after`) that
    /// has not ended waits for it now (`Lane::after`) if `ahead` succeeded; if `ahead` failed,
    /// its worker answers it unrun without waiting.
    fn promote_chained(&mut self, i: usize, ahead: &Arc<Slot>, next: Arc<Slot>) {
        let goes_on = next.run.takes_tasks();
        let other = match self.lanes[i].chained_after.take() {
            Some((other, false)) if goes_on && next.unreleased() == 1 => {
                self.lanes[i].after = Some(other);
                self.lanes[i].busy = Some((next, 0));
                return;
            }
            Some((other, settled)) => {
                if !settled {
                    self.waiting_after -= 1;
                    self.lanes[i].settle_after(false);
                }
                Some(other)
            }
            None => None,
        };
        if next.launch_chained() {
            self.note_chained_launch(i, &next);
        } else {
            // The one that failed (the other task may have succeeded).
            let culprit = match other {
                Some(o) if o.lock().failure.is_some() => o,
                _ => ahead.clone(),
            };
            self.lanes[i].unlaunched = Some(Self::poisoned_behind(&culprit, &next));
        }
        self.lanes[i].busy = Some((next, 0));
    }

    /// Chained task `next` launched on lane `i` (CHAINED -> RUNNING): its timeline events,
    /// noted when its start is seen (after the worker started it), and its span.
    fn note_chained_launch(&mut self, i: usize, next: &Slot) {
        next.run.note(next.index, crate::dfx::timeline::TaskEvent::Ready);
        next.run.note(next.index, crate::dfx::timeline::TaskEvent::Started(&self.lanes[i].name));
        let task = next.task();
        tracing::trace!(target: "simpler::scheduler", run_id = next.run.id, task_index = next.index, callable = task.callable.name(), worker = %self.lanes[i].name, "chained task launched");
        let span = tracing::debug_span!(target: "simpler::task", parent: &next.run.span, "task", run_id = next.run.id, task_index = next.index, member = 0u32, callable = task.callable.name(), worker = %self.lanes[i].name);
        self.lanes[i].span = (!span.is_disabled()).then(|| (span, std::time::Instant::now()));
    }

    /// Why chained task `next` did not run: its run was stopped (a cancel, a deadline), its
    /// orchestration function failed or it was abandoned (done while its tasks still end),
    /// which is then what the task ahead of it failed of too;
    /// otherwise the task `ahead` of it failed (or, with no failure recorded, its run ended
    /// first).
    fn poisoned_behind(ahead: &Slot, next: &Slot) -> Error {
        if !next.run.takes_tasks() {
            return not_started(next);
        }
        match ahead.lock().failure.as_ref() {
            Some(e) => Error::new(
                ErrorKind::Poisoned,
                format!("{} did not run: {} failed: {}", next.describe(), ahead.describe(), e.message()),
            ),
            None => not_started(next),
        }
    }

    /// Task `ahead` ended and was completed: each lane whose running task waits for it
    /// (`Lane::after`) is settled. Its task launches if `ahead` succeeded, which released its
    /// last fanin (CHAINED -> RUNNING), unless its run was abandoned; otherwise its worker is
    /// told not to start it, and its end fails it, as for a chained task that did not launch.
    ///
    /// A lane whose chained task waits for it (`Lane::chained_after`), behind a task still
    /// running there, is settled too: that worker may start it once its own task succeeded
    /// if `ahead` succeeded (one fanin left); otherwise it is told not to.
    fn settle_waiters(&mut self, ahead: &Arc<Slot>) {
        for k in 0..self.sub.len() {
            let m = self.sub[k];
            let lane = &mut self.lanes[m];
            if let Some((other, settled @ false)) = &mut lane.chained_after
                && Arc::ptr_eq(other, ahead)
            {
                *settled = true;
                self.waiting_after -= 1;
                let next = lane.chained.front().expect("a lane whose chained task waits holds one");
                let go = next.run.takes_tasks() && next.unreleased() == 1;
                lane.settle_after(go);
                continue;
            }
            if !self.lanes[m].after.as_ref().is_some_and(|a| Arc::ptr_eq(a, ahead)) {
                continue;
            }
            self.lanes[m].after = None;
            self.waiting_after -= 1;
            let next = self.lanes[m].busy.as_ref().expect("a lane waiting for another runs a task").0.clone();
            // As for a chained task behind its worker's own: by the producer's end (the worker
            // may have started it already); a stopped run's or a failed orchestration's was
            // withdrawn, and its worker answers it unrun unless it had started.
            let go = !next.run.is_done() && next.launch_chained();
            if go {
                self.note_chained_launch(m, &next);
            } else {
                self.lanes[m].unlaunched = Some(Self::poisoned_behind(ahead, &next));
            }
            self.lanes[m].settle_after(go);
        }
    }

    /// Chained task `slot` of lane `i` can no longer be followed (its endpoint panicked,
    /// `why`): it fails (CHAINED -> PENDING -> FAILED, its consumers poisoned) and is never
    /// queued again, so it runs at most where it was handed.
    fn lose_chained(&mut self, eng: &Engine, i: usize, slot: &Arc<Slot>, why: &str) {
        let name = self.lanes[i].name.clone();
        let err = Error::new(
            ErrorKind::Internal,
            format!(
                "run {}: {} was chained on {name}: {why}; {name} is out of service",
                slot.run.id,
                slot.describe()
            ),
        );
        Self::fail_chained(eng, slot, err);
    }

    /// Chained task `slot` on lane `i`, which did not launch, ended with `outcome`: the worker
    /// answered it unrun (or died): it fails as `poison` says (CHAINED -> PENDING -> FAILED,
    /// its consumers poisoned), and a worker that died or broke its protocol leaves service.
    fn end_unlaunched(
        &mut self,
        eng: &Engine,
        i: usize,
        slot: &Arc<Slot>,
        outcome: &std::result::Result<Outcome, String>,
        poison: Error,
    ) {
        match outcome {
            Err(why) | Ok(Outcome::EndpointFailure(why)) => self.lanes[i].dead = Some(why.clone()),
            _ => {}
        }
        Self::fail_chained(eng, slot, poison);
    }

    /// Fails CHAINED task `slot`, which did not run, with `err` (CHAINED -> PENDING -> FAILED,
    /// its consumers poisoned); its run is abandoned if the engine panics doing so.
    fn fail_chained(eng: &Engine, slot: &Arc<Slot>, err: Error) {
        if slot.unchain() && catch_unwind(AssertUnwindSafe(|| eng.fail_unstarted(slot, err))).is_err() {
            let err = Error::new(
                ErrorKind::Internal,
                format!("run {}: the scheduler panicked while failing {}", slot.run.id, slot.describe()),
            );
            eng.abandon_run(&slot.run, err);
        }
    }

    /// Chains, on each SUB lane that runs a task and holds none chained, a task of the same
    /// run whose one unfinished producer is the running task (rule 5 of `slot`), and then
    /// maybe one more behind it ([`chain_deeper`](Self::chain_deeper), as on a lane that held
    /// one chained already): the worker starts each as soon as the one ahead succeeds, with no
    /// hand-off through this thread (a wake-up each way, the most a short task costs). Not
    /// while a READY SUB task waits in a queue (it goes first), not for a group or a run that
    /// was stopped, and not while the running task is a chained one that did not launch.
    fn chain_successors(&mut self, eng: &Engine) -> bool {
        if self.parts.iter().any(|(_, p)| !p.sub.is_empty()) {
            return false;
        }
        let mut progress = false;
        for k in 0..self.sub.len() {
            let i = self.sub[k];
            let lane = &self.lanes[i];
            if !lane.chains || lane.dead.is_some() {
                continue;
            }
            if !lane.chained.is_empty() {
                progress |= self.chain_deeper(eng, i);
                if self.lanes[i].dead.is_some() || self.idle_chaining_lane().is_none() {
                    continue;
                }
            }
            let lane = &self.lanes[i];
            let Some((ahead, _)) = &lane.busy else { continue };
            if ahead.task().group
                || ahead.state() != State::Running
                || ahead.run.is_done()
                || ahead.run.is_stopped()
                || ahead.run.build_failed()
            {
                continue;
            }
            let ahead = ahead.clone();
            // The running task's key, asked once (a hint: a panic counts as none).
            let mut key: Option<Option<u32>> = None;
            // Those waiting for it alone first: one that also waits for a task on another
            // lane may still go behind that one there (a tree step's two tasks both wait for
            // the same task, one of them also for its sibling).
            let mut consumers = ahead.consumers();
            // (A stable sort of a few entries: no allocation.)
            consumers.sort_by_key(|n| n.unreleased() != 1);
            for next in consumers {
                let sub_single = next.task.as_ref().is_some_and(TaskData::is_sub_single);
                if !sub_single || !Arc::ptr_eq(&next.run, &ahead.run) || next.state() != State::Pending {
                    continue;
                }
                // Behind it on its worker first; then on an idle worker, to start as soon as
                // that worker sees it succeed (a consumer of several tasks' outputs whose last
                // unfinished producer runs elsewhere).
                if self.lanes[i].chained.is_empty() {
                    // Its other unfinished producer, if it has one, must run on another lane.
                    let other = match next.unreleased() {
                        1 => Some(None),
                        2 => self.other_producer(i, &next).map(Some),
                        _ => None,
                    };
                    if let Some(other) = other
                        && next.chain_behind(1 + u32::from(other.is_some()))
                        && self.chain_on(eng, i, next, other)
                    {
                        progress = true;
                        // And maybe more behind it, in the same scan.
                        self.chain_deeper(eng, i);
                    }
                    if self.lanes[i].dead.is_some() {
                        break;
                    }
                    continue;
                }
                let Some(m) = self.idle_chaining_lane() else { break };
                let endpoint = &self.lanes[i].endpoint;
                let key = *key.get_or_insert_with(|| {
                    catch_unwind(AssertUnwindSafe(|| endpoint.chain_key())).unwrap_or(None)
                });
                let Some(key) = key else { break };
                if next.chain_behind(1) {
                    progress |= self.chain_after_on(eng, m, next, &ahead, key);
                }
            }
        }
        progress
    }

    /// Fills lane `i`, which holds a chained task, up to [`CHAIN_DEPTH`]: one task after
    /// another behind its last chained task ([`chain_one_deeper`](Self::chain_one_deeper)),
    /// while one is found and the lane stays in service. Returns whether anything happened.
    fn chain_deeper(&mut self, eng: &Engine, i: usize) -> bool {
        let mut progress = false;
        while self.lanes[i].dead.is_none() && self.chain_one_deeper(eng, i) {
            progress = true;
        }
        progress
    }

    /// Chains, on lane `i`, which holds a chained task and has room for one more
    /// ([`CHAIN_DEPTH`]), a task of the same run behind its last chained task whose unfinished
    /// producers all run or wait on this lane (a chain of tasks on one worker, each overwriting
    /// what the task two ahead wrote: its producers are the two tasks ahead of it). Not behind
    /// a task that waits for another lane's (its wait is settled one task at a time), nor behind
    /// a running task that did not launch.
    fn chain_one_deeper(&mut self, eng: &Engine, i: usize) -> bool {
        let lane = &self.lanes[i];
        if lane.chained.len() >= CHAIN_DEPTH
            || lane.chained_after.is_some()
            || lane.after.is_some()
            || lane.unlaunched.is_some()
        {
            return false;
        }
        let Some(tail) = lane.chained.back().cloned() else { return false };
        if !tail.run.takes_tasks() {
            return false;
        }
        for next in tail.consumers() {
            let sub_single = next.task.as_ref().is_some_and(TaskData::is_sub_single);
            if !sub_single || !Arc::ptr_eq(&next.run, &tail.run) || next.state() != State::Pending {
                continue;
            }
            let lane = &self.lanes[i];
            let here = lane.busy.iter().filter(|(s, _)| s.feeds(&next)).count()
                + lane.chained.iter().filter(|s| s.feeds(&next)).count();
            let here = here as u32;
            if next.unreleased() == here && next.chain_behind(here) {
                return self.chain_on(eng, i, next, None);
            }
        }
        false
    }

    /// For `next`, a consumer of lane `i`'s running task with two unfinished producers: the
    /// other one, if it is the running single task (not a group: a member's end is not the
    /// group's) of another SUB lane that takes chained tasks, with that lane's key for it
    /// ([`Endpoint::chain_key`]; a panic asking counts as none).
    fn other_producer(&self, i: usize, next: &Slot) -> Option<(Arc<Slot>, u32)> {
        self.sub.iter().copied().find_map(|j| {
            let lane = &self.lanes[j];
            let (other, _) = lane.busy.as_ref()?;
            if j == i
                || !lane.chains
                || lane.dead.is_some()
                || lane.after.is_some()
                || other.task().group
                || other.state() != State::Running
                || !other.feeds(next)
            {
                return None;
            }
            let key = catch_unwind(AssertUnwindSafe(|| lane.endpoint.chain_key())).ok().flatten()?;
            Some((other.clone(), key))
        })
    }

    /// Asks the workers not to start the chained tasks of the runs `of` picks, and the tasks
    /// waiting for another lane's task (they answer them unrun unless they started already).
    fn withdraw_chains(&mut self, of: impl Fn(&RunState) -> bool) {
        for lane in &mut self.lanes {
            if lane.chained.iter().any(|s| of(&s.run)) {
                lane.withdraw_chained();
            }
            if lane.after.is_some() && lane.busy.as_ref().is_some_and(|(s, _)| of(&s.run)) {
                lane.settle_after(false);
            }
        }
    }

    /// An idle SUB lane that takes chained tasks, if any.
    fn idle_chaining_lane(&self) -> Option<usize> {
        self.sub.iter().copied().find(|&m| self.lanes[m].chains && self.lanes[m].idle())
    }

    /// Hands CHAINED task `slot` to idle lane `m`, to start once the worker of `ahead`, its
    /// one unfinished producer, records that task's success (`key`, [`Endpoint::chain_after`]).
    /// One the endpoint refuses goes back to PENDING.
    fn chain_after_on(
        &mut self,
        eng: &Engine,
        m: usize,
        slot: Arc<Slot>,
        ahead: &Arc<Slot>,
        key: u32,
    ) -> bool {
        let Some(slot) = self.hand_chained(eng, m, slot, "chain_after", |e, d| e.chain_after(d, key)) else {
            return self.lanes[m].dead.is_some();
        };
        tracing::trace!(target: "simpler::scheduler", run_id = slot.run.id, task_index = slot.index, worker = %self.lanes[m].name, after = ahead.index, "chain");
        let lane = &mut self.lanes[m];
        lane.busy = Some((slot, 0));
        lane.after = Some(ahead.clone());
        self.waiting_after += 1;
        true
    }

    /// Hands CHAINED task `slot` to lane `i` behind its running task ([`Endpoint::chain`]),
    /// and with `other` (its other unfinished producer, running on another lane, and that
    /// lane's key for it) also after that one. One the endpoint refuses goes back to PENDING,
    /// and is queued when its producers end.
    fn chain_on(&mut self, eng: &Engine, i: usize, slot: Arc<Slot>, other: Option<(Arc<Slot>, u32)>) -> bool {
        let key = other.as_ref().map(|&(_, key)| key);
        let Some(slot) = self.hand_chained(eng, i, slot, "chain", |e, d| e.chain(d, key)) else {
            return self.lanes[i].dead.is_some();
        };
        let depth = self.lanes[i].chained.len() + 1;
        tracing::trace!(target: "simpler::scheduler", run_id = slot.run.id, task_index = slot.index, worker = %self.lanes[i].name, depth, also_after = other.as_ref().map(|(o, _)| o.index), "chain");
        let lane = &mut self.lanes[i];
        lane.chained.push_back(slot);
        if let Some((other, _)) = other {
            lane.chained_after = Some((other, false));
            self.waiting_after += 1;
        }
        true
    }

    /// Hands CHAINED task `slot` over to lane `i`'s endpoint with `call` (`what` names it):
    /// the slot back when it was handed over (counted in flight; the caller records where).
    /// `None` when the endpoint refused it (it goes back to PENDING) or panicked: whether it
    /// was handed over is then unknown and the endpoint cannot be trusted, so the lane leaves
    /// service (rule 5 of the engine) and the task fails (queued again it might run twice), as
    /// one whose `start` panicked does.
    fn hand_chained(
        &mut self,
        eng: &Engine,
        i: usize,
        slot: Arc<Slot>,
        what: &str,
        call: impl FnOnce(&mut dyn Endpoint, &Dispatch<'_>) -> crate::error::Result<()>,
    ) -> Option<Arc<Slot>> {
        let d = Self::dispatch_of(eng, &slot, 0, false);
        match catch_unwind(AssertUnwindSafe(|| call(self.lanes[i].endpoint.as_mut(), &d))) {
            Ok(Ok(())) => {
                self.in_flight += 1;
                Some(slot)
            }
            Ok(Err(e)) => {
                tracing::debug!(target: "simpler::scheduler", worker = %self.lanes[i].name, "{} not chained: {}", slot.describe(), e.message());
                slot.unchain();
                None
            }
            Err(panic) => {
                let why = format!("its endpoint panicked in {what}: {}", panic_message(&*panic));
                tracing::error!(target: "simpler::scheduler", worker = %self.lanes[i].name, "{why}; out of service");
                self.lanes[i].dead = Some(why.clone());
                self.lose_chained(eng, i, &slot, &why);
                None
            }
        }
    }

    /// Puts lane `i`, out of service since its worker died, back in service: a new worker
    /// took its place. Returns whether it did: a lane still in service is left as it is, and so
    /// is every lane once the endpoints were shut down (a close that raced the replacement).
    pub(crate) fn revive(&mut self, i: usize) -> bool {
        match self.lanes.get_mut(i) {
            Some(lane) if !self.shut && lane.busy.is_none() => lane.dead.take().is_some(),
            _ => false,
        }
    }

    /// Whether lane `i` holds a task (running, chained or staged): a lost lane's is still to
    /// end, and its endpoint may not be replaced yet.
    pub(crate) fn holds_task(&self, i: usize) -> bool {
        self.lanes.get(i).is_some_and(Lane::holds_any)
    }

    /// Gives lane `i` a new endpoint (its worker was lost) and puts it back in service; `None`
    /// (nothing changed) while it holds a task or a staged one, else whether it was out of
    /// service.
    pub(crate) fn replace_endpoint(&mut self, i: usize, endpoint: Box<dyn Endpoint>) -> Option<bool> {
        match self.lanes.get_mut(i) {
            Some(lane) if !self.shut && !lane.holds_any() => {
                lane.endpoint = endpoint;
                Some(lane.dead.take().is_some())
            }
            _ => None,
        }
    }

    /// Takes idle lane `i` out of service if its worker is known to be gone, before any task
    /// is given to it (a panic asking counts as gone: the endpoint cannot be trusted, rule 5 of
    /// the engine). Returns whether the lane left service.
    fn check_idle(&mut self, i: usize) -> bool {
        if self.lanes[i].dead.is_some() {
            return false;
        }
        let gone = match catch_unwind(AssertUnwindSafe(|| self.lanes[i].endpoint.gone())) {
            Ok(None) => return false,
            Ok(Some(why)) => why,
            Err(panic) => format!("its endpoint panicked in gone: {}", panic_message(&*panic)),
        };
        tracing::warn!(target: "simpler::scheduler", worker = %self.lanes[i].name, "{gone}; out of service");
        self.lanes[i].dead = Some(gone);
        true
    }

    /// Completes `slot` ([`Engine::complete`]), containing a panic there (rule 5 of the engine:
    /// its run fails, see [`Engine::completion_panicked`]).
    fn complete_contained(&mut self, eng: &Engine, slot: &Arc<Slot>, result: Result<(), Error>) {
        let ready = &mut self.ready;
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| eng.complete(slot, result, ready))) {
            eng.completion_panicked(slot, &*panic, &mut self.ready);
        }
    }

    /// Records one member's (or a single task's) end; completes the slot when all ended.
    fn finish_member(&mut self, eng: &Engine, slot: &Arc<Slot>, member: u32, result: Result<(), Error>) {
        if !slot.task().group {
            self.complete_contained(eng, slot, result);
            return;
        }
        let all_done = {
            let mut l = slot.lock();
            let m = &mut l.members[member as usize];
            *m = if result.is_ok() { Member::Success } else { Member::Failed };
            if let Err(e) = &result
                && l.failure.is_none()
            {
                l.failure = Some(e.clone());
            }
            l.members.iter().all(|m| !matches!(m, Member::Running | Member::NotDispatched))
        };
        if all_done {
            let failure = slot.lock().failure.clone();
            self.complete_contained(eng, slot, failure.map_or(Ok(()), Err));
        }
    }

    /// Fails a task that cannot be placed (dead or missing target).
    fn fail_unplaceable(&mut self, eng: &Engine, slot: &Arc<Slot>, why: String) {
        if slot.cas(State::Ready, State::Running) {
            let err = Error::new(ErrorKind::WorkerDied, format!("{} cannot run: {why}", slot.describe()));
            self.complete_contained(eng, slot, Err(err));
        }
    }

    /// What an endpoint is handed for member `member` of `slot` (0 for a single task), under
    /// its run's lease (on the member's chip, for a next-level task).
    fn dispatch_of<'s>(eng: &Engine, slot: &'s Slot, member: u32, overlap: bool) -> Dispatch<'s> {
        let task = slot.task();
        Dispatch {
            callable: &task.callable,
            args: &task.args[member as usize],
            config: task.config.as_deref(),
            run: slot.run.id,
            task: slot.index,
            member,
            captured: slot.run.capture.is_some(),
            engine: slot.run.engine,
            lease: match &task.target {
                Target::NextLevel(ws) => eng.chip_lease_for(&slot.run, ws[member as usize]),
                Target::Sub => eng.lease_for(&slot.run),
            },
            overlap,
        }
    }

    fn start_on(&mut self, eng: &Engine, lane: usize, slot: &Arc<Slot>, member: u32) {
        let task = slot.task();
        // A staging lane runs the head's task where it can watch for a successor when one
        // is admitted behind it, or is likely to be: its run was submitted by a caller that
        // went on without waiting (one that waits for its run gets the task run at once, on
        // the chip's own thread, without a hop to the executor).
        let overlap = self.lanes[lane].stages
            && (slot.run.ahead.load(std::sync::atomic::Ordering::Relaxed) || eng.successor_run().is_some());
        let d = Self::dispatch_of(eng, slot, member, overlap);
        tracing::trace!(target: "simpler::scheduler", run_id = slot.run.id, task_index = slot.index, member, callable = task.callable.name(), worker = %self.lanes[lane].name, "dispatch");
        let span = tracing::debug_span!(target: "simpler::task", parent: &slot.run.span, "task", run_id = slot.run.id, task_index = slot.index, member, callable = task.callable.name(), worker = %self.lanes[lane].name);
        self.lanes[lane].span = (!span.is_disabled()).then(|| (span, std::time::Instant::now()));
        // Its start is the time before the hand-off (what runs inside it, in a nested Worker
        // or on a chip's cores, starts after), noted once the worker has it: the lock is off
        // the task's path. Its end is polled on a later pass, so it is noted after this.
        let at = slot.run.capture.as_ref().map(|_| crate::sys::clock::monotonic_ns());
        let started = catch_unwind(AssertUnwindSafe(|| self.lanes[lane].endpoint.start(&d)));
        if let Some(at) = at {
            slot.run.note_at(
                slot.index,
                crate::dfx::timeline::TaskEvent::Started(&self.lanes[lane].name),
                at,
            );
        }
        match started {
            Ok(Ok(())) => {
                self.lanes[lane].busy = Some((slot.clone(), member));
                self.in_flight += 1;
            }
            // Whether the task started is unknown, and the endpoint cannot be trusted: the task
            // fails and the lane leaves service (rule 5 of the engine).
            Err(panic) => {
                let name = self.lanes[lane].name.clone();
                let why = format!("its endpoint panicked in start: {}", panic_message(&*panic));
                tracing::error!(target: "simpler::scheduler", worker = %name, "{why}; out of service");
                self.lanes[lane].dead = Some(why.clone());
                let err = Error::new(
                    ErrorKind::Internal,
                    format!(
                        "run {}: {} could not start on {name}: {why}; {name} is out of service",
                        slot.run.id,
                        slot.describe()
                    ),
                );
                self.finish_member(eng, slot, member, Err(err));
            }
            Ok(Err(e)) => {
                let name = self.lanes[lane].name.clone();
                let err = Error::new(
                    e.kind(),
                    format!("{} could not start on {name}: {}", slot.describe(), e.message()),
                );
                self.finish_member(eng, slot, member, Err(err));
            }
        }
    }

    /// Hands task `slot` of the head's first successor run to staging lane `lane`, to prepare
    /// beside the task it runs (the task counts as in flight; it starts when activated).
    fn stage_on(&mut self, eng: &Engine, lane: usize, slot: &Arc<Slot>, lease: crate::engine::lease::Lease) {
        let task = slot.task();
        let d = Dispatch {
            callable: &task.callable,
            args: &task.args[0],
            config: task.config.as_deref(),
            run: slot.run.id,
            task: slot.index,
            member: 0,
            captured: slot.run.capture.is_some(),
            engine: slot.run.engine,
            lease: Some(lease),
            overlap: true,
        };
        tracing::trace!(target: "simpler::scheduler", run_id = slot.run.id, task_index = slot.index, callable = task.callable.name(), worker = %self.lanes[lane].name, "stage");
        match catch_unwind(AssertUnwindSafe(|| self.lanes[lane].endpoint.stage(&d))) {
            Ok(Ok(())) => {
                self.lanes[lane].staged = Some((slot.clone(), 0));
                self.lanes[lane].prepared = false;
                self.in_flight += 1;
                // Its run may be startable now (`staged_startable`): checked again.
                self.settled = self.settled.wrapping_add(1);
            }
            Err(panic) => {
                let name = self.lanes[lane].name.clone();
                let why = format!("its endpoint panicked in stage: {}", panic_message(&*panic));
                tracing::error!(target: "simpler::scheduler", worker = %name, "{why}; out of service");
                self.lanes[lane].dead = Some(why.clone());
                let err = Error::new(
                    ErrorKind::Internal,
                    format!("run {}: {} could not be staged on {name}: {why}", slot.run.id, slot.describe()),
                );
                self.finish_member(eng, slot, 0, Err(err));
            }
            Ok(Err(e)) => {
                let name = self.lanes[lane].name.clone();
                let err = Error::new(
                    e.kind(),
                    format!("{} could not be staged on {name}: {}", slot.describe(), e.message()),
                );
                self.finish_member(eng, slot, 0, Err(err));
            }
        }
    }

    /// Withdraws the staged task of lane `i` (its run was stopped). Asked again on every pass
    /// until it ends: a worker still preparing it cannot give it back yet. A panic fails the
    /// task at once and takes the lane out of service (rule 5 of the engine).
    fn withdraw_on(&mut self, eng: &Engine, i: usize) {
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.lanes[i].endpoint.withdraw())) {
            let why = format!("its endpoint panicked in withdraw: {}", panic_message(&*panic));
            self.lose_staged(eng, i, why);
        }
    }

    /// The staged task of lane `i` can no longer be followed (its endpoint panicked, `why`):
    /// it fails now and the lane leaves service, so its run still ends.
    fn lose_staged(&mut self, eng: &Engine, i: usize, why: String) {
        let Some((slot, member)) = self.lanes[i].staged.take() else {
            tracing::error!(target: "simpler::scheduler", worker = %self.lanes[i].name, "{why}; out of service");
            self.lanes[i].dead = Some(why);
            return;
        };
        if std::mem::take(&mut self.lanes[i].prepared) {
            slot.run.staged.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.in_flight -= 1;
        self.record_outcome(eng, i, &slot, member, Err(why), None);
    }

    /// Activates the staged tasks of the head run on lanes that run nothing now (they become
    /// those lanes' running tasks); a lane whose staged head task is not prepared yet is held
    /// (it takes no other task this pass). A staged task of a stopped or abandoned run is
    /// withdrawn (again) instead, never activated.
    fn activate_staged(&mut self, eng: &Engine, head: u64) -> bool {
        let mut progress = false;
        for i in 0..self.lanes.len() {
            self.lanes[i].held = false;
            if let (Some(dead), Some(_)) = (&self.lanes[i].dead, &self.lanes[i].staged) {
                // A lane out of service never activates its staged task. A worker that died
                // has had its death reported by `poll_staged`; one whose endpoint panicked
                // (in `poll`, `start`, `stop`) would hold the task, and its run, forever.
                let why =
                    format!("it is out of service ({dead}); the task was staged there and not launched");
                let (slot, member) = self.lanes[i].staged.take().expect("a staged task");
                if std::mem::take(&mut self.lanes[i].prepared) {
                    slot.run.staged.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                }
                self.in_flight -= 1;
                self.record_outcome(eng, i, &slot, member, Ok(Outcome::WorkerDied(why)), None);
                progress = true;
                continue;
            }
            let lane = &mut self.lanes[i];
            // Prepared since the last pass: counted and recorded.
            let prepared = match &lane.staged {
                Some(_) if !lane.prepared => catch_unwind(AssertUnwindSafe(|| lane.endpoint.prepared())),
                _ => Ok(None),
            };
            match prepared {
                Ok(None) => {}
                Ok(Some(at)) => {
                    let (slot, _) = lane.staged.as_ref().expect("a staged task");
                    lane.prepared = true;
                    slot.run.staged.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    slot.run.note(slot.index, crate::dfx::timeline::TaskEvent::Staged(at));
                    progress = true;
                }
                Err(panic) => {
                    let why = format!("its endpoint panicked in prepared: {}", panic_message(&*panic));
                    self.lose_staged(eng, i, why);
                    progress = true;
                    continue;
                }
            }
            let Some((slot, _)) = &lane.staged else { continue };
            let ours = slot.run.id == head;
            if slot.run.is_stopped() || slot.run.is_done() || slot.run.build_failed() {
                // Withdrawn when its run was stopped, maybe before the worker could give it
                // back, or its orchestration function failed (its tasks not started never
                // start), or its run was abandoned (it is done with this task still staged,
                // and never the head again): ask until it ends (`poll_staged`); it never
                // launches.
                lane.held = ours;
                self.withdraw_on(eng, i);
                continue;
            }
            // A run dispatching before its turn launches its staged task once the lane is free.
            if !ours && !slot.run.independent.load(std::sync::atomic::Ordering::Relaxed) {
                continue;
            }
            if lane.busy.is_some() {
                lane.held = true;
                continue;
            }
            match catch_unwind(AssertUnwindSafe(|| lane.endpoint.activate())) {
                Ok(true) => {
                    let (slot, member) = lane.staged.take().expect("a staged task");
                    if std::mem::take(&mut lane.prepared) {
                        slot.run.staged.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    tracing::trace!(target: "simpler::scheduler", run_id = slot.run.id, task_index = slot.index, callable = slot.task().callable.name(), worker = %lane.name, "activate");
                    let span = tracing::debug_span!(target: "simpler::task", parent: &slot.run.span, "task", run_id = slot.run.id, task_index = slot.index, member, callable = slot.task().callable.name(), worker = %lane.name);
                    lane.span = (!span.is_disabled()).then(|| (span, std::time::Instant::now()));
                    slot.run.note(slot.index, crate::dfx::timeline::TaskEvent::Started(&lane.name));
                    lane.busy = Some((slot, member));
                    progress = true;
                }
                Ok(false) => lane.held = true,
                Err(panic) => {
                    let why = format!("its endpoint panicked in activate: {}", panic_message(&*panic));
                    self.lose_staged(eng, i, why);
                    progress = true;
                }
            }
        }
        progress
    }

    /// Stages the first READY single task of the head's first successor run on each staging
    /// lane that holds none and that no READY group of that run needs (a group reserves its
    /// workers, so no single may be activated ahead of it), when its host inputs cannot change
    /// any more: the head run has closed its submission and none of its tasks that write those
    /// buffers is still to end (the successor's inputs are copied in now, while the head runs).
    fn stage_successor(&mut self, eng: &Engine, head: u64) -> bool {
        if !self.parts.iter().any(|(id, _)| *id > head) {
            return false;
        }
        let Some(next) = eng.successor_run() else { return false };
        let Some(at) = self.parts.iter().position(|(id, _)| *id == next.id) else { return false };
        let head_run = match eng.live_head() {
            Some(h) if h.id == head && h.submission_closed() => h,
            _ => return false,
        };
        let mut progress = false;
        for w in 0..self.next_level.len() {
            let lane = self.next_level[w];
            let l = &self.lanes[lane];
            // Never beside a task of its own run: both would be under its one lease on the
            // chip, whose per-run resources the running task uses.
            // Nor, for a run dispatching before its turn (whose staged task launches as soon as
            // the lane is free), on a lane the head's group reserved.
            if !l.stages
                || l.staged.is_some()
                || l.dead.is_some()
                || l.runs_task_of(&next)
                || (self.reserved[w] && next.independent.load(std::sync::atomic::Ordering::Relaxed))
            {
                continue;
            }
            let part = &mut self.parts[at].1;
            while part.single[w].front().is_some_and(|s| s.state() != State::Ready) {
                part.single[w].pop_front();
                self.queued -= 1;
            }
            let Some(slot) = part.single[w].front().cloned() else { continue };
            // A READY group of the run that needs this worker reserves it, for staging as at
            // the head: the group dispatches first once its run is the head (as at depth 1),
            // and a single staged here would be activated before it.
            if part.group_needs(w) {
                continue;
            }
            let inputs_final =
                slot.task().args[0].tensors.iter().zip(&slot.task().args[0].tags).all(|(t, tag)| {
                    !tag.access().can_read()
                        || matches!(t.desc().backing(), crate::data::buffer::Backing::Device { .. })
                        || !eng.writer_pending(head_run.id, t.desc().identity())
                });
            if !inputs_final {
                continue;
            }
            // Only beside a task of the head running on this chip, under the chip's other lease
            // (at a grant of 2): a successor waiting for its turn does not hold a lease of a
            // chip the head has left, which runs dispatching before their turn may need.
            if !self.lanes[lane].runs_task_of(&head_run) {
                continue;
            }
            let Some(lease) = eng.chip_lease_for(&next, w as u32) else { continue };
            part.single[w].pop_front();
            self.queued -= 1;
            if slot.cas(State::Ready, State::Running) {
                self.stage_on(eng, lane, &slot, lease);
                progress = true;
            }
        }
        progress
    }

    fn dispatch(&mut self, eng: &Engine) -> bool {
        eng.fault_point("dispatch", None);
        let head = eng.head_run();
        let mut progress = false;
        if self.staging {
            progress |= self.activate_staged(eng, head);
        }
        progress |= self.dispatch_head(eng, head);
        if self.parts.iter().any(|(id, _)| *id > head) {
            progress |= self.dispatch_independent(eng, head);
        }
        if self.staging {
            progress |= self.stage_successor(eng, head);
            if self.ahead_of_turn {
                progress |= self.stage_independent(eng, head);
            }
        }
        progress
    }

    /// Stages, on each staging lane that runs a task and holds none staged, the first READY
    /// single task queued for it by a run dispatching before its turn (in FIFO order), under
    /// that run's lease on the chip, which it holds already: prepared while the lane runs, it
    /// launches once the lane is free (`activate_staged`), so such runs pipeline on a chip as
    /// the head and its successor do. Never beside a task of the same run (one lease), nor on
    /// a lane the head's group reserved or a READY group of the same run needs (a single does
    /// not overtake it). Its inputs are final: its run conflicts with no
    /// unfinished task ahead, and a READY task's producers in its run have ended.
    fn stage_independent(&mut self, eng: &Engine, head: u64) -> bool {
        let mut progress = false;
        for w in 0..self.next_level.len() {
            let lane = self.next_level[w];
            let l = &self.lanes[lane];
            let Some((busy, _)) = &l.busy else { continue };
            // Not beside a task whose run was stopped: its worker is being stopped.
            if !l.stages
                || l.staged.is_some()
                || l.dead.is_some()
                || self.reserved[w]
                || busy.run.is_stopped()
            {
                continue;
            }
            let busy_run = busy.run.clone();
            for at in 0..self.parts.len() {
                if self.parts[at].0 <= head {
                    continue;
                }
                let part = &mut self.parts[at].1;
                while part.single[w].front().is_some_and(|s| s.state() != State::Ready) {
                    part.single[w].pop_front();
                    self.queued -= 1;
                }
                let Some(slot) = part.single[w].front().cloned() else { continue };
                let run = &slot.run;
                if !run.independent.load(std::sync::atomic::Ordering::Relaxed)
                    || run.is_stopped()
                    || run.is_done()
                    || run.build_failed()
                    || Arc::ptr_eq(run, &busy_run)
                    || part.group_needs(w)
                {
                    continue;
                }
                let Some(lease) = eng.chip_lease_for(run, w as u32) else { continue };
                part.single[w].pop_front();
                self.queued -= 1;
                if slot.cas(State::Ready, State::Running) {
                    self.stage_on(eng, lane, &slot, lease);
                    progress = true;
                }
                break;
            }
        }
        progress
    }

    /// Dispatches the work of the runs behind the head that are independent of every run
    /// ahead of them (issue 31: a run whose task hangs no longer holds every later run). A run
    /// behind the head becomes independent once its submission closed, no unfinished task of a
    /// live run ahead touches a buffer it names in a way that conflicts
    /// ([`Engine::independent_of`]), and it got its pipeline lease and, where the next-level
    /// workers are chips, its lease on each chip it uses, all at once
    /// ([`Engine::leases_for_all`]); from then on it
    /// dispatches as the head does, to the workers the head leaves idle (groups excepted: they
    /// wait for its turn). Nothing ahead of
    /// it can touch its buffers any more (those runs submit nothing more), so it stays
    /// independent. A run that is not is checked again only after a task ended or the runs
    /// changed. The partitions of runs that left the FIFO are retired here.
    fn dispatch_independent(&mut self, eng: &Engine, head: u64) -> bool {
        let key = (eng.runs_epoch(), self.settled);
        // A new partition is checked too: a run whose submission closed (the epoch moved) may
        // have had none yet when that pass looked (its tasks still on their way to the inbox),
        // and nothing else would make the scheduler look at it again.
        let recheck = key != self.checked || self.parts_made != self.parts_seen;
        self.checked = key;
        // Nothing to check again, no run dispatching ahead of its turn and no new partition (one
        // may be a departed run's, to retire below): nothing to do, and no lock taken.
        if !recheck && !self.ahead_of_turn && self.parts_made == self.parts_seen {
            return false;
        }
        let mut ahead_of_turn = false;
        let mut live = std::mem::take(&mut self.live);
        eng.live_runs_into(&mut live);
        let mut progress = false;
        let mut i = 0;
        while i < self.parts.len() {
            let id = self.parts[i].0;
            if id <= head {
                i += 1;
                continue;
            }
            let Some(run) = live.iter().find(|r| r.id == id) else {
                // Its run left the FIFO (ended, or was abandoned): only stale entries are left,
                // or an abandoned run's READY tasks, which `retire` fails.
                if let Some((_, stale)) = self.parts.remove(i) {
                    self.retire(eng, stale);
                }
                progress = true;
                continue;
            };
            i += 1;
            if run.is_stopped() || run.is_done() || run.build_failed() {
                continue;
            }
            if !run.independent.load(std::sync::atomic::Ordering::Relaxed) {
                // A lease only for a run with a task some idle worker can take now: at L4 tasks
                // are pinned to their Worker, and one that waits for a busy (maybe hung) Worker
                // must not hold a lease that a run on an idle Worker could use. (A task ending
                // makes the next pass look again.)
                if !recheck
                    || !(self.startable(&self.parts[i - 1].1) || self.staged_startable(run))
                    || !eng.independent_of(run, &live)
                    || !eng.leases_for_all(
                        run,
                        &run.next_level_workers(self.next_level.len())
                            .collect::<smallvec::SmallVec<[u32; 8]>>(),
                    )
                {
                    continue;
                }
                tracing::trace!(target: "simpler::scheduler", run_id = id, head, "independent of the runs ahead: dispatched before its turn");
                run.independent.store(true, std::sync::atomic::Ordering::Relaxed);
                // Its staged task, if any, launches next pass (`activate_staged`): a pass.
                progress = true;
            }
            ahead_of_turn = true;
            // Nothing more to give out this pass once no worker is idle and no chip can take
            // a staged task (`stage_independent`): the runs behind need not be checked now.
            let idle = |ls: &[usize]| ls.iter().any(|&l| self.lanes[l].idle());
            if !idle(&self.sub)
                && !idle(&self.next_level)
                && !self.next_level.iter().any(|&l| self.lanes[l].takes_staged())
            {
                break;
            }
            let mut part = std::mem::take(&mut self.parts[i - 1].1);
            progress |= self.dispatch_sub(eng, &mut part);
            // Groups wait for the run's turn, and reserve their workers against the run's
            // singles meanwhile (as at the head and in staging): a single does not overtake a
            // group ahead of it in its run.
            progress |= self.dispatch_singles(eng, &mut part, true);
            self.parts[i - 1].1 = part;
        }
        live.clear();
        self.live = live;
        self.ahead_of_turn = ahead_of_turn;
        self.parts_seen = self.parts_made;
        progress
    }

    /// Whether `part` has a READY task a worker could take now: SUB work with a SUB worker
    /// idle, or a single task whose next-level worker is unreserved and idle, or, staging,
    /// has no task staged (`stage_independent` prepares it beside the running one).
    fn startable(&self, part: &Partition) -> bool {
        let ready = |q: &VecDeque<Arc<Slot>>| q.iter().any(|s| s.state() == State::Ready);
        let takes = |l: &Lane| l.idle() || l.takes_staged();
        (ready(&part.sub) && self.sub.iter().any(|&l| self.lanes[l].idle()))
            || self.next_level.iter().enumerate().any(|(w, &l)| {
                !self.reserved[w] && takes(&self.lanes[l]) && part.single.get(w).is_some_and(ready)
            })
    }

    /// Whether a task of `run` is staged on a lane that runs nothing now (found independent,
    /// the run launches it there at once: `activate_staged`).
    fn staged_startable(&self, run: &RunState) -> bool {
        self.lanes.iter().any(|l| l.busy.is_none() && l.dead.is_none() && l.stages_task_of(run))
    }

    fn dispatch_head(&mut self, eng: &Engine, head: u64) -> bool {
        // Reservations belong to the current head group only: recomputed on every pass (by
        // `dispatch_group_head`), so a group that leaves the head without launching
        // (cancelled, failed) releases them, and so does a head with nothing queued, whose
        // stale reservations would hold independent runs' tasks back.
        self.reserved.iter_mut().for_each(|r| *r = false);
        // Partitions of runs that are no longer live hold only stale entries (and, after a
        // panic, the READY tasks of an abandoned run).
        while let Some(&(id, _)) = self.parts.front() {
            if id < head || head == 0 {
                if let Some((_, stale)) = self.parts.pop_front() {
                    self.retire(eng, stale);
                }
            } else {
                break;
            }
        }
        // The head run's partition, if any, is now the first one. It is moved out while the
        // dispatchers borrow `self` (a move of a few pointers, no allocation) and put back.
        let Some((id, front)) = self.parts.front_mut() else { return false };
        if *id != head {
            return false;
        }
        // Every task carries its run's lease (children refuse the invalid one, rule L1 of
        // `lease`): while every lease is quarantined behind an abandoned run's task still on a
        // worker, the head waits for one (until that task ends, or the head is stopped).
        let any = front
            .sub
            .front()
            .or(front.groups.front())
            .or_else(|| front.single.iter().find_map(|q| q.front()));
        if let Some(task) = any
            && eng.lease_for(&task.run).is_none()
        {
            if self.lease_wait != head {
                self.lease_wait = head;
                tracing::warn!(target: "simpler::scheduler", run_id = head, quarantined = ?eng.quarantined_leases(), "the head run waits for a pipeline lease: every lease is quarantined until the tasks of abandoned runs end");
            }
            return false;
        }
        let mut part = std::mem::take(front);
        let mut progress = false;
        progress |= self.dispatch_group_head(eng, &mut part);
        progress |= self.dispatch_singles(eng, &mut part, false);
        progress |= self.dispatch_sub(eng, &mut part);
        self.parts[0].1 = part;
        progress
    }

    fn dispatch_group_head(&mut self, eng: &Engine, part: &mut Partition) -> bool {
        let mut progress = false;
        loop {
            let Some(slot) = part.groups.front().cloned() else { break };
            if slot.state() != State::Ready {
                part.groups.pop_front();
                self.queued -= 1;
                continue;
            }
            let Target::NextLevel(targets) = &slot.task().target else {
                unreachable!("groups are NEXT_LEVEL")
            };
            let lanes: Vec<usize> = targets.iter().map(|&w| self.next_level[w as usize]).collect();
            if let Some(dead) = lanes.iter().find_map(|&l| self.lanes[l].dead.clone().map(|m| (l, m))) {
                part.groups.pop_front();
                self.queued -= 1;
                let name = self.lanes[dead.0].name.clone();
                self.fail_unplaceable(eng, &slot, format!("{name} is dead ({})", dead.1));
                progress = true;
                continue;
            }
            if lanes.iter().all(|&l| self.lanes[l].idle()) {
                // Its lease on each of its chips, all at once; while one is held by a run
                // dispatching before its turn, which needs nothing of the head, it waits
                // without reserving the lanes that run may need.
                if !eng.leases_for_all(&slot.run, targets) {
                    break;
                }
                part.groups.pop_front();
                self.queued -= 1;
                if slot.cas(State::Ready, State::Running) {
                    for m in slot.lock().members.iter_mut() {
                        *m = Member::Running;
                    }
                    for (i, &lane) in lanes.iter().enumerate() {
                        self.start_on(eng, lane, &slot, i as u32);
                    }
                    progress = true;
                }
                continue;
            }
            for &w in targets {
                self.reserved[w as usize] = true;
            }
            break;
        }
        progress
    }

    /// Starts the first READY single of `part` on each idle, unreserved next-level worker;
    /// `before_turn` (a run dispatching before its turn, whose groups wait for it): also not
    /// on a worker a READY group of the run needs.
    fn dispatch_singles(&mut self, eng: &Engine, part: &mut Partition, before_turn: bool) -> bool {
        let mut progress = false;
        for w in 0..self.next_level.len() {
            let lane = self.next_level[w];
            if self.reserved[w] || (before_turn && part.group_needs(w)) {
                continue;
            }
            while let Some(slot) = part.single[w].front().cloned() {
                if slot.state() != State::Ready {
                    part.single[w].pop_front();
                    self.queued -= 1;
                    continue;
                }
                if let Some(msg) = self.lanes[lane].dead.clone() {
                    part.single[w].pop_front();
                    self.queued -= 1;
                    let name = self.lanes[lane].name.clone();
                    self.fail_unplaceable(eng, &slot, format!("{name} is dead ({msg})"));
                    progress = true;
                    continue;
                }
                // Not beside a staged task of its own run (a run found independent this pass,
                // whose task was staged while it waited): both would be under its one lease
                // there; the staged one launches first (`activate_staged`, next pass).
                if !self.lanes[lane].idle()
                    || self.lanes[lane].stages_task_of(&slot.run)
                    || eng.chip_lease_for(&slot.run, w as u32).is_none()
                {
                    break;
                }
                part.single[w].pop_front();
                self.queued -= 1;
                if slot.cas(State::Ready, State::Running) {
                    self.start_on(eng, lane, &slot, 0);
                    progress = true;
                }
                break;
            }
        }
        progress
    }

    fn dispatch_sub(&mut self, eng: &Engine, part: &mut Partition) -> bool {
        let mut progress = false;
        while let Some(slot) = part.sub.front().cloned() {
            if slot.state() != State::Ready {
                part.sub.pop_front();
                self.queued -= 1;
                continue;
            }
            let need = slot.task().args.len();
            let live = self.sub.iter().filter(|&&l| self.lanes[l].dead.is_none()).count();
            if live < need {
                part.sub.pop_front();
                self.queued -= 1;
                let why = if self.sub.is_empty() {
                    "this Worker has no SUB workers (WorkerBuilder::sub_workers)".to_string()
                } else {
                    let dead: Vec<&str> =
                        self.sub.iter().filter_map(|&l| self.lanes[l].dead.as_deref()).take(4).collect();
                    format!("it needs {need} SUB workers but only {live} are alive ({})", dead.join("; "))
                };
                self.fail_unplaceable(eng, &slot, why);
                progress = true;
                continue;
            }
            // (No allocation per task: a group of up to eight members fits inline.)
            let idle: smallvec::SmallVec<[usize; 8]> =
                self.sub.iter().copied().filter(|&l| self.lanes[l].idle()).take(need).collect();
            if idle.len() < need {
                break;
            }
            part.sub.pop_front();
            self.queued -= 1;
            if !slot.cas(State::Ready, State::Running) {
                continue;
            }
            if slot.task().group {
                for m in slot.lock().members.iter_mut() {
                    *m = Member::Running;
                }
            }
            for (i, lane) in idle.into_iter().enumerate() {
                self.start_on(eng, lane, &slot, i as u32);
            }
            progress = true;
        }
        progress
    }
}
