//! The parent's side of a mailbox: posting tasks (to run, or staged, M11) and control
//! requests, collecting their replies, activating and withdrawing a staged task, waiting for
//! startup, shutdown, and resetting the frames for a new child (M8). Every method may be called
//! from any thread of the parent: each claim is a compare-exchange (rule M3).

#![expect(unsafe_code, reason = "filling and draining frames the parent claimed; rules M2-M4, M6, M10")]

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::layout::{ARGS_CAPACITY, CONFIG_BYTES};
use super::{
    BUSY, CONTROL_DONE, CONTROL_REQUEST, FALLBACK_CODE, FrameError, INIT_FAILED, INIT_READY, Mailbox,
    state_name,
};
use crate::error::{Error, Result};
use crate::sys::futex::spin_then_yield;

/// How often a parent wait re-checks its `give_up` condition (a dead child must not hang it).
pub(super) const GIVE_UP_POLL: Duration = Duration::from_millis(50);

/// How a task is posted ([`Mailbox::post_task_at`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Posting {
    /// The trace key of a captured run's task (rule M10).
    pub(crate) trace: Option<(u64, u64, u32, u32)>,
    /// The lease of the task's run: slot and generation (rule M12; generation 0: none).
    pub(crate) lease: (u32, u64),
    /// [`FLAG_OVERLAP`](super::FLAG_OVERLAP) or 0.
    pub(crate) flags: u32,
    /// Post as a successor to prepare (`PREPARE_READY`), not a task to run (rule M11).
    pub(crate) stage: bool,
    /// The task on another worker it runs after ([`after_key`](super::after_key); 0: none;
    /// rule M13).
    pub(crate) after: u32,
}

/// What [`Mailbox::withdraw`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Withdrawn {
    /// The child had not taken it: the frame is `IDLE`, the task never reached the child.
    Taken,
    /// The child holds it prepared: it answers `TASK_DONE` with an error, unlaunched.
    Asked,
    /// It was activated or has ended already.
    Late,
}

/// What a parent learned about a child's startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum InitStatus {
    /// Not reported yet (the deadline passed or the caller gave up).
    Pending,
    /// The child is ready; the base frame is `IDLE` again.
    Ready,
    /// The child failed to start, with its message.
    Failed(String),
}

impl Mailbox<'_> {
    /// Posts a task into task frame `ix`: claims the `IDLE` task frame, copies the digest, lets `write` fill the config
    /// bytes (zeroed first) and the args payload and return the payload length, then publishes
    /// `TASK_READY` (Release) and rings the child doorbell.
    ///
    /// Errors: [`ErrorKind::InvalidState`](crate::error::ErrorKind) when the frame is not
    /// `IDLE`; [`ErrorKind::InvalidArgument`](crate::error::ErrorKind) when the returned length
    /// exceeds [`ARGS_CAPACITY`]; any error of `write`. On error (or if `write` panics) the frame
    /// goes back to `IDLE`.
    ///
    /// `posting` carries its run's lease and its flags (rule M12), a captured run's trace key
    /// (its engine, run, task and member, written to the frame's `result`, `command` and `arg0`
    /// so that the child records what it runs for it: rule M10), and whether it is a successor
    /// to prepare beside the running task (`PREPARE_READY`, rule M11) or a task to run
    /// (`TASK_READY`). Clears the frame's acceptance word.
    ///
    /// # Panics
    ///
    /// If `ix >= TASK_FRAMES`.
    pub(crate) fn post_task_at(
        &self,
        ix: usize,
        digest: &[u8; 32],
        posting: &Posting,
        write: impl FnOnce(&mut [u8; CONFIG_BYTES], &mut [u8]) -> Result<usize>,
    ) -> Result<()> {
        let frame = &self.slot.tasks[ix];
        let words = &self.slot.words[ix];
        let handover = frame.state.claim_to_post().map_err(|s| {
            Error::state(format!("cannot post a task: task frame {ix} is {} (not IDLE)", state_name(s)))
        })?;
        // SAFETY: rule M3 — we claimed the frame, so we own every field until `handover` stores
        // the next state (M4); the references die before that.
        let (config, payload) = unsafe { (&mut *frame.config.get(), &mut *frame.payload.get()) };
        config.fill(0);
        let len = write(config, payload)?;
        if len > ARGS_CAPACITY {
            return Err(Error::invalid(format!(
                "args blob exceeds mailbox capacity: {len} bytes, at most {ARGS_CAPACITY}"
            )));
        }
        // SAFETY: rule M3 — still claimed; `len <= ARGS_CAPACITY` was checked above.
        unsafe {
            *frame.digest.get() = *digest;
            *frame.payload_len.get() = len as u32;
            let (engine, run, task, member) = posting.trace.unwrap_or((0, 0, 0, 0));
            *frame.command.get() = run;
            *frame.arg0.get() = u64::from(task) | (u64::from(member) << 32);
            *frame.result.get() = engine;
            *frame.after.get() = posting.after;
        }
        // Rule M12: written under the claim, ordered by the hand-over below.
        words.slot.store(posting.lease.0, Ordering::Relaxed);
        words.generation.store(posting.lease.1, Ordering::Relaxed);
        words.flags.store(posting.flags, Ordering::Relaxed);
        words.accepted.store(0, Ordering::Relaxed);
        words.withdraw.store(0, Ordering::Relaxed);
        frame.error_code.store(0, Ordering::Relaxed);
        if posting.stage {
            handover.post_staged();
        } else {
            handover.post_task();
        }
        self.slot.doorbell.ring();
        Ok(())
    }

    /// Posts a plain task (no lease, not traced) into task frame 0 (tests; see
    /// [`post_task_at`](Mailbox::post_task_at)).
    #[cfg(test)]
    pub(crate) fn post_task(
        &self,
        digest: &[u8; 32],
        write: impl FnOnce(&mut [u8; CONFIG_BYTES], &mut [u8]) -> Result<usize>,
    ) -> Result<()> {
        self.post_task_at(0, digest, &Posting::default(), write)
    }

    /// Collects a finished task from task frame 0 (tests; see
    /// [`take_task_result_at`](Mailbox::take_task_result_at)).
    #[cfg(test)]
    pub(crate) fn take_task_result(&self) -> Option<std::result::Result<(), FrameError>> {
        self.take_task_result_at(0)
    }

    /// Collects a finished task: if task frame `ix` is `TASK_DONE`, reads the error code and
    /// message, returns the frame to `IDLE` and returns `Some(Ok(()))` or `Some(Err(..))`;
    /// otherwise `None`. Never blocks.
    pub(crate) fn take_task_result_at(&self, ix: usize) -> Option<std::result::Result<(), FrameError>> {
        let frame = &self.slot.tasks[ix];
        let _back = frame.state.collect_task()?;
        // SAFETY: rule M3 — we claimed the frame from TASK_DONE, so we own its fields until
        // `_back` hands it back as IDLE, and the Acquire claim sees the child's writes (M4).
        Some(unsafe { frame.read_error() })
    }

    /// Lets the staged task of frame `ix` launch: `FRAME_STAGED` -> `ACTIVATE` by
    /// compare-exchange (rule M11), then rings the child. `Err` holds the state found instead
    /// (still `PREPARE_READY` or `BUSY`: not prepared yet; `TASK_DONE`: it failed to prepare).
    pub(crate) fn activate(&self, ix: usize) -> std::result::Result<(), u32> {
        self.slot.tasks[ix].state.activate()?;
        self.slot.doorbell.ring();
        Ok(())
    }

    /// Withdraws the staged task of frame `ix` (its run was stopped; rule M11): one the child
    /// has not taken yet goes back to `IDLE` at once ([`Withdrawn::Taken`]); a prepared one is
    /// asked to end unlaunched ([`Withdrawn::Asked`]: the child answers `TASK_DONE` with an
    /// error); one the child is still preparing (its frame `BUSY`) is asked through the
    /// sticky withdraw word, which the child reads between pieces of its copy-in
    /// ([`Withdrawn::Late`], as is anything else: it ends as it ends; ask again).
    pub(crate) fn withdraw(&self, ix: usize) -> Withdrawn {
        let frame = &self.slot.tasks[ix];
        if frame.state.take_back_posted() {
            return Withdrawn::Taken;
        }
        match frame.state.ask_withdraw() {
            Ok(_) => {
                self.slot.doorbell.ring();
                Withdrawn::Asked
            }
            Err(BUSY) => {
                self.slot.words[ix].withdraw.store(1, Ordering::Release);
                self.slot.doorbell.ring();
                Withdrawn::Late
            }
            Err(_) => Withdrawn::Late,
        }
    }

    /// Asks the child not to start the chained task of frame `ix` (its run was stopped; rules
    /// M12, M13): sets the frame's sticky withdraw word. The child answers it unrun unless it
    /// started it already.
    pub(crate) fn withdraw_chained(&self, ix: usize) {
        self.settle_after(ix, false);
    }

    /// Settles the task of frame `ix`, posted to run after another worker's task (rule M13),
    /// once that task ended: `go` when it succeeded (the word goes 0 -> [`CHAIN_GO`](super::CHAIN_GO)
    /// by compare-exchange, so a withdraw stays), else withdrawn; then rings the child.
    pub(crate) fn settle_after(&self, ix: usize, go: bool) {
        let word = &self.slot.words[ix].withdraw;
        if go {
            let _ = word.compare_exchange(0, super::CHAIN_GO, Ordering::AcqRel, Ordering::Acquire);
        } else {
            word.store(super::CHAIN_WITHDRAW, Ordering::Release);
        }
        self.slot.doorbell.ring();
    }

    /// When the child had the staged task of frame `ix` prepared, once it has (its frame is
    /// `FRAME_STAGED`; rule M11).
    pub(crate) fn prepared_at(&self, ix: usize) -> Option<u64> {
        // Acquire: the child wrote the time before its Release store of FRAME_STAGED.
        self.slot.tasks[ix].state.is_staged().then(|| self.slot.words[ix].prepared_ns.load(Ordering::Relaxed))
    }

    /// The lease last posted into task frame `ix` (slot, generation; generation 0: none).
    /// [`Mailbox::reset_for_new_child`] keeps it, so a replacement chip starts from the marks
    /// its predecessor was given (rule M12).
    pub(crate) fn posted_lease(&self, ix: usize) -> (u32, u64) {
        let words = &self.slot.words[ix];
        (words.slot.load(Ordering::Relaxed), words.generation.load(Ordering::Relaxed))
    }

    /// Whether the task of frame `ix` launched (its sticky acceptance word, rule M12).
    pub(crate) fn accepted(&self, ix: usize) -> bool {
        self.slot.words[ix].accepted.load(Ordering::Acquire) != 0
    }

    /// Task frame 0's state word (Acquire).
    pub(crate) fn task_state(&self) -> u32 {
        self.task_state_at(0)
    }

    /// Task frame `ix`'s state word (Acquire).
    pub(crate) fn task_state_at(&self, ix: usize) -> u32 {
        self.slot.tasks[ix].state.get()
    }

    /// The base frame's state word (Acquire), for diagnostics.
    pub(crate) fn base_state(&self) -> u32 {
        self.slot.base.state.get()
    }

    /// Posts a control request: claims the `IDLE` base frame, writes `command`, `arg0`, `digest`
    /// and `payload`, publishes `CONTROL_REQUEST` (Release) and rings the child doorbell.
    ///
    /// Errors: [`ErrorKind::InvalidArgument`](crate::error::ErrorKind) when the payload exceeds
    /// [`ARGS_CAPACITY`]; [`ErrorKind::InvalidState`](crate::error::ErrorKind) when the base
    /// frame is not `IDLE` (startup not collected yet, or a control still in flight).
    pub(crate) fn post_control(
        &self,
        command: u64,
        arg0: u64,
        digest: &[u8; 32],
        payload: &[u8],
    ) -> Result<()> {
        if payload.len() > ARGS_CAPACITY {
            return Err(Error::invalid(format!(
                "control payload exceeds mailbox capacity: {} bytes, at most {ARGS_CAPACITY}",
                payload.len()
            )));
        }
        let frame = &self.slot.base;
        let handover = frame.state.claim_to_post().map_err(|s| {
            Error::state(format!(
                "cannot post control {command}: the base frame is {} (not IDLE)",
                state_name(s)
            ))
        })?;
        // SAFETY: rule M3 — we claimed the frame, so we own its fields until `handover` stores
        // the next state (M4); the payload length was checked above.
        unsafe {
            *frame.command.get() = command;
            *frame.arg0.get() = arg0;
            *frame.result.get() = 0;
            frame.write_request(digest, payload);
        }
        frame.error_code.store(0, Ordering::Relaxed);
        handover.post_control();
        self.slot.doorbell.ring();
        Ok(())
    }

    /// Waits until the base frame is `CONTROL_DONE` (spin, yield, then futex on its state word),
    /// reads the result or error and returns the frame to `IDLE`.
    ///
    /// Returns `None` when the deadline passes or `give_up()` returns true (checked at least
    /// every [`GIVE_UP_POLL`], so a dead child cannot hang the caller); the request then stays in
    /// flight. Returns `Some(Err(..))` with code −1 when no control request is in flight.
    pub(crate) fn wait_control_done(
        &self,
        deadline: Option<Instant>,
        give_up: impl Fn() -> bool,
    ) -> Option<std::result::Result<u64, FrameError>> {
        let frame = &self.slot.base;
        spin_then_yield(deadline, || frame.state.get() == CONTROL_DONE);
        loop {
            let state = frame.state.get();
            match state {
                CONTROL_DONE => {
                    if let Some(_back) = frame.state.collect_control() {
                        // SAFETY: rule M3 — we claimed the frame from CONTROL_DONE, so we own its
                        // fields until `_back` hands it back as IDLE, and the Acquire claim sees
                        // the child's writes (M4).
                        let result = unsafe {
                            match frame.read_error() {
                                Ok(()) => Ok(*frame.result.get()),
                                Err(e) => Err(e),
                            }
                        };
                        return Some(result);
                    }
                    continue;
                }
                CONTROL_REQUEST | BUSY => {}
                other => {
                    return Some(Err(FrameError::new(
                        FALLBACK_CODE,
                        format!("no control request in flight: the base frame is {}", state_name(other)),
                    )));
                }
            }
            let timeout = bounded_timeout(deadline, &give_up)?;
            frame.state.wait_while(state, timeout);
        }
    }

    /// Waits for the child's startup report (`INIT_READY` / `INIT_FAILED` on the base frame)
    /// until `deadline`, sleeping on the base state word.
    ///
    /// `Pending` when the deadline passes or `give_up()` returns true (checked at least every
    /// [`GIVE_UP_POLL`]). On `Ready` the base frame goes back to `IDLE`; `INIT_FAILED` stays.
    pub(crate) fn wait_init(&self, deadline: Instant, give_up: impl Fn() -> bool) -> InitStatus {
        let frame = &self.slot.base;
        loop {
            let state = frame.state.get();
            match state {
                INIT_READY => {
                    if frame.state.accept_ready() {
                        return InitStatus::Ready;
                    }
                    continue;
                }
                INIT_FAILED => {
                    // SAFETY: rule M2 — INIT_FAILED is terminal: nobody writes the fields again,
                    // and the Acquire load above sees the child's message (M4).
                    return InitStatus::Failed(unsafe { frame.read_message() });
                }
                _ => {}
            }
            let Some(timeout) = bounded_timeout(Some(deadline), &give_up) else {
                return InitStatus::Pending;
            };
            frame.state.wait_while(state, timeout);
        }
    }

    /// Sets the sticky shutdown word (Release) and rings the child doorbell.
    pub(crate) fn request_shutdown(&self) {
        self.slot.shutdown.store(1, Ordering::Release);
        self.slot.doorbell.ring();
    }

    /// The CPU (plus one) the child last ran a task on; 0 when unknown.
    pub(crate) fn child_cpu(&self) -> u32 {
        self.slot.child_cpu.load(Ordering::Relaxed)
    }

    /// Records the CPU the parent posts from (a hint for the child's waits).
    pub(crate) fn set_parent_cpu(&self, cpu: u32) {
        self.slot.parent_cpu.store(cpu, Ordering::Relaxed);
    }

    /// Returns every frame to `IDLE` for a new child, after the old one died (rule M8): the
    /// caller has seen the old child reaped, keeps every other parent-side party (the scheduler,
    /// which has the lane out of service; control requests) off this mailbox until the new
    /// child reports ready, and has not requested shutdown.
    pub(crate) fn reset_for_new_child(&self) {
        for frame in std::iter::once(&self.slot.base).chain(&self.slot.tasks) {
            frame.error_code.store(0, Ordering::Relaxed);
            frame.state.reset();
        }
        for words in &self.slot.words {
            words.accepted.store(0, Ordering::Relaxed);
            words.withdraw.store(0, Ordering::Relaxed);
        }
        self.slot.child_pid.store(0, Ordering::Release);
        self.slot.child_cpu.store(0, Ordering::Relaxed);
        self.slot.done.store(0, Ordering::Release);
        self.slot.waiters.store(0, Ordering::Release);
        self.slot.granted_depth.store(0, Ordering::Relaxed);
    }

    /// The pipeline depth the child granted (0: none), as published before it reported ready
    /// (M9); read it after [`Mailbox::wait_init`] returned [`InitStatus::Ready`].
    pub(crate) fn granted_depth(&self) -> u32 {
        self.slot.granted_depth.load(Ordering::Relaxed)
    }

    /// The recorded child pid (Acquire; 0 if none was recorded).
    pub(crate) fn child_pid(&self) -> u32 {
        self.slot.child_pid.load(Ordering::Acquire)
    }
}

/// The next futex timeout of a parent wait: at most [`GIVE_UP_POLL`], at most the time left.
/// `None` when the caller gives up or the deadline has passed.
fn bounded_timeout(deadline: Option<Instant>, give_up: &impl Fn() -> bool) -> Option<Duration> {
    if give_up() {
        return None;
    }
    match deadline {
        None => Some(GIVE_UP_POLL),
        Some(d) => match d.checked_duration_since(Instant::now()) {
            Some(left) if !left.is_zero() => Some(left.min(GIVE_UP_POLL)),
            _ => None,
        },
    }
}
