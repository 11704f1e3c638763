//! Hidden randomized harness for the decoders that read bytes another process wrote: the args
//! blob, `CallConfig` and buffer descriptor of the wire codec, callable descriptors, chip
//! descriptor payloads, and the task and base frames of a mailbox (the request fields a child
//! reads, the error tail and control result a parent reads back).
//!
//! Not part of the public API. Deterministic and seedable, on the stable toolchain: input `i` of
//! a run with seed `s` is generated from `(s, i)` alone, so [`Harness::run`] with `inputs = i + 1`
//! and the same seed replays it. Most inputs are valid encodings made by the real encoders and
//! then mutated (bit flips, interesting values over length fields and other words, truncation,
//! extension, inserted, deleted and copied ranges); some are random bytes. Each decoder call runs
//! under `catch_unwind`, and an input is a [`Finding`] when the decoder panics, rejects it with
//! an error of a kind the decoder does not document (or no message), accepts it but the value
//! does not survive a re-encode, or allocates more than the input's size justifies (when the
//! caller passes an allocation probe).
//!
//! ```
//! use simpler::fuzzing::{Harness, Target};
//! let mut h = Harness::new().unwrap();
//! for target in Target::ALL {
//!     let report = h.run(target, 7, 50, None).unwrap();
//!     assert_eq!(report.inputs, 50);
//! }
//! ```

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
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
    CALL_CONFIG_WIRE_SIZE, DESC_SIZE, blob_size, decode_args, decode_config, decode_desc, encode_args,
    encode_config, encode_desc,
};
use crate::engine::orchestrator::Orchestrator;
use crate::error::{Error, ErrorKind, Result};
use crate::ipc::mailbox::{
    ARGS_CAPACITY, BUSY, CONFIG_BYTES, CONTROL_DONE, CONTROL_REQUEST, ERROR_MSG_CAPACITY, FRAME_SIZE,
    FrameError, HostileFrames, IDLE, INIT_FAILED, INIT_READY, InitStatus, TASK_DONE, TASK_READY,
};

/// A small, fast, seedable generator (SplitMix64); not for anything but test inputs.
///
/// ```
/// use simpler::fuzzing::Rng;
/// let (mut a, mut b) = (Rng::new(1), Rng::new(1));
/// assert_eq!(a.next_u64(), b.next_u64());
/// assert!(a.below(10) < 10);
/// ```
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    ///
    /// ```
    /// let _ = simpler::fuzzing::Rng::new(42);
    /// ```
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    ///
    /// ```
    /// let _ = simpler::fuzzing::Rng::new(42).next_u64();
    /// ```
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    ///
    /// ```
    /// assert!(simpler::fuzzing::Rng::new(1).below(3) < 3);
    /// ```
    pub fn below(&mut self, n: u64) -> u64 {
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

/// Mixes a run's seed and an input's index into the seed of that input.
fn input_seed(seed: u64, index: u64) -> u64 {
    let mut r = Rng::new(seed ^ index.wrapping_mul(0xD134_2543_DE82_EF95));
    r.next_u64()
}

/// One decoder under test.
///
/// ```
/// use simpler::fuzzing::Target;
/// assert_eq!(Target::Args.name(), "wire_args");
/// assert_eq!(Target::ALL.len(), 10);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `wire::decode_args`: the args blob of a task frame.
    Args,
    /// `wire::decode_config`: the `CallConfig` of a task frame.
    Config,
    /// `wire::decode_desc`: a buffer descriptor of a control payload.
    Desc,
    /// `Descriptor::from_bytes`: a callable descriptor of a `REGISTER_*` control.
    CallableDescriptor,
    /// `ChipFn::from_parts`: the payload of a chip callable descriptor.
    ChipDescriptor,
    /// A task frame: the request a child takes (then decodes) and the error tail a parent reads.
    TaskFrame,
    /// A base frame: a control request a child reads (then decodes), the control result and
    /// error tail a parent reads, a startup failure message.
    BaseFrame,
    /// `net::frame::read_frame`: a frame of a remote session, as read from a socket.
    RemoteFrame,
    /// The body of a remote TASK, as a node decodes it (and its argument blob).
    RemoteTask,
    /// The body of a remote COMPLETION, as a root decodes it.
    RemoteCompletion,
}

impl Target {
    /// Every target.
    ///
    /// ```
    /// assert!(simpler::fuzzing::Target::ALL.contains(&simpler::fuzzing::Target::TaskFrame));
    /// ```
    pub const ALL: [Target; 10] = [
        Target::Args,
        Target::Config,
        Target::Desc,
        Target::CallableDescriptor,
        Target::ChipDescriptor,
        Target::TaskFrame,
        Target::BaseFrame,
        Target::RemoteFrame,
        Target::RemoteTask,
        Target::RemoteCompletion,
    ];

    /// The name used in figures and findings.
    ///
    /// ```
    /// assert_eq!(simpler::fuzzing::Target::BaseFrame.name(), "mailbox_base_frame");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Target::Args => "wire_args",
            Target::Config => "wire_config",
            Target::Desc => "wire_desc",
            Target::CallableDescriptor => "callable_descriptor",
            Target::ChipDescriptor => "chip_descriptor",
            Target::TaskFrame => "mailbox_task_frame",
            Target::BaseFrame => "mailbox_base_frame",
            Target::RemoteFrame => "remote_frame",
            Target::RemoteTask => "remote_task",
            Target::RemoteCompletion => "remote_completion",
        }
    }
}

/// What an allocation probe reports: the largest single request and the total bytes requested
/// since the previous call (a probe resets itself when read).
///
/// ```
/// let s = simpler::fuzzing::AllocStats { largest: 0, total: 0 };
/// assert_eq!(s.largest, s.total);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// The largest single allocation (or reallocation) request, in bytes.
    pub largest: usize,
    /// The bytes of every request together.
    pub total: usize,
}

/// What one run did.
///
/// ```
/// let mut h = simpler::fuzzing::Harness::new().unwrap();
/// let r = h.run(simpler::fuzzing::Target::Desc, 1, 20, None).unwrap();
/// assert_eq!(r.accepted + r.rejected, 20);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// The decoder.
    pub target: Target,
    /// Inputs decoded.
    pub inputs: u64,
    /// Inputs the decoder accepted.
    pub accepted: u64,
    /// Inputs the decoder refused with a named error.
    pub rejected: u64,
}

/// An input a decoder mishandled.
///
/// ```
/// let mut h = simpler::fuzzing::Harness::new().unwrap();
/// assert!(h.run(simpler::fuzzing::Target::Args, 3, 20, None).is_ok());
/// ```
#[derive(Debug, Clone)]
pub struct Finding {
    /// The decoder.
    pub target: Target,
    /// The run's seed.
    pub seed: u64,
    /// The input's index in the run (replay with `inputs = index + 1`).
    pub index: u64,
    /// The input bytes.
    pub input: Vec<u8>,
    /// What went wrong.
    pub problem: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} seed {:#x} input {}: {}; input ({} bytes, first 256 in hex): ",
            self.target.name(),
            self.seed,
            self.index,
            self.problem,
            self.input.len()
        )?;
        for b in self.input.iter().take(256) {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Runs the decoders on generated inputs; holds the private mailbox the frame targets use.
///
/// ```
/// let mut h = simpler::fuzzing::Harness::new().unwrap();
/// let r = h.run(simpler::fuzzing::Target::TaskFrame, 9, 10, None).unwrap();
/// assert_eq!(r.inputs, 10);
/// ```
pub struct Harness {
    frames: HostileFrames,
    image: Box<[u8; FRAME_SIZE]>,
}

impl fmt::Debug for Harness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Harness").finish_non_exhaustive()
    }
}

/// The outcome of one input: accepted, or refused with a named error; `Err` is a finding.
type Verdict = std::result::Result<bool, String>;

impl Harness {
    /// A harness with its own private one-mailbox region.
    ///
    /// ```
    /// assert!(simpler::fuzzing::Harness::new().is_ok());
    /// ```
    pub fn new() -> Result<Harness> {
        let image = vec![0u8; FRAME_SIZE].into_boxed_slice().try_into().expect("FRAME_SIZE bytes");
        Ok(Harness { frames: HostileFrames::new()?, image })
    }

    /// Decodes `inputs` generated inputs with `target`, stopping at the first [`Finding`].
    ///
    /// `probe`, when given, is read before and after each decode; the decode may allocate at
    /// most twice the input's size plus 4 KiB in one request and eight times its size plus
    /// 64 KiB in all.
    ///
    /// ```
    /// use simpler::fuzzing::{Harness, Target};
    /// let r = Harness::new().unwrap().run(Target::Config, 5, 30, None).unwrap();
    /// assert_eq!(r.target, Target::Config);
    /// ```
    pub fn run(
        &mut self,
        target: Target,
        seed: u64,
        inputs: u64,
        probe: Option<&dyn Fn() -> AllocStats>,
    ) -> std::result::Result<Report, Finding> {
        let mut report = Report { target, inputs: 0, accepted: 0, rejected: 0 };
        for index in 0..inputs {
            let mut rng = Rng::new(input_seed(seed, index));
            let input = generate(target, &mut rng);
            let owned = input.clone();
            if let Some(p) = probe {
                p();
            }
            let verdict = catch_unwind(AssertUnwindSafe(|| self.check(target, &input, owned)));
            let stats = probe.map(|p| p());
            let finding = |problem: String| Finding { target, seed, index, input: input.clone(), problem };
            let accepted = match verdict {
                Err(panic) => {
                    let msg = crate::error::panic_message(&*panic);
                    return Err(finding(format!("the decoder panicked: {msg}")));
                }
                Ok(Err(problem)) => return Err(finding(problem)),
                Ok(Ok(accepted)) => accepted,
            };
            if let Some(s) = stats {
                let (one, all) = (2 * input.len() + 4096, 8 * input.len() + 65536);
                if s.largest > one || s.total > all {
                    return Err(finding(format!(
                        "unbounded allocation: largest request {} bytes (at most {one}), {} bytes in \
                         all (at most {all})",
                        s.largest, s.total
                    )));
                }
            }
            report.inputs += 1;
            if accepted {
                report.accepted += 1;
            } else {
                report.rejected += 1;
            }
        }
        Ok(report)
    }

    /// Runs one input through `target`'s decoder and checks the result.
    fn check(&mut self, target: Target, input: &[u8], owned: Vec<u8>) -> Verdict {
        match target {
            Target::Args => check_args(input),
            Target::Config => check_config(input),
            Target::Desc => check_desc(input),
            Target::CallableDescriptor => check_callable(owned),
            Target::ChipDescriptor => check_chip(owned),
            Target::TaskFrame => self.check_task_frame(input),
            Target::BaseFrame => self.check_base_frame(input),
            Target::RemoteFrame => check_remote_frame(input),
            Target::RemoteTask => check_remote_task(input),
            Target::RemoteCompletion => check_remote_completion(input),
        }
    }

    fn plant_image(&mut self, input: &[u8]) {
        let n = input.len().min(FRAME_SIZE);
        self.image[..n].copy_from_slice(&input[..n]);
        self.image[n..].fill(0);
    }

    fn check_task_frame(&mut self, input: &[u8]) -> Verdict {
        self.plant_image(input);
        let image = &self.image;
        let state = u32::from_ne_bytes(image[0..4].try_into().expect("4 bytes"));
        let (mb, parent) = self.frames.plant(false, image);
        if let Some(req) = mb.task_request() {
            if state != TASK_READY {
                return Err(format!("a task was taken from state {state}"));
            }
            let (args, config) = (req.args(), req.config());
            if args.len() > ARGS_CAPACITY || config.len() != CONFIG_BYTES {
                return Err(format!("task slices of {} and {} bytes", args.len(), config.len()));
            }
            // What a child does with them: decode both.
            let accepted = check_args(args)? & check_config(config)?;
            // Reply with a message made of frame bytes, then read it back as the parent.
            let code = i32::from_ne_bytes(image[4..8].try_into().expect("4 bytes"));
            let text = String::from_utf8_lossy(&image[64..64 + 2 * ERROR_MSG_CAPACITY]).into_owned();
            mb.finish_task(req, Err(FrameError::new(code, text.clone())), parent);
            match mb.take_task_result() {
                Some(Err(e)) if e.code != 0 && text.starts_with(&e.message) => check_tail(&e)?,
                other => return Err(format!("the reply read back as {other:?}")),
            }
            return Ok(accepted);
        }
        if state == TASK_READY {
            return Err("a TASK_READY frame was not taken".into());
        }
        match mb.take_task_result() {
            None if state != TASK_DONE => Ok(false),
            Some(Ok(())) if state == TASK_DONE => Ok(true),
            Some(Err(e)) if state == TASK_DONE => check_tail(&e).map(|()| false),
            other => Err(format!("state {state} collected as {other:?}")),
        }
    }

    fn check_base_frame(&mut self, input: &[u8]) -> Verdict {
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
                    accepted |= check_desc(&req.payload)?;
                }
                accepted |= check_callable(req.payload.clone())?;
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

fn check_remote_frame(input: &[u8]) -> Verdict {
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

fn check_remote_task(input: &[u8]) -> Verdict {
    match crate::worker::remote::wire::decode_task(input) {
        Ok(t) => {
            // What a node does next: decode the argument blob.
            let args_ok = check_args(t.head.args_blob)?;
            let data: usize = t.data.iter().flatten().map(|(_, d)| d.len()).sum();
            if data > input.len() {
                return Err(format!("{data} bytes of tensor data from a {}-byte body", input.len()));
            }
            Ok(args_ok)
        }
        Err(e) => refused(&e, &[ErrorKind::Decode, ErrorKind::InvalidArgument]),
    }
}

fn check_remote_completion(input: &[u8]) -> Verdict {
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

/// A valid remote frame of a random kind and body (then mutated by the caller).
fn remote_frame_bytes(rng: &mut Rng) -> Vec<u8> {
    use crate::net::frame::{FrameKind, write_frame};
    let kind = rng.pick(&FrameKind::ALL);
    let n = rng.index(64);
    let body = rng.bytes(n);
    let mut out = Vec::new();
    write_frame(&mut out, kind, rng.next_u64(), &body).expect("writing to memory");
    out
}

/// A valid TASK body (then mutated by the caller).
fn remote_task_bytes(rng: &mut Rng) -> Vec<u8> {
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
fn remote_completion_bytes(rng: &mut Rng) -> Vec<u8> {
    let outputs: Vec<(usize, u64, Vec<u8>)> = (0..rng.index(3))
        .map(|i| {
            let n = rng.index(32);
            (i, rng.below(64), rng.bytes(n))
        })
        .collect();
    crate::worker::remote::wire::encode_completion(rng.below(6) as u32, "message", &outputs)
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

fn check_args(input: &[u8]) -> Verdict {
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

fn check_config(input: &[u8]) -> Verdict {
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

fn check_desc(input: &[u8]) -> Verdict {
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

fn check_callable(input: Vec<u8>) -> Verdict {
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

fn check_chip(input: Vec<u8>) -> Verdict {
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
// Generators: valid encodings from the real encoders, then mutations.

fn generate(target: Target, rng: &mut Rng) -> Vec<u8> {
    match target {
        Target::TaskFrame | Target::BaseFrame => return frame_image(target, rng),
        _ => {}
    }
    if rng.one_in(16) {
        let n = rng.index(2 * typical_len(target) + 1);
        return rng.bytes(n);
    }
    let mut bytes = match target {
        Target::Args => args_blob(rng),
        Target::Config => config_bytes(rng),
        Target::Desc => desc_bytes(rng),
        Target::CallableDescriptor => callable_bytes(rng),
        Target::RemoteFrame => remote_frame_bytes(rng),
        Target::RemoteTask => remote_task_bytes(rng),
        Target::RemoteCompletion => remote_completion_bytes(rng),
        _ => chip_bytes(rng),
    };
    if rng.one_in(4) {
        // Structure-aware: corrupt a length field the format has.
        corrupt_length(target, &mut bytes, rng);
    }
    let rounds = rng.pick(&[0, 1, 1, 1, 2, 2, 3, 4, 8]);
    for _ in 0..rounds {
        mutate(&mut bytes, rng, true);
    }
    bytes
}

fn typical_len(target: Target) -> usize {
    match target {
        Target::Args => 8 + 3 * 144 + 24,
        Target::Config => CALL_CONFIG_WIRE_SIZE,
        Target::Desc => DESC_SIZE,
        _ => 48,
    }
}

/// Interesting values for a word of `bits` bits, given the input's length.
fn interesting(rng: &mut Rng, bits: u32, len: usize) -> u64 {
    let max = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
    let v = match rng.below(12) {
        0 => 0,
        1 => 1,
        2 => max,
        3 => max - 1,
        4 => max / 2 + 1,
        5 => max / 2,
        6 => len as u64,
        7 => (len as u64).wrapping_add(1),
        8 => (len / 144) as u64 + rng.below(3),
        9 => rng.below(64),
        10 => 1u64 << rng.below(u64::from(bits)),
        _ => rng.next_u64(),
    };
    v & max
}

fn put_word(bytes: &mut [u8], at: usize, bits: u32, v: u64) {
    let n = (bits / 8) as usize;
    if at + n <= bytes.len() {
        bytes[at..at + n].copy_from_slice(&v.to_le_bytes()[..n]);
    }
}

fn corrupt_length(target: Target, bytes: &mut [u8], rng: &mut Rng) {
    let len = bytes.len();
    match target {
        Target::Args => {
            let at = rng.pick(&[0, 4]);
            let v = interesting(rng, 32, len);
            put_word(bytes, at, 32, v);
        }
        Target::Desc => {
            // body_len, the nbytes word, or a memfd body's pid, fd and inode.
            let (at, bits) = rng.pick(&[(52, 16), (40, 64), (56, 32), (60, 32), (64, 64)]);
            let v = interesting(rng, bits, len);
            put_word(bytes, at, bits, v);
        }
        Target::Config => {
            let v = interesting(rng, 32, len);
            put_word(bytes, 4 * rng.index(6), 32, v);
        }
        _ => {
            // The u32 after the header and the fields after it: version, counts, lengths.
            let at = 8 + 4 * rng.index(4);
            let v = interesting(rng, 32, len);
            put_word(bytes, at, 32, v);
        }
    }
}

/// One mutation of `bytes`; `resize` allows changing its length.
fn mutate(bytes: &mut Vec<u8>, rng: &mut Rng, resize: bool) {
    let len = bytes.len();
    let op = if resize { rng.below(10) } else { rng.below(6) };
    let at = rng.index(len.max(1));
    match op {
        _ if len == 0 && op < 6 => bytes.extend({
            let n = 1 + rng.index(16);
            rng.bytes(n)
        }),
        0 => bytes[at] ^= 1 << rng.below(8),
        1 => bytes[at] = rng.pick(&[0, 1, 0x7f, 0x80, 0xff, 0xfe, b'/', b' ']),
        2 => {
            let bits = rng.pick(&[16, 32, 64]);
            let at = if rng.one_in(2) { at & !((bits as usize / 8) - 1) } else { at };
            let v = interesting(rng, bits, len);
            put_word(bytes, at, bits, v);
        }
        3 => {
            let n = rng.index(len - at + 1).min(64);
            rng.fill(&mut bytes[at..at + n]);
        }
        4 => {
            // Copy a range over another (duplicated records, shifted fields).
            let from = rng.index(len);
            let n = rng.index(len - from.max(at) + 1).min(256);
            bytes.copy_within(from..from + n, at);
        }
        5 => bytes[at] = bytes[at].wrapping_add(rng.pick(&[1, 255])),
        6 => bytes.truncate(rng.index(len + 1)),
        7 => bytes.extend({
            let n = 1 + rng.index(64);
            rng.bytes(n)
        }),
        8 => {
            let n = rng.index(len - at + 1).min(64);
            bytes.drain(at..at + n);
        }
        _ => {
            let extra = {
                let n = 1 + rng.index(16);
                rng.bytes(n)
            };
            bytes.splice(at..at, extra);
        }
    }
}

fn identity(rng: &mut Rng) -> Identity {
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
fn memfd(rng: &mut Rng) -> Backing {
    let max = i32::MAX as u64;
    let (any_pid, any_fd, any_ino) = (1 + rng.below(max), rng.below(max + 1), 1 + rng.below(u64::MAX - 1));
    let pid = rng.pick(&[1, max, any_pid]) as u32;
    let fd = rng.pick(&[0, 3, max, any_fd]) as u32;
    let ino = rng.pick(&[1, u64::MAX, any_ino]);
    Backing::Memfd { pid, fd, ino }
}

fn desc(rng: &mut Rng, nbytes: u64) -> BufferDesc {
    let backing = match rng.below(3) {
        0 => Backing::HeapSlab { addr: 1 + rng.below(u64::MAX - 1), ino: 1 + rng.below(u64::MAX - 1) },
        1 => memfd(rng),
        _ => Backing::Device { ptr: rng.next_u64(), chip: rng.below(8) as u32 },
    };
    let access = rng.pick(&[Access::Read, Access::Write, Access::ReadWrite]);
    BufferDesc::new(identity(rng), backing, access, nbytes).expect("a valid backing")
}

fn view(rng: &mut Rng) -> TensorView {
    let dtype = DataType::from_u8(rng.below(15) as u8).expect("0..=14 are data types");
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

fn tensor(rng: &mut Rng) -> Tensor {
    let v = view(rng);
    let nbytes = v.byte_range().1 + rng.below(64);
    Tensor::from_desc(desc(rng, nbytes), v).expect("the buffer holds the view")
}

fn args_blob(rng: &mut Rng) -> Vec<u8> {
    let tensors: Vec<Tensor> = (0..rng.index(5)).map(|_| tensor(rng)).collect();
    let scalars: Vec<u64> = (0..rng.index(6)).map(|_| rng.next_u64()).collect();
    let mut out = vec![0; blob_size(tensors.len(), scalars.len()) + rng.pick(&[0, 0, 1, 8, 144])];
    let iter = tensors.iter().map(|t| (t, if rng.one_in(2) { t.desc().access() } else { Access::Read }));
    let iter: Vec<_> = iter.collect();
    encode_args(iter.into_iter(), &scalars, &mut out).expect("the blob fits");
    out
}

fn config(rng: &mut Rng) -> CallConfig {
    let flag = |rng: &mut Rng| rng.below(2) as i32;
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

fn config_bytes(rng: &mut Rng) -> Vec<u8> {
    let mut out = [0u8; CALL_CONFIG_WIRE_SIZE];
    encode_config(&config(rng), &mut out);
    let mut v = out.to_vec();
    v.extend({
        let n = rng.pick(&[0, 0, 1, 16]);
        rng.bytes(n)
    });
    v
}

fn desc_bytes(rng: &mut Rng) -> Vec<u8> {
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

fn name(rng: &mut Rng) -> String {
    let parts = ["k", "vadd", "relu_f32", "\u{e9}t\u{e9}", "\u{1F600}", "a::b<c>", ""];
    (0..1 + rng.index(3)).map(|_| parts[rng.index(parts.len())]).collect()
}

fn callable_bytes(rng: &mut Rng) -> Vec<u8> {
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
            put_word(&mut v, 0, 32, 1);
            v
        }
    }
}

fn chip_bytes(rng: &mut Rng) -> Vec<u8> {
    let n = name(rng);
    let f =
        if rng.one_in(2) { ChipFn::kernel(&n, noop_kernel) } else { ChipFn::orchestration(&n, noop_orch) };
    f.descriptor().bytes().to_vec()
}

/// A frame image (native endianness, the mailbox layout): a well-formed request or reply, then
/// mutations over its fields.
fn frame_image(target: Target, rng: &mut Rng) -> Vec<u8> {
    let mut image = vec![0u8; FRAME_SIZE];
    let base = target == Target::BaseFrame;
    let state = if rng.one_in(16) {
        rng.next_u64() as u32
    } else if base {
        rng.pick(&[CONTROL_REQUEST, CONTROL_REQUEST, CONTROL_DONE, INIT_FAILED, INIT_READY, IDLE, BUSY])
    } else {
        rng.pick(&[TASK_READY, TASK_READY, TASK_DONE, TASK_DONE, IDLE, BUSY])
    };
    image[0..4].copy_from_slice(&state.to_ne_bytes());
    let code: i32 = rng.pick(&[0, 0, 1, 2, 3, -1, i32::MIN, i32::MAX]);
    image[4..8].copy_from_slice(&code.to_ne_bytes());
    for at in [8, 16, 24] {
        image[at..at + 8].copy_from_slice(&rng.next_u64().to_ne_bytes());
    }
    rng.fill(&mut image[32..64]);
    image[64..64 + CALL_CONFIG_WIRE_SIZE].copy_from_slice(&config_bytes(rng)[..CALL_CONFIG_WIRE_SIZE]);
    let payload = if base {
        if rng.one_in(2) {
            let mut p = desc_bytes(rng);
            p.truncate(DESC_SIZE);
            p.extend(rng.bytes(16));
            p
        } else {
            callable_bytes(rng)
        }
    } else {
        args_blob(rng)
    };
    let payload_at = FRAME_SIZE - ERROR_MSG_CAPACITY - ARGS_CAPACITY;
    image[payload_at..payload_at + payload.len()].copy_from_slice(&payload);
    let mut len = payload.len() as u32;
    if rng.one_in(4) {
        len = rng.pick(&[
            0,
            len + 1,
            len.saturating_sub(1),
            ARGS_CAPACITY as u32,
            ARGS_CAPACITY as u32 + 1,
            u32::MAX,
        ]);
    }
    image[payload_at - 8..payload_at - 4].copy_from_slice(&len.to_ne_bytes());
    // The error tail: text, invalid UTF-8, a cut multi-byte character, with or without a NUL.
    let msg_at = FRAME_SIZE - ERROR_MSG_CAPACITY;
    match rng.below(4) {
        0 => {}
        1 => rng.fill(&mut image[msg_at..]),
        2 => {
            let text = "\u{1F600} failed \u{e9}".repeat(1 + rng.index(40));
            let n = text.len().min(ERROR_MSG_CAPACITY);
            image[msg_at..msg_at + n].copy_from_slice(&text.as_bytes()[..n]);
        }
        _ => image[msg_at..].fill(0xff),
    }
    for _ in 0..rng.pick(&[0, 0, 1, 2, 4]) {
        // Mutate one field region at a time so the mutations land where the readers look.
        let (lo, hi) = rng.pick(&[
            (0, 64),
            (64, 64 + CALL_CONFIG_WIRE_SIZE),
            (payload_at - 8, payload_at + payload.len() + 16),
            (msg_at, FRAME_SIZE),
        ]);
        let mut region = image[lo..hi].to_vec();
        mutate(&mut region, rng, false);
        image[lo..hi].copy_from_slice(&region);
    }
    image
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_deterministic() {
        let mut h = Harness::new().unwrap();
        for target in Target::ALL {
            let a = h.run(target, 11, 200, None).unwrap_or_else(|f| panic!("{f}"));
            let b = h.run(target, 11, 200, None).unwrap_or_else(|f| panic!("{f}"));
            assert_eq!(a, b);
            assert!(a.accepted > 0 && a.rejected > 0, "{a:?}");
        }
    }
}
