//! `loom` models of a task frame's state word (rules M3, M4, M11) and the shutdown word, on a
//! plain struct of facade atomics driven by the state word's own steps (`state.rs`: the same
//! [`StateWord`] and [`Handover`](super::state::Handover) the mailbox uses, over the facade's
//! atomic) (`RUSTFLAGS="--cfg loom" cargo test -p simpler-rt --lib --release loom`). The frame's
//! fields are a `loom` cell, so an access outside its owner's claim is reported as a race.

#![expect(unsafe_code, reason = "the models' frame fields are loom cells; rules M2-M4")]

use std::sync::atomic::Ordering;

use loom::cell::UnsafeCell;
use loom::sync::Arc;

use super::state::{Activation, StateWord};
use super::{BUSY, FRAME_STAGED, IDLE, TASK_DONE, TASK_READY};
use crate::sys::sync::checked::AtomicU32 as Word;

struct ModelFrame {
    state: StateWord<Word>,
    shutdown: Word,
    /// The frame's fields: the request, then the reply.
    fields: UnsafeCell<u64>,
}

impl ModelFrame {
    fn new(state: u32) -> Arc<ModelFrame> {
        Arc::new(ModelFrame {
            state: StateWord::over(Word::new(state)),
            shutdown: Word::new(0),
            fields: UnsafeCell::new(0),
        })
    }
}

fn check(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(2);
    builder.check(f);
}

/// The child loop: takes the task (`TASK_READY` -> `BUSY`), replies (`TASK_DONE`), and
/// leaves once it sees shutdown; returns how many tasks it ran.
fn child(f: &ModelFrame) -> u32 {
    let mut ran = 0;
    loop {
        if f.state.take_task() {
            // SAFETY: rule M3 — the claim won, so the child owns the fields until its reply.
            f.fields.with_mut(|v| unsafe { *v = *v * 10 + 1 });
            f.state.reply_task();
            ran += 1;
        } else if f.shutdown.load(Ordering::Acquire) != 0 {
            return ran;
        }
        loom::thread::yield_now();
    }
}

/// Parent posts a task, collects it, then requests shutdown, while the child loop runs: the
/// child runs it exactly once, the parent reads the child's reply (hand-over, M4), the
/// child leaves, and the frame ends `IDLE`.
#[test]
fn loom_post_take_and_shutdown() {
    check(|| {
        let f = ModelFrame::new(IDLE);
        let f2 = f.clone();
        let c = loom::thread::spawn(move || child(&f2));
        let post = f.state.claim_to_post().ok().expect("the frame is IDLE");
        // SAFETY: rule M3 — the parent claimed the IDLE frame; it owns it until `post` hands it
        // over.
        f.fields.with_mut(|v| unsafe { *v = 4 });
        post.post_task();
        let back = loop {
            if let Some(back) = f.state.collect_task() {
                break back;
            }
            loom::thread::yield_now();
        };
        // SAFETY: rules M3, M4 — claimed from TASK_DONE; the Acquire claim sees the reply.
        let reply = f.fields.with(|v| unsafe { *v });
        drop(back);
        f.shutdown.store(1, Ordering::Release);
        assert_eq!(reply, 41);
        assert_eq!(c.join().unwrap(), 1);
        assert_eq!(f.state.get(), IDLE);
    });
}

/// One party's claim of a frame handed over as `from` (a finished task to collect, or a posted
/// one to take): touches the fields, then gives the frame on.
fn take(f: &ModelFrame, from: u32) -> bool {
    if from == TASK_DONE {
        let Some(_back) = f.state.collect_task() else { return false };
        // SAFETY: rule M3 — this claim won, so this party owns the fields until `_back` drops.
        f.fields.with_mut(|v| unsafe { *v += 1 });
    } else {
        if !f.state.take_task() {
            return false;
        }
        // SAFETY: rule M3 — this claim won, so this party owns the fields until its reply.
        f.fields.with_mut(|v| unsafe { *v += 1 });
        f.state.reply_task();
    }
    true
}

/// Two parties race to collect one `TASK_DONE` (and two to take one `TASK_READY`): exactly
/// one claim wins each, and the loser touches no field.
#[test]
fn loom_no_double_claim() {
    for from in [TASK_DONE, TASK_READY] {
        check(move || {
            let f = ModelFrame::new(from);
            let f2 = f.clone();
            let other = loom::thread::spawn(move || take(&f2, from));
            let mine = take(&f, from);
            let theirs = other.join().unwrap();
            assert!(mine != theirs, "one claim wins");
            // SAFETY: both parties are joined; nobody else holds the frame.
            assert_eq!(f.fields.with(|v| unsafe { *v }), 1);
        });
    }
}

/// A staged task the child holds prepared (`FRAME_STAGED`, M11): the parent activates or
/// withdraws it while the child waits for its word, or gives the task up on its own (a
/// failed prepare) and answers at once. Whatever the interleaving, the child answers exactly
/// once, the parent collects that answer (the fields stay the child's until then), a word the
/// parent moved is never lost (a child that waits sees it), and a move that failed found the
/// frame already taken back (`BUSY`) or answered (`TASK_DONE`).
#[test]
fn loom_staged_activation_or_withdrawal() {
    for activate in [true, false] {
        for gives_up in [false, true] {
            check(move || {
                let f = ModelFrame::new(FRAME_STAGED);
                let f2 = f.clone();
                let c = loom::thread::spawn(move || {
                    let seen = loop {
                        match f2.state.take_activation() {
                            Activation::Waiting if gives_up => break Activation::Waiting,
                            Activation::Waiting => loom::thread::yield_now(),
                            other => break other,
                        }
                    };
                    f2.state.reclaim_to_reply();
                    // SAFETY: rules M2, M11 — a staged frame's fields are the child's until it
                    // answers TASK_DONE.
                    f2.fields.with_mut(|v| unsafe { *v += 7 });
                    f2.state.reply_task();
                    seen
                });
                let moved = if activate { f.state.activate() } else { f.state.ask_withdraw() };
                let back = loop {
                    if let Some(back) = f.state.collect_task() {
                        break back;
                    }
                    loom::thread::yield_now();
                };
                // SAFETY: rules M3, M4 — claimed from TASK_DONE; the Acquire claim sees the reply.
                assert_eq!(f.fields.with(|v| unsafe { *v }), 7, "one answer");
                drop(back);
                let seen = c.join().unwrap();
                let word = if activate { Activation::Activate } else { Activation::Withdraw };
                match moved {
                    Ok(()) => assert!(seen == word || (gives_up && seen == Activation::Waiting)),
                    Err(found) => {
                        assert!(
                            gives_up && seen == Activation::Waiting,
                            "only a child that gave up moves first"
                        );
                        assert!(found == BUSY || found == TASK_DONE, "found {found}");
                    }
                }
                assert_eq!(f.state.get(), IDLE);
            });
        }
    }
}
