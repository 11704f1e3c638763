//! The child's side of a mailbox: taking a task ([`TaskRequest`], the guard of rule M5) or a
//! control request, answering them, the staged task's steps (M11), and reporting startup. These
//! belong to the child loop: one thread (M5).

#![expect(unsafe_code, reason = "reading and answering frames the child claimed; rules M2-M6, M10, M11")]

use std::fmt;
use std::sync::atomic::Ordering;

use super::layout::{Frame, TaskWords};
use super::state::Activation;
use super::{FALLBACK_CODE, FrameError, Mailbox};
use crate::sys::futex::Doorbell;

/// The task a child took from its task frame: a guard that owns the frame (state `BUSY`) until
/// it is handed back through [`Mailbox::finish_task`], which consumes it (rule M5).
///
/// The slices it lends point into the shared frame and borrow the guard, so none outlives the
/// hand-over. Dropped without `finish_task` (the child loop unwound), it still hands the frame
/// back, as `TASK_DONE` with an error, so the frame never stays claimed.
pub(crate) struct TaskRequest<'a> {
    frame: &'a Frame,
    words: &'a TaskWords,
    /// The callable digest.
    pub(crate) digest: [u8; 32],
    /// For a task of a captured run: its engine, run and task number in the parent, and the
    /// member of a group (rule M10).
    pub(crate) trace: Option<(u64, u64, u32, u32)>,
    /// The lease of the task's run: its slot and generation (rule M12; generation 0: none).
    pub(crate) lease: (u32, u64),
    /// The task's flags ([`FLAG_OVERLAP`](super::FLAG_OVERLAP)).
    pub(crate) flags: u32,
    /// A successor posted for preparation (`PREPARE_READY`), not a task to run now.
    pub(crate) staged: bool,
    /// The `after` word (rule M13).
    after: u32,
    finished: bool,
}

impl TaskRequest<'_> {
    /// The config bytes (an encoded `CallConfig`), [`CONFIG_BYTES`](super::CONFIG_BYTES) long.
    pub(crate) fn config(&self) -> &[u8] {
        // SAFETY: rules M2, M5 — this guard claimed the frame (BUSY) and owns its fields until
        // `finish_task` or its drop, neither of which can run while this borrow of it lives.
        unsafe { &*self.frame.config.get() }
    }

    /// The args blob (`payload[..payload_len]`, clamped to [`ARGS_CAPACITY`](super::ARGS_CAPACITY)).
    pub(crate) fn args(&self) -> &[u8] {
        // SAFETY: rules M2, M5 — as in `config`: the guard owns the frame for this borrow; the
        // length is clamped (M6).
        unsafe { self.frame.payload() }
    }

    /// Publishes a staged task as prepared: `BUSY` -> `FRAME_STAGED` (Release, rule M11), and
    /// rings `parent`, which may now activate it. The guard keeps owning the fields.
    pub(crate) fn publish_staged(&mut self, parent: &Doorbell) {
        if self.staged && self.frame.state.still_claimed() {
            // Rule M12: read by the parent after an Acquire load of FRAME_STAGED.
            self.words.prepared_ns.store(crate::sys::clock::monotonic_ns(), Ordering::Relaxed);
            self.frame.state.publish_staged();
            parent.ring();
        }
    }

    /// Whether the parent asked, through the sticky withdraw word, to withdraw this staged
    /// task while the child still prepares it (rule M11).
    pub(crate) fn withdraw_asked(&self) -> bool {
        self.staged && self.words.withdraw.load(Ordering::Acquire) != 0
    }

    /// Whether the parent activated or withdrew this staged task (rule M11): takes
    /// `ACTIVATE` -> `TASK_LAUNCHED` or `WITHDRAW` -> `BUSY` by compare-exchange.
    pub(crate) fn activation(&mut self) -> Activation {
        self.frame.state.take_activation()
    }

    /// Whether the task is chained behind the one before it (rule M13).
    pub(crate) fn chained(&self) -> bool {
        self.flags & super::FLAG_CHAINED != 0
    }

    /// The task's sequence number on this child (rule M13).
    pub(crate) fn seq(&self) -> u16 {
        super::seq_of(self.flags)
    }

    /// Whether the parent set the frame's sticky withdraw word (rule M12): for a chained task,
    /// its run was stopped and it must not start (M13).
    pub(crate) fn withdrawn(&self) -> bool {
        self.chain_word() == super::CHAIN_WITHDRAW
    }

    /// The sticky withdraw word (rule M12): 0, [`CHAIN_WITHDRAW`](super::CHAIN_WITHDRAW) or
    /// [`CHAIN_GO`](super::CHAIN_GO) (rule M13).
    pub(crate) fn chain_word(&self) -> u32 {
        self.words.withdraw.load(Ordering::Acquire)
    }

    /// The task on another worker this one runs after (its mailbox and sequence number), if
    /// any (rule M13).
    pub(crate) fn after(&self) -> Option<(usize, u16)> {
        super::after_of(self.after)
    }

    /// Sets the frame's sticky acceptance word: the task is launching (rule M12).
    pub(crate) fn mark_accepted(&self) {
        self.words.accepted.store(1, Ordering::Release);
    }

    /// Writes the reply and hands the frame back as `TASK_DONE` (rule M4).
    fn reply(&mut self, result: &std::result::Result<(), FrameError>) {
        self.finished = true;
        // A staged frame the parent may still move (FRAME_STAGED -> ACTIVATE | WITHDRAW) is
        // taken back to BUSY first, so no parent transition is lost (M11).
        self.frame.state.reclaim_to_reply();
        let (code, message) = reply_code(result);
        // SAFETY: rules M3, M11 — this guard claimed the frame from TASK_READY or
        // PREPARE_READY, so it owns its fields until the store below.
        unsafe { self.frame.write_error(code, message) };
        self.frame.state.reply_task();
    }
}

impl Drop for TaskRequest<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.reply(&Err(FrameError::new(
                FALLBACK_CODE,
                "the child dropped the task without finishing it",
            )));
        }
    }
}

impl fmt::Debug for TaskRequest<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskRequest")
            .field("digest", &self.digest)
            .field("args_len", &self.args().len())
            .finish()
    }
}

/// What a child found in its base frame: a control request (copied out of the frame).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ControlRequest {
    /// The control sub-command.
    pub(crate) command: u64,
    /// The control argument.
    pub(crate) arg0: u64,
    /// The digest slot (a callable digest, or other 32 bytes the command defines).
    pub(crate) digest: [u8; 32],
    /// The payload (`payload[..payload_len]`, clamped to [`ARGS_CAPACITY`](super::ARGS_CAPACITY)).
    pub(crate) payload: Vec<u8>,
    /// Private: a `ControlRequest` is only ever read from a frame ([`Mailbox::control_request`]),
    /// so `ipc::child` may trust that its `arg0` is what the parent wrote (rule C1 there).
    from_frame: (),
}

impl<'a> Mailbox<'a> {
    /// True once the parent has requested shutdown (Acquire; sticky).
    pub(crate) fn shutdown_requested(&self) -> bool {
        self.slot.shutdown.load(Ordering::Acquire) != 0
    }

    /// The child doorbell: the child sleeps on it; the parent rings it after every post.
    pub(crate) fn child_doorbell(&self) -> &'a Doorbell {
        &self.slot.doorbell
    }

    /// Records the CPU the child runs on (a hint for the parent's waits).
    pub(crate) fn set_child_cpu(&self, cpu: u32) {
        self.slot.child_cpu.store(cpu, Ordering::Relaxed);
    }

    /// The CPU (plus one) the parent last posted from; 0 when unknown.
    pub(crate) fn parent_cpu(&self) -> u32 {
        self.slot.parent_cpu.load(Ordering::Relaxed)
    }

    /// Publishes the pipeline depth this child grants; call it before reporting ready (M9).
    pub(crate) fn set_granted_depth(&self, depth: u32) {
        self.slot.granted_depth.store(depth, Ordering::Relaxed);
    }

    /// Records the child's pid (Release).
    pub(crate) fn set_child_pid(&self, pid: u32) {
        self.slot.child_pid.store(pid, Ordering::Release);
    }

    /// Takes the posted task, if the task frame is `TASK_READY`: claims the frame (`TASK_READY`
    /// → `BUSY`, rule M3) and returns the guard that owns it until
    /// [`finish_task`](Mailbox::finish_task) (rule M5).
    #[cfg(any(test, feature = "fuzz", feature = "bench-support"))]
    pub(crate) fn task_request(&self) -> Option<TaskRequest<'a>> {
        self.task_request_at(0, false)
    }

    /// Records the task this child finished last (rule M13): its sequence number, whether it
    /// succeeded, and whether it was a chained task behind its predecessor's success (so that
    /// one succeeded, whether or not this one then ran).
    /// Returns the children (a bit per mailbox) that were asleep waiting for it: the caller
    /// rings them. SeqCst, paired with [`watch_done`](Mailbox::watch_done) (Dekker's pattern,
    /// as the doorbell's rule D2): a waiter either is in the mask or sees the record.
    pub(crate) fn set_done(&self, seq: u16, ok: bool, behind_success: bool) -> u64 {
        let word = u32::from(seq) << 16 | u32::from(behind_success) << 2 | u32::from(ok) << 1 | 1;
        self.slot.done.store(word, Ordering::SeqCst);
        if self.slot.waiters.load(Ordering::SeqCst) == 0 {
            return 0;
        }
        self.slot.waiters.swap(0, Ordering::SeqCst)
    }

    /// The task this mailbox's child finished last (rule M13): its sequence number, whether it
    /// succeeded, and whether it was a chained task that ran behind its predecessor's success
    /// (so that one succeeded); `None` before its first (SeqCst, see
    /// [`set_done`](Mailbox::set_done)).
    pub(crate) fn done(&self) -> Option<(u16, bool, bool)> {
        let w = self.slot.done.load(Ordering::SeqCst);
        (w & 1 == 1).then_some(((w >> 16) as u16, w & 2 != 0, w & 4 != 0))
    }

    /// The child of mailbox `waiter` is about to sleep until this child's `done` moves (rule
    /// M13): it is rung when it does. False (nothing registered) for a mailbox past 63, which
    /// waits for its parent's word instead. Check `done` again after this returns.
    pub(crate) fn watch_done(&self, waiter: usize) -> bool {
        if waiter >= 64 {
            return false;
        }
        self.slot.waiters.fetch_or(1 << waiter, Ordering::SeqCst);
        true
    }

    /// Takes the next task to run from the task frames (rule M13): a `TASK_READY` frame not
    /// chained first, else a chained one, the one whose sequence number follows `last` (the
    /// task this child finished last) first. A chained one that does not follow it is taken
    /// only after the frames are read again: the task that follows may have been posted into a
    /// frame after that frame was read, and the Acquire load that saw the later post makes the
    /// earlier one visible. Claims the frame (M3).
    pub(crate) fn next_task(&self, last: Option<u16>) -> Option<TaskRequest<'a>> {
        let rank = |ix: usize| {
            // Acquire (M4): a TASK_READY frame's words are the poster's; the parent never takes
            // such a frame back (M13), so this child's claim below finds the same task.
            if self.slot.tasks[ix].state.get() != super::TASK_READY {
                return None;
            }
            let flags = self.slot.words[ix].flags.load(Ordering::Relaxed);
            Some(if flags & super::FLAG_CHAINED == 0 {
                0u8
            } else if last.map(|l| l.wrapping_add(1)) == Some(super::seq_of(flags)) {
                1
            } else {
                2
            })
        };
        let best = || (0..super::TASK_FRAMES).filter_map(|ix| rank(ix).map(|r| (r, ix))).min();
        let (r, mut ix) = best()?;
        if r == 2 {
            ix = best().map_or(ix, |(_, i)| i);
        }
        self.task_request_at(ix, false)
    }

    /// Takes the task posted in task frame `ix`: a task to run (`TASK_READY`), or with
    /// `staged` a successor to prepare (`PREPARE_READY`, rule M11). Claims the frame (rule M3)
    /// and returns the guard that owns it until [`finish_task`](Mailbox::finish_task) (M5).
    pub(crate) fn task_request_at(&self, ix: usize, staged: bool) -> Option<TaskRequest<'a>> {
        let frame: &'a Frame = &self.slot.tasks[ix];
        let words: &'a TaskWords = &self.slot.words[ix];
        let taken = if staged { frame.state.take_staged() } else { frame.state.take_task() };
        if !taken {
            return None;
        }
        // SAFETY: rule M3 — we claimed the frame, so we own its fields, and the Acquire claim
        // sees the parent's writes (M4).
        let (digest, run, task, engine, after) = unsafe {
            (
                *frame.digest.get(),
                *frame.command.get(),
                *frame.arg0.get(),
                *frame.result.get(),
                *frame.after.get(),
            )
        };
        // Rule M10: a run number of 0 is no trace.
        let trace = (run != 0).then_some((engine, run, task as u32, (task >> 32) as u32));
        // Rule M12: written before the parent's hand-over, which the claim saw.
        let lease = (words.slot.load(Ordering::Relaxed), words.generation.load(Ordering::Relaxed));
        let flags = words.flags.load(Ordering::Relaxed);
        Some(TaskRequest { frame, words, digest, trace, lease, flags, staged, after, finished: false })
    }

    /// Finishes the task `req` took from this mailbox: writes the error code and message
    /// (truncated to fit, NUL-terminated; an `Err` with code 0 is written as −1), publishes
    /// `TASK_DONE` (Release) and rings `parent`.
    ///
    /// Panics if `req` was taken from another mailbox.
    pub(crate) fn finish_task(
        &self,
        mut req: TaskRequest<'_>,
        result: std::result::Result<(), FrameError>,
        parent: &Doorbell,
    ) {
        assert!(
            self.slot.tasks.iter().any(|f| std::ptr::eq(req.frame, f)),
            "a task finished on another mailbox"
        );
        req.reply(&result);
        parent.ring();
    }

    /// The posted control request, if the base frame is `CONTROL_REQUEST` (copied out).
    pub(crate) fn control_request(&self) -> Option<ControlRequest> {
        let frame = &self.slot.base;
        if !frame.state.control_posted() {
            return None;
        }
        // SAFETY: rules M2, M5 — in CONTROL_REQUEST the child side owns the frame and only reads
        // the request fields, written by the parent before its Release store (M4); everything
        // is copied out before returning; the payload length is clamped (M6).
        let request = unsafe {
            ControlRequest {
                command: *frame.command.get(),
                arg0: *frame.arg0.get(),
                digest: *frame.digest.get(),
                payload: frame.payload().to_vec(),
                from_frame: (),
            }
        };
        Some(request)
    }

    /// Answers the control request in the base frame: claims it from `CONTROL_REQUEST`, writes
    /// the result or the error (as [`finish_task`](Mailbox::finish_task) does), publishes
    /// `CONTROL_DONE` (Release), futex-wakes the base state word and rings `parent`.
    ///
    /// Does nothing if the frame is not `CONTROL_REQUEST`.
    pub(crate) fn finish_control(&self, result: std::result::Result<u64, FrameError>, parent: &Doorbell) {
        let frame = &self.slot.base;
        if !frame.state.claim_to_reply_control() {
            return;
        }
        let value = *result.as_ref().unwrap_or(&0);
        let (code, message) = reply_code(&result);
        // SAFETY: rule M3 — we claimed the frame from CONTROL_REQUEST, so we own its fields.
        unsafe {
            *frame.result.get() = value;
            frame.write_error(code, message);
        }
        frame.state.reply_control();
        frame.state.wake_all();
        parent.ring();
    }

    /// Reports startup on the base frame: `INIT_READY`, or `INIT_FAILED` with the message
    /// (truncated to fit), then futex-wakes the base state word.
    ///
    /// Does nothing if the base frame is not `IDLE` (startup already reported, or a premature
    /// control request won the frame: the parent's [`wait_init`](Mailbox::wait_init) then times
    /// out).
    pub(crate) fn publish_init(&self, result: std::result::Result<(), &str>) {
        let frame = &self.slot.base;
        match result {
            Ok(()) => {
                frame.state.report_ready();
            }
            Err(message) => {
                if !frame.state.claim_to_report_failure() {
                    return;
                }
                // SAFETY: rule M3 — we claimed the base frame from IDLE before startup was
                // reported, so we own its fields until the Release store below (M4).
                unsafe { frame.write_error(FALLBACK_CODE, message) };
                frame.state.report_failed();
            }
        }
        frame.state.wake_all();
    }
}

/// The code and message to write for a reply (rule: 0 only for success).
fn reply_code<T>(result: &std::result::Result<T, FrameError>) -> (i32, &str) {
    match result {
        Ok(_) => (0, ""),
        Err(e) if e.code == 0 => (FALLBACK_CODE, e.message.as_str()),
        Err(e) => (e.code, e.message.as_str()),
    }
}
