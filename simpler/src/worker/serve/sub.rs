//! What a SUB worker process serves: host functions, one task at a time.
//!
//! The process runs the shared child loop ([`serve`]) with a [`SubChild`] handler: a task names
//! a host function by digest; its arguments are decoded and validated, every buffer is mapped
//! once by identity ([`HostResolver`]), and the function runs with [`HostArgs`] (typed slices,
//! borrow-checked at run time), its panics caught. Controls install and release host functions
//! registered after `init`.

use crate::callable::host::HostFn;
use crate::callable::identity::{CallableKind, Descriptor, Digest};
use crate::callable::registry::Registry;
use crate::data::buffer::Backing;
use crate::data::host_args::HostArgs;
use crate::data::wire::decode_args;
use crate::ipc::child::{
    CTRL_REGISTER_FN, CTRL_UNREGISTER, ERR_BAD_FRAME, ERR_TASK, ERR_UNKNOWN_CALLABLE, HostResolver,
    ReceivedFn, Serve, received_fn, serve,
};
use crate::ipc::mailbox::{ControlRequest, FrameError, MailboxRegion, TaskRequest};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

/// Everything a SUB child needs, captured before the fork.
pub(crate) struct SubChild {
    pub(crate) region: Arc<MailboxRegion>,
    pub(crate) index: usize,
    /// The CPU this worker is bound to (`WorkerBuilder::bind_sub_workers`); `None`: not bound.
    pub(crate) cpu: Option<usize>,
    pub(crate) registry: Registry<HostFn>,
    pub(crate) resolver: HostResolver,
}

impl SubChild {
    /// Runs the loop until shutdown; returns the exit code.
    pub(crate) fn run(mut self) -> i32 {
        let region = self.region.clone();
        let mb = region.mailbox(self.index);
        mb.set_child_pid(std::process::id());
        if let Some(cpu) = self.cpu
            && let Err(e) = crate::sys::process::bind_to_cpu(cpu)
        {
            mb.publish_init(Err(&format!("bind_sub_workers: {}", e.message())));
            return 1;
        }
        mb.publish_init(Ok(()));
        serve(&region, self.index, &mut self)
    }
}

impl Serve for SubChild {
    fn control(&mut self, req: ControlRequest) -> Result<u64, FrameError> {
        let digest = Digest::from_bytes(req.digest);
        match req.command {
            CTRL_REGISTER_FN => {
                let ReceivedFn::Host(f) = received_fn(&req)? else {
                    unreachable!("CTRL_REGISTER_FN carries a host function (rule C1 of ipc::child)")
                };
                let desc = Descriptor::from_bytes(req.payload)
                    .map_err(|e| FrameError::new(ERR_BAD_FRAME, e.to_string()))?;
                if desc.kind() != CallableKind::HostFn {
                    return Err(FrameError::new(
                        ERR_BAD_FRAME,
                        format!("{digest}: not a host function descriptor"),
                    ));
                }
                let host = HostFn::from_parts(f, desc.clone());
                self.registry
                    .install(digest, desc.bytes(), host)
                    .map(u64::from)
                    .map_err(|e| FrameError::new(ERR_BAD_FRAME, e.to_string()))
            }
            CTRL_UNREGISTER => self
                .registry
                .release(&digest)
                .map(u64::from)
                .map_err(|e| FrameError::new(ERR_UNKNOWN_CALLABLE, e.to_string())),
            other => Err(FrameError::new(
                ERR_BAD_FRAME,
                format!("unknown control command {other} for a SUB worker"),
            )),
        }
    }

    fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), FrameError> {
        let digest = Digest::from_bytes(req.digest);
        let Some(f) = self.registry.get(&digest) else {
            return Err(FrameError::new(
                ERR_UNKNOWN_CALLABLE,
                format!("UNKNOWN_CALLABLE: {digest} is not registered on sub worker {}", self.index),
            ));
        };
        let decoded = decode_args(req.args())
            .map_err(|e| FrameError::new(ERR_BAD_FRAME, format!("bad task frame: {e}")))?;
        let bad_tensor = |i: usize, m: String, device: bool| {
            let m = if device { format!("{m}; a host function on a SUB worker cannot use it") } else { m };
            FrameError::new(ERR_BAD_FRAME, format!("tensor {i}: {m}"))
        };
        // Map every buffer first, then lend tensors that borrow the mappings (rule C2).
        for (i, t) in decoded.tensors.iter().enumerate() {
            let device = matches!(t.desc.backing(), Backing::Device { .. });
            self.resolver.resolve(&t.desc).map_err(|m| bad_tensor(i, m, device))?;
        }
        let mut mapped = Vec::with_capacity(decoded.tensors.len());
        for (i, t) in decoded.tensors.iter().enumerate() {
            let tensor = self.resolver.tensor(&t.desc, t.view, t.desc.access());
            mapped.push(tensor.map_err(|m| bad_tensor(i, m, false))?);
        }
        let args = HostArgs::new(mapped, &decoded.scalars, self.index as u32)
            .map_err(|e| FrameError::new(ERR_BAD_FRAME, e.to_string()))?;
        let result = catch_unwind(AssertUnwindSafe(|| f.call(&args)));
        // A child of a fork the host function made returned here: it leaves (rule P6).
        crate::sys::process::leave_if_forked_copy(matches!(result, Ok(Ok(()))));
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(FrameError::new(ERR_TASK, e.to_string())),
            Err(panic) => {
                Err(FrameError::new(ERR_TASK, format!("panicked: {}", crate::error::panic_message(&*panic))))
            }
        }
    }

    fn idle(&mut self) {
        self.resolver.trim();
    }
}
