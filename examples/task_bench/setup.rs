//! The Workers the Task Bench graph runs on, one set per `--workers` value, and the node
//! processes of the remote placement.
//!
//! Shared by the `task_bench` example (`examples/task_bench.rs`) and its integration test
//! (`tests/task_bench.rs`, through `#[path]`), so the test builds exactly what the example runs:
//!
//! * `sub`: an L3 Worker with SUB workers; each task is [`point`] as a host function.
//! * `chips`: an L3 Worker with simulated chips of one core each; each task is [`point`] as a
//!   kernel on chip `p % chips`, its host tensors copied into the chip and back.
//! * `l4`: an L4 Worker over two L3 Workers with SUB workers; each task is [`l3_point`] on L3
//!   `p % 2`, which submits [`point`] to one of its SUB workers.
//! * `remote`: the same, the two L3 Workers being nodes: processes of the same program on this
//!   host, reached over loopback TCP with a fresh cluster key ([`Nodes`], [`serve_node`]).

#![allow(dead_code)] // The example and the test use different parts.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdin, Command, Stdio};

use simpler::remote::{ClusterKey, Node, NodeAddr, RemoteWorker};
use simpler::status::Level;
use simpler::{CallableHandle, Error, ErrorKind, HostFn, OrchFn, Worker, WorkerBuilder, chip::ChipFn};

use super::graph::{Placement, l3_point, point};

/// How long a node may take to print the address it listens on.
const NODE_START: std::time::Duration = std::time::Duration::from_secs(30);
/// How long a node may take to exit once its root closed.
const NODE_EXIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Where the tasks run (`--workers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workers {
    /// SUB workers of one L3 Worker.
    Sub,
    /// Simulated chips of one L3 Worker.
    Chips,
    /// SUB workers of two L3 Workers under one L4 Worker.
    L4,
    /// SUB workers of two remote L3 Workers (nodes on this host) under one L4 Worker.
    Remote,
}

impl Workers {
    /// Every placement.
    pub const ALL: [Workers; 4] = [Workers::Sub, Workers::Chips, Workers::L4, Workers::Remote];

    /// The `--workers` name.
    pub fn name(self) -> &'static str {
        match self {
            Workers::Sub => "sub",
            Workers::Chips => "chips",
            Workers::L4 => "l4",
            Workers::Remote => "remote",
        }
    }

    /// The placement named `name`.
    pub fn parse(name: &str) -> Option<Workers> {
        Workers::ALL.into_iter().find(|w| w.name() == name)
    }
}

/// The name the point function is registered under, as a host function and as a kernel.
pub const POINT: &str = "task_bench_point";
/// The name of the L3 orchestration function of the L4 placements.
pub const L3_POINT: &str = "task_bench_l3_point";
/// The environment variable that tells a node process how many SUB workers its L3 Worker has.
pub const NODE_SUB_WORKERS_ENV: &str = "TASK_BENCH_NODE_SUB_WORKERS";
/// The environment variable that carries the cluster key to the nodes (what
/// [`ClusterKey::from_env`] reads).
pub const CLUSTER_KEY_ENV: &str = "SIMPLER_CLUSTER_KEY";

/// A placement and how many workers run its tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Where the tasks run.
    pub workers: Workers,
    /// Workers that run tasks: SUB workers (`sub`), chips (`chips`), or SUB workers over both
    /// L3 Workers (`l4`, `remote`; split in two, at least one each).
    pub count: usize,
    /// `sub`: SUB worker `i` runs only on the `i`-th CPU this process may use, modulo their
    /// count ([`WorkerBuilder::bind_sub_workers`]), as StarPU and Open MPI bind theirs by
    /// default; `--no-bind` turns it off.
    pub bind: bool,
}

impl Plan {
    /// The SUB workers of L3 Worker `i` (0 or 1) of the L4 placements: `count` split in two,
    /// the first half rounded up, at least one each.
    pub fn l3_sub_workers(&self, i: usize) -> usize {
        let second = self.count / 2;
        (if i == 0 { self.count - second } else { second }).max(1)
    }

    /// The builder of the Worker the graph is submitted to, with room for `window` live tasks;
    /// `nodes` are the remote placement's nodes (started with [`Nodes::start`]). Before
    /// `build`: the L3 Workers of `l4` are built here, with [`point`] registered on them.
    pub fn builder(&self, window: usize, nodes: &Nodes) -> simpler::Result<WorkerBuilder> {
        let builder = Worker::builder().task_window(window);
        Ok(match self.workers {
            Workers::Sub => builder.sub_workers(self.count).bind_sub_workers(self.bind),
            Workers::Chips => builder.chips(self.count).chip_cores(1),
            Workers::L4 => {
                let mut builder = builder.level(Level::Network1);
                for i in 0..2 {
                    let mut l3 = Worker::builder().sub_workers(self.l3_sub_workers(i)).build()?;
                    l3.register(HostFn::new(POINT, point))?;
                    builder = builder.worker(l3);
                }
                builder
            }
            Workers::Remote => {
                let (Some(key), 2) = (&nodes.key, nodes.addrs.len()) else {
                    return Err(Error::new(
                        ErrorKind::InvalidArgument,
                        "--workers remote needs its two nodes started (Nodes::start)",
                    ));
                };
                let mut builder = builder.level(Level::Network1);
                for addr in &nodes.addrs {
                    builder = builder.remote_worker(RemoteWorker::new(NodeAddr::parse(addr)?, key.clone()));
                }
                builder
            }
        })
    }

    /// Registers what the tasks are submitted under on `worker` (built from
    /// [`builder`](Self::builder), before `init`) and returns its handle.
    pub fn register(&self, worker: &mut Worker) -> simpler::Result<CallableHandle> {
        match self.workers {
            Workers::Sub => worker.register(HostFn::new(POINT, point)),
            Workers::Chips => worker.register_chip(ChipFn::kernel(POINT, point)),
            Workers::L4 | Workers::Remote => worker.register_orch(OrchFn::new(L3_POINT, l3_point)),
        }
    }

    /// How [`Graph::submit`](super::graph::Graph::submit) places the tasks, under `handle`
    /// (from [`register`](Self::register)).
    pub fn placement<'a>(&self, handle: &'a CallableHandle) -> Placement<'a> {
        match self.workers {
            Workers::Sub => Placement::Sub { point: handle },
            Workers::Chips => Placement::Chips { kernel: handle, chips: self.count as u32 },
            Workers::L4 | Workers::Remote => Placement::Workers { orch: handle, workers: 2 },
        }
    }

    /// What the report's `Workers:` line says.
    pub fn describe(&self, nodes: &Nodes) -> String {
        let (a, b) = (self.l3_sub_workers(0), self.l3_sub_workers(1));
        match self.workers {
            Workers::Sub if self.bind => format!("sub x {} (bound to CPUs in turn)", self.count),
            Workers::Sub => format!("sub x {}", self.count),
            Workers::Chips => format!("chips x {} (one L3 Worker, simulated chips of 1 core)", self.count),
            Workers::L4 => format!("l4 x 2 (one L4 Worker over two L3 Workers of {a} and {b} SUB workers)"),
            Workers::Remote => format!(
                "remote x 2 (one L4 Worker over two nodes of {a} and {b} SUB workers at {})",
                nodes.addrs.join(", ")
            ),
        }
    }
}

/// A node process: killed (SIGKILL) and reaped on drop unless it was reaped already. Its stdin
/// is a pipe from this process, which [`serve_node`] watches: if this process dies first, the
/// node sees the pipe close and exits, so a node never outlives its root.
struct NodeChild {
    child: Child,
    /// Held open for the node's life (see above).
    stdin: Option<ChildStdin>,
}

impl Drop for NodeChild {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        self.stdin = None;
    }
}

/// The node processes of the remote placement (none for the others), killed and reaped when
/// dropped before [`wait`](Nodes::wait) reaped them.
#[derive(Default)]
pub struct Nodes {
    children: Vec<NodeChild>,
    addrs: Vec<String>,
    key: Option<ClusterKey>,
}

impl Nodes {
    /// No nodes (every placement but `remote`).
    pub fn none() -> Nodes {
        Nodes::default()
    }

    /// Starts the two nodes of `plan` (none unless it is `remote`): each is `command()` with a
    /// fresh cluster key in [`CLUSTER_KEY_ENV`], its SUB worker count in
    /// [`NODE_SUB_WORKERS_ENV`] and its stdin and stdout piped; it must run [`serve_node`],
    /// which prints `NODE <address>`. Returns once both listen.
    pub fn start(plan: &Plan, command: impl Fn() -> Command) -> simpler::Result<Nodes> {
        let mut nodes = Nodes::none();
        if plan.workers != Workers::Remote {
            return Ok(nodes);
        }
        let os = |what: &str, e: std::io::Error| {
            Error::new(ErrorKind::Os, format!("starting a node: {what}: {e}"))
        };
        let mut secret = [0u8; 16];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut secret))
            .map_err(|e| os("/dev/urandom", e))?;
        let key_text: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        nodes.key = Some(ClusterKey::new(&key_text)?);
        for i in 0..2 {
            let mut child = command()
                .env(CLUSTER_KEY_ENV, &key_text)
                .env(NODE_SUB_WORKERS_ENV, plan.l3_sub_workers(i).to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| os("spawn", e))?;
            let (stdin, stdout) = (child.stdin.take(), child.stdout.take());
            nodes.children.push(NodeChild { child, stdin });
            let mut reader = BufReader::new(
                stdout.ok_or_else(|| Error::new(ErrorKind::InvalidArgument, "a node without stdout"))?,
            );
            // A thread reads its address, then keeps draining what it prints, so it never
            // blocks on a full pipe; this side waits for the address with a bound.
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut line = String::new();
                loop {
                    line.clear();
                    match reader.read_line(&mut line) {
                        Ok(0) | Err(_) => return, // exited: the sender drops
                        Ok(_) => {}
                    }
                    // A test harness may print on the same line first.
                    if let Some(a) = line.split("NODE ").nth(1) {
                        let _ = tx.send(a.trim().to_string());
                        break;
                    }
                }
                let _ = std::io::copy(&mut reader, &mut std::io::sink());
            });
            let addr = rx.recv_timeout(NODE_START).map_err(|e| {
                let why = match e {
                    std::sync::mpsc::RecvTimeoutError::Timeout => {
                        format!("it did not listen within {NODE_START:?}")
                    }
                    std::sync::mpsc::RecvTimeoutError::Disconnected => {
                        "it exited before it listened".to_string()
                    }
                };
                Error::new(ErrorKind::WorkerDied, format!("starting a node: {why}"))
            })?;
            nodes.addrs.push(addr);
        }
        Ok(nodes)
    }

    /// The nodes' process ids.
    pub fn pids(&self) -> Vec<i32> {
        self.children.iter().map(|c| c.child.id() as i32).collect()
    }

    /// Waits for every node to exit (each ends its session when the root Worker closes) and
    /// checks that it exited successfully.
    pub fn wait(self) -> simpler::Result<()> {
        let addrs = self.addrs.clone();
        for (code, addr) in self.exit_codes()?.into_iter().zip(&addrs) {
            if code != Some(0) {
                let how = code.map_or("was killed by a signal".to_string(), |c| format!("exited with {c}"));
                return Err(Error::new(ErrorKind::WorkerDied, format!("the node at {addr} {how}")));
            }
        }
        Ok(())
    }

    /// Waits for every node to exit, for [`NODE_EXIT`] at most, and returns their exit codes
    /// (`None`: killed by a signal). A node still running then is an error (and is killed and
    /// reaped as `self` drops).
    pub fn exit_codes(mut self) -> simpler::Result<Vec<Option<i32>>> {
        let deadline = std::time::Instant::now() + NODE_EXIT;
        let mut codes = Vec::new();
        for node in &mut self.children {
            let status = loop {
                let exited = node
                    .child
                    .try_wait()
                    .map_err(|e| Error::new(ErrorKind::Os, format!("waiting for a node: {e}")))?;
                if let Some(status) = exited {
                    break status;
                }
                if std::time::Instant::now() >= deadline {
                    return Err(Error::new(
                        ErrorKind::Timeout,
                        format!(
                            "node {} did not exit within {NODE_EXIT:?} of its root closing",
                            node.child.id()
                        ),
                    ));
                }
                // No way to wait on a child with a bound in std: look again shortly.
                std::thread::sleep(std::time::Duration::from_millis(5));
            };
            codes.push(status.code());
        }
        Ok(codes)
    }

    /// Closes every node's stdin, as the root's death does: each node then exits with code 3
    /// (see [`serve_node`]).
    pub fn hang_up(&mut self) {
        for node in &mut self.children {
            node.stdin = None;
        }
    }
}

/// The node role of the remote placement: an L3 Worker with [`NODE_SUB_WORKERS_ENV`] SUB
/// workers and [`point`] and [`l3_point`] registered, served to one root with the key in
/// [`CLUSTER_KEY_ENV`]. Prints `NODE <address>` once it listens on a free loopback port, and
/// exits (code 3) as soon as its stdin closes, which happens when the root is gone.
pub fn serve_node() -> simpler::Result<()> {
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        std::process::exit(3);
    });
    let subs: usize =
        std::env::var(NODE_SUB_WORKERS_ENV).ok().and_then(|v| v.parse().ok()).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("a node needs {NODE_SUB_WORKERS_ENV} (its SUB workers)"),
            )
        })?;
    let mut l3 = Worker::builder().sub_workers(subs).build()?;
    l3.register(HostFn::new(POINT, point))?;
    let mut node = Node::new(l3, NodeAddr::loopback(0), ClusterKey::from_env()?)?;
    node.register_orch(OrchFn::new(L3_POINT, l3_point));
    let bound = node.bind()?;
    #[allow(clippy::print_stdout)] // The driver reads the address from the node's stdout.
    {
        println!("NODE {}", bound.local_addr());
    }
    bound.serve_one()
}
