//! The health connection of a session: each session is two authenticated connections between
//! the same root and node, the *session* connection (TASK, CONTROL and their answers, with the
//! tensors' bytes) and the *health* connection (the node's heartbeats, nothing else), so that
//! no heartbeat ever waits behind a large TASK or COMPLETION and a slow transfer is never taken
//! for silence.
//!
//! Pairing: whichever side opened the session connection (the root, or a launched node that
//! connects out to its root) sends, as the first frame after the handshake, a HEALTH frame
//! carrying a fresh random [`Token`]; it then opens the health connection, authenticates it
//! the same way, and sends the same token as its first frame there. A connection presenting
//! another token (or none) is refused; so is a session whose health connection does not come
//! within the connect timeout.

use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};
use crate::net::frame::{FrameKind, read_frame, write_frame};
use crate::net::transport::Stream;

/// The length of a pairing token.
pub(crate) const TOKEN_LEN: usize = 16;

/// What pairs a health connection with its session connection.
pub(crate) type Token = [u8; TOKEN_LEN];

/// A fresh token from the kernel's random source.
pub(crate) fn token() -> Result<Token> {
    crate::sys::random::bytes("a session token")
}

/// Sends `token` as the first frame of an authenticated connection.
pub(crate) fn announce(stream: &mut Stream, token: &Token, peer: &str) -> Result<()> {
    write_frame(stream, FrameKind::Health, 0, token).map_err(|e| {
        Error::new(ErrorKind::WorkerDied, format!("{peer}: the connection failed after the handshake: {e}"))
    })
}

/// Reads the token an authenticated connection must send first, waiting at most `timeout`.
pub(crate) fn read_token(stream: &mut Stream, timeout: Duration, peer: &str) -> Result<Token> {
    stream.set_read_timeout(Some(timeout)).map_err(|e| Error::os("setting a read timeout", e))?;
    let frame = read_frame(stream, TOKEN_LEN);
    let _ = stream.set_read_timeout(None);
    let refused = |what: String| Error::new(ErrorKind::InvalidArgument, format!("{peer}: {what}"));
    match frame {
        Ok(f) if f.kind == FrameKind::Health && f.body.len() == TOKEN_LEN => {
            Ok(f.body.try_into().expect("TOKEN_LEN bytes"))
        }
        Ok(f) => Err(refused(format!(
            "expected a session token first, got a {:?} frame of {} bytes",
            f.kind,
            f.body.len()
        ))),
        Err(e) if e.is_timeout() => {
            Err(Error::new(ErrorKind::Timeout, format!("{peer}: no session token within {timeout:?}")))
        }
        Err(e) => Err(refused(format!("expected a session token first: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::transport::{Listener, NodeAddr};

    fn pair() -> (Stream, Stream) {
        let l = Listener::bind(&NodeAddr::loopback(0), false).unwrap();
        let c = Stream::connect(&l.local_addr(), Duration::from_secs(5)).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    #[test]
    fn a_token_is_read_back_and_anything_else_first_is_refused() {
        let (mut a, mut b) = pair();
        let t = token().unwrap();
        assert_ne!(t, token().unwrap());
        announce(&mut a, &t, "peer").unwrap();
        assert_eq!(read_token(&mut b, Duration::from_secs(5), "peer").unwrap(), t);
        // A TASK first, a short token, or silence: refused, naming the peer.
        write_frame(&mut a, FrameKind::Task, 0, &t).unwrap();
        let e = read_token(&mut b, Duration::from_secs(5), "10.0.0.9:1").unwrap_err();
        assert!(e.message().contains("10.0.0.9:1") && e.message().contains("Task"), "{e}");
        write_frame(&mut a, FrameKind::Health, 0, &t[..4]).unwrap();
        assert!(read_token(&mut b, Duration::from_secs(5), "peer").is_err());
        let e = read_token(&mut b, Duration::from_millis(50), "peer").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout);
    }
}
