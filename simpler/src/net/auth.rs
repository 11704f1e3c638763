//! The cluster key and the mutual challenge-response handshake (the HELLO frames).
//!
//! Both sides prove that they hold the [`ClusterKey`] without sending it, each over a fresh
//! nonce of the other's choosing, so a recorded HELLO is worthless in a later session; the
//! labels "root" and "node" in the MACs keep one side's proof from being reflected back as the
//! other's. The steps and body layouts are in the module docs of [`crate::net`]. A
//! [`ClusterKey`] has no default: it comes from the program or from `SIMPLER_CLUSTER_KEY`.

use std::fmt;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::frame::{
    BodyReader, BodyWriter, Frame, FrameError, FrameKind, MAX_HELLO_BODY, PROTOCOL_VERSION, read_frame,
    write_frame,
};
use super::transport::Stream;
use crate::error::{Error, ErrorKind, Result};

/// The environment variable [`ClusterKey::from_env`] reads.
pub(crate) const CLUSTER_KEY_ENV: &str = "SIMPLER_CLUSTER_KEY";
/// The shortest cluster key accepted, in bytes.
pub(crate) const MIN_KEY_LEN: usize = 16;
/// How long each side waits for the other's next HELLO.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The size of each side's nonce.
pub(crate) const NONCE_LEN: usize = 32;
/// The size of an HMAC-SHA256 tag.
pub(crate) const MAC_LEN: usize = 32;

/// HELLO step: the node's challenge (`nonce_n`).
const STEP_CHALLENGE: u8 = 1;
/// HELLO step: the root's answer (`nonce_r`, `mac_r`).
const STEP_RESPONSE: u8 = 2;
/// HELLO step: the node's proof and what it offers (`mac_n`, node id, SUB workers, chips, pid).
const STEP_READY: u8 = 3;
/// HELLO step: "refused", with nothing more said.
const STEP_REFUSED: u8 = 4;

const ROOT_LABEL: &[u8] = b"simpler-hello-v1|root";
const NODE_LABEL: &[u8] = b"simpler-hello-v1|node";

type HmacSha256 = Hmac<Sha256>;

/// The cluster's shared secret, which every root and node of a cluster holds. No default: a
/// node refuses to start without one. `Debug` never shows it.
#[derive(Clone)]
pub struct ClusterKey(std::sync::Arc<[u8]>);

impl ClusterKey {
    /// A key of the bytes of `secret`, which must be at least 16 bytes long (else
    /// `ErrorKind::InvalidArgument`, naming the length and the minimum).
    pub fn new(secret: impl AsRef<[u8]>) -> Result<ClusterKey> {
        let secret = secret.as_ref();
        if secret.len() < MIN_KEY_LEN {
            return Err(Error::invalid(format!(
                "a cluster key of {} bytes is too short: it must be at least {MIN_KEY_LEN} bytes",
                secret.len()
            )));
        }
        Ok(ClusterKey(secret.into()))
    }

    /// The key's bytes (for a Worker's start spec, which carries it to the process of a nested
    /// Worker with remote Workers).
    pub(crate) fn secret(&self) -> &[u8] {
        &self.0
    }

    /// The key in the environment variable `SIMPLER_CLUSTER_KEY` (its bytes, at least 16); an
    /// `ErrorKind::InvalidArgument` naming the variable when it is unset, empty or short.
    pub fn from_env() -> Result<ClusterKey> {
        ClusterKey::from_env_value(std::env::var_os(CLUSTER_KEY_ENV))
    }

    fn from_env_value(value: Option<std::ffi::OsString>) -> Result<ClusterKey> {
        use std::os::unix::ffi::OsStrExt;
        let Some(value) = value else {
            return Err(Error::invalid(format!(
                "{CLUSTER_KEY_ENV} is not set: the root and its nodes need a shared cluster key of at \
                 least {MIN_KEY_LEN} bytes"
            )));
        };
        ClusterKey::new(value.as_bytes()).map_err(|e| e.context(CLUSTER_KEY_ENV))
    }

    /// HMAC-SHA256 under this key of `label` followed by `parts`.
    fn mac(&self, label: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
        self.hmac(label, parts).finalize().into_bytes().into()
    }

    /// True when `tag` is the MAC of `label` and `parts` (compared in constant time).
    fn verify(&self, label: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
        self.hmac(label, parts).verify_slice(tag).is_ok()
    }

    fn hmac(&self, label: &[u8], parts: &[&[u8]]) -> HmacSha256 {
        let mut m = HmacSha256::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        m.update(label);
        for p in parts {
            m.update(p);
        }
        m
    }
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

/// What a node tells the root once authenticated (its HELLO READY).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeHello {
    /// The node's id, as its operator configured it.
    pub(crate) node_id: u64,
    /// The SUB workers it runs.
    pub(crate) sub_workers: u32,
    /// The chips it drives.
    pub(crate) chips: u32,
    /// The node's process id on its host (what the root's `Worker::workers` reports).
    pub(crate) pid: u32,
}

/// `NONCE_LEN` bytes from the kernel's random source.
fn nonce() -> Result<[u8; NONCE_LEN]> {
    crate::sys::random::bytes("a handshake nonce")
}

/// The body of a node's challenge.
fn challenge_body(nonce_n: &[u8; NONCE_LEN]) -> Vec<u8> {
    let mut w = BodyWriter::with_capacity(3 + NONCE_LEN);
    w.u8(STEP_CHALLENGE).u16(PROTOCOL_VERSION).raw(nonce_n);
    w.finish()
}

/// The body of a root's answer to the challenge `nonce_n`.
fn response_body(key: &ClusterKey, nonce_n: &[u8], nonce_r: &[u8; NONCE_LEN]) -> Vec<u8> {
    let mac_r = key.mac(ROOT_LABEL, &[nonce_n, nonce_r]);
    let mut w = BodyWriter::with_capacity(3 + NONCE_LEN + MAC_LEN);
    w.u8(STEP_RESPONSE).u16(PROTOCOL_VERSION).raw(nonce_r).raw(&mac_r);
    w.finish()
}

/// What the node's READY MAC covers after the two nonces: the fields it announces.
fn hello_fields(hello: &NodeHello) -> [u8; 20] {
    let mut out = [0u8; 20];
    out[0..8].copy_from_slice(&hello.node_id.to_le_bytes());
    out[8..12].copy_from_slice(&hello.sub_workers.to_le_bytes());
    out[12..16].copy_from_slice(&hello.chips.to_le_bytes());
    out[16..20].copy_from_slice(&hello.pid.to_le_bytes());
    out
}

/// The body of a node's READY, answering the root nonce `nonce_r` to its own `nonce_n`.
fn ready_body(key: &ClusterKey, nonce_r: &[u8], nonce_n: &[u8], hello: &NodeHello) -> Vec<u8> {
    let mac_n = key.mac(NODE_LABEL, &[nonce_r, nonce_n, &hello_fields(hello)]);
    let mut w = BodyWriter::with_capacity(1 + MAC_LEN + 20);
    w.u8(STEP_READY).raw(&mac_n).u64(hello.node_id).u32(hello.sub_workers).u32(hello.chips).u32(hello.pid);
    w.finish()
}

/// Why a handshake failed, before it is given the peer's name.
enum Refusal {
    /// The stream failed, closed or timed out, or sent bytes that are not a frame.
    Frame(FrameError, &'static str),
    /// A frame that is not the HELLO this step expects, or a HELLO body of the wrong shape.
    Protocol(String),
    /// A protocol version this side does not speak.
    Version(u16),
    /// The peer does not hold the key (or replayed an old HELLO).
    BadProof,
    /// The peer said "refused".
    Refused,
    /// The node said "refused" before any proof was exchanged (it takes no root now).
    RefusedConnection,
    /// A local failure (no random bytes, a failed write, a socket option).
    Local(Error),
}

/// Reads the next HELLO frame (any other kind, or step "refused", is refused).
fn read_hello(stream: &mut Deadline<'_>, waiting_for: &'static str) -> std::result::Result<Vec<u8>, Refusal> {
    let Frame { kind, body, .. } =
        read_frame(stream, MAX_HELLO_BODY).map_err(|e| Refusal::Frame(e, waiting_for))?;
    if kind != FrameKind::Hello {
        return Err(Refusal::Protocol(format!("a {kind:?} frame where {waiting_for} was due")));
    }
    if body.first() == Some(&STEP_REFUSED) {
        return Err(Refusal::Refused);
    }
    Ok(body)
}

/// Checks a HELLO's step byte and (for the steps that carry one) its version.
fn expect_step(
    r: &mut BodyReader<'_>,
    step: u8,
    versioned: bool,
    waiting_for: &str,
) -> std::result::Result<(), Refusal> {
    let malformed = |e: FrameError| Refusal::Protocol(format!("{waiting_for}: {e}"));
    let got = r.u8().map_err(malformed)?;
    if got != step {
        return Err(Refusal::Protocol(format!("HELLO step {got} where {waiting_for} (step {step}) was due")));
    }
    if versioned {
        let v = r.u16().map_err(malformed)?;
        if v != PROTOCOL_VERSION {
            return Err(Refusal::Version(v));
        }
    }
    Ok(())
}

fn send(stream: &mut Deadline<'_>, body: &[u8]) -> std::result::Result<(), Refusal> {
    write_frame(stream, FrameKind::Hello, 0, body)
        .map_err(|e| Refusal::Local(Error::new(ErrorKind::WorkerDied, format!("sending a HELLO: {e}"))))
}

/// Tells the peer "refused" (best effort; nothing more is said).
fn refuse(stream: &mut Deadline<'_>) {
    let _ = write_frame(stream, FrameKind::Hello, 0, &[STEP_REFUSED]);
}

/// A stream whose reads share one deadline: each read waits at most for what is left of it, so
/// a peer that trickles bytes cannot stretch the handshake past [`HANDSHAKE_TIMEOUT`].
struct Deadline<'a> {
    stream: &'a Stream,
    until: Instant,
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the handshake's deadline passed"));
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

impl Write for Deadline<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.write(buf)
    }

    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        self.stream.write_vectored(bufs)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `steps` within [`HANDSHAKE_TIMEOUT`] (a read timeout, cleared afterwards whatever
/// happened).
fn with_timeout<T>(
    stream: &mut Stream,
    timeout: Duration,
    steps: impl FnOnce(&mut Deadline<'_>) -> std::result::Result<T, Refusal>,
) -> std::result::Result<T, Refusal> {
    let mut deadline = Deadline { stream, until: crate::sys::clock::after(timeout) };
    let out = steps(&mut deadline);
    let _ = stream.set_read_timeout(None);
    out
}

/// Root side: runs the challenge-response over `stream` (already connected) and returns the
/// node's HELLO READY.
///
/// Errors name `peer`: the node refused the key (`InvalidArgument`), a node that does not hold
/// the key or speaks another version (`InvalidArgument`), no HELLO within 5 s (`Timeout`), a
/// connection that failed, closed or carried bytes that are not a HELLO (`WorkerDied`).
pub(crate) fn client_handshake(stream: &mut Stream, key: &ClusterKey, peer: &str) -> Result<NodeHello> {
    client_handshake_within(stream, key, peer, HANDSHAKE_TIMEOUT)
}

/// [`client_handshake`] with the whole handshake bounded by `timeout` instead of
/// [`HANDSHAKE_TIMEOUT`].
pub(crate) fn client_handshake_within(
    stream: &mut Stream,
    key: &ClusterKey,
    peer: &str,
    timeout: Duration,
) -> Result<NodeHello> {
    let outcome = with_timeout(stream, timeout, |stream| {
        let body = read_hello(stream, "the node's challenge").map_err(|r| match r {
            Refusal::Refused => Refusal::RefusedConnection,
            // A node sends its challenge as soon as it takes the connection: one that does not
            // is busy with another root's session (a node serves one root at a time).
            Refusal::Frame(e, _) if e.is_timeout() => Refusal::Frame(
                e,
                "the node's challenge (is the node serving another root? a node serves one root at a time)",
            ),
            other => other,
        })?;
        let mut r = BodyReader::new(&body);
        expect_step(&mut r, STEP_CHALLENGE, true, "the node's challenge")?;
        let nonce_n: [u8; NONCE_LEN] = read_array(&mut r, "the node's challenge")?;
        finish(r, "the node's challenge")?;

        let nonce_r = nonce().map_err(Refusal::Local)?;
        send(stream, &response_body(key, &nonce_n, &nonce_r))?;

        let body = read_hello(stream, "the node's READY")?;
        let mut r = BodyReader::new(&body);
        expect_step(&mut r, STEP_READY, false, "the node's READY")?;
        let mac_n: [u8; MAC_LEN] = read_array(&mut r, "the node's READY")?;
        let field = |e: FrameError| Refusal::Protocol(format!("the node's READY: {e}"));
        let hello = NodeHello {
            node_id: r.u64().map_err(field)?,
            sub_workers: r.u32().map_err(field)?,
            chips: r.u32().map_err(field)?,
            pid: r.u32().map_err(field)?,
        };
        finish(r, "the node's READY")?;
        if !key.verify(NODE_LABEL, &[&nonce_r, &nonce_n, &hello_fields(&hello)], &mac_n) {
            refuse(stream);
            return Err(Refusal::BadProof);
        }
        Ok(hello)
    });
    outcome.map_err(|refusal| {
        // A caller whose messages name the node already passes an empty `peer`.
        let at = if peer.is_empty() {
            "handshake with the node".to_string()
        } else {
            format!("handshake with the node at {peer}")
        };
        match refusal {
            Refusal::Refused => Error::invalid(format!(
                "{at}: the node refused the cluster key (the root and the node must hold the same key)"
            )),
            Refusal::BadProof => Error::invalid(format!(
                "{at}: the node does not hold the cluster key (its HELLO READY failed verification)"
            )),
            Refusal::RefusedConnection => Error::new(
                ErrorKind::WorkerDied,
                format!("{at}: the node refused the connection before the handshake"),
            ),
            other => describe(other, &at, "node", timeout),
        }
    })
}

/// A server-side handshake that its listener may end to make room for a newer connection (a
/// node's sessions, its peer listener). Its own thread [`finish`](Handshake::finish)es it and
/// the listener [`end`](Handshake::end)s it; whichever claims it first wins, so a handshake
/// that finished is never ended, and one that was ended reports nothing.
#[derive(Debug, Default)]
pub(crate) struct Handshake(std::sync::atomic::AtomicU8);

impl Handshake {
    const RUNNING: u8 = 0;
    const FINISHED: u8 = 1;
    const ENDED: u8 = 2;

    fn claim(&self, to: u8) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.0.compare_exchange(Self::RUNNING, to, SeqCst, SeqCst).is_ok()
    }

    /// The handshake's thread claims it: false when it was ended meanwhile.
    pub(crate) fn finish(&self) -> bool {
        self.claim(Self::FINISHED)
    }

    /// The listener claims it to end it: false when it already finished (or was ended).
    pub(crate) fn end(&self) -> bool {
        self.claim(Self::ENDED)
    }
}

/// Node side: challenges a connecting root; on success sends HELLO READY carrying `hello`.
///
/// On failure (wrong key, a replayed or malformed HELLO, another version, a timeout) returns an
/// error naming `peer` after telling the root only "refused" (nothing at all when the stream
/// failed); it changes no state. The caller logs it (`tracing::warn` with the peer) and drops
/// the connection.
pub(crate) fn server_handshake(
    stream: &mut Stream,
    key: &ClusterKey,
    hello: &NodeHello,
    peer: &str,
) -> Result<()> {
    server_handshake_within(stream, key, hello, peer, HANDSHAKE_TIMEOUT)
}

/// [`server_handshake`] with the whole handshake bounded by `timeout` instead of
/// [`HANDSHAKE_TIMEOUT`].
pub(crate) fn server_handshake_within(
    stream: &mut Stream,
    key: &ClusterKey,
    hello: &NodeHello,
    peer: &str,
    timeout: Duration,
) -> Result<()> {
    let outcome = with_timeout(stream, timeout, |stream| {
        let nonce_n = nonce().map_err(Refusal::Local)?;
        send(stream, &challenge_body(&nonce_n))?;
        let checked = (|| {
            let body = read_hello(stream, "the root's response")?;
            let mut r = BodyReader::new(&body);
            expect_step(&mut r, STEP_RESPONSE, true, "the root's response")?;
            let nonce_r: [u8; NONCE_LEN] = read_array(&mut r, "the root's response")?;
            let mac_r: [u8; MAC_LEN] = read_array(&mut r, "the root's response")?;
            finish(r, "the root's response")?;
            // A root that echoes the node's own nonce gains nothing (the labels differ), but it
            // is never a real root.
            if nonce_r == nonce_n || !key.verify(ROOT_LABEL, &[&nonce_n, &nonce_r], &mac_r) {
                return Err(Refusal::BadProof);
            }
            Ok(nonce_r)
        })();
        let nonce_r = match checked {
            Ok(n) => n,
            Err(refusal) => {
                if !matches!(refusal, Refusal::Frame(..) | Refusal::Refused | Refusal::Local(_)) {
                    refuse(stream);
                }
                return Err(refusal);
            }
        };
        send(stream, &ready_body(key, &nonce_r, &nonce_n, hello))
    });
    outcome.map_err(|refusal| {
        let at = format!("refused the root at {peer}");
        match refusal {
            Refusal::BadProof => Error::invalid(format!(
                "{at}: its HELLO does not prove the cluster key (a wrong key, or a HELLO replayed from \
                 an earlier session)"
            )),
            Refusal::Refused => {
                Error::new(ErrorKind::WorkerDied, format!("{at}: the root gave up the handshake"))
            }
            other => describe(other, &at, "root", timeout),
        }
    })
}

fn read_array<const N: usize>(r: &mut BodyReader<'_>, what: &str) -> std::result::Result<[u8; N], Refusal> {
    let b = r.raw(N).map_err(|e| Refusal::Protocol(format!("{what}: {e}")))?;
    Ok(b.try_into().expect("raw returned N bytes"))
}

fn finish(r: BodyReader<'_>, what: &str) -> std::result::Result<(), Refusal> {
    r.finish().map_err(|e| Refusal::Protocol(format!("{what}: {e}")))
}

/// The error for the refusals both sides share; `at` names the peer, `other` its role.
fn describe(refusal: Refusal, at: &str, other: &str, timeout: Duration) -> Error {
    match refusal {
        Refusal::Frame(FrameError::Closed, waiting_for) => Error::new(
            ErrorKind::WorkerDied,
            format!("{at}: the {other} closed the connection while {waiting_for} was due"),
        ),
        Refusal::Frame(e, waiting_for) if e.is_timeout() => Error::new(
            ErrorKind::Timeout,
            format!("{at}: timed out after {timeout:?} waiting for {waiting_for}"),
        ),
        Refusal::Frame(e, waiting_for) => e.into_error(format!("{at}: reading {waiting_for}")),
        Refusal::Protocol(what) => {
            Error::new(ErrorKind::WorkerDied, format!("{at}: not a valid HELLO: {what}"))
        }
        Refusal::Version(v) => Error::invalid(format!(
            "{at}: the {other} speaks protocol version {v}, this side speaks {PROTOCOL_VERSION}"
        )),
        Refusal::Local(e) => e.context(at),
        Refusal::BadProof | Refusal::Refused | Refusal::RefusedConnection => {
            Error::new(ErrorKind::Internal, format!("{at}: an unexpected refusal"))
        }
    }
}

#[cfg(test)]
mod tests;
