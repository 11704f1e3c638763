//! `RunOptions`: what a run may carry besides its orchestration function: arguments, config,
//! DAG capture and a deadline (without one, the Worker's `WorkerBuilder::run_deadline`).

use std::time::Duration;

use crate::data::call_config::CallConfig;
use crate::data::task_args::TaskArgs;

/// Options of one run, for [`Worker::submit_with`](crate::Worker::submit_with) and
/// [`Worker::run_with`](crate::Worker::run_with): the arguments and config the orchestration
/// function receives (empty and default unless set), whether the run records its DAG, and its
/// deadline.
///
/// ```
/// use simpler::{chip::CallConfig, RunOptions, TaskArgs};
/// let mut args = TaskArgs::new();
/// args.scalar(7);
/// let options = RunOptions::new().args(args).config(CallConfig::new().aicpu_threads(4)).capture_dag();
/// assert!(options.captures_dag());
/// assert!(!RunOptions::default().captures_dag());
/// ```
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub(crate) args: TaskArgs,
    pub(crate) config: CallConfig,
    pub(crate) capture: bool,
    pub(crate) deadline: Option<Duration>,
}

impl RunOptions {
    /// No arguments, the default config, no DAG capture.
    ///
    /// ```
    /// assert!(!simpler::RunOptions::new().captures_dag());
    /// ```
    pub fn new() -> RunOptions {
        RunOptions::default()
    }

    /// The arguments the orchestration function receives. A tensor tagged
    /// [`Input`](crate::Tag::Input) arrives read-only, as it does in an orchestration a Worker
    /// above sent: the function may pass it only where a callable reads it.
    ///
    /// ```
    /// use simpler::{memory::Access, DataType, RunOptions, TaskArgs};
    /// # let buffer = simpler::__private::doc_buffer(64)?;
    /// let t = buffer.tensor(&[16], DataType::Float32)?;
    /// let mut args = TaskArgs::new();
    /// args.input(&t)?.scalar(1);
    /// let options = RunOptions::new().args(args);
    /// # let _ = options;
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn args(mut self, mut args: TaskArgs) -> RunOptions {
        args.narrow_inputs();
        self.args = args;
        self
    }

    /// The config the orchestration function receives (checked at submit).
    ///
    /// ```
    /// let _ = simpler::RunOptions::new().config(simpler::chip::CallConfig::new().aicpu_threads(2));
    /// ```
    pub fn config(mut self, config: CallConfig) -> RunOptions {
        self.config = config;
        self
    }

    /// Records the run's DAG (tasks, and the tensor or explicit dependency behind each edge),
    /// read back with [`RunHandle::dag`](crate::RunHandle::dag).
    ///
    /// ```
    /// assert!(simpler::RunOptions::new().capture_dag().captures_dag());
    /// ```
    pub fn capture_dag(mut self) -> RunOptions {
        self.capture = true;
        self
    }

    /// The run must finish within `limit` of its submit (building and waiting for admission
    /// included), or it is stopped: it fails with an [`ErrorKind::Timeout`] error that names the
    /// tasks still running (task index and callable), the worker each runs on ("sub worker 1",
    /// "chip 0", "worker 0") and the deadline ("within its deadline of 200 ms").
    ///
    /// Stopping a run is what [`RunHandle::cancel`] does: its tasks not yet started never run,
    /// each worker running one of its tasks is stopped (the child process is killed with
    /// `SIGKILL`, a nested Worker with everything below it) and leaves service like any dead
    /// worker ([`Worker::workers`] shows it killed), and later runs go to the workers left; a
    /// remote Worker is asked to cancel the task's run on its node and stays in service. The
    /// deadline holds whether or not anyone waits on the run: the scheduler wakes at the
    /// earliest deadline by itself. Overrides [`WorkerBuilder::run_deadline`]; without either,
    /// a run has no deadline.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use simpler::{ErrorKind, HostArgs, HostFn, HostResult, RunOptions, TaskArgs, Worker};
    ///
    /// fn forever(_args: &HostArgs<'_>) -> HostResult {
    ///     loop {
    ///         std::thread::park(); // never returns
    ///     }
    /// }
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(2).build()?;
    /// let forever = worker.register(HostFn::new("forever", forever))?;
    /// worker.init()?;
    /// let options = RunOptions::new().deadline(Duration::from_millis(200));
    /// let err = worker
    ///     .run_with(options, |orch, _, _| orch.submit_sub(&forever, TaskArgs::new()).map(|_| ()))
    ///     .unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::Timeout);
    /// // "run 1 did not finish within its deadline of 200 ms; still running: task 0 `forever`
    /// // on sub worker 0; it was stopped (...)"
    /// assert!(err.message().contains("200 ms") && err.message().contains("sub worker 0"));
    /// worker.run(|_orch| Ok(()))?; // later runs proceed on sub worker 1
    /// # Ok(()) }
    /// ```
    ///
    /// [`ErrorKind::Timeout`]: crate::ErrorKind::Timeout
    /// [`RunHandle::cancel`]: crate::RunHandle::cancel
    /// [`Worker::workers`]: crate::Worker::workers
    /// [`WorkerBuilder::run_deadline`]: crate::WorkerBuilder::run_deadline
    pub fn deadline(mut self, limit: Duration) -> RunOptions {
        self.deadline = Some(limit);
        self
    }

    /// The run's deadline, if one was set with [`deadline`](RunOptions::deadline).
    ///
    /// ```
    /// use std::time::Duration;
    /// let options = simpler::RunOptions::new().deadline(Duration::from_secs(5));
    /// assert_eq!(options.run_deadline(), Some(Duration::from_secs(5)));
    /// assert_eq!(simpler::RunOptions::new().run_deadline(), None);
    /// ```
    pub fn run_deadline(&self) -> Option<Duration> {
        self.deadline
    }

    /// Whether the run records its DAG.
    ///
    /// ```
    /// assert!(!simpler::RunOptions::new().captures_dag());
    /// ```
    pub fn captures_dag(&self) -> bool {
        self.capture
    }
}
