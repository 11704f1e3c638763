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
//! | 2 | u8 | address space (HOST = 0, DEVICE = 1; DEVICE goes with backend kind Device and no other) |
//! | 3 | u8 | access (Read = 0, Write = 1, ReadWrite = 2) |
//! | 4 | u8 | backend kind (HeapSlab = 0, Memfd = 2, Device = 4; 1, the named shm objects of earlier versions, is refused) |
//! | 5..8 | | zero |
//! | 8 | u64 | identity owner |
//! | 16 | u64 | identity buffer_id (non-zero) |
//! | 24 | u32 | identity generation (non-zero) |
//! | 28..40 | | zero |
//! | 40 | u64 | nbytes |
//! | 48 | u32 | owner_worker_path_id (written 0, ignored) |
//! | 52 | u16 | body_len (<= 32) |
//! | 54..56 | | zero |
//! | 56..88 | bytes | body: HeapSlab = u64 address + u64 ring inode (16 bytes), Memfd = u32 pid + u32 fd + u64 inode (16 bytes), Device = u64 pointer + u32 chip (12 bytes); zero past body_len |
//! | 88 | u64 | byte_offset |
//! | 96 | u32 | ndims (1..=5) |
//! | 100 | u32 × 5 | shape |
//! | 120 | u32 × 5 | strides (elements) |
//! | 140 | u8 | dtype |
//! | 141..144 | | zero |
//!
//! [`ErrorKind::Decode`]: crate::error::ErrorKind::Decode

use std::ops::Range;

use smallvec::SmallVec;

use crate::data::buffer::{Access, Backing, BufferDesc, Identity};
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
const BACKEND_MEMFD: u8 = 2;
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
    /// The tensors, in argument order (inline up to 4: a worker decodes one set per task, and
    /// most tasks have few).
    pub(crate) tensors: SmallVec<[WireTensor; 4]>,
    /// The scalars, in argument order (inline up to 16).
    pub(crate) scalars: SmallVec<[u64; 16]>,
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
// A buffer identity as a control frame's 32-byte argument.

/// `id` as a control frame's 32-byte argument (`CTRL_MALLOC`: the buffer the block is for):
/// owner, buffer id and generation, little-endian, then zeros.
pub(crate) fn identity_arg(id: Identity) -> [u8; 32] {
    let mut out = [0u8; 32];
    out[..8].copy_from_slice(&id.owner().to_le_bytes());
    out[8..16].copy_from_slice(&id.buffer_id().to_le_bytes());
    out[16..20].copy_from_slice(&id.generation().to_le_bytes());
    out
}

/// The identity [`identity_arg`] wrote; a `Decode` error for any other bytes.
pub(crate) fn identity_from_arg(b: &[u8; 32]) -> Result<Identity> {
    if b[20..].iter().any(|&x| x != 0) {
        return Err(Error::decode("a buffer identity argument has non-zero padding"));
    }
    let word = |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().expect("8 bytes"));
    let generation = u32::from_le_bytes(b[16..20].try_into().expect("4 bytes"));
    Identity::new(word(0..8), word(8..16), generation).map_err(to_decode)
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
        Backing::HeapSlab { addr, ino } => {
            put(out, D_BODY, &addr.to_le_bytes());
            put(out, D_BODY + 8, &ino.to_le_bytes());
            16
        }
        Backing::Memfd { pid, fd, ino } => {
            put(out, D_BODY, &pid.to_le_bytes());
            put(out, D_BODY + 4, &fd.to_le_bytes());
            put(out, D_BODY + 8, &ino.to_le_bytes());
            16
        }
        Backing::Device { ptr, chip } => {
            put(out, D_BODY, &ptr.to_le_bytes());
            put(out, D_BODY + 8, &chip.to_le_bytes());
            12
        }
    };
    // A body is at most 16 bytes, so this never truncates.
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
    if backend != BACKEND_HEAP_SLAB && backend != BACKEND_MEMFD && backend != BACKEND_DEVICE {
        return Err(Error::decode(format!(
            "unknown backend kind {backend} (known: 0 = heap slab, 2 = memfd, 4 = device)"
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
        if body_len != 16 {
            return Err(Error::decode(format!(
                "heap slab body_len must be 16 (u64 address, u64 ring inode), got {body_len}"
            )));
        }
        // Non-zero values are checked by `BufferDesc::new` below.
        Backing::HeapSlab { addr: get_u64(body, 0), ino: get_u64(body, 8) }
    } else if backend == BACKEND_DEVICE {
        if body_len != 12 {
            return Err(Error::decode(format!(
                "device body_len must be 12 (u64 offset, u32 chip), got {body_len}"
            )));
        }
        Backing::Device { ptr: get_u64(body, 0), chip: get_u32(body, 8) }
    } else {
        if body_len != 16 {
            return Err(Error::decode(format!(
                "memfd body_len must be 16 (u32 pid, u32 fd, u64 inode), got {body_len}"
            )));
        }
        // Ranges are checked by `BufferDesc::new` below.
        Backing::Memfd { pid: get_u32(body, 0), fd: get_u32(body, 4), ino: get_u64(body, 8) }
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
    Tensor::from_desc(desc, view).map_err(to_decode)?;
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
    let mut tensors = SmallVec::with_capacity(t);
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
mod tests;
