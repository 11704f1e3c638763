//! A chip's backend as the runtime uses it: every device operation goes through the
//! [`ChipBackend`] trait, and whatever the backend returns is checked before a kernel can see
//! it.
//!
//! Device pointers are opaque: the runtime never dereferences one. Two blocks the runtime holds
//! at once must never share a byte, or two kernels on two cores of a simulated chip would alias
//! a `&mut` from safe code. A backend's `malloc` is the backend's own code, so [`Device`] keeps
//! the blocks it handed out (`held`) and refuses a result that overlaps a held one (or, for a
//! backend whose memory is in this process, that is not a live block of it). Copies of a
//! simulated chip may run only while no kernel runs; its memory enforces that itself (rule A3
//! of `chip::arena`), and a device backend's own queues order them.
//!
//! Every other held block belongs to the buffer it was allocated for: its [`Identity`], given
//! at `malloc`. A device tensor is checked by that identity, not only by its address
//! ([`Device::is_live_as`], [`Device::usable_by_kernels`]): once a block is freed and its bytes
//! handed to another buffer, a task still naming the old buffer is refused, though the
//! addresses match.
//!
//! Some held blocks are the runtime's own (*internal*: the retained staging buffers of the
//! pipeline slots). They are invisible to users: a device tensor or a memory control naming
//! one is refused as not live ([`Device::is_live`]), and only the runtime hands kernels views
//! of them ([`Device::usable_by_kernels`]). In tests and with the `bench-support` feature,
//! every successful backend `malloc` is counted (`Device::allocations`), so the pipeline
//! benchmark sees how many device allocations a run costs.
//!
//! Kernels reach the backend here too: [`Device::load_kernel`] at registration and
//! [`Device::launch`] from a core thread or the executor.

use std::collections::BTreeMap;
#[cfg(any(test, feature = "bench-support"))]
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::callable::identity::Digest;
use crate::chip::arena::{self, Arena};
use crate::chip::backend::{ChipBackend, Completion, DeviceTensor, KernelDef, KernelLaunch, check_cores};
use crate::chip::sim::DeviceMemory;
use crate::data::buffer::Identity;
use crate::data::host_args::MappedTensor;
use crate::data::tensor::TensorView;
use crate::error::{Error, ErrorKind, Result};
use crate::sys::sync;

/// One chip's backend, with the blocks it handed out.
pub(crate) struct Device {
    chip: u32,
    backend: Box<dyn ChipBackend>,
    /// The memory native kernels see, for a simulated backend: what `backend.host_memory()`
    /// returned when the chip was built.
    memory: Option<DeviceMemory>,
    /// The backend's memory size and alignment (checked at construction).
    size: u64,
    align: u64,
    /// Blocks handed out by `backend.malloc` and not freed: start -> (length, holder).
    held: Mutex<BTreeMap<u64, (u64, Holder)>>,
    /// Successful backend mallocs so far.
    #[cfg(any(test, feature = "bench-support"))]
    mallocs: AtomicU64,
}

/// Whom a held block was allocated for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Holder {
    /// The runtime itself (a staging buffer): internal.
    Runtime,
    /// The buffer of this identity (a user's device buffer or an `orch.alloc` intermediate).
    Buffer(Identity),
    /// A level's device heap block: the parent's ring allocator hands parts of it to its
    /// intermediates, each under an identity of its own, and keeps them apart.
    Ring,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("chip", &self.chip).field("memory", &self.memory).finish()
    }
}

impl Device {
    /// Takes `backend` as chip `chip`'s device; refuses a core count outside 1..=1024.
    /// Refuses an alignment that is not a power of two from 64 to 65536, and a memory of 0
    /// bytes.
    pub(crate) fn new(chip: u32, backend: Box<dyn ChipBackend>) -> Result<Device> {
        check_cores(backend.cores())?;
        let align = backend.alignment();
        if !align.is_power_of_two() || !(64..=65536).contains(&align) {
            return Err(Error::invalid(format!(
                "the backend's alignment is {align} bytes; it must be a power of two from 64 to 65536"
            )));
        }
        let size = backend.memory_size();
        if size == 0 {
            return Err(Error::invalid(
                "the backend reports 0 bytes of device memory (implement ChipBackend::memory_size, or host_memory for a simulated backend)",
            ));
        }
        let memory = backend.host_memory().cloned();
        Ok(Device {
            chip,
            backend,
            memory,
            size,
            align,
            held: Mutex::new(BTreeMap::new()),
            #[cfg(any(test, feature = "bench-support"))]
            mallocs: AtomicU64::new(0),
        })
    }

    /// The backend's core count (checked at construction).
    pub(crate) fn cores(&self) -> usize {
        self.backend.cores()
    }

    /// The memory native kernels see, for a simulated backend.
    pub(crate) fn arena(&self) -> Option<&Arc<Arena>> {
        self.memory.as_ref().map(DeviceMemory::arena)
    }

    /// The memory's size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// The bytes of the blocks the runtime holds, as requested (tests).
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> u64 {
        sync::lock(&self.held).values().map(|&(len, _)| len).sum()
    }

    /// Where a kernel argument may start: staged host tensors are placed at multiples of it.
    pub(crate) fn align(&self) -> u64 {
        self.align
    }

    /// Fences the staging block at `ptr` (rule A6 of `chip::arena`): a no-op on a device
    /// backend, whose queues order copies and kernels.
    pub(crate) fn fence(&self, ptr: u64) -> Result<()> {
        self.arena().map_or(Ok(()), |a| a.fence(ptr))
    }

    /// Lifts the fence of the staging block at `ptr` (rule A6 of `chip::arena`).
    pub(crate) fn unfence(&self, ptr: u64) -> Result<()> {
        self.arena().map_or(Ok(()), |a| a.unfence(ptr))
    }

    /// Allocates through the backend. No room (the backend's [`ErrorKind::InvalidState`]
    /// error, or a request larger than the whole memory) is an [`ErrorKind::ResourceExhausted`]
    /// error naming `WorkerBuilder::chip_memory`; the backend's other errors pass through; a
    /// result that is not a free block of the memory is an [`ErrorKind::Os`] error naming the
    /// block.
    /// The block belongs to the buffer `id` from now until it is freed.
    pub(crate) fn malloc(&self, nbytes: u64, id: Identity) -> Result<u64> {
        self.malloc_as(nbytes, Holder::Buffer(id))
    }

    /// As [`Device::malloc`], for a block of the runtime's own (a staging buffer): fenced at
    /// once (rule A6 of `chip::arena`) and invisible to users.
    pub(crate) fn malloc_internal(&self, nbytes: u64) -> Result<u64> {
        let ptr = self.malloc_as(nbytes, Holder::Runtime)?;
        if let Some(Err(e)) = self.arena().map(|a| a.fence_new(ptr)) {
            let _ = self.free(ptr);
            return Err(e);
        }
        Ok(ptr)
    }

    /// As [`Device::malloc`], for a level's device heap block ([`Holder::Ring`]): device
    /// tensors of any identity may name parts of it, memory controls none.
    pub(crate) fn malloc_shared(&self, nbytes: u64) -> Result<u64> {
        self.malloc_as(nbytes, Holder::Ring)
    }

    /// Successful backend allocations so far (user buffers, `orch.alloc` intermediates and
    /// staging buffers alike).
    #[cfg(any(test, feature = "bench-support"))]
    pub(crate) fn allocations(&self) -> u64 {
        self.mallocs.load(Ordering::Relaxed)
    }

    fn malloc_as(&self, nbytes: u64, holder: Holder) -> Result<u64> {
        let ptr = self.backend.malloc(nbytes).map_err(|e| {
            let no_room = e.kind() == ErrorKind::InvalidState
                || (e.kind() == ErrorKind::InvalidArgument && nbytes > self.size());
            if !no_room {
                return e;
            }
            Error::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "{}; raise WorkerBuilder::chip_memory (now {} bytes) or free device memory sooner",
                    e.message(),
                    self.size()
                ),
            )
        })?;
        let mut held = sync::lock(&self.held);
        let end = ptr.checked_add(nbytes);
        let clash = end.and_then(|end| held.range(..end).next_back().filter(|&(&p, &(l, _))| p + l > ptr));
        let live = self.memory.as_ref().is_none_or(|m| m.is_live(ptr, nbytes));
        if end.is_none() || !live || clash.is_some() {
            return Err(Error::new(
                ErrorKind::Os,
                format!(
                    "chip {}: the backend's malloc({nbytes}) returned {ptr:#x}, which is not a free block of its device memory{}",
                    self.chip,
                    clash
                        .map(|(p, (l, _))| format!(" (it overlaps the held block {p:#x}..+{l})"))
                        .unwrap_or_default()
                ),
            ));
        }
        held.insert(ptr, (nbytes, holder));
        #[cfg(any(test, feature = "bench-support"))]
        self.mallocs.fetch_add(1, Ordering::Relaxed);
        Ok(ptr)
    }

    /// As [`Device::malloc`], but `Ok(None)` when the backend has no room now though the
    /// memory could hold the request (a free may make room).
    pub(crate) fn try_malloc(&self, nbytes: u64, id: Identity) -> Result<Option<u64>> {
        match self.malloc(nbytes, id) {
            Ok(ptr) => Ok(Some(ptr)),
            Err(e) if e.kind() == ErrorKind::ResourceExhausted && nbytes <= self.size() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Frees a block through the backend; the runtime holds it no longer.
    pub(crate) fn free(&self, ptr: u64) -> Result<()> {
        self.backend.free(ptr)?;
        sync::lock(&self.held).remove(&ptr);
        Ok(())
    }

    /// True when `ptr..ptr + len` lies inside a block the runtime holds for a buffer (not an
    /// internal one), live in the memory: what a memory control may name (its caller checked
    /// the buffer's identity).
    pub(crate) fn is_live(&self, ptr: u64, len: u64) -> bool {
        matches!(self.held_block(ptr, len), Some(Holder::Buffer(_)))
    }

    /// True when `ptr..ptr + len` lies inside the block the runtime holds for buffer `id`, live
    /// in the memory: what a device tensor of `id` may name.
    pub(crate) fn is_live_as(&self, ptr: u64, len: u64, id: Identity) -> bool {
        matches!(self.held_block(ptr, len), Some(h) if h == Holder::Buffer(id) || h == Holder::Ring)
    }

    /// True when `ptr..ptr + len` lies inside the block of buffer `id`, or inside one of the
    /// runtime's own (a staging buffer, whose tensors carry identities of the run's scratch),
    /// live in the memory: what a core may be handed (the memory itself refuses a view into a
    /// fenced block).
    pub(crate) fn usable_by_kernels(&self, ptr: u64, len: u64, id: Identity) -> bool {
        matches!(self.held_block(ptr, len), Some(h) if h == Holder::Runtime || h == Holder::Ring || h == Holder::Buffer(id))
    }

    /// Who holds the held block the range lies in; `None` when none holds it.
    fn held_block(&self, ptr: u64, len: u64) -> Option<Holder> {
        let holder = sync::lock(&self.held)
            .range(..=ptr)
            .next_back()
            .filter(|&(&p, &(l, _))| ptr.checked_add(len).is_some_and(|end| end <= p + l))
            .map(|(_, &(_, holder))| holder)?;
        self.memory.as_ref().is_none_or(|m| m.is_live(ptr, len)).then_some(holder)
    }

    /// Host to device, through the backend.
    pub(crate) fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.backend.copy_to_device(dst, src)
    }

    /// Device to host, through the backend.
    pub(crate) fn copy_from_device(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.backend.copy_from_device(src, dst)
    }

    /// Copies a host tensor's elements into the device buffer at `ptr`, packed (laid out as
    /// `view`, contiguous and of the host view's shape): one backend copy, from the view in
    /// place when it is contiguous, else from a host buffer its elements are gathered into.
    pub(crate) fn copy_in(&self, host: &MappedTensor<'_>, ptr: u64, view: &TensorView) -> Result<()> {
        self.copy_in_part(host, ptr, view, (0, u64::MAX)).map(|_| ())
    }

    /// [`copy_in`](Self::copy_in) of the view's element bytes `window.0..` up to `window.1` of
    /// them (see [`arena::copy_runs_in`]); returns the bytes copied.
    pub(crate) fn copy_in_part(
        &self,
        host: &MappedTensor<'_>,
        ptr: u64,
        view: &TensorView,
        window: (u64, u64),
    ) -> Result<u64> {
        let dev = self.device_view("copy-in of a host tensor", host.view(), ptr, view)?;
        arena::copy_runs_in(host, dev, window, |d, s| self.backend.copy_to_device(d, s))
    }

    /// Copies the packed device view at `ptr` back into a host tensor's elements: one backend
    /// copy, into the view in place when it is contiguous, else into a host buffer scattered
    /// into its elements.
    pub(crate) fn copy_out(&self, ptr: u64, view: &TensorView, host: &MappedTensor<'_>) -> Result<()> {
        let dev = self.device_view("copy-back of a host tensor", host.view(), ptr, view)?;
        arena::copy_runs_out(dev, host, |d, s| self.backend.copy_from_device(d, s))
    }

    /// Checks that the device buffer at `ptr` holds `dev_view`'s byte range inside a held
    /// block and that `dev_view` is the packed layout of `host` (contiguous, same shape and
    /// type); returns the device pointer of the view's first byte.
    fn device_view(&self, what: &str, host: &TensorView, ptr: u64, dev_view: &TensorView) -> Result<u64> {
        if host.shape() != dev_view.shape() || host.dtype() != dev_view.dtype() || !dev_view.is_contiguous() {
            return Err(Error::invalid(format!(
                "{what}: host view {host:?} and device view {dev_view:?} differ"
            )));
        }
        let (start, end) = dev_view.byte_range();
        let at = ptr.checked_add(start).filter(|&at| self.held_block(at, end - start).is_some());
        at.map(|_| ptr + dev_view.byte_offset()).ok_or_else(|| {
            Error::invalid(format!(
                "{what}: device range {:#x}..+{} does not lie inside one live allocation of chip {}",
                ptr.wrapping_add(start),
                end - start,
                self.chip
            ))
        })
    }

    /// Makes `kernel` launchable (at registration): a build failure names the kernel and the
    /// chip and carries the backend's message (the compiler's log).
    pub(crate) fn load_kernel(&self, kernel: &KernelDef<'_>) -> Result<()> {
        self.backend.load_kernel(kernel)
    }

    /// Whether the backend can run `kernel` (see [`ChipBackend::can_run`]).
    pub(crate) fn can_run(&self, kernel: &KernelDef<'_>) -> bool {
        self.backend.can_run(kernel)
    }

    /// Forgets a kernel loaded by [`load_kernel`](Self::load_kernel).
    pub(crate) fn unload_kernel(&self, digest: &Digest) {
        self.backend.unload_kernel(digest);
    }

    /// Runs `kernel` on `core` with `tensors` (each checked usable by kernels by its caller)
    /// and `scalars`, and waits for it; its failure is the error.
    pub(crate) fn launch(
        &self,
        kernel: KernelDef<'_>,
        core: u32,
        tensors: &[DeviceTensor],
        scalars: &[u64],
    ) -> Result<()> {
        self.backend.launch(KernelLaunch { kernel, core, tensors, scalars }).and_then(Completion::wait)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::chip::sim::SimChip;

    /// A backend whose malloc returns whatever it is told to.
    struct Liar {
        sim: SimChip,
        next: AtomicU64,
    }

    impl ChipBackend for Liar {
        fn cores(&self) -> usize {
            1
        }
        fn malloc(&self, _nbytes: u64) -> Result<u64> {
            Ok(self.next.load(Ordering::SeqCst))
        }
        fn host_memory(&self) -> Option<&DeviceMemory> {
            self.sim.host_memory()
        }
    }

    fn id(n: u64) -> Identity {
        Identity::new(0xc41, n, 1).unwrap()
    }

    /// A block freed and handed to another buffer at the same address is that buffer's: a
    /// tensor of the old buffer is refused though its address range matches.
    #[test]
    fn a_block_is_checked_by_the_identity_it_was_allocated_for() {
        let dev = Device::new(0, Box::new(SimChip::new(4096, 1).unwrap())).unwrap();
        let (old, new) = (id(1), id(2));
        let p = dev.malloc(256, old).unwrap();
        assert!(dev.is_live_as(p, 256, old) && dev.usable_by_kernels(p, 256, old));
        dev.free(p).unwrap();
        assert_eq!(dev.malloc(256, new).unwrap(), p, "first fit hands out the same bytes again");
        assert!(dev.is_live(p, 256), "live for a memory control, whose caller checked the identity");
        assert!(!dev.is_live_as(p, 256, old), "the old buffer's tensor is refused");
        assert!(!dev.usable_by_kernels(p, 256, old), "and never reaches a core");
        assert!(dev.is_live_as(p, 256, new) && dev.usable_by_kernels(p, 256, new));
    }

    #[test]
    fn a_malloc_result_that_aliases_a_held_block_is_refused() {
        let sim = SimChip::new(4096, 1).unwrap();
        let real = sim.memory().malloc(256).unwrap();
        let dev = Device::new(7, Box::new(Liar { sim, next: AtomicU64::new(real) })).unwrap();
        assert_eq!(dev.malloc(256, id(1)).unwrap(), real, "a live block is accepted once");
        let err = dev.malloc(16, id(2)).unwrap_err();
        assert!(err.message().contains("chip 7") && err.message().contains("overlaps"), "{err}");
    }

    #[test]
    fn a_malloc_result_outside_the_memory_is_refused() {
        let sim = SimChip::new(4096, 1).unwrap();
        let dev = Device::new(0, Box::new(Liar { sim, next: AtomicU64::new(1 << 40) })).unwrap();
        let err = dev.malloc(16, id(1)).unwrap_err();
        assert!(err.message().contains("not a free block"), "{err}");
        assert!(!dev.is_live(1 << 40, 16));
    }

    #[test]
    fn a_backend_with_no_cores_is_refused() {
        struct NoCores {
            sim: SimChip,
        }
        impl ChipBackend for NoCores {
            fn cores(&self) -> usize {
                0
            }
            fn host_memory(&self) -> Option<&DeviceMemory> {
                self.sim.host_memory()
            }
        }
        let err = Device::new(0, Box::new(NoCores { sim: SimChip::new(4096, 1).unwrap() })).unwrap_err();
        assert!(err.message().contains("cores"), "{err}");
    }

    #[test]
    fn view_copies_check_layout_and_bounds() {
        use crate::data::buffer::Access;
        use crate::data::dtype::DataType;
        use crate::sys::mem::as_bytes_mut;
        let dev = Device::new(0, Box::new(SimChip::new(4096, 1).unwrap())).unwrap();
        let mut host = vec![0f32; 8];
        let view = TensorView::new(0, &[8], None, DataType::Float32).unwrap();
        let m = MappedTensor::from_slice(as_bytes_mut(&mut host), view, Access::Read).unwrap();
        let small = dev.malloc(16, id(1)).unwrap();
        let err = dev.copy_in(&m, small, &view).unwrap_err();
        assert!(err.message().contains("does not lie inside one live allocation"), "{err}");
        let p = dev.malloc(32, id(2)).unwrap();
        let other = TensorView::new(0, &[4, 2], None, DataType::Float32).unwrap();
        assert!(dev.copy_in(&m, p, &other).unwrap_err().message().contains("differ"));
        dev.copy_in(&m, p, &view).unwrap();
        dev.free(p).unwrap();
        assert!(dev.copy_in(&m, p, &view).is_err(), "a freed block takes no copy");
    }
}
