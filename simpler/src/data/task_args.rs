//! Task arguments: tensors with a tag each, then `u64` scalars, plus explicit dependencies
//! ([`Dep`], on a [`TaskHandle`] a submit returned).

use smallvec::SmallVec;

use crate::data::buffer::Access;
use crate::data::tensor::Tensor;
use crate::error::{Error, Result};

/// How a task uses a tensor argument; drives dependency inference at submit.
///
/// | Tag | waits for earlier writers | waits for earlier readers | becomes | access required |
/// | --- | --- | --- | --- | --- |
/// | `Input` | yes (read-after-write) | no | a reader | read |
/// | `InOut` | yes (RaW and WaW) | yes (write-after-read) | the writer | read-write |
/// | `Output` | yes (write-after-write) | yes (write-after-read) | the writer | write |
/// | `OutputExisting` | yes, as `Output` | yes | the writer | write |
/// | `NoDep` | no | no | nothing | none checked |
///
/// Only overlapping bytes of the same buffer order tasks: disjoint views stay parallel. So two
/// tasks that could be handed aliasing slices (`&mut [T]` beside `&[T]` or `&mut [T]`) are
/// always ordered, unless one is `NoDep`, which is why only the `unsafe`
/// [`TaskArgs::no_dep`] adds it. The upstream orders write-after-write and write-after-read
/// only through explicit dependencies; this crate orders them itself, because its host
/// functions and kernels receive Rust slices.
///
/// ```
/// use simpler::Tag;
/// assert!(Tag::InOut.reads() && Tag::InOut.writes());
/// assert!(!Tag::Output.reads());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Tag {
    /// Read; waits for the current writer.
    Input = 0,
    /// Written without reading; does not wait.
    Output = 1,
    /// Read and written; waits for the current writer and becomes the writer.
    InOut = 2,
    /// Writes into existing memory; same dependency rules as `Output`.
    OutputExisting = 3,
    /// No dependency tracking at all; added only by the `unsafe` [`TaskArgs::no_dep`].
    NoDep = 4,
}

impl Tag {
    /// True when the tag looks up the current writer (waits for it): `Input` and `InOut`.
    ///
    /// ```
    /// use simpler::Tag;
    /// assert!(Tag::Input.reads() && Tag::InOut.reads());
    /// assert!(!Tag::Output.reads() && !Tag::OutputExisting.reads() && !Tag::NoDep.reads());
    /// ```
    pub fn reads(self) -> bool {
        matches!(self, Tag::Input | Tag::InOut)
    }

    /// True when the tag makes the task the new writer: `Output`, `InOut` and `OutputExisting`.
    ///
    /// ```
    /// use simpler::Tag;
    /// assert!(Tag::Output.writes() && Tag::InOut.writes() && Tag::OutputExisting.writes());
    /// assert!(!Tag::Input.writes() && !Tag::NoDep.writes());
    /// ```
    pub fn writes(self) -> bool {
        matches!(self, Tag::Output | Tag::InOut | Tag::OutputExisting)
    }

    /// The tag that grants exactly `access` (Read -> Input, Write -> Output, ReadWrite -> InOut):
    /// how a tensor that crossed a process boundary (tags do not) is tagged again.
    pub(crate) fn for_access(access: Access) -> Tag {
        match access {
            Access::Read => Tag::Input,
            Access::Write => Tag::Output,
            Access::ReadWrite => Tag::InOut,
        }
    }

    /// The access a task holding this tag is given to the tensor's bytes.
    ///
    /// ```
    /// use simpler::{memory::Access, Tag};
    /// assert_eq!(Tag::Input.access(), Access::Read);
    /// assert_eq!(Tag::Output.access(), Access::Write);
    /// assert_eq!(Tag::InOut.access(), Access::ReadWrite);
    /// assert_eq!(Tag::NoDep.access(), Access::ReadWrite);
    /// ```
    pub fn access(self) -> Access {
        match self {
            Tag::Input => Access::Read,
            Tag::Output | Tag::OutputExisting => Access::Write,
            Tag::InOut | Tag::NoDep => Access::ReadWrite,
        }
    }
}

/// A handle to a submitted task, valid within the run that submitted it.
///
/// Returned by every `submit_*`; pass it to [`TaskArgs::add_dep`] or
/// [`TaskArgs::add_dep_wait`] to order a later task after it.
///
/// ```no_run
/// # fn demo(orch: &mut simpler::Orchestrator<'_>, f: &simpler::CallableHandle) -> simpler::Result<()> {
/// use simpler::TaskArgs;
/// let first = orch.submit_sub(f, TaskArgs::new())?;
/// let mut args = TaskArgs::new();
/// args.add_dep_wait(first);
/// orch.submit_sub(f, args)?; // runs after `first` completes
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskHandle {
    pub(crate) run: u64,
    pub(crate) index: u32,
}

impl TaskHandle {
    /// The run this task belongs to (the same as [`Orchestrator::run_id`](crate::Orchestrator::run_id)).
    ///
    /// ```no_run
    /// # fn demo(orch: &mut simpler::Orchestrator<'_>, f: &simpler::CallableHandle) -> simpler::Result<()> {
    /// let t = orch.submit_sub(f, simpler::TaskArgs::new())?;
    /// assert_eq!(t.run_id(), orch.run_id());
    /// # Ok(()) }
    /// ```
    pub fn run_id(&self) -> u64 {
        self.run
    }

    /// The task's number within its run (0 for the first submit).
    ///
    /// ```no_run
    /// # fn demo(orch: &mut simpler::Orchestrator<'_>, f: &simpler::CallableHandle) -> simpler::Result<()> {
    /// use simpler::TaskArgs;
    /// let first = orch.submit_sub(f, TaskArgs::new())?;
    /// let second = orch.submit_sub(f, TaskArgs::new())?;
    /// assert_eq!(second.index(), first.index() + 1);
    /// # Ok(()) }
    /// ```
    pub fn index(&self) -> u32 {
        self.index
    }
}

/// An explicit dependency on an earlier task of the same run, as recorded by
/// [`TaskArgs::add_dep`] and [`TaskArgs::add_dep_wait`].
///
/// ```no_run
/// # fn demo(orch: &mut simpler::Orchestrator<'_>, f: &simpler::CallableHandle) -> simpler::Result<()> {
/// use simpler::{Dep, TaskArgs};
/// let producer = orch.submit_sub(f, TaskArgs::new())?;
/// let mut args = TaskArgs::new();
/// args.add_dep(producer);
/// assert_eq!(args.deps(), &[Dep { task: producer, retain: true }]);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dep {
    /// The producer.
    pub task: TaskHandle,
    /// `true`: the producer is retained until this task completes (`add_dep`);
    /// `false`: ordering only (`add_dep_wait`).
    pub retain: bool,
}

/// Arguments of one task: tensors with a [`Tag`] each, then `u64` scalars.
///
/// Tensors must come before scalars; adding a tensor after a scalar is an error.
///
/// ```
/// use simpler::{DataType, Tag, TaskArgs, memory::TensorView};
/// # let buf = simpler::__private::doc_buffer(64)?;
/// # let a = buf.view(TensorView::new(0, &[8], None, DataType::Float32)?)?;
/// # let b = buf.view(TensorView::new(32, &[8], None, DataType::Float32)?)?;
/// let mut args = TaskArgs::new();
/// args.input(&a)?.output(&b)?.scalar(8);
/// assert_eq!(args.tensor_count(), 2);
/// assert_eq!(args.tag(1), Some(Tag::Output));
/// assert!(args.input(&a).is_err()); // a tensor after a scalar
/// # Ok::<(), simpler::Error>(())
/// ```
#[derive(Clone, Default)]
pub struct TaskArgs {
    // Tensors live out of line so a `TaskArgs` stays small: it is moved several times on its
    // way into a task slot, and copying inline tensors showed up in the submit profile.
    pub(crate) tensors: Vec<Tensor>,
    pub(crate) tags: SmallVec<[Tag; 8]>,
    pub(crate) scalars: SmallVec<[u64; 4]>,
    pub(crate) deps: Vec<Dep>,
    /// Tensors (bit `i`: tensor `i`, the first 64) whose edges the submitter states itself
    /// through `deps`, so the TensorMap neither looks them up nor records them: a
    /// `task_graph!`'s own intermediates, whose every use the graph tracks (static edges).
    pub(crate) static_tensors: u64,
}

impl std::fmt::Debug for TaskArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskArgs")
            .field("tensors", &self.tensors.iter().zip(&self.tags).collect::<Vec<_>>())
            .field("scalars", &self.scalars)
            .field("deps", &self.deps)
            .finish()
    }
}

impl TaskArgs {
    /// Empty arguments.
    ///
    /// ```
    /// use simpler::TaskArgs;
    /// let args = TaskArgs::new();
    /// assert_eq!((args.tensor_count(), args.scalar_count(), args.deps().len()), (0, 0, 0));
    /// ```
    pub fn new() -> TaskArgs {
        TaskArgs::default()
    }

    /// Adds a tensor with a tag; returns `self` for chaining.
    ///
    /// # Errors
    ///
    /// When a scalar was already added (tensors must come first), or the tag is
    /// [`Tag::NoDep`] (add it with the `unsafe` [`no_dep`](Self::no_dep)), an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error; the arguments
    /// are left unchanged.
    ///
    /// ```
    /// # use simpler::{DataType, memory::TensorView};
    /// # let buf = simpler::__private::doc_buffer(64)?;
    /// # let a = buf.view(TensorView::new(0, &[8], None, DataType::Float32)?)?;
    /// # let b = buf.view(TensorView::new(32, &[8], None, DataType::Float32)?)?;
    /// use simpler::{Tag, TaskArgs};
    /// let mut args = TaskArgs::new();
    /// args.add_tensor(&a, Tag::OutputExisting)?.add_tensor(&b, Tag::Input)?;
    /// assert_eq!(args.tag(0), Some(Tag::OutputExisting));
    /// assert!(args.add_tensor(&b, Tag::NoDep).is_err()); // only through `no_dep`
    /// args.scalar(1);
    /// assert!(args.add_tensor(&a, Tag::Input).is_err());
    /// assert_eq!(args.tensor_count(), 2);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn add_tensor(&mut self, tensor: &Tensor, tag: Tag) -> Result<&mut TaskArgs> {
        if tag == Tag::NoDep {
            return Err(no_dep_refused(self.tensors.len()));
        }
        self.push_tensor(tensor, tag)
    }

    /// Adds a tensor tagged [`Tag::NoDep`]: untracked, so the task neither waits for the tasks
    /// that use its bytes nor makes later ones wait, and it gets read-write access; errors as
    /// [`add_tensor`](Self::add_tensor).
    ///
    /// # Safety
    ///
    /// The task's callable receives this tensor as a slice it may write (`&mut [T]` from
    /// [`HostArgs::output`](crate::HostArgs::output), or a kernel's) while other tasks may hold
    /// slices of the same bytes, on other threads or processes. The caller must ensure that no
    /// two tasks that may run at once access these bytes in a way that races or aliases a
    /// mutable slice: for example, every task touches them only through atomics (a scratch word
    /// that tasks synchronize on), or the tasks are ordered by other means (explicit
    /// dependencies).
    ///
    /// ```
    /// # use simpler::{DataType, memory::TensorView};
    /// # let buf = simpler::__private::doc_buffer(64)?;
    /// # let flags = buf.view(TensorView::new(0, &[2], None, DataType::Uint32)?)?;
    /// use simpler::{Tag, TaskArgs};
    /// let mut args = TaskArgs::new();
    /// // SAFETY: every task that names `flags` reads and writes it only as `AtomicU32`s.
    /// unsafe { args.no_dep(&flags)? };
    /// assert_eq!(args.tag(0), Some(Tag::NoDep));
    /// # Ok::<(), simpler::Error>(())
    /// ```
    #[expect(unsafe_code, reason = "the caller takes over the ordering of an untracked tensor")]
    pub unsafe fn no_dep(&mut self, tensor: &Tensor) -> Result<&mut TaskArgs> {
        self.push_tensor(tensor, Tag::NoDep)
    }

    /// Narrows each [`Tag::Input`] tensor to [`Access::Read`]: what an orchestration function
    /// receives may then go only where a callable reads it (a submit checks each tag against its
    /// tensor's access).
    pub(crate) fn narrow_inputs(&mut self) {
        for (t, tag) in self.tensors.iter_mut().zip(&self.tags) {
            if *tag == Tag::Input
                && let Ok(read) = t.narrowed(Access::Read)
            {
                *t = read;
            }
        }
    }

    /// Adds a tensor with any tag (`NoDep` included; for the crate's own tests).
    pub(crate) fn push_tensor(&mut self, tensor: &Tensor, tag: Tag) -> Result<&mut TaskArgs> {
        if !self.scalars.is_empty() {
            return Err(Error::invalid(format!(
                "TaskArgs: cannot add tensor {} after a scalar; add every tensor before the first scalar",
                self.tensors.len()
            )));
        }
        self.tensors.push(tensor.clone());
        self.tags.push(tag);
        Ok(self)
    }

    /// Adds a tensor tagged [`Tag::Input`]; errors as [`add_tensor`](Self::add_tensor).
    ///
    /// ```
    /// # use simpler::{DataType, memory::TensorView};
    /// # let buf = simpler::__private::doc_buffer(64)?;
    /// # let a = buf.view(TensorView::new(0, &[8], None, DataType::Float32)?)?;
    /// # let b = buf.view(TensorView::new(32, &[8], None, DataType::Float32)?)?;
    /// use simpler::{Tag, TaskArgs};
    /// let mut args = TaskArgs::new();
    /// args.input(&a)?;
    /// assert_eq!(args.tag(0), Some(Tag::Input));
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn input(&mut self, tensor: &Tensor) -> Result<&mut TaskArgs> {
        self.add_tensor(tensor, Tag::Input)
    }

    /// Adds a tensor tagged [`Tag::Output`]; errors as [`add_tensor`](Self::add_tensor).
    ///
    /// ```
    /// # use simpler::{DataType, memory::TensorView};
    /// # let buf = simpler::__private::doc_buffer(64)?;
    /// # let a = buf.view(TensorView::new(0, &[8], None, DataType::Float32)?)?;
    /// # let b = buf.view(TensorView::new(32, &[8], None, DataType::Float32)?)?;
    /// use simpler::{Tag, TaskArgs};
    /// let mut args = TaskArgs::new();
    /// args.output(&b)?;
    /// assert_eq!(args.tag(0), Some(Tag::Output));
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn output(&mut self, tensor: &Tensor) -> Result<&mut TaskArgs> {
        self.add_tensor(tensor, Tag::Output)
    }

    /// Adds a tensor tagged [`Tag::InOut`]; errors as [`add_tensor`](Self::add_tensor).
    ///
    /// ```
    /// # use simpler::{DataType, memory::TensorView};
    /// # let buf = simpler::__private::doc_buffer(64)?;
    /// # let a = buf.view(TensorView::new(0, &[8], None, DataType::Float32)?)?;
    /// # let b = buf.view(TensorView::new(32, &[8], None, DataType::Float32)?)?;
    /// use simpler::{Tag, TaskArgs};
    /// let mut args = TaskArgs::new();
    /// args.inout(&a)?;
    /// assert_eq!(args.tag(0), Some(Tag::InOut));
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn inout(&mut self, tensor: &Tensor) -> Result<&mut TaskArgs> {
        self.add_tensor(tensor, Tag::InOut)
    }

    /// Adds a `u64` scalar; returns `self` for chaining.
    ///
    /// ```
    /// use simpler::TaskArgs;
    /// let mut args = TaskArgs::new();
    /// args.scalar(3).scalar(u64::MAX);
    /// assert_eq!(args.scalars(), &[3, u64::MAX]);
    /// ```
    pub fn scalar(&mut self, value: u64) -> &mut TaskArgs {
        self.scalars.push(value);
        self
    }

    /// Adds an `f32` scalar as its IEEE bits, zero-extended; a host function reads it back with
    /// [`HostArgs::scalar_f32`](crate::HostArgs::scalar_f32).
    ///
    /// ```
    /// use simpler::TaskArgs;
    /// let mut args = TaskArgs::new();
    /// args.scalar_f32(1.5);
    /// let bits = args.scalar_at(0).unwrap();
    /// assert_eq!(bits, u64::from(1.5f32.to_bits()));
    /// assert_eq!(f32::from_bits(bits as u32), 1.5);
    /// ```
    pub fn scalar_f32(&mut self, value: f32) -> &mut TaskArgs {
        self.scalar(u64::from(value.to_bits()))
    }

    /// Orders this task after `task` and keeps `task` retained until this one completes.
    ///
    /// ```no_run
    /// # fn demo(orch: &mut simpler::Orchestrator<'_>, f: &simpler::CallableHandle) -> simpler::Result<()> {
    /// use simpler::TaskArgs;
    /// let producer = orch.submit_sub(f, TaskArgs::new())?;
    /// let mut args = TaskArgs::new();
    /// args.add_dep(producer);
    /// assert!(args.deps()[0].retain);
    /// orch.submit_sub(f, args)?; // starts after `producer` completes
    /// # Ok(()) }
    /// ```
    pub fn add_dep(&mut self, task: TaskHandle) -> &mut TaskArgs {
        self.deps.push(Dep { task, retain: true });
        self
    }

    /// Orders this task after `task` without retaining it (ordering only).
    ///
    /// ```no_run
    /// # fn demo(orch: &mut simpler::Orchestrator<'_>, f: &simpler::CallableHandle) -> simpler::Result<()> {
    /// use simpler::TaskArgs;
    /// let producer = orch.submit_sub(f, TaskArgs::new())?;
    /// let mut args = TaskArgs::new();
    /// args.add_dep_wait(producer);
    /// assert!(!args.deps()[0].retain);
    /// orch.submit_sub(f, args)?; // starts after `producer` completes
    /// # Ok(()) }
    /// ```
    pub fn add_dep_wait(&mut self, task: TaskHandle) -> &mut TaskArgs {
        self.deps.push(Dep { task, retain: false });
        self
    }

    /// Number of tensors.
    ///
    /// ```
    /// # use simpler::{DataType, memory::TensorView};
    /// # let buf = simpler::__private::doc_buffer(64)?;
    /// # let a = buf.view(TensorView::new(0, &[8], None, DataType::Float32)?)?;
    /// # let b = buf.view(TensorView::new(32, &[8], None, DataType::Float32)?)?;
    /// let mut args = simpler::TaskArgs::new();
    /// args.input(&a)?.output(&b)?;
    /// assert_eq!(args.tensor_count(), 2);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    /// Number of scalars.
    ///
    /// ```
    /// let mut args = simpler::TaskArgs::new();
    /// args.scalar(1).scalar_f32(2.0);
    /// assert_eq!(args.scalar_count(), 2);
    /// ```
    pub fn scalar_count(&self) -> usize {
        self.scalars.len()
    }

    /// The tensor at `i`, or `None` past the end.
    ///
    /// ```
    /// # use simpler::{DataType, memory::TensorView};
    /// # let buf = simpler::__private::doc_buffer(64)?;
    /// # let a = buf.view(TensorView::new(0, &[8], None, DataType::Float32)?)?;
    /// # let b = buf.view(TensorView::new(32, &[8], None, DataType::Float32)?)?;
    /// let mut args = simpler::TaskArgs::new();
    /// args.input(&a)?.output(&b)?;
    /// assert_eq!(args.tensor(1), Some(&b));
    /// assert!(args.tensor(2).is_none());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn tensor(&self, i: usize) -> Option<&Tensor> {
        self.tensors.get(i)
    }

    /// The tag of tensor `i`, or `None` past the end.
    ///
    /// ```
    /// # use simpler::{DataType, memory::TensorView};
    /// # let buf = simpler::__private::doc_buffer(64)?;
    /// # let a = buf.view(TensorView::new(0, &[8], None, DataType::Float32)?)?;
    /// # let b = buf.view(TensorView::new(32, &[8], None, DataType::Float32)?)?;
    /// use simpler::Tag;
    /// let mut args = simpler::TaskArgs::new();
    /// args.inout(&a)?;
    /// assert_eq!(args.tag(0), Some(Tag::InOut));
    /// assert_eq!(args.tag(1), None);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn tag(&self, i: usize) -> Option<Tag> {
        self.tags.get(i).copied()
    }

    /// Changes the tag of tensor `i`.
    ///
    /// # Errors
    ///
    /// An index past the end, or [`Tag::NoDep`] (add the tensor with the `unsafe`
    /// [`no_dep`](Self::no_dep) instead), is an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error.
    ///
    /// ```
    /// # use simpler::{DataType, memory::TensorView};
    /// # let buf = simpler::__private::doc_buffer(64)?;
    /// # let a = buf.view(TensorView::new(0, &[8], None, DataType::Float32)?)?;
    /// # let b = buf.view(TensorView::new(32, &[8], None, DataType::Float32)?)?;
    /// use simpler::Tag;
    /// let mut args = simpler::TaskArgs::new();
    /// args.input(&a)?;
    /// args.set_tag(0, Tag::InOut)?;
    /// assert_eq!(args.tag(0), Some(Tag::InOut));
    /// assert!(args.set_tag(0, Tag::NoDep).is_err());
    /// assert!(args.set_tag(1, Tag::Input).is_err());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn set_tag(&mut self, i: usize, tag: Tag) -> Result<()> {
        if tag == Tag::NoDep {
            return Err(no_dep_refused(i));
        }
        let n = self.tags.len();
        let slot = self.tags.get_mut(i).ok_or_else(|| {
            Error::invalid(format!("TaskArgs: tensor index {i} out of range ({n} tensors)"))
        })?;
        *slot = tag;
        Ok(())
    }

    /// The scalar at `i`, or `None` past the end.
    ///
    /// ```
    /// let mut args = simpler::TaskArgs::new();
    /// args.scalar(10).scalar(20);
    /// assert_eq!(args.scalar_at(1), Some(20));
    /// assert_eq!(args.scalar_at(2), None);
    /// ```
    pub fn scalar_at(&self, i: usize) -> Option<u64> {
        self.scalars.get(i).copied()
    }

    /// All tensors, in the order they were added.
    ///
    /// ```
    /// # use simpler::{DataType, memory::TensorView};
    /// # let buf = simpler::__private::doc_buffer(64)?;
    /// # let a = buf.view(TensorView::new(0, &[8], None, DataType::Float32)?)?;
    /// # let b = buf.view(TensorView::new(32, &[8], None, DataType::Float32)?)?;
    /// let mut args = simpler::TaskArgs::new();
    /// args.input(&a)?.output(&b)?;
    /// assert_eq!(args.tensors(), &[a, b]);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// All scalars, in the order they were added.
    ///
    /// ```
    /// let mut args = simpler::TaskArgs::new();
    /// args.scalar(1).scalar(2);
    /// assert_eq!(args.scalars(), &[1, 2]);
    /// ```
    pub fn scalars(&self) -> &[u64] {
        &self.scalars
    }

    /// The explicit dependencies, in the order they were added.
    ///
    /// ```no_run
    /// # fn demo(orch: &mut simpler::Orchestrator<'_>, f: &simpler::CallableHandle) -> simpler::Result<()> {
    /// use simpler::TaskArgs;
    /// let (a, b) = (orch.submit_sub(f, TaskArgs::new())?, orch.submit_sub(f, TaskArgs::new())?);
    /// let mut args = TaskArgs::new();
    /// args.add_dep(a).add_dep_wait(b);
    /// let deps = args.deps();
    /// assert_eq!((deps[0].task, deps[0].retain), (a, true));
    /// assert_eq!((deps[1].task, deps[1].retain), (b, false));
    /// # Ok(()) }
    /// ```
    pub fn deps(&self) -> &[Dep] {
        &self.deps
    }

    /// Marks tensor `i` as one whose edges `deps` state (a `task_graph!`'s intermediate). Only
    /// for generated code: every task that names the tensor must be submitted this way, with
    /// every dependency the engine's rules would give it.
    pub(crate) fn set_static(&mut self, i: usize) {
        if i < 64 {
            self.static_tensors |= 1 << i;
        }
    }

    /// Whether tensor `i`'s edges are stated by `deps` (see `set_static`).
    pub(crate) fn is_static(&self, i: usize) -> bool {
        i < 64 && self.static_tensors & (1 << i) != 0
    }

    /// Removes everything (tensors, scalars and dependencies), so the value can be reused.
    ///
    /// ```
    /// # use simpler::{DataType, memory::TensorView};
    /// # let buf = simpler::__private::doc_buffer(64)?;
    /// # let a = buf.view(TensorView::new(0, &[8], None, DataType::Float32)?)?;
    /// # let b = buf.view(TensorView::new(32, &[8], None, DataType::Float32)?)?;
    /// let mut args = simpler::TaskArgs::new();
    /// args.input(&a)?.scalar(1);
    /// args.clear();
    /// assert_eq!((args.tensor_count(), args.scalar_count()), (0, 0));
    /// args.output(&b)?; // tensors are allowed again
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn clear(&mut self) {
        self.static_tensors = 0;
        self.tensors.clear();
        self.tags.clear();
        self.scalars.clear();
        self.deps.clear();
    }
}
/// Why `add_tensor` and `set_tag` refuse `Tag::NoDep`.
fn no_dep_refused(i: usize) -> Error {
    Error::invalid(format!(
        "TaskArgs: tensor {i} cannot be tagged NoDep here: an untracked tensor can alias another task's slices, so add it with the unsafe TaskArgs::no_dep"
    ))
}
