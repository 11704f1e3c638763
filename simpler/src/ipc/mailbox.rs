//! Mailboxes: the local endpoint wire contract between a parent and its child processes.
//!
//! One [`SharedRegion`] (a memfd, rule R2 of `sys::mem`), which every child maps, holds a parent
//! [`Doorbell`] and `N` mailboxes, one per child. The parent doorbell is rung by every child when
//! it finishes a task or a control request (and may be rung by in-process parties), so one
//! thread can sleep on it for all its children. Each mailbox holds a child doorbell (the child
//! sleeps on it; the parent rings it after posting a task, a control request, or shutdown), a
//! sticky shutdown word, the child's pid, a **base frame** (startup and control) and two **task
//! frames**: SUB workers and nested Workers use the first only; a chip child that prepares a
//! successor run's task beside the one it runs uses both (rule M11).
//!
//! # Layout
//!
//! All `#[repr(C)]`, native endianness (parent and children are one binary on one host); the
//! offsets are checked at compile time.
//!
//! Region:
//!
//! | Offset | Size | Field |
//! | ------ | ---- | ----- |
//! | 0 | 64 | parent [`Doorbell`] (`seq` u32 @0, `sleepers` u32 @4) |
//! | 64 + i × [`MAILBOX_SIZE`] | [`MAILBOX_SIZE`] = 196 800 | mailbox `i` |
//!
//! Mailbox:
//!
//! | Offset | Size | Field |
//! | ------ | ---- | ----- |
//! | 0 | 64 | child [`Doorbell`] |
//! | 64 | 4 | `shutdown` u32: 0 → 1 only, written by the parent, never cleared |
//! | 68 | 4 | `child_pid` u32 |
//! | 72 | 4 | `child_cpu` u32: CPU + 1 the child last ran a task on (a wait hint, 0 = unknown) |
//! | 76 | 4 | `parent_cpu` u32: CPU + 1 the parent last posted from (a wait hint) |
//! | 80 | 4 | `granted_depth` u32: the pipeline depth a chip child grants (M9); 0 = none |
//! | 84 | 44 | reserved (0) |
//! | 128 + 32 k | 32 | task frame `k`'s words (M12): `generation` u64 @0 and `slot` u32 @16 (the lease of the task's run), `prepared_ns` u64 @8, `flags` u32 @20, `accepted` u32 @24 (sticky), reserved u32 @28 |
//! | 192 | 65 536 | base frame (startup + control) |
//! | 65 728 + 65 536 k | 65 536 | task frame `k` (k = 0, 1) |
//!
//! Frame ([`FRAME_SIZE`] = 64 KiB, 64-byte aligned):
//!
//! | Offset | Size | Field |
//! | ------ | ---- | ----- |
//! | 0 | 4 | `state` u32 (atomic): one of the state constants below |
//! | 4 | 4 | `error_code` i32 (atomic): 0 = success |
//! | 8 | 8 | `command` u64: control sub-command (base frame); the run number of a captured task (task frame, M10) |
//! | 16 | 8 | `arg0` u64: control argument; the task number of a captured task (task frame, M10) |
//! | 24 | 8 | `result` u64: control result; the engine number of a captured task (task frame, M10) |
//! | 32 | 32 | `digest`: callable digest (task) or control digest |
//! | 64 | 1 144 | `config`: opaque bytes, an encoded `CallConfig` ([`CONFIG_BYTES`]) |
//! | 1 208 | 4 | `payload_len` u32 |
//! | 1 212 | 4 | reserved (0) |
//! | 1 216 | 63 808 | `payload`: the TaskArgs blob or control payload ([`ARGS_CAPACITY`]) |
//! | 65 024 | 512 | `error_msg`: NUL-terminated, truncated ([`ERROR_MSG_CAPACITY`]) |
//!
//! States: [`IDLE`] = 0, [`TASK_READY`] = 1, [`TASK_DONE`] = 2, [`CONTROL_REQUEST`] = 4,
//! [`CONTROL_DONE`] = 5, [`INIT_READY`] = 6, [`INIT_FAILED`] = 7, [`BUSY`] = 8: claimed by
//! one party that is filling or draining the frame (a transient state nobody waits for long,
//! but for a staged task the child prepares, M11),
//! and on a task frame holding a staged successor (M11): [`PREPARE_READY`] = 9,
//! [`FRAME_STAGED`] = 10, [`ACTIVATE`] = 11, [`TASK_LAUNCHED`] = 12, [`WITHDRAW`] = 13.
//!
//! Protocols:
//!
//! * Task: parent `IDLE → BUSY → TASK_READY` ([`Mailbox::post_task_at`]), child
//!   `TASK_READY → BUSY` ([`Mailbox::task_request_at`]) `→ TASK_DONE` ([`Mailbox::finish_task`]), parent
//!   `TASK_DONE → BUSY → IDLE` ([`Mailbox::take_task_result_at`]).
//! * Staged successor (M11): parent `IDLE → BUSY → PREPARE_READY`, child `PREPARE_READY → BUSY`
//!   (prepares) `→ FRAME_STAGED` ([`TaskRequest::publish_staged`]), parent `FRAME_STAGED →
//!   ACTIVATE` ([`Mailbox::activate`]), child `ACTIVATE → TASK_LAUNCHED`
//!   ([`TaskRequest::activation`]) `→ TASK_DONE`; or withdrawn: parent `PREPARE_READY → BUSY →
//!   IDLE` or `FRAME_STAGED → WITHDRAW` ([`Mailbox::withdraw`]), child `WITHDRAW → BUSY →
//!   TASK_DONE` with an error.
//! * Control: the same on the base frame with `CONTROL_REQUEST` / `CONTROL_DONE`
//!   ([`Mailbox::post_control`], [`Mailbox::finish_control`], [`Mailbox::wait_control_done`]).
//! * Startup: child `IDLE → INIT_READY`, or `IDLE → BUSY → INIT_FAILED` with a message
//!   ([`Mailbox::publish_init`]); the parent returns `INIT_READY` to `IDLE`
//!   ([`Mailbox::wait_init`]); `INIT_FAILED` is terminal.
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
//!   at [`ERROR_MSG_CAPACITY`] and is decoded lossily, and unknown states are reported, not
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
//!   ([`Mailbox::post_task_traced`]); they are written and read under the frame's ownership
//!   (M3) like the other fields. The child leaves the records of what it runs for the task in
//!   the trace log (`sys::tracelog`) under that key; a run number of 0, or a task number past
//!   `u32`, is no key.
//!
//! * **M11 (the two-frame lane).** A chip child that grants a pipeline depth of 2 runs one task
//!   and holds at most one staged successor, one per task frame: the parent posts a task to run
//!   (`TASK_READY`) only into the frame that holds no staged task and only while none runs, and
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
//!   frame, so a parent that sees the child die can say whether its task had launched; and the
//!   sticky `withdraw` word, set by the parent (Release) and read by the child (Acquire) while
//!   it prepares a staged task (M11), cleared when the parent posts. A child's
//!   replacement (M8) keeps the lease words: the new chip reads them before it reports ready
//!   and admits them as its high-water marks, so a lease older than its predecessor's is
//!   refused after a restart too.
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
//! * Wake-ups go through [`Doorbell`] (SeqCst Dekker pairing, rules D1–D3 of `sys::futex`) or a
//!   shared futex on the state word, whose compare-and-block the kernel does atomically with
//!   respect to the wake.

#![expect(unsafe_code, reason = "typed views of a frame layout that forked processes share; rules M1-M12")]

use std::cell::UnsafeCell;
use std::fmt;
use std::mem::offset_of;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::sys::futex::{Doorbell, futex_wait, futex_wake, spin_then_yield};
use crate::sys::mem::SharedRegion;

/// Size of one frame in bytes.
pub(crate) const FRAME_SIZE: usize = 65536;
/// Bytes of the NUL-terminated error message in a frame (511 characters of text at most).
pub(crate) const ERROR_MSG_CAPACITY: usize = 512;
/// Bytes of the opaque config field (the packed size of a `CallConfig`).
pub(crate) const CONFIG_BYTES: usize = 1144;
/// Offset of the payload inside a frame.
const PAYLOAD_OFFSET: usize = 1216;
/// Payload bytes per frame: the largest TaskArgs blob or control payload (63 808).
pub(crate) const ARGS_CAPACITY: usize = FRAME_SIZE - PAYLOAD_OFFSET - ERROR_MSG_CAPACITY;
/// Size of one mailbox (child doorbell, words, base frame, task frame) in bytes.
pub(crate) const MAILBOX_SIZE: usize = size_of::<Slot>();
/// Offset of mailbox 0 in the region (after the parent doorbell).
const SLOTS_OFFSET: usize = size_of::<Doorbell>();

/// How often a parent wait re-checks its `give_up` condition (a dead child must not hang it).
pub(crate) const GIVE_UP_POLL: Duration = Duration::from_millis(50);

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

/// Task frames per mailbox: one for the running task, one for a staged successor (M11).
pub(crate) const TASK_FRAMES: usize = 2;

/// Task flag (rule M12): the parent has another run in flight, or expects one (the task's run
/// was submitted without waiting), so the child should execute the task where it can still
/// watch its other frame (a successor may be staged meanwhile).
pub(crate) const FLAG_OVERLAP: u32 = 1;

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

/// One 64 KiB frame (see the module docs for the layout and rules M1–M4).
#[repr(C, align(64))]
struct Frame {
    state: AtomicU32,
    error_code: AtomicI32,
    command: UnsafeCell<u64>,
    arg0: UnsafeCell<u64>,
    result: UnsafeCell<u64>,
    digest: UnsafeCell<[u8; 32]>,
    config: UnsafeCell<[u8; CONFIG_BYTES]>,
    payload_len: UnsafeCell<u32>,
    reserved: UnsafeCell<u32>,
    payload: UnsafeCell<[u8; ARGS_CAPACITY]>,
    error_msg: UnsafeCell<[u8; ERROR_MSG_CAPACITY]>,
}

// SAFETY: rules M2–M5 — the non-atomic fields are accessed only by the single owner the state
// word names, ownership is taken by compare-exchange (M3) and handed over by Release/Acquire on
// the state word (M4), and a task request's slices live only while its guard owns the frame
// (M5); the atomics are Sync themselves.
unsafe impl Sync for Frame {}

// A panic cannot leave a frame half-handed-over: every transition is one atomic store, and a
// writer that unwinds while filling a claimed frame hands it back through `Handover` (M4).
impl std::panic::RefUnwindSafe for Frame {}

/// One mailbox (see the module docs for the layout).
#[repr(C, align(64))]
struct Slot {
    doorbell: Doorbell,
    shutdown: AtomicU32,
    child_pid: AtomicU32,
    /// The CPU (plus one) the child last ran a task on; 0 = unknown. A hint for waits only.
    child_cpu: AtomicU32,
    /// The CPU (plus one) the parent last posted from; 0 = unknown. A hint for waits only.
    parent_cpu: AtomicU32,
    /// The pipeline depth the child grants (rule M9); 0 = none published.
    granted_depth: AtomicU32,
    _reserved: [u32; 11],
    /// The lease, flags and acceptance word of each task frame (rule M12).
    words: [TaskWords; TASK_FRAMES],
    base: Frame,
    tasks: [Frame; TASK_FRAMES],
}

/// What travels beside a task frame (rule M12): the lease of the task's run and the task's
/// flags (written with the request, under the frame's ownership; atomics only so that no
/// `unsafe` is needed, Relaxed and ordered by the state word), the sticky acceptance word,
/// which the child sets when the task launches and the parent clears when it posts, and the
/// sticky withdraw word, which the parent sets to withdraw a staged task the child is still
/// preparing.
#[repr(C)]
struct TaskWords {
    generation: std::sync::atomic::AtomicU64,
    /// When the child had the staged task prepared (`CLOCK_MONOTONIC` ns), written before
    /// `FRAME_STAGED`.
    prepared_ns: std::sync::atomic::AtomicU64,
    slot: AtomicU32,
    flags: AtomicU32,
    accepted: AtomicU32,
    /// Set (Release) by the parent to withdraw a staged task whose frame the child holds
    /// `BUSY` while it prepares it; cleared when the parent posts (rule M11).
    withdraw: AtomicU32,
}

const _: () = {
    assert!(size_of::<Frame>() == FRAME_SIZE);
    assert!(offset_of!(Frame, state) == 0);
    assert!(offset_of!(Frame, error_code) == 4);
    assert!(offset_of!(Frame, command) == 8);
    assert!(offset_of!(Frame, arg0) == 16);
    assert!(offset_of!(Frame, result) == 24);
    assert!(offset_of!(Frame, digest) == 32);
    assert!(offset_of!(Frame, config) == 64);
    assert!(offset_of!(Frame, payload_len) == 1208);
    assert!(offset_of!(Frame, reserved) == 1212);
    assert!(offset_of!(Frame, payload) == PAYLOAD_OFFSET);
    assert!(offset_of!(Frame, error_msg) == FRAME_SIZE - ERROR_MSG_CAPACITY);
    assert!(ARGS_CAPACITY == 63808);
    assert!(offset_of!(Slot, doorbell) == 0);
    assert!(offset_of!(Slot, shutdown) == 64);
    assert!(offset_of!(Slot, child_pid) == 68);
    assert!(offset_of!(Slot, child_cpu) == 72);
    assert!(offset_of!(Slot, parent_cpu) == 76);
    assert!(offset_of!(Slot, granted_depth) == 80);
    assert!(size_of::<TaskWords>() == 32);
    assert!(offset_of!(Slot, words) == 128);
    assert!(offset_of!(Slot, base) == 192);
    assert!(offset_of!(Slot, tasks) == 192 + FRAME_SIZE);
    assert!(MAILBOX_SIZE == 196_800);
    assert!(SLOTS_OFFSET == 64);
    assert!(MAILBOX_SIZE.is_multiple_of(align_of::<Slot>()));
    assert!(SLOTS_OFFSET.is_multiple_of(align_of::<Slot>()));
};

/// A frame's state word: the shared mapping's `AtomicU32`, or (in the `loom` models) the sync
/// facade's, so the claims and hand-overs below are the code the models check.
trait StateWord {
    fn load(&self, order: Ordering) -> u32;
    fn store(&self, value: u32, order: Ordering);
    fn compare_exchange(
        &self,
        current: u32,
        new: u32,
        success: Ordering,
        failure: Ordering,
    ) -> std::result::Result<u32, u32>;
}

macro_rules! state_word {
    ($t:ty) => {
        impl StateWord for $t {
            fn load(&self, order: Ordering) -> u32 {
                <$t>::load(self, order)
            }
            fn store(&self, value: u32, order: Ordering) {
                <$t>::store(self, value, order)
            }
            fn compare_exchange(
                &self,
                current: u32,
                new: u32,
                success: Ordering,
                failure: Ordering,
            ) -> std::result::Result<u32, u32> {
                <$t>::compare_exchange(self, current, new, success, failure)
            }
        }
    };
}
state_word!(AtomicU32);
#[cfg(all(test, loom))]
state_word!(crate::sys::sync::checked::AtomicU32);

/// Claims a frame by moving its state word from `from` to `BUSY` (rule M3). `Err` holds the
/// state found instead.
fn claim(state: &(impl StateWord + ?Sized), from: u32) -> std::result::Result<(), u32> {
    state.compare_exchange(from, BUSY, Ordering::Acquire, Ordering::Acquire).map(drop)
}

/// Claims a frame that a peer hands over as `from` (M3, M4), if it is there: a cheap Relaxed
/// look first, then the Acquire claim.
fn claim_if(state: &(impl StateWord + ?Sized), from: u32) -> bool {
    state.load(Ordering::Relaxed) == from && claim(state, from).is_ok()
}

/// Stores `next` into a claimed frame's state word (Release) when dropped: the hand-over of rule
/// M4, which also happens if the code filling the frame unwinds.
struct Handover<'f, W: StateWord + ?Sized = AtomicU32> {
    state: &'f W,
    next: u32,
}

impl<W: StateWord + ?Sized> Drop for Handover<'_, W> {
    fn drop(&mut self) {
        self.state.store(self.next, Ordering::Release);
    }
}

impl Frame {
    /// Claims the frame by moving it from `from` to `BUSY` (rule M3). `Err` holds the state
    /// found instead.
    fn claim(&self, from: u32) -> std::result::Result<(), u32> {
        claim(&self.state, from)
    }

    /// Writes the error code and message (truncated on a character boundary, NUL-terminated).
    ///
    /// # Safety
    ///
    /// The caller owns the frame's fields (rules M2, M3).
    unsafe fn write_error(&self, code: i32, message: &str) {
        self.error_code.store(code, Ordering::Relaxed);
        let mut n = message.len().min(ERROR_MSG_CAPACITY - 1);
        while !message.is_char_boundary(n) {
            n -= 1;
        }
        // SAFETY: rule M2 — the caller owns the fields, so nobody else accesses `error_msg`.
        let buf = unsafe { &mut *self.error_msg.get() };
        buf[..n].copy_from_slice(&message.as_bytes()[..n]);
        buf[n] = 0;
    }

    /// Reads the error message: up to the first NUL or the capacity, lossy UTF-8 (rule M6).
    ///
    /// # Safety
    ///
    /// The caller owns the frame's fields (rule M2), or the frame is `INIT_FAILED` (terminal).
    unsafe fn read_message(&self) -> String {
        // SAFETY: rule M2 — owned by the caller or terminal, so nobody writes it meanwhile; the
        // bytes are copied out, so no reference into the frame outlives this call.
        let bytes: [u8; ERROR_MSG_CAPACITY] = unsafe { *self.error_msg.get() };
        let end = bytes.iter().position(|b| *b == 0).unwrap_or(ERROR_MSG_CAPACITY);
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    }

    /// Reads the error code, and the message if the code is not 0.
    ///
    /// # Safety
    ///
    /// The caller owns the frame's fields (rule M2).
    unsafe fn read_error(&self) -> std::result::Result<(), FrameError> {
        match self.error_code.load(Ordering::Relaxed) {
            0 => Ok(()),
            // SAFETY: rule M2 — forwarded from this function's contract.
            code => Err(FrameError { code, message: unsafe { self.read_message() } }),
        }
    }

    /// Writes a request's digest and payload (and its length).
    ///
    /// # Safety
    ///
    /// The caller owns the frame's fields (rules M2, M3) and `payload.len() <= ARGS_CAPACITY`.
    unsafe fn write_request(&self, digest: &[u8; 32], payload: &[u8]) {
        // SAFETY: rule M2 — the caller owns the fields; the length fits (this function's
        // contract), so the copy stays inside `payload`.
        unsafe {
            *self.digest.get() = *digest;
            *self.payload_len.get() = payload.len() as u32;
            (&mut *self.payload.get())[..payload.len()].copy_from_slice(payload);
        }
    }

    /// The request's payload, its length clamped to the capacity (rule M6).
    ///
    /// # Safety
    ///
    /// The caller may read the request fields (rules M2, M5) for as long as the slice lives.
    unsafe fn payload(&self) -> &[u8] {
        // SAFETY: rules M2, M5 — forwarded from this function's contract; the length is clamped
        // to the array (M6), so the slice stays inside the frame.
        unsafe {
            let len = (*self.payload_len.get() as usize).min(ARGS_CAPACITY);
            &(&*self.payload.get())[..len]
        }
    }
}

/// The shared region holding the parent doorbell and `count` mailboxes.
///
/// Made before fork (zero-filled: every frame `IDLE`); parent and children use the same value.
pub(crate) struct MailboxRegion {
    region: SharedRegion,
    count: usize,
}

impl MailboxRegion {
    /// Maps a region for `count` mailboxes (64 + `count` × [`MAILBOX_SIZE`] bytes), all `IDLE`.
    pub(crate) fn new(count: usize) -> Result<MailboxRegion> {
        let len = MailboxRegion::bytes(count)?;
        let region =
            SharedRegion::new(len, false).map_err(|e| e.context(format!("mapping {count} mailboxes")))?;
        Ok(MailboxRegion { region, count })
    }

    /// Maps the region of `count` mailboxes a parent made, from its memfd (a child started by
    /// exec). The memfd must hold at least the region's bytes (checked).
    pub(crate) fn from_fd(fd: std::os::fd::OwnedFd, count: usize) -> Result<MailboxRegion> {
        let len = MailboxRegion::bytes(count)?;
        let region = SharedRegion::map_fd(fd, len, false)
            .map_err(|e| e.context(format!("mapping the parent's {count} mailboxes")))?;
        Ok(MailboxRegion { region, count })
    }

    fn bytes(count: usize) -> Result<usize> {
        count
            .checked_mul(MAILBOX_SIZE)
            .and_then(|n| n.checked_add(SLOTS_OFFSET))
            .ok_or_else(|| Error::invalid(format!("{count} mailboxes do not fit in memory")))
    }

    /// The memfd behind the region (what a child started by exec inherits).
    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.region.fd()
    }

    /// The parent doorbell: rung by every child when it finishes a task or a control request.
    pub(crate) fn doorbell(&self) -> &Doorbell {
        // SAFETY: rule M1 — the region starts with a Doorbell at offset 0 (page-aligned, all-zero
        // bytes valid, atomics only) and lives as long as `self`, which the result borrows.
        unsafe { &*self.region.as_ptr().cast::<Doorbell>() }
    }

    /// A view of mailbox `i`.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()` (an internal invariant: mailbox indices come from the lanes that
    /// created the region).
    pub(crate) fn mailbox(&self, i: usize) -> Mailbox<'_> {
        assert!(i < self.len(), "mailbox {i} is out of range: the region holds {}", self.len());
        // SAFETY: rule M1 — `i < count`, so the Slot at 64 + i * MAILBOX_SIZE lies inside the
        // region, is 64-byte aligned, is valid for any bytes, and lives as long as `self`.
        let slot = unsafe { &*self.region.as_ptr().add(SLOTS_OFFSET + i * MAILBOX_SIZE).cast::<Slot>() };
        Mailbox { slot }
    }

    /// The number of mailboxes.
    pub(crate) fn len(&self) -> usize {
        self.count
    }
}

impl fmt::Debug for MailboxRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MailboxRegion").field("region", &self.region).field("count", &self.count).finish()
    }
}

/// A typed view of one mailbox in a [`MailboxRegion`] (`Copy`, `Send + Sync`).
///
/// Parent-side methods may be called from any thread (every claim is a compare-exchange, rule
/// M3); child-side methods belong to the child loop (rule M5).
#[derive(Clone, Copy)]
pub(crate) struct Mailbox<'a> {
    slot: &'a Slot,
}

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
    /// The task's flags ([`FLAG_OVERLAP`]).
    pub(crate) flags: u32,
    /// A successor posted for preparation (`PREPARE_READY`), not a task to run now.
    pub(crate) staged: bool,
    finished: bool,
}

/// What the parent said of a staged task ([`TaskRequest::activation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activation {
    /// Nothing yet: the task stays staged.
    Waiting,
    /// Launch it (the frame is `TASK_LAUNCHED` now).
    Activate,
    /// Give it up unlaunched and answer with an error (the frame is `BUSY` now).
    Withdraw,
}

impl TaskRequest<'_> {
    /// The config bytes (an encoded `CallConfig`), [`CONFIG_BYTES`] long.
    pub(crate) fn config(&self) -> &[u8] {
        // SAFETY: rules M2, M5 — this guard claimed the frame (BUSY) and owns its fields until
        // `finish_task` or its drop, neither of which can run while this borrow of it lives.
        unsafe { &*self.frame.config.get() }
    }

    /// The args blob (`payload[..payload_len]`, clamped to [`ARGS_CAPACITY`]).
    pub(crate) fn args(&self) -> &[u8] {
        // SAFETY: rules M2, M5 — as in `config`: the guard owns the frame for this borrow; the
        // length is clamped (M6).
        unsafe { self.frame.payload() }
    }

    /// Publishes a staged task as prepared: `BUSY` -> `FRAME_STAGED` (Release, rule M11), and
    /// rings `parent`, which may now activate it. The guard keeps owning the fields.
    pub(crate) fn publish_staged(&mut self, parent: &Doorbell) {
        if self.staged && self.frame.state.load(Ordering::Relaxed) == BUSY {
            self.words.prepared_ns.store(crate::sys::clock::monotonic_ns(), Ordering::Relaxed);
            self.frame.state.store(FRAME_STAGED, Ordering::Release);
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
        let state = &self.frame.state;
        if state.compare_exchange(ACTIVATE, TASK_LAUNCHED, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            return Activation::Activate;
        }
        if state.compare_exchange(WITHDRAW, BUSY, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            return Activation::Withdraw;
        }
        Activation::Waiting
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
        loop {
            let now = self.frame.state.load(Ordering::Acquire);
            if !matches!(now, FRAME_STAGED | ACTIVATE | WITHDRAW | TASK_LAUNCHED) {
                break;
            }
            if self.frame.claim(now).is_ok() {
                break;
            }
        }
        let (code, message) = reply_code(result);
        // SAFETY: rules M3, M11 — this guard claimed the frame from TASK_READY or
        // PREPARE_READY, so it owns its fields until the store below.
        unsafe { self.frame.write_error(code, message) };
        self.frame.state.store(TASK_DONE, Ordering::Release);
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
    /// The payload (`payload[..payload_len]`, clamped to [`ARGS_CAPACITY`]).
    pub(crate) payload: Vec<u8>,
    /// Private: a `ControlRequest` is only ever read from a frame ([`Mailbox::control_request`]),
    /// so `ipc::child` may trust that its `arg0` is what the parent wrote (rule C1 there).
    from_frame: (),
}

/// A failure reported through a frame: a non-zero code and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FrameError {
    /// The error code; never 0 once read back (0 means success on the wire).
    pub(crate) code: i32,
    /// The message, at most [`ERROR_MSG_CAPACITY`] − 1 bytes once read back.
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

/// How a task is posted ([`Mailbox::post_task_at`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Posting {
    /// The trace key of a captured run's task (rule M10).
    pub(crate) trace: Option<(u64, u64, u32, u32)>,
    /// The lease of the task's run: slot and generation (rule M12; generation 0: none).
    pub(crate) lease: (u32, u64),
    /// [`FLAG_OVERLAP`] or 0.
    pub(crate) flags: u32,
    /// Post as a successor to prepare (`PREPARE_READY`), not a task to run (rule M11).
    pub(crate) stage: bool,
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

impl<'a> Mailbox<'a> {
    // ---- parent side ----

    /// Posts a task into task frame `ix`: claims the `IDLE` frame, copies the digest, lets
    /// `write` fill the config bytes (zeroed first) and the args payload and return the payload
    /// length, then publishes the request (Release) and rings the child doorbell. `posting`
    /// carries its run's lease and its flags (rule M12), a captured run's trace key (rule
    /// M10), and whether it is a successor to prepare beside the running task
    /// (`PREPARE_READY`, rule M11) or a task to run (`TASK_READY`). Clears the frame's
    /// acceptance word.
    ///
    /// Errors: [`ErrorKind::InvalidState`](crate::error::ErrorKind) when the frame is not
    /// `IDLE`; [`ErrorKind::InvalidArgument`](crate::error::ErrorKind) when the returned length
    /// exceeds [`ARGS_CAPACITY`]; any error of `write`. On error (or if `write` panics) the frame
    /// goes back to `IDLE`.
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
        frame.claim(IDLE).map_err(|s| {
            Error::state(format!("cannot post a task: task frame {ix} is {} (not IDLE)", state_name(s)))
        })?;
        let mut handover = Handover { state: &frame.state, next: IDLE };
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
        }
        // Rule M12: written under the claim, ordered by the hand-over below.
        words.slot.store(posting.lease.0, Ordering::Relaxed);
        words.generation.store(posting.lease.1, Ordering::Relaxed);
        words.flags.store(posting.flags, Ordering::Relaxed);
        words.accepted.store(0, Ordering::Relaxed);
        words.withdraw.store(0, Ordering::Relaxed);
        frame.error_code.store(0, Ordering::Relaxed);
        handover.next = if posting.stage { PREPARE_READY } else { TASK_READY };
        drop(handover);
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

    /// Collects a finished task from task frame 0 (see
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
        if !claim_if(&frame.state, TASK_DONE) {
            return None;
        }
        // SAFETY: rule M3 — we claimed the frame from TASK_DONE, so we own its fields, and the
        // Acquire claim sees the child's writes (M4).
        let result = unsafe { frame.read_error() };
        frame.state.store(IDLE, Ordering::Release);
        Some(result)
    }

    /// Lets the staged task of frame `ix` launch: `FRAME_STAGED` -> `ACTIVATE` by
    /// compare-exchange (rule M11), then rings the child. `Err` holds the state found instead
    /// (still `PREPARE_READY` or `BUSY`: not prepared yet; `TASK_DONE`: it failed to prepare).
    pub(crate) fn activate(&self, ix: usize) -> std::result::Result<(), u32> {
        let state = &self.slot.tasks[ix].state;
        state.compare_exchange(FRAME_STAGED, ACTIVATE, Ordering::AcqRel, Ordering::Acquire)?;
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
        if claim(&frame.state, PREPARE_READY).is_ok() {
            frame.state.store(IDLE, Ordering::Release);
            return Withdrawn::Taken;
        }
        match frame.state.compare_exchange(FRAME_STAGED, WITHDRAW, Ordering::AcqRel, Ordering::Acquire) {
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

    /// When the child had the staged task of frame `ix` prepared, once it has (its frame is
    /// `FRAME_STAGED`; rule M11).
    pub(crate) fn prepared_at(&self, ix: usize) -> Option<u64> {
        // Acquire: the child wrote the time before its Release store of FRAME_STAGED.
        (self.slot.tasks[ix].state.load(Ordering::Acquire) == FRAME_STAGED)
            .then(|| self.slot.words[ix].prepared_ns.load(Ordering::Relaxed))
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
        self.slot.tasks[ix].state.load(Ordering::Acquire)
    }

    /// The base frame's state word (Acquire), for diagnostics.
    pub(crate) fn base_state(&self) -> u32 {
        self.slot.base.state.load(Ordering::Acquire)
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
        frame.claim(IDLE).map_err(|s| {
            Error::state(format!(
                "cannot post control {command}: the base frame is {} (not IDLE)",
                state_name(s)
            ))
        })?;
        // SAFETY: rule M3 — we claimed the frame, so we own its fields until the Release store
        // below (M4); the payload length was checked above.
        unsafe {
            *frame.command.get() = command;
            *frame.arg0.get() = arg0;
            *frame.result.get() = 0;
            frame.write_request(digest, payload);
        }
        frame.error_code.store(0, Ordering::Relaxed);
        frame.state.store(CONTROL_REQUEST, Ordering::Release);
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
        spin_then_yield(deadline, || frame.state.load(Ordering::Acquire) == CONTROL_DONE);
        loop {
            let state = frame.state.load(Ordering::Acquire);
            match state {
                CONTROL_DONE => {
                    if frame.claim(CONTROL_DONE).is_ok() {
                        // SAFETY: rule M3 — we claimed the frame from CONTROL_DONE, so we own its
                        // fields, and the Acquire claim sees the child's writes (M4).
                        let result = unsafe {
                            match frame.read_error() {
                                Ok(()) => Ok(*frame.result.get()),
                                Err(e) => Err(e),
                            }
                        };
                        frame.state.store(IDLE, Ordering::Release);
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
            futex_wait(&frame.state, state, Some(timeout));
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
            let state = frame.state.load(Ordering::Acquire);
            match state {
                INIT_READY => {
                    if frame
                        .state
                        .compare_exchange(INIT_READY, IDLE, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
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
            futex_wait(&frame.state, state, Some(timeout));
        }
    }

    /// Sets the sticky shutdown word (Release) and rings the child doorbell.
    pub(crate) fn request_shutdown(&self) {
        self.slot.shutdown.store(1, Ordering::Release);
        self.slot.doorbell.ring();
    }

    // ---- child side ----

    /// True once the parent has requested shutdown (Acquire; sticky).
    pub(crate) fn shutdown_requested(&self) -> bool {
        self.slot.shutdown.load(Ordering::Acquire) != 0
    }

    /// The child doorbell: the child sleeps on it; the parent rings it after every post.
    pub(crate) fn child_doorbell(&self) -> &'a Doorbell {
        &self.slot.doorbell
    }

    /// Records the child's pid (Release).
    /// Records the CPU the child runs on (a hint for the parent's waits).
    pub(crate) fn set_child_cpu(&self, cpu: u32) {
        self.slot.child_cpu.store(cpu, Ordering::Relaxed);
    }

    /// The CPU (plus one) the child last ran a task on; 0 when unknown.
    pub(crate) fn child_cpu(&self) -> u32 {
        self.slot.child_cpu.load(Ordering::Relaxed)
    }

    /// Records the CPU the parent posts from (a hint for the child's waits).
    pub(crate) fn set_parent_cpu(&self, cpu: u32) {
        self.slot.parent_cpu.store(cpu, Ordering::Relaxed);
    }

    /// The CPU (plus one) the parent last posted from; 0 when unknown.
    pub(crate) fn parent_cpu(&self) -> u32 {
        self.slot.parent_cpu.load(Ordering::Relaxed)
    }

    /// Returns both frames to `IDLE` for a new child, after the old one died (rule M8): the
    /// caller has seen the old child reaped, keeps every other parent-side party (the scheduler,
    /// which has the lane out of service; control requests) off this mailbox until the new
    /// child reports ready, and has not requested shutdown.
    pub(crate) fn reset_for_new_child(&self) {
        for frame in std::iter::once(&self.slot.base).chain(&self.slot.tasks) {
            frame.error_code.store(0, Ordering::Relaxed);
            frame.state.store(IDLE, Ordering::Release);
        }
        for words in &self.slot.words {
            words.accepted.store(0, Ordering::Relaxed);
            words.withdraw.store(0, Ordering::Relaxed);
        }
        self.slot.child_pid.store(0, Ordering::Release);
        self.slot.child_cpu.store(0, Ordering::Relaxed);
        self.slot.granted_depth.store(0, Ordering::Relaxed);
    }

    /// Publishes the pipeline depth this child grants; call it before reporting ready (M9).
    pub(crate) fn set_granted_depth(&self, depth: u32) {
        self.slot.granted_depth.store(depth, Ordering::Relaxed);
    }

    /// The pipeline depth the child granted (0: none), as published before it reported ready
    /// (M9); read it after [`Mailbox::wait_init`] returned [`InitStatus::Ready`].
    pub(crate) fn granted_depth(&self) -> u32 {
        self.slot.granted_depth.load(Ordering::Relaxed)
    }

    pub(crate) fn set_child_pid(&self, pid: u32) {
        self.slot.child_pid.store(pid, Ordering::Release);
    }

    /// The recorded child pid (Acquire; 0 if none was recorded).
    pub(crate) fn child_pid(&self) -> u32 {
        self.slot.child_pid.load(Ordering::Acquire)
    }

    /// Takes the posted task, if the task frame is `TASK_READY`: claims the frame (`TASK_READY`
    /// → `BUSY`, rule M3) and returns the guard that owns it until
    /// [`finish_task`](Mailbox::finish_task) (rule M5).
    pub(crate) fn task_request(&self) -> Option<TaskRequest<'a>> {
        self.task_request_at(0, false)
    }

    /// Takes the task posted in task frame `ix`: a task to run (`TASK_READY`), or with
    /// `staged` a successor to prepare (`PREPARE_READY`, rule M11). Claims the frame (rule M3)
    /// and returns the guard that owns it until [`finish_task`](Mailbox::finish_task) (M5).
    pub(crate) fn task_request_at(&self, ix: usize, staged: bool) -> Option<TaskRequest<'a>> {
        let frame: &'a Frame = &self.slot.tasks[ix];
        let words: &'a TaskWords = &self.slot.words[ix];
        if !claim_if(&frame.state, if staged { PREPARE_READY } else { TASK_READY }) {
            return None;
        }
        // SAFETY: rule M3 — we claimed the frame, so we own its fields, and the Acquire claim
        // sees the parent's writes (M4).
        let (digest, run, task, engine) =
            unsafe { (*frame.digest.get(), *frame.command.get(), *frame.arg0.get(), *frame.result.get()) };
        // Rule M10: a run number of 0 is no trace.
        let trace = (run != 0).then_some((engine, run, task as u32, (task >> 32) as u32));
        // Rule M12: written before the parent's hand-over, which the claim saw.
        let lease = (words.slot.load(Ordering::Relaxed), words.generation.load(Ordering::Relaxed));
        let flags = words.flags.load(Ordering::Relaxed);
        Some(TaskRequest { frame, words, digest, trace, lease, flags, staged, finished: false })
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
        if frame.state.load(Ordering::Acquire) != CONTROL_REQUEST {
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
        if frame.claim(CONTROL_REQUEST).is_err() {
            return;
        }
        let value = *result.as_ref().unwrap_or(&0);
        let (code, message) = reply_code(&result);
        // SAFETY: rule M3 — we claimed the frame from CONTROL_REQUEST, so we own its fields.
        unsafe {
            *frame.result.get() = value;
            frame.write_error(code, message);
        }
        frame.state.store(CONTROL_DONE, Ordering::Release);
        futex_wake(&frame.state, i32::MAX);
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
                let _ = frame.state.compare_exchange(IDLE, INIT_READY, Ordering::Release, Ordering::Relaxed);
            }
            Err(message) => {
                if frame.claim(IDLE).is_err() {
                    return;
                }
                // SAFETY: rule M3 — we claimed the base frame from IDLE before startup was
                // reported, so we own its fields until the Release store below (M4).
                unsafe { frame.write_error(FALLBACK_CODE, message) };
                frame.state.store(INIT_FAILED, Ordering::Release);
            }
        }
        futex_wake(&frame.state, i32::MAX);
    }
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

/// A private mailbox the fuzz harness fills with hostile bytes (`mailbox/hostile.rs`).
#[cfg(feature = "fuzz")]
mod hostile;
#[cfg(feature = "fuzz")]
pub(crate) use hostile::HostileFrames;

/// The code and message to write for a reply (rule: 0 only for success).
fn reply_code<T>(result: &std::result::Result<T, FrameError>) -> (i32, &str) {
    match result {
        Ok(_) => (0, ""),
        Err(e) if e.code == 0 => (FALLBACK_CODE, e.message.as_str()),
        Err(e) => (e.code, e.message.as_str()),
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

#[cfg(test)]
mod tests;

/// `loom` models of the task frame's state word (rules M3, M4) and the shutdown word, on a plain
/// struct of facade atomics driven by the mailbox's own `claim_if` and `Handover`
/// (`RUSTFLAGS="--cfg loom" cargo test -p simpler --lib --release loom`). The frame's fields are
/// a `loom` cell, so an access outside its owner's claim is reported as a race.
#[cfg(all(test, loom))]
mod loom_models {
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;

    use super::*;
    use crate::sys::sync::checked::AtomicU32 as Word;

    struct ModelFrame {
        state: Word,
        shutdown: Word,
        /// The frame's fields: the request, then the reply.
        fields: UnsafeCell<u64>,
    }

    fn check(f: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(2);
        builder.check(f);
    }

    /// The child loop: takes the task (`TASK_READY` -> `BUSY`), replies (`TASK_DONE`), and
    /// leaves once it sees shutdown; returns how many tasks it ran.
    fn child(f: &ModelFrame) -> u32 {
        let mut ran = 0;
        loop {
            if claim_if(&f.state, TASK_READY) {
                let _done = Handover { state: &f.state, next: TASK_DONE };
                // SAFETY: rule M3 — the claim won, so the child owns the fields until `_done`.
                f.fields.with_mut(|v| unsafe { *v = *v * 10 + 1 });
                ran += 1;
            } else if f.shutdown.load(Ordering::Acquire) != 0 {
                return ran;
            }
            loom::thread::yield_now();
        }
    }

    /// Parent posts a task, collects it, then requests shutdown, while the child loop runs: the
    /// child runs it exactly once, the parent reads the child's reply (hand-over, M4), the
    /// child leaves, and the frame ends `IDLE`.
    #[test]
    fn loom_post_take_and_shutdown() {
        check(|| {
            let f = Arc::new(ModelFrame {
                state: Word::new(IDLE),
                shutdown: Word::new(0),
                fields: UnsafeCell::new(0),
            });
            let f2 = f.clone();
            let c = loom::thread::spawn(move || child(&f2));
            assert!(claim(&f.state, IDLE).is_ok());
            {
                let _post = Handover { state: &f.state, next: TASK_READY };
                // SAFETY: rule M3 — the parent claimed the IDLE frame; it owns it until `_post`.
                f.fields.with_mut(|v| unsafe { *v = 4 });
            }
            while !claim_if(&f.state, TASK_DONE) {
                loom::thread::yield_now();
            }
            // SAFETY: rules M3, M4 — claimed from TASK_DONE; the Acquire claim sees the reply.
            let reply = f.fields.with(|v| unsafe { *v });
            f.state.store(IDLE, Ordering::Release);
            f.shutdown.store(1, Ordering::Release);
            assert_eq!(reply, 41);
            assert_eq!(c.join().unwrap(), 1);
            assert_eq!(f.state.load(Ordering::Acquire), IDLE);
        });
    }

    /// One party's collection: claims the frame from `from`, touches its fields, gives it
    /// back as `IDLE`.
    fn take(f: &ModelFrame, from: u32) -> bool {
        if !claim_if(&f.state, from) {
            return false;
        }
        let _back = Handover { state: &f.state, next: IDLE };
        // SAFETY: rule M3 — this claim won, so this party owns the fields until `_back` drops.
        f.fields.with_mut(|v| unsafe { *v += 1 });
        true
    }

    /// Two parties race to collect one `TASK_DONE` (and two to take one `TASK_READY`): exactly
    /// one claim wins each, and the loser touches no field.
    #[test]
    fn loom_no_double_claim() {
        for from in [TASK_DONE, TASK_READY] {
            check(move || {
                let f = Arc::new(ModelFrame {
                    state: Word::new(from),
                    shutdown: Word::new(0),
                    fields: UnsafeCell::new(0),
                });
                let f2 = f.clone();
                let other = loom::thread::spawn(move || take(&f2, from));
                let mine = take(&f, from);
                let theirs = other.join().unwrap();
                assert!(mine != theirs, "one claim wins");
                // SAFETY: both parties are joined; nobody else holds the frame.
                assert_eq!(f.fields.with(|v| unsafe { *v }), 1);
            });
        }
    }
}
