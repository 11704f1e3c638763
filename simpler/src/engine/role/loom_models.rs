//! `loom` models of the role hand-off (rules 1, 3, 4), through `RoleState`'s methods; the
//! engine's outstanding work and its background doorbell (`bg_bell`) stand in as two counters
//! (`RUSTFLAGS="--cfg loom" cargo test -p simpler-rt --lib --release loom`).

use loom::sync::Arc;
use loom::sync::atomic::AtomicUsize;
use loom::thread;

use super::*;

fn check(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

/// The role, the work and the background doorbell of one engine.
struct Eng {
    role: RoleState,
    sched: Mutex<()>,
    /// Work outstanding (the engine's inbox, in-flight and queued counts).
    work: AtomicUsize,
    /// The background doorbell's sequence number (`Doorbell::seq`, `ring`).
    bg_bell: AtomicU32,
}

impl Eng {
    fn new(work: usize) -> Arc<Eng> {
        let eng = Eng {
            role: RoleState::new(),
            sched: Mutex::new(()),
            work: AtomicUsize::new(work),
            bg_bell: AtomicU32::new(0),
        };
        // `loom` takes an atomic's initial value for a store weaker than `SeqCst`, which
        // would let a `SeqCst` load miss later `SeqCst` stores (a false alarm): store the
        // initial values again, as the engine's long-lived flags have been many times.
        eng.role.held.store(false, Ordering::SeqCst);
        eng.role.wanted.store(0, Ordering::SeqCst);
        eng.work.store(work, Ordering::SeqCst);
        eng.bg_bell.store(0, Ordering::SeqCst);
        Arc::new(eng)
    }

    fn outstanding(&self) -> bool {
        self.work.load(Ordering::SeqCst) > 0
    }

    /// `Engine::wake_background_if_needed`.
    fn wake_background_if_needed(&self) {
        if self.role.needs_background_wake(|| self.outstanding()) {
            self.bg_bell.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A scheduler pass by the holder: finishes one unit of work, if any.
    fn pass(&self) {
        let _ = self.work.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| w.checked_sub(1));
    }

    /// `Role::drop`: release, then rule 4.
    fn release(&self, guard: MutexGuard<'_, ()>) {
        self.role.release(guard);
        self.wake_background_if_needed();
    }

    /// `WaiterIntent::drop`.
    fn withdraw(&self) {
        if self.role.withdraw(|| self.outstanding()) {
            self.bg_bell.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// `Engine::publish_ready` from a thread that does not hold the role: publish, then
    /// check the holder (rule 4); the inline pass is left out.
    fn publish(&self) {
        self.work.fetch_add(1, Ordering::SeqCst);
        if !self.role.held() {
            self.wake_background_if_needed();
        }
        // (Else the holder's doorbell rings; the holder checks the work before it releases.)
    }

    /// `Engine::background_loop_inner` until it goes to sleep on `bg_bell`: returns the
    /// sequence number it sleeps on. Holding the role, it drives while work is outstanding
    /// and nobody wants the role.
    fn background(&self) -> u32 {
        for _ in 0..8 {
            let seen = self.bg_bell.load(Ordering::Acquire);
            if self.role.wanted() == 0
                && self.outstanding()
                && let Some(guard) = self.role.try_take(&self.sched)
            {
                loop {
                    self.pass();
                    if self.role.wanted() > 0 || !self.outstanding() {
                        break;
                    }
                }
                self.release(guard);
                continue;
            }
            // `Doorbell::sleep` returns at once when the bell rang since `seen`.
            if self.bg_bell.load(Ordering::SeqCst) == seen {
                return seen;
            }
        }
        panic!("the background thread never went to sleep");
    }
}

/// After every thread ended: if the background thread went to sleep and its bell did not
/// ring since, no work is left (nobody holds or wants the role any more, so nobody else
/// would drive it).
fn no_lost_wake_up(eng: &Eng, slept_on: u32) {
    assert!(!eng.role.held());
    assert_eq!(eng.role.wanted(), 0);
    if eng.bg_bell.load(Ordering::SeqCst) == slept_on {
        assert!(!eng.outstanding(), "work is left, and the background thread sleeps unwoken");
    }
}

/// Rule 3 and 4: a waiter takes the role from the background holder, or fails to and
/// withdraws, while a third thread publishes more work: whichever way the role goes, work
/// left with nobody holding or wanting the role wakes the background thread.
#[test]
fn loom_role_hand_off_loses_no_wake_up() {
    check(|| {
        let eng = Eng::new(1);
        let e1 = eng.clone();
        let waiter = thread::spawn(move || {
            e1.role.announce();
            if let Some(guard) = e1.role.try_take(&e1.sched) {
                e1.pass();
                e1.release(guard);
            }
            e1.withdraw();
        });
        let e2 = eng.clone();
        let publisher = thread::spawn(move || e2.publish());
        let slept_on = eng.background();
        waiter.join().unwrap();
        publisher.join().unwrap();
        no_lost_wake_up(&eng, slept_on);
    });
}

/// Rule 1: two threads race for the role: at most one holds it at a time, and the flag
/// says so while it is held; each release clears it while still holding the lock, so the
/// flag is never left set (or cleared under a later holder).
#[test]
fn loom_one_holder_at_a_time() {
    check(|| {
        let eng = Eng::new(0);
        let holders = Arc::new(AtomicUsize::new(0));
        let racers: Vec<_> = (0..2)
            .map(|_| {
                let (eng, holders) = (eng.clone(), holders.clone());
                thread::spawn(move || {
                    if let Some(guard) = eng.role.try_take(&eng.sched) {
                        assert_eq!(holders.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                        assert!(eng.role.held(), "the role is held but not flagged");
                        holders.fetch_sub(1, Ordering::SeqCst);
                        assert!(eng.role.held(), "the flag was cleared under its holder");
                        eng.role.release(guard);
                    }
                })
            })
            .collect();
        for r in racers {
            r.join().unwrap();
        }
        assert!(!eng.role.held(), "the flag was left set");
    });
}

/// Rule 4, the wake-up a bare decrement lost: a waiter announces itself, finds its run done
/// and withdraws without driving, while work is published for nobody in particular: the
/// background thread, which stood aside for the waiter, is woken to drive it.
#[test]
fn loom_withdrawal_wakes_the_background() {
    check(|| {
        let eng = Eng::new(0);
        let e1 = eng.clone();
        let waiter = thread::spawn(move || {
            e1.role.announce();
            e1.withdraw();
        });
        let e2 = eng.clone();
        let publisher = thread::spawn(move || e2.publish());
        let slept_on = eng.background();
        waiter.join().unwrap();
        publisher.join().unwrap();
        no_lost_wake_up(&eng, slept_on);
    });
}
