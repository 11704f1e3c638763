//! Hidden support for the benchmarks in `benches/` that measure a piece of the library with
//! nothing around it, which the public API cannot reach:
//!
//! * [`mailbox_pingpong`] (`pingpong`): a bare mailbox round trip with a forked child, the
//!   floor under every SUB task;
//! * [`orchestrator_submit`] and [`type_sizes`] (`submit`): the Orchestrator on an in-process
//!   engine with no-op endpoints, no process and no thread;
//! * [`chip_pipeline`] (`chip_pipeline`): the chip runtime's lifecycle without its process.
//!
//! Each drives the same internal calls the library makes (the mailbox endpoint's posting and
//! collecting, the Worker's engine with a doorbell of its own, the chip server's leases and
//! launches), so no production function lives on for a benchmark alone. Everything else a
//! benchmark needs goes through the public API or lives in `benches/`.
//!
//! Not part of the public API: nothing here is stable, and nothing here is used by the library
//! itself.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::wait::WaitStatus;

use crate::callable::host::HostFnPtr;
use crate::callable::identity::{CallableHandle, CallableKind, Digest};
use crate::data::buffer::IdentityMinter;
use crate::data::buffer::{Access, Backing, BufferDesc, Identity};
use crate::data::dtype::DataType;
use crate::data::task_args::TaskArgs;
use crate::data::tensor::{Tensor, TensorView};
use crate::engine::endpoint::{Dispatch, Endpoint, Outcome};
use crate::engine::heap::HostRings;
use crate::engine::scheduler::{Lane, LaneKind};
use crate::engine::{Bell, Engine, EngineConfig, LevelParts, NoDevices};
use crate::error::{Error, ErrorKind, Result};
use crate::ipc::mailbox::{InitStatus, Mailbox, MailboxRegion, Posting};
use crate::sys::futex::Doorbell;
use crate::sys::process::ChildGuard;

/// How long any single wait of these benchmarks may take before it counts as a hang.
const HANG: Duration = Duration::from_secs(10);

/// Asks the ping-pong child to leave through its mailbox and reaps it (it exits at its next
/// wake-up). On any other path the guard kills and reaps it.
fn shut_down(mut child: ChildGuard, mb: Mailbox<'_>) -> Result<()> {
    mb.request_shutdown();
    match child.wait()? {
        WaitStatus::Exited(_, 0) => Ok(()),
        other => Err(Error::new(ErrorKind::WorkerDied, format!("ping-pong child ended: {other:?}"))),
    }
}

/// The child side of the ping-pong: serve every task frame at once with success, sleeping on the
/// child doorbell in between (spin, yield, futex), until shutdown.
fn pong(region: &MailboxRegion) -> i32 {
    let mb = region.mailbox(0);
    mb.set_child_pid(std::process::id());
    mb.publish_init(Ok(()));
    let bell = mb.child_doorbell();
    loop {
        let seen = bell.seq();
        if mb.shutdown_requested() {
            return 0;
        }
        if let Some(req) = mb.task_request() {
            mb.finish_task(req, Ok(()), region.doorbell());
            continue;
        }
        bell.wait(seen, None);
    }
}

/// What [`mailbox_pingpong`] measured.
#[derive(Debug, Clone)]
pub struct PingPong<T> {
    /// One duration per timed round trip.
    pub times: Vec<Duration>,
    /// What the caller's `after` saw right after the timed round trips.
    pub after: T,
}

/// Bare mailbox ping-pong between this process and one forked child: the floor under every
/// SUB task.
///
/// Each round trip posts an empty task frame as the SUB endpoint does (`post_task_at` frame 0,
/// which rings the child doorbell), the child takes it (`task_request`) and answers
/// (`finish_task`, which rings the parent doorbell), and the parent collects it
/// (`take_task_result_at`), waiting on the parent doorbell with the mailbox's own wait (spin,
/// yield, futex). `warmup` untimed round trips come first; before each timed one the parent
/// sleeps `pause` (outside the timed region; zero for back to back). Right after the timed
/// round trips, `after` is given the child's pid (to see where it ran, while it still runs).
///
/// Forks: call it before this process starts any other thread. The child leaves with `_exit`;
/// it is shut down and reaped before this returns, and killed and reaped if this panics.
pub fn mailbox_pingpong<T>(
    warmup: usize,
    iterations: usize,
    pause: Duration,
    after: impl FnOnce(i32) -> T,
) -> Result<PingPong<T>> {
    let region = MailboxRegion::new(1)?;
    let child = ChildGuard::fork(|| pong(&region))?;
    let mb = region.mailbox(0);
    match mb.wait_init(Instant::now() + HANG, || false) {
        InitStatus::Ready => {}
        other => {
            return Err(Error::new(
                ErrorKind::WorkerDied,
                format!("ping-pong child did not start: {other:?}"),
            ));
        }
    }
    let parent = region.doorbell();
    let digest = [0u8; 32];
    let round_trip = || -> Result<Duration> {
        let start = Instant::now();
        mb.post_task_at(0, &digest, &Posting::default(), |_, _| Ok(0))?;
        let deadline = start + HANG;
        loop {
            let seen = parent.seq();
            if let Some(result) = mb.take_task_result_at(0) {
                result.map_err(|e| Error::new(ErrorKind::TaskFailed, e.message))?;
                return Ok(start.elapsed());
            }
            if Instant::now() >= deadline {
                return Err(Error::new(ErrorKind::Timeout, "ping-pong: no answer within 10 s"));
            }
            parent.wait(seen, Some(deadline));
        }
    };
    for _ in 0..warmup {
        round_trip()?;
    }
    let mut times = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
        times.push(round_trip()?);
    }
    let after = after(child.pid().as_raw());
    shut_down(child, mb)?;
    Ok(PingPong { times, after })
}

/// The engine doorbell of an in-process engine: on the heap, rung by nobody but the engine.
struct LocalBell(Doorbell);

impl AsRef<Doorbell> for LocalBell {
    fn as_ref(&self) -> &Doorbell {
        &self.0
    }
}

/// A no-op endpoint: it does nothing with a task and reports success at the first poll after
/// `release` is set. Holding completions until the submit loop ends keeps the measured loop to
/// the Orchestrator's own work (completions are measured separately, in the drain).
struct InstantEndpoint {
    running: bool,
    release: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Endpoint for InstantEndpoint {
    fn start(&mut self, _dispatch: &Dispatch<'_>) -> Result<()> {
        self.running = true;
        Ok(())
    }

    fn poll(&mut self) -> Option<Outcome> {
        if !self.release.load(Ordering::Acquire) {
            return None;
        }
        std::mem::take(&mut self.running).then_some(Outcome::Success)
    }
}

/// One repetition of [`orchestrator_submit`].
#[derive(Debug, Clone, Copy)]
pub struct SubmitTiming {
    /// Tasks submitted.
    pub tasks: usize,
    /// Time of the submit loop alone.
    pub submit: Duration,
    /// Time of the submit loop plus closing the run and draining it to completion.
    pub total: Duration,
}

/// Orchestrator submit throughput on an in-process engine with `lanes` no-op endpoints (no
/// processes, no threads). The endpoints hold every task until the submit loop ends, so the
/// loop measures the Orchestrator (validation, slots, TensorMap, scopes, routing); the drain
/// that follows completes everything and is in `total`.
///
/// Each of the `tasks` independent tasks names two Input tensors and one Output tensor over
/// buffers of its own (three distinct buffer identities per task), so every submit does two
/// TensorMap lookups and one insert on distinct keys. The TaskArgs are built before the clock
/// starts; the timed loop is `submit_sub` alone. The task window holds every task, so
/// back-pressure never waits. Runs `reps` repetitions, each a fresh run on one engine.
pub fn orchestrator_submit(tasks: usize, lanes: u32, reps: usize) -> Result<Vec<SubmitTiming>> {
    let nonce = 0x5eed_0000_0000_0001u64;
    let cfg = EngineConfig {
        task_window: tasks + 16,
        heap_ring_size: 0,
        sub_workers: lanes as usize,
        ..EngineConfig::default()
    };
    let parts = LevelParts {
        minter: std::sync::Arc::new(IdentityMinter::new(nonce)),
        heap: std::sync::Arc::new(HostRings::new(cfg.heap_ring_size)?),
        devices: std::sync::Arc::new(NoDevices),
    };
    let engine = Engine::new(cfg, Bell::Shared(std::sync::Arc::new(LocalBell(Doorbell::new()))), parts)?;
    let release = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    engine.attach_lanes(
        (0..lanes)
            .map(|i| {
                let ep = InstantEndpoint { running: false, release: release.clone() };
                Lane::named(LaneKind::Sub(i), Box::new(ep), format!("sub worker {i}"))
            })
            .collect(),
    );
    let digest = Digest::of(b"simpler bench: no-op host function");
    engine.callables().write().insert(digest, CallableKind::HostFn.into());
    let noop = CallableHandle::new(digest, CallableKind::HostFn, "bench_noop");

    // Fake buffers: nothing dereferences them (the endpoints never look at the arguments).
    const NBYTES: u64 = 4096;
    let view = TensorView::new(0, &[1024], None, DataType::Float32)?;
    let next_id = AtomicU32::new(1);
    let tensor = || -> Result<Tensor> {
        let id = u64::from(next_id.fetch_add(1, Ordering::Relaxed));
        let desc = BufferDesc::new(
            // Another owner than the engine's: these stand for buffers made elsewhere (an
            // engine checks that its own `orch.alloc` buffers are still live).
            Identity::new(nonce ^ 1, id, 1)?,
            Backing::HeapSlab { addr: 0x10_0000_0000 + id * NBYTES, ino: 1 },
            Access::ReadWrite,
            NBYTES,
        )?;
        Tensor::from_desc(desc, view)
    };
    let mut all = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        let (a, b, c) = (tensor()?, tensor()?, tensor()?);
        let mut args = TaskArgs::new();
        args.input(&a)?.input(&b)?.output(&c)?;
        all.push(args);
    }

    let mut out = Vec::with_capacity(reps);
    for _ in 0..reps {
        let batch = all.clone();
        release.store(false, Ordering::Release);
        let mut start = Instant::now();
        let mut submit = Duration::ZERO;
        let built = engine
            .build_run(false, None, false, |orch| {
                start = Instant::now();
                for args in batch {
                    orch.submit_sub(&noop, args)?;
                }
                submit = start.elapsed();
                release.store(true, Ordering::Release);
                Ok(())
            })
            .map_err(crate::engine::BuildFailed::into_error)?;
        let run = built.run;
        if !engine.drive_until(|| run.is_done(), Some(Instant::now() + HANG)) {
            return Err(Error::new(ErrorKind::Timeout, "submit benchmark: the run did not drain in 10 s"));
        }
        let total = start.elapsed();
        run.result()?;
        out.push(SubmitTiming { tasks, submit, total });
    }
    engine.shutdown_lanes();
    Ok(out)
}

/// Sizes in bytes of the structures a submit creates or copies (for the benchmark's notes).
pub fn type_sizes() -> Vec<(&'static str, usize)> {
    vec![
        ("Slot", size_of::<crate::engine::slot::Slot>()),
        ("TaskData", size_of::<crate::engine::slot::TaskData>()),
        ("TaskArgs", size_of::<TaskArgs>()),
        ("Tensor", size_of::<Tensor>()),
        ("BufferDesc", size_of::<BufferDesc>()),
        ("CallConfig", size_of::<crate::data::call_config::CallConfig>()),
    ]
}

/// What [`chip_pipeline`] measured.
#[derive(Debug, Clone)]
pub struct ChipPipelineRuns {
    /// Wall time of all the runs, first prepare to last finalize.
    pub wall: Duration,
    /// Device allocations the first run made (growing the staging buffers).
    pub first_run_allocations: u64,
    /// Device allocations of every run after the first two (the steady state), in total.
    pub steady_allocations: u64,
    /// Runs in the steady state (after the first two).
    pub steady_runs: usize,
    /// Whether every run's output came back the same, and not all zeros.
    pub outputs_checked: bool,
    /// Mean time of a prepare (the copy-in) after the first two runs.
    pub prepare: Duration,
    /// Mean time from a launch to its run being done, after the first two runs (at depth 1:
    /// the kernel's time plus the hand-offs to and from the executor thread).
    pub execute: Duration,
}

/// Runs `runs` chip runs of `kernel` on an in-process simulated chip (2 cores) through the
/// L2 lifecycle at pipeline depth `depth` (1 or 2): each run copies in `input_bytes` of f32
/// (tensor 0), runs the kernel with the scalars `passes` and `every`, and copies back
/// `output_bytes` (tensor 1). At depth 1 every run is prepared, launched, waited for and
/// finalized before the next; at depth 2 the next run is prepared (its copy-in) while the
/// current one's kernel runs, then launched once the current one is finalized. Each run's
/// lease is what the chip server gives a task that comes with none (`local_lease`, avoiding
/// the slot of the run in flight).
pub fn chip_pipeline(
    kernel: HostFnPtr,
    depth: u32,
    runs: usize,
    input_bytes: usize,
    output_bytes: usize,
    (passes, every): (u64, u64),
) -> Result<ChipPipelineRuns> {
    use crate::callable::registry::Registry;
    use crate::chip::{
        BackendFactory, ChipArg, ChipCall, ChipConfig, ChipFn, ChipRuntime, ChipSpec, CopyIn, Trace,
    };
    use crate::data::host_args::MappedTensor;

    if !(1..=2).contains(&depth) || runs == 0 || output_bytes == 0 {
        return Err(Error::invalid("chip_pipeline: depth 1 or 2, at least one run and one output byte"));
    }
    let k = ChipFn::kernel("pipeline_kernel", kernel);
    let digest = k.handle().digest();
    let mut reg = Registry::new(4);
    reg.install(digest, k.descriptor().bytes(), k.clone())?;
    let memory = 4 * (input_bytes + output_bytes) as u64 + (1 << 20);
    let cfg = ChipConfig {
        spec: ChipSpec { chip_id: 0, memory_bytes: memory, cores: 2 },
        backend: BackendFactory::sim(),
    };
    let mut rt = ChipRuntime::new(cfg, reg)?;
    rt.grant_pipeline_depth(depth)?;
    let (n_in, n_out) = (input_bytes / 4, output_bytes / 4);
    // Each run its own host input and output, so the runs in flight borrow disjoint memory.
    let mut inputs: Vec<Vec<f32>> = (0..runs).map(|_| (0..n_in).map(|i| (i % 7) as f32).collect()).collect();
    // Touched before the clock starts (a fresh zeroed vector would fault its pages in during the copy-back).
    let mut outputs: Vec<Vec<f32>> = (0..runs).map(|_| vec![-1.0f32; n_out]).collect();
    let in_view = TensorView::new(0, &[n_in as u32], None, DataType::Float32)?;
    let out_view = TensorView::new(0, &[n_out as u32], None, DataType::Float32)?;
    let scalars = [passes, every];
    let config = crate::data::call_config::CallConfig::default();
    fn args_of<'a>(
        input: &'a mut [f32],
        out: &'a mut [f32],
        views: (TensorView, TensorView),
    ) -> Result<Vec<ChipArg<'a>>> {
        Ok(vec![
            ChipArg::Host(MappedTensor::from_slice(
                crate::sys::mem::as_bytes_mut(input),
                views.0,
                Access::Read,
            )?),
            ChipArg::Host(MappedTensor::from_slice(
                crate::sys::mem::as_bytes_mut(out),
                views.1,
                Access::Write,
            )?),
        ])
    }
    let mut allocations = Vec::with_capacity(runs + 1);
    allocations.push(rt.device_allocations());
    let start = Instant::now();
    let mut active: Option<crate::chip::ChipRun<'_>> = None;
    let (mut prepares, mut executes) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for (input, out) in inputs.iter_mut().zip(outputs.iter_mut()) {
        let lease = rt.local_lease(active.as_ref().map(|r| r.lease().slot));
        let p0 = Instant::now();
        let call = ChipCall {
            digest,
            args: args_of(input, out, (in_view, out_view))?,
            scalars: scalars.to_vec(),
            config: config.clone(),
        };
        let mut run = rt.prepare(lease, call, CopyIn::Now)?;
        prepares.push(p0.elapsed());
        if let Some(head) = active.take() {
            executes.push(finish(&mut rt, head)?);
        }
        rt.launch(&mut run, Trace::Off)?;
        allocations.push(rt.device_allocations());
        if depth == 1 {
            executes.push(finish(&mut rt, run)?);
        } else {
            active = Some(run);
        }
    }
    if let Some(head) = active.take() {
        executes.push(finish(&mut rt, head)?);
    }
    let wall = start.elapsed();
    /// Waits for and finalizes `run`; how long the wait took.
    fn finish(rt: &mut ChipRuntime, mut run: crate::chip::ChipRun<'_>) -> Result<Duration> {
        let t = Instant::now();
        rt.wait(&mut run);
        let waited = t.elapsed();
        rt.finalize(run).map(|()| waited)
    }
    let mean = |v: &[Duration]| {
        let tail = &v[v.len().min(2)..];
        if tail.is_empty() { Duration::ZERO } else { tail.iter().sum::<Duration>() / tail.len() as u32 }
    };
    rt.shutdown();
    // Every run had the same input: every output must be the first one, and not all zero.
    let outputs_checked = outputs.iter().all(|o| *o == outputs[0]) && outputs[0].iter().any(|v| *v != 0.0);
    let steady_runs = runs.saturating_sub(2);
    Ok(ChipPipelineRuns {
        wall,
        first_run_allocations: allocations[1] - allocations[0],
        steady_allocations: allocations[runs] - allocations[runs.min(2)],
        steady_runs,
        outputs_checked,
        prepare: mean(&prepares),
        execute: mean(&executes),
    })
}
