use std::os::unix::net::UnixStream;
use std::thread;

use super::*;
use crate::net::frame::write_frame;

fn key(s: &str) -> ClusterKey {
    ClusterKey::new(s).unwrap()
}

fn pair() -> (Stream, Stream) {
    let (a, b) = UnixStream::pair().unwrap();
    (Stream::Unix(a), Stream::Unix(b))
}

const HELLO: NodeHello = NodeHello { node_id: 42, sub_workers: 3, chips: 2, pid: 4242 };

/// Runs the node side on a thread and `root` here; returns both outcomes.
fn run<T>(node_key: ClusterKey, root: impl FnOnce(&mut Stream) -> T) -> (Result<()>, T) {
    let (mut root_end, mut node_end) = pair();
    let node = thread::spawn(move || {
        let out = server_handshake(&mut node_end, &node_key, &HELLO, "unix:root-peer");
        drop(node_end);
        out
    });
    let root_out = root(&mut root_end);
    drop(root_end);
    (node.join().unwrap(), root_out)
}

#[test]
fn keys_are_checked_and_never_printed() {
    let err = ClusterKey::new("short").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("5 bytes") && err.message().contains("at least 16"), "{}", err.message());
    let k = key("0123456789abcdef");
    assert_eq!(format!("{k:?}"), "ClusterKey(..)");
    assert_eq!(format!("{:?}", k.clone()), "ClusterKey(..)");
    let err = ClusterKey::from_env_value(None).unwrap_err();
    assert!(
        err.kind() == crate::error::ErrorKind::InvalidArgument
            && err.message().contains("SIMPLER_CLUSTER_KEY is not set")
    );
    let err = ClusterKey::from_env_value(Some("tiny".into())).unwrap_err();
    assert!(err.message().starts_with("SIMPLER_CLUSTER_KEY: ") && err.message().contains("4 bytes"));
    assert!(ClusterKey::from_env_value(Some("a-long-enough-secret".into())).is_ok());
}

#[test]
fn the_right_key_authenticates_both_sides() {
    let (node, root) = run(key("the-cluster-secret"), |s| {
        let out = client_handshake(s, &key("the-cluster-secret"), "unix:node-peer");
        // The read timeout is cleared after the handshake.
        if let Stream::Unix(u) = s {
            assert_eq!(u.read_timeout().unwrap(), None);
        }
        out
    });
    node.unwrap();
    assert_eq!(root.unwrap(), HELLO);
}

#[test]
fn the_handshake_runs_over_loopback_tcp() {
    use crate::net::transport::{Listener, NodeAddr};
    let l = Listener::bind(&NodeAddr::loopback(0), false).unwrap();
    let addr = l.local_addr();
    let node = thread::spawn(move || {
        let (mut s, peer) = l.accept().unwrap();
        server_handshake(&mut s, &key("the-cluster-secret"), &HELLO, &peer)
    });
    let mut s = Stream::connect(&addr, Duration::from_secs(5)).unwrap();
    let peer = s.peer();
    let got = client_handshake(&mut s, &key("the-cluster-secret"), &peer).unwrap();
    assert_eq!(got, HELLO);
    node.join().unwrap().unwrap();
}

#[test]
fn a_wrong_key_fails_both_sides() {
    let (node, root) =
        run(key("the-cluster-secret"), |s| client_handshake(s, &key("another-secret-key"), "unix:node-peer"));
    let node = node.unwrap_err();
    assert!(node.kind() == crate::error::ErrorKind::InvalidArgument);
    assert!(node.message().contains("unix:root-peer"), "{}", node.message());
    assert!(node.message().contains("does not prove the cluster key"), "{}", node.message());
    let root = root.unwrap_err();
    assert!(root.kind() == crate::error::ErrorKind::InvalidArgument);
    assert!(root.message().contains("the node refused the cluster key"), "{}", root.message());
    assert!(root.message().contains("unix:node-peer"), "{}", root.message());
}

/// The root's side done by hand: reads the challenge, sends `response(nonce_n)` and returns
/// what came back (the READY's body, or the error).
fn manual_root(
    s: &mut Stream,
    response: impl FnOnce(&[u8; NONCE_LEN]) -> Vec<u8>,
) -> std::result::Result<Vec<u8>, FrameError> {
    let f = read_frame(s, MAX_HELLO_BODY)?;
    assert_eq!(f.kind, FrameKind::Hello);
    let nonce_n: [u8; NONCE_LEN] = f.body[3..].try_into().unwrap();
    write_frame(s, FrameKind::Hello, 0, &response(&nonce_n)).unwrap();
    read_frame(s, MAX_HELLO_BODY).map(|f| f.body)
}

#[test]
fn a_replayed_hello_is_refused() {
    let k = key("the-cluster-secret");
    // Session 1: a genuine root; an eavesdropper records its response.
    let mut recorded = Vec::new();
    let (node, ready) = run(k.clone(), |s| {
        manual_root(s, |nonce_n| {
            recorded = response_body(&k, nonce_n, &nonce().unwrap());
            recorded.clone()
        })
    });
    node.unwrap();
    assert_eq!(ready.unwrap()[0], STEP_READY);
    // Session 2: the eavesdropper, without the key, replays the recorded response.
    let (node, reply) = run(k.clone(), |s| manual_root(s, |_| recorded.clone()));
    let node = node.unwrap_err();
    assert!(node.message().contains("replayed"), "{}", node.message());
    assert!(node.message().contains("unix:root-peer"));
    assert_eq!(reply.unwrap(), [STEP_REFUSED], "the node says only \"refused\"");
}

#[test]
fn garbage_instead_of_a_hello_is_refused() {
    let (node, _) = run(key("the-cluster-secret"), |s| {
        read_frame(s, MAX_HELLO_BODY).unwrap();
        std::io::Write::write_all(s, b"GET / HTTP/1.1\r\nHost: node\r\n\r\n").unwrap();
        read_frame(s, MAX_HELLO_BODY).map(|f| f.body)
    });
    let node = node.unwrap_err();
    assert_eq!(node.kind(), ErrorKind::WorkerDied);
    assert!(
        node.message().contains("unix:root-peer") && node.message().contains("bad magic"),
        "{}",
        node.message()
    );

    // A well-formed frame of the wrong kind, and a HELLO of the wrong length, likewise.
    let (node, reply) = run(key("the-cluster-secret"), |s| manual_root(s, |_| Vec::new()));
    assert_eq!(reply.unwrap(), [STEP_REFUSED]);
    let node = node.unwrap_err();
    assert!(node.message().contains("not a valid HELLO"), "{}", node.message());
    let (mut root_end, mut node_end) = pair();
    let t = thread::spawn(move || server_handshake(&mut node_end, &key("the-cluster-secret"), &HELLO, "p"));
    read_frame(&mut root_end, MAX_HELLO_BODY).unwrap();
    write_frame(&mut root_end, FrameKind::Task, 0, b"run this").unwrap();
    let err = t.join().unwrap().unwrap_err();
    assert!(err.message().contains("a Task frame where the root's response was due"), "{}", err.message());
}

#[test]
fn another_version_is_refused_naming_both() {
    // A root whose response says the next version in its body.
    let next = PROTOCOL_VERSION + 1;
    let k = key("the-cluster-secret");
    let (node, reply) = run(k.clone(), |s| {
        manual_root(s, |nonce_n| {
            let mut b = response_body(&k, nonce_n, &[7; NONCE_LEN]);
            b[1..3].copy_from_slice(&next.to_le_bytes());
            b
        })
    });
    let node = node.unwrap_err();
    assert!(node.kind() == crate::error::ErrorKind::InvalidArgument);
    assert!(
        node.message().contains(&format!("version {next}, this side speaks {PROTOCOL_VERSION}")),
        "{}",
        node.message()
    );
    assert_eq!(reply.unwrap(), [STEP_REFUSED]);

    // A node whose frames say version 9 in their header.
    let (mut root_end, mut node_end) = pair();
    let t = thread::spawn(move || client_handshake(&mut root_end, &key("the-cluster-secret"), "unix:v9"));
    let mut frame = Vec::new();
    write_frame(&mut frame, FrameKind::Hello, 0, &challenge_body(&[1; NONCE_LEN])).unwrap();
    frame[4..6].copy_from_slice(&9u16.to_le_bytes());
    std::io::Write::write_all(&mut node_end, &frame).unwrap();
    let err = t.join().unwrap().unwrap_err();
    assert!(err.kind() == crate::error::ErrorKind::InvalidArgument);
    assert!(err.message().contains("unix:v9"));
    let want = format!("protocol version 9, this side speaks {PROTOCOL_VERSION}");
    assert!(err.message().contains(&want), "{}", err.message());
}

#[test]
fn a_fake_node_without_the_key_is_refused() {
    let (mut root_end, mut node_end) = pair();
    let root =
        thread::spawn(move || client_handshake(&mut root_end, &key("the-cluster-secret"), "unix:fake"));
    // The fake node challenges, ignores the root's proof and answers with its own key.
    let nonce_n = [3u8; NONCE_LEN];
    write_frame(&mut node_end, FrameKind::Hello, 0, &challenge_body(&nonce_n)).unwrap();
    let resp = read_frame(&mut node_end, MAX_HELLO_BODY).unwrap().body;
    let nonce_r = &resp[3..3 + NONCE_LEN];
    let ready = ready_body(&key("a-guessed-wrong-key"), nonce_r, &nonce_n, &HELLO);
    write_frame(&mut node_end, FrameKind::Hello, 0, &ready).unwrap();
    let err = root.join().unwrap().unwrap_err();
    // The root tells the fake node "refused", and nothing more.
    let told = read_frame(&mut node_end, MAX_HELLO_BODY).map(|f| f.body);
    assert!(err.kind() == crate::error::ErrorKind::InvalidArgument);
    assert!(err.message().contains("unix:fake") && err.message().contains("does not hold the cluster key"));
    assert_eq!(told.unwrap(), [STEP_REFUSED]);

    // A READY whose announced fields were altered fails as well (the MAC covers them).
    let (mut root_end, mut node_end) = pair();
    let root = thread::spawn(move || client_handshake(&mut root_end, &key("the-cluster-secret"), "unix:m"));
    write_frame(&mut node_end, FrameKind::Hello, 0, &challenge_body(&nonce_n)).unwrap();
    let resp = read_frame(&mut node_end, MAX_HELLO_BODY).unwrap().body;
    let mut ready = ready_body(&key("the-cluster-secret"), &resp[3..3 + NONCE_LEN], &nonce_n, &HELLO);
    let chips_at = ready.len() - 4;
    ready[chips_at] = 200;
    write_frame(&mut node_end, FrameKind::Hello, 0, &ready).unwrap();
    assert!(root.join().unwrap().unwrap_err().message().contains("does not hold the cluster key"));
}

#[test]
fn a_node_that_refuses_at_once_is_not_blamed_on_the_key() {
    let (mut root_end, mut node_end) = pair();
    write_frame(&mut node_end, FrameKind::Hello, 0, &[STEP_REFUSED]).unwrap();
    let err = client_handshake(&mut root_end, &key("the-cluster-secret"), "unix:busy").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WorkerDied);
    assert!(err.message().contains("unix:busy") && err.message().contains("refused the connection"));
}

#[test]
fn a_silent_a_trickling_and_a_closed_peer_are_named() {
    let k = key("the-cluster-secret");
    // A node that closes at once.
    let (mut root_end, node_end) = pair();
    drop(node_end);
    let err = client_handshake(&mut root_end, &k, "unix:gone").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WorkerDied);
    assert!(err.message().contains("unix:gone") && err.message().contains("closed the connection"));
    // A node that says nothing.
    let (mut root_end, _node_end) = pair();
    let short = Duration::from_millis(100);
    let err = client_handshake_within(&mut root_end, &k, "unix:mute", short).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(err.message().contains("unix:mute"), "{}", err.message());
    assert!(
        err.message().contains("timed out after 100ms waiting for the node's challenge")
            && err.message().contains("serving another root"),
        "{}",
        err.message()
    );
    if let Stream::Unix(u) = &root_end {
        assert_eq!(u.read_timeout().unwrap(), None, "the timeout is cleared after a failure too");
    }
    // A root that trickles a valid response a byte at a time: the deadline covers the whole
    // handshake, not each read.
    let (mut root_end, mut node_end) = pair();
    let node_key = k.clone();
    let node =
        thread::spawn(move || server_handshake_within(&mut node_end, &node_key, &HELLO, "unix:slow", short));
    let challenge = read_frame(&mut root_end, MAX_HELLO_BODY).unwrap().body;
    let nonce_n: [u8; NONCE_LEN] = challenge[3..].try_into().unwrap();
    let mut frame = Vec::new();
    write_frame(&mut frame, FrameKind::Hello, 0, &response_body(&k, &nonce_n, &[9; NONCE_LEN])).unwrap();
    let started = Instant::now();
    for b in frame {
        if std::io::Write::write_all(&mut root_end, &[b]).is_err()
            || started.elapsed() > Duration::from_secs(2)
        {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    let err = node.join().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{}", err.message());
    assert!(err.message().contains("unix:slow"));
}
