//! What a chip process serves: chip callables on its own chip (its backend, a simulated chip by default), and the memory
//! controls of chip-resident buffers.
//!
//! The chip runtime (device memory, core threads) is built after the fork, inside the child,
//! from the configuration and the callables captured before it ([`ChipChild`]). The process then
//! runs a loop of its own over both task frames and the base frame (`serve_chip`, below, rather
//! than the shared `ipc::child::serve`) with a `ChipServer`: tasks run chip callables (copying
//! host tensors in and out of device memory), controls install chip callables registered after
//! `init` and serve `alloc_child_tensor`, `copy_to`, `copy_from` and `free`.
//!
//! # The two-frame loop
//!
//! One loop serves controls and both task frames (rule M11 of `ipc::mailbox`). A task to run is
//! prepared and launched at once (`ChipRuntime::start`, also while a successor is prepared): on
//! the loop's thread only when no successor is staged and none can come (the parent's
//! `FLAG_OVERLAP` is off: it is set when a successor run is admitted, or when the task's run was
//! submitted by a caller that did not wait, `RunState::ahead`, so the first run of a burst
//! overlaps too, while `run`'s single task runs without the executor hop), else on the chip's
//! executor thread, so the loop stays free to read a staged task's `WITHDRAW` and can prepare a
//! staged task meanwhile: `ChipRuntime::prepare` with `CopyIn::InPieces`, then its copy-in into
//! its slot's fenced staging buffer (rule A6 of `chip::arena`), 512 KiB per turn of the loop
//! (`COPY_PIECE`), so the running task's end is answered between pieces rather than after the
//! whole copy; it publishes `FRAME_STAGED` once all is in. On `ACTIVATE` it launches the
//! prepared run on the executor; on `WITHDRAW` it finalizes it unlaunched and answers with an
//! error.
//!
//! The executor copies each run's outputs back into the host tensors the loop kept for it
//! (`HostResolver::kept`, given when the run starts or is activated, when its outputs become its
//! own; rule C2 of `ipc::child`) before it rings the child doorbell
//! (`ChipRuntime::on_run_done`), so the copy-back overlaps the next run's copy-in. Meanwhile the
//! loop leaves `copy_to` / `copy_from` controls posted (they wait for the running task anyway,
//! rule A3 of `chip::arena`), and those copy through a private buffer
//! (`HostResolver::read_range` / `write_range`), so a backend never holds a slice of host memory
//! that anyone writes. Once the chip is shutting down, the executor copies nothing back
//! (`Executor::stop`). The loop finalizes each run (one executed on the loop's own thread has
//! its host tensors mapped again from its frame for the copy-back: `ChipRun::detach`,
//! `finalize_traced`). While a successor waits, the loop checks politely for the running task's
//! end for up to 250 us before it sleeps (`Doorbell::wait_expecting`, `END_WINDOW`), and so does
//! the executor, after a run, for its next one while the runtime holds a prepared run: each
//! saves a wake-up (~35 us on a 2-vCPU guest) between two pipelined runs. Mappings are trimmed
//! only while the chip holds no run.

use crate::callable::identity::{CallableKind, Descriptor, Digest};
use crate::callable::registry::Registry;
use crate::chip::{
    ChipArg, ChipCall, ChipConfig, ChipFn, ChipRun, ChipRuntime, CopyBack, CopyIn, RunOn, Trace,
};
use crate::data::buffer::{Backing, BufferDesc};
use crate::data::wire::{DESC_SIZE, decode_args, decode_config, decode_desc};
use crate::engine::lease::Lease;
use crate::ipc::child::{
    CTRL_COPY_FROM, CTRL_COPY_TO, CTRL_FREE, CTRL_MALLOC, CTRL_REGISTER_CHIP, CTRL_REGISTER_CHIP_ORCH,
    CTRL_UNREGISTER, ERR_BAD_FRAME, ERR_DEVICE, ERR_TASK, ERR_UNKNOWN_CALLABLE, HostResolver, received_fn,
    task_lease,
};
use crate::ipc::mailbox::{
    Activation, ControlRequest, FLAG_OVERLAP, FrameError, MailboxRegion, TASK_FRAMES, TaskRequest,
};
use crate::sys::futex::PeerWait;
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
        // The parent names the chip in `init`'s error: the message says only what failed.
        let built = ChipRuntime::build(self.config, self.registry)
            .and_then(|mut rt| rt.grant_pipeline_depth(self.pipeline_depth).map(|granted| (rt, granted)));
        let runtime = match built {
            Ok((rt, granted)) => {
                // Before reporting ready (rule M9 of `ipc::mailbox`).
                mb.set_granted_depth(granted);
                rt
            }
            Err(e) => {
                mb.publish_init(Err(e.message()));
                return 1;
            }
        };
        let mut server = ChipServer { chip, runtime, resolver: self.resolver };
        server.inherit_marks(mb);
        mb.publish_init(Ok(()));
        let code = serve_chip(&region, self.index, &mut server);
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

impl ChipServer {
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
            CTRL_MALLOC if req.payload == crate::ipc::child::MALLOC_SHARED_RING => {
                self.runtime.malloc_shared(req.arg0).map_err(dev)
            }
            CTRL_MALLOC => {
                let id = crate::data::wire::identity_from_arg(&req.digest)
                    .map_err(|e| FrameError::new(ERR_BAD_FRAME, e.to_string()))?;
                self.runtime.malloc(req.arg0, id).map_err(dev)
            }
            CTRL_FREE => self.runtime.free(req.arg0).map(|()| 0).map_err(dev),
            // Through a copy of the host bytes: the backend gets a slice it may keep looking
            // at, and tasks of other processes may write the buffer's own bytes meanwhile.
            CTRL_COPY_TO => {
                let (desc, off, n) = Self::host_range(&req.payload)?;
                let src =
                    self.resolver.read_range(&desc, off, n).map_err(|m| FrameError::new(ERR_DEVICE, m))?;
                self.runtime.copy_to_device(req.arg0, &src).map(|()| 0).map_err(dev)
            }
            CTRL_COPY_FROM => {
                let (desc, off, n) = Self::host_range(&req.payload)?;
                // Checked against the buffer as mapped here before anything is allocated.
                self.resolver.range(&desc, off, n).map_err(|m| FrameError::new(ERR_DEVICE, m))?;
                let mut dst = vec![0u8; n as usize];
                self.runtime.copy_from_device(req.arg0, &mut dst).map_err(dev)?;
                self.resolver
                    .write_range(&desc, off, &dst)
                    .map(|()| 0)
                    .map_err(|m| FrameError::new(ERR_DEVICE, m))
            }
            other => Err(FrameError::new(
                ERR_BAD_FRAME,
                format!("unknown control command {other} for chip {}", self.chip),
            )),
        }
    }
}

/// Decodes task frame `req` into the call it asks of the chip (its host tensors mapped here;
/// they borrow the resolver), mapping its host buffers first (rule C2 of `ipc::child`: every
/// buffer is mapped first, then the tensors lent borrow the mappings).
fn decode<'r>(
    chip: u32,
    resolver: &'r mut HostResolver,
    req: &TaskRequest<'_>,
) -> Result<ChipCall<'r>, FrameError> {
    let decoded = decode_args(req.args())
        .map_err(|e| FrameError::new(ERR_BAD_FRAME, format!("bad task frame: {e}")))?;
    let config = decode_config(req.config())
        .map_err(|e| FrameError::new(ERR_BAD_FRAME, format!("bad task frame: {e}")))?;
    for (i, t) in decoded.tensors.iter().enumerate() {
        if !matches!(t.desc.backing(), Backing::Device { .. }) {
            resolver
                .resolve(&t.desc)
                .map_err(|m| FrameError::new(ERR_BAD_FRAME, format!("tensor {i}: {m}")))?;
        }
    }
    let resolver: &'r HostResolver = resolver;
    let mut args = Vec::with_capacity(decoded.tensors.len());
    for (i, t) in decoded.tensors.iter().enumerate() {
        let access = t.desc.access();
        match t.desc.backing() {
            Backing::Device { ptr, chip: owner } => {
                if owner != chip {
                    return Err(FrameError::new(
                        ERR_BAD_FRAME,
                        format!("tensor {i}: device memory of chip {owner} sent to chip {chip}"),
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
                let tensor = resolver
                    .tensor(&t.desc, t.view, access)
                    .map_err(|m| FrameError::new(ERR_BAD_FRAME, format!("tensor {i}: {m}")))?;
                args.push(ChipArg::Host(tensor));
            }
        }
    }
    Ok(ChipCall { digest: Digest::from_bytes(req.digest), args, scalars: decoded.scalars.into_vec(), config })
}

/// Whether the run of `req` records what it runs: for a task of a captured parent run (rule M10
/// of `ipc::mailbox`).
fn trace_of(req: &TaskRequest<'_>) -> Trace {
    if req.trace.is_some() { Trace::Record } else { Trace::Off }
}

/// The writable host tensors of task frame `req`, each with its index among the task's
/// tensors, holding their mappings (rule C2 of `ipc::child`): for the executor thread to copy
/// the task's outputs back into as soon as it has executed, while this thread goes on.
fn outputs_kept(resolver: &mut HostResolver, req: &TaskRequest<'_>) -> Result<CopyBack, FrameError> {
    let decoded = decode_args(req.args())
        .map_err(|e| FrameError::new(ERR_BAD_FRAME, format!("bad task frame: {e}")))?;
    let mut back = Vec::new();
    for (i, t) in decoded.tensors.iter().enumerate() {
        let access = t.desc.access();
        if matches!(t.desc.backing(), Backing::Device { .. }) || !access.can_write() {
            continue;
        }
        let kept = resolver.resolve(&t.desc).and_then(|_| resolver.kept(&t.desc, t.view, access));
        back.push((i, kept.map_err(|m| FrameError::new(ERR_BAD_FRAME, format!("tensor {i}: {m}")))?));
    }
    Ok(back)
}

/// A chip error as a frame error.
fn task_error(e: &crate::error::Error) -> FrameError {
    FrameError::new(super::frame_code(e, ERR_TASK), e.message().to_string())
}

/// A task the chip holds across requests: its frame (the guard owns it) and its run.
struct Held<'m> {
    req: TaskRequest<'m>,
    run: ChipRun<'static>,
}

impl ChipServer {
    /// Starts from the leases last posted to this mailbox (rule M12 of `ipc::mailbox`): after
    /// a restart, a lease older than the dead chip's is refused too.
    fn inherit_marks(&mut self, mb: crate::ipc::mailbox::Mailbox<'_>) {
        for ix in 0..TASK_FRAMES {
            let (slot, generation) = mb.posted_lease(ix);
            if generation != 0
                && let Err(e) = self.runtime.inherit_mark(Lease { slot, generation })
            {
                tracing::debug!(target: "simpler::chip", chip = self.chip, "not inheriting the lease mark of frame {ix}: {e}");
            }
        }
    }

    /// The lease a task came with (rule M12); a frame carrying the invalid lease (generation
    /// 0) is refused, unrun (rule L1 of `engine::lease`).
    fn lease_of(&self, req: &TaskRequest<'_>) -> Result<Lease, FrameError> {
        task_lease(req, &format_args!("chip {}", self.chip))
    }

    /// Takes a task to run now: prepares and launches it (on this thread when `here`). `Err`:
    /// it failed before it ran (answer it now).
    fn begin(&mut self, req: &TaskRequest<'_>, here: bool) -> Result<ChipRun<'static>, FrameError> {
        let lease = self.lease_of(req)?;
        let chip = self.chip;
        // On the executor thread, which copies the outputs back as soon as the task has run.
        let on = if here { RunOn::Here } else { RunOn::Executor(outputs_kept(&mut self.resolver, req)?) };
        let call = decode(chip, &mut self.resolver, req)?;
        if !self.runtime.contains(&call.digest) {
            return Err(FrameError::new(
                ERR_UNKNOWN_CALLABLE,
                format!("UNKNOWN_CALLABLE: {} is not registered on chip {chip}", call.digest),
            ));
        }
        let trace = trace_of(req);
        // Accepted before it launches: a kernel run on this thread has ended by the time
        // `start` returns, and the parent must not say of a task that ran when the chip died
        // that it had not launched (rule M12).
        let started = catch_unwind(AssertUnwindSafe(|| {
            self.runtime.start(lease, call, on, trace, || {
                req.mark_accepted();
            })
        }));
        match started {
            Ok(Ok(run)) => Ok(run.detach()),
            Ok(Err(e)) => Err(task_error(&e)),
            Err(panic) => Err(FrameError::new(
                ERR_TASK,
                format!("chip runtime panicked: {}", crate::error::panic_message(&*panic)),
            )),
        }
    }

    /// Prepares a staged successor: its tensors checked and given their slices of its slot's
    /// staging buffer; [`copy_some`](Self::copy_some) copies its inputs in while the running
    /// task executes. `Err`: it failed to prepare (answer it now).
    fn prepare(&mut self, req: &TaskRequest<'_>) -> Result<ChipRun<'static>, FrameError> {
        let lease = self.lease_of(req)?;
        let chip = self.chip;
        let call = decode(chip, &mut self.resolver, req)?;
        if !self.runtime.contains(&call.digest) {
            return Err(FrameError::new(
                ERR_UNKNOWN_CALLABLE,
                format!("UNKNOWN_CALLABLE: {} is not registered on chip {chip}", call.digest),
            ));
        }
        match catch_unwind(AssertUnwindSafe(|| self.runtime.prepare(lease, call, CopyIn::InPieces))) {
            Ok(Ok(run)) => Ok(run.detach()),
            Ok(Err(e)) => Err(task_error(&e)),
            Err(panic) => Err(FrameError::new(
                ERR_TASK,
                format!("chip runtime panicked preparing: {}", crate::error::panic_message(&*panic)),
            )),
        }
    }

    /// Copies up to `budget` more bytes of a staged successor's inputs in (its host tensors
    /// mapped again from its frame); true once they are all in. `Err`: it failed (finalize
    /// it and answer it now).
    fn copy_some(
        &mut self,
        req: &TaskRequest<'_>,
        run: &mut ChipRun<'static>,
        budget: u64,
    ) -> Result<bool, FrameError> {
        let call = decode(self.chip, &mut self.resolver, req)?;
        match catch_unwind(AssertUnwindSafe(|| self.runtime.copy_in_some(run, &call.args, budget))) {
            Ok(r) => r.map_err(|e| task_error(&e)),
            Err(panic) => Err(FrameError::new(
                ERR_TASK,
                format!("chip runtime panicked copying in: {}", crate::error::panic_message(&*panic)),
            )),
        }
    }

    /// Finishes a run that ended (or waits for it): copies its outputs back into its host
    /// tensors, mapped again from its frame (unless its executor did already), leaves its
    /// records in the trace log, and gives the frame's answer.
    fn end(&mut self, req: &TaskRequest<'_>, run: ChipRun<'static>) -> Result<(), FrameError> {
        let chip = self.chip;
        let outputs = if run.copies_back() {
            None
        } else {
            match decode(chip, &mut self.resolver, req) {
                Ok(call) => Some(call),
                Err(e) => {
                    let _ = self.runtime.finalize(run);
                    return Err(e);
                }
            }
        };
        let targets = outputs.as_ref().map(|call| &call.args[..]);
        let ended = catch_unwind(AssertUnwindSafe(|| self.runtime.finalize_traced(run, targets)));
        match ended {
            Ok((result, records)) => {
                if let (Some(key), Some(records)) = (req.trace, records) {
                    super::leave_trace(key, 0, 0, records);
                }
                result.map_err(|e| task_error(&e))
            }
            Err(panic) => Err(FrameError::new(
                ERR_TASK,
                format!("chip runtime panicked finishing: {}", crate::error::panic_message(&*panic)),
            )),
        }
    }
}

/// The answer to a staged task withdrawn before it launched.
fn withdrawn(chip: u32) -> FrameError {
    FrameError::new(
        ERR_TASK,
        format!(
            "chip {chip}: withdrawn before it launched (its run was stopped or its orchestration failed)"
        ),
    )
}

/// The bytes of a staged successor's inputs the chip child copies in per turn of its loop
/// (tens of microseconds: how late it may notice the running task's end).
const COPY_PIECE: u64 = 512 << 10;

/// The chip child's loop: one thread serves controls and both task frames (rule M11 of
/// `ipc::mailbox`), holding at most one running task (executed here, or on the chip's
/// executor thread when a successor may be staged meanwhile) and one staged successor
/// (prepared beside it, its inputs copied in a piece per turn so that the running task's end
/// is answered meanwhile, launched when the parent activates it). Sleeps on the mailbox's child
/// doorbell, which the parent rings after posting and the executor thread after each run.
/// Returns the exit code.
fn serve_chip(region: &std::sync::Arc<MailboxRegion>, index: usize, server: &mut ChipServer) -> i32 {
    let mb = region.mailbox(index);
    let parent = region.doorbell();
    {
        let region = region.clone();
        server.runtime.on_run_done(Box::new(move || region.mailbox(index).child_doorbell().ring()));
    }
    let mut active: Option<Held<'_>> = None;
    let mut staged: Option<Held<'_>> = None;
    loop {
        let seen = mb.child_doorbell().seq();
        if mb.shutdown_requested() {
            // Dropped guards answer their frames with an error; the runtime's shutdown waits
            // for the executing run.
            return 0;
        }
        let mut worked = false;
        // A copy between a host buffer and the chip waits while the executor may copy the
        // running task's outputs back into host memory: the control reads or writes host bytes
        // on this thread, which must not race the copy-back's writes on that one (rule C2 of
        // `ipc::child`). Its copy would wait for the running task anyway (rule A3 of
        // `chip::arena`).
        if let Some(ctl) = mb.control_request()
            && !(matches!(ctl.command, CTRL_COPY_TO | CTRL_COPY_FROM)
                && active.as_ref().is_some_and(|a| a.run.copies_back()))
        {
            let result = catch_unwind(AssertUnwindSafe(|| server.control(ctl))).unwrap_or_else(|p| {
                Err(FrameError::new(
                    ERR_BAD_FRAME,
                    format!("control panicked: {}", crate::error::panic_message(&*p)),
                ))
            });
            mb.finish_control(result, parent);
            worked = true;
        }
        // A task to run now (the parent posts one only while none runs here).
        if active.is_none() {
            for ix in 0..TASK_FRAMES {
                let Some(req) = mb.task_request_at(ix, false) else { continue };
                mb.set_child_cpu(crate::sys::futex::current_cpu());
                worked = true;
                // On this thread only when no successor is staged and none may come while it
                // runs: with one staged, this loop must stay free to read its WITHDRAW (its
                // run stopped), which would otherwise wait for this kernel's end.
                let here = staged.is_none() && req.flags & FLAG_OVERLAP == 0;
                match server.begin(&req, here) {
                    Ok(run) => active = Some(Held { req, run }),
                    Err(e) => mb.finish_task(req, Err(e), parent),
                }
                break;
            }
        }
        // The running task, once it ended (first: its run's end waits on it; a task run on this
        // thread has ended already).
        if let Some(a) = active.as_mut()
            && server.runtime.poll(&mut a.run)
        {
            let Some(Held { req, run }) = active.take() else { unreachable!() };
            let result = server.end(&req, run);
            mb.finish_task(req, result, parent);
            worked = true;
        }
        // A successor to prepare beside it.
        if staged.is_none() {
            for ix in 0..TASK_FRAMES {
                let Some(req) = mb.task_request_at(ix, true) else { continue };
                worked = true;
                match server.prepare(&req) {
                    Ok(run) => staged = Some(Held { req, run }),
                    Err(e) => mb.finish_task(req, Err(e), parent),
                }
                break;
            }
        }
        // Its copy-in, a piece per turn: the running task's end is answered between pieces,
        // not once the whole copy is in.
        if let Some(st) = staged.as_mut()
            && !st.run.copied()
        {
            worked = true;
            // Its run stopped meanwhile: the parent asks through the withdraw word (M11).
            let piece = if st.req.withdraw_asked() {
                Err(withdrawn(server.chip))
            } else {
                server.copy_some(&st.req, &mut st.run, COPY_PIECE)
            };
            match piece {
                Ok(true) => st.req.publish_staged(parent),
                Ok(false) => {}
                Err(e) => {
                    let Some(Held { req, run }) = staged.take() else { unreachable!() };
                    let _ = server.runtime.finalize(run);
                    mb.finish_task(req, Err(e), parent);
                }
            }
        }
        // The staged successor: activated (its run is the head now) or withdrawn. The parent
        // can do either only once it is staged, all its inputs in (rule M11).
        if let Some(st) = staged.as_mut()
            && st.run.copied()
        {
            match st.req.activation() {
                Activation::Waiting => {}
                Activation::Activate if active.is_some() => {
                    // The parent activates only with nothing running here.
                    let Some(Held { req, run }) = staged.take() else { unreachable!() };
                    let _ = server.runtime.finalize(run);
                    let e = FrameError::new(ERR_BAD_FRAME, "activated while another task runs on the chip");
                    mb.finish_task(req, Err(e), parent);
                    worked = true;
                }
                Activation::Activate => {
                    let Some(Held { req, mut run }) = staged.take() else { unreachable!() };
                    worked = true;
                    // Its outputs are its own from now on (the run before has ended): kept for
                    // its executor to copy back as soon as it has run.
                    match outputs_kept(&mut server.resolver, &req) {
                        Ok(back) => run.copy_back_into(back),
                        Err(e) => {
                            let _ = server.runtime.finalize(run);
                            mb.finish_task(req, Err(e), parent);
                            continue;
                        }
                    }
                    // Before the launch, as in `begin`.
                    req.mark_accepted();
                    match server.runtime.launch(&mut run, trace_of(&req)) {
                        Ok(()) => active = Some(Held { req, run }),
                        Err(e) => {
                            let _ = server.runtime.finalize(run);
                            mb.finish_task(req, Err(task_error(&e)), parent);
                        }
                    }
                }
                Activation::Withdraw => {
                    let Some(Held { req, run }) = staged.take() else { unreachable!() };
                    let _ = server.runtime.finalize(run);
                    mb.finish_task(req, Err(withdrawn(server.chip)), parent);
                    worked = true;
                }
            }
        }
        if worked {
            if active.is_none() && staged.is_none() {
                server.resolver.trim();
            }
        } else if active.is_some() && staged.is_some() {
            // The executor thread rings when the run ends. A staged successor launches only
            // after that end's copy-back and the parent's answer: notice it at once if it
            // comes soon, asleep otherwise.
            mb.child_doorbell().wait_expecting(seen, crate::chip::END_WINDOW);
        } else if active.is_some() {
            mb.child_doorbell().sleep(seen, None);
        } else {
            let me = crate::sys::futex::current_cpu();
            let parent_cpu = mb.parent_cpu();
            let elsewhere = me == 0 || parent_cpu == 0 || me != parent_cpu;
            mb.child_doorbell().wait_for_peer(seen, None, PeerWait::from_elsewhere(elsewhere));
        }
    }
}

#[cfg(test)]
mod tests;
