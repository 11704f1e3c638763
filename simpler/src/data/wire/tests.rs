use super::*;
use crate::error::ErrorKind;

fn shm_desc(buffer_id: u64, fd: u32, access: Access, nbytes: u64) -> BufferDesc {
    let identity = Identity::new(0xfeed_beef_0123_4567, buffer_id, 3).unwrap();
    let backing = Backing::Memfd { pid: 4242, fd, ino: 0x1_0000_0000 + u64::from(fd) };
    BufferDesc::new(identity, backing, access, nbytes).unwrap()
}

/// The ring inode of [`slab_desc`]'s slabs.
const SLAB_INO: u64 = 0x99_0000_0077;

fn slab_desc(buffer_id: u64, addr: u64, access: Access, nbytes: u64) -> BufferDesc {
    let identity = Identity::new(0x0bad_cafe, buffer_id, 1).unwrap();
    BufferDesc::new(identity, Backing::HeapSlab { addr, ino: SLAB_INO }, access, nbytes).unwrap()
}

/// A tensor; empty `st` means contiguous.
fn tensor(d: BufferDesc, dt: DataType, off: u64, shape: &[u32], st: &[u32]) -> Tensor {
    let st = (!st.is_empty()).then_some(st);
    Tensor::from_desc(d, TensorView::new(off, shape, st, dt).unwrap()).unwrap()
}

/// A varied set of tensors with their granted access.
fn sample() -> Vec<(Tensor, Access)> {
    use Access::{Read, ReadWrite, Write};
    let shm = shm_desc(1, 7, ReadWrite, 4096);
    let slab = slab_desc(2, 0x7f00_0000_1000, ReadWrite, 1 << 20);
    let long = shm_desc(9, i32::MAX as u32, Read, 64);
    let tensors = [
        tensor(shm, DataType::Float32, 0, &[4, 8], &[]),
        tensor(slab, DataType::Float16, 128, &[3, 4, 2], &[64, 8, 2]),
        tensor(slab, DataType::Int64, 8, &[2, 1, 3, 1, 2], &[]),
        tensor(shm, DataType::Fp4E2M1, 1, &[7], &[3]),
        tensor(long, DataType::BFloat16, 2, &[2, 3], &[1, 2]),
        tensor(slab, DataType::Uint8, 4096, &[5, 5, 5, 5, 5], &[]),
    ];
    let grants = [Read, Write, ReadWrite, ReadWrite, Read, Write];
    tensors.into_iter().zip(grants).collect()
}

fn pairs(ts: &[(Tensor, Access)]) -> impl ExactSizeIterator<Item = (&Tensor, Access)> {
    ts.iter().map(|(t, a)| (t, *a))
}

fn encode(tensors: &[(Tensor, Access)], scalars: &[u64]) -> Vec<u8> {
    let mut out = vec![0u8; blob_size(tensors.len(), scalars.len())];
    let n = encode_args(pairs(tensors), scalars, &mut out).unwrap();
    assert_eq!(n, out.len());
    out
}

fn check_round_trip(tensors: &[(Tensor, Access)], scalars: &[u64]) {
    let blob = encode(tensors, scalars);
    assert_eq!(blob.len(), 8 + 144 * tensors.len() + 8 * scalars.len());
    let dec = decode_args(&blob).unwrap();
    assert_eq!(dec.tensors.len(), tensors.len());
    for ((t, a), w) in tensors.iter().zip(&dec.tensors) {
        assert_eq!(w.desc, t.desc().with_access(*a));
        assert_eq!(w.view, *t.view());
    }
    assert_eq!(&dec.scalars[..], scalars);
    // Trailing bytes are ignored.
    let mut longer = blob.clone();
    longer.extend_from_slice(&[0xa5; 300]);
    assert_eq!(decode_args(&longer).unwrap(), dec);
}

#[test]
fn round_trips() {
    let ts = sample();
    let scalars = [0, 1, u64::MAX, 0xdead_beef, u64::from(1.5f32.to_bits())];
    check_round_trip(&ts, &scalars);
    check_round_trip(&ts, &[]);
    check_round_trip(&[], &scalars);
    check_round_trip(&[], &[]);
    let empty = encode(&[], &[]);
    assert_eq!(empty, vec![0u8; 8]);
    assert_eq!(decode_args(&empty).unwrap(), DecodedArgs::default());
}

#[test]
fn record_layout_is_as_documented() {
    let slab = slab_desc(0x0102, 0x1122_3344_5566_7788, Access::ReadWrite, 0x1000);
    let t = tensor(slab, DataType::Int32, 16, &[2, 3], &[8, 2]);
    let blob = encode(&[(t, Access::Write)], &[0xabcd]);
    assert_eq!(&blob[0..8], &[1, 0, 0, 0, 1, 0, 0, 0]);
    let r = &blob[8..8 + 144];
    assert_eq!(&r[0..2], &[0x42, 0x53]);
    assert_eq!(r[2], 0); // HOST
    assert_eq!(r[3], 1); // Write
    assert_eq!(r[4], 0); // HeapSlab
    assert_eq!(r[8..16], 0x0bad_cafe_u64.to_le_bytes());
    assert_eq!(r[16..24], 0x0102_u64.to_le_bytes());
    assert_eq!(r[24..28], 1u32.to_le_bytes());
    assert_eq!(r[40..48], 0x1000_u64.to_le_bytes());
    assert_eq!(r[48..52], [0; 4]);
    assert_eq!(r[52..54], 16u16.to_le_bytes());
    assert_eq!(r[56..64], 0x1122_3344_5566_7788_u64.to_le_bytes());
    assert_eq!(r[64..72], SLAB_INO.to_le_bytes());
    assert_eq!(r[88..96], 16u64.to_le_bytes());
    assert_eq!(r[96..100], 2u32.to_le_bytes());
    assert_eq!(r[100..104], 2u32.to_le_bytes());
    assert_eq!(r[104..108], 3u32.to_le_bytes());
    assert_eq!(r[108..120], [0; 12]);
    assert_eq!(r[120..124], 8u32.to_le_bytes());
    assert_eq!(r[124..128], 2u32.to_le_bytes());
    assert_eq!(r[140], DataType::Int32.as_u8());
    assert_eq!(blob[152..160], 0xabcd_u64.to_le_bytes());
    // Every padding range is zero.
    for range in [5..8, 28..40, 54..56, 72..88, 128..140, 141..144] {
        assert!(r[range].iter().all(|&b| b == 0));
    }
}

#[test]
fn memfd_body_layout_is_as_documented() {
    let d = shm_desc(2, 0x0a0b_0c0d, Access::ReadWrite, 64);
    let blob = encode(&[(tensor(d, DataType::Uint8, 0, &[64], &[]), Access::Read)], &[]);
    let r = &blob[8..8 + 144];
    assert_eq!(r[4], 2); // Memfd
    assert_eq!(r[52..54], 16u16.to_le_bytes());
    assert_eq!(r[56..60], 4242u32.to_le_bytes()); // pid
    assert_eq!(r[60..64], 0x0a0b_0c0d_u32.to_le_bytes()); // fd
    assert_eq!(r[64..72], (0x1_0000_0000_u64 + 0x0a0b_0c0d).to_le_bytes()); // inode
    assert!(r[72..88].iter().all(|&b| b == 0));
    assert_eq!(decode_args(&blob).unwrap().tensors[0].desc, d.with_access(Access::Read));
}

#[test]
fn access_byte_is_the_granted_access() {
    let read_only = shm_desc(4, 4, Access::Read, 64);
    let t = tensor(read_only, DataType::Float32, 0, &[16], &[]);
    for granted in [Access::Read, Access::Write, Access::ReadWrite] {
        let blob = encode(&[(t.clone(), granted)], &[]);
        assert_eq!(blob[8 + 3], granted as u8);
        let dec = decode_args(&blob).unwrap();
        assert_eq!(dec.tensors[0].desc.access(), granted);
    }
    let rw = shm_desc(5, 5, Access::ReadWrite, 64);
    let t = tensor(rw, DataType::Float32, 0, &[16], &[]);
    let blob = encode(&[(t, Access::Read)], &[]);
    assert_eq!(blob[8 + 3], Access::Read as u8);
}

#[test]
fn encode_refuses_a_small_mailbox() {
    let ts = sample();
    let mut out = vec![0u8; 100];
    let err = encode_args(pairs(&ts), &[1, 2], &mut out).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let n = blob_size(ts.len(), 2);
    let want = format!("args blob of {n} bytes exceeds the mailbox capacity of 100 bytes");
    assert_eq!(err.message(), want);
    // Exactly enough room works, and leaves the rest of a larger buffer alone.
    let mut out = vec![0x77u8; n + 5];
    assert_eq!(encode_args(pairs(&ts), &[1, 2], &mut out).unwrap(), n);
    assert_eq!(&out[n..], &[0x77; 5]);
}

#[test]
fn every_truncation_is_an_error() {
    let blob = encode(&sample(), &[1, 2, 3]);
    for len in 0..blob.len() {
        let err = decode_args(&blob[..len]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Decode, "len {len}");
    }
    assert!(decode_args(&blob).is_ok());
}

fn header(t: u32, s: u32, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    b[0..4].copy_from_slice(&t.to_le_bytes());
    b[4..8].copy_from_slice(&s.to_le_bytes());
    b
}

#[test]
fn short_blob_message() {
    let err = decode_args(&header(5, 2, 100)).unwrap_err();
    let want = "args blob declares 5 tensors and 2 scalars (744 bytes) but only 100 bytes \
                are present";
    assert_eq!(err.message(), want);
}

#[test]
fn huge_counts_error_without_allocating() {
    const M: u32 = u32::MAX;
    let start = std::time::Instant::now();
    for (t, s) in [(M, M), (M, 0), (0, M), (1 << 30, 7)] {
        let err = decode_args(&header(t, s, 64)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Decode);
        expect(err, "but only 64 bytes are present");
    }
    assert!(start.elapsed() < std::time::Duration::from_secs(1));
}

/// Encodes `tensors`, lets `f` corrupt record `rec`, decodes, and returns the error.
fn corrupt(tensors: &[(Tensor, Access)], rec: usize, f: impl FnOnce(&mut [u8])) -> Error {
    let mut blob = encode(tensors, &[42]);
    f(&mut blob[8 + 144 * rec..8 + 144 * (rec + 1)]);
    let err = decode_args(&blob).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Decode, "{err}");
    let prefix = format!("tensor record {rec}: ");
    assert!(err.message().starts_with(&prefix), "{err}");
    err
}

fn expect(err: Error, needle: &str) {
    let msg = err.message();
    assert!(msg.contains(needle), "{msg:?} should mention {needle:?}");
}

fn two_shm() -> Vec<(Tensor, Access)> {
    let d = shm_desc(1, 3, Access::ReadWrite, 256);
    let a = tensor(d, DataType::Float32, 0, &[4], &[]);
    let b = tensor(d, DataType::Float32, 16, &[2, 4], &[8, 1]);
    vec![(a, Access::Read), (b, Access::ReadWrite)]
}

#[test]
fn device_descriptors_round_trip() {
    let identity = Identity::new(9, 3, 1).unwrap();
    let d =
        BufferDesc::new(identity, Backing::Device { ptr: 4096, chip: 2 }, Access::ReadWrite, 1024).unwrap();
    let t = tensor(d, DataType::Float32, 0, &[256], &[]);
    let mut out = vec![0u8; blob_size(1, 0)];
    encode_args([(&t, Access::Write)].into_iter(), &[], &mut out).unwrap();
    let dec = decode_args(&out).unwrap();
    assert_eq!(dec.tensors[0].desc.backing(), Backing::Device { ptr: 4096, chip: 2 });
    assert_eq!(dec.tensors[0].desc.access(), Access::Write);
    let mut bad = out.clone();
    bad[8 + 52] = 8; // body_len
    assert!(decode_args(&bad).is_err(), "a truncated device body is refused");
}

fn one_slab() -> Vec<(Tensor, Access)> {
    let d = slab_desc(1, 0x1000, Access::ReadWrite, 256);
    vec![(tensor(d, DataType::Float32, 0, &[4], &[]), Access::Read)]
}

fn put32(r: &mut [u8], at: usize, v: u32) {
    r[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64(r: &mut [u8], at: usize, v: u64) {
    r[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn corrupted_fields_are_named() {
    let shm = two_shm();
    let slab = one_slab();
    expect(corrupt(&shm, 0, |r| r[0] ^= 0xff), "magic");
    expect(corrupt(&shm, 1, |r| r[1] = 0), "magic");
    expect(corrupt(&shm, 0, |r| r[2] = 1), "does not match address_space 1");
    expect(corrupt(&shm, 0, |r| r[4] = 4), "does not match address_space 0");
    expect(corrupt(&shm, 0, |r| r[2] = 9), "address_space");
    expect(corrupt(&shm, 0, |r| r[3] = 3), "access");
    expect(corrupt(&shm, 0, |r| r[4] = 1), "backend"); // the named shm objects of earlier versions
    expect(corrupt(&shm, 0, |r| r[4] = 3), "backend");
    expect(corrupt(&shm, 0, |r| r[140] = 16), "data type");
    expect(corrupt(&shm, 1, |r| put64(r, 16, 0)), "buffer_id");
    expect(corrupt(&shm, 0, |r| put32(r, 24, 0)), "generation");
    expect(corrupt(&shm, 0, |r| r[52] = 33), "body_len");
    expect(corrupt(&shm, 0, |r| r[53] = 1), "body_len");
    expect(corrupt(&shm, 0, |r| r[56 + 16] = 1), "past body_len");
    expect(corrupt(&shm, 0, |r| r[87] = 1), "past body_len");
    expect(corrupt(&shm, 0, |r| r[52] = 0), "past body_len");
    for at in [5, 7, 28, 39, 54, 55, 141, 143] {
        expect(corrupt(&shm, 0, |r| r[at] = 1), "padding");
    }
    expect(corrupt(&shm, 0, |r| put32(r, 96, 0)), "ndims");
    expect(corrupt(&shm, 0, |r| put32(r, 96, 6)), "ndims");
    expect(corrupt(&shm, 0, |r| put32(r, 96, 257)), "ndims");
    expect(corrupt(&shm, 1, |r| put32(r, 96, 3)), "shape[2]");
    expect(corrupt(&shm, 0, |r| put32(r, 100, 0)), "shape[0]");
    expect(corrupt(&shm, 0, |r| put32(r, 120, 0)), "stride[0]");
    expect(corrupt(&shm, 0, |r| put32(r, 112, 1)), "past ndims");
    expect(corrupt(&shm, 0, |r| r[88] = 2), "byte offset");
    expect(corrupt(&shm, 0, |r| put64(r, 40, 8)), "past the end");
    expect(corrupt(&shm, 0, |r| put32(r, 100, 1000)), "past the end");
    // The memfd body: u32 pid (1..=i32::MAX), u32 fd (0..=i32::MAX), u64 inode (non-zero).
    expect(corrupt(&shm, 0, |r| put32(r, 56, 0)), "memfd host buffer: pid 0");
    expect(corrupt(&shm, 0, |r| put32(r, 56, 1 << 31)), "memfd host buffer: pid 2147483648");
    expect(corrupt(&shm, 0, |r| put32(r, 60, u32::MAX)), "descriptor 4294967295");
    expect(corrupt(&shm, 0, |r| put64(r, 64, 0)), "inode 0");
    let short_body = |r: &mut [u8]| {
        r[52] = 12;
        r[68..72].fill(0);
    };
    expect(corrupt(&shm, 0, short_body), "memfd body_len must be 16");
    expect(corrupt(&shm, 0, |r| r[52] = 17), "memfd body_len must be 16");
    expect(corrupt(&shm, 0, |r| r[52] = 32), "memfd body_len must be 16");
    expect(corrupt(&slab, 0, |r| put64(r, 56, 0)), "address");
    expect(corrupt(&slab, 0, |r| put64(r, 64, 0)), "ring inode 0");
    expect(corrupt(&slab, 0, |r| r[52] = 4), "body_len");
    expect(corrupt(&slab, 0, |r| r[52] = 17), "heap slab body_len must be 16");
    let short_slab = |r: &mut [u8]| {
        r[52] = 8;
        r[64..72].fill(0);
    };
    expect(corrupt(&slab, 0, short_slab), "heap slab body_len must be 16");
    expect(corrupt(&slab, 0, |r| r[72] = 1), "past body_len");
    // A host slab is not device memory.
    expect(corrupt(&slab, 0, |r| r[4] = 4), "address_space");
}

/// Found by the decoder fuzz harness: a record whose unit strides keep the extent inside the
/// buffer while its element count overflows `u64` is refused, not decoded into a view whose
/// `num_elements` panics.
#[test]
fn an_element_count_past_u64_is_refused() {
    let slab = one_slab();
    let huge = |r: &mut [u8]| {
        put32(r, 96, 5);
        for i in 0..5 {
            put32(r, 100 + 4 * i, 65535);
            put32(r, 120 + 4 * i, 1);
        }
        put64(r, 40, 1 << 20);
    };
    expect(corrupt(&slab, 0, huge), "more elements than fit in u64");
}

#[test]
fn ignored_fields_do_not_fail() {
    let mut blob = encode(&two_shm(), &[]);
    put32(&mut blob[8..], 48, 7);
    let dec = decode_args(&blob).unwrap();
    assert_eq!(dec.tensors.len(), 2);
}

#[test]
fn desc_round_trip() {
    let shm = shm_desc(3, 0, Access::Write, 1 << 40);
    let slab = slab_desc(u64::MAX, u64::MAX, Access::Read, 0);
    for desc in [shm, slab] {
        let mut out = [0xffu8; DESC_SIZE];
        encode_desc(&desc, &mut out);
        assert_eq!(decode_desc(&out).unwrap(), desc);
        let mut longer = out.to_vec();
        longer.push(9);
        assert_eq!(decode_desc(&longer).unwrap(), desc);
        let short = decode_desc(&out[..DESC_SIZE - 1]).unwrap_err();
        assert_eq!(short.kind(), ErrorKind::Decode);
        out[0] = 0;
        let err = decode_desc(&out).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Decode);
        expect(err, "buffer descriptor: bad magic");
    }
}

/// xorshift64: a tiny deterministic PRNG.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Re-encodes what was decoded: it must reproduce the input bytes (path ids aside).
fn check_canonical(buf: &[u8], dec: &DecodedArgs) {
    let mut ts = Vec::new();
    for w in &dec.tensors {
        ts.push((Tensor::from_desc(w.desc, w.view).unwrap(), w.desc.access()));
    }
    let again = encode(&ts, &dec.scalars);
    let mut seen = buf[..again.len()].to_vec();
    for i in 0..ts.len() {
        put32(&mut seen[8 + 144 * i..], 48, 0);
    }
    assert_eq!(again, seen);
}

#[test]
fn random_corruption_never_panics() {
    let blob = encode(&sample(), &[5, 6, 7]);
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let (mut ok, mut err) = (0u32, 0u32);
    let mut buf = blob.clone();
    for _ in 0..20_000 {
        buf.copy_from_slice(&blob);
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(buf.len());
            buf[at] ^= 1 + rng.below(255) as u8;
        }
        match decode_args(&buf) {
            Ok(dec) => {
                ok += 1;
                check_canonical(&buf, &dec);
            }
            Err(e) => {
                err += 1;
                assert_eq!(e.kind(), ErrorKind::Decode);
            }
        }
    }
    assert!(ok > 0 && err > 0, "ok {ok} err {err}");
}

/// A valid config with every field set to something non-default.
fn sample_config() -> CallConfig {
    use crate::data::call_config::{RingSizes, Swimlane};
    let rings = [(4, 1024, 4), (8, 0, 5), (0, 1 << 40, 0), (1 << 30, u64::from(u32::MAX), i32::MAX as u64)];
    let set = |v: u64| (v != 0).then_some(v);
    let mut cfg = CallConfig::new()
        .output_prefix("/tmp/simpler-diag")
        .aicpu_threads(4)
        .swimlane(Swimlane::Level2)
        .pmu_event(1)
        .scope_stats(true);
    for (d, (w, h, p)) in rings.into_iter().enumerate() {
        cfg = cfg.ring(d, RingSizes { task_window: set(w), heap_bytes: set(h), dep_pool: set(p) });
    }
    cfg.validate().unwrap();
    cfg
}

#[test]
fn config_round_trip() {
    let cfg = sample_config();
    for c in [CallConfig::default(), cfg.clone()] {
        let mut out = [0xeeu8; CALL_CONFIG_WIRE_SIZE];
        encode_config(&c, &mut out);
        assert_eq!(decode_config(&out).unwrap(), c);
        let mut longer = out.to_vec();
        longer.push(1);
        assert_eq!(decode_config(&longer).unwrap(), c);
    }
    let mut out = [0u8; CALL_CONFIG_WIRE_SIZE];
    encode_config(&cfg, &mut out);
    assert_eq!(out[0..4], 4i32.to_le_bytes());
    assert_eq!(out[4..8], 2i32.to_le_bytes());
    assert_eq!(out[8..12], 0i32.to_le_bytes());
    assert_eq!(out[12..16], 1i32.to_le_bytes());
    assert_eq!(out[20..24], 1i32.to_le_bytes());
    assert_eq!(out[24..32], 4u64.to_le_bytes());
    assert_eq!(out[56..64], 1024u64.to_le_bytes());
    assert_eq!(out[88..96], 4u64.to_le_bytes());
    assert_eq!(&out[120..137], b"/tmp/simpler-diag");
    assert!(out[137..].iter().all(|&b| b == 0));
    // Any non-zero flag on the wire is on.
    out[20..24].copy_from_slice(&3i32.to_le_bytes());
    assert!(decode_config(&out).unwrap().get_scope_stats());
}

#[test]
fn config_decode_validates() {
    let bad = sample_config().aicpu_threads(1);
    let mut out = [0u8; CALL_CONFIG_WIRE_SIZE];
    encode_config(&bad, &mut out);
    let err = decode_config(&out).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Decode);
    expect(err, "aicpu_threads");
    // A diagnostic flag without an output prefix.
    let mut out = [0u8; CALL_CONFIG_WIRE_SIZE];
    out[12] = 1;
    expect(decode_config(&out).unwrap_err(), "output_prefix");
    // A window that is not a power of two.
    let mut out = [0u8; CALL_CONFIG_WIRE_SIZE];
    out[24..32].copy_from_slice(&6u64.to_le_bytes());
    expect(decode_config(&out).unwrap_err(), "ring 0: task_window");
    let short = decode_config(&out[..CALL_CONFIG_WIRE_SIZE - 1]).unwrap_err();
    assert_eq!(short.kind(), ErrorKind::Decode);
}

#[test]
fn an_identity_argument_round_trips_and_refuses_other_bytes() {
    let id = Identity::new(0xfeed_f00d_dead_beef, 42, 7).unwrap();
    let arg = identity_arg(id);
    assert_eq!(identity_from_arg(&arg).unwrap(), id);
    let mut padded = arg;
    padded[31] = 1;
    expect(identity_from_arg(&padded).unwrap_err(), "padding");
    let zero = identity_from_arg(&[0; 32]).unwrap_err();
    assert_eq!(zero.kind(), ErrorKind::Decode, "buffer id 0 is reserved: {zero}");
}
