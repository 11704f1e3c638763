use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

fn size(sub_workers: u32, chips: u32) -> Size {
    Size { sub_workers, chips }
}

/// A sized node's Workers of `limits`, made by `make`, counting the Workers asked of it.
fn sized(limits: SessionLimits, make: fn(u32, u32) -> Result<Worker>) -> (Sized, Arc<AtomicUsize>) {
    let made = Arc::new(AtomicUsize::new(0));
    let count = made.clone();
    let sized = Sized::new(
        limits,
        Box::new(move |s, c| {
            count.fetch_add(1, Ordering::Relaxed);
            make(s, c)
        }),
    )
    .unwrap();
    (sized, made)
}

fn plain(sub: u32, chips: u32) -> Result<Worker> {
    Worker::builder().sub_workers(sub as usize).chips(chips as usize).build()
}

#[test]
fn limits_that_contradict_each_other_are_refused() {
    let over = SessionLimits::new(2, 1).per_session(2, 2).check().unwrap_err();
    assert_eq!(over.kind(), ErrorKind::InvalidArgument);
    assert!(over.message().contains("2 SUB workers and 2 chips"), "{over}");
    let default = SessionLimits::new(4, 0).per_session(2, 0).default_size(3, 0).check().unwrap_err();
    assert!(default.message().contains("default size (3 SUB workers and 0 chips)"), "{default}");
    // A default above a later per-session maximum comes down to it.
    assert_eq!(SessionLimits::new(4, 2).per_session(1, 1).unasked(), (1, 1));
    SessionLimits::new(4, 2).per_session(2, 1).default_size(0, 0).check().unwrap();
}

#[crate::test_support::isolated_test(crate = crate)]
fn shares_add_up_to_the_limits_and_come_back_when_a_session_ends() {
    let (node, made) = sized(SessionLimits::new(2, 0).per_session(2, 0).default_size(1, 0), plain);
    let first = node.start(size(0, 0), "n").unwrap();
    assert_eq!(first.size(), size(1, 0), "nothing asked: the default size");
    assert!(first.own() && first.worker().is_ready(), "the node starts the session's Worker");
    let second = node.start(size(1, 0), "n").unwrap();
    let refused = node.start(size(1, 0), "n").err().unwrap();
    assert!(
        refused.starts_with("RESOURCE: the node at n has 2 SUB workers and 0 chips in all and its 2 other sessions hold 2 SUB workers"),
        "{refused}"
    );
    assert_eq!(made.load(Ordering::Relaxed), 2, "no Worker is made for a refused session");
    drop(second);
    let third = node.start(size(1, 0), "n").unwrap();
    drop((first, third));
    let whole = node.start(size(2, 0), "n").unwrap();
    assert_eq!(whole.size(), size(2, 0));
    let too_big = node.start(size(3, 0), "n").err().unwrap();
    assert!(
        too_big.starts_with("LIMIT: ") && too_big.contains("at most 2 SUB workers and 0 chips"),
        "{too_big}"
    );
}

#[crate::test_support::isolated_test(crate = crate)]
fn a_worker_the_node_cannot_serve_a_session_with_is_refused_and_its_share_given_back() {
    fn wrong_size(sub: u32, _: u32) -> Result<Worker> {
        Worker::builder().sub_workers(sub as usize + 1).build()
    }
    fn forks(sub: u32, _: u32) -> Result<Worker> {
        Worker::builder().sub_workers(sub as usize).start_method(StartMethod::Fork).build()
    }
    fn fails(_: u32, _: u32) -> Result<Worker> {
        Err(Error::invalid("no such device"))
    }
    fn panics(_: u32, _: u32) -> Result<Worker> {
        panic!("a node's function that panics")
    }
    for (make, want) in [
        (wrong_size as fn(u32, u32) -> Result<Worker>, "made a Worker of 2 SUB workers and 0 chips"),
        (forks, "starts its children by fork"),
        (fails, "could not make a Worker of 1 SUB worker and 0 chips: no such device"),
        (panics, "could not make a Worker of 1 SUB worker and 0 chips: its function panicked"),
    ] {
        let (node, _) = sized(SessionLimits::new(1, 0), make);
        let why = node.start(size(1, 0), "n").err().unwrap();
        assert!(why.contains(want), "{why}");
        assert_eq!(*sync::lock(&node.held), (Size::default(), 0), "the refused session's share is back");
    }
}

#[crate::test_support::isolated_test(crate = crate)]
fn limits_of_u32_max_never_overflow_what_sessions_hold() {
    let (node, made) = sized(SessionLimits::new(u32::MAX, 0), plain);
    let first = node.start(size(1, 0), "n").unwrap();
    // Together past u32::MAX: refused, not wrapped round (nor a panic under the book's lock).
    let refused = node.start(size(u32::MAX, 0), "n").err().unwrap();
    assert!(refused.starts_with("RESOURCE: "), "{refused}");
    assert_eq!(made.load(Ordering::Relaxed), 1);
    drop(first);
    assert_eq!(*sync::lock(&node.held), (Size::default(), 0));
}

/// Workers the racing test's `make` made and its sessions still hold.
static LIVE: AtomicUsize = AtomicUsize::new(0);

fn counted(sub: u32, chips: u32) -> Result<Worker> {
    let live = LIVE.fetch_add(1, Ordering::SeqCst) + 1;
    assert!(live <= 2, "{live} Workers at once under limits of 2 SUB workers of 1 each");
    plain(sub, chips)
}

/// Eight threads racing for a node whose limits hold two sessions: never more than two
/// Workers exist at once (the share is reserved before `make` runs), each start is served or
/// refused as exhausted, and every share comes back.
#[crate::test_support::isolated_test(crate = crate)]
fn sessions_racing_for_the_limits_never_hold_more_than_they_allow() {
    let (node, made) = sized(SessionLimits::new(2, 0).per_session(1, 0), counted);
    let served = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..3 {
                    match node.start(size(1, 0), "n") {
                        Ok(w) => {
                            served.fetch_add(1, Ordering::SeqCst);
                            // Counted out before its Worker closes and its share comes back.
                            LIVE.fetch_sub(1, Ordering::SeqCst);
                            drop(w);
                        }
                        Err(e) => assert!(e.starts_with("RESOURCE: "), "{e}"),
                    }
                }
            });
        }
    });
    assert!(served.load(Ordering::SeqCst) >= 2, "some sessions were served");
    assert_eq!(
        made.load(Ordering::SeqCst),
        served.load(Ordering::SeqCst),
        "a Worker per served session only"
    );
    let all = node.start(size(1, 0), "n").and_then(|a| node.start(size(1, 0), "n").map(|b| (a, b)));
    assert!(all.is_ok(), "both shares are free again: {:?}", all.err());
}
