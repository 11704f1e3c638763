//! Task slots and their state machine.
//!
//! ```text
//! FREE -> BUILDING -> PENDING -> READY -> RUNNING -> COMPLETED -> CONSUMED
//!            └───────────┴──────────┴─────────┴─────> FAILED ───> CONSUMED
//! ```
//!
//! A slot is created by the Orchestrator in BUILDING with all its task data (callable, args,
//! config, targets), which is immutable from then on. Everything that changes lives in
//! [`Links`] under the slot's own lock (the upstream `fanout_mu`), plus the state word.
//!
//! Rules:
//!
//! 1. Every transition that can race is a compare-and-swap on the state word with exactly one
//!    winner ([`Slot::cas`]). PENDING -> READY is won by the producer whose completion releases
//!    the last fanin; READY -> RUNNING by the dispatcher (a loser means the task was poisoned).
//! 2. Publication (BUILDING -> PENDING | READY) stores `fanin_count` and changes the state under
//!    the slot's lock, so a producer that completes while the consumer is BUILDING only bumps
//!    `fanin_released` and the publication sees it. Dispatch never claims a BUILDING slot.
//! 3. A failing producer poisons its consumers under their locks: PENDING/READY consumers move
//!    to FAILED (first failure wins and alone records the message); a BUILDING consumer is only
//!    marked (`poisoned`), and the submitting thread fails it at publication.
//! 4. A slot is consumed once it is terminal and `fanout_released >= fanout_total + 1` (the `+1`
//!    is its own release at completion). Consumption is a CAS to CONSUMED, so it happens once.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use smallvec::SmallVec;

use crate::callable::identity::CallableHandle;
use crate::data::buffer::Identity;
use crate::data::call_config::CallConfig;
use crate::data::task_args::TaskArgs;
use crate::engine::run::RunState;
use crate::error::Error;
use crate::sys::sync;

/// Slot states (upstream `TaskState` numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum State {
    Pending = 1,
    Ready = 2,
    Running = 3,
    Completed = 4,
    Failed = 5,
    Consumed = 6,
    Building = 7,
}

impl State {
    fn from_u8(v: u8) -> State {
        match v {
            1 => State::Pending,
            2 => State::Ready,
            3 => State::Running,
            4 => State::Completed,
            5 => State::Failed,
            6 => State::Consumed,
            _ => State::Building,
        }
    }
}

/// Where a task runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// Any idle SUB worker; a group takes `n` distinct ones.
    Sub,
    /// Exactly these NEXT_LEVEL workers (one for a single task, one per member for a group).
    NextLevel(SmallVec<[u32; 4]>),
}

/// What a task runs, fixed at submit.
pub(crate) struct TaskData {
    pub(crate) callable: CallableHandle,
    /// One entry for a single task, one per member for a group.
    pub(crate) args: SmallVec<[TaskArgs; 1]>,
    /// `None` for the default config (most tasks), so slots stay small.
    pub(crate) config: Option<Box<CallConfig>>,
    pub(crate) target: Target,
    pub(crate) group: bool,
    /// Whether any tensor is device memory (counted with the level's `DeviceRules` while the
    /// slot lives).
    pub(crate) names_device: bool,
}

impl TaskData {
    /// The identities of the device buffers the task's tensors name, once per tensor.
    pub(crate) fn device_buffers(&self) -> impl Iterator<Item = crate::data::buffer::Identity> + '_ {
        self.args
            .iter()
            .flat_map(|a| a.tensors.iter())
            .filter(|t| matches!(t.desc().backing(), crate::data::buffer::Backing::Device { .. }))
            .map(|t| t.desc().identity())
    }
}

/// Member states of a group task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Member {
    NotDispatched,
    Running,
    Success,
    Failed,
    Skipped,
}

/// The mutable part of a slot, under its lock.
pub(crate) struct Links {
    pub(crate) fanin_count: u32,
    pub(crate) fanin_released: u32,
    /// Consumers waiting for this slot (each counts it as one live fanin).
    pub(crate) fanout: SmallVec<[Arc<Slot>; 4]>,
    pub(crate) fanout_total: u32,
    pub(crate) fanout_released: u32,
    /// Producers this slot retains until it completes.
    pub(crate) retained: SmallVec<[Arc<Slot>; 4]>,
    /// Buffers whose TensorMap entries this slot may own (erased at consumption).
    pub(crate) written: SmallVec<[Identity; 4]>,
    /// Rule 3: a producer failed while this slot was BUILDING.
    pub(crate) poisoned: Option<Error>,
    /// The failure of this task, once FAILED.
    pub(crate) failure: Option<Error>,
    pub(crate) members: SmallVec<[Member; 1]>,
}

/// The memory an `orch.alloc` slot holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeapHold {
    /// The allocation's buffer identity (its TensorMap creator entry).
    pub(crate) identity: Identity,
    pub(crate) block: crate::engine::heap::HeapBlock,
}

/// One task of a run.
pub(crate) struct Slot {
    pub(crate) run: Arc<RunState>,
    /// Number within the run.
    pub(crate) index: u32,
    /// For `orch.alloc` slots: the allocation, released when the slot is consumed.
    pub(crate) heap: Option<HeapHold>,
    pub(crate) task: Option<TaskData>,
    state: AtomicU8,
    links: Mutex<Links>,
}

impl Slot {
    pub(crate) fn new(
        run: Arc<RunState>,
        index: u32,
        task: Option<TaskData>,
        heap: Option<HeapHold>,
    ) -> Slot {
        let members = match &task {
            Some(t) if t.group => smallvec::smallvec![Member::NotDispatched; t.args.len()],
            _ => SmallVec::new(),
        };
        Slot {
            run,
            index,
            heap,
            task,
            state: AtomicU8::new(State::Building as u8),
            links: Mutex::new(Links {
                fanin_count: 0,
                fanin_released: 0,
                fanout: SmallVec::new(),
                // The open scope's reference, taken at creation (submit step 2).
                fanout_total: 1,
                fanout_released: 0,
                retained: SmallVec::new(),
                written: SmallVec::new(),
                poisoned: None,
                failure: None,
                members,
            }),
        }
    }

    pub(crate) fn state(&self) -> State {
        State::from_u8(self.state.load(Ordering::Acquire))
    }

    /// Rule 1: one winner per transition.
    pub(crate) fn cas(&self, from: State, to: State) -> bool {
        self.state.compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Unconditional store; only for transitions with a single possible writer.
    pub(crate) fn set_state(&self, to: State) {
        self.state.store(to as u8, Ordering::Release);
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Links> {
        // A poisoned lock means a panic in engine code while holding it; the data is still
        // consistent at every await point we release it, so keep going.
        sync::lock(&self.links)
    }

    pub(crate) fn task(&self) -> &TaskData {
        self.task.as_ref().expect("dispatched slots carry task data")
    }

    /// `callable` for messages; alloc slots have none.
    pub(crate) fn describe(&self) -> String {
        match &self.task {
            Some(t) => format!("task {} {}", self.index, t.callable),
            None => format!("allocation {}", self.index),
        }
    }
}

/// Rule 4: true when a terminal slot has been released by everyone who holds it.
pub(crate) fn consumable(state: State, links: &Links) -> bool {
    matches!(state, State::Completed | State::Failed) && links.fanout_released > links.fanout_total
}
