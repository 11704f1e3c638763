//! What a nested Worker process serves: orchestration functions, each run as a run of
//! the whole Worker it starts in its process (L3 under L4, recursively).
//!
//! This is the one place a child process runs a whole Worker. In its process the child starts its
//! own subtree (its SUB workers, chips or nested Workers) within what is left of the parent's
//! startup deadline, and only then reports ready. Each task names an orchestration function by
//! digest; the child runs it as a run of its own, on its own engine, with the task's arguments
//! (tensors keep their identity; the granted access becomes the tag, `Output` made read-write
//! by `Access::within_orchestration`) and config.
//!
//! The run goes through `Worker::run_for_parent`, which the remote node's session uses too: the
//! run is driven by the serving thread, confined to the task's tensors, and a panic of the
//! function is the task's `TaskFailed` error rather than the end of the process.

use crate::callable::identity::{CallableHandle, CallableKind, Descriptor, Digest};
use crate::callable::registry::Registry;
use crate::chip::ChipFn;
use crate::data::buffer::BufferDesc;
use crate::data::call_config::CallConfig;
use crate::data::task_args::{Tag, TaskArgs};
use crate::data::tensor::Tensor;
use crate::data::wire::{decode_args, decode_config};
use crate::engine::orch_fn::OrchFn;
use crate::error::Error;
use crate::ipc::child::{
    CTRL_REGISTER_CHIP, CTRL_REGISTER_CHIP_ORCH, CTRL_REGISTER_ORCH, CTRL_UNREGISTER, ERR_BAD_FRAME,
    ERR_TASK, ERR_UNKNOWN_CALLABLE, ReceivedFn, Serve, received_fn, serve,
};
use crate::ipc::mailbox::{CONFIG_BYTES, ControlRequest, FrameError, MailboxRegion, TaskRequest};
use crate::sys::mem::SharedSpan;
use crate::worker::{RunOptions, Worker};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Everything a nested child needs, captured before the fork.
pub(crate) struct NestedChild {
    pub(crate) region: Arc<MailboxRegion>,
    /// Mailbox index.
    pub(crate) index: usize,
    /// NEXT_LEVEL worker id in the parent.
    pub(crate) id: u32,
    pub(crate) worker: Worker,
    pub(crate) registry: Registry<OrchFn>,
    /// The parent's startup deadline: the whole subtree must be ready by then.
    pub(crate) deadline: Instant,
    /// Heap rings of the parent and its ancestors.
    pub(crate) heaps: Vec<SharedSpan>,
    /// Owner nonces of the parent and its ancestors: their buffers reach this Worker's tasks.
    pub(crate) owners: Vec<u64>,
}

impl NestedChild {
    /// Starts the subtree, reports ready, serves until shutdown, closes the subtree.
    pub(crate) fn run(self) -> i32 {
        let region = self.region.clone();
        let mb = region.mailbox(self.index);
        mb.set_child_pid(std::process::id());
        let mut inner = self.worker;
        if !inner.cfg.startup_delay.is_zero() {
            std::thread::sleep(inner.cfg.startup_delay); // test hook: a slow start
        }
        let left = self.deadline.saturating_duration_since(Instant::now());
        inner.cfg.startup_timeout = left.max(Duration::from_millis(1));
        inner.extra_heaps = self.heaps;
        inner.extra_owners = self.owners;
        if let Err(e) = inner.init() {
            // The parent names this Worker in `init`'s error.
            mb.publish_init(Err(e.message()));
            return 1;
        }
        mb.publish_init(Ok(()));
        let mut server = NestedServer { id: self.id, inner, registry: self.registry };
        let code = serve(&region, self.index, &mut server);
        let _ = server.inner.close();
        code
    }
}

struct NestedServer {
    id: u32,
    inner: Worker,
    registry: Registry<OrchFn>,
}

impl Serve for NestedServer {
    fn control(&mut self, req: ControlRequest) -> std::result::Result<u64, FrameError> {
        let digest = Digest::from_bytes(req.digest);
        let bad = |e: Error| FrameError::new(ERR_BAD_FRAME, e.to_string());
        match req.command {
            CTRL_REGISTER_ORCH => {
                let ReceivedFn::Orch(f) = received_fn(&req)? else {
                    unreachable!("CTRL_REGISTER_ORCH carries an orchestration (rule C1 of ipc::child)")
                };
                let desc = Descriptor::from_bytes(req.payload).map_err(bad)?;
                if desc.kind() != CallableKind::Orch {
                    return Err(FrameError::new(
                        ERR_BAD_FRAME,
                        format!("{digest}: not an orchestration descriptor"),
                    ));
                }
                self.registry
                    .install(digest, desc.bytes(), OrchFn::from_parts(f, desc.clone()))
                    .map(u64::from)
                    .map_err(bad)
            }
            CTRL_REGISTER_CHIP | CTRL_REGISTER_CHIP_ORCH => {
                let body = super::chip_body(received_fn(&req)?);
                let desc = Descriptor::from_bytes(req.payload).map_err(bad)?;
                let f = ChipFn::from_parts(body, desc).map_err(bad)?;
                self.inner.register_chip(f).map(|_| 0).map_err(bad)
            }
            CTRL_UNREGISTER => {
                if self.registry.contains(&digest) {
                    self.registry
                        .release(&digest)
                        .map(u64::from)
                        .map_err(|e| FrameError::new(ERR_UNKNOWN_CALLABLE, e.to_string()))
                } else {
                    let handle = CallableHandle::new(digest, CallableKind::Chip, "");
                    self.inner
                        .unregister(&handle)
                        .map(|()| 0)
                        .map_err(|e| FrameError::new(ERR_UNKNOWN_CALLABLE, e.to_string()))
                }
            }
            other => Err(FrameError::new(
                ERR_BAD_FRAME,
                format!("unknown control command {other} for worker {}", self.id),
            )),
        }
    }

    fn task(&mut self, req: &TaskRequest<'_>) -> std::result::Result<(), FrameError> {
        let digest = Digest::from_bytes(req.digest);
        let Some(f) = self.registry.get(&digest) else {
            return Err(FrameError::new(
                ERR_UNKNOWN_CALLABLE,
                format!("UNKNOWN_CALLABLE: {digest} is not registered on worker {}", self.id),
            ));
        };
        let bad = |e: Error| FrameError::new(ERR_BAD_FRAME, format!("bad task frame: {e}"));
        let decoded = decode_args(req.args()).map_err(bad)?;
        // Most tasks carry the default config: skip decoding (and validating) all-zero bytes.
        // Compared against zeros with `memcmp` (a byte loop was a visible share of a nested task).
        static ZEROS: [u8; CONFIG_BYTES] = [0; CONFIG_BYTES];
        let config = if ZEROS.get(..req.config().len()) == Some(req.config()) {
            CallConfig::new()
        } else {
            decode_config(req.config()).map_err(bad)?
        };
        // Re-export, never map: the descriptors (and so the identities) pass through unchanged.
        let mut args = TaskArgs::new();
        for t in &decoded.tensors {
            let d = t.desc;
            let access = d.access().within_orchestration();
            let desc = BufferDesc::new(d.identity(), d.backing(), access, d.nbytes()).map_err(bad)?;
            let tensor = Tensor::from_desc(desc, t.view).map_err(bad)?;
            args.add_tensor(&tensor, Tag::for_access(d.access())).map_err(bad)?;
        }
        for &s in &decoded.scalars {
            args.scalar(s);
        }
        let mut options = RunOptions::new().args(args).config(config);
        if req.trace.is_some() {
            options = options.capture_dag(); // its parent's run is captured: so is this one
        }
        // This thread waits for the run, so it drives it (no hop to the background thread).
        let (run, result) = self
            .inner
            .run_for_parent(options, |orch, a, c| f.call(orch, a, c), |_| {})
            .map_err(|e| FrameError::new(super::frame_code(&e, ERR_TASK), e.message().to_string()))?;
        if let (Some(trace), Some(t)) = (req.trace, run.own_timeline()) {
            super::leave_trace(trace, run.engine_id(), run.id(), t.records().to_vec());
        }
        result.map_err(|e| FrameError::new(super::frame_code(&e, ERR_TASK), e.message().to_string()))
    }
}
