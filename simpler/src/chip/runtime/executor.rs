//! The chip's executor thread: runs one launched run at a time (a kernel as core 0, or a chip
//! orchestration driving the chip engine), copies its outputs back, and hands back its result.
//! At each launch its affinity leaves out the launching thread's CPU
//! (`sys::process::keep_off_my_cpu`: a thread woken by one that stays busy otherwise tends to
//! wait on the waker's CPU while another idles, which serialized the copy-in and the kernel).

use super::*;

/// What the executor thread needs to run a launched run.
pub(super) struct ExecCtx {
    pub(super) chip: u32,
    pub(super) device: Arc<Device>,
    pub(super) engine: Arc<Engine>,
}

/// A launched run, as the executor thread receives it.
pub(super) struct ExecJob {
    pub(super) lease: Lease,
    pub(super) name: String,
    pub(super) body: RunBody,
    pub(super) prepared: Vec<Prepared>,
    pub(super) scalars: Vec<u64>,
    pub(super) config: CallConfig,
    /// Record the run's tasks for a captured parent run ([`Trace::Record`]).
    pub(super) trace: bool,
    /// Where its outputs go once it succeeded ([`ChipRun::copy_back_into`]).
    pub(super) back: Option<CopyBack>,
}

/// The host tensors a run's outputs go back to, each with its index among the run's tensors
/// ([`ChipRun::copy_back_into`]).
pub(crate) type CopyBack = Vec<(usize, KeptTensor)>;

impl ExecCtx {
    /// Executes `job`, then copies its outputs back when it has somewhere to put them
    /// ([`ChipRun::copy_back_into`]), unless the chip is `closing` by then (its process was
    /// asked to shut down: the parent has given the run up, and its host tensors are their
    /// owners' again). The kept host tensors are dropped before this returns, so before the
    /// run's end is reported.
    pub(super) fn run_job(
        &self,
        job: &mut ExecJob,
        records: &mut Option<Vec<TaskRecord>>,
        closing: &AtomicBool,
    ) -> Result<()> {
        let result = self.execute_caught(job, records);
        let Some(back) = job.back.take() else { return result };
        if closing.load(Ordering::Acquire) {
            return result.and(Err(Error::state(format!(
                "chip {}: shut down before the outputs of `{}` were copied back",
                self.chip, job.name
            ))));
        }
        result.and_then(|()| {
            catch_unwind(AssertUnwindSafe(|| self.copy_back(job, &back))).unwrap_or_else(|panic| {
                Err(Error::new(
                    ErrorKind::Internal,
                    format!(
                        "chip {}: copying back the outputs of `{}` panicked: {}",
                        self.chip,
                        job.name,
                        crate::error::panic_message(&*panic)
                    ),
                ))
            })
        })
    }

    /// Copies the executed `job`'s outputs back into the host tensors of `back`.
    pub(super) fn copy_back(&self, job: &ExecJob, back: &CopyBack) -> Result<()> {
        for (i, host) in back {
            let host = host.tensor();
            if !host.access().can_write() {
                continue;
            }
            let Some(p) = job.prepared.get(*i) else {
                return Err(Error::new(
                    ErrorKind::Internal,
                    format!(
                        "chip {}: `{}` has {} tensors, and its output {i} was to be copied back",
                        self.chip,
                        job.name,
                        job.prepared.len()
                    ),
                ));
            };
            self.device.copy_out(p.ptr, &p.view, host).map_err(|e| {
                e.context(format!("chip {}: copying back host tensor {i} of `{}`", self.chip, job.name))
            })?;
        }
        Ok(())
    }

    /// [`execute`](Self::execute) with a panic turned into an [`ErrorKind::Internal`] error.
    pub(super) fn execute_caught(&self, job: &ExecJob, records: &mut Option<Vec<TaskRecord>>) -> Result<()> {
        catch_unwind(AssertUnwindSafe(|| self.execute(job, records))).unwrap_or_else(|panic| {
            Err(Error::new(
                ErrorKind::Internal,
                format!(
                    "chip {}: the chip runtime panicked running `{}`: {}",
                    self.chip,
                    job.name,
                    crate::error::panic_message(&*panic)
                ),
            ))
        })
    }

    /// Runs `job`; with `job.trace`, leaves the records of what it ran in `records`.
    pub(super) fn execute(&self, job: &ExecJob, records: &mut Option<Vec<TaskRecord>>) -> Result<()> {
        let k = match &job.body {
            RunBody::Orchestration(o) => {
                return self.run_orchestration(job, *o, records);
            }
            RunBody::Kernel(k) => k,
        };
        let diagnose = crate::chip::diag::wanted(&job.config);
        if !diagnose && !job.trace {
            return self.run_kernel(k, &job.prepared, &job.scalars);
        }
        // A bare kernel recorded: one task on core 0.
        let started = crate::sys::clock::monotonic_ns();
        let result = self.run_kernel(k, &job.prepared, &job.scalars);
        let ended = crate::sys::clock::monotonic_ns();
        let record =
            crate::chip::diag::kernel_record(&job.name, (started, ended), result.as_ref().map(|_| ()));
        let written = if diagnose {
            let mut args = String::new();
            let tensors = job.prepared.iter().map(|p| {
                let how: &dyn std::fmt::Debug = &p.access;
                (how, p.view, p.identity.buffer_id(), p.nbytes, Some((self.chip, p.ptr)))
            });
            crate::dfx::graph::describe_tensors(&mut args, tensors, &job.scalars);
            crate::chip::diag::write_kernel(self.chip, &job.name, &job.config, record.clone(), args)
                .map(|_| ())
        } else {
            Ok(())
        };
        if job.trace {
            *records = Some(vec![record]);
        }
        // The kernel's own error first; a diagnostic that could not be written fails a kernel
        // that succeeded.
        result.and(written.map_err(|e| self.diag_error(&job.name, e)))
    }

    /// A diagnostic that could not be written: the task fails saying so (its results are
    /// there; what it was asked to record is not).
    pub(super) fn diag_error(&self, name: &str, e: Error) -> Error {
        e.context(format!(
            "chip {}: `{name}` ran, but its diagnostics (CallConfig) could not be written",
            self.chip
        ))
    }

    /// Runs kernel `k` as core 0; its failure is its own message (`run` adds what failed where).
    pub(super) fn run_kernel(&self, k: &KernelRef, prepared: &[Prepared], scalars: &[u64]) -> Result<()> {
        let tensors: smallvec::SmallVec<[DeviceTensor; 8]> =
            prepared.iter().map(|p| DeviceTensor::new(p.ptr, p.view, p.access)).collect();
        self.device.launch(k.def(), 0, &tensors, scalars)
    }

    pub(super) fn run_orchestration(
        &self,
        job: &ExecJob,
        o: ChipOrchFnPtr,
        records: &mut Option<Vec<TaskRecord>>,
    ) -> Result<()> {
        let (name, prepared, scalars, config, trace) =
            (job.name.as_str(), &job.prepared, &job.scalars, &job.config, job.trace);
        let chip = self.chip;
        let mut args = TaskArgs::new();
        for p in prepared {
            let access = p.access.within_orchestration();
            let desc = BufferDesc::new(p.identity, Backing::Device { ptr: p.ptr, chip }, access, p.nbytes)?;
            args.add_tensor(&Tensor::from_desc(desc, p.view)?, tag_for(p.access))?;
        }
        for &s in scalars {
            args.scalar(s);
        }
        let eng = &self.engine;
        let context = format!("chip orchestration `{name}` on chip {chip}");
        // The diagnostics the config asks for come from the run's capture.
        let diagnose = crate::chip::diag::wanted(config);
        let built = eng
            .build_run(diagnose || trace, None, false, |orch| {
                if config.get_dump_args() {
                    orch.keep_args_text();
                }
                orch.confine_to(&args);
                o(orch, &args, config)
            })
            .map_err(|f| f.into_error().context(&context))?;
        eng.drive_until(|| built.run.is_done(), None);
        if trace {
            *records = Some(built.run.own_timeline().map(|t| t.records().to_vec()).unwrap_or_default());
        }
        let written = if diagnose {
            crate::chip::diag::write_run(chip, name, config, &built.run).map(|_| ())
        } else {
            Ok(())
        };
        // The run's own error first; a diagnostic that could not be written fails a run that
        // succeeded.
        built.run.result().map_err(|e| e.context(context)).and(written.map_err(|e| self.diag_error(name, e)))
    }
}

/// How long a chip's threads check politely for what comes next between two pipelined runs
/// before they sleep: the executor thread for its next run after one (`Executor::spawn`), a
/// chip child with nothing else to do for its executing run's end. About what the copy-back,
/// the parent's round trip and the launch take together.
pub(crate) const END_WINDOW: std::time::Duration = std::time::Duration::from_micros(250);

/// The chip's executor thread: runs one launched run at a time and hands back its result.
pub(super) struct Executor {
    tx: Option<mpsc::Sender<ExecJob>>,
    rx: mpsc::Receiver<ExecDone>,
    handle: Option<thread::JoinHandle<()>>,
    /// The thread's kernel id (0 until it has started).
    tid: Arc<std::sync::atomic::AtomicI32>,
    /// Whether a prepared run waits to launch after the executing one.
    pub(super) next_waits: Arc<std::sync::atomic::AtomicBool>,
    /// Set by [`stop`](Executor::stop): a run that ends afterwards copies nothing back.
    pub(super) closing: Arc<AtomicBool>,
}

/// A run the executor finished: its lease, result and records.
type ExecDone = (Lease, Result<()>, Option<Vec<TaskRecord>>);

/// Called by the executor thread after each run it finished (a driver sleeping elsewhere
/// wakes up to finalize it).
pub(crate) type RunDone = Arc<std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>>;

impl Executor {
    pub(super) fn spawn(ctx: ExecCtx, notify: RunDone) -> Result<Executor> {
        let (tx, jobs) = mpsc::channel::<ExecJob>();
        let (done_tx, rx) = mpsc::channel();
        let chip = ctx.chip;
        let tid = Arc::new(std::sync::atomic::AtomicI32::new(0));
        let tid_w = tid.clone();
        let next_waits = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let next_w = next_waits.clone();
        let closing = Arc::new(AtomicBool::new(false));
        let closing_w = closing.clone();
        let handle = thread::Builder::new()
            .name(format!("chip{chip}-exec"))
            .spawn(move || {
                tid_w.store(crate::sys::process::thread_id(), Ordering::Release);
                let mut ran = false;
                loop {
                    // After a run, the next one (the successor the chip prepared meanwhile)
                    // comes once the parent has seen this one end: a round trip that a
                    // sleeping thread's wake-up would lengthen. With one prepared, check for
                    // it politely for a while first.
                    let mut next = None;
                    if ran && next_w.load(Ordering::Relaxed) {
                        crate::sys::futex::poll_politely_for(END_WINDOW, None, || match jobs.try_recv() {
                            Ok(job) => {
                                next = Some(Ok(job));
                                true
                            }
                            Err(mpsc::TryRecvError::Empty) => false,
                            Err(mpsc::TryRecvError::Disconnected) => {
                                next = Some(Err(mpsc::RecvError));
                                true
                            }
                        });
                    }
                    let Ok(mut job) = next.unwrap_or_else(|| jobs.recv()) else { break };
                    ran = true;
                    let mut records = None;
                    let result = ctx.run_job(&mut job, &mut records, &closing_w);
                    if done_tx.send((job.lease, result, records)).is_err() {
                        break;
                    }
                    if let Some(f) = notify.get() {
                        f();
                    }
                }
            })
            .map_err(|e| Error::os("starting the chip's executor thread", e))?;
        Ok(Executor { tx: Some(tx), rx, handle: Some(handle), tid, next_waits, closing })
    }

    pub(super) fn send(&self, job: ExecJob) -> Result<()> {
        // The caller goes on (preparing the next run): wake the executor on another CPU.
        match self.tid.load(Ordering::Acquire) {
            0 => {}
            tid => crate::sys::process::keep_off_my_cpu(tid),
        }
        match &self.tx {
            Some(tx) if tx.send(job).is_ok() => Ok(()),
            _ => Err(Error::state("the executor thread has stopped")),
        }
    }

    pub(super) fn outcome(lease: Lease, chip: u32, got: ExecDone) -> (Result<()>, Option<Vec<TaskRecord>>) {
        let (done, result, records) = got;
        if done != lease {
            let err = Error::new(
                ErrorKind::Internal,
                format!("chip {chip}: waiting for the run under {lease}, the run under {done} ended"),
            );
            return (Err(err), None);
        }
        (result, records)
    }

    pub(super) fn stopped(chip: u32) -> (Result<()>, Option<Vec<TaskRecord>>) {
        (Err(Error::new(ErrorKind::Internal, format!("chip {chip}: the executor thread has stopped"))), None)
    }

    /// The launched run's result, once it is done.
    pub(super) fn take(&self, lease: Lease, chip: u32) -> (Result<()>, Option<Vec<TaskRecord>>) {
        match self.rx.recv() {
            Ok(got) => Self::outcome(lease, chip, got),
            Err(mpsc::RecvError) => Self::stopped(chip),
        }
    }

    /// The launched run's result if it is done.
    pub(super) fn try_take(&self, lease: Lease, chip: u32) -> Option<(Result<()>, Option<Vec<TaskRecord>>)> {
        match self.rx.try_recv() {
            Ok(got) => Some(Self::outcome(lease, chip, got)),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(Self::stopped(chip)),
        }
    }

    /// Stops the thread once its run (if any) returns; that run copies nothing back.
    pub(super) fn stop(&mut self) {
        self.closing.store(true, Ordering::Release);
        self.tx = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
