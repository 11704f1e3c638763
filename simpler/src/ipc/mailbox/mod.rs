//! Mailboxes: the local endpoint wire contract between a parent and its child processes.
//!
//! One [`SharedRegion`](crate::sys::mem::SharedRegion) (a memfd, rule R2 of `sys::mem`), which every child maps, holds a parent
//! [`Doorbell`](crate::sys::futex::Doorbell) and `N` mailboxes, one per child. The parent doorbell is rung by every child when
//! it finishes a task or a control request (and may be rung by in-process parties), so one
//! thread can sleep on it for all its children. Each mailbox holds a child doorbell (the child
//! sleeps on it; the parent rings it after posting a task, a control request, or shutdown), a
//! sticky shutdown word, the child's pid, a **base frame** (startup and control) and four **task
//! frames**: nested Workers use the first only; a chip child that prepares a successor run's
//! task beside the one it runs uses two (rule M11); a SUB worker all four, for its running
//! task and up to three chained behind it (rule M13).
//!
//! # Layout
//!
//! All `#[repr(C)]`, native endianness, checked at compile time: the tables are in [`layout`]
//! (region: the parent doorbell, then mailbox `i` at 64 + i × [`MAILBOX_SIZE`](layout::MAILBOX_SIZE); mailbox: child
//! doorbell, words, base frame, four task frames; frame: state word, error code, request and
//! reply fields, payload, error message).
//!
//! # Files
//!
//! * `mod.rs` (this file): the states, the protocols and the rules; [`Mailbox`], the typed view
//!   of one mailbox; [`FrameError`].
//! * `layout.rs`: the region, mailbox and frame layouts ([`MailboxRegion`] maps them) and the
//!   frame's field accessors.
//! * `state.rs`: the state word, a newtype whose methods are the protocol steps below (each
//!   claim, hand-over and compare-exchange of M3, M4 and M11 with its ordering), so no other
//!   code stores a state or compares-and-exchanges one; generic over the atomic, so the `loom`
//!   models drive the same steps.
//! * `parent.rs`: the parent's side of a mailbox (post, collect, activate, withdraw, control,
//!   startup, shutdown, a new child).
//! * `child.rs`: the child's side ([`TaskRequest`], [`ControlRequest`], replies, startup).
//! * `hostile.rs` (`fuzz`): `HostileFrames`, the fuzz harness's hostile peer.
//! * `loom_models.rs` (`--cfg loom`), `tests.rs`.
//!
//! # States and protocols
//!
//! States: [`IDLE`] = 0, [`TASK_READY`] = 1, [`TASK_DONE`] = 2, [`CONTROL_REQUEST`] = 4,
//! [`CONTROL_DONE`] = 5, [`INIT_READY`] = 6, [`INIT_FAILED`] = 7, [`BUSY`] = 8: claimed by
//! one party that is filling or draining the frame (a transient state nobody waits for long,
//! but for a staged task the child prepares, M11),
//! and on a task frame holding a staged successor (M11): [`PREPARE_READY`] = 9,
//! [`FRAME_STAGED`] = 10, [`ACTIVATE`] = 11, [`TASK_LAUNCHED`] = 12, [`WITHDRAW`] = 13.
//!
//! Protocols, each step named after the [`StateWord`](state::StateWord) method that makes it:
//!
//! * Task: parent `IDLE → BUSY → TASK_READY` (`claim_to_post`, `post_task`;
//!   [`Mailbox::post_task_at`]), child `TASK_READY → BUSY` (`take_task`;
//!   [`Mailbox::task_request_at`]) `→ TASK_DONE` (`reply_task`; [`Mailbox::finish_task`]), parent
//!   `TASK_DONE → BUSY → IDLE` (`collect_task`; [`Mailbox::take_task_result_at`]).
//! * Staged successor (M11): parent `IDLE → BUSY → PREPARE_READY` (`claim_to_post`,
//!   `post_staged`), child `PREPARE_READY → BUSY` (`take_staged`) (prepares) `→ FRAME_STAGED`
//!   (`publish_staged`; [`TaskRequest::publish_staged`]), parent `FRAME_STAGED → ACTIVATE`
//!   (`activate`; [`Mailbox::activate`]), child `ACTIVATE → TASK_LAUNCHED` (`take_activation`;
//!   [`TaskRequest::activation`]) `→ TASK_DONE`; or withdrawn: parent `PREPARE_READY → BUSY →
//!   IDLE` (`take_back_posted`) or `FRAME_STAGED → WITHDRAW` (`ask_withdraw`;
//!   [`Mailbox::withdraw`]), child `WITHDRAW → BUSY` (`take_activation`) `→ TASK_DONE` with an
//!   error. A child that answers a staged frame first takes it back to `BUSY`
//!   (`reclaim_to_reply`).
//! * Control: the same on the base frame with `CONTROL_REQUEST` / `CONTROL_DONE`
//!   (`post_control`, `control_posted`, `claim_to_reply_control`, `reply_control`,
//!   `collect_control`; [`Mailbox::post_control`], [`Mailbox::finish_control`],
//!   [`Mailbox::wait_control_done`]).
//! * Startup: child `IDLE → INIT_READY` (`report_ready`), or `IDLE → BUSY → INIT_FAILED` with a
//!   message (`claim_to_report_failure`, `report_failed`; [`Mailbox::publish_init`]); the parent
//!   returns `INIT_READY` to `IDLE` (`accept_ready`; [`Mailbox::wait_init`]); `INIT_FAILED` is
//!   terminal.
//! * A new child (M8): every frame back to `IDLE` (`reset`; [`Mailbox::reset_for_new_child`]).
//! * Shutdown: the parent sets the sticky shutdown word and rings the child doorbell
//!   ([`Mailbox::request_shutdown`]); the child checks it at the top of every loop iteration.
//!
//! # Rules
//!
//! * **M1 (layout).** The region is one zero-filled, page-aligned `MAP_SHARED` mapping of a
//!   memfd (rules R1, R2 of `sys::mem`) that every process of the tree maps (a forked child at
//!   the same address, one started by exec wherever its kernel puts it: the layout holds no
//!   address), and it lives as long as the [`MailboxRegion`] that every [`Mailbox`] borrows. Every
//!   field is an atomic or an `UnsafeCell` of integers or bytes: all-zero bytes are a valid
//!   value of every type (every frame `IDLE`, doorbells at zero), a shared reference to the
//!   layout never asserts that the non-atomic bytes are immutable, and all offsets are multiples
//!   of the fields' alignment.
//! * **M2 (ownership by state).** A frame's non-atomic fields (`command`, `arg0`, `result`,
//!   `digest`, `config`, `payload_len`, `payload`, `error_msg`) belong to the party the state
//!   word names, and only that party accesses them:
//!   `IDLE` — nobody (the parent may claim it; on the base frame before startup is reported, the
//!   child may too); `BUSY` — whoever moved the frame into `BUSY`; `TASK_READY`,
//!   `CONTROL_REQUEST` — the child; `PREPARE_READY` — nobody until the child (to prepare) or the
//!   parent (to withdraw) claims it; `FRAME_STAGED`, `ACTIVATE`, `WITHDRAW`, `TASK_LAUNCHED` —
//!   the child, which claimed it from `PREPARE_READY` (the parent only moves the state word
//!   between them, M11); `TASK_DONE`, `CONTROL_DONE` — nobody until the parent claims
//!   it; `INIT_READY` — nobody (no fields carried); `INIT_FAILED` — terminal: nobody writes any
//!   field again, anyone may read.
//! * **M3 (claims).** A party takes a frame it may claim (parent: `IDLE`, `TASK_DONE`,
//!   `CONTROL_DONE`, and a task frame's `PREPARE_READY` to withdraw it, M11; child:
//!   `TASK_READY`, `PREPARE_READY`, `CONTROL_REQUEST` before replying, and the base
//!   frame's `IDLE` before startup is reported) only by a compare-exchange of the state word to
//!   `BUSY`, never by a load followed by writes; so two threads can never both own a frame, and a
//!   claim that loses a race fails without touching a field.
//! * **M4 (hand-over).** An owner gives a frame up by a Release store of the next state after
//!   its last access to the fields. A party that then observes that state with an Acquire load
//!   or an Acquire compare-exchange sees every field write made before the store. Parent to
//!   child: `TASK_READY`, `PREPARE_READY`, `CONTROL_REQUEST`; child to parent: `TASK_DONE`, `CONTROL_DONE`,
//!   `INIT_READY`, `INIT_FAILED`; back to nobody: `IDLE`.
//! * **M5 (the task guard).** The child takes a task by claiming its frame (`TASK_READY` or
//!   `PREPARE_READY` → `BUSY`, M3) in [`Mailbox::task_request_at`], which returns a
//!   [`TaskRequest`] guard (a staged one keeps the fields while the frame is `FRAME_STAGED`,
//!   `ACTIVATE`, `WITHDRAW` or `TASK_LAUNCHED`, M11); the
//!   request's slices borrow the guard, and the guard is consumed by [`Mailbox::finish_task`]
//!   (or, if dropped unfinished, still writes an error reply), which hands the frame over as
//!   `TASK_DONE` (M4). So the types enforce that no slice of a request outlives the child's
//!   ownership of the frame. Control requests are read in place and copied out: the
//!   child-side control methods ([`Mailbox::control_request`], [`Mailbox::finish_control`])
//!   are called by one thread, the child loop, so no reply hands the base frame back while
//!   the request is still being copied.
//! * **M6 (untrusted contents).** No value read from a frame can cause an out-of-bounds access:
//!   `payload_len` is clamped to [`ARGS_CAPACITY`], an error message stops at the first NUL or
//!   at [`ERROR_MSG_CAPACITY`](layout::ERROR_MSG_CAPACITY) and is decoded lossily, and unknown states are reported, not
//!   trusted. A child that writes garbage makes the parent read garbage bytes, never UB.
//! * **M7 (wake-ups).** Every state change a peer may sleep on is followed by a wake:
//!   posting a task, a control request or shutdown rings the child doorbell after the Release
//!   store; finishing a task or control rings the parent doorbell; [`Mailbox::finish_control`]
//!   and [`Mailbox::publish_init`] also futex-wake the base state word, where
//!   [`Mailbox::wait_control_done`] and [`Mailbox::wait_init`] sleep. A waiter on a doorbell
//!   follows rule D3 of `sys::futex` (read `seq`, check the states, then wait), so no post is
//!   missed.
//! * **M8 (a new child).** Once a child is reaped, its mailbox has one party left, the parent;
//!   [`Mailbox::reset_for_new_child`] may then return every frame to `IDLE` (atomic stores
//!   only, no field access) before a replacement child starts on it, provided no parent-side
//!   party uses the mailbox until that child reports ready (the scheduler keeps the lane out of
//!   service, control requests are refused for a dead worker and serialized with the
//!   replacement). The replacement then follows the startup protocol as a first child does.
//!   A task the scheduler had not yet seen end when the frames were reset is failed by the
//!   endpoint, which keeps the pid each frame's task was posted to (its frame is `IDLE` now:
//!   nothing there is claimed).
//!
//! * **M9 (granted depth).** A chip child stores the pipeline depth it grants in
//!   `granted_depth` before it reports `INIT_READY`; the parent reads it only after
//!   [`Mailbox::wait_init`] saw `INIT_READY` (Acquire), so the Release store of `INIT_READY`
//!   orders it (the word itself is atomic and Relaxed). SUB and nested children publish none
//!   (0). [`Mailbox::reset_for_new_child`] clears it.
//!
//! * **M10 (trace key).** In the task frame, `command`, `arg0` and `result` carry the posting
//!   run's number, the task's number (low 32 bits of `arg0`; its member of a group in the high
//!   32) and the posting engine's number when the run is captured, and zeros when it is not
//!   ([`Mailbox::post_task_at`], from the `trace` of its [`Posting`]); they are written and
//!   read under the frame's ownership (M3) like the other fields. The child leaves the records
//!   of what it runs for the task in the trace log (`sys::tracelog`) under that key; a run
//!   number of 0, or a task number past `u32`, is no key.
//!
//! * **M11 (the two-frame lane).** A chip child that grants a pipeline depth of 2 runs one task
//!   and holds at most one staged successor, one per task frame (frames 0 and 1; a chip leaves
//!   frame 2 `IDLE`): the parent posts a task to run (`TASK_READY`) only into the one of the two
//!   that holds no staged task and only while none runs, and
//!   a staged one (`PREPARE_READY`) only while none is staged. The child claims a staged frame
//!   (M3), prepares its task, and publishes `FRAME_STAGED` (Release) keeping the fields; from
//!   then on the parent changes only the state word, by compare-exchange: `FRAME_STAGED →
//!   ACTIVATE` once nothing runs on the chip, or `FRAME_STAGED → WITHDRAW`; and the child,
//!   also by compare-exchange, takes `ACTIVATE → TASK_LAUNCHED` (and launches) or `WITHDRAW →
//!   BUSY`. A child that answers a staged frame takes it back to `BUSY` by compare-exchange
//!   first, so no move of the parent's is lost; the answer is `TASK_DONE` (M4) as for any task.
//!   A staged task the child has not claimed the parent may take back (`PREPARE_READY → BUSY`,
//!   M3); one the child holds `BUSY` while it prepares it (its inputs go in piece by piece)
//!   the parent asks to end by setting the sticky withdraw word (M12), which the child reads
//!   between pieces and then answers `TASK_DONE` with an error, unlaunched. Every step rings
//!   the peer (M7).
//! * **M12 (the task words).** Each task frame has a block of atomic words in the mailbox's
//!   header: the lease of the task's run (`slot`, `generation`; generation 0: none) and its
//!   `flags` ([`FLAG_OVERLAP`]), written by the poster under its claim before the hand-over and
//!   read by the child after its claim (Relaxed, ordered by the state word, M4); `prepared_ns`,
//!   written by the child before it publishes `FRAME_STAGED` and read by the parent after an
//!   Acquire load of that state; and the sticky `accepted` word, which the child sets (Release)
//!   once the task is prepared, just before it launches (a kernel run on the child's own
//!   thread has ended when the launch returns), and the parent clears when it posts into the
//!   frame, so a parent that sees the child die can say whether its task had launched. The
//!   word is that record, not a launch fence: a staged task launches only from `ACTIVATE`,
//!   which the parent sets by compare-exchange from `FRAME_STAGED`, the state a withdraw
//!   moves from too (M11), so whether it runs is settled on the parent's side by whichever of
//!   the two won (a withdraw that lost returns `Withdrawn::Late` and the task is the running
//!   one); a task posted to run is never withdrawn (a stopped run's child is killed, and its
//!   death ends the task). A frame's lease must be a minted one: a child refuses a task whose
//!   generation is 0, unrun (rule L1 of `engine::lease`). And the
//!   sticky `withdraw` word, set by the parent (Release) and read by the child (Acquire) while
//!   it prepares a staged task (M11), cleared when the parent posts. A child's
//!   replacement (M8) keeps the lease words: the new chip reads them before it reports ready
//!   and admits them as its high-water marks, so a lease older than its predecessor's is
//!   refused after a restart too.
//! * **M13 (chained tasks).** A SUB child takes tasks from all task frames. The parent posts
//!   a task to run into the frame after the one it posted last (in turn), only into an
//!   `IDLE` frame, with a sequence number in the high half of `flags` that it increments with
//!   every post ([`flag_seq`]). While tasks are posted and not yet collected, the parent may
//!   post more, up to one per frame, flagged [`FLAG_CHAINED`]: a task whose unfinished
//!   producers are tasks posted before it to this child, and for the first chained one at
//!   most one task on a sibling (its `after` word, below; nothing is chained behind a task
//!   whose wait for a sibling is not settled, nor behind a chained task that carries such a
//!   word). The child claims the `TASK_READY` frame that is not
//!   chained first, else the chained one whose sequence number follows the task it finished
//!   last (reading the frames again before it takes one that does not: the post of the one
//!   that follows was made first, so the Acquire load that saw the later one makes it
//!   visible); it runs a chained
//!   task only if it finished that task itself, successfully, and the sticky `withdraw` word
//!   (M12; the parent sets it when the task's run is stopped) is not [`CHAIN_WITHDRAW`], and otherwise answers
//!   it `TASK_DONE` with [`ERR_NOT_RUN`](crate::ipc::child::ERR_NOT_RUN) at once. The parent
//!   never takes a `TASK_READY` frame back, so a frame the child found `TASK_READY` holds the
//!   same task when it claims it; every chained task is answered, and the parent collects the
//!   frames in the order it posted them. To an idle SUB child the parent may also post a
//!   task to run after a task on a sibling (the frame's `after` word names the sibling's
//!   mailbox and that task's sequence number, [`after_key`]), and a chained task may carry such
//!   a word too: the child runs it behind its own task's success, then after the sibling's
//!   (the parent may settle that wait before the child's own task ends). Every SUB child records, after
//!   it answered each task, that task's sequence number, its success, and whether it was a
//!   chained task behind its predecessor's success (so that one succeeded, whether this one
//!   then ran or was answered unrun), in its mailbox's `done` word
//!   (SeqCst), then rings the siblings whose bits it clears from its `waiters` word. A child
//!   waiting for a sibling's task reads the sibling's `done` first, then its own frame's
//!   withdraw word: [`CHAIN_GO`] runs it, [`CHAIN_WITHDRAW`] answers it unrun, and otherwise a
//!   `done` naming that task decides (success runs it, failure answers it unrun), as does one
//!   naming the next task that ran behind its success; any other record waits for the word.
//!   Before it sleeps it sets its bit in the sibling's `waiters` and checks again. The parent
//!   sets the word once it has seen the sibling's task end, before it posts to the sibling
//!   anything that is not chained behind that task; a task chained behind it runs only behind
//!   its success, so no record is taken for another task's.
//!
//! # Memory ordering
//!
//! * The state word carries the frame: Release stores hand a frame over and Acquire loads or
//!   compare-exchanges take it (M4). Claims use Acquire on success so that the claimer's writes
//!   cannot be reordered before the previous owner's hand-over (M3).
//! * `error_code` is atomic only so that it may be read without `unsafe`; it is written and read
//!   by the frame's owner alone, so its accesses are Relaxed and ordered by the state word.
//! * `shutdown` is a Release store (0 → 1) by the parent, read with Acquire by the child;
//!   `child_pid` likewise.
//! * Wake-ups go through [`Doorbell`](crate::sys::futex::Doorbell) (SeqCst Dekker pairing, rules D1–D3 of `sys::futex`) or a
//!   shared futex on the state word, whose compare-and-block the kernel does atomically with
//!   respect to the wake.

mod child;
#[cfg(feature = "fuzz")]
mod hostile;
mod layout;
#[cfg(all(test, loom))]
mod loom_models;
mod parent;
mod state;
#[cfg(test)]
mod tests;

use std::fmt;

pub(crate) use child::{ControlRequest, TaskRequest};
#[cfg(feature = "fuzz")]
pub(crate) use hostile::HostileFrames;
#[cfg(any(test, feature = "fuzz"))]
pub(crate) use layout::ERROR_MSG_CAPACITY;
#[cfg(feature = "fuzz")]
pub(crate) use layout::FRAME_SIZE;
pub(crate) use layout::{ARGS_CAPACITY, CONFIG_BYTES, MailboxRegion, TASK_FRAMES};
pub(crate) use parent::{InitStatus, Posting, Withdrawn};
pub(crate) use state::Activation;

use layout::Slot;

/// Frame state: free; the parent may post.
pub(crate) const IDLE: u32 = 0;
/// Task frame state: a task was posted; the child owns the frame.
pub(crate) const TASK_READY: u32 = 1;
/// Task frame state: the child finished the task; the error code and message are valid.
pub(crate) const TASK_DONE: u32 = 2;
/// Base frame state: a control request was posted; the child owns the frame.
pub(crate) const CONTROL_REQUEST: u32 = 4;
/// Base frame state: the child answered the control request.
pub(crate) const CONTROL_DONE: u32 = 5;
/// Base frame state: the child started up and is ready.
pub(crate) const INIT_READY: u32 = 6;
/// Base frame state: the child failed to start; the error message says why (terminal).
pub(crate) const INIT_FAILED: u32 = 7;
/// Frame state: claimed by one party that is filling or draining it (rule M3).
pub(crate) const BUSY: u32 = 8;
/// Task frame state: a successor's task was posted for preparation beside the running one; the
/// child may claim it (rule M11).
pub(crate) const PREPARE_READY: u32 = 9;
/// Task frame state: the child prepared the posted successor and holds it, unlaunched (M11).
pub(crate) const FRAME_STAGED: u32 = 10;
/// Task frame state: the parent lets the staged task launch (its run is the head now; M11).
pub(crate) const ACTIVATE: u32 = 11;
/// Task frame state: the staged task launched; the child owns the frame until `TASK_DONE` (M11).
pub(crate) const TASK_LAUNCHED: u32 = 12;
/// Task frame state: the parent withdraws the staged task (its run was stopped); the child
/// gives it up unlaunched and answers `TASK_DONE` with an error (M11).
pub(crate) const WITHDRAW: u32 = 13;

/// Task flag (rule M12): the parent has another run in flight, or expects one (the task's run
/// was submitted without waiting), so the child should execute the task where it can still
/// watch its other frame (a successor may be staged meanwhile).
pub(crate) const FLAG_OVERLAP: u32 = 1;

/// Task flag (rule M13): the task is chained behind the task the child runs or ran just before
/// it (the one whose sequence number, [`flag_seq`], is one less): the child starts it only if
/// that one succeeded and the sticky withdraw word is not [`CHAIN_WITHDRAW`] (and, with an
/// `after` word, once the sibling's task succeeded), and otherwise answers it
/// `TASK_DONE` with [`ERR_NOT_RUN`](crate::ipc::child::ERR_NOT_RUN), unrun.
pub(crate) const FLAG_CHAINED: u32 = 2;

/// The flags word's high half: the task's sequence number on its worker (rule M13), which the
/// parent increments with every task it posts to the worker (wrapping).
pub(crate) const fn flag_seq(seq: u16) -> u32 {
    (seq as u32) << 16
}

/// The sticky withdraw word's value (rule M12) that withdraws a chained task (M13).
pub(crate) const CHAIN_WITHDRAW: u32 = 1;

/// The sticky withdraw word's value that lets a task posted to run after another worker's
/// task start: that task succeeded (M13).
pub(crate) const CHAIN_GO: u32 = 2;

/// The `after` word of a task that runs after the task with sequence number `seq` on the
/// worker of mailbox `mailbox` (rule M13); `None` for a mailbox past 4095.
pub(crate) fn after_key(mailbox: usize, seq: u16) -> Option<u32> {
    (mailbox < 1 << 12).then(|| 1 << 31 | (mailbox as u32) << 16 | u32::from(seq))
}

/// The mailbox and sequence number an `after` word names ([`after_key`]); `None` for 0 (or a
/// word without its mark).
pub(crate) fn after_of(word: u32) -> Option<(usize, u16)> {
    (word >> 31 == 1).then_some((((word >> 16) & 0xfff) as usize, word as u16))
}

/// The sequence number a flags word carries ([`flag_seq`]).
pub(crate) const fn seq_of(flags: u32) -> u16 {
    (flags >> 16) as u16
}

/// The name of a state value, for messages (`"UNKNOWN"` for garbage).
pub(crate) fn state_name(state: u32) -> &'static str {
    match state {
        IDLE => "IDLE",
        TASK_READY => "TASK_READY",
        TASK_DONE => "TASK_DONE",
        CONTROL_REQUEST => "CONTROL_REQUEST",
        CONTROL_DONE => "CONTROL_DONE",
        INIT_READY => "INIT_READY",
        INIT_FAILED => "INIT_FAILED",
        BUSY => "BUSY",
        PREPARE_READY => "PREPARE_READY",
        FRAME_STAGED => "FRAME_STAGED",
        ACTIVATE => "ACTIVATE",
        TASK_LAUNCHED => "TASK_LAUNCHED",
        WITHDRAW => "WITHDRAW",
        _ => "UNKNOWN",
    }
}

/// A typed view of one mailbox in a [`MailboxRegion`] (`Copy`, `Send + Sync`).
///
/// Parent-side methods (`parent.rs`) may be called from any thread (every claim is a
/// compare-exchange, rule M3); child-side methods (`child.rs`) belong to the child loop (rule
/// M5).
#[derive(Clone, Copy)]
pub(crate) struct Mailbox<'a> {
    slot: &'a Slot,
}

impl fmt::Debug for Mailbox<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mailbox")
            .field("base", &state_name(self.base_state()))
            .field("task", &state_name(self.task_state()))
            .field("task2", &state_name(self.task_state_at(1)))
            .field("shutdown", &self.shutdown_requested())
            .field("child_pid", &self.child_pid())
            .finish()
    }
}

/// A failure reported through a frame: a non-zero code and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FrameError {
    /// The error code; never 0 once read back (0 means success on the wire).
    pub(crate) code: i32,
    /// The message, at most [`ERROR_MSG_CAPACITY`](layout::ERROR_MSG_CAPACITY) − 1 bytes once
    /// read back.
    pub(crate) message: String,
}

impl FrameError {
    /// A frame error with `code` and `message`.
    pub(crate) fn new(code: i32, message: impl Into<String>) -> FrameError {
        FrameError { code, message: message.into() }
    }
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.message, self.code)
    }
}

impl std::error::Error for FrameError {}

/// The code written for an `Err` whose code is 0, so it is never mistaken for success.
const FALLBACK_CODE: i32 = -1;
