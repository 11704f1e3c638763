//! Tensors: a buffer descriptor plus a strided view, and the overlap test between views.
//!
//! A [`TensorView`] is an offset, a shape, element strides and a dtype, validated. A [`Tensor`]
//! is a descriptor plus a view; [`overlap`] decides whether two views share a byte (bounding
//! ranges first, then a per-axis lattice), and [`Tensor::overlaps`] is the engine's overlap rule
//! between two tensors.
//!
//! The public ways to make a tensor start from a `Buffer` ([`Buffer::tensor`],
//! [`Buffer::view`], [`Tensor::new`]) or from another tensor ([`Tensor::reshape`],
//! [`Tensor::narrowed`], partitions), so every tensor of a host buffer carries the buffer (its
//! keepalive), which a submitted task holds against host writes. A tensor of a bare descriptor,
//! holding nothing, is crate-private ([`Tensor::from_desc`]): for descriptors no `Buffer` of
//! this process owns (decoded from a frame, `orch.alloc` heap slabs, device memory).
//!
//! Partitions ([`Tensor::rows`], [`Tensor::slice`], [`Tensor::split`], [`Tensor::tiles`],
//! [`Tensor::grid`]) give views whose offsets count in elements of the tensor, with its buffer,
//! strides and access; a partition that does not divide evenly is refused, and the message says
//! what would be left over.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::data::buffer::{Access, Buffer, BufferDesc};
use crate::data::dtype::DataType;
use crate::error::{Error, Result};

/// The most dimensions a tensor view may have.
///
/// ```
/// use simpler::{DataType, memory::MAX_TENSOR_DIMS, memory::TensorView};
/// assert!(TensorView::new(0, &[1; MAX_TENSOR_DIMS], None, DataType::Int8).is_ok());
/// assert!(TensorView::new(0, &[1; MAX_TENSOR_DIMS + 1], None, DataType::Int8).is_err());
/// ```
pub const MAX_TENSOR_DIMS: usize = 5;

/// A strided view into a buffer: byte offset, shape, element strides and element type.
///
/// Validation: 1..=5 dimensions, every shape and stride > 0, the byte offset a multiple of the
/// element size. `strides: None` means row-major contiguous. Whether the view fits inside its
/// buffer is checked when it is attached to one ([`Buffer::view`]).
///
/// ```
/// use simpler::{DataType, memory::TensorView};
/// let v = TensorView::new(0, &[2, 3], None, DataType::Float32).unwrap();
/// assert_eq!(v.strides(), &[3, 1]);
/// assert_eq!(v.extent_bytes(), 24);
/// assert!(TensorView::new(2, &[4], None, DataType::Float32).is_err()); // misaligned offset
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorView {
    byte_offset: u64,
    ndims: u8,
    shape: [u32; MAX_TENSOR_DIMS],
    strides: [u32; MAX_TENSOR_DIMS],
    dtype: DataType,
}

impl TensorView {
    /// Builds and validates a view. `strides` are in elements; `None` means row-major contiguous.
    ///
    /// # Errors
    ///
    /// An [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error when the rank
    /// is not in `1..=5`, a dimension or stride is 0, `strides` has another length than `shape`,
    /// the byte offset is not a multiple of the element size, the extent overflows, or two
    /// elements would share bytes (taken by increasing stride, each stride must step past
    /// everything the smaller strides span).
    ///
    /// ```
    /// use simpler::{DataType, memory::TensorView};
    /// // Every other element of a 1-D i32 array, starting at element 1.
    /// let odd = TensorView::new(4, &[3], Some(&[2]), DataType::Int32).unwrap();
    /// assert_eq!(odd.byte_range(), (4, 24));
    /// assert!(TensorView::new(0, &[2, 0], None, DataType::Int32).is_err()); // empty dimension
    /// assert!(TensorView::new(0, &[2, 2], Some(&[1]), DataType::Int32).is_err()); // rank mismatch
    /// // Elements that share bytes: refused, so no view ever names one element twice.
    /// assert!(TensorView::new(0, &[1000; 5], Some(&[1; 5]), DataType::Uint8).is_err());
    /// ```
    pub fn new(
        byte_offset: u64,
        shape: &[u32],
        strides: Option<&[u32]>,
        dtype: DataType,
    ) -> Result<TensorView> {
        let nd = shape.len();
        if nd == 0 || nd > MAX_TENSOR_DIMS {
            return Err(Error::invalid(format!(
                "tensor must have 1..={MAX_TENSOR_DIMS} dimensions, got {nd}"
            )));
        }
        let mut s = [0u32; MAX_TENSOR_DIMS];
        let mut st = [0u32; MAX_TENSOR_DIMS];
        s[..nd].copy_from_slice(shape);
        match strides {
            Some(given) => {
                if given.len() != nd {
                    return Err(Error::invalid(format!(
                        "tensor has {nd} dimensions but {} strides",
                        given.len()
                    )));
                }
                st[..nd].copy_from_slice(given);
            }
            None => {
                let mut acc: u64 = 1;
                for i in (0..nd).rev() {
                    st[i] = u32::try_from(acc).map_err(|_| {
                        Error::invalid(format!("tensor shape {shape:?} is too large for u32 strides"))
                    })?;
                    acc = acc.saturating_mul(u64::from(shape[i].max(1)));
                }
            }
        }
        let view = TensorView { byte_offset, ndims: nd as u8, shape: s, strides: st, dtype };
        view.validate()?;
        Ok(view)
    }

    /// Re-checks every rule (used after decoding).
    pub(crate) fn validate(&self) -> Result<()> {
        let nd = usize::from(self.ndims);
        if nd == 0 || nd > MAX_TENSOR_DIMS {
            return Err(Error::invalid(format!(
                "tensor must have 1..={MAX_TENSOR_DIMS} dimensions, got {nd}"
            )));
        }
        for i in 0..nd {
            if self.shape[i] == 0 {
                return Err(Error::invalid(format!("tensor shape[{i}] is 0; every dimension must be > 0")));
            }
            if self.strides[i] == 0 {
                return Err(Error::invalid(format!("tensor stride[{i}] is 0; every stride must be > 0")));
            }
        }
        for i in nd..MAX_TENSOR_DIMS {
            if self.shape[i] != 0 || self.strides[i] != 0 {
                return Err(Error::invalid(format!("tensor slot {i} past ndims={nd} must be zero")));
            }
        }
        let es = self.dtype.size() as u64;
        if !self.byte_offset.is_multiple_of(es) {
            return Err(Error::invalid(format!(
                "tensor byte offset {} is not a multiple of the {} element size {es}",
                self.byte_offset, self.dtype
            )));
        }
        if self.extent_bytes_checked().is_none() {
            return Err(Error::invalid("tensor view extent overflows u64"));
        }
        // Overlapping strides keep the extent small while the element count grows: the count
        // must fit too (`num_elements`, `is_contiguous` and every size computed from it).
        if self.shape().iter().try_fold(1u64, |n, &d| n.checked_mul(u64::from(d))).is_none() {
            return Err(Error::invalid(format!(
                "tensor shape {:?} has more elements than fit in u64",
                self.shape()
            )));
        }
        // Each element has bytes of its own: taken by increasing stride, every dimension's
        // stride is larger than the span of the dimensions before it (size-1 dimensions do not
        // matter). So the element count is at most the extent in elements, and a writable view
        // can never hand out two `&mut` to one element.
        let mut dims: [(u64, u64); MAX_TENSOR_DIMS] = [(0, 0); MAX_TENSOR_DIMS];
        for (d, (&stride, &size)) in dims.iter_mut().zip(self.strides[..nd].iter().zip(&self.shape[..nd])) {
            *d = (u64::from(stride), u64::from(size));
        }
        dims[..nd].sort_unstable();
        let mut span: u64 = 0;
        for &(stride, size) in dims[..nd].iter().filter(|d| d.1 > 1) {
            if stride <= span {
                return Err(Error::invalid(format!(
                    "tensor view shape {:?} strides {:?}: its elements overlap (a stride of {stride} does not step past the {} elements the smaller strides span); every element needs bytes of its own",
                    self.shape(),
                    self.strides(),
                    span + 1
                )));
            }
            // Cannot overflow: the extent check above bounds the sum of the spans.
            span += (size - 1) * stride;
        }
        Ok(())
    }

    /// Byte offset of the first element within the buffer.
    ///
    /// ```
    /// use simpler::{DataType, memory::TensorView};
    /// let v = TensorView::new(16, &[4], None, DataType::Int64).unwrap();
    /// assert_eq!(v.byte_offset(), 16);
    /// ```
    pub fn byte_offset(&self) -> u64 {
        self.byte_offset
    }

    /// The shape (one entry per dimension).
    ///
    /// ```
    /// use simpler::{DataType, memory::TensorView};
    /// let v = TensorView::new(0, &[2, 3, 4], None, DataType::Uint8).unwrap();
    /// assert_eq!(v.shape(), &[2, 3, 4]);
    /// ```
    pub fn shape(&self) -> &[u32] {
        &self.shape[..usize::from(self.ndims)]
    }

    /// The strides in elements (one entry per dimension); row-major when none were given.
    ///
    /// ```
    /// use simpler::{DataType, memory::TensorView};
    /// let v = TensorView::new(0, &[2, 3, 4], None, DataType::Uint8).unwrap();
    /// assert_eq!(v.strides(), &[12, 4, 1]);
    /// let t = TensorView::new(0, &[4, 3], Some(&[1, 4]), DataType::Uint8).unwrap(); // transposed
    /// assert_eq!(t.strides(), &[1, 4]);
    /// ```
    pub fn strides(&self) -> &[u32] {
        &self.strides[..usize::from(self.ndims)]
    }

    /// The element type.
    ///
    /// ```
    /// use simpler::{DataType, memory::TensorView};
    /// let v = TensorView::new(0, &[8], None, DataType::BFloat16).unwrap();
    /// assert_eq!(v.dtype(), DataType::BFloat16);
    /// ```
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// Number of elements (the product of the shape, whatever the strides).
    ///
    /// ```
    /// use simpler::{DataType, memory::TensorView};
    /// let v = TensorView::new(0, &[2, 3], Some(&[8, 2]), DataType::Float32).unwrap();
    /// assert_eq!(v.num_elements(), 6);
    /// ```
    pub fn num_elements(&self) -> u64 {
        // Never overflows: elements have bytes of their own, so there are at most as many as
        // the extent (a `u64`) holds bytes.
        self.shape().iter().map(|&d| u64::from(d)).product()
    }

    /// True when the view is row-major contiguous (strides of size-1 dimensions are ignored).
    ///
    /// ```
    /// use simpler::{DataType, memory::TensorView};
    /// let dense = TensorView::new(0, &[2, 3], None, DataType::Float32).unwrap();
    /// assert!(dense.is_contiguous());
    /// let rows = TensorView::new(0, &[2, 3], Some(&[4, 1]), DataType::Float32).unwrap(); // padded rows
    /// assert!(!rows.is_contiguous());
    /// let one_row = TensorView::new(0, &[1, 3], Some(&[99, 1]), DataType::Float32).unwrap();
    /// assert!(one_row.is_contiguous());
    /// ```
    pub fn is_contiguous(&self) -> bool {
        let mut expect: u64 = 1;
        for i in (0..usize::from(self.ndims)).rev() {
            if self.shape[i] != 1 && u64::from(self.strides[i]) != expect {
                return false;
            }
            expect *= u64::from(self.shape[i]);
        }
        true
    }

    fn extent_bytes_checked(&self) -> Option<u64> {
        let mut last: u64 = 0;
        for i in 0..usize::from(self.ndims) {
            let span = u64::from(self.shape[i]).checked_sub(1)?.checked_mul(u64::from(self.strides[i]))?;
            last = last.checked_add(span)?;
        }
        last.checked_add(1)?.checked_mul(self.dtype.size() as u64)
    }

    /// Bytes from the first to one past the last element: `(Σ (shape_i-1)·stride_i + 1) · elem`.
    ///
    /// ```
    /// use simpler::{DataType, memory::TensorView};
    /// let dense = TensorView::new(0, &[2, 3], None, DataType::Float32).unwrap();
    /// assert_eq!(dense.extent_bytes(), 6 * 4);
    /// // Two rows of 3 out of rows of 4: the last element is at (1·4 + 2) = 6.
    /// let padded = TensorView::new(0, &[2, 3], Some(&[4, 1]), DataType::Float32).unwrap();
    /// assert_eq!(padded.extent_bytes(), 7 * 4);
    /// ```
    pub fn extent_bytes(&self) -> u64 {
        self.extent_bytes_checked().unwrap_or(u64::MAX)
    }

    /// The byte range `[offset, offset + extent)` the view touches (its bounding range; a
    /// strided view need not touch every byte in it).
    ///
    /// ```
    /// use simpler::{DataType, memory::TensorView};
    /// let v = TensorView::new(8, &[4], None, DataType::Int16).unwrap();
    /// assert_eq!(v.byte_range(), (8, 16));
    /// ```
    pub fn byte_range(&self) -> (u64, u64) {
        (self.byte_offset, self.byte_offset.saturating_add(self.extent_bytes()))
    }

    /// Calls `f(byte offset from the view's first byte, length)` for every contiguous run of the
    /// view's elements, in order. A contiguous view is one run; otherwise runs are the innermost
    /// rows when their stride is 1, else single elements.
    pub(crate) fn for_each_run(&self, mut f: impl FnMut(usize, usize)) {
        let esize = self.dtype().size();
        if self.is_contiguous() {
            f(0, self.num_elements() as usize * esize);
            return;
        }
        let shape = self.shape();
        let strides = self.strides();
        let rank = shape.len();
        let (inner, run_len) =
            if strides[rank - 1] == 1 { (rank - 1, shape[rank - 1] as usize * esize) } else { (rank, esize) };
        let mut idx = [0u32; MAX_TENSOR_DIMS];
        loop {
            let elem: u64 = (0..inner).map(|k| u64::from(idx[k]) * u64::from(strides[k])).sum();
            f(elem as usize * esize, run_len);
            // Odometer over the outer `inner` dimensions.
            let mut k = inner;
            loop {
                if k == 0 {
                    return;
                }
                k -= 1;
                idx[k] += 1;
                if idx[k] < shape[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
    }

    /// Raw parts for the wire codec.
    pub(crate) fn raw(&self) -> (u64, u8, [u32; MAX_TENSOR_DIMS], [u32; MAX_TENSOR_DIMS], DataType) {
        (self.byte_offset, self.ndims, self.shape, self.strides, self.dtype)
    }

    /// Rebuilds a view from raw parts and validates it.
    pub(crate) fn from_raw(
        byte_offset: u64,
        ndims: u8,
        shape: [u32; MAX_TENSOR_DIMS],
        strides: [u32; MAX_TENSOR_DIMS],
        dtype: DataType,
    ) -> Result<TensorView> {
        let v = TensorView { byte_offset, ndims, shape, strides, dtype };
        v.validate()?;
        Ok(v)
    }
}

impl fmt::Debug for TensorView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{:?}@{} strides {:?}", self.dtype, self.shape(), self.byte_offset, self.strides())
    }
}

/// How two views of the same buffer relate; the result of [`overlap`] (cases in the unit tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overlap {
    /// No byte is shared.
    None,
    /// Some bytes may be shared (conservative for views whose geometry cannot be compared).
    Partial,
    /// The second view's bytes are all inside the first's.
    Covered,
}

/// Compares the bytes `a` and `b` touch. Returns [`Overlap::Covered`] when every byte of `b` is
/// touched by `a` (so a write through `a` replaces everything `b` had).
///
/// Stage 1 compares bounding byte ranges. Stage 2, only for views that share dtype, rank and
/// strides that nest as exact multiples down to 1, intersects per-axis intervals; anything
/// else that the bounding ranges cannot separate counts as [`Overlap::Partial`].
pub(crate) fn overlap(a: &TensorView, b: &TensorView) -> Overlap {
    let (a0, a1) = a.byte_range();
    let (b0, b1) = b.byte_range();
    if a1 <= b0 || b1 <= a0 {
        return Overlap::None;
    }
    if a.is_contiguous() && a0 <= b0 && b1 <= a1 {
        return Overlap::Covered;
    }
    match lattice_overlap(a, b) {
        Some(o) => o,
        None => Overlap::Partial,
    }
}

/// Per-axis comparison for views on the same lattice; `None` when the geometry does not allow it.
fn lattice_overlap(a: &TensorView, b: &TensorView) -> Option<Overlap> {
    if a.dtype != b.dtype || a.ndims != b.ndims || a.strides() != b.strides() {
        return None;
    }
    let nd = usize::from(a.ndims);
    let st = a.strides();
    if st[nd - 1] != 1 {
        return None;
    }
    for i in 0..nd - 1 {
        if !st[i].is_multiple_of(st[i + 1]) || st[i] < st[i + 1] {
            return None;
        }
    }
    // Decompose each origin (in elements) into per-axis coordinates on the lattice.
    let es = a.dtype.size() as u64;
    let coords = |off: u64| -> Option<[u64; MAX_TENSOR_DIMS]> {
        let mut rem = off / es;
        let mut c = [0u64; MAX_TENSOR_DIMS];
        for i in 0..nd {
            let s = u64::from(st[i]);
            c[i] = rem / s;
            rem %= s;
        }
        (rem == 0).then_some(c)
    };
    let ca = coords(a.byte_offset)?;
    let cb = coords(b.byte_offset)?;
    // Each axis except the outermost must stay inside its parent stride to be a true lattice.
    for i in 1..nd {
        let room = u64::from(st[i - 1]) / u64::from(st[i]);
        if ca[i] + u64::from(a.shape[i]) > room || cb[i] + u64::from(b.shape[i]) > room {
            return None;
        }
    }
    let mut covered = true;
    for i in 0..nd {
        let (lo_a, hi_a) = (ca[i], ca[i] + u64::from(a.shape[i]));
        let (lo_b, hi_b) = (cb[i], cb[i] + u64::from(b.shape[i]));
        if hi_a <= lo_b || hi_b <= lo_a {
            return Some(Overlap::None);
        }
        if !(lo_a <= lo_b && hi_b <= hi_a) {
            covered = false;
        }
    }
    Some(if covered { Overlap::Covered } else { Overlap::Partial })
}

/// A tensor: a buffer descriptor and a validated view that fits inside it.
///
/// Tensors carry no address. Cloning is cheap. A tensor of a host buffer is made from the
/// [`Buffer`] itself ([`Buffer::tensor`], [`Buffer::view`], [`Tensor::new`]) or from another
/// tensor of it (reshapes, partitions): it keeps the buffer alive, so tasks that still name it
/// never see it freed, and a task that names it holds the buffer against host writes until it
/// ends.
///
/// ```
/// use simpler::{DataType, Tensor, memory::TensorView};
/// # let buf = simpler::__private::doc_buffer(64).unwrap();
/// // `buf`: a 64-byte host buffer (`worker.create_buffer(64)?`).
/// let t = buf.view(TensorView::new(0, &[16], None, DataType::Float32).unwrap()).unwrap();
/// assert_eq!(t.view().num_elements(), 16);
/// // A view past the end of the buffer is refused.
/// assert!(Tensor::new(&buf, TensorView::new(4, &[16], None, DataType::Float32).unwrap()).is_err());
/// ```
#[derive(Clone)]
pub struct Tensor {
    desc: BufferDesc,
    view: TensorView,
    keepalive: Option<Arc<dyn Any + Send + Sync>>,
}

impl Tensor {
    /// A tensor of `buffer` with the view `view` (byte offset, shape, element strides): the
    /// same as [`Buffer::view`]. Like every tensor made from a [`Buffer`], it keeps the buffer
    /// alive, and while a submitted task names it the buffer's host writes
    /// ([`Buffer::write`]) are refused.
    ///
    /// A tensor is made from the buffer, never from its bare descriptor: such a tensor would
    /// not hold the buffer, so a host write could change the bytes a running task holds as
    /// `&[T]` or `&mut [T]`. To take another view of a tensor you have (an argument of an
    /// orchestration function, an `orch.alloc` intermediate), use
    /// [`reshape`](Tensor::reshape) or a partition ([`rows`](Tensor::rows),
    /// [`slice`](Tensor::slice), ...), which keep what the tensor keeps.
    ///
    /// # Errors
    ///
    /// A view whose [byte range](TensorView::byte_range) ends past the buffer is an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error.
    ///
    /// ```
    /// use simpler::{DataType, Tensor, memory::TensorView};
    /// # let buf = simpler::__private::doc_buffer(32)?;
    /// // `buf`: a 32-byte host buffer (`worker.create_buffer(32)?`).
    /// let t = Tensor::new(&buf, TensorView::new(16, &[2, 2], None, DataType::Float32)?)?;
    /// assert_eq!(t.view().byte_range(), (16, 32));
    /// assert!(Tensor::new(&buf, TensorView::new(16, &[5], None, DataType::Float32)?).is_err());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    ///
    /// A descriptor alone makes no tensor:
    ///
    /// ```compile_fail
    /// use simpler::{DataType, Tensor, memory::TensorView};
    /// # let buf = simpler::__private::doc_buffer(32)?;
    /// let t = Tensor::new(*buf.desc(), TensorView::new(0, &[8], None, DataType::Float32)?)?; // error: expected `&Buffer`
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn new(buffer: &Buffer, view: TensorView) -> Result<Tensor> {
        buffer.view(view)
    }

    /// A tensor of a bare descriptor, holding nothing: for descriptors that no [`Buffer`] of
    /// this process owns (decoded from another process's frame, an `orch.alloc` heap slab, a
    /// chip's own memory). Never for a host buffer this process created: a task naming such a
    /// tensor would not hold the buffer against host writes (use `Buffer::view`).
    pub(crate) fn from_desc(desc: BufferDesc, view: TensorView) -> Result<Tensor> {
        Tensor::with_keepalive(desc, view, None)
    }

    /// The name of the buffer under the tensor ([`Buffer::set_name`]), if it has one.
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// # let mut worker = simpler::Worker::builder().sub_workers(1).build()?;
    /// # worker.init()?;
    /// let x = worker.create_buffer(16)?;
    /// let t = x.tensor(&[4], simpler::DataType::Float32)?;
    /// assert_eq!(t.buffer_name(), None);
    /// x.set_name("x")?;
    /// assert_eq!(t.buffer_name().as_deref(), Some("x"));
    /// # Ok(()) }
    /// ```
    pub fn buffer_name(&self) -> Option<String> {
        let inner = self.keepalive.as_ref()?.downcast_ref::<crate::data::buffer::BufferInner>()?;
        inner.name().map(|n| n.to_string())
    }

    /// How messages name the tensor's buffer: its name (`Buffer::set_name`) and identity, or
    /// the identity alone.
    pub(crate) fn buffer_label(&self) -> String {
        self.buffer_ref().map_or_else(|| self.desc.identity().to_string(), |b| b.label())
    }

    /// The buffer a tensor made by [`Buffer::tensor`] views.
    pub(crate) fn buffer_ref(&self) -> Option<&crate::data::buffer::BufferInner> {
        self.keepalive.as_ref()?.downcast_ref::<crate::data::buffer::BufferInner>()
    }

    pub(crate) fn with_keepalive(
        desc: BufferDesc,
        view: TensorView,
        keepalive: Option<Arc<dyn Any + Send + Sync>>,
    ) -> Result<Tensor> {
        let (_, end) = view.byte_range();
        if end > desc.nbytes() {
            return Err(Error::invalid(format!(
                "tensor view {view:?} ends at byte {end}, past the end of its {}-byte buffer",
                desc.nbytes()
            )));
        }
        Ok(Tensor { desc, view, keepalive })
    }

    /// The same tensor with less access, for handing a buffer on to code that must not write
    /// it (or not read it). Only narrowing is allowed: asking for access the descriptor does
    /// not grant is an [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error.
    ///
    /// ```
    /// use simpler::{memory::Access, DataType};
    /// # let buffer = simpler::__private::doc_buffer(64)?;
    /// // `buffer`: a host buffer (`worker.create_buffer(64)?`).
    /// let t = buffer.tensor(&[16], DataType::Float32)?;
    /// let read_only = t.narrowed(Access::Read)?;
    /// assert_eq!(read_only.desc().access(), Access::Read);
    /// assert!(read_only.narrowed(Access::ReadWrite).is_err()); // never wider
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn narrowed(&self, access: Access) -> Result<Tensor> {
        if !self.desc.access().allows(access) {
            return Err(Error::invalid(format!(
                "tensor of buffer {}: cannot widen {:?} access to {access:?}",
                self.desc.identity(),
                self.desc.access()
            )));
        }
        Ok(Tensor { desc: self.desc.with_access(access), view: self.view, keepalive: self.keepalive.clone() })
    }

    /// The buffer descriptor.
    ///
    /// ```
    /// # use simpler::{DataType, Tensor, memory::TensorView};
    /// # let buf = simpler::__private::doc_buffer(64)?;
    /// let t = buf.view(TensorView::new(0, &[16], None, DataType::Float32)?)?;
    /// assert_eq!(t.desc(), buf.desc());
    /// assert_eq!(t.desc().identity(), buf.desc().identity());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn desc(&self) -> &BufferDesc {
        &self.desc
    }

    /// The view.
    ///
    /// ```
    /// # use simpler::{DataType, Tensor, memory::TensorView};
    /// # let buf = simpler::__private::doc_buffer(64)?;
    /// let t = buf.view(TensorView::new(0, &[4, 4], None, DataType::Float32)?)?;
    /// assert_eq!(t.view().shape(), &[4, 4]);
    /// assert_eq!(t.view().dtype(), DataType::Float32);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn view(&self) -> &TensorView {
        &self.view
    }

    /// Another view of the same buffer (keeps the same owner alive). The view's byte offset
    /// counts from the start of the buffer, not of this tensor; to take part of the tensor
    /// itself, use [`rows`](Tensor::rows), [`slice`](Tensor::slice), [`split`](Tensor::split),
    /// [`tiles`](Tensor::tiles) or [`grid`](Tensor::grid).
    ///
    /// # Errors
    ///
    /// As [`Tensor::new`]: the new view must lie inside the buffer.
    ///
    /// ```
    /// # use simpler::{DataType, Tensor, memory::TensorView};
    /// # let buf = simpler::__private::doc_buffer(64)?;
    /// let whole = buf.view(TensorView::new(0, &[4, 4], None, DataType::Float32)?)?;
    /// // The bottom two rows.
    /// let bottom = whole.reshape(TensorView::new(32, &[2, 4], None, DataType::Float32)?)?;
    /// assert_eq!(bottom.desc(), whole.desc());
    /// assert_eq!(bottom.view().byte_range(), (32, 64));
    /// assert!(whole.reshape(TensorView::new(0, &[17], None, DataType::Float32)?).is_err());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn reshape(&self, view: TensorView) -> Result<Tensor> {
        Tensor::with_keepalive(self.desc, view, self.keepalive.clone())
    }
}

/// Partitions: views of a part of a tensor, with offsets and ranges counted in elements of the
/// tensor (not bytes of its buffer). Each keeps the buffer, the element type, the strides and
/// the access of the tensor it was taken from, so a piece of a read-only tensor is read-only.
impl Tensor {
    /// The rows `range` of the tensor (axis 0): `slice(0, range)`.
    ///
    /// # Errors
    ///
    /// As [`slice`](Tensor::slice).
    ///
    /// ```
    /// use simpler::DataType;
    /// # let buffer = simpler::__private::doc_buffer(4 * 12)?;
    /// // `buffer`: a host buffer (`worker.create_buffer(48)?`).
    /// let m = buffer.tensor(&[4, 3], DataType::Float32)?; // 4 rows of 3
    /// let mid = m.rows(1..3)?;
    /// assert_eq!(mid.view().shape(), &[2, 3]);
    /// assert_eq!(mid.view().byte_offset(), 12); // row 1 starts 3 elements in
    /// assert!(m.rows(3..5).is_err()); // past the last row
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn rows(&self, range: std::ops::Range<u32>) -> Result<Tensor> {
        self.slice(0, range)
    }

    /// The part of the tensor whose index along `axis` is in `range`; the other axes are whole.
    /// The piece has the tensor's strides, so a slice along an inner axis is a strided view.
    ///
    /// # Errors
    ///
    /// An [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error when `axis`
    /// is not an axis of the tensor, or `range` is empty or ends past the axis.
    ///
    /// ```
    /// use simpler::DataType;
    /// # let buffer = simpler::__private::doc_buffer(4 * 12)?;
    /// let m = buffer.tensor(&[4, 3], DataType::Float32)?;
    /// let last_column = m.slice(1, 2..3)?;
    /// assert_eq!(last_column.view().shape(), &[4, 1]);
    /// assert_eq!(last_column.view().strides(), &[3, 1]);
    /// assert_eq!(last_column.view().byte_offset(), 8);
    /// let err = m.slice(2, 0..1).unwrap_err();
    /// assert!(err.message().contains("has no axis 2"), "{err}");
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn slice(&self, axis: usize, range: std::ops::Range<u32>) -> Result<Tensor> {
        let v = &self.view;
        let shape = v.shape();
        let Some(&len) = shape.get(axis) else {
            return Err(Error::invalid(format!(
                "cannot slice tensor {shape:?} along axis {axis}: it has no axis {axis} (rank {})",
                shape.len()
            )));
        };
        if range.start >= range.end || range.end > len {
            return Err(Error::invalid(format!(
                "cannot slice {}..{} of axis {axis} of tensor {shape:?}: the range must be non-empty and within 0..{len}",
                range.start, range.end
            )));
        }
        let mut s = [0u32; MAX_TENSOR_DIMS];
        s[..shape.len()].copy_from_slice(shape);
        s[axis] = range.end - range.start;
        let offset = u64::from(range.start) * u64::from(v.strides()[axis]) * v.dtype().size() as u64;
        let view = TensorView::new(v.byte_offset + offset, &s[..shape.len()], Some(v.strides()), v.dtype())?;
        self.reshape(view)
    }

    /// `n` equal pieces along axis 0, in order (a partition of the rows).
    ///
    /// # Errors
    ///
    /// An [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error when `n` is 0
    /// or does not divide the number of rows: pieces are never of unequal size. To handle a
    /// remainder, split the rows that divide and take the rest with [`rows`](Tensor::rows).
    ///
    /// ```
    /// use simpler::DataType;
    /// # let buffer = simpler::__private::doc_buffer(4 * 12)?;
    /// let m = buffer.tensor(&[4, 3], DataType::Float32)?;
    /// let halves = m.split(2)?;
    /// assert_eq!(halves.len(), 2);
    /// assert_eq!(halves[1].view().shape(), &[2, 3]);
    /// assert_eq!(halves[1].view().byte_offset(), 24);
    /// let err = m.split(3).unwrap_err();
    /// assert!(err.message().contains("4 rows into 3 equal pieces"), "{err}");
    /// let err = m.split(6).unwrap_err(); // more pieces than rows
    /// assert!(err.message().contains("at most 4 pieces of one row"), "{err}");
    /// // The remainder by hand: 3 pieces of 1 row, then the last row.
    /// let (head, tail) = (m.rows(0..3)?.split(3)?, m.rows(3..4)?);
    /// assert_eq!((head.len(), tail.view().shape()[0]), (3, 1));
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn split(&self, n: u32) -> Result<Vec<Tensor>> {
        let rows = self.view.shape()[0];
        if n == 0 || !rows.is_multiple_of(n) {
            let (why, hint) = if n == 0 {
                ("a count of 0".to_string(), "choose a count of at least 1".to_string())
            } else if n > rows {
                (
                    "it has fewer rows than pieces".to_string(),
                    format!("choose a count that divides {rows} (at most {rows} pieces of one row)"),
                )
            } else {
                (
                    format!("{} rows would be left over", rows % n),
                    format!(
                        "choose a count that divides {rows}, or split the first {} rows and take the rest with `rows(..)`",
                        rows - rows % n
                    ),
                )
            };
            return Err(Error::invalid(format!(
                "cannot split tensor {:?} of {rows} rows into {n} equal pieces: {why}; {hint}",
                self.view.shape()
            )));
        }
        let step = rows / n;
        (0..n).map(|i| self.rows(i * step..(i + 1) * step)).collect()
    }

    /// Pieces of shape `tile` covering the tensor, in row-major order of the tile grid (the
    /// piece at grid position `(r, c)` of a 2-D grid with `C` columns is number `r * C + c`).
    ///
    /// # Errors
    ///
    /// An [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error when `tile`
    /// has another rank than the tensor, or a tile dimension is 0 or does not divide the
    /// tensor's.
    ///
    /// ```
    /// use simpler::DataType;
    /// # let buffer = simpler::__private::doc_buffer(4 * 16)?;
    /// let m = buffer.tensor(&[4, 4], DataType::Float32)?;
    /// let tiles = m.tiles(&[2, 2])?; // a 2x2 grid of 2x2 tiles
    /// assert_eq!(tiles.len(), 4);
    /// assert_eq!(tiles[1].view().byte_offset(), 2 * 4); // top right: column 2
    /// assert_eq!(tiles[2].view().byte_offset(), 8 * 4); // bottom left: row 2
    /// assert_eq!(tiles[3].view().strides(), &[4, 1]);
    /// assert!(m.tiles(&[3, 2]).is_err()); // 3 does not divide 4
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn tiles(&self, tile: &[u32]) -> Result<Vec<Tensor>> {
        let shape = self.view.shape();
        if tile.len() != shape.len() {
            return Err(Error::invalid(format!(
                "cannot tile tensor {shape:?} with tiles {tile:?}: a tile needs one dimension per axis ({})",
                shape.len()
            )));
        }
        let mut counts = [0u32; MAX_TENSOR_DIMS];
        for (axis, (&d, &t)) in shape.iter().zip(tile).enumerate() {
            if t == 0 || !d.is_multiple_of(t) {
                return Err(Error::invalid(format!(
                    "cannot tile tensor {shape:?} with tiles {tile:?}: a tile dimension of {t} does not divide axis {axis} of {d}{}",
                    if t == 0 { String::new() } else { format!(" ({} left over)", d % t) }
                )));
            }
            counts[axis] = d / t;
        }
        self.grid(&counts[..shape.len()])
    }

    /// The tensor cut into `counts[axis]` equal pieces along each axis: [`tiles`](Tensor::tiles)
    /// given the grid instead of the tile shape. `grid(&[n])` on a 1-D tensor is `split(n)`.
    ///
    /// # Errors
    ///
    /// An [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error when `counts`
    /// has another rank than the tensor, or a count is 0 or does not divide its axis.
    ///
    /// ```
    /// use simpler::DataType;
    /// # let buffer = simpler::__private::doc_buffer(4 * 16)?;
    /// let m = buffer.tensor(&[4, 4], DataType::Float32)?;
    /// let quarters = m.grid(&[2, 2])?;
    /// assert_eq!(quarters[3].view().shape(), &[2, 2]);
    /// assert_eq!(quarters[3].view().byte_offset(), (2 * 4 + 2) * 4);
    /// let err = m.grid(&[3, 1]).unwrap_err();
    /// assert!(err.message().contains("3 pieces"), "{err}");
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn grid(&self, counts: &[u32]) -> Result<Vec<Tensor>> {
        let shape = self.view.shape();
        if counts.len() != shape.len() {
            return Err(Error::invalid(format!(
                "cannot cut tensor {shape:?} into a grid of {counts:?}: the grid needs one count per axis ({})",
                shape.len()
            )));
        }
        for (axis, (&d, &n)) in shape.iter().zip(counts).enumerate() {
            if n == 0 || !d.is_multiple_of(n) {
                return Err(Error::invalid(format!(
                    "cannot cut axis {axis} of tensor {shape:?} ({d} long) into {n} pieces of equal size; choose a count that divides {d}"
                )));
            }
        }
        let total: u64 = counts.iter().map(|&n| u64::from(n)).product();
        let mut pieces = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
        let mut idx = [0u32; MAX_TENSOR_DIMS];
        let nd = shape.len();
        loop {
            let mut t = self.clone();
            for axis in 0..nd {
                let len = shape[axis] / counts[axis];
                if counts[axis] > 1 {
                    t = t.slice(axis, idx[axis] * len..(idx[axis] + 1) * len)?;
                }
            }
            pieces.push(t);
            // Row-major odometer over the grid.
            let mut axis = nd;
            loop {
                if axis == 0 {
                    return Ok(pieces);
                }
                axis -= 1;
                idx[axis] += 1;
                if idx[axis] < counts[axis] {
                    break;
                }
                idx[axis] = 0;
            }
        }
    }

    /// Whether the two tensors may share bytes: the same buffer and views that overlap (by
    /// the rule the engine orders tasks with; views it cannot compare count as overlapping).
    ///
    /// ```
    /// use simpler::DataType;
    /// # let buffer = simpler::__private::doc_buffer(4 * 16)?;
    /// let m = buffer.tensor(&[4, 4], DataType::Float32)?;
    /// let q = m.grid(&[2, 2])?;
    /// assert!(!q[0].overlaps(&q[1]));
    /// assert!(m.overlaps(&q[3]));
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn overlaps(&self, other: &Tensor) -> bool {
        self.desc.identity() == other.desc.identity() && overlap(&self.view, &other.view) != Overlap::None
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({} {:?})", self.desc.identity(), self.view)
    }
}

impl PartialEq for Tensor {
    fn eq(&self, other: &Tensor) -> bool {
        self.desc == other.desc && self.view == other.view
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::buffer::{Access, Backing, Identity};

    fn f32v(off: u64, shape: &[u32], strides: Option<&[u32]>) -> TensorView {
        TensorView::new(off, shape, strides, DataType::Float32).unwrap()
    }

    #[test]
    fn rejects_bad_views() {
        assert!(TensorView::new(0, &[], None, DataType::Float32).is_err());
        assert!(TensorView::new(0, &[1, 1, 1, 1, 1, 1], None, DataType::Float32).is_err());
        assert!(TensorView::new(0, &[0], None, DataType::Float32).is_err());
        assert!(TensorView::new(0, &[4], Some(&[0]), DataType::Float32).is_err());
        assert!(TensorView::new(0, &[4], Some(&[1, 1]), DataType::Float32).is_err());
        assert!(TensorView::new(6, &[4], None, DataType::Float32).is_err());
        assert!(TensorView::new(6, &[4], None, DataType::Int16).is_ok());
    }

    /// Found by the decoder fuzz harness: unit strides over `[65535; 5]` span 327 671 elements
    /// but count 65535^5 (more than `u64` holds), so `num_elements` overflowed on a view that
    /// had passed validation.
    #[test]
    fn element_count_must_fit_u64() {
        let err = TensorView::new(0, &[65535; 5], Some(&[1; 5]), DataType::Uint8).unwrap_err();
        assert_eq!(err.kind(), crate::error::ErrorKind::InvalidArgument);
        assert!(err.message().contains("more elements than fit in u64"), "{err}");
        // A count that fits is still refused when elements overlap (see `validate`).
        let err = TensorView::new(0, &[65535; 4], Some(&[1; 4]), DataType::Uint8).unwrap_err();
        assert!(err.message().contains("overlap"), "{err}");
    }

    #[test]
    fn extent_of_strided_view() {
        let v = f32v(0, &[2, 2], Some(&[8, 2]));
        // last element at 8 + 2 = 10 elements -> (10 + 1) * 4 bytes
        assert_eq!(v.extent_bytes(), 44);
        assert!(!v.is_contiguous());
    }

    #[test]
    fn view_must_fit_buffer() {
        let desc = BufferDesc::new(
            Identity::new(1, 1, 1).unwrap(),
            Backing::Memfd { pid: 1, fd: 3, ino: 9 },
            Access::ReadWrite,
            16,
        )
        .unwrap();
        assert!(Tensor::from_desc(desc, f32v(0, &[4], None)).is_ok());
        assert!(Tensor::from_desc(desc, f32v(4, &[4], None)).is_err());
    }

    #[test]
    fn overlap_cases() {
        let a = f32v(0, &[8], None);
        let b = f32v(32, &[8], None);
        assert_eq!(overlap(&a, &b), Overlap::None);
        let half = f32v(0, &[4], None);
        assert_eq!(overlap(&a, &half), Overlap::Covered);
        assert_eq!(overlap(&half, &a), Overlap::Partial);
        // Row blocks of a 4x4 matrix.
        let top = f32v(0, &[2, 4], Some(&[4, 1]));
        let bottom = f32v(32, &[2, 4], Some(&[4, 1]));
        assert_eq!(overlap(&top, &bottom), Overlap::None);
        // Column blocks interleave in bytes but not in elements.
        let left = f32v(0, &[4, 2], Some(&[4, 1]));
        let right = f32v(8, &[4, 2], Some(&[4, 1]));
        assert_eq!(overlap(&left, &right), Overlap::None);
        let mid = f32v(4, &[4, 2], Some(&[4, 1]));
        assert_eq!(overlap(&left, &mid), Overlap::Partial);
        // Different strides: conservative.
        let odd = f32v(4, &[2], Some(&[2]));
        let even = f32v(0, &[2], Some(&[2]));
        assert_eq!(overlap(&odd, &even), Overlap::Partial);
    }

    /// Whether two views share bytes does not depend on their order (the TensorMap computes
    /// one overlap for both of a writer's questions, `footprint::touches_and_covers`).
    #[test]
    fn sharing_bytes_does_not_depend_on_the_order() {
        let mut views = Vec::new();
        for off in [0u64, 4, 8, 16, 32, 36] {
            views.push(f32v(off, &[1], None));
            views.push(f32v(off, &[4], None));
            views.push(f32v(off, &[2], Some(&[2])));
            views.push(f32v(off, &[2, 2], Some(&[4, 1])));
            views.push(f32v(off, &[2, 1], Some(&[4, 1])));
            views.push(f32v(off, &[4, 2], Some(&[4, 1])));
            views.push(f32v(off, &[2, 2], Some(&[8, 2])));
        }
        for a in &views {
            for b in &views {
                assert_eq!(overlap(a, b) == Overlap::None, overlap(b, a) == Overlap::None, "{a:?} and {b:?}");
            }
        }
    }

    fn matrix(rows: u32, cols: u32) -> Tensor {
        let desc = BufferDesc::new(
            Identity::new(1, 1, 1).unwrap(),
            Backing::Memfd { pid: 1, fd: 3, ino: 9 },
            Access::Read,
            u64::from(rows * cols) * 4,
        )
        .unwrap();
        Tensor::from_desc(desc, f32v(0, &[rows, cols], None)).unwrap()
    }

    #[test]
    fn pieces_are_relative_to_the_tensor() {
        // A view that starts at row 2 of an 8x4 buffer: its row 1 is row 3 of the buffer.
        let m = matrix(8, 4);
        let lower = m.rows(2..8).unwrap();
        let r = lower.rows(1..2).unwrap();
        assert_eq!(r.view().byte_offset(), 3 * 4 * 4);
        let col = lower.slice(1, 3..4).unwrap().rows(0..1).unwrap();
        assert_eq!(col.view().byte_offset(), (2 * 4 + 3) * 4);
        // Access and element type are carried.
        assert_eq!(r.desc().access(), Access::Read);
        assert_eq!(r.view().dtype(), DataType::Float32);
    }

    #[test]
    fn partitions_cover_the_tensor_without_overlap() {
        let m = matrix(8, 4);
        for pieces in [m.split(4).unwrap(), m.tiles(&[2, 2]).unwrap(), m.grid(&[2, 4]).unwrap()] {
            let elems: u64 = pieces.iter().map(|p| p.view().num_elements()).sum();
            assert_eq!(elems, 32);
            for (i, a) in pieces.iter().enumerate() {
                assert!(m.overlaps(a));
                for b in &pieces[i + 1..] {
                    assert!(!a.overlaps(b), "{a:?} and {b:?}");
                }
            }
        }
        // Row-major grid order.
        let t = m.tiles(&[4, 2]).unwrap();
        assert_eq!(t.len(), 4);
        assert_eq!(t[1].view().byte_offset(), 2 * 4);
        assert_eq!(t[2].view().byte_offset(), 4 * 4 * 4);
    }

    #[test]
    fn partitions_that_do_not_divide_are_refused() {
        let m = matrix(6, 4);
        let err = m.split(4).unwrap_err();
        assert!(err.message().contains("2 rows would be left over"), "{err}");
        assert!(m.split(0).is_err());
        assert!(m.tiles(&[4, 4]).is_err());
        assert!(m.tiles(&[2]).is_err());
        assert!(m.grid(&[1, 3]).is_err());
        assert!(m.rows(5..7).is_err());
        assert!(m.rows(2..2).is_err());
    }
}
