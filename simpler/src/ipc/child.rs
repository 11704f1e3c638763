//! The child loops: what a forked SUB worker or chip process runs until shutdown.
//!
//! Rules (cited by the `SAFETY` comments below):
//!
//! C1. A `REGISTER_*` control carries the address of a function pointer taken in the parent.
//!     The child is a fork of the parent, so the same code sits at the same address; the child
//!     also recomputes the digest from the descriptor and installs only on a match.
//! C2. Heap-slab tensors are accepted only when their whole buffer lies inside one of the heap
//!     rings mapped before the fork; POSIX shm tensors only inside the object as mapped here.
//!     A pointer from [`HostResolver::resolve`] stays valid until the next
//!     [`HostResolver::trim`], which runs only between tasks and controls.
//!
//! Both loops share [`serve`]: sleep on the mailbox's child doorbell (keep checking while the
//! parent runs on another CPU, yield when it shares ours, then futex), then handle shutdown, a
//! control request, or a task, in that order. Failures are reported in the frame; nothing a
//! task does can take the loop down (panics are caught).

#![allow(unsafe_code)] // Rebuilding fn pointers sent by the parent and copying host bytes; rules C1-C2.

use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::callable::host::{HostFn, HostFnPtr};
use crate::callable::identity::{CallableKind, Descriptor, Digest};
use crate::callable::registry::Registry;
use crate::chip::{ChipArg, ChipConfig, ChipFn, ChipRuntime};
use crate::data::buffer::{Backing, BufferDesc, Identity};
use crate::data::wire::{DESC_SIZE, decode_args, decode_config, decode_desc};
use crate::ipc::futex::PeerWait;
use crate::ipc::host_args::{HostArgs, MappedTensor};
use crate::ipc::mailbox::{ControlRequest, FrameError, MailboxRegion, TaskRequest};
use crate::ipc::shm::PosixShm;

/// Control command: install a host function (arg0 = fn address, payload = descriptor).
pub(crate) const CTRL_REGISTER_FN: u64 = 1;
/// Control command: drop one reference to a callable (digest).
pub(crate) const CTRL_UNREGISTER: u64 = 2;
/// Control command: install a chip callable (arg0 = fn address, payload = descriptor).
pub(crate) const CTRL_REGISTER_CHIP: u64 = 3;
/// Control command: allocate device memory (arg0 = bytes; result = device offset).
pub(crate) const CTRL_MALLOC: u64 = 4;
/// Control command: free device memory (arg0 = device offset).
pub(crate) const CTRL_FREE: u64 = 5;
/// Control command: host -> device (arg0 = device offset; payload = host descriptor, u64 host
/// byte offset, u64 byte count).
pub(crate) const CTRL_COPY_TO: u64 = 6;
/// Control command: device -> host (same payload as [`CTRL_COPY_TO`]).
pub(crate) const CTRL_COPY_FROM: u64 = 7;
/// Control command: install an orchestration function in a nested Worker (arg0 = fn address,
/// payload = descriptor).
pub(crate) const CTRL_REGISTER_ORCH: u64 = 8;

/// Frame error code: the function returned an error or panicked.
pub(crate) const ERR_TASK: i32 = 1;
/// Frame error code: the digest is not installed here.
pub(crate) const ERR_UNKNOWN_CALLABLE: i32 = 2;
/// Frame error code: the frame or a tensor in it is malformed.
pub(crate) const ERR_BAD_FRAME: i32 = 3;
/// Frame error code: a device-memory operation failed.
pub(crate) const ERR_DEVICE: i32 = 4;

/// Most POSIX shm objects a child keeps mapped; older mappings are dropped between tasks.
const SHM_CACHE: usize = 64;

/// What a child loop does with each request.
pub(crate) trait Serve {
    fn control(&mut self, req: ControlRequest) -> Result<u64, FrameError>;
    fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), FrameError>;
    /// Runs between requests (rule C2: mappings may be dropped here only).
    fn idle(&mut self) {}
}

/// The shared loop; returns the exit code.
pub(crate) fn serve(region: &MailboxRegion, index: usize, handler: &mut impl Serve) -> i32 {
    let mb = region.mailbox(index);
    let parent = region.doorbell();
    loop {
        let seen = mb.child_doorbell().seq();
        if mb.shutdown_requested() {
            return 0;
        }
        let mut worked = false;
        if let Some(ctl) = mb.control_request() {
            let result = catch_unwind(AssertUnwindSafe(|| handler.control(ctl))).unwrap_or_else(|p| {
                Err(FrameError::new(
                    ERR_BAD_FRAME,
                    format!("control panicked: {}", crate::error::panic_message(&*p)),
                ))
            });
            mb.finish_control(result, parent);
            worked = true;
        }
        if let Some(req) = mb.task_request() {
            mb.set_child_cpu(crate::ipc::futex::current_cpu());
            let result = handler.task(&req);
            mb.finish_task(result, parent);
            worked = true;
        }
        if worked {
            handler.idle();
        } else {
            // The parent usually posts the next task within microseconds of collecting the last
            // result: keep checking while it runs elsewhere, then sleep.
            let me = crate::ipc::futex::current_cpu();
            let parent_cpu = mb.parent_cpu();
            let elsewhere = me == 0 || parent_cpu == 0 || me != parent_cpu;
            mb.child_doorbell().wait_for_peer(seen, None, PeerWait::from_elsewhere(elsewhere));
        }
    }
}

/// Maps host buffers named by descriptors into this process (rule C2).
pub(crate) struct HostResolver {
    /// (base address, length) of every heap ring.
    heaps: Vec<(u64, u64)>,
    maps: HashMap<Identity, PosixShm>,
    order: VecDeque<Identity>,
}

impl HostResolver {
    pub(crate) fn new(heaps: Vec<(u64, u64)>) -> HostResolver {
        HostResolver { heaps, maps: HashMap::new(), order: VecDeque::new() }
    }

    /// The base address of a host buffer in this process.
    pub(crate) fn resolve(&mut self, desc: &BufferDesc) -> Result<*mut u8, String> {
        let n = desc.nbytes();
        match desc.backing() {
            Backing::HeapSlab { addr } => {
                let inside = self.heaps.iter().any(|&(base, len)| {
                    addr >= base && addr.checked_add(n).is_some_and(|end| end <= base + len)
                });
                if inside {
                    Ok(addr as usize as *mut u8)
                } else {
                    Err(format!("heap slab at {addr:#x} (+{n} bytes) is outside every heap ring"))
                }
            }
            Backing::Device { chip, .. } => Err(format!("device memory of chip {chip} is not host memory")),
            Backing::PosixShm { name } => {
                let id = desc.identity();
                if !self.maps.contains_key(&id) {
                    let len = usize::try_from(n).map_err(|_| "buffer too large".to_string())?;
                    let shm = PosixShm::open(&name, len).map_err(|e| e.to_string())?;
                    self.order.push_back(id);
                    self.maps.insert(id, shm);
                }
                let shm = &self.maps[&id];
                if (shm.len() as u64) < n {
                    return Err(format!(
                        "shm object {name} is smaller ({}) than its descriptor ({n})",
                        shm.len()
                    ));
                }
                Ok(shm.as_ptr())
            }
        }
    }

    /// Drops the oldest mappings beyond the cache size (only between requests, rule C2).
    pub(crate) fn trim(&mut self) {
        while self.order.len() > SHM_CACHE {
            if let Some(old) = self.order.pop_front() {
                self.maps.remove(&old);
            }
        }
    }

    /// `nbytes` bytes at `offset` of a host buffer, as a mutable byte slice.
    fn bytes(&mut self, desc: &BufferDesc, offset: u64, nbytes: u64) -> Result<&mut [u8], String> {
        offset.checked_add(nbytes).filter(|&e| e <= desc.nbytes()).ok_or_else(|| {
            format!("range {offset}..+{nbytes} is outside the {}-byte host buffer", desc.nbytes())
        })?;
        let base = self.resolve(desc)?;
        // SAFETY: rule C2 — `base` maps at least `desc.nbytes()` bytes (checked by `resolve`),
        // the range was bounds-checked above, and the slice is dropped before the next `trim`.
        Ok(unsafe { std::slice::from_raw_parts_mut(base.add(offset as usize), nbytes as usize) })
    }
}

/// Everything a SUB child needs, captured before the fork.
pub(crate) struct SubChild {
    pub(crate) region: Arc<MailboxRegion>,
    pub(crate) index: usize,
    pub(crate) registry: Registry<HostFn>,
    pub(crate) resolver: HostResolver,
}

impl SubChild {
    /// Runs the loop until shutdown; returns the exit code.
    pub(crate) fn run(mut self) -> i32 {
        let region = self.region.clone();
        let mb = region.mailbox(self.index);
        mb.set_child_pid(std::process::id());
        mb.publish_init(Ok(()));
        serve(&region, self.index, &mut self)
    }
}

impl Serve for SubChild {
    fn control(&mut self, req: ControlRequest) -> Result<u64, FrameError> {
        let digest = Digest::from_bytes(req.digest);
        match req.command {
            CTRL_REGISTER_FN => {
                let desc = Descriptor::from_bytes(req.payload)
                    .map_err(|e| FrameError::new(ERR_BAD_FRAME, e.to_string()))?;
                if desc.kind() != CallableKind::HostFn {
                    return Err(FrameError::new(
                        ERR_BAD_FRAME,
                        format!("{digest}: not a host function descriptor"),
                    ));
                }
                // SAFETY: rule C1 — `arg0` is the address of a `HostFnPtr` of this same binary,
                // taken in the parent this process was forked from.
                let f: HostFnPtr = unsafe { std::mem::transmute::<usize, HostFnPtr>(req.arg0 as usize) };
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
        let decoded = decode_args(req.args)
            .map_err(|e| FrameError::new(ERR_BAD_FRAME, format!("bad task frame: {e}")))?;
        let mut mapped = Vec::with_capacity(decoded.tensors.len());
        for (i, t) in decoded.tensors.iter().enumerate() {
            let base = self.resolver.resolve(&t.desc).map_err(|m| {
                let m = if matches!(t.desc.backing(), Backing::Device { .. }) {
                    format!("{m}; a host function on a SUB worker cannot use it")
                } else {
                    m
                };
                FrameError::new(ERR_BAD_FRAME, format!("tensor {i}: {m}"))
            })?;
            mapped.push(MappedTensor { base, view: t.view, access: t.desc.access() });
        }
        let args = HostArgs::new(mapped, &decoded.scalars, self.index as u32)
            .map_err(|e| FrameError::new(ERR_BAD_FRAME, e.to_string()))?;
        match catch_unwind(AssertUnwindSafe(|| f.call(&args))) {
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

/// Everything a chip child needs, captured before the fork. The chip runtime (with its core
/// threads) is built after the fork, inside the child.
pub(crate) struct ChipChild {
    pub(crate) region: Arc<MailboxRegion>,
    /// Mailbox index of this chip.
    pub(crate) index: usize,
    pub(crate) config: ChipConfig,
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
        let chip = self.config.chip_id;
        let runtime = match ChipRuntime::new(self.config, self.registry) {
            Ok(rt) => rt,
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
        let dev = |e: crate::Error| FrameError::new(ERR_DEVICE, e.to_string());
        match req.command {
            CTRL_REGISTER_CHIP => {
                let desc = Descriptor::from_bytes(req.payload)
                    .map_err(|e| FrameError::new(ERR_BAD_FRAME, e.to_string()))?;
                if desc.kind() != CallableKind::Chip {
                    return Err(FrameError::new(
                        ERR_BAD_FRAME,
                        format!("{digest}: not a chip callable descriptor"),
                    ));
                }
                // Rule C1: the address is a fn pointer of this binary (checked against the
                // descriptor's sub-kind by `from_parts`).
                let f = ChipFn::from_parts(req.arg0, desc.clone())
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
        let decoded = decode_args(req.args)
            .map_err(|e| FrameError::new(ERR_BAD_FRAME, format!("bad task frame: {e}")))?;
        let config = decode_config(req.config)
            .map_err(|e| FrameError::new(ERR_BAD_FRAME, format!("bad task frame: {e}")))?;
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
                    let base = self
                        .resolver
                        .resolve(&t.desc)
                        .map_err(|m| FrameError::new(ERR_BAD_FRAME, format!("tensor {i}: {m}")))?;
                    args.push(ChipArg::Host(MappedTensor { base, view: t.view, access }));
                }
            }
        }
        if !self.runtime.contains(&digest) {
            return Err(FrameError::new(
                ERR_UNKNOWN_CALLABLE,
                format!("UNKNOWN_CALLABLE: {digest} is not registered on chip {}", self.chip),
            ));
        }
        match catch_unwind(AssertUnwindSafe(|| self.runtime.run(&digest, args, &decoded.scalars, &config))) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(FrameError::new(ERR_TASK, e.message().to_string())),
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
