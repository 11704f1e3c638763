//! The phases of a chip run, and [`ChipRun`], the run between them.
//!
//! A run goes through four phases, and [`ChipRuntime::run`] is their blocking composition;
//! [`ChipRuntime::start`] prepares and launches at once:
//!
//! * [`ChipRuntime::prepare`] (steps 1-3 below, on the caller's thread): admit the
//!   run's [`Lease`] (its slot's generation high-water mark refuses a stale one, rule L5 of
//!   `engine::lease`), look the callable up, check the tensors, grow the slot's staging buffer
//!   if needed and copy the host inputs in. Nothing reaches the cores: the slot's staging
//!   buffer is fenced (rule A6 of `chip::arena`), so this overlaps the kernels of the run that
//!   executes.
//! * [`ChipRuntime::launch`]: hands the run to the executor thread and returns at once.
//!   Refused while another run is launched and not finalized: runs execute one at a time.
//! * [`ChipRuntime::poll`] / [`ChipRuntime::wait`]: whether / until it is done.
//! * [`ChipRuntime::finalize`] (steps 5-6): copy the outputs back on success, fence
//!   the staging buffer, and give the run's result.
//!
//! A chip holds at most one launched (active) run and one prepared, unlaunched run: a second
//! prepare is refused until the prepared run launches, and a prepared run's slot must differ
//! from the active one's (each slot has its own staging buffer: resource class `HostPerRun`;
//! the chip engine and its `orch.alloc` memory are the one `DeviceScratch`, used only by the
//! active run).
//!
//! One run, end to end:
//!
//! 1. look the callable up by digest (`UNKNOWN_CALLABLE` when absent), and refuse a kernel's
//!    task whose tensors or scalars do not match the parameters its OpenCL C source declares
//!    (`callable::signature`);
//! 2. check every device tensor: its view lies inside its buffer, and the buffer is a live
//!    allocation of this chip;
//! 3. give every host tensor a slice of the pipeline slot's retained staging buffer
//!    (`chip::staging`: grow-only, 64-byte bump slices, no device allocation once it is large
//!    enough) holding its view packed (contiguous, offset 0, the view's shape: a strided view,
//!    such as a tile of a matrix, reaches the kernel as a plain tensor), and copy the view's
//!    elements in when the tensor is readable (`Read`, `ReadWrite`): one backend copy, from the
//!    view in place when it is contiguous, else gathered on the host first;
//! 4. run, on the executor thread: a kernel there as core 0; a chip orchestration as one run of the
//!    chip engine, with every tensor handed over as device memory (`Backing::Device`) tagged
//!    from its access (`Read` -> `Input`, `Write` -> `Output`, `ReadWrite` -> `InOut`);
//! 5. on success, copy the elements of every writable host tensor back, unpacked into the
//!    host view's elements (on failure the host tensors are left as they were);
//! 6. fence the staging buffer again (rule A6 of `chip::arena`), whatever happened; it is
//!    freed when the chip shuts down.
//!
//! What a run calls is a [`ChipCall`] (digest, tensors, scalars, config). [`ChipRuntime::run`]
//! composes the phases under the chip's own lease and executes the run on the calling thread
//! (`launch_here`): with no successor prepared there is nothing to overlap, and a hop to the
//! executor thread and back cost two wake-ups per chip task. [`ChipRuntime::start`] prepares
//! and launches at once, where [`RunOn`] says; `launch` and `start` take a [`Trace`], whether
//! the run records what it runs.
//!
//! * `prepare` grows the slot's staging buffer before any copy (a failed grow fails this run
//!   only). With [`CopyIn::InPieces`] it does all but the copy, which
//!   [`ChipRuntime::copy_in_some`] then makes a piece at a time (`Arena::copy_view_in_part`: any
//!   view, a piece cut anywhere, even inside an element); `launch` refuses a run whose inputs
//!   are not all in.
//! * `launch` unfences the slot's staging buffer and hands the run to the chip's executor thread
//!   (`chip{N}-exec`), and returns.
//! * A prepared run finalized unlaunched gives its place up and fails saying so. A run given the
//!   host tensors its outputs go to before it launches ([`ChipRun::copy_back_into`],
//!   `KeptTensor`s that hold their mappings, rule H5 of `data::host_args`) has them copied back
//!   by whoever executes it, as soon as it succeeded (`ExecCtx::run_job`), and `finalize` copies
//!   nothing.

use super::*;

/// Whether a launched run records what it runs (its kernels on the cores, or a bare kernel as
/// one task on core 0), for a task of a captured parent run; [`ChipRuntime::finalize_traced`]
/// gives the records back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trace {
    /// Records nothing.
    Off,
    /// Records what the run runs.
    Record,
}

/// When [`ChipRuntime::prepare`] copies a run's readable host tensors into their staging
/// slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyIn {
    /// Before `prepare` returns.
    Now,
    /// Later, a piece at a time, by [`ChipRuntime::copy_in_some`]; the run launches only once
    /// they are all in.
    InPieces,
}

/// Which run [`ChipRuntime::prepare_as`] prepares.
#[derive(Debug, Clone, Copy)]
enum PrepareMode {
    /// The chip's prepared run (at most one at a time), for [`ChipRuntime::launch`].
    Waiting(CopyIn),
    /// A run [`ChipRuntime::start`] launches at once: never the chip's prepared run, so one may
    /// wait beside it.
    Ahead,
}

/// Where [`ChipRuntime::start`] executes a run.
pub(crate) enum RunOn {
    /// On the calling thread: done when `start` returns.
    Here,
    /// On the chip's executor thread, which also copies the run's outputs back into the given
    /// host tensors ([`ChipRun::copy_back_into`]).
    Executor(CopyBack),
}

/// Where a [`ChipRun`] is.
enum Phase {
    Prepared,
    Launched,
    /// Its result, and the records of what it ran when it was launched traced.
    Done(Result<()>, Option<Vec<TaskRecord>>),
    Finished,
}

/// One chip run between [`ChipRuntime::prepare`] (or [`start`](ChipRuntime::start)) and
/// [`ChipRuntime::finalize`]: its lease, its callable, its arguments (host tensors borrowed
/// until their outputs are copied back) and where it is. Give every run to `finalize`: a launched run dropped unfinalized leaves the
/// chip refusing further launches.
pub(crate) struct ChipRun<'a> {
    lease: Lease,
    name: String,
    body: RunBody,
    args: Vec<ChipArg<'a>>,
    pub(super) prepared: Vec<Prepared>,
    scalars: Vec<u64>,
    config: CallConfig,
    phase: Phase,
    /// Prepared by [`ChipRuntime::start`], to launch at once (not the chip's prepared run).
    ahead: bool,
    /// Host inputs still to copy in (a run prepared with its copy-in deferred): the next
    /// tensor's index and the bytes of it already in. `None` once all are in.
    copying: Option<(usize, u64)>,
    /// The host tensors its outputs go back to as soon as it has executed, given by
    /// [`ChipRun::copy_back_into`], until it launches.
    back: Option<CopyBack>,
    /// Launched with `back`: its executor copies its outputs back, not `finalize`.
    backed: bool,
}

impl std::fmt::Debug for ChipRun<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChipRun").field("lease", &self.lease).field("callable", &self.name).finish()
    }
}

impl ChipRun<'_> {
    /// The run without its host tensors, which it needs only to copy its outputs back: give
    /// them to [`ChipRuntime::finalize_traced`] again, mapped anew. For a caller that keeps a
    /// run across requests (a two-frame chip child), while the mappings it borrowed change.
    pub(crate) fn detach(self) -> ChipRun<'static> {
        ChipRun {
            lease: self.lease,
            name: self.name,
            body: self.body,
            args: Vec::new(),
            prepared: self.prepared,
            scalars: self.scalars,
            config: self.config,
            phase: self.phase,
            ahead: self.ahead,
            copying: self.copying,
            back: self.back,
            backed: self.backed,
        }
    }

    /// Has the run's outputs copied back into `back` by whoever executes it, as soon as it
    /// has executed successfully, rather than by [`ChipRuntime::finalize_traced`]: a
    /// pipelined chip's executor thread then copies them back while the chip thread goes on
    /// copying the next run in. `back` holds every writable host tensor of the run, each with
    /// its index among the run's tensors. Only before the run launches.
    pub(crate) fn copy_back_into(&mut self, back: CopyBack) {
        self.back = Some(back);
    }

    /// Whether its outputs go back through [`copy_back_into`](Self::copy_back_into)'s tensors.
    pub(crate) fn copies_back(&self) -> bool {
        self.back.is_some() || self.backed
    }

    /// Whether every host input of the run is in its staging slice (only a run prepared with
    /// [`ChipRuntime::prepare`] with [`CopyIn::InPieces`] may still lack some).
    pub(crate) fn copied(&self) -> bool {
        self.copying.is_none()
    }

    /// The lease the run holds.
    #[cfg(feature = "bench-support")]
    pub(crate) fn lease(&self) -> Lease {
        self.lease
    }
}

/// A tensor ready to run: device memory of this chip.
#[derive(Clone)]
pub(super) struct Prepared {
    pub(super) ptr: u64,
    pub(super) view: TensorView,
    pub(super) access: Access,
    pub(super) identity: Identity,
    pub(super) nbytes: u64,
}

impl ChipRuntime {
    /// Runs `call` (see the [module docs](super) for the steps): the blocking composition of
    /// [`prepare`](Self::prepare), [`launch`](Self::launch), [`wait`](Self::wait) and
    /// [`finalize`](Self::finalize), under a lease of the chip's own.
    ///
    /// It executes on the calling thread ([`launch`](Self::launch) hands a run to the chip's
    /// executor thread instead, for a caller that prepares the next run meanwhile). A kernel
    /// runs as core 0 (`worker_index() == 0`) and ignores the call's config; a chip
    /// orchestration receives it and runs its kernels on the core threads. Device tensors must
    /// belong to this chip (the caller checks the owner; this checks liveness and bounds).
    /// Errors: an unknown digest is an [`ErrorKind::Callable`] error starting
    /// `UNKNOWN_CALLABLE`; a bad tensor an [`ErrorKind::InvalidArgument`] error; a failing or
    /// panicking kernel an [`ErrorKind::TaskFailed`] error with its message; a chip
    /// orchestration's own error, or else the first error of its run. Never panics on bad
    /// input. Returns once every kernel of the run has returned (a kernel that never returns
    /// blocks the chip, as on a device).
    pub(crate) fn run(&mut self, call: ChipCall<'_>) -> Result<()> {
        self.usable()?;
        let lease = self.leases.acquire().ok_or_else(|| {
            Error::state(format!(
                "chip {}: every pipeline slot is held by a run in flight; finalize one first",
                self.chip
            ))
        })?;
        self.in_run = true;
        let result = match self.prepare(lease, call, CopyIn::Now) {
            Err(e) => Err(e),
            Ok(mut run) => {
                // A kernel's failure is its own message (a parent's engine names the task and
                // the chip); called directly, this names them.
                let kernel = matches!(run.body, RunBody::Kernel(_)).then(|| run.name.clone());
                let result = match self.launch_here(&mut run, Trace::Off) {
                    Ok(()) => self.finalize(run),
                    Err(e) => {
                        let _ = self.finalize(run);
                        Err(e)
                    }
                };
                result.map_err(|e| match kernel {
                    Some(name) if e.kind() == ErrorKind::TaskFailed => {
                        e.context(format!("kernel `{name}` failed on chip {}", self.chip))
                    }
                    _ => e,
                })
            }
        };
        if let Err(e) = self.leases.release(lease) {
            tracing::error!(target: "simpler::chip", chip = self.chip, "returning {lease}: {e}");
        }
        self.in_run = false;
        result
    }

    /// Phase 1: admits `lease`, looks the callable up, checks the tensors, and stages the host
    /// tensors in the lease's slot (see the [module docs](super)): the chip's prepared run,
    /// which [`launch`](Self::launch) launches. Overlaps the executing run. With
    /// [`CopyIn::InPieces`] the host inputs are only checked and given their staging slices;
    /// [`copy_in_some`](Self::copy_in_some) copies them a piece at a time, so that a caller who
    /// copies also answers the executing run's end meanwhile, and the run launches only once
    /// they are all in.
    ///
    /// Refused (an [`ErrorKind::InvalidState`] error) while another run is prepared and not
    /// launched, for the slot of the executing run, or for a stale lease; otherwise errors as
    /// [`run`](Self::run)'s steps 1-3. A failed prepare leaves no run behind and nothing else
    /// changed: the executing run goes on.
    pub(crate) fn prepare<'a>(
        &mut self,
        lease: Lease,
        call: ChipCall<'a>,
        copy: CopyIn,
    ) -> Result<ChipRun<'a>> {
        self.prepare_as(lease, call, PrepareMode::Waiting(copy))
    }

    /// Copies up to `budget` more bytes of the host inputs of a run prepared with
    /// [`prepare`](Self::prepare) with [`CopyIn::InPieces`] into its staging slices (a budget of 0
    /// counts as 1); true once they are all in (at once for any other run). `args` are the
    /// run's tensors, mapped anew, as given to [`finalize_traced`](Self::finalize_traced); a
    /// tensor that differs from the one prepared is an [`ErrorKind::InvalidArgument`] error,
    /// and the run should then be finalized. A backend sees one `copy_to_device` per piece of
    /// a contiguous run the budget cuts.
    pub(crate) fn copy_in_some(
        &mut self,
        run: &mut ChipRun<'_>,
        args: &[ChipArg<'_>],
        budget: u64,
    ) -> Result<bool> {
        let Some((mut i, mut done)) = run.copying else { return Ok(true) };
        if !matches!(run.phase, Phase::Prepared) || args.len() != run.prepared.len() {
            return Err(Error::new(
                ErrorKind::Internal,
                format!(
                    "chip {}: copying in `{}` ({} tensors prepared, {} given) after it was launched or with other tensors",
                    self.chip,
                    run.name,
                    run.prepared.len(),
                    args.len()
                ),
            ));
        }
        // At least a byte per call, so a caller's loop always ends.
        let mut left = budget.max(1);
        while i < args.len() && left > 0 {
            let n = match &args[i] {
                ChipArg::Host(m) if m.access().can_read() => {
                    let p = &run.prepared[i];
                    self.device.copy_in_part(m, p.ptr, &p.view, (done, left)).map_err(|e| {
                        Error::invalid(format!(
                            "chip {}: `{}` tensor {i}: {}",
                            self.chip,
                            run.name,
                            e.message()
                        ))
                    })?
                }
                _ => 0,
            };
            if n < left {
                (i, done) = (i + 1, 0);
            } else {
                done += n;
            }
            left -= n;
        }
        run.copying = (i < args.len()).then_some((i, done));
        Ok(run.copying.is_none())
    }

    /// [`prepare`](Self::prepare) and [`launch`](Self::launch) at once, also while another run
    /// is prepared and waits (a successor staged before this run arrived): the run is never a
    /// prepared, unlaunched one, so the chip still holds at most one of those. Where it
    /// executes is `on`'s ([`RunOn::Here`]: on the calling thread, done when this returns).
    /// Refused while another run is launched and not finalized, or for the waiting run's slot.
    /// `launching` is called once the run is prepared, just before it is launched (a caller
    /// that must tell whether the run got as far as executing, should its process die).
    pub(crate) fn start<'a>(
        &mut self,
        lease: Lease,
        call: ChipCall<'a>,
        on: RunOn,
        trace: Trace,
        launching: impl FnOnce(),
    ) -> Result<ChipRun<'a>> {
        if let Some(a) = self.active {
            return Err(Error::state(format!(
                "chip {}: starting a run under {lease} while the run under {a} executes; finalize it first",
                self.chip
            )));
        }
        let mut run = self.prepare_as(lease, call, PrepareMode::Ahead)?;
        launching();
        let launched = match on {
            RunOn::Here => self.launch_here(&mut run, trace),
            RunOn::Executor(back) => {
                run.copy_back_into(back);
                self.launch(&mut run, trace)
            }
        };
        match launched {
            Ok(()) => Ok(run),
            Err(e) => {
                let _ = self.finalize(run);
                Err(e)
            }
        }
    }

    /// [`prepare`](Self::prepare) or the preparation of [`start`](Self::start), as `mode` says.
    fn prepare_as<'a>(&mut self, lease: Lease, call: ChipCall<'a>, mode: PrepareMode) -> Result<ChipRun<'a>> {
        let ChipCall { digest, args, scalars, config } = call;
        let (ahead, copy) = match mode {
            PrepareMode::Waiting(copy) => (false, copy),
            PrepareMode::Ahead => (true, CopyIn::Now),
        };
        if self.closed {
            return Err(Error::state(format!("chip {} is shut down", self.chip)));
        }
        if let Some(w) = self.waiting
            && (!ahead || w.slot == lease.slot)
        {
            return Err(Error::state(format!(
                "chip {}: preparing a run under {lease} while the run under {w} is prepared and not launched; a chip holds one prepared run",
                self.chip
            )));
        }
        if let Some(a) = self.active
            && a.slot == lease.slot
        {
            return Err(Error::state(format!(
                "chip {}: preparing a run under {lease} while the run under {a} executes in the same slot",
                self.chip
            )));
        }
        self.marks.admit(lease).map_err(|e| e.context(format!("chip {}", self.chip)))?;
        let Some(f) = self.read_registry().get(&digest).cloned() else {
            return Err(Error::new(
                ErrorKind::Callable,
                format!("UNKNOWN_CALLABLE: {digest} is not registered on chip {}", self.chip),
            ));
        };
        let _span = tracing::debug_span!(target: "simpler::chip", "chip prepare", chip = self.chip, callable = f.name(), slot = lease.slot, generation = lease.generation)
            .entered();
        if let Some(sig) = f.signature() {
            let dtypes = args.iter().map(|a| match a {
                ChipArg::Host(t) => t.view().dtype(),
                ChipArg::Device { view, .. } => view.dtype(),
            });
            // The handle (an allocation) is made only for the message of a mismatch.
            let name = std::fmt::from_fn(|out| std::fmt::Display::fmt(&f.handle(), out));
            sig.check(&name, dtypes, scalars.len())?;
        }
        let prepared = self.stage(&f, &args, lease.slot as usize, copy)?;
        if !ahead {
            self.set_waiting(Some(lease));
        }
        Ok(ChipRun {
            lease,
            name: f.name().to_string(),
            body: f.run_body(),
            args,
            prepared,
            scalars,
            config,
            phase: Phase::Prepared,
            ahead,
            copying: matches!(copy, CopyIn::InPieces).then_some((0, 0)),
            back: None,
            backed: false,
        })
    }

    /// Phase 2: hands the prepared `run` to the executor thread and returns; with
    /// [`Trace::Record`] the run records what it runs (given back by
    /// [`finalize_traced`](Self::finalize_traced)). Refused (an [`ErrorKind::InvalidState`]
    /// error) while another run is launched and not finalized, or for a run that is not this
    /// chip's prepared one.
    pub(crate) fn launch(&mut self, run: &mut ChipRun<'_>, trace: Trace) -> Result<()> {
        let job = self.launchable(run, trace)?;
        self.exec.send(job).map_err(|e| e.context(format!("chip {}", self.chip)))?;
        if self.waiting == Some(run.lease) {
            self.set_waiting(None);
        }
        self.active = Some(run.lease);
        run.phase = Phase::Launched;
        Ok(())
    }

    /// [`launch`](Self::launch), but the run executes here, on the calling thread, and is done
    /// when this returns: what the blocking [`run`](Self::run) does when no other run of the
    /// chip is prepared to overlap it (a hop to the executor thread and back would cost two
    /// wake-ups per chip task for nothing).
    fn launch_here(&mut self, run: &mut ChipRun<'_>, trace: Trace) -> Result<()> {
        let mut job = self.launchable(run, trace)?;
        if self.waiting == Some(run.lease) {
            self.set_waiting(None);
        }
        self.active = Some(run.lease);
        let ctx = ExecCtx { chip: self.chip, device: self.device.clone(), engine: self.engine.clone() };
        let mut traced = None;
        // On this thread, which would be the one to shut the chip down.
        let result = ctx.run_job(&mut job, &mut traced, &AtomicBool::new(false));
        run.phase = Phase::Done(result, traced);
        Ok(())
    }

    /// The checks of a launch, the run's staging buffer unfenced, and the job to execute (with
    /// the host tensors its outputs go back to, when the run was given them).
    fn launchable(&mut self, run: &mut ChipRun<'_>, trace: Trace) -> Result<ExecJob> {
        if !matches!(run.phase, Phase::Prepared) || !(run.ahead || self.waiting == Some(run.lease)) {
            return Err(Error::state(format!(
                "chip {}: the run under {} is not this chip's prepared run",
                self.chip, run.lease
            )));
        }
        if let Some(a) = self.active {
            return Err(Error::state(format!(
                "chip {}: launching the run under {} while the run under {a} executes; finalize it first",
                self.chip, run.lease
            )));
        }
        if !run.copied() {
            return Err(Error::state(format!(
                "chip {}: launching the run under {} before its host inputs are all copied in",
                self.chip, run.lease
            )));
        }
        if let Some(ptr) = self.staging[run.lease.slot as usize].ptr() {
            self.device.unfence(ptr)?;
        }
        let back = run.back.take();
        run.backed = back.is_some();
        Ok(ExecJob {
            lease: run.lease,
            name: run.name.clone(),
            body: run.body.clone(),
            prepared: run.prepared.clone(),
            scalars: run.scalars.clone(),
            config: run.config.clone(),
            trace: trace == Trace::Record,
            back,
        })
    }

    /// Phase 3, without blocking: true once the launched `run` is done (or when it is not
    /// launched at all).
    pub(crate) fn poll(&mut self, run: &mut ChipRun<'_>) -> bool {
        if matches!(run.phase, Phase::Launched)
            && let Some((result, records)) = self.exec.try_take(run.lease, self.chip)
        {
            run.phase = Phase::Done(result, records);
        }
        !matches!(run.phase, Phase::Launched)
    }

    /// Phase 3: blocks until the launched `run` is done.
    pub(crate) fn wait(&mut self, run: &mut ChipRun<'_>) {
        if matches!(run.phase, Phase::Launched) {
            let (result, records) = self.exec.take(run.lease, self.chip);
            run.phase = Phase::Done(result, records);
        }
    }

    /// Phase 4: waits for `run` if needed, copies its writable host tensors back on success,
    /// fences its staging buffer and returns its result. A run finalized before it was
    /// launched gives up its prepared place and fails with an [`ErrorKind::InvalidState`]
    /// error saying so.
    pub(crate) fn finalize(&mut self, run: ChipRun<'_>) -> Result<()> {
        self.finalize_traced(run, None).0
    }

    /// [`finalize`](Self::finalize), copying the outputs back into `outputs` (the run's host
    /// tensors, mapped again: a [`detach`](ChipRun::detach)ed run holds none) when given, and
    /// with the records of what the run ran when it was launched traced.
    pub(crate) fn finalize_traced(
        &mut self,
        mut run: ChipRun<'_>,
        outputs: Option<&[ChipArg<'_>]>,
    ) -> (Result<()>, Option<Vec<TaskRecord>>) {
        self.wait(&mut run);
        let slot = run.lease.slot as usize;
        // The run gives its slot's block up (after this call, which holds the runtime, nobody
        // may take it meanwhile: the copy-back below still reads it).
        if let Some(s) = self.staging.get_mut(slot) {
            s.idle();
        }
        let (result, records) = match std::mem::replace(&mut run.phase, Phase::Finished) {
            Phase::Prepared => {
                if self.waiting == Some(run.lease) {
                    self.set_waiting(None);
                }
                let err = Error::state(format!(
                    "chip {}: the run under {} was finalized before it was launched",
                    self.chip, run.lease
                ));
                return (Err(err), None);
            }
            Phase::Done(result, records) => (result, records),
            Phase::Launched | Phase::Finished => unreachable!("waited for above"),
        };
        let args = std::mem::take(&mut run.args);
        let targets = outputs.unwrap_or(&args);
        // Copied back already, by whoever executed it, when the run was given its outputs.
        let result = result.and_then(|()| {
            if run.backed {
                return Ok(());
            }
            if targets.len() != run.prepared.len() {
                return Err(Error::new(
                    ErrorKind::Internal,
                    format!(
                        "chip {}: `{}` was prepared with {} tensors and finalized with {}",
                        self.chip,
                        run.name,
                        run.prepared.len(),
                        targets.len()
                    ),
                ));
            }
            for (i, (arg, p)) in targets.iter().zip(&run.prepared).enumerate() {
                if let ChipArg::Host(m) = arg
                    && m.access().can_write()
                {
                    self.device.copy_out(p.ptr, &p.view, m).map_err(|e| {
                        e.context(format!(
                            "chip {}: copying back host tensor {i} of `{}`",
                            self.chip, run.name
                        ))
                    })?;
                }
            }
            Ok(())
        });
        if let Some(ptr) = self.staging.get(slot).and_then(Staging::ptr)
            && let Err(e) = self.device.fence(ptr)
        {
            tracing::error!(target: "simpler::chip", chip = self.chip, "fencing the staging buffer: {e}");
        }
        if self.active == Some(run.lease) {
            self.active = None;
        }
        (result, records)
    }

    /// Steps 2 and 3: device tensors checked, host tensors given a slice of slot `slot`'s
    /// staging buffer (grown first when the run needs more, before anything is copied) and,
    /// when readable and `copy` is [`CopyIn::Now`], copied into it.
    fn stage(
        &mut self,
        f: &ChipFn,
        args: &[ChipArg<'_>],
        slot: usize,
        copy: CopyIn,
    ) -> Result<Vec<Prepared>> {
        let chip = self.chip;
        let device = self.device.clone();
        let host_sizes = args.iter().filter_map(|a| match a {
            // Packed: the view's elements with no gaps.
            ChipArg::Host(m) => Some(m.view().num_elements() * m.view().dtype().size() as u64),
            ChipArg::Device { .. } => None,
        });
        let (offsets, need) = staging::layout(host_sizes, device.align())
            .map_err(|e| e.context(format!("chip {chip}: `{}`", f.name())))?;
        let mut reserved = self.staging[slot].reserve(&device, need);
        if reserved.as_ref().is_err_and(|e| e.kind() == ErrorKind::ResourceExhausted) {
            // Another slot's block that serves no run now gives its memory back, and the
            // grow is tried again.
            let mut freed = false;
            for (i, other) in self.staging.iter_mut().enumerate() {
                if i != slot && other.reclaimable() {
                    other.release(&device)?;
                    freed = true;
                }
            }
            if freed {
                reserved = self.staging[slot].reserve(&device, need);
            }
        }
        let base = reserved.map_err(|e| {
            e.context(format!(
                "chip {chip}: `{}`: device scratch for its host tensors ({need} bytes in the staging buffer of pipeline slot {slot})",
                f.name()
            ))
        })?;
        let mut offsets = offsets.into_iter();
        let mut out = Vec::with_capacity(args.len());
        for (i, arg) in args.iter().enumerate() {
            let bad = |msg: String| Error::invalid(format!("chip {chip}: `{}` tensor {i}: {msg}", f.name()));
            match arg {
                ChipArg::Device { ptr, view, access, identity, nbytes } => {
                    let (_, end) = view.byte_range();
                    if end > *nbytes {
                        return Err(bad(format!(
                            "its view ends at byte {end}, past its {nbytes}-byte device buffer"
                        )));
                    }
                    if !device.is_live_as(*ptr, *nbytes, *identity) {
                        return Err(bad(format!(
                            "device buffer {identity} at {ptr:#x} (+{nbytes} bytes) is not a live allocation of this chip (freed, or never allocated here)"
                        )));
                    }
                    out.push(Prepared {
                        ptr: *ptr,
                        view: *view,
                        access: *access,
                        identity: *identity,
                        nbytes: *nbytes,
                    });
                }
                ChipArg::Host(m) => {
                    // The kernel sees the view packed: contiguous, of the view's shape, so a
                    // strided host view (a tile of a matrix, an inner-axis slice) reaches it
                    // as a plain tensor; the copy-back unpacks it into the view's elements.
                    let size = m.view().num_elements() * m.view().dtype().size() as u64;
                    let view = TensorView::new(0, m.view().shape(), None, m.view().dtype())
                        .map_err(|e| bad(e.message().to_string()))?;
                    let at = offsets.next().expect("one slice per host tensor");
                    let ptr = base.expect("a staging block when a host tensor is staged") + at;
                    // A write-only tensor is not copied in: its slice holds what an earlier run
                    // left there, as freshly allocated device memory would (never the host's
                    // bytes).
                    if copy == CopyIn::Now && m.access().can_read() {
                        device.copy_in(m, ptr, &view).map_err(|e| bad(e.message().to_string()))?;
                    }
                    let identity = self.scratch.mint()?;
                    out.push(Prepared { ptr, view, access: m.access(), identity, nbytes: size });
                }
            }
        }
        Ok(out)
    }
}
