//! Taking locks, with one poison policy for the whole crate.
//!
//! A `std` lock is poisoned when a thread panics while holding it. Every lock of this crate
//! guards state that stays consistent across such a panic: the engine and the Worker catch
//! panics of user code (orchestration functions, host functions, kernels) at the boundary that
//! turns them into a failed run or task, the engine contains panics of its own scheduler passes
//! (rule 5 of the engine's scheduler role), and their own critical sections only move whole
//! values in and out of the guarded state. So a poisoned lock is taken as if it were not poisoned:
//! refusing it would turn one failed run into a Worker that can never run again.
//!
//! These helpers ([`lock`], [`try_lock`], [`read`], [`write`], [`wait_timeout`],
//! `wait_timeout_while`) are the only places that make that decision; code elsewhere calls them
//! instead of `lock().unwrap_or_else(|e| e.into_inner())`.
//!
//! [`checked`] is the sync facade of the protocols the `loom` models check (the slot state
//! machine, the scheduler role's flags, the mailbox state words): `std` in every normal build,
//! `loom` under `--cfg loom` (`engine/slot.rs` and `engine/role.rs` use it; the mailbox's
//! `StateWord` is generic over its atomic). The models sit beside their modules, in
//! `loom_models.rs`: `engine/slot/` (rules 1-4 of the slot module: dispatch vs fail,
//! consumption after the last release, publication vs completion and vs failure),
//! `ipc/mailbox/` (rules M3, M4, M11: post / take / collect with shutdown, no double claim, a
//! staged task activated or withdrawn while the child answers) and `engine/role/` (the
//! scheduler role's rules 1, 3 and 4: one holder at a time, and no lost wake-up of the
//! background thread). `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p
//! simpler --lib --release loom`, a step of `.ci/run`. Not modelled: the futexes themselves,
//! and the scheduler's passes (rule 5).

use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};
use std::time::Duration;

/// Locks `m`, taking a poisoned lock as it is (see the module docs).
#[inline]
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Tries to lock `m` without blocking: `None` only when another thread holds it. A poisoned
/// lock is taken as it is (see the module docs), never mistaken for a held one.
#[inline]
pub(crate) fn try_lock<T: ?Sized>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// Waits on `cv` up to `timeout`, taking a poisoned lock back as it is (see the module docs).
pub(crate) fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Duration,
) -> MutexGuard<'a, T> {
    cv.wait_timeout(guard, timeout).unwrap_or_else(|e| e.into_inner()).0
}

/// Waits on `cv` while `cond` holds, up to `timeout`; returns the guard and whether it timed
/// out. A poisoned lock is taken back as it is (see the module docs).
#[cfg(test)]
pub(crate) fn wait_timeout_while<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Duration,
    cond: impl FnMut(&mut T) -> bool,
) -> (MutexGuard<'a, T>, bool) {
    let (g, t) = cv.wait_timeout_while(guard, timeout, cond).unwrap_or_else(|e| e.into_inner());
    (g, t.timed_out())
}

/// Takes a read lock on `l`, taking a poisoned lock as it is (see the module docs).
#[inline]
pub(crate) fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

/// Takes a write lock on `l`, taking a poisoned lock as it is (see the module docs).
#[inline]
pub(crate) fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// The atomics and locks of the protocols that `loom` models check (`engine::slot`,
/// `engine::role`, the state words of `ipc::mailbox`): the `std` types in every normal build, so they cost nothing,
/// and `loom`'s in the unit tests under `--cfg loom` (`loom` is a dev-dependency), where the
/// `loom_models` explore every interleaving of the code that uses them
/// (`RUSTFLAGS="--cfg loom" cargo test -p simpler-rt --lib --release loom`). Code under check names
/// its atomics and locks through here and locks with [`checked::lock`] and [`checked::try_lock`]
/// (the poison policy above).
pub(crate) mod checked {
    #[cfg(not(all(test, loom)))]
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
    #[cfg(not(all(test, loom)))]
    pub(crate) use std::sync::{Mutex, MutexGuard};

    // A real mailbox frame's state word lives in a shared mapping and is always `std`'s
    // `AtomicU32` (rule M1 of `ipc::mailbox`); only its models take this one.
    #[cfg(all(test, loom))]
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
    #[cfg(all(test, loom))]
    pub(crate) use loom::sync::{Mutex, MutexGuard};

    /// Locks `m` with the crate's poison policy (the same function as [`super::lock`] in a
    /// normal build).
    #[cfg(not(all(test, loom)))]
    pub(crate) use super::lock;

    /// Locks `m` with the crate's poison policy (`loom`'s locks never poison).
    #[cfg(all(test, loom))]
    pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tries to lock `m` with the crate's poison policy (the same function as
    /// [`super::try_lock`] in a normal build).
    #[cfg(not(all(test, loom)))]
    pub(crate) use super::try_lock;

    /// Tries to lock `m`: `None` only when another thread holds it (`loom`'s locks never
    /// poison).
    #[cfg(all(test, loom))]
    pub(crate) fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
        m.try_lock().ok()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex, RwLock};

    use super::*;

    fn poison<T: Send + 'static>(m: Arc<Mutex<T>>) {
        let _ = std::thread::spawn(move || {
            let _g = m.lock().unwrap();
            panic!("poison it");
        })
        .join();
    }

    #[test]
    fn a_poisoned_mutex_is_taken_as_it_is() {
        let m = Arc::new(Mutex::new(7));
        poison(m.clone());
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 7);
        assert_eq!(try_lock(&m).map(|g| *g), Some(7));
    }

    #[test]
    fn try_lock_is_none_only_while_held() {
        let m = Mutex::new(1);
        let g = lock(&m);
        assert!(try_lock(&m).is_none());
        drop(g);
        assert!(try_lock(&m).is_some());
    }

    #[test]
    fn a_poisoned_rwlock_is_taken_as_it_is() {
        let l = Arc::new(RwLock::new(3));
        let l2 = l.clone();
        let _ = std::thread::spawn(move || {
            let _g = l2.write().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(l.is_poisoned());
        assert_eq!(*read(&l), 3);
        *write(&l) = 4;
        assert_eq!(*read(&l), 4);
    }
}
