//! What a chip process serves: chip callables on its own chip (its backend, a simulated chip by default), and the memory
//! controls of chip-resident buffers.
//!
//! The chip runtime (device memory, core threads) is built after the fork, inside the child,
//! from the configuration and the callables captured before it ([`ChipChild`]). The process then
//! runs the shared child loop ([`serve`]) with a `ChipServer` handler: tasks run chip callables
//! (copying host tensors in and out of device memory), controls install chip callables
//! registered after `init` and serve `alloc_child_tensor`, `copy_to`, `copy_from` and `free`.

use crate::callable::identity::{CallableKind, Descriptor, Digest};
use crate::callable::registry::Registry;
use crate::chip::{ChipArg, ChipConfig, ChipFn, ChipRuntime};
use crate::data::buffer::{Backing, BufferDesc};
use crate::data::wire::{DESC_SIZE, decode_args, decode_config, decode_desc};
use crate::ipc::child::{
    CTRL_COPY_FROM, CTRL_COPY_TO, CTRL_FREE, CTRL_MALLOC, CTRL_REGISTER_CHIP, CTRL_REGISTER_CHIP_ORCH,
    CTRL_UNREGISTER, ERR_BAD_FRAME, ERR_DEVICE, ERR_TASK, ERR_UNKNOWN_CALLABLE, HostResolver, Serve,
    received_fn, serve,
};
use crate::ipc::mailbox::{ControlRequest, FrameError, MailboxRegion, TaskRequest};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

/// Everything a chip child needs, captured before the fork. The chip runtime (with its core
/// threads) is built after the fork, inside the child.
pub(crate) struct ChipChild {
    pub(crate) region: Arc<MailboxRegion>,
    /// Mailbox index of this chip.
    pub(crate) index: usize,
    pub(crate) config: ChipConfig,
    /// The pipeline depth the parent asks for; the chip grants at most
    /// 2 (one run launched, one prepared) and publishes its grant.
    pub(crate) pipeline_depth: u32,
    pub(crate) registry: Registry<ChipFn>,
    pub(crate) resolver: HostResolver,
}

struct ChipServer {
    chip: u32,
    runtime: ChipRuntime,
    resolver: HostResolver,
}

impl ChipChild {
    /// Builds the chip, prepares every snapshot callable, reports ready, and serves until
    /// shutdown; returns the exit code.
    pub(crate) fn run(self) -> i32 {
        let region = self.region.clone();
        let mb = region.mailbox(self.index);
        mb.set_child_pid(std::process::id());
        let chip = self.config.spec.chip_id;
        let built = ChipRuntime::new(self.config, self.registry)
            .and_then(|mut rt| rt.grant_pipeline_depth(self.pipeline_depth).map(|granted| (rt, granted)));
        let runtime = match built {
            Ok((rt, granted)) => {
                // Before reporting ready (rule M9 of `ipc::mailbox`).
                mb.set_granted_depth(granted);
                rt
            }
            Err(e) => {
                mb.publish_init(Err(&format!("chip {chip}: {e}")));
                return 1;
            }
        };
        mb.publish_init(Ok(()));
        let mut server = ChipServer { chip, runtime, resolver: self.resolver };
        let code = serve(&region, self.index, &mut server);
        server.runtime.shutdown();
        code
    }
}

impl ChipServer {
    fn host_range(payload: &[u8]) -> Result<(BufferDesc, u64, u64), FrameError> {
        if payload.len() < DESC_SIZE + 16 {
            return Err(FrameError::new(ERR_BAD_FRAME, "copy request too short".to_string()));
        }
        let desc = decode_desc(payload).map_err(|e| FrameError::new(ERR_BAD_FRAME, e.to_string()))?;
        let word = |at: usize| u64::from_le_bytes(payload[at..at + 8].try_into().expect("8 bytes"));
        Ok((desc, word(DESC_SIZE), word(DESC_SIZE + 8)))
    }
}

impl Serve for ChipServer {
    fn control(&mut self, req: ControlRequest) -> Result<u64, FrameError> {
        let digest = Digest::from_bytes(req.digest);
        let dev = |e: crate::error::Error| FrameError::new(super::frame_code(&e, ERR_DEVICE), e.to_string());
        match req.command {
            CTRL_REGISTER_CHIP | CTRL_REGISTER_CHIP_ORCH => {
                // `from_parts` checks the function's kind against the descriptor's sub-kind.
                let body = super::chip_body(received_fn(&req)?);
                let desc = Descriptor::from_bytes(req.payload)
                    .map_err(|e| FrameError::new(ERR_BAD_FRAME, e.to_string()))?;
                if desc.kind() != CallableKind::Chip {
                    return Err(FrameError::new(
                        ERR_BAD_FRAME,
                        format!("{digest}: not a chip callable descriptor"),
                    ));
                }
                let f = ChipFn::from_parts(body, desc.clone())
                    .map_err(|e| FrameError::new(ERR_BAD_FRAME, e.to_string()))?;
                self.runtime
                    .install(digest, desc.bytes(), f)
                    .map(u64::from)
                    .map_err(|e| FrameError::new(ERR_BAD_FRAME, e.to_string()))
            }
            CTRL_UNREGISTER => self
                .runtime
                .release(&digest)
                .map(u64::from)
                .map_err(|e| FrameError::new(ERR_UNKNOWN_CALLABLE, e.to_string())),
            CTRL_MALLOC => self.runtime.malloc(req.arg0).map_err(dev),
            CTRL_FREE => self.runtime.free(req.arg0).map(|()| 0).map_err(dev),
            CTRL_COPY_TO => {
                let (desc, off, n) = Self::host_range(&req.payload)?;
                let src = self.resolver.bytes(&desc, off, n).map_err(|m| FrameError::new(ERR_DEVICE, m))?;
                self.runtime.copy_to_device(req.arg0, src).map(|()| 0).map_err(dev)
            }
            CTRL_COPY_FROM => {
                let (desc, off, n) = Self::host_range(&req.payload)?;
                let dst = self.resolver.bytes(&desc, off, n).map_err(|m| FrameError::new(ERR_DEVICE, m))?;
                self.runtime.copy_from_device(req.arg0, dst).map(|()| 0).map_err(dev)
            }
            other => Err(FrameError::new(
                ERR_BAD_FRAME,
                format!("unknown control command {other} for chip {}", self.chip),
            )),
        }
    }

    fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), FrameError> {
        let digest = Digest::from_bytes(req.digest);
        let decoded = decode_args(req.args())
            .map_err(|e| FrameError::new(ERR_BAD_FRAME, format!("bad task frame: {e}")))?;
        let config = decode_config(req.config())
            .map_err(|e| FrameError::new(ERR_BAD_FRAME, format!("bad task frame: {e}")))?;
        // Map every host buffer first, then lend tensors that borrow the mappings (rule C2).
        for (i, t) in decoded.tensors.iter().enumerate() {
            if !matches!(t.desc.backing(), Backing::Device { .. }) {
                self.resolver
                    .resolve(&t.desc)
                    .map_err(|m| FrameError::new(ERR_BAD_FRAME, format!("tensor {i}: {m}")))?;
            }
        }
        let mut args = Vec::with_capacity(decoded.tensors.len());
        for (i, t) in decoded.tensors.iter().enumerate() {
            let access = t.desc.access();
            match t.desc.backing() {
                Backing::Device { ptr, chip } => {
                    if chip != self.chip {
                        return Err(FrameError::new(
                            ERR_BAD_FRAME,
                            format!("tensor {i}: device memory of chip {chip} sent to chip {}", self.chip),
                        ));
                    }
                    args.push(ChipArg::Device {
                        ptr,
                        view: t.view,
                        access,
                        identity: t.desc.identity(),
                        nbytes: t.desc.nbytes(),
                    });
                }
                _ => {
                    let tensor = self
                        .resolver
                        .tensor(&t.desc, t.view, access)
                        .map_err(|m| FrameError::new(ERR_BAD_FRAME, format!("tensor {i}: {m}")))?;
                    args.push(ChipArg::Host(tensor));
                }
            }
        }
        if !self.runtime.contains(&digest) {
            return Err(FrameError::new(
                ERR_UNKNOWN_CALLABLE,
                format!("UNKNOWN_CALLABLE: {digest} is not registered on chip {}", self.chip),
            ));
        }
        let trace = req.trace.is_some();
        let result = catch_unwind(AssertUnwindSafe(|| {
            self.runtime.run_traced(&digest, args, &decoded.scalars, &config, trace)
        }))
        .map(|(result, records)| {
            if let (Some(key), Some(records)) = (req.trace, records) {
                super::leave_trace(key, 0, 0, records);
            }
            result
        });
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(FrameError::new(super::frame_code(&e, ERR_TASK), e.message().to_string())),
            Err(panic) => Err(FrameError::new(
                ERR_TASK,
                format!("chip runtime panicked: {}", crate::error::panic_message(&*panic)),
            )),
        }
    }

    fn idle(&mut self) {
        self.resolver.trim();
    }
}
