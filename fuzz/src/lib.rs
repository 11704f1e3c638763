//! A seedable fuzz harness for the decoders of `simpler` that read bytes another process wrote:
//! the args blob, `CallConfig` and buffer descriptor of the wire codec, callable descriptors,
//! chip descriptor payloads, the task and base frames of a mailbox (the request fields a child
//! reads, the error tail and control result a parent reads back), and the remote session's
//! frames, TASK and COMPLETION bodies.
//!
//! It reaches them through `simpler::__fuzz` (the `fuzz` feature of `simpler`): one decoder
//! entry point per target, and valid encodings made by the real encoders. Everything else is
//! here: the generator, the mutations, the frame images, the reports. The short run is the test
//! `tests/hostile_bytes.rs` (part of `cargo test --workspace`); the long run is this package's
//! binary (`src/main.rs`, `cargo run -p simpler-fuzz --profile fuzz -- 10000000`).
//!
//! Deterministic and seedable, on the stable toolchain: input `i` of a run with seed `s` is
//! generated from `(s, i)` alone, so [`Harness::run`] with `inputs = i + 1` and the same seed
//! replays it. Most inputs are valid encodings made by the real encoders and then mutated (bit
//! flips, interesting values over length fields and other words, truncation, extension,
//! inserted, deleted and copied ranges); some are random bytes. Each decoder call runs under
//! `catch_unwind`, and an input is a [`Finding`] when the decoder panics, rejects it with an
//! error of a kind the decoder does not document (or no message), accepts it but the value does
//! not survive a re-encode, or allocates more than the input's size justifies (when the caller
//! passes an allocation probe, such as [`Counting::probe`]).
//!
//! ```
//! use simpler_fuzz::{Harness, Target};
//! let mut h = Harness::new().unwrap();
//! for target in Target::ALL {
//!     let report = h.run(target, 7, 50, None).unwrap();
//!     assert_eq!(report.inputs, 50);
//! }
//! ```

mod counting;

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};

use simpler::__fuzz as fz;
use simpler::__fuzz::{
    ARGS_CAPACITY, BUSY, CALL_CONFIG_WIRE_SIZE, CONTROL_DONE, CONTROL_REQUEST, DESC_SIZE, ERROR_MSG_CAPACITY,
    FRAME_SIZE, Frames, IDLE, INIT_FAILED, INIT_READY, TASK_DONE, TASK_READY, Verdict,
};

pub use counting::Counting;

/// A small, fast, seedable generator (SplitMix64); not for anything but test inputs.
///
/// ```
/// use simpler_fuzz::Rng;
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
    /// let _ = simpler_fuzz::Rng::new(42);
    /// ```
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    ///
    /// ```
    /// let _ = simpler_fuzz::Rng::new(42).next_u64();
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
    /// assert!(simpler_fuzz::Rng::new(1).below(3) < 3);
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
/// use simpler_fuzz::Target;
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
    /// assert!(simpler_fuzz::Target::ALL.contains(&simpler_fuzz::Target::TaskFrame));
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
    /// assert_eq!(simpler_fuzz::Target::BaseFrame.name(), "mailbox_base_frame");
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
/// let s = simpler_fuzz::AllocStats { largest: 0, total: 0 };
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
/// let mut h = simpler_fuzz::Harness::new().unwrap();
/// let r = h.run(simpler_fuzz::Target::Desc, 1, 20, None).unwrap();
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
/// let mut h = simpler_fuzz::Harness::new().unwrap();
/// assert!(h.run(simpler_fuzz::Target::Args, 3, 20, None).is_ok());
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
/// let mut h = simpler_fuzz::Harness::new().unwrap();
/// let r = h.run(simpler_fuzz::Target::TaskFrame, 9, 10, None).unwrap();
/// assert_eq!(r.inputs, 10);
/// ```
pub struct Harness {
    frames: Frames,
}

impl fmt::Debug for Harness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Harness").finish_non_exhaustive()
    }
}

impl Harness {
    /// A harness with its own private one-mailbox region.
    ///
    /// ```
    /// assert!(simpler_fuzz::Harness::new().is_ok());
    /// ```
    pub fn new() -> simpler::Result<Harness> {
        Ok(Harness { frames: Frames::new()? })
    }

    /// Decodes `inputs` generated inputs with `target`, stopping at the first [`Finding`].
    ///
    /// `probe`, when given, is read before and after each decode; the decode may allocate at
    /// most twice the input's size plus 4 KiB in one request and eight times its size plus
    /// 64 KiB in all.
    ///
    /// ```
    /// use simpler_fuzz::{Harness, Target};
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
                    let msg = panic_message(&*panic);
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
            Target::Args => fz::wire_args(input),
            Target::Config => fz::wire_config(input),
            Target::Desc => fz::wire_desc(input),
            Target::CallableDescriptor => fz::callable_descriptor(owned),
            Target::ChipDescriptor => fz::chip_descriptor(owned),
            Target::TaskFrame => self.frames.task_frame(input),
            Target::BaseFrame => self.frames.base_frame(input),
            Target::RemoteFrame => fz::remote_frame(input),
            Target::RemoteTask => fz::remote_task(input),
            Target::RemoteCompletion => fz::remote_completion(input),
        }
    }
}

/// The text of a caught panic's payload (what `panic!` was given).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_string())
}

// ---------------------------------------------------------------------------------------------
// Generators: valid encodings from the real encoders (`simpler::__fuzz`), then mutations.

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
        Target::Args => fz::valid_wire_args(&mut || rng.next_u64()),
        Target::Config => fz::valid_wire_config(&mut || rng.next_u64()),
        Target::Desc => fz::valid_wire_desc(&mut || rng.next_u64()),
        Target::CallableDescriptor => fz::valid_callable_descriptor(&mut || rng.next_u64()),
        Target::RemoteFrame => fz::valid_remote_frame(&mut || rng.next_u64()),
        Target::RemoteTask => fz::valid_remote_task(&mut || rng.next_u64()),
        Target::RemoteCompletion => fz::valid_remote_completion(&mut || rng.next_u64()),
        _ => fz::valid_chip_descriptor(&mut || rng.next_u64()),
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
    image[64..64 + CALL_CONFIG_WIRE_SIZE]
        .copy_from_slice(&fz::valid_wire_config(&mut || rng.next_u64())[..CALL_CONFIG_WIRE_SIZE]);
    let payload = if base {
        if rng.one_in(2) {
            let mut p = fz::valid_wire_desc(&mut || rng.next_u64());
            p.truncate(DESC_SIZE);
            p.extend(rng.bytes(16));
            p
        } else {
            fz::valid_callable_descriptor(&mut || rng.next_u64())
        }
    } else {
        fz::valid_wire_args(&mut || rng.next_u64())
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
