//! Random numbers: [`bytes`] from the kernel's random source (for secrets: handshake nonces,
//! session tokens), and [`u64`] for numbers that must only differ between uses (nonces of
//! buffer owners, engine numbers), which costs no system call.

use std::hash::BuildHasher;
use std::io::Read;

use crate::error::{Error, Result};

/// `N` bytes from `/dev/urandom`; `what` names their use in the error.
pub(crate) fn bytes<const N: usize>(what: &str) -> Result<[u8; N]> {
    let mut out = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut out))
        .map_err(|e| Error::os(&format!("reading /dev/urandom for {what}"), e))?;
    Ok(out)
}

/// A number that differs from every other this process or another one draws (std's hasher
/// keys, seeded per thread from the OS and stepped per call, over the pid and the time).
pub(crate) fn u64() -> u64 {
    std::collections::hash_map::RandomState::new().hash_one((std::process::id(), std::time::Instant::now()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn draws_differ() {
        assert_ne!(super::u64(), super::u64());
        assert_ne!(super::bytes::<16>("a test").unwrap(), super::bytes::<16>("a test").unwrap());
    }
}
