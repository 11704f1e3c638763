//! Task slots and their state machine.
//!
//! ```text
//! FREE -> BUILDING -> PENDING -> READY -> RUNNING -> COMPLETED -> CONSUMED
//!            │           │  └──> CHAINED ──┘│
//!            └───────────┴──────────┴───────┴─────> FAILED ───> CONSUMED
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
//!    the last fanin; READY -> RUNNING by the dispatcher (a loser means the task was poisoned);
//!    PENDING -> CHAINED by the scheduler (rule 5).
//! 2. Publication (BUILDING -> PENDING | READY) stores `fanin_count` and changes the state under
//!    the slot's lock, so a producer that completes while the consumer is BUILDING only bumps
//!    `fanin_released` and the publication sees it. Dispatch never claims a BUILDING slot.
//! 3. A failing producer poisons its consumers under their locks: PENDING/READY consumers move
//!    to FAILED (first failure wins and alone records the message); a BUILDING consumer is only
//!    marked (`poisoned`), and the submitting thread fails it at publication.
//! 4. A slot is consumed once it is terminal and `fanout_released >= fanout_total + 1` (the `+1`
//!    is its own release at completion). Consumption is a CAS to CONSUMED, so it happens once.
//!    A slot that is consumable is gone for good: an attach ([`Slot::attach`]) finds it so under
//!    its lock and neither links nor retains it, since the releaser that made it consumable is
//!    about to consume it (for an allocation's creator: to reclaim its memory).
//! 5. A PENDING slot whose one unreleased fanin is a task running on a SUB worker may be
//!    handed to that worker behind it (CHAINED, [`Slot::chain_behind`]: a CAS under the lock,
//!    so it races no release); one whose two unreleased fanins are single tasks running on two
//!    SUB workers, to one of them, to start behind its own once the other's succeeded; one
//!    whose unreleased fanins are all tasks running or CHAINED on one SUB worker, to that
//!    worker behind the last of them. A CHAINED slot belongs to the scheduler
//!    lane that chained it: a release of its last fanin does not queue it (the worker starts
//!    it itself once the task ahead succeeded) and moves nothing; the lane moves it CHAINED ->
//!    RUNNING ([`Slot::launch_chained`]) after its last fanin was released, or back to PENDING
//!    ([`Slot::unchain`]) when the task ahead failed, and then fails it as poisoned. Nothing
//!    else fails a CHAINED slot ([`Slot::fail_unstarted`] leaves it): the worker may be running
//!    it already.
//!
//! The state word and the lock come from the sync facade (`sys::sync::checked`), and each
//! transition's locked step is a method here that the engine calls ([`Slot::settle`],
//! [`Slot::release_fanin`], [`Slot::fail_unstarted`], [`Slot::mark_poisoned`], [`Slot::publish`],
//! [`Slot::release`], [`Slot::claim_consumption`], [`Slot::attach`]), so the `loom` models at the end of this file
//! run the same code under every interleaving.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::callable::identity::CallableHandle;
use crate::data::buffer::Identity;
use crate::data::call_config::CallConfig;
use crate::data::task_args::TaskArgs;
use crate::engine::run::RunState;
use crate::error::Error;
use crate::sys::sync::checked::{self as sync, AtomicU8, Mutex, MutexGuard, Ordering};

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
    /// PENDING, handed to a SUB worker behind its one unfinished producer (rule 5).
    Chained = 8,
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
            8 => State::Chained,
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
    /// The host buffers of its tensors, held from submit until the slot is consumed (or the
    /// task is dropped unconsumed): a host write is refused meanwhile.
    pub(crate) holds: BufferHolds,
}

/// Whether a task holds the host buffers of its tensors (`BufferInner::hold`), released once.
/// The tensors themselves (in the task's arguments) keep the buffers alive, so nothing more is
/// stored: submit and consume stay free of reference counting.
#[derive(Default)]
pub(crate) struct BufferHolds {
    held: bool,
    released: std::sync::atomic::AtomicBool,
}

/// The buffers that `args`' tensors hold: those made from a `Buffer` (once per naming tensor),
/// except `NoDep` ones, whose ordering the submitter took over (`unsafe`), host writes
/// included.
fn held_buffers<'a>(args: &'a [TaskArgs]) -> impl Iterator<Item = &'a crate::data::buffer::BufferInner> + 'a {
    args.iter()
        .flat_map(|a| a.tensors.iter().zip(a.tags.iter()))
        .filter(|(_, tag)| **tag != crate::data::task_args::Tag::NoDep)
        .filter_map(|(t, _)| t.buffer_ref())
}

impl BufferHolds {
    /// Holds the buffers of `args` (see [`held_buffers`]).
    pub(crate) fn take(args: &[TaskArgs]) -> BufferHolds {
        let mut held = false;
        for b in held_buffers(args) {
            b.hold();
            held = true;
        }
        BufferHolds { held, released: std::sync::atomic::AtomicBool::new(false) }
    }

    /// Releases what [`take`](BufferHolds::take) held for the same `args` (the first call only).
    pub(crate) fn release(&self, args: &[TaskArgs]) {
        if self.held && !self.released.swap(true, std::sync::atomic::Ordering::AcqRel) {
            for b in held_buffers(args) {
                b.release();
            }
        }
    }
}

impl Drop for TaskData {
    /// A task dropped unconsumed (its engine went away) still releases its buffers.
    fn drop(&mut self) {
        self.holds.release(&self.args);
    }
}

impl TaskData {
    /// A single task (not a group) for a SUB worker: what may be chained (rule 5).
    pub(crate) fn is_sub_single(&self) -> bool {
        !self.group && self.target == Target::Sub
    }

    /// The identities of the device buffers the task's tensors name, once per tensor.
    pub(crate) fn device_buffers(&self) -> impl Iterator<Item = crate::data::buffer::Identity> + '_ {
        self.args
            .iter()
            .flat_map(|a| a.tensors.iter())
            .filter(|t| t.desc().device_chip().is_some())
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

    /// Completion's step under the lock: the slot settles as COMPLETED or FAILED (recording the
    /// failure) and hands back its consumers and the producers it retained.
    pub(crate) fn settle(&self, result: &std::result::Result<(), Error>) -> (Fanout, Fanout) {
        let mut l = self.lock();
        match result {
            Ok(()) => self.set_state(State::Completed),
            Err(e) => {
                self.set_state(State::Failed);
                l.failure = Some(e.clone());
            }
        }
        (std::mem::take(&mut l.fanout), std::mem::take(&mut l.retained))
    }

    /// One producer of this consumer completed: true when that released its last fanin and
    /// this call won PENDING -> READY (rules 1, 2), so the caller queues it.
    pub(crate) fn release_fanin(&self) -> bool {
        let mut l = self.lock();
        l.fanin_released += 1;
        // A CHAINED slot (rule 5) only counts the release: its lane launches it.
        self.state() == State::Pending
            && l.fanin_released >= l.fanin_count
            && self.cas(State::Pending, State::Ready)
    }

    /// Rule 5: hands this PENDING slot to the lane running a producer of it, when `unreleased`
    /// (1 or 2) fanins are left: that producer (one the caller found this slot in the fanout
    /// of), and for 2 one more that runs on another SUB worker, or ahead of it on the same one. True when this call moved it
    /// PENDING -> CHAINED.
    pub(crate) fn chain_behind(&self, unreleased: u32) -> bool {
        let l = self.lock();
        self.state() == State::Pending
            && l.fanin_released + unreleased == l.fanin_count
            && self.cas(State::Pending, State::Chained)
    }

    /// How many of its fanins are not released yet (0 once it may run).
    pub(crate) fn unreleased(&self) -> u32 {
        let l = self.lock();
        l.fanin_count.saturating_sub(l.fanin_released)
    }

    /// Whether `consumer` waits for this slot now (it is in the fanout, under the lock).
    pub(crate) fn feeds(&self, consumer: &Slot) -> bool {
        self.lock().fanout.iter().any(|c| std::ptr::eq(Arc::as_ptr(c), consumer))
    }

    /// Rule 5: the task ahead of this CHAINED slot succeeded, which released its last fanin:
    /// CHAINED -> RUNNING. False, changing nothing, when a fanin is still unreleased (the task
    /// ahead failed) or the slot is not CHAINED.
    pub(crate) fn launch_chained(&self) -> bool {
        let l = self.lock();
        self.state() == State::Chained
            && l.fanin_released >= l.fanin_count
            && self.cas(State::Chained, State::Running)
    }

    /// Rule 5: the task ahead of this CHAINED slot failed (or it could not be handed over):
    /// CHAINED -> PENDING, so that it fails, or is queued, as any PENDING slot. False when it
    /// was not CHAINED.
    pub(crate) fn unchain(&self) -> bool {
        let _l = self.lock();
        self.cas(State::Chained, State::Pending)
    }

    /// The consumers waiting for this slot now (cloned under the lock).
    pub(crate) fn consumers(&self) -> Fanout {
        self.lock().fanout.clone()
    }

    /// Failing a slot that has not started, under its lock (rule 1): a BUILDING slot (only its
    /// submitting thread calls this then) or a PENDING / READY one whose CAS this call wins
    /// moves to FAILED with `err`, its members skipped; returns its consumers and the producers
    /// it retained. `None`, changing nothing, when the slot was past that.
    pub(crate) fn fail_unstarted(&self, err: Error) -> Option<(Fanout, Fanout)> {
        let mut l = self.lock();
        match self.state() {
            State::Building => self.set_state(State::Failed),
            s @ (State::Pending | State::Ready) if self.cas(s, State::Failed) => {}
            _ => return None,
        }
        l.failure = Some(err);
        for m in l.members.iter_mut() {
            *m = Member::Skipped;
        }
        Some((std::mem::take(&mut l.fanout), std::mem::take(&mut l.retained)))
    }

    /// Rule 3 for a consumer still BUILDING: marks it poisoned (the first cause wins) and
    /// returns true; false when it was published already, so the caller fails it instead.
    pub(crate) fn mark_poisoned(&self, poison: &Error) -> bool {
        if self.state() != State::Building {
            return false;
        }
        let mut l = self.lock();
        if self.state() != State::Building {
            return false;
        }
        if l.poisoned.is_none() {
            l.poisoned = Some(poison.clone());
        }
        true
    }

    /// Publication (rule 2): stores the fanin count and what the slot wrote, then moves
    /// BUILDING to READY (every live producer already released it) or PENDING, or reports the
    /// failure it must take instead: `producer_failed` (a producer found FAILED at attach), else
    /// the poison a failing producer marked it with meanwhile (rule 3).
    pub(crate) fn publish(
        &self,
        live: u32,
        written: SmallVec<[Identity; 4]>,
        producer_failed: Option<Error>,
    ) -> Published {
        let mut l = self.lock();
        l.fanin_count = live;
        l.written = written;
        if let Some(err) = producer_failed.or_else(|| l.poisoned.take()) {
            Published::Failed(err)
        } else if l.fanin_released >= live {
            self.set_state(State::Ready);
            Published::Ready
        } else {
            self.set_state(State::Pending);
            Published::Pending
        }
    }

    /// The submitting thread's attach (step 4 of a submit) of `consumer` to this producer,
    /// under the producer's lock: when `orders`, the consumer waits for it (unless it already
    /// ended); when `retains`, the consumer keeps it from being consumed until the consumer is.
    /// A producer consumed or consumable is [`Attached::Gone`] (rule 4), and nothing is linked.
    pub(crate) fn attach(self: &Arc<Self>, consumer: &Arc<Slot>, orders: bool, retains: bool) -> Attached {
        let mut l = self.lock();
        let state = self.state();
        if state == State::Consumed || consumable(state, &l) {
            return Attached::Gone;
        }
        let mut attached = Attached::Linked { waits: false, failure: None };
        if orders {
            match state {
                State::Failed => {
                    let failure = l.failure.clone().unwrap_or_else(|| Error::state("producer failed"));
                    attached = Attached::Linked { waits: false, failure: Some(failure) };
                }
                State::Completed => {}
                _ => {
                    l.fanout.push(consumer.clone());
                    attached = Attached::Linked { waits: true, failure: None };
                }
            }
        }
        if retains {
            l.fanout_total += 1;
            drop(l);
            consumer.lock().retained.push(self.clone());
        }
        attached
    }

    /// Drops one reference (rule 4): true when the slot is now consumable, so the caller
    /// consumes it ([`Slot::claim_consumption`]).
    pub(crate) fn release(&self) -> bool {
        let mut l = self.lock();
        l.fanout_released += 1;
        consumable(self.state(), &l)
    }

    /// Rule 4: the CAS of a terminal slot to CONSUMED; true for the one caller that consumes it.
    pub(crate) fn claim_consumption(&self) -> bool {
        let from = self.state();
        matches!(from, State::Completed | State::Failed) && self.cas(from, State::Consumed)
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

/// What [`Slot::attach`] did.
pub(crate) enum Attached {
    /// The producer is consumed or being consumed (rule 4): nothing was linked or retained.
    Gone,
    /// Linked: `waits` when the consumer counts it as a fanin; `failure` when the producer
    /// failed (the consumer must not run).
    Linked { waits: bool, failure: Option<Error> },
}

/// Consumers or retained producers, as a slot's links hold them.
pub(crate) type Fanout = SmallVec<[Arc<Slot>; 4]>;

/// What [`Slot::publish`] did.
pub(crate) enum Published {
    /// Now READY: the caller queues it.
    Ready,
    /// Now PENDING: its last producer's completion makes it ready.
    Pending,
    /// Still BUILDING: the caller fails it with this error ([`Slot::fail_unstarted`]).
    Failed(Error),
}

/// Rule 4: true when a terminal slot has been released by everyone who holds it.
pub(crate) fn consumable(state: State, links: &Links) -> bool {
    matches!(state, State::Completed | State::Failed) && links.fanout_released > links.fanout_total
}

#[cfg(all(test, loom))]
mod loom_models;
