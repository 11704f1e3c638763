use super::*;
use crate::worker::Worker;

fn key() -> ClusterKey {
    ClusterKey::new("the peer tests' cluster secret").unwrap()
}

fn hello() -> NodeHello {
    NodeHello { node_id: 1, sub_workers: 0, chips: 0, pid: std::process::id() }
}

/// A started Worker (for its host buffers) and a buffer of `n` bytes holding 0, 1, 2, ...
fn worker_and_buffer(n: usize) -> (Worker, Buffer) {
    let mut w = Worker::builder().build().unwrap();
    w.init().unwrap();
    let b = w.create_buffer(n).unwrap();
    let bytes: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    b.write(0, &bytes).unwrap();
    (w, b)
}

fn source(server: &PeerServer, grant: Grant, offset: u64, len: u64) -> PeerSource {
    PeerSource { addr: server.addr().to_string(), grant, offset, len }
}

#[crate::test_support::isolated_test(crate = crate)]
fn a_granted_range_is_read_over_a_kept_connection_and_a_revoked_grant_is_refused() {
    let (w, held) = worker_and_buffer(1 << 20);
    let server = PeerServer::start(&NodeAddr::loopback(0), key(), hello()).unwrap();
    let grant = server.grant(&held).unwrap();
    assert_eq!(server.grants(), 1);
    let client = PeerClient::new(key());
    let into = w.create_buffer(4096).unwrap();
    client.fetch(&source(&server, grant, 1000, 4096), &into, 0, &()).unwrap();
    let want: Vec<u8> = (1000..1000 + 4096).map(|i| (i % 251) as u8).collect();
    assert_eq!(into.read::<u8>(0, 4096).unwrap(), want);
    // Again, over the connection it kept.
    client.fetch(&source(&server, grant, 0, 16), &into, 100, &()).unwrap();
    assert_eq!(into.read::<u8>(100, 16).unwrap(), (0..16).collect::<Vec<u8>>());
    assert_eq!(sync::lock(&client.idle).len(), 1);
    // Outside the buffer, or with a grant that names nothing: refused, naming why, and the
    // connection stays usable.
    let e = client.fetch(&source(&server, grant, (1 << 20) - 8, 16), &into, 0, &()).unwrap_err();
    assert!(e.message().contains("refused the read") && e.message().contains("16 bytes at offset"), "{e}");
    let e = client.fetch(&source(&server, [9; GRANT_LEN], 0, 16), &into, 0, &()).unwrap_err();
    assert!(e.message().contains("no node-resident buffer of this node has that grant"), "{e}");
    server.revoke(&grant);
    let e = client.fetch(&source(&server, grant, 0, 16), &into, 0, &()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidState, "{e}");
    server.stop();
    w.close().unwrap();
}

#[crate::test_support::isolated_test(crate = crate)]
fn a_peer_without_the_cluster_key_reads_nothing() {
    let (w, held) = worker_and_buffer(64);
    let server = PeerServer::start(&NodeAddr::loopback(0), key(), hello()).unwrap();
    let grant = server.grant(&held).unwrap();
    let intruder = PeerClient::new(ClusterKey::new("another cluster's secret!").unwrap());
    let into = w.create_buffer(64).unwrap();
    let e = intruder.fetch(&source(&server, grant, 0, 64), &into, 0, &()).unwrap_err();
    assert!(e.message().contains("refused the cluster key"), "{e}");
    assert_eq!(into.read::<u8>(0, 64).unwrap(), vec![0; 64], "nothing was read");
    server.stop();
    w.close().unwrap();
}

#[crate::test_support::isolated_test(crate = crate)]
fn silent_connections_hold_back_no_honest_peer() {
    let (w, held) = worker_and_buffer(64);
    let server = PeerServer::start(&NodeAddr::loopback(0), key(), hello()).unwrap();
    let grant = server.grant(&held).unwrap();
    let at = NodeAddr::parse(server.addr()).unwrap();
    // Twice as many connections as the server serves, each saying nothing.
    let silent: Vec<Stream> =
        (0..2 * MAX_PEERS).map(|_| Stream::connect(&at, Duration::from_secs(5)).unwrap()).collect();
    let client = PeerClient::new(key());
    let into = w.create_buffer(64).unwrap();
    client.fetch(&source(&server, grant, 0, 64), &into, 0, &()).expect("an honest peer is served");
    assert_eq!(into.read::<u8>(0, 64).unwrap(), (0..64).collect::<Vec<u8>>());
    drop(silent);
    server.stop();
    w.close().unwrap();
}

#[test]
fn an_alloc_reply_names_the_buffer_and_where_other_nodes_read_it() {
    let mut reply = 7u64.to_le_bytes().to_vec();
    assert_eq!(decode_alloc(&reply).unwrap(), (7, None));
    reply.extend_from_slice(&[3; GRANT_LEN]);
    reply.extend_from_slice(b"127.0.0.1:9");
    assert_eq!(decode_alloc(&reply).unwrap(), (7, Some(("127.0.0.1:9".to_string(), [3; GRANT_LEN]))));
    for cut in [0, 4, 9, 8 + GRANT_LEN] {
        assert!(decode_alloc(&reply[..cut]).is_err(), "{cut}");
    }
}

#[crate::test_support::isolated_test(crate = crate)]
fn a_stopped_server_ends_its_connections_and_holds_no_buffer() {
    let (w, held) = worker_and_buffer(64);
    let server = PeerServer::start(&NodeAddr::loopback(0), key(), hello()).unwrap();
    let grant = server.grant(&held).unwrap();
    let client = PeerClient::new(key());
    let into = w.create_buffer(64).unwrap();
    client.fetch(&source(&server, grant, 0, 64), &into, 0, &()).unwrap();
    // A connection still in its handshake, and the kept one of the client.
    let silent = Stream::connect(&NodeAddr::parse(server.addr()).unwrap(), PEER_CONNECT).unwrap();
    server.stop();
    assert_eq!(server.grants(), 0, "a stopped server keeps no buffer mapped for a connection");
    silent.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Ended: the stream ends (after the server's challenge, if it had accepted the connection
    // before it stopped), rather than staying open until the read times out.
    let ended = std::io::Read::read_to_end(&mut &silent, &mut Vec::new());
    assert!(
        ended.is_ok() || ended.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the pending handshake was ended: {ended:?}"
    );
    let mut byte = [0u8; 1];
    let kept = sync::lock(&client.idle).remove(server.addr()).expect("the client kept its connection");
    let n = std::io::Read::read(&mut &kept, &mut byte).unwrap_or(0);
    assert_eq!(n, 0, "the served connection was ended");
    w.close().unwrap();
}
