//! Remote L3 Workers over loopback: an L4 drives nodes (other processes, or threads of this
//! one, in the node role) over authenticated sessions. Graphs across local and remote Workers,
//! the wrong key, a digest the node lacks, a node killed mid-task, a node that stops answering,
//! garbage on the wire, and a root that dies.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use simpler::{
    ErrorKind, HostArgs, HostFn, HostResult, OrchFn, Orchestrator, TaskArgs, Worker, chip::CallConfig,
    remote::ClusterKey, remote::Node, remote::NodeAddr, remote::RemoteWorker, remote::SessionLimits,
    status::Level, status::WorkerKind, status::WorkerState,
};

const KEY: &str = "the test cluster's shared secret";

fn key() -> ClusterKey {
    ClusterKey::new(KEY).unwrap()
}

/// `x[i] = x[i] * 2 + 1` for every u64 word.
fn twice_plus_one(args: &HostArgs<'_>) -> HostResult {
    for v in args.output::<u64>(0)?.iter_mut() {
        *v = *v * 2 + 1;
    }
    Ok(())
}

/// The marker in which `stall` announces that it runs, on the node whose process is `node_pid`.
fn stall_marker(node_pid: u32) -> std::path::PathBuf {
    marker_file("remote-stall", node_pid)
}

/// Announces that it runs (a SUB worker of a node process), then blocks for up to a minute
/// (the test kills or stops its node meanwhile).
fn stall(_args: &HostArgs<'_>) -> HostResult {
    announce_to_parent("remote-stall", "running")?;
    spin_until(Instant::now() + Duration::from_secs(60), || false);
    Ok(())
}

/// The orchestration the root sends: one `twice_plus_one` on the node's SUB worker.
fn step(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    let mut a = TaskArgs::new();
    a.inout(args.tensor(0).unwrap())?;
    orch.submit_sub(&HostFn::new("twice_plus_one", twice_plus_one).handle(), a).map(|_| ())
}

/// Every tensor of the task through `twice_plus_one`, one SUB task each.
fn step_all(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    for t in args.tensors() {
        let mut a = TaskArgs::new();
        a.inout(t)?;
        orch.submit_sub(&HostFn::new("twice_plus_one", twice_plus_one).handle(), a)?;
    }
    Ok(())
}

/// `out = in`, word by word (tensor 0 read, tensor 1 written).
fn copy_words(args: &HostArgs<'_>) -> HostResult {
    let src = args.input::<u64>(0)?.to_vec();
    args.output::<u64>(1)?.copy_from_slice(&src);
    Ok(())
}

/// One `copy_words` on the node's SUB worker: tensor 0 into tensor 1.
fn copy_step(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    let mut a = TaskArgs::new();
    a.input(args.tensor(0).unwrap())?;
    a.output(args.tensor(1).unwrap())?;
    orch.submit_sub(&HostFn::new("copy_words", copy_words).handle(), a).map(|_| ())
}

/// The gate file `name` of the test process (the parent of a thread node's SUB worker).
fn gate(test_pid: u32, name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("simpler-remote-gate-{test_pid}-{name}"))
}

/// Announces that it runs (gate `started`), then waits up to a minute for gate `open`.
fn gated(_args: &HostArgs<'_>) -> HostResult {
    let test = std::os::unix::process::parent_id();
    std::fs::write(gate(test, "started"), b"running")?;
    let open = gate(test, "open");
    if !spin_until(Instant::now() + Duration::from_secs(60), || open.exists()) {
        return Err("the gate never opened".into());
    }
    Ok(())
}

/// One `gated` on the node's SUB worker.
fn gated_step(orch: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    orch.submit_sub(&HostFn::new("gated", gated).handle(), TaskArgs::new()).map(|_| ())
}

/// `twice_plus_one`, after 30 ms of work: long past the root's checking for the reply.
fn slowly_twice_plus_one(args: &HostArgs<'_>) -> HostResult {
    spin_until(Instant::now() + Duration::from_millis(30), || false);
    twice_plus_one(args)
}

/// One `slowly_twice_plus_one` on the node's SUB worker.
fn slow_step(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    let mut a = TaskArgs::new();
    a.inout(args.tensor(0).unwrap())?;
    orch.submit_sub(&HostFn::new("slowly_twice_plus_one", slowly_twice_plus_one).handle(), a).map(|_| ())
}

/// Fails with a 2 MiB message.
fn huge_error(_: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    Err(simpler::Error::new(ErrorKind::TaskFailed, "x".repeat(2 << 20)))
}

/// An orchestration function with a bug.
fn panics(_: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    panic!("the node's orchestration panicked on purpose")
}

/// The orchestration that stalls on the node.
fn stalled(orch: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    orch.submit_sub(&HostFn::new("stall", stall).handle(), TaskArgs::new()).map(|_| ())
}

/// A node's L3 Worker and orchestration functions: what both roles register (SPMD).
fn node_with(addr: &str) -> Node {
    let mut l3 = Worker::builder().sub_workers(1).build().unwrap();
    l3.register(HostFn::new("twice_plus_one", twice_plus_one)).unwrap();
    l3.register(HostFn::new("stall", stall)).unwrap();
    l3.register(HostFn::new("slowly_twice_plus_one", slowly_twice_plus_one)).unwrap();
    l3.register(HostFn::new("gated", gated)).unwrap();
    l3.register(HostFn::new("copy_words", copy_words)).unwrap();
    let mut node = Node::new(l3, NodeAddr::parse(addr).unwrap(), key()).unwrap();
    node.register_orch(OrchFn::new("gated_step", gated_step));
    node.register_orch(OrchFn::new("step", step));
    node.register_orch(OrchFn::new("slow_step", slow_step));
    node.register_orch(OrchFn::new("stalled", stalled));
    node.register_orch(OrchFn::new("step_all", step_all));
    node.register_orch(OrchFn::new("huge_error", huge_error));
    node.register_orch(OrchFn::new("panics", panics));
    node.register_orch(OrchFn::new("copy_step", copy_step));
    node
}

/// A node on a thread of this process, serving one session; returns its address and thread.
fn thread_node() -> (NodeAddr, std::thread::JoinHandle<simpler::Result<()>>) {
    thread_node_of(|| node_with("127.0.0.1:0"))
}

/// [`thread_node`] serving the node `make` builds (on the node's thread).
fn thread_node_of(
    make: impl FnOnce() -> Node + Send + 'static,
) -> (NodeAddr, std::thread::JoinHandle<simpler::Result<()>>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let bound = make().bind()?;
        tx.send(bound.local_addr()).unwrap();
        bound.serve_one()
    });
    (rx.recv_timeout(Duration::from_secs(30)).expect("the node bound its address"), t)
}

/// The env var that makes `node_process` serve as a node.
const NODE_ENV: &str = "SIMPLER_TEST_REMOTE_NODE";
/// The address `node_process` listens at (default: a free loopback port).
const NODE_ADDR_ENV: &str = "SIMPLER_TEST_REMOTE_NODE_ADDR";
/// Set: `node_process` serves only the orchestration functions it registers by hand.
const NODE_UNLINKED_ENV: &str = "SIMPLER_TEST_REMOTE_NODE_UNLINKED";

/// Not a test of its own: the body of a node process (this test binary started with
/// `NODE_ENV`), which prints its address and serves one session. Ignored, so it runs only when
/// a test starts it.
#[test]
#[ignore = "the body of a node process that a test starts"]
fn node_process() {
    let Some(_) = std::env::var_os(NODE_ENV) else {
        panic!("node_process runs only in a process a test started with {NODE_ENV}");
    };
    let addr = std::env::var(NODE_ADDR_ENV).unwrap_or_else(|_| "127.0.0.1:0".into());
    let linked = std::env::var_os(NODE_UNLINKED_ENV).is_none();
    let bound = node_with(&addr).linked_callables(linked).bind().unwrap();
    let mut out = std::io::stdout();
    writeln!(out, "NODE {}", bound.local_addr()).unwrap();
    out.flush().unwrap();
    bound.serve_one().unwrap();
}

/// Sends `sig` to our own child `pid`.
#[expect(unsafe_code, reason = "kill(2) has no safe wrapper in std")]
fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on our own child with a valid signal; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// A child process killed (SIGKILL) and reaped on drop, also when the test panics.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A node in a process of its own (this binary, in `node_process`), killed on drop.
struct NodeProcess {
    child: KillOnDrop,
    addr: NodeAddr,
}

impl NodeProcess {
    fn start() -> NodeProcess {
        NodeProcess::start_at("127.0.0.1:0")
    }

    /// A node process listening at `addr` (a node restarted where the root knows it).
    fn start_at(addr: &str) -> NodeProcess {
        NodeProcess::start_with(addr, true)
    }

    /// A node process at `addr`, serving the binary's `#[callable(orch)]`s or not (`linked`).
    fn start_with(addr: &str, linked: bool) -> NodeProcess {
        let mut command = Command::new(std::env::current_exe().unwrap());
        if !linked {
            command.env(NODE_UNLINKED_ENV, "1");
        }
        let mut child = command
            .args(["--exact", "node_process", "--ignored", "--nocapture", "--test-threads=1"])
            .env(NODE_ENV, "1")
            .env(NODE_ADDR_ENV, addr)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut reader = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let addr = loop {
            line.clear();
            assert!(reader.read_line(&mut line).unwrap() > 0, "the node process ended before binding");
            // libtest may print "test node_process ... " on the same line first.
            if let Some(a) = line.split("NODE ").nth(1) {
                break NodeAddr::parse(a.trim()).unwrap();
            }
        };
        // Keep draining its output so it never blocks on a full pipe.
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        NodeProcess { child: KillOnDrop(child), addr }
    }

    fn pid(&self) -> i32 {
        self.child.0.id() as i32
    }
}

/// Closes `root`, waits for the thread nodes to end their sessions, then checks that nothing
/// of the test is left (the nodes' processes and buffers are this process's too).
fn finish(root: Worker, nodes: Vec<std::thread::JoinHandle<simpler::Result<()>>>) {
    let pids = root.child_pids();
    root.close().expect("the root closes");
    for n in nodes {
        n.join().unwrap().expect("the node served its session");
    }
    assert_left_nothing(&pids);
}

/// An L4 Worker (not initialized) with one local L3 (one SUB worker) and the remote nodes
/// `addrs`, `step` and `stalled` registered.
fn root_worker(addrs: &[NodeAddr], health: Duration) -> Worker {
    root_worker_from(Worker::builder(), addrs, health)
}

/// [`root_worker`] from `builder`.
fn root_worker_from(builder: simpler::WorkerBuilder, addrs: &[NodeAddr], health: Duration) -> Worker {
    with_orchs(root_builder(builder, addrs, health).build().unwrap())
}

/// `builder` at L4 with one local L3 (one SUB worker, worker 0) and the remote nodes `addrs`.
fn root_builder(
    builder: simpler::WorkerBuilder,
    addrs: &[NodeAddr],
    health: Duration,
) -> simpler::WorkerBuilder {
    let mut local = Worker::builder().sub_workers(1).build().unwrap();
    local.register(HostFn::new("twice_plus_one", twice_plus_one)).unwrap();
    local.register(HostFn::new("stall", stall)).unwrap();
    let mut builder = builder.level(Level::Network1).worker(local);
    for a in addrs {
        builder = builder.remote_worker(RemoteWorker::new(a.clone(), key()).health_timeout(health));
    }
    builder
}

/// `w` with the root's orchestration functions registered.
fn with_orchs(mut w: Worker) -> Worker {
    w.register_orch(OrchFn::new("step", step)).unwrap();
    w.register_orch(OrchFn::new("stalled", stalled)).unwrap();
    w.register_orch(OrchFn::new("step_all", step_all)).unwrap();
    w.register_orch(OrchFn::new("huge_error", huge_error)).unwrap();
    w.register_orch(OrchFn::new("slow_step", slow_step)).unwrap();
    w.register_orch(OrchFn::new("panics", panics)).unwrap();
    w.register_orch(OrchFn::new("gated_step", gated_step)).unwrap();
    w.register_orch(OrchFn::new("copy_step", copy_step)).unwrap();
    w
}

/// An L4 with one local L3 (one SUB worker) and the remote nodes `addrs`, `step` registered.
fn root_with(addrs: &[NodeAddr], health: Duration) -> Rig {
    let mut rig = Rig::new(root_builder(Worker::builder(), addrs, health));
    rig.register_orch(OrchFn::new("step", step)).unwrap();
    rig.register_orch(OrchFn::new("stalled", stalled)).unwrap();
    rig
}

/// Runs `step` on worker `w` over words `from..from + n` of `buf`.
fn step_on(rig: &Worker, buf: &simpler::Buffer, from: usize, n: usize, w: u32) -> simpler::Result<()> {
    let t = u64s(buf, from, n);
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.inout(&t)?;
        orch.submit_next_level(&OrchFn::new("step", step).handle(), a, CallConfig::default(), w).map(|_| ())
    })
}

#[isolated_test]
fn a_graph_runs_across_a_local_and_two_remote_l3_workers() {
    let (a1, n1) = thread_node();
    let (a2, n2) = thread_node();
    let mut rig = root_worker(&[a1.clone(), a2.clone()], Duration::from_secs(2));
    rig.init().unwrap();
    let kinds: Vec<_> = rig.workers().iter().map(|w| (w.kind, w.id, w.state)).collect();
    assert!(kinds.contains(&(WorkerKind::Remote, 1, WorkerState::Alive)), "{kinds:?}");
    assert!(kinds.contains(&(WorkerKind::Remote, 2, WorkerState::Alive)), "{kinds:?}");
    let buf = u64_buffer(&rig, 12);
    buf.write(0, &(0..12u64).collect::<Vec<_>>()).unwrap();
    // One run: a chain per worker, over disjoint words, then a second pass on the other nodes.
    let (x0, x1, x2) = (u64s(&buf, 0, 4), u64s(&buf, 4, 4), u64s(&buf, 8, 4));
    rig.run(|orch| {
        let h = OrchFn::new("step", step).handle();
        for (t, w) in [(&x0, 0u32), (&x1, 1), (&x2, 2), (&x0, 2), (&x1, 0), (&x2, 1)] {
            let mut a = TaskArgs::new();
            a.inout(t)?;
            orch.submit_next_level(&h, a, CallConfig::default(), w)?;
        }
        Ok(())
    })
    .expect("the run across local and remote Workers");
    let want: Vec<u64> = (0..12u64).map(|v| (v * 2 + 1) * 2 + 1).collect();
    assert_eq!(read_u64(&buf, 0, 12), want);
    // Data written on a node comes back, and can go out again in the next run.
    step_on(&rig, &buf, 4, 4, 2).unwrap();
    assert_eq!(read_u64(&buf, 4, 4), want[4..8].iter().map(|v| v * 2 + 1).collect::<Vec<_>>());
    drop((x0, x1, x2, buf));
    finish(rig, vec![n1, n2]); // closing the root ends each node's session
}

/// Runs on an L4 under an L5: `step` on the L4's worker 1 (a remote one).
fn step_on_remote(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    let mut a = TaskArgs::new();
    a.inout(args.tensor(0).unwrap())?;
    orch.submit_next_level(&OrchFn::new("step", step).handle(), a, CallConfig::default(), 1).map(|_| ())
}

/// An L4 with a remote Worker under an L5: the L4's process (started by exec, the default) is
/// rebuilt from its start spec with its remote Worker, which it connects to itself.
#[isolated_test]
fn an_l4_under_an_l5_drives_its_remote_worker() {
    let (addr, node) = thread_node();
    let l4 = root_worker(&[addr], Duration::from_secs(2));
    let mut l5 = Worker::builder().level(Level::Network2).worker(l4).build().unwrap();
    let fwd = l5.register_orch(OrchFn::new("step_on_remote", step_on_remote)).unwrap();
    l5.init().unwrap();
    let buf = u64_buffer(&l5, 4);
    buf.write(0, &[0u64, 1, 2, 3]).unwrap();
    let t = u64s(&buf, 0, 4);
    l5.run(|orch| {
        let mut a = TaskArgs::new();
        a.inout(&t)?;
        orch.submit_next_level(&fwd, a, CallConfig::default(), 0).map(|_| ())
    })
    .expect("the L4 under the L5 ran the task on its node");
    assert_eq!(read_u64(&buf, 0, 4), vec![1, 3, 5, 7]);
    drop((t, buf));
    finish(l5, vec![node]);
}

#[isolated_test]
fn large_tensors_go_to_the_node_and_back_run_after_run() {
    let (addr, node) = thread_node();
    let mut rig = root_worker(&[addr], Duration::from_secs(5));
    rig.init().unwrap();
    // Two 2 MiB tensors and a small one between them, in one task: the large ones travel
    // straight from the root's buffer to the node's and back, the small one with the head.
    const BIG: usize = 1 << 18;
    let n = 2 * BIG + 8;
    let buf = u64_buffer(&rig, n);
    let mut want: Vec<u64> = (0..n as u64).map(|v| v * 3).collect();
    buf.write(0, &want).unwrap();
    let (big, small, tail) = (u64s(&buf, 0, BIG), u64s(&buf, BIG, 8), u64s(&buf, BIG + 8, BIG));
    // Several runs: the node reuses its buffers from the second on.
    for round in 0..3 {
        rig.run(|orch| {
            let mut a = TaskArgs::new();
            a.inout(&big)?;
            a.inout(&small)?;
            a.inout(&tail)?;
            orch.submit_next_level(&OrchFn::new("step_all", step_all).handle(), a, CallConfig::default(), 1)
                .map(|_| ())
        })
        .unwrap_or_else(|e| panic!("round {round}: {e}"));
        want.iter_mut().for_each(|v| *v = *v * 2 + 1);
        assert!(read_u64(&buf, 0, n) == want, "round {round}: the words differ from what the node computed");
    }
    // A tile from the middle of the buffer, in a buffer the node reused: only its words come
    // back changed.
    step_on(&rig, &buf, 1000, 100_000, 1).unwrap();
    want[1000..101_000].iter_mut().for_each(|v| *v = *v * 2 + 1);
    assert!(read_u64(&buf, 0, n) == want, "only the tile's words change");
    drop((big, small, tail, buf));
    finish(rig, vec![node]);
}

/// Runs the orchestration `f` on a node, which must fail alone: the session stays up and the
/// node serves the next task. Returns the failed task's error.
fn fails_alone_on_a_node(f: OrchFn) -> simpler::Error {
    let (addr, node) = thread_node();
    let mut rig = root_worker(&[addr], Duration::from_secs(5));
    rig.init().unwrap();
    let h = f.handle();
    let err = rig
        .run(|orch| orch.submit_next_level(&h, TaskArgs::new(), CallConfig::default(), 1).map(|_| ()))
        .expect_err("the task fails");
    let buf = u64_buffer(&rig, 2);
    step_on(&rig, &buf, 0, 2, 1).expect("the node serves the next task");
    assert_eq!(read_u64(&buf, 0, 2), vec![1, 1]);
    drop(buf);
    finish(rig, vec![node]);
    err
}

#[isolated_test]
fn a_task_failing_with_a_huge_message_fails_alone_and_the_node_serves_on() {
    let err = fails_alone_on_a_node(OrchFn::new("huge_error", huge_error));
    assert_eq!(err.kind(), ErrorKind::TaskFailed, "{}", &err.message()[..200.min(err.message().len())]);
    assert!(err.message().len() < 128 << 10, "the message was cut: {} bytes", err.message().len());
    assert!(err.message().contains("more bytes]"));
}

/// A panic in the orchestration function a node runs fails that task alone, with the
/// panic's message; the session stays up and the node serves the next task.
#[isolated_test]
fn a_task_whose_orchestration_panics_on_the_node_fails_alone_and_the_node_serves_on() {
    let err = fails_alone_on_a_node(OrchFn::new("panics", panics));
    assert_eq!(err.kind(), ErrorKind::TaskFailed, "{err}");
    let msg = err.message();
    assert!(msg.contains("`panics`") && msg.contains("remote worker 1"), "{msg}");
    assert!(msg.contains("panicked: the node's orchestration panicked on purpose"), "{msg}");
}

#[isolated_test]
fn a_root_with_the_wrong_key_is_refused_and_the_node_serves_the_next_one() {
    let (addr, node) = thread_node();
    let wrong = ClusterKey::new("not the cluster's secret at all").unwrap();
    let mut l4 = Worker::builder()
        .level(Level::Network1)
        .remote_worker(RemoteWorker::new(addr.clone(), wrong))
        .build()
        .unwrap();
    let err = l4.init().expect_err("the node refuses the key");
    assert!(err.message().contains(&addr.to_string()), "{err}");
    assert!(err.message().contains("refused"), "{err}");
    // Nothing changed on the node: the right root is served.
    let mut rig = root_worker(&[addr], Duration::from_secs(2));
    rig.init().unwrap();
    let buf = u64_buffer(&rig, 2);
    step_on(&rig, &buf, 0, 2, 1).unwrap();
    assert_eq!(read_u64(&buf, 0, 2), vec![1, 1]);
    drop(buf);
    finish(rig, vec![node]);
}

fn only_here(_o: &mut Orchestrator<'_>, _a: &TaskArgs, _c: &CallConfig) -> simpler::Result<()> {
    Ok(())
}

#[isolated_test]
fn an_orchestration_the_node_lacks_fails_init_naming_digest_name_and_node() {
    let (addr, node) = thread_node();
    let mut rig = root_worker(std::slice::from_ref(&addr), Duration::from_secs(2));
    let h = rig.register_orch(OrchFn::new("only_here", only_here)).unwrap();
    let err = rig.init().expect_err("the node does not run `only_here`");
    assert_err(&err, ErrorKind::Callable, &["only_here", &h.digest().to_string(), &addr.to_string()]);
    // The failed init ended the session: the node's serve_one returns.
    node.join().unwrap().expect("the node's session ended cleanly");
    assert!(leftover_shm().is_empty(), "{:?}", leftover_shm());
}

fn also_here(_o: &mut Orchestrator<'_>, _a: &TaskArgs, _c: &CallConfig) -> simpler::Result<()> {
    Ok(())
}

#[isolated_test]
fn an_orchestration_placed_on_some_workers_is_asked_only_of_those_nodes_and_refused_elsewhere() {
    let (a1, n1) = thread_node();
    let (a2, n2) = thread_node();
    let mut rig = root_worker(&[a1, a2.clone()], Duration::from_secs(2));
    // No node has `only_here`: placed on the local worker 0 alone, no node is asked for it.
    let here = rig.register_orch_on(OrchFn::new("only_here", only_here), &[0]).unwrap();
    let step_h = OrchFn::new("step", step).handle();
    rig.init().expect("no node is asked for what is not placed on it");
    let buf = u64_buffer(&rig, 1);
    let t = u64s(&buf, 0, 1);
    let on = |rig: &Worker, h: &simpler::CallableHandle, w: u32| {
        rig.run(|orch| {
            let mut a = TaskArgs::new();
            a.inout(&t)?;
            orch.submit_next_level(h, a, CallConfig::default(), w).map(|_| ())
        })
    };
    on(&rig, &here, 0).expect("worker 0 has it");
    for w in [1, 2] {
        let err = on(&rig, &here, w).expect_err("the nodes do not have it");
        assert_err(
            &err,
            ErrorKind::Callable,
            &["only_here", &format!("not on worker {w}"), "only worker 0 has it"],
        );
    }
    let err = rig
        .run(|orch| {
            let mut a = TaskArgs::new();
            a.inout(&t)?;
            orch.submit_next_level_group(&here, vec![a.clone(), a], CallConfig::default(), &[0, 1])
                .map(|_| ())
        })
        .expect_err("a group member on a worker without it");
    assert_err(&err, ErrorKind::Callable, &["submit_next_level_group", "not on worker 1"]);
    on(&rig, &step_h, 2).expect("what is everywhere runs everywhere");
    assert_eq!(read_u64(&buf, 0, 1), vec![1]);
    // After init, too, only the nodes named are asked.
    let err = rig.register_orch_on(OrchFn::new("also_here", also_here), &[0, 2]).unwrap_err();
    assert_err(&err, ErrorKind::Callable, &["also_here", "not registered on the node", &a2.to_string()]);
    let also = rig.register_orch_on(OrchFn::new("also_here", also_here), &[0]).expect("no node asked");
    on(&rig, &also, 0).unwrap();
    // One placement per function while it is registered; ids this Worker has, once each.
    let err = rig.register_orch_on(OrchFn::new("only_here", only_here), &[0, 1]).unwrap_err();
    assert_err(
        &err,
        ErrorKind::Callable,
        &["only_here", "registered on workers 0 already", "now on workers 0, 1"],
    );
    let err = rig.register_orch(OrchFn::new("only_here", only_here)).unwrap_err();
    assert_err(&err, ErrorKind::Callable, &["only_here", "now on every nested and remote Worker"]);
    let err = rig.register_orch_on(OrchFn::new("x", also_here), &[3]).unwrap_err();
    assert_err(&err, ErrorKind::InvalidArgument, &["worker 3 does not exist", "3 nested and remote Workers"]);
    let err = rig.register_orch_on(OrchFn::new("x", also_here), &[1, 1]).unwrap_err();
    assert_err(&err, ErrorKind::InvalidArgument, &["worker 1 is named twice"]);
    let err = rig.register_orch_on(OrchFn::new("x", also_here), &[]).unwrap_err();
    assert_err(&err, ErrorKind::InvalidArgument, &["no workers named"]);
    drop((t, buf));
    finish(rig, vec![n1, n2]);
}

/// `x += 10` on a SUB worker (linked: every L3 with SUB workers registers it at `init`).
#[simpler::callable(sub)]
fn add_ten(mut x: simpler::dsl::InOut<u64>) {
    x.iter_mut().for_each(|v| *v += 10);
}

/// A linked orchestration function: a root registers it at `init` on the workers that have it;
/// the nodes of this binary serve it unless built with `linked_callables(false)`.
#[simpler::callable(orch)]
fn add_ten_there(o: &mut Orchestrator<'_>, x: simpler::dsl::InOut<u64>) -> simpler::Result<()> {
    add_ten::call(&mut x)?.on(o, simpler::dsl::sub())?;
    Ok(())
}

#[isolated_test]
fn a_linked_orchestration_goes_only_to_the_nodes_that_serve_it() {
    let (a1, n1) = thread_node();
    let (a2, n2) = thread_node_of(|| node_with("127.0.0.1:0").linked_callables(false));
    let mut rig = root_worker(&[a1, a2], Duration::from_secs(2));
    rig.init().expect("a node without a linked orchestration function is no obstacle");
    let buf = u64_buffer(&rig, 1);
    let mut t = buf.typed::<u64>(&[1]).unwrap();
    for w in [0, 1] {
        rig.run(|o| add_ten_there::call(&mut t)?.on(o, simpler::dsl::worker(w)).map(|_| ())).unwrap();
    }
    assert_eq!(read_u64(&buf, 0, 1), vec![20], "ran on worker 0 and on the node that serves it");
    let err = rig
        .run(|o| add_ten_there::call(&mut t)?.on(o, simpler::dsl::worker(2)).map(|_| ()))
        .expect_err("node 2 does not serve it");
    assert_err(&err, ErrorKind::Callable, &["add_ten_there", "not on worker 2", "only workers 0, 1 have it"]);
    assert_eq!(read_u64(&buf, 0, 1), vec![20]);
    // What the root registers explicitly is still required of every node.
    drop((t, buf));
    finish(rig, vec![n1, n2]);
}

#[isolated_test]
fn a_node_killed_mid_task_fails_the_task_naming_it_and_rejoins_once_restarted() {
    let node = NodeProcess::start();
    let mut rig = root_with(std::slice::from_ref(&node.addr), Duration::from_secs(2));
    rig.init();
    let h = OrchFn::new("stalled", stalled).handle();
    let marker = stall_marker(node.pid() as u32);
    let _files = TempFiles::new([marker.clone()]);
    let run = rig
        .submit(|orch| orch.submit_next_level(&h, TaskArgs::new(), CallConfig::default(), 1).map(|_| ()))
        .unwrap();
    wait_for_marker(&marker, "the task to run on the node");
    sigkill(node.pid());
    let started = Instant::now();
    let err = run.wait().expect_err("the node died under the task");
    assert!(started.elapsed() < Duration::from_secs(3), "noticed in {:?}", started.elapsed());
    assert_err(&err, ErrorKind::WorkerDied, &["stalled", &node.addr.to_string()]);
    let remote = rig.workers().into_iter().find(|w| w.kind == WorkerKind::Remote).unwrap();
    assert_eq!(remote.state, WorkerState::Lost);
    // Its node is not started from here: `replace_dead_workers` leaves it, and replacing it
    // while nothing listens at its address says so and leaves it lost.
    assert!(rig.replace_dead_workers().unwrap().is_empty());
    let err = rig.replace_worker(WorkerKind::Remote, remote.id).unwrap_err();
    // ("cannot connect", or a handshake reset while the dead node's last processes go.)
    assert_err(&err, ErrorKind::WorkerDied, &[&node.addr.to_string()]);
    assert!(["cannot connect", "handshake"].iter().any(|w| err.message().contains(w)), "{err}");
    let err = rig.run(|o| o.submit_next_level(&h, TaskArgs::new(), CallConfig::default(), 1).map(|_| ()));
    let err = err.unwrap_err();
    assert_err(&err, ErrorKind::WorkerDied, &[&node.addr.to_string()]);
    assert_eq!(err.message().matches(&node.addr.to_string()).count(), 1, "the node is named once: {err}");
    // The local L3 still works; close does not hang.
    let buf = u64_buffer(&rig, 1);
    step_on(&rig, &buf, 0, 1, 0).unwrap();
    // The node restarted at its address (by hand, or by a supervisor) rejoins, and later runs
    // go to it again.
    let addr = node.addr.to_string();
    drop(node);
    let again = NodeProcess::start_at(&addr);
    let back = rig.replace_worker(WorkerKind::Remote, remote.id).expect("the restarted node rejoins");
    assert_eq!((back.state, back.pid), (WorkerState::Alive, again.pid()));
    step_on(&rig, &buf, 0, 1, 1).unwrap();
    assert_eq!(read_u64(&buf, 0, 1), vec![3], "0 -> 1 on worker 0, then -> 3 on the rejoined node");
    let err = rig.replace_worker(WorkerKind::Remote, remote.id).unwrap_err();
    assert_err(&err, ErrorKind::InvalidState, &["in service"]);
    drop(buf);
}

#[isolated_test]
fn a_node_that_stops_in_the_middle_of_a_large_transfer_is_lost_and_nothing_hangs() {
    let node = NodeProcess::start();
    let mut rig = root_with(std::slice::from_ref(&node.addr), Duration::from_millis(500));
    rig.init();
    // 128 MiB to send: far more than the socket buffers hold, so the root's writer is still
    // sending when the node stops reading (or has not started: either way it must not hang).
    let words = 16 << 20;
    let buf = rig.create_buffer(8 * words).unwrap();
    let t = u64s(&buf, 0, words);
    let h = OrchFn::new("step", step).handle();
    let run = rig
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.inout(&t)?;
            orch.submit_next_level(&h, a, CallConfig::default(), 1).map(|_| ())
        })
        .unwrap();
    signal(node.pid(), libc::SIGSTOP);
    let started = Instant::now();
    let err = run.wait().expect_err("the node stopped under the transfer");
    assert!(started.elapsed() < Duration::from_secs(3), "noticed in {:?}", started.elapsed());
    assert_err(&err, ErrorKind::WorkerDied, &["step", &node.addr.to_string()]);
    // The local L3 still works, and close returns although the node never read the bytes.
    let small = u64_buffer(&rig, 1);
    step_on(&rig, &small, 0, 1, 0).unwrap();
    drop((t, buf, small));
    let closing = Instant::now();
    rig.close().expect("close");
    assert!(closing.elapsed() < Duration::from_secs(3), "close took {:?}", closing.elapsed());
    signal(node.pid(), libc::SIGCONT);
}

#[isolated_test]
fn a_node_that_stops_answering_is_lost_within_its_health_timeout() {
    let node = NodeProcess::start();
    let mut rig = root_with(std::slice::from_ref(&node.addr), Duration::from_millis(500));
    rig.init();
    // SIGSTOP: the process lives, but sends nothing (no heartbeat, no completion).
    signal(node.pid(), libc::SIGSTOP);
    // kill(2) returns before the stop takes effect: wait until every thread of it is stopped.
    let stopped = || {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", node.pid())).into_iter().flatten().flatten();
        tasks
            .map(|t| std::fs::read_to_string(t.path().join("stat")).unwrap_or_default())
            .all(|stat| stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('T')))
    };
    wait_for("the node process to be stopped", Duration::from_secs(10), stopped);
    let h = OrchFn::new("step", step).handle();
    let buf = u64_buffer(&rig, 1);
    let t = u64s(&buf, 0, 1);
    let started = Instant::now();
    let err = rig
        .run(|orch| {
            let mut a = TaskArgs::new();
            a.inout(&t)?;
            orch.submit_next_level(&h, a, CallConfig::default(), 1).map(|_| ())
        })
        .expect_err("the node is silent");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "noticed in {took:?}");
    assert_err(&err, ErrorKind::WorkerDied, &[&node.addr.to_string(), "stopped answering"]);
    signal(node.pid(), libc::SIGCONT);
    drop(buf);
}

#[isolated_test]
fn garbage_on_the_wire_is_refused_and_the_node_keeps_serving() {
    let (addr, node) = thread_node();
    let NodeAddr::Tcp(sock) = addr.clone() else { panic!("a TCP node") };
    for garbage in [&b"GET / HTTP/1.1\r\n\r\n"[..], &[0u8; 3][..], &[0xffu8; 64][..]] {
        let mut s = std::net::TcpStream::connect(sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(garbage);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest); // the node closes the connection
    }
    let mut rig = root_worker(&[addr], Duration::from_secs(2));
    rig.init().unwrap();
    let buf = u64_buffer(&rig, 1);
    step_on(&rig, &buf, 0, 1, 1).unwrap();
    drop(buf);
    finish(rig, vec![node]);
}

/// The env var that makes `root_process` act as a root driving the node at its value.
const ROOT_ENV: &str = "SIMPLER_TEST_REMOTE_ROOT";

/// Not a test of its own: the body of a root process (this test binary started with
/// `ROOT_ENV`), which sends a task that stalls on the node and waits on it. Ignored, so it runs
/// only when a test starts it.
#[test]
#[ignore = "the body of a root process that a test starts"]
fn root_process() {
    let Some(addr) = std::env::var_os(ROOT_ENV) else {
        panic!("root_process runs only in a process a test started with {ROOT_ENV}");
    };
    let addr = NodeAddr::parse(&addr.to_string_lossy()).unwrap();
    let mut root = root_worker(&[addr], Duration::from_secs(2));
    root.init().unwrap();
    let h = OrchFn::new("stalled", stalled).handle();
    let run = root
        .submit(|orch| orch.submit_next_level(&h, TaskArgs::new(), CallConfig::default(), 1).map(|_| ()))
        .unwrap();
    let _ = run.wait(); // killed meanwhile
}

/// A root process (`root_process`) driving the thread node at `addr`, once its task stalls
/// on the node.
fn root_with_a_stalled_task(addr: &NodeAddr) -> KillOnDrop {
    let marker = stall_marker(std::process::id());
    let _files = TempFiles::new([marker.clone()]);
    let root = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "root_process", "--ignored", "--nocapture", "--test-threads=1"])
            .env(ROOT_ENV, addr.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("the root's task to run on the node", Duration::from_secs(30), || marker.exists());
    root
}

#[isolated_test]
fn a_root_killed_mid_task_ends_the_node_session_and_its_task() {
    let (addr, node) = thread_node();
    let root = root_with_a_stalled_task(&addr);
    drop(root); // SIGKILL, and reaped
    let killed = Instant::now();
    // The node notices the closed connection, cancels the task (stopping the SUB worker that
    // ran it) and ends the session, long before the task would have ended on its own.
    let served = node.join().unwrap();
    assert!(killed.elapsed() < Duration::from_secs(5), "the node took {:?}", killed.elapsed());
    served.expect("a root that disappears ends the session cleanly");
    assert!(leftover_shm().is_empty(), "{:?}", leftover_shm());
}

/// A root that stops (SIGSTOP, or a network that drops everything) is alive as far as the
/// node's sockets can tell, for many minutes: the node hears no answer to its heartbeats for
/// 3 s, ends the session (cancelling the task it ran for that root), and `serve_one` returns.
#[isolated_test]
fn a_root_that_stops_answering_loses_its_node_session_within_seconds() {
    let (addr, node) = thread_node();
    let root = root_with_a_stalled_task(&addr);
    signal(root.0.id() as i32, libc::SIGSTOP);
    wait_for("the node to end the stopped root's session", Duration::from_secs(10), || node.is_finished());
    node.join().unwrap().expect("a root that falls silent ends the session cleanly");
    drop(root); // SIGKILL, and reaped
}

#[isolated_test]
fn a_launched_job_connects_its_nodes_to_the_root_by_rank() {
    // Three ranks as a launcher would start them, here as threads: the root listens at the
    // address every rank was given; ranks 1 and 2 connect to it (before or after it listens).
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let root_addr = NodeAddr::loopback(port);
    let nodes: Vec<_> = (1..3)
        .map(|rank| {
            let launch = simpler::remote::Launch::new(rank, 3, root_addr.clone()).unwrap();
            std::thread::spawn(move || node_with("127.0.0.1:0").serve_launch(&launch))
        })
        .collect();
    let launch = simpler::remote::Launch::new(0, 3, root_addr).unwrap();
    let builder =
        root_builder(Worker::builder(), &[], Duration::from_secs(2)).launched_workers(&launch, key());
    let mut root = with_orchs(builder.build().unwrap());
    assert_eq!((root.nested_workers(), root.remote_workers()), (1, 2)); // ids 0; 1 and 2
    root.init().unwrap();
    let names: Vec<String> =
        root.workers().iter().filter(|w| w.kind == WorkerKind::Remote).map(|w| format!("{}", w.id)).collect();
    assert_eq!(names, ["1", "2"]);
    let buf = u64_buffer(&root, 2);
    step_on(&root, &buf, 0, 1, 1).unwrap();
    step_on(&root, &buf, 1, 1, 2).unwrap();
    assert_eq!(read_u64(&buf, 0, 2), vec![1, 1]);
    // A node that is not part of the launch is refused by its rank.
    let err = root_builder(Worker::builder(), &[], Duration::from_secs(2))
        .launched_workers(&simpler::remote::Launch::new(1, 3, NodeAddr::loopback(1)).unwrap(), key())
        .build()
        .unwrap_err();
    assert_err(&err, ErrorKind::InvalidArgument, &["rank 1", "root"]);
    drop(buf);
    finish(root, nodes);
}

#[isolated_test]
fn node_resident_memory_stays_on_the_node_across_runs() {
    let (addr, node) = thread_node();
    let mut root = root_worker(std::slice::from_ref(&addr), Duration::from_secs(2));
    root.init().unwrap();
    // Worker 1 is the node: a buffer that lives there.
    let dev = root.alloc_child_tensor(1, &[4], simpler::DataType::Uint64).unwrap();
    let host = u64_buffer(&root, 4);
    host.write(0, &[1u64, 2, 3, 4]).unwrap();
    root.copy_to(&dev, &host).unwrap();
    let t = dev.tensor(&[4], simpler::DataType::Uint64).unwrap();
    let h = OrchFn::new("step", step).handle();
    for _ in 0..2 {
        root.run(|orch| {
            let mut a = TaskArgs::new();
            a.inout(&t)?;
            orch.submit_next_level(&h, a, CallConfig::default(), 1).map(|_| ())
        })
        .expect("a run on the node-resident buffer");
    }
    // Controls from two threads at once each get their own reply.
    let other = root.alloc_child_tensor(1, &[4], simpler::DataType::Uint64).unwrap();
    std::thread::scope(|s| {
        for target in [&other, &other] {
            let (root, host) = (&root, &host);
            s.spawn(move || {
                for _ in 0..20 {
                    root.copy_to(target, host).expect("a concurrent copy_to");
                }
            });
        }
    });
    root.free(&other).unwrap();
    let back = u64_buffer(&root, 4);
    root.copy_from(&back, &dev).unwrap();
    assert_eq!(
        read_u64(&back, 0, 4),
        vec![7, 11, 15, 19],
        "(x * 2 + 1) * 2 + 1, computed in place on the node"
    );
    assert_eq!(read_u64(&host, 0, 4), vec![1, 2, 3, 4], "the host copy is untouched");
    // The local L3 cannot use it; after free nothing can.
    let err = root
        .run(|orch| {
            let mut a = TaskArgs::new();
            a.inout(&t)?;
            orch.submit_next_level(&h, a, CallConfig::default(), 0).map(|_| ())
        })
        .unwrap_err();
    assert_err(&err, ErrorKind::InvalidArgument, &["lives on worker 1", "runs on worker 0"]);
    drop(t);
    root.free(&dev).unwrap();
    assert_err(&root.copy_from(&back, &dev).unwrap_err(), ErrorKind::InvalidState, &["freed"]);
    drop((dev, other, host, back));
    finish(root, vec![node]);
}

/// A tensor one node holds, written there and read by a task on another node: its bytes go
/// from node to node (the root never holds them: they exist only on the first node), a task
/// may not write another node's memory, and a freed buffer is read by nobody.
#[isolated_test]
fn a_tensor_written_on_one_node_is_read_on_another_straight_from_it() {
    let (a, node_a) = thread_node();
    let (b, node_b) = thread_node();
    let mut root = root_worker(&[a, b], Duration::from_secs(2));
    root.init().unwrap();
    // Worker 1 is node A, worker 2 node B: a buffer on A, written there by `step` (x * 2 + 1),
    // so its new values exist on A alone.
    let n = 1 << 16; // 512 KiB: the bulk path, not the small one
    let on_a = root.alloc_child_tensor(1, &[n as u32], simpler::DataType::Uint64).unwrap();
    let host = u64_buffer(&root, n);
    host.write(0, &(0..n as u64).collect::<Vec<_>>()).unwrap();
    root.copy_to(&on_a, &host).unwrap();
    let t = on_a.tensor(&[n as u32], simpler::DataType::Uint64).unwrap();
    let out = u64_buffer(&root, n);
    let (step_h, copy_h) = (OrchFn::new("step", step).handle(), OrchFn::new("copy_step", copy_step).handle());
    for round in 0..2 {
        root.run(|orch| {
            let mut w = TaskArgs::new();
            w.inout(&t)?;
            orch.submit_next_level(&step_h, w, CallConfig::default(), 1)?;
            // On B, after the write on A (the tensor orders them): a view of words 8.. of it.
            let mut r = TaskArgs::new();
            r.input(&on_a.view(simpler::memory::TensorView::new(
                64,
                &[(n - 8) as u32],
                None,
                simpler::DataType::Uint64,
            )?)?)?;
            r.output(&u64s(&out, 0, n - 8))?;
            orch.submit_next_level(&copy_h, r, CallConfig::default(), 2).map(|_| ())
        })
        .expect("a run across the two nodes");
        let expect: Vec<u64> =
            (8..n as u64).map(|x| if round == 0 { x * 2 + 1 } else { (x * 2 + 1) * 2 + 1 }).collect();
        assert_eq!(read_u64(&out, 0, n - 8), expect, "round {round}: B read what A wrote");
    }
    assert_eq!(read_u64(&host, 0, 4), vec![0, 1, 2, 3], "the root's copy never saw A's values");
    // Writing another node's memory is refused at submit, naming both.
    let err = root
        .run(|orch| {
            let mut w = TaskArgs::new();
            w.inout(&t)?;
            orch.submit_next_level(&step_h, w, CallConfig::default(), 2).map(|_| ())
        })
        .unwrap_err();
    assert_err(&err, ErrorKind::InvalidArgument, &["lives on worker 1", "worker 2 would write it"]);
    // Freed: nobody reads it.
    drop(t);
    root.free(&on_a).unwrap();
    let err = root
        .run(|orch| {
            let mut r = TaskArgs::new();
            r.input(&on_a.tensor(&[n as u32], simpler::DataType::Uint64)?)?;
            r.output(&u64s(&out, 0, n))?;
            orch.submit_next_level(&copy_h, r, CallConfig::default(), 2).map(|_| ())
        })
        .unwrap_err();
    assert_err(&err, ErrorKind::InvalidArgument, &["freed"]);
    drop((on_a, host, out));
    finish(root, vec![node_a, node_b]);
}

/// The root's driver reads a quick COMPLETION itself; a slow one, after the driver went to
/// sleep, is read by the session's reader thread, and so are control replies while a task
/// runs; then quick tasks go back to the driver.
#[isolated_test]
fn replies_come_back_whoever_reads_them_slow_quick_and_controls_mid_task() {
    let (addr, node) = thread_node();
    let mut root = root_worker(std::slice::from_ref(&addr), Duration::from_secs(2));
    root.init().unwrap();
    let buf = u64_buffer(&root, 4);
    buf.write(0, &[1u64, 2, 3, 4]).unwrap();
    let t = u64s(&buf, 0, 4);
    let dev = root.alloc_child_tensor(1, &[4], simpler::DataType::Uint64).unwrap();
    let host = u64_buffer(&root, 4);
    let (quick, slow) = (OrchFn::new("step", step).handle(), OrchFn::new("slow_step", slow_step).handle());
    let once = |h: &simpler::CallableHandle| {
        let mut a = TaskArgs::new();
        a.inout(&t).unwrap();
        let h = h.clone();
        root.submit(move |orch| orch.submit_next_level(&h, a, CallConfig::default(), 1).map(|_| ())).unwrap()
    };
    let mut want = vec![1u64, 2, 3, 4];
    for round in 0..3 {
        for h in [&quick, &slow, &quick, &quick] {
            let run = once(h);
            if round == 1 && h == &slow {
                // Controls while the slow task runs: their replies come on the same socket.
                for _ in 0..3 {
                    root.copy_to(&dev, &host).expect("a control while a task runs");
                }
            }
            run.wait().expect("the remote task");
            want.iter_mut().for_each(|v| *v = *v * 2 + 1);
            assert_eq!(read_u64(&buf, 0, 4), want, "round {round}");
        }
    }
    root.free(&dev).unwrap();
    drop((t, buf, dev, host));
    finish(root, vec![node]);
}

#[isolated_test]
fn a_session_runs_over_a_unix_socket_and_late_registrations_ask_the_node() {
    let path = std::env::temp_dir().join(format!("simpler-remote-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let addr = NodeAddr::parse(&format!("unix:{}", path.display())).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let at = addr.clone();
    let node = std::thread::spawn(move || {
        let bound = node_with(&at.to_string()).bind()?;
        tx.send(()).unwrap();
        bound.serve_one()
    });
    rx.recv().unwrap();
    let mut root = root_worker(std::slice::from_ref(&addr), Duration::from_secs(2));
    root.init().unwrap();
    let buf = u64_buffer(&root, 1);
    step_on(&root, &buf, 0, 1, 1).unwrap();
    assert_eq!(read_u64(&buf, 0, 1), vec![1]);
    // Registered after init: the node is asked, and refuses what it does not run.
    let err = root.register_orch(OrchFn::new("only_here", only_here)).unwrap_err();
    assert_err(&err, ErrorKind::Callable, &["only_here", "not registered on the node"]);
    drop(buf);
    finish(root, vec![node]);
    assert!(!path.exists(), "the node removed its socket file");
}

/// A control that gives up while the node is busy (controls wait for the task the node runs)
/// leaves its late reply in the connection: the next controls must read past it to their own,
/// not take it for theirs and time out one after the other.
#[isolated_test]
fn a_control_that_timed_out_does_not_break_the_next_ones() {
    let (me, _gates) = gates();
    let (addr, node) = thread_node();
    // Controls wait as long as the startup timeout: 1 s here.
    let builder = Worker::builder().startup_timeout(Duration::from_secs(1));
    let mut root = root_worker_from(builder, std::slice::from_ref(&addr), Duration::from_secs(5));
    root.init().unwrap();
    let dev = root.alloc_child_tensor(1, &[4], simpler::DataType::Uint64).unwrap();
    let host = u64_buffer(&root, 4);
    host.write(0, &[5u64, 6, 7, 8]).unwrap();
    let h = OrchFn::new("gated_step", gated_step).handle();
    let run = root
        .submit(move |orch| orch.submit_next_level(&h, TaskArgs::new(), CallConfig::default(), 1).map(|_| ()))
        .unwrap();
    let started = gate(me, "started");
    wait_for("the node's task to run", Duration::from_secs(20), || started.exists());
    let err = root.copy_to(&dev, &host).expect_err("the node answers no control while its task waits");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(err.message().contains(&addr.to_string()), "{err}");
    std::fs::write(gate(me, "open"), b"open").unwrap();
    run.wait().unwrap();
    for i in 0..3 {
        root.copy_to(&dev, &host).unwrap_or_else(|e| panic!("control {i} after the late reply: {e}"));
    }
    let back = u64_buffer(&root, 4);
    root.copy_from(&back, &dev).unwrap();
    assert_eq!(read_u64(&back, 0, 4), vec![5, 6, 7, 8]);
    drop((dev, host, back));
    finish(root, vec![node]);
}

/// This test process's id, and a guard that removes its gate files when dropped (also when
/// the test panics).
fn gates() -> (u32, impl Drop) {
    struct Remove(u32);
    impl Drop for Remove {
        fn drop(&mut self) {
            for name in ["started", "open"] {
                let _ = std::fs::remove_file(gate(self.0, name));
            }
        }
    }
    let me = std::process::id();
    (me, Remove(me))
}

/// A node-resident copy larger than what one control carries goes in parts, each to its own
/// offset, both ways (a copy of over 1 GiB used to be one frame past the size limit, and the
/// node ended the session).
#[isolated_test]
fn node_resident_copies_go_in_parts_each_to_its_place() {
    let (addr, node) = thread_node();
    let mut root = root_worker(std::slice::from_ref(&addr), Duration::from_secs(5));
    root.init().unwrap();
    // 150 MiB: three parts of at most 64 MiB, the last one partial.
    const WORDS: usize = (150 << 20) / 8;
    let dev = root.alloc_child_tensor(1, &[WORDS as u32], simpler::DataType::Uint64).unwrap();
    let host = u64_buffer(&root, WORDS);
    let words: Vec<u64> = (0..WORDS as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
    host.write(0, &words).unwrap();
    root.copy_to(&dev, &host).unwrap();
    let back = u64_buffer(&root, WORDS);
    root.copy_from(&back, &dev).unwrap();
    assert!(read_u64(&back, 0, WORDS) == words, "a part landed in the wrong place");
    drop((dev, host, back));
    finish(root, vec![node]);
}

/// A run past its deadline with a task on a node: the error names the node by its address and
/// says what stopping it did; the node cancels the task's run there and the session stays in
/// service, so later runs (and a cancelled one's) use the node again.
#[isolated_test]
fn a_remote_task_past_its_deadline_or_cancelled_is_cancelled_on_the_node_and_the_session_survives() {
    let _gates = gates();
    let (addr, node) = thread_node();
    let mut root = root_worker(std::slice::from_ref(&addr), Duration::from_secs(5));
    root.init().unwrap();
    let h = OrchFn::new("gated_step", gated_step).handle();
    let started = Instant::now();
    let err = root
        .run_with(simpler::RunOptions::new().deadline(Duration::from_millis(300)), |orch, _, _| {
            orch.submit_next_level(&h, TaskArgs::new(), CallConfig::default(), 1).map(|_| ())
        })
        .expect_err("the gate never opens");
    assert!(started.elapsed() < Duration::from_secs(5), "the run ended in {:?}", started.elapsed());
    let node_name = format!("remote worker 1 ({addr})");
    assert_err(
        &err,
        ErrorKind::Timeout,
        &["deadline of 300 ms", "gated_step", &node_name, "the node cancels the task's run"],
    );
    let remote = root.workers().into_iter().find(|w| w.kind == WorkerKind::Remote).unwrap();
    assert_eq!(remote.state, WorkerState::Alive, "the session is still in service");
    let buf = u64_buffer(&root, 1);
    step_on(&root, &buf, 0, 1, 1).expect("the node runs the next task");
    // A cancelled run, the same way.
    let test = std::process::id();
    let _ = std::fs::remove_file(gate(test, "started"));
    let run = root
        .submit(|orch| orch.submit_next_level(&h, TaskArgs::new(), CallConfig::default(), 1).map(|_| ()))
        .unwrap();
    wait_for("the task to run on the node", Duration::from_secs(20), || gate(test, "started").exists());
    run.cancel();
    assert_err(
        &run.wait().unwrap_err(),
        ErrorKind::Cancelled,
        &["gated_step", "the node cancels the task's run"],
    );
    step_on(&root, &buf, 0, 1, 1).expect("the node runs the next task");
    assert_eq!(read_u64(&buf, 0, 1), vec![3]);
    drop(buf);
    finish(root, vec![node]);
}

/// A health timeout the node's heartbeats cannot meet is refused up front, naming the node and
/// the least it may be (zero used to fail `init` with an OS error naming neither).
#[test]
fn a_health_timeout_under_two_heartbeats_is_refused_naming_the_node() {
    let addr = NodeAddr::loopback(7399);
    for t in [Duration::ZERO, Duration::from_millis(399)] {
        let node = RemoteWorker::new(addr.clone(), key()).health_timeout(t);
        let err = Worker::builder().level(Level::Network1).remote_worker(node).build().unwrap_err();
        assert_err(&err, ErrorKind::InvalidArgument, &["health timeout", &addr.to_string(), "400ms"]);
    }
    let node = RemoteWorker::new(addr, key()).health_timeout(Duration::from_millis(400));
    Worker::builder().level(Level::Network1).remote_worker(node).build().unwrap();
}

/// The sizes of the memfds this process holds (a thread node's buffers are among them).
fn memfd_sizes() -> Vec<u64> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("/memfd:")))
        .filter_map(|e| std::fs::metadata(e.path()).ok().map(|m| m.len()))
        .collect()
}

/// A task that names a small tile of a large buffer of the root costs the node the tile: the
/// node's buffer for it holds the tile's span, not the root's whole buffer (which a node with
/// less memory could not hold).
#[isolated_test]
fn a_tile_of_a_large_root_buffer_costs_the_node_only_the_tile() {
    let (addr, node) = thread_node();
    let mut root = root_worker(std::slice::from_ref(&addr), Duration::from_secs(5));
    root.init().unwrap();
    // 512 MiB and a word, never touched but for the tile: its pages are not allocated. The node
    // keeps a finished task's buffers for the next one, so its buffer for the tile is seen.
    const WORDS: usize = (512 << 20) / 8 + 1;
    let big = u64_buffer(&root, WORDS);
    let of_its_size = || memfd_sizes().into_iter().filter(|&n| n == 8 * WORDS as u64).count();
    assert_eq!(of_its_size(), 1);
    big.write(1000, &[1u64, 2, 3, 4]).unwrap();
    let tile = u64s(&big, 1000, 4);
    step_on_tensor(&root, &tile, 1).unwrap();
    assert_eq!(read_u64(&big, 1000, 4), vec![3, 5, 7, 9]);
    assert_eq!(of_its_size(), 1, "the node made a buffer the size of the root's for a 32-byte tile");
    drop((tile, big));
    finish(root, vec![node]);
}

/// Runs `step` on worker `w` over `t`.
fn step_on_tensor(rig: &Worker, t: &simpler::Tensor, w: u32) -> simpler::Result<()> {
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.inout(t)?;
        orch.submit_next_level(&OrchFn::new("step", step).handle(), a, CallConfig::default(), w).map(|_| ())
    })
}

/// Anyone who can reach a node's port may connect; without the key they get nothing, and while
/// they say nothing they hold back no root: each connection is authenticated on its own.
#[isolated_test]
fn silent_connections_without_the_key_hold_back_no_root() {
    let (addr, node) = thread_node();
    let NodeAddr::Tcp(sock) = addr.clone() else { panic!("a TCP node") };
    let strays: Vec<_> = (0..4).map(|_| std::net::TcpStream::connect(sock).unwrap()).collect();
    let mut root = root_worker(std::slice::from_ref(&addr), Duration::from_secs(5));
    root.init().expect("the root connects past the silent strays");
    let buf = u64_buffer(&root, 2);
    step_on(&root, &buf, 0, 2, 1).unwrap();
    assert_eq!(read_u64(&buf, 0, 2), vec![1, 1]);
    drop((strays, buf));
    finish(root, vec![node]);
}

/// `close` keeps its bound (`close_timeout` + 1.1 s) when a node stops while the root is still
/// sending it a large tensor, whatever the health timeout: the session does not wait for its
/// sending thread to finish a write the node will never read.
#[isolated_test]
fn close_keeps_its_bound_when_a_node_stops_mid_transfer() {
    let node = NodeProcess::start();
    let builder = root_builder(Worker::builder(), std::slice::from_ref(&node.addr), Duration::from_secs(8))
        .close_timeout(Duration::from_millis(200));
    let mut root = with_orchs(builder.build().unwrap());
    root.init().unwrap();
    let words = 16 << 20;
    let buf = root.create_buffer(8 * words).unwrap();
    let t = u64s(&buf, 0, words);
    let h = OrchFn::new("step", step).handle();
    let run = root
        .submit(|orch| {
            let mut a = TaskArgs::new();
            a.inout(&t)?;
            orch.submit_next_level(&h, a, CallConfig::default(), 1).map(|_| ())
        })
        .unwrap();
    signal(node.pid(), libc::SIGSTOP);
    let closing = Instant::now();
    let _ = root.close();
    let took = closing.elapsed();
    signal(node.pid(), libc::SIGCONT);
    drop((run, t, buf));
    assert!(took < Duration::from_millis(1300), "close took {took:?}");
}

/// The same node added twice is refused by `build` at once, naming it (it used to make `init`
/// wait for the second connection's timeout).
#[isolated_test]
fn the_same_node_added_twice_is_refused_at_build() {
    let addr: NodeAddr = "127.0.0.1:45999".parse().unwrap();
    let started = Instant::now();
    let err = root_builder(Worker::builder(), &[addr.clone(), addr.clone()], Duration::from_secs(2))
        .build()
        .unwrap_err();
    assert_err(&err, ErrorKind::InvalidArgument, &["127.0.0.1:45999", "added twice"]);
    assert!(started.elapsed() < Duration::from_secs(1));
}

/// `workers()` reports a remote Worker's process id: the node's, on its host (it was 0).
#[isolated_test]
fn workers_report_a_remote_workers_node_pid() {
    let node = NodeProcess::start();
    let mut rig = root_with(std::slice::from_ref(&node.addr), Duration::from_secs(2));
    rig.init();
    let remote = rig.workers().into_iter().last().expect("the remote Worker is the last");
    assert_eq!(remote.pid, node.pid(), "{remote:?}");
    assert!(remote.is_alive());
}

/// Idle connections do not deny a node to its root: 200 peers that connect and say nothing
/// (past the 16 handshakes a node runs at once) and then a root's `init` succeeds at once, and
/// so does a run on the node (issue 30: it failed with `Timeout` after 5 s).
#[isolated_test]
fn idle_connections_do_not_keep_a_root_out() {
    let node = NodeProcess::start();
    let target = node.addr.to_string();
    let idle: Vec<std::net::TcpStream> =
        (0..200).filter_map(|_| std::net::TcpStream::connect(target.as_str()).ok()).collect();
    assert!(idle.len() >= 100, "only {} idle connections opened", idle.len());
    let started = Instant::now();
    let mut rig = root_with(std::slice::from_ref(&node.addr), Duration::from_secs(2));
    rig.init();
    assert!(started.elapsed() < Duration::from_secs(3), "init took {:?}", started.elapsed());
    let buf = u64_buffer(&rig, 4);
    step_on(&rig, &buf, 0, 4, 1).unwrap();
    drop((buf, idle));
}

/// A root's errors about a node name its address once (issue 31: "remote worker 1 (addr):
/// cannot connect the session to the node at addr").
#[isolated_test]
fn a_node_that_is_not_there_is_named_once() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr: NodeAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut root = root_worker(std::slice::from_ref(&addr), Duration::from_secs(2));
    let err = root.init().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WorkerDied, "{err}");
    assert_eq!(err.message().matches(&addr.to_string()).count(), 1, "{err}");
}

/// One node, several roots: two sessions at once, each with node-resident buffers of its own
/// (the same ids on the node name different buffers), a third root refused while both run
/// (naming the limit), and a later one served once a session ended.
#[isolated_test]
fn a_node_serves_two_roots_at_once_each_isolated_and_refuses_a_third_naming_its_limit() {
    let (tx, rx) = std::sync::mpsc::channel();
    let node = std::thread::spawn(move || {
        let bound = node_with("127.0.0.1:0").bind()?;
        tx.send(bound.local_addr()).unwrap();
        bound.serve(3, 2)
    });
    let addr = rx.recv_timeout(Duration::from_secs(30)).expect("the node bound its address");
    let start = |words: &[u64]| {
        let mut root = root_worker(std::slice::from_ref(&addr), Duration::from_secs(5));
        root.init().expect("a root within the node's limit");
        let dev = root.alloc_child_tensor(1, &[4], simpler::DataType::Uint64).unwrap();
        let host = u64_buffer(&root, 4);
        host.write(0, words).unwrap();
        root.copy_to(&dev, &host).unwrap();
        (root, dev, host)
    };
    let (a, dev_a, host_a) = start(&[1, 2, 3, 4]);
    let (b, dev_b, host_b) = start(&[10, 20, 30, 40]);
    // A third while both sessions run: refused, saying why.
    let mut c = root_worker(std::slice::from_ref(&addr), Duration::from_secs(5));
    let err = c.init().expect_err("the node serves two roots at once");
    assert_err(&err, ErrorKind::WorkerDied, &["serves 2 roots at once, its limit"]);
    // Both roots run tasks on their own node-resident buffers, side by side.
    std::thread::scope(|s| {
        for (root, dev) in [(&a, &dev_a), (&b, &dev_b)] {
            s.spawn(move || {
                let t = dev.tensor(&[4], simpler::DataType::Uint64).unwrap();
                let h = OrchFn::new("step", step).handle();
                root.run(|orch| {
                    let mut args = TaskArgs::new();
                    args.inout(&t)?;
                    orch.submit_next_level(&h, args, CallConfig::default(), 1).map(|_| ())
                })
                .expect("a run on the node");
            });
        }
    });
    for (root, dev, host, want) in
        [(&a, &dev_a, &host_a, [3u64, 5, 7, 9]), (&b, &dev_b, &host_b, [21, 41, 61, 81])]
    {
        root.copy_from(host, dev).unwrap();
        assert_eq!(read_u64(host, 0, 4), want, "each root sees its own buffer");
    }
    drop((dev_a, host_a));
    a.close().unwrap();
    // A session ended: the next root is served.
    let (d, dev_d, host_d) = start(&[7, 7, 7, 7]);
    d.copy_from(&host_d, &dev_d).unwrap();
    assert_eq!(read_u64(&host_d, 0, 4), vec![7; 4]);
    drop((dev_b, host_b, dev_d, host_d));
    b.close().unwrap();
    d.close().unwrap();
    drop(c);
    node.join().unwrap().expect("the node served its three sessions");
}

#[isolated_test]
fn a_root_that_requires_more_than_the_node_has_is_refused_at_init_naming_both() {
    let (addr, node) = thread_node();
    let local = Worker::builder().sub_workers(1).build().unwrap();
    let mut root = Worker::builder()
        .level(Level::Network1)
        .worker(local)
        .remote_worker(RemoteWorker::new(addr.clone(), key()).requires(4, 1))
        .build()
        .unwrap();
    let err = root.init().expect_err("the node has 1 SUB worker and no chip");
    assert_err(
        &err,
        ErrorKind::InvalidArgument,
        &[&addr.to_string(), "gives a session at most 1 SUB workers and 0 chips", "requires 4 and 1"],
    );
    node.join().unwrap().expect("the node's session ended cleanly");
}

/// A node rejoining as another program: the linked functions it serves now are asked again, so
/// tasks of one it lacked before go to it after the rejoin.
#[isolated_test]
fn a_rejoined_node_is_asked_again_for_the_linked_functions_it_serves() {
    let first = NodeProcess::start_with("127.0.0.1:0", false);
    let addr = first.addr.to_string();
    let mut rig = root_with(std::slice::from_ref(&first.addr), Duration::from_secs(2));
    rig.init();
    let buf = u64_buffer(&rig, 1);
    let mut t = buf.typed::<u64>(&[1]).unwrap();
    let on_node = |t: &mut simpler::dsl::TensorOf<u64>| {
        rig.run(|o| add_ten_there::call(&mut *t)?.on(o, simpler::dsl::worker(1)).map(|_| ()))
    };
    let err = on_node(&mut t).expect_err("the node does not serve add_ten_there");
    assert_err(&err, ErrorKind::Callable, &["add_ten_there", "not on worker 1"]);
    drop(first); // killed
    let err = step_on(&rig, &buf, 0, 1, 1).expect_err("the node is gone");
    assert_eq!(err.kind(), ErrorKind::WorkerDied, "{err}");
    let _again = NodeProcess::start_with(&addr, true);
    rig.replace_worker(WorkerKind::Remote, 1).expect("the node rejoins");
    on_node(&mut t).expect("the rejoined node serves it");
    assert_eq!(read_u64(&buf, 0, 1), vec![10]);
    drop((t, buf));
}

/// Words 0 and 1 of its output: its two scalars; word 2: the SUB worker's process id.
fn put_size(args: &HostArgs<'_>) -> HostResult {
    let out = args.output::<u64>(0)?;
    out[0] = args.scalar(0)?;
    out[1] = args.scalar(1)?;
    out[2] = u64::from(std::process::id());
    Ok(())
}

/// On the node: the size of the Worker it runs on (SUB workers, chips), and which process ran
/// it, into the task's tensor.
fn say_size(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    let mut a = TaskArgs::new();
    a.output(args.tensor(0).unwrap())?;
    a.scalar(orch.sub_workers() as u64);
    a.scalar(orch.next_level_workers() as u64);
    orch.submit_sub(&HostFn::new("put_size", put_size).handle(), a).map(|_| ())
}

/// A root with one local L3 and the node at `addr`, asking it for `sub` SUB workers and
/// `chips` chips.
fn sized_root(addr: &NodeAddr, sub: u32, chips: u32) -> Worker {
    let local = Worker::builder().sub_workers(1).build().unwrap();
    let mut root = Worker::builder()
        .level(Level::Network1)
        .worker(local)
        // The sizing tests are not about silence: a node busy making other sessions' Workers
        // while the whole suite runs on two CPUs once went 2 s (the default) without a
        // heartbeat heard, which failed an `init` that should have been served or refused.
        .remote_worker(
            RemoteWorker::new(addr.clone(), key())
                .requires(sub, chips)
                .health_timeout(Duration::from_secs(15)),
        )
        .build()
        .unwrap();
    root.register_orch(OrchFn::new("say_size", say_size)).unwrap();
    root
}

/// What `say_size` reports from `root`'s node: (SUB workers, chips, the SUB worker's pid).
fn size_on_node(root: &Worker) -> (u64, u64, i32) {
    let buf = u64_buffer(root, 3);
    let t = u64s(&buf, 0, 3);
    root.run(|orch| {
        let mut a = TaskArgs::new();
        a.output(&t)?;
        orch.submit_next_level(&OrchFn::new("say_size", say_size).handle(), a, CallConfig::default(), 1)
            .map(|_| ())
    })
    .expect("say_size runs on the node");
    let w = read_u64(&buf, 0, 3);
    (w[0], w[1], w[2] as i32)
}

/// A sized node (issue 30, point 2): each root's session gets an L3 Worker of its own, of the
/// size it asked for (or the node's default), within the node's limits; a root asking more than
/// a session may have, or more than the node has left, is refused at `init` naming the node and
/// the sizes; a session's workers go when it ends, and its share is given back.
#[isolated_test]
fn a_sized_node_gives_each_root_a_worker_of_the_size_it_asks_within_its_limits() {
    let made = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let record = made.clone();
    let node = std::thread::spawn(move || {
        let limits = SessionLimits::new(3, 0).per_session(2, 0).default_size(1, 0);
        let mut node = Node::sized(NodeAddr::parse("127.0.0.1:0")?, key(), limits, move |sub, chips| {
            record.lock().unwrap().push((sub, chips));
            let mut l3 = Worker::builder().sub_workers(sub as usize).chips(chips as usize).build()?;
            l3.register(HostFn::new("put_size", put_size))?;
            Ok(l3)
        })?;
        node.register_orch(OrchFn::new("say_size", say_size));
        let bound = std::sync::Arc::new(node.bind()?);
        tx.send(bound.clone()).unwrap();
        bound.serve(5, 3)
    });
    let bound = rx.recv_timeout(Duration::from_secs(30)).expect("the node bound its address");
    let addr = bound.local_addr();
    let mut a = sized_root(&addr, 2, 0);
    a.init().expect("2 SUB workers: within the node's limits");
    let (sub_a, chips_a, pid_a) = size_on_node(&a);
    assert_eq!((sub_a, chips_a), (2, 0), "root A's session runs on a Worker of the size it asked");
    let mut b = sized_root(&addr, 0, 0);
    b.init().expect("the default size: the node has 1 SUB worker left");
    let (sub_b, _, pid_b) = size_on_node(&b);
    assert_eq!(sub_b, 1, "a root that asks nothing gets the node's default size");
    assert_ne!(pid_a, pid_b, "two roots' sessions do not share SUB workers");
    // The node's 3 SUB workers are held: a third root is refused, naming what is held.
    let mut c = sized_root(&addr, 1, 0);
    let err = c.init().expect_err("the node has no SUB worker left");
    assert_err(
        &err,
        ErrorKind::ResourceExhausted,
        &[
            &addr.to_string(),
            "has 3 SUB workers and 0 chips in all",
            "2 other sessions hold 3 SUB workers",
            "asked for 1 SUB worker and 0 chips",
        ],
    );
    drop(c);
    // More than one session may have: refused before any is started.
    let mut d = sized_root(&addr, 3, 0);
    let err = d.init().expect_err("a session has at most 2 SUB workers");
    assert_err(
        &err,
        ErrorKind::InvalidArgument,
        &[&addr.to_string(), "at most 2 SUB workers and 0 chips", "requires 3 and 0"],
    );
    drop(d);
    // A's session ends: its workers go, and its share comes back for the next root once the
    // node freed it (a session counts until then; C's and D's ended too).
    a.close().unwrap();
    assert!(
        spin_until(Instant::now() + Duration::from_secs(30), || bound.sessions() == 1),
        "the node freed what the sessions of A, C and D held"
    );
    assert!(!process_exists(pid_a), "A's SUB worker ended with its session");
    let mut e = sized_root(&addr, 2, 0);
    e.init().expect("A's share of the node is free again");
    let (sub_e, _, pid_e) = size_on_node(&e);
    assert_eq!(sub_e, 2);
    let pids = [b.child_pids(), e.child_pids()].concat();
    b.close().unwrap();
    e.close().unwrap();
    node.join().unwrap().expect("the node served its five sessions");
    assert!(!process_exists(pid_b) && !process_exists(pid_e), "every session's SUB workers ended with it");
    assert_eq!(
        *made.lock().unwrap(),
        [(2, 0), (1, 0), (2, 0)],
        "a Worker per session, none for the refused roots"
    );
    assert_left_nothing(&pids);
}

/// Roots racing for a sized node's limits: each either gets a Worker of its own or is refused
/// with `ResourceExhausted`, the node never makes more Workers than it served sessions with one,
/// and when they are all gone nothing of theirs is left on the node.
#[isolated_test]
fn roots_racing_for_a_sized_node_get_a_worker_or_a_clear_refusal_and_leave_nothing() {
    const ROOTS: usize = 6;
    const ROUNDS: usize = 5;
    let made = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (tx, rx) = std::sync::mpsc::channel();
    let count = made.clone();
    let node = std::thread::spawn(move || {
        let limits = SessionLimits::new(2, 0).per_session(1, 0);
        let mut node = Node::sized(NodeAddr::parse("127.0.0.1:0")?, key(), limits, move |sub, chips| {
            count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut l3 = Worker::builder().sub_workers(sub as usize).chips(chips as usize).build()?;
            l3.register(HostFn::new("put_size", put_size))?;
            Ok(l3)
        })?;
        node.register_orch(OrchFn::new("say_size", say_size));
        let bound = std::sync::Arc::new(node.bind()?);
        tx.send(bound.clone()).unwrap();
        // Every root's every round is one session: served or refused by the limits.
        bound.serve(ROOTS * ROUNDS, ROOTS + 2)
    });
    let bound = rx.recv_timeout(Duration::from_secs(30)).expect("the node bound its address");
    let addr = bound.local_addr();
    let outcomes: Vec<(usize, Vec<i32>)> = std::thread::scope(|s| {
        let joins: Vec<_> = (0..ROOTS)
            .map(|_| {
                s.spawn(|| {
                    let (mut served, mut pids) = (0, Vec::new());
                    for _ in 0..ROUNDS {
                        let mut root = sized_root(&addr, 1, 0);
                        match root.init() {
                            Ok(()) => {
                                let (sub, _, pid) = size_on_node(&root);
                                assert_eq!(sub, 1, "a session of the size it asked");
                                pids.push(pid);
                                pids.extend(root.child_pids());
                                root.close().unwrap();
                                served += 1;
                            }
                            Err(e) => assert_err(
                                &e,
                                ErrorKind::ResourceExhausted,
                                &["has 2 SUB workers and 0 chips in all"],
                            ),
                        }
                    }
                    (served, pids)
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    node.join().unwrap().expect("the node served every session");
    let served: usize = outcomes.iter().map(|(n, _)| n).sum();
    assert!(served >= 2, "at least the first two roots are served ({served})");
    assert_eq!(
        made.load(std::sync::atomic::Ordering::Relaxed),
        served,
        "one Worker per session served, none for a refused one"
    );
    assert_eq!(bound.sessions(), 0);
    let pids: Vec<i32> = outcomes.into_iter().flat_map(|(_, p)| p).collect();
    assert_left_nothing(&pids);
}

/// A task on one node that reads another node's buffer while that node answers nothing (it is
/// stopped) is cancelled there when its run passes its deadline: the read ends at once, and the
/// reading node's session stays in service (it used to wait out its read, past the root's
/// cancel grace, which lost the session).
#[isolated_test]
fn a_read_from_a_stopped_node_ends_when_the_root_cancels_and_the_reader_serves_on() {
    let owner = NodeProcess::start();
    let (reader, reader_node) = thread_node();
    let mut root = root_worker(&[owner.addr.clone(), reader], Duration::from_secs(2));
    root.init().unwrap();
    let n = 1024;
    let on_owner = root.alloc_child_tensor(1, &[n as u32], simpler::DataType::Uint64).unwrap();
    let host = u64_buffer(&root, n);
    host.write(0, &vec![7u64; n]).unwrap();
    root.copy_to(&on_owner, &host).unwrap();
    let t = on_owner.tensor(&[n as u32], simpler::DataType::Uint64).unwrap();
    let out = u64_buffer(&root, n);
    signal(owner.pid(), libc::SIGSTOP);
    let copy_h = OrchFn::new("copy_step", copy_step).handle();
    let started = Instant::now();
    let err = root
        .run_with(simpler::RunOptions::new().deadline(Duration::from_millis(300)), |orch, _, _| {
            let mut r = TaskArgs::new();
            r.input(&t)?;
            r.output(&u64s(&out, 0, n))?;
            orch.submit_next_level(&copy_h, r, CallConfig::default(), 2).map(|_| ())
        })
        .expect_err("the owner answers nothing");
    assert_err(&err, ErrorKind::Timeout, &["deadline of 300 ms", "copy_step"]);
    let reader_state =
        root.workers().into_iter().find(|w| w.kind == WorkerKind::Remote && w.id == 2).map(|w| w.state);
    assert_eq!(reader_state, Some(WorkerState::Alive), "the reader's session is still in service");
    let buf = u64_buffer(&root, 1);
    step_on(&root, &buf, 0, 1, 2).expect("the reader runs the next task");
    // Far below the 30 s peer read timeout the read used to wait out (not the grace: CI is busy).
    assert!(started.elapsed() < Duration::from_secs(5), "it took {:?}", started.elapsed());
    assert_eq!(read_u64(&out, 0, 1), vec![0], "nothing was copied");
    signal(owner.pid(), libc::SIGCONT);
    drop((t, on_owner, host, out, buf));
    finish(root, vec![reader_node]);
}
