//! The boundary between the engine and a worker: the [`Endpoint`] trait.
//!
//! A lane owns one endpoint. The scheduler role holder is the only caller: it starts a task
//! with [`Endpoint::start`] and later collects the outcome with [`Endpoint::poll`], which must
//! never block. An endpoint that has something to report rings the engine doorbell so a sleeping
//! holder wakes up; a [`watched`](Endpoint::watched) one (a remote worker, whose reply sits in
//! a socket) is checked through [`Endpoint::ready`] while the holder keeps checking, and rings
//! only once told the holder sleeps ([`Endpoint::unwatched`]).
//!
//! Besides: [`Endpoint::peer_cpu`] (where the worker runs, for a polite wait),
//! [`Endpoint::gone`] (asked on every pass for each idle lane: a dead worker leaves service
//! before it is given a task) and [`Endpoint::stop`] (for a stopped run: true when the worker
//! was told to stop and will be reported dead). An endpoint that [`stages`](Endpoint::stages)
//! also takes a task of a later run to prepare ([`Endpoint::prepared`],
//! [`Endpoint::activate`], [`Endpoint::withdraw`], [`Endpoint::poll_staged`]; see
//! `scheduler`).

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
    /// successor's for a staged task. The head dispatches only once it holds one, so `None`
    /// only for a task of a run that ended meanwhile (abandoned); a child process refuses a
    /// task that carries none (rule L1 of `lease`).
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
    /// A chained task ([`Endpoint::chain`]) the worker gave back without running it: the
    /// task ahead of it failed, or it was withdrawn.
    NotRun(String),
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
        "the worker process is killed, and leaves service"
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

    // ---- staging: a later run's task prepared beside the running one (two-frame lanes)

    /// Whether this worker can hold a staged task: one of the FIFO's first successor run, or
    /// of a run dispatching before its turn, handed over while another run's task may be
    /// running, prepared beside it, and launched only when [`activate`](Endpoint::activate)d. Chips started with a pipeline
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

    // ---- chaining: a task of the same run that the worker starts itself (SUB workers)

    /// Whether this worker takes a chained task ([`chain`](Endpoint::chain)): a SUB worker's
    /// mailbox does.
    fn chains(&self) -> bool {
        false
    }

    /// Hands over a task whose unfinished producers are tasks handed here before it (rule 5 of
    /// `slot`), behind the last of them, which the worker starts itself as soon as that one
    /// succeeded, without a round trip through the scheduler. Only while a task runs, and a
    /// worker takes as many as it has room for (a SUB worker's mailbox two; an error says it
    /// has none); after [`poll`](Endpoint::poll) reported the running task's end, the first
    /// chained one is the running task (a worker that did not start it reports
    /// [`Outcome::NotRun`]). With `after` (another endpoint's
    /// [`chain_key`](Endpoint::chain_key); only as the first chained task) it also waits for
    /// that task, as one handed over with [`chain_after`](Endpoint::chain_after) does, and
    /// [`settle_after`](Endpoint::settle_after) settles that wait, before or after the task
    /// running here ended. An error means nothing was handed over.
    fn chain(&mut self, _dispatch: &Dispatch<'_>, _after: Option<u32>) -> Result<()> {
        Err(crate::error::Error::state("this worker cannot chain a task"))
    }

    /// Asks the worker not to start its chained tasks (their run was stopped): each reports
    /// [`Outcome::NotRun`] unless it started already. Never blocks.
    fn withdraw_chained(&mut self) {}

    /// A key that another endpoint of the same kind ([`chain_after`](Endpoint::chain_after))
    /// can wait on: the running task's end as this worker records it. `None` when it has none.
    fn chain_key(&self) -> Option<u32> {
        None
    }

    /// Hands over, to this idle worker, a task whose one unfinished producer runs on another
    /// worker, named by that one's [`chain_key`](Endpoint::chain_key): the worker starts it as
    /// soon as it sees that task's success, or when [`settle_after`](Endpoint::settle_after)
    /// lets it; it is the running task from now on, and its end is polled once settled. An
    /// error means nothing was handed over.
    fn chain_after(&mut self, _dispatch: &Dispatch<'_>, _key: u32) -> Result<()> {
        Err(crate::error::Error::state("this worker cannot take a task to run after another"))
    }

    /// The task handed over to wait for another worker's ([`chain_after`](Endpoint::chain_after),
    /// or [`chain`](Endpoint::chain) with `after`) may start (`go`: the task it waits for
    /// succeeded) or must not (it failed, or its run was stopped: it reports
    /// [`Outcome::NotRun`] unless it started already). Once per such task; never blocks.
    fn settle_after(&mut self, _go: bool) {}
}

#[cfg(test)]
pub(crate) mod testing;
