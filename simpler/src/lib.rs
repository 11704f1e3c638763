//! # simpler
//!
//! Orchestrate task graphs on a hierarchy of accelerator workers, in Rust.
//!
//! A [`Worker`] runs one level of the hierarchy. Its engine has three parts:
//!
//! * the **Orchestrator** ([`Orchestrator`]), which turns `submit_*` calls made by an
//!   orchestration function into a DAG, inferring dependencies from each tensor's [`Tag`];
//! * the **Scheduler**, which dispatches ready tasks and processes completions (a role taken by
//!   whichever thread waits on a run, or by a background thread when nobody waits);
//! * the **WorkerManager**, whose lanes drive forked child processes through shared-memory
//!   mailboxes.
//!
//! ```no_run
//! use simpler::{CallConfig, DataType, HostArgs, HostFn, HostResult, TaskArgs, Worker};
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
//! worker.run(
//!     |orch, _args, _cfg| {
//!         let mut args = TaskArgs::new();
//!         args.input(&tx)?.output(&ty)?;
//!         orch.submit_sub(&double, args)?;
//!         Ok(())
//!     },
//!     TaskArgs::new(),
//!     CallConfig::default(),
//! )?;
//! assert_eq!(y.read::<f32>(0, 16)?, vec![2.0; 16]);
//! worker.close()?;
//! # Ok(()) }
//! ```

#[doc(hidden)]
pub mod bench_support;
mod callable;
mod chip;
mod data;
mod dfx;
mod engine;
mod error;
mod ipc;
mod level;
mod worker;

pub use callable::host::{HostFn, HostFnPtr, HostResult};
pub use callable::identity::{CallableHandle, CallableKind, Digest, Namespace};
pub use callable::orch::{OrchFn, OrchFnPtr};
pub use chip::{ChipBackend, ChipFn, ChipOrchFnPtr, SimChip};
pub use data::buffer::{Access, Backing, Buffer, BufferDesc, Identity, SHM_NAME_MAX, ShmName};
pub use data::call_config::{CallConfig, OUTPUT_PREFIX_LEN, RING_DEPTH, RuntimeEnv};
pub use data::dtype::{DataType, Element};
pub use data::task_args::{Dep, Tag, TaskArgs, TaskHandle};
pub use data::tensor::{MAX_TENSOR_DIMS, Overlap, Tensor, TensorView, overlap};
pub use dfx::graph::{EdgeReason, RunDag, TaskNode};
pub use engine::orchestrator::{MAX_SCOPE_DEPTH, Orchestrator};
pub use engine::run::{RunHandle, RunStats};
pub use error::{Error, ErrorKind, Result};
pub use ipc::host_args::HostArgs;
pub use level::Level;
pub use worker::{Worker, WorkerBuilder};

/// The README's code compiles as a doctest, so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
