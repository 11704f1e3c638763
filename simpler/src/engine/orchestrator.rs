//! The Orchestrator: turns `submit_*` calls into a DAG.
//!
//! One submit, end to end (upstream "7 steps"):
//!
//! 0. validate everything that can be checked before any state changes (the run has not failed,
//!    the config, the callable's kind and registration, the targets, every tensor's access and
//!    aliasing, explicit dependencies belong to this run);
//! 1. claim a place in the task window (waits under back-pressure);
//! 2. create the slot in BUILDING with all its task data and give the open scope a reference;
//! 3. walk the tags through the TensorMap: readers find the live writers of overlapping bytes,
//!    writers become the writer; every task naming an `orch.alloc` buffer retains its creator;
//! 4. attach to each producer under its lock (completed producers add no live fanin, a failed
//!    producer poisons the task);
//! 5. publish: fanin count and BUILDING -> PENDING | READY in one step under the slot's lock;
//! 6. route READY tasks to the scheduler.

use std::sync::{Arc, Weak};
use std::time::Instant;

use smallvec::SmallVec;

use crate::callable::identity::{CallableHandle, CallableKind};
use crate::data::buffer::{Access, Backing, BufferDesc, Identity};
use crate::data::call_config::CallConfig;
use crate::data::dtype::DataType;
use crate::data::task_args::{TaskArgs, TaskHandle};
use crate::data::tensor::{Overlap, Tensor, TensorView, overlap};
use crate::dfx::graph::{EdgeReason, TaskNode};
use crate::engine::Engine;
use crate::engine::ring::ring_for_depth;
use crate::engine::run::RunState;
use crate::engine::slot::{Member, Slot, State, Target, TaskData};
use crate::error::{Error, ErrorKind, Result};

/// Scope stack limit, counting the run's outer scope.
pub const MAX_SCOPE_DEPTH: usize = 64;

/// Builds one run's DAG; handed to the orchestration function.
///
/// Valid only inside the orchestration function it was passed to. Every `submit_*` returns a
/// [`TaskHandle`] for explicit dependencies; dependencies on tensors are inferred from tags.
///
/// ```no_run
/// # fn demo(worker: &simpler::Worker, f: &simpler::CallableHandle, t: &simpler::Tensor) -> simpler::Result<()> {
/// use simpler::{CallConfig, DataType, TaskArgs};
/// worker.run(|orch, _args, _cfg| {
///     let tmp = orch.alloc(&[1024], DataType::Float32)?; // runtime-managed intermediate
///     let mut produce = TaskArgs::new();
///     produce.input(t)?.output(&tmp)?;
///     orch.submit_sub(f, produce)?;
///     let mut consume = TaskArgs::new();
///     consume.input(&tmp)?; // waits for the producer: read-after-write
///     orch.submit_sub(f, consume)?;
///     Ok(())
/// }, TaskArgs::new(), CallConfig::default())
/// # }
/// ```
pub struct Orchestrator<'a> {
    eng: &'a Engine,
    run: Arc<RunState>,
    scopes: Vec<Vec<Arc<Slot>>>,
    tasks: Vec<Weak<Slot>>,
    allocs: u32,
    /// Callables already checked in this run (registration cannot go away mid-build: the
    /// Worker's `unregister` needs `&mut Worker`, which building excludes).
    checked: SmallVec<[(crate::callable::identity::Digest, CallableKind); 4]>,
}

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
        Orchestrator {
            eng,
            run,
            scopes: vec![Vec::new()],
            tasks: Vec::new(),
            allocs: 0,
            checked: SmallVec::new(),
        }
    }

    /// The id of the run being built.
    pub fn run_id(&self) -> u64 {
        self.run.id
    }

    /// Current scope depth: 0 in the run's outer scope, 1 inside the first `scope_begin`, ...
    pub fn scope_depth(&self) -> usize {
        self.scopes.len() - 1
    }

    /// Number of tasks submitted so far in this run.
    pub fn task_count(&self) -> usize {
        self.tasks.len()
    }

    /// Submits a host function to any idle SUB worker.
    #[track_caller]
    pub fn submit_sub(&mut self, callable: &CallableHandle, args: TaskArgs) -> Result<TaskHandle> {
        self.check_kind(callable, CallableKind::HostFn, "submit_sub")?;
        self.check_sub_pool(callable, 1)?;
        self.submit(callable, smallvec::smallvec![args], CallConfig::default(), Target::Sub, false)
    }

    /// Submits one task whose members run on `args_list.len()` distinct SUB workers at once
    /// (all or nothing). Member `i` gets `args_list[i]`.
    #[track_caller]
    pub fn submit_sub_group(
        &mut self,
        callable: &CallableHandle,
        args_list: Vec<TaskArgs>,
    ) -> Result<TaskHandle> {
        self.check_kind(callable, CallableKind::HostFn, "submit_sub_group")?;
        if args_list.is_empty() {
            return Err(Error::invalid(format!("submit_sub_group of {callable}: args_list is empty")));
        }
        self.check_sub_pool(callable, args_list.len())?;
        self.submit(callable, args_list.into_iter().collect(), CallConfig::default(), Target::Sub, true)
    }

    /// Submits a task to exactly one NEXT_LEVEL worker.
    #[track_caller]
    pub fn submit_next_level(
        &mut self,
        callable: &CallableHandle,
        args: TaskArgs,
        config: CallConfig,
        worker: u32,
    ) -> Result<TaskHandle> {
        self.check_kind(callable, self.eng.cfg.next_level_kind, "submit_next_level")?;
        self.check_worker(worker, callable)?;
        self.submit(
            callable,
            smallvec::smallvec![args],
            config,
            Target::NextLevel(smallvec::smallvec![worker]),
            false,
        )
    }

    /// Submits one task whose member `i` runs `args_list[i]` on `workers[i]`, all launched
    /// together or not at all.
    #[track_caller]
    pub fn submit_next_level_group(
        &mut self,
        callable: &CallableHandle,
        args_list: Vec<TaskArgs>,
        config: CallConfig,
        workers: &[u32],
    ) -> Result<TaskHandle> {
        self.check_kind(callable, self.eng.cfg.next_level_kind, "submit_next_level_group")?;
        if workers.is_empty() || workers.len() != args_list.len() {
            return Err(Error::invalid(format!(
                "submit_next_level_group of {callable}: {} workers for {} argument sets; give one worker per member",
                workers.len(),
                args_list.len()
            )));
        }
        for (i, w) in workers.iter().enumerate() {
            self.check_worker(*w, callable)?;
            if workers[..i].contains(w) {
                return Err(Error::invalid(format!(
                    "submit_next_level_group of {callable}: worker {w} is named twice; group members need distinct workers"
                )));
            }
        }
        self.submit(
            callable,
            args_list.into_iter().collect(),
            config,
            Target::NextLevel(workers.iter().copied().collect()),
            true,
        )
    }

    fn check_kind(&mut self, callable: &CallableHandle, want: CallableKind, api: &str) -> Result<()> {
        let digest = callable.digest();
        if self.checked.iter().any(|&(d, k)| d == digest && k == want) {
            return Ok(());
        }
        let known = self.eng.callables.read().unwrap_or_else(|e| e.into_inner()).get(&digest).copied();
        if known == Some(want) {
            self.checked.push((digest, want));
        }
        match known {
            None => Err(Error::new(
                ErrorKind::Callable,
                format!("{api}: callable {callable} is not registered on this Worker; register it first"),
            )),
            Some(kind) if kind != want => Err(Error::new(
                ErrorKind::Callable,
                format!(
                    "{api}: {callable} is a {} callable, but this API runs {} callables",
                    kind.name(),
                    want.name()
                ),
            )),
            Some(_) => Ok(()),
        }
    }

    fn check_sub_pool(&self, callable: &CallableHandle, need: usize) -> Result<()> {
        let n = self.eng.cfg.sub_workers;
        if need > n {
            let why = if n == 0 {
                "this Worker has no SUB workers (set WorkerBuilder::sub_workers)".to_string()
            } else {
                format!("it needs {need} SUB workers at once but this Worker has {n}")
            };
            return Err(Error::invalid(format!("{callable} cannot run: {why}")));
        }
        Ok(())
    }

    fn check_worker(&self, worker: u32, callable: &CallableHandle) -> Result<()> {
        let n = self.eng.cfg.next_level_workers;
        if worker as usize >= n {
            return Err(Error::invalid(format!(
                "{callable}: worker id {worker} names no NEXT_LEVEL worker (this Worker has {n})"
            )));
        }
        Ok(())
    }

    /// Allocates a runtime-managed intermediate from the heap ring of the current scope depth.
    ///
    /// The returned tensor is a contiguous view of the whole allocation. The bytes are
    /// reclaimed automatically once the enclosing scope has ended and every task that names the
    /// buffer has completed. Waits under back-pressure while the ring is full.
    pub fn alloc(&mut self, shape: &[u32], dtype: DataType) -> Result<Tensor> {
        let view = TensorView::new(0, shape, None, dtype).map_err(|e| e.context("orch.alloc"))?;
        let bytes = view.extent_bytes();
        let ring = ring_for_depth(self.scope_depth());
        self.claim_window("orch.alloc")?;
        let heap = &self.eng.heaps[ring];
        let mut got = heap.try_alloc(bytes);
        if matches!(got, Ok(None)) {
            let deadline = Instant::now() + self.eng.cfg.backpressure_timeout;
            let cell = std::cell::RefCell::new(None);
            self.eng.drive_until(
                || match heap.try_alloc(bytes) {
                    Ok(None) => false,
                    other => {
                        *cell.borrow_mut() = Some(other);
                        true
                    }
                },
                Some(deadline),
            );
            got = cell.into_inner().unwrap_or(Ok(None));
        }
        let (block, addr) = match got {
            Ok(Some(b)) => b,
            Ok(None) => {
                self.eng.window.release();
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "orch.alloc: heap ring {ring} exhausted (waited {:?} for {bytes} bytes); raise WorkerBuilder::heap_ring_size (now {} bytes) or end scopes sooner",
                        self.eng.cfg.backpressure_timeout,
                        heap.size()
                    ),
                ));
            }
            Err(e) => {
                self.eng.window.release();
                return Err(e);
            }
        };
        let id = self.eng.next_buffer_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let identity = Identity::new(self.eng.nonce, id, 1)?;
        let desc = BufferDesc::new(identity, Backing::HeapSlab { addr }, Access::ReadWrite, bytes)?;
        self.allocs += 1;
        let slot =
            Arc::new(Slot::new(self.run.clone(), self.allocs - 1, None, Some((ring, block, identity))));
        {
            let mut l = slot.lock();
            l.fanout_total = 1; // the scope's reference
            l.fanout_released = 1; // born COMPLETED: its own release is done
        }
        slot.set_state(State::Completed);
        self.run.slot_created();
        self.eng.tensor_map.insert_creator(self.run.id, identity, slot.clone());
        self.scopes.last_mut().expect("outer scope").push(slot);
        Tensor::new(desc, view)
    }

    /// Opens a nested scope: tasks and allocations inside it use the next heap ring and are
    /// reclaimed independently of outer ones. At most 64 frames, the outer scope included.
    pub fn scope_begin(&mut self) -> Result<()> {
        if self.scopes.len() >= MAX_SCOPE_DEPTH {
            return Err(Error::state(format!(
                "scope_begin: scopes nest at most {MAX_SCOPE_DEPTH} deep (the run's outer scope included)"
            )));
        }
        self.scopes.push(Vec::new());
        Ok(())
    }

    /// Closes the innermost scope. Never blocks. An end without a matching begin is an error.
    pub fn scope_end(&mut self) -> Result<()> {
        if self.scopes.len() <= 1 {
            return Err(Error::state("scope_end without a matching scope_begin"));
        }
        self.end_top_scope();
        Ok(())
    }

    /// Runs `f` inside a nested scope (`scope_begin` ... `scope_end`), also when `f` fails.
    pub fn scope<R>(&mut self, f: impl FnOnce(&mut Orchestrator<'a>) -> Result<R>) -> Result<R> {
        self.scope_begin()?;
        let depth = self.scopes.len();
        let out = f(self);
        while self.scopes.len() >= depth {
            self.end_top_scope();
        }
        out
    }

    fn end_top_scope(&mut self) {
        if let Some(frame) = self.scopes.pop() {
            for slot in frame {
                self.eng.release_ref(&slot);
            }
        }
    }

    fn claim_window(&self, api: &str) -> Result<()> {
        if self.eng.window.try_claim() {
            return Ok(());
        }
        let deadline = Instant::now() + self.eng.cfg.backpressure_timeout;
        let w = &self.eng.window;
        let claimed = std::cell::Cell::new(false);
        self.eng.drive_until(
            || {
                let ok = w.try_claim();
                claimed.set(ok);
                ok
            },
            Some(deadline),
        );
        if claimed.get() {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "{api}: the task window is full ({} live tasks, waited {:?}); tasks in a scope stay live until the scope ends, so open scopes (orch.scope) around batches of work, or raise WorkerBuilder::task_window",
                    w.capacity(),
                    self.eng.cfg.backpressure_timeout
                ),
            ))
        }
    }

    fn validate_args(&self, callable: &CallableHandle, args: &TaskArgs) -> Result<()> {
        for (i, (t, tag)) in args.tensors.iter().zip(&args.tags).enumerate() {
            let granted = t.desc().access();
            let needed = tag.access();
            if *tag != crate::Tag::NoDep && !granted.allows(needed) {
                return Err(Error::invalid(format!(
                    "{callable}: tensor {i} is tagged {tag:?}, which needs {needed:?} access, but its buffer grants {granted:?}"
                )));
            }
        }
        let n = args.tensors.len();
        for i in 0..n {
            for j in i + 1..n {
                let (a, b) = (&args.tensors[i], &args.tensors[j]);
                let writes = |k: usize| args.tags[k].writes() || args.tags[k] == crate::Tag::NoDep;
                if (writes(i) || writes(j))
                    && a.desc().identity() == b.desc().identity()
                    && overlap(a.view(), b.view()) != Overlap::None
                {
                    return Err(Error::invalid(format!(
                        "{callable}: tensors {i} and {j} overlap in buffer {} and at least one is written; pass disjoint views",
                        a.desc().identity()
                    )));
                }
            }
        }
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

    fn submit(
        &mut self,
        callable: &CallableHandle,
        args_list: SmallVec<[TaskArgs; 1]>,
        config: CallConfig,
        target: Target,
        group: bool,
    ) -> Result<TaskHandle> {
        if let Some(e) = self.run.first_error() {
            return Err(
                e.context(format!("submit of {callable} refused: run {} already failed", self.run.id))
            );
        }
        config.validate()?;
        for args in &args_list {
            self.validate_args(callable, args)?;
        }
        // Step 1.
        self.claim_window("submit")?;
        if let Some(e) = self.run.first_error() {
            // The run failed while this submit waited for room.
            self.eng.window.release();
            return Err(
                e.context(format!("submit of {callable} refused: run {} already failed", self.run.id))
            );
        }
        // Step 2.
        let index = self.tasks.len() as u32;
        let slot = Arc::new(Slot::new(
            self.run.clone(),
            index,
            Some(TaskData {
                callable: callable.clone(),
                args: args_list,
                config: (config != CallConfig::DEFAULT).then(|| Box::new(config)),
                target,
                group,
            }),
            None,
        ));
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
        }
        let mut producers: SmallVec<[Producer; 8]> = SmallVec::new();
        let mut add = |p: Arc<Slot>, orders: bool, retains: bool| {
            if Arc::ptr_eq(&p, &slot) {
                return;
            }
            if let Some(e) = producers.iter_mut().find(|e| Arc::ptr_eq(&e.slot, &p)) {
                e.orders |= orders;
                e.retains |= retains;
            } else {
                producers.push(Producer { slot: p, orders, retains });
            }
        };
        let capture = self.run.capture.is_some();
        let mut edges: Vec<(u32, EdgeReason)> = Vec::new();
        let mut written: SmallVec<[Identity; 4]> = SmallVec::new();
        let task = slot.task();
        let mut walk = self.eng.tensor_map.walk();
        for args in &task.args {
            for (i, (t, tag)) in args.tensors.iter().zip(&args.tags).enumerate() {
                if t.desc().nbytes() == 0 {
                    continue;
                }
                let id = t.desc().identity();
                let found = walk.lookup(self.run.id, id, t.view(), tag.reads());
                if let Some(c) = found.creator {
                    add(c, false, true);
                }
                for w in found.writers {
                    if capture && !Arc::ptr_eq(&w, &slot) && w.task.is_some() {
                        edges.push((w.index, EdgeReason::Tensor { arg: i as u32, buffer: id }));
                    }
                    add(w, true, true);
                }
                if tag.writes() {
                    if !written.contains(&id) {
                        written.push(id);
                    }
                    walk.insert(self.run.id, id, *t.view(), slot.clone());
                }
            }
        }
        drop(walk);
        for args in &task.args {
            for dep in &args.deps {
                if let Some(p) = self.tasks[dep.task.index as usize].upgrade() {
                    if capture {
                        edges.push((p.index, EdgeReason::Explicit { retain: dep.retain }));
                    }
                    add(p, true, dep.retain);
                }
            }
        }

        // Step 4: attach.
        let mut live = 0u32;
        let mut failed: Option<Error> = None;
        for p in producers {
            let mut pl = p.slot.lock();
            let st = p.slot.state();
            if st == State::Consumed {
                continue;
            }
            if p.orders {
                match st {
                    State::Failed => {
                        if failed.is_none() {
                            failed =
                                Some(pl.failure.clone().unwrap_or_else(|| Error::state("producer failed")));
                        }
                    }
                    State::Completed => {}
                    _ => {
                        pl.fanout.push(slot.clone());
                        live += 1;
                    }
                }
            }
            if p.retains {
                pl.fanout_total += 1;
                drop(pl);
                slot.lock().retained.push(p.slot.clone());
            }
        }
        if let Some(cap) = &self.run.capture {
            let node = TaskNode {
                index,
                callable: callable.name().to_string(),
                digest: callable.digest(),
                target: match &slot.task().target {
                    Target::Sub => "sub".to_string(),
                    Target::NextLevel(ws) => {
                        ws.iter().map(|w| format!("worker {w}")).collect::<Vec<_>>().join(", ")
                    }
                },
                members: slot.task().args.len() as u32,
            };
            cap.lock().unwrap_or_else(|e| e.into_inner()).record(node, edges);
        }

        // Step 5: publish.
        self.publish(&slot, live, failed, written);
        Ok(TaskHandle { run: self.run.id, index })
    }

    fn publish(
        &self,
        slot: &Arc<Slot>,
        live: u32,
        producer_failed: Option<Error>,
        written: SmallVec<[Identity; 4]>,
    ) {
        enum Next {
            Ready,
            Pending,
            Failed(SmallVec<[Arc<Slot>; 4]>),
        }
        let next = {
            let mut l = slot.lock();
            l.fanin_count = live;
            l.written = written;
            let poison = match producer_failed {
                Some(cause) => Some(Error::new(
                    ErrorKind::Poisoned,
                    format!(
                        "{} did not run: a task it depends on failed: {}",
                        slot.describe(),
                        cause.message()
                    ),
                )),
                None => l.poisoned.take(),
            };
            if let Some(err) = poison {
                slot.set_state(State::Failed);
                l.failure = Some(err);
                for m in l.members.iter_mut() {
                    *m = Member::Skipped;
                }
                Next::Failed(std::mem::take(&mut l.retained))
            } else if l.fanin_released >= live {
                slot.set_state(State::Ready);
                Next::Ready
            } else {
                slot.set_state(State::Pending);
                Next::Pending
            }
        };
        match next {
            Next::Ready => self.eng.publish_ready(slot.clone()),
            Next::Pending => {}
            Next::Failed(retained) => {
                self.run.failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                for p in retained {
                    self.eng.release_ref(&p);
                }
                self.eng.release_ref(slot);
            }
        }
    }

    /// Ends the run's building: closes every open scope and submission. On an orchestration
    /// error, first fails every task that has not started.
    pub(crate) fn finish(mut self, error: Option<&Error>) {
        if let Some(err) = error {
            self.run.record_error(err.clone());
            let live: Vec<Arc<Slot>> = self.tasks.iter().filter_map(Weak::upgrade).collect();
            self.eng.cancel_unstarted(&live, err);
        }
        if self.scopes.len() > 1 {
            tracing::warn!(target: "simpler::orchestrator", run_id = self.run.id, open = self.scopes.len() - 1, "orchestration returned with scopes still open; closing them");
        }
        while !self.scopes.is_empty() {
            self.end_top_scope();
        }
        if self.run.close_submission() {
            self.eng.run_finished(&self.run);
        }
    }
}
