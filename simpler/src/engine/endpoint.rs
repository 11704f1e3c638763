//! The boundary between the engine and a worker: the [`Endpoint`] trait.
//!
//! A lane owns one endpoint. The scheduler role holder is the only caller: it starts a task
//! with [`Endpoint::start`] and later collects the outcome with [`Endpoint::poll`], which must
//! never block. An endpoint that has something to report rings the engine doorbell so a sleeping
//! holder wakes up.

use crate::callable::identity::CallableHandle;
use crate::data::call_config::CallConfig;
use crate::data::task_args::TaskArgs;
use crate::error::Result;

/// What a lane hands its endpoint for one task (or one group member).
pub(crate) struct Dispatch<'a> {
    pub(crate) callable: &'a CallableHandle,
    pub(crate) args: &'a TaskArgs,
    pub(crate) config: &'a CallConfig,
    pub(crate) run: u64,
    pub(crate) task: u32,
    pub(crate) member: u32,
}

/// How a dispatched task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The task ran and succeeded.
    Success,
    /// The task ran (or was refused by its target) and failed with this message.
    TaskFailure(String),
    /// The worker itself is gone or broke its protocol; the lane is dead from now on.
    EndpointFailure(String),
}

/// One worker as the engine sees it.
pub(crate) trait Endpoint: Send {
    /// Starts a task. An error fails the task at once (the endpoint stays usable).
    fn start(&mut self, dispatch: &Dispatch<'_>) -> Result<()>;
    /// The outcome of the running task, if it has ended. Never blocks.
    fn poll(&mut self) -> Option<Outcome>;
    /// Stops the worker (close). Must not block for long.
    fn shutdown(&mut self) {}
}

#[cfg(test)]
pub(crate) mod testing {
    //! In-process endpoints for engine tests: each runs tasks on its own thread.

    use std::sync::Arc;
    use std::sync::mpsc;
    use std::thread;

    use super::*;
    use crate::ipc::futex::Doorbell;

    /// What a test endpoint does with a task: `Ok` or a failure message.
    pub(crate) type Behaviour =
        Arc<dyn Fn(&str, &TaskArgs, u32) -> std::result::Result<(), String> + Send + Sync>;

    /// A task as the test endpoint received it.
    pub(crate) struct Job {
        pub(crate) name: String,
        pub(crate) args: TaskArgs,
        pub(crate) member: u32,
    }

    /// Runs each task on a worker thread and rings `bell` when it ends.
    pub(crate) struct ThreadEndpoint {
        tx: Option<mpsc::Sender<Job>>,
        rx: mpsc::Receiver<Outcome>,
        handle: Option<thread::JoinHandle<()>>,
    }

    impl ThreadEndpoint {
        pub(crate) fn new(bell: Arc<Doorbell>, behaviour: Behaviour) -> ThreadEndpoint {
            let (tx, jobs) = mpsc::channel::<Job>();
            let (done_tx, rx) = mpsc::channel();
            let handle = thread::spawn(move || {
                for job in jobs {
                    let out = match behaviour(&job.name, &job.args, job.member) {
                        Ok(()) => Outcome::Success,
                        Err(m) => Outcome::TaskFailure(m),
                    };
                    let _ = done_tx.send(out);
                    bell.ring();
                }
            });
            ThreadEndpoint { tx: Some(tx), rx, handle: Some(handle) }
        }
    }

    impl Endpoint for ThreadEndpoint {
        fn start(&mut self, d: &Dispatch<'_>) -> Result<()> {
            let job = Job { name: d.callable.name().to_string(), args: d.args.clone(), member: d.member };
            self.tx.as_ref().expect("not shut down").send(job).expect("worker thread alive");
            Ok(())
        }

        fn poll(&mut self) -> Option<Outcome> {
            self.rx.try_recv().ok()
        }

        fn shutdown(&mut self) {
            self.tx = None;
            if let Some(h) = self.handle.take() {
                let _ = h.join();
            }
        }
    }
}
