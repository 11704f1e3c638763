//! # simpler
//!
//! Orchestrate task graphs on a hierarchy of accelerator workers, in Rust: declare what each
//! function reads and writes, write the orchestration as a graph, and `simpler` infers the
//! dependencies and runs the tasks on worker processes, simulated or real (OpenCL) chips,
//! nested Workers and remote nodes. The tutorial is the book in the repository's `book/`
//! directory (every chapter is also a doctest of this crate, under `book`). The package is
//! `simpler-rt`; the library is imported as `simpler`.
//!
//! `#[callable]` turns a function into a callable whose signature declares how it uses each
//! tensor (`In<T>`, `Out<T>`, `InOut<T>`); [`task_graph!`] writes an orchestration function
//! as a graph of such calls, checked by the compiler (a tensor read before it is written, a
//! write to an input, a chip kernel placed on a SUB worker... are compile errors):
//!
//! ```no_run
//! use simpler::prelude::*;
//!
//! #[callable(sub)]
//! fn double(x: In<f32>, mut y: Out<f32>) {
//!     for (o, i) in y.iter_mut().zip(x.iter()) {
//!         *o = 2.0 * i;
//!     }
//! }
//!
//! task_graph! {
//!     /// `y = 4x`, through an intermediate the runtime allocates and frees.
//!     fn quadruple(x: In<f32>, y: Out<f32>) {
//!         let t = alloc::<f32>([16]);
//!         double(x, &mut t).on(sub());
//!         double(t, &mut y).on(sub());
//!     }
//! }
//!
//! # fn main() -> simpler::Result<()> {
//! let mut worker = Worker::builder().sub_workers(2).build()?;
//! worker.init()?; // registers every #[callable] of the binary, starts the SUB workers
//! let (a, b) = (worker.create_buffer(64)?, worker.create_buffer(64)?);
//! a.write(0, &[1.0f32; 16])?;
//! let (x, mut y) = (a.typed::<f32>(&[16])?, b.typed::<f32>(&[16])?);
//! quadruple::call(&x, &mut y)?.run(&worker)?;
//! assert_eq!(b.read::<f32>(0, 16)?, vec![4.0; 16]);
//! worker.close()
//! # }
//! ```
//!
//! A [`Worker`] runs one level of the hierarchy. Its engine has three parts:
//!
//! * the **Orchestrator** ([`Orchestrator`]), which turns `submit_*` calls made by an
//!   orchestration function into a DAG, inferring dependencies from each tensor's [`Tag`];
//! * the **Scheduler**, which dispatches ready tasks and processes completions (a role taken by
//!   whichever thread waits on a run, or by a background thread when nobody waits);
//! * the **lanes** to its workers, which drive child processes through shared-memory
//!   mailboxes.
//!
//! The API comes in three tiers: the crate root, with what every program names ([`Worker`],
//! [`Orchestrator`], [`Buffer`], [`Tensor`], [`TaskArgs`], [`HostFn`], [`Error`], the
//! [`callable`](macro@callable) attribute and [`task_graph!`], ...); topic modules ([`dsl`]:
//! typed tensors, placements, graphs and index launches; [`chip`]: chip callables, backends and
//! [`CallConfig`](chip::CallConfig); [`callable`](mod@callable): digests, kinds and namespaces;
//! [`memory`], [`trace`], [`remote`], [`status`]); and [`prelude`], what the examples import
//! (without [`Result`] and [`Error`]).
//!
//! ## Feature flags
//!
//! * `opencl`: chips on an OpenCL device (`chip::OpenClChip`): kernels in OpenCL C, compiled
//!   at registration. Needs an OpenCL ICD at run time (a GPU driver's, or PoCL's on a CPU).
//! * `bench-support`: internals the benchmarks drive (`simpler::bench_support`); not an API.
//! * `fuzz`: the decoders of bytes another process wrote, for the fuzz harness; not an API.
//!
//! A program with the plain API, which the DSL lowers to:
//!
//! ```no_run
//! use simpler::{DataType, HostArgs, HostFn, HostResult, TaskArgs, Worker};
//!
//! fn double(args: &HostArgs<'_>) -> HostResult {
//!     let x: Vec<f32> = args.input::<f32>(0)?.to_vec();
//!     let y = args.output::<f32>(1)?;
//!     for (o, i) in y.iter_mut().zip(x) {
//!         *o = 2.0 * i;
//!     }
//!     Ok(())
//! }
//!
//! # fn main() -> simpler::Result<()> {
//! let mut worker = Worker::builder().sub_workers(2).build()?;
//! let double = worker.register(HostFn::new("double", double))?;
//! worker.init()?;
//! let x = worker.create_buffer(4 * 16)?;
//! let y = worker.create_buffer(4 * 16)?;
//! x.write(0, &[1.0f32; 16])?;
//! let (tx, ty) = (x.tensor(&[16], DataType::Float32)?, y.tensor(&[16], DataType::Float32)?);
//! worker.run(|orch| {
//!     let mut args = TaskArgs::new();
//!     args.input(&tx)?.output(&ty)?;
//!     orch.submit_sub(&double, args)?;
//!     Ok(())
//! })?;
//! assert_eq!(y.read::<f32>(0, 16)?, vec![2.0; 16]);
//! worker.close()?;
//! # Ok(()) }
//! ```

#[cfg(feature = "fuzz")]
#[doc(hidden)]
#[path = "fuzz.rs"]
pub mod __fuzz;
#[cfg(feature = "bench-support")]
#[doc(hidden)]
pub mod bench_support;
#[cfg(doctest)]
mod book;
pub mod callable;
pub mod chip;
mod data;
mod dfx;
pub mod dsl;
mod engine;
mod error;
mod ipc;
#[cfg(test)]
mod layering;
mod level;
pub(crate) mod net;
mod sys;
#[doc(hidden)]
pub mod test_support;
mod worker;

// The root: what every program names. The rest lives in the topic modules below and in
// `callable`, `chip` and `dsl`; `prelude` has what most programs import.
pub use callable::host::{HostFn, HostResult};
pub use callable::identity::CallableHandle;
pub use data::buffer::Buffer;
pub use data::dtype::DataType;
pub use data::host_args::HostArgs;
pub use data::task_args::{Dep, Tag, TaskArgs, TaskHandle};
pub use data::tensor::Tensor;
pub use engine::orch_fn::{OrchFn, OrchFnPtr};
pub use engine::orchestrator::{MAX_SCOPE_DEPTH, Orchestrator};
pub use engine::run::{RunFuture, RunHandle};
pub use error::{Error, ErrorKind, Result};
pub use worker::{RunOptions, StartMethod, SubmitFuture, Worker, WorkerBuilder};

/// What most programs import: `use simpler::prelude::*;`.
///
/// The Worker and its runs, buffers and tensors, task arguments and host functions, the two
/// macros and the typed DSL's tensors and placements. [`Result`] and
/// [`Error`] stay out, so they do not shadow the standard library's; name them
/// as `simpler::Result`.
///
/// ```
/// use simpler::prelude::*;
///
/// #[callable(sub)]
/// fn double(x: In<f32>, mut y: Out<f32>) {
///     for (o, i) in y.iter_mut().zip(x.iter()) {
///         *o = 2.0 * i;
///     }
/// }
///
/// # fn main() -> simpler::Result<()> {
/// let mut worker = Worker::builder().sub_workers(1).build()?;
/// worker.init()?;
/// let (a, b) = (worker.create_buffer(64)?, worker.create_buffer(64)?);
/// a.write(0, &[1.0f32; 16])?;
/// let (x, mut y) = (a.typed::<f32>(&[16])?, b.typed::<f32>(&[16])?);
/// worker.run(|orch| double::call(&x, &mut y)?.on(orch, sub()).map(|_| ()))?;
/// assert_eq!(b.read::<f32>(0, 16)?, vec![2.0; 16]);
/// worker.close()
/// # }
/// ```
pub mod prelude {
    pub use crate::dsl::{In, InOut, Out, TensorOf, chip, sub, worker};
    pub use crate::{
        Buffer, CallableHandle, DataType, HostArgs, HostFn, HostResult, Orchestrator, RunHandle, RunOptions,
        TaskArgs, Tensor, Worker, callable, task_graph,
    };
}

/// Where tensors live: buffer descriptors and identities, views, element types, and the
/// clean-up of shared memory left by crashed processes of earlier versions.
///
/// ```
/// use simpler::memory::{Access, TensorView};
/// use simpler::DataType;
///
/// let view = TensorView::new(0, &[4, 4], None, DataType::Float32)?;
/// assert_eq!(view.extent_bytes(), 64);
/// assert!(Access::ReadWrite.allows(Access::Read));
/// # Ok::<(), simpler::Error>(())
/// ```
pub mod memory {
    pub use crate::data::buffer::{Access, BufferDesc, Identity};
    pub use crate::data::dtype::Element;
    pub use crate::data::tensor::{MAX_TENSOR_DIMS, TensorView};
    pub use crate::sys::shm::{SweepReport, sweep_stale_buffers};
}

/// What a run did: its DAG (`RunOptions::capture_dag`) and its timeline (`RunHandle::timeline`),
/// exportable as Chrome traces, SVG and DOT.
///
/// ```no_run
/// use simpler::trace::Timeline;
///
/// fn write_trace(timeline: &Timeline) -> std::io::Result<()> {
///     std::fs::write("run.json", timeline.to_chrome_trace())
/// }
/// ```
pub mod trace {
    pub use crate::dfx::graph::{EdgeReason, RunDag, TaskNode};
    pub use crate::dfx::timeline::{TaskRecord, TaskStatus, Timeline};
}

/// Workers on other hosts: remote L3 Workers reached over an authenticated, framed protocol,
/// and jobs started by a launcher (`mpirun`, `srun`).
///
/// ```no_run
/// use simpler::remote::{ClusterKey, NodeAddr};
///
/// let key = ClusterKey::from_env()?;
/// let root: NodeAddr = "10.0.0.1:7000".parse()?;
/// # let _ = (key, root);
/// # Ok::<(), simpler::Error>(())
/// ```
pub mod remote {
    pub use crate::net::{ClusterKey, NodeAddr};
    pub use crate::worker::{BoundNode, Launch, Node, RemoteWorker, SessionLimits};
}

/// How a Worker and its runs are doing: its level, its workers' states, a run's progress and
/// statistics.
///
/// ```no_run
/// use simpler::status::{Level, WorkerState};
/// use simpler::Worker;
///
/// # fn main() -> simpler::Result<()> {
/// let mut worker = Worker::builder().sub_workers(2).build()?;
/// worker.init()?;
/// assert_eq!(worker.level(), Level::Node);
/// assert!(worker.workers().iter().all(|w| w.state == WorkerState::Alive));
/// # Ok(()) }
/// ```
pub mod status {
    pub use crate::engine::run::{RunProgress, RunStats};
    pub use crate::level::Level;
    pub use crate::worker::{WorkerKind, WorkerState, WorkerStatus};
}

/// Turns a function into a callable: `#[callable(chip)]` (a kernel, or a chip orchestration
/// when its first parameter is `&mut Orchestrator<'_>`), `#[callable(sub)]` (a host function
/// run by a SUB worker) or `#[callable(orch)]` (an orchestration function a parent dispatches
/// to a nested Worker).
///
/// Tensor parameters are `In<T>` (read), `Out<T>` (written) and `InOut<T>` (read and written);
/// other parameters are scalars (u8..u64, i8..i64, usize, isize, f32, f64, bool). In a kernel
/// or host function, `In<T>` dereferences to `&[T]` and `Out<T>` / `InOut<T>` to `&mut [T]`;
/// in an orchestration they arrive as typed handles ([`TensorOf<T, ReadOnly>`](crate::dsl::TensorOf) and
/// `TensorOf<T, ReadWrite>`). The function may return `()` or a `Result<(), E>`.
///
/// Next to the function, the macro generates a twin of the same name (a type, so both live in
/// one scope) holding the canonical descriptor and its sha256 digest (computed at compile time
/// from the item's path, its signature and a hash of its tokens), the signature as `PARAMS`,
/// and a typed `call(...)` whose arguments are checked by rustc: the element type, `&t` for
/// `In` and `&mut t` of a writable tensor for `Out` / `InOut`, the number of arguments, and the
/// placement (`sub()`, `chip(N)`, `worker(N)`) against the kind. The tags come from the
/// signature and are never written by hand. The callable is recorded in a link-time registry:
/// every process of the binary finds it by digest, and every Worker registers the linked
/// callables it can run when it starts.
///
/// Options: one kind, and `crate = path` when `simpler` is renamed. Errors carry a code
/// `[S0NNN]` explained in the book's error chapter.
///
/// ```
/// use simpler::{callable, dsl::sub, dsl::In, dsl::Out, Worker};
///
/// #[callable(sub)]
/// fn scale(x: In<f32>, mut y: Out<f32>, k: f32) {
///     for (o, i) in y.iter_mut().zip(x.iter()) {
///         *o = k * i;
///     }
/// }
///
/// # fn main() -> simpler::Result<()> {
/// let mut worker = Worker::builder().sub_workers(1).build()?;
/// worker.init()?; // `scale` is registered with the Worker here
/// let (a, b) = (worker.create_buffer(64)?, worker.create_buffer(64)?);
/// a.write(0, &[2.0f32; 16])?;
/// let (x, mut y) = (a.typed::<f32>(&[16])?, b.typed::<f32>(&[16])?);
/// worker.run(|orch| scale::call(&x, &mut y, 1.5)?.on(orch, sub()).map(|_| ()))?;
/// assert_eq!(b.read::<f32>(0, 16)?, vec![3.0; 16]);
/// assert_eq!(scale::INFO.digest, scale::DIGEST);
/// worker.close()
/// # }
/// ```
///
/// A read-only tensor cannot be passed where the callable writes:
///
/// ```compile_fail
/// # use simpler::{callable, dsl::In, dsl::Out, dsl::TensorOf};
/// # #[callable(sub)] fn scale(x: In<f32>, mut y: Out<f32>, k: f32) { let _ = (x, y, k); }
/// # fn demo(x: &TensorOf<f32>, y: &TensorOf<f32>) -> simpler::Result<()> {
/// scale::call(x, y, 1.5)?; // error: `&TensorOf<f32>` cannot be passed to an `Out<f32>` parameter
/// # Ok(()) }
/// ```
///
/// Nor can a chip callable run on a SUB worker:
///
/// ```compile_fail
/// # use simpler::{callable, dsl::sub, dsl::In, dsl::Out, dsl::TensorOf};
/// # #[callable(chip)] fn copy(x: In<f32>, mut y: Out<f32>) { y.copy_from_slice(&x); }
/// # fn demo(o: &mut simpler::Orchestrator<'_>, x: &TensorOf<f32>, mut y: TensorOf<f32>) -> simpler::Result<()> {
/// copy::call(x, &mut y)?.on(o, sub())?; // error: a `ChipCallable` cannot be placed on `SubWorker`
/// # Ok(()) }
/// ```
pub use simpler_macros::callable;

/// Writes an orchestration function as a graph of calls, checked at compile time.
///
/// The body is Rust syntax: `let h = alloc::<T>([dims]);` allocates an intermediate,
/// `f(a, &mut h, n).on(chip(0));` calls a `#[callable]` (a bare name reads, `&mut name`
/// writes), `scope(|| { ... });` opens a scope, `group(|| { ... });` makes its call lines one
/// group task (one callable, all members start together), and scalar `let`s pass through. It
/// lowers to exactly the Orchestrator calls a hand-written orchestration makes, and generates
/// the same twin as `#[callable(orch)]` (`g::call(...)`, which can `run` it on a Worker or
/// place it on a nested Worker with `.on(o, worker(N))`) plus `g::graph()`, the graph's
/// structure as a [`TaskGraph`](crate::dsl::TaskGraph) (for a graph that tiles its tensors, `x.tiles([R, C])`, whose
/// task count is the run's: `g::graph_for(x_shape, ..)`, the structure for tensors of those
/// shapes).
///
/// Checked at compile time, each error spanned on the user's tokens: a read before any write
/// (`S0101`), a write to an `In` input (`S0102`), one tensor written twice (`S0103`) or read
/// and written (`S0104`) by one call, an `Out` never written (`S0106`), a value nothing reads
/// (`S0107`, an error since a proc macro cannot warn; a `_`-prefixed intermediate may stay
/// unread), group members that differ or collide (`S0108`), an unsupported statement
/// (`S0109`), an unknown or out-of-scope tensor (`S0110`), an `InOut` parameter given a tensor
/// with no value (`S0111`), an `Out` parameter overwriting a value nothing has read
/// (`S0112`), loop iterations that write the same bytes or name pieces a partition lacks
/// (`S0113`) or read what another iteration writes (`S0114`), and a loop bound, partition
/// count or tile shape not known at compile time (`S0115`). Types, modes and placements are
/// checked by rustc through the typed `call`.
///
/// **Loops and piece indices.** A loop `for i in 0..N` (`N` a literal or `const`) or
/// `for (i, t) in xs` names pieces of a partition at its index, `&mut ys[i]`, or at an index
/// affine in it with integer literal coefficients: `ys[2 * i]`, `ys[2 * i + 1]`, `ys[i + 1]`,
/// `ys[i - 1]`. Affine indices are checked like plain ones: the writes of different iterations
/// must be different pieces (`2 * i` beside `2 * i + 1` is an index launch; `i` beside
/// `i + 1` is refused), and every piece a range loop names must exist, at compile time for a
/// `split` or `grid` count (`for i in 0..4` over `ys[2 * i + 1]` of `y.split(7)` is refused),
/// before anything is submitted for `tiles`:
///
/// ```
/// use simpler::{callable, task_graph, dsl::In, dsl::Out};
///
/// #[callable(sub)]
/// fn copy(a: In<f32>, mut b: Out<f32>) {
///     b.copy_from_slice(&a);
/// }
///
/// task_graph! {
///     /// Each piece of `x` into two pieces of `y`, side by side: eight parallel tasks.
///     fn twice(x: In<f32>, y: Out<f32>) {
///         let xs = x.split(4);
///         let ys = y.split(8);
///         for i in 0..4 {
///             copy(xs[i], &mut ys[2 * i]).on(sub());
///             copy(xs[i], &mut ys[2 * i + 1]).on(sub());
///         }
///     }
/// }
///
/// assert_eq!(twice::graph().graph().edge_count(), 0);
/// ```
///
/// **Ordering.** The engine orders read-after-write, write-after-write and write-after-read
/// from the tags of every call (a call that writes a tensor waits for every task that read its
/// previous value), so the graph's calls never see aliased slices; `graph()` shows each edge
/// with its reason.
///
/// ```
/// use simpler::{callable, task_graph, dsl::In, dsl::InOut, dsl::Out, Worker};
///
/// #[callable(sub)]
/// fn add(a: In<f32>, b: In<f32>, mut out: Out<f32>) {
///     for i in 0..out.len() {
///         out[i] = a[i] + b[i];
///     }
/// }
///
/// #[callable(sub)]
/// fn inc(mut x: InOut<f32>) {
///     x.iter_mut().for_each(|v| *v += 1.0);
/// }
///
/// task_graph! {
///     /// `y = (a + b) + (b + a) + 1`
///     fn diamond(a: In<f32>, b: In<f32>, y: Out<f32>, n: u32) {
///         let t1 = alloc::<f32>([n]);
///         let t2 = alloc::<f32>([n]);
///         add(a, b, &mut t1).on(sub());
///         add(b, a, &mut t2).on(sub());
///         add(t1, t2, &mut y).on(sub());
///         inc(&mut y).on(sub());
///     }
/// }
///
/// # fn main() -> simpler::Result<()> {
/// let mut worker = Worker::builder().sub_workers(2).build()?;
/// worker.init()?;
/// let bufs: Vec<_> = (0..3).map(|_| worker.create_buffer(64)).collect::<simpler::Result<_>>()?;
/// bufs[0].write(0, &[1.0f32; 16])?;
/// bufs[1].write(0, &[2.0f32; 16])?;
/// let (a, b) = (bufs[0].typed::<f32>(&[16])?, bufs[1].typed::<f32>(&[16])?);
/// let mut y = bufs[2].typed::<f32>(&[16])?;
/// let run = diamond::call(&a, &b, &mut y, 16)?.submit_with(&worker, simpler::RunOptions::new().capture_dag())?;
/// run.wait()?;
/// assert_eq!(bufs[2].read::<f32>(0, 16)?, vec![7.0; 16]);
/// assert!(diamond::graph().matches(&run.dag().unwrap())); // the same shape as the run
/// println!("{}", diamond::graph().to_dot());
/// worker.close()
/// # }
/// ```
///
/// Reading an intermediate before anything writes it does not compile:
///
/// ```compile_fail
/// # use simpler::{callable, task_graph, dsl::In, dsl::Out};
/// # #[callable(sub)] fn copy(a: In<f32>, mut b: Out<f32>) { b.copy_from_slice(&a); }
/// task_graph! {
///     fn broken(y: Out<f32>) {
///         let h = alloc::<f32>([16]);
///         copy(h, &mut y).on(sub()); // error: `h` is read here but no call has written it yet [S0101]
///     }
/// }
/// ```
pub use simpler_macros::task_graph;

/// What the code generated by `#[callable]` and `task_graph!` uses. Not a public API.
#[doc(hidden)]
pub use dsl::private as __private;

/// The README's code compiles as a doctest, so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
