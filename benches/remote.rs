//! Remote L3 Workers over loopback TCP: one L4 root driving a node (an L3 Worker with one SUB
//! worker) in another thread of this process, through an authenticated session.
//!
//! * `remote_task_p50_us`, `remote_task_p99_us`: one `Worker::run` on the L4 whose task goes to
//!   the node, which runs an orchestration function submitting one empty host function to its
//!   SUB worker. Back to back, after warm-up. Target: p50 at most 30 us.
//! * `remote_copy_gbps`: a task that reads and writes a 64 MiB tensor: its bytes go to the node
//!   with the task and come back with the completion (128 MiB moved per run). Target: at least
//!   1 GB/s.
//! * `remote_hop_gbps`, `remote_relay_gbps`: a 64 MiB tensor written by a task on one node and
//!   read by a task on another (a second node, another thread of this process), per run of the
//!   two tasks. Hop: the tensor lives on the first node (`alloc_child_tensor`) and the second
//!   reads it from there directly. Relay: the tensor is the root's memory, so it goes to the
//!   first node with its task, back with the completion, and to the second with its task. The
//!   tasks touch nothing: what is timed is moving the bytes. Target: hop at least 1.5x relay.
//! * `remote_idle_cpu_percent`: CPU the root and the node (with their children) burn over one
//!   second while connected and idle. Target: under 2 %.

#![allow(clippy::print_stdout)]

mod common;

use std::time::{Duration, Instant};

use common::{figure, percentile, target, us};
use simpler::{
    DataType, HostArgs, HostFn, HostResult, OrchFn, Orchestrator, TaskArgs, Worker, chip::CallConfig,
    remote::ClusterKey, remote::Node, remote::NodeAddr, remote::RemoteWorker, status::Level,
};

const WARMUP: usize = 200;
const ITERATIONS: usize = 2_000;
const COPY_BYTES: usize = 64 << 20;
const COPY_RUNS: usize = 5;
const HOP_RUNS: usize = 9;

fn empty(_args: &HostArgs<'_>) -> HostResult {
    Ok(())
}

/// One empty host function on the node's SUB worker.
fn one_empty(orch: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    orch.submit_sub(&HostFn::new("empty", empty).handle(), TaskArgs::new()).map(|_| ())
}

/// Touches nothing: the tensor's bytes travel both ways with the task.
fn touch(_orch: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    Ok(())
}

fn key() -> ClusterKey {
    ClusterKey::new("the benchmark cluster's secret").expect("key")
}

/// utime + stime of `pid` in clock ticks.
fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some((_, rest)) = stat.rsplit_once(')') else { return 0 };
    let mut fields = rest.split_whitespace().skip(11);
    let u: u64 = fields.next().and_then(|f| f.parse().ok()).unwrap_or(0);
    let s: u64 = fields.next().and_then(|f| f.parse().ok()).unwrap_or(0);
    u + s
}

/// This process and every process below it.
fn tree(pid: i32) -> Vec<i32> {
    let mut out = vec![pid];
    let mut next = 0;
    while next < out.len() {
        let at = out[next];
        next += 1;
        let dir = format!("/proc/{at}/task");
        for task in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let kids = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            out.extend(kids.split_whitespace().filter_map(|k| k.parse::<i32>().ok()));
        }
    }
    out
}

/// A node on a thread of this process, serving one session.
fn spawn_node() -> (NodeAddr, std::thread::JoinHandle<simpler::Result<()>>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let node = std::thread::spawn(move || -> simpler::Result<()> {
        let mut l3 = Worker::builder().sub_workers(1).build()?;
        l3.register(HostFn::new("empty", empty))?;
        let mut node = Node::new(l3, NodeAddr::loopback(0), key())?;
        node.register_orch(OrchFn::new("one_empty", one_empty));
        node.register_orch(OrchFn::new("touch", touch));
        let bound = node.bind()?;
        tx.send(bound.local_addr()).expect("send the address");
        bound.serve_one()
    });
    (rx.recv().expect("the node bound"), node)
}

fn main() -> simpler::Result<()> {
    let (addr, node) = spawn_node();
    let (addr_b, node_b) = spawn_node();
    let mut l4 = Worker::builder()
        .level(Level::Network1)
        .remote_worker(RemoteWorker::new(addr, key()))
        .remote_worker(RemoteWorker::new(addr_b, key()))
        .build()?;
    let task = l4.register_orch(OrchFn::new("one_empty", one_empty))?;
    let copy = l4.register_orch(OrchFn::new("touch", touch))?;
    l4.init()?;

    let one = |h: &simpler::CallableHandle, args: TaskArgs| {
        l4.run(|orch| orch.submit_next_level(h, args, CallConfig::default(), 0).map(|_| ()))
    };
    for _ in 0..WARMUP {
        one(&task, TaskArgs::new())?;
    }
    let mut lat = Vec::with_capacity(ITERATIONS);
    for _ in 0..ITERATIONS {
        let t = Instant::now();
        one(&task, TaskArgs::new())?;
        lat.push(us(t.elapsed()));
    }
    let p50 = percentile(&mut lat, 50.0);
    figure("remote_task_p50_us", p50, "us");
    figure("remote_task_p99_us", percentile(&mut lat, 99.0), "us");
    target("remote_task_p50_us", p50, "<=", 30.0, "us");

    let big = l4.create_buffer(COPY_BYTES)?;
    big.write(0, &vec![7u8; COPY_BYTES])?;
    let t = big.tensor(&[COPY_BYTES as u32], DataType::Uint8)?;
    let mut args = TaskArgs::new();
    args.inout(&t)?;
    one(&copy, args.clone())?; // warm
    let start = Instant::now();
    for _ in 0..COPY_RUNS {
        one(&copy, args.clone())?;
    }
    let gbps = (2 * COPY_BYTES * COPY_RUNS) as f64 / start.elapsed().as_secs_f64() / 1e9;
    figure("remote_copy_gbps", gbps, "GB/s");
    target("remote_copy_gbps", gbps, ">=", 1.0, "GB/s");
    drop((args, t, big));

    // Node to node: written on worker 0, read on worker 1, the tensor on worker 0 (hop) or in
    // the root's memory (relay); the two figures alternate run by run.
    let words = (COPY_BYTES / 8) as u32;
    let on_a = l4.alloc_child_tensor(0, &[words], DataType::Uint64)?;
    let in_root = l4.create_buffer(COPY_BYTES)?;
    let pair = |l4: &Worker, t: &simpler::Tensor| -> simpler::Result<f64> {
        let start = Instant::now();
        l4.run(|orch| {
            let mut w = TaskArgs::new();
            w.output(t)?;
            orch.submit_next_level(&copy, w, CallConfig::default(), 0)?;
            let mut r = TaskArgs::new();
            r.input(t)?;
            orch.submit_next_level(&copy, r, CallConfig::default(), 1).map(|_| ())
        })?;
        Ok(COPY_BYTES as f64 / start.elapsed().as_secs_f64() / 1e9)
    };
    let hop_t = on_a.tensor(&[words], DataType::Uint64)?;
    let relay_t = in_root.tensor(&[words], DataType::Uint64)?;
    pair(&l4, &hop_t)?; // warm: connections, buffers
    pair(&l4, &relay_t)?;
    let (mut hop, mut relay) = (Vec::new(), Vec::new());
    for _ in 0..HOP_RUNS {
        hop.push(pair(&l4, &hop_t)?);
        relay.push(pair(&l4, &relay_t)?);
    }
    let (hop, relay) = (percentile(&mut hop, 50.0), percentile(&mut relay, 50.0));
    println!("median of {HOP_RUNS} alternating runs of each");
    figure("remote_hop_gbps", hop, "GB/s");
    figure("remote_relay_gbps", relay, "GB/s");
    figure("remote_hop_over_relay", hop / relay, "x");
    target("remote_hop_over_relay", hop / relay, ">=", 1.5, "x");
    drop((hop_t, relay_t));
    l4.free(&on_a)?;
    drop((on_a, in_root));

    let hz = 100.0;
    let pids = tree(std::process::id() as i32);
    let before: u64 = pids.iter().map(|&p| cpu_ticks(p)).sum();
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let after: u64 = pids.iter().map(|&p| cpu_ticks(p)).sum();
    let idle = (after - before) as f64 / hz / start.elapsed().as_secs_f64() * 100.0;
    println!("idle root + node ({} processes) over 1 s", pids.len());
    figure("remote_idle_cpu_percent", idle, "%");
    target("remote_idle_cpu_percent", idle, "<", 2.0, "%");

    l4.close()?;
    node.join().expect("the node thread")?;
    node_b.join().expect("the second node's thread")?;
    Ok(())
}
