//! Frames: the unit of the remote protocol, and the body reader and writer its messages use.
//!
//! A frame is a 24-byte header and a body (layout in the module docs of [`crate::net`]).
//! [`read_frame`] checks every header field before it allocates the body, so a peer that
//! claims a huge body costs nothing until it is refused; [`write_frame`] sends header and body
//! in one vectored write where the writer supports it.

use std::fmt;
use std::io::{self, IoSlice, Read, Write};

use crate::error::{Error, ErrorKind};

/// The version of the protocol this build speaks (every frame header carries it).
pub(crate) const PROTOCOL_VERSION: u16 = 5;
/// Largest body before the handshake completes (HELLO frames only).
pub(crate) const MAX_HELLO_BODY: usize = 4096;
/// Default largest body of an authenticated session's frame (tensor data travels in
/// TASK/COMPLETION bodies). Below 4 GiB, since the header's length field is a `u32`.
pub(crate) const DEFAULT_MAX_BODY: usize = 1 << 30;
/// The first four bytes of every frame.
pub(crate) const MAGIC: [u8; 4] = *b"SPNF";
/// The size of a frame header.
pub(crate) const HEADER_LEN: usize = 24;

/// What a frame carries; the `u16` in the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub(crate) enum FrameKind {
    /// The handshake (challenge, response, ready, refused): the only kind before it completes.
    Hello = 1,
    /// A task for the node to run (root to node).
    Task = 2,
    /// A control request (root to node).
    Control = 3,
    /// The reply to a control request (node to root).
    ControlReply = 4,
    /// A finished task (node to root).
    Completion = 5,
    /// A liveness probe or its answer.
    Health = 6,
    /// Orderly end of the session.
    Shutdown = 7,
    /// Cancel the task with this sequence number (root to node, on the health connection):
    /// its run passed its deadline or was cancelled at the root.
    Cancel = 8,
}

impl FrameKind {
    /// Every kind, in wire order.
    pub(crate) const ALL: [FrameKind; 8] = [
        FrameKind::Hello,
        FrameKind::Task,
        FrameKind::Control,
        FrameKind::ControlReply,
        FrameKind::Completion,
        FrameKind::Health,
        FrameKind::Shutdown,
        FrameKind::Cancel,
    ];

    /// The kind whose wire value is `v`, if any.
    pub(crate) fn from_u16(v: u16) -> Option<FrameKind> {
        FrameKind::ALL.into_iter().find(|k| *k as u16 == v)
    }
}

/// One frame as read: its kind, the sender's sequence number and its body.
#[derive(Debug)]
pub(crate) struct Frame {
    /// What the frame carries.
    pub(crate) kind: FrameKind,
    /// The sender's sequence number (the protocol layer above gives it meaning).
    pub(crate) seq: u64,
    /// The body, exactly as long as the header said.
    pub(crate) body: Vec<u8>,
}

/// Why [`read_frame`] (or a [`BodyReader`]) returned no frame.
#[derive(Debug)]
pub(crate) enum FrameError {
    /// The peer closed the connection cleanly between frames.
    Closed,
    /// An I/O error (including a read timeout: `io::ErrorKind::WouldBlock` / `TimedOut`).
    Io(io::Error),
    /// Bytes that are not a valid frame: what was wrong, e.g. "bad magic 0x..", "protocol
    /// version 7, this side speaks 2", "unknown frame kind 99", "flags 0x4 set", "body of
    /// 2147483648 bytes is over the 4096-byte limit", "connection closed inside a frame (12 of
    /// 24 header bytes)".
    Malformed(String),
}

impl FrameError {
    /// True for a read that ran out of time (a read timeout on the stream).
    pub(crate) fn is_timeout(&self) -> bool {
        matches!(self, FrameError::Io(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
    }

    /// True for a frame whose header names a protocol version other than [`PROTOCOL_VERSION`].
    pub(crate) fn is_version_mismatch(&self) -> bool {
        matches!(self, FrameError::Malformed(m) if m.starts_with("protocol version "))
    }

    /// This error as a crate error, its message prefixed with `context` (which should name the
    /// peer): a timeout is [`ErrorKind::Timeout`], a version mismatch
    /// [`ErrorKind::InvalidArgument`] (retrying cannot help), anything else (closed, I/O,
    /// malformed) [`ErrorKind::WorkerDied`].
    pub(crate) fn into_error(self, context: impl fmt::Display) -> Error {
        let kind = if self.is_timeout() {
            ErrorKind::Timeout
        } else if self.is_version_mismatch() {
            ErrorKind::InvalidArgument
        } else {
            ErrorKind::WorkerDied
        };
        Error::new(kind, format!("{context}: {self}"))
    }
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Closed => f.write_str("the peer closed the connection"),
            FrameError::Io(e) if self.is_timeout() => write!(f, "timed out waiting for the peer ({e})"),
            FrameError::Io(e) => write!(f, "i/o error: {e}"),
            FrameError::Malformed(what) => write!(f, "malformed frame: {what}"),
        }
    }
}

impl std::error::Error for FrameError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FrameError::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// The header of a frame of `kind` and `seq` with a body of `body_len` bytes.
fn header(kind: FrameKind, seq: u64, body_len: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC);
    h[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    h[6..8].copy_from_slice(&(kind as u16).to_le_bytes());
    // h[8..12]: flags, always 0 in version 1.
    h[12..20].copy_from_slice(&seq.to_le_bytes());
    h[20..24].copy_from_slice(&body_len.to_le_bytes());
    h
}

/// Writes one frame (header + body) with as few syscalls as practical: one vectored write of
/// both parts (one `writev` on a socket, unless the kernel takes only part of it). Does not
/// flush. A body of 4 GiB or more is refused (`io::ErrorKind::InvalidInput`) before anything is
/// written.
pub(crate) fn write_frame(w: &mut impl Write, kind: FrameKind, seq: u64, body: &[u8]) -> io::Result<()> {
    write_frame_start(w, kind, seq, body.len(), body)
}

/// Writes a frame's header for a body of `body_len` bytes and the body's first part `first`
/// (in one vectored write); the caller writes the other `body_len - first.len()` bytes right
/// after, before any other frame. A body of 4 GiB or more, or a first part longer than the
/// body, is refused (`io::ErrorKind::InvalidInput`) before anything is written.
pub(crate) fn write_frame_start(
    w: &mut impl Write,
    kind: FrameKind,
    seq: u64,
    body_len: usize,
    first: &[u8],
) -> io::Result<()> {
    let len = u32::try_from(body_len).ok().filter(|_| first.len() <= body_len).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a frame body of {body_len} bytes does not fit the header's 32-bit length (or its first part)"
            ),
        )
    })?;
    let head = header(kind, seq, len);
    let mut parts = [IoSlice::new(&head), IoSlice::new(first)];
    let mut bufs = &mut parts[..];
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "the peer took no more bytes")),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Fills `buf` from `r`; returns how many bytes came before a clean end of stream (`buf.len()`
/// when it filled).
fn fill(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// A frame's header as read: its kind, the sender's sequence number and how long its body is
/// (checked against the limit; the body has not been read).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FrameHead {
    /// What the frame carries.
    pub(crate) kind: FrameKind,
    /// The sender's sequence number.
    pub(crate) seq: u64,
    /// The body's length in bytes, at most the `max_body` it was read with.
    pub(crate) len: usize,
}

/// Reads one frame's header; every field is checked (magic, version, kind, flags must be 0,
/// length <= `max_body`). The caller reads the body (exactly `len` bytes) before the next
/// frame; [`read_frame`] does both.
pub(crate) fn read_frame_head(r: &mut impl Read, max_body: usize) -> Result<FrameHead, FrameError> {
    let mut h = [0u8; HEADER_LEN];
    match fill(r, &mut h).map_err(FrameError::Io)? {
        0 => return Err(FrameError::Closed),
        HEADER_LEN => {}
        n => {
            return Err(FrameError::Malformed(format!(
                "connection closed inside a frame ({n} of {HEADER_LEN} header bytes)"
            )));
        }
    }
    let u16_at = |at: usize| u16::from_le_bytes([h[at], h[at + 1]]);
    let u32_at = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    if h[0..4] != MAGIC {
        return Err(FrameError::Malformed(format!(
            "bad magic 0x{:08x} (expected 0x{:08x}, \"SPNF\")",
            u32::from_be_bytes([h[0], h[1], h[2], h[3]]),
            u32::from_be_bytes(MAGIC)
        )));
    }
    let version = u16_at(4);
    if version != PROTOCOL_VERSION {
        return Err(FrameError::Malformed(format!(
            "protocol version {version}, this side speaks {PROTOCOL_VERSION}"
        )));
    }
    let kind_raw = u16_at(6);
    let kind = FrameKind::from_u16(kind_raw)
        .ok_or_else(|| FrameError::Malformed(format!("unknown frame kind {kind_raw}")))?;
    let flags = u32_at(8);
    if flags != 0 {
        return Err(FrameError::Malformed(format!("flags 0x{flags:x} set (version 1 defines none)")));
    }
    let seq = u64::from_le_bytes(h[12..20].try_into().expect("8 bytes"));
    let len = u32_at(20) as usize;
    if len > max_body {
        return Err(FrameError::Malformed(format!("body of {len} bytes is over the {max_body}-byte limit")));
    }
    Ok(FrameHead { kind, seq, len })
}

/// Reads the body of a frame whose header `head` was just read.
pub(crate) fn read_body(r: &mut impl Read, head: FrameHead) -> Result<Vec<u8>, FrameError> {
    // Zeroed memory: a large body is backed page by page only as it arrives.
    let mut body = vec![0u8; head.len];
    read_part(r, &mut body).map_err(|e| match e {
        FrameError::Malformed(m) => FrameError::Malformed(format!("{m} of a {:?} frame", head.kind)),
        e => e,
    })?;
    Ok(body)
}

/// Fills `buf` with the next bytes of a frame's body (a body read in parts: the head of a
/// TASK, then each tensor's bytes); the stream ending first is a malformed frame.
pub(crate) fn read_part(r: &mut impl Read, buf: &mut [u8]) -> Result<(), FrameError> {
    let got = fill(r, buf).map_err(FrameError::Io)?;
    if got < buf.len() {
        return Err(FrameError::Malformed(format!(
            "connection closed inside a frame ({got} of {} body bytes)",
            buf.len()
        )));
    }
    Ok(())
}

/// Reads and drops the next `n` bytes of a frame's body (parts nobody wants).
pub(crate) fn skip_part(r: &mut impl Read, n: u64) -> Result<(), FrameError> {
    let copied = io::copy(&mut Read::take(&mut *r, n), &mut io::sink()).map_err(FrameError::Io)?;
    if copied < n {
        return Err(FrameError::Malformed(format!(
            "connection closed inside a frame ({copied} of {n} bytes)"
        )));
    }
    Ok(())
}

/// Reads one frame; every header field is checked (magic, version, kind, flags must be 0,
/// length <= `max_body`) BEFORE the body is allocated or read.
pub(crate) fn read_frame(r: &mut impl Read, max_body: usize) -> Result<Frame, FrameError> {
    let head = read_frame_head(r, max_body)?;
    let body = read_body(r, head)?;
    Ok(Frame { kind: head.kind, seq: head.seq, body })
}

/// Builds a frame body: little-endian integers, length-prefixed and raw byte strings.
#[derive(Debug, Default)]
pub(crate) struct BodyWriter(Vec<u8>);

impl BodyWriter {
    /// An empty body.
    pub(crate) fn new() -> BodyWriter {
        BodyWriter(Vec::new())
    }

    /// An empty body with room for `n` bytes.
    pub(crate) fn with_capacity(n: usize) -> BodyWriter {
        BodyWriter(Vec::with_capacity(n))
    }

    /// Appends a byte.
    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }

    /// Appends a little-endian `u16`.
    pub(crate) fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a little-endian `u32`.
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a little-endian `u64`.
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends `b` after its length as a little-endian `u32` (read back by
    /// [`BodyReader::bytes`]).
    ///
    /// # Panics
    ///
    /// When `b` is 4 GiB or longer: no frame can carry it ([`DEFAULT_MAX_BODY`] is 1 GiB).
    pub(crate) fn bytes(&mut self, b: &[u8]) -> &mut Self {
        let len = u32::try_from(b.len()).expect("a frame body field under 4 GiB");
        self.u32(len);
        self.0.extend_from_slice(b);
        self
    }

    /// Appends `b` with no length prefix (read back by [`BodyReader::raw`]).
    pub(crate) fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }

    /// The body.
    pub(crate) fn finish(self) -> Vec<u8> {
        self.0
    }
}

/// Reads a frame body written by a [`BodyWriter`]: every read is bounds-checked, and a read
/// past the end is a [`FrameError::Malformed`] naming the offset, never a panic.
#[derive(Debug, Clone)]
pub(crate) struct BodyReader<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> BodyReader<'a> {
    /// A reader at the start of `body`.
    pub(crate) fn new(body: &'a [u8]) -> BodyReader<'a> {
        BodyReader { body, at: 0 }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], FrameError> {
        let left = self.remaining();
        if n > left {
            return Err(FrameError::Malformed(format!(
                "body too short: {what} needs {n} bytes at offset {}, {left} left",
                self.at
            )));
        }
        let out = &self.body[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], FrameError> {
        let b = self.take(N, what)?;
        Ok(b.try_into().expect("take returned N bytes"))
    }

    /// Reads a byte.
    pub(crate) fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.array::<1>("a u8")?[0])
    }

    /// Reads a little-endian `u16`.
    pub(crate) fn u16(&mut self) -> Result<u16, FrameError> {
        Ok(u16::from_le_bytes(self.array("a u16")?))
    }

    /// Reads a little-endian `u32`.
    pub(crate) fn u32(&mut self) -> Result<u32, FrameError> {
        Ok(u32::from_le_bytes(self.array("a u32")?))
    }

    /// Reads a little-endian `u64`.
    pub(crate) fn u64(&mut self) -> Result<u64, FrameError> {
        Ok(u64::from_le_bytes(self.array("a u64")?))
    }

    /// Reads a byte string written by [`BodyWriter::bytes`]: a `u32` length, checked against
    /// what is left before anything is taken, then that many bytes (borrowed, not copied).
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], FrameError> {
        let start = self.at;
        let len = self.u32()? as usize;
        let left = self.remaining();
        if len > left {
            self.at = start;
            return Err(FrameError::Malformed(format!(
                "body too short: a byte string at offset {start} claims {len} bytes, {left} left"
            )));
        }
        self.take(len, "a byte string")
    }

    /// Reads `n` bytes with no length prefix (borrowed, not copied).
    pub(crate) fn raw(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        self.take(n, "a raw field")
    }

    /// The bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.body.len() - self.at
    }

    /// Ends the read: an error if bytes are left over (a body longer than its message).
    pub(crate) fn finish(self) -> Result<(), FrameError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(FrameError::Malformed(format!(
                "{n} bytes left over after the body's last field (at offset {} of {})",
                self.at,
                self.body.len()
            ))),
        }
    }
}

#[cfg(test)]
mod tests;
