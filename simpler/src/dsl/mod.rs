//! The typed layer under `#[callable]` and `task_graph!`.
//!
//! * [`view`]: what a kernel or host function receives (`In<T>`, `Out<T>`, `InOut<T>`);
//! * [`typed`]: typed tensor handles ([`TensorOf`](typed::TensorOf)) and the argument traits
//!   that make rustc check every argument of a typed call;
//! * [`place`]: placements (`sub()`, `chip(N)`, `worker(N)`) checked against the callable's
//!   kind, and the typed [`Call`](place::Call);
//! * [`graph`]: the static structure of a `task_graph!`;
//! * [`launch`]: index launches whose bound is known only at run time, checked for overlap.
//!
//! The link-time registry the macros add to is callable identity: `callable::linked`.

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
pub use view::{In, InOut, Out};
