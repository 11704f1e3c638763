//! Engine unit tests with in-process endpoints (no processes are started): the rig here, the
//! tests by topic beside it (`dispatch`, `tensor_map`, `failures`, `staging`, `chaining`,
//! `runs`, `panics`, `heap`).
//!
//! Two kinds of lanes:
//!
//! * [`ManualEndpoint`]: a task ends only when the test calls [`ManualControl::finish`]; every
//!   dispatch happens inside a scheduler pass on the test's own thread, so what has (not) been
//!   dispatched is exact at every point.
//! * [`ThreadEndpoint`] driven by a [`Script`]: tasks really run on their own threads, can be held
//!   at a gate, can meet at a rendezvous (proving concurrency) and record start/end events.
//!
//! Every lane is wrapped in a [`Faulty`] endpoint whose [`FaultPlan`] makes `start` or `poll`
//! panic for chosen tasks, and `Engine::faults` injects panics while completing a task or in a
//! pass: the panic tests (rule 5 of the scheduler role) use both.
//!
//! Every task carries its test id as its first scalar. Nothing sleeps in place of a condition:
//! tests wait on condvars, doorbells or `drive_until` with a generous deadline.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use crate::callable::identity::{CallableHandle, CallableKind, Digest};
use crate::data::buffer::IdentityMinter;
use crate::data::buffer::{Access, Backing, BufferDesc, Identity};
use crate::data::call_config::CallConfig;
use crate::data::dtype::DataType;
use crate::data::task_args::{Tag, TaskArgs, TaskHandle};
use crate::data::tensor::{Tensor, TensorView};
use crate::dfx::graph::{EdgeReason, RunDag};
use crate::engine::endpoint::Outcome;
use crate::engine::endpoint::testing::{
    Behaviour, FaultPlan, Faulty, Logged, ManualControl, ManualEndpoint, StartLog, Started, ThreadEndpoint,
    Wait,
};
use crate::engine::heap::HostRings;
use crate::engine::orchestrator::Orchestrator;
use crate::engine::ring::HEAP_RINGS;
use crate::engine::run::{RunHandle, RunState};
use crate::engine::scheduler::{Lane, LaneKind};
use crate::engine::slot::{Slot, State, Target, TaskData};
use crate::engine::{Bell, Engine, EngineConfig};
use crate::engine::{LevelParts, NoDevices};
use crate::error::{Error, ErrorKind, Result};
use crate::sys::futex::Doorbell;
use crate::sys::sync;

mod chaining;
mod dispatch;
mod failures;
mod heap;
mod panics;
mod runs;
mod staging;
mod tensor_map;

/// How long any positive condition may take before the test fails.
const LONG: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------- the rig

struct BellRef(Arc<Doorbell>);

impl AsRef<Doorbell> for BellRef {
    fn as_ref(&self) -> &Doorbell {
        &self.0
    }
}

fn cfg(next_level: usize, sub: usize) -> EngineConfig {
    EngineConfig {
        next_level_workers: next_level,
        sub_workers: sub,
        next_level_kind: CallableKind::Chip,
        heap_ring_size: 1 << 16,
        task_window: 64,
        backpressure_timeout: Duration::from_secs(5),
        ..EngineConfig::default()
    }
}

/// An engine with its lanes, a chip callable for NEXT_LEVEL and a host callable for SUB.
struct Rig {
    eng: Arc<Engine>,
    /// The engine's heap rings.
    rings: Arc<HostRings>,
    chip: CallableHandle,
    host: CallableHandle,
    /// Every dispatch, in the order the scheduler made it.
    log: StartLog,
    nl: Vec<ManualControl>,
    sub: Vec<ManualControl>,
    /// Tasks whose endpoint panics in `start` or `poll` (every lane's).
    faults: Arc<FaultPlan>,
}

impl Rig {
    fn build(cfg: EngineConfig, lane: impl Fn(LaneKind, &Arc<Doorbell>) -> Box<dyn LaneEp>) -> Rig {
        let bell = Arc::new(Doorbell::new());
        let (n, m) = (cfg.next_level_workers, cfg.sub_workers);
        let rings = Arc::new(HostRings::new(cfg.heap_ring_size).unwrap());
        let bell_ref = Bell::Shared(Arc::new(BellRef(bell.clone())));
        let parts = LevelParts {
            minter: Arc::new(IdentityMinter::new(0xa110c)),
            heap: rings.clone(),
            devices: Arc::new(NoDevices),
        };
        let eng = Engine::new(cfg, bell_ref, parts).unwrap();
        let log: StartLog = Arc::default();
        let faults: Arc<FaultPlan> = Arc::default();
        let kinds = (0..n as u32).map(LaneKind::NextLevel).chain((0..m as u32).map(LaneKind::Sub));
        let (mut nl, mut sub) = (Vec::new(), Vec::new());
        let mut lanes = Vec::new();
        for kind in kinds {
            let ep = lane(kind, &bell);
            if let Some(c) = ep.control() {
                match kind {
                    LaneKind::NextLevel(_) => nl.push(c),
                    LaneKind::Sub(_) => sub.push(c),
                }
            }
            let faulty = Box::new(Faulty::new(faults.clone(), ep.into_endpoint()));
            lanes.push(Lane::named(kind, Box::new(Logged::new(kind, log.clone(), faulty)), kind.to_string()));
        }
        eng.attach_lanes(lanes);
        let chip = CallableHandle::new(Digest::of(b"chip_kernel"), CallableKind::Chip, "chip_kernel");
        let host = CallableHandle::new(Digest::of(b"host_fn"), CallableKind::HostFn, "host_fn");
        {
            let mut reg = eng.callables.write();
            reg.insert(chip.digest(), CallableKind::Chip.into());
            reg.insert(host.digest(), CallableKind::HostFn.into());
        }
        Rig { eng: Arc::new(eng), rings, chip, host, log, nl, sub, faults }
    }

    /// Lanes the test finishes by hand.
    fn manual(cfg: EngineConfig) -> Rig {
        Rig::build(cfg, |kind, bell| {
            let (ep, ctl) = ManualEndpoint::new(kind, bell.clone());
            Box::new((ep, ctl))
        })
    }

    /// Lanes the test finishes by hand, whose NEXT_LEVEL ones take staged tasks (as chips with
    /// two task frames do).
    fn staging(cfg: EngineConfig) -> Rig {
        Rig::build(cfg, |kind, bell| {
            let (ep, ctl) = match kind {
                LaneKind::NextLevel(_) => ManualEndpoint::staging(kind, bell.clone()),
                LaneKind::Sub(_) => ManualEndpoint::new(kind, bell.clone()),
            };
            Box::new((ep, ctl))
        })
    }

    /// Lanes the test finishes by hand, whose SUB ones take chained tasks (as SUB workers'
    /// mailboxes do).
    fn chaining(cfg: EngineConfig) -> Rig {
        Rig::build(cfg, |kind, bell| {
            let (ep, ctl) = match kind {
                LaneKind::NextLevel(_) => ManualEndpoint::new(kind, bell.clone()),
                LaneKind::Sub(_) => ManualEndpoint::chaining(kind, bell.clone()),
            };
            Box::new((ep, ctl))
        })
    }

    /// Lanes that run the script on their own threads.
    fn threaded(cfg: EngineConfig, script: &Arc<Script>) -> Rig {
        Rig::build(cfg, |kind, bell| {
            let s = script.clone();
            let behaviour: Behaviour = Arc::new(move |name, args, member| s.run(kind, name, args, member));
            Box::new(ThreadEndpoint::new(bell.clone(), behaviour))
        })
    }

    fn begin(&self) -> Arc<RunState> {
        self.eng.begin_run(true, None).unwrap()
    }

    fn orch(&self, run: &Arc<RunState>) -> Orchestrator<'_> {
        Orchestrator::new(&self.eng, run.clone())
    }

    /// Drives the scheduler until `cond` holds; fails the test after [`LONG`].
    fn drive(&self, what: &str, cond: impl Fn() -> bool) {
        assert!(self.eng.drive_until(cond, Some(Instant::now() + LONG)), "timed out waiting for {what}");
    }

    /// Drives for a short while and returns whether `cond` became true (for "must not happen").
    fn drive_briefly(&self, cond: impl Fn() -> bool) -> bool {
        self.eng.drive_until(cond, Some(Instant::now() + Duration::from_millis(30)))
    }

    fn wait(&self, run: &Arc<RunState>) -> Result<()> {
        self.drive(&format!("run {} to finish", run.id), || run.is_done());
        run.result()
    }

    fn dag(&self, run: &Arc<RunState>) -> RunDag {
        RunHandle::new(run.clone(), &self.eng).dag().expect("captured")
    }

    /// Dispatches so far (synchronous record made inside the scheduler pass).
    fn dispatched(&self) -> Vec<Started> {
        self.log.lock().unwrap().clone()
    }

    fn was_dispatched(&self, id: u64) -> bool {
        self.log.lock().unwrap().iter().any(|s| s.id() == id)
    }

    fn in_flight(&self) -> usize {
        self.eng.in_flight.load(Ordering::SeqCst)
    }

    /// Slot accounting after the last run: nothing live, nothing mapped, no heap held.
    fn assert_clean(&self) {
        assert_eq!(self.eng.window.live(), 0, "live slots after every run finished");
        assert_eq!(self.eng.tensor_map.len(), 0, "TensorMap entries after every run finished");
        for r in 0..HEAP_RINGS {
            assert_eq!(self.rings.ring(r).used(), 0, "heap ring {r} bytes held after every run finished");
        }
        let leases = self.eng.lease_counts();
        assert_eq!(
            (leases.live, leases.quarantined),
            (0, 0),
            "pipeline leases held after every run finished"
        );
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        // Joining endpoint threads of a failed test could hang on a held gate.
        if !thread::panicking() {
            self.eng.shutdown_lanes();
        }
    }
}

/// A lane endpoint under construction, with its test control when it has one.
trait LaneEp {
    fn control(&self) -> Option<ManualControl>;
    fn into_endpoint(self: Box<Self>) -> Box<dyn crate::engine::endpoint::Endpoint>;
}

impl LaneEp for (ManualEndpoint, ManualControl) {
    fn control(&self) -> Option<ManualControl> {
        Some(self.1.clone())
    }
    fn into_endpoint(self: Box<Self>) -> Box<dyn crate::engine::endpoint::Endpoint> {
        Box::new(self.0)
    }
}

impl LaneEp for ThreadEndpoint {
    fn control(&self) -> Option<ManualControl> {
        None
    }
    fn into_endpoint(self: Box<Self>) -> Box<dyn crate::engine::endpoint::Endpoint> {
        self
    }
}

// ---------------------------------------------------------------------------------- the script

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ev {
    Start(LaneKind, u64, u32),
    End(LaneKind, u64, u32),
}

#[derive(Default)]
struct ScriptState {
    events: Vec<Ev>,
    /// Task ids held at their gate until released.
    held: HashSet<u64>,
    /// Task ids that fail: `None` every member, `Some(m)` only member `m`.
    fail: HashMap<u64, Option<u32>>,
    /// Task ids whose members must all be running at once: (needed, arrived).
    meet: HashMap<u64, (usize, usize)>,
}

/// What threaded lanes do, shared by all of them.
#[derive(Default)]
struct Script {
    st: Mutex<ScriptState>,
    cv: Condvar,
}

impl Script {
    fn new() -> Arc<Script> {
        Arc::new(Script::default())
    }

    fn lock(&self) -> MutexGuard<'_, ScriptState> {
        sync::lock(&self.st)
    }

    fn hold(&self, id: u64) {
        self.lock().held.insert(id);
    }

    fn release(&self, id: u64) {
        self.lock().held.remove(&id);
        self.cv.notify_all();
    }

    fn fail(&self, id: u64, member: Option<u32>) {
        self.lock().fail.insert(id, member);
    }

    fn meet(&self, id: u64, n: usize) {
        self.lock().meet.insert(id, (n, 0));
    }

    fn events(&self) -> Vec<Ev> {
        self.lock().events.clone()
    }

    fn started(&self, id: u64) -> bool {
        self.lock().events.iter().any(|e| matches!(e, Ev::Start(_, i, _) if *i == id))
    }

    fn ended(&self, id: u64) -> bool {
        self.lock().events.iter().any(|e| matches!(e, Ev::End(_, i, _) if *i == id))
    }

    /// Position of the first event matching `f`.
    fn pos(&self, f: impl Fn(&Ev) -> bool) -> usize {
        let ev = self.events();
        ev.iter().position(f).unwrap_or_else(|| panic!("event not found in {ev:?}"))
    }

    /// Blocks (without driving the scheduler) until `f` holds.
    fn wait_for(&self, what: &str, f: impl Fn(&ScriptState) -> bool) {
        let g = self.lock();
        let (_g, timed_out) = sync::wait_timeout_while(&self.cv, g, LONG, |s| !f(s));
        assert!(!timed_out, "timed out waiting for {what}");
    }

    /// The behaviour of every threaded lane.
    fn run(
        &self,
        lane: LaneKind,
        _name: &str,
        args: &TaskArgs,
        member: u32,
    ) -> std::result::Result<(), String> {
        let id = args.scalar_at(0).unwrap_or(0);
        let mut g = self.lock();
        g.events.push(Ev::Start(lane, id, member));
        self.cv.notify_all();
        let mut result = Ok(());
        if let Some(m) = g.meet.get_mut(&id) {
            m.1 += 1;
            self.cv.notify_all();
            let (g2, timed_out) =
                sync::wait_timeout_while(&self.cv, g, LONG, |s| s.meet.get(&id).is_some_and(|m| m.1 < m.0));
            g = g2;
            if timed_out {
                result = Err(format!("task {id}: group members were not running at the same time"));
            }
        }
        let (g2, _) = sync::wait_timeout_while(&self.cv, g, LONG, |s| s.held.contains(&id));
        g = g2;
        if result.is_ok()
            && let Some(m) = g.fail.get(&id)
            && m.is_none_or(|m| m == member)
        {
            result = Err(format!("boom {id}.{member}"));
        }
        g.events.push(Ev::End(lane, id, member));
        self.cv.notify_all();
        result
    }
}

// ---------------------------------------------------------------------------------- data helpers

/// A 64-byte (16 x f32) buffer named by `id`.
fn buffer(id: u64) -> BufferDesc {
    buffer_with(id, Access::ReadWrite)
}

fn buffer_with(id: u64, access: Access) -> BufferDesc {
    BufferDesc::new(
        Identity::new(1, id, 1).unwrap(),
        Backing::HeapSlab { addr: 0x1000 * id, ino: 1 },
        access,
        64,
    )
    .unwrap()
}

/// Elements `[from, from + len)` of a buffer, as f32.
fn view(desc: BufferDesc, from: u64, len: u32) -> Tensor {
    Tensor::from_desc(desc, TensorView::new(from * 4, &[len], None, DataType::Float32).unwrap()).unwrap()
}

fn whole(desc: BufferDesc) -> Tensor {
    view(desc, 0, 16)
}

/// Arguments: tensors with tags, then the task id as the only scalar.
fn args(id: u64, tensors: &[(&Tensor, Tag)]) -> TaskArgs {
    let mut a = TaskArgs::new();
    for (t, tag) in tensors {
        a.push_tensor(t, *tag).unwrap();
    }
    a.scalar(id);
    a
}

fn cc() -> CallConfig {
    CallConfig::default()
}

fn err_of<T: std::fmt::Debug>(r: Result<T>) -> Error {
    r.expect_err("expected an error")
}

fn ids(v: &[Started]) -> Vec<u64> {
    v.iter().map(Started::id).collect()
}

// ---------------------------------------------------------------------------------- shared checks

#[track_caller]
fn assert_mentions(err: &Error, needles: &[&str]) {
    for n in needles {
        assert!(err.message().contains(n), "the error should mention {n:?}: {err:?}");
    }
}

/// Waits, without driving the scheduler, until `run` is done or `deadline` passes (the engine
/// rings `events` when a run finishes).
fn wait_undriven(eng: &Engine, run: &RunState, deadline: Instant) -> bool {
    loop {
        let seen = eng.events.seq();
        if run.is_done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        eng.events.wait(seen, Some(deadline));
    }
}

// ---------------------------------------------------------------------------------- fault injection

/// Where a test injects a panic (against the task with id 1, or the next pass).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inject {
    /// The endpoint's `start` of task 1.
    Start,
    /// The endpoint's `poll` that would report task 1's end.
    Poll,
    /// `Engine::complete` of task 1, once.
    CompleteOnce,
    /// `Engine::complete` of task 1, every time.
    CompleteAlways,
    /// The next scheduler pass, outside endpoints and completion processing.
    Pass,
}

impl Inject {
    const ALL: [Inject; 5] =
        [Inject::Start, Inject::Poll, Inject::CompleteOnce, Inject::CompleteAlways, Inject::Pass];

    /// What the failed run's error must say.
    fn needles(self) -> &'static [&'static str] {
        match self {
            Inject::Start => &["panicked in start", "injected panic in start of task 1", "out of service"],
            Inject::Poll => &["panicked in poll", "injected panic in poll of task 1", "out of service"],
            Inject::CompleteOnce | Inject::CompleteAlways => {
                &["panicked while completing task", "injected panic completing task 1"]
            }
            Inject::Pass => &["panicked during a pass", "injected panic in a pass"],
        }
    }
}

/// The test id of a slot (its first scalar), if it is a task.
fn test_id(slot: &Slot) -> Option<u64> {
    slot.task.as_ref()?.args.first()?.scalar_at(0)
}

/// Arms `what`.
fn inject(rig: &Rig, what: Inject) {
    let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hook: crate::engine::FaultHook = match what {
        Inject::Start => {
            sync::lock(&rig.faults.start).insert(1);
            return;
        }
        Inject::Poll => {
            sync::lock(&rig.faults.poll).insert(1);
            return;
        }
        Inject::CompleteOnce | Inject::CompleteAlways => Box::new(move |phase, slot| {
            if phase == "complete"
                && slot.and_then(test_id) == Some(1)
                && (what == Inject::CompleteAlways || !fired.swap(true, Ordering::SeqCst))
            {
                panic!("injected panic completing task 1");
            }
        }),
        Inject::Pass => Box::new(move |phase, _| {
            if phase == "dispatch" && !fired.swap(true, Ordering::SeqCst) {
                panic!("injected panic in a pass");
            }
        }),
    };
    *sync::write(&rig.eng.faults) = Some(hook);
}
