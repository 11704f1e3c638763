//! The fuzz harness's hostile peer (only with the `fuzz` feature; `crate::__fuzz` is its one user): a
//! private mailbox whose frames it fills with arbitrary bytes, so the real readers run on
//! hostile contents (rule M6).

#![expect(unsafe_code, reason = "writing arbitrary bytes into a private frame's fields; rules M1, M3")]

use std::mem::offset_of;
use std::sync::atomic::Ordering;

use super::Mailbox;
use super::layout::{
    ARGS_CAPACITY, CONFIG_BYTES, ERROR_MSG_CAPACITY, FRAME_SIZE, Frame, MailboxRegion, PAYLOAD_OFFSET,
};
use crate::error::Result;
use crate::sys::futex::Doorbell;

/// A private mailbox whose frames the fuzz harness (`crate::__fuzz`) fills with arbitrary
/// bytes, playing a peer that ignores the protocol, so that the real readers run on hostile
/// contents.
///
/// Its region is made by [`HostileFrames::new`] and reached only through `&mut self`, so no
/// other party (thread, or a child: nothing here is ever handed to one) touches its frames.
pub(crate) struct HostileFrames {
    region: MailboxRegion,
}

impl HostileFrames {
    /// Maps a private one-mailbox region.
    pub(crate) fn new() -> Result<HostileFrames> {
        Ok(HostileFrames { region: MailboxRegion::new(1)? })
    }

    /// Overwrites every field of the task frame (`base == false`) or the base frame with `image`,
    /// the frame's bytes at their layout offsets (module docs), the state word last (Release),
    /// and returns the mailbox for the readers. The borrow of `self` keeps any request taken
    /// from it from outliving the next plant.
    pub(crate) fn plant(&mut self, base: bool, image: &[u8; FRAME_SIZE]) -> (Mailbox<'_>, &Doorbell) {
        let mb = self.region.mailbox(0);
        let frame = if base { &mb.slot.base } else { &mb.slot.tasks[0] };
        let at = |r: std::ops::Range<usize>| &image[r];
        let word = |o: usize| u64::from_ne_bytes(at(o..o + 8).try_into().expect("8 bytes"));
        let half = |o: usize| u32::from_ne_bytes(at(o..o + 4).try_into().expect("4 bytes"));
        // Take the frame from whatever state a previous plant left (rule M3: a compare-exchange).
        frame.state.claim_as_found().expect("a private frame changes state only under `&mut self`");
        frame.error_code.store(half(offset_of!(Frame, error_code)) as i32, Ordering::Relaxed);
        // SAFETY: rules M1, M3 — the claim above made this party the frame's owner, and nobody
        // else can reach this private region (`&mut self`, see the type's docs); every field is
        // written from `image` at its own offset inside the frame's size.
        unsafe {
            *frame.command.get() = word(offset_of!(Frame, command));
            *frame.arg0.get() = word(offset_of!(Frame, arg0));
            *frame.result.get() = word(offset_of!(Frame, result));
            (*frame.digest.get()).copy_from_slice(at(32..64));
            (*frame.config.get()).copy_from_slice(at(64..64 + CONFIG_BYTES));
            *frame.payload_len.get() = half(offset_of!(Frame, payload_len));
            *frame.after.get() = half(offset_of!(Frame, after));
            (*frame.payload.get()).copy_from_slice(at(PAYLOAD_OFFSET..PAYLOAD_OFFSET + ARGS_CAPACITY));
            (*frame.error_msg.get()).copy_from_slice(at(FRAME_SIZE - ERROR_MSG_CAPACITY..FRAME_SIZE));
        }
        frame.state.plant(half(offset_of!(Frame, state)));
        (mb, self.region.doorbell())
    }
}
