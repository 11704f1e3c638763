#![expect(unsafe_code, reason = "playing a misbehaving peer that writes a claimed frame's fields; rule M3")]

use std::sync::atomic::AtomicBool;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::layout::{MAILBOX_SIZE, SLOTS_OFFSET};
use super::*;
use crate::error::ErrorKind;
use crate::error::{Error, Result};
use crate::sys::test_fork::fork_child;

const LONG: Duration = Duration::from_secs(10);

fn soon() -> Instant {
    Instant::now() + LONG
}

/// Posts a task whose payload is `text` and whose config starts with `tag`.
fn post_text(mb: Mailbox<'_>, digest: u8, tag: u8, text: &str) -> Result<()> {
    mb.post_task(&[digest; 32], |config, payload| {
        config[0] = tag;
        payload[..text.len()].copy_from_slice(text.as_bytes());
        Ok(text.len())
    })
}

/// Waits on the parent doorbell (rule D3) until the task result arrives.
fn wait_task(region: &MailboxRegion, mb: Mailbox<'_>) -> std::result::Result<(), FrameError> {
    let deadline = soon();
    loop {
        let seen = region.doorbell().seq();
        if let Some(result) = mb.take_task_result() {
            return result;
        }
        assert!(Instant::now() < deadline, "no task result within {LONG:?}");
        region.doorbell().wait(seen, Some(deadline));
    }
}

/// The child loop of the echo child: a task whose payload starts with "ok" succeeds, any
/// other fails with a message echoing the payload, digest and config; control returns
/// command + arg0 + payload length, or fails for command 13.
fn echo_child(region: &MailboxRegion, i: usize) -> i32 {
    let mb = region.mailbox(i);
    mb.set_child_pid(std::process::id());
    mb.publish_init(Ok(()));
    let bell = mb.child_doorbell();
    loop {
        let seen = bell.seq();
        if mb.shutdown_requested() {
            return 0;
        }
        if let Some(req) = mb.task_request() {
            let text = String::from_utf8_lossy(req.args()).into_owned();
            let result = if text.starts_with("ok") {
                Ok(())
            } else {
                Err(FrameError::new(
                    7,
                    format!(
                        "echo {text} digest {} config {} len {}",
                        req.digest[0],
                        req.config()[0],
                        req.config().len()
                    ),
                ))
            };
            mb.finish_task(req, result, region.doorbell());
            continue;
        }
        if let Some(ctl) = mb.control_request() {
            let result = if ctl.command == 13 {
                Err(FrameError::new(13, format!("control refused, digest {}", ctl.digest[0])))
            } else {
                Ok(ctl.command + ctl.arg0 + ctl.payload.len() as u64)
            };
            mb.finish_control(result, region.doorbell());
            continue;
        }
        bell.wait(seen, None);
    }
}

#[test]
fn layout_constants() {
    assert_eq!(ARGS_CAPACITY, 63_808);
    assert_eq!(MAILBOX_SIZE, 327_936);
    let region = MailboxRegion::new(3).unwrap();
    assert_eq!(region.len(), 3);
    for i in 0..3 {
        assert_eq!(region.mailbox(i).task_state(), IDLE);
        assert_eq!(region.mailbox(i).base_state(), IDLE);
        assert!(!region.mailbox(i).shutdown_requested());
    }
    let base = region.region.addr();
    let m1 = region.mailbox(1).slot as *const Slot as u64;
    assert_eq!(m1 - base, (SLOTS_OFFSET + MAILBOX_SIZE) as u64);
}

#[test]
#[should_panic(expected = "out of range")]
fn mailbox_index_out_of_range_panics() {
    let region = MailboxRegion::new(1).unwrap();
    let _ = region.mailbox(1);
}

#[test]
fn mailbox_is_send_sync() {
    fn assert_bounds<T: Send + Sync>() {}
    assert_bounds::<Mailbox<'_>>();
    assert_bounds::<MailboxRegion>();
}

#[crate::test_support::isolated_test(crate = crate)] // rule T1
fn forked_child_serves_tasks_controls_and_shutdown() {
    let region = MailboxRegion::new(2).unwrap();
    let mut child = fork_child(|| echo_child(&region, 1));
    let mb = region.mailbox(1);
    assert_eq!(mb.wait_init(soon(), || false), InitStatus::Ready);
    assert_eq!(mb.base_state(), IDLE);
    assert_eq!(mb.child_pid(), child.pid().as_raw() as u32);

    for k in 0..5u8 {
        post_text(mb, k, 100 + k, &format!("task-{k}")).unwrap();
        let err = wait_task(&region, mb).unwrap_err();
        assert_eq!(err.code, 7);
        assert_eq!(err.message, format!("echo task-{k} digest {k} config {} len {CONFIG_BYTES}", 100 + k));
        assert_eq!(mb.task_state(), IDLE);
    }
    post_text(mb, 9, 0, "ok fine").unwrap();
    assert_eq!(wait_task(&region, mb), Ok(()));

    // An empty payload, and a full-capacity one.
    post_text(mb, 1, 2, "").unwrap();
    assert_eq!(
        wait_task(&region, mb).unwrap_err().message,
        format!("echo  digest 1 config 2 len {CONFIG_BYTES}")
    );
    mb.post_task(&[3; 32], |_, payload| {
        payload.fill(b'x');
        payload[..2].copy_from_slice(b"ok");
        Ok(payload.len())
    })
    .unwrap();
    assert_eq!(wait_task(&region, mb), Ok(()));

    mb.post_control(40, 2, &[5; 32], b"abc").unwrap();
    assert_eq!(mb.wait_control_done(Some(soon()), || false), Some(Ok(45)));
    mb.post_control(13, 0, &[6; 32], &[]).unwrap();
    assert_eq!(
        mb.wait_control_done(None, || false),
        Some(Err(FrameError::new(13, "control refused, digest 6")))
    );
    assert_eq!(mb.base_state(), IDLE);

    // The other mailbox was never touched.
    assert_eq!(region.mailbox(0).task_state(), IDLE);

    mb.request_shutdown();
    assert!(mb.shutdown_requested());
    assert_eq!(child.wait_timeout(LONG), 0);
}

#[crate::test_support::isolated_test(crate = crate)] // rule T1
fn forked_child_round_trips_without_lost_wake_ups() {
    // Many quick round trips race every post against the child going to sleep (rule D2);
    // a lost wake-up would stall a round trip until the 10 s deadline and fail.
    let region = MailboxRegion::new(1).unwrap();
    let mut child = fork_child(|| echo_child(&region, 0));
    let mb = region.mailbox(0);
    assert_eq!(mb.wait_init(soon(), || false), InitStatus::Ready);
    for k in 0..2_000u32 {
        if k % 8 == 0 {
            // Let the child fall asleep in the kernel, so posts also take the futex path.
            std::thread::sleep(Duration::from_micros(100));
        }
        post_text(mb, 0, 0, if k % 2 == 0 { "ok" } else { "no" }).unwrap();
        let result = if k % 3 == 0 {
            // Sleep at once (no spin), so the child's ring must wake us through the futex.
            let deadline = soon();
            loop {
                let seen = region.doorbell().seq();
                if let Some(result) = mb.take_task_result() {
                    break result;
                }
                assert!(Instant::now() < deadline, "no task result within {LONG:?}");
                region.doorbell().sleep(seen, Some(deadline));
            }
        } else {
            wait_task(&region, mb)
        };
        assert_eq!(result.is_ok(), k % 2 == 0);
    }
    mb.request_shutdown();
    assert_eq!(child.wait_timeout(LONG), 0);
}

#[crate::test_support::isolated_test(crate = crate)] // rule T1
fn forked_child_reports_init_failure() {
    let region = MailboxRegion::new(1).unwrap();
    let mut child = fork_child(|| {
        region.mailbox(0).publish_init(Err("no chip 3"));
        0
    });
    let mb = region.mailbox(0);
    assert_eq!(mb.wait_init(soon(), || false), InitStatus::Failed("no chip 3".into()));
    assert_eq!(mb.base_state(), INIT_FAILED);
    // Terminal: no control can be posted, and a second look says the same.
    assert!(
        mb.post_control(1, 0, &[0; 32], &[]).unwrap_err().kind() == crate::error::ErrorKind::InvalidState
    );
    assert_eq!(mb.wait_init(soon(), || false), InitStatus::Failed("no chip 3".into()));
    assert_eq!(child.wait_timeout(LONG), 0);
}

#[test]
fn waits_time_out_and_give_up() {
    let region = MailboxRegion::new(1).unwrap();
    let mb = region.mailbox(0);
    let start = Instant::now();
    assert_eq!(mb.wait_init(start + Duration::from_millis(30), || false), InitStatus::Pending);
    assert!(start.elapsed() >= Duration::from_millis(30));

    // give_up is polled at least every GIVE_UP_POLL even without a deadline's help.
    let flag = AtomicBool::new(false);
    let start = Instant::now();
    let status = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(20));
            flag.store(true, Ordering::SeqCst);
        });
        mb.wait_init(start + LONG, || flag.load(Ordering::SeqCst))
    });
    assert_eq!(status, InitStatus::Pending);
    assert!(start.elapsed() < LONG / 2);

    mb.publish_init(Ok(()));
    assert_eq!(mb.wait_init(soon(), || false), InitStatus::Ready);

    mb.post_control(1, 2, &[0; 32], b"x").unwrap();
    let start = Instant::now();
    assert_eq!(mb.wait_control_done(Some(start + Duration::from_millis(30)), || false), None);
    assert!(start.elapsed() >= Duration::from_millis(30));
    assert_eq!(mb.wait_control_done(None, || true), None);
    // The request stays in flight; a second post is refused.
    assert_eq!(mb.base_state(), CONTROL_REQUEST);
    assert!(
        mb.post_control(1, 2, &[0; 32], b"x").unwrap_err().kind() == crate::error::ErrorKind::InvalidState
    );
    // A late answer is still collected.
    let ctl = mb.control_request().unwrap();
    assert_eq!((ctl.command, ctl.arg0, ctl.digest, ctl.payload.as_slice()), (1, 2, [0; 32], &b"x"[..]));
    mb.finish_control(Ok(99), region.doorbell());
    assert_eq!(mb.wait_control_done(None, || false), Some(Ok(99)));
    // Nothing in flight now.
    assert_eq!(mb.wait_control_done(None, || false).unwrap().unwrap_err().code, FALLBACK_CODE);
}

#[test]
fn post_task_requires_an_idle_frame() {
    let region = MailboxRegion::new(1).unwrap();
    let mb = region.mailbox(0);
    post_text(mb, 1, 1, "first").unwrap();
    assert_eq!(mb.task_state(), TASK_READY);
    let err = post_text(mb, 2, 2, "second").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidState);
    assert!(err.message().contains("TASK_READY"), "{err}");
    assert!(mb.take_task_result().is_none());
    // The first task is intact.
    let req = mb.task_request().unwrap();
    assert_eq!((req.digest, req.args()), ([1; 32], &b"first"[..]));
    assert_eq!(mb.task_state(), BUSY, "the request owns the frame");
    mb.finish_task(req, Ok(()), region.doorbell());
    assert_eq!(mb.task_state(), TASK_DONE);
    let err = post_text(mb, 2, 2, "second").unwrap_err();
    assert!(err.message().contains("TASK_DONE"), "{err}");
    assert_eq!(mb.take_task_result(), Some(Ok(())));
    assert!(mb.take_task_result().is_none());
    post_text(mb, 2, 2, "second").unwrap();
}

#[test]
fn failed_or_panicking_writers_leave_the_frame_idle() {
    let region = MailboxRegion::new(1).unwrap();
    let mb = region.mailbox(0);
    let err = mb.post_task(&[0; 32], |_, p| Ok(p.len() + 1)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("exceeds mailbox capacity"), "{err}");
    assert_eq!(mb.task_state(), IDLE);
    let err = mb.post_task(&[0; 32], |_, _| Err(Error::decode("bad tensor"))).unwrap_err();
    assert_eq!(err.message(), "bad tensor");
    assert_eq!(mb.task_state(), IDLE);
    let panicked = std::panic::catch_unwind(|| mb.post_task(&[0; 32], |_, _| panic!("writer panicked")));
    assert!(panicked.is_err());
    assert_eq!(mb.task_state(), IDLE);
    assert!(
        mb.post_control(0, 0, &[0; 32], &vec![0; ARGS_CAPACITY + 1]).unwrap_err().kind()
            == crate::error::ErrorKind::InvalidArgument
    );
    assert_eq!(mb.base_state(), IDLE);
    // Config bytes are zeroed for every post.
    post_text(mb, 0, 77, "a").unwrap();
    mb.finish_task(mb.task_request().unwrap(), Ok(()), region.doorbell());
    mb.take_task_result().unwrap().unwrap();
    mb.post_task(&[0; 32], |config, _| {
        assert!(config.iter().all(|b| *b == 0));
        Ok(0)
    })
    .unwrap();
}

#[test]
fn long_messages_are_truncated() {
    let region = MailboxRegion::new(1).unwrap();
    let mb = region.mailbox(0);
    post_text(mb, 0, 0, "x").unwrap();
    // 'é' is two bytes: 511 bytes of text would split one, so 510 are kept.
    let long = "é".repeat(1000);
    mb.finish_task(mb.task_request().unwrap(), Err(FrameError::new(3, long.clone())), region.doorbell());
    let err = mb.take_task_result().unwrap().unwrap_err();
    assert_eq!(err.code, 3);
    assert_eq!(err.message.len(), 510);
    assert!(long.starts_with(&err.message));

    post_text(mb, 0, 0, "x").unwrap();
    let ascii = "a".repeat(2000);
    mb.finish_task(mb.task_request().unwrap(), Err(FrameError::new(0, ascii)), region.doorbell());
    let err = mb.take_task_result().unwrap().unwrap_err();
    assert_eq!(err.code, FALLBACK_CODE, "an Err with code 0 must not read back as success");
    assert_eq!(err.message, "a".repeat(ERROR_MSG_CAPACITY - 1));

    // A short message after a long one is not polluted by the old bytes.
    post_text(mb, 0, 0, "x").unwrap();
    mb.finish_task(mb.task_request().unwrap(), Err(FrameError::new(4, "short")), region.doorbell());
    assert_eq!(mb.take_task_result(), Some(Err(FrameError::new(4, "short"))));
}

#[test]
fn garbage_frame_contents_are_read_safely() {
    let region = MailboxRegion::new(1).unwrap();
    let mb = region.mailbox(0);
    post_text(mb, 0, 0, "x").unwrap();
    let frame = &mb.slot.tasks[0];
    // Play a misbehaving child: claim the frame and fill the message with invalid UTF-8 and
    // no NUL, and the payload length with nonsense.
    assert!(frame.state.take_task());
    // SAFETY: rule M3 — this test claimed the frame, so it owns the fields.
    unsafe {
        (*frame.error_msg.get()).fill(0xFF);
        *frame.payload_len.get() = u32::MAX;
    }
    frame.error_code.store(-5, Ordering::Relaxed);
    frame.state.reply_task();
    let err = mb.take_task_result().unwrap().unwrap_err();
    assert_eq!(err.code, -5);
    assert_eq!(err.message.chars().count(), ERROR_MSG_CAPACITY);
    assert!(err.message.chars().all(|c| c == char::REPLACEMENT_CHARACTER));

    // A payload length past the capacity is clamped.
    let post = frame.state.claim_to_post().unwrap();
    // SAFETY: rule M3 — this test claimed the frame, so it owns the fields.
    unsafe { *frame.payload_len.get() = u32::MAX };
    post.post_task();
    assert_eq!(mb.task_request().unwrap().args().len(), ARGS_CAPACITY);

    // Unknown states are neither collected nor served.
    frame.state.plant(0xDEAD);
    assert!(mb.take_task_result().is_none());
    assert!(mb.task_request().is_none());
    assert_eq!(state_name(mb.task_state()), "UNKNOWN");
    assert!(post_text(mb, 0, 0, "x").unwrap_err().message().contains("UNKNOWN"));
}

#[test]
fn child_side_calls_out_of_turn_do_nothing() {
    let region = MailboxRegion::new(1).unwrap();
    let mb = region.mailbox(0);
    let seen = region.doorbell().seq();
    // (A task cannot be finished out of turn: `finish_task` takes the request's guard.)
    mb.finish_control(Ok(1), region.doorbell());
    assert_eq!((mb.task_state(), mb.base_state()), (IDLE, IDLE));
    assert_eq!(region.doorbell().seq(), seen, "nothing finished, nothing rung");
    assert!(mb.task_request().is_none());
    assert!(mb.control_request().is_none());
    mb.publish_init(Ok(()));
    mb.publish_init(Err("too late"));
    assert_eq!(mb.wait_init(soon(), || false), InitStatus::Ready);
}

#[test]
fn posts_ring_the_child_doorbell() {
    let region = MailboxRegion::new(1).unwrap();
    let mb = region.mailbox(0);
    let bell = mb.child_doorbell();
    let seen = bell.seq();
    post_text(mb, 0, 0, "x").unwrap();
    assert_eq!(bell.seq(), seen + 1);
    mb.publish_init(Ok(()));
    mb.wait_init(soon(), || false);
    mb.post_control(0, 0, &[0; 32], &[]).unwrap();
    assert_eq!(bell.seq(), seen + 2);
    mb.request_shutdown();
    assert_eq!(bell.seq(), seen + 3);
    let parent_seen = region.doorbell().seq();
    mb.finish_task(mb.task_request().unwrap(), Ok(()), region.doorbell());
    mb.finish_control(Ok(0), region.doorbell());
    assert_eq!(region.doorbell().seq(), parent_seen + 2);
}

#[test]
fn a_task_request_owns_the_frame_until_finished() {
    let region = MailboxRegion::new(2).unwrap();
    let (mb, other) = (region.mailbox(0), region.mailbox(1));
    post_text(mb, 5, 0, "payload").unwrap();
    let req = mb.task_request().unwrap();
    // Taken once: a second look (another copy of the mailbox, another thread) finds nothing,
    // and the parent can neither collect nor post over it.
    assert!(mb.task_request().is_none());
    assert!(mb.take_task_result().is_none());
    assert!(post_text(mb, 6, 0, "over").unwrap_err().message().contains("BUSY"));
    assert_eq!(req.args(), b"payload");
    // Finishing it on another mailbox is refused (and the guard still answers on drop).
    let wrong = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        other.finish_task(req, Ok(()), region.doorbell())
    }));
    assert!(wrong.is_err());
    assert_eq!(other.task_state(), IDLE);
    let err = mb.take_task_result().unwrap().unwrap_err();
    assert_eq!(err.code, FALLBACK_CODE);
    assert!(err.message.contains("without finishing"), "{err}");
}

#[test]
fn a_dropped_task_request_answers_with_an_error() {
    let region = MailboxRegion::new(1).unwrap();
    let mb = region.mailbox(0);
    post_text(mb, 0, 0, "x").unwrap();
    drop(mb.task_request().unwrap());
    assert_eq!(mb.task_state(), TASK_DONE);
    let err = mb.take_task_result().unwrap().unwrap_err();
    assert_eq!(err.code, FALLBACK_CODE);
    assert!(err.message.contains("without finishing"), "{err}");
    // The frame is usable again.
    post_text(mb, 0, 0, "y").unwrap();
    mb.finish_task(mb.task_request().unwrap(), Ok(()), region.doorbell());
    assert_eq!(mb.take_task_result(), Some(Ok(())));
}

/// Posts `text` into task frame `ix`, to run (`stage` false) or to prepare, with a lease.
fn post_at(mb: Mailbox<'_>, ix: usize, stage: bool, lease: (u32, u64), text: &str) -> Result<()> {
    let posting = Posting { lease, flags: FLAG_OVERLAP, stage, ..Posting::default() };
    mb.post_task_at(ix, &[ix as u8; 32], &posting, |_, payload| {
        payload[..text.len()].copy_from_slice(text.as_bytes());
        Ok(text.len())
    })
}

#[test]
fn a_staged_successor_is_prepared_beside_the_running_task_and_launches_only_when_activated() {
    let region = MailboxRegion::new(1).unwrap();
    let (mb, parent) = (region.mailbox(0), region.doorbell());
    post_at(mb, 0, false, (0, 7), "head").unwrap();
    post_at(mb, 1, true, (1, 8), "next").unwrap();
    assert_eq!((mb.task_state_at(0), mb.task_state_at(1)), (TASK_READY, PREPARE_READY));
    // A staged frame is not a task to run, and a running one not one to prepare.
    assert!(mb.task_request_at(1, false).is_none() && mb.task_request_at(0, true).is_none());
    let head = mb.task_request_at(0, false).unwrap();
    assert_eq!((head.lease, head.flags, head.staged), ((0, 7), FLAG_OVERLAP, false));
    head.mark_accepted();
    let mut next = mb.task_request_at(1, true).unwrap();
    assert_eq!((next.lease, next.staged, next.args()), ((1, 8), true, &b"next"[..]));
    assert_eq!(mb.prepared_at(1), None, "not prepared yet");
    assert_eq!(mb.activate(1), Err(BUSY), "nothing to activate before FRAME_STAGED");
    next.publish_staged(parent);
    assert_eq!(mb.task_state_at(1), FRAME_STAGED);
    assert!(mb.prepared_at(1).is_some_and(|t| t > 0));
    assert_eq!(next.activation(), Activation::Waiting);
    assert!(!mb.accepted(1), "prepared is not launched");
    mb.finish_task(head, Ok(()), parent);
    assert!(mb.accepted(0));
    assert_eq!(mb.take_task_result_at(0), Some(Ok(())));
    mb.activate(1).unwrap();
    assert_eq!(mb.task_state_at(1), ACTIVATE);
    assert_eq!(mb.withdraw(1), Withdrawn::Late, "an activated task is not withdrawn");
    assert_eq!(next.activation(), Activation::Activate);
    assert_eq!(mb.task_state_at(1), TASK_LAUNCHED);
    next.mark_accepted();
    mb.finish_task(next, Err(FrameError::new(9, "kernel failed")), parent);
    assert!(mb.accepted(1));
    assert_eq!(mb.take_task_result_at(1), Some(Err(FrameError::new(9, "kernel failed"))));
    // Posting again clears the acceptance word.
    post_at(mb, 1, false, (1, 9), "again").unwrap();
    assert!(!mb.accepted(1));
}

#[test]
fn a_withdrawn_staged_task_ends_unlaunched_whether_or_not_the_child_took_it() {
    let region = MailboxRegion::new(1).unwrap();
    let (mb, parent) = (region.mailbox(0), region.doorbell());
    // Not taken yet: the frame goes back to IDLE at once.
    post_at(mb, 1, true, (1, 2), "next").unwrap();
    assert_eq!(mb.withdraw(1), Withdrawn::Taken);
    assert_eq!(mb.task_state_at(1), IDLE);
    assert!(mb.task_request_at(1, true).is_none(), "the child never sees it");
    // Prepared: the child is asked, and answers with an error.
    post_at(mb, 1, true, (1, 3), "next").unwrap();
    let mut next = mb.task_request_at(1, true).unwrap();
    next.publish_staged(parent);
    assert_eq!(mb.withdraw(1), Withdrawn::Asked);
    assert_eq!(mb.activate(1), Err(WITHDRAW), "a withdrawn task cannot be activated");
    assert_eq!(next.activation(), Activation::Withdraw);
    mb.finish_task(next, Err(FrameError::new(1, "withdrawn")), parent);
    assert_eq!(mb.take_task_result_at(1).unwrap().unwrap_err().message, "withdrawn");
    assert!(!mb.accepted(1));
    // Still being prepared (the child holds the frame BUSY): asked through the sticky word,
    // which the child reads between pieces of its copy-in; the next posting clears it.
    post_at(mb, 1, true, (1, 4), "next").unwrap();
    let next = mb.task_request_at(1, true).unwrap();
    assert!(!next.withdraw_asked());
    assert_eq!(mb.withdraw(1), Withdrawn::Late, "nothing the parent can take back yet");
    assert!(next.withdraw_asked());
    assert_eq!(mb.withdraw(1), Withdrawn::Late, "asking again changes nothing");
    mb.finish_task(next, Err(FrameError::new(1, "withdrawn while preparing")), parent);
    assert_eq!(mb.take_task_result_at(1).unwrap().unwrap_err().message, "withdrawn while preparing");
    post_at(mb, 1, true, (1, 5), "next").unwrap();
    let next = mb.task_request_at(1, true).unwrap();
    assert!(!next.withdraw_asked(), "a new posting starts unasked");
    mb.finish_task(next, Ok(()), parent);
    assert_eq!(mb.take_task_result_at(1), Some(Ok(())));
    // A running task's frame is BUSY too, but a running task is not withdrawn.
    post_at(mb, 0, false, (0, 6), "head").unwrap();
    let head = mb.task_request_at(0, false).unwrap();
    assert_eq!(mb.withdraw(0), Withdrawn::Late);
    assert!(!head.withdraw_asked(), "a running task reads no withdraw word");
    mb.finish_task(head, Ok(()), parent);
    assert_eq!(mb.take_task_result_at(0), Some(Ok(())));
    // A child that drops a staged task it holds still answers (and no parent move is lost).
    post_at(mb, 1, true, (1, 7), "next").unwrap();
    let mut next = mb.task_request_at(1, true).unwrap();
    next.publish_staged(parent);
    drop(next);
    assert_eq!(mb.task_state_at(1), TASK_DONE);
    assert!(mb.take_task_result_at(1).unwrap().is_err());
}

/// Posts a task with sequence number `seq` into frame `ix`, chained or not (rule M13).
fn post_seq(mb: Mailbox<'_>, ix: usize, seq: u16, chained: bool) {
    let flags = flag_seq(seq) | if chained { FLAG_CHAINED } else { 0 };
    let posting = Posting { lease: (0, 1), flags, ..Posting::default() };
    mb.post_task_at(ix, &[seq as u8; 32], &posting, |_, _| Ok(0)).unwrap();
}

#[test]
fn a_child_takes_the_unchained_task_first_then_the_chained_one_that_follows_its_last() {
    let region = MailboxRegion::new(1).unwrap();
    let (mb, parent) = (region.mailbox(0), region.doorbell());
    // The task ahead went into frame 1, the chained one behind it into frame 0.
    post_seq(mb, 1, 7, false);
    post_seq(mb, 0, 8, true);
    let first = mb.next_task(Some(3)).expect("a task");
    assert_eq!((first.seq(), first.chained()), (7, false), "the unchained one first, whatever the frame");
    mb.finish_task(first, Ok(()), parent);
    let second = mb.next_task(Some(7)).expect("the chained one");
    assert_eq!((second.seq(), second.chained(), second.withdrawn()), (8, true, false));
    mb.finish_task(second, Ok(()), parent);
    assert_eq!((mb.take_task_result_at(1), mb.take_task_result_at(0)), (Some(Ok(())), Some(Ok(()))));
    // Two chained tasks: the one that follows the last first.
    post_seq(mb, 1, 10, true);
    post_seq(mb, 0, 9, true);
    assert_eq!(mb.next_task(Some(8)).expect("a task").seq(), 9);
    // Then the other (its word clear).
    assert!(mb.next_task(Some(9)).is_some_and(|t| t.seq() == 10 && !t.withdrawn()));
}

#[test]
fn a_withdrawn_chained_task_says_so_and_the_word_is_cleared_by_the_next_post() {
    let region = MailboxRegion::new(1).unwrap();
    let (mb, parent) = (region.mailbox(0), region.doorbell());
    post_seq(mb, 0, 1, false);
    post_seq(mb, 1, 2, true);
    mb.withdraw_chained(1);
    mb.finish_task(mb.next_task(None).unwrap(), Ok(()), parent);
    let chained = mb.next_task(Some(1)).unwrap();
    assert!(chained.chained() && chained.withdrawn());
    mb.finish_task(chained, Err(FrameError::new(crate::ipc::child::ERR_NOT_RUN, "not run")), parent);
    assert!(mb.take_task_result_at(0).is_some());
    assert_eq!(mb.take_task_result_at(1).unwrap().unwrap_err().code, crate::ipc::child::ERR_NOT_RUN);
    post_seq(mb, 1, 3, false);
    assert!(!mb.next_task(Some(2)).unwrap().withdrawn(), "a new post clears the word");
}
