//! The flags of the scheduler role (rules 1, 3 and 4 of the engine's module docs): who holds the
//! role and how many threads want it, with the checks the engine makes on them.
//!
//! The engine's `sched` lock is the role; [`RoleState`] marks it held while a thread has it
//! ([`RoleState::try_take`], [`RoleState::release`]) and counts the threads that announced they
//! want it ([`RoleState::announce`], [`RoleState::withdraw`]). [`RoleState::needs_background_wake`]
//! is rule 4's check, made after every release, withdrawal and publication that found the role
//! free. Every operation is sequentially consistent, so a thread that publishes work and then
//! checks the holder, and one that releases (or withdraws) and then checks the work, cannot both
//! miss each other. The atomics and the lock come from the sync facade, so the `loom` models at
//! the end of this file race these very methods.

use crate::sys::sync::checked::{self as sync, AtomicBool, AtomicU32, Mutex, MutexGuard, Ordering};

/// Whether the scheduler role is held, and how many threads want it (see the module docs).
pub(crate) struct RoleState {
    /// Set while a thread holds the role's lock (rule 1): set right after taking it, cleared
    /// right before unlocking.
    held: AtomicBool,
    /// Threads that announced they will wait and drive (rule 3).
    wanted: AtomicU32,
}

impl RoleState {
    pub(crate) fn new() -> RoleState {
        RoleState { held: AtomicBool::new(false), wanted: AtomicU32::new(0) }
    }

    /// Takes the role's lock `lock` if nobody holds it and marks the role held (rule 1). Give it
    /// up with [`RoleState::release`].
    #[inline]
    pub(crate) fn try_take<'a, T>(&self, lock: &'a Mutex<T>) -> Option<MutexGuard<'a, T>> {
        let guard = sync::try_lock(lock)?;
        self.held.store(true, Ordering::SeqCst);
        Some(guard)
    }

    /// Gives the role up: clears the flag while the lock is still held, so it can never
    /// overwrite the flag of a thread that took the role right after, then unlocks. The caller
    /// then applies rule 4 ([`RoleState::needs_background_wake`]).
    #[inline]
    pub(crate) fn release<T>(&self, guard: MutexGuard<'_, T>) {
        self.held.store(false, Ordering::SeqCst);
        drop(guard);
    }

    /// Whether a thread holds the role.
    #[inline]
    pub(crate) fn held(&self) -> bool {
        self.held.load(Ordering::SeqCst)
    }

    /// How many threads announced that they want the role.
    #[inline]
    pub(crate) fn wanted(&self) -> u32 {
        self.wanted.load(Ordering::SeqCst)
    }

    /// Announces that this thread wants the role (rule 3); undone by [`RoleState::withdraw`].
    #[inline]
    pub(crate) fn announce(&self) {
        self.wanted.fetch_add(1, Ordering::SeqCst);
    }

    /// Withdraws an announcement, then makes rule 4's check: returns whether the background
    /// thread must be woken. Leaving without the check loses that wake-up.
    #[inline]
    pub(crate) fn withdraw(&self, outstanding: impl FnOnce() -> bool) -> bool {
        self.wanted.fetch_sub(1, Ordering::SeqCst);
        self.needs_background_wake(outstanding)
    }

    /// Rule 4: whether the background thread must be woken, that is, nobody holds or wants the
    /// role and `outstanding` says work is left. Called after the change that may call for it
    /// (a release, a withdrawal, a publication).
    #[inline]
    pub(crate) fn needs_background_wake(&self, outstanding: impl FnOnce() -> bool) -> bool {
        !self.held() && self.wanted() == 0 && outstanding()
    }
}

#[cfg(all(test, loom))]
mod loom_models;
