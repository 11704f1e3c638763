//! Remote L3 Workers: an L4 Worker drives L3 Workers on other hosts (or other processes of
//! this one) over an authenticated session (`net`), behind the same engine [`Endpoint`] as a
//! mailbox lane.
//!
//! * The root side ([`RemoteWorker`], added with `WorkerBuilder::remote_worker`): at `init` the L4
//!   connects to each node, runs the challenge–response handshake on the cluster key over two
//!   connections (the session's and its health connection, paired by a token: `lane`), and
//!   only then gives it a lane. The driver waiting on a remote task (the engine's role holder)
//!   checks the socket while it keeps checking, and reads a small COMPLETION that sits whole
//!   there itself, without blocking and with no thread hop; anything else (a large COMPLETION,
//!   a control's reply, a COMPLETION due after the driver went to sleep) is read by the
//!   session's reader thread, which takes a COMPLETION's outputs straight from the socket into
//!   the root's memory, records the outcome and rings the engine's doorbell (as a mailbox
//!   completion does), and otherwise sleeps without reading. A health
//!   thread reads the node's heartbeats on the health connection. A node silent there past its
//!   health deadline, a closed connection, or a malformed frame fails the task and takes the
//!   lane out of service, naming the node's address and what was seen.
//! * The node side ([`Node`](node::Node)): a program in the node role builds its L3 Worker and
//!   the orchestration functions the root may send (the same program runs on every host, so
//!   the same registrations run there), binds its address, and serves one session: each TASK
//!   runs one orchestration function as a run of its L3 Worker, over buffers of its own filled
//!   with the tensors' bytes; the written bytes travel back with the COMPLETION.
//!
//! # The root's session
//!
//! A [`Session`] has a writer thread fed by a queue, so neither the scheduler nor a control
//! caller blocks on the socket: small frames are written directly by their sender when nothing
//! is queued, a TASK with a large bulk goes to the writer thread, which sends it from the root's
//! mappings. The socket is read by whoever holds its reading end, one whole frame at a time:
//! the driver waiting on the task (a *watched* endpoint, `engine::endpoint`: while it keeps
//! checking it also checks the socket, and its pass takes a small COMPLETION that sits whole
//! there, `Stream::waiting_frame`, in one read, without blocking or waking any thread), or else
//! the reader thread. [`RemoteEndpoint`] is the engine's `Endpoint`: `start` encodes and sends a
//! TASK, `poll` takes the outcome, reading it itself when it is whole, `ready` / `unwatched` for
//! the driver that checks it, `stop` asks the node to cancel the task (a CANCEL on the health
//! connection; the COMPLETION that follows ends it, and the session stays in service).
//!
//! # Sequence numbers: every reply in its place
//!
//! Each frame the root sends has a sequence number whose high 32 bits are the session's id (a
//! random nonzero number drawn when the session opens) and whose low 32 bits count; the node
//! echoes the number of the TASK or CONTROL it answers. So a reply is matched to what it
//! answers, and one of another session (a node that mixed up its connections) is told apart.
//! A COMPLETION must answer the TASK in flight, a CONTROL_REPLY the control in flight or one
//! that timed out; anything else (a duplicate, a reply to nothing sent, another session's)
//! breaks the protocol and loses the session, naming what came.
//!
//! Controls go one at a time; one that gives up (its timeout is the startup timeout; a node
//! answers controls between tasks) is *abandoned*: it still takes effect on the node, in order
//! (a COPY_TO lands, a FREE frees), and its late reply is dropped, except an ALLOC's: the
//! buffer it made is freed at once (a FREE the root sends unasked, whose own reply is dropped),
//! so nothing leaks on the node. At most [`MAX_ABANDONED`] controls may await their late
//! replies; past that the session is lost (a node that answers none is as good as gone). A
//! health timeout under two heartbeats (400 ms) is refused by
//! `WorkerBuilder::remote_worker`.
//!
//! # Latency
//!
//! An empty remote task costs a bare TCP round trip (53-64 us between two threads on different
//! vCPUs of a 2-vCPU guest when the receiver sleeps in `read`, 8 us when it is checking) plus
//! two runs of the engine; hence the polite checking, and the driver reading the COMPLETION
//! itself (no reader thread to wake, no doorbell hop). On the node, the session thread runs
//! each task's run as one it waits for (`Worker::run_for_parent`, whose hook hands the heartbeat
//! thread the handle to cancel), so it drives the run itself and the node's background
//! scheduler thread is never woken (`a_session_drives_its_tasks_runs_itself`).

pub(crate) mod lane;
pub(crate) mod launch;
pub(crate) mod node;
pub(crate) mod peer;
pub(crate) mod wire;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::callable::identity::{CallableHandle, Digest};
use crate::data::buffer::BufferDesc;
use crate::data::tensor::TensorView;
use crate::engine::endpoint::{Dispatch, Endpoint, Outcome};
use crate::error::{Error, ErrorKind, Result};
use crate::ipc::child::HostResolver;
use crate::net::auth::{ClusterKey, NodeHello, client_handshake};
use crate::net::frame::{
    DEFAULT_MAX_BODY, FrameError, FrameKind, read_body, read_frame, read_frame_head, write_frame,
    write_frame_start,
};
use crate::net::transport::{NodeAddr, Stream, Waiting};
use crate::sys::futex::Doorbell;
use crate::sys::sync;
use crate::worker::remote::peer::PeerBook;
use crate::worker::remote::wire::TensorData;
use std::io::Write as _;

/// Bodies up to this size are written by the sender itself (no hop to the writer thread).
const DIRECT_SEND: usize = 16 << 10;

/// Frames (header included) up to this size are read by a driver that finds them whole in the
/// socket; larger ones, by the reader thread.
const ENGINE_READS: usize = 64 << 10;

/// Most timed-out controls a session waits on for late replies before it is lost.
pub(crate) const MAX_ABANDONED: usize = 64;

/// The low 32 bits of a sequence number count; the high 32 are the session's id.
const SEQ_COUNT: u64 = 0xffff_ffff;

/// `Session::reader_wanted`: the reader thread reads the COMPLETION due...
const READ_TASK: u32 = 1;
/// ... or the reply to the control in flight.
const READ_CONTROL: u32 = 2;

/// A remote L3 Worker for an L4 Worker to drive: where the node listens and the cluster's key
/// ([`WorkerBuilder::remote_worker`](crate::WorkerBuilder::remote_worker)).
///
/// ```
/// use std::time::Duration;
/// use simpler::{remote::ClusterKey, remote::NodeAddr, remote::RemoteWorker};
///
/// let key = ClusterKey::new("a secret of at least sixteen bytes")?;
/// let node = RemoteWorker::new(NodeAddr::parse("127.0.0.1:7301")?, key)
///     .connect_timeout(Duration::from_secs(5))
///     .health_timeout(Duration::from_secs(2));
/// assert_eq!(node.addr().to_string(), "127.0.0.1:7301");
/// # Ok::<(), simpler::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct RemoteWorker {
    pub(crate) addr: NodeAddr,
    pub(crate) key: ClusterKey,
    pub(crate) connect_timeout: Duration,
    pub(crate) health_timeout: Duration,
    /// Set for a node a launcher started: its rank. The node connects to the root, which
    /// listens at `addr`, instead of the root connecting to it.
    pub(crate) launch_rank: Option<u32>,
    /// The least SUB workers and chips the node must have (`requires`).
    pub(crate) needs: (u32, u32),
}

impl RemoteWorker {
    /// The node at `addr`, which must know `key`. Defaults: 10 s to connect and authenticate,
    /// 2 s of silence before the node counts as lost.
    ///
    /// ```
    /// let key = simpler::remote::ClusterKey::new([7u8; 32])?;
    /// let node = simpler::remote::RemoteWorker::new(simpler::remote::NodeAddr::loopback(7302), key);
    /// # drop(node);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn new(addr: NodeAddr, key: ClusterKey) -> RemoteWorker {
        RemoteWorker {
            addr,
            key,
            connect_timeout: Duration::from_secs(10),
            health_timeout: Duration::from_secs(2),
            launch_rank: None,
            needs: (0, 0),
        }
    }

    /// The size this root asks of the node: `sub_workers` SUB workers and `chips` chips under
    /// its L3 Worker (default 0 and 0: whatever the node gives a session). A node announces the
    /// most a session may have when it authenticates; asking for more is refused at `init` (or
    /// when the node rejoins) with [`ErrorKind::InvalidArgument`] naming the node, what it
    /// offers and what was asked, before any task is sent. Then the root says its size (the
    /// SIZE control): a sized node ([`Node::sized`](crate::remote::Node::sized)) starts an L3
    /// Worker of just that size for this root's session alone, or refuses with
    /// [`ErrorKind::ResourceExhausted`] when its other sessions hold too much of its limits; a
    /// node with one Worker ([`Node::new`](crate::remote::Node::new)) lends that one, which has
    /// at least that. A root cannot make a node bigger than its limits.
    ///
    /// ```
    /// # let key = simpler::remote::ClusterKey::new([7u8; 32])?;
    /// let node = simpler::remote::RemoteWorker::new(simpler::remote::NodeAddr::loopback(7306), key)
    ///     .requires(4, 1); // 4 SUB workers and a chip
    /// # drop(node);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn requires(mut self, sub_workers: u32, chips: u32) -> RemoteWorker {
        self.needs = (sub_workers, chips);
        self
    }

    /// How long `init` waits to connect to the node and authenticate (default 10 s).
    ///
    /// ```
    /// # let key = simpler::remote::ClusterKey::new([7u8; 32])?;
    /// let node = simpler::remote::RemoteWorker::new(simpler::remote::NodeAddr::loopback(7303), key)
    ///     .connect_timeout(std::time::Duration::from_secs(30));
    /// # drop(node);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn connect_timeout(mut self, t: Duration) -> RemoteWorker {
        self.connect_timeout = t;
        self
    }

    /// How long the node may stay silent on its health connection before its session is lost:
    /// its task fails naming the node, and its lane leaves service (default 2 s; the node
    /// sends a heartbeat every 200 ms on a connection of its own, so a long task or a large
    /// transfer on the session connection never counts as silence). At least twice the
    /// heartbeat, 400 ms: [`WorkerBuilder::remote_worker`](crate::WorkerBuilder::remote_worker)
    /// refuses less.
    ///
    /// ```
    /// # let key = simpler::remote::ClusterKey::new([7u8; 32])?;
    /// let node = simpler::remote::RemoteWorker::new(simpler::remote::NodeAddr::loopback(7304), key)
    ///     .health_timeout(std::time::Duration::from_millis(500));
    /// # drop(node);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn health_timeout(mut self, t: Duration) -> RemoteWorker {
        self.health_timeout = t;
        self
    }

    /// Where the node listens.
    ///
    /// ```
    /// # let key = simpler::remote::ClusterKey::new([7u8; 32])?;
    /// let node = simpler::remote::RemoteWorker::new(simpler::remote::NodeAddr::loopback(7305), key);
    /// assert!(node.addr().is_loopback());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn addr(&self) -> &NodeAddr {
        &self.addr
    }
}

/// How long `close` lets the writer thread send what is queued (and the SHUTDOWN) before it
/// shuts the socket under it.
const CLOSE_WRITE_GRACE: Duration = Duration::from_millis(300);

/// What the writer thread sends next.
enum Outgoing {
    Frame(FrameKind, u64, Vec<u8>),
    /// A TASK with tensor data: its head, then the bytes of each (descriptor, offset, length)
    /// of the root's memory, sent straight from the root's mappings.
    Bulk {
        seq: u64,
        head: Vec<u8>,
        segments: Vec<(BufferDesc, u64, u64)>,
    },
    Stop,
}

/// What a session's reader thread reports.
#[derive(Default)]
struct SessionState {
    /// The outcome of the task in flight, once its COMPLETION arrived.
    completion: Option<Outcome>,
    /// The reply to the control in flight: (sequence, result).
    reply: Option<(u64, std::result::Result<Vec<u8>, String>)>,
    /// Why the session is over (set once).
    lost: Option<String>,
    /// A TASK was sent and its COMPLETION has not been read.
    awaiting: bool,
    /// The sequence number of the last TASK sent (what a CANCEL names).
    task_seq: u64,
    /// When a cancelled task must have ended: past it, with its COMPLETION still due, the
    /// session is lost (the health thread checks at each heartbeat), so a stopped run ends.
    cancel_by: Option<Instant>,
    /// The sequence number of the control in flight (controls go one at a time).
    control_seq: Option<u64>,
    /// Controls that gave up waiting (timed out), by sequence number, with their command: their
    /// late replies are dropped when read (an ALLOC's buffer freed first).
    abandoned: std::collections::HashMap<u64, u32>,
}

/// One authenticated session with a node, shared by its endpoint, its reader thread and the
/// Worker's control requests.
///
/// Who reads the socket: whoever holds `rx`, for one whole frame at a time. The reader thread
/// reads only while `reader_wanted` asks it to: the endpoint asks when a COMPLETION is due and
/// its driver stops checking (`unwatched`) or finds a frame it must not read itself (large, or
/// not whole yet), and `control` asks for its reply. Otherwise the driver, checking in `poll`,
/// takes small frames that sit whole in the socket (`waiting_frame`), so the common COMPLETION
/// wakes no thread. While idle nobody reads: the health connection tells a lost node.
pub(crate) struct Session {
    /// "remote worker N (ADDR)", for messages.
    label: String,
    /// Frames to send, in order, to the writer thread (so neither the scheduler nor a control
    /// caller ever blocks on the socket).
    outbox: crossbeam_channel::Sender<Outgoing>,
    /// The socket's writing end, shared by the writer thread and small direct sends.
    direct: Mutex<Stream>,
    /// Frames queued for the writer thread and not written yet: a small frame is written
    /// directly (no thread hop) only when none is, so frames of one sender keep their order.
    pending: std::sync::atomic::AtomicUsize,
    /// A handle on the socket, used only to shut it down.
    socket: Stream,
    /// The node's process id on its host (from its HELLO).
    node_pid: u32,
    /// The writer thread, joined by `close`.
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Disconnected when the writer thread ends (its sender drops with it): `close` waits on
    /// it for at most [`CLOSE_WRITE_GRACE`].
    writer_done: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    state: Mutex<SessionState>,
    changed: Condvar,
    seq: AtomicU64,
    /// The root's memory, where task inputs are read from and outputs written to.
    resolver: Mutex<HostResolver>,
    /// The tensors of the task in flight that come back written: (index, descriptor, view).
    outputs: Mutex<Vec<(usize, BufferDesc, TensorView)>>,
    /// Rung when something arrives (the engine's doorbell).
    bell: Arc<dyn AsRef<Doorbell> + Send + Sync>,
    /// One control at a time (the state holds one reply): held from send to reply.
    control_lock: Mutex<()>,
    /// The reader thread, joined by `close`.
    reader: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The socket's reading end: whoever reads a frame holds it for the whole frame.
    rx: Mutex<Stream>,
    /// What the reader thread reads for ([`READ_TASK`], [`READ_CONTROL`]); while none, it
    /// sleeps on `rx_bell` and a driver that keeps checking reads whole small frames itself.
    reader_wanted: std::sync::atomic::AtomicU32,
    /// Rung when `reader_wanted` changes or the session is lost.
    rx_bell: Doorbell,
    /// The session's id: the high 32 bits of each sequence number it sends.
    id: u64,
    /// How long a cancelled task may take to end on the node (the health timeout).
    cancel_grace: Duration,
    /// A handle on the health connection, used only to shut it down.
    health_socket: Stream,
    /// The health connection's writing end: its writes (the answers to heartbeats, a CANCEL)
    /// hold the lock, so frames never interleave.
    health_tx: Mutex<Stream>,
    /// The health thread (reads the node's heartbeats), joined by `close`.
    health_reader: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Session {
    /// Connects to `spec`'s node and authenticates its session and health connections
    /// (`lane`); starts the session's threads.
    pub(crate) fn connect(
        spec: &RemoteWorker,
        label: String,
        resolver: HostResolver,
        bell: Arc<dyn AsRef<Doorbell> + Send + Sync>,
    ) -> Result<Arc<Session>> {
        let peer = spec.addr.to_string();
        let open = |what: &str| -> Result<(Stream, NodeHello)> {
            let mut stream = Stream::connect(&spec.addr, spec.connect_timeout).map_err(|e| {
                Error::new(ErrorKind::WorkerDied, format!("{label}: cannot connect {what}: {e}"))
            })?;
            // The label names the node's address: the handshake's messages do not repeat it.
            let hello = client_handshake(&mut stream, &spec.key, "").map_err(|e| e.context(label.clone()))?;
            Ok((stream, hello))
        };
        let token = lane::token()?;
        let (mut stream, hello) = open("the session")?;
        lane::announce(&mut stream, &token, &peer)?;
        let (mut health, _) = open("the health connection")?;
        lane::announce(&mut health, &token, &peer)?;
        Session::open(stream, health, &hello, spec, label, resolver, bell)
    }

    /// Starts the session over `stream` and `health` (its session and health connections,
    /// authenticated and paired already; `hello` is the node's).
    pub(crate) fn open(
        stream: Stream,
        health: Stream,
        hello: &NodeHello,
        spec: &RemoteWorker,
        label: String,
        resolver: HostResolver,
        bell: Arc<dyn AsRef<Doorbell> + Send + Sync>,
    ) -> Result<Arc<Session>> {
        tracing::info!(target: "simpler::remote", node = %label, node_id = hello.node_id, sub_workers = hello.sub_workers, chips = hello.chips, "session ready");
        let (sub, chips) = spec.needs;
        if hello.sub_workers < sub || hello.chips < chips {
            for s in [&stream, &health] {
                s.shutdown();
            }
            return Err(Error::invalid(format!(
                "{label}: the node gives a session at most {} SUB workers and {} chips; this root requires {sub} and {chips} (RemoteWorker::requires)",
                hello.sub_workers, hello.chips
            )));
        }
        let reader = stream.try_clone().map_err(|e| Error::os("cloning a session socket", e))?;
        health
            .set_read_timeout(Some(spec.health_timeout))
            .map_err(|e| Error::os("setting a session timeout", e))?;
        let health_socket = health.try_clone().map_err(|e| Error::os("cloning a session socket", e))?;
        let health_tx = health.try_clone().map_err(|e| Error::os("cloning a session socket", e))?;
        let socket = stream.try_clone().map_err(|e| Error::os("cloning a session socket", e))?;
        let (outbox, outgoing) = crossbeam_channel::unbounded();
        let direct = Mutex::new(stream);
        // The session's id, in the high half of every sequence number it sends (nonzero).
        let id = u64::from(u32::from_le_bytes(crate::sys::random::bytes::<4>("a session id")?).max(1));
        let session = Arc::new(Session {
            label,
            node_pid: hello.pid,
            outbox,
            direct,
            pending: std::sync::atomic::AtomicUsize::new(0),
            socket,
            writer: Mutex::new(None),
            writer_done: Mutex::new(None),
            state: Mutex::new(SessionState::default()),
            changed: Condvar::new(),
            seq: AtomicU64::new(1),
            id,
            cancel_grace: spec.health_timeout.max(Duration::from_secs(1)),
            resolver: Mutex::new(resolver),
            outputs: Mutex::new(Vec::new()),
            bell,
            control_lock: Mutex::new(()),
            reader: Mutex::new(None),
            rx: Mutex::new(reader),
            reader_wanted: std::sync::atomic::AtomicU32::new(0),
            rx_bell: Doorbell::new(),
            health_socket,
            health_tx: Mutex::new(health_tx),
            health_reader: Mutex::new(None),
        });
        let s = session.clone();
        let thread = std::thread::Builder::new()
            .name("simpler-remote".into())
            .spawn(move || s.read_loop())
            .map_err(|e| Error::os("starting a session reader thread", e))?;
        *sync::lock(&session.reader) = Some(thread);
        let s = session.clone();
        let timeout = spec.health_timeout;
        let thread = std::thread::Builder::new()
            .name("simpler-health".into())
            .spawn(move || s.health_loop(health, timeout))
            .map_err(|e| Error::os("starting a session health thread", e))?;
        *sync::lock(&session.health_reader) = Some(thread);
        let s = session.clone();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        *sync::lock(&session.writer_done) = Some(done_rx);
        let thread = std::thread::Builder::new()
            .name("simpler-remote-tx".into())
            .spawn(move || {
                let _done = done_tx; // dropped when this thread ends
                for out in outgoing {
                    let written = match out {
                        Outgoing::Frame(kind, seq, body) => {
                            write_frame(&mut *sync::lock(&s.direct), kind, seq, &body)
                        }
                        Outgoing::Bulk { seq, head, segments } => s.write_bulk(seq, &head, &segments),
                        Outgoing::Stop => return,
                    };
                    s.pending.fetch_sub(1, Ordering::AcqRel);
                    if let Err(e) = written {
                        return s.lose(format!("the connection failed while sending: {e}"));
                    }
                }
            })
            .map_err(|e| Error::os("starting a session writer thread", e))?;
        *sync::lock(&session.writer) = Some(thread);
        Ok(session)
    }

    /// Sends a frame: a small one directly when nothing is queued and the socket is free (a
    /// small write does not block: it fits the socket's buffer), any other through the writer
    /// thread; returns its sequence number.
    fn send(&self, kind: FrameKind, body: Vec<u8>) -> Result<u64> {
        self.send_as(kind, self.next_seq(), body)
    }

    /// The sequence number of the next frame sent (this session's id in its high half).
    fn next_seq(&self) -> u64 {
        // The count wraps within the low half (skipping 0), never into the session's id.
        let n = self.seq.fetch_add(1, Ordering::Relaxed) & SEQ_COUNT;
        (self.id << 32) | n.max(1)
    }

    /// [`send`](Self::send) under a sequence number drawn already (so what its reply is matched
    /// against is recorded before the frame goes).
    fn send_as(&self, kind: FrameKind, seq: u64, body: Vec<u8>) -> Result<u64> {
        if body.len() <= DIRECT_SEND
            && let Ok(mut stream) = self.direct.try_lock()
            && self.pending.load(Ordering::Acquire) == 0
        {
            if let Err(e) = write_frame(&mut *stream, kind, seq, &body) {
                drop(stream);
                self.lose(format!("the connection failed while sending: {e}"));
                return Err(Error::new(
                    ErrorKind::WorkerDied,
                    format!("{}: {}", self.label, self.lost().unwrap_or_default()),
                ));
            }
            return Ok(seq);
        }
        self.pending.fetch_add(1, Ordering::AcqRel);
        self.outbox.send(Outgoing::Frame(kind, seq, body)).map_err(|_| {
            Error::new(ErrorKind::WorkerDied, format!("{}: {}", self.label, self.lost().unwrap_or_default()))
        })?;
        Ok(seq)
    }

    /// Queues a TASK whose tensor bytes go straight from the root's memory to the socket (on
    /// the writer thread); returns its sequence number.
    fn send_bulk(&self, seq: u64, head: Vec<u8>, segments: Vec<(BufferDesc, u64, u64)>) -> Result<u64> {
        self.pending.fetch_add(1, Ordering::AcqRel);
        self.outbox.send(Outgoing::Bulk { seq, head, segments }).map_err(|_| {
            Error::new(ErrorKind::WorkerDied, format!("{}: {}", self.label, self.lost().unwrap_or_default()))
        })?;
        Ok(seq)
    }

    /// Writes a TASK frame: its head, then each segment of the root's memory as it is (no
    /// copy). The resolver stays locked while a segment is written, so its mapping stays.
    fn write_bulk(&self, seq: u64, head: &[u8], segments: &[(BufferDesc, u64, u64)]) -> std::io::Result<()> {
        let bulk: u64 = segments.iter().map(|(_, _, len)| *len).sum();
        let body_len = usize::try_from(head.len() as u64 + bulk).unwrap_or(usize::MAX);
        let mut stream = sync::lock(&self.direct);
        write_frame_start(&mut *stream, FrameKind::Task, seq, body_len, head)?;
        for (desc, start, len) in segments {
            let mut resolver = sync::lock(&self.resolver);
            let bytes = resolver.bytes(desc, *start, *len).map_err(std::io::Error::other)?;
            stream.write_all(bytes)?;
        }
        Ok(())
    }

    /// Marks the session lost (the first reason stays) and wakes everyone.
    fn lose(&self, why: String) {
        {
            let mut st = sync::lock(&self.state);
            if st.lost.is_none() {
                tracing::warn!(target: "simpler::remote", node = %self.label, "{why}");
                st.lost = Some(why);
            }
        }
        self.changed.notify_all();
        AsRef::<Doorbell>::as_ref(&*self.bell).ring();
        self.rx_bell.ring();
        self.socket.shutdown();
        self.health_socket.shutdown();
    }

    fn lost(&self) -> Option<String> {
        sync::lock(&self.state).lost.clone()
    }

    /// Once the session is lost, waits until no task output is being written into the root's
    /// memory: outputs are written under the resolver's lock, and only while the session is
    /// not lost, so none is being written, or will be, once this returns.
    fn wait_for_output_writes(&self) {
        drop(sync::lock(&self.resolver));
    }

    /// Asks the node to cancel the task in flight (a CANCEL on the health connection, which the
    /// node reads while it runs the task); its COMPLETION then says how it ended. False when
    /// the CANCEL could not be written (the session is lost then).
    fn cancel_task(&self) -> bool {
        let seq = {
            let mut st = sync::lock(&self.state);
            if st.lost.is_some() {
                return false;
            }
            st.cancel_by = Some(Instant::now() + self.cancel_grace);
            st.task_seq
        };
        match write_frame(&mut *sync::lock(&self.health_tx), FrameKind::Cancel, seq, &[]) {
            Ok(()) => true,
            Err(e) => {
                self.lose(format!("asking the node to cancel its task failed: {e}"));
                false
            }
        }
    }

    /// Whether the session is over.
    pub(crate) fn is_lost(&self) -> bool {
        sync::lock(&self.state).lost.is_some()
    }

    /// Reads the node's heartbeats on the health connection, and answers each (so the node
    /// knows its root lives: `node::ROOT_SILENCE`); silence past `timeout`, a closed
    /// connection or anything but a heartbeat loses the session.
    fn health_loop(&self, mut health: Stream, timeout: Duration) {
        loop {
            // Heartbeats are empty; a SHUTDOWN may say why (a few hundred bytes).
            match read_frame(&mut health, 4096) {
                Ok(f) if f.kind == FrameKind::Health => {
                    if let Err(e) = write_frame(&mut *sync::lock(&self.health_tx), FrameKind::Health, 0, &[])
                    {
                        return self.lose(format!("answering the node's heartbeat failed: {e}"));
                    }
                    let overdue = {
                        let st = sync::lock(&self.state);
                        st.awaiting && st.cancel_by.is_some_and(|by| Instant::now() >= by)
                    };
                    if overdue {
                        return self.lose(format!(
                            "the node did not end its cancelled task within {:?} (its orchestration function may not return)",
                            self.cancel_grace
                        ));
                    }
                }
                Ok(f) if f.kind == FrameKind::Shutdown => return self.lose(ended_by_node(&f.body)),
                Ok(f) => {
                    return self.lose(format!("the node sent a {:?} frame on its health connection", f.kind));
                }
                Err(e) => return self.lose(why_lost(e, timeout, "health connection")),
            }
        }
    }

    /// The reader thread: reads the socket while asked to (`reader_wanted`), and sleeps on
    /// `rx_bell` otherwise.
    fn read_loop(&self) {
        loop {
            let seen = self.rx_bell.seq();
            if self.lost().is_some() {
                return;
            }
            if self.reader_wanted.load(Ordering::Acquire) == 0 {
                self.rx_bell.sleep(seen, None);
                continue;
            }
            let mut rx = sync::lock(&self.rx);
            if self.reader_wanted.load(Ordering::Acquire) == 0 {
                continue; // a driver read what this thread was woken for
            }
            if let Err(why) = self.read_one(&mut *rx) {
                drop(rx);
                return self.lose(why);
            }
        }
    }

    /// Reads and handles one frame from the node; `Err` says why the session is lost.
    fn read_one(&self, reader: &mut impl std::io::Read) -> std::result::Result<(), String> {
        let why = |e: FrameError| why_lost(e, Duration::ZERO, "connection");
        let head = read_frame_head(reader, DEFAULT_MAX_BODY).map_err(why)?;
        if matches!(head.kind, FrameKind::Completion | FrameKind::ControlReply) && head.seq >> 32 != self.id {
            return Err(format!(
                "the node sent a {:?} of another session (sequence number {:#x}; this session's are {:#x}_xxxxxxxx)",
                head.kind, head.seq, self.id
            ));
        }
        if head.kind == FrameKind::Completion {
            {
                let st = sync::lock(&self.state);
                if !st.awaiting || head.seq != st.task_seq {
                    let due = if st.awaiting {
                        format!("task {} is in flight", st.task_seq & SEQ_COUNT)
                    } else {
                        "no task is in flight".to_string()
                    };
                    return Err(format!(
                        "the node sent a COMPLETION for task {} while {due} (a duplicate, or out of order)",
                        head.seq & SEQ_COUNT
                    ));
                }
            }
            let outcome = match self.complete(reader, head.len) {
                Ok(Ok(o)) => o,
                Ok(Err(e)) => return Err(format!("the node sent a bad COMPLETION: {e}")),
                Err(e) => return Err(why(e)),
            };
            {
                let mut st = sync::lock(&self.state);
                st.completion = Some(outcome);
                st.awaiting = false;
                self.reader_wanted.fetch_and(!READ_TASK, Ordering::AcqRel);
            }
            AsRef::<Doorbell>::as_ref(&*self.bell).ring();
            return Ok(());
        }
        let body = read_body(reader, head).map_err(why)?;
        match head.kind {
            FrameKind::Health => Ok(()),
            FrameKind::ControlReply => match wire::decode_reply(&body) {
                Ok(r) => {
                    let mut st = sync::lock(&self.state);
                    if st.control_seq == Some(head.seq) {
                        st.control_seq = None;
                        st.reply = Some((head.seq, r));
                        drop(st);
                        self.reader_wanted.fetch_and(!READ_CONTROL, Ordering::AcqRel);
                        self.changed.notify_all();
                        return Ok(());
                    }
                    let Some(command) = st.abandoned.remove(&head.seq) else {
                        return Err(format!(
                            "the node replied to control {}, which is not awaiting a reply (a duplicate, or out of order)",
                            head.seq & SEQ_COUNT
                        ));
                    };
                    drop(st);
                    self.reconcile(command, head.seq, r)
                }
                Err(e) => Err(format!("the node sent a bad CONTROL_REPLY: {e}")),
            },
            FrameKind::Shutdown => Err(ended_by_node(&body)),
            other => Err(format!("the node sent an unexpected {other:?} frame")),
        }
    }

    /// Handles the late reply to control `seq` (`command`), which gave up waiting: an ALLOC
    /// that succeeded made a buffer nobody holds, so it is freed now (a FREE whose own reply is
    /// dropped in turn); any other late reply is dropped (its effect on the node is what the
    /// root asked for). `Err` says why the session is lost.
    fn reconcile(
        &self,
        command: u32,
        seq: u64,
        reply: std::result::Result<Vec<u8>, String>,
    ) -> std::result::Result<(), String> {
        tracing::debug!(target: "simpler::remote", node = %self.label, command, seq = seq & SEQ_COUNT, "the late reply to a control that timed out");
        let Ok(bytes) = reply else { return Ok(()) };
        if command != wire::ALLOC {
            return Ok(());
        }
        let id = <[u8; 8]>::try_from(bytes.as_slice())
            .map(u64::from_le_bytes)
            .map_err(|_| "the node answered an allocation with no buffer id".to_string())?;
        tracing::info!(target: "simpler::remote", node = %self.label, buffer = id, "freeing the buffer of an allocation that timed out");
        let free = self.next_seq();
        sync::lock(&self.state).abandoned.insert(free, wire::FREE);
        let body = wire::encode_control(wire::FREE, &Digest::from_bytes([0; 32]), "", id, 0, &[]);
        self.send_as(FrameKind::Control, free, body).map(|_| ()).map_err(|e| e.message().to_string())
    }

    /// Asks the reader thread to read the COMPLETION due (a driver stops checking for it).
    fn hand_to_reader(&self) {
        {
            let st = sync::lock(&self.state);
            if st.awaiting && st.completion.is_none() && st.lost.is_none() {
                self.reader_wanted.fetch_or(READ_TASK, Ordering::AcqRel);
            }
        }
        self.rx_bell.ring();
    }

    /// Reads a COMPLETION whose body is `body_len` bytes: each output's bytes go straight from
    /// the socket into the root's memory (through a scratch buffer only for a strided view,
    /// whose gaps may belong to other tasks). Returns the task's outcome; an inner `Err` is a
    /// COMPLETION that breaks the protocol, an outer one a failed read.
    fn complete(
        &self,
        r: &mut impl std::io::Read,
        body_len: usize,
    ) -> std::result::Result<Result<Outcome>, FrameError> {
        let (head, bulk) = match wire::read_head(r, body_len)? {
            Ok(h) => h,
            Err(e) => return Ok(Err(e)),
        };
        let msg = match wire::decode_completion_head(&head, bulk) {
            Ok(m) => m,
            Err(e) => return Ok(Err(e)),
        };
        let expected = std::mem::take(&mut *sync::lock(&self.outputs));
        if msg.status != wire::DONE {
            crate::net::frame::skip_part(r, bulk)?;
        } else {
            let mut resolver = sync::lock(&self.resolver);
            // A stopped session's task has ended for the engine (`stop`, which takes this lock
            // after losing the session): its outputs may be another task's bytes by now.
            if self.is_lost() {
                return Ok(Err(Error::state(format!("{}: the session was lost", self.label))));
            }
            for &(i, offset, len) in &msg.outputs {
                let Some((_, desc, view)) = expected.iter().find(|(j, _, _)| *j == i) else {
                    return Ok(Err(Error::decode(format!("output {i} is not a written tensor of the task"))));
                };
                let (start, end) = view.byte_range();
                if offset != start || len != end - start {
                    return Ok(Err(Error::decode(format!(
                        "output {i} has {len} bytes at {offset}; its view spans {} at {start}",
                        end - start
                    ))));
                }
                if view.is_contiguous() {
                    let dst = match resolver.bytes(desc, start, len) {
                        Ok(d) => d,
                        Err(m) => return Ok(Err(Error::decode(m))),
                    };
                    crate::net::frame::read_part(r, dst)?;
                } else {
                    // Only the view's elements: bytes between them may belong to other tasks.
                    let Ok(n) = usize::try_from(len) else {
                        return Ok(Err(Error::decode(format!("output {i} of {len} bytes is too large"))));
                    };
                    let mut bytes = vec![0u8; n];
                    crate::net::frame::read_part(r, &mut bytes)?;
                    if let Err(m) = resolver.write_view(desc, view, &bytes) {
                        return Ok(Err(Error::decode(m)));
                    }
                }
            }
        }
        let m = format!("{}: {}", self.label, msg.message);
        Ok(Ok(match msg.status {
            wire::DONE => Outcome::Success,
            wire::WORKER_DIED => Outcome::WorkerDied(m),
            wire::RESOURCE => Outcome::ResourceExhausted(m),
            _ => Outcome::TaskFailure(m),
        }))
    }

    /// Sends a control and waits for its reply (or the session's loss).
    pub(crate) fn control(
        &self,
        command: u32,
        body: &[u8],
        timeout: Duration,
    ) -> Result<std::result::Result<Vec<u8>, String>> {
        let _one_at_a_time = sync::lock(&self.control_lock);
        let seq = self.next_seq();
        {
            let mut st = sync::lock(&self.state);
            st.control_seq = Some(seq);
            st.reply = None;
        }
        self.reader_wanted.fetch_or(READ_CONTROL, Ordering::AcqRel);
        self.rx_bell.ring();
        let _done = ControlDone(self);
        self.send_as(FrameKind::Control, seq, body.to_vec())?;
        let deadline = crate::sys::clock::after(timeout);
        let mut st = sync::lock(&self.state);
        loop {
            if let Some((s, _)) = &st.reply
                && *s == seq
            {
                return Ok(st.reply.take().expect("checked").1);
            }
            if let Some(why) = &st.lost {
                return Err(Error::new(ErrorKind::WorkerDied, format!("{}: {why}", self.label)));
            }
            let now = Instant::now();
            if now >= deadline {
                // Its reply may still come: the reader handles it then (`reconcile`).
                st.control_seq = None;
                st.abandoned.insert(seq, command);
                if st.abandoned.len() > MAX_ABANDONED {
                    drop(st);
                    self.lose(format!("{MAX_ABANDONED} control requests went unanswered"));
                    return Err(Error::new(
                        ErrorKind::WorkerDied,
                        format!("{}: {}", self.label, self.lost().unwrap_or_default()),
                    ));
                }
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "{}: no reply to a control request within {timeout:?} (the node may be busy with a long task)",
                        self.label
                    ),
                ));
            }
            st = sync::wait_timeout(&self.changed, st, deadline - now);
        }
    }

    /// The node's process id on its host, as its HELLO said.
    pub(crate) fn node_pid(&self) -> u32 {
        self.node_pid
    }

    /// Ends the session: tells the node, closes the connection, waits for the reader thread
    /// and drops the mappings of the root's memory the session held.
    pub(crate) fn close(&self) {
        if self.lost().is_none() {
            let _ = self.send(FrameKind::Shutdown, Vec::new());
        }
        let _ = self.outbox.send(Outgoing::Stop);
        // The writer sends what is queued, then the SHUTDOWN; a node that stopped reading would
        // hold it in a write until the socket's send timeout (the health timeout), so after a
        // short grace the session is lost, which shuts the socket and ends the write at once.
        let done = sync::lock(&self.writer_done).take();
        if let Some(done) = done
            && matches!(done.recv_timeout(CLOSE_WRITE_GRACE), Err(std::sync::mpsc::RecvTimeoutError::Timeout))
        {
            self.lose(format!(
                "closing: the node took no more bytes within {CLOSE_WRITE_GRACE:?} (it stopped reading)"
            ));
        }
        let writer = sync::lock(&self.writer).take();
        if let Some(t) = writer
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join(); // the SHUTDOWN went out (or the socket failed)
        }
        self.lose("the session was closed".into());
        for thread in [&self.reader, &self.health_reader] {
            let t = sync::lock(thread).take();
            if let Some(t) = t
                && t.thread().id() != std::thread::current().id()
            {
                let _ = t.join();
            }
        }
        *sync::lock(&self.resolver) = HostResolver::new(Vec::new());
    }
}

/// Clears the reader thread's order to read a control's reply when the control ends.
struct ControlDone<'a>(&'a Session);

impl Drop for ControlDone<'_> {
    fn drop(&mut self) {
        self.0.reader_wanted.fetch_and(!READ_CONTROL, Ordering::AcqRel);
    }
}

/// Why a session is lost when reading its `what` (a connection) failed with `e`; a timeout is
/// silence past `timeout`.
fn why_lost(e: FrameError, timeout: Duration, what: &str) -> String {
    match e {
        FrameError::Closed => format!("the node closed the {what}"),
        FrameError::Io(e)
            if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
        {
            format!("the node stopped answering: nothing heard for {timeout:?}")
        }
        FrameError::Io(e) => format!("the {what} failed: {e}"),
        FrameError::Malformed(m) => format!("the node sent a malformed frame: {m}"),
    }
}

/// Why the session is over when the node ends it (its SHUTDOWN may say why: a node serving
/// as many roots as it takes refuses one more).
fn ended_by_node(body: &[u8]) -> String {
    match body {
        [] => "the node ended the session".into(),
        why => {
            format!("the node ended the session: {}", String::from_utf8_lossy(&why[..why.len().min(1024)]))
        }
    }
}

/// The engine's endpoint for one remote L3 Worker.
pub(crate) struct RemoteEndpoint {
    session: Arc<Session>,
    /// Its NEXT_LEVEL worker id (its node-resident buffers carry it).
    id: u32,
    /// Where other nodes' buffers are read.
    peers: Arc<PeerBook>,
    /// Where a driver looks at a frame before it reads it.
    scratch: Vec<u8>,
}

impl RemoteEndpoint {
    /// The endpoint of remote Worker `id` (its NEXT_LEVEL worker id), reached over `session`;
    /// `peers` tells where other nodes' buffers are read.
    pub(crate) fn new(session: Arc<Session>, id: u32, peers: Arc<PeerBook>) -> RemoteEndpoint {
        RemoteEndpoint { session, id, peers, scratch: Vec::new() }
    }

    /// The outcome of the task in flight, once known.
    fn outcome(&self) -> Option<Outcome> {
        let mut st = sync::lock(&self.session.state);
        if let Some(o) = st.completion.take() {
            return Some(o);
        }
        st.lost.as_ref().map(|why| Outcome::EndpointFailure(why.clone())) // the scheduler names the lane
    }
}

impl Endpoint for RemoteEndpoint {
    fn start(&mut self, d: &Dispatch<'_>) -> Result<()> {
        let s = &self.session;
        if let Some(why) = s.lost() {
            return Err(Error::new(ErrorKind::WorkerDied, format!("{}: {why}", s.label)));
        }
        let mut outputs = Vec::new();
        let mut spans = Vec::with_capacity(d.args.tensors.len());
        let mut segments = Vec::new();
        let mut resolver = sync::lock(&s.resolver);
        for (i, t) in d.args.tensors.iter().enumerate() {
            let desc = t.desc();
            if let crate::data::buffer::Backing::Device { ptr, chip } = desc.backing() {
                if chip == self.id {
                    spans.push(TensorData::Resident); // node-resident here: it stays on the node
                    continue;
                }
                // Another node's: the node reads the bytes the view spans from it directly
                // (only reads: the submit refused a write).
                let Some((addr, grant)) = self.peers.get(chip, ptr) else {
                    return Err(Error::invalid(format!(
                        "{}: tensor {i} lives on worker {chip}, whose node serves no other node (its peer listener did not start; see its log)",
                        d.callable
                    )));
                };
                let (start, end) = t.view().byte_range();
                spans.push(TensorData::Peer(wire::PeerSource {
                    addr,
                    grant,
                    offset: start,
                    len: end - start,
                }));
                continue;
            }
            if wire::writes(d.args.tags[i].access()) {
                outputs.push((i, *desc, *t.view()));
            }
            // The bytes the view spans travel (not the rest of a large buffer); gaps of a
            // strided view go too, so the node's copy matches the root's there.
            let (start, end) = t.view().byte_range();
            resolver
                .bytes(desc, start, end - start)
                .map_err(|m| Error::invalid(format!("{}: tensor {i}: {m}", d.callable)))?;
            spans.push(TensorData::Bulk { offset: start, len: end - start });
            segments.push((*desc, start, end - start));
        }
        let mut head =
            wire::encode_task_head(&d.callable.digest(), d.callable.name(), d.config, d.args, &spans)?;
        let bulk: u64 = segments.iter().map(|(_, _, len)| *len).sum();
        if head.len() as u64 + bulk > DEFAULT_MAX_BODY as u64 {
            return Err(Error::invalid(format!(
                "{}: its tensors take {bulk} bytes, over the {DEFAULT_MAX_BODY}-byte limit of a remote task; keep large data on the node (Worker::alloc_child_tensor on a remote Worker)",
                d.callable
            )));
        }
        let small = head.len() as u64 + bulk <= DIRECT_SEND as u64;
        if small {
            for (desc, start, len) in &segments {
                head.extend_from_slice(resolver.bytes(desc, *start, *len).map_err(Error::invalid)?);
            }
        }
        drop(resolver);
        *sync::lock(&s.outputs) = outputs;
        let seq = s.next_seq();
        {
            let mut st = sync::lock(&s.state);
            st.completion = None;
            st.awaiting = true;
            st.task_seq = seq;
            st.cancel_by = None;
        }
        tracing::trace!(target: "simpler::remote", run_id = d.run, task_index = d.task, node = %s.label, bytes = bulk, "send task");
        if small { s.send_as(FrameKind::Task, seq, head) } else { s.send_bulk(seq, head, segments) }
            .map(|_| ())
    }

    fn poll(&mut self) -> Option<Outcome> {
        if let Some(o) = self.outcome() {
            return Some(o);
        }
        let s = self.session.clone();
        if s.reader_wanted.load(Ordering::Acquire) != 0 {
            return None; // the reader thread reads
        }
        // Nobody else reads: take the frames that sit whole in the socket (no blocking).
        let rx = sync::try_lock(&s.rx)?;
        loop {
            self.scratch.resize(ENGINE_READS, 0);
            match rx.waiting_frame(&mut self.scratch) {
                Waiting::Nothing => break,
                Waiting::Whole(n) => {
                    // Out of the socket in one read, then handled from memory.
                    let frame = &mut self.scratch[..n];
                    let read = std::io::Read::read_exact(&mut &*rx, frame)
                        .map_err(|e| why_lost(FrameError::Io(e), Duration::ZERO, "connection"));
                    if let Err(why) = read.and_then(|()| s.read_one(&mut &frame[..])) {
                        drop(rx);
                        s.lose(why);
                        break;
                    }
                    if sync::lock(&s.state).completion.is_some() {
                        break;
                    }
                }
                Waiting::Other => {
                    drop(rx);
                    s.hand_to_reader();
                    break;
                }
            }
        }
        self.outcome()
    }

    fn watched(&self) -> bool {
        true
    }

    fn ready(&self) -> bool {
        let s = &self.session;
        s.reader_wanted.load(Ordering::Acquire) == 0
            && sync::try_lock(&s.rx).is_some_and(|rx| rx.readable_now())
    }

    fn unwatched(&self) {
        self.session.hand_to_reader();
    }

    fn shutdown(&mut self) {
        self.session.close();
    }

    fn stop(&mut self) -> bool {
        // The node cancels the task's run (its workers running it are stopped there) and
        // answers with a COMPLETION, which ends the task here; the session stays in service. A
        // node that cannot be asked is lost, which ends the task as for any lost node.
        if !self.session.cancel_task() {
            self.session.wait_for_output_writes();
        }
        true
    }

    fn stopping(&self) -> &'static str {
        "the node cancels the task's run and answers; the session stays in service"
    }

    fn gone(&self) -> Option<String> {
        let why = self.session.lost()?;
        self.session.wait_for_output_writes();
        // The scheduler names the lane ("remote worker 1 (ADDR) is dead (..)"): not again here.
        Some(why)
    }
}

/// Checks that `session`'s node runs the callable `handle` names (registration reaches a node
/// only when it answers).
pub(crate) fn check_callable(session: &Session, handle: &CallableHandle, timeout: Duration) -> Result<()> {
    let digest: Digest = handle.digest();
    match session.control(wire::CHECK_CALLABLE, &wire::encode_check(&digest, handle.name()), timeout)? {
        Ok(_) => Ok(()),
        Err(m) => Err(Error::new(ErrorKind::Callable, format!("{}: {m}", session.label))),
    }
}

/// Says the size `needs` (SUB workers, chips; 0 and 0: the node's default) of `session`'s L3
/// Worker: the first control of a session. A sized node starts a Worker of that size for it;
/// its refusal is an error naming the node: [`ErrorKind::ResourceExhausted`] when its other
/// sessions hold too much. Returns the size the session got.
pub(crate) fn claim_size(session: &Session, needs: (u32, u32), timeout: Duration) -> Result<(u32, u32)> {
    let got = match session.control(wire::SIZE, &wire::encode_size(needs.0, needs.1), timeout)? {
        Ok(b) => wire::decode_size_reply(&b).map_err(|e| e.context(session.label.clone()))?,
        Err(m) => return Err(wire::refusal_error(&session.label, &m)),
    };
    if got.0 < needs.0 || got.1 < needs.1 {
        return Err(Error::decode(format!(
            "{}: asked for {} SUB workers and {} chips, the node gave {} and {}",
            session.label, needs.0, needs.1, got.0, got.1
        )));
    }
    tracing::info!(target: "simpler::remote", node = %session.label, sub_workers = got.0, chips = got.1, "session sized");
    Ok(got)
}

/// A node-resident buffer operation on `session`'s node (`wire::ALLOC`, `COPY_TO`, `COPY_FROM`,
/// `FREE`); returns the reply's bytes, or the node's refusal as an error of kind `kind`.
pub(crate) fn resident(
    session: &Session,
    command: u32,
    arg: u64,
    arg2: u64,
    data: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>> {
    let body = wire::encode_control(command, &Digest::from_bytes([0; 32]), "", arg, arg2, data);
    session.control(command, &body, timeout)?.map_err(|m| wire::refusal_error(&session.label, &m))
}

#[cfg(test)]
mod tests;
