use std::io::Cursor;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::*;

fn encode(kind: FrameKind, seq: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame(&mut out, kind, seq, body).unwrap();
    out
}

fn malformed(bytes: &[u8], max_body: usize) -> String {
    match read_frame(&mut &bytes[..], max_body) {
        Err(FrameError::Malformed(m)) => m,
        other => panic!("expected Malformed, got {other:?}"),
    }
}

#[test]
fn every_kind_round_trips() {
    for (i, kind) in FrameKind::ALL.into_iter().enumerate() {
        let body: Vec<u8> = (0..i * 37).map(|b| b as u8).collect();
        let seq = u64::MAX - i as u64;
        let bytes = encode(kind, seq, &body);
        assert_eq!(bytes.len(), HEADER_LEN + body.len());
        let mut r = Cursor::new(&bytes);
        let f = read_frame(&mut r, DEFAULT_MAX_BODY).unwrap();
        assert_eq!((f.kind, f.seq, &f.body), (kind, seq, &body));
        assert_eq!(FrameKind::from_u16(kind as u16), Some(kind));
        // Then a clean end of stream between frames.
        assert!(matches!(read_frame(&mut r, DEFAULT_MAX_BODY), Err(FrameError::Closed)));
    }
    assert_eq!(FrameKind::from_u16(0), None);
    assert_eq!(FrameKind::from_u16(9), None);
}

#[test]
fn frames_follow_one_another() {
    let mut bytes = encode(FrameKind::Task, 1, b"first");
    bytes.extend(encode(FrameKind::Health, 2, b""));
    let mut r = &bytes[..];
    assert_eq!(read_frame(&mut r, 64).unwrap().body, b"first");
    let f = read_frame(&mut r, 64).unwrap();
    assert_eq!((f.kind, f.seq, f.body.len()), (FrameKind::Health, 2, 0));
    assert!(matches!(read_frame(&mut r, 64), Err(FrameError::Closed)));
}

#[test]
fn the_header_layout_is_as_documented() {
    let b = encode(FrameKind::ControlReply, 0x0102_0304_0506_0708, b"xyz");
    assert_eq!(&b[0..4], b"SPNF");
    assert_eq!(&b[4..6], &PROTOCOL_VERSION.to_le_bytes());
    assert_eq!(&b[6..8], &[4, 0]);
    assert_eq!(&b[8..12], &[0; 4]);
    assert_eq!(&b[12..20], &[8, 7, 6, 5, 4, 3, 2, 1]);
    assert_eq!(&b[20..24], &[3, 0, 0, 0]);
    assert_eq!(&b[24..], b"xyz");
}

#[test]
fn each_corrupted_header_field_is_named() {
    let good = encode(FrameKind::Task, 9, b"body");
    let mut b = good.clone();
    b[0] = b'X';
    assert!(malformed(&b, 64).contains("bad magic 0x58504e46"), "{}", malformed(&b, 64));
    let mut b = good.clone();
    b[4..6].copy_from_slice(&7u16.to_le_bytes());
    assert_eq!(malformed(&b, 64), format!("protocol version 7, this side speaks {PROTOCOL_VERSION}"));
    assert!(read_frame(&mut &b[..], 64).unwrap_err().is_version_mismatch());
    let mut b = good.clone();
    b[6..8].copy_from_slice(&99u16.to_le_bytes());
    assert_eq!(malformed(&b, 64), "unknown frame kind 99");
    let mut b = good.clone();
    b[6..8].copy_from_slice(&0u16.to_le_bytes());
    assert_eq!(malformed(&b, 64), "unknown frame kind 0");
    let mut b = good.clone();
    b[8..12].copy_from_slice(&4u32.to_le_bytes());
    assert!(malformed(&b, 64).starts_with("flags 0x4 set"));
    let mut b = good.clone();
    b[20..24].copy_from_slice(&0x8000_0000u32.to_le_bytes());
    assert_eq!(malformed(&b, 4096), "body of 2147483648 bytes is over the 4096-byte limit");
    // The sequence number is the sender's business: any value reads back.
    let mut b = good;
    b[12..20].copy_from_slice(&[0xff; 8]);
    assert_eq!(read_frame(&mut &b[..], 64).unwrap().seq, u64::MAX);
}

#[test]
fn truncation_is_malformed_and_a_clean_end_is_closed() {
    assert!(matches!(read_frame(&mut &[][..], 64), Err(FrameError::Closed)));
    let good = encode(FrameKind::Completion, 3, &[5; 40]);
    for cut in 1..good.len() {
        let m = malformed(&good[..cut], 64);
        assert!(m.starts_with("connection closed inside a frame"), "{m}");
        if cut < HEADER_LEN {
            assert!(m.contains(&format!("({cut} of 24 header bytes)")), "{m}");
        } else {
            assert!(m.contains(&format!("({} of 40 body bytes", cut - HEADER_LEN)), "{m}");
        }
    }
    assert_eq!(malformed(&good[..12], 64), "connection closed inside a frame (12 of 24 header bytes)");
}

/// A reader that serves a header and panics if asked for a single body byte.
struct HeaderOnly {
    header: [u8; HEADER_LEN],
    at: usize,
}

impl Read for HeaderOnly {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        assert!(self.at < HEADER_LEN, "read_frame tried to read the body of a refused frame");
        let n = buf.len().min(HEADER_LEN - self.at);
        buf[..n].copy_from_slice(&self.header[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[test]
fn an_oversize_length_is_refused_before_the_body_is_touched() {
    let claimed = (1u32 << 30) + 1;
    let mut r = HeaderOnly { header: header(FrameKind::Task, 0, claimed), at: 0 };
    let err = read_frame(&mut r, MAX_HELLO_BODY).unwrap_err();
    assert!(
        matches!(&err, FrameError::Malformed(m) if m == "body of 1073741825 bytes is over the 4096-byte limit")
    );
    assert_eq!(r.at, HEADER_LEN);
    // The default limit refuses it as well, and a body exactly at the limit is accepted.
    let mut r = HeaderOnly { header: header(FrameKind::Task, 0, claimed), at: 0 };
    assert!(matches!(read_frame(&mut r, DEFAULT_MAX_BODY), Err(FrameError::Malformed(_))));
    let at_limit = encode(FrameKind::Hello, 0, &[1; MAX_HELLO_BODY]);
    assert_eq!(read_frame(&mut &at_limit[..], MAX_HELLO_BODY).unwrap().body.len(), MAX_HELLO_BODY);
    assert!(matches!(read_frame(&mut &at_limit[..], MAX_HELLO_BODY - 1), Err(FrameError::Malformed(_))));
}

/// A writer that takes at most 5 bytes a call and is interrupted every other call.
struct Trickle {
    out: Vec<u8>,
    calls: usize,
}

impl Write for Trickle {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.calls += 1;
        if self.calls.is_multiple_of(2) {
            return Err(io::Error::from(io::ErrorKind::Interrupted));
        }
        let n = buf.len().min(5);
        self.out.extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn partial_and_interrupted_writes_complete_the_frame() {
    let mut w = Trickle { out: Vec::new(), calls: 0 };
    write_frame(&mut w, FrameKind::Control, 77, b"a body longer than five").unwrap();
    assert_eq!(w.out, encode(FrameKind::Control, 77, b"a body longer than five"));
}

#[test]
fn io_errors_and_timeouts_are_told_apart() {
    struct Failing(io::ErrorKind);
    impl Read for Failing {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            Err(io::Error::from(self.0))
        }
    }
    let e = read_frame(&mut Failing(io::ErrorKind::WouldBlock), 64).unwrap_err();
    assert!(e.is_timeout());
    assert_eq!(e.into_error("node 127.0.0.1:1").kind(), ErrorKind::Timeout);
    let e = read_frame(&mut Failing(io::ErrorKind::ConnectionReset), 64).unwrap_err();
    assert!(matches!(e, FrameError::Io(_)) && !e.is_timeout());
    let err = e.into_error("node 127.0.0.1:1");
    assert_eq!(err.kind(), ErrorKind::WorkerDied);
    assert!(err.message().starts_with("node 127.0.0.1:1: i/o error"), "{}", err.message());
    assert_eq!(FrameError::Closed.into_error("x").kind(), ErrorKind::WorkerDied);
    let v = FrameError::Malformed("protocol version 2, this side speaks 1".into());
    assert_eq!(v.into_error("x").kind(), ErrorKind::InvalidArgument);
}

#[test]
fn body_reader_reads_back_what_the_writer_wrote() {
    let mut w = BodyWriter::new();
    w.u8(1).u16(0x0203).u32(0x0405_0607).u64(u64::MAX).bytes(b"hello").raw(b"tail");
    let body = w.finish();
    assert_eq!(body.len(), 1 + 2 + 4 + 8 + 4 + 5 + 4);
    let mut r = BodyReader::new(&body);
    assert_eq!(r.u8().unwrap(), 1);
    assert_eq!(r.u16().unwrap(), 0x0203);
    assert_eq!(r.u32().unwrap(), 0x0405_0607);
    assert_eq!(r.u64().unwrap(), u64::MAX);
    assert_eq!(r.bytes().unwrap(), b"hello");
    assert_eq!(r.remaining(), 4);
    assert_eq!(r.raw(4).unwrap(), b"tail");
    r.finish().unwrap();
    assert!(BodyWriter::with_capacity(8).finish().is_empty());
}

#[test]
fn every_read_past_the_end_is_an_error() {
    let body = [0u8; 3];
    let at_end = || {
        let mut r = BodyReader::new(&body);
        r.raw(3).unwrap();
        r
    };
    assert!(matches!(at_end().u8(), Err(FrameError::Malformed(_))));
    assert!(at_end().u16().is_err());
    assert!(at_end().u32().is_err());
    assert!(at_end().u64().is_err());
    assert!(at_end().bytes().is_err());
    assert!(at_end().raw(1).is_err());
    assert_eq!(at_end().raw(0).unwrap(), b"");
    // Short reads from part-way through.
    assert!(BodyReader::new(&body).u32().is_err());
    assert!(BodyReader::new(&body).u64().is_err());
    assert!(BodyReader::new(&body).raw(usize::MAX).is_err());
    let mut r = BodyReader::new(&body);
    r.u16().unwrap();
    assert!(r.u16().is_err());
    assert_eq!(r.remaining(), 1, "a failed read takes nothing");
    let err = BodyReader::new(&body).finish().unwrap_err();
    assert!(matches!(&err, FrameError::Malformed(m) if m.starts_with("3 bytes left over")), "{err}");
}

#[test]
fn a_byte_string_longer_than_the_body_is_refused_not_allocated() {
    let mut w = BodyWriter::new();
    w.u32(u32::MAX).raw(b"abc");
    let body = w.finish();
    let mut r = BodyReader::new(&body);
    let err = r.bytes().unwrap_err();
    assert!(
        matches!(&err, FrameError::Malformed(m) if m.contains("claims 4294967295 bytes, 3 left")),
        "{err}"
    );
    assert_eq!(r.remaining(), body.len(), "a refused byte string leaves the reader where it was");
    // Exactly what is left is fine.
    let mut w = BodyWriter::new();
    w.u32(3).raw(b"abc");
    let body = w.finish();
    assert_eq!(BodyReader::new(&body).bytes().unwrap(), b"abc");
}

/// xorshift64*: a seeded generator for the mutation loop.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }
}

/// Mutates a valid frame: flipped bits, interesting values over header words, truncation,
/// extension, random bytes.
fn mutate(rng: &mut Rng, frame: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(3) {
        match rng.below(6) {
            0 if !frame.is_empty() => {
                let i = rng.below(frame.len());
                frame[i] ^= 1 << rng.below(8);
            }
            1 => {
                // An interesting u32 over one of the header's 32-bit words.
                let word = [0u32, 1, 0x7fff_ffff, 0x8000_0000, u32::MAX, 4096, 4097, 24][rng.below(8)];
                let at = [0, 4, 8, 16, 20][rng.below(5)];
                if frame.len() >= at + 4 {
                    frame[at..at + 4].copy_from_slice(&word.to_le_bytes());
                }
            }
            2 => frame.truncate(rng.below(frame.len() + 1)),
            3 => {
                let extra = rng.below(40);
                frame.extend((0..extra).map(|_| rng.next() as u8));
            }
            4 if !frame.is_empty() => {
                let i = rng.below(frame.len());
                frame[i] = rng.next() as u8;
            }
            _ => {
                let n = rng.below(64);
                *frame = (0..n).map(|_| rng.next() as u8).collect();
            }
        }
    }
}

#[test]
fn mutated_frames_never_panic() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut accepted = 0;
    for i in 0..4000 {
        let kind = FrameKind::ALL[rng.below(FrameKind::ALL.len())];
        let body: Vec<u8> = (0..rng.below(200)).map(|_| rng.next() as u8).collect();
        let mut bytes = encode(kind, rng.next(), &body);
        mutate(&mut rng, &mut bytes);
        let max_body = [0, 64, 199, 4096][rng.below(4)];
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let mut r = &bytes[..];
            let result = read_frame(&mut r, max_body);
            if let Ok(f) = &result {
                // What was accepted re-encodes to the bytes it was read from.
                assert!(f.body.len() <= max_body);
                let used = bytes.len() - r.len();
                assert_eq!(encode(f.kind, f.seq, &f.body), &bytes[..used]);
                // And any reading of its body stays in bounds.
                let mut br = BodyReader::new(&f.body);
                while br.remaining() > 0 {
                    let step = match f.seq % 3 {
                        0 => br.bytes().map(|b| b.len()),
                        1 => br.u64().map(|_| 8),
                        _ => br.u16().map(|_| 2),
                    };
                    if step.is_err() {
                        break;
                    }
                }
            }
            result.map(|_| ()).map_err(|e| e.to_string())
        }));
        match outcome {
            Ok(Ok(())) => accepted += 1,
            Ok(Err(msg)) => assert!(!msg.is_empty()),
            Err(_) => panic!("input {i} panicked: {bytes:02x?}"),
        }
    }
    // The mutations leave some frames valid (a flipped sequence bit, an appended tail).
    assert!(accepted > 0);
}
