//! The Orchestrator: turns `submit_*` calls into a DAG.
//!
//! One submit, end to end (upstream "7 steps"):
//!
//! 0. validate everything that can be checked before any state changes (the run has not failed,
//!    the config, the callable's kind and registration, the targets, every tensor's access and
//!    aliasing, explicit dependencies belong to this run);
//! 1. claim a place in the task window (waits under back-pressure);
//! 2. create the slot in BUILDING with all its task data and give the open scope a reference;
//! 3. walk the tags through the TensorMap: readers find the live writers of overlapping bytes
//!    (read after write) and are recorded as readers; writers find the live writers (write
//!    after write) and the readers since (write after read) of overlapping bytes and become the
//!    writer; `NoDep` tensors are not tracked; every task naming an `orch.alloc` buffer retains
//!    its creator;
//! 4. attach to each producer under its lock (completed producers add no live fanin, a failed
//!    producer poisons the task);
//! 5. publish: fanin count and BUILDING -> PENDING | READY in one step under the slot's lock;
//! 6. route READY tasks to the scheduler.
//!
//! Validation checks device tensors through the level's `DeviceRules` (`engine/parts.rs`).
//! The claim (step 1) may drive the scheduler, so the liveness of the task's `orch.alloc`
//! tensors is checked again after it, and an attach that must retain a creator consumed
//! meanwhile (rule 4 of the slot module) publishes the task failed and fails the submit naming
//! the tensor: a task never runs on reclaimed memory.
//!
//! `alloc` mints its identity with the level's minter, takes a block for it from the engine's
//! `IntermediateHeap` (ring = min(scope depth, 3); a chip binds the block to the identity), and
//! records a born-COMPLETED creator slot that every task naming the buffer retains. Scopes nest
//! up to 64 ([`MAX_SCOPE_DEPTH`]); ending one never blocks.
//!
//! A run that serves a task of the level above (`Worker::run_for_parent`, a chip
//! orchestration) is confined to that task's tensors ([`Orchestrator::confine_to`]: a tensor of
//! another owner must be covered by an argument of the same buffer), so it can neither widen a
//! view it was given nor use a tensor kept from an earlier task. How the tags become edges,
//! and why every overlap is ordered, is the TensorMap's (`tensor_map.rs`).

use std::sync::{Arc, Weak};

use smallvec::SmallVec;

use crate::callable::identity::{CallableHandle, CallableKind, Digest};
use crate::data::buffer::{Access, BufferDesc, Identity};
use crate::data::call_config::CallConfig;
use crate::data::dtype::DataType;
use crate::data::task_args::{Tag, TaskArgs, TaskHandle};
use crate::data::tensor::{Overlap, Tensor, TensorView, overlap};
use crate::data::wire::blob_size;
use crate::dfx::graph::{CapturedTask, Placed};
use crate::engine::heap::Place;
use crate::engine::ring::ring_for_depth;
use crate::engine::run::RunState;
use crate::engine::slot::{Attached, HeapHold, Published, Slot, State, Target, TaskData};
use crate::engine::tensor_map::Found;
use crate::engine::{DeviceUse, Engine, Registered};
use crate::error::{Error, ErrorKind, Result};
use crate::sys::sync;

/// Scope stack limit, counting the run's outer scope.
///
/// So [`Orchestrator::scope_depth`] goes up to `MAX_SCOPE_DEPTH - 1`; one more
/// [`scope`](Orchestrator::scope) is an error.
///
/// ```
/// assert_eq!(simpler::MAX_SCOPE_DEPTH, 64);
/// ```
///
/// ```no_run
/// use simpler::{ErrorKind, MAX_SCOPE_DEPTH, Orchestrator, Worker};
///
/// /// Nests scopes until one is refused; returns the depth reached.
/// fn nest(orch: &mut Orchestrator<'_>) -> simpler::Result<usize> {
///     match orch.scope(nest) {
///         Err(e) if e.kind() == ErrorKind::InvalidState => Ok(orch.scope_depth()),
///         other => other,
///     }
/// }
///
/// # fn main() -> simpler::Result<()> {
/// let mut worker = Worker::builder().sub_workers(1).build()?;
/// worker.init()?;
/// worker.run(|orch| {
///     assert_eq!(nest(orch)?, MAX_SCOPE_DEPTH - 1);
///     Ok(())
/// })?;
/// # Ok(()) }
/// ```
pub const MAX_SCOPE_DEPTH: usize = 64;

/// Builds one run's DAG; handed to the orchestration function.
///
/// Valid only inside the orchestration function it was passed to. Every `submit_*` returns a
/// [`TaskHandle`] for explicit dependencies; dependencies on tensors are inferred from tags.
///
/// ```no_run
/// # fn demo(worker: &simpler::Worker, f: &simpler::CallableHandle, t: &simpler::Tensor) -> simpler::Result<()> {
/// use simpler::{DataType, TaskArgs};
/// worker.run(|orch| {
/// let tmp = orch.alloc(&[1024], DataType::Float32)?; // runtime-managed intermediate
/// let mut produce = TaskArgs::new();
/// produce.input(t)?.output(&tmp)?;
/// orch.submit_sub(f, produce)?;
/// let mut consume = TaskArgs::new();
/// consume.input(&tmp)?; // waits for the producer: read-after-write
/// orch.submit_sub(f, consume)?;
/// Ok(())
/// })
/// # }
/// ```
pub struct Orchestrator<'a> {
    eng: &'a Engine,
    run: Arc<RunState>,
    scopes: Vec<Vec<Arc<Slot>>>,
    tasks: TaskIndex,
    allocs: u32,
    /// `scope_end` may not pop below this many frames (1: the run's outer scope; inside
    /// `Orchestrator::scope`, the scope it opened).
    scope_floor: usize,
    /// Emptied scope frames, reused by `scope_begin` (and by the next run).
    frames: Vec<Vec<Arc<Slot>>>,
    /// Callables already checked, valid while the engine's registrations are at generation
    /// `checked_generation` (kept across runs; registration cannot change mid-build: the
    /// Worker's `register` and `unregister` need `&mut Worker`, which building excludes).
    checked: SmallVec<[Checked; 4]>,
    checked_generation: u64,
    /// For a run that serves a task of the level above ([`confine_to`](Orchestrator::confine_to)):
    /// the tensors that task was given. Tasks may name only bytes inside one of them, or this
    /// engine's own intermediates.
    grant: Option<SmallVec<[(crate::data::buffer::Identity, TensorView); 4]>>,
    /// A submit was refused because the run had failed already (see [`Orchestrator::ended_by_refusal`]).
    refused: bool,
}

/// What an Orchestrator keeps for the next run of its engine, so that a run allocates no
/// buffers of its own in steady state: empty vectors with their capacity, and the callables it
/// checked (with the registration generation they were checked at).
#[derive(Default)]
pub(crate) struct OrchBuffers {
    scopes: Vec<Vec<Arc<Slot>>>,
    frames: Vec<Vec<Arc<Slot>>>,
    tasks: TaskIndex,
    checked: SmallVec<[Checked; 4]>,
    checked_generation: u64,
}

/// The run's tasks by index, for explicit dependencies and for failing the unstarted ones:
/// weak references to the slots. Consumed slots at the front are dropped from it as the next
/// task is submitted (a weak reference pins the slot's memory), so a run whose earliest tasks
/// are consumed as it goes (scopes that end as it goes) holds memory for its live tasks only.
/// A task still alive at the front (one in the outer scope, kept until the run ends) keeps
/// every later reference too, as a plain list would.
#[derive(Default)]
struct TaskIndex {
    /// The index of `live[0]`: every task below it has been consumed.
    base: u32,
    live: std::collections::VecDeque<Weak<Slot>>,
}

impl TaskIndex {
    /// How many tasks the run has submitted.
    fn len(&self) -> usize {
        self.base as usize + self.live.len()
    }

    /// Records the next task (index `len()`), first dropping consumed ones from the front.
    fn push(&mut self, slot: Weak<Slot>) {
        while self.live.front().is_some_and(|w| w.strong_count() == 0) {
            self.live.pop_front();
            self.base += 1;
        }
        self.live.push_back(slot);
    }

    /// Task `index`, if its slot is still alive (`None` once consumed: nothing to wait for).
    fn get(&self, index: u32) -> Option<Arc<Slot>> {
        index.checked_sub(self.base).and_then(|i| self.live.get(i as usize)).and_then(Weak::upgrade)
    }

    /// Every task whose slot is alive.
    fn alive(&self) -> impl Iterator<Item = Arc<Slot>> + '_ {
        self.live.iter().filter_map(Weak::upgrade)
    }

    /// Forgets every task (for the next run), keeping the memory unless it is large.
    fn clear(&mut self) {
        self.base = 0;
        self.live.clear();
        if self.live.capacity() > SPARE_CAPACITY {
            self.live = std::collections::VecDeque::new();
        }
    }
}

/// Most (emptied) scope frames kept for reuse.
const SPARE_FRAMES: usize = 8;
/// Largest capacity (entries) a kept vector may have; bigger ones are freed, so one huge run
/// does not pin its memory.
const SPARE_CAPACITY: usize = 4096;
/// A callable checked as runnable by the method that checked it: its digest, the kind that
/// method runs, and its registration (a kernel's signature, which each task's arguments must
/// match; the workers an orchestration function is placed on).
type Checked = (Digest, CallableKind, Registered);

/// Most callables remembered as checked.
const CHECKED_MAX: usize = 16;

impl std::fmt::Debug for Orchestrator<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Orchestrator")
            .field("run", &self.run.id)
            .field("scope_depth", &self.scope_depth())
            .field("tasks", &self.tasks.len())
            .finish()
    }
}

impl<'a> Orchestrator<'a> {
    pub(crate) fn new(eng: &'a Engine, run: Arc<RunState>) -> Orchestrator<'a> {
        let mut b = std::mem::take(&mut *sync::lock(&eng.orch_spare));
        let generation = eng.callables.generation();
        if b.checked_generation != generation {
            b.checked.clear();
        }
        let outer = b.frames.pop().unwrap_or_default();
        b.scopes.clear();
        b.scopes.push(outer);
        b.tasks.clear();
        Orchestrator {
            eng,
            run,
            scopes: b.scopes,
            tasks: b.tasks,
            allocs: 0,
            scope_floor: 1,
            frames: b.frames,
            checked: b.checked,
            checked_generation: generation,
            grant: None,
            refused: false,
        }
    }

    /// Confines the run to `args`, the tensors of the task of the level above it serves (a
    /// nested or remote Worker's run, a chip orchestration): from now on a task may name a
    /// buffer only through a view whose bytes all lie inside one of `args`' views of it, or
    /// one of this engine's own `orch.alloc` intermediates. So an orchestration cannot widen
    /// a view it was given (a `reshape` over the whole buffer) nor keep a tensor for a later
    /// run, which could reach bytes that another task holds meanwhile.
    pub(crate) fn confine_to(&mut self, args: &TaskArgs) {
        self.grant = Some(args.tensors.iter().map(|t| (t.desc().identity(), *t.view())).collect());
    }

    /// Keeps every task's arguments as text in the run's capture (a chip's
    /// `CallConfig::dump_args`); nothing when the run is not captured.
    pub(crate) fn keep_args_text(&mut self) {
        if let Some(cap) = &self.run.capture {
            sync::lock(cap).dump_args = true;
        }
    }

    /// The id of the run being built.
    ///
    /// The same as the [`RunHandle::id`](crate::RunHandle::id) the submit returns, and as
    /// [`TaskHandle::run_id`] of every task submitted here.
    ///
    /// ```no_run
    /// use simpler::{HostArgs, HostFn, HostResult, TaskArgs, Worker};
    ///
    /// fn step(_args: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(1).build()?;
    /// let step = worker.register(HostFn::new("step", step))?;
    /// worker.init()?;
    /// let mut built = 0;
    /// let run = worker.submit(|orch| {
    ///     built = orch.run_id();
    ///     let task = orch.submit_sub(&step, TaskArgs::new())?;
    ///     assert_eq!(task.run_id(), orch.run_id());
    ///     Ok(())
    /// })?;
    /// assert_eq!(run.id(), built);
    /// run.wait()?;
    /// # Ok(()) }
    /// ```
    pub fn run_id(&self) -> u64 {
        self.run.id
    }

    /// Current scope depth: 0 in the run's outer scope, 1 inside the first `scope`, ...
    ///
    /// ```no_run
    /// use simpler::Worker;
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(1).build()?;
    /// worker.init()?;
    /// worker.run(|orch| {
    ///     assert_eq!(orch.scope_depth(), 0);
    ///     orch.scope(|orch| {
    ///         assert_eq!(orch.scope_depth(), 1);
    ///         orch.scope(|orch| {
    ///             assert_eq!(orch.scope_depth(), 2);
    ///             Ok(())
    ///         })
    ///     })?;
    ///     assert_eq!(orch.scope_depth(), 0);
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn scope_depth(&self) -> usize {
        self.scopes.len() - 1
    }

    /// Number of tasks submitted so far in this run.
    ///
    /// A group counts as one task; `alloc` counts none.
    ///
    /// ```no_run
    /// use simpler::{DataType, HostArgs, HostFn, HostResult, TaskArgs, Worker};
    ///
    /// fn zero(args: &HostArgs<'_>) -> HostResult {
    ///     args.output::<f32>(0)?.fill(0.0);
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(2).build()?;
    /// let zero = worker.register(HostFn::new("zero", zero))?;
    /// worker.init()?;
    /// worker.run(|orch| {
    ///     let tmp = [
    ///         orch.alloc(&[64], DataType::Float32)?,
    ///         orch.alloc(&[64], DataType::Float32)?,
    ///         orch.alloc(&[64], DataType::Float32)?,
    ///     ];
    ///     assert_eq!(orch.task_count(), 0); // allocations are not tasks
    ///     let mut args = TaskArgs::new();
    ///     args.output(&tmp[0])?;
    ///     let task = orch.submit_sub(&zero, args)?;
    ///     assert_eq!(orch.task_count(), 1);
    ///     assert_eq!(task.index() as usize, orch.task_count() - 1);
    ///     let (mut m0, mut m1) = (TaskArgs::new(), TaskArgs::new());
    ///     m0.output(&tmp[1])?;
    ///     m1.output(&tmp[2])?;
    ///     orch.submit_sub_group(&zero, vec![m0, m1])?;
    ///     assert_eq!(orch.task_count(), 2); // a group is one task
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn task_count(&self) -> usize {
        self.tasks.len()
    }

    /// Number of SUB workers of the Worker this run runs on: to size a group or the tiles of
    /// a split to them (an orchestration function on a node runs on whatever Worker the node
    /// gave its root's session).
    ///
    /// ```no_run
    /// use simpler::{HostArgs, HostFn, HostResult, TaskArgs, Worker};
    ///
    /// fn part(_args: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(3).build()?;
    /// let part = worker.register(HostFn::new("part", part))?;
    /// worker.init()?;
    /// worker.run(|orch| {
    ///     assert_eq!(orch.sub_workers(), 3);
    ///     let members = (0..orch.sub_workers()).map(|_| TaskArgs::new()).collect();
    ///     orch.submit_sub_group(&part, members).map(|_| ())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn sub_workers(&self) -> usize {
        self.eng.cfg.sub_workers
    }

    /// Number of next-level workers of the Worker this run runs on (chips at L3, nested and
    /// remote Workers above), ids `0..n` for
    /// [`submit_next_level`](Self::submit_next_level).
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = simpler::Worker::builder().chips(2).build()?;
    /// worker.init()?;
    /// worker.run(|orch| {
    ///     assert_eq!(orch.next_level_workers(), 2);
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn next_level_workers(&self) -> usize {
        self.eng.cfg.next_level_workers
    }

    /// Submits a host function to any idle SUB worker.
    ///
    /// The task waits for the earlier writers of the tensors it reads (see [`Tag`](crate::Tag))
    /// and for the tasks named by [`TaskArgs::add_dep`]. The callable must be a host function
    /// registered on this Worker, and the Worker must have SUB workers.
    ///
    /// ```no_run
    /// use simpler::{DataType, HostArgs, HostFn, HostResult, TaskArgs, Worker};
    ///
    /// fn scale(args: &HostArgs<'_>) -> HostResult {
    ///     let k = args.scalar_f32(0)?;
    ///     for v in args.output::<f32>(0)? {
    ///         *v *= k;
    ///     }
    ///     Ok(())
    /// }
    ///
    /// fn log(_args: &HostArgs<'_>) -> HostResult {
    ///     eprintln!("scaled");
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(2).build()?;
    /// let scale = worker.register(HostFn::new("scale", scale))?;
    /// let log = worker.register(HostFn::new("log", log))?;
    /// worker.init()?;
    /// let buf = worker.create_buffer(4 * 16)?;
    /// buf.write(0, &[2.0f32; 16])?;
    /// let x = buf.tensor(&[16], DataType::Float32)?;
    /// worker.run(|orch| {
    ///     let mut args = TaskArgs::new();
    ///     args.inout(&x)?.scalar_f32(3.0);
    ///     let first = orch.submit_sub(&scale, args)?;
    ///     let mut args = TaskArgs::new();
    ///     args.inout(&x)?.scalar_f32(0.5); // waits for `first`: it reads what `first` wrote
    ///     let second = orch.submit_sub(&scale, args)?;
    ///     let mut args = TaskArgs::new();
    ///     args.add_dep(second); // no tensors: ordered by an explicit dependency
    ///     orch.submit_sub(&log, args)?;
    ///     assert_eq!((first.index(), second.index()), (0, 1));
    ///     Ok(())
    /// })?;
    /// assert_eq!(buf.read::<f32>(0, 16)?, vec![3.0; 16]);
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn submit_sub(&mut self, callable: &CallableHandle, args: TaskArgs) -> Result<TaskHandle> {
        self.check_kind(callable, CallableKind::HostFn).map_err(|e| e.context("submit_sub"))?;
        self.check_sub_pool(callable, 1)?;
        self.submit(callable, smallvec::smallvec![args], None, Target::Sub, false)
    }

    /// Submits one task whose members run on `args_list.len()` distinct SUB workers at once
    /// (all or nothing). Member `i` gets `args_list[i]`.
    ///
    /// The group is one task: one [`TaskHandle`], complete when every member is. It needs at
    /// least one member and at most [`Worker::sub_workers`](crate::Worker::sub_workers).
    ///
    /// ```no_run
    /// use simpler::{DataType, HostArgs, HostFn, HostResult, TaskArgs, memory::TensorView, Worker};
    ///
    /// fn whoami(args: &HostArgs<'_>) -> HostResult {
    ///     args.output::<u32>(0)?.fill(args.worker_index());
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(2).build()?;
    /// let whoami = worker.register(HostFn::new("whoami", whoami))?;
    /// worker.init()?;
    /// let buf = worker.create_buffer(4 * 8)?;
    /// let halves = [
    ///     buf.view(TensorView::new(0, &[4], None, DataType::Uint32)?)?, // elements 0..4
    ///     buf.view(TensorView::new(16, &[4], None, DataType::Uint32)?)?, // elements 4..8
    /// ];
    /// worker.run(|orch| {
    ///     let mut members = Vec::new();
    ///     for half in &halves {
    ///         let mut args = TaskArgs::new();
    ///         args.output(half)?;
    ///         members.push(args);
    ///     }
    ///     let group = orch.submit_sub_group(&whoami, members)?; // both SUB workers at once
    ///     assert_eq!((group.index(), orch.task_count()), (0, 1));
    ///     Ok(())
    /// })?;
    /// let ids = buf.read::<u32>(0, 8)?;
    /// assert_ne!(ids[0], ids[4]); // two distinct SUB workers
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn submit_sub_group(
        &mut self,
        callable: &CallableHandle,
        args_list: Vec<TaskArgs>,
    ) -> Result<TaskHandle> {
        self.check_kind(callable, CallableKind::HostFn).map_err(|e| e.context("submit_sub_group"))?;
        if args_list.is_empty() {
            return Err(Error::invalid(format!("submit_sub_group of {callable}: args_list is empty")));
        }
        self.check_sub_pool(callable, args_list.len())?;
        self.submit(callable, args_list.into_iter().collect(), None, Target::Sub, true)
    }

    /// Submits a task to exactly one NEXT_LEVEL worker.
    ///
    /// `worker` is a NEXT_LEVEL worker id (`0..n`); for an L3 Worker these are its chips, which
    /// run chip callables ([`CallableKind::Chip`]) with `config`; for an L4+ Worker, its nested
    /// Workers, which run orchestration callables ([`CallableKind::Orch`]). A handle of the
    /// wrong kind is an [`ErrorKind::Callable`] error, an unknown id an
    /// [`ErrorKind::InvalidArgument`] one.
    ///
    /// ```no_run
    /// # fn demo(
    /// #     orch: &mut simpler::Orchestrator<'_>,
    /// #     kernel: &simpler::CallableHandle,
    /// #     x: &simpler::Tensor,
    /// #     y: &simpler::Tensor,
    /// # ) -> simpler::Result<()> {
    /// use simpler::{chip::CallConfig, TaskArgs};
    /// // y = kernel(x) on chip 0, with four AICPU scheduler threads.
    /// let mut args = TaskArgs::new();
    /// args.input(x)?.output(y)?;
    /// let on_chip = orch.submit_next_level(kernel, args, CallConfig::new().aicpu_threads(4), 0)?;
    /// // Later tasks reading `y` wait for it; others can name it with `add_dep`.
    /// # let _ = on_chip;
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn submit_next_level(
        &mut self,
        callable: &CallableHandle,
        args: TaskArgs,
        config: CallConfig,
        worker: u32,
    ) -> Result<TaskHandle> {
        let at = self
            .check_kind(callable, self.eng.cfg.next_level_kind)
            .map_err(|e| e.context("submit_next_level"))?;
        self.check_worker(worker, callable)?;
        self.check_placed(at, worker, callable).map_err(|e| e.context("submit_next_level"))?;
        self.check_signature(at, callable, &args)?;
        self.run.note_next_level(&[worker], false);
        self.submit(
            callable,
            smallvec::smallvec![args],
            Some(config),
            Target::NextLevel(smallvec::smallvec![worker]),
            false,
        )
    }

    /// Submits one task whose member `i` runs `args_list[i]` on `workers[i]`, all launched
    /// together or not at all.
    ///
    /// `workers` are distinct NEXT_LEVEL worker ids, one per member; for an L3 Worker these are
    /// its chips, for an L4+ Worker its nested Workers; handles and ids are checked as in
    /// [`submit_next_level`](Self::submit_next_level).
    ///
    /// ```no_run
    /// # fn demo(
    /// #     orch: &mut simpler::Orchestrator<'_>,
    /// #     kernel: &simpler::CallableHandle,
    /// #     x: [&simpler::Tensor; 2],
    /// #     y: [&simpler::Tensor; 2],
    /// # ) -> simpler::Result<()> {
    /// use simpler::{chip::CallConfig, TaskArgs};
    /// // Half of the data on chip 0, the other half on chip 1, launched together.
    /// let mut members = Vec::new();
    /// for half in 0..2 {
    ///     let mut args = TaskArgs::new();
    ///     args.input(x[half])?.output(y[half])?;
    ///     members.push(args);
    /// }
    /// let both = orch.submit_next_level_group(kernel, members, CallConfig::default(), &[0, 1])?;
    /// # let _ = both;
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn submit_next_level_group(
        &mut self,
        callable: &CallableHandle,
        args_list: Vec<TaskArgs>,
        config: CallConfig,
        workers: &[u32],
    ) -> Result<TaskHandle> {
        let at = self
            .check_kind(callable, self.eng.cfg.next_level_kind)
            .map_err(|e| e.context("submit_next_level_group"))?;
        if workers.is_empty() || workers.len() != args_list.len() {
            return Err(Error::invalid(format!(
                "submit_next_level_group of {callable}: {} workers for {} argument sets; give one worker per member",
                workers.len(),
                args_list.len()
            )));
        }
        for args in &args_list {
            self.check_signature(at, callable, args)?;
        }
        for (i, w) in workers.iter().enumerate() {
            self.check_worker(*w, callable)?;
            self.check_placed(at, *w, callable).map_err(|e| e.context("submit_next_level_group"))?;
            if workers[..i].contains(w) {
                return Err(Error::invalid(format!(
                    "submit_next_level_group of {callable}: worker {w} is named twice; group members need distinct workers"
                )));
            }
        }
        self.run.note_next_level(workers, true);
        self.submit(
            callable,
            args_list.into_iter().collect(),
            Some(config),
            Target::NextLevel(workers.iter().copied().collect()),
            true,
        )
    }

    /// Refuses `callable` unless it is registered on this Worker as a `want` callable (the kind
    /// the submitting method runs); the method names itself in the error. Returns where it sits
    /// in `checked`, whose entry carries a kernel's signature for
    /// [`check_signature`](Self::check_signature).
    fn check_kind(&mut self, callable: &CallableHandle, want: CallableKind) -> Result<usize> {
        let digest = callable.digest();
        if let Some(at) = self.checked.iter().position(|(d, k, _)| *d == digest && *k == want) {
            return Ok(at);
        }
        let known = self.eng.callables.read().get(&digest).cloned();
        match known {
            Some(registered) if registered.kind == want => {
                if self.checked.len() >= CHECKED_MAX {
                    self.checked.clear();
                }
                self.checked.push((digest, want, registered));
                Ok(self.checked.len() - 1)
            }
            known => Err(self.kind_error(callable, known.map_or(callable.kind(), |r| r.kind), want)),
        }
    }

    /// Refuses a task whose arguments do not match the parameters that the kernel at
    /// `checked[at]` declares in its OpenCL C source (an [`ErrorKind::InvalidArgument`] error
    /// naming it, what it declares and what the task passed); nothing to check for a callable
    /// without such a signature.
    fn check_signature(&self, at: usize, callable: &CallableHandle, args: &TaskArgs) -> Result<()> {
        match &self.checked[at].2.signature {
            None => Ok(()),
            Some(sig) => {
                sig.check(callable, args.tensors.iter().map(|t| t.view().dtype()), args.scalars.len())
            }
        }
    }

    /// Why `callable` (of `kind`, or registered as `kind`) cannot run through a method that runs
    /// `want` callables: the wrong kind, no worker that runs `want`, or not registered.
    fn kind_error(&self, callable: &CallableHandle, kind: CallableKind, want: CallableKind) -> Error {
        let cfg = &self.eng.cfg;
        let (noun, adds) = cfg.next_level_names;
        let message = if kind != want && kind == CallableKind::Chip && want == CallableKind::Orch {
            format!(
                "{callable} is a chip callable, but this Worker's NEXT_LEVEL workers are {noun}s, which run orchestration callables; submit chip callables from an orchestration callable placed on a {noun} that has chips"
            )
        } else if kind == CallableKind::Orch && want != CallableKind::Orch {
            let (place, runs) = if want == CallableKind::HostFn {
                ("SUB workers".to_string(), "host functions")
            } else {
                (format!("{noun}s"), "chip callables")
            };
            format!(
                "{callable} is an orchestration callable, but this Worker's {place} run {runs}; run it as a run of this Worker (`name::call(..)?.run(&worker)` or `.submit(&worker)`), or place it on a nested Worker under a Worker one level up"
            )
        } else if kind != want {
            let article = |k: CallableKind| if k == CallableKind::Orch { "an" } else { "a" };
            format!(
                "{callable} is {} {} callable, but this API runs {} callables",
                article(kind),
                kind.name(),
                want.name()
            )
        } else if want == CallableKind::HostFn && cfg.sub_workers == 0 {
            format!(
                "{callable} cannot run: this Worker has no SUB workers; add them with WorkerBuilder::sub_workers(n)"
            )
        } else if want != CallableKind::HostFn && cfg.next_level_workers == 0 {
            format!("{callable} cannot run: this Worker has no {noun}s; add them with {adds}")
        } else {
            format!("callable {callable} is not registered on this Worker; register it first")
        };
        Error::new(ErrorKind::Callable, message)
    }

    fn check_sub_pool(&self, callable: &CallableHandle, need: usize) -> Result<()> {
        let n = self.eng.cfg.sub_workers;
        if need > n {
            let why = if n == 0 {
                "this Worker has no SUB workers; add them with WorkerBuilder::sub_workers(n)".to_string()
            } else {
                format!("it needs {need} SUB workers at once but this Worker has {n}")
            };
            return Err(Error::invalid(format!("{callable} cannot run: {why}")));
        }
        Ok(())
    }

    /// Refuses a task of the callable at `checked[at]` placed on `worker` when that worker does
    /// not have it (an orchestration function registered on some workers only): an
    /// [`ErrorKind::Callable`] error naming both and the workers that have it.
    fn check_placed(&self, at: usize, worker: u32, callable: &CallableHandle) -> Result<()> {
        let Some(placed) = &self.checked[at].2.placed else { return Ok(()) };
        if placed.binary_search(&worker).is_ok() {
            return Ok(());
        }
        // Only orchestration functions are placed: on nested and remote Workers alike.
        let noun = "worker";
        let on: Vec<String> = placed.iter().map(u32::to_string).collect();
        let has = match on.len() {
            0 => format!("no {noun} has it"),
            1 => format!("only {noun} {} has it", on[0]),
            _ => format!("only {noun}s {} have it", on.join(", ")),
        };
        Err(Error::new(
            ErrorKind::Callable,
            format!(
                "{callable} is not on {noun} {worker}: {has}; place the task on one of them, or have {noun} {worker} serve it too (Node::register_orch there, Worker::register_orch_on here)"
            ),
        ))
    }

    fn check_worker(&self, worker: u32, callable: &CallableHandle) -> Result<()> {
        let n = self.eng.cfg.next_level_workers;
        if worker as usize >= n {
            let (noun, adds) = self.eng.cfg.next_level_names;
            return Err(Error::invalid(format!(
                "{callable}: {noun} {worker} does not exist: this Worker has {n} {noun}s; add them with {adds}"
            )));
        }
        Ok(())
    }

    /// Allocates a runtime-managed intermediate from the heap ring of the current scope depth.
    ///
    /// The returned tensor is a contiguous view of the whole allocation. The bytes are
    /// reclaimed automatically once the enclosing scope has ended and every task that names the
    /// buffer has completed. Waits under back-pressure while the ring is full. Inside a chip
    /// orchestration ([`ChipFn::orchestration`](crate::chip::ChipFn::orchestration)) the bytes come
    /// from the chip's device memory instead, and the wait is for room there.
    ///
    /// ```no_run
    /// use simpler::{DataType, HostArgs, HostFn, HostResult, TaskArgs, Worker};
    ///
    /// fn add(args: &HostArgs<'_>) -> HostResult {
    ///     let (a, b, out) = (args.input::<f32>(0)?, args.input::<f32>(1)?, args.output::<f32>(2)?);
    ///     for i in 0..out.len() {
    ///         out[i] = a[i] + b[i];
    ///     }
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(2).build()?;
    /// let add = worker.register(HostFn::new("add", add))?;
    /// worker.init()?;
    /// let (x, out) = (worker.create_buffer(4 * 256)?, worker.create_buffer(4 * 256)?);
    /// x.write(0, &[1.0f32; 256])?;
    /// let (tx, tout) = (x.tensor(&[256], DataType::Float32)?, out.tensor(&[256], DataType::Float32)?);
    /// worker.run(|orch| {
    ///     // out = (x + x) + (x + x), with both partial sums in runtime-managed memory.
    ///     let s1 = orch.alloc(&[256], DataType::Float32)?;
    ///     let s2 = orch.alloc(&[256], DataType::Float32)?;
    ///     for s in [&s1, &s2] {
    ///         let mut args = TaskArgs::new();
    ///         args.input(&tx)?.input(&tx)?.output(s)?;
    ///         orch.submit_sub(&add, args)?;
    ///     }
    ///     let mut args = TaskArgs::new();
    ///     args.input(&s1)?.input(&s2)?.output(&tout)?; // waits for both partial sums
    ///     orch.submit_sub(&add, args)?;
    ///     Ok(())
    /// })?;
    /// assert_eq!(out.read::<f32>(0, 256)?, vec![4.0; 256]);
    /// # Ok(()) }
    /// ```
    pub fn alloc(&mut self, shape: &[u32], dtype: DataType) -> Result<Tensor> {
        self.alloc_at(Place::Host, shape, dtype)
    }

    /// As [`alloc`](Self::alloc), for an intermediate that only kernels on chip `chip` use: on
    /// an L3 Worker with a device heap on that chip
    /// ([`WorkerBuilder::chip_heap_ring_size`](crate::WorkerBuilder::chip_heap_ring_size)), its
    /// bytes live in the chip's memory, so the kernels that write and read it copy nothing to
    /// or from the host. Elsewhere (no device heap, a remote or replaced chip, another level) it
    /// is an ordinary host intermediate. Only tasks on chip `chip` may name a device one; a SUB
    /// task or another chip's kernel is refused at submit, naming the tensor.
    ///
    /// `task_graph!` uses it for an `alloc` whose every task runs on one chip given as a
    /// constant (`.on(chip(0))`).
    ///
    /// ```no_run
    /// use simpler::{chip::CallConfig, chip::ChipFn, DataType, HostArgs, HostResult, TaskArgs, Worker};
    ///
    /// fn fill(args: &HostArgs<'_>) -> HostResult {
    ///     args.output::<f32>(0)?.fill(1.0);
    ///     Ok(())
    /// }
    /// fn check(args: &HostArgs<'_>) -> HostResult {
    ///     assert!(args.input::<f32>(0)?.iter().all(|&v| v == 1.0));
    ///     Ok(())
    /// }
    /// # fn main() -> simpler::Result<()> {
    /// let (produce, consume) = (ChipFn::kernel("fill", fill), ChipFn::kernel("check", check));
    /// let mut worker = Worker::builder().chips(1).chip_heap_ring_size(1 << 20).build()?;
    /// let (produce, consume) = (worker.register_chip(produce)?, worker.register_chip(consume)?);
    /// worker.init()?;
    /// worker.run(|orch| {
    ///     let tmp = orch.alloc_on(0, &[256], DataType::Float32)?; // stays on chip 0
    ///     let mut a = TaskArgs::new();
    ///     a.output(&tmp)?;
    ///     orch.submit_next_level(&produce, a, CallConfig::default(), 0)?;
    ///     let mut b = TaskArgs::new();
    ///     b.input(&tmp)?;
    ///     orch.submit_next_level(&consume, b, CallConfig::default(), 0)?;
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn alloc_on(&mut self, chip: u32, shape: &[u32], dtype: DataType) -> Result<Tensor> {
        self.alloc_at(Place::Chip(chip), shape, dtype)
    }

    fn alloc_at(&mut self, place: Place, shape: &[u32], dtype: DataType) -> Result<Tensor> {
        let view = TensorView::new(0, shape, None, dtype).map_err(|e| e.context("orch.alloc"))?;
        let bytes = view.extent_bytes();
        let ring = ring_for_depth(self.scope_depth());
        self.claim_window().map_err(|e| e.context("orch.alloc"))?;
        let identity = match self.eng.minter.mint() {
            Ok(id) => id,
            Err(e) => {
                self.eng.window.release();
                return Err(e);
            }
        };
        let eng = self.eng;
        // A block of the scope's heap ring, or, inside a chip, of the chip's memory.
        let try_alloc = || eng.heap.alloc(place, ring, bytes, identity);
        let mut got = try_alloc();
        if matches!(got, Ok(None)) {
            let deadline = crate::sys::clock::after(self.eng.cfg.backpressure_timeout);
            let cell = std::cell::RefCell::new(None);
            let _waiting = crate::engine::CapacityWait::new(self.eng);
            self.eng.drive_until(
                || {
                    if cell.borrow().is_some() {
                        return true;
                    }
                    match try_alloc() {
                        Ok(None) => false,
                        other => {
                            *cell.borrow_mut() = Some(other);
                            true
                        }
                    }
                },
                Some(deadline),
            );
            got = cell.into_inner().unwrap_or(Ok(None));
        }
        let (block, backing) = match got {
            Ok(Some(b)) => b,
            Ok(None) => {
                self.eng.window.release();
                let waited = self.eng.cfg.backpressure_timeout;
                let (what, knob, size) = self.eng.heap.exhausted(place, ring);
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "orch.alloc: {what} (waited {waited:?} for {bytes} bytes); raise WorkerBuilder::{knob} (now {size} bytes) or end scopes sooner"
                    ),
                ));
            }
            Err(e) => {
                self.eng.window.release();
                return Err(e);
            }
        };
        let desc = BufferDesc::new(identity, backing, Access::ReadWrite, bytes)?;
        self.allocs += 1;
        let hold = HeapHold { identity, block };
        let slot = Arc::new(Slot::new(self.run.clone(), self.allocs - 1, None, Some(hold)));
        {
            let mut l = slot.lock();
            l.fanout_total = 1; // the scope's reference
            l.fanout_released = 1; // born COMPLETED: its own release is done
        }
        slot.set_state(State::Completed);
        self.run.slot_created();
        self.eng.tensor_map.insert_creator(self.run.id, identity, slot.clone());
        self.scopes.last_mut().expect("outer scope").push(slot);
        Tensor::from_desc(desc, view)
    }

    /// Opens a nested scope (see [`scope`](Self::scope), the public way: generated graph code
    /// and the engine's tests pair this with [`scope_end`](Self::scope_end)).
    pub(crate) fn scope_begin(&mut self) -> Result<()> {
        if self.scopes.len() >= MAX_SCOPE_DEPTH {
            return Err(Error::state(format!(
                "Orchestrator::scope: scopes nest at most {MAX_SCOPE_DEPTH} deep (the run's outer scope included)"
            )));
        }
        let frame = self.frames.pop().unwrap_or_default();
        self.scopes.push(frame);
        Ok(())
    }

    /// Closes the innermost scope opened by [`scope_begin`](Self::scope_begin). Never blocks;
    /// an end without a matching begin is an error.
    pub(crate) fn scope_end(&mut self) -> Result<()> {
        if self.scopes.len() <= self.scope_floor {
            return Err(Error::state(if self.scope_floor > 1 {
                "scope_end would close the scope opened by Orchestrator::scope; it closes itself"
            } else {
                "scope_end without a matching scope_begin"
            }));
        }
        self.end_top_scope();
        Ok(())
    }

    /// Runs `f` inside a nested scope, which ends when `f` returns, also when it fails.
    ///
    /// Tasks and allocations inside it use the heap ring of their depth (`min(depth, 3)`:
    /// depths 3 and deeper share ring 3), and its `alloc` memory is reclaimed as soon as its
    /// tasks are done, independently of outer scopes, instead of living until the run ends.
    /// Scopes nest at most [`MAX_SCOPE_DEPTH`](crate::MAX_SCOPE_DEPTH) deep, the run's outer
    /// scope included. Ending a scope never blocks: its tasks keep running, and their places
    /// in the task window and their memory are given back as they complete.
    ///
    /// Returns what `f` returns, e.g. a [`TaskHandle`] to depend on outside the scope.
    ///
    /// ```no_run
    /// use simpler::{DataType, HostArgs, HostFn, HostResult, TaskArgs, Worker};
    ///
    /// fn add(args: &HostArgs<'_>) -> HostResult {
    ///     let (a, b, out) = (args.input::<f32>(0)?, args.input::<f32>(1)?, args.output::<f32>(2)?);
    ///     for i in 0..out.len() {
    ///         out[i] = a[i] + b[i];
    ///     }
    ///     Ok(())
    /// }
    ///
    /// fn report(_args: &HostArgs<'_>) -> HostResult {
    ///     eprintln!("layer done");
    ///     Ok(())
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(2).build()?;
    /// let add = worker.register(HostFn::new("add", add))?;
    /// let report = worker.register(HostFn::new("report", report))?;
    /// worker.init()?;
    /// let (x, out) = (worker.create_buffer(4 * 32)?, worker.create_buffer(4 * 32)?);
    /// x.write(0, &[1.0f32; 32])?;
    /// let (tx, tout) = (x.tensor(&[32], DataType::Float32)?, out.tensor(&[32], DataType::Float32)?);
    /// worker.run(|orch| {
    ///     // out = 4x: the intermediate lives only inside the scope.
    ///     let last = orch.scope(|orch| {
    ///         let twice = orch.alloc(&[32], DataType::Float32)?;
    ///         let mut args = TaskArgs::new();
    ///         args.input(&tx)?.input(&tx)?.output(&twice)?;
    ///         orch.submit_sub(&add, args)?;
    ///         let mut args = TaskArgs::new();
    ///         args.input(&twice)?.input(&twice)?.output(&tout)?;
    ///         orch.submit_sub(&add, args) // the scope ends when this returns, `?` or not
    ///     })?;
    ///     let mut args = TaskArgs::new();
    ///     args.add_dep(last);
    ///     orch.submit_sub(&report, args)?;
    ///     Ok(())
    /// })?;
    /// assert_eq!(out.read::<f32>(0, 32)?, vec![4.0; 32]);
    /// # Ok(()) }
    /// ```
    pub fn scope<R>(&mut self, f: impl FnOnce(&mut Orchestrator<'a>) -> Result<R>) -> Result<R> {
        self.scope_begin()?;
        let depth = self.scopes.len();
        let outer_floor = std::mem::replace(&mut self.scope_floor, depth);
        let out = f(self);
        self.scope_floor = outer_floor;
        while self.scopes.len() >= depth {
            self.end_top_scope();
        }
        out
    }

    fn end_top_scope(&mut self) {
        if let (Some(cap), Some(frame)) = (&self.run.capture, self.scopes.last()) {
            let tasks = frame.iter().filter(|s| s.task.is_some()).count();
            let stat = crate::dfx::graph::ScopeStat {
                depth: self.scopes.len(),
                tasks,
                allocations: frame.len() - tasks,
            };
            sync::lock(cap).scopes.push(stat);
        }
        if let Some(mut frame) = self.scopes.pop() {
            for slot in frame.drain(..) {
                self.eng.release_ref(&slot);
            }
            if self.frames.len() < SPARE_FRAMES && frame.capacity() <= SPARE_CAPACITY {
                self.frames.push(frame);
            }
        }
    }

    /// Claims one place in the task window, waiting for one (driving the scheduler) up to the
    /// backpressure timeout; the caller names itself in the error.
    fn claim_window(&self) -> Result<()> {
        if self.eng.window.try_claim() {
            return Ok(());
        }
        let deadline = crate::sys::clock::after(self.eng.cfg.backpressure_timeout);
        let w = &self.eng.window;
        let claimed = std::cell::Cell::new(false);
        let _waiting = crate::engine::CapacityWait::new(self.eng);
        // At most one claim, however often the condition is evaluated.
        self.eng.drive_until(
            || {
                if !claimed.get() && w.try_claim() {
                    claimed.set(true);
                }
                claimed.get()
            },
            Some(deadline),
        );
        if claimed.get() {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "the task window is full ({} live tasks, waited {:?}); tasks in a scope stay live until the scope ends, so open scopes (orch.scope) around batches of work, or raise WorkerBuilder::task_window",
                    w.capacity(),
                    self.eng.cfg.backpressure_timeout
                ),
            ))
        }
    }

    fn validate_args(&self, callable: &CallableHandle, args: &TaskArgs) -> Result<()> {
        check_tensor_args(callable, args)?;
        for dep in &args.deps {
            if dep.task.run != self.run.id {
                return Err(Error::invalid(format!(
                    "{callable}: dependency on task {} of run {}, but this is run {}; explicit dependencies must name tasks of the same run",
                    dep.task.index, dep.task.run, self.run.id
                )));
            }
            if dep.task.index as usize >= self.tasks.len() {
                return Err(Error::invalid(format!(
                    "{callable}: dependency on task {} which has not been submitted",
                    dep.task.index
                )));
            }
        }
        Ok(())
    }

    /// Refuses arguments whose encoding would not fit the mailbox a task crosses.
    fn check_args_size(&self, callable: &CallableHandle, args: &TaskArgs) -> Result<()> {
        let Some(cap) = self.eng.cfg.args_capacity else { return Ok(()) };
        let (t, s) = (args.tensors.len(), args.scalars.len());
        let need = blob_size(t, s);
        if need <= cap {
            return Ok(());
        }
        let header = blob_size(0, 0);
        let (per_tensor, per_scalar) = (blob_size(1, 0) - header, blob_size(0, 1) - header);
        Err(Error::invalid(format!(
            "{callable}: the task's arguments ({t} tensors and {s} scalars) take {need} bytes, more than the {cap} bytes a worker's mailbox holds (at most {} tensors, or {} scalars, each tensor taking {per_tensor} bytes and each scalar {per_scalar}); split the task or pass values in a tensor",
            (cap - header) / per_tensor,
            (cap - header) / per_scalar
        )))
    }

    /// Device tensors may only go to the chip that owns them, and only while they are live.
    fn validate_placement(
        &self,
        callable: &CallableHandle,
        args: &TaskArgs,
        target: &Target,
        member: usize,
    ) -> Result<()> {
        for (i, t) in args.tensors.iter().enumerate() {
            let owner = t.desc().identity().owner();
            if self.eng.cfg.owners.as_ref().is_some_and(|owners| !owners.contains(&owner)) {
                return Err(Error::invalid(format!(
                    "{callable}: tensor {i} names buffer {} of another Worker; a Buffer can be named only in runs of the Worker that created it (and of the Workers nested below it): create it with this Worker's create_buffer",
                    t.buffer_label()
                )));
            }
            self.check_alloc_live(callable, i, t)?;
            if let Some(chip) = t.desc().device_chip() {
                let runs_on = match target {
                    Target::Sub => None,
                    Target::NextLevel(ws) => Some(ws[member]),
                };
                let intermediate =
                    owner == self.eng.minter.owner() && self.eng.heap.hands_out(&t.desc().backing());
                let writes = args.tags[i].access().can_write();
                let used = DeviceUse {
                    callable,
                    tensor: i,
                    chip,
                    id: t.desc().identity(),
                    runs_on,
                    intermediate,
                    writes,
                };
                self.eng.devices.check(&used)?;
            }
            // After the checks with more precise messages.
            if let Some(grant) = &self.grant {
                let id = t.desc().identity();
                if owner != self.eng.minter.owner()
                    && !grant.iter().any(|(g, v)| *g == id && overlap(v, t.view()) == Overlap::Covered)
                {
                    return Err(Error::invalid(format!(
                        "{callable}: tensor {i} names bytes of buffer {id} that this run was not given: a run for a task of the level above may use only views inside its arguments and its own orch.alloc intermediates ({} view(s) of that buffer given)",
                        grant.iter().filter(|(g, _)| *g == id).count()
                    )));
                }
            }
        }
        Ok(())
    }

    /// An `orch.alloc` tensor of this engine is usable only while its allocation is live in
    /// this run: after its scope ended and it was reclaimed, the bytes belong to another
    /// allocation. Inside a chip `orch.alloc` hands out device memory under the same nonce.
    fn check_alloc_live(&self, callable: &CallableHandle, i: usize, t: &Tensor) -> Result<()> {
        let id = t.desc().identity();
        if id.owner() == self.eng.minter.owner()
            && self.eng.heap.hands_out(&t.desc().backing())
            && !self.eng.tensor_map.has_creator(self.run.id, id)
        {
            return Err(not_live(callable, i, id, self.run.id));
        }
        Ok(())
    }

    /// When the run has failed: the error a submit of `callable` gets, the run's first error
    /// with the refusal as its context. Noted, so that the orchestration function ending with
    /// it (as `?` makes it) ends the run's building without failing more than the run's
    /// failure did ([`ended_by_refusal`](Orchestrator::ended_by_refusal)).
    fn refusal(&mut self, callable: &CallableHandle) -> Option<Error> {
        let e = self
            .run
            .first_error()?
            .context(format!("submit of {callable} refused: run {} already failed", self.run.id));
        self.refused = true;
        Some(e)
    }

    /// Whether `e`, the orchestration function's error, is a refused submit's passed on (a
    /// submit was refused because the run had failed, and `e` is of the run's error's kind
    /// and carries its message, as the refusal and any context added to it do): the run
    /// already has its error, and the function adds none. The run then ends as a failed run
    /// whose function returned `Ok` does: its tasks that do not depend on the failure still
    /// run, and waiting for it gives the run's first error. So the outcome does not depend on
    /// whether the failure came before or after the function's next submit. Not for a run that
    /// is done while it is built (abandoned after a scheduler panic, or by `close`): its
    /// unstarted tasks are failed as for an error of the function's own.
    pub(crate) fn ended_by_refusal(&self, e: &Error) -> bool {
        self.refused
            && !self.run.is_done()
            && self
                .run
                .first_error()
                .is_some_and(|first| first.kind() == e.kind() && e.message().contains(first.message()))
    }

    fn submit(
        &mut self,
        callable: &CallableHandle,
        args_list: SmallVec<[TaskArgs; 1]>,
        config: Option<CallConfig>,
        target: Target,
        group: bool,
    ) -> Result<TaskHandle> {
        if let Some(e) = self.refusal(callable) {
            return Err(e);
        }
        // SUB tasks carry no config (`None`); a next-level config equal to the default is
        // stored as `None` too, so most slots stay small.
        let config = match config {
            Some(c) => {
                c.validate()?;
                (c != CallConfig::new()).then(|| Box::new(c))
            }
            None => None,
        };
        for (member, args) in args_list.iter().enumerate() {
            self.check_args_size(callable, args)?;
            self.validate_args(callable, args)?;
            self.validate_placement(callable, args, &target, member)?;
        }
        if args_list.len() > 1 {
            check_members_disjoint(callable, &args_list)?;
        }
        // Step 1.
        self.claim_window().map_err(|e| e.context("submit"))?;
        if let Some(e) = self.refusal(callable) {
            // The run failed while this submit waited for room.
            self.eng.window.release();
            return Err(e);
        }
        // The claim may have driven the scheduler, and a task that completed meanwhile may have
        // been the last to hold an allocation checked live above: check again. (A driver on
        // another thread can still reclaim one before the attach; the attach refuses that.)
        for args in &args_list {
            for (i, t) in args.tensors.iter().enumerate() {
                if let Err(e) = self.check_alloc_live(callable, i, t) {
                    self.eng.window.release();
                    return Err(e);
                }
            }
        }
        // Step 2.
        let index = self.tasks.len() as u32;
        let names_device =
            args_list.iter().flat_map(|a| a.tensors.iter()).any(|t| t.desc().device_chip().is_some());
        // Released when the slot is consumed (`Engine::consume`).
        let holds = crate::engine::slot::BufferHolds::take(&args_list);
        let task = TaskData {
            callable: callable.clone(),
            args: args_list,
            config,
            target,
            group,
            names_device,
            holds,
        };
        if names_device {
            // Released when the slot is consumed (`Engine::consume`).
            for id in task.device_buffers() {
                self.eng.devices.hold(id);
            }
        }
        let slot = Arc::new(Slot::new(self.run.clone(), index, Some(task), None));
        self.run.slot_created();
        self.run.tasks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.tasks.push(Arc::downgrade(&slot));
        self.scopes.last_mut().expect("outer scope").push(slot.clone());
        let _span = tracing::trace_span!(target: "simpler::orchestrator", "submit", run_id = self.run.id, task_index = index).entered();

        // Step 3: the tag walk.
        struct Producer {
            slot: Arc<Slot>,
            orders: bool,
            retains: bool,
            /// For an allocation's creator: the tensor (index, identity) that names it.
            memory: Option<(usize, Identity)>,
        }
        let mut producers: SmallVec<[Producer; 8]> = SmallVec::new();
        let mut add = |p: Arc<Slot>, orders: bool, retains: bool, memory: Option<(usize, Identity)>| {
            if Arc::ptr_eq(&p, &slot) {
                return;
            }
            if let Some(e) = producers.iter_mut().find(|e| Arc::ptr_eq(&e.slot, &p)) {
                e.orders |= orders;
                e.retains |= retains;
                e.memory = e.memory.or(memory);
            } else {
                producers.push(Producer { slot: p, orders, retains, memory });
            }
        };
        // When a captured task was submitted (`None`: not captured).
        let mut submitted = None;
        if let Some(cap) = &self.run.capture {
            // Before the task is published, so that its later events find its record.
            let mut cap = sync::lock(cap);
            let now = crate::sys::clock::monotonic_ns();
            cap.times.submitted(index, now);
            submitted = Some(now);
            if cap.dump_args {
                let text = crate::dfx::graph::describe_args(&slot.task().args);
                cap.args_text.push((index, text));
            }
        }
        let mut written: SmallVec<[Identity; 4]> = SmallVec::new();
        let task = slot.task();
        let staging = self.eng.staging.load(std::sync::atomic::Ordering::Relaxed);
        let mut walk = self.eng.tensor_map.walk();
        let mut found = Found::default();
        for (member, args) in task.args.iter().enumerate() {
            for (arg, (t, tag)) in args.tensors.iter().zip(&args.tags).enumerate() {
                if t.desc().nbytes() == 0 {
                    continue;
                }
                let id = t.desc().identity();
                // A static tensor's edges are the task's deps: only its allocation's creator
                // is looked up (as for `NoDep`), so that the task retains the memory.
                let untracked_write = *tag == Tag::NoDep || (args.is_static(arg) && tag.writes());
                let tag = if args.is_static(arg) { &Tag::NoDep } else { tag };
                // Readers wait for the writers (RaW, and retain them); writers wait for the
                // writers (WaW) and the readers since (WaR), for ordering only.
                let mut recorded =
                    walk.visit(self.run.id, id, t.view(), *tag, &slot, (member, arg), &mut found);
                // An untracked writer orders nothing, but a successor run's task staged while
                // this run executes must not copy its bytes in before it ended.
                if staging && untracked_write {
                    recorded |= walk.untracked_writer(self.run.id, id, &slot, (member, arg));
                }
                if recorded && !written.contains(&id) {
                    written.push(id);
                }
                if let Some(c) = found.creator.take() {
                    add(c, false, true, Some((arg, id)));
                }
                for w in found.writers.drain(..) {
                    add(w, true, tag.reads(), None);
                }
                for r in found.readers.drain(..) {
                    add(r, true, false, None);
                }
            }
        }
        drop(walk);
        for args in &task.args {
            for dep in &args.deps {
                if let Some(p) = self.tasks.get(dep.task.index) {
                    add(p, true, dep.retain, None);
                }
            }
        }

        // Step 4: attach.
        let mut live = 0u32;
        // How many of the tasks it waits for run or wait chained now on SUB workers (it may be
        // chained behind one of them, after the other if there are two, or two deep behind
        // both on one worker).
        let mut behind_running = 0u32;
        let mut failed: Option<Error> = None;
        let mut lost: Option<Error> = None;
        for p in producers {
            match p.slot.attach(&slot, p.orders, p.retains) {
                // A creator gone means its memory is reclaimed and may already be another
                // allocation's: the task must not run on it.
                Attached::Gone => {
                    if let (Some((i, id)), None) = (p.memory, &lost) {
                        lost = Some(not_live(callable, i, id, self.run.id));
                    }
                }
                Attached::Linked { waits, failure } => {
                    live += u32::from(waits);
                    behind_running += u32::from(
                        waits
                            && matches!(p.slot.state(), State::Running | State::Chained)
                            && p.slot.task.as_ref().is_some_and(TaskData::is_sub_single),
                    );
                    if failed.is_none() {
                        failed = failure;
                    }
                }
            }
        }

        // Step 5: publish. A task that lost an allocation is published failed, which undoes
        // its links and references as for any task that cannot run, and the submit fails.
        if let Some(err) = lost {
            self.publish(&slot, live, Some(err.clone()), written, submitted);
            self.capture_task(&slot, callable);
            return Err(err);
        }
        let failed = failed.map(|cause| {
            Error::new(
                ErrorKind::Poisoned,
                format!("{} did not run: a task it depends on failed: {}", slot.describe(), cause.message()),
            )
        });
        let pending = self.publish(&slot, live, failed, written, submitted);
        if pending && live <= 2 && behind_running == live && slot.task().is_sub_single() {
            self.eng.chain_chance();
        }
        self.capture_task(&slot, callable);
        Ok(TaskHandle { run: self.run.id, index })
    }

    /// Records a submitted task in the run's DAG when the run is captured, after it was
    /// published, so the worker may already run it meanwhile: one hold of the lock, and no
    /// text made per task ([`CapturedTask`]). The DAG has every dependency the tags and deps
    /// express, also on tasks that already finished (and left the TensorMap): the same run
    /// gives the same DAG. (Only this thread records, in submission order.)
    fn capture_task(&self, slot: &Arc<Slot>, callable: &CallableHandle) {
        let Some(cap) = &self.run.capture else { return };
        let mut cap = sync::lock(cap);
        let edges = cap.edges_for(slot.index, &slot.task().args);
        let task = CapturedTask {
            index: slot.index,
            callable: callable.shared_name().clone(),
            digest: callable.digest(),
            placed: match &slot.task().target {
                Target::Sub => Placed::Sub,
                Target::NextLevel(ws) => Placed::Workers(ws.clone()),
            },
            members: slot.task().args.len() as u32,
        };
        cap.record(task, edges);
    }

    /// Publishes `slot` (rule 2 of the slot module): ready, pending, or failed with `failure`;
    /// true when pending. `submitted`: when it was submitted, if its run is captured.
    fn publish(
        &self,
        slot: &Arc<Slot>,
        live: u32,
        failure: Option<Error>,
        written: SmallVec<[Identity; 4]>,
        submitted: Option<u64>,
    ) -> bool {
        match slot.publish(live, written, failure) {
            Published::Ready => {
                self.eng.publish_ready(slot.clone());
                // Ready since its submit (nothing to wait for), noted once it is out: no
                // clock read nor lock on the task's path.
                if let Some(at) = submitted {
                    slot.run.note_at(slot.index, crate::dfx::timeline::TaskEvent::Ready, at);
                }
            }
            Published::Pending => {
                self.eng.submitted_pending();
                return true;
            }
            Published::Failed(err) => {
                self.eng.fail_unstarted(slot, err);
            }
        }
        false
    }

    /// What the run's tasks not yet consumed name (see [`Footprint`](crate::engine::run::Footprint)).
    fn footprint(&self) -> crate::engine::run::Footprint {
        let mut buffers: Vec<(Identity, bool)> = Vec::new();
        for slot in self.tasks.alive() {
            let task = slot.task();
            for args in &task.args {
                for (t, tag) in args.tensors.iter().zip(&args.tags) {
                    buffers.push((t.desc().identity(), tag.access().can_write()));
                }
            }
        }
        // One entry per buffer, writing when any task writes it.
        buffers.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        buffers.dedup_by_key(|e| e.0);
        crate::engine::run::Footprint { buffers: buffers.into_boxed_slice() }
    }

    /// Ends the run's building: closes every open scope and submission. On an orchestration
    /// error, first fails every task that has not started.
    pub(crate) fn finish(mut self, error: Option<&Error>) {
        if let Some(err) = error {
            self.run.record_error(err.clone());
            // Its staged tasks are withdrawn by the scheduler (`activate_staged`).
            self.run.mark_build_failed();
            let live: Vec<Arc<Slot>> = self.tasks.alive().collect();
            self.eng.cancel_unstarted(&live, err);
            // Its chained tasks are withdrawn by the scheduler's next look for chains.
            self.eng.chain_chance();
        }
        if self.scopes.len() > 1 {
            tracing::warn!(target: "simpler::orchestrator", run_id = self.run.id, open = self.scopes.len() - 1, "orchestration returned with scopes still open; closing them");
        }
        while !self.scopes.is_empty() {
            self.end_top_scope();
        }
        // A run behind another one may dispatch before its turn once it is independent of the
        // runs ahead (`Scheduler::dispatch_independent`): what its tasks name is recorded
        // first, and the scheduler is told its submission closed (its check may pass now).
        let behind = error.is_none() && self.eng.head_run() != self.run.id;
        if behind {
            let _ = self.run.footprint.set(self.footprint());
        }
        if self.run.close_submission() {
            self.eng.run_finished(&self.run);
        } else if behind {
            self.eng.runs_changed();
        }
        // Keep the buffers for the next run (the weak task references go now: they pin the
        // slots' memory).
        self.tasks.clear();
        let spare = OrchBuffers {
            scopes: std::mem::take(&mut self.scopes),
            frames: std::mem::take(&mut self.frames),
            tasks: std::mem::take(&mut self.tasks),
            checked: std::mem::take(&mut self.checked),
            checked_generation: self.checked_generation,
        };
        *sync::lock(&self.eng.orch_spare) = spare;
    }
}

/// The error of a submit whose tensor `i` names an `orch.alloc` allocation `id` that is not live
/// in run `run`.
fn not_live(callable: &CallableHandle, i: usize, id: Identity, run: u64) -> Error {
    Error::invalid(format!(
        "{callable}: tensor {i} names orch.alloc buffer {id} that is not live in run {run}: its scope ended and its memory was reclaimed (or it belongs to another run)"
    ))
}

/// Access and aliasing of one task's tensors: each tag within what its buffer grants, and no
/// two tensors of one buffer overlapping when either is written (the worker hands out `&mut`).
/// The members of one group task run at the same time and nothing orders them: no member may
/// write bytes another member names (`NoDep` tensors excepted: their caller took the ordering
/// over, `TaskArgs::no_dep`).
fn check_members_disjoint(callable: &CallableHandle, members: &[TaskArgs]) -> Result<()> {
    use crate::data::task_args::Tag;
    for (i, a) in members.iter().enumerate() {
        for (j, b) in members.iter().enumerate().skip(i + 1) {
            for (x, (ta, tag_a)) in a.tensors.iter().zip(&a.tags).enumerate() {
                for (y, (tb, tag_b)) in b.tensors.iter().zip(&b.tags).enumerate() {
                    if *tag_a == Tag::NoDep || *tag_b == Tag::NoDep || !(tag_a.writes() || tag_b.writes()) {
                        continue;
                    }
                    if ta.desc().identity() == tb.desc().identity()
                        && overlap(ta.view(), tb.view()) != Overlap::None
                    {
                        return Err(Error::invalid(format!(
                            "{callable}: group members {i} and {j} overlap in buffer {} (tensor {x} of member {i}, tensor {y} of member {j}) and one of them writes it; members run at the same time, so give each its own view",
                            ta.buffer_label()
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

pub(crate) fn check_tensor_args(callable: &CallableHandle, args: &TaskArgs) -> Result<()> {
    for (i, (t, tag)) in args.tensors.iter().zip(&args.tags).enumerate() {
        let granted = t.desc().access();
        let needed = tag.access();
        if *tag != crate::data::task_args::Tag::NoDep && !granted.allows(needed) {
            return Err(Error::invalid(format!(
                "{callable}: tensor {i} is tagged {tag:?}, which needs {needed:?} access, but its buffer grants {granted:?}"
            )));
        }
    }
    let n = args.tensors.len();
    for i in 0..n {
        for j in i + 1..n {
            let (a, b) = (&args.tensors[i], &args.tensors[j]);
            let writes =
                |k: usize| args.tags[k].writes() || args.tags[k] == crate::data::task_args::Tag::NoDep;
            if (writes(i) || writes(j))
                && a.desc().identity() == b.desc().identity()
                && overlap(a.view(), b.view()) != Overlap::None
            {
                return Err(Error::invalid(format!(
                    "{callable}: tensors {i} and {j} overlap in buffer {} and at least one is written; pass disjoint views",
                    a.buffer_label()
                )));
            }
        }
    }
    Ok(())
}
