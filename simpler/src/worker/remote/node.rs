//! The node role: a program that serves an L4 root as a remote L3 Worker.
//!
//! [`Node`] / [`BoundNode`]: an L3 Worker, the orchestration functions it runs by digest
//! (`register_orch`, and every `#[callable(orch)]`), and a listener. `serve_one` serves one
//! session, `serve` many, at most some number at once, each on a thread of its own with what
//! it holds on the node (`Held`: node-resident buffers, reused task buffers) its own; a root
//! authenticated past that number is told so in a SHUTDOWN and refused. Pairing authenticates
//! each connection on a thread of its own, at most 16 at once, and pairs a session with the
//! next connection that presents its token. A silent or slow peer holds back no root: at 16,
//! a new connection makes room by ending the oldest handshake still pending (an honest root
//! answers within a round trip, so the oldest is the one that says nothing), so no number of
//! idle connections keeps a root out.
//!
//! A session's first control is SIZE: a node with one L3 Worker lends it to every session; a
//! sized node ([`Node::sized`], `sizes`) starts one of the size the root asks for, within its
//! limits, which the session alone runs on and which closes when it ends.
//!
//! A session runs each TASK on its own thread, one at a time, each a run of the L3 Worker over
//! host buffers of the node that the bulk is read into, each just the span of its tensor's view
//! (the view moved to its start: a tile of a large buffer of the root costs the node the tile).
//! It keeps the buffers of its finished tasks for its next ones (one of exactly a span's size),
//! up to 16 buffers and 1 GiB, so steady-state tasks touch no fresh memory. A frame that waits
//! whole in the socket (`Stream::waiting_frame`) is taken in one read and decoded from memory;
//! others stream from the socket. After answering, the session checks its socket politely for a
//! moment before it sleeps in `read` (a busy root's next task comes at once).
//!
//! A heartbeat thread sends HEALTH on the health connection every 200 ms ([`HEARTBEAT`]), which
//! the root's health thread answers; when one cannot be written, or the root has answered none
//! for 3 s ([`ROOT_SILENCE`]: a stopped or cut-off root, which TCP would notice only after many
//! minutes), it cancels the task in flight and shuts the session connection, ending the session.
//! It also reads the root's CANCEL there (a run at the root passed its deadline or was
//! cancelled) and cancels the task it names, now or as soon as its run starts (a read from
//! another node the task waits on before its run ends at once: its connection is shut); the session goes
//! on, and workers the cancel stopped are replaced before the next task.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::callable::identity::{CallableHandle, CallableKind, Digest};
use crate::data::buffer::Buffer;
use crate::data::task_args::{Tag, TaskArgs};
use crate::data::tensor::TensorView;
use crate::data::wire::decode_args;
use crate::engine::orch_fn::OrchFn;
use crate::engine::run::RunHandle;
use crate::error::{Error, ErrorKind, Result};
use crate::level::Level;
use crate::net::auth::{ClusterKey, Handshake, NodeHello, server_handshake};
use crate::net::frame::{
    DEFAULT_MAX_BODY, FrameError, FrameKind, read_body, read_frame, read_frame_head, write_frame,
    write_frame_start,
};
use crate::net::transport::{Listener, NodeAddr, Stream, Waiting};
use crate::sys::sync;
use crate::worker::remote::lane;
use crate::worker::remote::launch::Launch;
use crate::worker::remote::peer::{Grant, PeerClient, PeerServer};
use crate::worker::remote::wire::{self, TensorData};
use crate::worker::{RunOptions, Worker};
pub use sizes::SessionLimits;
use sizes::{SessionWorker, Size, Sized};
use std::os::fd::AsFd;

/// How long a node waits for the health connection of a session a root opened.
const HEALTH_PAIRING: Duration = Duration::from_secs(10);

/// How many connections a node authenticates at once (each on a thread of its own); at this
/// many, a new connection ends the oldest pending handshake.
const HANDSHAKES: usize = 16;

/// How often a node tells its root it is alive.
pub(crate) const HEARTBEAT: Duration = Duration::from_millis(200);

/// How long a node waits for its root to answer a heartbeat before it takes the root for gone
/// (stopped, or cut off by the network, which a write notices only after TCP gives up, many
/// minutes later) and ends the session: its task is cancelled and what it held is freed.
pub(crate) const ROOT_SILENCE: Duration = Duration::from_secs(3);

/// The L3 Workers a node's sessions run on.
enum Workers {
    /// The node's one Worker, lent to each session ([`Node::new`]).
    One(Box<Worker>),
    /// One per session, of the size its root asks for ([`Node::sized`]).
    Sized(Sized),
}

impl Workers {
    /// Brings back the workers a cancelled task left dead (the node's one Worker: a sized
    /// node's session Workers are each their session's to mend).
    fn mend(&self, when: &str) {
        if let Workers::One(w) = self
            && let Err(e) = w.replace_dead_workers()
        {
            tracing::warn!(target: "simpler::remote", "replacing dead workers {when}: {e}");
        }
    }
}

/// A program in the node role: an L3 Worker served to one L4 root over an authenticated
/// session.
///
/// The same program runs as the root and as every node (SPMD): each decides its role at start
/// (an argument, the environment, or the launcher's rank) and makes the same registrations, so
/// a callable the root names by digest is found on the node. A node builds its L3 Worker (SUB
/// workers, chips, their callables), registers the orchestration functions the root will send
/// ([`register_orch`](Node::register_orch); `#[callable(orch)]`s are found on their own), binds
/// its address, and serves: each task runs one orchestration function as a run of its L3
/// Worker. Nodes listen on loopback unless [`allow_remote`](Node::allow_remote) says otherwise,
/// and only a root that proves it knows the [`ClusterKey`] may drive one.
///
/// ```no_run
/// use simpler::{remote::ClusterKey, remote::Node, remote::NodeAddr, Worker};
///
/// # fn main() -> simpler::Result<()> {
/// let l3 = Worker::builder().sub_workers(2).build()?;
/// let mut node = Node::new(l3, NodeAddr::parse("127.0.0.1:7401")?, ClusterKey::from_env()?)?;
/// // node.register_orch(OrchFn::new("step", step))?; // what the root will send
/// let bound = node.bind()?; // init the L3 Worker, listen
/// bound.serve_one()?; // one root's session, until it ends
/// # Ok(()) }
/// ```
pub struct Node {
    workers: Workers,
    addr: NodeAddr,
    key: ClusterKey,
    allow_remote: bool,
    /// Whether the binary's `#[callable(orch)]` functions are served too.
    linked: bool,
    orch: HashMap<Digest, OrchFn>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("addr", &self.addr).field("orch", &self.orch.len()).finish()
    }
}

impl Node {
    /// A node that will serve `worker` (an L3 Worker, not initialized) at `addr` to roots that
    /// know `key`.
    ///
    /// ```
    /// use simpler::{remote::ClusterKey, ErrorKind, status::Level, remote::Node, remote::NodeAddr, Worker};
    ///
    /// let key = ClusterKey::new([1u8; 32])?;
    /// let node = Node::new(Worker::builder().sub_workers(1).build()?, NodeAddr::loopback(0), key.clone())?;
    /// # drop(node);
    /// let l4 = Worker::builder().level(Level::Network1).build()?;
    /// let err = Node::new(l4, NodeAddr::loopback(0), key).unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn new(worker: Worker, addr: NodeAddr, key: ClusterKey) -> Result<Node> {
        if worker.level() != Level::Node {
            return Err(Error::invalid(format!(
                "Node::new: a node serves an L3 Worker, not an {} one",
                worker.level()
            )));
        }
        if worker.is_ready() {
            return Err(Error::state("Node::new: the Worker must not be initialized (the node starts it)"));
        }
        Ok(Node {
            workers: Workers::One(Box::new(worker)),
            addr,
            key,
            allow_remote: false,
            linked: true,
            orch: HashMap::new(),
        })
    }

    /// A node that gives each root's session an L3 Worker of its own, of the size the root asks
    /// for ([`RemoteWorker::requires`](crate::remote::RemoteWorker::requires)) within `limits`:
    /// `make(sub_workers, chips)` builds it (not initialized; the node starts it when the
    /// session starts and closes it when the session ends). So roots that share a node do not
    /// share its workers, and the node never holds more than `limits` says, however many roots
    /// come. `make` runs on a session's thread while other sessions run: the Worker it builds
    /// must start its children by exec (the default [`StartMethod`](crate::StartMethod)), and
    /// `make` must return promptly: the session's share of the limits is held while it runs, and
    /// its root waits for the answer to its SIZE (a root that goes away meanwhile is noticed
    /// only after the Worker was made and started, which then closes at once).
    ///
    /// ```no_run
    /// use simpler::{remote::ClusterKey, remote::Node, remote::NodeAddr, remote::SessionLimits, HostFn, Worker};
    ///
    /// # fn work(_: &simpler::HostArgs<'_>) -> simpler::HostResult { Ok(()) }
    /// # fn main() -> simpler::Result<()> {
    /// // 8 SUB workers and 2 chips for all sessions together, at most 4 and 1 each.
    /// let limits = SessionLimits::new(8, 2).per_session(4, 1);
    /// let node = Node::sized(NodeAddr::parse("127.0.0.1:7401")?, ClusterKey::from_env()?, limits, |sub, chips| {
    ///     let mut l3 = Worker::builder().sub_workers(sub as usize).chips(chips as usize).build()?;
    ///     l3.register(HostFn::new("work", work))?;
    ///     Ok(l3)
    /// })?;
    /// node.bind()?.serve(usize::MAX, 4)?;
    /// # Ok(()) }
    /// ```
    ///
    /// Limits that contradict each other are refused:
    ///
    /// ```
    /// use simpler::{remote::ClusterKey, remote::Node, remote::NodeAddr, remote::SessionLimits, ErrorKind, Worker};
    ///
    /// let key = ClusterKey::new([1u8; 32])?;
    /// let err = Node::sized(NodeAddr::loopback(0), key, SessionLimits::new(2, 0).per_session(4, 0), |s, c| {
    ///     Worker::builder().sub_workers(s as usize).chips(c as usize).build()
    /// })
    /// .unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn sized(
        addr: NodeAddr,
        key: ClusterKey,
        limits: SessionLimits,
        make: impl Fn(u32, u32) -> Result<Worker> + Send + Sync + 'static,
    ) -> Result<Node> {
        let workers = Workers::Sized(Sized::new(limits, Box::new(make))?);
        Ok(Node { workers, addr, key, allow_remote: false, linked: true, orch: HashMap::new() })
    }

    /// Whether the node may listen on an address other than loopback (default `false`: a node
    /// executes code on request, so reaching it from other hosts is a decision).
    ///
    /// ```
    /// # let key = simpler::remote::ClusterKey::new([1u8; 32])?;
    /// # let w = simpler::Worker::builder().build()?;
    /// let node = simpler::remote::Node::new(w, simpler::remote::NodeAddr::parse("0.0.0.0:7402")?, key)?.allow_remote(true);
    /// # drop(node);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn allow_remote(mut self, allow: bool) -> Node {
        self.allow_remote = allow;
        self
    }

    /// Whether the node also serves every `#[callable(orch)]` function of its binary (default
    /// `true`). With `false` it serves only what [`register_orch`](Node::register_orch)
    /// names: a node with a role of its own in a cluster whose nodes serve different work. A
    /// root's linked `#[callable(orch)]` functions then go only to the nodes that have them,
    /// and a task of one placed on this node is refused at submit, naming both.
    ///
    /// ```
    /// # let key = simpler::remote::ClusterKey::new([1u8; 32])?;
    /// # let w = simpler::Worker::builder().build()?;
    /// let node = simpler::remote::Node::new(w, simpler::remote::NodeAddr::loopback(0), key)?.linked_callables(false);
    /// # drop(node);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn linked_callables(mut self, serve: bool) -> Node {
        self.linked = serve;
        self
    }

    /// Registers an orchestration function the root may send (the root registers the same one
    /// with `register_orch`; they meet by digest).
    ///
    /// ```
    /// use simpler::{chip::CallConfig, remote::ClusterKey, remote::Node, remote::NodeAddr, OrchFn, Orchestrator, TaskArgs, Worker};
    ///
    /// fn step(_o: &mut Orchestrator<'_>, _a: &TaskArgs, _c: &CallConfig) -> simpler::Result<()> {
    ///     Ok(())
    /// }
    /// let key = ClusterKey::new([1u8; 32])?;
    /// let mut node = Node::new(Worker::builder().build()?, NodeAddr::loopback(0), key)?;
    /// let h = node.register_orch(OrchFn::new("step", step));
    /// assert_eq!(h, OrchFn::new("step", step).handle());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn register_orch(&mut self, f: OrchFn) -> CallableHandle {
        let h = f.handle();
        self.orch.insert(h.digest(), f);
        h
    }

    /// Adds every `#[callable(orch)]` of the binary to what the node runs.
    fn add_linked_orchs(&mut self) -> Result<()> {
        for info in crate::callable::linked::CallableInfo::linked_unambiguous()? {
            if info.kind == CallableKind::Orch {
                let f = OrchFn::from_linked(info)?;
                self.orch.entry(f.handle().digest()).or_insert(f);
            }
        }
        Ok(())
    }

    /// Starts the L3 Worker and listens; a node is reachable from here on.
    ///
    /// ```no_run
    /// # let key = simpler::remote::ClusterKey::new([1u8; 32])?;
    /// let node = simpler::remote::Node::new(simpler::Worker::builder().build()?, simpler::remote::NodeAddr::loopback(0), key)?;
    /// let bound = node.bind()?;
    /// println!("listening on {}", bound.local_addr()); // the real port when 0 was asked
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn bind(mut self) -> Result<BoundNode> {
        if self.linked {
            self.add_linked_orchs()?;
        }
        let listener = Listener::bind(&self.addr, self.allow_remote)?;
        if let Workers::One(w) = &mut self.workers {
            w.init()?;
        }
        let name = listener.local_addr().to_string();
        Ok(BoundNode {
            workers: self.workers,
            listener: Some(listener),
            key: self.key.clone(),
            orch: self.orch,
            name,
            sessions: std::sync::atomic::AtomicUsize::new(0),
            peer: std::sync::OnceLock::new(),
            client: PeerClient::new(self.key.clone()),
        })
    }

    /// Serves the root of a launched job (`mpirun`, `srun`): starts the L3 Worker, connects to
    /// the root at `launch.root()` (waiting for it to listen, up to a minute), authenticates,
    /// and serves its session until it ends. The node's own address is not used: it connects
    /// out, so nothing listens on it.
    ///
    /// ```no_run
    /// use simpler::{remote::ClusterKey, remote::Launch, remote::Node, remote::NodeAddr, Worker};
    ///
    /// # fn main() -> simpler::Result<()> {
    /// if let Some(launch) = Launch::from_env()?.filter(|l| !l.is_root()) {
    ///     let l3 = Worker::builder().sub_workers(2).build()?;
    ///     Node::new(l3, NodeAddr::loopback(0), ClusterKey::from_env()?)?.serve_launch(&launch)?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn serve_launch(mut self, launch: &Launch) -> Result<()> {
        if launch.is_root() {
            return Err(Error::invalid("Node::serve_launch: rank 0 is the root, not a node"));
        }
        if self.linked {
            self.add_linked_orchs()?;
        }
        if let Workers::One(w) = &mut self.workers {
            w.init()?;
        }
        let node = BoundNode {
            workers: self.workers,
            listener: None,
            client: PeerClient::new(self.key.clone()),
            key: self.key,
            orch: self.orch,
            name: format!("rank {}", launch.rank()),
            sessions: std::sync::atomic::AtomicUsize::new(0),
            peer: std::sync::OnceLock::new(),
        };
        let root = launch.root();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut backoff = Duration::from_millis(10);
        let mut stream = loop {
            match Stream::connect(root, Duration::from_secs(5)) {
                Ok(s) => break s,
                // The root may not listen yet: the launcher starts every rank at once.
                Err(e) if std::time::Instant::now() < deadline => {
                    tracing::debug!(target: "simpler::remote", "rank {}: the root at {root} is not there yet: {e}", launch.rank());
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                Err(e) => {
                    return Err(Error::new(
                        ErrorKind::WorkerDied,
                        format!("rank {}: cannot connect to the root at {root}: {e}", launch.rank()),
                    ));
                }
            }
        };
        let hello = NodeHello { node_id: u64::from(launch.rank()), ..node.hello() };
        let peer = stream.peer();
        server_handshake(&mut stream, &node.key, &hello, &peer)?;
        // The health connection: opened by this node too, paired by a token.
        let token = lane::token()?;
        lane::announce(&mut stream, &token, &peer)?;
        let mut health = Stream::connect(root, Duration::from_secs(5)).map_err(|e| {
            Error::new(
                ErrorKind::WorkerDied,
                format!(
                    "rank {}: cannot open the health connection to the root at {root}: {e}",
                    launch.rank()
                ),
            )
        })?;
        server_handshake(&mut health, &node.key, &hello, &peer)?;
        lane::announce(&mut health, &token, &peer)?;
        node.session(node.count_session(), stream, health, &peer)
    }
}

/// One session counted in [`BoundNode::sessions`], until it drops.
struct Counted<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A node listening, with its L3 Worker started ([`Node::bind`]; a sized node starts one per
/// session).
pub struct BoundNode {
    workers: Workers,
    /// `None` for a node of a launched job, which connects to its root.
    listener: Option<Listener>,
    key: ClusterKey,
    orch: HashMap<Digest, OrchFn>,
    /// How messages name this node (its address, or its rank).
    name: String,
    /// The sessions running now ([`Counted`]).
    sessions: std::sync::atomic::AtomicUsize,
    /// Where other nodes read this node's node-resident buffers (`peer`): started by the
    /// first allocation, or why it could not be.
    peer: std::sync::OnceLock<std::result::Result<Arc<PeerServer>, String>>,
    /// How this node reads other nodes' buffers.
    client: PeerClient,
}

/// A handshake in progress: its accept order, a handle on the connection to end it by, its
/// claim (which settles a race between a handshake that finishes and the pairing loop ending
/// it to make room).
type Pending = (u64, Stream, Arc<Handshake>);

/// What pairing connections keeps from one session to the next (a node serving several roots
/// pairs one while others' connections are still authenticating or waiting for their pair).
struct Pairing {
    tx: std::sync::mpsc::Sender<(u64, Stream, String, Result<lane::Token>)>,
    rx: std::sync::mpsc::Receiver<(u64, Stream, String, Result<lane::Token>)>,
    /// Each handshake thread writes a byte to `wake_tx` once it sent its connection: wakes `poll`.
    wake_rx: std::os::unix::net::UnixStream,
    wake_tx: std::os::unix::net::UnixStream,
    /// Authenticated connections waiting for their pair: token -> (accept order, stream, peer,
    /// since when). Of two with one token, the one accepted first is the session's.
    waiting: HashMap<lane::Token, (u64, Stream, String, std::time::Instant)>,
    accepted: u64,
    running: usize,
    /// The handshakes in progress, oldest first.
    pending: std::collections::VecDeque<Pending>,
}

impl Pairing {
    fn new() -> Result<Pairing> {
        let (tx, rx) = std::sync::mpsc::channel();
        let (wake_rx, wake_tx) =
            std::os::unix::net::UnixStream::pair().map_err(|e| Error::os("making a wake-up pipe", e))?;
        wake_rx.set_nonblocking(true).map_err(|e| Error::os("making a wake-up pipe", e))?;
        Ok(Pairing {
            tx,
            rx,
            wake_rx,
            wake_tx,
            waiting: HashMap::new(),
            accepted: 0,
            running: 0,
            pending: std::collections::VecDeque::new(),
        })
    }
}

/// What one session holds on the node, which no other session sees: freed when it ends (its
/// buffers first, then its Worker: fields drop in order).
struct Held<'a> {
    /// Node-resident buffers of the session, by id, each with the grant other nodes read it by.
    resident: Mutex<HashMap<u64, (Buffer, Option<Grant>)>>,
    /// Host buffers of finished tasks, reused by the session's next tasks.
    pool: Mutex<Vec<Buffer>>,
    next_resident: std::sync::atomic::AtomicU64,
    /// Where this node's peer listener listens if this session starts it: the address the
    /// session reached the node at, any port (`None`: a fresh Unix socket).
    peer_at: Option<NodeAddr>,
    /// The L3 Worker the session's tasks run on, set by its SIZE (a root's first control).
    worker: std::sync::OnceLock<SessionWorker<'a>>,
}

impl<'a> Held<'a> {
    /// The session's Worker, which its SIZE set (a root sends SIZE before anything else).
    fn worker(&self) -> std::result::Result<&SessionWorker<'a>, String> {
        self.worker.get().ok_or_else(|| "this session has no Worker: its root sent no SIZE first".into())
    }

    fn with_resident(
        &self,
        id: u64,
        f: impl FnOnce(&Buffer) -> std::result::Result<Vec<u8>, String>,
    ) -> std::result::Result<Vec<u8>, String> {
        match sync::lock(&self.resident).get(&id) {
            Some((b, _)) => f(b),
            None => Err(format!("node-resident buffer {id} does not exist (freed already?)")),
        }
    }
}

impl std::fmt::Debug for BoundNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundNode").field("name", &self.name).finish()
    }
}

impl BoundNode {
    /// Where the node listens (with the real port when port 0 was asked).
    ///
    /// ```no_run
    /// # let key = simpler::remote::ClusterKey::new([1u8; 32])?;
    /// # let node = simpler::remote::Node::new(simpler::Worker::builder().build()?, simpler::remote::NodeAddr::loopback(0), key)?;
    /// let bound = node.bind()?;
    /// assert!(bound.local_addr().is_loopback());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn local_addr(&self) -> NodeAddr {
        self.listener.as_ref().expect("a bound node listens").local_addr()
    }

    /// The sessions running now. A session counts until the node freed what it held: its
    /// buffers, and on a sized node ([`Node::sized`]) its Worker and its share of the limits.
    ///
    /// ```no_run
    /// # let key = simpler::remote::ClusterKey::new([1u8; 32])?;
    /// # let node = simpler::remote::Node::new(simpler::Worker::builder().build()?, simpler::remote::NodeAddr::loopback(0), key)?;
    /// let bound = std::sync::Arc::new(node.bind()?);
    /// let serving = { let b = bound.clone(); std::thread::spawn(move || b.serve(usize::MAX, 4)) };
    /// println!("{} roots served now", bound.sessions());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn sessions(&self) -> usize {
        self.sessions.load(Ordering::Acquire)
    }

    /// Serves the next root that authenticates, until it ends the session or is lost (its
    /// connection closes: a dead root frees the node's session at once). Connections that fail
    /// the handshake are refused, logged with their address, and waited past.
    ///
    /// ```no_run
    /// # let key = simpler::remote::ClusterKey::new([1u8; 32])?;
    /// # let node = simpler::remote::Node::new(simpler::Worker::builder().build()?, simpler::remote::NodeAddr::loopback(0), key)?;
    /// let bound = node.bind()?;
    /// bound.serve_one()?;
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn serve_one(&self) -> Result<()> {
        let hello = self.hello();
        // Workers a cancelled task of an earlier session left dead come back first.
        self.workers.mend("before a session");
        let listener = self.listener.as_ref().expect("a bound node listens");
        let (stream, health, peer) = self.pair(&mut Pairing::new()?, listener, &hello)?;
        self.session(self.count_session(), stream, health, &peer)
    }

    /// Serves `sessions` roots in all (`usize::MAX`: for as long as the process runs), up to
    /// `at_once` of them at the same time, each on a thread of its own; returns once they all
    /// ended. Each session is isolated from the others: its node-resident buffers and its
    /// reused task buffers are its own (another root's ids name nothing here), and they are
    /// freed when it ends. Their runs share the node's L3 Worker, which runs them one after
    /// another in the order they come; on a sized node ([`Node::sized`]) each session has a
    /// Worker of its own instead. A root that authenticates while `at_once` sessions run
    /// is refused: its session ends at once with a message that says so ("serves 2 roots at
    /// once, its limit"), which the root reports from `init` or its first task; it does not
    /// count as one of `sessions`.
    ///
    /// ```no_run
    /// # let key = simpler::remote::ClusterKey::new([1u8; 32])?;
    /// # let node = simpler::remote::Node::new(simpler::Worker::builder().sub_workers(2).build()?, simpler::remote::NodeAddr::loopback(7402), key)?;
    /// let bound = node.bind()?;
    /// bound.serve(usize::MAX, 4)?; // any number of roots, 4 at a time, until the process ends
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn serve(&self, sessions: usize, at_once: usize) -> Result<()> {
        if at_once == 0 {
            return Err(Error::invalid("BoundNode::serve: at_once must be at least 1"));
        }
        let listener = self.listener.as_ref().expect("a bound node listens");
        let hello = self.hello();
        let mut pairing = Pairing::new()?;
        std::thread::scope(|scope| {
            let mut served = 0;
            while served < sessions {
                if self.sessions() == 0 {
                    self.workers.mend("between sessions");
                }
                let (stream, health, peer) = self.pair(&mut pairing, listener, &hello)?;
                if self.sessions() >= at_once {
                    let why = format!(
                        "the node at {} serves {at_once} root{} at once, its limit; try again once one ends",
                        self.name,
                        if at_once == 1 { "" } else { "s" }
                    );
                    tracing::warn!(target: "simpler::remote", peer = %peer, "{why}: refused");
                    // Said on both connections, which stay open until the root hangs up (or
                    // for 5 s): a root writing its first control meanwhile still reads why.
                    for mut s in [stream, health] {
                        let _ = write_frame(&mut s, FrameKind::Shutdown, 0, why.as_bytes());
                        scope.spawn(move || {
                            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                            let _ = std::io::copy(&mut s, &mut std::io::sink());
                            s.shutdown();
                        });
                    }
                    continue;
                }
                served += 1;
                // Counted before its thread starts, so the next turn of this loop sees it; the
                // count is given back however the session ends (a panic included), and also
                // when its thread cannot start (the closure holding it is dropped).
                let counted = self.count_session();
                std::thread::Builder::new()
                    .name("simpler-node-session".into())
                    .spawn_scoped(scope, move || {
                        if let Err(e) = self.session(counted, stream, health, &peer) {
                            tracing::warn!(target: "simpler::remote", peer = %peer, "session failed: {e}");
                        }
                    })
                    .map_err(|e| Error::os("starting a session thread", e))?;
            }
            Ok(())
        })
    }

    /// What the node announces in its handshake.
    fn hello(&self) -> NodeHello {
        // A sized node announces the most a session may ask for.
        let (sub_workers, chips) = match &self.workers {
            Workers::One(w) => {
                let size = Size::of(w);
                (size.sub_workers, size.chips)
            }
            Workers::Sized(s) => s.limits().per_session_max(),
        };
        NodeHello { node_id: std::process::id() as u64, sub_workers, chips, pid: std::process::id() }
    }

    /// The Worker of `asked` size (zero: any) for a session: the node's one (which must have at
    /// least that), or a new one of just that size.
    fn session_worker(&self, asked: Size) -> std::result::Result<SessionWorker<'_>, String> {
        match &self.workers {
            Workers::Sized(s) => s.start(asked, &self.name),
            Workers::One(w) => {
                let has = Size::of(w);
                if !asked.fits(has) {
                    return Err(wire::refusal(
                        ErrorKind::InvalidArgument,
                        format_args!("the node at {} has {has}; this root asked for {asked}", self.name),
                    ));
                }
                Ok(SessionWorker::Shared(w))
            }
        }
    }

    /// SIZE: the session's Worker, of the size its root asks for (the first control a root
    /// sends). The reply: the Worker's SUB workers and chips.
    fn size<'a>(&'a self, held: &Held<'a>, sub: u64, chips: u64) -> std::result::Result<Vec<u8>, String> {
        let asked = match (u32::try_from(sub), u32::try_from(chips)) {
            (Ok(sub_workers), Ok(chips)) => Size { sub_workers, chips },
            _ => {
                return Err(wire::refusal(
                    ErrorKind::InvalidArgument,
                    format_args!("a size of {sub} SUB workers and {chips} chips"),
                ));
            }
        };
        if held.worker.get().is_some() {
            return Err("the session's size is set once, by its first SIZE".into());
        }
        // A refused size leaves the session without a Worker (its root fails `init`). Set in one
        // step: a Worker set meanwhile refuses this one instead of being reported as its size.
        let set = self.session_worker(asked).and_then(|w| {
            held.worker.set(w).map_err(|_| "the session's size is set once, by its first SIZE".to_string())
        });
        match set.map(|()| held.worker.get().expect("set just now")) {
            Err(e) => Err(e),
            Ok(w) => {
                let size = w.size();
                tracing::info!(target: "simpler::remote", node = %self.name, sub_workers = size.sub_workers, chips = size.chips, own = w.own(), "session sized");
                Ok(wire::encode_size_reply(size.sub_workers, size.chips))
            }
        }
    }

    /// Accepts connections until a root's session connection and its health connection (the
    /// next one that presents the same token, within [`HEALTH_PAIRING`]) are authenticated.
    /// Each connection is authenticated on a thread of its own, at most [`HANDSHAKES`] at
    /// once: a connection accepted at that many ends the oldest pending handshake (its thread
    /// then ends at once), so peers that connect and then say nothing hold back nobody, however
    /// many they are; one that fails the handshake is refused and logged.
    fn pair(
        &self,
        p: &mut Pairing,
        listener: &Listener,
        hello: &NodeHello,
    ) -> Result<(Stream, Stream, String)> {
        loop {
            let now = std::time::Instant::now();
            p.waiting.retain(|_, (_, stream, peer, since)| {
                let keep = now.duration_since(*since) < HEALTH_PAIRING;
                if !keep {
                    tracing::warn!(target: "simpler::remote", peer = %peer, "refused a connection: no connection with its token within {HEALTH_PAIRING:?}");
                    stream.shutdown();
                }
                keep
            });
            // Until the first p.waiting connection expires (or for ever).
            let timeout = match p.waiting.values().map(|(_, _, _, since)| *since + HEALTH_PAIRING).min() {
                None => nix::poll::PollTimeout::NONE,
                Some(at) => {
                    let ms = at.saturating_duration_since(now).as_millis() + 1;
                    nix::poll::PollTimeout::try_from(ms).unwrap_or(nix::poll::PollTimeout::MAX)
                }
            };
            let mut fds = vec![nix::poll::PollFd::new(p.wake_rx.as_fd(), nix::poll::PollFlags::POLLIN)];
            // Ended handshakes leave within moments; the bound only keeps threads finite if
            // they do not.
            if p.running < 2 * HANDSHAKES {
                fds.push(nix::poll::PollFd::new(listener.as_fd(), nix::poll::PollFlags::POLLIN));
            }
            match nix::poll::poll(&mut fds, timeout) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(Error::os("poll", e)),
            }
            let new_connection = fds.get(1).and_then(|f| f.revents()).is_some_and(|r| !r.is_empty());
            drop(fds);
            let mut bytes = [0u8; 64];
            while std::io::Read::read(&mut &p.wake_rx, &mut bytes).is_ok_and(|n| n > 0) {}
            while let Ok((order, stream, peer, presented)) = p.rx.try_recv() {
                p.running -= 1;
                p.pending.retain(|(o, _, _)| *o != order);
                let token = match presented {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::warn!(target: "simpler::remote", peer = %peer, "refused a connection: {e}");
                        stream.shutdown();
                        continue;
                    }
                };
                match p.waiting.remove(&token) {
                    Some((first, session, first_peer, _)) if first < order => {
                        return Ok((session, stream, first_peer));
                    }
                    Some((_, health, _, _)) => return Ok((stream, health, peer)),
                    None => {
                        p.waiting.insert(token, (order, stream, peer, std::time::Instant::now()));
                    }
                }
            }
            if new_connection {
                let (mut stream, peer) = match listener.accept() {
                    Ok(c) => c,
                    // A connection that went before it was taken, or no file descriptor left
                    // for now: the node serves on (a moment's pause lets descriptors free up
                    // rather than spinning on a listener that stays readable).
                    Err(e) => {
                        tracing::warn!(target: "simpler::remote", "accepting a connection failed: {e}");
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                };
                p.accepted += 1;
                if p.pending.len() >= HANDSHAKES {
                    // The oldest still p.running (a finished one is drained on the next pass).
                    if let Some(at) = p.pending.iter().position(|(_, _, state)| state.end())
                        && let Some((_, oldest, _)) = p.pending.remove(at)
                    {
                        tracing::warn!(target: "simpler::remote", "ended the oldest p.pending handshake to make room for a new connection ({HANDSHAKES} p.pending)");
                        oldest.shutdown();
                    }
                }
                let state = Arc::new(Handshake::default());
                match stream.try_clone() {
                    Ok(handle) => p.pending.push_back((p.accepted, handle, state.clone())),
                    Err(e) => {
                        tracing::warn!(target: "simpler::remote", peer = %peer, "refused a connection: {e}");
                        stream.shutdown();
                        continue;
                    }
                }
                p.running += 1;
                let (order, tx, key, hello) = (p.accepted, p.tx.clone(), self.key.clone(), hello.clone());
                let wake = p.wake_tx.try_clone().map_err(|e| Error::os("cloning a wake-up pipe", e))?;
                let spawned = std::thread::Builder::new().name("simpler-handshake".into()).spawn(move || {
                    let mut presented = server_handshake(&mut stream, &key, &hello, &peer)
                        .and_then(|()| lane::read_token(&mut stream, HEALTH_PAIRING, &peer));
                    if !state.finish() {
                        presented =
                            Err(Error::state("its handshake was ended to make room for a newer connection"));
                    }
                    let _ = tx.send((order, stream, peer, presented));
                    let _ = std::io::Write::write(&mut &wake, &[1]);
                });
                if let Err(e) = spawned {
                    p.running -= 1;
                    p.pending.retain(|(o, _, _)| *o != p.accepted);
                    tracing::warn!(target: "simpler::remote", "refused a connection: no thread to authenticate it: {e}");
                }
            }
        }
    }

    /// Counts a session in [`sessions`](BoundNode::sessions) until the guard drops.
    fn count_session(&self) -> Counted<'_> {
        self.sessions.fetch_add(1, Ordering::AcqRel);
        Counted(&self.sessions)
    }

    /// Serves one session, `counted` (it counts until the node freed what the session held:
    /// declared before the session's state, it drops after it): its tasks and controls on
    /// `stream`, heartbeats on `health`.
    fn session(&self, counted: Counted<'_>, stream: Stream, health: Stream, peer: &str) -> Result<()> {
        tracing::info!(target: "simpler::remote", peer = %peer, "session started");
        let _counted = counted;
        // Buffer ids of this session start at a random point: an id of an earlier session (a
        // root that rejoined) names nothing here rather than a buffer of this one.
        let first = u64::from(u32::from_le_bytes(crate::sys::random::bytes::<4>("buffer ids")?)) << 32 | 1;
        let held = Held {
            resident: Mutex::default(),
            pool: Mutex::default(),
            worker: std::sync::OnceLock::new(),
            next_resident: std::sync::atomic::AtomicU64::new(first),
            peer_at: stream.local_addr().map(|a| match a {
                std::net::SocketAddr::V4(v4) => NodeAddr::Tcp((*v4.ip(), 0).into()),
                std::net::SocketAddr::V6(v6) => NodeAddr::Tcp((*v6.ip(), 0).into()),
            }),
        };
        let writer = Arc::new(Mutex::new(stream.try_clone().map_err(|e| Error::os("cloning a socket", e))?));
        let health_socket = health.try_clone().map_err(|e| Error::os("cloning a socket", e))?;
        let done = Arc::new(AtomicBool::new(false));
        // The task in flight: the heartbeat thread cancels it when the root is gone (its
        // heartbeat cannot be written, or it stopped answering them), since this thread is
        // busy running it; it also ends the session then (this thread may be waiting in a read).
        // It also cancels it when the root asks (a CANCEL on the health connection).
        let current: Arc<Mutex<InFlight>> = Arc::new(Mutex::new(InFlight::default()));
        let session_socket = stream.try_clone().map_err(|e| Error::os("cloning a socket", e))?;
        let beat = {
            let (mut health, done, current, peer) = (health, done.clone(), current.clone(), peer.to_string());
            std::thread::Builder::new()
                .name("simpler-heartbeat".into())
                .spawn(move || {
                    let root_gone = |why: &str| {
                        if !done.load(Ordering::Acquire) {
                            tracing::warn!(target: "simpler::remote", peer = %peer, "{why}: ending its session");
                            sync::lock(&current).abandon();
                            session_socket.shutdown();
                        }
                    };
                    let mut heard = std::time::Instant::now();
                    while !done.load(Ordering::Acquire) {
                        if write_frame(&mut health, FrameKind::Health, 0, &[]).is_err() {
                            return root_gone("the root is gone");
                        }
                        // The root answers each heartbeat: its answers are read until the next
                        // heartbeat is due.
                        let next = std::time::Instant::now() + HEARTBEAT;
                        loop {
                            let left = next.saturating_duration_since(std::time::Instant::now());
                            if left.is_zero() || health.set_read_timeout(Some(left)).is_err() {
                                break;
                            }
                            match read_frame(&mut health, 0) {
                                Ok(f) if f.kind == FrameKind::Health => heard = std::time::Instant::now(),
                                Ok(f) if f.kind == FrameKind::Cancel => sync::lock(&current).cancel(f.seq),
                                Err(e) if e.is_timeout() => break,
                                Ok(f) => return root_gone(&format!("the root sent a {:?} frame on its health connection", f.kind)),
                                Err(e) => return root_gone(&format!("the root's health connection failed: {e}")),
                            }
                        }
                        if heard.elapsed() > ROOT_SILENCE {
                            return root_gone(&format!("the root answered no heartbeat for {ROOT_SILENCE:?}"));
                        }
                    }
                })
                .map_err(|e| Error::os("starting the heartbeat thread", e))?
        };
        let reader = stream;
        let mut scratch = vec![0u8; WHOLE_FRAME];
        let result = loop {
            // A small frame that waits whole is taken in one read and read from memory.
            let mut from = match reader.waiting_frame(&mut scratch) {
                Waiting::Whole(n) => match std::io::Read::read_exact(&mut &reader, &mut scratch[..n]) {
                    Ok(()) => Source::Memory(&scratch[..n]),
                    Err(e) => break session_end(FrameError::Io(e), peer),
                },
                Waiting::Nothing | Waiting::Other => Source::Socket(&reader),
            };
            let head = match read_frame_head(&mut from, DEFAULT_MAX_BODY) {
                Ok(h) => h,
                Err(e) => break session_end(e, peer),
            };
            if head.kind == FrameKind::Task {
                // The tensors' bytes go straight from the socket into the node's buffers, and
                // the written ones straight back (no copy of the bulk on this side).
                let reply = match self.task(&held, &mut from, head.len, head.seq, &current) {
                    Ok(r) => r,
                    Err(e) => break session_end(e, peer),
                };
                if let Err(e) = reply.send(&mut sync::lock(&writer), head.seq) {
                    tracing::info!(target: "simpler::remote", peer = %peer, "the root is gone: {e}");
                    break Ok(());
                }
                self.recycle(&held, reply.buffers);
                reader.await_briefly(); // a busy root sends its next task right away
                continue;
            }
            let body = match read_body(&mut from, head) {
                Ok(b) => b,
                Err(e) => break session_end(e, peer),
            };
            let reply = match head.kind {
                FrameKind::Control => (FrameKind::ControlReply, self.control(&held, &body)),
                FrameKind::Shutdown => break Ok(()),
                FrameKind::Health => continue,
                other => {
                    break Err(Error::new(
                        ErrorKind::InvalidArgument,
                        format!("session with {peer}: unexpected {other:?} frame"),
                    ));
                }
            };
            if let Err(e) = write_frame(&mut *sync::lock(&writer), reply.0, head.seq, &reply.1) {
                // The root is gone (its end of the connection closed): the session is over.
                tracing::info!(target: "simpler::remote", peer = %peer, "the root is gone: {e}");
                break Ok(());
            }
        };
        done.store(true, Ordering::Release);
        beat.thread().unpark();
        sync::lock(&writer).shutdown();
        health_socket.shutdown();
        let _ = beat.join();
        // What the session held goes with it: other nodes can no longer read it either.
        if let Some(Ok(peer)) = self.peer.get() {
            for (_, grant) in sync::lock(&held.resident).values() {
                if let Some(g) = grant {
                    peer.revoke(g);
                }
            }
        }
        drop(held);
        tracing::info!(target: "simpler::remote", peer = %peer, "session ended");
        result
    }

    fn control<'a>(&'a self, held: &Held<'a>, body: &[u8]) -> Vec<u8> {
        let result = match wire::decode_control(body) {
            Ok(m) => match m.command {
                wire::CHECK_CALLABLE if self.orch.contains_key(&m.digest) => Ok(Vec::new()),
                wire::CHECK_CALLABLE => Err(self.unknown(&m.digest, &m.name)),
                wire::ALLOC => self.alloc_resident(held, m.arg),
                // A copy travels in parts of at most `wire::COPY_PART` bytes: COPY_TO's second
                // argument is the part's offset, COPY_FROM's its length (its offset in the data).
                wire::COPY_TO => held.with_resident(m.arg, |b| {
                    let at = usize::try_from(m.arg2).unwrap_or(usize::MAX);
                    if at.checked_add(m.data.len()).is_none_or(|end| end > b.nbytes()) {
                        return Err(format!(
                            "{} bytes at offset {} do not fit in its {} bytes",
                            m.data.len(),
                            m.arg2,
                            b.nbytes()
                        ));
                    }
                    b.write(at, m.data).map(|()| Vec::new()).map_err(|e| e.to_string())
                }),
                wire::COPY_FROM => held.with_resident(m.arg, |b| {
                    let n = usize::try_from(m.arg2).unwrap_or(usize::MAX);
                    let at = match m.data {
                        [] => 0,
                        d => match <[u8; 8]>::try_from(d) {
                            Ok(a) => usize::try_from(u64::from_le_bytes(a)).unwrap_or(usize::MAX),
                            Err(_) => return Err(format!("a COPY_FROM offset of {} bytes", d.len())),
                        },
                    };
                    if n > wire::COPY_PART || at.checked_add(n).is_none_or(|end| end > b.nbytes()) {
                        return Err(format!("{n} bytes at offset {at} asked of its {} bytes", b.nbytes()));
                    }
                    b.read::<u8>(at, n).map_err(|e| e.to_string())
                }),
                wire::SIZE => self.size(held, m.arg, m.arg2),
                wire::FREE => match sync::lock(&held.resident).remove(&m.arg) {
                    Some((_, grant)) => {
                        if let (Some(g), Some(Ok(peer))) = (grant, self.peer.get()) {
                            peer.revoke(&g);
                        }
                        Ok(Vec::new())
                    }
                    None => Err(format!("node-resident buffer {} does not exist (freed already?)", m.arg)),
                },
                other => Err(format!("unknown control command {other}")),
            },
            Err(e) => Err(e.to_string()),
        };
        wire::encode_reply(&result)
    }

    /// Allocates a node-resident buffer of `nbytes`. The reply: its id, then the grant other
    /// nodes read it by and the address of this node's peer listener (both empty when the
    /// listener could not start: the buffer is then usable on this node only).
    fn alloc_resident<'a>(&'a self, held: &Held<'a>, nbytes: u64) -> std::result::Result<Vec<u8>, String> {
        let n = usize::try_from(nbytes).map_err(|_| format!("{nbytes} bytes do not fit this node"))?;
        let buf =
            held.worker()?.worker().create_buffer(n.max(1)).map_err(|e| wire::refusal_of(&e, e.message()))?;
        let id = held.next_resident.fetch_add(1, Ordering::Relaxed);
        let mut reply = id.to_le_bytes().to_vec();
        let grant = match self.peer_server(held) {
            Ok(peer) => match peer.grant(&buf) {
                Ok(g) => {
                    reply.extend_from_slice(&g);
                    reply.extend_from_slice(peer.addr().as_bytes());
                    Some(g)
                }
                Err(e) => {
                    tracing::warn!(target: "simpler::remote", "no grant for a node-resident buffer: {e}");
                    None
                }
            },
            Err(why) => {
                tracing::warn!(target: "simpler::remote", "node-resident buffers of {} stay on it: {why}", self.name);
                None
            }
        };
        sync::lock(&held.resident).insert(id, (buf, grant));
        Ok(reply)
    }

    /// This node's peer listener, started on first use.
    fn peer_server(&self, held: &Held<'_>) -> std::result::Result<&Arc<PeerServer>, &str> {
        self.peer
            .get_or_init(|| {
                let at = match &held.peer_at {
                    Some(a) => a.clone(),
                    None => NodeAddr::Unix(std::env::temp_dir().join(format!(
                        "simpler-peer-{}-{:016x}.sock",
                        std::process::id(),
                        crate::sys::random::u64()
                    ))),
                };
                PeerServer::start(&at, self.key.clone(), self.hello()).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(String::as_str)
    }

    fn unknown(&self, digest: &Digest, name: &str) -> String {
        format!(
            "UNKNOWN_CALLABLE: {digest} (`{name}`) is not registered on the node at {} (register it with Node::register_orch, or make it a #[callable(orch)])",
            self.name
        )
    }

    /// Reads one TASK whose body is `body_len` bytes (the bulk straight into this node's
    /// buffers), runs it, and returns its COMPLETION. The run is in `current` while it runs.
    /// An `Err` is a broken connection (the session ends); everything else, a malformed body
    /// included, is a COMPLETION, with the whole body read so the next frame can be.
    fn task<'a>(
        &'a self,
        held: &Held<'a>,
        r: &mut Source<'_>,
        body_len: usize,
        seq: u64,
        current: &Mutex<InFlight>,
    ) -> std::result::Result<Reply, FrameError> {
        let (head, bulk) = match wire::read_head(r, body_len)? {
            Ok(h) => h,
            Err(e) => return Ok(Reply::failed(wire::BAD_FRAME, e.message())),
        };
        let msg = match wire::decode_task_head(&head, bulk) {
            Ok(m) => m,
            Err(e) => {
                crate::net::frame::skip_part(r, bulk)?;
                return Ok(Reply::failed(wire::BAD_FRAME, e.message()));
            }
        };
        let Some(f) = self.orch.get(&msg.digest) else {
            crate::net::frame::skip_part(r, bulk)?;
            return Ok(Reply::failed(wire::UNKNOWN_CALLABLE, &self.unknown(&msg.digest, &msg.name)));
        };
        let prepared = match self.prepare(held, &msg) {
            Ok(p) => p,
            Err(e) => {
                crate::net::frame::skip_part(r, bulk)?;
                return Ok(Reply::failed(status_of(&e), e.message()));
            }
        };
        // The bulk: each tensor's bytes, in order, into the buffer it belongs in (exactly the
        // bulk: `decode_task_head` checked the lengths add up to it, and `prepare` that only
        // host tensors bring bytes).
        debug_assert_eq!(prepared.incoming.iter().map(|(_, _, l)| *l).sum::<u64>(), bulk);
        for (buf, start, len) in &prepared.incoming {
            r.fill(buf, *start as usize, *len as usize).map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => {
                    FrameError::Malformed(format!("connection closed inside a TASK's tensor data: {e}"))
                }
                _ => FrameError::Io(e),
            })?;
        }
        let Prepared { args, incoming, outgoing, fetched } = prepared;
        // Tensors another node holds: read from it directly, before the run. Each connection
        // is in `current` meanwhile, so a CANCEL (or a root gone) ends a read the other node
        // does not answer at once, rather than after its read timeout.
        let watch = Watched { current, seq };
        for (i, buf, src) in &fetched {
            let fetched = self.client.fetch(src, buf, 0, &watch);
            let cancelled = sync::lock(current).fetched(seq);
            if let Err(e) = fetched {
                let e = if cancelled {
                    Error::new(
                        ErrorKind::Cancelled,
                        format!("the root cancelled the task while tensor {i} was read from another node"),
                    )
                } else {
                    e.context(format!("tensor {i} ({} bytes from another node)", src.len))
                };
                return Ok(Reply::failed(status_of(&e), e.message()));
            }
        }
        // This thread waits for the run, so it drives it (no hop to the node's background
        // thread); the heartbeat thread may cancel it meanwhile.
        let options = RunOptions::new().args(args).config(msg.config.clone());
        let result = held.worker().map_err(Error::state).and_then(|w| {
            w.worker()
                .run_for_parent(
                    options,
                    |orch, a, c| f.call(orch, a, c),
                    |run| {
                        sync::lock(current).start(seq, run);
                    },
                )
                .and_then(|(_, result)| result)
        });
        sync::lock(current).run = None;
        let mut buffers: Vec<Buffer> =
            incoming.into_iter().map(|(b, _, _)| b).chain(fetched.into_iter().map(|(_, b, _)| b)).collect();
        Ok(match result {
            Ok(()) => {
                let spans: Vec<(usize, u64, u64)> =
                    outgoing.iter().map(|(i, _, s, l)| (*i, *s, *l)).collect();
                let head = wire::encode_completion_head(wire::DONE, "", &spans);
                let outputs = outgoing.into_iter().map(|(_, b, _, l)| (b, 0, l)).collect();
                Reply { head, outputs, buffers }
            }
            Err(e) => {
                buffers.clear(); // a failed run's buffers are not reused
                // A cancelled run (the root's CANCEL) stopped the workers running its tasks:
                // the session's next tasks get new ones.
                // Only with no other session on the node: another's run may still hold a
                // lane whose worker died, which a replacement must not reuse under it.
                if let Ok(w) = held.worker()
                    && (w.own() || self.sessions.load(Ordering::Acquire) == 1)
                    && let Err(r) = w.worker().replace_dead_workers()
                {
                    tracing::warn!(target: "simpler::remote", "replacing dead workers after a failed task: {r}");
                }
                Reply::failed(status_of(&e), e.message())
            }
        })
    }

    /// Checks a TASK's tensors against its arguments and finds a buffer of this node for each
    /// one that travels (a reused one when the session has one of that size).
    fn prepare<'a>(&'a self, held: &Held<'a>, msg: &wire::TaskHead<'_>) -> Result<Prepared> {
        let decoded = decode_args(msg.args_blob)?;
        if decoded.tensors.len() != msg.data.len() {
            return Err(Error::decode("a TASK's tensor data does not match its arguments"));
        }
        let mut p = Prepared {
            args: TaskArgs::new(),
            incoming: Vec::new(),
            outgoing: Vec::new(),
            fetched: Vec::new(),
        };
        for (i, t) in decoded.tensors.iter().enumerate() {
            let access = t.desc.access().within_orchestration();
            let resident = matches!(t.desc.backing(), crate::data::buffer::Backing::Device { .. });
            if let (TensorData::Resident, crate::data::buffer::Backing::Device { ptr, .. }) =
                (&msg.data[i], t.desc.backing())
            {
                // A node-resident buffer of this session: the task uses it in place.
                let held_buffers = sync::lock(&held.resident);
                let (buf, _) = held_buffers.get(&ptr).ok_or_else(|| {
                    Error::state(format!(
                        "tensor {i}: node-resident buffer {ptr} does not exist (freed already?)"
                    ))
                })?;
                let tensor = buf.view(t.view)?.narrowed(access)?;
                p.args.add_tensor(&tensor, Tag::for_access(t.desc.access()))?;
                continue;
            }
            // The bytes the view spans arrive with the task or from another node, into a
            // buffer of just that span (the view moved to its start): a tile of a large buffer
            // costs this node the tile, not the buffer.
            let (start, end) = t.view.byte_range();
            let span =
                usize::try_from(end - start).map_err(|_| Error::invalid(format!("tensor {i}: too large")))?;
            let matches = |offset: u64, len: u64| -> Result<()> {
                if offset != start || len != end - start {
                    return Err(Error::decode(format!(
                        "tensor {i}: {len} bytes at {offset}, but its view spans {} bytes at {start}",
                        end - start
                    )));
                }
                Ok(())
            };
            match (&msg.data[i], resident) {
                (TensorData::Bulk { offset, len }, false) => matches(*offset, *len)?,
                (TensorData::Peer(src), true) => {
                    matches(src.offset, src.len)?;
                    if wire::writes(t.desc.access()) {
                        return Err(Error::decode(format!(
                            "tensor {i}: another node's memory sent to be written here (only reads cross nodes)"
                        )));
                    }
                }
                (TensorData::Resident, _) => {
                    return Err(Error::decode(format!(
                        "tensor {i}: host memory of the root sent without its bytes"
                    )));
                }
                (_, true) => {
                    return Err(Error::decode(format!(
                        "tensor {i}: node-resident memory sent with bytes of its own"
                    )));
                }
                (TensorData::Peer(_), false) => {
                    return Err(Error::decode(format!(
                        "tensor {i}: host memory of the root named as another node's"
                    )));
                }
            }
            let view = TensorView::new(0, t.view.shape(), Some(t.view.strides()), t.view.dtype())?;
            let buf = self
                .buffer(held, span.max(1))
                .map_err(|e| e.context(format!("tensor {i} ({span} bytes)")))?;
            let tensor = buf.view(view)?.narrowed(access)?;
            p.args.add_tensor(&tensor, Tag::for_access(t.desc.access()))?;
            match &msg.data[i] {
                TensorData::Peer(src) => p.fetched.push((i, buf, src.clone())),
                _ => {
                    if wire::writes(t.desc.access()) {
                        p.outgoing.push((i, buf.clone(), start, end - start));
                    }
                    p.incoming.push((buf, 0, end - start));
                }
            }
        }
        for &s in &decoded.scalars {
            p.args.scalar(s);
        }
        Ok(p)
    }

    /// A host buffer of `n` bytes: one of that size the session used before (its pages are in
    /// memory already; its bytes outside the task's views are what the session's earlier task
    /// left there), or a new one.
    fn buffer<'a>(&'a self, held: &Held<'a>, n: usize) -> Result<Buffer> {
        let mut pool = sync::lock(&held.pool);
        let best = pool.iter().enumerate().find(|(_, b)| b.nbytes() == n).map(|(at, _)| at);
        match best {
            Some(at) => Ok(pool.swap_remove(at)),
            None => {
                drop(pool);
                held.worker().map_err(Error::state)?.worker().create_buffer(n)
            }
        }
    }

    /// Keeps the buffers of a finished task for the session's next tasks (up to a bound).
    fn recycle(&self, held: &Held<'_>, buffers: Vec<Buffer>) {
        let mut pool = sync::lock(&held.pool);
        for b in buffers {
            let held: usize = pool.iter().map(Buffer::nbytes).sum();
            if pool.len() < POOL_BUFFERS && held + b.nbytes() <= POOL_BYTES {
                pool.push(b);
            }
        }
    }
}

/// Frames up to this size (header included) that wait whole in the socket are taken in one
/// read.
const WHOLE_FRAME: usize = 64 << 10;

/// Where a frame's bytes come from: the socket, or memory (a whole frame taken in one read).
enum Source<'a> {
    Socket(&'a Stream),
    Memory(&'a [u8]),
}

impl std::io::Read for Source<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Source::Socket(s) => (&mut &**s).read(buf),
            Source::Memory(m) => m.read(buf),
        }
    }
}

impl Source<'_> {
    /// The next `len` bytes into `buf` at byte `start`: from the socket straight into the
    /// buffer, or copied from memory.
    fn fill(&mut self, buf: &Buffer, start: usize, len: usize) -> std::io::Result<()> {
        match self {
            Source::Socket(s) => buf.read_from_fd(start, len, s.as_fd()),
            Source::Memory(m) => {
                if m.len() < len {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the frame ends early",
                    ));
                }
                let (now, rest) = m.split_at(len);
                buf.write(start, now).map_err(std::io::Error::other)?;
                *m = rest;
                Ok(())
            }
        }
    }
}

/// Buffers a session keeps for its next tasks: at most this many...
const POOL_BUFFERS: usize = 16;
/// ... holding at most this many bytes.
const POOL_BYTES: usize = 1 << 30;

/// A TASK's arguments on this node, and where its bytes go and come from.
struct Prepared {
    args: TaskArgs,
    /// (buffer, offset in it, length) of each tensor's bytes in the bulk, in order.
    incoming: Vec<(Buffer, u64, u64)>,
    /// (tensor index, buffer, offset in the root's buffer, length) of each written view (its
    /// bytes start the node's buffer).
    outgoing: Vec<(usize, Buffer, u64, u64)>,
    /// (tensor index, buffer, where its bytes are) of each tensor read from another node.
    fetched: Vec<(usize, Buffer, wire::PeerSource)>,
}

/// A COMPLETION to send: its head, then the bytes of each output, from this node's buffers.
struct Reply {
    head: Vec<u8>,
    outputs: Vec<(Buffer, u64, u64)>,
    /// The task's buffers, for the session's next tasks.
    buffers: Vec<Buffer>,
}

impl Reply {
    fn failed(status: u32, message: &str) -> Reply {
        Reply {
            head: wire::encode_completion_head(status, message, &[]),
            outputs: Vec::new(),
            buffers: Vec::new(),
        }
    }

    /// Writes the COMPLETION: small ones in one write, large outputs straight from their
    /// buffers.
    fn send(&self, w: &mut Stream, seq: u64) -> std::io::Result<()> {
        let bulk: u64 = self.outputs.iter().map(|(_, _, l)| *l).sum();
        let body_len = usize::try_from(self.head.len() as u64 + bulk).unwrap_or(usize::MAX);
        if bulk <= SMALL_OUTPUTS {
            let mut body = self.head.clone();
            for (b, start, len) in &self.outputs {
                body.extend_from_slice(
                    &b.read::<u8>(*start as usize, *len as usize).map_err(std::io::Error::other)?,
                );
            }
            return write_frame(w, FrameKind::Completion, seq, &body);
        }
        write_frame_start(w, FrameKind::Completion, seq, body_len, &self.head)?;
        for (b, start, len) in &self.outputs {
            b.send_to_fd(*start as usize, *len as usize, w.as_fd())?;
        }
        Ok(())
    }
}

/// Outputs up to this many bytes go in one write with the head.
const SMALL_OUTPUTS: u64 = 16 << 10;

/// The COMPLETION status of a task that failed with `e`.
fn status_of(e: &Error) -> u32 {
    match e.kind() {
        ErrorKind::WorkerDied => wire::WORKER_DIED,
        ErrorKind::ResourceExhausted => wire::RESOURCE,
        _ => wire::TASK_FAILED,
    }
}

/// How a session ends when reading a frame fails: a clean close or a vanished root is the end
/// of it, anything else an error naming the root.
fn session_end(e: FrameError, peer: &str) -> Result<()> {
    match e {
        FrameError::Closed => Ok(()),
        FrameError::Io(e)
            if matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe) =>
        {
            Ok(()) // the root is gone
        }
        e => Err(Error::new(ErrorKind::WorkerDied, format!("session with {peer}: {e}"))),
    }
}

impl Drop for BoundNode {
    fn drop(&mut self) {
        if let Some(Ok(peer)) = self.peer.get() {
            peer.stop();
        }
        if let Workers::One(w) = &self.workers {
            let _ = w.close();
        }
    }
}

mod sizes;
#[cfg(test)]
mod tests;

/// Task `seq`'s reads from other nodes, watched in `current` (its heartbeat thread ends them).
struct Watched<'a> {
    current: &'a Mutex<InFlight>,
    seq: u64,
}

impl crate::worker::remote::peer::ReadWatch for Watched<'_> {
    fn connecting(&self, cancel: crossbeam_channel::Sender<()>) {
        sync::lock(self.current).connect_on(self.seq, cancel);
    }

    fn reading(&self, stream: &Stream) {
        sync::lock(self.current).fetch_on(self.seq, stream);
    }

    fn read(&self) -> bool {
        !sync::lock(self.current).fetched(self.seq)
    }
}

/// How a read from another node is ended: its connection shut, or its connect abandoned.
enum Ender {
    Read(Stream),
    Connect(crossbeam_channel::Sender<()>),
}

impl Ender {
    fn end(&self) {
        match self {
            Ender::Read(s) => s.shutdown(),
            // Full (asked already) or nobody waiting (the connect ended): either is fine.
            Ender::Connect(cancel) => {
                let _ = cancel.try_send(());
            }
        }
    }
}

/// The task a session runs, for its heartbeat thread to cancel.
#[derive(Default)]
struct InFlight {
    /// The TASK's sequence number and its run, while it runs.
    run: Option<(u64, RunHandle)>,
    /// The TASK's sequence number and how to end its read of a tensor from another node, while
    /// it does (before its run).
    fetching: Option<(u64, Ender)>,
    /// The last task the root asked to cancel (a CANCEL may come before its run started).
    cancelled: Option<u64>,
    /// The root is gone: whatever the session's task does next is cancelled at once.
    gone: bool,
}

impl InFlight {
    /// Task `seq` reads from another node over `stream` now: ended at once if the root asked to
    /// cancel it already.
    fn fetch_on(&mut self, seq: u64, stream: &Stream) {
        match stream.try_clone() {
            Ok(s) => {
                if self.stopped(seq) {
                    s.shutdown();
                }
                self.fetching = Some((seq, Ender::Read(s)));
            }
            // Not watched: the read ends by its own timeout.
            Err(e) => tracing::warn!(target: "simpler::remote", "cannot watch a read from another node: {e}"),
        }
    }

    /// Task `seq` connects to another node for a read now: abandoned at once if the root asked
    /// to cancel it already.
    fn connect_on(&mut self, seq: u64, cancel: crossbeam_channel::Sender<()>) {
        let ender = Ender::Connect(cancel);
        if self.stopped(seq) {
            ender.end();
        }
        self.fetching = Some((seq, ender));
    }

    /// Task `seq`'s read over the watched connection ended (no cancel shuts it from now on);
    /// whether the root cancelled the task meanwhile.
    fn fetched(&mut self, seq: u64) -> bool {
        self.fetching = None;
        self.stopped(seq)
    }

    /// Whether task `seq` is not to go on: the root cancelled it, or is gone.
    fn stopped(&self, seq: u64) -> bool {
        self.gone || self.cancelled == Some(seq)
    }

    /// The root is gone: whatever the task does now ends, and what it does next too.
    fn abandon(&mut self) {
        self.gone = true;
        if let Some((_, run)) = &self.run {
            run.cancel(); // the result has nowhere to go
        }
        if let Some((_, ender)) = &self.fetching {
            ender.end();
        }
    }

    /// Task `seq`'s run started: cancelled at once if the root asked already.
    fn start(&mut self, seq: u64, run: &RunHandle) {
        if self.stopped(seq) {
            run.cancel();
        }
        self.run = Some((seq, run.clone()));
    }

    /// The root asks to cancel task `seq` (its run passed its deadline or was cancelled there):
    /// its run, if it runs now; else when it starts. A task that ended already is not touched.
    fn cancel(&mut self, seq: u64) {
        self.cancelled = Some(seq);
        if let Some((s, run)) = &self.run
            && *s == seq
        {
            run.cancel();
        }
        if let Some((s, ender)) = &self.fetching
            && *s == seq
        {
            ender.end();
        }
    }
}
