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

#[cfg(test)]
mod tests {
    use super::*;

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
