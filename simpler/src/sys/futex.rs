//! Shared (cross-process) futexes and the [`Doorbell`] every wait in the IPC layer sleeps on.
//!
//! Waiting follows one shape everywhere: spin for a few microseconds on the word (a handoff to a
//! spinning peer costs ~0.1 us), then yield a few times, then sleep in the kernel on a futex.
//! Where the peer runs shortens it ([`PeerWait`]): a waiter whose peer shares its CPU skips the
//! spinning, and one whose peer there is a nested Worker goes straight to sleep.
//! Never a fixed sleep, never an endless spin: an idle tree of workers must use ~0% CPU, and with
//! more spinners than cores every handoff would wait a whole time slice (~4 ms).
//!
//! Waits are placement-aware ([`current_cpu`], [`PeerWait`], [`Doorbell::wait_for_peer`]): a
//! waiter whose peer runs on another CPU keeps checking politely for up to 30 us
//! ([`REMOTE_SPIN_NANOS`], [`poll_politely`]), one whose peer shares its CPU yields, and a
//! driver whose busy peers all share its CPU and are nested Workers sleeps at once; all then
//! sleep on a shared futex. [`Doorbell::wait_watching`] also checks a costly hint (a socket, once
//! every [`WATCH_EVERY`] spins, so the checker still yields every microsecond or so to a thread
//! that shares its CPU) and runs a hook before it sleeps; [`Doorbell::wait_expecting`] keeps
//! checking for a window in which an answer is due (a chip run's end) before it sleeps.
//!
//! The futexes are the *shared* kind (`FUTEX_WAIT` / `FUTEX_WAKE` without
//! `FUTEX_PRIVATE_FLAG`): the kernel keys them by the backing page, so a waiter in one process is
//! woken by a waker in another as long as both map the word `MAP_SHARED`. (Private futexes, which
//! `std` uses, never cross a process boundary.) On private memory they still work within one
//! process.
//!
//! # Rules
//!
//! The `unsafe` in this module is the futex system call itself:
//!
//! * **F1 (the word).** Every call passes the address of an [`AtomicU32`] borrowed for the whole
//!   call, so it is live, 4-byte aligned and mapped. The kernel reads it atomically
//!   (`FUTEX_WAIT`) or uses its address only as a key (`FUTEX_WAKE`); it never writes it.
//! * **F2 (the timeout).** The timeout pointer is null (sleep until woken) or points to a
//!   `timespec` on the caller's stack that outlives the call; `FUTEX_WAIT` reads it as a relative
//!   duration. The unused arguments (`uaddr2`, `val3`) are null / zero, as `FUTEX_WAIT` and
//!   `FUTEX_WAKE` ignore them.
//! * **F3 (shared key).** `FUTEX_PRIVATE_FLAG` is never set, so waiters and wakers in different
//!   processes that map the same page meet on the same futex.
//!
//! The [`Doorbell`] protocol is safe code, stated here because other modules rely on it:
//!
//! * **D1 (ring).** `ring` increments `seq` (wrapping) *before* it looks at `sleepers`, and only
//!   then issues a wake, to every sleeper.
//! * **D2 (sleep).** A sleeper increments `sleepers` *before* it re-checks `seq`, and then blocks
//!   with `FUTEX_WAIT(seq, seen)`, which the kernel compares and blocks on atomically. So either
//!   the ringer sees the registered sleeper and wakes it, or the sleeper sees the new `seq` (or
//!   the kernel does, and refuses to block): a ring is never lost.
//! * **D3 (eventcount use).** A waiter reads [`Doorbell::seq`] first, then checks its condition
//!   (a mailbox state word, a queue), and only if the condition is false calls
//!   [`Doorbell::wait`] with the `seq` it read. A party that makes the condition true and then
//!   rings changes `seq` after the check could have missed it, so the wait returns.
//! * **D4 (stale sleepers).** A process killed while asleep leaves `sleepers` above zero; ringers
//!   then pay a wake syscall that wakes nobody. That costs time, never correctness.
//!
//! # Memory ordering
//!
//! `ring` is a `SeqCst` read-modify-write of `seq` followed by a `SeqCst` load of `sleepers`; the
//! sleeper does a `SeqCst` increment of `sleepers` followed by a `SeqCst` load of `seq`. That is
//! Dekker's pattern: with `SeqCst` on all four, at least one side sees the other's write (D2).
//! The increment of `seq` is also a release, and [`Doorbell::seq`] / the value returned by
//! [`Doorbell::wait`] are acquire loads, so a waiter that observes the new `seq` also observes
//! every write the ringer made before ringing (D3). A 32-bit `seq` could in principle wrap back to
//! `seen` between two looks (2^32 rings); that is not a practical concern.

#![expect(
    unsafe_code,
    reason = "the futex system call has no safe wrapper in std, libc or nix; rules F*, D*"
)]

use std::hint::spin_loop;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::yield_now;
use std::time::{Duration, Instant};

/// How long a wait spins on its word before yielding, in nanoseconds.
///
/// A handoff to a spinning peer costs ~0.1 us and waking a futex sleeper 3-40 us, so a few
/// microseconds of spinning catches every fast reply without holding a core for long.
pub(crate) const SPIN_NANOS: u64 = 3_000;

/// Spin iterations between two looks at the clock.
pub(crate) const SPIN_CHECK_EVERY: u32 = 64;

/// Spin iterations between two costly checks (a system call) of a polite poll: a few per
/// burst, so the check comes every microsecond or so and the yields still do.
pub(crate) const WATCH_EVERY: u32 = 16;

/// How many times a wait yields its time slice after spinning and before sleeping.
pub(crate) const YIELD_ROUNDS: u32 = 3;

/// Blocks while `*word == expected`, up to `timeout` (`None` = forever).
///
/// Spurious wake-ups are allowed: the caller re-checks its condition. Uses a shared
/// (cross-process) futex, so the word may live in memory mapped `MAP_SHARED` by several
/// processes. Interruptions, timeouts and a word that no longer equals `expected` all simply
/// return.
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
        // Always below 1e9, so it fits every `c_long`.
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts.as_ref().map_or(ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: rule F1 — `word` is a live, aligned AtomicU32 for the whole call and the kernel
    // only reads it; rule F2 — `ts_ptr` is null or points to `ts`, which outlives the call, and
    // the unused arguments are null / zero; rule F3 — no FUTEX_PRIVATE_FLAG.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            ts_ptr,
            ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes up to `n` waiters blocked in [`futex_wait`] on `word` (shared futex).
pub(crate) fn futex_wake(word: &AtomicU32, n: i32) {
    // SAFETY: rule F1 — `word` is a live, aligned AtomicU32 and FUTEX_WAKE only uses its address
    // as a key; rule F2 — the unused timeout, uaddr2 and val3 are null / zero; rule F3 — no
    // FUTEX_PRIVATE_FLAG.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            n,
            ptr::null::<libc::timespec>(),
            ptr::null::<u32>(),
            0u32,
        );
    }
}

/// How long a waiter keeps checking (spinning politely: yielding its CPU every microsecond or
/// so) when its peer runs on another CPU, before it sleeps in the kernel. A round trip to a
/// busy peer is well under this; waking a sleeping peer on a halted vCPU costs far more.
pub(crate) const REMOTE_SPIN_NANOS: u64 = 30_000;

/// How many CPUs this process may use (its affinity and cgroup quota, as
/// [`std::thread::available_parallelism`] says; 1 when unknown), asked once.
pub(crate) fn available_cpus() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// The CPU the calling thread runs on now, plus one (0 when unknown).
pub(crate) fn current_cpu() -> u32 {
    // SAFETY: sched_getcpu has no preconditions; it returns -1 on failure (mapped to 0).
    let cpu = unsafe { libc::sched_getcpu() };
    if cpu < 0 { 0 } else { cpu as u32 + 1 }
}

/// Checks `done` while the peer, which runs on another CPU, is expected to answer soon: spins,
/// yielding the CPU between short bursts (so a runnable neighbour on this CPU is never starved),
/// for up to [`REMOTE_SPIN_NANOS`]. Returns true as soon as `done()` does.
pub(crate) fn poll_politely(deadline: Option<Instant>, done: impl FnMut() -> bool) -> bool {
    poll_politely_for(Duration::from_nanos(REMOTE_SPIN_NANOS), deadline, done)
}

/// [`poll_politely`] for up to `window` instead: for a waiter that knows its answer is
/// usually longer coming than [`REMOTE_SPIN_NANOS`], yet sooner than a sleeper would wake.
pub(crate) fn poll_politely_for(
    window: Duration,
    deadline: Option<Instant>,
    mut done: impl FnMut() -> bool,
) -> bool {
    let mut end = Instant::now() + window;
    if let Some(d) = deadline
        && d < end
    {
        end = d;
    }
    loop {
        for _ in 0..SPIN_CHECK_EVERY {
            spin_loop();
            if done() {
                return true;
            }
        }
        if Instant::now() >= end {
            return false;
        }
        yield_now();
        if done() {
            return true;
        }
    }
}

/// Spins briefly, then yields a few times, until `done` returns true or the deadline passes.
///
/// The spin phase lasts about [`SPIN_NANOS`] (the clock is read every [`SPIN_CHECK_EVERY`]
/// iterations), then [`YIELD_ROUNDS`] yields follow. Returns true as soon as `done()` does, and
/// false when the caller should go to sleep (or give up, if the deadline has passed). It never
/// sleeps itself.
pub(crate) fn spin_then_yield(deadline: Option<Instant>, mut done: impl FnMut() -> bool) -> bool {
    if done() {
        return true;
    }
    let mut spin_end = Instant::now() + Duration::from_nanos(SPIN_NANOS);
    if let Some(d) = deadline
        && d < spin_end
    {
        spin_end = d;
    }
    loop {
        for _ in 0..SPIN_CHECK_EVERY {
            spin_loop();
            if done() {
                return true;
            }
        }
        if Instant::now() >= spin_end {
            break;
        }
    }
    for _ in 0..YIELD_ROUNDS {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
        yield_now();
        if done() {
            return true;
        }
    }
    false
}

/// How a waiter waits for the peer that will answer it, chosen from where the peer runs.
///
/// ```text
/// peer on another CPU                       -> Poll   (it answers long before a sleeper wakes)
/// peer on this CPU                          -> Yield  (give it the CPU, then sleep)
/// peer on this CPU, a Worker with children  -> Sleep  (its children need this CPU, not our turns)
/// ```
///
/// A context switch costs about 1 us in a small VM, so every needless turn a yielding waiter
/// takes is paid by the task it waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeerWait {
    /// Keep checking politely (yielding between short bursts), then sleep.
    Poll,
    /// Yield a few times so the peer can run here, then sleep.
    Yield,
    /// Sleep at once: the peer's answer waits on processes that need this CPU more than we do.
    Sleep,
}

impl PeerWait {
    /// `Poll` when the peer runs elsewhere, `Yield` when it shares this CPU.
    pub(crate) fn from_elsewhere(elsewhere: bool) -> PeerWait {
        if elsewhere { PeerWait::Poll } else { PeerWait::Yield }
    }

    /// How a waiter on `cpu` (CPU plus one, 0 = unknown) waits for its busy peers, each given as
    /// (its CPU plus one if known, whether it has children of its own), on a machine that gives
    /// this process `cpus` CPUs: `Poll` when any may run elsewhere (unknown counts as
    /// elsewhere) and fewer than `cpus` are known to run on this machine (a child that has not
    /// yet reported its CPU is not counted), `Sleep` when all
    /// share this CPU and have children, `Yield` otherwise (also when there is none).
    ///
    /// With a busy peer for every CPU, a poller takes a CPU that one of them needs: the kernel
    /// balances three busy processes on two CPUs as two and one, so a driver polling alone on
    /// one CPU leaves two workers sharing the other, each at half speed (measured: Task Bench
    /// steps 1.5x longer in about a third of the runs).
    pub(crate) fn for_peers(
        cpu: u32,
        cpus: usize,
        peers: impl IntoIterator<Item = (Option<u32>, bool)>,
    ) -> PeerWait {
        let (mut any, mut all_nested, mut elsewhere, mut here) = (false, true, false, 0usize);
        for (peer_cpu, has_children) in peers {
            here += usize::from(peer_cpu.is_some());
            if peer_cpu.is_none_or(|c| cpu == 0 || c != cpu) {
                elsewhere = true;
                continue;
            }
            any = true;
            all_nested &= has_children;
        }
        if elsewhere {
            return if here < cpus { PeerWait::Poll } else { PeerWait::Yield };
        }
        if any && all_nested { PeerWait::Sleep } else { PeerWait::Yield }
    }
}

/// A wake-up counter that one or more waiters sleep on and others ring.
///
/// It lives in shared memory (`#[repr(C)]`, 64-byte aligned so it never shares a cache line with
/// a neighbour; all-zero bytes are a valid initial state) and works across processes. Use it as
/// an eventcount (rule D3): read [`seq`](Doorbell::seq), check the condition, then
/// [`wait`](Doorbell::wait) with the value read.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub(crate) struct Doorbell {
    /// Incremented by every ring (D1); the futex word sleepers block on.
    seq: AtomicU32,
    /// How many waiters are registered as (about to be) asleep in the kernel (D2).
    sleepers: AtomicU32,
}

impl Doorbell {
    /// A doorbell with `seq == 0` and no sleepers (the same as all-zero bytes).
    pub(crate) const fn new() -> Doorbell {
        Doorbell { seq: AtomicU32::new(0), sleepers: AtomicU32::new(0) }
    }

    /// The current sequence number (Acquire).
    /// Threads asleep in the kernel on this bell now (for tests that need the futex path).
    #[cfg(test)]
    pub(crate) fn sleepers(&self) -> u32 {
        self.sleepers.load(Ordering::SeqCst)
    }

    pub(crate) fn seq(&self) -> u32 {
        self.seq.load(Ordering::Acquire)
    }

    /// Rings: `seq += 1` (SeqCst), then wakes every sleeper if any is registered (rule D1).
    ///
    /// Costs one atomic increment and one load when nobody sleeps; a wake syscall otherwise.
    pub(crate) fn ring(&self) {
        self.seq.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) != 0 {
            futex_wake(&self.seq, i32::MAX);
        }
    }

    /// Waits until `seq != seen` or the deadline passes, and returns the current `seq`
    /// (equal to `seen` on timeout).
    ///
    /// Spins a few microseconds, yields a few times, then sleeps on the futex (rule D2) with the
    /// remaining timeout. Use for waits that usually end quickly (a reply to a task).
    pub(crate) fn wait(&self, seen: u32, deadline: Option<Instant>) -> u32 {
        let mut current = seen;
        if spin_then_yield(deadline, || {
            current = self.seq();
            current != seen
        }) {
            return current;
        }
        self.sleep(seen, deadline)
    }

    /// Waits for a peer whose placement is known, the way `how` says (see [`PeerWait`]): keep
    /// checking politely for up to [`REMOTE_SPIN_NANOS`], yield a few times, or sleep at once.
    /// Whichever it starts with, it ends asleep in the kernel if the peer is slow.
    pub(crate) fn wait_for_peer(&self, seen: u32, deadline: Option<Instant>, how: PeerWait) -> u32 {
        self.wait_watching(seen, deadline, how, || false, || {})
    }

    /// Like [`wait_for_peer`](Doorbell::wait_for_peer), but also returns (with `seen`) as soon
    /// as `ready()` does while it checks; before it sleeps, it calls `before_sleep` (after
    /// which whatever `ready` watched rings the bell instead).
    pub(crate) fn wait_watching(
        &self,
        seen: u32,
        deadline: Option<Instant>,
        how: PeerWait,
        mut ready: impl FnMut() -> bool,
        before_sleep: impl FnOnce(),
    ) -> u32 {
        let mut current = seen;
        let mut checks = 0u32;
        let mut changed = || {
            current = self.seq();
            // `ready` may be a system call: once per burst of spins, so the yields between
            // bursts still come every microsecond or so.
            checks = checks.wrapping_add(1);
            current != seen || (checks % WATCH_EVERY == 1 && ready())
        };
        let done = match how {
            PeerWait::Poll => poll_politely(deadline, &mut changed),
            PeerWait::Yield => {
                let mut hit = changed();
                for _ in 0..YIELD_ROUNDS {
                    if hit || deadline.is_some_and(|d| Instant::now() >= d) {
                        break;
                    }
                    yield_now();
                    hit = changed();
                }
                hit
            }
            PeerWait::Sleep => changed(),
        };
        if done {
            return current;
        }
        before_sleep();
        self.sleep(seen, deadline)
    }

    /// Waits for a ring that usually comes within about `window`: checks politely (as
    /// [`PeerWait::Poll`] does, yielding the CPU every microsecond or so) for up to that long,
    /// then sleeps in the kernel. Returns the current `seq`.
    pub(crate) fn wait_expecting(&self, seen: u32, window: Duration) -> u32 {
        let mut current = seen;
        if poll_politely_for(window, None, || {
            current = self.seq();
            current != seen
        }) {
            return current;
        }
        self.sleep(seen, None)
    }

    /// Like [`wait`](Doorbell::wait), but sleeps at once without spinning or yielding.
    ///
    /// For waits known to be long: an idle background thread, a child waiting for work.
    pub(crate) fn sleep(&self, seen: u32, deadline: Option<Instant>) -> u32 {
        let current = self.seq();
        if current != seen {
            return current;
        }
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let result = loop {
            let current = self.seq.load(Ordering::SeqCst);
            if current != seen {
                break current;
            }
            let timeout = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => break seen,
                },
            };
            futex_wait(&self.seq, seen, timeout);
        };
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        result
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::thread;

    use super::*;

    const LONG: Duration = Duration::from_secs(10);

    /// Rings `bell` from another thread after `delay`, so the caller is already waiting.
    fn ring_later(bell: &Arc<Doorbell>, delay: Duration) -> thread::JoinHandle<()> {
        let bell = bell.clone();
        thread::spawn(move || {
            thread::sleep(delay);
            bell.ring();
        })
    }

    #[test]
    fn doorbell_is_one_cache_line() {
        assert_eq!(size_of::<Doorbell>(), 64);
        assert_eq!(align_of::<Doorbell>(), 64);
    }

    #[test]
    fn ring_wakes_a_waiting_thread() {
        let bell = Arc::new(Doorbell::new());
        let seen = bell.seq();
        let ringer = ring_later(&bell, Duration::from_millis(50));
        let start = Instant::now();
        let now = bell.wait(seen, Some(start + LONG));
        assert_eq!(now, seen.wrapping_add(1));
        assert!(start.elapsed() < LONG / 2, "woken by the ring, not by the deadline");
        ringer.join().unwrap();
    }

    #[test]
    fn peer_wait_follows_placement() {
        use PeerWait::{Poll, Sleep, Yield};
        // A peer elsewhere, or of unknown placement, is polled, whatever else is busy, while
        // some CPU has no busy peer of this machine.
        assert_eq!(PeerWait::for_peers(1, 2, [(Some(2), false)]), Poll);
        assert_eq!(PeerWait::for_peers(1, 2, [(Some(1), true), (None, true)]), Poll);
        assert_eq!(PeerWait::for_peers(0, 2, [(Some(1), true)]), Poll);
        assert_eq!(PeerWait::for_peers(1, 2, [(None, false), (None, false), (None, false)]), Poll);
        // A busy peer on every CPU: polling would take a CPU from one of them.
        assert_eq!(PeerWait::for_peers(1, 2, [(Some(2), false), (Some(2), false)]), Yield);
        assert_eq!(PeerWait::for_peers(3, 2, [(Some(1), false), (Some(2), false)]), Yield);
        assert_eq!(PeerWait::for_peers(0, 1, [(Some(1), false)]), Yield);
        // Sharing this CPU: yield to a plain child, sleep for Workers with children.
        assert_eq!(PeerWait::for_peers(1, 2, [(Some(1), false)]), Yield);
        assert_eq!(PeerWait::for_peers(1, 2, [(Some(1), true), (Some(1), false)]), Yield);
        assert_eq!(PeerWait::for_peers(1, 2, [(Some(1), true), (Some(1), true)]), Sleep);
        assert_eq!(PeerWait::for_peers(1, 2, []), Yield);
        assert_eq!(PeerWait::from_elsewhere(true), Poll);
        assert_eq!(PeerWait::from_elsewhere(false), Yield);
    }

    #[test]
    fn wait_for_peer_returns_when_rung_whichever_way_it_waits() {
        for how in [PeerWait::Poll, PeerWait::Yield, PeerWait::Sleep] {
            let bell = Arc::new(Doorbell::new());
            let seen = bell.seq();
            let ringer = ring_later(&bell, Duration::from_millis(20));
            let start = Instant::now();
            assert_eq!(bell.wait_for_peer(seen, Some(start + LONG), how), seen + 1, "{how:?}");
            assert!(start.elapsed() < LONG / 2, "{how:?}: woken by the ring, not by the deadline");
            ringer.join().unwrap();
            assert_eq!(bell.sleepers.load(Ordering::SeqCst), 0);
        }
    }

    #[test]
    fn wait_returns_at_once_when_already_rung() {
        let bell = Doorbell::new();
        let seen = bell.seq();
        bell.ring();
        assert_eq!(bell.wait(seen, None), seen + 1);
        assert_eq!(bell.sleep(seen, None), seen + 1);
    }

    #[test]
    fn timeout_returns_seen() {
        let bell = Doorbell::new();
        bell.ring();
        let seen = bell.seq();
        let start = Instant::now();
        assert_eq!(bell.wait(seen, Some(start + Duration::from_millis(30))), seen);
        assert!(start.elapsed() >= Duration::from_millis(30));
        let start = Instant::now();
        assert_eq!(bell.sleep(seen, Some(start + Duration::from_millis(30))), seen);
        assert!(start.elapsed() >= Duration::from_millis(30));
        // A deadline in the past returns at once.
        assert_eq!(bell.wait(seen, Some(Instant::now())), seen);
        assert_eq!(bell.sleep(seen, Some(Instant::now())), seen);
        assert_eq!(bell.sleepers.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn many_rings_many_waiters() {
        let bell = Arc::new(Doorbell::new());
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let bell = bell.clone();
                thread::spawn(move || {
                    let mut seen = bell.seq();
                    while seen < 200 {
                        seen = bell.wait(seen, Some(Instant::now() + LONG));
                    }
                    seen
                })
            })
            .collect();
        for _ in 0..200 {
            bell.ring();
            thread::yield_now();
        }
        for w in waiters {
            assert!(w.join().unwrap() >= 200);
        }
        assert_eq!(bell.sleepers.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn futex_wait_returns_when_word_differs() {
        let word = AtomicU32::new(5);
        let start = Instant::now();
        futex_wait(&word, 4, Some(LONG));
        assert!(start.elapsed() < LONG / 2);
        futex_wait(&word, 5, Some(Duration::from_millis(10)));
        assert!(start.elapsed() >= Duration::from_millis(10));
        futex_wake(&word, 1); // nobody waits: harmless
    }

    /// This thread's CPU time (user + system) in clock ticks, from `/proc/thread-self/stat`.
    fn thread_cpu_ticks() -> Option<u64> {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
        // Fields after the parenthesized command name start at field 3 (state); utime and stime
        // are fields 14 and 15.
        let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
        let utime: u64 = fields.next()?.parse().ok()?;
        let stime: u64 = fields.next()?.parse().ok()?;
        Some(utime + stime)
    }

    #[test]
    fn waiting_sleeps_instead_of_spinning() {
        let Some(before) = thread_cpu_ticks() else { return };
        let bell = Doorbell::new();
        let seen = bell.seq();
        bell.wait(seen, Some(Instant::now() + Duration::from_millis(500)));
        let used = thread_cpu_ticks().unwrap() - before;
        // A spinning wait would burn ~50 ticks (at 100 Hz); a sleeping one spends microseconds.
        assert!(used <= 10, "a 500 ms wait used {used} clock ticks of CPU");
    }
}
