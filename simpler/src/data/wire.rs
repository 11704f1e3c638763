//! The wire codec: the args blob that crosses process boundaries through shared-memory mailboxes,
//! buffer descriptors for control frames, and [`CallConfig`] by value.
//!
//! Every field is written explicitly, little-endian, at a fixed offset (never a memcpy of a
//! struct). The decoder trusts nothing: lengths are checked before anything is allocated, every
//! padding byte must be zero, and every value is re-validated through the same constructors the
//! public API uses. Malformed bytes are an [`ErrorKind::Decode`] error, never a panic.
//!
//! Args blob: `[u32 tensor_count T][u32 scalar_count S][T records of 144 bytes][S u64 scalars]`.
//!
//! Tensor record (144 bytes) = buffer descriptor (88 bytes) + view (56 bytes):
//!
//! | offset | type | field |
//! | --- | --- | --- |
//! | 0 | u16 | magic `0x5342` |
//! | 2 | u8 | address space (HOST = 0; DEVICE = 1 is reserved and refused) |
//! | 3 | u8 | access (Read = 0, Write = 1, ReadWrite = 2) |
//! | 4 | u8 | backend kind (HeapSlab = 0, PosixShm = 1) |
//! | 5..8 | | zero |
//! | 8 | u64 | identity owner |
//! | 16 | u64 | identity buffer_id (non-zero) |
//! | 24 | u32 | identity generation (non-zero) |
//! | 28..40 | | zero |
//! | 40 | u64 | nbytes |
//! | 48 | u32 | owner_worker_path_id (written 0, ignored) |
//! | 52 | u16 | body_len (<= 32) |
//! | 54..56 | | zero |
//! | 56..88 | bytes | body: HeapSlab = u64 address (8 bytes), PosixShm = name; zero past body_len |
//! | 88 | u64 | byte_offset |
//! | 96 | u32 | ndims (1..=5) |
//! | 100 | u32 × 5 | shape |
//! | 120 | u32 × 5 | strides (elements) |
//! | 140 | u8 | dtype |
//! | 141..144 | | zero |
//!
//! [`ErrorKind::Decode`]: crate::error::ErrorKind::Decode

use std::ops::Range;

use crate::data::buffer::{Access, Backing, BufferDesc, Identity, ShmName};
use crate::data::call_config::{CallConfig, OUTPUT_PREFIX_LEN, RING_DEPTH};
use crate::data::dtype::DataType;
use crate::data::tensor::{MAX_TENSOR_DIMS, Tensor, TensorView};
use crate::error::{Error, Result};

/// Size of one tensor record in an args blob: descriptor plus view.
pub(crate) const TENSOR_RECORD_SIZE: usize = 144;

/// Size of an encoded buffer descriptor (the first part of a tensor record).
pub(crate) const DESC_SIZE: usize = 88;

/// Size of the encoded [`CallConfig`]: 6 × i32, 12 × u64 of `runtime_env`, then the
/// 1024-byte output prefix.
pub(crate) const CALL_CONFIG_WIRE_SIZE: usize = 1144;

/// Size of the args blob header: tensor count and scalar count, both u32.
const HEADER_SIZE: usize = 8;
/// Size of one scalar.
const SCALAR_SIZE: usize = 8;

const MAGIC: u16 = 0x5342;
const ADDRESS_SPACE_HOST: u8 = 0;
const ADDRESS_SPACE_DEVICE: u8 = 1;
const BACKEND_HEAP_SLAB: u8 = 0;
const BACKEND_POSIX_SHM: u8 = 1;
const BACKEND_DEVICE: u8 = 4;
const BODY_MAX: usize = 32;

// Descriptor offsets.
const D_MAGIC: usize = 0;
const D_ADDRESS_SPACE: usize = 2;
const D_ACCESS: usize = 3;
const D_BACKEND: usize = 4;
const D_PAD0: Range<usize> = 5..8;
const D_OWNER: usize = 8;
const D_BUFFER_ID: usize = 16;
const D_GENERATION: usize = 24;
const D_PAD1: Range<usize> = 28..40;
const D_NBYTES: usize = 40;
const D_PATH_ID: usize = 48;
const D_BODY_LEN: usize = 52;
const D_PAD2: Range<usize> = 54..56;
const D_BODY: usize = 56;

// View offsets (within a tensor record).
const V_BYTE_OFFSET: usize = 88;
const V_NDIMS: usize = 96;
const V_SHAPE: usize = 100;
const V_STRIDES: usize = 120;
const V_DTYPE: usize = 140;
const V_PAD: Range<usize> = 141..144;

// CallConfig offsets.
const C_RUNTIME_ENV: usize = 24;
const C_OUTPUT_PREFIX: usize = C_RUNTIME_ENV + 3 * RING_DEPTH * 8;

const _: () = assert!(D_BODY + BODY_MAX == DESC_SIZE);
const _: () = assert!(V_SHAPE + 4 * MAX_TENSOR_DIMS == V_STRIDES);
const _: () = assert!(V_STRIDES + 4 * MAX_TENSOR_DIMS == V_DTYPE);
const _: () = assert!(V_PAD.end == TENSOR_RECORD_SIZE);
const _: () = assert!(C_OUTPUT_PREFIX + OUTPUT_PREFIX_LEN == CALL_CONFIG_WIRE_SIZE);

/// Bytes a blob with `tensors` tensors and `scalars` scalars takes (saturating at `usize::MAX`).
pub(crate) fn blob_size(tensors: usize, scalars: usize) -> usize {
    HEADER_SIZE
        .saturating_add(tensors.saturating_mul(TENSOR_RECORD_SIZE))
        .saturating_add(scalars.saturating_mul(SCALAR_SIZE))
}

/// `blob_size` without saturation: `None` when the size does not fit in `usize`.
fn blob_size_checked(tensors: usize, scalars: usize) -> Option<usize> {
    let t = tensors.checked_mul(TENSOR_RECORD_SIZE)?;
    let s = scalars.checked_mul(SCALAR_SIZE)?;
    HEADER_SIZE.checked_add(t)?.checked_add(s)
}

/// One decoded tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WireTensor {
    /// The buffer descriptor; its access is the access granted to the task.
    pub(crate) desc: BufferDesc,
    /// The validated view; it fits inside `desc.nbytes()`.
    pub(crate) view: TensorView,
}

/// Decoded args.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DecodedArgs {
    /// The tensors, in argument order.
    pub(crate) tensors: Vec<WireTensor>,
    /// The scalars, in argument order.
    pub(crate) scalars: Vec<u64>,
}

// ---------------------------------------------------------------------------------------------
// Little-endian field helpers. Offsets are constants inside buffers whose length was checked.

fn get<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(get(b, at))
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(get(b, at))
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(get(b, at))
}

fn get_i32(b: &[u8], at: usize) -> i32 {
    i32::from_le_bytes(get(b, at))
}

fn put(out: &mut [u8], at: usize, bytes: &[u8]) {
    out[at..at + bytes.len()].copy_from_slice(bytes);
}

/// Re-labels a validation error (from a constructor) as a decode error, keeping its message.
fn to_decode(e: Error) -> Error {
    Error::decode(e.message())
}

/// Errors when any byte of `b[range]` is non-zero.
fn check_zero(b: &[u8], range: Range<usize>) -> Result<()> {
    match b[range.clone()].iter().position(|&x| x != 0) {
        None => Ok(()),
        Some(k) => Err(Error::decode(format!(
            "non-zero padding byte {:#04x} at offset {} (bytes {}..{} must be zero)",
            b[range.start + k],
            range.start + k,
            range.start,
            range.end
        ))),
    }
}

// ---------------------------------------------------------------------------------------------
// Buffer descriptor.

/// Writes `desc` into `out[..DESC_SIZE]` (every byte of that range is written).
fn write_desc(desc: &BufferDesc, out: &mut [u8]) {
    let out = &mut out[..DESC_SIZE];
    out.fill(0);
    let id = desc.identity();
    put(out, D_MAGIC, &MAGIC.to_le_bytes());
    out[D_ADDRESS_SPACE] = match desc.backing() {
        Backing::Device { .. } => ADDRESS_SPACE_DEVICE,
        _ => ADDRESS_SPACE_HOST,
    };
    out[D_ACCESS] = desc.access() as u8;
    out[D_BACKEND] = desc.backing().kind_u8();
    put(out, D_OWNER, &id.owner().to_le_bytes());
    put(out, D_BUFFER_ID, &id.buffer_id().to_le_bytes());
    put(out, D_GENERATION, &id.generation().to_le_bytes());
    put(out, D_NBYTES, &desc.nbytes().to_le_bytes());
    put(out, D_PATH_ID, &0u32.to_le_bytes());
    let body_len = match desc.backing() {
        Backing::HeapSlab { addr } => {
            put(out, D_BODY, &addr.to_le_bytes());
            8
        }
        Backing::PosixShm { name } => {
            let name = name.as_bytes();
            put(out, D_BODY, name);
            name.len()
        }
        Backing::Device { ptr, chip } => {
            put(out, D_BODY, &ptr.to_le_bytes());
            put(out, D_BODY + 8, &chip.to_le_bytes());
            12
        }
    };
    // A body is at most 31 (shm name) or 8 (address) bytes, so this never truncates.
    put(out, D_BODY_LEN, &(body_len as u16).to_le_bytes());
}

/// Reads a descriptor from `b[..DESC_SIZE]`; the caller guarantees the length.
fn read_desc(b: &[u8]) -> Result<BufferDesc> {
    let magic = get_u16(b, D_MAGIC);
    if magic != MAGIC {
        let msg = format!("bad magic {magic:#06x} (expected {MAGIC:#06x})");
        return Err(Error::decode(msg));
    }
    let space = b[D_ADDRESS_SPACE];
    match space {
        ADDRESS_SPACE_HOST | ADDRESS_SPACE_DEVICE => {}
        v => {
            let msg = format!("unknown address_space {v} (known: 0 = HOST, 1 = DEVICE)");
            return Err(Error::decode(msg));
        }
    }
    let access = Access::from_u8(b[D_ACCESS])?;
    let backend = b[D_BACKEND];
    if backend != BACKEND_HEAP_SLAB && backend != BACKEND_POSIX_SHM && backend != BACKEND_DEVICE {
        return Err(Error::decode(format!(
            "unknown backend kind {backend} (known: 0 = heap slab, 1 = posix shm, 4 = device)"
        )));
    }
    if (backend == BACKEND_DEVICE) != (space == ADDRESS_SPACE_DEVICE) {
        return Err(Error::decode(format!(
            "backend kind {backend} does not match address_space {space} (device memory is address_space 1)"
        )));
    }
    check_zero(b, D_PAD0)?;
    check_zero(b, D_PAD1)?;
    check_zero(b, D_PAD2)?;
    let owner = get_u64(b, D_OWNER);
    let id = get_u64(b, D_BUFFER_ID);
    let generation = get_u32(b, D_GENERATION);
    let identity = Identity::new(owner, id, generation).map_err(to_decode)?;
    let nbytes = get_u64(b, D_NBYTES);
    // owner_worker_path_id (D_PATH_ID) is informational and ignored.
    let body_len = usize::from(get_u16(b, D_BODY_LEN));
    if body_len > BODY_MAX {
        return Err(Error::decode(format!(
            "body_len {body_len} exceeds the {BODY_MAX}-byte descriptor body"
        )));
    }
    let (body, rest) = b[D_BODY..DESC_SIZE].split_at(body_len);
    if let Some(k) = rest.iter().position(|&x| x != 0) {
        return Err(Error::decode(format!(
            "non-zero body byte at offset {} past body_len {body_len}",
            D_BODY + body_len + k
        )));
    }
    let backing = if backend == BACKEND_HEAP_SLAB {
        if body_len != 8 {
            return Err(Error::decode(format!(
                "heap slab body_len must be 8 (a u64 address), got {body_len}"
            )));
        }
        let addr = get_u64(body, 0);
        Backing::HeapSlab { addr }
    } else if backend == BACKEND_DEVICE {
        if body_len != 12 {
            return Err(Error::decode(format!(
                "device body_len must be 12 (u64 offset, u32 chip), got {body_len}"
            )));
        }
        Backing::Device { ptr: get_u64(body, 0), chip: get_u32(body, 8) }
    } else {
        let name = ShmName::from_bytes(body).map_err(to_decode)?;
        Backing::PosixShm { name }
    };
    BufferDesc::new(identity, backing, access, nbytes).map_err(to_decode)
}

/// Encodes one buffer descriptor (88 bytes), as used by control frames.
pub(crate) fn encode_desc(desc: &BufferDesc, out: &mut [u8; DESC_SIZE]) {
    write_desc(desc, out);
}

/// Decodes one buffer descriptor from the first [`DESC_SIZE`] bytes of `bytes` (trailing bytes
/// are ignored; fewer is an error).
pub(crate) fn decode_desc(bytes: &[u8]) -> Result<BufferDesc> {
    if bytes.len() < DESC_SIZE {
        return Err(Error::decode(format!(
            "buffer descriptor needs {DESC_SIZE} bytes but only {} are present",
            bytes.len()
        )));
    }
    read_desc(bytes).map_err(|e| e.context("buffer descriptor"))
}

// ---------------------------------------------------------------------------------------------
// Tensor records and the args blob.

/// Writes one tensor record (descriptor with `access`, then the view) into `rec`.
fn write_record(tensor: &Tensor, access: Access, rec: &mut [u8; TENSOR_RECORD_SIZE]) {
    write_desc(&tensor.desc().with_access(access), rec);
    let (byte_offset, ndims, shape, strides, dtype) = tensor.view().raw();
    put(rec, V_BYTE_OFFSET, &byte_offset.to_le_bytes());
    put(rec, V_NDIMS, &u32::from(ndims).to_le_bytes());
    for i in 0..MAX_TENSOR_DIMS {
        put(rec, V_SHAPE + 4 * i, &shape[i].to_le_bytes());
        put(rec, V_STRIDES + 4 * i, &strides[i].to_le_bytes());
    }
    rec[V_DTYPE] = dtype.as_u8();
    rec[V_PAD].fill(0);
}

/// Reads and validates one tensor record.
fn read_record(rec: &[u8; TENSOR_RECORD_SIZE]) -> Result<WireTensor> {
    let desc = read_desc(rec)?;
    let byte_offset = get_u64(rec, V_BYTE_OFFSET);
    let ndims = get_u32(rec, V_NDIMS);
    let ndims = match u8::try_from(ndims) {
        Ok(n) if (1..=MAX_TENSOR_DIMS).contains(&usize::from(n)) => n,
        _ => {
            let msg = format!("ndims {ndims} is not in 1..={MAX_TENSOR_DIMS}");
            return Err(Error::decode(msg));
        }
    };
    let mut shape = [0u32; MAX_TENSOR_DIMS];
    let mut strides = [0u32; MAX_TENSOR_DIMS];
    for i in 0..MAX_TENSOR_DIMS {
        shape[i] = get_u32(rec, V_SHAPE + 4 * i);
        strides[i] = get_u32(rec, V_STRIDES + 4 * i);
    }
    let dtype = DataType::from_u8(rec[V_DTYPE])?;
    check_zero(rec, V_PAD)?;
    let view = TensorView::from_raw(byte_offset, ndims, shape, strides, dtype);
    let view = view.map_err(to_decode)?;
    // Checks that the view lies inside the buffer.
    Tensor::new(desc, view).map_err(to_decode)?;
    Ok(WireTensor { desc, view })
}

/// Encodes an args blob into `out`.
///
/// The iterator yields each tensor and the access granted to the task for it; the encoded
/// descriptor's access byte is that access, not the buffer's. Errors
/// ([`ErrorKind::InvalidArgument`]) when the blob does not fit in `out`. Returns the number of
/// bytes written (`blob_size(tensors.len(), scalars.len())`); bytes of `out` past it are left
/// untouched. An iterator whose `len()` lies is an error too (then `out` may be partly written).
///
/// [`ErrorKind::InvalidArgument`]: crate::error::ErrorKind::InvalidArgument
pub(crate) fn encode_args<'a>(
    mut tensors: impl ExactSizeIterator<Item = (&'a Tensor, Access)>,
    scalars: &[u64],
    out: &mut [u8],
) -> Result<usize> {
    let t = tensors.len();
    let n = blob_size(t, scalars.len());
    if n > out.len() {
        return Err(Error::invalid(format!(
            "args blob of {n} bytes exceeds the mailbox capacity of {} bytes",
            out.len()
        )));
    }
    let (Ok(tc), Ok(sc)) = (u32::try_from(t), u32::try_from(scalars.len())) else {
        let msg = "args blob: a tensor or scalar count does not fit in u32";
        return Err(Error::invalid(msg));
    };
    let out = &mut out[..n];
    put(out, 0, &tc.to_le_bytes());
    put(out, 4, &sc.to_le_bytes());
    let records_end = HEADER_SIZE + t * TENSOR_RECORD_SIZE;
    let (records, _) = out[HEADER_SIZE..records_end].as_chunks_mut::<TENSOR_RECORD_SIZE>();
    let mut written = 0usize;
    for (rec, (tensor, access)) in records.iter_mut().zip(&mut tensors) {
        write_record(tensor, access, rec);
        written += 1;
    }
    if written != t || tensors.next().is_some() {
        return Err(Error::invalid(format!(
            "args blob: the tensor iterator reported {t} tensors but yielded a different number"
        )));
    }
    let (slots, _) = out[records_end..].as_chunks_mut::<SCALAR_SIZE>();
    for (slot, v) in slots.iter_mut().zip(scalars) {
        *slot = v.to_le_bytes();
    }
    Ok(n)
}

/// Decodes an args blob; `bytes` may be longer than the blob (trailing bytes are ignored) but
/// never shorter. Every error is [`ErrorKind::Decode`] and names the tensor record at fault.
///
/// [`ErrorKind::Decode`]: crate::error::ErrorKind::Decode
pub(crate) fn decode_args(bytes: &[u8]) -> Result<DecodedArgs> {
    if bytes.len() < HEADER_SIZE {
        return Err(Error::decode(format!(
            "args blob needs an {HEADER_SIZE}-byte header but only {} bytes are present",
            bytes.len()
        )));
    }
    let tc = get_u32(bytes, 0);
    let sc = get_u32(bytes, 4);
    // Check the declared size against what is present before allocating anything.
    let (Ok(t), Ok(s)) = (usize::try_from(tc), usize::try_from(sc)) else {
        return Err(Error::decode("args blob counts do not fit in usize"));
    };
    let need = blob_size_checked(t, s);
    match need {
        Some(need) if need <= bytes.len() => {}
        _ => {
            let need = match need {
                Some(n) => format!("{n} bytes"),
                None => "more bytes than fit in usize".to_owned(),
            };
            return Err(Error::decode(format!(
                "args blob declares {t} tensors and {s} scalars ({need}) but only {} bytes are \
                 present",
                bytes.len()
            )));
        }
    }
    let records_end = HEADER_SIZE + t * TENSOR_RECORD_SIZE;
    let scalars_end = records_end + s * SCALAR_SIZE;
    let (records, _) = bytes[HEADER_SIZE..records_end].as_chunks::<TENSOR_RECORD_SIZE>();
    let mut tensors = Vec::with_capacity(t);
    for (i, rec) in records.iter().enumerate() {
        tensors.push(read_record(rec).map_err(|e| e.context(format!("tensor record {i}")))?);
    }
    let (slots, _) = bytes[records_end..scalars_end].as_chunks::<SCALAR_SIZE>();
    let scalars = slots.iter().map(|b| u64::from_le_bytes(*b)).collect();
    Ok(DecodedArgs { tensors, scalars })
}

// ---------------------------------------------------------------------------------------------
// CallConfig.

/// Encodes a [`CallConfig`] field by field into the packed upstream layout, little-endian
/// (does not validate it): six `i32` knobs (0 = unset / off, 1 = a flag on), three `u64[4]`
/// ring arrays (0 = unset), the NUL-padded output prefix.
pub(crate) fn encode_config(cfg: &CallConfig, out: &mut [u8; CALL_CONFIG_WIRE_SIZE]) {
    for (i, v) in cfg.wire_ints().iter().enumerate() {
        put(out, 4 * i, &v.to_le_bytes());
    }
    for (i, v) in cfg.wire_rings().iter().flatten().enumerate() {
        put(out, C_RUNTIME_ENV + 8 * i, &v.to_le_bytes());
    }
    let mut prefix = [0u8; OUTPUT_PREFIX_LEN];
    let p = cfg.get_output_prefix().unwrap_or("").as_bytes();
    let n = p.len().min(OUTPUT_PREFIX_LEN - 1);
    prefix[..n].copy_from_slice(&p[..n]);
    put(out, C_OUTPUT_PREFIX, &prefix);
}

/// Decodes a [`CallConfig`] from the first [`CALL_CONFIG_WIRE_SIZE`] bytes of `bytes` (trailing
/// bytes are ignored; fewer is an error) and runs [`CallConfig::validate`]; a config that fails
/// validation is an [`ErrorKind::Decode`] error with the validation message.
///
/// [`ErrorKind::Decode`]: crate::error::ErrorKind::Decode
pub(crate) fn decode_config(bytes: &[u8]) -> Result<CallConfig> {
    if bytes.len() < CALL_CONFIG_WIRE_SIZE {
        return Err(Error::decode(format!(
            "call config needs {CALL_CONFIG_WIRE_SIZE} bytes but only {} are present",
            bytes.len()
        )));
    }
    let ints = std::array::from_fn(|i| get_i32(bytes, 4 * i));
    let rings = std::array::from_fn(|a| {
        std::array::from_fn(|i| get_u64(bytes, C_RUNTIME_ENV + 8 * (a * RING_DEPTH + i)))
    });
    let cfg = CallConfig::from_wire(ints, rings, &get(bytes, C_OUTPUT_PREFIX));
    cfg.and_then(|c| c.validate().map(|()| c))
        .map_err(|e| Error::decode(format!("decoded call config: {}", e.message())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn shm_desc(buffer_id: u64, name: &str, access: Access, nbytes: u64) -> BufferDesc {
        let identity = Identity::new(0xfeed_beef_0123_4567, buffer_id, 3).unwrap();
        let name = ShmName::new(name).unwrap();
        BufferDesc::new(identity, Backing::PosixShm { name }, access, nbytes).unwrap()
    }

    fn slab_desc(buffer_id: u64, addr: u64, access: Access, nbytes: u64) -> BufferDesc {
        let identity = Identity::new(0x0bad_cafe, buffer_id, 1).unwrap();
        BufferDesc::new(identity, Backing::HeapSlab { addr }, access, nbytes).unwrap()
    }

    /// A tensor; empty `st` means contiguous.
    fn tensor(d: BufferDesc, dt: DataType, off: u64, shape: &[u32], st: &[u32]) -> Tensor {
        let st = (!st.is_empty()).then_some(st);
        Tensor::new(d, TensorView::new(off, shape, st, dt).unwrap()).unwrap()
    }

    /// A varied set of tensors with their granted access.
    fn sample() -> Vec<(Tensor, Access)> {
        use Access::{Read, ReadWrite, Write};
        let shm = shm_desc(1, "sp-test-b1", ReadWrite, 4096);
        let slab = slab_desc(2, 0x7f00_0000_1000, ReadWrite, 1 << 20);
        let long = shm_desc(9, "abcdefghijklmnopqrstuvwxyz01234", Read, 64);
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
        assert_eq!(dec.scalars, scalars);
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
        assert_eq!(r[52..54], 8u16.to_le_bytes());
        assert_eq!(r[56..64], 0x1122_3344_5566_7788_u64.to_le_bytes());
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
        for range in [5..8, 28..40, 54..56, 64..88, 128..140, 141..144] {
            assert!(r[range].iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn access_byte_is_the_granted_access() {
        let read_only = shm_desc(4, "ro", Access::Read, 64);
        let t = tensor(read_only, DataType::Float32, 0, &[16], &[]);
        for granted in [Access::Read, Access::Write, Access::ReadWrite] {
            let blob = encode(&[(t.clone(), granted)], &[]);
            assert_eq!(blob[8 + 3], granted as u8);
            let dec = decode_args(&blob).unwrap();
            assert_eq!(dec.tensors[0].desc.access(), granted);
        }
        let rw = shm_desc(5, "rw", Access::ReadWrite, 64);
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
        let d = shm_desc(1, "abc", Access::ReadWrite, 256);
        let a = tensor(d, DataType::Float32, 0, &[4], &[]);
        let b = tensor(d, DataType::Float32, 16, &[2, 4], &[8, 1]);
        vec![(a, Access::Read), (b, Access::ReadWrite)]
    }

    #[test]
    fn device_descriptors_round_trip() {
        let identity = Identity::new(9, 3, 1).unwrap();
        let d = BufferDesc::new(identity, Backing::Device { ptr: 4096, chip: 2 }, Access::ReadWrite, 1024)
            .unwrap();
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
        expect(corrupt(&shm, 0, |r| r[4] = 2), "backend");
        expect(corrupt(&shm, 0, |r| r[140] = 15), "data type");
        expect(corrupt(&shm, 1, |r| put64(r, 16, 0)), "buffer_id");
        expect(corrupt(&shm, 0, |r| put32(r, 24, 0)), "generation");
        expect(corrupt(&shm, 0, |r| r[52] = 33), "body_len");
        expect(corrupt(&shm, 0, |r| r[53] = 1), "body_len");
        expect(corrupt(&shm, 0, |r| r[56 + 5] = b'x'), "past body_len");
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
        expect(corrupt(&shm, 0, |r| r[56] = b'/'), "shm name");
        expect(corrupt(&shm, 0, |r| r[56] = b' '), "shm name");
        let empty_name = |r: &mut [u8]| {
            r[52] = 0;
            r[56..59].fill(0);
        };
        expect(corrupt(&shm, 0, empty_name), "shm name");
        expect(corrupt(&shm, 0, |r| r[52] = 32), "shm name");
        expect(corrupt(&slab, 0, |r| put64(r, 56, 0)), "address");
        expect(corrupt(&slab, 0, |r| r[52] = 4), "body_len");
        expect(corrupt(&slab, 0, |r| r[52] = 9), "body_len");
        expect(corrupt(&slab, 0, |r| r[64] = 1), "past body_len");
        // The address bytes are not a valid name.
        expect(corrupt(&slab, 0, |r| r[4] = 1), "shm name");
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
        let shm = shm_desc(3, "sp-123-b3", Access::Write, 1 << 40);
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
            ts.push((Tensor::new(w.desc, w.view).unwrap(), w.desc.access()));
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
        let rings =
            [(4, 1024, 4), (8, 0, 5), (0, 1 << 40, 0), (1 << 30, u64::from(u32::MAX), i32::MAX as u64)];
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
}
