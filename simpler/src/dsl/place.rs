//! Where a typed call runs ([`sub`], [`chip`], [`worker`]) and the typed call itself
//! ([`Call`]), checked against the callable's kind at compile time.
//!
//! A twin's `call(...)` builds the `TaskArgs` with the signature's tags and returns a
//! `Call<K>`; `Call::on(orch, place)` needs `Placement<K>` and is `submit_sub` /
//! `submit_next_level` with the same arguments. The traits carry `on_unimplemented` messages.

use std::marker::PhantomData;

use smallvec::SmallVec;

use crate::callable::linked::CallableInfo;
use crate::data::call_config::CallConfig;
use crate::data::task_args::{Tag, TaskArgs, TaskHandle};
use crate::data::tensor::Tensor;
use crate::engine::orchestrator::Orchestrator;
use crate::error::{Error, Result};

/// Kind markers: the type parameter of [`Call`] and [`Placement`].
///
/// ```
/// use simpler::{callable, dsl::kind::HostCallable, dsl::Call, dsl::In};
///
/// #[callable(sub)]
/// fn look(x: In<f32>) {
///     let _ = x;
/// }
/// // `look::call(..)` returns a `Call<HostCallable>`, which only `sub()` can place.
/// fn _takes(_: simpler::Result<Call<HostCallable>>) {}
/// ```
pub mod kind {
    use crate::callable::identity::CallableKind;

    mod sealed {
        pub trait Kind {}
    }

    /// A callable kind at the type level.
    ///
    /// ```
    /// use simpler::dsl::kind::{ChipCallable, Kind};
    /// assert_eq!(ChipCallable::KIND, simpler::callable::CallableKind::Chip);
    /// ```
    pub trait Kind: sealed::Kind + 'static {
        /// The run-time kind.
        const KIND: CallableKind;
    }

    /// A chip kernel or chip orchestration (`#[callable(chip)]`): placed with `chip(N)`.
    ///
    /// ```
    /// use simpler::dsl::kind::{ChipCallable, Kind};
    /// assert_eq!(ChipCallable::KIND.name(), "chip");
    /// ```
    #[derive(Debug)]
    pub enum ChipCallable {}

    /// A host function (`#[callable(sub)]`): placed with `sub()`.
    ///
    /// ```
    /// use simpler::dsl::kind::{HostCallable, Kind};
    /// assert_eq!(HostCallable::KIND, simpler::callable::CallableKind::HostFn);
    /// ```
    #[derive(Debug)]
    pub enum HostCallable {}

    /// An orchestration function (`#[callable(orch)]`, `task_graph!`): placed on a nested
    /// Worker with `worker(N)`.
    ///
    /// ```
    /// use simpler::dsl::kind::{Kind, OrchCallable};
    /// assert_eq!(OrchCallable::KIND, simpler::callable::CallableKind::Orch);
    /// ```
    #[derive(Debug)]
    pub enum OrchCallable {}

    impl sealed::Kind for ChipCallable {}
    impl sealed::Kind for HostCallable {}
    impl sealed::Kind for OrchCallable {}
    impl Kind for ChipCallable {
        const KIND: CallableKind = CallableKind::Chip;
    }
    impl Kind for HostCallable {
        const KIND: CallableKind = CallableKind::HostFn;
    }
    impl Kind for OrchCallable {
        const KIND: CallableKind = CallableKind::Orch;
    }
}

use kind::{ChipCallable, HostCallable, Kind, OrchCallable};

mod sealed {
    pub trait Placement {}
}

/// Any SUB worker of this level: the placement of host functions.
///
/// ```
/// let p = simpler::dsl::sub();
/// assert_eq!(format!("{p:?}"), "SubWorker");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubWorker;

/// Next-level worker `N` of this Worker, as a placement for callables of kind `K`: chip `N` of
/// an L3 Worker ([`chip`]`(N)`, for chip callables) or nested Worker `N` of an L4+ Worker
/// ([`worker`]`(N)`, for orchestration callables). One id space (the Orchestrator's
/// `submit_next_level(.., worker)`); the kind only lets rustc check what may run there.
///
/// ```
/// use simpler::dsl::kind::{ChipCallable, OrchCallable};
/// let on_chip: simpler::dsl::WorkerId<ChipCallable> = simpler::dsl::chip(2);
/// let nested: simpler::dsl::WorkerId<OrchCallable> = simpler::dsl::worker(2);
/// assert_eq!(on_chip.index(), nested.index());
/// ```
pub struct WorkerId<K: Kind>(u32, PhantomData<fn() -> K>);

impl<K: Kind> WorkerId<K> {
    /// The next-level worker id.
    ///
    /// ```
    /// assert_eq!(simpler::dsl::chip(3).index(), 3);
    /// ```
    pub fn index(self) -> u32 {
        self.0
    }
}

impl<K: Kind> Clone for WorkerId<K> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K: Kind> Copy for WorkerId<K> {}
impl<K: Kind> PartialEq for WorkerId<K> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl<K: Kind> Eq for WorkerId<K> {}
impl<K: Kind> std::fmt::Debug for WorkerId<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WorkerId<{}>({})", K::KIND.name(), self.0)
    }
}

/// Runs a host function on any free SUB worker.
///
/// ```
/// let _ = simpler::dsl::sub();
/// ```
pub fn sub() -> SubWorker {
    SubWorker
}

/// Runs a chip callable on chip `n`.
///
/// ```
/// assert_eq!(simpler::dsl::chip(0).index(), 0);
/// ```
pub fn chip(n: u32) -> WorkerId<ChipCallable> {
    WorkerId(n, PhantomData)
}

/// Runs an orchestration callable on nested Worker `n`.
///
/// ```
/// assert_eq!(simpler::dsl::worker(3).index(), 3);
/// ```
pub fn worker(n: u32) -> WorkerId<OrchCallable> {
    WorkerId(n, PhantomData)
}

/// Where a callable of kind `K` may run: `sub()` for host functions, `chip(N)` for chip
/// callables, `worker(N)` for orchestration callables.
///
/// ```
/// fn place<P: simpler::dsl::Placement<simpler::dsl::kind::ChipCallable>>(p: P) -> Option<u32> {
///     p.worker_id()
/// }
/// assert_eq!(place(simpler::dsl::chip(3)), Some(3));
/// ```
///
/// A chip callable cannot go to a SUB worker:
///
/// ```compile_fail
/// fn place<P: simpler::dsl::Placement<simpler::dsl::kind::ChipCallable>>(_: P) {}
/// place(simpler::dsl::sub());
/// ```
#[diagnostic::on_unimplemented(
    message = "a `{K}` cannot be placed on `{Self}`",
    label = "wrong placement for this callable",
    note = "host functions (`#[callable(sub)]`) run on `sub()`, chip callables (`#[callable(chip)]`) on `chip(N)`, orchestration callables (`#[callable(orch)]`, `task_graph!`) on `worker(N)`"
)]
pub trait Placement<K: Kind>: sealed::Placement + Copy {
    /// The next-level worker id, or `None` for a SUB worker.
    ///
    /// ```
    /// use simpler::{dsl::Placement, dsl::kind::HostCallable};
    /// assert_eq!(Placement::<HostCallable>::worker_id(&simpler::dsl::sub()), None);
    /// ```
    fn worker_id(&self) -> Option<u32>;
}

impl sealed::Placement for SubWorker {}
impl<K: Kind> sealed::Placement for WorkerId<K> {}

impl Placement<HostCallable> for SubWorker {
    fn worker_id(&self) -> Option<u32> {
        None
    }
}

impl Placement<ChipCallable> for WorkerId<ChipCallable> {
    fn worker_id(&self) -> Option<u32> {
        Some(self.0)
    }
}

impl Placement<OrchCallable> for WorkerId<OrchCallable> {
    fn worker_id(&self) -> Option<u32> {
        Some(self.0)
    }
}

/// One typed call of a `#[callable]`, built by its generated `call(...)` function with every
/// argument checked against the signature; submit it with [`on`](Call::on), or several as one
/// group with [`Orchestrator::submit_group`].
///
/// The tags come from the signature: `In<T>` parameters are `Input`, `Out<T>` `Output`,
/// `InOut<T>` `InOut`; nothing is written by hand.
///
/// ```no_run
/// use simpler::{callable, dsl::chip, dsl::In, dsl::Out, dsl::TensorOf};
///
/// #[callable(chip)]
/// fn vadd(a: In<f32>, b: In<f32>, mut out: Out<f32>) {
///     for i in 0..out.len() {
///         out[i] = a[i] + b[i];
///     }
/// }
///
/// # fn demo(orch: &mut simpler::Orchestrator<'_>, a: &TensorOf<f32>, b: &TensorOf<f32>, mut c: TensorOf<f32>) -> simpler::Result<()> {
/// let first = vadd::call(a, b, &mut c)?.on(orch, chip(0))?;
/// # let _ = first; Ok(()) }
/// ```
#[must_use = "a call does nothing until it is placed (`.on(orch, ..)`, `submit_group`) or run (`.run`, `.submit`)"]
pub struct Call<K: Kind> {
    info: &'static CallableInfo,
    args: TaskArgs,
    /// `None` is the default (and tells that `.config(..)` was not called).
    config: Option<CallConfig>,
    _kind: PhantomData<fn() -> K>,
}

impl<K: Kind> std::fmt::Debug for Call<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call").field("callable", &self.info.name).field("args", &self.args).finish()
    }
}

impl<K: Kind> Call<K> {
    #[doc(hidden)]
    #[inline]
    pub fn __new(info: &'static CallableInfo) -> Call<K> {
        Call { info, args: TaskArgs::new(), config: None, _kind: PhantomData }
    }

    #[doc(hidden)]
    #[inline]
    pub fn __tensor(&mut self, tensor: &Tensor, tag: Tag, param: &'static str) -> Result<()> {
        if let Err(e) = self.args.add_tensor(tensor, tag) {
            return Err(e.context(format!("`{}` argument `{param}`", self.info.name)));
        }
        Ok(())
    }

    /// Generated code only (`task_graph!`'s static edges): tensor `i`'s edges are the deps.
    ///
    /// # Safety
    ///
    /// Tensor `i` is no longer ordered by the TensorMap (as if tagged `NoDep`, which is
    /// `unsafe` for the same reason): the caller must add, with [`__dep`](Call::__dep), an edge
    /// from every task of the run that touches the same bytes in a conflicting way, or two
    /// tasks may write (or one write and one read) the same memory at once.
    #[doc(hidden)]
    #[inline]
    #[expect(unsafe_code, reason = "the caller takes over the ordering of a tensor, as with NoDep")]
    pub unsafe fn __static(&mut self, i: usize) {
        self.args.set_static(i);
    }

    /// Generated code only: a dependency the graph computed (`retain`: a read after write).
    #[doc(hidden)]
    #[inline]
    pub fn __dep(&mut self, task: TaskHandle, retain: bool) {
        if retain {
            self.args.add_dep(task);
        } else {
            self.args.add_dep_wait(task);
        }
    }

    #[doc(hidden)]
    #[inline]
    pub fn __scalar(&mut self, bits: u64) {
        self.args.scalar(bits);
    }

    /// The per-task configuration ([`CallConfig::default`] unless set). Only next-level
    /// placements (chips, nested Workers) take one: placing a call that carries a config on
    /// `sub()` is an error, and the members of a group must carry the same config.
    ///
    /// ```no_run
    /// # use simpler::{callable, dsl::chip, dsl::In, dsl::Out, dsl::TensorOf, chip::CallConfig};
    /// # #[callable(chip)] fn copy(a: In<f32>, mut b: Out<f32>) { b.copy_from_slice(&a) }
    /// # fn demo(orch: &mut simpler::Orchestrator<'_>, a: &TensorOf<f32>, mut b: TensorOf<f32>) -> simpler::Result<()> {
    /// copy::call(a, &mut b)?.config(CallConfig::new().aicpu_threads(4)).on(orch, chip(0))?;
    /// # Ok(()) }
    /// ```
    pub fn config(mut self, config: CallConfig) -> Call<K> {
        self.config = Some(config);
        self
    }

    /// Orders this call after `task` without retaining it (`add_dep_wait`): what `task_graph!`
    /// adds for a write after a read.
    ///
    /// ```no_run
    /// # use simpler::{callable, dsl::chip, dsl::In, dsl::Out, dsl::TensorOf};
    /// # #[callable(chip)] fn copy(a: In<f32>, mut b: Out<f32>) { b.copy_from_slice(&a) }
    /// # fn demo(orch: &mut simpler::Orchestrator<'_>, mut a: TensorOf<f32>, mut b: TensorOf<f32>) -> simpler::Result<()> {
    /// let reader = copy::call(&a, &mut b)?.on(orch, chip(0))?;
    /// // Overwrite `a` only once `reader` is done with it.
    /// copy::call(&b, &mut a)?.after(reader).on(orch, chip(1))?;
    /// # Ok(()) }
    /// ```
    pub fn after(mut self, task: TaskHandle) -> Call<K> {
        self.args.add_dep_wait(task);
        self
    }

    /// The task arguments built so far (tensors with their tags, scalars, dependencies).
    ///
    /// ```no_run
    /// # use simpler::{callable, dsl::In, dsl::Out, dsl::TensorOf, Tag};
    /// # #[callable(chip)] fn copy(a: In<f32>, mut b: Out<f32>) { b.copy_from_slice(&a) }
    /// # fn demo(a: &TensorOf<f32>, mut b: TensorOf<f32>) -> simpler::Result<()> {
    /// let call = copy::call(a, &mut b)?;
    /// assert_eq!(call.args().tag(0), Some(Tag::Input));
    /// assert_eq!(call.args().tag(1), Some(Tag::Output));
    /// # Ok(()) }
    /// ```
    pub fn args(&self) -> &TaskArgs {
        &self.args
    }

    /// The callable's name (for messages).
    pub(crate) fn name(&self) -> &'static str {
        self.info.name
    }

    /// The name of the parameter that tensor argument `i` is passed to (for messages).
    pub(crate) fn tensor_param(&self, i: usize) -> &'static str {
        self.info.params.iter().filter(|p| p.mode.is_tensor()).nth(i).map_or("?", |p| p.name)
    }

    /// The handle of the callable this call runs.
    ///
    /// ```no_run
    /// # use simpler::{callable, dsl::In, dsl::Out, dsl::TensorOf};
    /// # #[callable(chip)] fn copy(a: In<f32>, mut b: Out<f32>) { b.copy_from_slice(&a) }
    /// # fn demo(a: &TensorOf<f32>, mut b: TensorOf<f32>) -> simpler::Result<()> {
    /// assert_eq!(copy::call(a, &mut b)?.handle().name(), "copy");
    /// # Ok(()) }
    /// ```
    pub fn handle(&self) -> &'static crate::callable::identity::CallableHandle {
        self.info.handle()
    }

    /// Submits the call to `place` in the current run.
    ///
    /// # Errors
    ///
    /// As [`Orchestrator::submit_sub`] and [`Orchestrator::submit_next_level`]: an unknown
    /// worker id, a callable this Worker does not have, back-pressure timeouts, and so on.
    ///
    /// ```no_run
    /// # use simpler::{callable, dsl::sub, dsl::In, dsl::Out, dsl::TensorOf};
    /// # #[callable(sub)] fn copy(a: In<f32>, mut b: Out<f32>) { b.copy_from_slice(&a) }
    /// # fn demo(orch: &mut simpler::Orchestrator<'_>, a: &TensorOf<f32>, mut b: TensorOf<f32>) -> simpler::Result<()> {
    /// let task = copy::call(a, &mut b)?.on(orch, sub())?;
    /// # let _ = task; Ok(()) }
    /// ```
    #[track_caller]
    #[inline]
    pub fn on(self, orch: &mut Orchestrator<'_>, place: impl Placement<K>) -> Result<TaskHandle> {
        let handle = self.info.handle();
        match place.worker_id() {
            None if self.config.is_some() => Err(Error::invalid(format!(
                "`{}`: a host function runs on a SUB worker, which takes no CallConfig; remove `.config(..)`",
                self.info.name
            ))),
            None => orch.submit_sub(handle, self.args),
            Some(w) => orch.submit_next_level(handle, self.args, config_of(self.config), w),
        }
    }
}

/// The configuration a `Call` carries (`None`: the default).
fn config_of(config: Option<CallConfig>) -> CallConfig {
    config.unwrap_or_default()
}

impl Orchestrator<'_> {
    /// Submits typed calls of one callable as one group task: all members start together or
    /// none does (reference §2.7). Every member names its own placement; they must all be
    /// `sub()` (a SUB group) or all distinct `chip(N)` / `worker(N)`.
    ///
    /// # Errors
    ///
    /// An [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error for an empty
    /// group, members of different callables, or mixed placements; otherwise as
    /// [`submit_sub_group`](Orchestrator::submit_sub_group) and
    /// [`submit_next_level_group`](Orchestrator::submit_next_level_group).
    ///
    /// ```no_run
    /// use simpler::{callable, dsl::chip, dsl::In, dsl::Out, dsl::TensorOf};
    ///
    /// #[callable(chip)]
    /// fn vadd(a: In<f32>, b: In<f32>, mut out: Out<f32>) {
    ///     for i in 0..out.len() {
    ///         out[i] = a[i] + b[i];
    ///     }
    /// }
    /// # fn demo(orch: &mut simpler::Orchestrator<'_>, a: &TensorOf<f32>, b: &TensorOf<f32>, outs: &mut [TensorOf<f32>]) -> simpler::Result<()> {
    /// let mut members = Vec::new();
    /// for (i, out) in outs.iter_mut().enumerate() {
    ///     members.push((vadd::call(a, b, out)?, chip(i as u32)));
    /// }
    /// orch.submit_group(members)?;
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn submit_group<K: Kind, P: Placement<K>>(
        &mut self,
        members: Vec<(Call<K>, P)>,
    ) -> Result<TaskHandle> {
        let Some((first, _)) = members.first() else {
            return Err(Error::invalid("submit_group: the group has no members"));
        };
        let info = first.info;
        let config = first.config.clone().unwrap_or_default();
        const DEFAULT: CallConfig = CallConfig::new();
        if members.iter().any(|(c, _)| c.config.as_ref().unwrap_or(&DEFAULT) != &config) {
            return Err(Error::invalid(format!(
                "submit_group of `{}`: the members carry different CallConfigs; a group task has one",
                info.name
            )));
        }
        let sub = members[0].1.worker_id().is_none();
        let mut workers: SmallVec<[u32; 8]> = SmallVec::new();
        let mut args_list = Vec::with_capacity(members.len());
        for (i, (call, place)) in members.into_iter().enumerate() {
            if call.info.digest != info.digest {
                return Err(Error::invalid(format!(
                    "submit_group: member {i} calls `{}` but member 0 calls `{}`; a group runs one callable",
                    call.info.name, info.name
                )));
            }
            match (sub, place.worker_id()) {
                (true, None) => {}
                (false, Some(w)) => workers.push(w),
                _ => {
                    return Err(Error::invalid(format!(
                        "submit_group of `{}`: member {i} mixes a SUB placement with worker placements",
                        info.name
                    )));
                }
            }
            args_list.push(call.args);
        }
        let handle = info.handle();
        if sub {
            self.submit_sub_group(handle, args_list)
        } else {
            self.submit_next_level_group(handle, args_list, config, &workers)
        }
    }
}

impl Call<OrchCallable> {
    /// The function to run at the top of a Worker, after the checks a submit makes (tensor
    /// access against the tags; no written tensor overlapping another argument, since two
    /// parameters of one graph naming one buffer would race).
    fn entry(&self) -> Result<crate::engine::orch_fn::OrchFnPtr> {
        crate::engine::orchestrator::check_tensor_args(self.info.handle(), &self.args)?;
        self.info
            .entry::<crate::engine::orch_fn::OrchFnPtr>()
            .ok_or_else(|| Error::invalid(format!("`{}` is not an orchestration function", self.info.name)))
    }

    /// Runs this orchestration callable (a `task_graph!` or `#[callable(orch)]`) as one run of
    /// `worker` itself, and waits for it.
    ///
    /// # Errors
    ///
    /// As [`Worker::run`](crate::worker::Worker::run).
    ///
    /// ```no_run
    /// use simpler::{callable, task_graph, dsl::In, dsl::Out, Worker};
    ///
    /// #[callable(sub)]
    /// fn copy(a: In<f32>, mut b: Out<f32>) {
    ///     b.copy_from_slice(&a);
    /// }
    /// task_graph! {
    ///     fn copy_once(x: In<f32>, y: Out<f32>) {
    ///         copy(x, &mut y).on(sub());
    ///     }
    /// }
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(1).build()?;
    /// worker.init()?;
    /// let (a, b) = (worker.create_buffer(64)?, worker.create_buffer(64)?);
    /// let (x, mut y) = (a.typed::<f32>(&[16])?, b.typed::<f32>(&[16])?);
    /// copy_once::call(&x, &mut y)?.run(&worker)?;
    /// worker.close()
    /// # }
    /// ```
    pub fn run(self, worker: &crate::worker::Worker) -> Result<()> {
        self.run_with(worker, crate::worker::RunOptions::new())
    }

    /// As [`run`](Call::run), with a run's options: its deadline and DAG capture. The call's
    /// arguments and config are its own: options that carry arguments or a config are
    /// refused.
    ///
    /// # Errors
    ///
    /// As [`Worker::run_with`](crate::worker::Worker::run_with).
    ///
    /// ```no_run
    /// # use simpler::{callable, task_graph, dsl::In, dsl::Out, RunOptions, Worker};
    /// # #[callable(sub)] fn copy(a: In<f32>, mut b: Out<f32>) { b.copy_from_slice(&a); }
    /// # task_graph! { fn copy_once(x: In<f32>, y: Out<f32>) { copy(x, &mut y).on(sub()); } }
    /// # fn demo(worker: &Worker, x: &simpler::dsl::TensorOf<f32>, mut y: simpler::dsl::TensorOf<f32>) -> simpler::Result<()> {
    /// use std::time::Duration;
    /// copy_once::call(x, &mut y)?.run_with(worker, RunOptions::new().deadline(Duration::from_secs(2)))?;
    /// # Ok(()) }
    /// ```
    pub fn run_with(self, worker: &crate::worker::Worker, options: crate::worker::RunOptions) -> Result<()> {
        let f = self.entry()?;
        worker.run_with(self.options(options)?, f)
    }

    /// Submits this orchestration callable as a run of `worker` without waiting.
    ///
    /// # Errors
    ///
    /// As [`Worker::submit`](crate::worker::Worker::submit).
    ///
    /// ```no_run
    /// # use simpler::{callable, task_graph, dsl::In, dsl::Out, Worker};
    /// # #[callable(sub)] fn copy(a: In<f32>, mut b: Out<f32>) { b.copy_from_slice(&a); }
    /// # task_graph! { fn copy_once(x: In<f32>, y: Out<f32>) { copy(x, &mut y).on(sub()); } }
    /// # fn demo(worker: &Worker, x: &simpler::dsl::TensorOf<f32>, mut y: simpler::dsl::TensorOf<f32>) -> simpler::Result<()> {
    /// let run = copy_once::call(x, &mut y)?.submit(worker)?;
    /// run.wait()?;
    /// # Ok(()) }
    /// ```
    pub fn submit(self, worker: &crate::worker::Worker) -> Result<crate::engine::run::RunHandle> {
        self.submit_with(worker, crate::worker::RunOptions::new())
    }

    /// As [`submit`](Call::submit), with a run's options (see [`run_with`](Call::run_with)).
    ///
    /// # Errors
    ///
    /// As [`Worker::submit_with`](crate::worker::Worker::submit_with).
    ///
    /// ```no_run
    /// # use simpler::{callable, task_graph, dsl::In, dsl::Out, RunOptions, Worker};
    /// # #[callable(sub)] fn copy(a: In<f32>, mut b: Out<f32>) { b.copy_from_slice(&a); }
    /// # task_graph! { fn copy_once(x: In<f32>, y: Out<f32>) { copy(x, &mut y).on(sub()); } }
    /// # fn demo(worker: &Worker, x: &simpler::dsl::TensorOf<f32>, mut y: simpler::dsl::TensorOf<f32>) -> simpler::Result<()> {
    /// let run = copy_once::call(x, &mut y)?.submit_with(worker, RunOptions::new().capture_dag())?;
    /// run.wait()?;
    /// assert!(copy_once::graph().matches(&run.dag().unwrap()));
    /// # Ok(()) }
    /// ```
    pub fn submit_with(
        self,
        worker: &crate::worker::Worker,
        options: crate::worker::RunOptions,
    ) -> Result<crate::engine::run::RunHandle> {
        let f = self.entry()?;
        worker.submit_with(self.options(options)?, f)
    }

    /// [`submit`](Call::submit) for async code: waits for room among the Worker's admitted runs
    /// without blocking ([`Worker::submit_async`](crate::worker::Worker::submit_async)), then
    /// resolves to the run's handle, itself a future of the run's result.
    ///
    /// # Errors
    ///
    /// As [`Worker::submit`](crate::worker::Worker::submit).
    ///
    /// ```no_run
    /// # use simpler::{callable, task_graph, dsl::In, dsl::Out, Worker};
    /// # #[callable(sub)] fn copy(a: In<f32>, mut b: Out<f32>) { b.copy_from_slice(&a); }
    /// # task_graph! { fn copy_once(x: In<f32>, y: Out<f32>) { copy(x, &mut y).on(sub()); } }
    /// # async fn demo(worker: &Worker, x: &simpler::dsl::TensorOf<f32>, mut y: simpler::dsl::TensorOf<f32>) -> simpler::Result<()> {
    /// copy_once::call(x, &mut y)?.submit_async(worker).await?.await?;
    /// # Ok(()) }
    /// ```
    pub async fn submit_async(self, worker: &crate::worker::Worker) -> Result<crate::engine::run::RunHandle> {
        let f = self.entry()?;
        let options = self.options(crate::worker::RunOptions::new())?;
        worker.submit_async(options, f).await
    }

    /// The options of a top-level run of this call: the given deadline and capture, with the
    /// call's own arguments and config.
    fn options(self, options: crate::worker::RunOptions) -> Result<crate::worker::RunOptions> {
        if options.args.tensor_count() > 0
            || !options.args.scalars().is_empty()
            || options.config != CallConfig::new()
        {
            return Err(Error::invalid(format!(
                "`{}`: a call's arguments and config are its own; give run_with / submit_with options with only a deadline or DAG capture",
                self.info.name
            )));
        }
        Ok(crate::worker::RunOptions { args: self.args, config: config_of(self.config), ..options })
    }
}

impl Call<ChipCallable> {
    /// Runs this chip callable on a level-2 Worker (one simulated chip, in this process), which
    /// is how one tests a kernel alone.
    ///
    /// # Errors
    ///
    /// As [`Worker::run_callable`](crate::worker::Worker::run_callable).
    ///
    /// ```
    /// use simpler::{callable, dsl::In, status::Level, dsl::Out, Worker};
    ///
    /// #[callable(chip)]
    /// fn double(x: In<i32>, mut y: Out<i32>) {
    ///     for (o, i) in y.iter_mut().zip(x.iter()) {
    ///         *o = 2 * i;
    ///     }
    /// }
    /// # fn main() -> simpler::Result<()> {
    /// let mut chip = Worker::builder().level(Level::Chip).chip_memory(1 << 20).build()?;
    /// chip.init()?;
    /// let (a, b) = (chip.create_buffer(16)?, chip.create_buffer(16)?);
    /// a.write(0, &[1i32, 2, 3, 4])?;
    /// let (x, mut y) = (a.typed::<i32>(&[4])?, b.typed::<i32>(&[4])?);
    /// double::call(&x, &mut y)?.run(&chip)?;
    /// assert_eq!(b.read::<i32>(0, 4)?, [2, 4, 6, 8]);
    /// chip.close()
    /// # }
    /// ```
    pub fn run(self, worker: &crate::worker::Worker) -> Result<()> {
        worker.run_callable(self.info.handle(), self.args, config_of(self.config))
    }
}
