//! What a `#[callable]` kernel or host function receives for its tensor parameters: `In<T>`
//! (a read-only slice), `Out<T>` and `InOut<T>` (mutable slices), each with the tensor's shape,
//! its rows and 2-D indexing `x[(r, c)]`; and [`worker_index`], which core or SUB worker runs
//! the call.
//!
//! The elements are always contiguous, in row-major order of the shape: a strided piece (a
//! tile of a matrix, an inner-axis slice) arrives packed, by the chip's copy-in or the host
//! function's packed copy (`data::host_args`, rule H6), and its writes go back into the piece.

use std::fmt;
use std::ops::{
    Deref, DerefMut, Index, IndexMut, Range, RangeFrom, RangeFull, RangeInclusive, RangeTo, RangeToInclusive,
};

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

    /// Elements per row: the innermost dimension.
    fn cols(&self) -> usize {
        self.dims[usize::from(self.rank.max(1)) - 1] as usize
    }

    /// The flat index of element `(r, c)`; panics when `c` is past the row.
    #[track_caller]
    fn at(&self, (r, c): (usize, usize)) -> usize {
        let cols = self.cols();
        assert!(c < cols, "column {c} is past the {cols} columns of a {:?} tensor", self.get());
        r * cols + c
    }
}

/// The rows of `data` (an empty iterator for a tensor with no columns).
fn rows_of<T>(data: &[T], cols: usize) -> std::slice::ChunksExact<'_, T> {
    if cols == 0 { data[..0].chunks_exact(1) } else { data.chunks_exact(cols) }
}

/// The rows of `data`, mutable.
fn rows_of_mut<T>(data: &mut [T], cols: usize) -> std::slice::ChunksExactMut<'_, T> {
    if cols == 0 { data[..0].chunks_exact_mut(1) } else { data.chunks_exact_mut(cols) }
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
///     x[0] = 1.0; // error: cannot assign to data in an index of `In<'_, f32>`
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

    /// The rows: slices of the innermost dimension's length, in order (for a 3-D tensor, the
    /// rows of every matrix in turn). A tile of a matrix has its own rows, whatever the rows
    /// of the matrix it was cut from.
    ///
    /// ```
    /// use simpler::{callable, dsl::In, dsl::Out};
    ///
    /// /// Sums each row of a 2-D tile.
    /// #[callable(sub)]
    /// fn row_sums(m: In<f32>, mut sums: Out<f32>) {
    ///     for (s, row) in sums.iter_mut().zip(m.rows()) {
    ///         *s = row.iter().sum();
    ///     }
    /// }
    /// let x = In::new(&[1.0f32, 2.0, 3.0, 4.0]);
    /// assert_eq!(x.rows().count(), 1, "a slice wrapped by hand is one row");
    /// ```
    pub fn rows(&self) -> std::slice::ChunksExact<'a, T> {
        rows_of(self.data, self.dims.cols())
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

    /// The rows: slices of the innermost dimension's length, in order (see [`In::rows`]).
    ///
    /// ```
    /// use simpler::{callable, dsl::In, dsl::Out};
    ///
    /// /// Copies the first column of a tile into each of its rows' last element.
    /// #[callable(sub)]
    /// fn first_to_last(x: In<u32>, mut y: Out<u32>) {
    ///     for (r, row) in x.rows().enumerate() {
    ///         let last = y.shape()[1] as usize - 1;
    ///         y[(r, last)] = row[0];
    ///     }
    ///     assert_eq!(y.rows().count(), x.rows().count());
    /// }
    /// ```
    pub fn rows(&self) -> std::slice::ChunksExact<'_, T> {
        rows_of(self.data, self.dims.cols())
    }

    /// The rows, mutable (see [`In::rows`]).
    ///
    /// ```
    /// use simpler::{callable, dsl::Out};
    ///
    /// /// Numbers each row of a 2-D tile by its index: `y[(r, c)] = r`.
    /// #[callable(chip)]
    /// fn row_numbers(mut y: Out<u32>) {
    ///     for (r, row) in y.rows_mut().enumerate() {
    ///         row.fill(r as u32);
    ///     }
    /// }
    /// let mut data = [9u32; 4];
    /// simpler::dsl::Out::new(&mut data).rows_mut().for_each(|row| row[0] = 1);
    /// assert_eq!(data, [1, 9, 9, 9]);
    /// ```
    pub fn rows_mut(&mut self) -> std::slice::ChunksExactMut<'_, T> {
        let cols = self.dims.cols();
        rows_of_mut(self.data, cols)
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

    /// The rows: slices of the innermost dimension's length, in order (see [`In::rows`]).
    ///
    /// ```
    /// use simpler::{callable, dsl::In, dsl::InOut};
    ///
    /// /// Copies the first column of a tile into each of its rows' last element.
    /// #[callable(sub)]
    /// fn first_to_last(x: In<u32>, mut y: InOut<u32>) {
    ///     for (r, row) in x.rows().enumerate() {
    ///         let last = y.shape()[1] as usize - 1;
    ///         y[(r, last)] = row[0];
    ///     }
    ///     assert_eq!(y.rows().count(), x.rows().count());
    /// }
    /// ```
    pub fn rows(&self) -> std::slice::ChunksExact<'_, T> {
        rows_of(self.data, self.dims.cols())
    }

    /// The rows, mutable (see [`In::rows`]).
    ///
    /// ```
    /// use simpler::{callable, dsl::InOut};
    ///
    /// /// Numbers each row of a 2-D tile by its index: `y[(r, c)] = r`.
    /// #[callable(chip)]
    /// fn row_numbers(mut y: InOut<u32>) {
    ///     for (r, row) in y.rows_mut().enumerate() {
    ///         row.fill(r as u32);
    ///     }
    /// }
    /// let mut data = [9u32; 4];
    /// simpler::dsl::InOut::new(&mut data).rows_mut().for_each(|row| row[0] = 1);
    /// assert_eq!(data, [1, 9, 9, 9]);
    /// ```
    pub fn rows_mut(&mut self) -> std::slice::ChunksExactMut<'_, T> {
        let cols = self.dims.cols();
        rows_of_mut(self.data, cols)
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

/// `x[i]`, `x[a..b]` and the other slice indices, as on the slice the parameter dereferences
/// to (`Index` on the parameter itself would otherwise hide them).
macro_rules! slice_indices {
    ($m:ident, $ty:ident) => {
        $m!($ty: usize, Range<usize>, RangeFrom<usize>, RangeTo<usize>, RangeFull, RangeInclusive<usize>,
            RangeToInclusive<usize>);
    };
}

macro_rules! index {
    ($ty:ident: $($i:ty),*) => {
        $(
            impl<T: Element> Index<$i> for $ty<'_, T> {
                type Output = <[T] as Index<$i>>::Output;

                #[track_caller]
                fn index(&self, i: $i) -> &Self::Output {
                    &self.data[i]
                }
            }
        )*
    };
}

macro_rules! index_mut {
    ($ty:ident: $($i:ty),*) => {
        $(
            impl<T: Element> IndexMut<$i> for $ty<'_, T> {
                #[track_caller]
                fn index_mut(&mut self, i: $i) -> &mut Self::Output {
                    &mut self.data[i]
                }
            }
        )*
    };
}

/// `x[(r, c)]`: the element in row `r`, column `c` (rows as [`In::rows`] gives them). A column
/// past the row panics, as an index past a slice's end does.
macro_rules! index_2d {
    ($ty:ident) => {
        impl<T: Element> Index<(usize, usize)> for $ty<'_, T> {
            type Output = T;

            #[track_caller]
            fn index(&self, rc: (usize, usize)) -> &T {
                &self.data[self.dims.at(rc)]
            }
        }
    };
}

macro_rules! index_2d_mut {
    ($ty:ident) => {
        impl<T: Element> IndexMut<(usize, usize)> for $ty<'_, T> {
            #[track_caller]
            fn index_mut(&mut self, rc: (usize, usize)) -> &mut T {
                let i = self.dims.at(rc);
                &mut self.data[i]
            }
        }
    };
}

slice_indices!(index, In);
slice_indices!(index, Out);
slice_indices!(index, InOut);
slice_indices!(index_mut, Out);
slice_indices!(index_mut, InOut);
index_2d!(In);
index_2d!(Out);
index_2d!(InOut);
index_2d_mut!(Out);
index_2d_mut!(InOut);

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
