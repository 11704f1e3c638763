use std::thread;
use std::time::Instant;

use super::*;
use crate::error::ErrorKind;
use crate::net::frame::{FrameKind, read_frame, write_frame};

#[test]
fn addresses_parse_and_round_trip() {
    for (text, want) in [
        ("127.0.0.1:5555", NodeAddr::loopback(5555)),
        ("tcp:127.0.0.1:5555", NodeAddr::loopback(5555)),
        ("localhost:80", NodeAddr::loopback(80)),
        ("tcp:LOCALHOST:0", NodeAddr::loopback(0)),
        ("[::1]:7", NodeAddr::Tcp("[::1]:7".parse().unwrap())),
        ("0.0.0.0:1", NodeAddr::Tcp("0.0.0.0:1".parse().unwrap())),
        ("unix:/tmp/node.sock", NodeAddr::Unix("/tmp/node.sock".into())),
        ("unix:relative.sock", NodeAddr::Unix("relative.sock".into())),
    ] {
        let got = NodeAddr::parse(text).unwrap();
        assert_eq!(got, want, "{text}");
        assert_eq!(got.to_string().parse::<NodeAddr>().unwrap(), got, "{text}");
    }
    assert_eq!(NodeAddr::loopback(9).to_string(), "127.0.0.1:9");
    assert_eq!(NodeAddr::Unix("/a/b".into()).to_string(), "unix:/a/b");
    assert_eq!(NodeAddr::parse("[::1]:7").unwrap().to_string(), "[::1]:7");
    for bad in
        ["", "unix:", "127.0.0.1", "127.0.0.1:99999", "host.example:80", "::1:80", "tcp:", ":80", "1.2.3:4"]
    {
        let err = NodeAddr::parse(bad).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.message().contains(&format!("{bad:?}")), "{}", err.message());
    }
    assert!(NodeAddr::loopback(1).is_loopback());
    assert!(NodeAddr::parse("[::1]:1").unwrap().is_loopback());
    assert!(NodeAddr::parse("unix:/x").unwrap().is_loopback());
    assert!(!NodeAddr::parse("0.0.0.0:1").unwrap().is_loopback());
    assert!(!NodeAddr::parse("10.1.2.3:1").unwrap().is_loopback());
}

#[test]
fn a_non_loopback_address_binds_only_with_allow_remote() {
    let any = NodeAddr::parse("0.0.0.0:0").unwrap();
    let err = Listener::bind(&any, false).unwrap_err();
    assert!(err.kind() == crate::error::ErrorKind::InvalidArgument);
    assert!(
        err.message().contains("non-loopback") && err.message().contains("allow_remote"),
        "{}",
        err.message()
    );
    let err = Listener::bind(&NodeAddr::parse("0.0.0.0:1").unwrap(), false).unwrap_err();
    assert!(err.message().contains("0.0.0.0:1"));
    // With allow_remote it binds (port 0: the wildcard address is never a real remote here).
    let l = Listener::bind(&any, true).unwrap();
    assert!(matches!(l.local_addr(), NodeAddr::Tcp(a) if a.port() != 0));
}

#[test]
fn tcp_loopback_connects_and_carries_frames() {
    let l = Listener::bind(&NodeAddr::loopback(0), false).unwrap();
    let addr = l.local_addr();
    let NodeAddr::Tcp(bound) = addr else { panic!("a TCP address") };
    assert_ne!(bound.port(), 0);
    let server = thread::spawn(move || {
        let (mut s, peer) = l.accept().unwrap();
        assert!(peer.starts_with("127.0.0.1:"), "{peer}");
        if let Stream::Tcp(t) = &s {
            assert!(t.nodelay().unwrap());
        }
        let f = read_frame(&mut s, 1024).unwrap();
        write_frame(&mut s, FrameKind::ControlReply, f.seq, &f.body).unwrap();
    });
    let mut c = Stream::connect(&addr, Duration::from_secs(5)).unwrap();
    assert_eq!(c.peer(), addr.to_string());
    write_frame(&mut c, FrameKind::Control, 5, b"ping").unwrap();
    let f = read_frame(&mut c, 1024).unwrap();
    assert_eq!((f.kind, f.seq, &f.body[..]), (FrameKind::ControlReply, 5, &b"ping"[..]));
    server.join().unwrap();
    let clone = c.try_clone().unwrap();
    clone.shutdown();
    assert!(matches!(read_frame(&mut c, 1024), Err(crate::net::frame::FrameError::Closed)));
}

fn socket_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("simpler-net-{}-{name}.sock", std::process::id()))
}

#[test]
fn a_unix_listener_accepts_and_cleans_up() {
    let path = socket_path("accept");
    let addr = NodeAddr::Unix(path.clone());
    let l = Listener::bind(&addr, false).unwrap();
    assert_eq!(l.local_addr(), addr);
    let server = thread::spawn(move || {
        let (mut s, peer) = l.accept().unwrap();
        let f = read_frame(&mut s, 64).unwrap();
        write_frame(&mut &s, FrameKind::Completion, f.seq + 1, b"done").unwrap();
        (peer, l)
    });
    let mut c = Stream::connect(&addr, Duration::from_secs(1)).unwrap();
    assert_eq!(c.peer(), addr.to_string());
    write_frame(&mut c, FrameKind::Task, 1, b"work").unwrap();
    let f = read_frame(&mut &c, 64).unwrap();
    assert_eq!((f.kind, f.seq, &f.body[..]), (FrameKind::Completion, 2, &b"done"[..]));
    let (peer, l) = server.join().unwrap();
    assert_eq!(peer, addr.to_string());
    // A second listener on a live socket is refused, and the live one is untouched.
    let err = Listener::bind(&addr, false).unwrap_err();
    assert!(err.message().contains("already listens"), "{}", err.message());
    assert!(Stream::connect(&addr, Duration::from_secs(1)).is_ok());
    drop(l);
    assert!(!path.exists(), "the listener removes its socket file");
}

#[test]
fn a_stale_unix_socket_is_replaced_and_a_plain_file_is_not() {
    let path = socket_path("stale");
    let _ = std::fs::remove_file(&path);
    // A socket file nobody listens on (its listener forgotten, as after a crash).
    drop(UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let l = Listener::bind(&NodeAddr::Unix(path.clone()), false).unwrap();
    let c = Stream::connect(&l.local_addr(), Duration::from_secs(1)).unwrap();
    drop((c, l));
    std::fs::write(&path, b"not a socket").unwrap();
    let err = Listener::bind(&NodeAddr::Unix(path.clone()), false).unwrap_err();
    assert!(err.message().contains("not a socket"), "{}", err.message());
    assert_eq!(std::fs::read(&path).unwrap(), b"not a socket");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn connecting_to_nothing_fails() {
    let l = Listener::bind(&NodeAddr::loopback(0), false).unwrap();
    let addr = l.local_addr();
    drop(l);
    assert!(Stream::connect(&addr, Duration::from_secs(1)).is_err());
    assert!(Stream::connect(&NodeAddr::Unix(socket_path("none")), Duration::from_secs(1)).is_err());
}

#[test]
fn a_frame_counts_as_waiting_whole_only_when_all_of_it_is_there_and_fits_the_look() {
    let (a, b) = UnixStream::pair().unwrap();
    let (mut a, b) = (Stream::Unix(a), Stream::Unix(b));
    let mut look = [0u8; 64];
    assert_eq!(b.waiting_frame(&mut look), Waiting::Nothing);
    let mut frame = Vec::new();
    write_frame(&mut frame, FrameKind::Control, 3, &[9u8; 10]).unwrap();
    a.write_all(&frame[..20]).unwrap(); // part of the header
    assert_eq!(b.waiting_frame(&mut look), Waiting::Other);
    a.write_all(&frame[20..30]).unwrap(); // the header and part of the body
    assert_eq!(b.waiting_frame(&mut look), Waiting::Other);
    a.write_all(&frame[30..]).unwrap();
    assert_eq!(b.waiting_frame(&mut look), Waiting::Whole(frame.len()));
    assert_eq!(b.waiting_frame(&mut look), Waiting::Whole(frame.len()), "looking takes nothing");
    let got = read_frame(&mut &b, 64).unwrap();
    assert_eq!((got.kind, got.seq, got.body), (FrameKind::Control, 3, vec![9u8; 10]));
    // A whole frame longer than the look is not one a look can vouch for.
    write_frame(&mut a, FrameKind::Control, 4, &[1u8; 100]).unwrap();
    assert_eq!(b.waiting_frame(&mut look), Waiting::Other);
    assert_eq!(read_frame(&mut &b, 200).unwrap().body.len(), 100);
    drop(a);
    assert_eq!(b.waiting_frame(&mut look), Waiting::Other, "the end of the stream");
}

/// A TCP connect the peer's kernel never answers (its accept queue is full, so it drops the
/// SYN): abandoned at once when cancelled, ended by its timeout otherwise, also when nobody can
/// cancel it any more.
#[test]
fn a_connect_that_hangs_ends_when_cancelled_or_by_its_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // Connections nobody accepts fill the queue; the first that times out shows it is full.
    let mut held = Vec::new();
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(s) => held.push(s),
            Err(e) if matches!(e.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock) => break,
            Err(e) => panic!("connect {}: {e}", held.len()),
        }
        assert!(held.len() < 100_000, "the accept queue never filled");
    }
    let at = NodeAddr::Tcp(addr);
    // Cancelled while it waits: the connecting thread is there, then the cancel comes.
    let connecting = || {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim() == "simpler-connect")
            .count()
    };
    let before = connecting();
    let (cancel, cancelled) = crossbeam_channel::bounded(1);
    let start = Instant::now();
    let waiter = {
        let at = at.clone();
        thread::spawn(move || Stream::connect_cancellable(&at, Duration::from_secs(2), &cancelled))
    };
    while connecting() == before {
        assert!(start.elapsed() < Duration::from_secs(10), "the connecting thread never started");
        thread::yield_now();
    }
    cancel.send(()).unwrap();
    let got = waiter.join().unwrap().expect("no error: cancelled");
    assert!(got.is_none(), "cancelled, not connected");
    assert!(start.elapsed() < Duration::from_secs(2), "abandoned at once, not after the timeout");
    // Not cancelled: its own timeout ends it, also with nobody left to cancel it.
    let (cancel, cancelled) = crossbeam_channel::bounded::<()>(1);
    let start = Instant::now();
    let err = Stream::connect_cancellable(&at, Duration::from_millis(300), &cancelled).unwrap_err();
    assert!(matches!(err.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock), "{err}");
    assert!(start.elapsed() >= Duration::from_millis(300));
    drop(cancel);
    let err = Stream::connect_cancellable(&at, Duration::from_millis(300), &cancelled).unwrap_err();
    assert!(matches!(err.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock), "{err}");
    drop(held);
}
