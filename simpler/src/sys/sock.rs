//! Looking at the bytes waiting in a stream socket without taking them: [`peek`] (`recv` with
//! `MSG_PEEK | MSG_DONTWAIT`), so a driver reads a node's reply only when it is whole there.
//!
//! # Rules
//!
//! * **K1 (the buffer).** `recv(2)` is given the address and length of a `&mut [u8]` borrowed
//!   for the whole call, so the kernel writes at most that many bytes into memory the caller
//!   owns exclusively.
//! * **K2 (the descriptor).** The descriptor is a `BorrowedFd`, open for the whole call.

#![expect(
    unsafe_code,
    reason = "recv(2) with MSG_PEEK has no safe wrapper in std or in nix's enabled features; rules K1-K2"
)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Copies the bytes waiting in the stream socket `fd` into `buf`, without taking them and
/// without blocking: how many were copied (at most `buf.len()`), 0 at the end of the stream,
/// and an error of kind `WouldBlock` when none are waiting.
pub(crate) fn peek(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: rule K1 — `buf` is borrowed mutably for the call and its length bounds the
        // write; rule K2 — `fd` is open while borrowed.
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn peek_leaves_the_bytes_and_never_blocks() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(super::peek(b.as_fd(), &mut buf).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
        a.write_all(b"hello").unwrap();
        assert_eq!(super::peek(b.as_fd(), &mut buf).unwrap(), 5);
        assert_eq!(super::peek(b.as_fd(), &mut buf[..2]).unwrap(), 2);
        let mut got = [0u8; 5];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");
        drop(a);
        assert_eq!(super::peek(b.as_fd(), &mut buf).unwrap(), 0);
    }
}
