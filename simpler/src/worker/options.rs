//! `RunOptions`: what a run may carry besides its orchestration function.

use crate::data::call_config::CallConfig;
use crate::data::task_args::TaskArgs;

/// Options of one run, for [`Worker::submit_with`](crate::Worker::submit_with) and
/// [`Worker::run_with`](crate::Worker::run_with): the arguments and config the orchestration
/// function receives (empty and default unless set), and whether the run records its DAG.
///
/// ```
/// use simpler::{CallConfig, RunOptions, TaskArgs};
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

    /// The arguments the orchestration function receives.
    ///
    /// ```
    /// let mut args = simpler::TaskArgs::new();
    /// args.scalar(1);
    /// let _ = simpler::RunOptions::new().args(args);
    /// ```
    pub fn args(mut self, args: TaskArgs) -> RunOptions {
        self.args = args;
        self
    }

    /// The config the orchestration function receives (checked at submit).
    ///
    /// ```
    /// let _ = simpler::RunOptions::new().config(simpler::CallConfig::new().aicpu_threads(2));
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

    /// Whether the run records its DAG.
    ///
    /// ```
    /// assert!(!simpler::RunOptions::new().captures_dag());
    /// ```
    pub fn captures_dag(&self) -> bool {
        self.capture
    }
}
