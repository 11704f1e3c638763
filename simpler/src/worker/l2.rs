//! L2: a Worker that is one chip, run in this process (how one tests a kernel alone).

use std::collections::HashSet;
use std::sync::Mutex;

use crate::callable::identity::{CallableHandle, CallableKind};
use crate::callable::registry::Registry;
use crate::chip::{ChipArg, ChipConfig, ChipFn, ChipRuntime};
use crate::data::buffer::{Backing, Buffer, Identity, IdentityMinter};
use crate::data::call_config::CallConfig;
use crate::data::task_args::TaskArgs;
use crate::error::{Error, ErrorKind, Result};
use crate::ipc::child::HostResolver;
use crate::sys::sync;
use crate::worker::{Phase, Worker};

/// The state of an initialized L2 Worker.
pub(super) struct ChipLive {
    runtime: Mutex<ChipRuntime>,
    resolver: Mutex<HostResolver>,
    /// Device buffers not yet freed.
    live: Mutex<HashSet<Identity>>,
    /// Mints this Worker's buffer identities.
    pub(super) minter: IdentityMinter,
}

impl ChipLive {
    pub(super) fn start(config: ChipConfig, registry: Registry<ChipFn>) -> Result<ChipLive> {
        let runtime = ChipRuntime::new(config, registry)?;
        Ok(ChipLive {
            runtime: Mutex::new(runtime),
            resolver: Mutex::new(HostResolver::new(Vec::new())),
            live: Mutex::new(HashSet::new()),
            minter: IdentityMinter::new(super::random_u64()),
        })
    }

    fn runtime(&self) -> std::sync::MutexGuard<'_, ChipRuntime> {
        sync::lock(&self.runtime)
    }

    pub(super) fn shutdown(&self) {
        self.runtime().shutdown();
    }

    pub(super) fn install(&self, f: ChipFn) -> Result<()> {
        let desc = f.descriptor().clone();
        self.runtime().install(desc.digest(), desc.bytes(), f).map(|_| ())
    }

    pub(super) fn release(&self, digest: &crate::callable::identity::Digest) -> Result<()> {
        self.runtime().release(digest).map(|_| ())
    }

    pub(super) fn malloc(&self, nbytes: u64) -> Result<Buffer> {
        let ptr = self.runtime().malloc(nbytes)?;
        let id = self.minter.mint()?;
        sync::lock(&self.live).insert(id);
        Buffer::device(id, 0, ptr, nbytes)
    }

    pub(super) fn free(&self, buf: &Buffer, ptr: u64) -> Result<()> {
        sync::lock(&self.live).remove(&buf.desc().identity());
        self.runtime().free(ptr)
    }

    pub(super) fn copy_to(&self, ptr: u64, host: &Buffer, nbytes: u64) -> Result<()> {
        let bytes = host.read::<u8>(0, nbytes as usize)?;
        self.runtime().copy_to_device(ptr, &bytes)
    }

    pub(super) fn copy_from(&self, host: &Buffer, ptr: u64, nbytes: u64) -> Result<()> {
        let mut bytes = vec![0u8; nbytes as usize];
        self.runtime().copy_from_device(ptr, &mut bytes)?;
        host.write::<u8>(0, &bytes)
    }

    fn run(&self, callable: &CallableHandle, args: &TaskArgs, config: &CallConfig) -> Result<()> {
        let mut guard = sync::lock(&self.resolver);
        crate::engine::orchestrator::check_tensor_args(callable, args)?;
        // Map every host buffer first, then lend tensors that borrow the mappings.
        for (i, t) in args.tensors.iter().enumerate() {
            if !matches!(t.desc().backing(), Backing::Device { .. }) {
                guard
                    .resolve(t.desc())
                    .map_err(|m| Error::invalid(format!("{callable}: tensor {i}: {m}")))?;
            }
        }
        let resolver = &*guard;
        let mut chip_args = Vec::with_capacity(args.tensor_count());
        for (i, (t, tag)) in args.tensors.iter().zip(&args.tags).enumerate() {
            let access = tag.access();
            match t.desc().backing() {
                Backing::Device { ptr, chip } => {
                    let live = sync::lock(&self.live).contains(&t.desc().identity());
                    if chip != 0 || !live {
                        return Err(Error::invalid(format!(
                            "{callable}: tensor {i} names device memory this chip does not hold (freed, or from another Worker)"
                        )));
                    }
                    chip_args.push(ChipArg::Device {
                        ptr,
                        view: *t.view(),
                        access,
                        identity: t.desc().identity(),
                        nbytes: t.desc().nbytes(),
                    });
                }
                _ => {
                    let tensor = resolver
                        .tensor(t.desc(), *t.view(), access)
                        .map_err(|m| Error::invalid(format!("{callable}: tensor {i}: {m}")))?;
                    chip_args.push(ChipArg::Host(tensor));
                }
            }
        }
        let result = self.runtime().run(&callable.digest(), chip_args, args.scalars(), config);
        guard.trim();
        result
    }
}

impl Worker {
    /// Runs one chip callable (a kernel or a chip orchestration) on an L2 Worker, in this
    /// process, and waits for it: how one tests a kernel alone.
    ///
    /// Host-backed tensors are copied into the chip's device memory before the run (when the
    /// tag reads them) and back after it (when the tag writes them); device buffers from
    /// [`alloc_child_tensor`](Worker::alloc_child_tensor) stay on the chip.
    ///
    /// ```no_run
    /// # fn main() -> simpler::Result<()> {
    /// use simpler::{CallConfig, ChipFn, DataType, HostArgs, HostResult, Level, TaskArgs, Worker};
    ///
    /// fn scale(args: &HostArgs<'_>) -> HostResult {
    ///     for v in args.output::<f32>(0)? {
    ///         *v *= 2.0;
    ///     }
    ///     Ok(())
    /// }
    /// let mut chip = Worker::builder().level(Level::Chip).chip_memory(16 << 20).build()?;
    /// let scale = chip.register_chip(ChipFn::kernel("scale", scale))?;
    /// chip.init()?; // no fork: the chip runs in this process
    /// let x = chip.create_buffer(16)?;
    /// x.write(0, &[1.0f32, 2.0, 3.0, 4.0])?;
    /// let mut args = TaskArgs::new();
    /// args.inout(&x.tensor(&[4], DataType::Float32)?)?;
    /// chip.run_callable(&scale, args, CallConfig::default())?;
    /// assert_eq!(x.read::<f32>(0, 4)?, vec![2.0, 4.0, 6.0, 8.0]);
    /// # Ok(()) }
    /// ```
    pub fn run_callable(&self, callable: &CallableHandle, args: TaskArgs, config: CallConfig) -> Result<()> {
        let Phase::Chip(chip) = &self.phase else {
            return Err(Error::state(match self.phase {
                Phase::New => "Worker.run_callable: the Worker is not initialized; call init() first",
                Phase::Closed => "Worker.run_callable: the Worker is closed",
                _ => {
                    "Worker.run_callable: only an L2 (chip) Worker runs a chip callable directly; submit it from an orchestration function"
                }
            }));
        };
        if callable.kind() != CallableKind::Chip {
            return Err(Error::new(
                ErrorKind::Callable,
                format!(
                    "Worker.run_callable: {callable} is a {} callable, not a chip callable",
                    callable.kind().name()
                ),
            ));
        }
        config.validate()?;
        chip.run(callable, &args, &config)
    }
}
