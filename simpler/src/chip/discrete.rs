//! A simulated chip whose memory the host cannot read ([`DiscreteSim`]): the check that a
//! program, and the runtime under it, reach device memory only through [`ChipBackend`]'s
//! copies, as they must for a discrete device (OpenCL, CUDA).
//!
//! Device bytes are stored scrambled (each byte XORed with [`DiscreteSim::SCRAMBLE`]), at
//! device pointers that are not offsets of any memory of this process (they start at
//! [`DiscreteSim::BASE`]), and [`ChipBackend::host_memory`] is `None`, so the runtime takes the
//! paths of a real device: no kernel gate, no fences, copies through the trait. Anything that
//! read device bytes without the backend's copies would read scrambled ones, and a result that
//! came back without `copy_from_device` would be wrong.
//!
//! A launch runs the kernel's native (Rust) body the way a device runs a kernel in memory the
//! host does not see: it decodes every tensor's bytes into a fresh scratch [`DeviceMemory`] of
//! its own (one block per device buffer, so views of one buffer keep their layout), runs the
//! kernel there, and encodes back only the elements of the tensors it may write (a strided
//! view's gaps belong to other tasks). Kernels on different cores each have their own
//! scratch, so they run concurrently, as on [`SimChip`](crate::chip::SimChip).

use crate::chip::backend::{
    ChipBackend, ChipSpec, Completion, DeviceTensor, KernelDef, KernelLaunch, check_cores,
};
use crate::chip::sim::{DeviceMemory, run_native};
use crate::error::{Error, Result};

/// A simulated chip that behaves like a discrete device: its memory is not readable by the
/// host (bytes stored scrambled, pointers that are no host offsets, no
/// [`host_memory`](ChipBackend::host_memory)), so every byte moves through the backend's
/// copies. Kernels are native (Rust) ones, as on [`SimChip`](crate::chip::SimChip).
///
/// Run a program on it (`WorkerBuilder::chip_backend(DiscreteSim::backend)`) to check that it
/// would work on a real device before you have one: a result that reached the host any other
/// way than the runtime's copies would come back scrambled.
///
/// ```
/// use simpler::{chip::ChipBackend, chip::DiscreteSim, chip::DeviceMemory};
///
/// let chip = DiscreteSim::new(1 << 20, 2)?;
/// assert!(chip.host_memory().is_none()); // nothing of it is host memory
/// let p = chip.malloc(4)?;
/// assert!(p >= DiscreteSim::BASE);
/// chip.copy_to_device(p, &[1, 2, 3, 4])?;
/// let mut back = [0u8; 4];
/// chip.copy_from_device(p, &mut back)?;
/// assert_eq!(back, [1, 2, 3, 4]);
/// # Ok::<(), simpler::Error>(())
/// ```
#[derive(Debug)]
pub struct DiscreteSim {
    /// The scrambled bytes, at `ptr - BASE`.
    store: DeviceMemory,
    cores: usize,
}

impl DiscreteSim {
    /// Where its device pointers start: pointer `BASE + k` is byte `k` of its store, so no
    /// pointer is an offset of memory the host could read.
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::DiscreteSim};
    /// let chip = DiscreteSim::new(4096, 1)?;
    /// assert_eq!(chip.malloc(64)?, DiscreteSim::BASE);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub const BASE: u64 = 0x5a00_0000_0000_0000;

    /// What each stored byte is XORed with.
    ///
    /// ```
    /// assert_eq!(simpler::chip::DiscreteSim::SCRAMBLE, 0xa5);
    /// ```
    pub const SCRAMBLE: u8 = 0xa5;

    /// The alignment it asks staged tensors for (a device's, not the simulator's 64 bytes).
    const ALIGN: u64 = 256;

    /// A chip with `memory_bytes` of device memory (backed on first touch) and `cores` cores.
    ///
    /// # Errors
    ///
    /// As [`SimChip::new`](crate::chip::SimChip::new): zero memory, zero cores or more than
    /// 1024 cores.
    ///
    /// ```
    /// use simpler::{chip::ChipBackend, chip::DiscreteSim};
    /// let chip = DiscreteSim::new(64 << 20, 4)?;
    /// assert_eq!((chip.memory_size(), chip.cores(), chip.alignment()), (64 << 20, 4, 256));
    /// assert!(DiscreteSim::new(4096, 0).is_err());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn new(memory_bytes: u64, cores: usize) -> Result<DiscreteSim> {
        check_cores(cores)?;
        Ok(DiscreteSim { store: DeviceMemory::new(memory_bytes)?, cores })
    }

    /// A factory for [`WorkerBuilder::chip_backend`](crate::WorkerBuilder::chip_backend):
    /// every chip of the Worker is a `DiscreteSim` of the builder's `chip_memory` and
    /// `chip_cores`.
    ///
    /// ```
    /// use simpler::{chip::ChipFn, chip::DiscreteSim, DataType, HostArgs, HostResult, TaskArgs, Worker, status::Level};
    ///
    /// fn double(args: &HostArgs<'_>) -> HostResult {
    ///     args.output::<f32>(0)?.iter_mut().for_each(|v| *v *= 2.0);
    ///     Ok(())
    /// }
    /// let mut chip = Worker::builder().level(Level::Chip).chip_backend(DiscreteSim::backend).build()?;
    /// let k = chip.register_chip(ChipFn::kernel("double", double))?;
    /// chip.init()?;
    /// let x = chip.create_buffer(16)?;
    /// x.write(0, &[1.0f32, 2.0, 3.0, 4.0])?;
    /// let mut args = TaskArgs::new();
    /// args.inout(&x.tensor(&[4], DataType::Float32)?)?;
    /// chip.run_callable(&k, args, Default::default())?;
    /// assert_eq!(x.read::<f32>(0, 4)?, [2.0, 4.0, 6.0, 8.0]);
    /// # chip.close()?;
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn backend(spec: &ChipSpec) -> Result<Box<dyn ChipBackend>> {
        Ok(Box::new(DiscreteSim::new(spec.memory_bytes(), spec.cores())?))
    }

    /// The store offset of device pointer `ptr`, or the error naming what was passed.
    fn offset(&self, what: &str, ptr: u64) -> Result<u64> {
        ptr.checked_sub(Self::BASE).filter(|&o| o < self.store.size()).ok_or_else(|| {
            Error::invalid(format!("{what}: {ptr:#x} is not a device pointer of this DiscreteSim"))
        })
    }
}

/// `bytes` XORed with the scramble byte, in place (its own inverse).
fn scramble(bytes: &mut [u8]) {
    const WORD: u64 = u64::from_ne_bytes([DiscreteSim::SCRAMBLE; 8]);
    let mut words = bytes.chunks_exact_mut(8);
    for w in &mut words {
        let x = u64::from_ne_bytes((&*w).try_into().expect("8 bytes")) ^ WORD;
        w.copy_from_slice(&x.to_ne_bytes());
    }
    words.into_remainder().iter_mut().for_each(|b| *b ^= DiscreteSim::SCRAMBLE);
}

/// The scratch blocks of one launch: one per distinct device buffer among its tensors.
struct Group {
    /// The buffer's device pointer (the tensors' `ptr`).
    ptr: u64,
    /// The byte range of the buffer its tensors touch, from `ptr`, start rounded down to 64.
    start: u64,
    end: u64,
    /// Where `ptr` lands in the scratch memory.
    scratch: u64,
}

impl ChipBackend for DiscreteSim {
    fn cores(&self) -> usize {
        self.cores
    }

    fn memory_size(&self) -> u64 {
        self.store.size()
    }

    fn alignment(&self) -> u64 {
        Self::ALIGN
    }

    fn malloc(&self, nbytes: u64) -> Result<u64> {
        Ok(Self::BASE + self.store.malloc(nbytes)?)
    }

    fn free(&self, ptr: u64) -> Result<()> {
        self.store.free(self.offset("free", ptr)?)
    }

    fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()> {
        let mut bytes = src.to_vec();
        scramble(&mut bytes);
        self.store.copy_to(self.offset("copy_to_device", dst)?, &bytes)
    }

    fn copy_from_device(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.store.copy_from(self.offset("copy_from_device", src)?, dst)?;
        scramble(dst);
        Ok(())
    }

    fn load_kernel(&self, kernel: &KernelDef<'_>) -> Result<()> {
        kernel.require_native("a DiscreteSim")
    }

    fn launch(&self, launch: KernelLaunch<'_>) -> Result<Completion> {
        launch.kernel.require_native("a DiscreteSim")?;
        // One block per device buffer, covering the bytes its tensors touch.
        let mut groups: Vec<Group> = Vec::new();
        for t in launch.tensors {
            let (start, end) = t.view().byte_range();
            match groups.iter_mut().find(|g| g.ptr == t.ptr()) {
                Some(g) => (g.start, g.end) = (g.start.min(start & !63), g.end.max(end)),
                None => groups.push(Group { ptr: t.ptr(), start: start & !63, end, scratch: 0 }),
            }
        }
        // The scratch memory: a pad first, so that every block lands at or above its start
        // (the kernel's views are `scratch + view offset`), then the blocks, 64-byte aligned.
        let pad = groups.iter().map(|g| g.start).max().unwrap_or(0).max(64);
        let total = pad + groups.iter().map(|g| (g.end - g.start).div_ceil(64) * 64 + 64).sum::<u64>();
        let scratch = DeviceMemory::new(total)?;
        scratch.malloc(pad)?;
        let mut bytes = Vec::new();
        for g in &mut groups {
            let block = scratch.malloc((g.end - g.start).max(1))?;
            g.scratch = block - g.start;
            bytes.resize((g.end - g.start) as usize, 0);
            self.copy_from_device(g.ptr + g.start, &mut bytes)?;
            scratch.copy_to(block, &bytes)?;
        }
        let at = |t: &DeviceTensor| groups.iter().find(|g| g.ptr == t.ptr()).expect("grouped above").scratch;
        let tensors: Vec<DeviceTensor> =
            launch.tensors.iter().map(|t| DeviceTensor::new(at(t), *t.view(), t.access())).collect();
        let ran = run_native(&scratch, KernelLaunch { tensors: &tensors, ..launch });
        // Back to the device: the elements of every tensor the kernel may write, gaps left out.
        for (t, local) in launch.tensors.iter().zip(&tensors) {
            if !t.access().can_write() {
                continue;
            }
            let first = t.view().byte_offset();
            let mut runs = Vec::new();
            t.view().for_each_run(|off, len| runs.push((first + off as u64, len)));
            for (off, len) in runs {
                let mut run = vec![0u8; len];
                scratch.copy_from(local.ptr() + off, &mut run)?;
                self.copy_to_device(t.ptr() + off, &run)?;
            }
        }
        ran
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::buffer::Access;
    use crate::data::dtype::DataType;
    use crate::data::tensor::TensorView;

    #[test]
    fn stored_bytes_are_scrambled_and_pointers_are_not_offsets() {
        let chip = DiscreteSim::new(1 << 16, 1).unwrap();
        let p = chip.malloc(4).unwrap();
        chip.copy_to_device(p, &[0, 1, 2, 3]).unwrap();
        let mut raw = [0u8; 4];
        chip.store.copy_from(p - DiscreteSim::BASE, &mut raw).unwrap();
        assert_eq!(raw, [0xa5, 0xa4, 0xa7, 0xa6]);
        let err = chip.copy_from_device(p - DiscreteSim::BASE, &mut raw).unwrap_err();
        assert!(err.message().contains("not a device pointer"), "{err}");
        assert!(chip.free(1).is_err());
        chip.free(p).unwrap();
    }

    #[test]
    fn a_launch_writes_back_the_elements_of_its_writable_views_only() {
        let chip = DiscreteSim::new(1 << 16, 1).unwrap();
        // An 8-element f32 buffer; the kernel writes elements 1..4 of it through an Output view
        // and reads element 0 through an Input view of the same buffer.
        let p = chip.malloc(32).unwrap();
        let init: Vec<u8> = (0..8u32).flat_map(|i| (i as f32).to_ne_bytes()).collect();
        chip.copy_to_device(p, &init).unwrap();
        fn shift(args: &crate::data::host_args::HostArgs<'_>) -> crate::callable::host::HostResult {
            let first = args.input::<f32>(0)?[0];
            args.output::<f32>(1)?.iter_mut().for_each(|v| *v = first + 100.0);
            Ok(())
        }
        let read =
            DeviceTensor::new(p, TensorView::new(0, &[1], None, DataType::Float32).unwrap(), Access::Read);
        let write =
            DeviceTensor::new(p, TensorView::new(4, &[3], None, DataType::Float32).unwrap(), Access::Write);
        let def = KernelDef {
            name: "shift",
            digest: crate::callable::identity::Digest::of(b"shift"),
            native: Some(shift),
            source: None,
        };
        let tensors = [read, write];
        chip.launch(KernelLaunch { kernel: def, core: 0, tensors: &tensors, scalars: &[] })
            .unwrap()
            .wait()
            .unwrap();
        let mut back = vec![0u8; 32];
        chip.copy_from_device(p, &mut back).unwrap();
        let back: Vec<f32> = back.chunks(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect();
        assert_eq!(back, [0.0, 100.0, 100.0, 100.0, 4.0, 5.0, 6.0, 7.0]);
    }
}
