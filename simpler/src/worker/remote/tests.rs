//! The root's session against a node played by the test, frame by frame: replies late,
//! duplicated, out of order and of another session, and COMPLETIONs that answer no task.

use super::*;
use crate::net::frame::{read_frame, write_frame};
use std::os::unix::net::UnixStream;

/// What the engine's doorbell is for a session under test.
struct Bell(Doorbell);

impl AsRef<Doorbell> for Bell {
    fn as_ref(&self) -> &Doorbell {
        &self.0
    }
}

/// A session over socket pairs, and the node's ends of its session and health connections (the
/// test plays the node; it sends no heartbeats, so the health timeout is long).
fn session() -> (Arc<Session>, Stream, Stream) {
    session_with(Duration::from_secs(120))
}

/// [`session`] with the health timeout `health`.
fn session_with(health: Duration) -> (Arc<Session>, Stream, Stream) {
    let (root, node) = UnixStream::pair().unwrap();
    let (root_health, node_health) = UnixStream::pair().unwrap();
    let key = ClusterKey::new("the unit test cluster's secret").unwrap();
    let spec = RemoteWorker::new(NodeAddr::parse("unix:/nowhere").unwrap(), key).health_timeout(health);
    let hello = NodeHello { node_id: 1, sub_workers: 1, chips: 0, pid: 4242 };
    let s = Session::open(
        Stream::Unix(root),
        Stream::Unix(root_health),
        &hello,
        &spec,
        "remote worker 0 (fake)".into(),
        HostResolver::new(Vec::new()),
        Arc::new(Bell(Doorbell::new())),
    )
    .unwrap();
    let node = Stream::Unix(node);
    node.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    (s, node, Stream::Unix(node_health))
}

/// A control of `command` sent on another thread, waiting `timeout` for its reply.
fn control_in_background(
    s: &Arc<Session>,
    command: u32,
    arg: u64,
    timeout: Duration,
) -> std::thread::JoinHandle<Result<std::result::Result<Vec<u8>, String>>> {
    let s = s.clone();
    std::thread::spawn(move || {
        let body = wire::encode_control(command, &Digest::from_bytes([0; 32]), "", arg, 0, &[]);
        s.control(command, &body, timeout)
    })
}

/// Reads the next CONTROL the root sent; returns its sequence number, command and argument.
fn next_control(node: &mut Stream) -> (u64, u32, u64) {
    let f = read_frame(node, DEFAULT_MAX_BODY).unwrap();
    assert_eq!(f.kind, FrameKind::Control);
    let msg = wire::decode_control(&f.body).unwrap();
    (f.seq, msg.command, msg.arg)
}

fn reply(node: &mut Stream, seq: u64, result: std::result::Result<Vec<u8>, String>) {
    write_frame(node, FrameKind::ControlReply, seq, &wire::encode_reply(&result)).unwrap();
}

#[test]
fn an_allocation_whose_reply_came_late_is_freed_and_later_controls_get_their_own_replies() {
    let (s, mut node, _health) = session();
    let t = control_in_background(&s, wire::ALLOC, 64, Duration::from_millis(50));
    let (alloc, command, _) = next_control(&mut node);
    assert_eq!(command, wire::ALLOC);
    let err = t.join().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    // The node answers after all: buffer 77 exists there, and nobody holds it.
    reply(&mut node, alloc, Ok(77u64.to_le_bytes().to_vec()));
    // The next control makes the root read again: it frees buffer 77 unasked (before or after
    // sending the new control), and takes only its own reply.
    let t = control_in_background(&s, wire::CHECK_CALLABLE, 0, Duration::from_secs(20));
    let (mut free, mut check) = (None, None);
    for _ in 0..2 {
        match next_control(&mut node) {
            (seq, wire::FREE, 77) => free = Some(seq),
            (seq, wire::CHECK_CALLABLE, _) => check = Some(seq),
            other => panic!("unexpected control {other:?}"),
        }
    }
    let (free, check) = (free.expect("the late buffer is freed"), check.expect("the new control"));
    reply(&mut node, free, Ok(Vec::new())); // dropped: nobody asked for it
    reply(&mut node, check, Ok(vec![1, 2, 3]));
    assert_eq!(t.join().unwrap().unwrap(), Ok(vec![1, 2, 3]));
    assert!(!s.is_lost(), "{:?}", s.lost());
    s.close();
}

#[test]
fn a_late_reply_to_a_copy_is_dropped_and_does_not_answer_the_next_control() {
    let (s, mut node, _health) = session();
    let t = control_in_background(&s, wire::COPY_FROM, 5, Duration::from_millis(50));
    let (late, _, _) = next_control(&mut node);
    assert_eq!(t.join().unwrap().unwrap_err().kind(), ErrorKind::Timeout);
    let t = control_in_background(&s, wire::CHECK_CALLABLE, 0, Duration::from_secs(20));
    let (now, _, _) = next_control(&mut node);
    // The late reply first, then the current one: the control gets its own.
    reply(&mut node, late, Ok(vec![9; 16]));
    reply(&mut node, now, Ok(vec![4]));
    assert_eq!(t.join().unwrap().unwrap(), Ok(vec![4]));
    assert!(!s.is_lost());
    s.close();
}

/// Sends a control, lets `misreply` answer it wrongly, and returns the error the control ends
/// with (the session lost, naming what came).
fn lost_by(misreply: impl FnOnce(&mut Stream, u64)) -> Error {
    let (s, mut node, _health) = session();
    let t = control_in_background(&s, wire::CHECK_CALLABLE, 0, Duration::from_secs(20));
    let (seq, _, _) = next_control(&mut node);
    misreply(&mut node, seq);
    let err = t.join().unwrap().unwrap_err();
    assert!(s.is_lost());
    s.close();
    err
}

#[test]
fn a_duplicated_reply_loses_the_session_naming_it() {
    let (s, mut node, _health) = session();
    let t = control_in_background(&s, wire::CHECK_CALLABLE, 0, Duration::from_secs(20));
    let (seq, _, _) = next_control(&mut node);
    reply(&mut node, seq, Ok(Vec::new()));
    reply(&mut node, seq, Ok(Vec::new()));
    assert_eq!(t.join().unwrap().unwrap(), Ok(Vec::new()));
    // The duplicate answers nothing in flight, whenever it is read (at once, or with the next
    // control's reply): the next control ends with the session.
    let t = control_in_background(&s, wire::CHECK_CALLABLE, 0, Duration::from_secs(20));
    let err = t.join().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WorkerDied);
    assert!(err.message().contains("not awaiting a reply (a duplicate, or out of order)"), "{err}");
    s.close();
}

#[test]
fn a_reply_to_a_control_never_sent_loses_the_session() {
    let err = lost_by(|node, seq| reply(node, seq + 5, Ok(Vec::new())));
    assert_eq!(err.kind(), ErrorKind::WorkerDied);
    assert!(err.message().contains("not awaiting a reply"), "{err}");
}

#[test]
fn a_reply_of_another_session_loses_the_session_naming_it() {
    let err = lost_by(|node, seq| reply(node, seq ^ (0x5a5a_5a5a << 32), Ok(Vec::new())));
    assert_eq!(err.kind(), ErrorKind::WorkerDied);
    assert!(err.message().contains("of another session"), "{err}");
}

#[test]
fn every_frame_of_a_session_carries_its_id_and_two_sessions_differ() {
    let (a, mut node_a, _ha) = session();
    let (b, mut node_b, _hb) = session();
    let ta = control_in_background(&a, wire::CHECK_CALLABLE, 0, Duration::from_millis(10));
    let tb = control_in_background(&b, wire::CHECK_CALLABLE, 0, Duration::from_millis(10));
    let (sa, _, _) = next_control(&mut node_a);
    let (sb, _, _) = next_control(&mut node_b);
    let _ = (ta.join(), tb.join());
    assert_eq!(sa >> 32, a.id);
    assert_eq!(sb >> 32, b.id);
    assert_ne!(a.id, b.id, "two sessions drew the same id (1 in 2^32)");
    a.close();
    b.close();
}

/// Marks task `seq` in flight on `s`, as `RemoteEndpoint::start` does, for the reader thread.
fn task_in_flight(s: &Session, seq: u64) {
    {
        let mut st = sync::lock(&s.state);
        st.awaiting = true;
        st.completion = None;
        st.task_seq = seq;
    }
    s.hand_to_reader();
}

fn completion(node: &mut Stream, seq: u64) {
    write_frame(node, FrameKind::Completion, seq, &wire::encode_completion(wire::DONE, "", &[])).unwrap();
}

/// Waits until the session has the outcome of its task, or is lost.
fn settled(s: &Session) {
    let until = Instant::now() + Duration::from_secs(20);
    while sync::lock(&s.state).completion.is_none() && !s.is_lost() {
        assert!(Instant::now() < until, "neither an outcome nor a loss");
        s.rx_bell.ring();
        std::thread::yield_now();
    }
}

#[test]
fn a_completion_must_answer_the_task_in_flight() {
    // The right one is taken.
    let (s, mut node, _health) = session();
    let seq = s.next_seq();
    task_in_flight(&s, seq);
    completion(&mut node, seq);
    settled(&s);
    assert!(matches!(sync::lock(&s.state).completion.take(), Some(Outcome::Success)));
    // A second one for the same task (a duplicate) answers nothing.
    let next = s.next_seq();
    task_in_flight(&s, next);
    completion(&mut node, seq);
    settled(&s);
    let why = s.lost().expect("lost");
    assert!(
        why.contains(&format!(
            "COMPLETION for task {} while task {} is in flight",
            seq & SEQ_COUNT,
            next & SEQ_COUNT
        )),
        "{why}"
    );
    s.close();
    // One with no task in flight at all.
    let (s, mut node, _health) = session();
    let seq = s.next_seq();
    sync::lock(&s.state).task_seq = seq;
    s.reader_wanted.fetch_or(READ_TASK, Ordering::AcqRel);
    s.rx_bell.ring();
    completion(&mut node, seq);
    settled(&s);
    assert!(s.lost().expect("lost").contains("no task is in flight"));
    s.close();
}

#[test]
fn a_cancelled_task_the_node_never_ends_loses_the_session_within_the_grace() {
    let (s, node, mut health) = session_with(Duration::from_secs(1));
    let seq = s.next_seq();
    task_in_flight(&s, seq);
    let mut ep = RemoteEndpoint::new(s.clone(), 0, Default::default());
    let asked = Instant::now();
    assert!(ep.stop(), "the endpoint asks the node");
    // The node hears the CANCEL for that task on its health connection...
    health.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let cancel = read_frame(&mut health, 0).unwrap();
    assert_eq!((cancel.kind, cancel.seq), (FrameKind::Cancel, seq));
    // ... keeps beating, and never answers the task.
    while !s.is_lost() {
        assert!(asked.elapsed() < Duration::from_secs(10), "the session outlived its cancel grace");
        write_frame(&mut health, FrameKind::Health, 0, &[]).unwrap();
        let _ = read_frame(&mut health, 0); // the root's answer
    }
    assert!(asked.elapsed() >= Duration::from_secs(1), "lost before the grace: {:?}", asked.elapsed());
    let why = s.lost().unwrap();
    assert!(why.contains("did not end its cancelled task within 1s"), "{why}");
    node.shutdown();
    s.close();
}

#[test]
fn sequence_numbers_wrap_within_their_count_and_keep_the_sessions_id() {
    let (s, _node, _health) = session();
    s.seq.store(SEQ_COUNT, Ordering::Relaxed);
    let (last, next, after) = (s.next_seq(), s.next_seq(), s.next_seq());
    assert_eq!((last >> 32, next >> 32, after >> 32), (s.id, s.id, s.id));
    assert_eq!((last & SEQ_COUNT, next & SEQ_COUNT, after & SEQ_COUNT), (SEQ_COUNT, 1, 1));
    s.close();
}
