//! Typed tensor handles and the argument traits of the typed submit API.
//!
//! A [`TensorOf<T, A>`] is a [`Tensor`] whose element type `T` and access `A` (read-only or
//! read-write) are part of its type. The `call` / `submit` functions that `#[callable]`
//! generates take `impl InArg<T>` for `In<T>` parameters, `impl OutArg<T>` for `Out<T>` and
//! `impl InOutArg<T>` for `InOut<T>`: `&t` reads, `&mut t` writes, and only a read-write
//! handle can be borrowed mutably as an argument. The traits are sealed and say what went wrong
//! in the user's terms when an argument does not fit.

use std::fmt;
use std::marker::PhantomData;

use crate::data::buffer::Buffer;
use crate::data::dtype::Element;
use crate::data::tensor::Tensor;
use crate::engine::orchestrator::Orchestrator;
use crate::error::{Error, Result};

mod sealed {
    pub trait Mode {}
    pub trait Arg {}
    pub trait Scalar {}
}

/// The access a [`TensorOf`] holder has; implemented by [`ReadOnly`] and [`ReadWrite`].
///
/// ```
/// use simpler::{dsl::Mode, dsl::ReadOnly, dsl::ReadWrite};
/// assert!(!ReadOnly::WRITABLE && ReadWrite::WRITABLE);
/// ```
pub trait Mode: sealed::Mode + 'static {
    /// Whether holders may pass the tensor to `Out` / `InOut` parameters.
    const WRITABLE: bool;
}

/// The holder may only read the tensor (pass it to `In` parameters).
///
/// ```
/// # fn demo(t: &simpler::dsl::TensorOf<f32>) {
/// let r: simpler::dsl::TensorOf<f32, simpler::dsl::ReadOnly> = t.read_only();
/// # let _ = r; }
/// ```
#[derive(Debug)]
pub enum ReadOnly {}

/// The holder may read and write the tensor (the default of [`TensorOf`]).
///
/// ```
/// use simpler::{dsl::Mode, dsl::ReadWrite};
/// assert!(ReadWrite::WRITABLE);
/// ```
#[derive(Debug)]
pub enum ReadWrite {}

impl sealed::Mode for ReadOnly {}
impl sealed::Mode for ReadWrite {}
impl Mode for ReadOnly {
    const WRITABLE: bool = false;
}
impl Mode for ReadWrite {
    const WRITABLE: bool = true;
}

/// A tensor whose element type `T` and access `A` are known at compile time.
///
/// Make one from a buffer with [`Buffer::typed`], from a plain [`Tensor`] with
/// [`TensorOf::new`] (which checks the data type), or inside an orchestration with
/// [`Orchestrator::alloc_of`]. [`read_only`](TensorOf::read_only) gives a copy that can only be
/// read: passing it where a callable writes does not compile.
///
/// ```
/// use simpler::{DataType, status::Level, dsl::ReadOnly, dsl::TensorOf, Worker};
///
/// let mut worker = Worker::builder().level(Level::Chip).build()?; // a chip: nothing is started
/// worker.init()?;
/// let buf = worker.create_buffer(64)?;
/// let t: TensorOf<f32> = buf.typed(&[16])?;
/// assert_eq!(t.tensor().view().dtype(), DataType::Float32);
/// let r: TensorOf<f32, ReadOnly> = t.read_only();
/// assert_eq!(r.shape(), &[16]);
/// assert!(TensorOf::<i32>::new(t.tensor().clone()).is_err()); // wrong element type
/// # Ok::<(), simpler::Error>(())
/// ```
pub struct TensorOf<T: Element, A: Mode = ReadWrite> {
    tensor: Tensor,
    _marker: PhantomData<(fn() -> T, A)>,
}

impl<T: Element, A: Mode> TensorOf<T, A> {
    /// Types a tensor; its data type must be `T`'s.
    ///
    /// # Errors
    ///
    /// An [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error naming both
    /// types when they differ.
    ///
    /// ```
    /// # let mut worker = simpler::Worker::builder().level(simpler::status::Level::Chip).build()?;
    /// # worker.init()?;
    /// # let buf = worker.create_buffer(64)?;
    /// use simpler::{DataType, dsl::TensorOf};
    /// let plain = buf.tensor(&[16], DataType::Int32)?;
    /// let typed = TensorOf::<i32>::new(plain.clone())?;
    /// assert_eq!(typed.tensor().view().shape(), &[16]);
    /// let err = TensorOf::<f32>::new(plain).unwrap_err();
    /// assert!(err.to_string().contains("of i32 elements"), "{err}");
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn new(tensor: Tensor) -> Result<TensorOf<T, A>> {
        let dtype = tensor.view().dtype();
        if dtype != T::DTYPE {
            return Err(Error::invalid(format!(
                "a tensor of {} elements cannot be typed as TensorOf<{}>",
                dtype.name(),
                std::any::type_name::<T>()
            )));
        }
        Ok(TensorOf { tensor, _marker: PhantomData })
    }

    /// The untyped tensor (for the plain API).
    ///
    /// ```
    /// # let mut worker = simpler::Worker::builder().level(simpler::status::Level::Chip).build()?;
    /// # worker.init()?;
    /// # let buf = worker.create_buffer(64)?;
    /// let t = buf.typed::<u64>(&[8])?;
    /// let mut args = simpler::TaskArgs::new();
    /// args.input(t.tensor())?;
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// The shape of its view.
    ///
    /// ```
    /// # let mut worker = simpler::Worker::builder().level(simpler::status::Level::Chip).build()?;
    /// # worker.init()?;
    /// # let buf = worker.create_buffer(64)?;
    /// assert_eq!(buf.typed::<f32>(&[4, 4])?.shape(), &[4, 4]);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn shape(&self) -> &[u32] {
        self.tensor.view().shape()
    }

    /// A read-only handle to the same tensor.
    ///
    /// ```
    /// # let mut worker = simpler::Worker::builder().level(simpler::status::Level::Chip).build()?;
    /// # worker.init()?;
    /// # let buf = worker.create_buffer(64)?;
    /// let t = buf.typed::<f32>(&[16])?;
    /// let r = t.read_only();
    /// assert_eq!(r.tensor().desc().identity(), t.tensor().desc().identity());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn read_only(&self) -> TensorOf<T, ReadOnly> {
        TensorOf { tensor: self.tensor.clone(), _marker: PhantomData }
    }
}

/// Partitions of a typed tensor: the pieces keep the element type `T` and the access `A` (a
/// piece of a writable tensor is writable, one of a read-only tensor read-only), and their
/// offsets count in elements of this tensor. They are [`Tensor`]'s partitions, typed; the
/// errors are the same.
impl<T: Element, A: Mode> TensorOf<T, A> {
    fn typed_like(tensor: Tensor) -> TensorOf<T, A> {
        TensorOf { tensor, _marker: PhantomData }
    }

    /// The rows `range` (axis 0). See [`Tensor::rows`].
    ///
    /// # Errors
    ///
    /// An empty range or one past the last row.
    ///
    /// ```
    /// # let buf = simpler::__private::doc_buffer(4 * 12)?;
    /// let m = buf.typed::<f32>(&[4, 3])?;
    /// assert_eq!(m.rows(2..4)?.shape(), &[2, 3]);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn rows(&self, range: std::ops::Range<u32>) -> Result<TensorOf<T, A>> {
        self.tensor.rows(range).map(Self::typed_like)
    }

    /// The part whose index along `axis` is in `range`. See [`Tensor::slice`].
    ///
    /// # Errors
    ///
    /// An axis the tensor does not have, or an empty or out-of-range `range`.
    ///
    /// ```
    /// # let buf = simpler::__private::doc_buffer(4 * 12)?;
    /// let m = buf.typed::<f32>(&[4, 3])?.read_only();
    /// let col: simpler::dsl::TensorOf<f32, simpler::dsl::ReadOnly> = m.slice(1, 0..1)?;
    /// assert_eq!(col.shape(), &[4, 1]);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn slice(&self, axis: usize, range: std::ops::Range<u32>) -> Result<TensorOf<T, A>> {
        self.tensor.slice(axis, range).map(Self::typed_like)
    }

    /// `n` equal pieces along axis 0. See [`Tensor::split`].
    ///
    /// # Errors
    ///
    /// `n` is 0 or does not divide the number of rows.
    ///
    /// ```
    /// # let buf = simpler::__private::doc_buffer(4 * 64)?;
    /// let x = buf.typed::<f32>(&[64])?;
    /// let pieces = x.split(4)?;
    /// assert!(pieces.iter().all(|p| p.shape() == [16]));
    /// assert!(x.split(5).is_err()); // 64 rows do not split into 5 equal pieces
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn split(&self, n: u32) -> Result<Vec<TensorOf<T, A>>> {
        Ok(self.tensor.split(n)?.into_iter().map(Self::typed_like).collect())
    }

    /// Pieces of shape `tile`, in row-major grid order. See [`Tensor::tiles`].
    ///
    /// # Errors
    ///
    /// A tile of another rank, or a tile dimension that does not divide the tensor's.
    ///
    /// ```
    /// # let buf = simpler::__private::doc_buffer(4 * 64)?;
    /// let m = buf.typed::<f32>(&[8, 8])?;
    /// assert_eq!(m.tiles(&[4, 4])?.len(), 4);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn tiles(&self, tile: &[u32]) -> Result<Vec<TensorOf<T, A>>> {
        Ok(self.tensor.tiles(tile)?.into_iter().map(Self::typed_like).collect())
    }

    /// `counts[axis]` equal pieces along each axis, in row-major grid order. See
    /// [`Tensor::grid`].
    ///
    /// # Errors
    ///
    /// A grid of another rank, or a count that does not divide its axis.
    ///
    /// ```
    /// # let buf = simpler::__private::doc_buffer(4 * 64)?;
    /// let m = buf.typed::<f32>(&[8, 8])?;
    /// let g = m.grid(&[2, 4])?;
    /// assert_eq!((g.len(), g[0].shape()), (8, &[4u32, 2][..]));
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn grid(&self, counts: &[u32]) -> Result<Vec<TensorOf<T, A>>> {
        Ok(self.tensor.grid(counts)?.into_iter().map(Self::typed_like).collect())
    }
}

impl<T: Element> TensorOf<T, ReadWrite> {
    /// A second writable handle to the same tensor (a `TensorOf` is not `Clone`, so that two
    /// writable handles to one tensor are always made on purpose).
    ///
    /// ```
    /// # let mut worker = simpler::Worker::builder().level(simpler::status::Level::Chip).build()?;
    /// # worker.init()?;
    /// # let buf = worker.create_buffer(64)?;
    /// let t = buf.typed::<f32>(&[16])?;
    /// let again = t.share();
    /// assert_eq!(again.shape(), t.shape());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn share(&self) -> TensorOf<T, ReadWrite> {
        TensorOf { tensor: self.tensor.clone(), _marker: PhantomData }
    }
}

impl<T: Element, A: Mode> fmt::Debug for TensorOf<T, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorOf")
            .field("element", &std::any::type_name::<T>())
            .field("writable", &A::WRITABLE)
            .field("tensor", &self.tensor)
            .finish()
    }
}

impl Buffer {
    /// A typed, writable tensor over the whole-buffer prefix with `shape` and `T`'s data type.
    ///
    /// # Errors
    ///
    /// As [`Buffer::tensor`]: a shape that does not fit in the buffer.
    ///
    /// ```
    /// # let mut worker = simpler::Worker::builder().level(simpler::status::Level::Chip).build()?;
    /// # worker.init()?;
    /// let buf = worker.create_buffer(4 * 32)?;
    /// let t = buf.typed::<f32>(&[32])?;
    /// assert_eq!(t.shape(), &[32]);
    /// assert!(buf.typed::<f32>(&[33]).is_err());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn typed<T: Element>(&self, shape: &[u32]) -> Result<TensorOf<T>> {
        TensorOf::new(self.tensor(shape, T::DTYPE)?)
    }
}

impl Orchestrator<'_> {
    /// [`alloc`](Orchestrator::alloc) with the element type in the type: an intermediate that
    /// lives until the run (or its scope) no longer needs it.
    ///
    /// # Errors
    ///
    /// As [`alloc`](Orchestrator::alloc).
    ///
    /// ```no_run
    /// # fn demo(worker: &simpler::Worker) -> simpler::Result<()> {
    /// use simpler::TaskArgs;
    /// worker.run(|orch| {
    /// let tmp = orch.alloc_of::<f32>(&[1024])?;
    /// assert_eq!(tmp.shape(), &[1024]);
    /// Ok(())
    /// })
    /// # }
    /// ```
    pub fn alloc_of<T: Element>(&mut self, shape: &[u32]) -> Result<TensorOf<T>> {
        TensorOf::new(self.alloc(shape, T::DTYPE)?)
    }

    /// [`alloc_of`](Self::alloc_of) for an intermediate that only kernels on chip `chip` use:
    /// in that chip's memory where the level has a device heap there (see
    /// [`Orchestrator::alloc_on`]). `task_graph!` uses it for an `alloc` whose every task runs
    /// on one constant chip, unless the graph cuts it into strided pieces (a `grid` with more
    /// than one piece along an inner axis): those stay in host memory, where a chip's copy-in
    /// packs each piece for its kernel (an OpenCL kernel refuses a strided view of device
    /// memory).
    ///
    /// ```no_run
    /// # fn demo(orch: &mut simpler::Orchestrator<'_>) -> simpler::Result<()> {
    /// let tmp = orch.alloc_of_on::<f32>(0, &[1024])?; // kernels on chip 0 only
    /// # let _ = tmp; Ok(())
    /// # }
    /// ```
    pub fn alloc_of_on<T: Element>(&mut self, chip: u32, shape: &[u32]) -> Result<TensorOf<T>> {
        TensorOf::new(self.alloc_on(chip, shape, T::DTYPE)?)
    }
}

/// An argument for an `In<T>` parameter: `&t` for any [`TensorOf<T, _>`].
///
/// ```
/// fn takes<A: simpler::dsl::InArg<f32>>(_: A) {}
/// # let mut worker = simpler::Worker::builder().level(simpler::status::Level::Chip).build()?;
/// # worker.init()?;
/// # let buf = worker.create_buffer(64)?;
/// let t = buf.typed::<f32>(&[16])?;
/// takes(&t);
/// takes(&t.read_only());
/// # Ok::<(), simpler::Error>(())
/// ```
///
/// A mutable borrow says "this call writes", which an `In` parameter does not:
///
/// ```compile_fail
/// fn takes<A: simpler::dsl::InArg<f32>>(_: A) {}
/// # fn demo(mut t: simpler::dsl::TensorOf<f32>) {
/// takes(&mut t);
/// # }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be passed to an `In<{T}>` parameter",
    label = "an `In<{T}>` parameter takes `&t` where `t` is a `TensorOf<{T}>`",
    note = "an `In` parameter only reads: pass the tensor as `&t`, not `&mut t`; its element type must be `{T}`"
)]
pub trait InArg<T: Element>: sealed::Arg {
    /// The tensor.
    ///
    /// ```
    /// use simpler::dsl::InArg;
    /// # let mut worker = simpler::Worker::builder().level(simpler::status::Level::Chip).build()?;
    /// # worker.init()?;
    /// # let buf = worker.create_buffer(64)?;
    /// let t = buf.typed::<f32>(&[16])?;
    /// assert_eq!(InArg::<f32>::tensor(&&t).view().shape(), &[16]);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn tensor(&self) -> &Tensor;
}

/// An argument for an `Out<T>` parameter: `&mut t` for a writable [`TensorOf<T>`].
///
/// ```
/// fn takes<A: simpler::dsl::OutArg<f32>>(_: A) {}
/// # let mut worker = simpler::Worker::builder().level(simpler::status::Level::Chip).build()?;
/// # worker.init()?;
/// # let buf = worker.create_buffer(64)?;
/// let mut t = buf.typed::<f32>(&[16])?;
/// takes(&mut t);
/// # Ok::<(), simpler::Error>(())
/// ```
///
/// A shared borrow or a read-only handle does not grant write access:
///
/// ```compile_fail
/// fn takes<A: simpler::dsl::OutArg<f32>>(_: A) {}
/// # fn demo(t: simpler::dsl::TensorOf<f32>) {
/// takes(&t);
/// # }
/// ```
///
/// ```compile_fail
/// fn takes<A: simpler::dsl::OutArg<f32>>(_: A) {}
/// # fn demo(t: simpler::dsl::TensorOf<f32>) {
/// takes(&mut t.read_only());
/// # }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be passed to an `Out<{T}>` parameter",
    label = "an `Out<{T}>` parameter writes: pass `&mut t` where `t` is a writable `TensorOf<{T}>`",
    note = "a read-only argument (`&t`, or a `TensorOf<_, ReadOnly>`) cannot be written; its element type must be `{T}`"
)]
pub trait OutArg<T: Element>: sealed::Arg {
    /// The tensor.
    ///
    /// ```
    /// use simpler::dsl::OutArg;
    /// # let mut worker = simpler::Worker::builder().level(simpler::status::Level::Chip).build()?;
    /// # worker.init()?;
    /// # let buf = worker.create_buffer(64)?;
    /// let mut t = buf.typed::<f32>(&[16])?;
    /// assert_eq!(OutArg::<f32>::tensor(&&mut t).view().shape(), &[16]);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn tensor(&self) -> &Tensor;
}

/// An argument for an `InOut<T>` parameter: `&mut t` for a writable [`TensorOf<T>`].
///
/// ```
/// fn takes<A: simpler::dsl::InOutArg<u8>>(_: A) {}
/// # let mut worker = simpler::Worker::builder().level(simpler::status::Level::Chip).build()?;
/// # worker.init()?;
/// # let buf = worker.create_buffer(64)?;
/// let mut t = buf.typed::<u8>(&[16])?;
/// takes(&mut t);
/// # Ok::<(), simpler::Error>(())
/// ```
///
/// ```compile_fail
/// fn takes<A: simpler::dsl::InOutArg<u8>>(_: A) {}
/// # fn demo(t: simpler::dsl::TensorOf<u8>) {
/// takes(&t);
/// # }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be passed to an `InOut<{T}>` parameter",
    label = "an `InOut<{T}>` parameter reads and writes: pass `&mut t` where `t` is a writable `TensorOf<{T}>`",
    note = "a read-only argument (`&t`, or a `TensorOf<_, ReadOnly>`) cannot be written; its element type must be `{T}`"
)]
pub trait InOutArg<T: Element>: sealed::Arg {
    /// The tensor.
    ///
    /// ```
    /// use simpler::dsl::InOutArg;
    /// # let mut worker = simpler::Worker::builder().level(simpler::status::Level::Chip).build()?;
    /// # worker.init()?;
    /// # let buf = worker.create_buffer(64)?;
    /// let mut t = buf.typed::<u8>(&[16])?;
    /// assert_eq!(InOutArg::<u8>::tensor(&&mut t).view().shape(), &[16]);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    fn tensor(&self) -> &Tensor;
}

impl<T: Element, A: Mode> sealed::Arg for &TensorOf<T, A> {}
impl<T: Element> sealed::Arg for &mut TensorOf<T, ReadWrite> {}

impl<T: Element, A: Mode> InArg<T> for &TensorOf<T, A> {
    fn tensor(&self) -> &Tensor {
        &self.tensor
    }
}

impl<T: Element> OutArg<T> for &mut TensorOf<T, ReadWrite> {
    fn tensor(&self) -> &Tensor {
        &self.tensor
    }
}

impl<T: Element> InOutArg<T> for &mut TensorOf<T, ReadWrite> {
    fn tensor(&self) -> &Tensor {
        &self.tensor
    }
}

/// A scalar parameter type of a `#[callable]`: carried as 64 bits in the task's scalars.
///
/// Integers are sign- or zero-extended, `f32` travels as its IEEE bits (as
/// [`TaskArgs::scalar_f32`](crate::TaskArgs::scalar_f32)), `f64` as its bits, `bool` as 0 or 1.
///
/// ```
/// use simpler::dsl::Scalar;
/// assert_eq!(<i32 as Scalar>::from_bits(Scalar::to_bits(-3i32)), -3i32);
/// assert_eq!(<f32 as Scalar>::from_bits(u64::from(1.5f32.to_bits())), 1.5);
/// assert_eq!(<bool as Scalar>::NAME, "bool");
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a scalar type a callable can take",
    label = "unsupported parameter type",
    note = "callable parameters are `In<T>`, `Out<T>`, `InOut<T>` tensors or the scalars u8..u64, i8..i64, usize, isize, f32, f64, bool"
)]
pub trait Scalar: sealed::Scalar + Copy + 'static {
    /// The type's name in callable descriptors.
    const NAME: &'static str;
    /// The 64-bit encoding.
    ///
    /// ```
    /// assert_eq!(simpler::dsl::Scalar::to_bits(true), 1);
    /// ```
    fn to_bits(self) -> u64;
    /// Decodes [`to_bits`](Scalar::to_bits).
    ///
    /// ```
    /// assert_eq!(<u16 as simpler::dsl::Scalar>::from_bits(7), 7u16);
    /// ```
    fn from_bits(bits: u64) -> Self;
}

macro_rules! int_scalar {
    ($($t:ty),*) => {$(
        impl sealed::Scalar for $t {}
        impl Scalar for $t {
            const NAME: &'static str = stringify!($t);
            #[allow(clippy::cast_sign_loss, clippy::cast_possible_wrap, trivial_numeric_casts)]
            fn to_bits(self) -> u64 {
                self as i128 as u64
            }
            #[allow(clippy::cast_possible_truncation, trivial_numeric_casts)]
            fn from_bits(bits: u64) -> Self {
                bits as $t
            }
        }
    )*};
}

int_scalar!(u8, u16, u32, u64, usize, i8, i16, i32, i64, isize);

impl sealed::Scalar for f32 {}
impl Scalar for f32 {
    const NAME: &'static str = "f32";
    fn to_bits(self) -> u64 {
        u64::from(f32::to_bits(self))
    }
    fn from_bits(bits: u64) -> Self {
        f32::from_bits(bits as u32)
    }
}

impl sealed::Scalar for f64 {}
impl Scalar for f64 {
    const NAME: &'static str = "f64";
    fn to_bits(self) -> u64 {
        f64::to_bits(self)
    }
    fn from_bits(bits: u64) -> Self {
        f64::from_bits(bits)
    }
}

impl sealed::Scalar for bool {}
impl Scalar for bool {
    const NAME: &'static str = "bool";
    fn to_bits(self) -> u64 {
        u64::from(self)
    }
    fn from_bits(bits: u64) -> Self {
        bits != 0
    }
}
