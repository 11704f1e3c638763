//! Completion and poisoning: a task that ended (or failed without starting) is settled, its
//! consumers are released or poisoned over the whole downstream cone, its references dropped
//! and its slot consumed (rules 1, 3 and 4 of `slot`); a panic while completing fails or
//! abandons its run (rule 5). Consuming a slot frees room in the task window and the heap
//! rings, which wakes the threads waiting for it ([`CapacityWait`]).
//!
//! [`Engine::fail_unstarted`] is the one way a task that has not started fails: publication of
//! a poisoned slot, poisoning of the downstream cone, `cancel_unstarted`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::dfx::timeline::TaskEvent;
use crate::engine::Engine;
use crate::engine::run::RunState;
use crate::engine::slot::{Slot, State};
use crate::error::{Error, ErrorKind};

/// A thread waiting for room in the task window or a heap ring (see `Engine::consume`).
pub(crate) struct CapacityWait<'a> {
    eng: &'a Engine,
}

impl<'a> CapacityWait<'a> {
    pub(crate) fn new(eng: &'a Engine) -> CapacityWait<'a> {
        eng.capacity_waiters.fetch_add(1, Ordering::SeqCst);
        CapacityWait { eng }
    }
}

impl Drop for CapacityWait<'_> {
    fn drop(&mut self) {
        self.eng.capacity_waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Engine {
    /// A task finished (or was failed without running): settle it, release or poison its
    /// consumers, drop its references. Newly ready consumers are appended to `ready`.
    pub(crate) fn complete(
        &self,
        slot: &Arc<Slot>,
        result: std::result::Result<(), Error>,
        ready: &mut Vec<Arc<Slot>>,
    ) {
        self.fault_point("complete", Some(slot));
        let (fanout, retained) = slot.settle(&result);
        slot.run.note(slot.index, TaskEvent::Ended(result.as_ref().map(|_| ())));
        tracing::trace!(target: "simpler::scheduler", run_id = slot.run.id, task_index = slot.index, ok = result.is_ok(), "completion");
        match result {
            Ok(()) => {
                slot.run.completed.fetch_add(1, Ordering::Relaxed);
                for consumer in fanout {
                    self.release_fanin(&consumer, ready);
                }
            }
            Err(err) => {
                slot.run.failed.fetch_add(1, Ordering::Relaxed);
                slot.run.record_error(err.clone());
                self.poison_all(fanout, slot, &err);
            }
        }
        for p in retained {
            self.release_ref(&p);
        }
        self.release_ref(slot);
    }

    /// [`Engine::complete`] of `slot` panicked (rule 5). The slot's run fails with an
    /// [`ErrorKind::Internal`] error naming the task and the panic. When the panic came before
    /// the slot changed (it is still `Running`), the slot is completed again as failed, so its
    /// consumers are poisoned and the run settles normally; when that panics too, or the slot
    /// had changed already, the run's bookkeeping cannot be trusted and it is abandoned
    /// (see [`Engine::abandon_run`]).
    pub(crate) fn completion_panicked(
        &self,
        slot: &Arc<Slot>,
        panic: &(dyn std::any::Any + Send),
        ready: &mut Vec<Arc<Slot>>,
    ) {
        let run = slot.run.clone();
        let err = Error::new(
            ErrorKind::Internal,
            format!(
                "run {}: the scheduler panicked while completing {}: {}",
                run.id,
                slot.describe(),
                crate::error::panic_message(panic)
            ),
        );
        tracing::error!(target: "simpler::scheduler", "{}", err.message());
        // First, so the run's error names the panic rather than what it led to.
        run.record_error(err.clone());
        if slot.state() == State::Running
            && catch_unwind(AssertUnwindSafe(|| self.complete(slot, Err(err.clone()), ready))).is_ok()
        {
            return;
        }
        tracing::error!(target: "simpler::scheduler", run_id = run.id, "completing it as failed was not possible; the run is abandoned");
        self.abandon_run(&run, err);
    }

    /// Ends `run` now with `err`, without waiting for its tasks (rule 5): it is marked done and
    /// leaves the run FIFO, so its waiters return and later runs dispatch. Its tasks still
    /// running end and are released as usual, and its lease stays quarantined until they have
    /// (rule L4 of `lease`); its READY ones are failed when the scheduler
    /// retires its queues; what the panic cut off (the panicking task and the consumers only
    /// it would have released) stays allocated.
    /// Returns false, doing nothing, when the run was done already.
    pub(crate) fn abandon_run(&self, run: &Arc<RunState>, err: Error) -> bool {
        if run.is_done() {
            return false;
        }
        run.abandon(err);
        // Its lease is quarantined until no task of it is on a worker (rule L4 of `lease`).
        self.run_ended(run, true);
        true
    }

    fn release_fanin(&self, consumer: &Arc<Slot>, ready: &mut Vec<Arc<Slot>>) {
        if consumer.release_fanin() {
            consumer.run.note(consumer.index, TaskEvent::Ready);
            ready.push(consumer.clone());
        }
    }

    /// Fails `slot`, which has not started, with `err`: the one way a task fails without
    /// running. A `Building` slot belongs to the submitting thread, which calls this at
    /// publication; a `Pending` or `Ready` one moves to `Failed` only if this call wins the CAS
    /// (rule 1 of the slot module). Its members are skipped, the run counts it failed, its
    /// consumers are poisoned (rule 3, over the whole downstream cone), and its references are
    /// dropped. Returns false, doing nothing, when the slot was past that (running or done).
    pub(crate) fn fail_unstarted(&self, slot: &Arc<Slot>, err: Error) -> bool {
        let Some(fanout) = self.fail_one(slot, err.clone()) else { return false };
        self.poison_all(fanout, slot, &err);
        true
    }

    /// The state change and bookkeeping of [`Engine::fail_unstarted`] for one slot; returns
    /// its consumers for the caller to poison.
    fn fail_one(&self, slot: &Arc<Slot>, err: Error) -> Option<smallvec::SmallVec<[Arc<Slot>; 4]>> {
        let (fanout, retained) = slot.fail_unstarted(err.clone())?;
        slot.run.note(slot.index, TaskEvent::NotRun(&err));
        slot.run.failed.fetch_add(1, Ordering::Relaxed);
        for p in retained {
            self.release_ref(&p);
        }
        self.release_ref(slot);
        Some(fanout)
    }

    /// Rule 3 of the slot module, over the whole downstream cone (iteratively): a consumer
    /// still being built is marked (its submitting thread fails it at publication); a pending
    /// or ready one fails now.
    fn poison_all(&self, first: smallvec::SmallVec<[Arc<Slot>; 4]>, producer: &Arc<Slot>, cause: &Error) {
        let mut work: Vec<(Arc<Slot>, String)> =
            first.into_iter().map(|c| (c, producer.describe())).collect();
        while let Some((victim, by)) = work.pop() {
            let poison = Error::new(
                ErrorKind::Poisoned,
                format!("{} did not run: {by} failed: {}", victim.describe(), cause.message()),
            );
            if victim.mark_poisoned(&poison) {
                continue;
            }
            let name = victim.describe();
            if let Some(fanout) = self.fail_one(&victim, poison) {
                work.extend(fanout.into_iter().map(|c| (c, name.clone())));
            }
        }
    }

    /// Fails every not-yet-running task of a run (the orchestration function returned an
    /// error): they never run, and are released and consumed normally.
    pub(crate) fn cancel_unstarted(&self, slots: &[Arc<Slot>], cause: &Error) {
        for s in slots {
            if s.state() != State::Building {
                self.fail_unstarted(s, cause.clone());
            }
        }
    }

    /// Drops one reference on `slot`; consumes it when it was the last (rule 4).
    pub(crate) fn release_ref(&self, slot: &Arc<Slot>) {
        if slot.release() {
            self.consume(slot);
        }
    }

    fn consume(&self, slot: &Arc<Slot>) {
        if !slot.claim_consumption() {
            return;
        }
        let (written, retained) = {
            let mut l = slot.lock();
            (std::mem::take(&mut l.written), std::mem::take(&mut l.retained))
        };
        for p in retained {
            self.release_ref(&p);
        }
        if !written.is_empty() {
            self.tensor_map.erase(slot.run.id, &written, slot);
        }
        if let Some(task) = slot.task.as_ref() {
            task.holds.release(&task.args);
            if task.names_device {
                for id in task.device_buffers() {
                    self.devices.release(id);
                }
            }
        }
        if let Some(hold) = slot.heap {
            self.tensor_map.erase(slot.run.id, &[hold.identity], slot);
            self.heap.release(hold.block);
        }
        self.window.release();
        if slot.run.slot_consumed() {
            self.run_finished(&slot.run);
        } else {
            // Room in the window or a heap ring: wake whoever waits on back-pressure. Pairs
            // with `CapacityWait::new` (announce, then try): one of the two sees the other.
            std::sync::atomic::fence(Ordering::SeqCst);
            if self.capacity_waiters.load(Ordering::SeqCst) > 0 {
                self.events.ring();
                self.doorbell().ring();
            }
        }
    }
}
