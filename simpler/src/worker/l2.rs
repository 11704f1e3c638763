//! The L2 runtime: a Worker that is one chip, run in this process (how one tests a kernel
//! alone). Nothing is started and there is no engine: `run_callable` runs one chip callable on
//! the chip and waits for it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::callable::identity::{CallableHandle, CallableKind};
use crate::callable::registry::Registry;
use crate::chip::{ChipArg, ChipCall, ChipConfig, ChipFn, ChipRuntime, ChipSpec};
use crate::data::buffer::{Backing, Buffer, Identity, IdentityMinter};
use crate::data::call_config::CallConfig;
use crate::data::dtype::DataType;
use crate::data::task_args::TaskArgs;
use crate::engine::Engine;
use crate::error::{Error, ErrorKind, Result};
use crate::ipc::child::HostResolver;
use crate::sys::sync;
use crate::worker::builder::Config;
use crate::worker::callables::Callable;
use crate::worker::runtime::Runtime;
use crate::worker::status::WorkerStatus;

/// A started L2 Worker: its chip's runtime, in this process.
pub(super) struct L2Chip {
    runtime: Mutex<ChipRuntime>,
    resolver: Mutex<HostResolver>,
    /// Device buffers not yet freed.
    live: Mutex<HashSet<Identity>>,
    /// Mints this Worker's buffer identities.
    minter: IdentityMinter,
}

impl L2Chip {
    /// Starts the chip of an L2 Worker configured by `cfg`, with the chip callables `registry`.
    pub(super) fn start(cfg: &Config, registry: &Registry<ChipFn>) -> Result<L2Chip> {
        let config = ChipConfig {
            spec: ChipSpec { chip_id: 0, memory_bytes: cfg.chip_memory, cores: cfg.chip_cores },
            backend: cfg.chip_backend,
        };
        let runtime = ChipRuntime::new(config, registry.clone())?;
        Ok(L2Chip {
            runtime: Mutex::new(runtime),
            resolver: Mutex::new(HostResolver::new(Vec::new())),
            live: Mutex::new(HashSet::new()),
            minter: IdentityMinter::new(crate::sys::random::u64()),
        })
    }

    /// Refuses a device buffer another Worker allocated and, when `live`, one already freed.
    fn owned(&self, id: Identity, live: bool) -> Result<()> {
        if id.owner() != self.minter.owner() {
            return Err(Error::invalid(format!(
                "device buffer {id} belongs to another Worker; only the Worker that allocated it may use it"
            )));
        }
        if live && !sync::lock(&self.live).contains(&id) {
            return Err(Error::state(format!("device buffer {id} was already freed")));
        }
        Ok(())
    }

    fn runtime(&self) -> std::sync::MutexGuard<'_, ChipRuntime> {
        sync::lock(&self.runtime)
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
        let call = ChipCall {
            digest: callable.digest(),
            args: chip_args,
            scalars: args.scalars().to_vec(),
            config: config.clone(),
        };
        let result = self.runtime().run(call);
        guard.trim();
        result
    }
}

impl Runtime for L2Chip {
    fn child_pids(&self) -> Vec<i32> {
        Vec::new()
    }

    fn workers(&self) -> Vec<WorkerStatus> {
        Vec::new()
    }

    fn replace(&self, _: usize, _: &crate::worker::callables::Callables) -> Result<i32> {
        Err(Error::invalid("an L2 (chip) Worker runs its chip in this process; it has no worker processes"))
    }

    fn ships_by_address(&self) -> bool {
        false
    }

    fn install(&self, c: &Callable) -> Result<()> {
        // The Worker refuses host and orchestration functions at L2 (no SUB or nested workers).
        let Callable::Chip(f) = c else {
            return Err(Error::invalid(format!(
                "{}: an L2 (chip) Worker runs chip callables only",
                c.handle()
            )));
        };
        let desc = f.descriptor();
        self.runtime().install(desc.digest(), desc.bytes(), f.clone()).map(|_| ())
    }

    fn uninstall(&self, handle: &CallableHandle, _last: bool) -> Result<()> {
        self.runtime().release(&handle.digest()).map(|_| ())
    }

    fn minter(&self) -> Result<&IdentityMinter> {
        Ok(&self.minter)
    }

    fn engine(&self) -> Result<&Arc<Engine>> {
        Err(Error::state("an L2 (chip) Worker runs chip callables in-process; use run_callable"))
    }

    fn run_callable(&self, callable: &CallableHandle, args: TaskArgs, config: CallConfig) -> Result<()> {
        if callable.kind() != CallableKind::Chip {
            return Err(Error::new(
                ErrorKind::Callable,
                format!(
                    "Worker.run_callable: {callable} is {} {} callable, not a chip callable",
                    if callable.kind() == CallableKind::Orch { "an" } else { "a" },
                    callable.kind().name()
                ),
            ));
        }
        config.validate()?;
        self.run(callable, &args, &config)
    }

    fn alloc_device(&self, chip: u32, shape: &[u32], dtype: DataType) -> Result<Buffer> {
        if chip != 0 {
            return Err(Error::invalid(format!("an L2 Worker is one chip, worker id 0; got {chip}")));
        }
        let nbytes = super::device_extent(shape, dtype)?;
        let id = self.minter.mint()?;
        let ptr = self.runtime().malloc(nbytes, id)?;
        sync::lock(&self.live).insert(id);
        Buffer::device(id, 0, ptr, nbytes)
    }

    fn copy_to(&self, _chip: u32, ptr: u64, dev: Identity, src: &Buffer, nbytes: u64) -> Result<()> {
        self.owned(dev, true)?;
        let bytes = src.read::<u8>(0, nbytes as usize)?;
        self.runtime().copy_to_device(ptr, &bytes)
    }

    fn copy_from(&self, dst: &Buffer, _chip: u32, ptr: u64, dev: Identity, nbytes: u64) -> Result<()> {
        self.owned(dev, true)?;
        let mut bytes = vec![0u8; nbytes as usize];
        self.runtime().copy_from_device(ptr, &mut bytes)?;
        dst.write::<u8>(0, &bytes)
    }

    fn free(&self, buf: &Buffer, _chip: u32, ptr: u64) -> Result<()> {
        self.owned(buf.desc().identity(), false)?;
        if !buf.mark_freed() {
            return Err(Error::state(format!("device buffer {} was already freed", buf.desc().identity())));
        }
        sync::lock(&self.live).remove(&buf.desc().identity());
        self.runtime().free(ptr)
    }

    fn close(&self, _timeout: Duration) -> Result<()> {
        self.runtime().shutdown();
        Ok(())
    }
}
