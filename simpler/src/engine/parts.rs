//! What the level that owns an engine gives it: [`LevelParts`] (the minter of `orch.alloc`
//! identities, the intermediate heap, the [`DeviceRules`] that check device tensors at submit),
//! how the engine is sized ([`EngineConfig`]) and where its doorbell lives ([`Bell`]). The engine
//! knows nothing else of its level.
//!
//! The device rules of each level: `ChipBuffers` (`worker/tree.rs`) at L3 and up, `OneChip`
//! (`chip/runtime/heap.rs`) inside a chip, `NoDevices` for tests and benchmarks.

use std::sync::Arc;
use std::time::Duration;

use crate::callable::identity::CallableHandle;
use crate::callable::identity::CallableKind;
use crate::data::buffer::{Identity, IdentityMinter};
use crate::engine::heap::IntermediateHeap;
use crate::error::Result;
use crate::sys::futex::Doorbell;

/// Sizing and limits of one engine.
#[derive(Debug, Clone)]
pub(crate) struct EngineConfig {
    /// Live slots at most (submitted, not yet consumed).
    pub(crate) task_window: usize,
    /// Bytes per heap ring (0 disables `orch.alloc`).
    pub(crate) heap_ring_size: u64,
    /// Runs that may hold per-run resources at once (the lease grant); also the admission
    /// bound when `pending_run_depth` is 0.
    pub(crate) pipeline_depth: usize,
    /// Runs admitted at once (non-terminal runs in the FIFO: one executing, the rest built and
    /// waiting); 0: `pipeline_depth`.
    pub(crate) pending_run_depth: usize,
    /// How long a full task window or heap ring waits before failing.
    pub(crate) backpressure_timeout: Duration,
    /// How long a new run waits for room among the admitted runs (`Duration::MAX`: for ever);
    /// a deadline of the run bounds it too.
    pub(crate) submit_timeout: Duration,
    /// Number of NEXT_LEVEL workers (ids 0..n).
    pub(crate) next_level_workers: usize,
    /// Number of SUB workers.
    pub(crate) sub_workers: usize,
    /// The kind of callable NEXT_LEVEL workers run (chips run chip callables, nested Workers
    /// run orchestration functions).
    pub(crate) next_level_kind: CallableKind,
    /// How messages name one NEXT_LEVEL worker ("chip", "nested Worker", "core") and the call
    /// that adds them ("WorkerBuilder::chips(n)", ...).
    pub(crate) next_level_names: (&'static str, &'static str),
    /// The most bytes one member's encoded `TaskArgs` may take (the mailbox a task crosses);
    /// `None` when tasks never leave the process.
    pub(crate) args_capacity: Option<usize>,
    /// The owner nonces whose buffers this engine's tasks may name: the Worker's own and its
    /// ancestors' (a `Buffer` belongs to the Worker that created it). `None`: any (engines
    /// whose tensors come from their parent, such as a chip's).
    pub(crate) owners: Option<Vec<u64>>,
    /// The level of the Worker this engine schedules for (task records name it).
    pub(crate) level: crate::level::Level,
}

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        EngineConfig {
            task_window: 65536,
            heap_ring_size: 1 << 30,
            pipeline_depth: 2,
            pending_run_depth: 0,
            backpressure_timeout: Duration::from_secs(10),
            submit_timeout: Duration::MAX,
            next_level_workers: 0,
            sub_workers: 0,
            next_level_kind: CallableKind::Chip,
            next_level_names: ("NEXT_LEVEL worker", "the level's builder"),
            args_capacity: None,
            owners: None,
            level: crate::level::Level::Node,
        }
    }
}

/// Where the engine doorbell lives: in the shared mailbox region (children ring it), or
/// wherever an in-process engine keeps it.
pub(crate) enum Bell {
    Shared(Arc<dyn AsRef<Doorbell> + Send + Sync>),
}

impl Bell {
    pub(super) fn get(&self) -> &Doorbell {
        match self {
            Bell::Shared(r) => (**r).as_ref(),
        }
    }
}

/// What the level that owns an engine gives it: the engine mints, allocates and checks device
/// memory through these, and knows nothing of the level itself.
pub(crate) struct LevelParts {
    /// Mints the identities of `orch.alloc` intermediates.
    pub(crate) minter: Arc<IdentityMinter>,
    /// Where `orch.alloc` takes memory from.
    pub(crate) heap: Arc<dyn IntermediateHeap>,
    /// How device tensors are checked at submit.
    pub(crate) devices: Arc<dyn DeviceRules>,
}

/// One device tensor of a task being submitted, as [`DeviceRules::check`] sees it.
pub(crate) struct DeviceUse<'a> {
    /// The task's callable (for messages).
    pub(crate) callable: &'a CallableHandle,
    /// The tensor's index in the task's arguments.
    pub(crate) tensor: usize,
    /// The chip whose memory it is.
    pub(crate) chip: u32,
    /// The buffer's identity.
    pub(crate) id: Identity,
    /// The NEXT_LEVEL worker the task (member) runs on; `None` for a SUB task.
    pub(crate) runs_on: Option<u32>,
    /// It is one of the engine's `orch.alloc_on` intermediates (checked live in this run).
    pub(crate) intermediate: bool,
    /// The task may write it.
    pub(crate) writes: bool,
}

/// How a level checks a device tensor a task names at submit: whose chip it is, and whether it
/// is still allocated. (An L3 Worker knows the buffers it allocated on its chips; a chip, that
/// its memory is its own.)
pub(crate) trait DeviceRules: Send + Sync {
    /// Checks one device tensor of a task; the error names the callable and the tensor.
    fn check(&self, used: &DeviceUse<'_>) -> Result<()>;

    /// A submitted task names device buffer `id` (once per naming tensor), from its submit
    /// until its slot is consumed: a level may refuse to copy over the buffer meanwhile.
    fn hold(&self, _id: Identity) {}

    /// The task that [`hold`](DeviceRules::hold) counted is gone.
    fn release(&self, _id: Identity) {}
}

/// A level without device memory: every device tensor is refused (tests and benchmarks).
#[cfg(any(test, feature = "bench-support"))]
pub(crate) struct NoDevices;

#[cfg(any(test, feature = "bench-support"))]
impl DeviceRules for NoDevices {
    fn check(&self, u: &DeviceUse<'_>) -> Result<()> {
        Err(crate::error::Error::invalid(format!(
            "{}: tensor {} is device memory of chip {}, and this level has none",
            u.callable, u.tensor, u.chip
        )))
    }
}
