//! Cross-process doorbell tests: a `sys::futex::Doorbell` in the mailbox region's shared
//! memory, rung by a forked child (rules D1-D3 of `sys::futex`).

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
