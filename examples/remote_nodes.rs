//! One L4 Worker driving a local L3 Worker and two remote L3 Workers: two more processes of
//! this same program, started in the node role and reached over loopback TCP with the cluster
//! key. The graph is a `task_graph!` whose tasks run on `worker(0)` (local, with a chip),
//! `worker(1)` and `worker(2)` (the nodes, with SUB workers); the tensors the remote tasks use
//! travel with them, and what they write comes back.
//!
//! The same program is root and node (SPMD, as `mpirun` and `srun` users know it): started
//! with `--node ADDR` it serves one root as a node, otherwise it is the root and starts its two
//! nodes itself. Run it with `cargo run --example remote_nodes`.
//!
//! Each node gives this root's session an L3 Worker of its own, of the size the root asks
//! for (`Node::sized`, `RemoteWorker::requires`).
//!
//! The nodes need not serve the same work: started with `--only square_then_inc`, the second
//! node serves that one orchestration function and none of the program's others
//! (`Node::linked_callables(false)`). The root registers its `#[callable(orch)]` functions on
//! the workers that have them, and refuses a task placed on a node that lacks its function
//! before anything is sent.
//!
//! Then the first node is killed mid-program: the run that needs it fails naming it, the node
//! is started again at its address, `Worker::replace_worker(WorkerKind::Remote, 1)` brings it
//! back, and the graph runs again.
//!
//! Under a launcher, rank 0 is the root and ranks 1 and 2 the nodes, which connect to the root:
//!
//! ```text
//! cargo build --example remote_nodes
//! SIMPLER_CLUSTER_KEY=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n') \
//!   mpirun --oversubscribe -np 3 -x SIMPLER_CLUSTER_KEY -x SIMPLER_ROOT=127.0.0.1:7470 \
//!   target/debug/examples/remote_nodes
//! ```

#![allow(clippy::print_stdout)] // An example talks to its user.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitCode, Stdio};

use simpler::prelude::*;
use simpler::{
    remote::ClusterKey, remote::Launch, remote::Node, remote::NodeAddr, remote::RemoteWorker,
    remote::SessionLimits, status::Level,
};

const N: u32 = 1024;

/// `out = a + b` on a chip.
#[callable(chip)]
fn vadd(a: In<f32>, b: In<f32>, mut out: Out<f32>) {
    for i in 0..out.len() {
        out[i] = a[i] + b[i];
    }
}

/// `x = x * x` on a SUB worker.
#[callable(sub)]
fn square(mut x: InOut<f32>) {
    x.iter_mut().for_each(|v| *v *= *v);
}

/// `x += 1` on a SUB worker.
#[callable(sub)]
fn inc(mut x: InOut<f32>) {
    x.iter_mut().for_each(|v| *v += 1.0);
}

/// `out = x` on a SUB worker.
#[callable(sub)]
fn copy(x: In<f32>, mut out: Out<f32>) {
    out.copy_from_slice(&x);
}

/// Runs on a node: `out = x`, where `x` may be another node's memory (fetched from it).
#[callable(orch)]
fn copy_here(o: &mut Orchestrator<'_>, x: In<f32>, out: Out<f32>) -> simpler::Result<()> {
    copy::call(&x, &mut out)?.on(o, sub())?;
    Ok(())
}

task_graph! {
    /// Runs on the local L3, which has a chip.
    fn add_on_chip(a: In<f32>, b: In<f32>, out: Out<f32>) {
        vadd(a, b, &mut out).on(chip(0));
    }
}

/// Runs on a node: `x = x * x + times`.
#[callable(orch)]
fn square_then_inc(o: &mut Orchestrator<'_>, x: InOut<f32>, times: u32) -> simpler::Result<()> {
    square::call(&mut x)?.on(o, sub())?;
    for _ in 0..times {
        inc::call(&mut x)?.on(o, sub())?;
    }
    Ok(())
}

task_graph! {
    /// The L4 graph: `y = (a + b)^2 + 3` and `z = (a + a)^2 + 1`, the squares on the nodes.
    fn across(a: In<f32>, b: In<f32>, y: Out<f32>, z: Out<f32>) {
        add_on_chip(a, b, &mut y).on(worker(0));
        add_on_chip(a, a, &mut z).on(worker(0));
        square_then_inc(&mut y, 3).on(worker(1));
        square_then_inc(&mut z, 1).on(worker(2));
    }
}

/// The node role: serves one root a session with an L3 Worker of its own, of the size the
/// root asks for (at most 4 SUB workers; 1 when it asks nothing); with `only`, it serves that
/// orchestration function alone.
fn node(addr: &str, only: Option<&str>) -> simpler::Result<()> {
    let limits = SessionLimits::new(4, 0).default_size(1, 0);
    let mut node = Node::sized(NodeAddr::parse(addr)?, ClusterKey::from_env()?, limits, |sub, chips| {
        Worker::builder().sub_workers(sub as usize).chips(chips as usize).build()
    })?;
    if let Some(name) = only {
        let handle = match name {
            "square_then_inc" => square_then_inc::handle(),
            "add_on_chip" => add_on_chip::handle(),
            _ => {
                return Err(simpler::Error::new(
                    simpler::ErrorKind::Callable,
                    format!("--only {name}: not a function of this program"),
                ));
            }
        };
        node = node.linked_callables(false);
        node.register_orch(simpler::OrchFn::linked(handle)?);
    }
    let bound = node.bind()?;
    println!("{}", bound.local_addr()); // the root reads where we listen
    bound.serve_one()
}

/// A node process, killed and reaped if the root gives up before the node's session ended.
struct NodeChild(Child);

impl Drop for NodeChild {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts a node of this program at `addr` (`127.0.0.1:0`: a free loopback port), serving only
/// the orchestration function `only`, if given; returns it and its address.
fn start_node(
    key: &str,
    addr: &str,
    only: Option<&str>,
) -> Result<(NodeChild, String), Box<dyn std::error::Error>> {
    let only = only.map(|name| ["--only", name]);
    let mut child = NodeChild(
        Command::new(std::env::current_exe()?)
            .args(["--node", addr])
            .args(only.iter().flatten())
            .env("SIMPLER_CLUSTER_KEY", key)
            .stdout(Stdio::piped())
            .spawn()?,
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.as_mut().ok_or("no stdout")?.by_ref()).read_line(&mut line)?;
    Ok((child, line.trim().to_string()))
}

/// A node of a launched job: connects to the root (rank 0) and serves it.
fn launched_node(launch: &Launch) -> simpler::Result<()> {
    let l3 = Worker::builder().sub_workers(2).build()?;
    Node::new(l3, NodeAddr::loopback(0), ClusterKey::from_env()?)?.serve_launch(launch)
}

fn root(launch: Option<&Launch>) -> Result<(), Box<dyn std::error::Error>> {
    let mut l4 = Worker::builder()
        .level(Level::Network1)
        .worker(Worker::builder().chips(1).chip_memory(16 << 20).build()?); // worker 0
    let mut nodes = Vec::new();
    let mut key_text = String::new();
    match launch {
        Some(launch) => {
            if launch.size() != 3 {
                return Err(format!(
                    "this example runs as 3 ranks (a root and two nodes), not {}",
                    launch.size()
                )
                .into());
            }
            l4 = l4.launched_workers(launch, ClusterKey::from_env()?);
            println!("workers 1 and 2: ranks 1 and 2, connecting to {}", launch.root());
        }
        None => {
            // A fresh key for this run; a cluster keeps one in its launcher's environment.
            let mut secret = [0u8; 16];
            std::fs::File::open("/dev/urandom")?.read_exact(&mut secret)?;
            key_text = secret.iter().map(|b| format!("{b:02x}")).collect();
            let key = ClusterKey::new(&key_text)?;
            nodes.push(start_node(&key_text, "127.0.0.1:0", None)?);
            nodes.push(start_node(&key_text, "127.0.0.1:0", Some("square_then_inc"))?);
            for (id, (_, addr)) in (1..).zip(&nodes) {
                // Each root session gets a Worker of 2 SUB workers of its own on the node.
                l4 = l4.remote_worker(RemoteWorker::new(NodeAddr::parse(addr)?, key.clone()).requires(2, 0));
                let serves = if id == 1 { "every orchestration function" } else { "square_then_inc only" };
                println!(
                    "worker {id}: the node at {addr}, serving {serves} on 2 SUB workers of this root's own"
                );
            }
        }
    }
    let mut l4 = l4.build()?;
    l4.init()?;

    let (a, b) = (l4.create_buffer(4 * N as usize)?, l4.create_buffer(4 * N as usize)?);
    let (y, z) = (l4.create_buffer(4 * N as usize)?, l4.create_buffer(4 * N as usize)?);
    a.write(0, &vec![1.0f32; N as usize])?;
    b.write(0, &vec![2.0f32; N as usize])?;
    let (ta, tb) = (a.typed::<f32>(&[N])?, b.typed::<f32>(&[N])?);
    let (mut ty, mut tz) = (y.typed::<f32>(&[N])?, z.typed::<f32>(&[N])?);
    across::call(&ta, &tb, &mut ty, &mut tz)?.run(&l4)?;

    // Node to node: a buffer that lives on worker 2's node, updated there, then read by a task
    // on worker 1, whose node fetches it from worker 2's directly (not through this root).
    let on2 = l4.alloc_child_tensor(2, &[N], DataType::Float32)?;
    l4.copy_to(&on2, &a)?; // 1.0 everywhere
    let mut t2 = on2.typed::<f32>(&[N])?;
    let w = l4.create_buffer(4 * N as usize)?;
    let mut tw = w.typed::<f32>(&[N])?;
    l4.run(|o| {
        square_then_inc::call(&mut t2, 2)?.on(o, worker(2))?; // 1 * 1 + 2, on worker 2
        copy_here::call(&t2, &mut tw)?.on(o, worker(1))?; // read on worker 1
        Ok(())
    })?;
    let hop = w.read::<f32>(0, N as usize)?;
    drop(t2);
    l4.free(&on2)?;
    if hop.iter().any(|&v| v != 3.0) {
        return Err(format!("node to node: expected 3.0 everywhere, got {}", hop[0]).into());
    }
    println!("node to node: worker 1 read what worker 2 computed in its own memory: {} (correct)", hop[0]);
    if launch.is_none() {
        // Worker 2 serves square_then_inc only: a task of another function placed there is
        // refused at submit, naming both, and nothing reaches the node.
        let refused = l4.run(|o| add_on_chip::call(&ta, &tb, &mut ty)?.on(o, worker(2)).map(|_| ()));
        match refused {
            Err(e) if e.kind() == simpler::ErrorKind::Callable => println!("refused as it should be: {e}"),
            other => return Err(format!("add_on_chip on worker 2 should be refused, got {other:?}").into()),
        }
        // Worker 1's node dies (killed, as a crash would). The run that needs it fails naming
        // it; the node is started again at its address and rejoins; the graph runs again.
        let (mut dead, addr) = nodes.remove(0);
        dead.0.kill()?;
        dead.0.wait()?;
        match across::call(&ta, &tb, &mut ty, &mut tz)?.run(&l4) {
            Err(e) => println!("worker 1 is lost, as it should be: {e}"),
            Ok(()) => return Err("a run on a killed node should fail".into()),
        }
        nodes.insert(0, start_node(&key_text, &addr, None)?);
        let back = l4.replace_worker(simpler::status::WorkerKind::Remote, 1)?;
        println!("worker 1 rejoined: the node at {addr} is process {} now", back.pid);
        y.write(0, &vec![0.0f32; N as usize])?;
        z.write(0, &vec![0.0f32; N as usize])?;
        across::call(&ta, &tb, &mut ty, &mut tz)?.run(&l4)?;
    }

    let (ys, zs) = (y.read::<f32>(0, N as usize)?, z.read::<f32>(0, N as usize)?);
    l4.close()?;
    for (mut child, _) in nodes {
        child.0.wait()?; // each node ends its session when the root closes it
    }
    let ok = ys.iter().all(|&v| v == 12.0) && zs.iter().all(|&v| v == 5.0);
    println!(
        "result check: y = (1 + 2)^2 + 3 = {} and z = (1 + 1)^2 + 1 = {} in all {N} elements, the squares computed on two nodes: {}",
        ys[0],
        zs[0],
        if ok { "correct" } else { "WRONG" }
    );
    if ok { Ok(()) } else { Err("wrong result".into()) }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let result = match (Launch::from_env(), args.iter().position(|a| a == "--node")) {
        (Err(e), _) => Err(e.into()),
        (Ok(Some(launch)), _) if launch.is_root() => root(Some(&launch)),
        (Ok(Some(launch)), _) => launched_node(&launch).map_err(Into::into),
        (Ok(None), Some(i)) => {
            let only = args.iter().position(|a| a == "--only").and_then(|j| args.get(j + 1));
            node(args.get(i + 1).map_or("127.0.0.1:0", String::as_str), only.map(String::as_str))
                .map_err(Into::into)
        }
        (Ok(None), None) => root(None),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
