//! One clock for every process on the host: `CLOCK_MONOTONIC` in nanoseconds. Task records of
//! a run's timeline are taken with it, so times taken by a parent and by its children line up.

/// Nanoseconds of `CLOCK_MONOTONIC` (since an unspecified start, the same for every process
/// of this host; it never goes back). Read through the vDSO: tens of nanoseconds.
pub(crate) fn monotonic_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => (t.tv_sec() as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec() as u64),
        Err(_) => 0, // CLOCK_MONOTONIC is always there on Linux
    }
}

/// The instant `d` from now, or about a century from now when `d` is longer than `Instant`
/// can count (`Duration::MAX` as "wait for ever"): every user-given timeout and deadline goes
/// through this, so none overflows.
pub(crate) fn after(d: std::time::Duration) -> std::time::Instant {
    const CENTURY: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 24 * 3600);
    let now = std::time::Instant::now();
    now.checked_add(d.min(CENTURY)).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_after_any_duration_is_an_instant_to_come() {
        let now = std::time::Instant::now();
        assert!(after(std::time::Duration::MAX) > now + std::time::Duration::from_secs(3600 * 24 * 365));
        assert!(after(std::time::Duration::ZERO) >= now);
        let soon = after(std::time::Duration::from_millis(10));
        assert!(
            soon >= now + std::time::Duration::from_millis(10)
                && soon < now + std::time::Duration::from_secs(10)
        );
    }

    #[test]
    fn the_clock_moves_forward_and_agrees_with_instant() {
        let (a, i) = (monotonic_ns(), std::time::Instant::now());
        while i.elapsed() < std::time::Duration::from_millis(5) {
            std::hint::spin_loop();
        }
        let (b, j) = (monotonic_ns(), std::time::Instant::now());
        let took = (b - a) as i128 - j.duration_since(i).as_nanos() as i128;
        assert!(a > 0 && b > a);
        assert!(took.abs() < 1_000_000, "the two clocks differ by {took} ns over 5 ms");
    }
}
