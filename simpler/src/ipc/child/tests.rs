//! Unit tests of the child side: the host resolver's mappings and the wait for a sibling's
//! task (rule M13 of `ipc::mailbox`).

use super::*;
use crate::data::buffer::{Buffer, IdentityMinter};

/// Posts, into mailbox 0 of `region`, a task to run after task `seq` of mailbox 1's child,
/// claims it as the child does, and runs `wait_after` on it while `sibling_and_parent`
/// plays the other child and the parent (on another thread; its receiver gets a message once
/// `wait_after` returned).
fn wait_after_with(
    seq: u16,
    sibling_and_parent: impl FnOnce(&MailboxRegion, crossbeam_channel::Receiver<()>) + Send,
) -> Result<(), FrameError> {
    use crate::ipc::mailbox::{Posting, after_key};
    let region = MailboxRegion::new(2).unwrap();
    let posting = Posting { lease: (0, 1), after: after_key(1, seq).unwrap(), ..Posting::default() };
    region.mailbox(0).post_task_at(0, &[1; 32], &posting, |_, _| Ok(0)).unwrap();
    let req = region.mailbox(0).next_task(None).unwrap();
    assert_eq!(req.after(), Some((1, seq)));
    let (returned, waited) = crossbeam_channel::bounded(1);
    std::thread::scope(|s| {
        s.spawn(|| sibling_and_parent(&region, waited));
        let result = wait_after(&region, 0, &req);
        let _ = returned.send(());
        result
    })
}

/// The sibling records `(seq, ok, behind)`, which must decide alone: only if the wait has not
/// returned 10 s later does the parent settle it, the other way (so a wait that ignored the
/// record gets the wrong answer rather than hanging).
fn record_decides(seq: u16, ok: bool, behind: bool, decides_go: bool) -> Result<(), FrameError> {
    wait_after_with(5, move |r, waited| {
        ring_waiters(r, r.mailbox(1).set_done(seq, ok, behind));
        if waited.recv_timeout(std::time::Duration::from_secs(10)).is_err() {
            r.mailbox(0).settle_after(0, !decides_go);
        }
    })
}

#[test]
fn a_task_after_another_workers_starts_when_that_one_records_its_success_and_not_on_its_failure() {
    for ok in [true, false] {
        match record_decides(5, ok, false, ok) {
            Ok(()) => assert!(ok, "it ran behind a failure"),
            Err(e) => {
                assert!(!ok, "it did not run behind a success: {e}");
                assert_eq!(e.code, ERR_NOT_RUN);
                assert!(e.message.contains("failed"), "{e}");
            }
        }
    }
}

#[test]
fn a_task_after_another_workers_waits_for_the_parent_once_that_record_moved_on() {
    // The sibling finished the task waited for and a later one before this child looked:
    // only the parent's word says how the first ended.
    for go in [true, false] {
        let result = wait_after_with(5, |r, _| {
            ring_waiters(r, r.mailbox(1).set_done(6, !go, false));
            r.mailbox(0).settle_after(0, go);
        });
        assert_eq!(result.is_ok(), go, "the parent's word decided");
    }
    // The task chained behind it ran behind its success: that says it succeeded.
    assert!(record_decides(6, false, true, true).is_ok());
    // A withdraw stays, even if the parent then lets it go (both before the child looks).
    use crate::ipc::mailbox::{Posting, after_key};
    let region = MailboxRegion::new(2).unwrap();
    let posting = Posting { lease: (0, 1), after: after_key(1, 5).unwrap(), ..Posting::default() };
    region.mailbox(0).post_task_at(0, &[1; 32], &posting, |_, _| Ok(0)).unwrap();
    let req = region.mailbox(0).next_task(None).unwrap();
    region.mailbox(0).withdraw_chained(0);
    region.mailbox(0).settle_after(0, true);
    assert_eq!(wait_after(&region, 0, &req).unwrap_err().code, ERR_NOT_RUN);
}

#[test]
fn a_task_after_its_own_worker_is_refused() {
    use crate::ipc::mailbox::{Posting, after_key};
    let region = MailboxRegion::new(2).unwrap();
    let posting = Posting { lease: (0, 1), after: after_key(0, 1).unwrap(), ..Posting::default() };
    region.mailbox(0).post_task_at(0, &[1; 32], &posting, |_, _| Ok(0)).unwrap();
    let req = region.mailbox(0).next_task(None).unwrap();
    let err = wait_after(&region, 0, &req).unwrap_err();
    assert_eq!(err.code, ERR_BAD_FRAME);
    assert!(err.message.contains("worker 0"), "{err}");
}

#[test]
fn a_task_after_a_worker_that_does_not_exist_is_refused() {
    use crate::ipc::mailbox::{Posting, after_key};
    let region = MailboxRegion::new(1).unwrap();
    let posting = Posting { lease: (0, 1), after: after_key(9, 1).unwrap(), ..Posting::default() };
    region.mailbox(0).post_task_at(0, &[1; 32], &posting, |_, _| Ok(0)).unwrap();
    let req = region.mailbox(0).next_task(None).unwrap();
    let err = wait_after(&region, 0, &req).unwrap_err();
    assert_eq!(err.code, ERR_BAD_FRAME);
    assert!(err.message.contains("worker 9"), "{err}");
}

/// A host buffer of `len` bytes and its descriptor.
fn host(minter: &IdentityMinter, len: usize) -> (Buffer, BufferDesc) {
    let buf = Buffer::create_host(minter.mint().unwrap(), len).unwrap();
    let desc = *buf.desc();
    (buf, desc)
}

#[test]
fn a_strided_view_is_written_only_at_its_elements() {
    use crate::data::dtype::DataType;
    let minter = IdentityMinter::new(7);
    let mut resolver = HostResolver::new(Vec::new());
    let (buf, desc) = host(&minter, 12);
    buf.write(0, &[0xeeu8; 12]).unwrap();
    // Column 1 of a 3x4 u8 matrix: bytes 1, 5 and 9; its span is bytes 1..10.
    let view = TensorView::new(1, &[3], Some(&[4]), DataType::Uint8).unwrap();
    let span: Vec<u8> = (0..9).collect();
    resolver.write_view(&desc, &view, &span).unwrap();
    let mut want = vec![0xeeu8; 12];
    (want[1], want[5], want[9]) = (0, 4, 8);
    assert_eq!(buf.read::<u8>(0, 12).unwrap(), want, "the bytes between the elements are untouched");
    assert!(resolver.write_view(&desc, &view, &span[..8]).is_err(), "a span of the wrong size");
    let past = TensorView::new(4, &[3], Some(&[4]), DataType::Uint8).unwrap();
    assert!(resolver.write_view(&desc, &past, &span).is_err(), "a view past the buffer");
    assert_eq!(buf.read::<u8>(0, 12).unwrap(), want, "nothing written by the refused calls");
}

#[test]
fn a_kept_tensor_keeps_its_bytes_mapped_after_the_resolver_and_the_buffer_are_gone() {
    use crate::data::dtype::DataType;
    let minter = IdentityMinter::new(7);
    let mut resolver = HostResolver::new(Vec::new());
    let (buf, desc) = host(&minter, 64);
    buf.write(0, &(0..64u8).collect::<Vec<_>>()).unwrap();
    resolver.resolve(&desc).unwrap();
    let view = TensorView::new(8, &[16], None, DataType::Uint8).unwrap();
    let kept = resolver.kept(&desc, view, Access::Write).unwrap();
    assert!(
        resolver
            .kept(&desc, TensorView::new(60, &[8], None, DataType::Uint8).unwrap(), Access::Read)
            .is_err()
    );
    // Every other mapping of the object goes: the resolver's, and the creator's own.
    drop((resolver, buf));
    let t = kept.tensor();
    // SAFETY: rule H5 — the kept tensor holds its mapping, so its 16 bytes are still mapped;
    // nothing else in this test touches them.
    let bytes = unsafe { std::slice::from_raw_parts(t.ptr(), 16) };
    assert_eq!(bytes, (8..24u8).collect::<Vec<_>>(), "the view's bytes, still mapped");
}

#[test]
fn large_mappings_of_dropped_buffers_are_given_back() {
    let minter = IdentityMinter::new(7);
    let mut resolver = HostResolver::new(Vec::new());
    let (big, big_desc) = host(&minter, 2 * LARGE_MAPPING);
    let (small, small_desc) = host(&minter, 4096);
    resolver.resolve(&big_desc).unwrap();
    resolver.resolve(&small_desc).unwrap();
    resolver.drop_dropped();
    assert_eq!(resolver.mapped(), 2, "both buffers are still held by their creator");
    // The owner drops both buffers (closing them); the child's mapping of the large one
    // goes at the next look, so its memory is freed; the small one may wait for the cache.
    drop((big, small));
    for _ in 0..UNLINKED_CHECK_EVERY {
        resolver.trim();
    }
    assert_eq!(resolver.mapped(), 1, "the large mapping was dropped, the small one kept");
    assert!(resolver.resolve(&big_desc).is_err(), "and it cannot be mapped again");
}

#[test]
fn a_stale_descriptor_never_maps_the_buffer_that_reused_its_descriptor_number() {
    let minter = IdentityMinter::new(9);
    let mut resolver = HostResolver::new(Vec::new());
    let fd = |d: &BufferDesc| match d.backing() {
        Backing::Memfd { fd, .. } => fd,
        other => panic!("host buffers are memfd objects, not {other:?}"),
    };
    // The new buffer gets the dropped one's descriptor number (unless another test thread
    // took it in between: then try again).
    let (old_desc, new, new_desc) = (0..100)
        .map(|_| {
            let (old, old_desc) = host(&minter, 4096);
            old.write(0, &[1u8; 16]).unwrap();
            drop(old);
            let (new, new_desc) = host(&minter, 4096);
            (old_desc, new, new_desc)
        })
        .find(|(old_desc, _, new_desc)| fd(old_desc) == fd(new_desc))
        .expect("a descriptor number is reused");
    new.write(0, &[2u8; 16]).unwrap();
    let err = resolver.resolve(&old_desc).unwrap_err();
    assert!(err.contains("reused the descriptor number"), "{err}");
    assert_eq!(resolver.mapped(), 0);
    // The same identity with another key is refused too, also once mapped.
    let base = resolver.resolve(&new_desc).unwrap();
    // SAFETY: test only — `base` maps the 4096-byte buffer `new`, alive here.
    assert_eq!(unsafe { *base }, 2);
    let Backing::Memfd { pid, fd, ino } = new_desc.backing() else { unreachable!() };
    let forged =
        BufferDesc::new(new_desc.identity(), Backing::Memfd { pid, fd, ino: ino + 1 }, Access::Read, 4096)
            .unwrap();
    assert!(resolver.resolve(&forged).unwrap_err().contains("this descriptor names"));
    let view = TensorView::new(0, &[16], None, crate::data::dtype::DataType::Uint8).unwrap();
    assert!(resolver.tensor(&forged, view, Access::Read).is_err());
    assert!(resolver.tensor(&new_desc, view, Access::Read).is_ok());
}

/// A child started by exec maps its parent's heap rings at addresses of its own, beside
/// rings it made itself, so a slab address of one process may lie inside another process's
/// ring as well: the ring's inode, not the address, says which ring a slab is in.
#[test]
fn a_heap_slab_resolves_in_its_own_ring_when_another_rings_addresses_coincide() {
    use crate::sys::mem::SharedRegion;
    use std::sync::Arc;
    let mine = Arc::new(SharedRegion::new(1 << 16, true).unwrap());
    let parents = Arc::new(SharedRegion::new(1 << 16, true).unwrap());
    // The parent created its ring at the very address this process's own ring has here.
    let origin = mine.addr();
    let heaps = vec![SharedSpan::here(mine.clone()), SharedSpan { origin, region: parents.clone() }];
    let mut resolver = HostResolver::new(heaps);
    let minter = IdentityMinter::new(11);
    let slab = |ino: u64| {
        let backing = Backing::HeapSlab { addr: origin + 4096, ino };
        BufferDesc::new(minter.mint().unwrap(), backing, Access::ReadWrite, 64).unwrap()
    };
    let at = |r: &SharedRegion| r.as_ptr().wrapping_add(4096);
    assert_eq!(resolver.resolve(&slab(parents.ino())).unwrap(), at(&parents));
    assert_eq!(resolver.resolve(&slab(mine.ino())).unwrap(), at(&mine));
    let err = resolver.resolve(&slab(mine.ino().max(parents.ino()) + 1)).unwrap_err();
    assert!(err.contains("outside every heap ring"), "{err}");
}
