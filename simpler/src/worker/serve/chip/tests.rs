//! The chip child's server and loop over in-process mailboxes (no process is started): lease
//! marks across a replacement, the refusal of a task without a lease, and the staged task's
//! launch fence.

use super::*;
use crate::chip::{BackendFactory, ChipSpec};
use crate::data::host_args::HostArgs;
use crate::ipc::mailbox::Posting;

fn noop(_: &HostArgs<'_>) -> crate::callable::host::HostResult {
    Ok(())
}

fn server(k: &ChipFn) -> ChipServer {
    server_of(&[k])
}

fn server_of(kernels: &[&ChipFn]) -> ChipServer {
    let mut reg = Registry::new(4);
    for k in kernels {
        reg.install(k.handle().digest(), k.descriptor().bytes(), (*k).clone()).unwrap();
    }
    let config = ChipConfig {
        spec: ChipSpec { chip_id: 0, memory_bytes: 1 << 20, cores: 1 },
        backend: BackendFactory::sim(),
    };
    let mut runtime = ChipRuntime::new(config, reg).unwrap();
    runtime.grant_pipeline_depth(2).unwrap();
    ChipServer { chip: 0, runtime, resolver: HostResolver::new(Vec::new()) }
}

/// Posts `k` with no arguments under `lease` into task frame 0 and has `server` take it.
fn run(
    server: &mut ChipServer,
    mb: crate::ipc::mailbox::Mailbox<'_>,
    k: &ChipFn,
    lease: (u32, u64),
) -> Result<(), FrameError> {
    let posting = Posting { lease, ..Posting::default() };
    mb.post_task_at(0, k.handle().digest().as_bytes(), &posting, |_, payload| {
        crate::data::wire::encode_args(std::iter::empty(), &[], payload)
    })
    .unwrap();
    let req = mb.task_request_at(0, false).unwrap();
    let result = server.begin(&req, true).and_then(|run| server.end(&req, run));
    mb.finish_task(req, result.clone(), &crate::sys::futex::Doorbell::new());
    mb.take_task_result_at(0).unwrap()?;
    result
}

#[test]
fn a_chip_that_replaces_a_dead_one_refuses_leases_older_than_its_predecessors() {
    let k = ChipFn::kernel("noop", noop);
    let region = MailboxRegion::new(1).unwrap();
    let mb = region.mailbox(0);
    let mut first = server(&k);
    first.inherit_marks(mb);
    run(&mut first, mb, &k, (0, 5)).unwrap();
    let err = run(&mut first, mb, &k, (0, 3)).unwrap_err();
    assert!(err.message.contains("stale") && err.message.contains("generation 5"), "{err}");
    run(&mut first, mb, &k, (0, 7)).unwrap();
    // The chip dies; its replacement starts on the same mailbox.
    drop(first);
    mb.reset_for_new_child();
    let mut second = server(&k);
    second.inherit_marks(mb);
    let err = run(&mut second, mb, &k, (0, 6)).unwrap_err();
    assert!(err.message.contains("stale") && err.message.contains("generation 7"), "{err}");
    run(&mut second, mb, &k, (0, 8)).unwrap();
    run(&mut second, mb, &k, (1, 1)).unwrap();
}

static RAN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn counted(_: &HostArgs<'_>) -> crate::callable::host::HostResult {
    RAN.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(())
}

#[test]
fn a_chip_refuses_a_task_carrying_the_invalid_lease_and_runs_nothing() {
    let k = ChipFn::kernel("counted", counted);
    let region = MailboxRegion::new(1).unwrap();
    let mb = region.mailbox(0);
    let mut chip = server(&k);
    for slot in [0, 1] {
        let err = run(&mut chip, mb, &k, (slot, 0)).unwrap_err();
        assert!(err.message.contains("chip 0") && err.message.contains("invalid lease"), "{}", err.message);
    }
    assert_eq!(RAN.load(std::sync::atomic::Ordering::SeqCst), 0, "a task without a lease ran");
    run(&mut chip, mb, &k, (0, 1)).unwrap();
    assert_eq!(RAN.load(std::sync::atomic::Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------------------- the launch fence

/// The gate the `held` kernel waits at (opened by the test, or by its guard when it fails).
static GATE: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
static GATE_CV: std::sync::Condvar = std::sync::Condvar::new();
static STAGED_RAN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
const LONG: std::time::Duration = std::time::Duration::from_secs(10);

fn set_gate(open: bool) {
    *crate::sys::sync::lock(&GATE) = open;
    GATE_CV.notify_all();
}

fn held(_: &HostArgs<'_>) -> crate::callable::host::HostResult {
    let g = crate::sys::sync::lock(&GATE);
    let (_g, timed_out) = crate::sys::sync::wait_timeout_while(&GATE_CV, g, LONG, |open| !*open);
    if timed_out { Err("the gate never opened".into()) } else { Ok(()) }
}

fn staged_kernel(_: &HostArgs<'_>) -> crate::callable::host::HostResult {
    STAGED_RAN.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(())
}

/// Why the acceptance word need not be a launch fence (rule M12): a staged task launches only
/// from `ACTIVATE`, which the parent sets by compare-exchange from `FRAME_STAGED`, and a
/// withdraw is the other compare-exchange from that state (or, while the child prepares it,
/// the sticky word the child reads before it publishes `FRAME_STAGED`). So a withdraw that
/// raced with a launch is resolved on the parent's side at once: won, the task ends unlaunched
/// (its acceptance word never set); lost (`Late`, activated first), the task is the running
/// one and its end comes as any task's. Driven through the chip child's real loop.
#[test]
fn a_staged_task_launches_only_through_activation_and_a_withdraw_resolves_the_race() {
    use crate::ipc::mailbox::{BUSY, FLAG_OVERLAP, TASK_DONE, WITHDRAW, Withdrawn};
    use std::sync::atomic::Ordering;

    let (hold, next) = (ChipFn::kernel("held", held), ChipFn::kernel("staged", staged_kernel));
    let region = Arc::new(MailboxRegion::new(1).unwrap());
    let mb = region.mailbox(0);
    let parent = region.doorbell();
    let post = |ix: usize, k: &ChipFn, lease: (u32, u64), stage: bool| {
        let posting = Posting { lease, flags: FLAG_OVERLAP, stage, ..Posting::default() };
        mb.post_task_at(ix, k.handle().digest().as_bytes(), &posting, |_, payload| {
            crate::data::wire::encode_args(std::iter::empty(), &[], payload)
        })
        .unwrap();
    };
    let until = |what: &str, f: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + LONG;
        loop {
            let seen = parent.seq();
            if f() {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
            parent.wait(seen, Some(deadline));
        }
    };
    let result = |ix: usize| {
        let got = std::cell::Cell::new(None);
        until(&format!("frame {ix}'s answer"), &|| {
            mb.take_task_result_at(ix).map(|r| got.set(Some(r))).is_some()
        });
        got.take().unwrap()
    };
    /// Opens the gate and stops the loop however the test ends.
    struct Stop<'a>(crate::ipc::mailbox::Mailbox<'a>);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            set_gate(true);
            self.0.request_shutdown();
        }
    }
    set_gate(false);
    let mut chip = server_of(&[&hold, &next]);
    std::thread::scope(|s| {
        let _stop = Stop(mb);
        let child = s.spawn(|| serve_chip(&region, 0, &mut chip));
        // The withdraw wins: the prepared task is withdrawn, can no longer be activated, and
        // ends unlaunched.
        post(0, &hold, (0, 1), false);
        post(1, &next, (1, 1), true);
        until("the staged task to be prepared", &|| mb.prepared_at(1).is_some());
        assert_eq!(mb.withdraw(1), Withdrawn::Asked);
        // Refused whatever the child did with the withdraw meanwhile: still asked (WITHDRAW),
        // being answered (BUSY), or answered (TASK_DONE).
        let refused = mb.activate(1);
        assert!(
            matches!(refused, Err(WITHDRAW | BUSY | TASK_DONE)),
            "a withdrawn task was activated: {refused:?}"
        );
        let err = result(1).unwrap_err();
        assert!(err.message.contains("withdrawn before it launched"), "{}", err.message);
        assert!(!mb.accepted(1), "a withdrawn task was accepted");
        set_gate(true);
        assert_eq!(result(0), Ok(()));
        assert!(mb.accepted(0));
        assert_eq!(STAGED_RAN.load(Ordering::SeqCst), 0, "the withdrawn task ran");
        // The activation wins: a withdraw after it is refused, and the task runs to its end.
        set_gate(false);
        post(0, &hold, (0, 2), false);
        post(1, &next, (1, 2), true);
        until("the staged task to be prepared", &|| mb.prepared_at(1).is_some());
        set_gate(true);
        assert_eq!(result(0), Ok(()));
        mb.activate(1).unwrap();
        assert_eq!(mb.withdraw(1), Withdrawn::Late, "an activated task was withdrawn");
        assert_eq!(result(1), Ok(()));
        assert!(mb.accepted(1));
        assert_eq!(STAGED_RAN.load(Ordering::SeqCst), 1);
        mb.request_shutdown();
        assert_eq!(child.join().unwrap(), 0);
    });
}
