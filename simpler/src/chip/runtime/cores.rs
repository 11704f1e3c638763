//! The chip's cores: one thread each, an [`Endpoint`] of the chip engine that runs the kernels
//! dispatched to it and rings the engine's doorbell when one ends.

use super::*;

/// What every core endpoint of a chip shares.
pub(super) struct CoreShared {
    pub(super) chip: u32,
    pub(super) device: Arc<Device>,
    pub(super) registry: SharedRegistry,
}

impl CoreShared {
    /// The device pointer of tensor `i`'s buffer, after checking it may be used on this chip.
    pub(super) fn resolve(&self, i: usize, t: &Tensor) -> std::result::Result<u64, String> {
        let desc = t.desc();
        let n = desc.nbytes();
        match desc.backing() {
            Backing::Device { ptr, chip } => {
                if chip != self.chip {
                    return Err(format!(
                        "tensor {i} is device memory of chip {chip}, not of chip {}",
                        self.chip
                    ));
                }
                if !self.device.usable_by_kernels(ptr, n, desc.identity()) {
                    return Err(format!(
                        "tensor {i}: device buffer {} at {ptr:#x} (+{n} bytes) is not a live allocation of chip {chip}",
                        desc.identity()
                    ));
                }
                Ok(ptr)
            }
            Backing::HeapSlab { addr, .. } => Err(format!(
                "tensor {i} is host memory (a heap slab at {addr:#x}); kernels on a chip's cores use device memory only"
            )),
            Backing::Memfd { .. } => Err(format!(
                "tensor {i} is host memory (a host buffer, {}); kernels on a chip's cores use device memory only",
                desc.identity()
            )),
        }
    }
}

/// One kernel for a core thread: the kernel, its tensors and its scalars.
struct CoreJob {
    kernel: KernelRef,
    tensors: Vec<DeviceTensor>,
    scalars: Vec<u64>,
}

/// One core: runs the kernels the chip engine dispatches to it on its own thread and rings the
/// engine doorbell when one ends.
pub(super) struct CoreEndpoint {
    core: u32,
    shared: Arc<CoreShared>,
    tx: Option<mpsc::Sender<CoreJob>>,
    rx: mpsc::Receiver<Outcome>,
    handle: Option<thread::JoinHandle<()>>,
    /// The CPU (plus one) the thread last ran a kernel on; 0 when unknown.
    cpu: Arc<AtomicU32>,
}

impl CoreEndpoint {
    pub(super) fn spawn(core: u32, shared: Arc<CoreShared>, bell: Arc<Doorbell>) -> Result<CoreEndpoint> {
        let (tx, jobs) = mpsc::channel::<CoreJob>();
        let (done_tx, rx) = mpsc::channel();
        let cpu = Arc::new(AtomicU32::new(0));
        let cpu_w = cpu.clone();
        let device = shared.device.clone();
        let handle = thread::Builder::new()
            .name(format!("chip{}-core{core}", shared.chip))
            .spawn(move || {
                for job in jobs {
                    cpu_w.store(crate::sys::futex::current_cpu(), Ordering::Relaxed);
                    let out = match device.launch(job.kernel.def(), core, &job.tensors, &job.scalars) {
                        Ok(()) => Outcome::Success,
                        Err(e) => Outcome::TaskFailure(e.message().to_string()),
                    };
                    if done_tx.send(out).is_err() {
                        break;
                    }
                    bell.ring();
                }
            })
            .map_err(|e| Error::os(&format!("starting the thread of core {core}"), e))?;
        Ok(CoreEndpoint { core, shared, tx: Some(tx), rx, handle: Some(handle), cpu })
    }

    pub(super) fn kernel_of(&self, callable: &CallableHandle) -> Result<KernelRef> {
        let reg = sync::read(&self.shared.registry);
        match reg.get(&callable.digest()).map(|f| (f.body(), f)) {
            Some((ChipBody::Kernel(_), f)) => Ok(f.kernel_ref().expect("a kernel")),
            Some((ChipBody::Orchestration(_), _)) => {
                Err(Error::invalid(format!("{callable} is a chip orchestration; only kernels run on a core")))
            }
            None => Err(Error::new(
                ErrorKind::Callable,
                format!("UNKNOWN_CALLABLE: {callable} is not registered on chip {}", self.shared.chip),
            )),
        }
    }
}

impl Endpoint for CoreEndpoint {
    fn start(&mut self, d: &Dispatch<'_>) -> Result<()> {
        let kernel = self.kernel_of(d.callable)?;
        let mut tensors = Vec::with_capacity(d.args.tensors.len());
        for (i, (t, tag)) in d.args.tensors.iter().zip(&d.args.tags).enumerate() {
            let base = self.shared.resolve(i, t).map_err(Error::invalid)?;
            tensors.push(DeviceTensor::new(base, *t.view(), tag.access()));
        }
        let job = CoreJob { kernel, tensors, scalars: d.args.scalars.to_vec() };
        let sent = self.tx.as_ref().is_some_and(|tx| tx.send(job).is_ok());
        if !sent {
            return Err(Error::state(format!("core {} of chip {} has stopped", self.core, self.shared.chip)));
        }
        Ok(())
    }

    fn poll(&mut self) -> Option<Outcome> {
        match self.rx.try_recv() {
            Ok(out) => Some(out),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(Outcome::EndpointFailure(format!(
                "core {} of chip {} has stopped",
                self.core, self.shared.chip
            ))),
        }
    }

    fn shutdown(&mut self) {
        self.tx = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }

    fn peer_cpu(&self) -> Option<u32> {
        match self.cpu.load(Ordering::Relaxed) {
            0 => None,
            c => Some(c),
        }
    }
}

impl Drop for CoreEndpoint {
    fn drop(&mut self) {
        self.shutdown();
    }
}
