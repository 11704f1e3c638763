//! `MailboxEndpoint`: the engine's [`Endpoint`] for a child process behind a mailbox.

use std::sync::Arc;

use crate::data::wire::{encode_args, encode_config};
use crate::engine::endpoint::{Dispatch, Endpoint, Outcome};
use crate::error::Result;
use crate::ipc::child::{ERR_RESOURCE, ERR_WORKER_DIED};
use crate::ipc::mailbox::MailboxRegion;
use crate::sys::process::ExitBoard;

/// Drives one child through its mailbox's task frame.
pub(crate) struct MailboxEndpoint {
    region: Arc<MailboxRegion>,
    index: usize,
    exits: Arc<ExitBoard>,
    /// What the child is to the user ("sub worker 1", "chip 0"), for messages.
    label: String,
}

impl MailboxEndpoint {
    pub(crate) fn new(
        region: Arc<MailboxRegion>,
        index: usize,
        exits: Arc<ExitBoard>,
        label: String,
    ) -> MailboxEndpoint {
        MailboxEndpoint { region, index, exits, label }
    }
}

impl MailboxEndpoint {
    /// The child's pid now (a replacement has its own), as the parent's exit board has it.
    fn pid(&self) -> i32 {
        self.exits.pid(self.index)
    }
}

impl Endpoint for MailboxEndpoint {
    fn start(&mut self, d: &Dispatch<'_>) -> Result<()> {
        let mb = self.region.mailbox(self.index);
        mb.set_parent_cpu(crate::sys::futex::current_cpu());
        tracing::trace!(target: "simpler::ipc", run_id = d.run, task_index = d.task, member = d.member, child = self.index, "post task");
        let trace = d.captured.then_some((d.engine, d.run, d.task, d.member));
        mb.post_task_traced(d.callable.digest().as_bytes(), trace, |config, payload| {
            // `post_task` hands over a zeroed config, which is the default config's encoding.
            if let Some(c) = d.config {
                encode_config(c, config);
            }
            encode_args(
                d.args.tensors.iter().zip(d.args.tags.iter().map(|t| t.access())),
                &d.args.scalars,
                payload,
            )
        })
    }

    fn peer_cpu(&self) -> Option<u32> {
        match self.region.mailbox(self.index).child_cpu() {
            0 => None,
            cpu => Some(cpu),
        }
    }

    fn poll(&mut self) -> Option<Outcome> {
        let mb = self.region.mailbox(self.index);
        if let Some(r) = mb.take_task_result() {
            return Some(match r {
                Ok(()) => Outcome::Success,
                Err(e) if e.code == ERR_RESOURCE => Outcome::ResourceExhausted(e.message),
                Err(e) if e.code == ERR_WORKER_DIED => Outcome::WorkerDied(e.message),
                Err(e) => Outcome::TaskFailure(e.message),
            });
        }
        // Dead only after checking the frame: a child may finish its task and then die.
        if !self.exits.has_exited(self.index) {
            return None;
        }
        self.exits.exit_of(self.index).map(|how| {
            Outcome::EndpointFailure(format!(
                "{} (process {}) died: the worker process {how}",
                self.label,
                self.pid()
            ))
        })
    }

    fn stop(&mut self) -> bool {
        tracing::debug!(target: "simpler::ipc", child = self.index, pid = self.pid(), "stopping {} (SIGKILL)", self.label);
        // Also when it already exited: its death is then reported as it is.
        self.exits.kill(self.index) || self.exits.has_exited(self.index)
    }

    fn gone(&self) -> Option<String> {
        // One atomic load while the child lives: this runs on every pass.
        if !self.exits.has_exited(self.index) {
            return None;
        }
        let how = self.exits.exit_of(self.index)?;
        Some(format!("{} (process {}) died while idle: the worker process {how}", self.label, self.pid()))
    }
}
