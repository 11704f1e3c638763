//! `MailboxEndpoint`: the engine's [`Endpoint`] for a child process behind a mailbox.
//!
//! It writes the task into a task frame, reads the outcome back, and reports the child's death
//! (from the `ExitBoard`) as a failure, or, while idle, through `gone`. A task whose child was
//! replaced before its death was seen (the frames were reset, rule M8) fails with `WorkerDied`:
//! the endpoint keeps the pid each frame's task was posted to. A task error frame's code keeps
//! the error's kind across a level: `ERR_RESOURCE` and `ERR_WORKER_DIED` come back as
//! `ResourceExhausted` and `WorkerDied`. Its `stop` SIGKILLs the child (`ExitBoard::kill`); a
//! nested Worker's children follow through `PR_SET_PDEATHSIG`.
//!
//! For a chip that stages (the two-frame lane, rule M11) it posts a running task (`TASK_READY`)
//! into the frame no staged task holds and a staged one as `PREPARE_READY`; activation is the
//! compare-exchange `FRAME_STAGED -> ACTIVATE`; a withdraw is `PREPARE_READY -> IDLE`,
//! `FRAME_STAGED -> WITHDRAW`, or, while the child still copies the task in (its frame `BUSY`),
//! the frame's sticky withdraw word, which the child reads between pieces (M12). A child that
//! dies with a staged task fails it naming the chip and saying it was staged and not launched
//! (the sticky `accepted` word tells a running task that had not launched).

use std::collections::VecDeque;
use std::sync::Arc;

use crate::data::wire::{encode_args, encode_config};
use crate::engine::endpoint::{Dispatch, Endpoint, Outcome};
use crate::error::Result;
use crate::ipc::child::{ERR_NOT_RUN, ERR_RESOURCE, ERR_WORKER_DIED};
use crate::ipc::mailbox::{
    FLAG_CHAINED, FLAG_OVERLAP, MailboxRegion, Posting, TASK_FRAMES, Withdrawn, after_key, flag_seq,
};
use crate::sys::process::ExitBoard;

// A SUB worker's mailbox holds as many chained tasks as the scheduler hands it (rule M13).
const _: () = assert!(crate::engine::scheduler::CHAIN_DEPTH < TASK_FRAMES);

/// Drives one child through its mailbox's task frames: the running task in one, and, for a
/// chip that can prepare a successor beside it, a staged task in another (rule M11 of
/// `ipc::mailbox`), or for a SUB worker up to three chained tasks in the others (M13).
pub(crate) struct MailboxEndpoint {
    region: Arc<MailboxRegion>,
    index: usize,
    exits: Arc<ExitBoard>,
    /// What the child is to the user ("sub worker 1", "chip 0"), for messages.
    label: String,
    /// The child prepares staged successors (a chip that granted a pipeline depth of 2).
    stages: bool,
    /// The task frame of the running task.
    active: Option<usize>,
    /// The task frame of the staged task, until it is activated or ends.
    staged: Option<usize>,
    /// The staged task was taken back before the child saw it (it ends at the next poll).
    withdrawn: bool,
    /// The child takes chained tasks (a SUB worker: rule M13).
    chains: bool,
    /// The task frames of the chained tasks, in the order posted: the first is the running one
    /// once the running one's end was polled.
    chained: VecDeque<usize>,
    /// The task frame of the task that waits for another worker's (M13), until settled.
    waiting: Option<usize>,
    /// Chaining: the frame the next post goes to (posts go to the frames in turn, M13).
    next: usize,
    /// Chaining: the sequence number of the next post (M13).
    seq: u16,
    /// Chaining: the sequence number posted into each task frame last.
    posted_seq: [u16; TASK_FRAMES],
    /// The pid of the child each task frame's task was posted to: a child replaced since
    /// (`Worker::replace_worker`, which resets the frames) took the task with it.
    posted_to: [i32; TASK_FRAMES],
    /// The child this endpoint killed to stop a run (`stop`), so that its death says so.
    stopped_pid: i32,
}

impl MailboxEndpoint {
    pub(crate) fn new(
        region: Arc<MailboxRegion>,
        index: usize,
        exits: Arc<ExitBoard>,
        label: String,
    ) -> MailboxEndpoint {
        MailboxEndpoint {
            region,
            index,
            exits,
            label,
            stages: false,
            active: None,
            staged: None,
            withdrawn: false,
            chains: false,
            chained: VecDeque::new(),
            waiting: None,
            next: 0,
            seq: 0,
            posted_seq: [0; TASK_FRAMES],
            stopped_pid: 0,
            posted_to: [0; TASK_FRAMES],
        }
    }

    /// This child prepares staged successors (a chip child that granted depth 2 and runs the
    /// two-frame loop).
    pub(crate) fn staging(mut self, on: bool) -> MailboxEndpoint {
        self.stages = on;
        self
    }

    /// This child takes chained tasks (a SUB worker, whose loop reads all its task frames:
    /// rule M13 of `ipc::mailbox`).
    pub(crate) fn chaining(mut self, on: bool) -> MailboxEndpoint {
        self.chains = on;
        self
    }

    /// The child's pid now (a replacement has its own), as the parent's exit board has it.
    fn pid(&self) -> i32 {
        self.exits.pid(self.index)
    }

    /// The task frame a new task goes to: the one no staged task holds.
    fn free_frame(&self) -> usize {
        if self.staged == Some(0) { 1 } else { 0 }
    }

    fn post(&mut self, d: &Dispatch<'_>, ix: usize, stage: bool, chained: bool, after: u32) -> Result<()> {
        let mb = self.region.mailbox(self.index);
        mb.set_parent_cpu(crate::sys::futex::current_cpu());
        tracing::trace!(target: "simpler::ipc", run_id = d.run, task_index = d.task, member = d.member, child = self.index, frame = ix, stage, "post task");
        let posting = Posting {
            trace: d.captured.then_some((d.engine, d.run, d.task, d.member)),
            lease: d.lease.map_or((0, 0), |l| (l.slot, l.generation)),
            flags: if d.overlap && self.stages { FLAG_OVERLAP } else { 0 }
                | if chained { FLAG_CHAINED } else { 0 }
                | flag_seq(self.seq),
            stage,
            after,
        };
        mb.post_task_at(ix, d.callable.digest().as_bytes(), &posting, |config, payload| {
            // `post_task_at` hands over a zeroed config, which is the default config's encoding.
            if let Some(c) = d.config {
                encode_config(c, config);
            }
            encode_args(
                d.args.tensors.iter().zip(d.args.tags.iter().map(|t| t.access())),
                &d.args.scalars,
                payload,
            )
        })?;
        self.posted_to[ix] = self.pid();
        if self.chains {
            self.posted_seq[ix] = self.seq;
            self.next = (ix + 1) % TASK_FRAMES;
            self.seq = self.seq.wrapping_add(1);
        }
        Ok(())
    }

    /// The outcome a finished frame reports.
    fn outcome(r: std::result::Result<(), crate::ipc::mailbox::FrameError>) -> Outcome {
        match r {
            Ok(()) => Outcome::Success,
            Err(e) if e.code == ERR_RESOURCE => Outcome::ResourceExhausted(e.message),
            Err(e) if e.code == ERR_WORKER_DIED => Outcome::WorkerDied(e.message),
            Err(e) if e.code == ERR_NOT_RUN => Outcome::NotRun(e.message),
            Err(e) => Outcome::TaskFailure(e.message),
        }
    }

    /// The child's death, as the outcome of the task of frame `ix` (`None` while it lives).
    fn died(&self, ix: usize, staged: bool) -> Option<Outcome> {
        if self.pid() != self.posted_to[ix] {
            // The child died and a new one took its place before this saw the death: the
            // frames were reset (rule M8), so the task's end will never come. The new child
            // is in service; only the task fails.
            let what = if staged { "; the task was staged there and not launched" } else { "" };
            return Some(Outcome::WorkerDied(format!(
                "{} (process {}) died and was replaced by process {} before its task's end was seen{what}",
                self.label,
                self.posted_to[ix],
                self.pid()
            )));
        }
        if !self.exits.has_exited(self.index) {
            return None;
        }
        let how = self.exits.exit_of(self.index)?;
        let mb = self.region.mailbox(self.index);
        let what = if staged && mb.prepared_at(ix).is_some() {
            "; the task was staged there, prepared for its run and not launched"
        } else if staged {
            "; the task was staged there and not yet prepared"
        } else if self.stages && !mb.accepted(ix) {
            "; the task had not launched"
        } else {
            ""
        };
        let why = if self.stopped_pid == self.pid() {
            " (this Worker killed it to stop a run: a cancel or a deadline)"
        } else {
            ""
        };
        Some(Outcome::EndpointFailure(format!(
            "{} (process {}) died: the worker process {how}{why}{what}",
            self.label,
            self.pid()
        )))
    }
}

impl Endpoint for MailboxEndpoint {
    fn start(&mut self, d: &Dispatch<'_>) -> Result<()> {
        let ix = if self.chains { self.next } else { self.free_frame() };
        self.post(d, ix, false, false, 0)?;
        self.active = Some(ix);
        Ok(())
    }

    fn stages(&self) -> bool {
        self.stages
    }

    fn stage(&mut self, d: &Dispatch<'_>) -> Result<()> {
        if !self.stages || self.staged.is_some() {
            return Err(crate::error::Error::state(format!("{} holds a staged task already", self.label)));
        }
        let ix = match self.active {
            Some(a) => 1 - a,
            None => 1,
        };
        self.post(d, ix, true, false, 0)?;
        self.staged = Some(ix);
        Ok(())
    }

    fn activate(&mut self) -> bool {
        let Some(ix) = self.staged else { return false };
        if self.active.is_some() {
            return false;
        }
        if self.region.mailbox(self.index).activate(ix).is_ok() {
            self.staged = None;
            self.active = Some(ix);
            return true;
        }
        false
    }

    fn prepared(&self) -> Option<u64> {
        let ix = self.staged?;
        if self.withdrawn {
            return None;
        }
        self.region.mailbox(self.index).prepared_at(ix)
    }

    fn poll_staged(&mut self) -> Option<Outcome> {
        let ix = self.staged?;
        if std::mem::take(&mut self.withdrawn) {
            self.staged = None;
            return Some(Outcome::TaskFailure(format!(
                "{} gave the staged task back before preparing it: its run was stopped",
                self.label
            )));
        }
        let mb = self.region.mailbox(self.index);
        if let Some(r) = mb.take_task_result_at(ix) {
            self.staged = None;
            return Some(Self::outcome(r));
        }
        let died = self.died(ix, true);
        if died.is_some() {
            self.staged = None;
        }
        died
    }

    fn withdraw(&mut self) {
        let Some(ix) = self.staged else { return };
        let mb = self.region.mailbox(self.index);
        match mb.withdraw(ix) {
            // It never reached the child: it ends here, reported by `poll_staged`.
            Withdrawn::Taken => self.withdrawn = true,
            Withdrawn::Asked | Withdrawn::Late => {}
        }
    }

    fn peer_cpu(&self) -> Option<u32> {
        match self.region.mailbox(self.index).child_cpu() {
            0 => None,
            cpu => Some(cpu),
        }
    }

    fn poll(&mut self) -> Option<Outcome> {
        let ix = self.active.unwrap_or(0);
        let mb = self.region.mailbox(self.index);
        // Dead only after checking the frame: a child may finish its task and then die.
        let outcome = match mb.take_task_result_at(ix) {
            Some(r) => Self::outcome(r),
            None => self.died(ix, false)?,
        };
        // The chained task is the running one now (rule M13); an ended task waits for nothing.
        if self.waiting == Some(ix) {
            self.waiting = None;
        }
        self.active = self.chained.pop_front();
        Some(outcome)
    }

    fn chains(&self) -> bool {
        self.chains
    }

    fn chain(&mut self, d: &Dispatch<'_>, after: Option<u32>) -> Result<()> {
        // Not behind a task still waiting for a sibling's (its settle would be lost), only into a
        // free frame, and with a sibling's key only as the first chained task.
        if self.active.is_none()
            || !self.chains
            || self.chained.len() + 1 >= TASK_FRAMES
            || self.waiting.is_some()
            || (after.is_some() && !self.chained.is_empty())
        {
            return Err(crate::error::Error::state(format!("{} cannot take a chained task now", self.label)));
        }
        let ix = self.next;
        self.post(d, ix, false, true, after.unwrap_or(0))?;
        self.chained.push_back(ix);
        self.waiting = after.map(|_| ix);
        Ok(())
    }

    fn chain_key(&self) -> Option<u32> {
        let ix = self.active.filter(|_| self.chains)?;
        after_key(self.index, self.posted_seq[ix])
    }

    fn chain_after(&mut self, d: &Dispatch<'_>, key: u32) -> Result<()> {
        if !self.chains || self.active.is_some() || !self.chained.is_empty() {
            return Err(crate::error::Error::state(format!(
                "{} cannot take a task to run after another now",
                self.label
            )));
        }
        let ix = self.next;
        self.post(d, ix, false, false, key)?;
        self.active = Some(ix);
        self.waiting = Some(ix);
        Ok(())
    }

    fn settle_after(&mut self, go: bool) {
        if let Some(ix) = self.waiting.take() {
            self.region.mailbox(self.index).settle_after(ix, go);
        }
    }

    fn withdraw_chained(&mut self) {
        for &ix in &self.chained {
            self.region.mailbox(self.index).withdraw_chained(ix);
        }
    }

    fn stop(&mut self) -> bool {
        tracing::debug!(target: "simpler::ipc", child = self.index, pid = self.pid(), "stopping {} (SIGKILL)", self.label);
        // Also when it already exited: its death is then reported as it is.
        if self.exits.kill(self.index) {
            self.stopped_pid = self.pid();
            return true;
        }
        self.exits.has_exited(self.index)
    }

    fn gone(&self) -> Option<String> {
        // One atomic load while the child lives: this runs on every pass.
        if !self.exits.has_exited(self.index) {
            return None;
        }
        let how = self.exits.exit_of(self.index)?;
        Some(format!("{} (process {}) died while idle: the worker process {how}", self.label, self.pid()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::MailboxEndpoint;
    use crate::callable::identity::{CallableHandle, CallableKind, Digest};
    use crate::data::task_args::TaskArgs;
    use crate::engine::endpoint::{Dispatch, Endpoint, Outcome};
    use crate::ipc::mailbox::MailboxRegion;
    use crate::sys::process::ExitBoard;

    /// A chip lane (child pid 1000001, no process) with run 1's task posted to run and run 2's
    /// posted staged.
    fn running_and_staged() -> (Arc<MailboxRegion>, Arc<ExitBoard>, MailboxEndpoint) {
        let region = Arc::new(MailboxRegion::new(1).unwrap());
        let exits = Arc::new(ExitBoard::new(&[1_000_001]));
        let mut ep = MailboxEndpoint::new(region.clone(), 0, exits.clone(), "chip 0".into()).staging(true);
        let k = CallableHandle::new(Digest::of(b"kernel"), CallableKind::Chip, "kernel");
        let mut args = TaskArgs::new();
        args.scalar(1);
        let d = Dispatch {
            callable: &k,
            args: &args,
            config: None,
            run: 1,
            task: 0,
            member: 0,
            captured: false,
            engine: 1,
            lease: None,
            overlap: true,
        };
        ep.start(&d).unwrap();
        ep.stage(&Dispatch { run: 2, ..d }).unwrap();
        (region, exits, ep)
    }

    #[test]
    fn a_task_whose_child_was_replaced_before_its_death_was_seen_fails_instead_of_hanging() {
        // `Worker::replace_worker` needs only the exit board to say the child exited; it resets
        // the frames and starts a new child, maybe before the scheduler polled the lane: the
        // running and the staged task must still end.
        let (region, exits, mut ep) = running_and_staged();
        assert!(ep.poll().is_none() && ep.poll_staged().is_none());
        exits.record_exit_for_test(0, "was killed by signal 9 (SIGKILL)");
        region.mailbox(0).reset_for_new_child();
        exits.replace_for_test(0, 1_000_002);
        for outcome in [ep.poll_staged(), ep.poll()] {
            match outcome {
                Some(Outcome::WorkerDied(m)) => assert!(m.contains("replaced by process 1000002"), "{m}"),
                other => panic!("expected the task to fail with WorkerDied, got {other:?}"),
            }
        }
        assert!(ep.gone().is_none(), "the new child is in service");
    }

    #[test]
    fn a_dead_childs_staged_task_says_whether_it_was_prepared() {
        for prepared in [false, true] {
            let (region, exits, mut ep) = running_and_staged();
            if prepared {
                // The child takes the staged task and publishes it prepared (rule M11).
                let mb = region.mailbox(0);
                let mut req = (0..2).find_map(|ix| mb.task_request_at(ix, true)).expect("the staged task");
                req.publish_staged(region.doorbell());
                std::mem::forget(req); // the child dies holding it
            }
            exits.record_exit_for_test(0, "was killed by signal 9 (SIGKILL)");
            match ep.poll_staged() {
                Some(Outcome::EndpointFailure(m)) => {
                    let want =
                        if prepared { "prepared for its run and not launched" } else { "not yet prepared" };
                    assert!(m.contains("staged there") && m.contains(want), "prepared {prepared}: {m}");
                }
                other => panic!("expected the staged task to fail, got {other:?}"),
            }
        }
    }
}
