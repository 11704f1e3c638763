//! How a Worker starts its children: [`StartMethod`], and the start spec a child started by
//! exec receives.
//!
//! With [`StartMethod::Exec`] (the default) each child is a new process of this same binary
//! (`sys::spawn`): before `main` runs, its start hook reads a *start spec* and becomes the
//! child the spec describes. The spec carries everything the child would otherwise inherit by
//! fork: its mailbox region and the heap rings (as inherited memfds), which mailbox it serves,
//! the callables it starts with (each as its descriptor and its function's offset in the
//! binary, rule FA2 of `sys::fn_address`), and for a nested Worker that Worker's whole
//! configuration, its callables and its own nested Workers, recursively.
//!
//! The spec is bytes this module writes and reads: a magic word, a version, then fields in a
//! fixed order, every length bounds-checked on the way in (a malformed spec is a named error in
//! the child, never a panic). It holds the mailbox region and heap rings as fd indices, the
//! role (a SUB worker's with the CPU it binds itself to, if any), the callables as command + function offset + references + descriptor, and for a nested
//! Worker its whole configuration, callables and nested Workers, recursively, then its remote
//! Workers (name, address, key, timeouts, launch rank); the children are re-added through
//! the builder (`WorkerBuilder::worker`, `remote_worker`), so the rebuilt Worker has the same lanes and ids.
//! [`start_child`] forks a [`ChildPlan`] (a `SubChild`, `ChipChild` or `NestedChild`) or writes
//! it as a spec and starts this binary with it; `child_main`, the `CHILD_ENTRY`, reads a spec
//! back and runs the plan.
//!
//! # Why exec
//!
//! A fork copies the program with every lock its other threads hold at that moment (stdout, a
//! logger, the panic hook, a user mutex), and a child that takes one hangs for ever;
//! `PR_SET_PDEATHSIG` also ties a forked child to the thread that forked it. So by default every
//! child is a new process of the same binary: forked and at once exec'd (only
//! async-signal-safe calls in between) on `sys::spawn`'s spawner thread, which lives as long as
//! the process, so the children die with the process and not with the thread that called
//! `init`. The `.init_array` hook makes the new process the child before `main` (also under a
//! test harness). What a fork would have inherited travels explicitly: regions as memfds,
//! callables as function offsets in the binary (`#[callable]`s and `HostFn::new` fns, before or
//! after `init`; closures cannot, and registering one under `Exec` is refused with the way out).
//!
//! The alternative, a fork server started before any thread, needs a hook before `main` too,
//! cannot serve a Worker made after threads exist unless it was started eagerly in every
//! program, and would still not start a node on another host. Exec of the same binary is the
//! design the remote nodes need as well: the same program, started in another role, receiving
//! its role as bytes (there over a socket, here in a memfd). [`StartMethod::Fork`] stays for
//! programs that start their Workers before any thread and want closures.
//!
//! Either way a child leads a background process group (rule P7 of `sys::process`), so the
//! terminal's signals to the foreground group (`SIGINT`, `SIGQUIT`, `SIGHUP`, `SIGTSTP`) reach
//! the program only, and the child ignores them and the background group's `SIGTTIN` and
//! `SIGTTOU` besides (`sys::spawn::ignore_terminal_signals`; a worker that reads from the
//! terminal gets an error rather than being stopped for good). So a program that handles Ctrl-C
//! keeps its workers, and one that does not ends and takes them with it (`PR_SET_PDEATHSIG`).

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::callable::host::{Body, HostFn};
use crate::callable::identity::{CallableKind, Descriptor};
use crate::callable::registry::Registry;
use crate::chip::{BackendFactory, ChipConfig, ChipFn, ChipSpec};
use crate::engine::orch_fn::OrchFn;
use crate::error::{Error, Result};
use crate::ipc::child::{
    CTRL_REGISTER_CHIP, CTRL_REGISTER_CHIP_ORCH, CTRL_REGISTER_FN, CTRL_REGISTER_ORCH, HostResolver,
    ReceivedFn, StartFn,
};
use crate::ipc::mailbox::MailboxRegion;
use crate::level::Level;
use crate::net::auth::ClusterKey;
use crate::net::frame::{BodyReader, BodyWriter, FrameError};
use crate::net::transport::NodeAddr;
use crate::sys::mem::{SharedRegion, SharedSpan};
use crate::sys::process::fork_child;
use crate::sys::spawn::{CHILD_ENTRY, ChildStart, spawn_self};
use crate::worker::Worker;
use crate::worker::builder::{Config, WorkerBuilder};
use crate::worker::callables::Callables;
use crate::worker::remote::RemoteWorker;
use crate::worker::serve::chip::ChipChild;
use crate::worker::serve::nested::NestedChild;
use crate::worker::serve::sub::SubChild;

/// How a Worker starts its child processes (SUB workers, chips, nested Workers); set with
/// [`WorkerBuilder::start_method`](crate::WorkerBuilder::start_method).
///
/// * [`Exec`](StartMethod::Exec), the default: each child is a new process of this program's
///   binary, which becomes the child before `main` runs. Safe whatever other threads the
///   program runs (nothing they lock is inherited), and the children live as long as the
///   Worker whichever thread created it. Children receive callables as functions of the binary:
///   `#[callable]`s and [`HostFn::new`](crate::HostFn::new) functions reach them, registered
///   before or after `init`; a [`HostFn::closure`](crate::HostFn::closure) cannot (registering
///   one is refused, naming it). Statics and other state the program set up in `main` are not
///   in the children: a child starts from the binary, not from a copy of the program.
///   The environment variable `SIMPLER_START_SPEC` is how a child learns its role: it is
///   reserved (a program started with it set does not reach `main`).
/// * [`Fork`](StartMethod::Fork): each child is a fork of the program at `init`. Closures
///   reach the children, but a fork copies every lock another thread held at that moment
///   (stdout, a logger, the allocator's): a child that needs one hangs for ever. Use it only
///   where `init` runs before the program starts any thread. A forked child is also killed when
///   the thread that called `init` ends.
///
/// ```
/// use simpler::{StartMethod, Worker};
///
/// let worker = Worker::builder().sub_workers(2).build()?;
/// assert_eq!(worker.start_method(), StartMethod::Exec);
/// let forked = Worker::builder().sub_workers(2).start_method(StartMethod::Fork).build()?;
/// assert_eq!(forked.start_method(), StartMethod::Fork);
/// # Ok::<(), simpler::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StartMethod {
    /// A new process of this binary per child (safe among threads).
    #[default]
    Exec,
    /// A fork of the calling process per child (closures reach the children; see the hazards).
    Fork,
}

/// The first bytes of every start spec.
const MAGIC: &[u8; 8] = b"SIMPLER1";
/// The start spec's format version.
const VERSION: u32 = 1;
/// Deepest nesting of Workers a spec may describe (levels L3..L7).
const MAX_DEPTH: u32 = 8;
/// Most entries of any list in a spec.
const MAX_LIST: u32 = 1 << 16;
/// Most references one callable may hold in a spec (a registration per reference).
const MAX_REFS: u32 = 1 << 16;

const ROLE_SUB: u8 = 1;
const ROLE_CHIP: u8 = 2;
const ROLE_NESTED: u8 = 3;

/// One child to start: what it serves, with everything it needs.
pub(crate) enum ChildPlan {
    Sub(SubChild),
    Chip(ChipChild),
    Nested(Box<NestedChild>),
}

impl ChildPlan {
    fn run(self) -> i32 {
        crate::sys::process::become_worker();
        match self {
            ChildPlan::Sub(c) => c.run(),
            ChildPlan::Chip(c) => c.run(),
            ChildPlan::Nested(c) => c.run(),
        }
    }
}

/// Starts `plan` by `method`; `label` names it (the child's `argv[0]` under exec). Returns its
/// pid.
pub(crate) fn start_child(
    method: StartMethod,
    label: &str,
    plan: ChildPlan,
    region: &Arc<MailboxRegion>,
    heaps: &[SharedSpan],
) -> Result<i32> {
    // The program's own children lead a process group each, which holds everything below them
    // (rule P7 of `sys::process`).
    let new_group = !crate::sys::process::in_worker();
    match method {
        StartMethod::Fork => fork_child(new_group, move || plan.run()),
        StartMethod::Exec => {
            let mut spec = Enc::new();
            let index = match &plan {
                ChildPlan::Sub(c) => c.index,
                ChildPlan::Chip(c) => c.index,
                ChildPlan::Nested(c) => c.index,
            };
            spec.u32(region.len() as u32).u32(index as u32).u32(heaps.len() as u32);
            let mut fds: Vec<BorrowedFd<'_>> = vec![region.fd()];
            for h in heaps {
                spec.u64(h.origin).u64(h.len());
                fds.push(h.region.fd());
            }
            // The tree's trace log (`sys::tracelog`), where the child leaves what it runs for
            // tasks of captured runs.
            let log = crate::sys::tracelog::key();
            spec.u32(log.map_or(0, |k| k.pid)).u32(log.map_or(0, |k| k.fd)).u64(log.map_or(0, |k| k.ino));
            match &plan {
                ChildPlan::Sub(c) => {
                    spec.u8(ROLE_SUB);
                    spec.u8(u8::from(c.cpu.is_some())).u64(c.cpu.unwrap_or(0) as u64);
                    host_registry(&mut spec, &c.registry, None)?;
                }
                ChildPlan::Chip(c) => {
                    spec.u8(ROLE_CHIP);
                    let s = &c.config.spec;
                    spec.u32(s.chip_id).u64(s.memory_bytes).u64(s.cores as u64).u64(c.config.backend.wire());
                    spec.u32(c.pipeline_depth);
                    chip_registry(&mut spec, &c.registry);
                }
                ChildPlan::Nested(c) => {
                    spec.u8(ROLE_NESTED).u32(c.id);
                    spec.duration(c.deadline.saturating_duration_since(Instant::now()));
                    spec.u32(c.owners.len() as u32);
                    for &o in &c.owners {
                        spec.u64(o);
                    }
                    orch_registry(&mut spec, &c.registry);
                    worker_spec(&mut spec, &c.worker, 0, &format!("worker {}", c.id))?;
                }
            }
            spawn_self(&format!("simpler: {label}"), &spec.finish(), &fds, new_group)
        }
    }
}

/// The entry a child started by exec runs (registered with `sys::spawn`).
#[expect(
    unsafe_code,
    reason = "a link-time registry entry: linkme places the static in a link section; no unsafe operation"
)]
#[linkme::distributed_slice(CHILD_ENTRY)]
static ENTRY: fn(ChildStart) -> i32 = child_main;

fn child_main(mut start: ChildStart) -> i32 {
    let spec = std::mem::take(&mut start.spec);
    let mut d = Dec::new(&spec);
    let region = match read_region(&mut d, &mut start) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("simpler: a worker process could not read its start spec: {e}");
            return 2;
        }
    };
    let index = match d.u32() {
        Ok(i) if (i as usize) < region.len() => i as usize,
        _ => {
            eprintln!("simpler: a worker process's start spec names no mailbox of its region");
            return 2;
        }
    };
    match read_plan(&mut d, &mut start, &region, index) {
        Ok(plan) => plan.run(),
        Err(e) => {
            let mb = region.mailbox(index);
            mb.set_child_pid(std::process::id());
            mb.publish_init(Err(&format!("its start spec is malformed: {e}")));
            1
        }
    }
}

fn read_region(d: &mut Dec<'_>, start: &mut ChildStart) -> Result<Arc<MailboxRegion>> {
    d.magic()?;
    let count = d.u32()? as usize;
    Ok(Arc::new(MailboxRegion::from_fd(start.take_fd(0)?, count)?))
}

fn read_plan(
    d: &mut Dec<'_>,
    start: &mut ChildStart,
    region: &Arc<MailboxRegion>,
    index: usize,
) -> Result<ChildPlan> {
    let n_heaps = d.count()?;
    let mut heaps = Vec::with_capacity(n_heaps);
    for i in 0..n_heaps {
        let origin = d.u64()?;
        let len = usize::try_from(d.u64()?).map_err(|_| Error::invalid("heap ring too large"))?;
        let region = SharedRegion::map_fd(start.take_fd(1 + i)?, len, true)?;
        heaps.push(SharedSpan { origin, region: Arc::new(region) });
    }
    let (pid, fd, ino) = (d.u32()?, d.u32()?, d.u64()?);
    if pid != 0 {
        crate::sys::tracelog::inherit(crate::sys::tracelog::LogKey { pid, fd, ino });
    }
    let region = region.clone();
    match d.u8()? {
        ROLE_SUB => {
            let bound = d.u8()? != 0;
            let cpu = Some(d.usize()?).filter(|_| bound);
            let registry = read_host(d)?;
            Ok(ChildPlan::Sub(SubChild { region, index, cpu, registry, resolver: HostResolver::new(heaps) }))
        }
        ROLE_CHIP => {
            let chip_id = d.u32()?;
            let memory_bytes = d.u64()?;
            let cores = d.u64()? as usize;
            let backend = BackendFactory::from_start_spec(d.u64()?)
                .ok_or_else(|| Error::invalid("chip backend factory at address 0"))?;
            let pipeline_depth = d.u32()?;
            let registry = read_chip(d)?;
            let config = ChipConfig { spec: ChipSpec { chip_id, memory_bytes, cores }, backend };
            Ok(ChildPlan::Chip(ChipChild {
                region,
                index,
                config,
                pipeline_depth,
                registry,
                resolver: HostResolver::new(heaps),
            }))
        }
        ROLE_NESTED => {
            let id = d.u32()?;
            let deadline = crate::sys::clock::after(d.duration()?);
            let owners = (0..d.count()?).map(|_| d.u64()).collect::<Result<Vec<_>>>()?;
            let registry = read_orch(d)?;
            let worker = read_worker(d, 0)?;
            Ok(ChildPlan::Nested(Box::new(NestedChild {
                region,
                index,
                id,
                worker,
                registry,
                deadline,
                heaps,
                owners,
            })))
        }
        other => Err(Error::invalid(format!("unknown child role {other}"))),
    }
}

/// Writes a Worker's configuration, callables and nested Workers (not started yet); `path`
/// names it from the Worker that starts it (`worker 0`, `worker 0/worker 1`).
fn worker_spec(e: &mut Enc, w: &Worker, depth: u32, path: &str) -> Result<()> {
    if depth >= MAX_DEPTH {
        return Err(Error::invalid("Workers nested deeper than a start spec can carry"));
    }
    let c = &w.cfg;
    e.u32(c.level.number())
        .u64(c.engine.task_window as u64)
        .u64(c.engine.heap_ring_size)
        .u64(c.engine.pipeline_depth as u64)
        .u64(c.engine.pending_run_depth as u64)
        .u8(u8::from(c.explicit_depth))
        .duration(c.engine.backpressure_timeout)
        .duration(c.engine.submit_timeout)
        .u64(c.engine.next_level_workers as u64)
        .u64(c.engine.sub_workers as u64)
        .u64(c.chip_memory)
        .u64(c.chip_cores as u64)
        .u8(u8::from(c.chip_heap_ring_size.is_some()))
        .u64(c.chip_heap_ring_size.unwrap_or(0))
        .u64(c.chip_backend.wire())
        .duration(c.startup_delay)
        .duration(c.startup_timeout)
        .duration(c.close_timeout)
        .u8(match c.start {
            StartMethod::Exec => 0,
            StartMethod::Fork => 1,
        })
        .u8(u8::from(c.replace_dead))
        .u8(u8::from(c.bind_sub_workers))
        .duration(c.run_deadline.unwrap_or(Duration::ZERO));
    host_registry(e, w.callables.host(), Some((path, w.cfg.level)))?;
    chip_registry(e, w.callables.chip());
    orch_registry(e, w.callables.orch());
    e.u32(w.children.len() as u32);
    for (j, child) in w.children.iter().enumerate() {
        worker_spec(e, child, depth + 1, &format!("{path}/worker {j}"))?;
    }
    e.u32(w.remote.len() as u32);
    for (j, node) in w.remote.iter().enumerate() {
        e.bytes(w.lanes.remote_name(j).as_bytes())
            .bytes(node.addr.to_string().as_bytes())
            .bytes(node.key.secret())
            .duration(node.connect_timeout)
            .duration(node.health_timeout)
            .u8(u8::from(node.launch_rank.is_some()))
            .u32(node.launch_rank.unwrap_or(0));
    }
    Ok(())
}

fn read_worker(d: &mut Dec<'_>, depth: u32) -> Result<Worker> {
    if depth >= MAX_DEPTH {
        return Err(Error::invalid("Workers nested too deep"));
    }
    let mut c = Config::defaults();
    c.level = Level::from_number(d.u32()?).ok_or_else(|| Error::invalid("unknown level"))?;
    c.engine.task_window = d.usize()?;
    c.engine.heap_ring_size = d.u64()?;
    c.engine.pipeline_depth = d.usize()?;
    c.engine.pending_run_depth = d.usize()?;
    c.explicit_depth = d.u8()? != 0;
    c.engine.backpressure_timeout = d.duration()?;
    c.engine.submit_timeout = d.duration()?;
    c.engine.next_level_workers = d.usize()?;
    c.engine.sub_workers = d.usize()?;
    if c.engine.next_level_workers.max(c.engine.sub_workers) > MAX_LIST as usize {
        return Err(Error::invalid(format!(
            "start spec: {} SUB workers and {} chips, more than {MAX_LIST}",
            c.engine.sub_workers, c.engine.next_level_workers
        )));
    }
    c.chip_memory = d.u64()?;
    c.chip_cores = d.usize()?;
    let heap_given = d.u8()? != 0;
    let heap = d.u64()?;
    c.chip_heap_ring_size = heap_given.then_some(heap);
    c.chip_backend = BackendFactory::from_start_spec(d.u64()?)
        .ok_or_else(|| Error::invalid("chip backend factory at address 0"))?;
    c.startup_delay = d.duration()?;
    c.startup_timeout = d.duration()?;
    c.close_timeout = d.duration()?;
    c.start = match d.u8()? {
        0 => StartMethod::Exec,
        1 => StartMethod::Fork,
        other => return Err(Error::invalid(format!("unknown start method {other}"))),
    };
    c.replace_dead = d.u8()? != 0;
    c.bind_sub_workers = d.u8()? != 0;
    c.run_deadline = Some(d.duration()?).filter(|d| !d.is_zero());
    let mut callables = Callables::new();
    callables.restore(read_host(d)?, read_chip(d)?, read_orch(d)?);
    let mut children = Vec::new();
    for _ in 0..d.count()? {
        children.push(read_worker(d, depth + 1)?);
    }
    // As the parent's were added: nested Workers first (their lanes, and which run chip
    // callables), then remote ones.
    let mut b = WorkerBuilder::of(c);
    for child in children {
        b = b.worker(child);
    }
    for _ in 0..d.count()? {
        let text = |b: &[u8]| {
            String::from_utf8(b.to_vec())
                .map_err(|_| Error::invalid("a remote Worker's name or address is not UTF-8"))
        };
        let name = text(d.bytes()?)?;
        let addr = NodeAddr::parse(&text(d.bytes()?)?)?;
        let key = ClusterKey::new(d.bytes()?)?;
        let mut node = RemoteWorker::new(addr, key);
        node.connect_timeout = d.duration()?;
        node.health_timeout = d.duration()?;
        let launched = d.u8()? != 0;
        let rank = d.u32()?;
        node.launch_rank = launched.then_some(rank);
        b = b.named_remote_worker(node, name);
    }
    let mut w = b.build()?;
    w.callables = callables;
    Ok(w)
}

/// Writes one registry entry: the command that types the function, its wire word, the
/// references held, and the descriptor.
fn entry(e: &mut Enc, command: u64, word: u64, refs: u32, descriptor: &[u8]) {
    e.u64(command).u64(word).u32(refs).bytes(descriptor);
}

/// Writes the host functions of a SUB worker (`nested` None) or of nested Worker `nested`
/// (its path and level).
fn host_registry(e: &mut Enc, r: &Registry<HostFn>, nested: Option<(&str, Level)>) -> Result<()> {
    e.u32(r.iter().count() as u32);
    for (digest, desc, f) in r.iter() {
        let Body::Ptr(ptr) = f.body() else {
            let msg = match nested {
                None => format!(
                    "{}: a closure cannot reach a worker process started by exec (StartMethod::Exec); register a fn with HostFn::new, or start the children with StartMethod::Fork",
                    f.handle()
                ),
                Some((path, level)) => format!(
                    "{}: a closure registered on {path} (an {level} Worker) cannot reach its process, which this Worker starts by exec (StartMethod::Exec); register a fn with HostFn::new, or build this Worker with StartMethod::Fork",
                    f.handle()
                ),
            };
            return Err(Error::new(crate::error::ErrorKind::Callable, msg));
        };
        let word = crate::sys::fn_address::FnAddress::of(*ptr).to_wire();
        entry(e, CTRL_REGISTER_FN, word, r.refs(digest), desc);
    }
    Ok(())
}

fn chip_registry(e: &mut Enc, r: &Registry<ChipFn>) {
    e.u32(r.iter().count() as u32);
    for (digest, desc, f) in r.iter() {
        let command = if f.is_kernel() { CTRL_REGISTER_CHIP } else { CTRL_REGISTER_CHIP_ORCH };
        entry(e, command, f.fn_address(), r.refs(digest), desc);
    }
}

fn orch_registry(e: &mut Enc, r: &Registry<OrchFn>) {
    e.u32(r.iter().count() as u32);
    for (digest, desc, f) in r.iter() {
        entry(e, CTRL_REGISTER_ORCH, f.fn_address(), r.refs(digest), desc);
    }
}

/// Reads `count` registry entries, building each value with `make` from its function and
/// descriptor, and installs each with its references.
fn read_registry<T: Clone + crate::callable::registry::Installable>(
    d: &mut Dec<'_>,
    kind: CallableKind,
    make: impl Fn(u64, ReceivedFn, Descriptor) -> Result<T>,
) -> Result<Registry<T>> {
    let mut r = Registry::new(crate::worker::callables::MAX_CALLABLES);
    for _ in 0..d.count()? {
        let command = d.u64()?;
        let word = d.u64()?;
        let refs = d.u32()?;
        let desc = Descriptor::from_bytes(d.bytes()?.to_vec())?;
        if desc.kind() != kind {
            return Err(Error::invalid(format!(
                "{}: a {:?} descriptor among {kind:?} callables",
                desc.digest(),
                desc.kind()
            )));
        }
        let f = StartFn::from_start_spec(command, word).get().map_err(|e| Error::invalid(e.message))?;
        let digest = desc.digest();
        let bytes = desc.bytes().to_vec();
        let value = make(command, f, desc)?;
        if refs == 0 || refs > MAX_REFS {
            return Err(Error::invalid(format!("{digest}: registered {refs} times (1 to {MAX_REFS})")));
        }
        for _ in 0..refs {
            r.install(digest, &bytes, value.clone())?;
        }
    }
    Ok(r)
}

fn read_host(d: &mut Dec<'_>) -> Result<Registry<HostFn>> {
    read_registry(d, CallableKind::HostFn, |command, f, desc| match (command, f) {
        (CTRL_REGISTER_FN, ReceivedFn::Host(f)) => Ok(HostFn::from_parts(f, desc)),
        _ => Err(Error::invalid(format!("command {command} among host functions"))),
    })
}

fn read_chip(d: &mut Dec<'_>) -> Result<Registry<ChipFn>> {
    read_registry(d, CallableKind::Chip, |_, f, desc| {
        ChipFn::from_parts(crate::worker::serve::chip_body(f), desc)
    })
}

fn read_orch(d: &mut Dec<'_>) -> Result<Registry<OrchFn>> {
    read_registry(d, CallableKind::Orch, |command, f, desc| match (command, f) {
        (CTRL_REGISTER_ORCH, ReceivedFn::Orch(f)) => Ok(OrchFn::from_parts(f, desc)),
        _ => Err(Error::invalid(format!("command {command} among orchestration functions"))),
    })
}

/// Writes a start spec: the session protocol's little-endian body writer, with a header.
struct Enc(BodyWriter);

impl Enc {
    fn new() -> Enc {
        let mut w = BodyWriter::new();
        w.raw(MAGIC).u32(VERSION);
        Enc(w)
    }
    fn u8(&mut self, v: u8) -> &mut Enc {
        self.0.u8(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Enc {
        self.0.u32(v);
        self
    }
    fn u64(&mut self, v: u64) -> &mut Enc {
        self.0.u64(v);
        self
    }
    fn duration(&mut self, d: Duration) -> &mut Enc {
        self.u64(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Enc {
        self.0.bytes(b);
        self
    }
    fn finish(self) -> Vec<u8> {
        self.0.finish()
    }
}

/// Reads a start spec: the session protocol's bounds-checked body reader, its errors as the
/// crate's.
struct Dec<'a>(BodyReader<'a>);

fn spec_error(e: FrameError) -> Error {
    Error::invalid(format!("start spec: {e}"))
}

impl<'a> Dec<'a> {
    fn new(b: &'a [u8]) -> Dec<'a> {
        Dec(BodyReader::new(b))
    }
    fn magic(&mut self) -> Result<()> {
        if self.0.raw(MAGIC.len()).map_err(spec_error)? != MAGIC {
            return Err(Error::invalid("not a start spec (bad magic)"));
        }
        match self.u32()? {
            VERSION => Ok(()),
            v => Err(Error::invalid(format!("start spec version {v}, expected {VERSION}"))),
        }
    }
    fn u8(&mut self) -> Result<u8> {
        self.0.u8().map_err(spec_error)
    }
    fn u32(&mut self) -> Result<u32> {
        self.0.u32().map_err(spec_error)
    }
    fn u64(&mut self) -> Result<u64> {
        self.0.u64().map_err(spec_error)
    }
    fn usize(&mut self) -> Result<usize> {
        usize::try_from(self.u64()?)
            .map_err(|_| Error::invalid("start spec: a count past this address space"))
    }
    fn count(&mut self) -> Result<usize> {
        match self.u32()? {
            n if n <= MAX_LIST => Ok(n as usize),
            n => Err(Error::invalid(format!("start spec: a list of {n} entries (at most {MAX_LIST})"))),
        }
    }
    fn duration(&mut self) -> Result<Duration> {
        Ok(Duration::from_nanos(self.u64()?))
    }
    fn bytes(&mut self) -> Result<&'a [u8]> {
        self.0.bytes().map_err(spec_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_or_foreign_spec_is_a_named_error() {
        let mut e = Enc::new();
        e.u32(2);
        let good = e.finish();
        let mut d = Dec::new(&good);
        d.magic().unwrap();
        assert_eq!(d.u32().unwrap(), 2);
        assert!(d.u32().unwrap_err().message().contains("start spec"));
        assert!(Dec::new(b"NOTSPEC!\x01\0\0\0").magic().unwrap_err().message().contains("magic"));
        let mut future = MAGIC.to_vec();
        future.extend_from_slice(&9u32.to_le_bytes());
        assert!(Dec::new(&future).magic().unwrap_err().message().contains("version 9"));
        let mut long = Enc::new();
        long.u32(MAX_LIST + 1);
        let long = long.finish();
        let mut d = Dec::new(&long);
        d.magic().unwrap();
        assert!(d.count().unwrap_err().message().contains("entries"));
    }

    #[test]
    fn a_worker_round_trips_through_a_spec() {
        fn noop(_: &crate::data::host_args::HostArgs<'_>) -> crate::callable::host::HostResult {
            Ok(())
        }
        let mut w = Worker::builder()
            .sub_workers(3)
            .task_window(64)
            .close_timeout(Duration::from_millis(1500))
            .chip_heap_ring_size(0)
            .bind_sub_workers(true)
            .build()
            .unwrap();
        w.register(HostFn::new("noop", noop)).unwrap();
        w.register(HostFn::new("noop", noop)).unwrap();
        let mut e = Enc::new();
        worker_spec(&mut e, &w, 0, "worker 0").unwrap();
        let bytes = e.finish();
        let mut d = Dec::new(&bytes);
        d.magic().unwrap();
        let back = read_worker(&mut d, 0).unwrap();
        assert_eq!(back.cfg.engine.sub_workers, 3);
        assert_eq!(back.cfg.engine.task_window, 64);
        assert_eq!(back.cfg.close_timeout, Duration::from_millis(1500));
        assert_eq!(back.cfg.chip_heap_ring_size, Some(0), "a heap size the user gave, even 0");
        assert!(back.cfg.bind_sub_workers && !back.cfg.replace_dead, "each flag in its own place");
        let (digest, _, _) = w.callables.host().iter().next().unwrap();
        assert_eq!(back.callables.host().refs(digest), 2);
        // Every prefix of the spec is refused with an error, never a panic.
        for cut in 0..bytes.len() {
            let mut d = Dec::new(&bytes[..cut]);
            assert!(d.magic().and_then(|()| read_worker(&mut d, 0)).is_err(), "prefix of {cut} bytes");
        }
    }

    /// A nested Worker started by exec is rebuilt with the children its parent gave it: its
    /// nested Workers as lanes (which of them run chip callables), then its remote Workers
    /// with their settings, in the same order and under the same ids.
    #[test]
    fn a_worker_with_nested_and_remote_workers_round_trips_with_its_lanes() {
        use crate::net::transport::NodeAddr;
        use crate::worker::remote::launch::Launch;
        let key = ClusterKey::new([7u8; 32]).unwrap();
        let node = RemoteWorker::new(NodeAddr::loopback(7999), key.clone())
            .connect_timeout(Duration::from_millis(1234))
            .health_timeout(Duration::from_millis(4321));
        let launch = Launch::new(0, 2, NodeAddr::loopback(7998)).unwrap();
        let l4 = Worker::builder()
            .level(Level::Network1)
            .worker(Worker::builder().sub_workers(1).build().unwrap())
            .worker(Worker::builder().chips(1).build().unwrap())
            .remote_worker(node)
            .launched_workers(&launch, key.clone())
            .build()
            .unwrap();
        assert_eq!(l4.lanes.label(2), "remote worker 2 (127.0.0.1:7999)");
        assert_eq!(l4.lanes.label(3), "remote worker 3 (rank 1)");
        let mut e = Enc::new();
        worker_spec(&mut e, &l4, 0, "worker 0").unwrap();
        let bytes = e.finish();
        let mut d = Dec::new(&bytes);
        d.magic().unwrap();
        let back = read_worker(&mut d, 0).unwrap();
        assert_eq!(back.nested_workers(), 2);
        assert!(back.runs_chip_callables(), "chip callables reach worker 1's chip");
        assert_eq!(back.lanes.targets(CallableKind::Chip), vec![1]);
        assert_eq!(back.remote_workers(), 2);
        assert_eq!(back.lanes.label(2), "remote worker 2 (127.0.0.1:7999)");
        assert_eq!(back.lanes.label(3), "remote worker 3 (rank 1)");
        let (a, b) = (&back.remote[0], &back.remote[1]);
        assert_eq!(a.addr.to_string(), "127.0.0.1:7999");
        assert_eq!(a.key.secret(), key.secret());
        assert_eq!(
            (a.connect_timeout, a.health_timeout),
            (Duration::from_millis(1234), Duration::from_millis(4321))
        );
        assert_eq!((a.launch_rank, b.launch_rank), (None, Some(1)));
        assert_eq!(b.addr.to_string(), "127.0.0.1:7998");
        for cut in 0..bytes.len() {
            let mut d = Dec::new(&bytes[..cut]);
            assert!(d.magic().and_then(|()| read_worker(&mut d, 0)).is_err(), "prefix of {cut} bytes");
        }
    }

    #[test]
    fn hostile_bytes_in_a_spec_give_errors_never_panics() {
        fn noop(_: &crate::data::host_args::HostArgs<'_>) -> crate::callable::host::HostResult {
            Ok(())
        }
        let mut l3 = Worker::builder().sub_workers(2).build().unwrap();
        l3.register(HostFn::new("noop", noop)).unwrap();
        let l4 = Worker::builder().level(Level::Network1).worker(l3).build().unwrap();
        let mut e = Enc::new();
        worker_spec(&mut e, &l4, 0, "worker 0").unwrap();
        let good = e.finish();
        // A fixed-seed xorshift: replayable, no dependency.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..2_000 {
            let mut bytes = good.clone();
            for _ in 0..1 + next() % 4 {
                let at = (next() % bytes.len() as u64) as usize;
                bytes[at] = match next() % 3 {
                    0 => next() as u8,
                    1 => 0xff,
                    _ => 0,
                };
            }
            let mut d = Dec::new(&bytes);
            // Either a Worker (a mutation the format cannot tell from a valid spec) or an error.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                d.magic().and_then(|()| read_worker(&mut d, 0)).map(drop)
            }))
            .expect("reading a mutated spec must not panic");
        }
    }
}
