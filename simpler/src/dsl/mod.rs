//! The typed layer under `#[callable]` and `task_graph!`.
//!
//! * [`view`]: what a kernel or host function receives (`In<T>`, `Out<T>`, `InOut<T>`);
//! * [`typed`]: typed tensor handles ([`TensorOf`](typed::TensorOf)) and the argument traits
//!   that make rustc check every argument of a typed call;
//! * [`place`]: placements (`sub()`, `chip(N)`, `worker(N)`) checked against the callable's
//!   kind, and the typed [`Call`](place::Call);
//! * [`registry`]: the link-time registry of `#[callable]` items;
//! * [`graph`]: the static structure of a `task_graph!`.

pub(crate) mod graph;
pub(crate) mod place;
pub mod private;
pub(crate) mod typed;
pub(crate) mod view;

use crate::error::Result;
use crate::worker::Worker;

impl Worker {
    /// Registers every `#[callable]` of the binary that this Worker can run: host functions
    /// when it has SUB workers, chip callables when it has chips (or is a chip), orchestration
    /// callables when it drives nested Workers. `init` calls it before forking anything.
    pub(crate) fn register_linked(&mut self) -> Result<()> {
        use crate::callable::identity::CallableKind;
        for info in crate::callable::linked::CallableInfo::linked() {
            let what = |e: crate::error::Error| e.context(format!("registering #[callable] `{}`", info.path));
            match info.kind {
                CallableKind::HostFn if self.sub_workers() > 0 => {
                    self.register(crate::callable::host::HostFn::from_linked(info)?).map_err(what)?;
                }
                CallableKind::Chip if self.chips() > 0 || self.level() == crate::level::Level::Chip => {
                    self.register_chip(crate::chip::ChipFn::from_linked(info)?).map_err(what)?;
                }
                CallableKind::Orch if self.level() > crate::level::Level::Node => {
                    self.register_orch(crate::engine::orch_fn::OrchFn::from_linked(info)?).map_err(what)?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}
