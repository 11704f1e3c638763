//! What a `#[callable]` kernel or host function receives for its tensor parameters: `In<T>`
//! (a read-only slice), `Out<T>` and `InOut<T>` (mutable slices).

use std::fmt;
use std::ops::{Deref, DerefMut};

use crate::data::dtype::Element;

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
        In { data }
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
        Out { data }
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
        InOut { data }
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
