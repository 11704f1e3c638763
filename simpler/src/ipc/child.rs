//! The child end of a mailbox: the loop every child process runs until shutdown, and the
//! resolver that maps a task's host buffers by identity. What each kind of child serves lives
//! in `worker::serve` (`sub`, `chip`, `nested`).
//!
//! Rules (cited by the `SAFETY` comments below):
//!
//! C1. A `REGISTER_*` control carries, in `arg0`, [`FnAddress::to_wire`] of a function taken in
//!     the parent that started this process (forked, or exec'd from the same binary file; a
//!     start spec carries the same pairs of command and word): a [`HostFnPtr`] for [`CTRL_REGISTER_FN`] and
//!     [`CTRL_REGISTER_CHIP`] (a kernel), an [`OrchFnPtr`] for [`CTRL_REGISTER_ORCH`] and
//!     [`CTRL_REGISTER_CHIP_ORCH`] (a chip orchestration). Control frames are written only by
//!     that parent, through `Mailbox::post_control` on its register paths, and a
//!     [`ControlRequest`] is only ever read from a frame. The command alone names the type, and
//!     [`received_fn`] is the one place that reads a function back; the child also recomputes
//!     the digest from the descriptor and installs only on a match.
//! C2. Heap-slab tensors are accepted only when their whole buffer lies inside the heap ring
//!     they name (by its memfd inode) among those mapped before the child started; memfd tensors only inside the object as mapped here (the
//!     object the descriptor names, checked by `SharedMem::open`, rule N5 of `sys::shm`).
//!     A mapping is dropped only by [`HostResolver::trim`], which takes `&mut self`: the
//!     tensors and byte slices the resolver lends borrow it, so none outlives its mapping.
//!     Heap rings stay mapped for the life of the process. A [`KeptTensor`]
//!     ([`HostResolver::kept`]) borrows nothing: it holds an `Arc` of the mapping itself, which
//!     then lives until both the resolver and the kept tensor have let it go (rule H5 of
//!     `data::host_args`).
//!
//! Every child runs [`serve`]: sleep on the mailbox's child doorbell (keep checking while the
//! parent runs on another CPU, yield when it shares ours, then futex), then handle shutdown, a
//! control request, or a task, in that order. Failures are reported in the frame; nothing a
//! task does can take the loop down (panics are caught). SUB and nested children run it over a
//! [`Serve`] handler; a chip child runs its own two-frame loop (`worker::serve::chip`).
//!
//! The control command numbers (`CTRL_*`) and task error codes (`ERR_*`) are here;
//! [`received_fn`] is the one place a function is read back from a `REGISTER_*` control (C1).
//! The [`HostResolver`] maps each host buffer once per identity (`SharedMem::open`, checked by
//! inode and memfd name; a cached mapping is used only for the same key), keeps up to 64
//! mappings, and every 16 tasks drops those of large buffers (1 MiB and up) whose creator closed
//! them, so a dropped buffer's memory goes back while the children live.

#![expect(
    unsafe_code,
    reason = "fn pointers from control frames and slices of mapped host buffers; rules C1-C2"
)]

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::callable::host::HostFnPtr;
use crate::data::buffer::{Access, Backing, BufferDesc, Identity, host_label};
use crate::data::host_args::{KeptTensor, MappedTensor};
use crate::data::tensor::TensorView;
use crate::engine::lease::Lease;
use crate::engine::orch_fn::OrchFnPtr;
use crate::engine::tensor_map::KeyHasher;
use crate::ipc::mailbox::{ControlRequest, FrameError, MailboxRegion, TaskRequest};
use crate::sys::fn_address::FnAddress;
use crate::sys::futex::PeerWait;
use crate::sys::mem::SharedSpan;
use crate::sys::shm::{SharedKey, SharedMem};

/// Control command: install a host function (arg0 = fn address, payload = descriptor).
pub(crate) const CTRL_REGISTER_FN: u64 = 1;
/// Control command: drop one reference to a callable (digest).
pub(crate) const CTRL_UNREGISTER: u64 = 2;
/// Control command: install a chip kernel (arg0 = kernel fn address, payload = descriptor).
pub(crate) const CTRL_REGISTER_CHIP: u64 = 3;
/// The payload of a [`CTRL_MALLOC`] for a level's device heap block: a block any
/// intermediate of that level may name a part of (the level's ring allocator keeps their parts
/// apart), where a plain malloc's block belongs to one buffer.
pub(crate) const MALLOC_SHARED_RING: &[u8] = b"shared-ring";
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
/// Control command: install a chip orchestration (arg0 = fn address, payload = descriptor).
pub(crate) const CTRL_REGISTER_CHIP_ORCH: u64 = 9;

/// Frame error code: the function returned an error or panicked.
pub(crate) const ERR_TASK: i32 = 1;
/// Frame error code: the digest is not installed here.
pub(crate) const ERR_UNKNOWN_CALLABLE: i32 = 2;
/// Frame error code: the frame or a tensor in it is malformed.
pub(crate) const ERR_BAD_FRAME: i32 = 3;
/// Frame error code: a device-memory operation failed.
pub(crate) const ERR_DEVICE: i32 = 4;
/// Frame error code: a fixed-size resource (a chip's device memory) cannot hold what the task
/// or request needs; the parent reports it as `ErrorKind::ResourceExhausted`.
pub(crate) const ERR_RESOURCE: i32 = 5;
/// Frame error code: a worker below the child (a nested Worker's SUB worker or chip) died and
/// the task or request failed with it; the parent reports it as `ErrorKind::WorkerDied`.
pub(crate) const ERR_WORKER_DIED: i32 = 6;
/// Frame error code: the child gave a chained task back without running it (rule M13 of
/// `ipc::mailbox`): the task ahead of it failed, or the parent withdrew it.
pub(crate) const ERR_NOT_RUN: i32 = 7;

/// The function a `REGISTER_*` control carries, typed by its command (rule C1).
#[derive(Debug, Clone, Copy)]
pub(crate) enum ReceivedFn {
    /// A host function or chip kernel ([`CTRL_REGISTER_FN`], [`CTRL_REGISTER_CHIP`]).
    Host(HostFnPtr),
    /// An orchestration or chip orchestration ([`CTRL_REGISTER_ORCH`], [`CTRL_REGISTER_CHIP_ORCH`]).
    Orch(OrchFnPtr),
}

/// The function in `arg0` of a `REGISTER_*` control (rule C1); an error for another command or
/// an address of 0.
pub(crate) fn received_fn(req: &ControlRequest) -> Result<ReceivedFn, FrameError> {
    StartFn::from_control(req).get()
}

/// A function a parent sent: the `REGISTER_*` command that types it and its wire word, from a
/// control frame or a start spec (rule C1). Only this module builds one from a frame; a start
/// spec's decoder builds one with [`StartFn::from_start_spec`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct StartFn {
    command: u64,
    word: u64,
}

impl StartFn {
    fn from_control(req: &ControlRequest) -> StartFn {
        StartFn { command: req.command, word: req.arg0 }
    }

    /// A function entry of a start spec (`crate::sys::spawn`): written by the parent that
    /// started this process, with the command that types it and `FnAddress::to_wire` of it
    /// (rule C1 holds for start specs as for control frames).
    pub(crate) fn from_start_spec(command: u64, word: u64) -> StartFn {
        StartFn { command, word }
    }

    /// The function (rule C1); an error for a command that carries none or an address of 0.
    pub(crate) fn get(self) -> Result<ReceivedFn, FrameError> {
        let zero = || FrameError::new(ERR_BAD_FRAME, format!("control {}: function address 0", self.command));
        match self.command {
            CTRL_REGISTER_FN | CTRL_REGISTER_CHIP => {
                // SAFETY: rule C1 — for these commands the word is
                // `FnAddress::<HostFnPtr>::to_wire`, written by the parent that started this
                // process, which runs the same binary (FA2 of `sys::fn_address`).
                let f = unsafe { FnAddress::<HostFnPtr>::from_wire(self.word) }.ok_or_else(zero)?;
                Ok(ReceivedFn::Host(f.get()))
            }
            CTRL_REGISTER_ORCH | CTRL_REGISTER_CHIP_ORCH => {
                // SAFETY: rule C1 — for these commands the word is
                // `FnAddress::<OrchFnPtr>::to_wire`, written by the parent that started this
                // process, which runs the same binary (FA2 of `sys::fn_address`).
                let f = unsafe { FnAddress::<OrchFnPtr>::from_wire(self.word) }.ok_or_else(zero)?;
                Ok(ReceivedFn::Orch(f.get()))
            }
            other => Err(FrameError::new(ERR_BAD_FRAME, format!("control {other} carries no function"))),
        }
    }
}

/// Most memfd host buffers a child keeps mapped; older mappings are dropped between tasks.
const SHM_CACHE: usize = 64;

/// Mappings at least this large are dropped once their creator no longer holds the object (the
/// buffer was dropped by its owner), so their memory goes back to the system instead of staying
/// until the cache pushes them out.
const LARGE_MAPPING: usize = 1 << 20;

/// One `trim` in this many looks for dropped large objects (a `stat` each).
const UNLINKED_CHECK_EVERY: u32 = 16;

/// What a child loop does with each request.
pub(crate) trait Serve {
    fn control(&mut self, req: ControlRequest) -> Result<u64, FrameError>;
    fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), FrameError>;
    /// Runs between requests (rule C2: mappings may be dropped here only).
    fn idle(&mut self) {}
}

/// The lease a task came with (rule M12 of `ipc::mailbox`), or the frame's refusal: a frame
/// carrying the invalid lease (generation 0, never minted: rule L1 of `engine::lease`) runs
/// nothing, in a SUB or nested child ([`serve`]) as in a chip child. `who` names the child.
pub(crate) fn task_lease(req: &TaskRequest<'_>, who: &dyn std::fmt::Display) -> Result<Lease, FrameError> {
    let (slot, generation) = req.lease;
    let lease = Lease { slot, generation };
    if !lease.is_valid() {
        return Err(FrameError::new(
            ERR_BAD_FRAME,
            format!(
                "{who}: refused a task carrying the invalid {lease} (generation 0 is never minted); it did not run"
            ),
        ));
    }
    Ok(lease)
}

/// The shared loop; returns the exit code.
pub(crate) fn serve(region: &MailboxRegion, index: usize, handler: &mut impl Serve) -> i32 {
    let mb = region.mailbox(index);
    let parent = region.doorbell();
    // The task this child finished last: its sequence number and whether it succeeded (a
    // chained task runs only behind a success, rule M13).
    let mut last: Option<(u16, bool)> = None;
    // For messages: asked once (a system call), not per task.
    let pid = std::process::id();
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
        if let Some(req) = mb.next_task(last.map(|(seq, _)| seq)) {
            mb.set_child_cpu(crate::sys::futex::current_cpu());
            let seq = req.seq();
            let result = if req.chained() && last != Some((seq.wrapping_sub(1), true)) {
                Err(FrameError::new(ERR_NOT_RUN, "not run: the task ahead of it on this worker failed"))
            } else if req.withdrawn() {
                Err(FrameError::new(ERR_NOT_RUN, "not run: it was withdrawn"))
            } else {
                wait_after(region, index, &req).and_then(|()| {
                    task_lease(&req, &format_args!("worker process {pid}")).and_then(|_| handler.task(&req))
                })
            };
            // Whether it ran behind its predecessor's success: its record then also says that
            // one succeeded (a sibling waiting for it may read this one's record instead).
            let behind = req.chained() && last == Some((seq.wrapping_sub(1), true));
            last = Some((seq, result.is_ok()));
            let ok = result.is_ok();
            mb.finish_task(req, result, parent);
            // After the answer, so a sibling never starts behind a task whose end the parent
            // does not see (the child dies between the two: both see no end).
            ring_waiters(region, mb.set_done(seq, ok, behind));
            // A chained task behind this one starts on the next turn, without a wake-up
            // (rule M13).
            worked = true;
        }
        if worked {
            handler.idle();
        } else {
            // The parent usually posts the next task within microseconds of collecting the last
            // result: keep checking while it runs elsewhere, then sleep.
            let me = crate::sys::futex::current_cpu();
            let parent_cpu = mb.parent_cpu();
            let elsewhere = me == 0 || parent_cpu == 0 || me != parent_cpu;
            mb.child_doorbell().wait_for_peer(seen, None, PeerWait::from_elsewhere(elsewhere));
        }
    }
}

/// Rings the children of the mailboxes in `waiters` (a bit each), which slept waiting for this
/// child's `done` record to move (rule M13 of `ipc::mailbox`).
fn ring_waiters(region: &MailboxRegion, mut waiters: u64) {
    while waiters != 0 {
        let j = waiters.trailing_zeros() as usize;
        waiters &= waiters - 1;
        if j < region.len() {
            region.mailbox(j).child_doorbell().ring();
        }
    }
}

/// For a task posted to run after a task on another worker (rule M13 of `ipc::mailbox`):
/// waits until that worker recorded that task's end, or the parent settled the wait, checking
/// politely and then sleeping on this child's doorbell (the parent rings it when it settles).
/// `Ok` to run it; `Err` (unrun) when that task failed, the parent withdrew it, or the child is
/// shutting down. The record is read before the parent's word, and decides only when it names
/// that task, or the task chained behind it that ran behind its success; any other record
/// leaves the decision to the parent's word (which it sets before it posts to the sibling
/// anything not chained behind that task, so no later post's record is mistaken for that
/// task's).
fn wait_after(region: &MailboxRegion, index: usize, req: &TaskRequest<'_>) -> Result<(), FrameError> {
    let Some((sibling, seq)) = req.after() else { return Ok(()) };
    if sibling >= region.len() || sibling == index {
        return Err(FrameError::new(
            ERR_BAD_FRAME,
            format!(
                "the task it runs after is on worker {sibling}, and this is worker {index} of {}",
                region.len()
            ),
        ));
    }
    let (mb, other) = (region.mailbox(index), region.mailbox(sibling));
    let decided = || -> Option<Result<(), FrameError>> {
        let done = other.done();
        match req.chain_word() {
            crate::ipc::mailbox::CHAIN_GO => return Some(Ok(())),
            crate::ipc::mailbox::CHAIN_WITHDRAW => {
                return Some(Err(FrameError::new(ERR_NOT_RUN, "not run: it was withdrawn")));
            }
            _ => {}
        }
        match done {
            Some((s, true, _)) if s == seq => Some(Ok(())),
            // The task chained behind it ran: it succeeded.
            Some((s, _, true)) if s == seq.wrapping_add(1) => Some(Ok(())),
            Some((s, false, _)) if s == seq => Some(Err(FrameError::new(
                ERR_NOT_RUN,
                format!("not run: the task it runs after failed on the worker of mailbox {sibling}"),
            ))),
            _ => None,
        }
    };
    loop {
        let seen = mb.child_doorbell().seq();
        if mb.shutdown_requested() {
            return Err(FrameError::new(ERR_NOT_RUN, "not run: the worker is shutting down"));
        }
        if let Some(result) = decided() {
            return result;
        }
        let ready = || {
            other.done().is_some_and(|(s, _, behind)| s == seq || (behind && s == seq.wrapping_add(1)))
                || req.chain_word() != 0
        };
        // Before it sleeps: the sibling rings it when it records an end (the parent rings it
        // when it settles); a record that came meanwhile rings it now.
        let register = || {
            if other.watch_done(index) && ready() {
                mb.child_doorbell().ring();
            }
        };
        mb.child_doorbell().wait_watching(seen, None, PeerWait::Poll, ready, register);
    }
}

/// Maps host buffers named by descriptors into this process (rule C2).
pub(crate) struct HostResolver {
    /// Every heap ring (base address in its creator, mapping here).
    heaps: Vec<SharedSpan>,
    maps: HashMap<Identity, Arc<SharedMem>, BuildHasherDefault<KeyHasher>>,
    order: VecDeque<Identity>,
    /// Trims since the last look for dropped large objects.
    trims: u32,
}

impl HostResolver {
    pub(crate) fn new(heaps: Vec<SharedSpan>) -> HostResolver {
        HostResolver { heaps, maps: HashMap::default(), order: VecDeque::new(), trims: 0 }
    }

    /// The base address of a host buffer in this process.
    pub(crate) fn resolve(&mut self, desc: &BufferDesc) -> Result<*mut u8, String> {
        let n = desc.nbytes();
        match desc.backing() {
            Backing::HeapSlab { .. } => self.heap_slab(desc).map(|(base, _)| base),
            Backing::Device { chip, .. } => Err(format!("device memory of chip {chip} is not host memory")),
            Backing::Memfd { pid, fd, ino } => {
                let id = desc.identity();
                let key = SharedKey { pid, fd, ino };
                let shm = match self.maps.entry(id) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(v) => {
                        let len = usize::try_from(n).map_err(|_| "buffer too large".to_string())?;
                        let shm =
                            SharedMem::open(key, &host_label(id, pid), len).map_err(|e| e.to_string())?;
                        self.order.push_back(id);
                        v.insert(Arc::new(shm))
                    }
                };
                if shm.key() != key {
                    return Err(format!(
                        "host buffer {id} is mapped here as {:?}, but this descriptor names {key:?}",
                        shm.key()
                    ));
                }
                if (shm.len() as u64) < n {
                    return Err(format!(
                        "host buffer {id} is smaller ({}) than its descriptor ({n})",
                        shm.len()
                    ));
                }
                Ok(shm.as_ptr())
            }
        }
    }

    /// Tensor `view` of a host buffer already mapped by [`resolve`](HostResolver::resolve),
    /// with `access` (rule C2); an error if the buffer is not mapped here or the view does not
    /// fit in it.
    pub(crate) fn tensor(
        &self,
        desc: &BufferDesc,
        view: TensorView,
        access: Access,
    ) -> Result<MappedTensor<'_>, String> {
        let (base, _) = self.mapped_view(desc, &view)?;
        // SAFETY: rule C2 — the whole buffer lies inside a heap ring or the memfd object as
        // mapped here (checked by `mapped_view`), and the view inside the buffer; the tensor
        // borrows `self`, so `trim` cannot unmap it meanwhile. Nobody else touches the bytes a
        // writable view covers while the task runs: the parent's engine orders tasks by their
        // tags (rule H1).
        Ok(unsafe { MappedTensor::new(base, view, access) })
    }

    /// [`tensor`](Self::tensor), but holding the buffer's mapping itself rather than borrowing
    /// the resolver: for another thread to use until the task ends (rule C2).
    pub(crate) fn kept(
        &self,
        desc: &BufferDesc,
        view: TensorView,
        access: Access,
    ) -> Result<KeptTensor, String> {
        let (base, mapping) = self.mapped_view(desc, &view)?;
        // SAFETY: rules C2 and H5 — the whole buffer lies inside a heap ring or the memfd
        // object as mapped here (checked by `mapped_view`), the view inside the buffer, and the
        // kept tensor holds that mapping's `Arc`, so it stays mapped while the tensor lives,
        // whatever `trim` does. Nobody else touches the bytes a writable view covers until the
        // task ends: the parent's engine orders tasks by their tags (rule H1), the chip child
        // asks for kept tensors only once its task's outputs are its own (it runs, or is
        // activated), serves no control that copies host bytes while one is held, and reports
        // the task's end only after its holder dropped it.
        Ok(unsafe { KeptTensor::new(base, view, access, mapping) })
    }

    /// The base address here of host buffer `desc`, already mapped by
    /// [`resolve`](Self::resolve), and its mapping; an error if `view` does not fit in it.
    fn mapped_view(
        &self,
        desc: &BufferDesc,
        view: &TensorView,
    ) -> Result<(*mut u8, Arc<dyn Send + Sync>), String> {
        let (_, end) = view.byte_range();
        if end > desc.nbytes() {
            return Err(format!("its view ends at byte {end}, past its {}-byte buffer", desc.nbytes()));
        }
        match desc.backing() {
            Backing::HeapSlab { .. } => self.heap_slab(desc),
            Backing::Device { chip, .. } => Err(format!("device memory of chip {chip} is not host memory")),
            Backing::Memfd { pid, fd, ino } => match self.maps.get(&desc.identity()) {
                Some(shm)
                    if shm.len() as u64 >= desc.nbytes() && shm.key() == (SharedKey { pid, fd, ino }) =>
                {
                    Ok((shm.as_ptr(), shm.clone()))
                }
                _ => Err(format!("host buffer {} is not mapped here", desc.identity())),
            },
        }
    }

    /// The address of a heap-slab buffer, if it lies inside one heap ring (rule C2).
    fn heap_slab(&self, desc: &BufferDesc) -> Result<(*mut u8, Arc<dyn Send + Sync>), String> {
        let n = desc.nbytes();
        let Backing::HeapSlab { addr, ino } = desc.backing() else {
            return Err("not a heap slab".to_string());
        };
        let found = self.heaps.iter().find_map(|span| span.local(ino, addr, n).map(|p| (p, span)));
        found.map(|(p, span)| (p, span.region.clone() as Arc<dyn Send + Sync>)).ok_or_else(|| {
            format!(
                "heap slab at {addr:#x} (+{n} bytes) of ring {ino} is outside every heap ring mapped here"
            )
        })
    }

    /// Drops the oldest mappings beyond the cache size (only between requests, rule C2).
    /// Also drops, every few calls, large mappings whose creator dropped the buffer.
    pub(crate) fn trim(&mut self) {
        while self.order.len() > SHM_CACHE {
            if let Some(old) = self.order.pop_front() {
                self.maps.remove(&old);
            }
        }
        self.trims += 1;
        if self.trims >= UNLINKED_CHECK_EVERY {
            self.trims = 0;
            self.drop_dropped();
        }
    }

    /// Drops the large mappings whose creator no longer holds the object: it dropped the
    /// buffer, so this mapping is all that keeps the memory (only between requests, rule C2).
    pub(crate) fn drop_dropped(&mut self) {
        let gone: Vec<Identity> = self
            .maps
            .iter()
            .filter(|(_, shm)| shm.len() >= LARGE_MAPPING && !shm.is_held())
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.maps.remove(&id);
            self.order.retain(|o| *o != id);
        }
    }

    /// Mappings held now (for tests).
    #[cfg(test)]
    pub(crate) fn mapped(&self) -> usize {
        self.maps.len()
    }

    /// `nbytes` bytes at `offset` of a host buffer, as a mutable byte slice.
    /// Copies `bytes`, the byte span of `view` (a strided view of the host buffer `desc`, from
    /// its first byte to its last), into the view's elements only: the bytes between them may
    /// belong to other tasks running meanwhile, so no reference to them is made.
    pub(crate) fn write_view(
        &mut self,
        desc: &BufferDesc,
        view: &TensorView,
        bytes: &[u8],
    ) -> Result<(), String> {
        let (start, end) = view.byte_range();
        if end > desc.nbytes() || bytes.len() as u64 != end - start {
            return Err(format!(
                "a view spanning bytes {start}..{end} of the {}-byte host buffer, given {} bytes",
                desc.nbytes(),
                bytes.len()
            ));
        }
        let base = self.resolve(desc)?;
        view.for_each_run(|off, n| {
            // SAFETY: rule C2 — `base` maps at least `desc.nbytes()` bytes (checked by
            // `resolve`), and every run lies inside `start..end`, checked above against both the
            // buffer and `bytes`; the run's bytes are the view's elements, which this task
            // writes (rule H1 of `data::host_args`), and `bytes` is other memory.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr().add(off), base.add(start as usize + off), n);
            }
        });
        Ok(())
    }

    /// A copy of `nbytes` bytes at `offset` of host buffer `desc`, made without a reference to
    /// the buffer's bytes: tasks of other processes may be writing them meanwhile, and the copy
    /// is handed to code (a chip backend) that may keep looking at it.
    pub(crate) fn read_range(
        &mut self,
        desc: &BufferDesc,
        offset: u64,
        nbytes: u64,
    ) -> Result<Vec<u8>, String> {
        let base = self.range(desc, offset, nbytes)?;
        let mut out = vec![0u8; nbytes as usize];
        // SAFETY: rule C2 — `base + offset..+nbytes` lies inside the buffer as mapped here
        // (checked by `range`), and `out` is other memory of that length; no reference to the
        // shared bytes is made.
        unsafe { std::ptr::copy_nonoverlapping(base.add(offset as usize), out.as_mut_ptr(), out.len()) };
        Ok(out)
    }

    /// Copies `bytes` into host buffer `desc` at `offset`, without a reference to the buffer's
    /// bytes (as [`read_range`](Self::read_range)).
    pub(crate) fn write_range(&mut self, desc: &BufferDesc, offset: u64, bytes: &[u8]) -> Result<(), String> {
        let base = self.range(desc, offset, bytes.len() as u64)?;
        // SAFETY: rule C2 — `base + offset..+len` lies inside the buffer as mapped here (checked
        // by `range`), and `bytes` is other memory; no reference to the shared bytes is made.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(offset as usize), bytes.len()) };
        Ok(())
    }

    /// The base address of host buffer `desc`, mapped, once `offset..+nbytes` is checked to lie
    /// inside it (so inside what is mapped here).
    pub(crate) fn range(&mut self, desc: &BufferDesc, offset: u64, nbytes: u64) -> Result<*mut u8, String> {
        offset.checked_add(nbytes).filter(|&e| e <= desc.nbytes()).ok_or_else(|| {
            format!("range {offset}..+{nbytes} is outside the {}-byte host buffer", desc.nbytes())
        })?;
        self.resolve(desc)
    }

    pub(crate) fn bytes(&mut self, desc: &BufferDesc, offset: u64, nbytes: u64) -> Result<&mut [u8], String> {
        offset.checked_add(nbytes).filter(|&e| e <= desc.nbytes()).ok_or_else(|| {
            format!("range {offset}..+{nbytes} is outside the {}-byte host buffer", desc.nbytes())
        })?;
        let base = self.resolve(desc)?;
        // SAFETY: rule C2 — `base` maps at least `desc.nbytes()` bytes (checked by `resolve`),
        // the range was bounds-checked above, and the slice borrows `self`, so no `trim` unmaps
        // it meanwhile.
        Ok(unsafe { std::slice::from_raw_parts_mut(base.add(offset as usize), nbytes as usize) })
    }
}

#[cfg(test)]
mod tests;
