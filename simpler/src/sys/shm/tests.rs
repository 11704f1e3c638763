use super::*;
use crate::error::ErrorKind;

/// A label unique to this test process.
fn label(tag: &str) -> String {
    format!("sp-t{}-{tag}", std::process::id())
}

/// Descriptors this process holds that name a memfd labelled `label`.
fn held(label: &str) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| is_memfd_named(&l.to_string_lossy(), label)))
        .count()
}

#[test]
fn names_of_this_library_name_their_creator() {
    assert_eq!(creator_pid("sp-0a1b2c3d-4242-b17"), Some(4242));
    assert_eq!(creator_pid(&buffer_label(0xff_0a1b_2c3d, 4242, 17)), Some(4242));
    assert_eq!(creator_pid("sp-doc-77-3"), Some(77));
    for other in [
        "sp-0a1b2c3d-4242-c17",
        "sp-0a1b2c3-4242-b1",
        "sp-0a1b2c3g-4242-b1",
        "sp-0a1b2c3d-42x-b1",
        "sp-0a1b2c3d--b1",
        "sp-0a1b2c3d-0-b1",
        "sp-0a1b2c3d-4242-b",
        "sp-doc-77-",
        "sp-t4242-rw",
        "sp-c4242-x",
        "other-0a1b2c3d-4242-b1",
        "sp-0a1b2c3d-4242-b1-x",
    ] {
        assert_eq!(creator_pid(other), None, "{other}");
    }
}

#[test]
fn memfd_links_are_matched_exactly() {
    assert!(is_memfd_named("/memfd:sp-1-b2 (deleted)", "sp-1-b2"));
    assert!(is_memfd_named("/memfd:sp-1-b2", "sp-1-b2"));
    assert!(!is_memfd_named("/memfd:sp-1-b23 (deleted)", "sp-1-b2"));
    assert!(!is_memfd_named("/dev/shm/sp-1-b2", "sp-1-b2"));
    assert!(!is_memfd_named("/memfd:sp-1-b2 (deleted)x", "sp-1-b2"));
}

#[test]
fn a_reused_pid_does_not_keep_an_older_object() {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    assert!(creator_is_gone(t, None), "no process has the id");
    assert!(!creator_is_gone(t, Some(t - Duration::from_secs(60))), "its creator, started before");
    assert!(!creator_is_gone(t, Some(t + Duration::from_millis(500))), "within the margin: kept");
    assert!(creator_is_gone(t, Some(t + PID_REUSE_MARGIN + Duration::from_millis(1))), "a later process");
}

#[test]
fn this_process_starts_before_it_creates() {
    let started = process_start(std::process::id() as i32).unwrap().expect("this process exists");
    let path = format!("{SHM_DIR}/{}", label("start"));
    std::fs::write(&path, b"x").unwrap();
    let changed = ctime(&std::fs::metadata(&path).unwrap());
    std::fs::remove_file(&path).unwrap();
    assert!(!creator_is_gone(changed, Some(started)), "{changed:?} vs start {started:?}");
    assert!(started <= SystemTime::now());
    assert_eq!(process_start(i32::MAX).unwrap(), None, "no such process");
}

#[test]
fn create_open_write_read() {
    let name = label("rw");
    let owner = SharedMem::create(&name, 4096).unwrap();
    assert_eq!(owner.len(), 4096);
    assert_eq!(owner.key().pid, std::process::id());
    assert!(
        std::fs::read_dir(SHM_DIR).unwrap().flatten().all(|e| e.file_name().to_string_lossy() != name),
        "no name in /dev/shm"
    );
    let mut zeros = [1u8; 16];
    owner.read_bytes(4080, &mut zeros).unwrap();
    assert_eq!(zeros, [0; 16]);
    owner.write_bytes(100, b"hello").unwrap();

    let opener = SharedMem::open(owner.key(), &name, 4096).unwrap();
    assert_eq!(opener.len(), 4096);
    assert_eq!(held(&name), 1, "the opener keeps no descriptor");
    let mut got = [0u8; 5];
    opener.read_bytes(100, &mut got).unwrap();
    assert_eq!(&got, b"hello");
    opener.write_bytes(4091, b"tail!").unwrap();
    owner.read_bytes(4091, &mut got).unwrap();
    assert_eq!(&got, b"tail!");
    assert!(opener.is_held());

    // The creator drops it: its descriptor closes, the opener's mapping stays usable.
    drop(owner);
    assert_eq!(held(&name), 0);
    assert!(!opener.is_held());
    opener.read_bytes(100, &mut got).unwrap();
    assert_eq!(&got, b"hello");
}

#[test]
fn the_size_is_sealed() {
    let owner = SharedMem::create(&label("seal"), 8192).unwrap();
    let file = owner.file.as_ref().unwrap();
    assert!(nix::unistd::ftruncate(file, 4096).is_err(), "shrinking is refused");
    assert!(nix::unistd::ftruncate(file, 1 << 20).is_err(), "growing is refused");
}

#[test]
fn a_reused_descriptor_number_is_refused() {
    let (first, second) = (label("first"), label("second"));
    // The lowest free number is taken again: the new object gets the old one's number
    // (unless another test thread took it in between: then try again).
    let (stale, b) = (0..100)
        .map(|_| {
            let stale = SharedMem::create(&first, 64).unwrap().key();
            (stale, SharedMem::create(&second, 64).unwrap())
        })
        .find(|(stale, b)| b.key().fd == stale.fd)
        .expect("a descriptor number is reused");
    assert_ne!(b.key().ino, stale.ino);
    let err = SharedMem::open(stale, &first, 64).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("reused"), "{err}");
    // Same label, stale inode: refused as well.
    let err = SharedMem::open(SharedKey { ino: stale.ino, ..b.key() }, &second, 64).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    // Right inode, wrong label: refused.
    assert!(SharedMem::open(b.key(), &first, 64).is_err());
    assert!(SharedMem::open(b.key(), &second, 64).is_ok());
}

#[test]
fn out_of_range_copies_are_refused() {
    let shm = SharedMem::create(&label("oob"), 64).unwrap();
    let err = shm.write_bytes(60, &[0; 5]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("offset 60"), "{err}");
    assert!(err.message().contains("64 bytes"), "{err}");
    assert!(shm.read_bytes(usize::MAX, &mut [0; 2]).is_err());
    assert!(shm.read_bytes(65, &mut []).is_err());
    assert!(shm.read_bytes(64, &mut []).is_ok());
    assert!(shm.write_bytes(0, &[7; 64]).is_ok());
}

#[test]
fn open_refuses_smaller_objects_and_missing_descriptors() {
    let name = label("small");
    let owner = SharedMem::create(&name, 100).unwrap();
    let err = SharedMem::open(owner.key(), &name, 101).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("100 bytes"), "{err}");
    assert!(SharedMem::open(owner.key(), &name, 100).is_ok());
    let missing = SharedKey { fd: i32::MAX as u32, ..owner.key() };
    assert_eq!(SharedMem::open(missing, &name, 1).unwrap_err().kind(), ErrorKind::Os);
    let no_process = SharedKey { pid: i32::MAX as u32, ..owner.key() };
    assert_eq!(SharedMem::open(no_process, &name, 1).unwrap_err().kind(), ErrorKind::Os);
}

#[test]
fn the_live_buffers_count_with_what_they_may_still_take() {
    let left = MemoryLeft { bytes: 1000, source: "a test".to_string() };
    let none = Commitment::default();
    assert!(admit("b1", 1000, &left, &none).is_ok(), "all that is left");
    let err = admit("b1", 1001, &left, &none).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted);
    assert!(err.message().contains("1001 bytes asked for") && err.message().contains("1000 bytes"), "{err}");
    assert!(!err.message().contains("live"), "no live buffer to name: {err}");
    // Two live buffers of 400 bytes, nothing written: 800 may still be taken.
    let untouched = Commitment { buffers: 2, bytes: 800, unbacked: 800 };
    assert!(admit("b3", 200, &left, &untouched).is_ok());
    let err = admit("b3", 201, &left, &untouched).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted);
    for needle in [
        "host buffer b3",
        "201 bytes asked for",
        "only 1000 bytes",
        "(a test)",
        "2 live host buffers",
        "800 bytes",
        "1001 bytes in all",
        "drop buffers",
    ] {
        assert!(err.message().contains(needle), "{needle:?} in {err}");
    }
    // Written, they take no more than what is left already leaves out.
    let written = Commitment { buffers: 2, bytes: 800, unbacked: 0 };
    assert!(admit("b3", 1000, &left, &written).is_ok());
    let one = Commitment { buffers: 1, bytes: 800, unbacked: 300 };
    let err = admit("b2", 701, &left, &one).unwrap_err();
    assert!(err.message().contains("the 1 live host buffer of this process holds"), "{err}");
}

#[test]
fn a_live_buffer_counts_what_is_not_written_yet() {
    let shm = SharedMem::create(&label("count"), 1 << 20).unwrap();
    let ino = shm.key().ino;
    let unbacked = |ino: u64| {
        let live = sync::lock(&LIVE);
        let (file, len) = &live.held[&ino];
        let m = file.metadata().unwrap();
        (*len, m.len().saturating_sub(m.blocks() * 512))
    };
    assert_eq!(unbacked(ino), (1 << 20, 1 << 20), "nothing written yet");
    shm.write_bytes(0, &[1u8; 64 << 10]).unwrap();
    // At least the pages written are backed (a huge page may back more).
    let (len, left) = unbacked(ino);
    assert!(len == 1 << 20 && left <= (1 << 20) - (64 << 10), "64 KiB written: {left} unbacked");
    let name = label("count");
    drop(shm);
    assert!(!sync::lock(&LIVE).held.contains_key(&ino), "a dropped buffer leaves the list");
    assert_eq!(held(&name), 0, "and its descriptor closed");
}

#[test]
fn zero_length_and_more_than_memory_are_refused() {
    assert_eq!(SharedMem::create(&label("zero"), 0).unwrap_err().kind(), ErrorKind::InvalidArgument);
    let left = memory_left().expect("/proc/meminfo is readable");
    assert!(left.bytes > 0, "{left:?}");
    let err = SharedMem::create(&label("huge"), 1 << 50).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted);
    assert!(err.message().contains(&(1u64 << 50).to_string()) && err.message().contains("left"), "{err}");
    assert_eq!(held(&label("huge")), 0, "nothing was created");
}
