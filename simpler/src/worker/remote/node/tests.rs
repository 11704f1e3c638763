use super::*;
use crate::net::auth::client_handshake;

fn key() -> ClusterKey {
    ClusterKey::new("the unit test cluster's secret").unwrap()
}

/// An authenticated connection to `addr` that presents `token` first.
fn connect(addr: &NodeAddr, token: &lane::Token) -> Stream {
    let mut s = Stream::connect(addr, Duration::from_secs(5)).unwrap();
    client_handshake(&mut s, &key(), "node").unwrap();
    lane::announce(&mut s, token, "node").unwrap();
    s
}

/// What a root sends first: SIZE, here of any size (the node's own Worker); its reply read.
fn size_first(s: &mut Stream) {
    write_frame(s, FrameKind::Control, 0, &wire::encode_size(0, 0)).unwrap();
    let reply = loop {
        let f = read_frame(s, DEFAULT_MAX_BODY).unwrap();
        if f.kind != FrameKind::Health {
            break f;
        }
    };
    assert_eq!((reply.kind, reply.seq), (FrameKind::ControlReply, 0));
    let _ = wire::decode_reply(&reply.body).expect("the node takes the SIZE");
}

#[crate::test_support::isolated_test(crate = crate)]
fn a_session_pairs_with_the_health_connection_that_presents_its_token() {
    let node = Node::new(Worker::builder().build().unwrap(), NodeAddr::loopback(0), key()).unwrap();
    let bound = node.bind().unwrap();
    let addr = bound.local_addr();
    let serving = std::thread::spawn(move || bound.serve_one());
    let token = lane::token().unwrap();
    let mut session = connect(&addr, &token);
    // Another authenticated connection with another token is not the session's health
    // connection: refused (closed), and the session still waits for the right one.
    let mut stranger = connect(&addr, &lane::token().unwrap());
    stranger.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(matches!(read_frame(&mut stranger, 64), Err(FrameError::Closed | FrameError::Io(_))));
    let mut health = connect(&addr, &token);
    health.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // Heartbeats come on the health connection; the session connection answers controls.
    let beat = read_frame(&mut health, 0).unwrap();
    assert_eq!((beat.kind, beat.body.len()), (FrameKind::Health, 0));
    let check = wire::encode_check(&Digest::from_bytes([1; 32]), "nothing");
    write_frame(&mut session, FrameKind::Control, 9, &check).unwrap();
    session.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let reply = read_frame(&mut session, DEFAULT_MAX_BODY).unwrap();
    assert_eq!((reply.kind, reply.seq), (FrameKind::ControlReply, 9));
    let refusal = wire::decode_reply(&reply.body).unwrap().unwrap_err();
    assert!(refusal.contains("UNKNOWN_CALLABLE") && refusal.contains("`nothing`"), "{refusal}");
    // The root goes: the session ends, and so does the health connection.
    session.shutdown();
    serving.join().unwrap().unwrap();
    // The health connection closes too, after any heartbeat still in flight.
    loop {
        match read_frame(&mut health, 0) {
            Ok(f) => assert_eq!(f.kind, FrameKind::Health),
            Err(FrameError::Closed) => break,
            Err(e) => panic!("the health connection should end cleanly: {e}"),
        }
    }
}

fn nothing(
    _: &mut crate::engine::orchestrator::Orchestrator<'_>,
    _: &TaskArgs,
    _: &crate::data::call_config::CallConfig,
) -> Result<()> {
    Ok(())
}

#[crate::test_support::isolated_test(crate = crate)]
fn bytes_sent_for_a_node_resident_tensor_are_refused_and_the_session_stays_in_step() {
    use crate::data::buffer::IdentityMinter;
    use crate::data::dtype::DataType;
    use crate::data::tensor::TensorView;
    let mut node = Node::new(Worker::builder().build().unwrap(), NodeAddr::loopback(0), key()).unwrap();
    let f = node.register_orch(OrchFn::new("nothing", nothing));
    let bound = node.bind().unwrap();
    let addr = bound.local_addr();
    let serving = std::thread::spawn(move || bound.serve_one());
    let token = lane::token().unwrap();
    let mut session = connect(&addr, &token);
    let _health = connect(&addr, &token);
    session.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    size_first(&mut session);
    let next = |s: &mut Stream| loop {
        let f = read_frame(s, DEFAULT_MAX_BODY).unwrap();
        if f.kind != FrameKind::Health {
            return f;
        }
    };
    // A node-resident buffer of 64 bytes.
    let alloc = wire::encode_control(wire::ALLOC, &Digest::from_bytes([0; 32]), "", 64, 0, &[]);
    write_frame(&mut session, FrameKind::Control, 1, &alloc).unwrap();
    let id = u64::from_le_bytes(
        wire::decode_reply(&next(&mut session).body).unwrap().unwrap()[..8].try_into().unwrap(),
    );
    // A TASK naming it, with 64 "bytes" for it: a whole CONTROL frame (seq 77) smuggled in.
    let identity = IdentityMinter::new(5).mint().unwrap();
    let t = Buffer::device(identity, 0, id, 64)
        .unwrap()
        .view(TensorView::new(0, &[16], None, DataType::Float32).unwrap())
        .unwrap();
    let mut args = TaskArgs::new();
    args.inout(&t).unwrap();
    let mut body = wire::encode_task_head(
        &f.digest(),
        "nothing",
        None,
        &args,
        &[wire::TensorData::Bulk { offset: 0, len: 64 }],
    )
    .unwrap();
    let mut smuggled = Vec::new();
    write_frame(&mut smuggled, FrameKind::Control, 77, &[0u8; 40]).unwrap();
    assert_eq!(smuggled.len(), 64);
    body.extend_from_slice(&smuggled);
    write_frame(&mut session, FrameKind::Task, 5, &body).unwrap();
    let done = next(&mut session);
    assert_eq!((done.kind, done.seq), (FrameKind::Completion, 5));
    let head = wire::decode_completion(&done.body).unwrap().head;
    assert_eq!(head.status, wire::TASK_FAILED);
    assert!(head.message.contains("sent with bytes of its own"), "{}", head.message);
    // The smuggled frame was read as the TASK's bytes, not run: the next reply is to seq 6.
    let check = wire::encode_check(&f.digest(), "nothing");
    write_frame(&mut session, FrameKind::Control, 6, &check).unwrap();
    let reply = next(&mut session);
    assert_eq!((reply.kind, reply.seq), (FrameKind::ControlReply, 6));
    session.shutdown();
    serving.join().unwrap().unwrap();
}

fn empty(_: &crate::data::host_args::HostArgs<'_>) -> crate::callable::host::HostResult {
    Ok(())
}

fn one_empty(
    orch: &mut crate::engine::orchestrator::Orchestrator<'_>,
    _: &TaskArgs,
    _: &crate::data::call_config::CallConfig,
) -> Result<()> {
    let empty = crate::callable::host::HostFn::new("empty", empty).handle();
    orch.submit_sub(&empty, TaskArgs::new()).map(|_| ())
}

/// The session thread waits for its task's run, so it drives it: the node's background
/// scheduler thread is never woken (a wake-up per task, and a thread that competes for the
/// CPUs, cost a remote task a third of its time on a two-vCPU machine).
#[crate::test_support::isolated_test(crate = crate)]
fn a_session_drives_its_tasks_runs_itself() {
    let mut l3 = Worker::builder().sub_workers(1).build().unwrap();
    l3.register(crate::callable::host::HostFn::new("empty", empty)).unwrap();
    let mut node = Node::new(l3, NodeAddr::loopback(0), key()).unwrap();
    let f = node.register_orch(OrchFn::new("one_empty", one_empty));
    let bound = Arc::new(node.bind().unwrap());
    let addr = bound.local_addr();
    let serving = std::thread::spawn({
        let bound = bound.clone();
        move || bound.serve_one()
    });
    let token = lane::token().unwrap();
    let mut session = connect(&addr, &token);
    let _health = connect(&addr, &token);
    session.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    size_first(&mut session);
    let task = wire::encode_task_head(&f.digest(), "one_empty", None, &TaskArgs::new(), &[]).unwrap();
    for seq in 1..=50 {
        write_frame(&mut session, FrameKind::Task, seq, &task).unwrap();
        let done = loop {
            let frame = read_frame(&mut session, DEFAULT_MAX_BODY).unwrap();
            if frame.kind != FrameKind::Health {
                break frame;
            }
        };
        assert_eq!((done.kind, done.seq), (FrameKind::Completion, seq));
        let head = wire::decode_completion(&done.body).unwrap().head;
        assert_eq!(head.status, wire::DONE, "{}", head.message);
    }
    let Workers::One(worker) = &bound.workers else { unreachable!("Node::new has one Worker") };
    let engine = worker.started().unwrap().engine().unwrap().clone();
    assert_eq!(engine.background_wakes(), 0, "a session's run woke the background thread");
    session.shutdown();
    serving.join().unwrap().unwrap();
}

#[crate::test_support::isolated_test(crate = crate)]
fn sessions_served_at_once_see_only_their_own_node_resident_buffers() {
    let node = Node::new(Worker::builder().build().unwrap(), NodeAddr::loopback(0), key()).unwrap();
    let bound = node.bind().unwrap();
    let addr = bound.local_addr();
    let serving = std::thread::spawn(move || bound.serve(2, 2));
    let open = || {
        let token = lane::token().unwrap();
        let mut session = connect(&addr, &token);
        let health = connect(&addr, &token);
        session.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        size_first(&mut session);
        (session, health)
    };
    let control = |s: &mut Stream, seq: u64, command: u32, arg: u64, arg2: u64| {
        let body = wire::encode_control(command, &Digest::from_bytes([0; 32]), "", arg, arg2, &[]);
        write_frame(s, FrameKind::Control, seq, &body).unwrap();
        let reply = read_frame(s, DEFAULT_MAX_BODY).unwrap();
        assert_eq!((reply.kind, reply.seq), (FrameKind::ControlReply, seq));
        wire::decode_reply(&reply.body).unwrap()
    };
    let (mut a, _ha) = open();
    let (mut b, _hb) = open();
    let id = control(&mut a, 1, wire::ALLOC, 8, 0).expect("an allocation");
    let (id, peer) = crate::worker::remote::peer::decode_alloc(&id).unwrap();
    assert!(peer.is_some(), "the node serves its buffers to other nodes");
    // Root B names root A's buffer: it does not exist in B's session.
    let err = control(&mut b, 1, wire::COPY_FROM, id, 8).unwrap_err();
    assert!(err.contains(&format!("node-resident buffer {id} does not exist")), "{err}");
    let err = control(&mut b, 2, wire::FREE, id, 0).unwrap_err();
    assert!(err.contains("does not exist"), "{err}");
    // A's is still there.
    assert_eq!(control(&mut a, 2, wire::COPY_FROM, id, 8).unwrap().len(), 8);
    a.shutdown();
    b.shutdown();
    serving.join().unwrap().unwrap();
}

/// Reads what is left on `s` until it ends or fails: true when the stream was shut (no bytes,
/// end of stream), within a second.
fn shut(s: &std::os::unix::net::UnixStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    matches!(std::io::Read::read(&mut &*s, &mut [0u8; 8]), Ok(0))
}

#[test]
fn a_cancel_shuts_the_read_in_flight_and_a_connection_read_after_it_is_not_kept() {
    // A CANCEL while task 7 reads over a connection shuts it (the other end sees it end).
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let mut f = InFlight::default();
    f.fetch_on(7, &Stream::Unix(ours));
    f.cancel(7);
    assert!(shut(&theirs), "the read in flight ended");
    assert!(f.fetched(7), "a cancelled task's connection is not kept");
    // A connection registered after the cancel is shut at once; a CANCEL for another task, or
    // one that came after the part was read, touches nothing.
    let (late, late_peer) = std::os::unix::net::UnixStream::pair().unwrap();
    f.fetch_on(7, &Stream::Unix(late));
    assert!(shut(&late_peer));
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let ours = Stream::Unix(ours); // the reader's own, kept as the client keeps it
    let mut g = InFlight::default();
    g.fetch_on(8, &ours);
    g.cancel(9);
    assert!(!g.fetched(8), "task 8 still wants its connection");
    g.cancel(8);
    std::io::Write::write_all(&mut &theirs, b"x").unwrap();
    assert!(!shut(&theirs), "a connection given back is not the cancel's to shut");
    assert!(g.fetched(8), "task 8 was cancelled");
    drop(ours);
}

#[test]
fn once_the_root_is_gone_every_later_read_and_run_of_the_session_stops() {
    let mut f = InFlight::default();
    f.abandon();
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    f.fetch_on(3, &Stream::Unix(ours));
    assert!(shut(&theirs), "a read started after the root went is shut at once");
    assert!(f.fetched(3));
}

/// A task's connect to another node for a read is abandoned when the root cancels that task
/// (before the connect started or during it) or is gone, and not for another task's cancel.
#[test]
fn a_cancel_abandons_the_connect_of_its_task_read() {
    let asked = |setup: &dyn Fn(&mut InFlight, crossbeam_channel::Sender<()>)| {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let mut f = InFlight::default();
        setup(&mut f, tx);
        rx.try_recv().is_ok()
    };
    assert!(asked(&|f, tx| {
        f.connect_on(5, tx);
        f.cancel(5);
    }));
    assert!(asked(&|f, tx| {
        f.cancel(5);
        f.connect_on(5, tx);
    }));
    assert!(asked(&|f, tx| {
        f.connect_on(5, tx);
        f.abandon();
    }));
    assert!(!asked(&|f, tx| {
        f.connect_on(5, tx);
        f.cancel(4);
    }));
}
