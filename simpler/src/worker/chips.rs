//! The chips of an L3 Worker: chip callables and chip-resident memory.

use crate::callable::identity::{CallableHandle, CallableKind};
use crate::chip::ChipFn;
use crate::data::buffer::{Backing, Buffer, Identity};
use crate::data::dtype::DataType;
use crate::data::wire::{DESC_SIZE, encode_desc};
use crate::engine::DeviceRules;
use crate::engine::slot::Target;
use crate::error::{Error, ErrorKind, Result};
use crate::ipc::child::{
    CTRL_COPY_FROM, CTRL_COPY_TO, CTRL_FREE, CTRL_MALLOC, CTRL_REGISTER_CHIP, CTRL_REGISTER_CHIP_ORCH,
};
use crate::sys::sync;
use crate::worker::{Live, Phase, Worker};

impl Worker {
    /// Number of simulated chips (the NEXT_LEVEL workers, ids `0..n`).
    ///
    /// ```
    /// assert_eq!(simpler::Worker::builder().chips(4).build().unwrap().chips(), 4);
    /// ```
    pub fn chips(&self) -> usize {
        self.cfg.engine.next_level_workers
    }

    /// Registers a chip callable (a kernel or a chip orchestration) on every chip.
    ///
    /// Before `init` it goes into the snapshot every chip prepares before reporting ready;
    /// after `init` it is sent to every live chip and this returns once all of them installed
    /// it; if one refuses, the others drop it again and nothing is registered. Above L3 it goes
    /// to every chip of the tree below (nested Workers without chips are skipped).
    ///
    /// The same rules hold before and after `init`: a Worker with no chip (below it) refuses a
    /// chip callable ([`ErrorKind::InvalidArgument`]), and a different function under the
    /// sub-kind and name of a registered one is refused ([`ErrorKind::Callable`]). Submit it with `Orchestrator::submit_next_level` (one chip) or
    /// `submit_next_level_group` (several chips at once).
    ///
    /// ```
    /// use simpler::{ChipFn, HostArgs, HostResult, Worker};
    ///
    /// fn vadd(args: &HostArgs<'_>) -> HostResult {
    ///     let (a, b, out) = (args.input::<f32>(0)?, args.input::<f32>(1)?, args.output::<f32>(2)?);
    ///     for i in 0..out.len() {
    ///         out[i] = a[i] + b[i];
    ///     }
    ///     Ok(())
    /// }
    /// let mut worker = Worker::builder().chips(2).build()?;
    /// let vadd = worker.register_chip(ChipFn::kernel("vadd", vadd))?;
    /// assert_eq!(vadd.kind(), simpler::CallableKind::Chip);
    ///
    /// fn vsub(_: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    /// let err = worker.register_chip(ChipFn::kernel("vadd", vsub)).unwrap_err(); // another fn
    /// assert_eq!(err.kind(), simpler::ErrorKind::Callable);
    /// let mut hosts = Worker::builder().sub_workers(1).build()?; // no chips
    /// let err = hosts.register_chip(ChipFn::kernel("vsub", vsub)).unwrap_err();
    /// assert_eq!(err.kind(), simpler::ErrorKind::InvalidArgument);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn register_chip(&mut self, f: ChipFn) -> Result<CallableHandle> {
        let desc = f.descriptor().clone();
        let digest = desc.digest();
        let handle = CallableHandle::new(digest, CallableKind::Chip, f.name());
        if matches!(self.phase, Phase::Closed) {
            return Err(Error::state("Worker.register_chip: the Worker is closed"));
        }
        self.needs_target(CallableKind::Chip, &handle)?;
        let context = |e: Error| e.context(format!("Worker.register_chip of {handle}"));
        self.chip_registry.check(digest, desc.bytes(), &f).map_err(context)?;
        match &self.phase {
            Phase::Chip(chip) => chip.install(f.clone()).map_err(context)?,
            Phase::Ready(live) => {
                // At L3 the targets are the chips; above, the nested Workers with chips below
                // them, which pass it on to their own chips.
                let addr = f.fn_address();
                let command = if f.is_kernel() { CTRL_REGISTER_CHIP } else { CTRL_REGISTER_CHIP_ORCH };
                live.register_on(
                    &self.targets(live, CallableKind::Chip),
                    |i| self.target_label(i),
                    &digest,
                    |mb| mb.post_control(command, addr, digest.as_bytes(), desc.bytes()),
                )
                .map_err(context)?;
            }
            _ => {}
        }
        self.chip_registry.install(digest, desc.bytes(), f)?;
        self.record(&handle);
        Ok(handle)
    }

    fn chip_mailbox(&self, api: &str, worker: u32) -> Result<(&Live, usize)> {
        let live = self.live(api)?;
        let n = self.chips();
        if worker as usize >= n {
            return Err(Error::invalid(format!(
                "Worker.{api}: worker id {worker} names no chip (this Worker has {n})"
            )));
        }
        Ok((live, self.cfg.engine.sub_workers + worker as usize))
    }

    /// Allocates `shape` elements of `dtype` in the device memory of chip `worker`.
    ///
    /// The buffer lives on that chip: only tasks on that chip may name it (aiming it at another
    /// worker is an error at submit), and it is never copied in or out around a run. Move bytes
    /// with [`copy_to`](Worker::copy_to) / [`copy_from`](Worker::copy_from); release it with
    /// [`free`](Worker::free).
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// use simpler::{DataType, Worker};
    /// let mut worker = Worker::builder().chips(1).build()?;
    /// worker.init()?;
    /// let weights = worker.alloc_child_tensor(0, &[1024], DataType::Float32)?;
    /// let host = worker.create_buffer(4096)?;
    /// host.write(0, &vec![0.5f32; 1024])?;
    /// worker.copy_to(&weights, &host)?; // host -> chip 0
    /// worker.free(&weights)?;
    /// # Ok(()) }
    /// ```
    pub fn alloc_child_tensor(&self, worker: u32, shape: &[u32], dtype: DataType) -> Result<Buffer> {
        if let Phase::Chip(chip) = &self.phase {
            if worker != 0 {
                return Err(Error::invalid(format!(
                    "Worker.alloc_child_tensor: an L2 Worker is one chip, worker id 0; got {worker}"
                )));
            }
            let view = crate::data::tensor::TensorView::new(0, shape, None, dtype)
                .map_err(|e| e.context("Worker.alloc_child_tensor"))?;
            return chip.malloc(view.extent_bytes());
        }
        let (live, mbox) = self.chip_mailbox("alloc_child_tensor", worker)?;
        let view = crate::data::tensor::TensorView::new(0, shape, None, dtype)
            .map_err(|e| e.context("Worker.alloc_child_tensor"))?;
        let nbytes = view.extent_bytes();
        let ptr = live
            .control(mbox, &format!("chip {worker}"), |mb| {
                mb.post_control(CTRL_MALLOC, nbytes, &[0; 32], &[])
            })
            .map_err(|e| {
                Error::new(e.kind(), format!("Worker.alloc_child_tensor on chip {worker}: {}", e.message()))
            })?;
        let identity = live.minter.mint()?;
        sync::lock(&live.devices.live).insert(identity);
        Buffer::device(identity, worker, ptr, nbytes)
    }

    fn device_of(&self, api: &str, buf: &Buffer) -> Result<(u32, u64)> {
        match buf.desc().backing() {
            Backing::Device { ptr, chip } => {
                if buf.is_freed() {
                    return Err(Error::state(format!(
                        "Worker.{api}: device buffer {} of chip {chip} was already freed",
                        buf.desc().identity()
                    )));
                }
                Ok((chip, ptr))
            }
            _ => Err(Error::invalid(format!(
                "Worker.{api}: buffer {} is host memory, not chip memory from alloc_child_tensor",
                buf.desc().identity()
            ))),
        }
    }

    fn host_payload(api: &str, host: &Buffer, nbytes: u64) -> Result<Vec<u8>> {
        if matches!(host.desc().backing(), Backing::Device { .. }) {
            return Err(Error::invalid(format!(
                "Worker.{api}: the host side must be a host buffer (create_buffer)"
            )));
        }
        if (host.nbytes() as u64) < nbytes {
            return Err(Error::invalid(format!(
                "Worker.{api}: the host buffer has {} bytes but the device buffer has {nbytes}",
                host.nbytes()
            )));
        }
        let mut d = [0u8; DESC_SIZE];
        encode_desc(host.desc(), &mut d);
        let mut payload = d.to_vec();
        payload.extend_from_slice(&0u64.to_le_bytes());
        payload.extend_from_slice(&nbytes.to_le_bytes());
        Ok(payload)
    }

    /// Copies the device buffer's size in bytes from host buffer `src` into device buffer `dst`.
    ///
    /// ```no_run
    /// # fn demo(worker: &simpler::Worker, dev: &simpler::Buffer, host: &simpler::Buffer) -> simpler::Result<()> {
    /// worker.copy_to(dev, host)?;
    /// # Ok(()) }
    /// ```
    pub fn copy_to(&self, dst: &Buffer, src: &Buffer) -> Result<()> {
        let (chip, ptr) = self.device_of("copy_to", dst)?;
        if let Phase::Chip(l2) = &self.phase {
            Self::host_payload("copy_to", src, dst.desc().nbytes())?;
            return l2.copy_to(ptr, src, dst.desc().nbytes());
        }
        let payload = Self::host_payload("copy_to", src, dst.desc().nbytes())?;
        let (live, mbox) = self.chip_mailbox("copy_to", chip)?;
        live.control(mbox, &format!("chip {chip}"), |mb| {
            mb.post_control(CTRL_COPY_TO, ptr, &[0; 32], &payload)
        })
        .map(|_| ())
        .map_err(|e| Error::new(e.kind(), format!("Worker.copy_to: {}", e.message())))
    }

    /// Copies device buffer `src` (its whole size) into host buffer `dst`.
    ///
    /// ```no_run
    /// # fn demo(worker: &simpler::Worker, dev: &simpler::Buffer, host: &simpler::Buffer) -> simpler::Result<()> {
    /// worker.copy_from(host, dev)?;
    /// let values = host.read::<f32>(0, 4)?;
    /// # Ok(()) }
    /// ```
    pub fn copy_from(&self, dst: &Buffer, src: &Buffer) -> Result<()> {
        let (chip, ptr) = self.device_of("copy_from", src)?;
        if let Phase::Chip(l2) = &self.phase {
            Self::host_payload("copy_from", dst, src.desc().nbytes())?;
            return l2.copy_from(dst, ptr, src.desc().nbytes());
        }
        let payload = Self::host_payload("copy_from", dst, src.desc().nbytes())?;
        let (live, mbox) = self.chip_mailbox("copy_from", chip)?;
        live.control(mbox, &format!("chip {chip}"), |mb| {
            mb.post_control(CTRL_COPY_FROM, ptr, &[0; 32], &payload)
        })
        .map(|_| ())
        .map_err(|e| Error::new(e.kind(), format!("Worker.copy_from: {}", e.message())))
    }

    /// Frees device memory from [`alloc_child_tensor`](Worker::alloc_child_tensor). Freeing
    /// twice, or freeing while a run is in flight, is an error; tasks submitted afterwards that
    /// name the buffer are refused at submit.
    ///
    /// ```no_run
    /// # fn demo(worker: &simpler::Worker, dev: &simpler::Buffer) -> simpler::Result<()> {
    /// worker.free(dev)?;
    /// assert!(worker.free(dev).is_err()); // already freed
    /// # Ok(()) }
    /// ```
    pub fn free(&self, buf: &Buffer) -> Result<()> {
        let (chip, ptr) = self.device_of("free", buf)?;
        if let Phase::Chip(l2) = &self.phase {
            if !buf.mark_freed() {
                return Err(Error::state(format!(
                    "Worker.free: device buffer {} was already freed",
                    buf.desc().identity()
                )));
            }
            return l2.free(buf, ptr);
        }
        let (live, mbox) = self.chip_mailbox("free", chip)?;
        let in_flight = live.engine.live_runs().len();
        if in_flight > 0 {
            return Err(Error::state(format!(
                "Worker.free: {in_flight} run(s) are in flight and may use the buffer; wait for them first"
            )));
        }
        if !buf.mark_freed() {
            return Err(Error::new(
                ErrorKind::InvalidState,
                format!("Worker.free: device buffer {} was already freed", buf.desc().identity()),
            ));
        }
        sync::lock(&live.devices.live).remove(&buf.desc().identity());
        live.control(mbox, &format!("chip {chip}"), |mb| mb.post_control(CTRL_FREE, ptr, &[0; 32], &[]))
            .map(|_| ())
            .map_err(|e| Error::new(e.kind(), format!("Worker.free: {}", e.message())))
    }
}

/// The device buffers an L3 Worker allocated on its chips and has not freed, and the rule its
/// engine checks device tensors by at submit: device memory goes only to a task on its own
/// chip (never to a SUB task), and only while it is allocated.
#[derive(Default)]
pub(crate) struct ChipBuffers {
    live: std::sync::Mutex<std::collections::HashSet<Identity>>,
}

impl DeviceRules for ChipBuffers {
    fn check(
        &self,
        callable: &CallableHandle,
        i: usize,
        chip: u32,
        id: Identity,
        target: &Target,
        member: usize,
    ) -> Result<()> {
        match target {
            Target::Sub => {
                return Err(Error::invalid(format!(
                    "{callable}: tensor {i} is device memory of chip {chip}; SUB tasks run on the host and cannot use it"
                )));
            }
            Target::NextLevel(ws) if ws[member] != chip => {
                return Err(Error::invalid(format!(
                    "{callable}: tensor {i} lives on chip {chip} but this task runs on chip {}; device memory is usable only by its own chip",
                    ws[member]
                )));
            }
            Target::NextLevel(_) => {}
        }
        if !sync::lock(&self.live).contains(&id) {
            return Err(Error::invalid(format!(
                "{callable}: tensor {i} names device buffer {id} of chip {chip}, which was freed (or never allocated by this Worker)"
            )));
        }
        Ok(())
    }
}
