//! The one error type of the crate.
//!
//! [`Error`] is opaque: it carries an [`ErrorKind`] that callers can match on and a message that
//! names what the user wrote (the callable, the worker id, the tensor index). Everything is
//! `Send + Sync + 'static`, so errors cross threads and are stored in run handles.

use std::fmt;

/// The result type used throughout `simpler`; the error type defaults to [`Error`].
///
/// ```
/// use simpler::{DataType, Result, memory::TensorView};
///
/// fn elements(shape: &[u32]) -> Result<u64> {
///     Ok(TensorView::new(0, shape, None, DataType::Float32)?.num_elements())
/// }
/// assert_eq!(elements(&[2, 3]).unwrap(), 6);
/// assert!(elements(&[]).is_err());
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The broad category of an [`Error`].
///
/// `Display` gives a short lowercase description of the kind. The enum is non-exhaustive:
/// match it with a wildcard arm.
///
/// ```
/// use simpler::{DataType, ErrorKind, memory::TensorView};
/// let err = TensorView::new(0, &[], None, DataType::Float32).unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::InvalidArgument);
/// assert_eq!(ErrorKind::Timeout.to_string(), "timed out");
///
/// let worth_retrying = |kind: ErrorKind| match kind {
///     ErrorKind::Timeout | ErrorKind::WorkerDied => true,
///     _ => false,
/// };
/// assert!(worth_retrying(ErrorKind::Timeout));
/// assert!(!worth_retrying(err.kind()));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A value passed by the caller is malformed (a bad tensor, shape, tag order, worker id...).
    InvalidArgument,
    /// The operation is not allowed in the current state (before `init`, after `close`, ...).
    InvalidState,
    /// A callable handle is unknown to its target, or of the wrong kind for it.
    Callable,
    /// A task failed: its function returned an error or panicked.
    TaskFailed,
    /// A task never ran because a task it depends on failed.
    Poisoned,
    /// A worker process died or broke the mailbox protocol.
    WorkerDied,
    /// Waiting ran out of time (ring back-pressure, pipeline admission, a run's `wait_timeout`,
    /// startup), or a run passed its deadline (`RunOptions::deadline`,
    /// `WorkerBuilder::run_deadline`): the message then names the task still running, its
    /// callable, the worker it ran on (which was stopped) and the deadline.
    Timeout,
    /// Bytes received over the wire are malformed.
    Decode,
    /// An operating-system call failed (mapping memory, forking, shared memory).
    Os,
    /// A fixed-size resource cannot hold what was asked for: a chip's device memory (its size
    /// is `WorkerBuilder::chip_memory`). The message names the request, the size and the
    /// builder call that sets it.
    ///
    /// ```no_run
    /// use simpler::{DataType, ErrorKind, Worker};
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().chips(1).chip_memory(1 << 20).build()?;
    /// worker.init()?;
    /// let err = worker.alloc_child_tensor(0, &[1 << 20], DataType::Float32).unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::ResourceExhausted);
    /// assert!(err.message().contains("chip_memory"));
    /// # Ok(()) }
    /// ```
    ResourceExhausted,
    /// `simpler` itself failed: its scheduler, or its link to a worker, panicked (a bug). The
    /// run it hit fails with this kind, the message says where it panicked, and the Worker
    /// stays usable (a worker whose link panicked is taken out of service).
    Internal,
    /// The run was cancelled with `RunHandle::cancel`: its tasks not yet started never ran and
    /// the workers running its tasks were stopped. The message names the run.
    ///
    /// ```no_run
    /// use simpler::{ErrorKind, Worker};
    ///
    /// # fn main() -> simpler::Result<()> {
    /// let mut worker = Worker::builder().sub_workers(1).build()?;
    /// worker.init()?;
    /// let run = worker.submit(|_orch| Ok(()))?;
    /// if run.cancel() {
    ///     assert_eq!(run.wait().unwrap_err().kind(), ErrorKind::Cancelled);
    /// }
    /// # Ok(()) }
    /// ```
    Cancelled,
    /// Tasks of one index launch ([`IndexLaunch`](crate::dsl::IndexLaunch)) would touch overlapping
    /// pieces of a tensor that one of them writes. The message names both tasks, their
    /// callables, the arguments and the byte ranges. `task_graph!` loops refuse the same at
    /// compile time (S0113, S0114).
    ///
    /// ```
    /// assert_eq!(simpler::ErrorKind::Overlap.to_string(), "overlapping pieces");
    /// ```
    Overlap,
}

impl ErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::InvalidState => "invalid state",
            ErrorKind::Callable => "callable error",
            ErrorKind::TaskFailed => "task failed",
            ErrorKind::Poisoned => "task poisoned",
            ErrorKind::WorkerDied => "worker died",
            ErrorKind::Timeout => "timed out",
            ErrorKind::Decode => "decode error",
            ErrorKind::Os => "os error",
            ErrorKind::ResourceExhausted => "resource exhausted",
            ErrorKind::Internal => "internal error",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Overlap => "overlapping pieces",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error type of `simpler`.
///
/// ```
/// use simpler::{Error, ErrorKind};
/// let err = Error::new(ErrorKind::Timeout, "ring 0 is full");
/// assert_eq!(err.kind(), ErrorKind::Timeout);
/// assert_eq!(err.to_string(), "ring 0 is full");
///
/// // It is a std error, so it boxes into the error type of a host function.
/// let boxed: Box<dyn std::error::Error + Send + Sync> = err.into();
/// assert_eq!(boxed.to_string(), "ring 0 is full");
/// ```
#[derive(Clone)]
pub struct Error {
    kind: ErrorKind,
    message: Box<str>,
}

impl Error {
    /// Creates an error of `kind` with a message.
    ///
    /// ```
    /// use simpler::{Error, ErrorKind};
    /// let err = Error::new(ErrorKind::InvalidState, format!("worker {} is closed", 3));
    /// assert_eq!(err.kind(), ErrorKind::InvalidState);
    /// assert_eq!(err.message(), "worker 3 is closed");
    /// ```
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into().into_boxed_str() }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    pub(crate) fn state(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidState, message)
    }

    pub(crate) fn decode(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Decode, message)
    }

    pub(crate) fn os(what: &str, err: impl fmt::Display) -> Error {
        Error::new(ErrorKind::Os, format!("{what}: {err}"))
    }

    /// The category of this error.
    ///
    /// ```
    /// use simpler::{DataType, ErrorKind};
    /// assert_eq!(DataType::from_u8(99).unwrap_err().kind(), ErrorKind::Decode);
    /// ```
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind (the same text `Display` prints).
    ///
    /// ```
    /// use simpler::{Error, ErrorKind};
    /// let err = Error::new(ErrorKind::Os, "mmap failed");
    /// assert_eq!(err.message(), "mmap failed");
    /// assert_eq!(err.message(), err.to_string());
    /// ```
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Returns a copy of this error whose message is prefixed with `context: `.
    pub(crate) fn context(&self, context: impl fmt::Display) -> Error {
        Error::new(self.kind, format!("{context}: {}", self.message))
    }
}

/// Runs `body`, the work of the public method `method` (named as the user calls it:
/// `"Worker.copy_to"`), and prefixes its error with `method: `, once: `Worker.copy_to: device
/// buffer 7 was already freed`. The helpers `body` calls return their errors without it.
pub(crate) fn in_method<T>(method: &str, body: impl FnOnce() -> Result<T>) -> Result<T> {
    body().map_err(|e| e.context(method))
}

/// The text of a caught panic's payload (what `panic!` was given), for task failure messages.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_string())
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // What `fn main() -> simpler::Result<()>` prints after "Error: ".
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_is_send_sync_static() {
        fn assert_bounds<T: Send + Sync + 'static>() {}
        assert_bounds::<Error>();
    }

    #[test]
    fn in_method_prefixes_the_error_once() {
        let ok: Result<u32> = in_method("Worker.free", || Ok(3));
        assert_eq!(ok.unwrap(), 3);
        let e = in_method::<()>("Worker.free", || Err(Error::state("device buffer 7 was already freed")))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidState);
        assert_eq!(e.message(), "Worker.free: device buffer 7 was already freed");
    }

    #[test]
    fn context_keeps_kind() {
        let e = Error::invalid("bad").context("tensor 2");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert_eq!(e.message(), "tensor 2: bad");
    }
}
