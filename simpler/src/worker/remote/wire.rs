//! The bodies of the session frames between a root (an L4 Worker) and a node (a remote L3
//! Worker), on top of `net::frame`.
//!
//! * `TASK`: the callable's digest and name, the config, the arguments (the local wire blob:
//!   descriptors, views, scalars), then for each tensor a flag and, unless it stays on the node,
//!   the bytes its view spans in its buffer with their offset (a node shares no memory with the
//!   root).
//! * `COMPLETION`: a status code, a message, and the bytes every written view spans, by tensor
//!   index, with their offset.
//! * `CONTROL` / `CONTROL_REPLY`: a command (`CHECK_CALLABLE`: does the node run this digest?)
//!   and its answer.
//! * `HEALTH`, `SHUTDOWN`: empty.
//!
//! Every length is checked against what is left of the body (`BodyReader`), so a hostile body
//! gives a named error, never a panic or an allocation larger than the frame.

use crate::callable::identity::Digest;
use crate::data::buffer::Access;
use crate::data::call_config::CallConfig;
use crate::data::task_args::TaskArgs;
use crate::data::wire::{CALL_CONFIG_WIRE_SIZE, blob_size, decode_config, encode_args, encode_config};
use crate::error::{Error, Result};
use crate::net::frame::{BodyReader, BodyWriter, FrameError};

/// COMPLETION status: the task succeeded.
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

/// Largest encoded argument blob a TASK carries (tensors' descriptors and views, scalars).
const MAX_ARGS_BLOB: usize = 1 << 20;

/// A TASK as the node reads it.
pub(crate) struct TaskMsg<'a> {
    pub(crate) digest: Digest,
    pub(crate) name: String,
    pub(crate) config: CallConfig,
    pub(crate) args_blob: &'a [u8],
    /// For each tensor, the bytes its view spans in its buffer and where they start.
    pub(crate) data: Vec<Option<(u64, &'a [u8])>>,
}

fn bad(e: FrameError) -> Error {
    Error::decode(format!("malformed message: {e}"))
}

/// Encodes a TASK; `data(i)` gives the bytes tensor `i`'s view spans and their offset in its
/// buffer (`None` for a tensor that stays on the node).
pub(crate) fn encode_task(
    digest: &Digest,
    name: &str,
    config: Option<&CallConfig>,
    args: &TaskArgs,
    mut data: impl FnMut(usize) -> Result<Option<(u64, Vec<u8>)>>,
) -> Result<Vec<u8>> {
    let data: Vec<Option<(u64, Vec<u8>)>> = (0..args.tensors.len()).map(&mut data).collect::<Result<_>>()?;
    let bytes: usize = data.iter().flatten().map(|(_, d)| d.len() + 12).sum();
    let mut w = BodyWriter::with_capacity(
        64 + name.len() + CALL_CONFIG_WIRE_SIZE + MAX_ARGS_BLOB.min(1 << 12) + bytes,
    );
    w.raw(digest.as_bytes()).bytes(name.as_bytes());
    let mut cfg = [0u8; CALL_CONFIG_WIRE_SIZE];
    if let Some(c) = config {
        encode_config(c, &mut cfg);
    }
    w.raw(&cfg);
    let size = blob_size(args.tensors.len(), args.scalars.len());
    if size > MAX_ARGS_BLOB {
        return Err(Error::invalid(format!(
            "a task's arguments take {size} bytes encoded, over the {MAX_ARGS_BLOB}-byte limit of a remote task"
        )));
    }
    let mut blob = vec![0u8; size];
    let n =
        encode_args(args.tensors.iter().zip(args.tags.iter().map(|t| t.access())), &args.scalars, &mut blob)?;
    w.bytes(&blob[..n]);
    w.u32(args.tensors.len() as u32);
    for d in &data {
        match d {
            Some((offset, bytes)) => {
                w.u8(1).u64(*offset).bytes(bytes);
            }
            None => {
                w.u8(0);
            }
        }
    }
    Ok(w.finish())
}

/// Decodes a TASK body.
pub(crate) fn decode_task(body: &[u8]) -> Result<TaskMsg<'_>> {
    let mut r = BodyReader::new(body);
    let digest: [u8; 32] = r.raw(32).map_err(bad)?.try_into().expect("32 bytes");
    let name = String::from_utf8_lossy(r.bytes().map_err(bad)?).into_owned();
    let config = decode_config(r.raw(CALL_CONFIG_WIRE_SIZE).map_err(bad)?)?;
    let args_blob = r.bytes().map_err(bad)?;
    let n = r.u32().map_err(bad)? as usize;
    if n > args_blob.len() {
        return Err(Error::decode(format!(
            "a TASK names {n} tensors but its argument blob cannot hold them"
        )));
    }
    let mut data = Vec::with_capacity(n);
    for _ in 0..n {
        data.push(match r.u8().map_err(bad)? {
            0 => None,
            1 => {
                let offset = r.u64().map_err(bad)?;
                Some((offset, r.bytes().map_err(bad)?))
            }
            f => return Err(Error::decode(format!("tensor data flag {f}"))),
        });
    }
    r.finish().map_err(bad)?;
    Ok(TaskMsg { digest: Digest::from_bytes(digest), name, config, args_blob, data })
}

/// A COMPLETION as the root reads it.
pub(crate) struct CompletionMsg<'a> {
    pub(crate) status: u32,
    pub(crate) message: String,
    /// The bytes every written view spans, by tensor index, with their offset in the buffer.
    pub(crate) outputs: Vec<(usize, u64, &'a [u8])>,
}

/// Encodes a COMPLETION.
pub(crate) fn encode_completion(status: u32, message: &str, outputs: &[(usize, u64, Vec<u8>)]) -> Vec<u8> {
    let bytes: usize = outputs.iter().map(|(_, _, b)| b.len() + 16).sum();
    let mut w = BodyWriter::with_capacity(12 + message.len() + bytes);
    w.u32(status).bytes(message.as_bytes()).u32(outputs.len() as u32);
    for (i, offset, bytes) in outputs {
        w.u32(*i as u32).u64(*offset).bytes(bytes);
    }
    w.finish()
}

/// Decodes a COMPLETION body.
pub(crate) fn decode_completion(body: &[u8]) -> Result<CompletionMsg<'_>> {
    let mut r = BodyReader::new(body);
    let status = r.u32().map_err(bad)?;
    let message = String::from_utf8_lossy(r.bytes().map_err(bad)?).into_owned();
    let n = r.u32().map_err(bad)? as usize;
    if n > r.remaining() {
        return Err(Error::decode(format!("a COMPLETION names {n} outputs but carries fewer bytes")));
    }
    let mut outputs = Vec::with_capacity(n);
    for _ in 0..n {
        let i = r.u32().map_err(bad)? as usize;
        let offset = r.u64().map_err(bad)?;
        outputs.push((i, offset, r.bytes().map_err(bad)?));
    }
    r.finish().map_err(bad)?;
    Ok(CompletionMsg { status, message, outputs })
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
        assert_eq!((m.status, m.message.as_str(), m.outputs.len()), (TASK_FAILED, "boom", 1));
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
        assert_eq!((task.digest, task.name.as_str(), task.data.len()), (d, "f", 0));
        for cut in 0..t.len() {
            assert!(decode_task(&t[..cut]).is_err(), "{cut}");
        }
    }
}
