//! The mailbox layout: the region, one mailbox, one frame, as `#[repr(C)]` types whose offsets
//! are checked at compile time; [`MailboxRegion`], the mapping that holds them (rule M1); and
//! the frame's field accessors, each for the party that owns the fields (M2).
//!
//! Native endianness: parent and children are one binary on one host.
//!
//! Region:
//!
//! | Offset | Size | Field |
//! | ------ | ---- | ----- |
//! | 0 | 64 | parent [`Doorbell`] (`seq` u32 @0, `sleepers` u32 @4) |
//! | 64 + i × [`MAILBOX_SIZE`] | [`MAILBOX_SIZE`] = 327 936 | mailbox `i` |
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
//! | 84 | 4 | `done` u32: the task the child finished last (M13): `seq << 16`, bit 2 = a chained task behind its predecessor's success (so that one succeeded, whether this one then ran or was answered unrun), bit 1 = it succeeded, bit 0 = one finished; 0 = none |
//! | 88 | 8 | `waiters` u64: bit `j` set by the child of mailbox `j` < 64 before it sleeps waiting for `done` to move (M13); the child clears them when it records `done`, and rings those children |
//! | 96 | 32 | reserved (0) |
//! | 128 + 32 k | 32 | task frame `k`'s words (M12): `generation` u64 @0 and `slot` u32 @16 (the lease of the task's run), `prepared_ns` u64 @8, `flags` u32 @20, `accepted` u32 @24 (sticky), `withdraw` u32 @28 (sticky) |
//! | 256 | 65 536 | base frame (startup + control) |
//! | 65 792 + 65 536 k | 65 536 | task frame `k` (k = 0, 1, 2, 3) |
//!
//! Frame ([`FRAME_SIZE`] = 64 KiB, 64-byte aligned):
//!
//! | Offset | Size | Field |
//! | ------ | ---- | ----- |
//! | 0 | 4 | `state` u32 (atomic): a [`StateWord`], one of the state constants of `super` |
//! | 4 | 4 | `error_code` i32 (atomic): 0 = success |
//! | 8 | 8 | `command` u64: control sub-command (base frame); the run number of a captured task (task frame, M10) |
//! | 16 | 8 | `arg0` u64: control argument; the task number of a captured task (task frame, M10) |
//! | 24 | 8 | `result` u64: control result; the engine number of a captured task (task frame, M10) |
//! | 32 | 32 | `digest`: callable digest (task) or control digest |
//! | 64 | 1 144 | `config`: opaque bytes, an encoded `CallConfig` ([`CONFIG_BYTES`]) |
//! | 1 208 | 4 | `payload_len` u32 |
//! | 1 212 | 4 | `after` u32 (task frame, M13): the task it waits for on another worker (bit 31 set, that worker's mailbox in bits 16-27, its sequence number in bits 0-15); 0 = none |
//! | 1 216 | 63 808 | `payload`: the TaskArgs blob or control payload ([`ARGS_CAPACITY`]) |
//! | 65 024 | 512 | `error_msg`: NUL-terminated, truncated ([`ERROR_MSG_CAPACITY`]) |
//!
//! The state word's values and protocols are in the parent module's doc (`super`), its steps in
//! `state.rs`.

#![expect(unsafe_code, reason = "typed views of a frame layout that forked processes share; rules M1-M6")]

use std::cell::UnsafeCell;
use std::fmt;
use std::mem::offset_of;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use super::state::StateWord;
use super::{FrameError, Mailbox};
use crate::error::{Error, Result};
use crate::sys::futex::Doorbell;
use crate::sys::mem::SharedRegion;

/// Size of one frame in bytes.
pub(crate) const FRAME_SIZE: usize = 65536;
/// Bytes of the NUL-terminated error message in a frame (511 characters of text at most).
pub(crate) const ERROR_MSG_CAPACITY: usize = 512;
/// Bytes of the opaque config field (the packed size of a `CallConfig`).
pub(crate) const CONFIG_BYTES: usize = 1144;
/// Offset of the payload inside a frame.
pub(super) const PAYLOAD_OFFSET: usize = 1216;
/// Payload bytes per frame: the largest TaskArgs blob or control payload (63 808).
pub(crate) const ARGS_CAPACITY: usize = FRAME_SIZE - PAYLOAD_OFFSET - ERROR_MSG_CAPACITY;
/// Size of one mailbox (child doorbell, words, base frame, task frame) in bytes.
pub(super) const MAILBOX_SIZE: usize = size_of::<Slot>();
/// Offset of mailbox 0 in the region (after the parent doorbell).
pub(super) const SLOTS_OFFSET: usize = size_of::<Doorbell>();

/// Task frames per mailbox: a chip uses two, one for the running task and one for a staged
/// successor (M11); a SUB worker all four, for the running task and three chained behind it
/// (M13).
pub(crate) const TASK_FRAMES: usize = 4;

/// One 64 KiB frame (see the module docs for the layout and rules M1–M4).
#[repr(C, align(64))]
pub(super) struct Frame {
    pub(super) state: StateWord,
    pub(super) error_code: AtomicI32,
    pub(super) command: UnsafeCell<u64>,
    pub(super) arg0: UnsafeCell<u64>,
    pub(super) result: UnsafeCell<u64>,
    pub(super) digest: UnsafeCell<[u8; 32]>,
    pub(super) config: UnsafeCell<[u8; CONFIG_BYTES]>,
    pub(super) payload_len: UnsafeCell<u32>,
    /// For a task to run after another worker's task (rule M13); 0: none.
    pub(super) after: UnsafeCell<u32>,
    pub(super) payload: UnsafeCell<[u8; ARGS_CAPACITY]>,
    pub(super) error_msg: UnsafeCell<[u8; ERROR_MSG_CAPACITY]>,
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
pub(super) struct Slot {
    pub(super) doorbell: Doorbell,
    pub(super) shutdown: AtomicU32,
    pub(super) child_pid: AtomicU32,
    /// The CPU (plus one) the child last ran a task on; 0 = unknown. A hint for waits only.
    pub(super) child_cpu: AtomicU32,
    /// The CPU (plus one) the parent last posted from; 0 = unknown. A hint for waits only.
    pub(super) parent_cpu: AtomicU32,
    /// The pipeline depth the child grants (rule M9); 0 = none published.
    pub(super) granted_depth: AtomicU32,
    /// The task the child finished last (rule M13); 0 = none.
    pub(super) done: AtomicU32,
    /// The children (by mailbox, below 64) asleep waiting for `done` to move (rule M13).
    pub(super) waiters: AtomicU64,
    _reserved: [u32; 8],
    /// The lease, flags and acceptance word of each task frame (rule M12).
    pub(super) words: [TaskWords; TASK_FRAMES],
    pub(super) base: Frame,
    pub(super) tasks: [Frame; TASK_FRAMES],
}

/// What travels beside a task frame (rule M12): the lease of the task's run and the task's
/// flags (written with the request, under the frame's ownership; atomics only so that no
/// `unsafe` is needed, Relaxed and ordered by the state word), the sticky acceptance word,
/// which the child sets when the task launches and the parent clears when it posts, and the
/// sticky withdraw word, which the parent sets to withdraw a staged task the child is still
/// preparing.
#[repr(C)]
pub(super) struct TaskWords {
    pub(super) generation: AtomicU64,
    /// When the child had the staged task prepared (`CLOCK_MONOTONIC` ns), written before
    /// `FRAME_STAGED`.
    pub(super) prepared_ns: AtomicU64,
    pub(super) slot: AtomicU32,
    pub(super) flags: AtomicU32,
    pub(super) accepted: AtomicU32,
    /// Set (Release) by the parent to withdraw a staged task whose frame the child holds
    /// `BUSY` while it prepares it; cleared when the parent posts (rule M11).
    pub(super) withdraw: AtomicU32,
}

const _: () = {
    assert!(size_of::<StateWord>() == 4);
    assert!(size_of::<Frame>() == FRAME_SIZE);
    assert!(offset_of!(Frame, state) == 0);
    assert!(offset_of!(Frame, error_code) == 4);
    assert!(offset_of!(Frame, command) == 8);
    assert!(offset_of!(Frame, arg0) == 16);
    assert!(offset_of!(Frame, result) == 24);
    assert!(offset_of!(Frame, digest) == 32);
    assert!(offset_of!(Frame, config) == 64);
    assert!(offset_of!(Frame, payload_len) == 1208);
    assert!(offset_of!(Frame, after) == 1212);
    assert!(offset_of!(Frame, payload) == PAYLOAD_OFFSET);
    assert!(offset_of!(Frame, error_msg) == FRAME_SIZE - ERROR_MSG_CAPACITY);
    assert!(ARGS_CAPACITY == 63808);
    assert!(offset_of!(Slot, doorbell) == 0);
    assert!(offset_of!(Slot, shutdown) == 64);
    assert!(offset_of!(Slot, child_pid) == 68);
    assert!(offset_of!(Slot, child_cpu) == 72);
    assert!(offset_of!(Slot, parent_cpu) == 76);
    assert!(offset_of!(Slot, granted_depth) == 80);
    assert!(offset_of!(Slot, done) == 84);
    assert!(offset_of!(Slot, waiters) == 88);
    assert!(size_of::<TaskWords>() == 32);
    assert!(offset_of!(Slot, words) == 128);
    assert!(offset_of!(Slot, base) == 256);
    assert!(offset_of!(Slot, tasks) == 256 + FRAME_SIZE);
    assert!(MAILBOX_SIZE == 327_936);
    assert!(SLOTS_OFFSET == 64);
    assert!(MAILBOX_SIZE.is_multiple_of(align_of::<Slot>()));
    assert!(SLOTS_OFFSET.is_multiple_of(align_of::<Slot>()));
};

impl Frame {
    /// Writes the error code and message (truncated on a character boundary, NUL-terminated).
    ///
    /// # Safety
    ///
    /// The caller owns the frame's fields (rules M2, M3).
    pub(super) unsafe fn write_error(&self, code: i32, message: &str) {
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
    pub(super) unsafe fn read_message(&self) -> String {
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
    pub(super) unsafe fn read_error(&self) -> std::result::Result<(), FrameError> {
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
    pub(super) unsafe fn write_request(&self, digest: &[u8; 32], payload: &[u8]) {
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
    pub(super) unsafe fn payload(&self) -> &[u8] {
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
    pub(super) region: SharedRegion,
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
