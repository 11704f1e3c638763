//! The typed layer under `#[callable]` and `task_graph!`.
//!
//! * what a kernel or host function receives: [`In<T>`](In), [`Out<T>`](Out),
//!   [`InOut<T>`](InOut) (files `view.rs`);
//! * typed tensor handles ([`TensorOf`]) and the argument traits ([`InArg`], [`OutArg`],
//!   [`InOutArg`], [`Scalar`]) that make rustc check every argument of a typed call
//!   (`typed.rs`);
//! * placements ([`sub`], [`chip`], [`worker`]) checked against the callable's [`kind`], and the
//!   typed [`Call`] (`place.rs`);
//! * the static structure of a `task_graph!`: [`TaskGraph`] (`graph.rs`);
//! * index launches whose bound is known only at run time, checked for overlap:
//!   [`IndexLaunch`] (`launch.rs`).
//!
//! The link-time registry the macros add to is callable identity: `callable::linked`.
//!
//! ```
//! use simpler::dsl::{TensorOf, sub};
//! # let _ = sub();
//! # fn f(_: &TensorOf<f32>) {}
//! ```

pub(crate) mod graph;
pub(crate) mod launch;
pub(crate) mod place;
#[doc(hidden)]
pub mod private;
pub(crate) mod typed;
pub(crate) mod view;

pub use graph::{GraphEdge, TaskGraph};
pub use launch::IndexLaunch;
pub use place::{Call, Placement, SubWorker, WorkerId, chip, kind, sub, worker};
pub use typed::{InArg, InOutArg, Mode, OutArg, ReadOnly, ReadWrite, Scalar, TensorOf};
pub use view::{In, InOut, Out, worker_index};
