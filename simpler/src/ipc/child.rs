//! The SUB child loop: what a forked SUB worker process runs until shutdown.
//!
//! Rules (cited by the `SAFETY` comments below):
//!
//! C1. A `REGISTER_FN` control carries the address of a `HostFnPtr` taken in the parent. The
//!     child is a fork of the parent, so the same code sits at the same address; the child also
//!     recomputes the digest from the descriptor and installs only on a match.
//! C2. Heap-slab tensors are accepted only when their whole buffer lies inside one of the heap
//!     rings mapped before the fork; POSIX shm tensors only inside the object as mapped here.
//!
//! The loop: sleep on the mailbox's child doorbell (spin, yield, futex), then handle shutdown,
//! a control request, or a task, in that order. Failures of a task are reported in the frame;
//! nothing a task does can take the loop down (panics are caught).

#![allow(unsafe_code)] // Rebuilding a fn pointer sent by the parent; see rule C1.

use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::callable::host::{HostFn, HostFnPtr};
use crate::callable::identity::{CallableKind, Descriptor, Digest};
use crate::callable::registry::Registry;
use crate::data::buffer::{Backing, BufferDesc, Identity};
use crate::data::wire::decode_args;
use crate::ipc::host_args::{HostArgs, MappedTensor};
use crate::ipc::mailbox::{FrameError, MailboxRegion, TaskRequest};
use crate::ipc::shm::PosixShm;

/// Control command: install a host function (arg0 = fn address, payload = descriptor).
pub(crate) const CTRL_REGISTER_FN: u64 = 1;
/// Control command: drop one reference to a callable (digest).
pub(crate) const CTRL_UNREGISTER: u64 = 2;

/// Frame error code: the function returned an error or panicked.
pub(crate) const ERR_TASK: i32 = 1;
/// Frame error code: the digest is not installed here.
pub(crate) const ERR_UNKNOWN_CALLABLE: i32 = 2;
/// Frame error code: the frame or a tensor in it is malformed.
pub(crate) const ERR_BAD_FRAME: i32 = 3;

/// Most POSIX shm objects a child keeps mapped; older mappings are dropped between tasks.
const SHM_CACHE: usize = 64;

/// Everything a SUB child needs, captured before the fork.
pub(crate) struct SubChild {
    pub(crate) region: Arc<MailboxRegion>,
    pub(crate) index: usize,
    pub(crate) registry: Registry<HostFn>,
    /// (base address, length) of every heap ring.
    pub(crate) heaps: Vec<(u64, u64)>,
}

fn frame_err(code: i32, message: String) -> FrameError {
    FrameError { code, message }
}

struct ShmCache {
    maps: HashMap<Identity, PosixShm>,
    order: VecDeque<Identity>,
}

impl SubChild {
    /// Runs the loop until shutdown; returns the exit code.
    pub(crate) fn run(mut self) -> i32 {
        let region = self.region.clone();
        let mb = region.mailbox(self.index);
        mb.set_child_pid(std::process::id());
        mb.publish_init(Ok(()));
        let parent = region.doorbell();
        let mut cache = ShmCache { maps: HashMap::new(), order: VecDeque::new() };
        loop {
            let seen = mb.child_doorbell().seq();
            if mb.shutdown_requested() {
                return 0;
            }
            let mut worked = false;
            if let Some(ctl) = mb.control_request() {
                let result = self.control(ctl.command, ctl.arg0, ctl.digest, ctl.payload);
                mb.finish_control(result, parent);
                worked = true;
            }
            if let Some(req) = mb.task_request() {
                mb.set_child_cpu(crate::ipc::futex::current_cpu());
                let result = self.task(&req, &mut cache);
                mb.finish_task(result, parent);
                // Only between tasks: a mapping in use by the current task is never dropped.
                while cache.order.len() > SHM_CACHE {
                    if let Some(old) = cache.order.pop_front() {
                        cache.maps.remove(&old);
                    }
                }
                worked = true;
            }
            if !worked {
                // The parent usually posts the next task within microseconds of collecting the
                // last result: keep checking while it runs elsewhere, then sleep.
                let me = crate::ipc::futex::current_cpu();
                let parent = mb.parent_cpu();
                let elsewhere = me == 0 || parent == 0 || me != parent;
                mb.child_doorbell().wait_for_peer(seen, None, elsewhere);
            }
        }
    }

    fn control(
        &mut self,
        command: u64,
        arg0: u64,
        digest: [u8; 32],
        payload: Vec<u8>,
    ) -> Result<u64, FrameError> {
        let digest = Digest::from_bytes(digest);
        match command {
            CTRL_REGISTER_FN => {
                let desc =
                    Descriptor::from_bytes(payload).map_err(|e| frame_err(ERR_BAD_FRAME, e.to_string()))?;
                if desc.kind() != CallableKind::HostFn {
                    return Err(frame_err(
                        ERR_BAD_FRAME,
                        format!("{digest}: not a host function descriptor"),
                    ));
                }
                // SAFETY: rule C1 — `arg0` is the address of a `HostFnPtr` of this same binary,
                // taken in the parent this process was forked from.
                let f: HostFnPtr = unsafe { std::mem::transmute::<usize, HostFnPtr>(arg0 as usize) };
                let host = HostFn::from_parts(f, desc.clone());
                self.registry
                    .install(digest, desc.bytes(), host)
                    .map(u64::from)
                    .map_err(|e| frame_err(ERR_BAD_FRAME, e.to_string()))
            }
            CTRL_UNREGISTER => self
                .registry
                .release(&digest)
                .map(u64::from)
                .map_err(|e| frame_err(ERR_UNKNOWN_CALLABLE, e.to_string())),
            other => Err(frame_err(ERR_BAD_FRAME, format!("unknown control command {other}"))),
        }
    }

    fn task(&self, req: &TaskRequest<'_>, cache: &mut ShmCache) -> Result<(), FrameError> {
        let digest = Digest::from_bytes(req.digest);
        let Some(f) = self.registry.get(&digest) else {
            return Err(frame_err(
                ERR_UNKNOWN_CALLABLE,
                format!("UNKNOWN_CALLABLE: {digest} is not registered on sub worker {}", self.index),
            ));
        };
        let decoded =
            decode_args(req.args).map_err(|e| frame_err(ERR_BAD_FRAME, format!("bad task frame: {e}")))?;
        let mut mapped = Vec::with_capacity(decoded.tensors.len());
        for (i, t) in decoded.tensors.iter().enumerate() {
            let base = self
                .resolve(&t.desc, cache)
                .map_err(|m| frame_err(ERR_BAD_FRAME, format!("tensor {i}: {m}")))?;
            mapped.push(MappedTensor { base, view: t.view, access: t.desc.access() });
        }
        let args = HostArgs::new(mapped, &decoded.scalars, self.index as u32)
            .map_err(|e| frame_err(ERR_BAD_FRAME, e.to_string()))?;
        match catch_unwind(AssertUnwindSafe(|| f.call(&args))) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(frame_err(ERR_TASK, e.to_string())),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".to_string());
                Err(frame_err(ERR_TASK, format!("panicked: {msg}")))
            }
        }
    }

    /// Resolves a buffer to its base address in this process (rule C2).
    fn resolve(&self, desc: &BufferDesc, cache: &mut ShmCache) -> Result<*mut u8, String> {
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
            Backing::Device { chip, .. } => Err(format!(
                "device memory of chip {chip} cannot be used by a host function (SUB workers run on the host)"
            )),
            Backing::PosixShm { name } => {
                let id = desc.identity();
                if !cache.maps.contains_key(&id) {
                    let len = usize::try_from(n).map_err(|_| "buffer too large".to_string())?;
                    let shm = PosixShm::open(&name, len).map_err(|e| e.to_string())?;
                    cache.order.push_back(id);
                    cache.maps.insert(id, shm);
                }
                let shm = &cache.maps[&id];
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
}
