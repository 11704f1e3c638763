//! What a `#[callable]` kernel or host function receives for its tensor parameters: `In<T>`
//! (a read-only slice), `Out<T>` and `InOut<T>` (mutable slices), each with the tensor's shape;
//! and [`worker_index`], which core or SUB worker runs the call.

use std::fmt;
use std::ops::{Deref, DerefMut};

use crate::data::dtype::Element;
use crate::data::tensor::{MAX_TENSOR_DIMS, TensorView};

/// A tensor parameter's shape, kept beside its elements.
#[derive(Clone, Copy)]
struct Dims {
    dims: [u32; MAX_TENSOR_DIMS],
    rank: u8,
}

impl Dims {
    /// One dimension of `len` elements (a slice wrapped by hand).
    fn flat(len: usize) -> Dims {
        let mut dims = [0; MAX_TENSOR_DIMS];
        dims[0] = u32::try_from(len).unwrap_or(u32::MAX);
        Dims { dims, rank: 1 }
    }

    /// The shape of `view`.
    fn of(view: &TensorView) -> Dims {
        let shape = view.shape();
        let mut dims = [0; MAX_TENSOR_DIMS];
        dims[..shape.len()].copy_from_slice(shape);
        Dims { dims, rank: shape.len() as u8 }
    }

    fn get(&self) -> &[u32] {
        &self.dims[..usize::from(self.rank)]
    }
}

thread_local! {
    /// The worker index of the `#[callable]` call running on this thread, if any.
    static WORKER: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// Which worker runs the `#[callable]` kernel or host function this thread is in: the chip
/// core for a kernel, the SUB worker's index for a host function; `None` outside such a call.
/// (A plain host function or kernel has it as `HostArgs::worker_index`.)
///
/// ```
/// use simpler::{callable, dsl::Out};
///
/// /// Each core fills its tile with its own index.
/// #[callable(chip)]
/// fn whoami(mut tile: Out<u32>) {
///     let core = simpler::dsl::worker_index().expect("inside a call");
///     tile.fill(core);
/// }
/// assert_eq!(simpler::dsl::worker_index(), None);
/// ```
pub fn worker_index() -> Option<u32> {
    WORKER.with(std::cell::Cell::get)
}

/// Sets [`worker_index`] for the call the generated shim makes; the previous value comes back
/// when it drops (`simpler::__private::at_worker`).
#[doc(hidden)]
#[must_use]
pub struct AtWorker(Option<u32>);

impl AtWorker {
    pub(crate) fn enter(index: u32) -> AtWorker {
        AtWorker(WORKER.with(|w| w.replace(Some(index))))
    }
}

impl Drop for AtWorker {
    fn drop(&mut self) {
        WORKER.with(|w| w.set(self.0));
    }
}

/// A read-only tensor parameter of a `#[callable(chip)]` kernel or `#[callable(sub)]` host
/// function: dereferences to `&[T]`.
///
/// It has no `DerefMut`, so writing through it does not compile:
///
/// ```compile_fail
/// use simpler::{callable, dsl::In, dsl::Out};
///
/// #[callable(sub)]
/// fn bad(x: In<f32>, y: Out<f32>) {
///     x[0] = 1.0; // error: cannot assign to data in dereference of `In<'_, f32>`
///     y[0] = x[0];
/// }
/// ```
///
/// In an orchestration callable (`#[callable(orch)]`, `task_graph!`) the same marker declares a
/// read-only tensor *handle* ([`TensorOf<T, ReadOnly>`](crate::dsl::TensorOf)) instead.
///
/// ```
/// use simpler::{callable, dsl::In, dsl::Out};
///
/// #[callable(sub)]
/// fn sum(x: In<f32>, mut total: Out<f32>) {
///     total[0] = x.iter().sum();
/// }
/// assert_eq!(sum::NAME, "sum");
/// ```
pub struct In<'a, T: Element> {
    data: &'a [T],
    dims: Dims,
}

/// A write-only tensor parameter of a kernel or host function: dereferences to `&mut [T]`.
///
/// Do not rely on what it holds before you write it. In an orchestration callable the same
/// marker declares a writable tensor handle ([`TensorOf<T, ReadWrite>`](crate::dsl::TensorOf)).
///
/// ```
/// use simpler::{callable, dsl::Out};
///
/// #[callable(sub)]
/// fn iota(mut y: Out<u32>) {
///     for (i, v) in y.iter_mut().enumerate() {
///         *v = i as u32;
///     }
/// }
/// assert_eq!(iota::NAME, "iota");
/// ```
pub struct Out<'a, T: Element> {
    data: &'a mut [T],
    dims: Dims,
}

/// A read-write tensor parameter of a kernel or host function: arrives with the tensor's
/// current contents and dereferences to `&mut [T]`.
///
/// ```
/// use simpler::{callable, dsl::InOut};
///
/// #[callable(sub)]
/// fn double(mut x: InOut<f32>) {
///     for v in x.iter_mut() {
///         *v *= 2.0;
///     }
/// }
/// assert_eq!(double::NAME, "double");
/// ```
pub struct InOut<'a, T: Element> {
    data: &'a mut [T],
    dims: Dims,
}

impl<'a, T: Element> In<'a, T> {
    /// Wraps a slice (what the generated shim does with each `In` argument).
    ///
    /// ```
    /// let data = [1.0f32, 2.0];
    /// let x = simpler::dsl::In::new(&data);
    /// assert_eq!(x.len(), 2);
    /// ```
    pub fn new(data: &'a [T]) -> In<'a, T> {
        In { dims: Dims::flat(data.len()), data }
    }

    /// The elements of a tensor `view` (what the generated shim makes).
    pub(crate) fn of_view(data: &'a [T], view: &TensorView) -> In<'a, T> {
        In { data, dims: Dims::of(view) }
    }

    /// The tensor's shape, outermost dimension first (`[len]` for a slice wrapped by
    /// [`new`](Self::new)).
    ///
    /// ```
    /// use simpler::{callable, dsl::In, dsl::Out};
    ///
    /// /// Sums each row of a 2-D tensor.
    /// #[callable(sub)]
    /// fn row_sums(m: In<f32>, mut sums: Out<f32>) {
    ///     let cols = m.shape()[1] as usize;
    ///     for (r, s) in sums.iter_mut().enumerate() {
    ///         *s = m[r * cols..(r + 1) * cols].iter().sum();
    ///     }
    /// }
    /// assert_eq!(In::new(&[1.0f32, 2.0]).shape(), [2]);
    /// ```
    pub fn shape(&self) -> &[u32] {
        self.dims.get()
    }

    /// The elements, for as long as the call lasts.
    ///
    /// ```
    /// let data = [3u8; 4];
    /// assert_eq!(simpler::dsl::In::new(&data).as_slice(), &[3, 3, 3, 3]);
    /// ```
    pub fn as_slice(&self) -> &'a [T] {
        self.data
    }
}

impl<'a, T: Element> Out<'a, T> {
    /// Wraps a mutable slice (what the generated shim does with each `Out` argument).
    ///
    /// ```
    /// let mut data = [0u64; 3];
    /// let mut y = simpler::dsl::Out::new(&mut data);
    /// y.fill(7);
    /// assert_eq!(data, [7, 7, 7]);
    /// ```
    pub fn new(data: &'a mut [T]) -> Out<'a, T> {
        Out { dims: Dims::flat(data.len()), data }
    }

    /// The elements of a tensor `view` (what the generated shim makes).
    pub(crate) fn of_view(data: &'a mut [T], view: &TensorView) -> Out<'a, T> {
        Out { data, dims: Dims::of(view) }
    }

    /// The tensor's shape, outermost dimension first (`[len]` for a slice wrapped by
    /// [`new`](Self::new)).
    ///
    /// ```
    /// let mut data = [0u8; 6];
    /// assert_eq!(simpler::dsl::Out::new(&mut data).shape(), [6]);
    /// ```
    pub fn shape(&self) -> &[u32] {
        self.dims.get()
    }
}

impl<'a, T: Element> InOut<'a, T> {
    /// Wraps a mutable slice (what the generated shim does with each `InOut` argument).
    ///
    /// ```
    /// let mut data = [1i32, 2];
    /// let mut x = simpler::dsl::InOut::new(&mut data);
    /// x[1] += 40;
    /// assert_eq!(data, [1, 42]);
    /// ```
    pub fn new(data: &'a mut [T]) -> InOut<'a, T> {
        InOut { dims: Dims::flat(data.len()), data }
    }

    /// The elements of a tensor `view` (what the generated shim makes).
    pub(crate) fn of_view(data: &'a mut [T], view: &TensorView) -> InOut<'a, T> {
        InOut { data, dims: Dims::of(view) }
    }

    /// The tensor's shape, outermost dimension first (`[len]` for a slice wrapped by
    /// [`new`](Self::new)).
    ///
    /// ```
    /// let mut data = [0u8; 6];
    /// assert_eq!(simpler::dsl::InOut::new(&mut data).shape(), [6]);
    /// ```
    pub fn shape(&self) -> &[u32] {
        self.dims.get()
    }
}

impl<T: Element> Deref for In<'_, T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        self.data
    }
}

impl<T: Element> Deref for Out<'_, T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        self.data
    }
}

impl<T: Element> DerefMut for Out<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.data
    }
}

impl<T: Element> Deref for InOut<'_, T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        self.data
    }
}

impl<T: Element> DerefMut for InOut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.data
    }
}

impl<T: Element + fmt::Debug> fmt::Debug for In<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("In").field(&self.data).finish()
    }
}

impl<T: Element + fmt::Debug> fmt::Debug for Out<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Out").field(&self.data).finish()
    }
}

impl<T: Element + fmt::Debug> fmt::Debug for InOut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("InOut").field(&self.data).finish()
    }
}
