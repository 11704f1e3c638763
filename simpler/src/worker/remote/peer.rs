//! Node-to-node data: a tensor that lives on one node (node-resident there) and is read by a
//! task on another goes straight between the two nodes, not through the root.
//!
//! * **Grants.** When a node allocates a node-resident buffer (the root's `ALLOC` control) it
//!   draws a random [`Grant`] for it and answers the root with the buffer's id, the grant and
//!   the address of its peer listener. The grant is what names the buffer to another node:
//!   unguessable (128 random bits), valid while the buffer lives (a `FREE`, or the end of its
//!   session, revokes it), and given only to the root that owns the buffer, which hands it to
//!   the node of a task that reads the tensor, inside that task's TASK.
//! * **The peer listener** ([`PeerServer`]): started by a node the first time one of its
//!   sessions allocates, on the address its session reached it at (the same interface, port
//!   0: any free one), or a fresh Unix socket when the session came over one. Each connection
//!   proves the cluster key with the same challenge-response as a root's (`net::auth`), then
//!   asks for bytes: `PEER_READ` controls (offset, length, grant), each answered with the
//!   bytes straight from the buffer (`SharedMem::send_to_fd`, rule N3 of `sys::shm`) or a
//!   refusal naming why (an unknown or revoked grant, a range outside the buffer). At most
//!   [`MAX_PEERS`] connections at once; one over that ends the oldest connection still in its
//!   handshake (a silent peer holds back no honest one), or is refused when none is.
//! * **The reading node** ([`PeerClient`]): before it runs a task with such a tensor it reads
//!   the view's bytes into a buffer of its own (straight from the socket, rule N2 of
//!   `sys::shm`), in parts of at most [`COPY_PART`] bytes, over a connection it keeps for the
//!   next task (one per peer; a kept connection that went stale is replaced once). A read that
//!   fails fails the task, naming the peer and what went wrong; the session goes on.
//!
//! The root orders everything: a task reading the tensor runs only after the task that wrote
//! it ended (and a later writer only after the readers ended), as for any tensor, so a peer read
//! never races a write. Only reads cross nodes: a task may not write another node's memory
//! (refused at submit).

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::callable::identity::Digest;
use crate::data::buffer::Buffer;
use crate::error::{Error, ErrorKind, Result};
use crate::net::auth::{ClusterKey, Handshake, NodeHello, client_handshake, server_handshake};
use crate::net::frame::{FrameKind, read_body, read_frame_head, read_part, write_frame, write_frame_start};
use crate::net::transport::{Listener, NodeAddr, Stream};
use crate::sys::sync;
use crate::worker::remote::wire::{self, COPY_PART, PeerSource};

/// The length of a grant.
pub(crate) const GRANT_LEN: usize = 16;

/// What names a node-resident buffer to another node.
pub(crate) type Grant = [u8; GRANT_LEN];

/// Most peer connections a node serves at once.
pub(crate) const MAX_PEERS: usize = 64;

/// A peer connection silent this long between requests is closed (the reading node opens a new
/// one when it needs it).
const PEER_IDLE: Duration = Duration::from_secs(60);

/// How long a reading node waits for each part of the bytes it asked for.
const PEER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a reading node waits to connect to a peer. A cancel ends the wait at once
/// ([`ReadWatch::connecting`]), so a peer that went off the network holds a cancelled read
/// no longer than the root's cancel grace.
const PEER_CONNECT: Duration = Duration::from_secs(5);

/// One connection the server holds: a handle to end it by, its handshake's claim.
struct Conn {
    id: u64,
    stream: Stream,
    state: Arc<Handshake>,
}

/// A node's peer listener: serves the bytes of its granted node-resident buffers to other
/// nodes that prove the cluster key.
pub(crate) struct PeerServer {
    /// Where other nodes connect (as `NodeAddr` writes it).
    addr: String,
    grants: Mutex<HashMap<Grant, Buffer>>,
    conns: Mutex<Vec<Conn>>,
    stop: AtomicBool,
    next: AtomicU64,
    /// Written to wake the accept thread when the server stops.
    wake: std::os::unix::net::UnixStream,
    accept: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl PeerServer {
    /// Listens at `at` (port 0 or a fresh socket path) and serves on a thread of its own.
    pub(crate) fn start(at: &NodeAddr, key: ClusterKey, hello: NodeHello) -> Result<Arc<PeerServer>> {
        let listener = Listener::bind(at, true)?;
        let (wake_rx, wake) =
            std::os::unix::net::UnixStream::pair().map_err(|e| Error::os("making a wake-up pipe", e))?;
        let server = Arc::new(PeerServer {
            addr: listener.local_addr().to_string(),
            grants: Mutex::new(HashMap::new()),
            conns: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            next: AtomicU64::new(0),
            wake,
            accept: Mutex::new(None),
        });
        let s = server.clone();
        let handle = std::thread::Builder::new()
            .name("simpler-peer-accept".into())
            .spawn(move || s.accept_loop(&listener, &wake_rx, &key, &hello))
            .map_err(|e| Error::os("starting the peer listener's thread", e))?;
        *sync::lock(&server.accept) = Some(handle);
        tracing::info!(target: "simpler::remote", addr = %server.addr, "peer listener started");
        Ok(server)
    }

    /// Where other nodes reach it.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// A fresh grant for `buf`, valid until [`revoke`](PeerServer::revoke)d.
    pub(crate) fn grant(&self, buf: &Buffer) -> Result<Grant> {
        let g: Grant = crate::sys::random::bytes("a buffer grant")?;
        sync::lock(&self.grants).insert(g, buf.clone());
        Ok(g)
    }

    /// Ends `grant`: its buffer is no longer served.
    pub(crate) fn revoke(&self, grant: &Grant) {
        sync::lock(&self.grants).remove(grant);
    }

    /// How many grants are live (tests).
    #[cfg(test)]
    pub(crate) fn grants(&self) -> usize {
        sync::lock(&self.grants).len()
    }

    /// Stops listening, ends every connection and revokes every grant (a connection's thread
    /// ends at once, and no buffer stays mapped for it); returns once the accept thread ended.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = std::io::Write::write(&mut &self.wake, &[1]);
        // The accept thread adds a connection under this lock only while `stop` is unset, so
        // every connection it keeps is ended here.
        for c in sync::lock(&self.conns).iter() {
            c.stream.shutdown();
        }
        sync::lock(&self.grants).clear();
        if let Some(h) = sync::lock(&self.accept).take() {
            let _ = h.join();
        }
    }

    fn accept_loop(
        self: &Arc<Self>,
        listener: &Listener,
        wake: &std::os::unix::net::UnixStream,
        key: &ClusterKey,
        hello: &NodeHello,
    ) {
        while !self.stop.load(Ordering::Acquire) {
            let mut fds = [
                nix::poll::PollFd::new(listener.as_fd(), nix::poll::PollFlags::POLLIN),
                nix::poll::PollFd::new(wake.as_fd(), nix::poll::PollFlags::POLLIN),
            ];
            match nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => {
                    tracing::warn!(target: "simpler::remote", "the peer listener stops: poll: {e}");
                    return;
                }
            }
            let ready = fds[0].revents().is_some_and(|r| !r.is_empty());
            if self.stop.load(Ordering::Acquire) || !ready {
                continue;
            }
            let (stream, peer) = match listener.accept() {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(target: "simpler::remote", "accepting a peer connection failed: {e}");
                    // A descriptor shortage: a moment's pause rather than a spin.
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            if !self.make_room() {
                tracing::warn!(target: "simpler::remote", peer = %peer, "refused a peer connection: {MAX_PEERS} peers connected");
                stream.shutdown();
                continue;
            }
            let Ok(handle) = stream.try_clone() else {
                stream.shutdown();
                continue;
            };
            let id = self.next.fetch_add(1, Ordering::Relaxed);
            let state = Arc::new(Handshake::default());
            {
                let mut conns = sync::lock(&self.conns);
                // Checked under the lock `stop` ends connections under: a connection accepted
                // while the server stops is ended here, not served.
                if self.stop.load(Ordering::Acquire) {
                    stream.shutdown();
                    break;
                }
                conns.push(Conn { id, stream: handle, state: state.clone() });
            }
            let (s, key, hello) = (self.clone(), key.clone(), hello.clone());
            let spawned = std::thread::Builder::new().name("simpler-peer".into()).spawn(move || {
                s.serve(stream, &peer, &key, &hello, &state);
                sync::lock(&s.conns).retain(|c| c.id != id);
            });
            if let Err(e) = spawned {
                tracing::warn!(target: "simpler::remote", "refused a peer connection: no thread for it: {e}");
                sync::lock(&self.conns).retain(|c| c.id != id);
            }
        }
    }

    /// Whether a new connection may be served: under [`MAX_PEERS`], or after ending the oldest
    /// connection still in its handshake.
    fn make_room(&self) -> bool {
        let mut conns = sync::lock(&self.conns);
        if conns.len() < MAX_PEERS {
            return true;
        }
        match conns.iter().position(|c| c.state.end()) {
            Some(at) => {
                let oldest = conns.remove(at);
                tracing::warn!(target: "simpler::remote", "ended the oldest pending peer handshake to make room ({MAX_PEERS} peers)");
                oldest.stream.shutdown();
                true
            }
            None => false,
        }
    }

    /// One peer connection: the handshake, then its reads until it closes or idles.
    fn serve(&self, mut stream: Stream, peer: &str, key: &ClusterKey, hello: &NodeHello, state: &Handshake) {
        if let Err(e) = server_handshake(&mut stream, key, hello, peer) {
            tracing::warn!(target: "simpler::remote", peer = %peer, "refused a peer connection: {e}");
            stream.shutdown();
            return;
        }
        if !state.finish() {
            return; // ended to make room meanwhile
        }
        loop {
            if stream.set_read_timeout(Some(PEER_IDLE)).is_err() {
                break;
            }
            let head = match read_frame_head(&mut &stream, 4096) {
                Ok(h) if h.kind == FrameKind::Control => h,
                Ok(h) => {
                    tracing::warn!(target: "simpler::remote", peer = %peer, "a peer sent a {:?} frame: closing", h.kind);
                    break;
                }
                Err(_) => break, // closed, idle, or malformed: the peer connects again if it needs
            };
            let Ok(body) = read_body(&mut &stream, head) else { break };
            let answered = match self.read(&body) {
                Ok((buf, at, len)) => {
                    // The bytes go straight from the buffer to the socket, after a head that
                    // says how many (a CONTROL_REPLY's encoding: status 0, then the bytes).
                    let mut lead = [0u8; 8];
                    lead[4..].copy_from_slice(&(len as u32).to_le_bytes());
                    write_frame_start(&mut &stream, FrameKind::ControlReply, head.seq, 8 + len, &lead)
                        .and_then(|()| buf.send_to_fd(at, len, stream.as_fd()))
                }
                Err(why) => {
                    tracing::debug!(target: "simpler::remote", peer = %peer, "refused a peer read: {why}");
                    write_frame(
                        &mut &stream,
                        FrameKind::ControlReply,
                        head.seq,
                        &wire::encode_reply(&Err(why)),
                    )
                }
            };
            if answered.is_err() {
                break;
            }
        }
        stream.shutdown();
    }

    /// The buffer and range a `PEER_READ` body asks for, or why not.
    fn read(&self, body: &[u8]) -> std::result::Result<(Buffer, usize, usize), String> {
        let m = wire::decode_control(body).map_err(|e| e.to_string())?;
        if m.command != wire::PEER_READ {
            return Err(format!("unknown peer command {}", m.command));
        }
        let grant: Grant = m.data.try_into().map_err(|_| format!("a grant of {} bytes", m.data.len()))?;
        let buf = sync::lock(&self.grants).get(&grant).cloned().ok_or_else(|| {
            "no node-resident buffer of this node has that grant (freed already, or its session ended)"
                .to_string()
        })?;
        let (at, len) =
            (usize::try_from(m.arg).unwrap_or(usize::MAX), usize::try_from(m.arg2).unwrap_or(usize::MAX));
        if len > COPY_PART || at.checked_add(len).is_none_or(|end| end > buf.nbytes()) {
            return Err(format!("{len} bytes at offset {at} asked of a buffer of {} bytes", buf.nbytes()));
        }
        Ok((buf, at, len))
    }
}

impl std::fmt::Debug for PeerServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerServer").field("addr", &self.addr).finish()
    }
}

/// Who may end a read from another node while it waits (a task the root cancels).
pub(crate) trait ReadWatch {
    /// A connection for the read is being made: a message on `cancel` abandons it at once.
    fn connecting(&self, cancel: crossbeam_channel::Sender<()>);
    /// The read goes over `stream` from now on: shutting it down ends the read at once.
    fn reading(&self, stream: &Stream);
    /// A part was read over it, which nothing may shut from now on: whether the reader still
    /// wants the connection. Only then is it kept for the next read, so a connection a cancel
    /// shut (or might still shut) is never reused.
    fn read(&self) -> bool;
}

/// Nobody ends the read.
impl ReadWatch for () {
    fn connecting(&self, _: crossbeam_channel::Sender<()>) {}
    fn reading(&self, _: &Stream) {}
    fn read(&self) -> bool {
        true
    }
}

/// A node's side of reading other nodes' buffers: one kept connection per peer.
pub(crate) struct PeerClient {
    key: ClusterKey,
    idle: Mutex<HashMap<String, Stream>>,
    seq: AtomicU64,
}

impl PeerClient {
    pub(crate) fn new(key: ClusterKey) -> PeerClient {
        PeerClient { key, idle: Mutex::new(HashMap::new()), seq: AtomicU64::new(1) }
    }

    /// Reads the bytes `src` names into `into` from byte `at` on, from the node that holds
    /// them. Errors name the peer. `watch` is shown each connection before anything is read
    /// from it, and told when a part was read (see [`ReadWatch`]).
    pub(crate) fn fetch(
        &self,
        src: &PeerSource,
        into: &Buffer,
        at: usize,
        watch: &dyn ReadWatch,
    ) -> Result<()> {
        let len = usize::try_from(src.len).map_err(|_| Error::invalid("too large"))?;
        let mut done = 0;
        while done < len {
            let part = COPY_PART.min(len - done);
            self.part(src, src.offset + done as u64, part, into, at + done, watch)?;
            done += part;
        }
        Ok(())
    }

    /// One part, over the kept connection (replaced once if it went stale) or a new one.
    fn part(
        &self,
        src: &PeerSource,
        offset: u64,
        len: usize,
        into: &Buffer,
        at: usize,
        watch: &dyn ReadWatch,
    ) -> Result<()> {
        let kept = sync::lock(&self.idle).remove(&src.addr);
        let reused = kept.is_some();
        let stream = match kept {
            Some(s) => {
                watch.reading(&s);
                s
            }
            None => self.connect(&src.addr, watch)?,
        };
        let keep = |s: Stream| {
            if watch.read() {
                sync::lock(&self.idle).insert(src.addr.clone(), s);
            } else {
                s.shutdown();
            }
        };
        match self.ask(&stream, src, offset, len, into, at) {
            Ok(()) => {
                keep(stream);
                Ok(())
            }
            // The peer closed a kept connection (it idled out): once more on a new one.
            Err(Failure::Connection(_)) if reused => {
                stream.shutdown();
                let fresh = self.connect(&src.addr, watch)?;
                match self.ask(&fresh, src, offset, len, into, at) {
                    Ok(()) => {
                        keep(fresh);
                        Ok(())
                    }
                    Err(f) => {
                        fresh.shutdown();
                        Err(f.into_error(&src.addr))
                    }
                }
            }
            Err(f) => {
                stream.shutdown();
                Err(f.into_error(&src.addr))
            }
        }
    }

    fn connect(&self, addr: &str, watch: &dyn ReadWatch) -> Result<Stream> {
        let at = NodeAddr::parse(addr)?;
        let (cancel, cancelled) = crossbeam_channel::bounded(1);
        watch.connecting(cancel);
        let made = Stream::connect_cancellable(&at, PEER_CONNECT, &cancelled).map_err(|e| {
            Error::new(
                ErrorKind::WorkerDied,
                format!("cannot connect to the node at {addr} (its peer listener): {e}"),
            )
        })?;
        let Some(mut s) = made else {
            return Err(Error::new(
                ErrorKind::Cancelled,
                format!("the read from the node at {addr} was cancelled while connecting to it"),
            ));
        };
        watch.reading(&s);
        client_handshake(&mut s, &self.key, addr)?;
        Ok(s)
    }

    fn ask(
        &self,
        stream: &Stream,
        src: &PeerSource,
        offset: u64,
        len: usize,
        into: &Buffer,
        at: usize,
    ) -> std::result::Result<(), Failure> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let body = wire::encode_control(
            wire::PEER_READ,
            &Digest::from_bytes([0; 32]),
            "",
            offset,
            len as u64,
            &src.grant,
        );
        stream.set_read_timeout(Some(PEER_READ_TIMEOUT)).map_err(|e| Failure::Connection(e.to_string()))?;
        write_frame(&mut &*stream, FrameKind::Control, seq, &body)
            .map_err(|e| Failure::Connection(e.to_string()))?;
        let head =
            read_frame_head(&mut &*stream, COPY_PART + 64).map_err(|e| Failure::Connection(e.to_string()))?;
        if head.kind != FrameKind::ControlReply || head.seq != seq {
            return Err(Failure::Protocol(format!(
                "answered a read with a {:?} frame numbered {} (expected {seq})",
                head.kind, head.seq
            )));
        }
        let mut lead = [0u8; 8];
        if head.len < 8 {
            return Err(Failure::Protocol(format!("a reply of {} bytes", head.len)));
        }
        read_part(&mut &*stream, &mut lead).map_err(|e| Failure::Connection(e.to_string()))?;
        let status = u32::from_le_bytes(lead[..4].try_into().expect("4 bytes"));
        let n = u32::from_le_bytes(lead[4..].try_into().expect("4 bytes")) as usize;
        if n != head.len - 8 {
            return Err(Failure::Protocol(format!(
                "a reply whose {n} bytes do not fill its {} bytes",
                head.len - 8
            )));
        }
        if status != 0 {
            let mut why = vec![0u8; n];
            read_part(&mut &*stream, &mut why).map_err(|e| Failure::Connection(e.to_string()))?;
            return Err(Failure::Refused(String::from_utf8_lossy(&why).into_owned()));
        }
        if n != len {
            return Err(Failure::Protocol(format!("sent {n} bytes for {len} asked")));
        }
        into.read_from_fd(at, len, stream.as_fd()).map_err(|e| Failure::Connection(e.to_string()))
    }
}

/// How a peer read failed.
enum Failure {
    /// The connection failed or closed.
    Connection(String),
    /// The peer answered with something that is not an answer.
    Protocol(String),
    /// The peer refused (an unknown grant, a range outside the buffer).
    Refused(String),
}

impl Failure {
    fn into_error(self, addr: &str) -> Error {
        match self {
            Failure::Connection(e) => {
                Error::new(ErrorKind::WorkerDied, format!("reading from the node at {addr} failed: {e}"))
            }
            Failure::Protocol(e) => Error::decode(format!("the node at {addr} {e}")),
            Failure::Refused(e) => Error::state(format!("the node at {addr} refused the read: {e}")),
        }
    }
}

/// The root's book of where other nodes read each node-resident buffer: by (remote worker,
/// buffer id), the owning node's peer address and the buffer's grant.
#[derive(Debug, Default)]
pub(crate) struct PeerBook(Mutex<HashMap<(u32, u64), (String, Grant)>>);

impl PeerBook {
    /// Buffer `ptr` of `worker` is read at `addr` with `grant`.
    pub(crate) fn record(&self, worker: u32, ptr: u64, addr: String, grant: Grant) {
        sync::lock(&self.0).insert((worker, ptr), (addr, grant));
    }

    /// Buffer `ptr` of `worker` was freed.
    pub(crate) fn forget(&self, worker: u32, ptr: u64) {
        sync::lock(&self.0).remove(&(worker, ptr));
    }

    /// Every buffer of `worker` is gone (its session was lost and replaced).
    pub(crate) fn forget_worker(&self, worker: u32) {
        sync::lock(&self.0).retain(|(w, _), _| *w != worker);
    }

    /// Where buffer `ptr` of `worker` is read from another node.
    pub(crate) fn get(&self, worker: u32, ptr: u64) -> Option<(String, Grant)> {
        sync::lock(&self.0).get(&(worker, ptr)).cloned()
    }
}

/// Reads an `ALLOC` reply: the buffer's id, and when the node serves its buffers to other
/// nodes, the grant and the node's peer address.
pub(crate) fn decode_alloc(reply: &[u8]) -> Result<(u64, Option<(String, Grant)>)> {
    let bad = || Error::decode(format!("a node answered an allocation with {} bytes", reply.len()));
    let id = u64::from_le_bytes(reply.get(..8).ok_or_else(bad)?.try_into().expect("8 bytes"));
    let rest = &reply[8..];
    if rest.is_empty() {
        return Ok((id, None));
    }
    let grant: Grant = rest.get(..GRANT_LEN).ok_or_else(bad)?.try_into().expect("GRANT_LEN bytes");
    let addr = std::str::from_utf8(&rest[GRANT_LEN..]).map_err(|_| bad())?;
    if addr.is_empty() {
        return Err(bad());
    }
    Ok((id, Some((addr.to_string(), grant))))
}

#[cfg(test)]
mod tests;
