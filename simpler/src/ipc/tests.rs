//! Cross-process doorbell tests: a `sys::futex::Doorbell` in the mailbox region's shared
//! memory, rung by a forked child (rules D1-D3 of `sys::futex`); and the child loop's refusal
//! of a task without a lease.

use std::thread;
use std::time::{Duration, Instant};

use crate::ipc::mailbox::MailboxRegion;
use crate::sys::test_fork::fork_child;

const LONG: Duration = Duration::from_secs(10);

#[crate::test_support::isolated_test(crate = crate)] // rule T1
fn cross_process_ring_wakes_waiting_parent() {
    // A region with no mailboxes is just the parent doorbell, in MAP_SHARED memory.
    let region = MailboxRegion::new(0).unwrap();
    let bell = region.doorbell();
    let seen = bell.seq();
    let mut child = fork_child(|| {
        thread::sleep(Duration::from_millis(50));
        bell.ring();
        0
    });
    let start = Instant::now();
    let now = bell.wait(seen, Some(start + LONG));
    assert_eq!(now, seen + 1);
    assert!(start.elapsed() < LONG / 2, "woken by the child's ring");
    assert_eq!(child.wait_timeout(LONG), 0);
}

#[crate::test_support::isolated_test(crate = crate)] // rule T1
fn cross_process_futex_wakes_sleeping_parent() {
    // A region with no mailboxes is just the parent doorbell, in MAP_SHARED memory.
    let region = MailboxRegion::new(0).unwrap();
    let bell = region.doorbell();
    let seen = bell.seq();
    let mut child = fork_child(|| {
        // Ring only once the parent is registered as a sleeper, so the futex path is taken.
        let give_up = Instant::now() + LONG;
        while bell.sleepers() == 0 && Instant::now() < give_up {
            thread::sleep(Duration::from_millis(1));
        }
        thread::sleep(Duration::from_millis(20));
        bell.ring();
        0
    });
    let start = Instant::now();
    let now = bell.sleep(seen, Some(start + LONG));
    assert_eq!(now, seen + 1);
    assert!(start.elapsed() < LONG / 2, "woken by the child's futex wake");
    assert_eq!(child.wait_timeout(LONG), 0);
}

/// A SUB or nested child's loop ([`crate::ipc::child::serve`]) refuses a task frame carrying
/// the invalid lease (generation 0, rule L1 of `engine::lease`) without running it, and runs
/// one carrying a minted lease. The loop runs on a thread of this process over the same
/// region a child would map.
#[test]
fn the_child_loop_refuses_a_task_carrying_the_invalid_lease() {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::ipc::child::{Serve, serve};
    use crate::ipc::mailbox::{ControlRequest, FrameError, Posting, TaskRequest};

    struct Counting<'a>(&'a AtomicUsize);
    impl Serve for Counting<'_> {
        fn control(&mut self, _: ControlRequest) -> Result<u64, FrameError> {
            Ok(0)
        }
        fn task(&mut self, _: &TaskRequest<'_>) -> Result<(), FrameError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    let region = MailboxRegion::new(1).unwrap();
    let mb = region.mailbox(0);
    let ran = AtomicUsize::new(0);
    let post_and_wait = |lease: (u32, u64)| {
        let posting = Posting { lease, ..Posting::default() };
        mb.post_task_at(0, &[1; 32], &posting, |_, _| Ok(0)).unwrap();
        let deadline = Instant::now() + LONG;
        loop {
            let seen = region.doorbell().seq();
            if let Some(result) = mb.take_task_result_at(0) {
                return result;
            }
            assert!(Instant::now() < deadline, "no answer from the child loop");
            region.doorbell().wait(seen, Some(deadline));
        }
    };
    /// Stops the loop however the test ends (a failed assertion included), so the scope's
    /// join never waits on it.
    struct Shutdown<'a>(crate::ipc::mailbox::Mailbox<'a>);
    impl Drop for Shutdown<'_> {
        fn drop(&mut self) {
            self.0.request_shutdown();
        }
    }
    thread::scope(|s| {
        let _stop = Shutdown(mb);
        let child = s.spawn(|| serve(&region, 0, &mut Counting(&ran)));
        let refused = post_and_wait((0, 0)).expect_err("a task without a lease ran");
        assert!(
            refused.message.contains("invalid lease") && refused.message.contains("generation 0"),
            "{}",
            refused.message
        );
        assert_eq!(ran.load(Ordering::SeqCst), 0, "the refused task ran");
        post_and_wait((0, 1)).unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        mb.request_shutdown();
        assert_eq!(child.join().unwrap(), 0);
    });
}
