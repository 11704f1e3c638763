//! The bodies of the session frames between a root (an L4 Worker) and a node (a remote L3
//! Worker), on top of `net::frame`.
//!
//! A `TASK` or `COMPLETION` body is a *head* (a `u32` length, then everything but tensor bytes)
//! followed by its *bulk*: the tensors' bytes, back to back, in the order the head lists them.
//! The head is read and checked first (at most [`MAX_HEAD`] bytes, and its segment lengths must
//! add up to exactly the bulk's length), so the bulk can go straight from the socket into the
//! buffers it belongs in, and straight from the buffers to the socket, with no copy on either
//! side.
//!
//! * `TASK` head: the callable's digest and name, the config, the arguments (the local wire
//!   blob: descriptors, views, scalars), then for each tensor where its bytes come from
//!   ([`TensorData`]): it stays on the node (node-resident there), the bulk (where the bytes
//!   its view spans start in the root's buffer and how many there are: a node shares no memory
//!   with the root), or another node (node-resident there: the node running the task reads
//!   them from that node's peer listener, `peer`, with the grant the root was given for it).
//! * `COMPLETION` head: a status code, a message, and for every written view its tensor index,
//!   offset and length.
//! * `CONTROL` / `CONTROL_REPLY`: a command (`CHECK_CALLABLE`: does the node run this digest?
//!   `SIZE`, the first a root sends: the SUB workers and chips its session's L3 Worker is to
//!   have, answered with what it has) and its answer.
//! * `HEALTH`, `SHUTDOWN`: empty.
//!
//! Every length is checked against what is left of the body (`BodyReader`), so a hostile body
//! gives a named error, never a panic or an allocation larger than the frame. A bad head is
//! answered (`BAD_FRAME`) after the rest of the body is read and dropped, so the session stays
//! in step. The bulk moves with `SharedMem::read_from_fd` / `send_to_fd` (rules N2 and N3 of
//! `sys::shm`: the kernel copies, no reference into the mapping).
//!
//! Node-resident buffers: the root's chip-memory calls (`alloc_device`, `copy_to`,
//! `copy_from`, `free`) for a remote Worker go to its session as `CONTROL` frames (`ALLOC`,
//! `COPY_TO`, `COPY_FROM`, `FREE`). The buffer is a device `Buffer` whose pointer is the node's
//! buffer id, so the root's `ChipBuffers` applies the owner, placement, use-after-free and busy
//! checks; a `TASK` leaves such tensors on the node, which uses its own buffer in place; a
//! session's buffers die with it. A copy moves in parts of at most 64 MiB ([`COPY_PART`]), each
//! a control of its own, so no frame nears the 1 GiB frame limit.

use crate::callable::identity::Digest;
use crate::data::buffer::Access;
use crate::data::call_config::CallConfig;
use crate::data::task_args::TaskArgs;
use crate::data::wire::{CALL_CONFIG_WIRE_SIZE, blob_size, decode_config, encode_args, encode_config};
use crate::error::{Error, ErrorKind, Result};
use crate::net::frame::{BodyReader, BodyWriter, FrameError, read_part, skip_part};

/// COMPLETION status: the task succeeded.
/// The most bytes one COPY_TO or COPY_FROM control moves: a larger copy goes in parts, so no
/// frame nears the frame size limit.
pub(crate) const COPY_PART: usize = 64 << 20;

pub(crate) const DONE: u32 = 0;
/// COMPLETION status: the task failed.
pub(crate) const TASK_FAILED: u32 = 1;
/// COMPLETION status: the node has no callable of that digest.
pub(crate) const UNKNOWN_CALLABLE: u32 = 2;
/// COMPLETION status: a worker of the node died under the task.
pub(crate) const WORKER_DIED: u32 = 3;
/// COMPLETION status: the node ran out of a fixed-size resource.
pub(crate) const RESOURCE: u32 = 4;
/// COMPLETION status: the frame could not be decoded.
pub(crate) const BAD_FRAME: u32 = 5;

/// CONTROL command: is a callable of this digest registered on the node?
pub(crate) const CHECK_CALLABLE: u32 = 1;
/// CONTROL command: allocate a node-resident buffer of `arg` bytes (result: its id).
pub(crate) const ALLOC: u32 = 2;
/// CONTROL command: write `data` into node-resident buffer `arg`.
pub(crate) const COPY_TO: u32 = 3;
/// CONTROL command: read `arg2` bytes of node-resident buffer `arg` (result: the bytes).
pub(crate) const COPY_FROM: u32 = 4;
/// CONTROL command: free node-resident buffer `arg`.
pub(crate) const FREE: u32 = 5;
/// CONTROL command on a peer connection (`peer`): read `arg2` bytes at offset `arg` of the
/// node-resident buffer whose grant is `data`.
pub(crate) const PEER_READ: u32 = 6;

/// CONTROL command: the session's L3 Worker is to have `arg` SUB workers and `arg2` chips (both
/// 0: the node's default); the reply is the `u32` SUB workers and `u32` chips it has. The first
/// control a root sends; a node with one Worker lends it when it is at least that large, a
/// sized node (`Node::sized`) makes one of just that size.
pub(crate) const SIZE: u32 = 7;

/// The longest address a TASK names for a peer node.
const MAX_PEER_ADDR: usize = 1024;

/// Where a TASK's tensor's bytes come from, as its head says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TensorData {
    /// Node-resident on the node that runs the task: used in place, no bytes travel.
    Resident,
    /// `len` bytes in the bulk: what the view spans, from byte `offset` of the root's buffer.
    Bulk { offset: u64, len: u64 },
    /// Node-resident on another node: the node running the task reads the bytes the view
    /// spans from that node itself.
    Peer(PeerSource),
}

/// Where a node reads a tensor another node holds: that node's peer listener, the grant that
/// names the buffer there, and the bytes the view spans in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PeerSource {
    pub(crate) addr: String,
    pub(crate) grant: super::peer::Grant,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

impl TensorData {
    /// The bytes it brings in the bulk.
    fn bulk(&self) -> u64 {
        match self {
            TensorData::Bulk { len, .. } => *len,
            _ => 0,
        }
    }
}

/// Largest encoded argument blob a TASK carries (tensors' descriptors and views, scalars).
const MAX_ARGS_BLOB: usize = 1 << 20;
/// Largest head of a TASK or COMPLETION (everything but the tensor bytes).
pub(crate) const MAX_HEAD: usize = MAX_ARGS_BLOB + (64 << 10);

fn bad(e: FrameError) -> Error {
    Error::decode(format!("malformed message: {e}"))
}

/// Splits a TASK or COMPLETION body into its head and its bulk (the tensor bytes).
#[cfg(any(test, feature = "fuzz"))]
fn split(body: &[u8]) -> Result<(&[u8], &[u8])> {
    let mut r = BodyReader::new(body);
    let head_len = r.u32().map_err(bad)? as usize;
    if head_len > MAX_HEAD || head_len > r.remaining() {
        return Err(Error::decode(format!(
            "a head of {head_len} bytes in a body of {} (at most {MAX_HEAD})",
            body.len()
        )));
    }
    let head = r.raw(head_len).map_err(bad)?;
    Ok((head, &body[4 + head_len..]))
}

/// The longest message a COMPLETION carries (a longer one is cut, at a character boundary,
/// with a note), so that a task failing with a huge message fails only itself.
pub(crate) const MAX_MESSAGE: usize = 64 << 10;

/// `s`, cut to at most `max` bytes at a character boundary, with a note when cut.
fn truncated(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{} [... {} more bytes]", &s[..end], s.len() - end))
}

/// Prefixes an encoded head with its length.
fn with_len(head: BodyWriter) -> Vec<u8> {
    let head = head.finish();
    let mut out = Vec::with_capacity(4 + head.len());
    out.extend_from_slice(&(head.len() as u32).to_le_bytes());
    out.extend_from_slice(&head);
    out
}

/// Reads the head of a TASK or COMPLETION frame whose body is `body_len` bytes from `r` (the
/// frame header read already); returns the head and how many bulk bytes follow it. Lengths
/// are checked before anything is allocated. A head length that does not fit the body is an
/// `Err` inside: the rest of the body was read and dropped, so the next frame can be read.
pub(crate) fn read_head(
    r: &mut impl std::io::Read,
    body_len: usize,
) -> std::result::Result<Result<(Vec<u8>, u64)>, FrameError> {
    if body_len < 4 {
        skip_part(r, body_len as u64)?;
        return Ok(Err(Error::decode(format!("a body of {body_len} bytes has no head length"))));
    }
    let mut len = [0u8; 4];
    read_part(r, &mut len)?;
    let head_len = u32::from_le_bytes(len) as usize;
    if head_len > MAX_HEAD || head_len > body_len - 4 {
        skip_part(r, (body_len - 4) as u64)?;
        return Ok(Err(Error::decode(format!(
            "a head of {head_len} bytes in a body of {body_len} (at most {MAX_HEAD})"
        ))));
    }
    let mut head = vec![0u8; head_len];
    read_part(r, &mut head)?;
    Ok(Ok((head, (body_len - 4 - head_len) as u64)))
}

/// Checks that segments of `lens` fill a bulk of `bulk` bytes exactly.
fn check_bulk(mut lens: impl Iterator<Item = u64>, bulk: u64) -> Result<()> {
    let sum =
        lens.try_fold(0u64, u64::checked_add).ok_or_else(|| Error::decode("tensor lengths overflow"))?;
    if sum != bulk {
        return Err(Error::decode(format!(
            "the head names {sum} bytes of tensor data, the body carries {bulk}"
        )));
    }
    Ok(())
}

/// A TASK's head as the node reads it: everything but the tensors' bytes, which follow it in
/// tensor order.
pub(crate) struct TaskHead<'a> {
    pub(crate) digest: Digest,
    pub(crate) name: String,
    pub(crate) config: CallConfig,
    pub(crate) args_blob: &'a [u8],
    /// For each tensor, where its bytes come from.
    pub(crate) data: Vec<TensorData>,
}

/// A whole TASK (head and bulk in memory).
#[cfg(any(test, feature = "fuzz"))]
pub(crate) struct TaskMsg<'a> {
    pub(crate) head: TaskHead<'a>,
    /// For each tensor, the bytes its view spans in its buffer and where they start.
    pub(crate) data: Vec<Option<(u64, &'a [u8])>>,
}

/// Encodes a TASK's head (with its length prefix); `data[i]` is where tensor `i`'s bytes come
/// from. The sender writes the bulk after it: the bytes of each `Bulk` tensor in order.
pub(crate) fn encode_task_head(
    digest: &Digest,
    name: &str,
    config: Option<&CallConfig>,
    args: &TaskArgs,
    data: &[TensorData],
) -> Result<Vec<u8>> {
    let size = blob_size(args.tensors.len(), args.scalars.len());
    if size > MAX_ARGS_BLOB {
        return Err(Error::invalid(format!(
            "a task's arguments take {size} bytes encoded, over the {MAX_ARGS_BLOB}-byte limit of a remote task"
        )));
    }
    let mut w = BodyWriter::with_capacity(96 + name.len() + CALL_CONFIG_WIRE_SIZE + size + 17 * data.len());
    w.raw(digest.as_bytes()).bytes(name.as_bytes());
    let mut cfg = [0u8; CALL_CONFIG_WIRE_SIZE];
    if let Some(c) = config {
        encode_config(c, &mut cfg);
    }
    w.raw(&cfg);
    let mut blob = vec![0u8; size];
    let n =
        encode_args(args.tensors.iter().zip(args.tags.iter().map(|t| t.access())), &args.scalars, &mut blob)?;
    w.bytes(&blob[..n]);
    w.u32(data.len() as u32);
    for d in data {
        match d {
            TensorData::Resident => w.u8(0),
            TensorData::Bulk { offset, len } => w.u8(1).u64(*offset).u64(*len),
            TensorData::Peer(p) => {
                if p.addr.len() > MAX_PEER_ADDR {
                    return Err(Error::invalid(format!(
                        "a peer address of {} bytes (at most {MAX_PEER_ADDR})",
                        p.addr.len()
                    )));
                }
                w.u8(2).bytes(p.addr.as_bytes()).raw(&p.grant).u64(p.offset).u64(p.len)
            }
        };
    }
    let head = with_len(w);
    if head.len() - 4 > MAX_HEAD {
        return Err(Error::invalid(format!(
            "a task's arguments take {} bytes with their tensors' places, over the {MAX_HEAD}-byte limit of a remote task",
            head.len() - 4
        )));
    }
    Ok(head)
}

/// Decodes a TASK's head (without its length prefix), followed by a bulk of `bulk` bytes.
pub(crate) fn decode_task_head(head: &[u8], bulk: u64) -> Result<TaskHead<'_>> {
    let mut r = BodyReader::new(head);
    let digest: [u8; 32] = r.raw(32).map_err(bad)?.try_into().expect("32 bytes");
    let name = String::from_utf8_lossy(r.bytes().map_err(bad)?).into_owned();
    let config = decode_config(r.raw(CALL_CONFIG_WIRE_SIZE).map_err(bad)?)?;
    let args_blob = r.bytes().map_err(bad)?;
    let n = r.u32().map_err(bad)? as usize;
    if n > args_blob.len() || n > r.remaining() {
        return Err(Error::decode(format!(
            "a TASK names {n} tensors but its argument blob cannot hold them"
        )));
    }
    let mut data = Vec::with_capacity(n);
    for _ in 0..n {
        data.push(match r.u8().map_err(bad)? {
            0 => TensorData::Resident,
            1 => TensorData::Bulk { offset: r.u64().map_err(bad)?, len: r.u64().map_err(bad)? },
            2 => {
                let addr = r.bytes().map_err(bad)?;
                if addr.len() > MAX_PEER_ADDR {
                    return Err(Error::decode(format!("a peer address of {} bytes", addr.len())));
                }
                let addr = std::str::from_utf8(addr)
                    .map_err(|_| Error::decode("a peer address that is not UTF-8"))?
                    .to_string();
                let grant = r.raw(super::peer::GRANT_LEN).map_err(bad)?.try_into().expect("GRANT_LEN bytes");
                TensorData::Peer(PeerSource {
                    addr,
                    grant,
                    offset: r.u64().map_err(bad)?,
                    len: r.u64().map_err(bad)?,
                })
            }
            f => return Err(Error::decode(format!("tensor data flag {f}"))),
        });
    }
    r.finish().map_err(bad)?;
    check_bulk(data.iter().map(TensorData::bulk), bulk)?;
    Ok(TaskHead { digest: Digest::from_bytes(digest), name, config, args_blob, data })
}

/// Encodes a whole TASK (head and bulk in one body); `data(i)` gives the bytes tensor `i`'s
/// view spans and their offset in its buffer (`None` for a tensor that stays on the node).
#[cfg(any(test, feature = "fuzz"))]
pub(crate) fn encode_task(
    digest: &Digest,
    name: &str,
    config: Option<&CallConfig>,
    args: &TaskArgs,
    mut data: impl FnMut(usize) -> Result<Option<(u64, Vec<u8>)>>,
) -> Result<Vec<u8>> {
    let data: Vec<Option<(u64, Vec<u8>)>> = (0..args.tensors.len()).map(&mut data).collect::<Result<_>>()?;
    let spans: Vec<TensorData> = data
        .iter()
        .map(|d| match d {
            Some((offset, b)) => TensorData::Bulk { offset: *offset, len: b.len() as u64 },
            None => TensorData::Resident,
        })
        .collect();
    let mut body = encode_task_head(digest, name, config, args, &spans)?;
    for (_, bytes) in data.iter().flatten() {
        body.extend_from_slice(bytes);
    }
    Ok(body)
}

/// Decodes a whole TASK body.
#[cfg(any(test, feature = "fuzz"))]
pub(crate) fn decode_task(body: &[u8]) -> Result<TaskMsg<'_>> {
    let (head, mut bulk) = split(body)?;
    let head = decode_task_head(head, bulk.len() as u64)?;
    let data = head
        .data
        .iter()
        .map(|d| match d {
            TensorData::Bulk { offset, len } => {
                let (bytes, rest) = bulk.split_at(*len as usize); // lengths checked against the bulk
                bulk = rest;
                Some((*offset, bytes))
            }
            _ => None,
        })
        .collect();
    Ok(TaskMsg { head, data })
}

/// A COMPLETION's head as the root reads it: the written tensors' bytes follow it in order.
pub(crate) struct CompletionHead {
    pub(crate) status: u32,
    pub(crate) message: String,
    /// For every written tensor: its index, where its view's bytes start in its buffer, and
    /// how many follow in the bulk.
    pub(crate) outputs: Vec<(usize, u64, u64)>,
}

/// A whole COMPLETION (head and bulk in memory).
#[cfg(any(test, feature = "fuzz"))]
pub(crate) struct CompletionMsg<'a> {
    pub(crate) head: CompletionHead,
    /// The bytes every written view spans, by tensor index, with their offset in the buffer.
    pub(crate) outputs: Vec<(usize, u64, &'a [u8])>,
}

/// Encodes a COMPLETION's head (with its length prefix); the sender writes each output's
/// bytes after it, in order.
pub(crate) fn encode_completion_head(status: u32, message: &str, outputs: &[(usize, u64, u64)]) -> Vec<u8> {
    let message = truncated(message, MAX_MESSAGE);
    let mut w = BodyWriter::with_capacity(16 + message.len() + 20 * outputs.len());
    w.u32(status).bytes(message.as_bytes()).u32(outputs.len() as u32);
    for (i, offset, len) in outputs {
        w.u32(*i as u32).u64(*offset).u64(*len);
    }
    with_len(w)
}

/// Decodes a COMPLETION's head (without its length prefix), followed by `bulk` bytes.
pub(crate) fn decode_completion_head(head: &[u8], bulk: u64) -> Result<CompletionHead> {
    let mut r = BodyReader::new(head);
    let status = r.u32().map_err(bad)?;
    let message = String::from_utf8_lossy(r.bytes().map_err(bad)?).into_owned();
    let n = r.u32().map_err(bad)? as usize;
    if n > r.remaining() {
        return Err(Error::decode(format!("a COMPLETION names {n} outputs but its head cannot hold them")));
    }
    let mut outputs = Vec::with_capacity(n);
    for _ in 0..n {
        outputs.push((r.u32().map_err(bad)? as usize, r.u64().map_err(bad)?, r.u64().map_err(bad)?));
    }
    r.finish().map_err(bad)?;
    check_bulk(outputs.iter().map(|(_, _, len)| *len), bulk)?;
    Ok(CompletionHead { status, message, outputs })
}

/// Encodes a whole COMPLETION (head and bulk in one body).
#[cfg(any(test, feature = "fuzz"))]
pub(crate) fn encode_completion(status: u32, message: &str, outputs: &[(usize, u64, Vec<u8>)]) -> Vec<u8> {
    let spans: Vec<(usize, u64, u64)> = outputs.iter().map(|(i, o, b)| (*i, *o, b.len() as u64)).collect();
    let mut body = encode_completion_head(status, message, &spans);
    for (_, _, bytes) in outputs {
        body.extend_from_slice(bytes);
    }
    body
}

/// Decodes a whole COMPLETION body.
#[cfg(any(test, feature = "fuzz"))]
pub(crate) fn decode_completion(body: &[u8]) -> Result<CompletionMsg<'_>> {
    let (head, mut bulk) = split(body)?;
    let head = decode_completion_head(head, bulk.len() as u64)?;
    let outputs = head
        .outputs
        .iter()
        .map(|&(i, offset, len)| {
            let (bytes, rest) = bulk.split_at(len as usize); // lengths checked against the bulk
            bulk = rest;
            (i, offset, bytes)
        })
        .collect();
    Ok(CompletionMsg { head, outputs })
}

/// A CONTROL as the node reads it.
pub(crate) struct ControlMsg<'a> {
    pub(crate) command: u32,
    pub(crate) digest: Digest,
    pub(crate) name: String,
    pub(crate) arg: u64,
    pub(crate) arg2: u64,
    pub(crate) data: &'a [u8],
}

/// Encodes a CONTROL.
pub(crate) fn encode_control(
    command: u32,
    digest: &Digest,
    name: &str,
    arg: u64,
    arg2: u64,
    data: &[u8],
) -> Vec<u8> {
    let mut w = BodyWriter::new();
    w.u32(command).raw(digest.as_bytes()).bytes(name.as_bytes()).u64(arg).u64(arg2).bytes(data);
    w.finish()
}

/// Encodes a CONTROL `CHECK_CALLABLE`.
pub(crate) fn encode_check(digest: &Digest, name: &str) -> Vec<u8> {
    encode_control(CHECK_CALLABLE, digest, name, 0, 0, &[])
}

/// Encodes a CONTROL `SIZE`: the session's Worker is to have `sub_workers` and `chips`.
pub(crate) fn encode_size(sub_workers: u32, chips: u32) -> Vec<u8> {
    encode_control(SIZE, &Digest::from_bytes([0; 32]), "", u64::from(sub_workers), u64::from(chips), &[])
}

/// Encodes a `SIZE` reply: the SUB workers and chips the session's Worker has.
pub(crate) fn encode_size_reply(sub_workers: u32, chips: u32) -> Vec<u8> {
    let mut w = BodyWriter::new();
    w.u32(sub_workers).u32(chips);
    w.finish()
}

/// Decodes a `SIZE` reply.
pub(crate) fn decode_size_reply(body: &[u8]) -> Result<(u32, u32)> {
    let mut r = BodyReader::new(body);
    let size = (r.u32().map_err(bad)?, r.u32().map_err(bad)?);
    r.finish().map_err(bad)?;
    Ok(size)
}

/// A node's refusal of a CONTROL, as its reply carries it: the message, after a tag for the
/// kinds the root reports as such (`RESOURCE:` too little left, `LIMIT:` past a limit).
pub(crate) fn refusal(kind: ErrorKind, message: impl std::fmt::Display) -> String {
    match kind {
        ErrorKind::ResourceExhausted => format!("RESOURCE: {message}"),
        ErrorKind::InvalidArgument => format!("LIMIT: {message}"),
        _ => message.to_string(),
    }
}

/// A failure `e` of the node's own Worker as a refusal saying `message`: too little left when
/// it ran out of something, else untagged (a node in a bad state, never the root's mistake).
pub(crate) fn refusal_of(e: &Error, message: impl std::fmt::Display) -> String {
    match e.kind() {
        ErrorKind::ResourceExhausted => refusal(ErrorKind::ResourceExhausted, message),
        _ => message.to_string(),
    }
}

/// A node's refusal ([`refusal`]) as an error of its kind, naming the node by `label`
/// (untagged: [`ErrorKind::InvalidState`]).
pub(crate) fn refusal_error(label: &str, refused: &str) -> Error {
    let (kind, message) = if let Some(m) = refused.strip_prefix("RESOURCE: ") {
        (ErrorKind::ResourceExhausted, m)
    } else if let Some(m) = refused.strip_prefix("LIMIT: ") {
        (ErrorKind::InvalidArgument, m)
    } else {
        (ErrorKind::InvalidState, refused)
    };
    Error::new(kind, format!("{label}: {message}"))
}

/// Decodes a CONTROL body.
pub(crate) fn decode_control(body: &[u8]) -> Result<ControlMsg<'_>> {
    let mut r = BodyReader::new(body);
    let command = r.u32().map_err(bad)?;
    let digest: [u8; 32] = r.raw(32).map_err(bad)?.try_into().expect("32 bytes");
    let name = String::from_utf8_lossy(r.bytes().map_err(bad)?).into_owned();
    let (arg, arg2) = (r.u64().map_err(bad)?, r.u64().map_err(bad)?);
    let data = r.bytes().map_err(bad)?;
    r.finish().map_err(bad)?;
    Ok(ControlMsg { command, digest: Digest::from_bytes(digest), name, arg, arg2, data })
}

/// Encodes a CONTROL_REPLY: the result bytes, or the node's refusal.
pub(crate) fn encode_reply(result: &std::result::Result<Vec<u8>, String>) -> Vec<u8> {
    let mut w = BodyWriter::new();
    match result {
        Ok(bytes) => w.u32(0).bytes(bytes),
        Err(m) => w.u32(1).bytes(m.as_bytes()),
    };
    w.finish()
}

/// Decodes a CONTROL_REPLY.
pub(crate) fn decode_reply(body: &[u8]) -> Result<std::result::Result<Vec<u8>, String>> {
    let mut r = BodyReader::new(body);
    let code = r.u32().map_err(bad)?;
    let bytes = r.bytes().map_err(bad)?;
    r.finish().map_err(bad)?;
    Ok(if code == 0 { Ok(bytes.to_vec()) } else { Err(String::from_utf8_lossy(bytes).into_owned()) })
}

/// Whether a task with `access` may write its tensor (its bytes come back with the COMPLETION).
pub(crate) fn writes(access: Access) -> bool {
    access.can_write()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_truncations_are_errors() {
        let c = encode_completion(TASK_FAILED, "boom", &[(1, 8, vec![1, 2, 3])]);
        let m = decode_completion(&c).unwrap();
        assert_eq!((m.head.status, m.head.message.as_str(), m.outputs.len()), (TASK_FAILED, "boom", 1));
        assert_eq!(m.outputs[0], (1, 8, &[1u8, 2, 3][..]));
        for cut in 0..c.len() {
            assert!(decode_completion(&c[..cut]).is_err(), "{cut}");
        }
        let d = Digest::from_bytes([7; 32]);
        let c = encode_check(&d, "f");
        let m = decode_control(&c).unwrap();
        assert_eq!((m.command, m.digest, m.name.as_str()), (CHECK_CALLABLE, d, "f"));
        for cut in 0..c.len() {
            assert!(decode_control(&c[..cut]).is_err(), "{cut}");
        }
        assert_eq!(decode_reply(&encode_reply(&Err("no".into()))).unwrap(), Err("no".to_string()));
        assert_eq!(decode_reply(&encode_reply(&Ok(vec![1, 2]))).unwrap(), Ok(vec![1, 2]));
        let t = encode_task(&d, "f", None, &TaskArgs::new(), |_| Ok(None)).unwrap();
        let task = decode_task(&t).unwrap();
        assert_eq!((task.head.digest, task.head.name.as_str(), task.data.len()), (d, "f", 0));
        for cut in 0..t.len() {
            assert!(decode_task(&t[..cut]).is_err(), "{cut}");
        }
    }

    #[test]
    fn a_tensor_another_node_holds_is_named_by_its_peer_and_grant() {
        let d = Digest::from_bytes([4; 32]);
        let mut args = TaskArgs::new();
        let b = crate::data::buffer::Buffer::device(
            crate::data::buffer::Identity::new(1, 1, 1).unwrap(),
            2,
            77,
            64,
        )
        .unwrap();
        args.input(&b.tensor(&[64], crate::data::dtype::DataType::Uint8).unwrap()).unwrap();
        let peer = TensorData::Peer(PeerSource {
            addr: "10.0.0.2:4100".into(),
            grant: [5; super::super::peer::GRANT_LEN],
            offset: 8,
            len: 56,
        });
        let head = encode_task_head(&d, "f", None, &args, std::slice::from_ref(&peer)).unwrap();
        // No bulk: the bytes come from the peer.
        let task = decode_task(&head).unwrap();
        assert_eq!(task.head.data, vec![peer]);
        assert_eq!(task.data, vec![None]);
        for cut in 0..head.len() {
            assert!(decode_task(&head[..cut]).is_err(), "{cut}");
        }
    }

    #[test]
    fn a_bulk_that_differs_from_what_the_head_lists_is_refused() {
        let d = Digest::from_bytes([3; 32]);
        let mut args = TaskArgs::new();
        args.scalar(5);
        let head = encode_task_head(&d, "f", None, &args, &[]).unwrap();
        // The head lists no tensor data; one stray byte after it is refused, not ignored.
        let mut body = head.clone();
        body.push(9);
        assert!(decode_task(&body).is_err());
        assert!(decode_task(&head).is_ok());
        let c = encode_completion_head(DONE, "", &[(0, 0, 4)]);
        let mut body = c.clone();
        body.extend_from_slice(&[1, 2, 3]); // one byte short
        assert!(decode_completion(&body).is_err());
        body.push(4);
        assert_eq!(decode_completion(&body).unwrap().outputs, vec![(0, 0, &[1u8, 2, 3, 4][..])]);
    }

    #[test]
    fn a_bad_head_length_is_refused_and_the_rest_of_the_body_read() {
        // A body of 12 bytes whose head claims 100: the 8 bytes after the length are dropped,
        // so the next frame's bytes come next.
        let mut wire = Vec::new();
        wire.extend_from_slice(&100u32.to_le_bytes());
        wire.extend_from_slice(&[0xAA; 8]);
        wire.extend_from_slice(b"NEXT");
        let mut r = &wire[..];
        let refused = read_head(&mut r, 12).unwrap();
        assert!(refused.unwrap_err().message().contains("head of 100 bytes"));
        assert_eq!(r, b"NEXT");
        // A truncated head is a malformed frame (the connection ended inside it).
        let mut wire = 8u32.to_le_bytes().to_vec();
        wire.extend_from_slice(&[1, 2]);
        assert!(matches!(read_head(&mut &wire[..], 20), Err(FrameError::Malformed(_))));
    }

    #[test]
    fn a_huge_message_is_cut_to_fit_a_head() {
        let long = "é".repeat(MAX_MESSAGE); // two bytes each: cut inside the run
        let c = encode_completion_head(TASK_FAILED, &long, &[]);
        assert!(c.len() - 4 <= MAX_HEAD);
        let m = decode_completion_head(&c[4..], 0).unwrap();
        assert!(
            m.message.len() < MAX_MESSAGE + 64 && m.message.ends_with("more bytes]"),
            "{}",
            m.message.len()
        );
    }
}
