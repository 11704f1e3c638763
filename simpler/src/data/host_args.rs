//! `HostArgs`: what a host function sees of its task — typed slices over mapped tensors.
//!
//! Rules (cited by the `SAFETY` comments below):
//!
//! H1. Every [`MappedTensor<'a>`](MappedTensor) points at a buffer whose view's bytes lie wholly
//!     inside memory mapped in this process for `'a` (writable when its access writes), and
//!     nobody else accesses the bytes a writable view covers while it lives. A `MappedTensor`
//!     is made only by the `unsafe` [`MappedTensor::new`], whose callers are the owners of the
//!     mappings and cite their rules (`ipc::child`'s resolver, which cannot unmap while a
//!     tensor borrows it; `chip::arena`), or, in tests, from a `&'a mut [u8]` it borrows
//!     (`MappedTensor::from_slice`, bounds checked).
//! H2. Within one task no two tensors overlap unless both are read-only: the child checks
//!     this when it builds the arguments (the parent's submit check is not trusted).
//! H3. A tensor index is handed out either any number of times shared (read-only slice) or once
//!     exclusively (mutable slice), tracked by a per-index borrow flag that never resets during
//!     the call; so no `&mut [T]` ever aliases another live reference.
//! H4. Slices are made only over contiguous bytes whose data type matches `T` and whose first
//!     element is aligned for `T` (checked at run time): a contiguous view in place, or the
//!     packed copy of a strided view (H6).
//! H5. A [`KeptTensor`] holds, beside its tensor, what keeps the tensor's bytes mapped (an
//!     `Arc` of the mapping), so its tensor's `'a` is the kept tensor's own life, in whichever
//!     thread holds it; it is made only by the `unsafe` [`KeptTensor::new`], whose caller owns
//!     the mapping and vouches for H1's exclusive use for as long as the kept tensor lives.
//! H6. A strided view is lent as a packed copy: [`HostArgs::new`] gathers its elements, in
//!     row-major order, into a heap block of its own (`u64`-aligned, so aligned for every
//!     element type) that only the [`HostArgs`] owns and frees, and slices of it follow H3
//!     like any tensor's. When the `HostArgs` drops (every slice it lent has ended, as they
//!     borrow it) the copy of a tensor lent mutably is scattered back into the view's
//!     elements, which H1 keeps mapped and exclusive until then; its callers drop it before
//!     they report the task's end.

#![expect(unsafe_code, reason = "typed slices over shared mappings; rules H1-H6")]

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::data::buffer::Access;
use crate::data::dtype::{DataType, Element};
use crate::data::tensor::{Overlap, TensorView, overlap};
use crate::error::{Error, Result};

/// One tensor of a task, resolved to an address in this process and valid for `'a` (rule H1).
#[derive(Debug)]
pub(crate) struct MappedTensor<'a> {
    /// Start of the buffer's mapping; the view's byte offset is relative to it.
    base: *mut u8,
    view: TensorView,
    access: Access,
    /// The mapped bytes, borrowed for `'a`.
    _mem: PhantomData<&'a mut [u8]>,
}

impl<'a> MappedTensor<'a> {
    /// A tensor over a buffer starting at `base`.
    ///
    /// # Safety
    ///
    /// Rule H1: for all of `'a`, the bytes `base + view.byte_range()` lie inside memory mapped
    /// in this process, writable if `access` writes; and while the tensor (or a [`HostArgs`]
    /// built from it) lives, nobody else writes those bytes, nor reads them if `access` writes.
    pub(crate) unsafe fn new(base: *mut u8, view: TensorView, access: Access) -> MappedTensor<'a> {
        MappedTensor { base, view, access, _mem: PhantomData }
    }

    /// A tensor over `bytes`, the whole buffer; an error if the view does not fit in it.
    #[cfg(any(test, feature = "bench-support"))]
    pub(crate) fn from_slice(
        bytes: &'a mut [u8],
        view: TensorView,
        access: Access,
    ) -> Result<MappedTensor<'a>> {
        let (_, end) = view.byte_range();
        if end > bytes.len() as u64 {
            return Err(Error::invalid(format!(
                "the view ends at byte {end}, past the {}-byte buffer",
                bytes.len()
            )));
        }
        // SAFETY: rule H1 — the view lies inside `bytes` (checked above), which this tensor
        // borrows exclusively for `'a`.
        Ok(unsafe { MappedTensor::new(bytes.as_mut_ptr(), view, access) })
    }

    /// The view, relative to the buffer's first byte.
    pub(crate) fn view(&self) -> &TensorView {
        &self.view
    }

    /// The access the task holds.
    pub(crate) fn access(&self) -> Access {
        self.access
    }

    /// The address of the view's first byte.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.base.wrapping_add(self.view.byte_offset() as usize)
    }

    fn byte_range(&self) -> (u64, u64) {
        let start = self.ptr() as u64;
        (start, start.saturating_add(self.view.extent_bytes()))
    }

    /// A packed copy of a strided view's elements (rule H6): a heap block of `u64`s holding
    /// them in row-major order; `None` for a contiguous view, which is lent in place.
    fn pack(&self) -> Option<Box<[u64]>> {
        if self.view.is_contiguous() {
            return None;
        }
        let len = (self.view.num_elements() as usize) * self.view.dtype().size();
        let mut block = vec![0u64; len.div_ceil(8)].into_boxed_slice();
        let dst = block.as_mut_ptr().cast::<u8>();
        let src = self.ptr();
        let mut pos = 0usize;
        self.view.for_each_run(|offset, n| {
            // SAFETY: rule H1 — `src + offset..+n` is a run of the view's elements, mapped for
            // `'a` and written by nobody else meanwhile; rule H6 — `dst + pos..+n` lies inside
            // the block (the runs' lengths add up to `len`), which nothing else references.
            unsafe { std::ptr::copy_nonoverlapping(src.add(offset), dst.add(pos), n) };
            pos += n;
        });
        Some(block)
    }

    /// Scatters a packed copy back into the view's elements (rule H6).
    fn unpack(&self, block: &[u64]) {
        let src = block.as_ptr().cast::<u8>();
        let dst = self.ptr();
        let mut pos = 0usize;
        self.view.for_each_run(|offset, n| {
            // SAFETY: rule H1 — `dst + offset..+n` is a run of the view's elements, mapped
            // writable for `'a` and accessed by nobody else while the task runs; rule H6 —
            // `src + pos..+n` lies inside the block, which no slice borrows any more.
            unsafe { std::ptr::copy_nonoverlapping(src.add(pos), dst.add(offset), n) };
            pos += n;
        });
    }
}

/// A host tensor that keeps the memory it points into mapped (rule H5): a [`MappedTensor`] a
/// thread other than the mapping's owner may hold across requests (a chip's executor thread,
/// copying a run's outputs back as soon as its kernel ends).
pub(crate) struct KeptTensor {
    tensor: MappedTensor<'static>,
    /// Keeps the tensor's bytes mapped; declared after `tensor`, so it drops after it.
    _mapping: Arc<dyn Send + Sync>,
}

impl KeptTensor {
    /// A tensor over a buffer starting at `base`, mapped for as long as `mapping` lives.
    ///
    /// # Safety
    ///
    /// Rule H5: the bytes `base + view.byte_range()` lie inside memory mapped in this process
    /// (writable if `access` writes) for as long as `mapping` lives; and while the kept tensor
    /// lives, nobody else writes those bytes, nor reads them if `access` writes (rule H1).
    pub(crate) unsafe fn new(
        base: *mut u8,
        view: TensorView,
        access: Access,
        mapping: Arc<dyn Send + Sync>,
    ) -> KeptTensor {
        // SAFETY: rule H5 — the bytes stay mapped while `mapping`, held beside the tensor and
        // dropped after it, lives; the caller vouches for the exclusive use (H1).
        let tensor = unsafe { MappedTensor::new(base, view, access) };
        KeptTensor { tensor, _mapping: mapping }
    }

    /// The tensor, for as long as this borrow.
    pub(crate) fn tensor(&self) -> &MappedTensor<'_> {
        &self.tensor
    }

    /// A kept tensor over `region`, the whole of it its buffer; an error if the view does not
    /// fit in it (tests, which read the region back through its descriptor, not a reference).
    #[cfg(test)]
    pub(crate) fn of_region(
        region: Arc<crate::sys::mem::SharedRegion>,
        view: TensorView,
        access: Access,
    ) -> Result<KeptTensor> {
        let (_, end) = view.byte_range();
        if end > region.len() as u64 {
            return Err(Error::invalid(format!(
                "the view ends at byte {end}, past the {}-byte region",
                region.len()
            )));
        }
        // SAFETY: rule H5 — the view lies inside the region (checked above), which stays mapped
        // while the kept tensor holds its `Arc`; the test that makes it touches the region only
        // through it, or through the region's descriptor once the tensor's task has ended.
        Ok(unsafe { KeptTensor::new(region.as_ptr(), view, access, region.clone()) })
    }
}

impl std::fmt::Debug for KeptTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptTensor").field("tensor", &self.tensor).finish_non_exhaustive()
    }
}

// SAFETY: rule H5 — the tensor's bytes stay mapped while the kept tensor lives, whichever thread
// holds it (the mapping's `Arc` is `Send + Sync` and moves with it); the exclusive use of rule
// H1 belongs to the task, not to a thread.
unsafe impl Send for KeptTensor {}

const FREE: u8 = 0;
const SHARED: u8 = 1;
const EXCLUSIVE: u8 = 2;

/// The arguments of one host-function call: tensors (typed slices) and scalars.
///
/// `input` gives `&[T]`, `output` gives `&mut [T]`; the element type must match the tensor's
/// data type. A tensor can be borrowed mutably once per call; an input (read-only) tensor
/// cannot be borrowed mutably at all.
///
/// A strided view (an inner-axis `slice`, a piece of `tiles` or `grid` of a matrix) is lent
/// packed: its elements in row-major order of its shape, copied out of the buffer before the
/// call, and, when it was borrowed by `output`, copied back into the view's elements after the
/// call. Contiguous views are lent in place, with no copy.
///
/// ```no_run
/// use simpler::{HostArgs, HostResult};
///
/// fn add(args: &HostArgs<'_>) -> HostResult {
///     let a = args.input::<f32>(0)?;
///     let b = args.input::<f32>(1)?;
///     let out = args.output::<f32>(2)?;
///     for i in 0..out.len() {
///         out[i] = a[i] + b[i];
///     }
///     Ok(())
/// }
/// ```
pub struct HostArgs<'a> {
    // A `Vec`, not a `SmallVec`: a `SmallVec` of a type with a lifetime is invariant in it,
    // and `HostArgs<'a>` must stay covariant (users pass `&'a HostArgs<'a>` to helpers).
    tensors: Vec<MappedTensor<'a>>,
    borrows: SmallVec<[Cell<u8>; 8]>,
    /// The packed copy of each strided tensor (rule H6), as a raw block this value owns (made
    /// by `Box::into_raw`, freed in `Drop`), so that the slices lent from it may be mutable.
    packed: SmallVec<[Option<*mut [u64]>; 8]>,
    scalars: &'a [u64],
    worker: u32,
}

impl std::fmt::Debug for HostArgs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostArgs")
            .field("tensors", &self.tensors.iter().map(|t| (t.view, t.access)).collect::<Vec<_>>())
            .field("scalars", &self.scalars)
            .field("worker", &self.worker)
            .finish()
    }
}

impl<'a> HostArgs<'a> {
    /// Builds the arguments; checks rule H2 (rule H1 holds for every tensor by construction).
    pub(crate) fn new(
        tensors: Vec<MappedTensor<'a>>,
        scalars: &'a [u64],
        worker: u32,
    ) -> Result<HostArgs<'a>> {
        for i in 0..tensors.len() {
            for j in i + 1..tensors.len() {
                let (a, b) = (&tensors[i], &tensors[j]);
                if !(a.access.can_write() || b.access.can_write()) {
                    continue;
                }
                let clash = if a.base == b.base {
                    // Views of one buffer: compare them in buffer coordinates.
                    overlap(&a.view, &b.view) != Overlap::None
                } else {
                    let (a0, a1) = a.byte_range();
                    let (b0, b1) = b.byte_range();
                    a0 < b1 && b0 < a1
                };
                if clash {
                    return Err(Error::invalid(format!(
                        "tensors {i} and {j} overlap and at least one is writable"
                    )));
                }
            }
        }
        let borrows = (0..tensors.len()).map(|_| Cell::new(FREE)).collect();
        let packed = tensors.iter().map(|t| t.pack().map(Box::into_raw)).collect();
        Ok(HostArgs { tensors, borrows, packed, scalars, worker })
    }

    /// Number of tensors (as added to the task's `TaskArgs`).
    ///
    /// ```no_run
    /// use simpler::{HostArgs, HostResult};
    ///
    /// fn f(args: &HostArgs<'_>) -> HostResult {
    ///     // Sum every i32 input tensor into the last one.
    ///     let last = args.tensor_count() - 1;
    ///     let mut acc = vec![0i32; args.view(last)?.num_elements() as usize];
    ///     for i in 0..last {
    ///         for (a, v) in acc.iter_mut().zip(args.input::<i32>(i)?) {
    ///             *a += v;
    ///         }
    ///     }
    ///     args.output::<i32>(last)?.copy_from_slice(&acc);
    ///     Ok(())
    /// }
    /// ```
    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    /// Number of scalars.
    ///
    /// ```no_run
    /// use simpler::{HostArgs, HostResult};
    ///
    /// fn f(args: &HostArgs<'_>) -> HostResult {
    ///     // An optional scale factor, 1.0 when the task passed none.
    ///     let k = if args.scalar_count() > 0 { args.scalar_f32(0)? } else { 1.0 };
    ///     for v in args.output::<f32>(0)? {
    ///         *v *= k;
    ///     }
    ///     Ok(())
    /// }
    /// ```
    pub fn scalar_count(&self) -> usize {
        self.scalars.len()
    }

    /// The index of the SUB worker running this call (`0..sub_workers`).
    ///
    /// ```no_run
    /// use simpler::{HostArgs, HostResult};
    ///
    /// fn f(args: &HostArgs<'_>) -> HostResult {
    ///     // Record which worker ran the task.
    ///     args.output::<u32>(0)?[0] = args.worker_index();
    ///     Ok(())
    /// }
    /// ```
    pub fn worker_index(&self) -> u32 {
        self.worker
    }

    /// Scalar `i` as raw `u64`.
    ///
    /// # Errors
    ///
    /// An index past the end is an [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)
    /// error.
    ///
    /// ```no_run
    /// use simpler::{HostArgs, HostResult};
    ///
    /// fn f(args: &HostArgs<'_>) -> HostResult {
    ///     let seed = args.scalar(0)?;
    ///     args.output::<u64>(0)?.iter_mut().enumerate().for_each(|(i, v)| *v = seed + i as u64);
    ///     Ok(())
    /// }
    /// ```
    pub fn scalar(&self, i: usize) -> Result<u64> {
        self.scalars.get(i).copied().ok_or_else(|| {
            Error::invalid(format!("scalar index {i} out of range ({} scalars)", self.scalars.len()))
        })
    }

    /// Scalar `i` read as the IEEE bits of an `f32` (the low 32 bits; see
    /// [`TaskArgs::scalar_f32`](crate::TaskArgs::scalar_f32)).
    ///
    /// # Errors
    ///
    /// As [`scalar`](Self::scalar): an index past the end.
    ///
    /// ```no_run
    /// use simpler::{HostArgs, HostResult};
    ///
    /// fn f(args: &HostArgs<'_>) -> HostResult {
    ///     let alpha = args.scalar_f32(0)?;
    ///     let x = args.input::<f32>(0)?;
    ///     for (y, x) in args.output::<f32>(1)?.iter_mut().zip(x) {
    ///         *y += alpha * x;
    ///     }
    ///     Ok(())
    /// }
    /// ```
    pub fn scalar_f32(&self, i: usize) -> Result<f32> {
        Ok(f32::from_bits(self.scalar(i)? as u32))
    }

    /// All scalars, in the order they were added.
    ///
    /// ```no_run
    /// use simpler::{HostArgs, HostResult};
    ///
    /// fn f(args: &HostArgs<'_>) -> HostResult {
    ///     let total: u64 = args.scalars().iter().sum();
    ///     args.output::<u64>(0)?[0] = total;
    ///     Ok(())
    /// }
    /// ```
    pub fn scalars(&self) -> &[u64] {
        self.scalars
    }

    /// The view of tensor `i` (shape, strides, dtype); available for strided views too.
    ///
    /// # Errors
    ///
    /// An index past the end is an [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)
    /// error.
    ///
    /// ```no_run
    /// use simpler::{HostArgs, HostResult};
    ///
    /// fn f(args: &HostArgs<'_>) -> HostResult {
    ///     // Transpose a rows x cols f32 matrix into tensor 1.
    ///     let shape = args.view(0)?.shape().to_vec();
    ///     let (rows, cols) = (shape[0] as usize, shape[1] as usize);
    ///     if args.view(1)?.shape() != [shape[1], shape[0]] {
    ///         return Err(format!("transpose: output shape must be [{cols}, {rows}]").into());
    ///     }
    ///     let a = args.input::<f32>(0)?;
    ///     let t = args.output::<f32>(1)?;
    ///     for r in 0..rows {
    ///         for c in 0..cols {
    ///             t[c * rows + r] = a[r * cols + c];
    ///         }
    ///     }
    ///     Ok(())
    /// }
    /// ```
    pub fn view(&self, i: usize) -> Result<&TensorView> {
        Ok(&self.tensor(i)?.view)
    }

    /// The access the task holds on tensor `i` (from its [`Tag`](crate::Tag)).
    ///
    /// # Errors
    ///
    /// An index past the end is an [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)
    /// error.
    ///
    /// ```no_run
    /// use simpler::{HostArgs, HostResult};
    ///
    /// fn f(args: &HostArgs<'_>) -> HostResult {
    ///     // Tensor 0 may be tagged Input or InOut (read it) or Output (nothing to read).
    ///     let prior: f32 = if args.access(0)?.can_read() { args.input::<f32>(0)?.iter().sum() } else { 0.0 };
    ///     if args.access(1)?.can_write() {
    ///         args.output::<f32>(1)?[0] = prior;
    ///     }
    ///     Ok(())
    /// }
    /// ```
    pub fn access(&self, i: usize) -> Result<Access> {
        Ok(self.tensor(i)?.access)
    }

    fn tensor(&self, i: usize) -> Result<&MappedTensor<'a>> {
        self.tensors.get(i).ok_or_else(|| {
            Error::invalid(format!("tensor index {i} out of range ({} tensors)", self.tensors.len()))
        })
    }

    /// Tensor `i` checked for `T`, and the address of its contiguous elements: the view's
    /// first byte, or the packed copy of a strided view (rule H6).
    fn check<T: Element>(&self, i: usize) -> Result<(&MappedTensor<'a>, *mut u8)> {
        let t = self.tensor(i)?;
        let dt = t.view.dtype();
        if T::DTYPE != dt && !(dt == DataType::Bool && T::DTYPE == DataType::Uint8) {
            return Err(Error::invalid(format!("tensor {i} holds {dt} elements, not {}", T::DTYPE)));
        }
        let ptr = match self.packed[i] {
            Some(block) => block.cast::<u8>(),
            None => t.ptr(),
        };
        if !(ptr as usize).is_multiple_of(align_of::<T>()) {
            return Err(Error::invalid(format!("tensor {i} is not aligned for {} elements", T::DTYPE)));
        }
        Ok((t, ptr))
    }

    /// Tensor `i` as a read-only slice; may be called any number of times for one tensor.
    ///
    /// # Errors
    ///
    /// An [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error when the index
    /// is out of range, `T` does not match the tensor's data type ([`DataType::Bool`] tensors
    /// read as `u8`), the tensor is write-only (tagged `Output`), or it is
    /// already borrowed by [`output`](Self::output) in this call.
    ///
    /// ```no_run
    /// use simpler::{HostArgs, HostResult};
    ///
    /// fn f(args: &HostArgs<'_>) -> HostResult {
    ///     let x = args.input::<f32>(0)?;
    ///     let again = args.input::<f32>(0)?; // shared borrows may repeat
    ///     assert_eq!(x.len(), again.len());
    ///     assert!(args.input::<i32>(0).is_err()); // wrong element type
    ///     args.output::<f32>(1)?[0] = x.iter().sum();
    ///     Ok(())
    /// }
    /// ```
    pub fn input<T: Element>(&self, i: usize) -> Result<&[T]> {
        let (t, ptr) = self.check::<T>(i)?;
        if !t.access.can_read() {
            return Err(Error::invalid(format!(
                "tensor {i} is write-only (tagged Output) and cannot be read"
            )));
        }
        if self.borrows[i].get() == EXCLUSIVE {
            return Err(Error::invalid(format!("tensor {i} is already borrowed mutably in this call")));
        }
        self.borrows[i].set(SHARED);
        let len = t.view.num_elements() as usize;
        // SAFETY: rule H1 (the pointer and `len` elements lie in a live mapping) or rule H6 (in
        // the packed copy this value owns), rule H4 (contiguous, matching dtype, aligned),
        // rules H2/H3 (no live `&mut` aliases it).
        Ok(unsafe { std::slice::from_raw_parts(ptr as *const T, len) })
    }

    /// Tensor `i` as a mutable slice; needs write access; once per call.
    ///
    /// An `InOut` tensor arrives with its current contents; do not rely on what an `Output`
    /// tensor holds before you write it.
    ///
    /// # Errors
    ///
    /// An [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error when the index
    /// is out of range, `T` does not match the tensor's data type, the tensor is read-only
    /// (tagged `Input`), or it was already borrowed in this call.
    ///
    /// ```no_run
    /// use simpler::{HostArgs, HostResult};
    ///
    /// fn f(args: &HostArgs<'_>) -> HostResult {
    ///     let acc = args.output::<i64>(0)?; // tagged InOut: read-modify-write
    ///     for v in acc.iter_mut() {
    ///         *v += 1;
    ///     }
    ///     assert!(args.output::<i64>(0).is_err()); // a second mutable borrow is refused
    ///     assert!(args.input::<i64>(0).is_err()); // so is reading it while borrowed mutably
    ///     Ok(())
    /// }
    /// ```
    #[allow(clippy::mut_from_ref)] // Exclusive access is enforced by rule H3 at run time.
    pub fn output<T: Element>(&self, i: usize) -> Result<&mut [T]> {
        let (t, ptr) = self.check::<T>(i)?;
        if !t.access.can_write() {
            return Err(Error::invalid(format!(
                "tensor {i} is read-only (tagged Input) and cannot be written"
            )));
        }
        if self.borrows[i].get() != FREE {
            return Err(Error::invalid(format!("tensor {i} is already borrowed in this call")));
        }
        self.borrows[i].set(EXCLUSIVE);
        let len = t.view.num_elements() as usize;
        // SAFETY: rule H1 (live mapping) or rule H6 (the packed copy this value owns, its
        // block made writable by `Box::into_raw`), rule H4 (contiguous, dtype, alignment),
        // rule H3 (this is the only borrow of index `i` for the rest of the call) and rule H2
        // (no other tensor of the task overlaps a writable one).
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr as *mut T, len) })
    }
}

impl Drop for HostArgs<'_> {
    /// Scatters the packed copy of every strided tensor lent mutably back into its view, and
    /// frees the copies (rule H6).
    fn drop(&mut self) {
        for (i, block) in self.packed.iter_mut().enumerate() {
            if let Some(raw) = block.take() {
                // SAFETY: rule H6 — `raw` came from `Box::into_raw` in `new` and is freed
                // only here, once; no slice lent from it outlives `&self`, which has ended.
                let block = unsafe { Box::from_raw(raw) };
                if self.borrows[i].get() == EXCLUSIVE {
                    self.tensors[i].unpack(&block);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::mem::as_bytes_mut;

    fn f32s(offset: u64, n: u32) -> TensorView {
        TensorView::new(offset, &[n], None, DataType::Float32).unwrap()
    }

    /// `HostArgs<'a>` is covariant in `'a`: a longer-lived one is accepted where a shorter one
    /// is asked for (a helper taking `&'a HostArgs<'a>`). A field that made it invariant (a
    /// `SmallVec` of `MappedTensor<'a>`) fails to compile here.
    #[expect(dead_code, reason = "a compile-time check")]
    fn host_args_is_covariant<'s, 'l: 's>(args: HostArgs<'l>) -> HostArgs<'s> {
        args
    }

    #[test]
    fn a_slice_tensor_must_hold_its_view() {
        let mut buf = [0f32; 4];
        let bytes = as_bytes_mut(&mut buf);
        let e = MappedTensor::from_slice(bytes, f32s(4, 4), Access::Read).unwrap_err();
        assert!(e.message().contains("past the 16-byte buffer"), "{e}");
        assert!(MappedTensor::from_slice(bytes, f32s(4, 3), Access::Read).is_ok());
    }

    #[test]
    fn writable_tensors_may_not_overlap() {
        let (mut a, mut b) = ([1f32; 4], [0f32; 4]);
        let ab = as_bytes_mut(&mut a);
        let base = ab.as_mut_ptr();
        // Two views of one buffer: only the first two elements of each overlap.
        // SAFETY: rule H1 — both views lie inside `a`, which outlives the arguments and which
        // nothing else touches meanwhile; the overlap is what `HostArgs::new` must refuse.
        let (t0, t1) = unsafe {
            (
                MappedTensor::new(base, f32s(0, 3), Access::Write),
                MappedTensor::new(base, f32s(8, 2), Access::Read),
            )
        };
        let e = HostArgs::new(vec![t0, t1], &[], 0).unwrap_err();
        assert!(e.message().contains("overlap"), "{e}");
        let out = MappedTensor::from_slice(as_bytes_mut(&mut b), f32s(0, 4), Access::Write).unwrap();
        let args = HostArgs::new(vec![out], &[], 0).unwrap();
        args.output::<f32>(0).unwrap().fill(2.0);
        assert!(args.output::<f32>(0).is_err(), "one mutable borrow per call");
        drop(args);
        assert_eq!(b, [2.0; 4]);
    }

    #[test]
    fn strided_views_are_lent_packed_and_written_back() {
        // A 4x6 matrix; the tile is rows 1..3, columns 2..5: shape [2, 3], strides [6, 1].
        let mut m: Vec<f32> = (0..24).map(|v| v as f32).collect();
        let mut n = m.clone();
        let tile = TensorView::new(4 * (6 + 2), &[2, 3], Some(&[6, 1]), DataType::Float32).unwrap();
        let col = TensorView::new(4 * 5, &[4], Some(&[6]), DataType::Float32).unwrap(); // column 5
        let t0 = MappedTensor::from_slice(as_bytes_mut(&mut m), tile, Access::ReadWrite).unwrap();
        let t1 = MappedTensor::from_slice(as_bytes_mut(&mut n), col, Access::Read).unwrap();
        let args = HostArgs::new(vec![t0, t1], &[], 0).unwrap();
        assert_eq!(args.input::<f32>(1).unwrap(), [5.0, 11.0, 17.0, 23.0]);
        let t = args.output::<f32>(0).unwrap();
        assert_eq!(t, [8.0, 9.0, 10.0, 14.0, 15.0, 16.0]);
        t.iter_mut().for_each(|v| *v = -*v);
        drop(args);
        let want: Vec<f32> =
            (0..24)
                .map(|v| {
                    if (1..3).contains(&(v / 6)) && (2..5).contains(&(v % 6)) {
                        -(v as f32)
                    } else {
                        v as f32
                    }
                })
                .collect();
        assert_eq!(m, want, "the tile went back, nothing else moved");
    }

    #[test]
    fn misaligned_views_are_refused() {
        let mut buf = [0u32; 4];
        let bytes = as_bytes_mut(&mut buf);
        // A buffer starting one byte into a u32 array: its f32 view is misaligned.
        let t = MappedTensor::from_slice(&mut bytes[1..], f32s(0, 2), Access::Read).unwrap();
        let args = HostArgs::new(vec![t], &[], 0).unwrap();
        let e = args.input::<f32>(0).unwrap_err();
        assert!(e.message().contains("not aligned"), "{e}");
    }
}
