//! (f) One empty SUB task two levels down: L4 -> L3 -> SUB, end to end through `Worker::run`.
//!
//! The L4 Worker has one nested L3 Worker (a process of its own), which has one SUB worker
//! (another process). Each timed run is one `Worker::run` on the L4 Worker whose orchestration
//! submits one task to its L3 child; the child runs an orchestration function of its own that
//! submits one empty host function to its SUB worker. Back to back, after warm-up.
//!
//! In the same process, the single-level figure is measured the same way on an L3 Worker with
//! one SUB worker (as `sub_task` does), so the two are compared on the same machine at the same
//! moment. For a breakdown, a third kind of run goes to the L3 child with an orchestration
//! function that submits nothing (the L4 -> L3 hop and the child's run, without the SUB
//! worker); it is printed as a human line only. The kinds are measured in alternating blocks,
//! so a slow patch of the machine spreads over all of them, and where each block ran is
//! printed: a nested run keeps three processes busy, so on a machine with fewer than three free
//! CPUs two of them share one and every handoff between those two is a context switch.
//!
//! Figures: `nested_sub_task_p50_us`, `nested_sub_task_p99_us`,
//! `single_sub_task_p50_us_same_run`. Target: the nested p50 at most 3x the single one.

#![allow(clippy::print_stdout)]

mod common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{bands, figure, last_cpu, one_sub_task, percentile, spread, target, us};
use simpler::{
    CallableHandle, HostArgs, HostFn, HostResult, OrchFn, Orchestrator, TaskArgs, Worker, chip::CallConfig,
    status::Level,
};

/// Warm-up runs of each kind before any timing.
const WARMUP: usize = 200;
/// Timed runs of each kind, in total.
const ITERATIONS: usize = 1_000;
/// Timed runs per block; the blocks of the kinds alternate.
const BLOCK: usize = 100;
/// Untimed runs at the start of each block (the other trees' processes went idle meanwhile).
const BLOCK_WARMUP: usize = 20;
/// Most the nested p50 may be, as a multiple of the single-level one.
const RATIO_TARGET: f64 = 3.0;

/// Kept out of line: a host function's identity is its name and address, and rustc may give a
/// small function a local copy (another address) in each codegen unit that names it.
#[inline(never)]
fn empty(_args: &HostArgs<'_>) -> HostResult {
    Ok(())
}

/// The handle of `empty`, made once per process: the single-level runs reuse the handle
/// `register` returned, so the nested ones should not hash a descriptor on every run either.
fn empty_handle() -> &'static CallableHandle {
    static HANDLE: OnceLock<CallableHandle> = OnceLock::new();
    HANDLE.get_or_init(|| HostFn::new("empty", empty).handle())
}

/// The L3 orchestration: one empty host function on the child's SUB worker.
fn l3_one_empty(orch: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    orch.submit_sub(empty_handle(), TaskArgs::new()).map(|_| ())
}

/// An L3 orchestration that submits nothing (the breakdown's third kind).
fn l3_nothing(_: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    Ok(())
}

/// One run of the L4 Worker: one task on its L3 child running the orchestration `orch_fn`.
fn nested(worker: &Worker, orch_fn: &CallableHandle) -> simpler::Result<Duration> {
    let start = Instant::now();
    worker
        .run(|orch| orch.submit_next_level(orch_fn, TaskArgs::new(), CallConfig::default(), 0).map(|_| ()))?;
    Ok(start.elapsed())
}

/// Warms up with `BLOCK_WARMUP` untimed runs, then appends `BLOCK` timed ones to `out` (us).
fn block(out: &mut Vec<f64>, mut one: impl FnMut() -> simpler::Result<Duration>) -> simpler::Result<()> {
    for _ in 0..BLOCK_WARMUP {
        one()?;
    }
    for _ in 0..BLOCK {
        out.push(us(one()?));
    }
    Ok(())
}

/// The first child of process `pid` (`/proc/<pid>/task/<pid>/children`), if `/proc` tells.
fn first_child(pid: i32) -> Option<String> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    children.split_whitespace().next().map(str::to_string)
}

/// Where the given processes last ran, as `a/b/c` (`?` where unknown).
fn cpus(pids: &[Option<&str>]) -> String {
    let cpu = |pid: &Option<&str>| pid.and_then(last_cpu).map_or("?".to_string(), |c| c.to_string());
    pids.iter().map(cpu).collect::<Vec<_>>().join("/")
}

/// p50 of the single-level and nested runs, and the nested p99, measured on fresh Workers.
fn measure() -> simpler::Result<(f64, f64, f64)> {
    let mut l3 = Worker::builder().sub_workers(1).build()?;
    let f = l3.register(HostFn::new("empty", empty))?;
    l3.init()?;

    let mut child = Worker::builder().sub_workers(1).build()?;
    child.register(HostFn::new("empty", empty))?;
    let mut l4 = Worker::builder().level(Level::Network1).worker(child).build()?;
    let one_empty = l4.register_orch(OrchFn::new("l3_one_empty", l3_one_empty))?;
    let nothing = l4.register_orch(OrchFn::new("l3_nothing", l3_nothing))?;
    l4.init()?;

    let sub_pid = l3.child_pids()[0].to_string();
    let l3_child_pid = l4.child_pids()[0];
    let grandchild_pid = first_child(l3_child_pid);
    let l3_child_pid = l3_child_pid.to_string();

    for _ in 0..WARMUP {
        one_sub_task(&l3, &f)?;
        nested(&l4, &nothing)?;
        nested(&l4, &one_empty)?;
    }
    let started = Instant::now();
    let (mut one, mut two, mut hop) = (Vec::new(), Vec::new(), Vec::new());
    let (mut one_at, mut two_at) = (Vec::new(), Vec::new());
    for _ in 0..ITERATIONS / BLOCK {
        block(&mut one, || one_sub_task(&l3, &f))?;
        one_at.push(cpus(&[Some("thread-self"), Some(&sub_pid)]));
        block(&mut hop, || nested(&l4, &nothing))?;
        block(&mut two, || nested(&l4, &one_empty))?;
        two_at.push(cpus(&[Some("thread-self"), Some(&l3_child_pid), grandchild_pid.as_deref()]));
    }
    let elapsed = started.elapsed();
    l4.close()?;
    l3.close()?;

    let n_cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("{n_cpus} CPUs; timed blocks took {:.2} s", elapsed.as_secs_f64());
    spread("empty SUB task, single level (L3 -> SUB)", &mut one);
    bands("  bands", &one);
    println!("  CPUs of driver/SUB worker after each block: {}", one_at.join(" "));
    spread("empty SUB task, nested (L4 -> L3 -> SUB)", &mut two);
    bands("  bands", &two);
    println!("  CPUs of driver/L3 child/its SUB worker after each block: {}", two_at.join(" "));
    spread("breakdown: nested, the L3 orchestration submits nothing (L4 -> L3)", &mut hop);
    let single50 = percentile(&mut one, 50.0);
    let nested50 = percentile(&mut two, 50.0);
    let nested99 = percentile(&mut two, 99.0);
    Ok((single50, nested50, nested99))
}

/// Round trips of the context-switch measurement.
const SWITCH_ROUNDS: u32 = 50_000;

/// The cost of one context switch on this CPU, in us: two threads of this process, confined to
/// one CPU, hand it to each other with `sched_yield`. (Between processes it costs a little more.)
fn context_switch_us() -> f64 {
    let other = std::thread::spawn(|| {
        for _ in 0..SWITCH_ROUNDS {
            std::thread::yield_now();
        }
    });
    let start = Instant::now();
    for _ in 0..SWITCH_ROUNDS {
        std::thread::yield_now();
    }
    let took = start.elapsed();
    other.join().expect("the yielding thread does not panic");
    // Each round of this thread is two switches: to the other thread and back.
    us(took) / f64::from(SWITCH_ROUNDS) / 2.0
}

/// Confines this process (and so every process it forks from now on) to its lowest allowed CPU.
#[expect(unsafe_code, reason = "sched_getaffinity/sched_setaffinity have no safe wrapper")]
fn pin_to_one_cpu() -> Option<usize> {
    // SAFETY: `cpu_set_t` is plain data; zeroed is a valid empty set, filled by the kernel.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; the size and pointer describe `set`.
    if unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return None;
    }
    // SAFETY: `CPU_ISSET` reads the set for an index below CPU_SETSIZE.
    let cpu = (0..libc::CPU_SETSIZE as usize).find(|&c| unsafe { libc::CPU_ISSET(c, &set) })?;
    // SAFETY: as above; a set holding exactly `cpu`.
    let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut one) };
    // SAFETY: pid 0 is this thread; the size and pointer describe `one`.
    (unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &one) } == 0).then_some(cpu)
}

fn main() -> simpler::Result<()> {
    // Where the scheduler puts the processes decides most of the figure on a 2-vCPU machine (a
    // nested run keeps three processes busy; the single-level baseline halves when its two
    // processes land on separate vCPUs), so the ratio is judged with both trees confined to the
    // same single vCPU, where placement cannot differ between them. The unconfined figures are
    // reported too.
    let (single50, nested50, nested99) = measure()?;
    figure("nested_sub_task_p50_us", nested50, "us");
    figure("nested_sub_task_p99_us", nested99, "us");
    figure("single_sub_task_p50_us_same_run", single50, "us");
    println!("unconfined nested/single p50 ratio: {:.2} x (placement-dependent)", nested50 / single50);
    let Some(cpu) = pin_to_one_cpu() else {
        println!("could not confine the benchmark to one CPU; the ratio is judged unconfined");
        target("nested/single p50 ratio", nested50 / single50, "<=", RATIO_TARGET, "x");
        return Ok(());
    };
    let (single1, nested1, _) = measure()?;
    println!("confined to CPU {cpu}: single {single1:.2} us, nested {nested1:.2} us");
    let switch = context_switch_us();
    println!(
        "a context switch on this CPU: {switch:.2} us; with fewer than three CPUs a nested run needs at least \
         two that the single level does not (three busy processes, two CPUs): unconfined nested p50 net of \
         them {:.2} us, {:.2} x the single level",
        nested50 - 2.0 * switch,
        (nested50 - 2.0 * switch) / single50
    );
    figure("nested_sub_task_p50_us_one_cpu", nested1, "us");
    figure("single_sub_task_p50_us_one_cpu", single1, "us");
    target("nested/single p50 ratio (same placement)", nested1 / single1, "<=", RATIO_TARGET, "x");
    Ok(())
}
