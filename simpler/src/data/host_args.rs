//! `HostArgs`: what a host function sees of its task — typed slices over mapped tensors.
//!
//! Rules (cited by the `SAFETY` comments below):
//!
//! H1. Every [`MappedTensor`] points at the first byte of a view that lies wholly inside a
//!     mapping (a heap ring, or a POSIX shm object from the child's map-once cache) that
//!     outlives the `HostArgs` — the child builds it after checking the bounds and never unmaps
//!     during a call.
//! H2. Within one task no two tensors overlap unless both are read-only: the child checks
//!     this when it builds the arguments (the parent's submit check is not trusted).
//! H3. A tensor index is handed out either any number of times shared (read-only slice) or once
//!     exclusively (mutable slice), tracked by a per-index borrow flag that never resets during
//!     the call; so no `&mut [T]` ever aliases another live reference.
//! H4. Slices are made only for contiguous views whose data type matches `T` and whose byte
//!     offset is a multiple of the element size (so, with page-aligned mappings, aligned).

#![allow(unsafe_code)] // Typed slices over shared mappings; see rules H1-H4.

use std::cell::Cell;

use crate::data::buffer::Access;
use crate::data::dtype::{DataType, Element};
use crate::data::tensor::{Overlap, TensorView, overlap};
use crate::error::{Error, Result};

/// One tensor of a task, resolved to an address in this process.
pub(crate) struct MappedTensor {
    /// Start of the buffer's mapping; the view's byte offset is relative to it.
    pub(crate) base: *mut u8,
    pub(crate) view: TensorView,
    pub(crate) access: Access,
}

impl MappedTensor {
    fn ptr(&self) -> *mut u8 {
        self.base.wrapping_add(self.view.byte_offset() as usize)
    }

    fn byte_range(&self) -> (u64, u64) {
        let start = self.ptr() as u64;
        (start, start.saturating_add(self.view.extent_bytes()))
    }
}

const FREE: u8 = 0;
const SHARED: u8 = 1;
const EXCLUSIVE: u8 = 2;

/// The arguments of one host-function call: tensors (typed slices) and scalars.
///
/// `input` gives `&[T]`, `output` gives `&mut [T]`; the element type must match the tensor's
/// data type and the view must be contiguous. A tensor can be borrowed mutably once per call;
/// an input (read-only) tensor cannot be borrowed mutably at all.
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
    tensors: Vec<MappedTensor>,
    borrows: Vec<Cell<u8>>,
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
    /// Builds the arguments; checks rule H2.
    pub(crate) fn new(tensors: Vec<MappedTensor>, scalars: &'a [u64], worker: u32) -> Result<HostArgs<'a>> {
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
        Ok(HostArgs { tensors, borrows, scalars, worker })
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

    fn tensor(&self, i: usize) -> Result<&MappedTensor> {
        self.tensors.get(i).ok_or_else(|| {
            Error::invalid(format!("tensor index {i} out of range ({} tensors)", self.tensors.len()))
        })
    }

    fn check<T: Element>(&self, i: usize) -> Result<&MappedTensor> {
        let t = self.tensor(i)?;
        let dt = t.view.dtype();
        if T::DTYPE != dt && !(dt == DataType::Bool && T::DTYPE == DataType::Uint8) {
            return Err(Error::invalid(format!("tensor {i} holds {dt} elements, not {}", T::DTYPE)));
        }
        if !t.view.is_contiguous() {
            return Err(Error::invalid(format!(
                "tensor {i} is a strided view {:?}; typed slices need a contiguous view",
                t.view
            )));
        }
        Ok(t)
    }

    /// Tensor `i` as a read-only slice; may be called any number of times for one tensor.
    ///
    /// # Errors
    ///
    /// An [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error when the index
    /// is out of range, `T` does not match the tensor's data type ([`DataType::Bool`] tensors
    /// read as `u8`), the view is strided, the tensor is write-only (tagged `Output`), or it is
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
        let t = self.check::<T>(i)?;
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
        // SAFETY: rule H1 (the pointer and `len` elements lie in a live mapping), rule H4
        // (contiguous, matching dtype, aligned), rules H2/H3 (no live `&mut` aliases it).
        Ok(unsafe { std::slice::from_raw_parts(t.ptr() as *const T, len) })
    }

    /// Tensor `i` as a mutable slice; needs write access; once per call.
    ///
    /// An `InOut` tensor arrives with its current contents; do not rely on what an `Output`
    /// tensor holds before you write it.
    ///
    /// # Errors
    ///
    /// An [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error when the index
    /// is out of range, `T` does not match the tensor's data type, the view is strided, the
    /// tensor is read-only (tagged `Input`), or it was already borrowed in this call.
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
        let t = self.check::<T>(i)?;
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
        // SAFETY: rule H1 (live mapping), rule H4 (contiguous, dtype, alignment), rule H3 (this
        // is the only borrow of index `i` for the rest of the call) and rule H2 (no other
        // tensor of the task overlaps a writable one).
        Ok(unsafe { std::slice::from_raw_parts_mut(t.ptr() as *mut T, len) })
    }
}
