//! The node role: a program that serves an L4 root as a remote L3 Worker.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::callable::identity::{CallableHandle, CallableKind, Digest};
use crate::data::buffer::Buffer;
use crate::data::task_args::{Tag, TaskArgs};
use crate::data::wire::decode_args;
use crate::engine::orch_fn::OrchFn;
use crate::engine::run::RunHandle;
use crate::error::{Error, ErrorKind, Result};
use crate::level::Level;
use crate::net::auth::{ClusterKey, NodeHello, server_handshake};
use crate::net::frame::{DEFAULT_MAX_BODY, FrameError, FrameKind, read_frame, write_frame};
use crate::net::transport::{Listener, NodeAddr, Stream};
use crate::sys::sync;
use crate::worker::remote::launch::Launch;
use crate::worker::remote::wire;
use crate::worker::{RunOptions, Worker};

/// How often a node tells its root it is alive.
const HEARTBEAT: Duration = Duration::from_millis(200);

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
/// use simpler::{ClusterKey, Node, NodeAddr, Worker};
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
    worker: Worker,
    addr: NodeAddr,
    key: ClusterKey,
    allow_remote: bool,
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
    /// use simpler::{ClusterKey, ErrorKind, Level, Node, NodeAddr, Worker};
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
        Ok(Node { worker, addr, key, allow_remote: false, orch: HashMap::new() })
    }

    /// Whether the node may listen on an address other than loopback (default `false`: a node
    /// executes code on request, so reaching it from other hosts is a decision).
    ///
    /// ```
    /// # let key = simpler::ClusterKey::new([1u8; 32])?;
    /// # let w = simpler::Worker::builder().build()?;
    /// let node = simpler::Node::new(w, simpler::NodeAddr::parse("0.0.0.0:7402")?, key)?.allow_remote(true);
    /// # drop(node);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn allow_remote(mut self, allow: bool) -> Node {
        self.allow_remote = allow;
        self
    }

    /// Registers an orchestration function the root may send (the root registers the same one
    /// with `register_orch`; they meet by digest).
    ///
    /// ```
    /// use simpler::{CallConfig, ClusterKey, Node, NodeAddr, OrchFn, Orchestrator, TaskArgs, Worker};
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

    /// Starts the L3 Worker and listens; a node is reachable from here on.
    ///
    /// ```no_run
    /// # let key = simpler::ClusterKey::new([1u8; 32])?;
    /// let node = simpler::Node::new(simpler::Worker::builder().build()?, simpler::NodeAddr::loopback(0), key)?;
    /// let bound = node.bind()?;
    /// println!("listening on {}", bound.local_addr()); // the real port when 0 was asked
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn bind(mut self) -> Result<BoundNode> {
        for info in crate::callable::linked::CallableInfo::linked() {
            if info.kind == CallableKind::Orch {
                let f = OrchFn::from_linked(info)?;
                self.orch.entry(f.handle().digest()).or_insert(f);
            }
        }
        let listener = Listener::bind(&self.addr, self.allow_remote)?;
        self.worker.init()?;
        let name = listener.local_addr().to_string();
        Ok(BoundNode {
            worker: self.worker,
            listener: Some(listener),
            key: self.key,
            orch: self.orch,
            name,
            resident: Mutex::new(HashMap::new()),
            next_resident: std::sync::atomic::AtomicU64::new(1),
        })
    }

    /// Serves the root of a launched job (`mpirun`, `srun`): starts the L3 Worker, connects to
    /// the root at `launch.root()` (waiting for it to listen, up to a minute), authenticates,
    /// and serves its session until it ends. The node's own address is not used: it connects
    /// out, so nothing listens on it.
    ///
    /// ```no_run
    /// use simpler::{ClusterKey, Launch, Node, NodeAddr, Worker};
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
        for info in crate::callable::linked::CallableInfo::linked() {
            if info.kind == CallableKind::Orch {
                let f = OrchFn::from_linked(info)?;
                self.orch.entry(f.handle().digest()).or_insert(f);
            }
        }
        self.worker.init()?;
        let node = BoundNode {
            worker: self.worker,
            listener: None,
            key: self.key,
            orch: self.orch,
            name: format!("rank {}", launch.rank()),
            resident: Mutex::new(HashMap::new()),
            next_resident: std::sync::atomic::AtomicU64::new(1),
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
        let hello = NodeHello {
            node_id: u64::from(launch.rank()),
            sub_workers: node.worker.sub_workers() as u32,
            chips: node.worker.chips() as u32,
        };
        let peer = stream.peer();
        server_handshake(&mut stream, &node.key, &hello, &peer)?;
        node.session(stream, &peer)
    }
}

/// A node listening, with its L3 Worker started ([`Node::bind`]).
pub struct BoundNode {
    worker: Worker,
    /// `None` for a node of a launched job, which connects to its root.
    listener: Option<Listener>,
    key: ClusterKey,
    orch: HashMap<Digest, OrchFn>,
    /// How messages name this node (its address, or its rank).
    name: String,
    /// Node-resident buffers of the session, by id (freed when the session ends).
    resident: Mutex<HashMap<u64, Buffer>>,
    next_resident: std::sync::atomic::AtomicU64,
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
    /// # let key = simpler::ClusterKey::new([1u8; 32])?;
    /// # let node = simpler::Node::new(simpler::Worker::builder().build()?, simpler::NodeAddr::loopback(0), key)?;
    /// let bound = node.bind()?;
    /// assert!(bound.local_addr().is_loopback());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn local_addr(&self) -> NodeAddr {
        self.listener.as_ref().expect("a bound node listens").local_addr()
    }

    /// Serves the next root that authenticates, until it ends the session or is lost (its
    /// connection closes: a dead root frees the node's session at once). Connections that fail
    /// the handshake are refused, logged with their address, and waited past.
    ///
    /// ```no_run
    /// # let key = simpler::ClusterKey::new([1u8; 32])?;
    /// # let node = simpler::Node::new(simpler::Worker::builder().build()?, simpler::NodeAddr::loopback(0), key)?;
    /// let bound = node.bind()?;
    /// bound.serve_one()?;
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn serve_one(&self) -> Result<()> {
        let hello = NodeHello {
            node_id: std::process::id() as u64,
            sub_workers: self.worker.sub_workers() as u32,
            chips: self.worker.chips() as u32,
        };
        // Workers a cancelled task of an earlier session left dead come back first.
        if let Err(e) = self.worker.replace_dead_workers() {
            tracing::warn!(target: "simpler::remote", "replacing dead workers before a session: {e}");
        }
        loop {
            let listener = self.listener.as_ref().expect("a bound node listens");
            let (mut stream, peer) = listener.accept().map_err(|e| Error::os("accepting a root", e))?;
            match server_handshake(&mut stream, &self.key, &hello, &peer) {
                Ok(()) => return self.session(stream, &peer),
                Err(e) => {
                    tracing::warn!(target: "simpler::remote", peer = %peer, "refused a connection: {e}");
                    stream.shutdown();
                }
            }
        }
    }

    fn session(&self, stream: Stream, peer: &str) -> Result<()> {
        tracing::info!(target: "simpler::remote", peer = %peer, "session started");
        let writer = Arc::new(Mutex::new(stream.try_clone().map_err(|e| Error::os("cloning a socket", e))?));
        let done = Arc::new(AtomicBool::new(false));
        // The task in flight: the heartbeat thread cancels it when the root is gone (its
        // heartbeat cannot be written), since this thread is busy running it.
        let current: Arc<Mutex<Option<RunHandle>>> = Arc::new(Mutex::new(None));
        let beat = {
            let (writer, done, current) = (writer.clone(), done.clone(), current.clone());
            std::thread::Builder::new()
                .name("simpler-heartbeat".into())
                .spawn(move || {
                    while !done.load(Ordering::Acquire) {
                        if write_frame(&mut *sync::lock(&writer), FrameKind::Health, 0, &[]).is_err() {
                            if let Some(run) = sync::lock(&current).as_ref() {
                                run.cancel(); // the root is gone: the result has nowhere to go
                            }
                            return;
                        }
                        std::thread::park_timeout(HEARTBEAT);
                    }
                })
                .map_err(|e| Error::os("starting the heartbeat thread", e))?
        };
        let mut reader = stream;
        let result = loop {
            let frame = match read_frame(&mut reader, DEFAULT_MAX_BODY) {
                Ok(f) => f,
                Err(FrameError::Closed) => break Ok(()),
                Err(FrameError::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
                    ) =>
                {
                    break Ok(()); // the root is gone
                }
                Err(e) => break Err(Error::new(ErrorKind::WorkerDied, format!("session with {peer}: {e}"))),
            };
            let reply = match frame.kind {
                FrameKind::Task => (FrameKind::Completion, self.task(&frame.body, &current)),
                FrameKind::Control => (FrameKind::ControlReply, self.control(&frame.body)),
                FrameKind::Shutdown => break Ok(()),
                FrameKind::Health => continue,
                other => {
                    break Err(Error::new(
                        ErrorKind::InvalidArgument,
                        format!("session with {peer}: unexpected {other:?} frame"),
                    ));
                }
            };
            if let Err(e) = write_frame(&mut *sync::lock(&writer), reply.0, frame.seq, &reply.1) {
                // The root is gone (its end of the connection closed): the session is over.
                tracing::info!(target: "simpler::remote", peer = %peer, "the root is gone: {e}");
                break Ok(());
            }
        };
        done.store(true, Ordering::Release);
        beat.thread().unpark();
        sync::lock(&writer).shutdown();
        let _ = beat.join();
        sync::lock(&self.resident).clear(); // what the session held goes with it
        tracing::info!(target: "simpler::remote", peer = %peer, "session ended");
        result
    }

    fn control(&self, body: &[u8]) -> Vec<u8> {
        let result = match wire::decode_control(body) {
            Ok(m) => match m.command {
                wire::CHECK_CALLABLE if self.orch.contains_key(&m.digest) => Ok(Vec::new()),
                wire::CHECK_CALLABLE => Err(self.unknown(&m.digest, &m.name)),
                wire::ALLOC => self.alloc_resident(m.arg),
                wire::COPY_TO => self.with_resident(m.arg, |b| {
                    if m.data.len() > b.nbytes() {
                        return Err(format!("{} bytes do not fit in its {} bytes", m.data.len(), b.nbytes()));
                    }
                    b.write(0, m.data).map(|()| Vec::new()).map_err(|e| e.to_string())
                }),
                wire::COPY_FROM => self.with_resident(m.arg, |b| {
                    let n = usize::try_from(m.arg2).unwrap_or(usize::MAX);
                    if n > b.nbytes() {
                        return Err(format!("{n} bytes asked of its {} bytes", b.nbytes()));
                    }
                    b.read::<u8>(0, n).map_err(|e| e.to_string())
                }),
                wire::FREE => match sync::lock(&self.resident).remove(&m.arg) {
                    Some(_) => Ok(Vec::new()),
                    None => Err(format!("node-resident buffer {} does not exist (freed already?)", m.arg)),
                },
                other => Err(format!("unknown control command {other}")),
            },
            Err(e) => Err(e.to_string()),
        };
        wire::encode_reply(&result)
    }

    /// Allocates a node-resident buffer of `nbytes`; its id as the reply.
    fn alloc_resident(&self, nbytes: u64) -> std::result::Result<Vec<u8>, String> {
        let n = usize::try_from(nbytes).map_err(|_| format!("{nbytes} bytes do not fit this node"))?;
        let buf = self.worker.create_buffer(n.max(1)).map_err(|e| match e.kind() {
            ErrorKind::ResourceExhausted => format!("RESOURCE: {}", e.message()),
            _ => e.message().to_string(),
        })?;
        let id = self.next_resident.fetch_add(1, Ordering::Relaxed);
        sync::lock(&self.resident).insert(id, buf);
        Ok(id.to_le_bytes().to_vec())
    }

    fn with_resident(
        &self,
        id: u64,
        f: impl FnOnce(&Buffer) -> std::result::Result<Vec<u8>, String>,
    ) -> std::result::Result<Vec<u8>, String> {
        match sync::lock(&self.resident).get(&id) {
            Some(b) => f(b),
            None => Err(format!("node-resident buffer {id} does not exist (freed already?)")),
        }
    }

    fn unknown(&self, digest: &Digest, name: &str) -> String {
        format!(
            "UNKNOWN_CALLABLE: {digest} (`{name}`) is not registered on the node at {} (register it with Node::register_orch, or make it a #[callable(orch)])",
            self.name
        )
    }

    /// Runs one TASK; returns the COMPLETION body. The run is in `current` while it runs.
    fn task(&self, body: &[u8], current: &Mutex<Option<RunHandle>>) -> Vec<u8> {
        let msg = match wire::decode_task(body) {
            Ok(m) => m,
            Err(e) => return wire::encode_completion(wire::BAD_FRAME, &e.to_string(), &[]),
        };
        let Some(f) = self.orch.get(&msg.digest) else {
            return wire::encode_completion(
                wire::UNKNOWN_CALLABLE,
                &self.unknown(&msg.digest, &msg.name),
                &[],
            );
        };
        match self.run_task(f, &msg, current) {
            Ok(outputs) => wire::encode_completion(wire::DONE, "", &outputs),
            Err(e) => {
                let status = match e.kind() {
                    ErrorKind::WorkerDied => wire::WORKER_DIED,
                    ErrorKind::ResourceExhausted => wire::RESOURCE,
                    _ => wire::TASK_FAILED,
                };
                wire::encode_completion(status, e.message(), &[])
            }
        }
    }

    /// Fills a buffer of this node per tensor (the bytes its view spans), runs `f` on the L3
    /// Worker, and returns the bytes every written view spans.
    fn run_task(
        &self,
        f: &OrchFn,
        msg: &wire::TaskMsg<'_>,
        current: &Mutex<Option<RunHandle>>,
    ) -> Result<Vec<(usize, u64, Vec<u8>)>> {
        let decoded = decode_args(msg.args_blob)?;
        if decoded.tensors.len() != msg.data.len() {
            return Err(Error::decode("a TASK's tensor data does not match its arguments"));
        }
        let mut buffers: Vec<(usize, Buffer, (u64, u64))> = Vec::new();
        let mut args = TaskArgs::new();
        for (i, t) in decoded.tensors.iter().enumerate() {
            if let crate::data::buffer::Backing::Device { ptr, .. } = t.desc.backing() {
                // A node-resident buffer: the task uses it in place.
                let resident = sync::lock(&self.resident);
                let buf = resident.get(&ptr).ok_or_else(|| {
                    Error::state(format!(
                        "tensor {i}: node-resident buffer {ptr} does not exist (freed already?)"
                    ))
                })?;
                let access = t.desc.access().within_orchestration();
                let tensor = buf.view(t.view)?.narrowed(access)?;
                args.add_tensor(&tensor, Tag::for_access(t.desc.access()))?;
                continue;
            }
            let n = usize::try_from(t.desc.nbytes()).map_err(|_| Error::invalid("tensor too large"))?;
            let buf = self.worker.create_buffer(n.max(1))?;
            // The bytes the view spans arrive with the task; the rest of the buffer is unused.
            let (start, end) = t.view.byte_range();
            if let Some((offset, bytes)) = msg.data[i] {
                if offset != start || bytes.len() as u64 != end - start {
                    return Err(Error::decode(format!(
                        "tensor {i}: {} bytes at {offset}, but its view spans {} bytes at {start}",
                        bytes.len(),
                        end - start
                    )));
                }
                buf.write(start as usize, bytes)?;
            }
            let access = t.desc.access().within_orchestration();
            let tensor = buf.view(t.view)?.narrowed(access)?;
            args.add_tensor(&tensor, Tag::for_access(t.desc.access()))?;
            if wire::writes(t.desc.access()) {
                buffers.push((i, buf, (start, end)));
            }
        }
        for &s in &decoded.scalars {
            args.scalar(s);
        }
        let run = self
            .worker
            .submit_with(RunOptions::new().args(args).config(msg.config.clone()), |orch, a, c| {
                f.call(orch, a, c)
            })?;
        *sync::lock(current) = Some(run.clone());
        let result = run.wait();
        *sync::lock(current) = None;
        result?;
        buffers
            .into_iter()
            .map(|(i, b, (start, end))| Ok((i, start, b.read::<u8>(start as usize, (end - start) as usize)?)))
            .collect()
    }
}

impl Drop for BoundNode {
    fn drop(&mut self) {
        let _ = self.worker.close();
    }
}
