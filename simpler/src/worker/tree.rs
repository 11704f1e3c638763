//! The tree runtime: an engine and child processes (L3 and up).
//!
//! `start` maps the mailboxes and heap rings and forks, in order, the SUB workers, then the
//! chips (L3) or the nested Workers (L4 and up), all before any engine thread; one startup
//! deadline holds for the whole tree. After that every registration, unregistration and chip
//! memory operation is a control request to the children's mailboxes (`Tree::control`), and
//! runs are built on the engine, whose lanes are the mailboxes.
//!
//! * **Start.** Map the mailboxes and heap rings, build the engine with `LevelParts`
//!   (`HostRings`, [`ChipBuffers`]), hand chip callables to nested Workers with chips below
//!   them, start the SUB children, then chips (L3) or nested Workers (L4+), and wait for each to
//!   report ready. At the deadline every child still silent is killed at once and named in the
//!   error (`hung_children`); the others are asked to shut down, with a grace of 5 s. Then one
//!   lane per mailbox, the remote Workers (connected after the local children, each checked to
//!   run every orchestration function, their lanes after the mailbox lanes), and the background
//!   thread. The engine's lease depth is the smallest grant of the chips (rule M9 of
//!   `ipc::mailbox`), at most `pipeline_depth`; nested Workers grant none, so a Worker over them
//!   builds as many runs ahead as asked, with lease depth `pipeline_depth` (the head and the
//!   runs found independent of the runs ahead dispatch under them). An explicit `pipeline_depth` above
//!   the smallest grant fails `init` naming the request, the chip, its grant and
//!   `pending_run_depth`.
//! * **Controls.** One at a time (`control_lock`); `register_on` removes what it installed when
//!   a target refuses. Node-resident buffers: the chip-memory calls route a remote Worker's id
//!   to its session (`worker::remote`).
//! * **Close.** Drain runs up to `close_timeout`, stop the background thread, shut down and reap
//!   every child (the monitor ends what is left of each one's process group first, rule P7 of
//!   `sys::process`); one still busy at the deadline is killed, so `close` ends within
//!   `close_timeout` + 1.1 s (`SHUTDOWN_GRACE` + `REAP_GRACE`).
//! * **Replace.** `replace` starts a new SUB worker or chip in a dead one's mailbox (under
//!   `control_lock`: mailbox rule M8 resets its frames, the monitor watches the new pid under
//!   the same index, the new child starts with the current callables and reports ready, a
//!   replaced chip's device buffers are marked lost in [`ChipBuffers`]), then
//!   `Engine::revive_lane` puts the lane back in service. `Worker::replace_worker` /
//!   `replace_dead_workers` call it, and so does every submit of a Worker built with
//!   `replace_dead_workers(true)`. Nested Workers, remote Workers and `StartMethod::Fork`
//!   Workers are refused.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::callable::host::Body;
use crate::callable::identity::{CallableHandle, CallableKind, Digest};
use crate::chip::{ChipConfig, ChipSpec};
use crate::data::buffer::{Buffer, Identity, IdentityMinter};
use crate::data::call_config::CallConfig;
use crate::data::dtype::DataType;
use crate::data::task_args::TaskArgs;
use crate::data::wire::{DESC_SIZE, encode_desc};
use crate::engine::heap::{DeviceRings, HeapBlock, HostRings, IntermediateHeap, Place};
use crate::engine::scheduler::{Lane, LaneKind};
use crate::engine::{Bell, DeviceRules, DeviceUse, Engine, LevelParts};
use crate::error::{Error, ErrorKind, Result};
use crate::ipc::child::{
    CTRL_COPY_FROM, CTRL_COPY_TO, CTRL_FREE, CTRL_MALLOC, CTRL_REGISTER_CHIP, CTRL_REGISTER_CHIP_ORCH,
    CTRL_REGISTER_FN, CTRL_REGISTER_ORCH, CTRL_UNREGISTER, ERR_RESOURCE, ERR_WORKER_DIED, HostResolver,
};
use crate::ipc::endpoint::MailboxEndpoint;
use crate::ipc::mailbox::{ARGS_CAPACITY, InitStatus, Mailbox, MailboxRegion};
use crate::level::Level;
use crate::sys::fn_address::FnAddress;
use crate::sys::futex::Doorbell;
use crate::sys::mem::SharedSpan;
use crate::sys::process::{Ended, Monitor};
use crate::sys::sync;
use crate::worker::Worker;
use crate::worker::builder::Config;
use crate::worker::callables::{Callable, Callables, Placement};
use crate::worker::lanes::Lanes;
use crate::worker::remote::launch::accept_ranks;
use crate::worker::remote::peer::{PeerBook, decode_alloc};
use crate::worker::remote::{
    RemoteEndpoint, RemoteWorker, Session, check_callable, claim_size, resident, wire,
};
use crate::worker::runtime::Runtime;
use crate::worker::serve;
use crate::worker::serve::chip::ChipChild;
use crate::worker::serve::sub::SubChild;
use crate::worker::start::StartMethod;
use crate::worker::start::{ChildPlan, start_child};
use crate::worker::status::{WorkerKind, WorkerState, WorkerStatus};

struct RegionBell(Arc<MailboxRegion>);

impl AsRef<Doorbell> for RegionBell {
    fn as_ref(&self) -> &Doorbell {
        self.0.doorbell()
    }
}

/// The CPU SUB worker `i` is bound to: the `i`-th of `cpus`, modulo their count (none if empty:
/// not bound).
fn cpu_of(cpus: &[usize], i: usize) -> Option<usize> {
    (!cpus.is_empty()).then(|| cpus[i % cpus.len()])
}

/// A started Worker of L3 and up: its engine and its child processes.
pub(super) struct Tree {
    engine: Arc<Engine>,
    /// Mints this Worker's buffer identities (host buffers, chip buffers, and its engine's
    /// `orch.alloc` intermediates).
    minter: Arc<IdentityMinter>,
    /// The device buffers allocated on this Worker's chips and not yet freed.
    devices: Arc<ChipBuffers>,
    /// The device heap rings on its chips (`orch.alloc_on`).
    rings: Arc<DeviceRings>,
    /// Serializes control requests (one per mailbox base frame at a time).
    control_lock: Mutex<()>,
    region: Arc<MailboxRegion>,
    /// Number of children (mailboxes).
    children: usize,
    /// The sessions with remote L3 Workers, lanes `children..` (a lost one is replaced by a
    /// new session with the same node: `replace`).
    remote: Vec<Mutex<Arc<Session>>>,
    /// What each remote Worker was built with (to connect to it again).
    remote_specs: Vec<RemoteWorker>,
    /// Where other nodes read each node-resident buffer (node-to-node data, `remote::peer`).
    peers: Arc<PeerBook>,
    /// The configuration, for replacement children.
    cfg: Config,
    /// The CPUs bound SUB workers run on, in turn (empty: not bound).
    sub_cpus: Vec<usize>,
    /// The heap rings every child maps (this Worker's and its ancestors').
    heaps: Vec<SharedSpan>,
    monitor: Monitor,
    /// The engine's background thread, until `close` joins it (behind a lock: `close` takes
    /// `&self`, as `Worker::close` does).
    background: Mutex<Option<JoinHandle<()>>>,
    lanes: Lanes,
}

impl Tree {
    /// Starts the tree of a Worker configured by `cfg`, with the children `lanes` lists:
    /// `callables` is the snapshot every child starts with, `children` the nested Workers (L4
    /// and up; each goes to its own process), `extra_heaps` the heap rings of the ancestors,
    /// `extra_owners` their owner nonces (their buffers reach this Worker's tasks).
    pub(super) fn start(
        cfg: &Config,
        lanes: &Lanes,
        callables: &Callables,
        children: &mut Vec<Worker>,
        remote: &[RemoteWorker],
        extra_heaps: &[SharedSpan],
        extra_owners: &[u64],
    ) -> Result<Tree> {
        let deadline = crate::sys::clock::after(cfg.startup_timeout);
        // The trace log of this process's tree: inherited, or made now (a root).
        if let Err(e) = crate::sys::tracelog::ensure() {
            tracing::warn!(target: "simpler::worker", "no trace log: timelines will miss what runs in worker processes: {e}");
        }
        let nested = cfg.level > Level::Node;
        // Where bound SUB workers run: the CPUs this thread may use, one each in turn.
        let sub_cpus = match cfg.bind_sub_workers {
            true => crate::sys::process::usable_cpus().map_err(|e| e.context("bind_sub_workers"))?,
            false => Vec::new(),
        };
        let mut engine_cfg = cfg.engine.clone();
        engine_cfg.level = cfg.level;
        if nested {
            engine_cfg.next_level_workers = children.len() + remote.len();
            engine_cfg.next_level_kind = CallableKind::Orch;
            engine_cfg.next_level_names = ("nested Worker", "WorkerBuilder::worker");
        } else {
            engine_cfg.next_level_names = ("chip", "WorkerBuilder::chips(n)");
        }
        // Every task crosses a child's mailbox: larger arguments are refused at submit.
        engine_cfg.args_capacity = Some(ARGS_CAPACITY);
        // Tasks name buffers of this Worker and of its ancestors only.
        let nonce = crate::sys::random::u64();
        let mut owners = vec![nonce];
        owners.extend_from_slice(extra_owners);
        engine_cfg.owners = Some(owners.clone());
        let n_sub = engine_cfg.sub_workers;
        // The mailbox children: remote Workers have no mailbox.
        let n_chip = engine_cfg.next_level_workers - remote.len();
        let region = Arc::new(MailboxRegion::new(n_sub + n_chip)?);
        let minter = Arc::new(IdentityMinter::new(nonce));
        // Above L3 the memory lives on a remote L3 Worker (a node), named as a worker.
        let devices = Arc::new(ChipBuffers {
            noun: if nested { "worker" } else { "chip" },
            remote: n_chip as u32..(n_chip + remote.len()) as u32,
            ..Default::default()
        });
        let rings = Arc::new(DeviceRings::new(if nested { 0 } else { n_chip }, cfg.chip_heap_ring()));
        let parts = LevelParts {
            minter: minter.clone(),
            heap: Arc::new(LevelHeap {
                host: HostRings::new(engine_cfg.heap_ring_size)?,
                chips: rings.clone(),
            }),
            devices: devices.clone(),
        };
        let engine = Engine::new(engine_cfg, Bell::Shared(Arc::new(RegionBell(region.clone()))), parts)?;
        let mut heaps: Vec<SharedSpan> = engine.heap().spans();
        heaps.extend(extra_heaps.iter().cloned());
        // Chip callables registered here reach the chips below: hand them (one registration
        // per reference) to each nested Worker with chips below it before it starts, so they
        // are in its chips' startup snapshot.
        for w in children.iter_mut().filter(|w| w.runs_chip_callables()) {
            for (digest, _, f) in callables.chip().iter() {
                for _ in 0..callables.chip().refs(digest) {
                    w.register_chip(f.clone())?;
                }
            }
        }
        let mut children = std::mem::take(children).into_iter();

        // Start order: every SUB child, then every chip child, all before any engine thread
        // (which matters to `StartMethod::Fork` only).
        let mut pids = Vec::with_capacity(n_sub + n_chip);
        let mut failure = None;
        for i in 0..n_sub + n_chip {
            let resolver = HostResolver::new(heaps.clone());
            let plan = if i < n_sub {
                ChildPlan::Sub(SubChild {
                    region: region.clone(),
                    index: i,
                    cpu: cpu_of(&sub_cpus, i),
                    registry: callables.host().clone(),
                    resolver,
                })
            } else if nested {
                ChildPlan::Nested(Box::new(serve::nested::NestedChild {
                    region: region.clone(),
                    index: i,
                    id: (i - n_sub) as u32,
                    worker: children.next().expect("one Worker per nested lane"),
                    registry: callables.orch().clone(),
                    deadline,
                    heaps: heaps.clone(),
                    owners: owners.clone(),
                }))
            } else {
                let config = ChipConfig {
                    spec: ChipSpec {
                        chip_id: (i - n_sub) as u32,
                        memory_bytes: cfg.chip_memory,
                        cores: cfg.chip_cores,
                    },
                    backend: cfg.chip_backend,
                };
                ChildPlan::Chip(ChipChild {
                    region: region.clone(),
                    index: i,
                    config,
                    pipeline_depth: chip_depth(cfg),
                    registry: callables.chip().clone(),
                    resolver,
                })
            };
            match start_child(cfg.start, &lanes.label(i), plan, &region, &heaps) {
                Ok(pid) => pids.push(pid),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let monitor = Monitor::start(pids.clone(), {
            let region = region.clone();
            move |_| region.doorbell().ring()
        });
        let monitor = match (monitor, failure) {
            (Ok(m), None) => m,
            (Ok(m), Some(e)) => {
                abort_children(&region, &m, &pids);
                return Err(e);
            }
            (Err(e), _) => {
                for &pid in &pids {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
                }
                return Err(e);
            }
        };
        for (i, &pid) in pids.iter().enumerate() {
            let board = monitor.board.clone();
            let status = region.mailbox(i).wait_init(deadline, || board.exit_of(i).is_some());
            let who = lanes.label(i);
            let err = match status {
                InitStatus::Ready => continue,
                InitStatus::Failed(msg) => format!("{who} (process {pid}) failed to start: {msg}"),
                InitStatus::Pending => match monitor.board.exit_of(i) {
                    Some(how) => format!("{who} (process {pid}) {how} during startup"),
                    None => {
                        // It hung. The deadline has passed, so so did every later child that
                        // has not reported by now: each is killed at once, not given the grace
                        // that the children which started get to leave on their own.
                        let hung = hung_children(&region, &monitor, i, &pids);
                        for &j in &hung {
                            monitor.board.kill(j);
                        }
                        let also: Vec<String> = hung[1..]
                            .iter()
                            .map(|&j| format!("{} (process {})", lanes.label(j), pids[j]))
                            .collect();
                        let also = if also.is_empty() {
                            String::new()
                        } else {
                            format!("; so did {}", also.join(", "))
                        };
                        format!(
                            "{who} (process {pid}) hung in startup: it did not report ready within the startup timeout of {:?}, and was killed{also}",
                            cfg.startup_timeout
                        )
                    }
                },
            };
            abort_children(&region, &monitor, &pids);
            return Err(Error::new(ErrorKind::WorkerDied, format!("Worker.init: {err}")));
        }

        // Each chip published the pipeline depth it grants before it reported ready (rule M9
        // of `ipc::mailbox`); an explicit request above the smallest grant fails here. Nested
        // Workers grant nothing (they keep the single-frame path): a Worker over them builds
        // as many runs ahead as it is asked.
        let chips = if nested { 0..0 } else { n_sub..n_sub + n_chip };
        if let Some((chip, granted)) =
            chips.clone().map(|i| (i - n_sub, region.mailbox(i).granted_depth())).min_by_key(|&(_, g)| g)
            && cfg.explicit_depth
            && cfg.engine.pipeline_depth > granted as usize
        {
            abort_children(&region, &monitor, &pids);
            return Err(Error::invalid(format!(
                "Worker.init: pipeline_depth({}) asks chip {chip} to hold {} runs at once, but it grants at most {granted}; \
                 lower pipeline_depth, or keep it and let more runs wait with WorkerBuilder::pending_run_depth({})",
                cfg.engine.pipeline_depth, cfg.engine.pipeline_depth, cfg.engine.pipeline_depth
            )));
        }

        // Each chip keeps pipeline leases of its own, as many as every chip grants (at most
        // `pipeline_depth`): a chip task carries its run's lease on that chip, the head's and,
        // with two, the staged successor's, which the chip prepares beside the task it runs
        // (rule M11 of `ipc::mailbox`), or a run's dispatching before its turn; so a run hung
        // on one chip leaves the other chips' leases to the others. The level's leases (the
        // ones SUB workers and nested Workers get, which keep no per-run resources by lease)
        // number the admitted runs: every run found independent of the runs ahead may dispatch
        // beside the head (`Scheduler::dispatch_independent`), and a hung one holds one of them.
        let n_leasing_chips = chips.len();
        let lease_depth = chips
            .map(|i| region.mailbox(i).granted_depth())
            .min()
            .unwrap_or(u32::MAX)
            .min(chip_depth(cfg))
            .max(1);
        let admitted = match cfg.engine.pending_run_depth {
            0 => cfg.engine.pipeline_depth,
            n => n,
        };
        let level_depth = lease_depth.max(u32::try_from(admitted).unwrap_or(u32::MAX));
        if let Err(e) = engine.set_lease_depth(level_depth, n_leasing_chips, lease_depth) {
            abort_children(&region, &monitor, &pids);
            return Err(e);
        }
        let mailbox_lanes = (0..n_sub + n_chip)
            .map(|i| {
                let ep = MailboxEndpoint::new(region.clone(), i, monitor.board.clone(), lanes.label(i))
                    .staging(i >= n_sub && !nested && lease_depth >= 2)
                    .chaining(i < n_sub);
                let kind =
                    if i < n_sub { LaneKind::Sub(i as u32) } else { LaneKind::NextLevel((i - n_sub) as u32) };
                Lane::named(kind, Box::new(ep), lanes.label(i))
            })
            .collect();
        // Remote L3 Workers: connected and authenticated now, after every local child started
        // (the sessions' threads start here), each checked to run every orchestration function.
        let mut sessions = Vec::with_capacity(remote.len());
        let peers = Arc::new(PeerBook::default());
        let mut lanes_all: Vec<Lane> = mailbox_lanes;
        // Nodes of a launched job connect to this root: accept them all first.
        let ranks: Vec<u32> = remote.iter().filter_map(|s| s.launch_rank).collect();
        let mut launched = match remote.iter().find(|s| s.launch_rank.is_some()) {
            Some(first) => match accept_ranks(&first.addr, &ranks, &first.key, first.connect_timeout) {
                Ok(a) => a,
                Err(e) => {
                    abort_children(&region, &monitor, &pids);
                    return Err(e);
                }
            },
            None => Default::default(),
        };
        // The linked orchestration functions some nodes lack, and those nodes' ids.
        let mut lacking: HashMap<Digest, Vec<u32>> = HashMap::new();
        for (j, spec) in remote.iter().enumerate() {
            let bell: Arc<dyn AsRef<Doorbell> + Send + Sync> = Arc::new(RegionBell(region.clone()));
            let label = lanes.label(n_sub + n_chip + j);
            let resolver = HostResolver::new(heaps.clone());
            let connected = match spec.launch_rank.and_then(|r| launched.remove(&r)) {
                Some((stream, health, hello, _)) => {
                    Session::open(stream, health, &hello, spec, label, resolver, bell)
                }
                None => Session::connect(spec, label, resolver, bell),
            }
            .and_then(|s| {
                // Its size first: a sized node starts the session's Worker now.
                if let Err(e) = claim_size(&s, spec.needs, cfg.startup_timeout) {
                    s.close();
                    return Err(e.context("Worker.init"));
                }
                // Each orchestration function placed on this node must be there; a linked one
                // (found wherever it is) is asked for, and left off the node when it is not.
                let id = (n_chip + j) as u32;
                for (d, _, f) in callables.orch().iter() {
                    let placement = callables.placement(d).unwrap_or(&Placement::Everywhere);
                    if !placement.requires(id) && *placement != Placement::Found {
                        continue;
                    }
                    match check_callable(&s, &f.handle(), cfg.startup_timeout) {
                        Ok(()) => {}
                        Err(e) if *placement == Placement::Found && e.kind() == ErrorKind::Callable => {
                            tracing::info!(target: "simpler::worker", callable = %f.handle(), node = id, "a linked orchestration function the node lacks: its tasks go elsewhere");
                            lacking.entry(*d).or_default().push(id);
                        }
                        Err(e) => {
                            s.close();
                            return Err(e.context("Worker.init"));
                        }
                    }
                }
                Ok(s)
            });
            match connected {
                Ok(s) => {
                    lanes_all.push(Lane::named(
                        LaneKind::NextLevel((n_chip + j) as u32),
                        Box::new(RemoteEndpoint::new(s.clone(), (n_chip + j) as u32, peers.clone())),
                        lanes.label(n_sub + n_chip + j),
                    ));
                    sessions.push(s);
                }
                Err(e) => {
                    for s in &sessions {
                        s.close();
                    }
                    abort_children(&region, &monitor, &pids);
                    return Err(e);
                }
            }
        }
        engine.attach_lanes(lanes_all);
        {
            let mut known = engine.callables().write();
            for (d, mut registered) in callables.kinds() {
                if let Some(ids) = lacking.get(&d) {
                    let all = (0..(n_chip + remote.len()) as u32).filter(|w| !ids.contains(w));
                    registered.placed = Some(all.collect());
                }
                known.insert(d, registered);
            }
        }
        let engine = Arc::new(engine);
        let bg_engine = engine.clone();
        let background = match std::thread::Builder::new()
            .name("simpler-scheduler".into())
            .spawn(move || bg_engine.background_loop())
        {
            Ok(t) => t,
            Err(e) => {
                for s in &sessions {
                    s.close();
                }
                abort_children(&region, &monitor, &pids);
                return Err(Error::os("spawn scheduler thread", e));
            }
        };
        tracing::debug!(target: "simpler::worker", sub_workers = n_sub, chips = n_chip, "worker ready");
        let tree = Tree {
            engine,
            minter,
            devices,
            rings,
            control_lock: Mutex::new(()),
            region,
            children: pids.len(),
            remote: sessions.into_iter().map(Mutex::new).collect(),
            remote_specs: remote.to_vec(),
            peers,
            cfg: cfg.clone(),
            sub_cpus,
            heaps,
            monitor,
            background: Mutex::new(Some(background)),
            lanes: lanes.clone(),
        };
        if let Err(e) = tree.start_device_heaps() {
            let _ = tree.close(cfg.close_timeout);
            return Err(e.context("Worker.init"));
        }
        Ok(tree)
    }

    /// Allocates each local chip's device heap block (`WorkerBuilder::chip_heap_ring_size`):
    /// a block the chip lends to every intermediate the rings hand out. With the default size a
    /// chip whose memory cannot hold it keeps its intermediates on the host; with a size the
    /// user gave, that is an error.
    fn start_device_heaps(&self) -> Result<()> {
        let bytes = self.rings.block_bytes();
        if bytes == 0 {
            return Ok(());
        }
        for chip in 0..self.lanes.chips() as u32 {
            let Some(mbox) = self.lanes.chip(chip) else { continue };
            // A ring block has no identity of its own (its parts get theirs from the ring).
            let got = self.control(mbox, &self.lanes.label(mbox), |mb| {
                mb.post_control(CTRL_MALLOC, bytes, &[0; 32], crate::ipc::child::MALLOC_SHARED_RING)
            });
            match got {
                Ok(base) => self.rings.set_base(chip, Some(base)),
                Err(e) if self.cfg.chip_heap_ring_size.is_none() => {
                    tracing::debug!(target: "simpler::worker", chip, "no device heap on chip {chip} ({bytes} bytes): {e}");
                }
                Err(e) => {
                    return Err(e.context(format!(
                        "allocating the device heap of chip {chip} ({bytes} bytes: four rings of WorkerBuilder::chip_heap_ring_size)"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// An L3 Worker's `orch.alloc` memory: its host heap rings, and device heap rings on its chips
/// for intermediates placed on one chip (`orch.alloc_on`), which fall back to the host rings
/// where a chip has none.
struct LevelHeap {
    host: HostRings,
    chips: Arc<DeviceRings>,
}

impl IntermediateHeap for LevelHeap {
    fn alloc(
        &self,
        place: Place,
        ring: usize,
        bytes: u64,
        id: Identity,
    ) -> Result<Option<(HeapBlock, crate::data::buffer::Backing)>> {
        if let Place::Chip(chip) = place
            && let Some(got) = self.chips.try_alloc(chip, ring, bytes)
        {
            return got;
        }
        self.host.alloc(Place::Host, ring, bytes, id)
    }

    fn release(&self, block: HeapBlock) {
        match block.place {
            Place::Host => self.host.release(block),
            Place::Chip(_) => self.chips.release(block),
        }
    }

    fn hands_out(&self, backing: &crate::data::buffer::Backing) -> bool {
        self.host.hands_out(backing) || self.chips.hands_out(backing)
    }

    fn exhausted(&self, place: Place, ring: usize) -> (String, &'static str, u64) {
        match place {
            Place::Chip(chip) if self.chips.base(chip).is_some() => (
                format!("device heap ring {ring} of chip {chip} exhausted"),
                "chip_heap_ring_size",
                self.chips.ring_size(),
            ),
            _ => self.host.exhausted(Place::Host, ring),
        }
    }

    fn spans(&self) -> Vec<SharedSpan> {
        self.host.spans()
    }
}

impl Tree {
    /// Sends one control request to mailbox `i` and waits for the reply (serialized with every
    /// other control of this Worker).
    fn control(&self, i: usize, who: &str, post: impl Fn(Mailbox<'_>) -> Result<()>) -> Result<u64> {
        let _one_at_a_time = sync::lock(&self.control_lock);
        if let Some(how) = self.monitor.board.exit_of(i) {
            return Err(Error::new(
                ErrorKind::WorkerDied,
                format!("{who} is dead: the worker process {how}"),
            ));
        }
        let mb = self.region.mailbox(i);
        post(mb)?;
        let board = self.monitor.board.clone();
        match mb.wait_control_done(None, || board.exit_of(i).is_some()) {
            Some(Ok(v)) => Ok(v),
            // A resource error names its chip already.
            Some(Err(e)) if e.code == ERR_RESOURCE => {
                Err(Error::new(ErrorKind::ResourceExhausted, e.message))
            }
            Some(Err(e)) if e.code == ERR_WORKER_DIED => {
                Err(Error::new(ErrorKind::WorkerDied, format!("{who} refused: {}", e.message)))
            }
            Some(Err(e)) => Err(Error::new(ErrorKind::Callable, format!("{who} refused: {}", e.message))),
            None => Err(Error::new(ErrorKind::WorkerDied, format!("{who} died during the request"))),
        }
    }

    /// Sends one registration (`post`) of `digest` to every live child in `targets` and waits
    /// for each to install it: all or nothing. When one refuses (or dies), the ones that
    /// installed it drop it again before this returns the error, so no task can run it
    /// anywhere; one that cannot confirm that makes the error `REGISTER_CLEANUP_UNCERTAIN`.
    fn register_on(
        &self,
        targets: &[usize],
        digest: &Digest,
        post: impl Fn(Mailbox<'_>) -> Result<()>,
    ) -> Result<()> {
        let label = |i: usize| self.lanes.label(i);
        let mut installed = Vec::with_capacity(targets.len());
        for &i in targets {
            if self.monitor.board.has_exited(i) {
                continue; // a dead worker can run nothing; it needs no copy
            }
            let err = match self.control(i, &label(i), &post) {
                Ok(_) => {
                    installed.push(i);
                    continue;
                }
                Err(e) => e,
            };
            let mut uncertain = Vec::new();
            for &j in installed.iter().rev() {
                let undo = self
                    .control(j, &label(j), |mb| mb.post_control(CTRL_UNREGISTER, 0, digest.as_bytes(), &[]));
                if let Err(u) = undo {
                    uncertain.push(u.message().to_string());
                }
            }
            let names = || installed.iter().map(|&j| label(j)).collect::<Vec<_>>().join(", ");
            let message = if !uncertain.is_empty() {
                format!(
                    "REGISTER_CLEANUP_UNCERTAIN: {}; it may still be installed where it could not be removed again: {}",
                    err.message(),
                    uncertain.join("; ")
                )
            } else if installed.is_empty() {
                err.message().to_string()
            } else {
                format!("{} (removed again from {}: registered nowhere)", err.message(), names())
            };
            return Err(Error::new(err.kind(), message));
        }
        Ok(())
    }

    /// Sends one control request to every live child in `targets` and waits for all replies.
    fn broadcast(
        &self,
        targets: impl IntoIterator<Item = usize>,
        post: impl Fn(Mailbox<'_>) -> Result<()>,
    ) -> Result<()> {
        for i in targets {
            if self.monitor.board.has_exited(i) {
                continue; // a dead worker can run nothing; it needs no copy
            }
            self.control(i, &self.lanes.label(i), &post)?;
        }
        Ok(())
    }

    /// Refuses a request on an engine that is closing.
    fn open(&self) -> Result<()> {
        if self.engine.is_closed() {
            return Err(Error::state("the Worker is closed"));
        }
        Ok(())
    }

    /// The session of the remote Worker NEXT_LEVEL id `id` names, if it names one; refused
    /// when the Worker is closing.
    fn remote_of(&self, id: u32) -> Result<Option<Arc<Session>>> {
        self.open()?;
        Ok(self.lanes.remote_index(id).map(|j| self.session(j)))
    }

    /// The session with remote Worker `j` now.
    fn session(&self, j: usize) -> Arc<Session> {
        sync::lock(&self.remote[j]).clone()
    }

    /// Connects to remote Worker `j`'s node again, in place of its lost session (lane `i`),
    /// with each orchestration function placed on it checked there; the node's resident
    /// buffers of the old session are gone. Returns the node's pid.
    fn rejoin(&self, i: usize, j: usize, callables: &Callables) -> Result<i32> {
        let who = self.lanes.label(i);
        let old = self.session(j);
        if !old.is_lost() {
            return Err(Error::state(format!("{who} is in service; only a lost remote Worker is replaced")));
        }
        let spec = &self.remote_specs[j];
        if let Some(rank) = spec.launch_rank {
            return Err(Error::invalid(format!(
                "{who} is rank {rank} of a launched job, which connects to the root only at init; relaunch the job to bring it back"
            )));
        }
        let busy = || {
            Error::state(format!(
                "{who} still holds a task of a run that has not ended; wait for it, then replace it"
            ))
        };
        // Before the connection and the node's Worker for it are made (asked again below).
        if self.engine.lane_holds_task(i) {
            return Err(busy());
        }
        let id = (self.lanes.next_level() - self.remote.len() + j) as u32;
        let bell: Arc<dyn AsRef<Doorbell> + Send + Sync> = Arc::new(RegionBell(self.region.clone()));
        let resolver = HostResolver::new(self.heaps.clone());
        let s = Session::connect(spec, who.clone(), resolver, bell)?;
        if let Err(e) = claim_size(&s, spec.needs, self.cfg.startup_timeout) {
            s.close();
            return Err(e);
        }
        // What is placed on it must be there; a linked function (found wherever it is) is asked
        // again: the node may run another program now.
        let mut found = Vec::new();
        for (d, _, f) in callables.orch().iter() {
            let placement = callables.placement(d).unwrap_or(&Placement::Everywhere);
            if !placement.requires(id) && *placement != Placement::Found {
                continue;
            }
            match check_callable(&s, &f.handle(), self.cfg.startup_timeout) {
                Ok(()) => found.push((*d, true)),
                Err(e) if *placement == Placement::Found && e.kind() == ErrorKind::Callable => {
                    found.push((*d, false));
                }
                Err(e) => {
                    s.close();
                    return Err(e);
                }
            }
        }
        // The old session's node-resident buffers died with it: forgotten before anything can
        // reach the new session (a task naming one fails as using a lost worker's buffer).
        self.devices.forget_chip(id);
        self.peers.forget_worker(id);
        if !self.engine.replace_endpoint(i, Box::new(RemoteEndpoint::new(s.clone(), id, self.peers.clone())))
        {
            s.close();
            return Err(busy());
        }
        old.close();
        *sync::lock(&self.remote[j]) = s.clone();
        {
            let all = self.lanes.next_level() as u32;
            let mut known = self.engine.callables().write();
            for (d, has) in found {
                let Some(r) = known.get_mut(&d).filter(|r| r.kind == CallableKind::Orch) else { continue };
                let mut on: Vec<u32> =
                    r.placed.as_deref().map_or_else(|| (0..all).collect(), <[u32]>::to_vec);
                on.retain(|&w| w != id);
                if has {
                    on.push(id);
                    on.sort_unstable();
                }
                r.placed = (on.len() != all as usize).then(|| on.into());
            }
        }
        tracing::info!(target: "simpler::worker", worker = %who, pid = s.node_pid(), "remote worker rejoined");
        Ok(s.node_pid() as i32)
    }

    /// The mailbox of chip `chip`; refused for a chip this Worker does not have, and when the
    /// Worker is closing.
    fn chip_mailbox(&self, chip: u32) -> Result<usize> {
        self.open()?;
        self.lanes.chip(chip).ok_or_else(|| {
            Error::invalid(format!(
                "chip {chip} does not exist: this Worker has {} chips; add chips with WorkerBuilder::chips(n)",
                self.lanes.chips()
            ))
        })
    }
}

/// The payload of a copy between host buffer `host` and a device buffer of `nbytes`.
fn host_payload(host: &Buffer, nbytes: u64) -> Vec<u8> {
    let mut d = [0u8; DESC_SIZE];
    encode_desc(host.desc(), &mut d);
    let mut payload = d.to_vec();
    payload.extend_from_slice(&0u64.to_le_bytes());
    payload.extend_from_slice(&nbytes.to_le_bytes());
    payload
}

impl Runtime for Tree {
    fn child_pids(&self) -> Vec<i32> {
        let board = &self.monitor.board;
        (0..self.children).filter(|&i| !board.has_exited(i)).map(|i| self.monitor.pid(i)).collect()
    }

    fn workers(&self) -> Vec<WorkerStatus> {
        let board = &self.monitor.board;
        let status = |(i, &pid): (usize, &i32)| {
            let (kind, id) = self.lanes.kind_of(i);
            let state = match board.exit_status(i) {
                None => WorkerState::Alive,
                Some(Ended::Exited(code)) => WorkerState::Exited(code),
                Some(Ended::Signaled(sig)) => WorkerState::Killed(sig),
                Some(Ended::Unknown) => WorkerState::Lost,
            };
            WorkerStatus { kind, id, pid, state }
        };
        let mut all: Vec<WorkerStatus> =
            (0..self.children).map(|i| (i, self.monitor.pid(i))).map(|(i, pid)| status((i, &pid))).collect();
        for j in 0..self.remote.len() {
            let s = self.session(j);
            let (kind, id) = self.lanes.kind_of(self.children + j);
            let state = if s.is_lost() { WorkerState::Lost } else { WorkerState::Alive };
            // The node's process id, on its own host.
            all.push(WorkerStatus { kind, id, pid: s.node_pid() as i32, state });
        }
        all
    }

    fn ships_by_address(&self) -> bool {
        true
    }

    fn any_dead(&self) -> bool {
        (0..self.children).any(|i| self.monitor.board.has_exited(i))
    }

    fn replace(&self, i: usize, callables: &Callables) -> Result<i32> {
        let _one_at_a_time = sync::lock(&self.control_lock);
        self.open()?;
        let who = self.lanes.label(i);
        if i >= self.children {
            return self.rejoin(i, i - self.children, callables);
        }
        let old = self.monitor.pid(i);
        if !self.monitor.board.has_exited(i) {
            return Err(Error::state(format!(
                "{who} (process {old}) is alive; only a dead worker is replaced"
            )));
        }
        let (kind, id) = self.lanes.kind_of(i);
        if kind == WorkerKind::Nested {
            return Err(Error::invalid(format!(
                "{who} is a nested Worker, whose whole subtree would have to start again; close this Worker and build a new one"
            )));
        }
        if self.cfg.start == StartMethod::Fork {
            return Err(Error::state(format!(
                "{who} would be forked from a process whose engine threads run (a new child could inherit a lock they hold); build the Worker with StartMethod::Exec to replace workers"
            )));
        }
        // Rule M8 of the mailbox: the old child is reaped, the lane is out of service, and
        // control requests wait for `control_lock`.
        let mb = self.region.mailbox(i);
        mb.reset_for_new_child();
        let resolver = HostResolver::new(self.heaps.clone());
        let plan = match kind {
            WorkerKind::Sub => ChildPlan::Sub(SubChild {
                region: self.region.clone(),
                index: i,
                cpu: cpu_of(&self.sub_cpus, i),
                registry: callables.host().clone(),
                resolver,
            }),
            _ => {
                let config = ChipConfig {
                    spec: ChipSpec {
                        chip_id: id,
                        memory_bytes: self.cfg.chip_memory,
                        cores: self.cfg.chip_cores,
                    },
                    backend: self.cfg.chip_backend,
                };
                ChildPlan::Chip(ChipChild {
                    region: self.region.clone(),
                    index: i,
                    config,
                    pipeline_depth: chip_depth(&self.cfg),
                    registry: callables.chip().clone(),
                    resolver,
                })
            }
        };
        let pid = start_child(self.cfg.start, &who, plan, &self.region, &self.heaps)?;
        if let Err(e) = self.monitor.watch(i, pid) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
            return Err(e);
        }
        let board = self.monitor.board.clone();
        let deadline = crate::sys::clock::after(self.cfg.startup_timeout);
        let failed = match mb.wait_init(deadline, || board.exit_of(i).is_some()) {
            InitStatus::Ready => None,
            InitStatus::Failed(msg) => Some(format!("failed to start: {msg}")),
            InitStatus::Pending => Some(match board.exit_of(i) {
                Some(how) => format!("{how} during startup"),
                None => format!(
                    "did not report ready within the startup timeout of {:?}",
                    self.cfg.startup_timeout
                ),
            }),
        };
        // A close that began while the new worker started may have stopped the children
        // before this one was among them: it is not put in service, but stopped here (a close
        // marks the Worker closed before it stops its children, so one of the two stops it).
        let failed =
            failed.or_else(|| self.open().err().map(|e| format!("was not put in service: {}", e.message())));
        if let Some(why) = failed {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            board.wait_all(&[i], Instant::now() + REAP_GRACE);
            return Err(Error::new(ErrorKind::WorkerDied, format!("the new {who} (process {pid}) {why}")));
        }
        if kind == WorkerKind::Chip {
            // The dead chip's device memory died with it: its buffers are gone, and so is its
            // device heap (its intermediates come from the host from now on).
            self.devices.forget_chip(id);
            self.rings.set_base(id, None);
        }
        self.engine.revive_lane(i);
        tracing::info!(target: "simpler::worker", worker = %who, old, pid, "worker replaced");
        Ok(pid)
    }

    fn install(&self, c: &Callable) -> Result<()> {
        let desc = c.descriptor();
        let digest = desc.digest();
        let (command, addr) = match c {
            Callable::Host(f) => match f.body() {
                Body::Ptr(ptr) => (CTRL_REGISTER_FN, FnAddress::of(*ptr).to_wire()),
                // The Worker refuses a closure once its children run (`ships_by_address`).
                Body::Closure(_) => {
                    return Err(Error::new(
                        ErrorKind::Callable,
                        format!("{}: a closure cannot be sent to a live worker", c.handle()),
                    ));
                }
            },
            // At L3 the targets are the chips; above, the nested Workers with chips below them,
            // which pass it on to their own chips.
            Callable::Chip(f) if f.is_kernel() => (CTRL_REGISTER_CHIP, f.fn_address()),
            Callable::Chip(f) => (CTRL_REGISTER_CHIP_ORCH, f.fn_address()),
            Callable::Orch(f, _) => (CTRL_REGISTER_ORCH, f.fn_address()),
        };
        if let Callable::Orch(_, placement) = c {
            // A remote node has it only if its program registered it too: each node it is
            // placed on says so, before any local target installs it (so a refusal leaves
            // nothing installed anywhere).
            let n_local = self.lanes.next_level() - self.remote.len();
            for j in 0..self.remote.len() {
                let s = self.session(j);
                if !s.is_lost() && placement.requires((n_local + j) as u32) {
                    check_callable(&s, &c.handle(), self.cfg.startup_timeout)?;
                }
            }
        }
        self.register_on(&self.lanes.targets(c.kind()), &digest, |mb| {
            mb.post_control(command, addr, digest.as_bytes(), desc.bytes())
        })?;
        // From now on, submits may name it.
        self.engine.callables().write().insert(digest, c.registered());
        Ok(())
    }

    fn uninstall(&self, handle: &CallableHandle, last: bool) -> Result<()> {
        let digest = handle.digest();
        self.broadcast(self.lanes.targets(handle.kind()), |mb| {
            mb.post_control(CTRL_UNREGISTER, 0, digest.as_bytes(), &[])
        })?;
        if last {
            self.engine.callables().write().remove(&digest);
        }
        Ok(())
    }

    fn minter(&self) -> Result<&IdentityMinter> {
        self.open()?;
        Ok(&self.minter)
    }

    fn engine(&self) -> Result<&Arc<Engine>> {
        self.open()?;
        Ok(&self.engine)
    }

    fn run_callable(&self, _: &CallableHandle, _: TaskArgs, _: CallConfig) -> Result<()> {
        Err(Error::state(
            "Worker.run_callable: only an L2 (chip) Worker runs a chip callable directly; submit it from an orchestration function",
        ))
    }

    fn alloc_device(&self, chip: u32, shape: &[u32], dtype: DataType) -> Result<Buffer> {
        if let Some(s) = self.remote_of(chip)? {
            let nbytes = super::device_extent(shape, dtype)?;
            let reply = resident(&s, wire::ALLOC, nbytes, 0, &[], self.cfg.startup_timeout)?;
            let (id, peer) = decode_alloc(&reply)?;
            if let Some((addr, grant)) = peer {
                self.peers.record(chip, id, addr, grant);
            }
            let identity = self.minter.mint()?;
            sync::lock(&self.devices.live).insert(identity, Held { chip, holds: 0 });
            return Buffer::device(identity, chip, id, nbytes);
        }
        let mbox = self.chip_mailbox(chip)?;
        let nbytes = super::device_extent(shape, dtype)?;
        // The chip binds the block to this identity, and checks device tensors by it.
        let identity = self.minter.mint()?;
        let arg = crate::data::wire::identity_arg(identity);
        // Its errors name the chip ("chip 0 refused: ..."; a resource error names it too).
        let ptr = self
            .control(mbox, &self.lanes.label(mbox), |mb| mb.post_control(CTRL_MALLOC, nbytes, &arg, &[]))?;
        sync::lock(&self.devices.live).insert(identity, Held { chip, holds: 0 });
        Buffer::device(identity, chip, ptr, nbytes)
    }

    fn copy_to(&self, chip: u32, ptr: u64, dev: Identity, src: &Buffer, nbytes: u64) -> Result<()> {
        self.devices.owned(&self.minter, dev, true)?;
        self.devices.idle(dev)?;
        if let Some(s) = self.remote_of(chip)? {
            let n = usize::try_from(nbytes).map_err(|_| Error::invalid("too large"))?;
            // In parts, each its own control (no frame nears the size limit).
            for at in (0..n).step_by(wire::COPY_PART) {
                let bytes = src.read::<u8>(at, wire::COPY_PART.min(n - at))?;
                resident(&s, wire::COPY_TO, ptr, at as u64, &bytes, self.cfg.startup_timeout)?;
            }
            return Ok(());
        }
        let payload = host_payload(src, nbytes);
        let mbox = self.chip_mailbox(chip)?;
        self.control(mbox, &self.lanes.label(mbox), |mb| {
            mb.post_control(CTRL_COPY_TO, ptr, &[0; 32], &payload)
        })
        .map(|_| ())
    }

    fn copy_from(&self, dst: &Buffer, chip: u32, ptr: u64, dev: Identity, nbytes: u64) -> Result<()> {
        self.devices.owned(&self.minter, dev, true)?;
        self.devices.idle(dev)?;
        if let Some(s) = self.remote_of(chip)? {
            let n = usize::try_from(nbytes).map_err(|_| Error::invalid("too large"))?;
            // In parts, each its own control (no frame nears the size limit).
            for at in (0..n).step_by(wire::COPY_PART) {
                let len = wire::COPY_PART.min(n - at);
                let offset = (at as u64).to_le_bytes();
                let bytes =
                    resident(&s, wire::COPY_FROM, ptr, len as u64, &offset, self.cfg.startup_timeout)?;
                if bytes.len() != len {
                    return Err(Error::decode(format!(
                        "the node sent {} of {len} bytes at offset {at}",
                        bytes.len()
                    )));
                }
                dst.write(at, &bytes)?;
            }
            return Ok(());
        }
        let payload = host_payload(dst, nbytes);
        let mbox = self.chip_mailbox(chip)?;
        self.control(mbox, &self.lanes.label(mbox), |mb| {
            mb.post_control(CTRL_COPY_FROM, ptr, &[0; 32], &payload)
        })
        .map(|_| ())
    }

    fn free(&self, buf: &Buffer, chip: u32, ptr: u64) -> Result<()> {
        self.devices.owned(&self.minter, buf.desc().identity(), false)?;
        if let Some(s) = self.remote_of(chip)? {
            let in_flight = self.engine.live_runs().len();
            if in_flight > 0 {
                return Err(Error::state(format!(
                    "{in_flight} run(s) are in flight and may use the buffer; wait for them first"
                )));
            }
            if !buf.mark_freed() {
                return Err(Error::state(format!(
                    "node-resident buffer {} was already freed",
                    buf.desc().identity()
                )));
            }
            sync::lock(&self.devices.live).remove(&buf.desc().identity());
            self.peers.forget(chip, ptr);
            return resident(&s, wire::FREE, ptr, 0, &[], self.cfg.startup_timeout).map(|_| ());
        }
        let mbox = self.chip_mailbox(chip)?;
        let in_flight = self.engine.live_runs().len();
        if in_flight > 0 {
            return Err(Error::state(format!(
                "{in_flight} run(s) are in flight and may use the buffer; wait for them first"
            )));
        }
        if !buf.mark_freed() {
            return Err(Error::state(format!("device buffer {} was already freed", buf.desc().identity())));
        }
        sync::lock(&self.devices.live).remove(&buf.desc().identity());
        self.control(mbox, &self.lanes.label(mbox), |mb| mb.post_control(CTRL_FREE, ptr, &[0; 32], &[]))
            .map(|_| ())
    }

    fn close(&self, timeout: Duration) -> Result<()> {
        let _span = tracing::debug_span!(target: "simpler::worker", "close").entered();
        let eng = self.engine.clone();
        eng.mark_closed();
        let deadline = crate::sys::clock::after(timeout);
        let mut abandoned = 0;
        for run in eng.live_runs() {
            if !eng.drive_until(|| run.is_done(), Some(deadline)) {
                abandoned += 1;
                run.abandon(Error::state(format!(
                    "run {} was abandoned: the Worker closed before it finished",
                    run.id
                )));
            }
        }
        eng.stop_background();
        if let Some(t) = sync::lock(&self.background).take() {
            let _ = t.join();
        }
        // Children still busy at the deadline (a stuck task) are killed, not waited for: the
        // whole close takes at most `timeout + SHUTDOWN_GRACE + REAP_GRACE` (1.1 s, documented
        // on `WorkerBuilder::close_timeout`), the extra only when a child had to be killed.
        stop_children(
            &self.region,
            &self.monitor,
            self.children,
            deadline.max(Instant::now() + SHUTDOWN_GRACE),
        );
        eng.shutdown_lanes();
        if abandoned > 0 {
            return Err(Error::new(
                ErrorKind::Timeout,
                format!("{abandoned} run(s) did not finish within {:?} and were abandoned", timeout),
            ));
        }
        Ok(())
    }
}

/// How long `close` waits for its children to exit once asked, at least: when its
/// `close_timeout` has already passed (runs were abandoned), the idle ones still get this long
/// to leave on their own before the stragglers are killed.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(100);

/// How long `close` waits for the children it killed (`SIGKILL`) to be reaped: the kernel
/// tears down a killed process's memory before it can be reaped, milliseconds per GiB.
const REAP_GRACE: Duration = Duration::from_secs(1);

/// `close`'s ending of the children: asks every child to shut down, waits for them until
/// `exit_by`, kills the stragglers and reaps them within [`REAP_GRACE`].
fn stop_children(region: &MailboxRegion, monitor: &Monitor, children: usize, exit_by: Instant) {
    for i in 0..children {
        region.mailbox(i).request_shutdown();
    }
    let all: Vec<usize> = (0..children).collect();
    if !monitor.board.wait_all(&all, exit_by) {
        monitor.kill_all();
        monitor.board.wait_all(&all, Instant::now() + REAP_GRACE);
    }
    monitor.stop();
}

/// Child `first`, which has not reported ready by the startup deadline, and every later child
/// of `pids` that has not reported either (ready or failed) and is alive: those that hung.
fn hung_children(region: &MailboxRegion, monitor: &Monitor, first: usize, pids: &[i32]) -> Vec<usize> {
    let now = Instant::now();
    let silent = |j: usize| {
        matches!(region.mailbox(j).wait_init(now, || false), InitStatus::Pending)
            && monitor.board.exit_of(j).is_none()
    };
    std::iter::once(first).chain((first + 1..pids.len()).filter(|&j| silent(j))).collect()
}

/// Asks every child to shut down, waits briefly, kills stragglers, and reaps all of them.
fn abort_children(region: &MailboxRegion, monitor: &Monitor, pids: &[i32]) {
    for i in 0..pids.len() {
        region.mailbox(i).request_shutdown();
    }
    let all: Vec<usize> = (0..pids.len()).collect();
    if !monitor.board.wait_all(&all, Instant::now() + Duration::from_secs(5)) {
        monitor.kill_all();
        monitor.board.wait_all(&all, Instant::now() + Duration::from_secs(5));
    }
    monitor.stop();
}

/// The device buffers an L3 Worker allocated on its chips and has not freed, each with the
/// number of submitted tasks that name it and have not finished, and the rule its engine
/// checks device tensors by at submit: device memory goes only to a task on its own chip
/// (never to a SUB task), and only while it is allocated.
#[derive(Default)]
pub(crate) struct ChipBuffers {
    /// What holds the memory, for messages: "chip" at L3, "worker" (a remote L3 Worker) above.
    noun: &'static str,
    /// The remote Workers' ids: a task on one may read another's node-resident memory (its
    /// bytes go from node to node, `remote::peer`).
    remote: std::ops::Range<u32>,
    live: std::sync::Mutex<std::collections::HashMap<Identity, Held>>,
    /// Buffers whose chip died and was replaced (their memory died with it), by chip.
    lost: std::sync::Mutex<std::collections::HashMap<Identity, u32>>,
}

/// One live device buffer: its chip, and the submitted tasks that name it and have not
/// finished.
#[derive(Clone, Copy)]
struct Held {
    chip: u32,
    holds: u32,
}

impl ChipBuffers {
    /// Refuses a device buffer another Worker allocated (its identity has another owner than
    /// `minter`'s) and, when `live`, one already freed or lost with its chip.
    fn owned(&self, minter: &IdentityMinter, id: Identity, live: bool) -> Result<()> {
        if id.owner() != minter.owner() {
            return Err(Error::invalid(format!(
                "device buffer {id} belongs to another Worker; only the Worker that allocated it may use it"
            )));
        }
        if live && !sync::lock(&self.live).contains_key(&id) {
            if let Some(chip) = sync::lock(&self.lost).get(&id) {
                return Err(Error::state(format!(
                    "device buffer {id} was lost with chip {chip}, which died and was replaced"
                )));
            }
            return Err(Error::state(format!("device buffer {id} was already freed")));
        }
        Ok(())
    }

    /// Forgets every buffer of `chip` (it died and was replaced): they are lost.
    fn forget_chip(&self, chip: u32) {
        let mut live = sync::lock(&self.live);
        let mut lost = sync::lock(&self.lost);
        live.retain(|&id, h| {
            if h.chip == chip {
                lost.insert(id, chip);
            }
            h.chip != chip
        });
    }

    /// Refuses device buffer `id` while a submitted task names it.
    fn idle(&self, id: Identity) -> Result<()> {
        match sync::lock(&self.live).get(&id).map(|h| h.holds) {
            Some(n) if n > 0 => Err(Error::state(format!(
                "device buffer {id} is named by {n} submitted task(s) that have not finished; a copy now would reorder data around them, so wait for their run first"
            ))),
            _ => Ok(()),
        }
    }
}

impl DeviceRules for ChipBuffers {
    fn check(&self, u: &DeviceUse<'_>) -> Result<()> {
        let DeviceUse { callable, tensor: i, chip, id, runs_on, intermediate, writes } = *u;
        match runs_on {
            None => {
                return Err(Error::invalid(format!(
                    "{callable}: tensor {i} is memory of {} {chip}; SUB tasks run on the host and cannot use it",
                    self.noun
                )));
            }
            // Node to node: read where it lives by the node that runs the task.
            Some(w) if w != chip && self.remote.contains(&w) && self.remote.contains(&chip) && !writes => {}
            Some(w) if w != chip && self.remote.contains(&w) && self.remote.contains(&chip) => {
                return Err(Error::invalid(format!(
                    "{callable}: tensor {i} lives on worker {chip} and this task on worker {w} would write it; a task may read another node's memory (its bytes go from node to node) but write only its own node's: write a buffer of worker {w}, or run the task on worker {chip}"
                )));
            }
            Some(w) if w != chip => {
                return Err(Error::invalid(format!(
                    "{callable}: tensor {i} lives on {noun} {chip} but this task runs on {noun} {w}; such memory is usable only there",
                    noun = self.noun
                )));
            }
            Some(_) => {}
        }
        // An intermediate of the engine's device heap: the engine checked it is live.
        if !intermediate && !sync::lock(&self.live).contains_key(&id) {
            if sync::lock(&self.lost).contains_key(&id) {
                return Err(Error::invalid(format!(
                    "{callable}: tensor {i} names buffer {id} of {noun} {chip}, which was lost when {noun} {chip} died and was replaced",
                    noun = self.noun
                )));
            }
            return Err(Error::invalid(format!(
                "{callable}: tensor {i} names buffer {id} of {} {chip}, which was freed (or never allocated by this Worker)",
                self.noun
            )));
        }
        Ok(())
    }

    fn hold(&self, id: Identity) {
        if let Some(h) = sync::lock(&self.live).get_mut(&id) {
            h.holds += 1;
        }
    }

    fn release(&self, id: Identity) {
        if let Some(h) = sync::lock(&self.live).get_mut(&id) {
            h.holds = h.holds.saturating_sub(1);
        }
    }
}

/// The pipeline depth a Worker asks of each chip: its `pipeline_depth`.
fn chip_depth(cfg: &Config) -> u32 {
    u32::try_from(cfg.engine.pipeline_depth).unwrap_or(u32::MAX)
}
