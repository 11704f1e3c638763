//! Hidden support for the benchmarks in `benches/` that need crate internals.
//!
//! Not part of the public API: nothing here is stable, and nothing here is used by the library
//! itself. Each function sets up exactly the internal pieces one benchmark measures.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::wait::WaitStatus;

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
use crate::ipc::mailbox::{InitStatus, Mailbox, MailboxRegion};
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

/// The CPU a process (or, with `"thread-self"`, the calling thread) last ran on: field 39 of
/// `/proc/<pid>/stat`. `None` where `/proc` cannot tell.
pub fn last_cpu(pid: &str) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesized command name start at field 3 (state).
    stat.rsplit_once(')')?.1.split_whitespace().nth(36)?.parse().ok()
}

/// What [`mailbox_pingpong`] measured.
#[derive(Debug, Clone)]
pub struct PingPong {
    /// One duration per timed round trip.
    pub times: Vec<Duration>,
    /// The CPU the parent thread last ran on, read right after the timed round trips.
    pub parent_cpu: Option<u32>,
    /// The CPU the child last ran on, read at the same moment.
    pub child_cpu: Option<u32>,
}

/// Bare mailbox ping-pong between this process and one forked child: the floor under every
/// SUB task.
///
/// Each round trip posts an empty task frame (`post_task`, which rings the child doorbell), the
/// child takes it (`task_request`) and answers (`finish_task`, which rings the parent doorbell),
/// and the parent collects it (`take_task_result`), waiting on the parent doorbell with the
/// mailbox's own wait (spin, yield, futex). `warmup` untimed round trips come first; before
/// each timed one the parent sleeps `pause` (outside the timed region; zero for back to back).
///
/// Forks: call it before this process starts any other thread. The child leaves with `_exit`;
/// it is shut down and reaped before this returns, and killed and reaped if this panics.
pub fn mailbox_pingpong(warmup: usize, iterations: usize, pause: Duration) -> Result<PingPong> {
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
        mb.post_task(&digest, |_, _| Ok(0))?;
        let deadline = start + HANG;
        loop {
            let seen = parent.seq();
            if let Some(result) = mb.take_task_result() {
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
    let (parent_cpu, child_cpu) = (last_cpu("thread-self"), last_cpu(&child.pid().to_string()));
    shut_down(child, mb)?;
    Ok(PingPong { times, parent_cpu, child_cpu })
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
    let engine = Engine::new(cfg, Bell::Local(Box::new(Doorbell::new())), parts)?;
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
    engine.callables().write().insert(digest, CallableKind::HostFn);
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

/// For each 1024-element block of the input (with `scalar 1` = `every` = k > 1: one block in
/// k, the others unread), `scalar 0` rounds of `x = 0.999 x + 0.5` over a copy of the block
/// (in the first-level cache, so the rounds are bound by arithmetic), summed into
/// `out[i % out.len()]`: a kernel whose duration scales with the blocks it reads and the
/// rounds (the pipeline benchmark's "kernel of comparable duration"). With `every` > 1 it
/// reads little of device memory, as a kernel on a real chip reads the chip's own memory and
/// not the host's, which a simulated chip shares with the next run's copy-in.
pub fn pipeline_kernel(args: &crate::data::host_args::HostArgs<'_>) -> crate::callable::host::HostResult {
    let rounds = args.scalar(0)?;
    let every = args.scalar(1).unwrap_or(1).max(1) as usize;
    let input = args.input::<f32>(0)?;
    pipeline_compute(input, args.output::<f32>(1)?, rounds, every);
    Ok(())
}

/// What [`pipeline_kernel`] computes, on plain slices (the benchmark runs it beside a copy to
/// measure what two threads of this machine overlap at best).
pub fn pipeline_compute(input: &[f32], out: &mut [f32], rounds: u64, every: usize) {
    out.fill(0.0);
    let n = out.len();
    let mut block = [0.0f32; 1024];
    for (k, chunk) in input.chunks(block.len()).enumerate().step_by(every.max(1)) {
        let tmp = &mut block[..chunk.len()];
        tmp.copy_from_slice(chunk);
        for _ in 0..rounds {
            for v in tmp.iter_mut() {
                *v = *v * 0.999 + 0.5;
            }
        }
        let at = (k * 1024) % n;
        for (o, v) in out[at..].iter_mut().zip(tmp.iter()) {
            *o += *v;
        }
    }
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

/// Runs `runs` chip runs of one kernel on an in-process simulated chip (2 cores) through the
/// L2 lifecycle at pipeline depth `depth` (1 or 2): each run copies in `input_bytes` of f32,
/// runs a kernel making `passes` passes over them, and copies back `output_bytes`. At depth 1
/// every run is prepared, launched, waited for and finalized before the next; at depth 2 the
/// next run is prepared (its copy-in) while the current one's kernel runs, then launched once
/// the current one is finalized.
pub fn chip_pipeline(
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
    let k = ChipFn::kernel("pipeline_kernel", pipeline_kernel);
    let digest = k.handle().digest();
    let mut reg = Registry::new(4);
    reg.install(digest, k.descriptor().bytes(), k.clone())?;
    let memory = 4 * (input_bytes + output_bytes) as u64 + (1 << 20);
    let cfg = ChipConfig {
        spec: ChipSpec { chip_id: 0, memory_bytes: memory, cores: 2 },
        backend: BackendFactory::sim(),
    };
    let mut rt = ChipRuntime::new(cfg, reg)?;
    rt.set_pipeline_depth(depth)?;
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
    let mut active = None;
    let (mut prepares, mut executes) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for (input, out) in inputs.iter_mut().zip(outputs.iter_mut()) {
        let lease = match rt.acquire_lease() {
            Some(l) => l,
            None => return Err(Error::state("chip_pipeline: no free lease")),
        };
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
    /// Waits for, finalizes and releases `run`; how long the wait took.
    fn finish(rt: &mut ChipRuntime, mut run: crate::chip::ChipRun<'_>) -> Result<Duration> {
        let t = Instant::now();
        rt.wait(&mut run);
        let waited = t.elapsed();
        let lease = run.lease();
        let r = rt.finalize(run);
        rt.release_lease(lease)?;
        r.map(|()| waited)
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
