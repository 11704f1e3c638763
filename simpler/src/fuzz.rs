//! The decoders that read bytes another process wrote, as the fuzz harness reaches them
//! (`fuzz/`, package `simpler-fuzz`): the args blob, `CallConfig` and buffer descriptor of the
//! wire codec, callable descriptors, chip descriptor payloads, the task and base frames of a
//! mailbox (the request fields a child reads, the error tail and control result a parent reads
//! back), and the remote session's frames, TASK and COMPLETION bodies.
//!
//! Hidden, behind the `fuzz` feature: not a public API, nothing here is stable, and the library
//! itself never calls it. Per decoder, two entry points:
//!
//! * the **decoder** (`wire_args`, ..., [`Frames::task_frame`]) takes the bytes, decodes them
//!   as the receiving process does (and what that process does next with the value), and
//!   checks what the decoder promises. Its [`Verdict`]: `Ok(true)` accepted, and the value
//!   survives a re-encode; `Ok(false)` refused with an error of a kind the decoder documents,
//!   with a message; `Err(problem)` anything else (a finding). A panic is the caller's to catch.
//! * a **valid encoding** (`valid_wire_args`, ...) made by the real encoders, drawing from the
//!   caller's random source, for the harness to mutate. A frame's image is the harness's to
//!   build, from the layout constants here.
//!
//! ```
//! use simpler::__fuzz::{valid_wire_args, wire_args};
//! let mut n = 0u64;
//! let mut next = || {
//!     n = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
//!     n
//! };
//! let blob = valid_wire_args(&mut next);
//! assert!(wire_args(&blob).is_ok()); // accepted, or refused for its spare bytes
//! assert_eq!(wire_args(&[1, 2, 3]), Ok(false)); // refused: too short
//! ```

use std::time::Instant;

use crate::callable::host::{HostFnPtr, HostResult};
use crate::callable::identity::{
    CallableKind, Descriptor, DescriptorWriter, Digest, host_fn_descriptor, orch_fn_descriptor,
};
use crate::chip::{ChipBody, ChipFn, ChipOrchFnPtr};
use crate::data::buffer::{Access, Backing, BufferDesc, Identity};
use crate::data::call_config::{CallConfig, OUTPUT_PREFIX_LEN, RING_DEPTH};
use crate::data::dtype::DataType;
use crate::data::host_args::HostArgs;
use crate::data::task_args::TaskArgs;
use crate::data::tensor::{Tensor, TensorView, overlap};
use crate::data::wire::{
    blob_size, decode_args, decode_config, decode_desc, encode_args, encode_config, encode_desc,
};
use crate::engine::orchestrator::Orchestrator;
use crate::error::{Error, ErrorKind, Result};
use crate::ipc::mailbox::{self, FrameError, HostileFrames, InitStatus};

/// What a decoder made of one input: accepted (`true`), or refused with a named error
/// (`false`); `Err` is a finding, saying what went wrong.
///
/// ```
/// let v: simpler::__fuzz::Verdict = simpler::__fuzz::wire_config(&[]);
/// assert_eq!(v, Ok(false));
/// ```
pub type Verdict = std::result::Result<bool, String>;

// ---------------------------------------------------------------------------------------------
// The layouts the harness builds frame images and targets length fields with.

/// Bytes of a mailbox frame image ([`Frames::task_frame`], [`Frames::base_frame`]).
pub const FRAME_SIZE: usize = mailbox::FRAME_SIZE;
/// Bytes of a frame's payload (the args blob or a control payload).
pub const ARGS_CAPACITY: usize = mailbox::ARGS_CAPACITY;
/// Bytes of a frame's error tail, its last bytes.
pub const ERROR_MSG_CAPACITY: usize = mailbox::ERROR_MSG_CAPACITY;
/// Bytes of an encoded `CallConfig` (`wire_config`'s input).
pub const CALL_CONFIG_WIRE_SIZE: usize = crate::data::wire::CALL_CONFIG_WIRE_SIZE;
/// Bytes of an encoded buffer descriptor (`wire_desc`'s input).
pub const DESC_SIZE: usize = crate::data::wire::DESC_SIZE;
/// A frame's state word (its first four bytes, native endian): a task posted to a child.
pub const TASK_READY: u32 = mailbox::TASK_READY;
/// State word: a task the child has answered.
pub const TASK_DONE: u32 = mailbox::TASK_DONE;
/// State word: nothing posted.
pub const IDLE: u32 = mailbox::IDLE;
/// State word: a request the child has taken.
pub const BUSY: u32 = mailbox::BUSY;
/// State word: a control request posted to a child.
pub const CONTROL_REQUEST: u32 = mailbox::CONTROL_REQUEST;
/// State word: a control request the child has answered.
pub const CONTROL_DONE: u32 = mailbox::CONTROL_DONE;
/// State word: the child failed to start (the error tail says why).
pub const INIT_FAILED: u32 = mailbox::INIT_FAILED;
/// State word: the child started.
pub const INIT_READY: u32 = mailbox::INIT_READY;

// ---------------------------------------------------------------------------------------------
// Decoders.

/// The private mailbox the frame decoders read: a frame image is planted in it, as a peer that
/// ignores the protocol would leave it, and the real readers run on it.
///
/// ```
/// let mut frames = simpler::__fuzz::Frames::new().unwrap();
/// let idle = vec![0u8; simpler::__fuzz::FRAME_SIZE];
/// assert_eq!(frames.task_frame(&idle), Ok(false)); // nothing to take
/// ```
pub struct Frames {
    frames: HostileFrames,
    image: Box<[u8; FRAME_SIZE]>,
}

impl std::fmt::Debug for Frames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frames").finish_non_exhaustive()
    }
}

impl Frames {
    /// Maps a private one-mailbox region.
    ///
    /// ```
    /// assert!(simpler::__fuzz::Frames::new().is_ok());
    /// ```
    pub fn new() -> Result<Frames> {
        let image = vec![0u8; FRAME_SIZE].into_boxed_slice().try_into().expect("FRAME_SIZE bytes");
        Ok(Frames { frames: HostileFrames::new()?, image })
    }

    fn plant_image(&mut self, input: &[u8]) {
        let n = input.len().min(FRAME_SIZE);
        self.image[..n].copy_from_slice(&input[..n]);
        self.image[n..].fill(0);
    }

    /// A task frame: `input` (cut or zero-padded to [`FRAME_SIZE`]) planted as the frame, then
    /// what a child does (take the request, decode its args and config, answer with an error)
    /// and what the parent does (collect the answer, read the error tail).
    ///
    /// ```
    /// let mut frames = simpler::__fuzz::Frames::new().unwrap();
    /// let mut image = vec![0u8; simpler::__fuzz::FRAME_SIZE];
    /// image[..4].copy_from_slice(&simpler::__fuzz::TASK_DONE.to_ne_bytes());
    /// assert_eq!(frames.task_frame(&image), Ok(true)); // a success collected
    /// ```
    pub fn task_frame(&mut self, input: &[u8]) -> Verdict {
        self.plant_image(input);
        let image = &self.image;
        let state = u32::from_ne_bytes(image[0..4].try_into().expect("4 bytes"));
        let (mb, parent) = self.frames.plant(false, image);
        if let Some(req) = mb.task_request() {
            if state != TASK_READY {
                return Err(format!("a task was taken from state {state}"));
            }
            let (args, config) = (req.args(), req.config());
            if args.len() > ARGS_CAPACITY || config.len() != mailbox::CONFIG_BYTES {
                return Err(format!("task slices of {} and {} bytes", args.len(), config.len()));
            }
            // What a child does with them: decode both.
            let accepted = wire_args(args)? & wire_config(config)?;
            // Reply with a message made of frame bytes, then read it back as the parent.
            let code = i32::from_ne_bytes(image[4..8].try_into().expect("4 bytes"));
            let text = String::from_utf8_lossy(&image[64..64 + 2 * ERROR_MSG_CAPACITY]).into_owned();
            mb.finish_task(req, Err(FrameError::new(code, text.clone())), parent);
            match mb.take_task_result_at(0) {
                Some(Err(e)) if e.code != 0 && text.starts_with(&e.message) => check_tail(&e)?,
                other => return Err(format!("the reply read back as {other:?}")),
            }
            return Ok(accepted);
        }
        if state == TASK_READY {
            return Err("a TASK_READY frame was not taken".into());
        }
        match mb.take_task_result_at(0) {
            None if state != TASK_DONE => Ok(false),
            Some(Ok(())) if state == TASK_DONE => Ok(true),
            Some(Err(e)) if state == TASK_DONE => check_tail(&e).map(|()| false),
            other => Err(format!("state {state} collected as {other:?}")),
        }
    }

    /// A base frame: `input` planted as the frame, then what a child does with a control
    /// request (read it, decode its payload as a descriptor or a callable, answer with an
    /// error) and what the parent reads (the control result and error tail, a startup failure).
    ///
    /// ```
    /// let mut frames = simpler::__fuzz::Frames::new().unwrap();
    /// let mut image = vec![0u8; simpler::__fuzz::FRAME_SIZE];
    /// image[..4].copy_from_slice(&simpler::__fuzz::INIT_READY.to_ne_bytes());
    /// assert_eq!(frames.base_frame(&image), Ok(true));
    /// ```
    pub fn base_frame(&mut self, input: &[u8]) -> Verdict {
        self.plant_image(input);
        let image = &self.image;
        let state = u32::from_ne_bytes(image[0..4].try_into().expect("4 bytes"));
        let (mb, parent) = self.frames.plant(true, image);
        let now = Instant::now;
        match state {
            CONTROL_REQUEST => {
                let Some(req) = mb.control_request() else {
                    return Err("a CONTROL_REQUEST frame was not read".into());
                };
                if req.payload.len() > ARGS_CAPACITY {
                    return Err(format!("a control payload of {} bytes", req.payload.len()));
                }
                // What a child does with a payload: a descriptor and two words (copies) or a
                // callable descriptor (registration).
                let mut accepted = false;
                if req.payload.len() >= DESC_SIZE + 16 {
                    accepted |= wire_desc(&req.payload)?;
                }
                accepted |= callable_descriptor(req.payload.clone())?;
                let code = i32::from_ne_bytes(image[4..8].try_into().expect("4 bytes"));
                let text = String::from_utf8_lossy(&req.payload).into_owned();
                mb.finish_control(Err(FrameError::new(code, text.clone())), parent);
                match mb.wait_control_done(Some(now()), || true) {
                    Some(Err(e)) if e.code != 0 && text.starts_with(&e.message) => check_tail(&e)?,
                    other => return Err(format!("the control reply read back as {other:?}")),
                }
                Ok(accepted)
            }
            INIT_FAILED => match mb.wait_init(now(), || true) {
                InitStatus::Failed(message) => check_tail(&FrameError::new(-1, message)).map(|()| false),
                other => Err(format!("INIT_FAILED read as {other:?}")),
            },
            INIT_READY => match mb.wait_init(now(), || true) {
                InitStatus::Ready => Ok(true),
                other => Err(format!("INIT_READY read as {other:?}")),
            },
            _ => {
                if mb.control_request().is_some() {
                    return Err(format!("a control request was read from state {state}"));
                }
                match mb.wait_control_done(Some(now()), || true) {
                    Some(Ok(_)) if state == CONTROL_DONE => Ok(true),
                    Some(Err(e)) if state != BUSY => check_tail(&e).map(|()| false),
                    None if state == BUSY => Ok(false),
                    other => Err(format!("state {state} collected as {other:?}")),
                }
            }
        }
    }
}

/// The largest body a fuzzed remote frame may declare.
const REMOTE_MAX_BODY: usize = 4096;

/// `net::frame::read_frame` on `input` as a socket's bytes (bodies up to 4 KiB): an accepted
/// frame must write back as the bytes it was read from.
///
/// ```
/// assert_eq!(simpler::__fuzz::remote_frame(&[]), Ok(false)); // closed before a frame
/// ```
pub fn remote_frame(input: &[u8]) -> Verdict {
    use crate::net::frame::{FrameError, read_frame, write_frame};
    match read_frame(&mut &input[..], REMOTE_MAX_BODY) {
        Ok(f) => {
            if f.body.len() > REMOTE_MAX_BODY {
                return Err(format!(
                    "a body of {} bytes passed a {REMOTE_MAX_BODY}-byte limit",
                    f.body.len()
                ));
            }
            let mut again = Vec::new();
            write_frame(&mut again, f.kind, f.seq, &f.body).map_err(|e| format!("re-encoding: {e}"))?;
            if !input.starts_with(&again) {
                return Err("an accepted frame re-encodes to other bytes".into());
            }
            Ok(true)
        }
        Err(FrameError::Closed | FrameError::Malformed(_)) => Ok(false),
        Err(FrameError::Io(e)) => Err(format!("reading from memory gave an I/O error: {e}")),
    }
}

/// The body of a remote TASK as a node decodes it, then its argument blob ([`wire_args`]).
///
/// ```
/// assert_eq!(simpler::__fuzz::remote_task(&[1, 2, 3]), Ok(false));
/// ```
pub fn remote_task(input: &[u8]) -> Verdict {
    match crate::worker::remote::wire::decode_task(input) {
        Ok(t) => {
            // What a node does next: decode the argument blob.
            let args_ok = wire_args(t.head.args_blob)?;
            let data: usize = t.data.iter().flatten().map(|(_, d)| d.len()).sum();
            if data > input.len() {
                return Err(format!("{data} bytes of tensor data from a {}-byte body", input.len()));
            }
            Ok(args_ok)
        }
        Err(e) => refused(&e, &[ErrorKind::Decode, ErrorKind::InvalidArgument]),
    }
}

/// The body of a remote COMPLETION as a root decodes it.
///
/// ```
/// assert_eq!(simpler::__fuzz::remote_completion(&[1, 2, 3]), Ok(false));
/// ```
pub fn remote_completion(input: &[u8]) -> Verdict {
    match crate::worker::remote::wire::decode_completion(input) {
        Ok(c) => {
            let bytes: usize = c.outputs.iter().map(|(_, _, b)| b.len()).sum();
            if c.outputs.iter().zip(&c.head.outputs).any(|(o, h)| o.2.len() as u64 != h.2 || o.0 != h.0) {
                return Err("a completion's outputs differ from what its head lists".into());
            }
            if bytes + c.head.message.len() > input.len() * 3 {
                return Err("a completion decoded into more than its body held".into());
            }
            Ok(true)
        }
        Err(e) => refused(&e, &[ErrorKind::Decode]),
    }
}

/// An error read back from a frame: a non-zero code and a bounded message.
fn check_tail(e: &FrameError) -> std::result::Result<(), String> {
    if e.code == 0 {
        return Err(format!("an error with code 0: {e:?}"));
    }
    if e.message.chars().count() > ERROR_MSG_CAPACITY || e.message.contains('\0') {
        return Err(format!("an error message of {} bytes or with a NUL", e.message.len()));
    }
    Ok(())
}

/// A refusal must be a named error of one of `kinds`, with a message.
fn refused(e: &Error, kinds: &[ErrorKind]) -> Verdict {
    if !kinds.contains(&e.kind()) || e.message().is_empty() {
        return Err(format!("refused with an unexpected error: {e:?} (expected one of {kinds:?})"));
    }
    Ok(false)
}

/// `wire::decode_args`, the args blob of a task frame, then what a child does with its
/// tensors (attach, measure, compare); an accepted blob must decode the same after a
/// re-encode.
///
/// ```
/// assert_eq!(simpler::__fuzz::wire_args(&[0; 8]), Ok(true)); // no tensor, no scalar
/// ```
pub fn wire_args(input: &[u8]) -> Verdict {
    let d = match decode_args(input) {
        Ok(d) => d,
        Err(e) => return refused(&e, &[ErrorKind::Decode]),
    };
    if blob_size(d.tensors.len(), d.scalars.len()) > input.len() {
        return Err(format!("decoded more than the input holds: {d:?}"));
    }
    // What a child does with the tensors next: attach, measure, compare.
    let mut tensors = Vec::with_capacity(d.tensors.len());
    for t in &d.tensors {
        let tensor =
            Tensor::from_desc(t.desc, t.view).map_err(|e| format!("a decoded tensor does not fit: {e}"))?;
        let v = t.view;
        let _ = (v.num_elements(), v.is_contiguous(), v.byte_range(), overlap(&v, &v));
        tensors.push(tensor);
    }
    let mut again = vec![0; blob_size(tensors.len(), d.scalars.len())];
    let iter = tensors.iter().map(|t| (t, t.desc().access()));
    encode_args(iter, &d.scalars, &mut again).map_err(|e| format!("re-encoding failed: {e}"))?;
    match decode_args(&again) {
        Ok(back) if back == d => Ok(true),
        other => Err(format!("re-encoded args decode differently: {other:?} vs {d:?}")),
    }
}

/// `wire::decode_config`, the `CallConfig` of a task frame.
///
/// ```
/// let zeros = [0u8; simpler::__fuzz::CALL_CONFIG_WIRE_SIZE];
/// assert_eq!(simpler::__fuzz::wire_config(&zeros), Ok(true)); // the default config
/// ```
pub fn wire_config(input: &[u8]) -> Verdict {
    let cfg = match decode_config(input) {
        Ok(c) => c,
        Err(e) => return refused(&e, &[ErrorKind::Decode]),
    };
    let mut again = [0u8; CALL_CONFIG_WIRE_SIZE];
    encode_config(&cfg, &mut again);
    match decode_config(&again) {
        Ok(back) if back == cfg => Ok(true),
        other => Err(format!("re-encoded config decodes differently: {other:?} vs {cfg:?}")),
    }
}

/// `wire::decode_desc`, a buffer descriptor of a control payload; a memfd backing it accepts
/// must name a valid process, descriptor and inode.
///
/// ```
/// assert_eq!(simpler::__fuzz::wire_desc(&[0; 4]), Ok(false));
/// ```
pub fn wire_desc(input: &[u8]) -> Verdict {
    let desc = match decode_desc(input) {
        Ok(d) => d,
        Err(e) => return refused(&e, &[ErrorKind::Decode]),
    };
    // A memfd backing names a process and a descriptor a child will open: only valid ones pass.
    if let Backing::Memfd { pid, fd, ino } = desc.backing()
        && (pid == 0 || pid > i32::MAX as u32 || fd > i32::MAX as u32 || ino == 0)
    {
        return Err(format!("an out-of-range memfd backing was accepted: {desc:?}"));
    }
    let mut again = [0u8; DESC_SIZE];
    encode_desc(&desc, &mut again);
    match decode_desc(&again) {
        Ok(back) if back == desc => Ok(true),
        other => Err(format!("re-encoded descriptor decodes differently: {other:?} vs {desc:?}")),
    }
}

/// `Descriptor::from_bytes`, a callable descriptor of a `REGISTER_*` control (owned, as the
/// decoder takes it).
///
/// ```
/// assert_eq!(simpler::__fuzz::callable_descriptor(vec![0; 3]), Ok(false));
/// ```
pub fn callable_descriptor(input: Vec<u8>) -> Verdict {
    let digest = Digest::of(&input);
    let len = input.len();
    match Descriptor::from_bytes(input) {
        Ok(d) if d.digest() == digest && d.bytes().len() == len => Ok(true),
        Ok(d) => Err(format!("a descriptor that does not match its bytes: {d:?}")),
        Err(e) => refused(&e, &[ErrorKind::Decode, ErrorKind::Callable]),
    }
}

fn noop_kernel(_: &HostArgs<'_>) -> HostResult {
    Ok(())
}

fn noop_orch(_: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> Result<()> {
    Ok(())
}

/// `ChipFn::from_parts`, the payload of a chip callable descriptor, with a kernel and with an
/// orchestration as its body.
///
/// ```
/// assert_eq!(simpler::__fuzz::chip_descriptor(vec![0; 3]), Ok(false));
/// ```
pub fn chip_descriptor(input: Vec<u8>) -> Verdict {
    let d = match Descriptor::from_bytes(input) {
        Ok(d) => d,
        Err(e) => return refused(&e, &[ErrorKind::Decode, ErrorKind::Callable]),
    };
    let kernel: HostFnPtr = noop_kernel;
    let orch: ChipOrchFnPtr = noop_orch;
    let mut accepted = false;
    for body in [ChipBody::Kernel(kernel), ChipBody::Orchestration(orch)] {
        match ChipFn::from_parts(body, d.clone()) {
            Ok(f) if f.descriptor() == &d && f.name().len() <= d.bytes().len() => accepted = true,
            Ok(f) => return Err(format!("a chip callable that does not match its descriptor: {f:?}")),
            Err(e) => {
                refused(&e, &[ErrorKind::Decode, ErrorKind::Callable])?;
            }
        }
    }
    Ok(accepted)
}

// ---------------------------------------------------------------------------------------------
// Valid encodings, from the real encoders.

/// A valid args blob: up to 4 tensors of every backing and up to 5 scalars, sometimes with
/// spare bytes after it.
///
/// ```
/// let mut n = 0u64;
/// let blob = simpler::__fuzz::valid_wire_args(&mut || {
///     n += 1;
///     n
/// });
/// assert!(simpler::__fuzz::wire_args(&blob).is_ok());
/// ```
pub fn valid_wire_args(next: &mut dyn FnMut() -> u64) -> Vec<u8> {
    args_blob(&mut Draw(next))
}

/// A valid `CallConfig` encoding, sometimes with spare bytes after it.
///
/// ```
/// let bytes = simpler::__fuzz::valid_wire_config(&mut || 7);
/// assert!(bytes.len() >= simpler::__fuzz::CALL_CONFIG_WIRE_SIZE);
/// ```
pub fn valid_wire_config(next: &mut dyn FnMut() -> u64) -> Vec<u8> {
    config_bytes(&mut Draw(next))
}

/// A valid buffer descriptor encoding, sometimes with spare bytes after it.
///
/// ```
/// let bytes = simpler::__fuzz::valid_wire_desc(&mut || 7);
/// assert!(bytes.len() >= simpler::__fuzz::DESC_SIZE);
/// ```
pub fn valid_wire_desc(next: &mut dyn FnMut() -> u64) -> Vec<u8> {
    desc_bytes(&mut Draw(next))
}

/// A callable descriptor: of a host function, an orchestration or a chip callable, one of
/// made-up fields, or (rarely) a version word and random bytes.
///
/// ```
/// let bytes = simpler::__fuzz::valid_callable_descriptor(&mut || 0);
/// assert!(simpler::__fuzz::callable_descriptor(bytes).is_ok());
/// ```
pub fn valid_callable_descriptor(next: &mut dyn FnMut() -> u64) -> Vec<u8> {
    callable_bytes(&mut Draw(next))
}

/// A chip callable's descriptor (a kernel or an orchestration).
///
/// ```
/// let bytes = simpler::__fuzz::valid_chip_descriptor(&mut || 0);
/// assert_eq!(simpler::__fuzz::chip_descriptor(bytes), Ok(true));
/// ```
pub fn valid_chip_descriptor(next: &mut dyn FnMut() -> u64) -> Vec<u8> {
    chip_bytes(&mut Draw(next))
}

/// A remote session frame of any kind, with a random body.
///
/// ```
/// let bytes = simpler::__fuzz::valid_remote_frame(&mut || 0);
/// assert_eq!(simpler::__fuzz::remote_frame(&bytes), Ok(true));
/// ```
pub fn valid_remote_frame(next: &mut dyn FnMut() -> u64) -> Vec<u8> {
    remote_frame_bytes(&mut Draw(next))
}

/// A remote TASK body.
///
/// ```
/// let bytes = simpler::__fuzz::valid_remote_task(&mut || 0);
/// assert!(simpler::__fuzz::remote_task(&bytes).is_ok());
/// ```
pub fn valid_remote_task(next: &mut dyn FnMut() -> u64) -> Vec<u8> {
    remote_task_bytes(&mut Draw(next))
}

/// A remote COMPLETION body.
///
/// ```
/// let bytes = simpler::__fuzz::valid_remote_completion(&mut || 0);
/// assert_eq!(simpler::__fuzz::remote_completion(&bytes), Ok(true));
/// ```
pub fn valid_remote_completion(next: &mut dyn FnMut() -> u64) -> Vec<u8> {
    remote_completion_bytes(&mut Draw(next))
}

/// The caller's random source, drawn from the way the harness's generator draws (so an input
/// is the same whichever side of the crate boundary draws it).
struct Draw<'a>(&'a mut dyn FnMut() -> u64);

impl Draw<'_> {
    fn next_u64(&mut self) -> u64 {
        (self.0)()
    }

    /// A number in `0..n` (0, drawing nothing, when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// True with probability `1 / n`.
    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    /// An index into a collection of `n` items (`n > 0`).
    fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.index(items.len())]
    }

    fn fill(&mut self, out: &mut [u8]) {
        for b in out {
            *b = self.next_u64() as u8;
        }
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        self.fill(&mut v);
        v
    }
}

/// A valid remote frame of a random kind and body (then mutated by the caller).
fn remote_frame_bytes(rng: &mut Draw<'_>) -> Vec<u8> {
    use crate::net::frame::{FrameKind, write_frame};
    let kind = rng.pick(&FrameKind::ALL);
    let n = rng.index(64);
    let body = rng.bytes(n);
    let mut out = Vec::new();
    write_frame(&mut out, kind, rng.next_u64(), &body).expect("writing to memory");
    out
}

/// A valid TASK body (then mutated by the caller).
fn remote_task_bytes(rng: &mut Draw<'_>) -> Vec<u8> {
    let mut args = crate::data::task_args::TaskArgs::new();
    for _ in 0..rng.index(3) {
        let _ = args.input(&tensor(rng));
    }
    for _ in 0..rng.index(3) {
        args.scalar(rng.next_u64());
    }
    let digest = crate::callable::identity::Digest::from_bytes([rng.below(256) as u8; 32]);
    let cfg = config(rng);
    let with_cfg = rng.one_in(2);
    crate::worker::remote::wire::encode_task(&digest, "fuzzed", with_cfg.then_some(&cfg), &args, |_| {
        Ok(Some((0, vec![7u8; 16])))
    })
    .unwrap_or_default()
}

/// A valid COMPLETION body (then mutated by the caller).
fn remote_completion_bytes(rng: &mut Draw<'_>) -> Vec<u8> {
    let outputs: Vec<(usize, u64, Vec<u8>)> = (0..rng.index(3))
        .map(|i| {
            let n = rng.index(32);
            (i, rng.below(64), rng.bytes(n))
        })
        .collect();
    crate::worker::remote::wire::encode_completion(rng.below(6) as u32, "message", &outputs)
}

fn identity(rng: &mut Draw<'_>) -> Identity {
    let owner = rng.next_u64();
    let id = 1 + {
        let bits = rng.pick(&[8, 32, 63]);
        rng.below(1 << bits)
    };
    let generation = 1 + rng.below(u64::from(u32::MAX - 1)) as u32;
    Identity::new(owner, id, generation).expect("non-zero id and generation")
}

/// A valid memfd backing: pid 1..=i32::MAX, fd 0..=i32::MAX, inode non-zero, with edge
/// values often.
fn memfd(rng: &mut Draw<'_>) -> Backing {
    let max = i32::MAX as u64;
    let (any_pid, any_fd, any_ino) = (1 + rng.below(max), rng.below(max + 1), 1 + rng.below(u64::MAX - 1));
    let pid = rng.pick(&[1, max, any_pid]) as u32;
    let fd = rng.pick(&[0, 3, max, any_fd]) as u32;
    let ino = rng.pick(&[1, u64::MAX, any_ino]);
    Backing::Memfd { pid, fd, ino }
}

fn desc(rng: &mut Draw<'_>, nbytes: u64) -> BufferDesc {
    let backing = match rng.below(3) {
        0 => Backing::HeapSlab { addr: 1 + rng.below(u64::MAX - 1), ino: 1 + rng.below(u64::MAX - 1) },
        1 => memfd(rng),
        _ => Backing::Device { ptr: rng.next_u64(), chip: rng.below(8) as u32 },
    };
    let access = rng.pick(&[Access::Read, Access::Write, Access::ReadWrite]);
    BufferDesc::new(identity(rng), backing, access, nbytes).expect("a valid backing")
}

fn view(rng: &mut Draw<'_>) -> TensorView {
    let dtype = DataType::from_u8(rng.below(DataType::ALL.len() as u64) as u8)
        .expect("every index of ALL is a data type");
    let nd = 1 + rng.index(5);
    let big = rng.one_in(8);
    let shape: Vec<u32> = (0..nd).map(|_| 1 + rng.below(if big { 1 << 16 } else { 8 }) as u32).collect();
    let strides: Option<Vec<u32>> = rng
        .one_in(2)
        .then(|| (0..nd).map(|_| 1 + rng.below(if big { 1 << 20 } else { 16 }) as u32).collect());
    let offset = rng.below(64) * dtype.size() as u64;
    TensorView::new(offset, &shape, strides.as_deref(), dtype)
        .or_else(|_| TensorView::new(offset, &[1], None, dtype))
        .expect("a one-element view is valid")
}

fn tensor(rng: &mut Draw<'_>) -> Tensor {
    let v = view(rng);
    let nbytes = v.byte_range().1 + rng.below(64);
    Tensor::from_desc(desc(rng, nbytes), v).expect("the buffer holds the view")
}

fn args_blob(rng: &mut Draw<'_>) -> Vec<u8> {
    let tensors: Vec<Tensor> = (0..rng.index(5)).map(|_| tensor(rng)).collect();
    let scalars: Vec<u64> = (0..rng.index(6)).map(|_| rng.next_u64()).collect();
    let mut out = vec![0; blob_size(tensors.len(), scalars.len()) + rng.pick(&[0, 0, 1, 8, 144])];
    let iter = tensors.iter().map(|t| (t, if rng.one_in(2) { t.desc().access() } else { Access::Read }));
    let iter: Vec<_> = iter.collect();
    encode_args(iter.into_iter(), &scalars, &mut out).expect("the blob fits");
    out
}

fn config(rng: &mut Draw<'_>) -> CallConfig {
    let flag = |rng: &mut Draw<'_>| rng.below(2) as i32;
    let ints = [
        rng.pick(&[0, 0, 2, 4, 8]),
        rng.below(5) as i32,
        flag(rng),
        rng.pick(&[0, 0, 1, 7]),
        flag(rng),
        flag(rng),
    ];
    let mut rings = [[0u64; RING_DEPTH]; 3];
    for d in 0..RING_DEPTH {
        let valid = [4 << rng.below(8), 1024 + rng.below(1 << 20), 4 + rng.below(1000)];
        for (array, v) in rings.iter_mut().zip(valid) {
            array[d] = if rng.one_in(2) { 0 } else { v };
        }
    }
    let mut prefix = [0u8; OUTPUT_PREFIX_LEN];
    let text = ["", "out", "/tmp/run-1/", "dump\u{e9}\u{1F600}"][rng.index(4)];
    prefix[..text.len()].copy_from_slice(text.as_bytes());
    let cfg = CallConfig::from_wire(ints, rings, &prefix).unwrap_or_default();
    if cfg.validate().is_ok() { cfg } else { CallConfig::default().output_prefix("out") }
}

fn config_bytes(rng: &mut Draw<'_>) -> Vec<u8> {
    let mut out = [0u8; CALL_CONFIG_WIRE_SIZE];
    encode_config(&config(rng), &mut out);
    let mut v = out.to_vec();
    v.extend({
        let n = rng.pick(&[0, 0, 1, 16]);
        rng.bytes(n)
    });
    v
}

fn desc_bytes(rng: &mut Draw<'_>) -> Vec<u8> {
    let mut out = [0u8; DESC_SIZE];
    let nbytes = rng.next_u64() >> rng.below(64);
    encode_desc(&desc(rng, nbytes), &mut out);
    let mut v = out.to_vec();
    v.extend({
        let n = rng.pick(&[0, 0, 16, 17]);
        rng.bytes(n)
    });
    v
}

fn name(rng: &mut Draw<'_>) -> String {
    let parts = ["k", "vadd", "relu_f32", "\u{e9}t\u{e9}", "\u{1F600}", "a::b<c>", ""];
    (0..1 + rng.index(3)).map(|_| parts[rng.index(parts.len())]).collect()
}

fn callable_bytes(rng: &mut Draw<'_>) -> Vec<u8> {
    match rng.below(5) {
        0 => host_fn_descriptor(&name(rng), &name(rng), rng.next_u64()).bytes().to_vec(),
        1 => orch_fn_descriptor(&name(rng), &name(rng), rng.next_u64()).bytes().to_vec(),
        2 => chip_bytes(rng),
        3 => {
            let kind = rng.pick(&[CallableKind::HostFn, CallableKind::Orch, CallableKind::Chip]);
            let mut w = DescriptorWriter::new(kind);
            for _ in 0..rng.index(4) {
                match rng.below(3) {
                    0 => w.u32(rng.next_u64() as u32),
                    1 => w.str(&name(rng)),
                    _ => w.bytes(&rng.next_u64().to_le_bytes()[..rng.index(9)]),
                };
            }
            w.finish().bytes().to_vec()
        }
        _ => {
            let mut v = {
                let n = rng.index(32);
                rng.bytes(n)
            };
            if v.len() >= 4 {
                v[..4].copy_from_slice(&1u32.to_le_bytes()); // a version word of 1
            }
            v
        }
    }
}

fn chip_bytes(rng: &mut Draw<'_>) -> Vec<u8> {
    let n = name(rng);
    let f =
        if rng.one_in(2) { ChipFn::kernel(&n, noop_kernel) } else { ChipFn::orchestration(&n, noop_orch) };
    f.descriptor().bytes().to_vec()
}
