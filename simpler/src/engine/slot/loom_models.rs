//! `loom` models of rules 1-5: the transitions the engine runs, raced under every interleaving
//! (`RUSTFLAGS="--cfg loom" cargo test -p simpler-rt --lib --release loom`).

use loom::sync::atomic::AtomicUsize;

use super::*;
use crate::error::ErrorKind;

fn slot() -> Arc<Slot> {
    Arc::new(Slot::new(Arc::new(RunState::new(0, false)), 0, None, None))
}

fn check(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

fn err() -> Error {
    Error::new(ErrorKind::Poisoned, "a producer failed")
}

/// The submitting thread's attach (step 4) and publication (rule 2) of `consumer` after
/// `producer`; returns what publication did.
fn attach_and_publish(producer: &Arc<Slot>, consumer: &Arc<Slot>) -> Published {
    let (live, failed) = match producer.attach(consumer, true, false) {
        Attached::Gone => (0, None),
        Attached::Linked { waits, failure } => (u32::from(waits), failure),
    };
    consumer.publish(live, SmallVec::new(), failed)
}

/// An allocation's creator (born COMPLETED, the scope's reference its only one) is
/// released by its scope while a submit attaches a task that retains it: either the task
/// retains it, and it is consumed only once the task releases it, or the attach finds it
/// gone. Never retained and consumed at once (its memory reclaimed under the task).
#[test]
fn loom_a_creator_is_retained_or_gone_never_both() {
    check(|| {
        let creator = slot();
        {
            let mut l = creator.lock();
            l.fanout_total = 1;
            l.fanout_released = 1;
        }
        creator.set_state(State::Completed);
        let task = slot();
        let c2 = creator.clone();
        let scope = loom::thread::spawn(move || c2.release() && c2.claim_consumption());
        let retained = matches!(creator.attach(&task, false, true), Attached::Linked { .. });
        let consumed_by_scope = scope.join().unwrap();
        assert!(
            retained != consumed_by_scope,
            "retained {retained}, consumed by its scope {consumed_by_scope}"
        );
        if retained {
            assert_eq!(creator.state(), State::Completed, "a retained creator is not consumed");
            assert!(creator.release() && creator.claim_consumption(), "the task's release consumes it");
        }
        assert_eq!(creator.state(), State::Consumed);
    });
}

/// A dispatcher (READY -> RUNNING, then completion) races a failure of the unstarted task
/// (a cancel or a poisoning producer): exactly one of them wins, and the slot ends as the
/// winner left it.
#[test]
fn loom_dispatch_and_fail_have_one_winner() {
    check(|| {
        let s = slot();
        assert!(matches!(s.publish(0, SmallVec::new(), None), Published::Ready));
        let s2 = s.clone();
        let dispatcher = loom::thread::spawn(move || {
            if s2.cas(State::Ready, State::Running) {
                s2.settle(&Ok(()));
                true
            } else {
                false
            }
        });
        let failed = s.fail_unstarted(err()).is_some();
        let ran = dispatcher.join().unwrap();
        assert!(ran != failed, "ran {ran}, failed {failed}");
        let l = s.lock();
        assert_eq!(s.state(), if ran { State::Completed } else { State::Failed });
        assert_eq!(l.failure.is_some(), failed);
    });
}

/// Completion's own release, the scope's and a retaining consumer's race: the slot is
/// consumed exactly once, and only after the last of them.
#[test]
fn loom_consumed_once_after_the_last_release() {
    check(|| {
        let s = slot();
        s.lock().fanout_total += 1; // a consumer retains it
        assert!(matches!(s.publish(0, SmallVec::new(), None), Published::Ready));
        assert!(s.cas(State::Ready, State::Running));
        let claims = loom::sync::Arc::new(AtomicUsize::new(0));
        let release = |s: &Slot, claims: &AtomicUsize| {
            if s.release() && s.claim_consumption() {
                claims.fetch_add(1, Ordering::Relaxed);
            }
        };
        let (s2, c2) = (s.clone(), claims.clone());
        let completer = loom::thread::spawn(move || {
            s2.settle(&Ok(()));
            release(&s2, &c2);
        });
        let (s3, c3) = (s.clone(), claims.clone());
        let consumer = loom::thread::spawn(move || release(&s3, &c3));
        release(&s, &claims); // the scope's reference
        completer.join().unwrap();
        consumer.join().unwrap();
        assert_eq!(claims.load(Ordering::Relaxed), 1);
        assert_eq!(s.state(), State::Consumed);
        assert_eq!(s.lock().fanout_released, 3);
    });
}

/// A producer completes while its consumer is attached and published (rule 2): the
/// consumer becomes READY exactly once, by whichever side saw the last fanin.
#[test]
fn loom_publication_and_completion_ready_once() {
    check(|| {
        let (p, c) = (slot(), slot());
        assert!(matches!(p.publish(0, SmallVec::new(), None), Published::Ready));
        assert!(p.cas(State::Ready, State::Running));
        let readied = loom::sync::Arc::new(AtomicUsize::new(0));
        let (p2, r2) = (p.clone(), readied.clone());
        let producer = loom::thread::spawn(move || {
            let (fanout, _) = p2.settle(&Ok(()));
            for consumer in fanout {
                if consumer.release_fanin() {
                    r2.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        match attach_and_publish(&p, &c) {
            Published::Ready => {
                readied.fetch_add(1, Ordering::Relaxed);
            }
            Published::Pending => {}
            Published::Failed(e) => panic!("nothing failed: {e}"),
        }
        producer.join().unwrap();
        assert_eq!(readied.load(Ordering::Relaxed), 1);
        assert_eq!(c.state(), State::Ready);
    });
}

/// A producer fails while its consumer is attached and published (rule 3): the consumer
/// is failed exactly once (poisoned while BUILDING and failed at publication, or failed by
/// the producer), and never becomes READY.
#[test]
fn loom_publication_and_failure_fail_once() {
    check(|| {
        let (p, c) = (slot(), slot());
        assert!(matches!(p.publish(0, SmallVec::new(), None), Published::Ready));
        assert!(p.cas(State::Ready, State::Running));
        let failed = loom::sync::Arc::new(AtomicUsize::new(0));
        let (p2, f2) = (p.clone(), failed.clone());
        let producer = loom::thread::spawn(move || {
            let cause = err();
            let (fanout, _) = p2.settle(&Err(cause.clone()));
            for victim in fanout {
                if !victim.mark_poisoned(&cause) && victim.fail_unstarted(cause.clone()).is_some() {
                    f2.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        match attach_and_publish(&p, &c) {
            Published::Failed(e) => {
                assert!(c.fail_unstarted(e).is_some());
                failed.fetch_add(1, Ordering::Relaxed);
            }
            Published::Pending => {}
            Published::Ready => panic!("a consumer of a failed producer became READY"),
        }
        producer.join().unwrap();
        assert_eq!(failed.load(Ordering::Relaxed), 1);
        assert_eq!(c.state(), State::Failed);
    });
}

/// Rule 5: the scheduler chains a PENDING consumer behind its one unfinished producer while
/// that producer completes (releasing the fanin) and a cancel tries to fail the consumer.
/// Either the consumer was chained first (then the release only counts, the cancel leaves it,
/// and its lane launches it) or it went READY (queued once, and the chain attempt fails) or
/// failed unstarted; never queued and chained both, nor failed while chained.
#[test]
fn loom_chaining_races_the_last_release_and_a_cancel() {
    check(|| {
        let c = slot();
        {
            let mut l = c.lock();
            l.fanin_count = 1;
        }
        assert!(matches!(c.publish(1, SmallVec::new(), None), Published::Pending));
        let (c2, c3) = (c.clone(), c.clone());
        let producer = loom::thread::spawn(move || c2.release_fanin());
        let canceller = loom::thread::spawn(move || c3.fail_unstarted(err()).is_some());
        let chained = c.chain_behind(1);
        let queued = producer.join().unwrap();
        let failed = canceller.join().unwrap();
        assert!(!(chained && queued), "chained and queued");
        assert!(!(chained && failed), "failed while chained");
        assert!(
            !(queued && failed) || c.state() == State::Failed,
            "queued, then failed unstarted: it stays failed"
        );
        if chained {
            assert!(c.launch_chained(), "the release came: its lane launches it");
            assert_eq!(c.state(), State::Running);
        }
    });
}

/// Rule 5 with two producers: the scheduler chains a PENDING consumer behind one of its two
/// unfinished producers (after the other) while both complete. It is chained only while both
/// fanins are unreleased, so it is never also queued; once both released it, its lane
/// launches it, and it waits for none.
#[test]
fn loom_chaining_behind_two_races_both_releases() {
    check(|| {
        let c = slot();
        {
            let mut l = c.lock();
            l.fanin_count = 2;
        }
        assert!(matches!(c.publish(2, SmallVec::new(), None), Published::Pending));
        let (c2, c3) = (c.clone(), c.clone());
        let first = loom::thread::spawn(move || c2.release_fanin());
        let second = loom::thread::spawn(move || c3.release_fanin());
        let chained = c.chain_behind(2);
        let queued = u32::from(first.join().unwrap()) + u32::from(second.join().unwrap());
        assert_eq!(c.unreleased(), 0);
        if chained {
            assert_eq!(queued, 0, "chained and queued");
            assert!(c.launch_chained(), "both releases came: its lane launches it");
            assert_eq!(c.state(), State::Running);
        } else {
            assert_eq!(queued, 1, "not chained: queued once, by the last release");
        }
    });
}
