//! Content-addressed identity of callables.
//!
//! A callable is identified by the sha256 [`Digest`] of its canonical descriptor bytes (see the
//! [module docs](super) for the encoding). [`DescriptorWriter`] produces those bytes, and
//! [`CallableHandle`] is what `Worker::register` hands back to the user; [`CallableKind`] and
//! [`Namespace`] go into every descriptor.
//!
//! What the digest covers: a function registered through the plain API (`HostFn::new`,
//! `ChipFn::kernel`, `OrchFn::new`) is identified by its kind and name, not its code; a
//! `HostFn::closure` also by its type and an instance number; a `#[callable]` by the digest the
//! macro computed at compile time (`simpler-macros/src/descriptor.rs`).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use crate::error::{Error, ErrorKind, Result};

/// The prefix of a printed [`Digest`].
const PREFIX: &str = "sha256:";

/// Lowercase hexadecimal digits, indexed by nibble.
const HEX: &[u8; 16] = b"0123456789abcdef";

/// 32-byte sha256 digest of a callable's canonical descriptor.
///
/// Printed (by both `Display` and `Debug`) as `sha256:` followed by 64 lowercase hex digits, and
/// parsed back from exactly that form.
///
/// ```
/// use simpler::callable::Digest;
/// let d = Digest::of(b"abc");
/// let text = d.to_string();
/// assert_eq!(
///     text,
///     "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
/// );
/// assert_eq!(text.parse::<Digest>().unwrap(), d);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    /// Computes the sha256 digest of `bytes`.
    ///
    /// ```
    /// use simpler::callable::Digest;
    /// assert_eq!(
    ///     Digest::of(b"").to_string(),
    ///     "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    /// );
    /// ```
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(Sha256::digest(bytes).into())
    }

    /// Wraps 32 raw digest bytes.
    ///
    /// ```
    /// use simpler::callable::Digest;
    /// let d = Digest::from_bytes([0xab; 32]);
    /// assert_eq!(d.as_bytes(), &[0xab; 32]);
    /// assert_eq!(d.short(), "sha256:abababababab");
    /// ```
    pub const fn from_bytes(bytes: [u8; 32]) -> Digest {
        Digest(bytes)
    }

    /// The 32 raw digest bytes.
    ///
    /// ```
    /// use simpler::callable::Digest;
    /// let d = Digest::of(b"abc");
    /// assert_eq!(d.as_bytes()[..4], [0xba, 0x78, 0x16, 0xbf]);
    /// ```
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Parses `sha256:` followed by exactly 64 lowercase hex digits.
    ///
    /// # Errors
    ///
    /// Anything else (another prefix, uppercase digits, a wrong length, non-hex characters) is an
    /// [`ErrorKind::InvalidArgument`] error whose message starts with `HASHID_FORMAT_INVALID`.
    ///
    /// ```
    /// use simpler::{callable::Digest, ErrorKind};
    /// let text = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    /// assert_eq!(Digest::parse(text).unwrap(), Digest::of(b"abc"));
    ///
    /// let err = Digest::parse("sha256:BA78").unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    /// assert!(err.message().starts_with("HASHID_FORMAT_INVALID"));
    /// ```
    pub fn parse(s: &str) -> Result<Digest> {
        let invalid = |why: &str| {
            // Keep messages bounded even when handed a huge string.
            let shown: String = s.chars().take(80).collect();
            let ellipsis = if shown.len() < s.len() { "..." } else { "" };
            Error::invalid(format!(
                "HASHID_FORMAT_INVALID: {why}; expected `sha256:` followed by 64 lowercase hex \
                 digits, got {shown:?}{ellipsis}"
            ))
        };
        let Some(hex) = s.strip_prefix(PREFIX) else {
            return Err(invalid("missing `sha256:` prefix"));
        };
        if hex.len() != 64 {
            return Err(invalid(&format!("{} hex digits instead of 64", hex.len())));
        }
        let mut out = [0u8; 32];
        for (byte, pair) in out.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
            match (nibble(pair[0]), nibble(pair[1])) {
                (Some(hi), Some(lo)) => *byte = (hi << 4) | lo,
                _ => return Err(invalid("not a lowercase hex digit")),
            }
        }
        Ok(Digest(out))
    }

    /// `sha256:` followed by the first 12 hex digits, for messages.
    ///
    /// ```
    /// use simpler::callable::Digest;
    /// assert_eq!(Digest::of(b"abc").short(), "sha256:ba7816bf8f01");
    /// ```
    pub fn short(&self) -> String {
        let mut s = String::with_capacity(PREFIX.len() + 12);
        s.push_str(PREFIX);
        push_hex(&mut s, &self.0[..6]);
        s
    }
}

/// Value of one lowercase hex digit.
fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// Appends `bytes` to `s` as lowercase hex.
fn push_hex(s: &mut String, bytes: &[u8]) {
    for &b in bytes {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::with_capacity(PREFIX.len() + 64);
        s.push_str(PREFIX);
        push_hex(&mut s, &self.0);
        f.pad(&s)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Digest {
    type Err = Error;

    fn from_str(s: &str) -> Result<Digest> {
        Digest::parse(s)
    }
}

/// What kind of callable a descriptor describes; its `u32` value is the descriptor's `kind` field.
///
/// ```
/// use simpler::{callable::CallableKind, callable::Namespace};
/// assert_eq!(CallableKind::HostFn as u32, 2);
/// assert_eq!(CallableKind::HostFn.namespace(), Namespace::LocalHost);
/// assert_eq!(CallableKind::Chip.name(), "chip");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum CallableKind {
    /// A chip kernel or a chip orchestration, run on an L2 chip.
    Chip = 1,
    /// A host function, run by a SUB worker.
    HostFn = 2,
    /// An orchestration function, run by a nested `Worker`.
    Orch = 3,
}

impl CallableKind {
    /// The kind whose descriptor value is `v`.
    ///
    /// # Errors
    ///
    /// Unknown values are an [`ErrorKind::Callable`] error whose message starts with
    /// `CALLABLE_KIND_UNSUPPORTED`.
    ///
    /// ```
    /// use simpler::{callable::CallableKind, ErrorKind};
    /// assert_eq!(CallableKind::from_u32(3).unwrap(), CallableKind::Orch);
    /// let err = CallableKind::from_u32(9).unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::Callable);
    /// assert!(err.message().starts_with("CALLABLE_KIND_UNSUPPORTED"));
    /// ```
    pub fn from_u32(v: u32) -> Result<CallableKind> {
        match v {
            1 => Ok(CallableKind::Chip),
            2 => Ok(CallableKind::HostFn),
            3 => Ok(CallableKind::Orch),
            _ => Err(Error::new(
                ErrorKind::Callable,
                format!(
                    "CALLABLE_KIND_UNSUPPORTED: callable kind {v} is unknown (expected 1 = chip, \
                     2 = host function, 3 = orchestration)"
                ),
            )),
        }
    }

    /// A human-readable name: `"chip"`, `"host function"` or `"orchestration"`.
    ///
    /// ```
    /// use simpler::callable::CallableKind;
    /// assert_eq!(CallableKind::HostFn.name(), "host function");
    /// assert_eq!(CallableKind::Orch.name(), "orchestration");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            CallableKind::Chip => "chip",
            CallableKind::HostFn => "host function",
            CallableKind::Orch => "orchestration",
        }
    }

    /// The namespace whose registries hold callables of this kind: [`Namespace::LocalChip`] for
    /// [`Chip`](CallableKind::Chip), [`Namespace::LocalHost`] for the others.
    ///
    /// ```
    /// use simpler::{callable::CallableKind, callable::Namespace};
    /// assert_eq!(CallableKind::Chip.namespace(), Namespace::LocalChip);
    /// assert_eq!(CallableKind::Orch.namespace(), Namespace::LocalHost);
    /// ```
    pub fn namespace(self) -> Namespace {
        match self {
            CallableKind::Chip => Namespace::LocalChip,
            CallableKind::HostFn | CallableKind::Orch => Namespace::LocalHost,
        }
    }
}

/// Which family of registries a callable is installed into.
///
/// ```
/// use simpler::{callable::CallableKind, callable::Namespace};
/// assert_eq!(CallableKind::HostFn.namespace(), Namespace::LocalHost);
/// assert_eq!(Namespace::Remote as u32, 3);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Namespace {
    /// The registries of chips.
    LocalChip = 1,
    /// The registries of SUB children and of nested-`Worker` dispatch loops.
    LocalHost = 2,
    /// Reserved for remote dispatchers.
    Remote = 3,
}

/// The descriptor schema version written at the start of every descriptor.
pub(crate) const SCHEMA_VERSION: u32 = 1;

/// The payload format version of run-time registered host and orchestration functions.
const FN_PAYLOAD_FORMAT_VERSION: u32 = 1;

/// Canonical descriptor encoder.
///
/// [`new`](DescriptorWriter::new) writes the header (`schema_version`, `kind`); the other methods
/// append fields in the canonical encoding, and [`finish`](DescriptorWriter::finish) hashes the
/// result. Lists are written as [`u32`](DescriptorWriter::u32) count followed by the items;
/// optionals as [`u8`](DescriptorWriter::u8) presence marker followed by the value when present.
pub(crate) struct DescriptorWriter {
    bytes: Vec<u8>,
    kind: CallableKind,
}

impl DescriptorWriter {
    /// Starts a descriptor of `kind`: writes `schema_version` then `kind`.
    pub(crate) fn new(kind: CallableKind) -> DescriptorWriter {
        let mut w = DescriptorWriter { bytes: Vec::with_capacity(64), kind };
        w.u32(SCHEMA_VERSION).u32(kind as u32);
        w
    }

    /// Appends a little-endian `u32` (also used for list counts).
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a string: `u32` byte length, then its UTF-8 bytes.
    ///
    /// # Panics
    ///
    /// If the string is longer than `u32::MAX` bytes.
    pub(crate) fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }

    /// Appends a byte array: `u32` length, then the bytes.
    ///
    /// # Panics
    ///
    /// If `b` is longer than `u32::MAX` bytes.
    pub(crate) fn bytes(&mut self, b: &[u8]) -> &mut Self {
        let len = u32::try_from(b.len()).expect("descriptor field longer than u32::MAX bytes");
        self.u32(len);
        self.bytes.extend_from_slice(b);
        self
    }

    #[cfg(test)] // only tests need it
    /// Appends one byte; only for optional presence markers (0 = absent, 1 = present).
    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.bytes.push(v);
        self
    }

    /// Finishes the descriptor and computes its digest.
    pub(crate) fn finish(self) -> Descriptor {
        let digest = Digest::of(&self.bytes);
        Descriptor { bytes: self.bytes, digest, kind: self.kind }
    }
}

/// Canonical descriptor bytes and their digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Descriptor {
    bytes: Vec<u8>,
    digest: Digest,
    kind: CallableKind,
}

impl Descriptor {
    /// The canonical descriptor bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The sha256 of [`bytes`](Descriptor::bytes).
    pub(crate) fn digest(&self) -> Digest {
        self.digest
    }

    /// The kind written in the descriptor header.
    pub(crate) fn kind(&self) -> CallableKind {
        self.kind
    }

    /// Parses the kind out of descriptor bytes (checks schema version 1 and a known kind) and
    /// recomputes the digest.
    ///
    /// Only the header is checked; the payload is opaque here. Fewer than 8 bytes or another
    /// schema version is an [`ErrorKind::Decode`] error; an unknown kind is an
    /// [`ErrorKind::Callable`] error starting with `CALLABLE_KIND_UNSUPPORTED`.
    pub(crate) fn from_bytes(bytes: Vec<u8>) -> Result<Descriptor> {
        let (Some(version), Some(kind)) = (le_u32(&bytes, 0), le_u32(&bytes, 4)) else {
            return Err(Error::decode(format!(
                "callable descriptor truncated: {} bytes, the header alone is 8",
                bytes.len()
            )));
        };
        if version != SCHEMA_VERSION {
            return Err(Error::decode(format!(
                "callable descriptor schema version {version} is unsupported (expected \
                 {SCHEMA_VERSION})"
            )));
        }
        let kind = CallableKind::from_u32(kind)?;
        let digest = Digest::of(&bytes);
        Ok(Descriptor { bytes, digest, kind })
    }
}

/// The little-endian `u32` at `at`, if `bytes` is long enough.
fn le_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let field = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(field.try_into().ok()?))
}

/// Descriptor of a function registered at run time (not through the macro).
fn fn_descriptor(kind: CallableKind, name: &str, type_name: &str, type_hash: u64) -> Descriptor {
    let mut w = DescriptorWriter::new(kind);
    w.u32(FN_PAYLOAD_FORMAT_VERSION).str(name).str(type_name).bytes(&type_hash.to_le_bytes());
    w.finish()
}

/// Descriptor of a host function registered at run time (not through the macro):
/// `schema_version`, `kind = HostFn`, `u32 payload_format_version = 1`, string `name`, string
/// `type_name`, bytes `type_hash` (8 bytes, little-endian).
pub(crate) fn host_fn_descriptor(name: &str, type_name: &str, type_hash: u64) -> Descriptor {
    fn_descriptor(CallableKind::HostFn, name, type_name, type_hash)
}

/// Descriptor of an orchestration function registered at run time: the same shape as
/// [`host_fn_descriptor`] with `kind = Orch`.
pub(crate) fn orch_fn_descriptor(name: &str, type_name: &str, type_hash: u64) -> Descriptor {
    fn_descriptor(CallableKind::Orch, name, type_name, type_hash)
}

/// What `Worker::register` returns: the identity of a registered callable.
///
/// Handles are cheap to clone. `Display` prints the name and a shortened digest, e.g.
/// `` `double` (sha256:9bdb05460e57) ``; `Debug` shows the full digest.
///
/// ```
/// use simpler::{callable::CallableKind, HostArgs, HostFn, HostResult, callable::Namespace, Worker};
///
/// fn double(_: &HostArgs<'_>) -> HostResult {
///     Ok(())
/// }
/// let mut worker = Worker::builder().sub_workers(1).build()?;
/// // Registering before `init` forks nothing.
/// let h = worker.register(HostFn::new("double", double))?;
/// assert_eq!(h.name(), "double");
/// assert_eq!(h.kind(), CallableKind::HostFn);
/// assert_eq!(h.namespace(), Namespace::LocalHost);
/// assert_eq!(h.to_string(), format!("`double` ({})", h.digest().short()));
/// # Ok::<(), simpler::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CallableHandle {
    digest: Digest,
    kind: CallableKind,
    name: Arc<str>,
}

impl CallableHandle {
    /// Creates a handle for the callable `name` of `kind` whose descriptor hashes to `digest`.
    pub(crate) fn new(digest: Digest, kind: CallableKind, name: &str) -> CallableHandle {
        CallableHandle { digest, kind, name: Arc::from(name) }
    }

    /// The digest of the callable's canonical descriptor.
    ///
    /// Two handles name the same callable exactly when their digests are equal.
    ///
    /// ```
    /// # use simpler::{HostArgs, HostFn, HostResult, Worker};
    /// # fn double(_: &HostArgs<'_>) -> HostResult { Ok(()) }
    /// # let mut worker = Worker::builder().sub_workers(1).build()?;
    /// let h = worker.register(HostFn::new("double", double))?; // before init: no fork
    /// let text = h.digest().to_string();
    /// assert!(text.starts_with("sha256:") && text.len() == 7 + 64);
    /// assert_eq!(text.parse::<simpler::callable::Digest>()?, h.digest());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// The callable's kind.
    ///
    /// ```
    /// use simpler::callable::CallableKind;
    /// # use simpler::{HostArgs, HostFn, HostResult, Worker};
    /// # fn double(_: &HostArgs<'_>) -> HostResult { Ok(()) }
    /// # let mut worker = Worker::builder().sub_workers(1).build()?;
    /// let h = worker.register(HostFn::new("double", double))?; // before init: no fork
    /// assert_eq!(h.kind(), CallableKind::HostFn);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn kind(&self) -> CallableKind {
        self.kind
    }

    /// The namespace whose registries hold this callable (that of its [`kind`](Self::kind)).
    ///
    /// ```
    /// use simpler::callable::Namespace;
    /// # use simpler::{HostArgs, HostFn, HostResult, Worker};
    /// # fn double(_: &HostArgs<'_>) -> HostResult { Ok(()) }
    /// # let mut worker = Worker::builder().sub_workers(1).build()?;
    /// let h = worker.register(HostFn::new("double", double))?; // before init: no fork
    /// assert_eq!(h.namespace(), Namespace::LocalHost);
    /// assert_eq!(h.namespace(), h.kind().namespace());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn namespace(&self) -> Namespace {
        self.kind.namespace()
    }

    /// The name the callable was registered under.
    ///
    /// ```
    /// # use simpler::{HostArgs, HostFn, HostResult, Worker};
    /// # fn double(_: &HostArgs<'_>) -> HostResult { Ok(()) }
    /// # let mut worker = Worker::builder().sub_workers(1).build()?;
    /// let h = worker.register(HostFn::new("double", double))?; // before init: no fork
    /// assert_eq!(h.name(), "double");
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name, shared: what a captured run keeps of each task (no copy of the text).
    pub(crate) fn shared_name(&self) -> &Arc<str> {
        &self.name
    }
}

impl fmt::Display for CallableHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` ({})", self.name, self.digest.short())
    }
}

impl fmt::Debug for CallableHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallableHandle")
            .field("name", &&*self.name)
            .field("kind", &self.kind)
            .field("digest", &self.digest)
            .finish()
    }
}

#[cfg(test)]
mod tests;
