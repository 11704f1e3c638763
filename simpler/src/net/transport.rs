//! Addresses, connected streams and listeners: TCP or Unix-domain sockets behind one type.
//! [`NodeAddr`] is a TCP address or a Unix socket path; a [`Stream`] sets `TCP_NODELAY` and can
//! tell whether a whole frame waits in it ([`Stream::waiting_frame`], through `sys::sock`); a
//! [`Listener`] binds to loopback unless told otherwise (`allow_remote`).

use std::fmt;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::net::frame::{HEADER_LEN, read_frame_head};

/// Where a node listens and the root connects: `tcp:HOST:PORT` or `HOST:PORT` (TCP; `HOST` a
/// numeric IPv4 or bracketed IPv6 address, or `localhost`), or `unix:/path/to/socket`.
///
/// `Display` writes `HOST:PORT` (`localhost` as `127.0.0.1`) or `unix:PATH`, which parses back
/// to the same address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeAddr {
    /// A TCP address.
    Tcp(SocketAddr),
    /// The path of a Unix-domain socket.
    Unix(PathBuf),
}

impl NodeAddr {
    /// Parses `s` (forms above); `ErrorKind::InvalidArgument` naming `s` otherwise.
    pub fn parse(s: &str) -> Result<NodeAddr> {
        let bad = |why: &str| {
            Error::invalid(format!(
                "node address {s:?} {why} (expected \"HOST:PORT\", \"tcp:HOST:PORT\" or \"unix:/path\", \
                 HOST a numeric IPv4/IPv6 address or localhost)"
            ))
        };
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(bad("names no socket path"));
            }
            return Ok(NodeAddr::Unix(PathBuf::from(path)));
        }
        let hostport = s.strip_prefix("tcp:").unwrap_or(s);
        if let Ok(addr) = SocketAddr::from_str(hostport) {
            return Ok(NodeAddr::Tcp(addr));
        }
        let Some((host, port)) = hostport.rsplit_once(':') else {
            return Err(bad("has no port"));
        };
        let port: u16 = port.parse().map_err(|_| bad(&format!("has a bad port {port:?}")))?;
        if host.eq_ignore_ascii_case("localhost") {
            return Ok(NodeAddr::loopback(port));
        }
        if host.parse::<std::net::Ipv6Addr>().is_ok() {
            return Err(bad("has an IPv6 address without brackets ([ADDR]:PORT)"));
        }
        Err(bad(&format!("has host {host:?}, which is neither a numeric address nor localhost")))
    }

    /// `127.0.0.1:port`.
    pub fn loopback(port: u16) -> NodeAddr {
        NodeAddr::Tcp(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port))
    }

    /// True when only this host can reach the address: a loopback IP, or any Unix socket.
    pub fn is_loopback(&self) -> bool {
        match self {
            NodeAddr::Tcp(a) => a.ip().is_loopback(),
            NodeAddr::Unix(_) => true,
        }
    }
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeAddr::Tcp(a) => write!(f, "{a}"),
            NodeAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl FromStr for NodeAddr {
    type Err = Error;

    fn from_str(s: &str) -> Result<NodeAddr> {
        NodeAddr::parse(s)
    }
}

/// A connected stream to a peer: TCP or Unix-domain.
#[derive(Debug)]
pub(crate) enum Stream {
    /// A TCP connection (`TCP_NODELAY` on).
    Tcp(TcpStream),
    /// A Unix-domain connection.
    Unix(UnixStream),
}

impl Stream {
    /// Connects (TCP with `TCP_NODELAY` on), within `timeout` (which must not be zero). A Unix
    /// socket connects at once or fails (the timeout does not apply).
    pub(crate) fn connect(addr: &NodeAddr, timeout: Duration) -> io::Result<Stream> {
        match addr {
            NodeAddr::Tcp(a) => {
                let s = TcpStream::connect_timeout(a, timeout)?;
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }
            NodeAddr::Unix(p) => Ok(Stream::Unix(UnixStream::connect(p)?)),
        }
    }

    /// Another handle to the same connection (one thread reads while another writes).
    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    /// Sets (or with `None` clears) the timeout of each read; a read that runs out fails with
    /// `WouldBlock` or `TimedOut`.
    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }

    /// Whether a read would return at once (bytes, the end of the stream or an error wait): a
    /// `poll` with a zero timeout.
    pub(crate) fn readable_now(&self) -> bool {
        let mut fds = [nix::poll::PollFd::new(self.as_fd(), nix::poll::PollFlags::POLLIN)];
        !matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO), Ok(0))
    }

    /// Waits briefly for the peer's next frame while it is expected soon (a reply to a task in
    /// flight, the next task of a busy root): checks politely (yielding the CPU between short
    /// bursts) for up to `sys::futex::REMOTE_SPIN_NANOS`. Waking a thread asleep in `read` on
    /// another vCPU costs tens of microseconds in a guest; a thread that is still checking
    /// takes the bytes at once.
    pub(crate) fn await_briefly(&self) {
        // A check is a system call: one per burst of spins, so the yields between bursts still
        // come every microsecond or so.
        let mut checks = 0u32;
        crate::sys::futex::poll_politely(None, || {
            checks = checks.wrapping_add(1);
            checks % crate::sys::futex::WATCH_EVERY == 1 && self.readable_now()
        });
    }

    /// What waits to be read, without taking it or blocking: a look at the next frame through
    /// `scratch`, which must hold at least a frame header and bounds what counts as whole
    /// (frames longer than `scratch` never do). A whole frame can then be taken in one read
    /// (two or three fewer system calls than reading header, head and body apart; each read
    /// costs about a microsecond on loopback).
    pub(crate) fn waiting_frame(&self, scratch: &mut [u8]) -> Waiting {
        let waiting = match crate::sys::sock::peek(self.as_fd(), scratch) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Waiting::Nothing,
            Ok(n) if n >= HEADER_LEN => n,
            _ => return Waiting::Other, // part of a header, the end of the stream, an error
        };
        match read_frame_head(&mut &scratch[..HEADER_LEN], usize::MAX) {
            Ok(head) if head.len <= waiting - HEADER_LEN => Waiting::Whole(HEADER_LEN + head.len),
            _ => Waiting::Other, // malformed, or not all there (yet, or at all)
        }
    }

    /// Shuts both directions down (a blocked reader on any clone wakes with end of stream);
    /// errors are ignored.
    pub(crate) fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }

    /// The peer, for messages: `"127.0.0.1:5555"`, or `"unix:/path"` (the socket's path, seen
    /// from either end), `"unix:?"` when neither end has one.
    pub(crate) fn peer(&self) -> String {
        match self {
            Stream::Tcp(s) => s.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "tcp:?".to_string()),
            Stream::Unix(s) => {
                let named = |a: io::Result<std::os::unix::net::SocketAddr>| {
                    a.ok().and_then(|a| a.as_pathname().map(|p| format!("unix:{}", p.display())))
                };
                named(s.peer_addr()).or_else(|| named(s.local_addr())).unwrap_or_else(|| "unix:?".to_string())
            }
        }
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match *self {
            Stream::Tcp(s) => (&*s).read(buf),
            Stream::Unix(s) => (&*s).read(buf),
        }
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        match *self {
            Stream::Tcp(s) => (&*s).read_vectored(bufs),
            Stream::Unix(s) => (&*s).read_vectored(bufs),
        }
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match *self {
            Stream::Tcp(s) => (&*s).write(buf),
            Stream::Unix(s) => (&*s).write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match *self {
            Stream::Tcp(s) => (&*s).write_vectored(bufs),
            Stream::Unix(s) => (&*s).write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        (&*self).read_vectored(bufs)
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        (&*self).write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Tcp(s) => s.as_fd(),
            Stream::Unix(s) => s.as_fd(),
        }
    }
}

/// What [`Stream::waiting_frame`] finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiting {
    /// Nothing to read.
    Nothing,
    /// A whole frame of this many bytes (header included).
    Whole(usize),
    /// Something else: part of a frame (larger than the look, or still arriving), a malformed
    /// header, the end of the stream, an error. Reading it may block.
    Other,
}

/// A bound, listening socket.
#[derive(Debug)]
pub(crate) struct Listener {
    inner: ListenerInner,
    addr: NodeAddr,
}

#[derive(Debug)]
enum ListenerInner {
    Tcp(TcpListener),
    /// The socket, and the (device, inode) of the file it made, removed on drop if still there.
    Unix(UnixListener, Option<(u64, u64)>),
}

impl Listener {
    /// Binds `addr`. A TCP address that is not loopback is refused unless `allow_remote`
    /// (`InvalidArgument`). A Unix path: a stale socket file (nothing listens on it) is removed
    /// first; a live one, or a file that is not a socket, is refused (finding a socket live takes
    /// a connection to it, which its listener sees close at once). Port 0 picks one
    /// ([`Listener::local_addr`] tells which).
    pub(crate) fn bind(addr: &NodeAddr, allow_remote: bool) -> Result<Listener> {
        match addr {
            NodeAddr::Tcp(a) => {
                if !allow_remote && !a.ip().is_loopback() {
                    return Err(Error::invalid(format!(
                        "node address {addr} listens on a non-loopback address; pass allow_remote to \
                         accept roots from other hosts (the cluster key authenticates each connection, \
                         but the traffic is not encrypted: use a trusted network or a tunnel)"
                    )));
                }
                let l = TcpListener::bind(a)
                    .map_err(|e| Error::os(&format!("binding node address {addr}"), e))?;
                let bound = l.local_addr().map_err(|e| Error::os(&format!("node address {addr}"), e))?;
                Ok(Listener { inner: ListenerInner::Tcp(l), addr: NodeAddr::Tcp(bound) })
            }
            NodeAddr::Unix(path) => {
                if let Ok(meta) = std::fs::symlink_metadata(path) {
                    if !meta.file_type().is_socket() {
                        return Err(Error::invalid(format!(
                            "node address {addr}: {} exists and is not a socket",
                            path.display()
                        )));
                    }
                    match UnixStream::connect(path) {
                        Ok(_) => {
                            return Err(Error::invalid(format!(
                                "node address {addr}: another process already listens on it"
                            )));
                        }
                        // Nobody listens: a socket file left by a process that died.
                        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                            std::fs::remove_file(path)
                                .map_err(|e| Error::os(&format!("removing the stale socket {addr}"), e))?;
                        }
                        Err(_) => {}
                    }
                }
                let l = UnixListener::bind(path)
                    .map_err(|e| Error::os(&format!("binding node address {addr}"), e))?;
                let id = std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()));
                Ok(Listener { inner: ListenerInner::Unix(l, id), addr: addr.clone() })
            }
        }
    }

    /// The bound address (with the real port when 0 was asked).
    pub(crate) fn local_addr(&self) -> NodeAddr {
        self.addr.clone()
    }

    /// Accepts one connection (TCP with `TCP_NODELAY` on); blocks (unless
    /// [`Listener::set_nonblocking`]). Returns the stream and the peer's name for messages.
    pub(crate) fn accept(&self) -> io::Result<(Stream, String)> {
        match &self.inner {
            ListenerInner::Tcp(l) => {
                let (s, peer) = l.accept()?;
                s.set_nodelay(true)?;
                Ok((Stream::Tcp(s), peer.to_string()))
            }
            ListenerInner::Unix(l, _) => {
                let (s, _) = l.accept()?;
                let s = Stream::Unix(s);
                let peer = s.peer();
                Ok((s, peer))
            }
        }
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match &self.inner {
            ListenerInner::Tcp(l) => l.as_fd(),
            ListenerInner::Unix(l, _) => l.as_fd(),
        }
    }
}

impl Drop for Listener {
    /// Removes the socket file of a Unix listener, if it is still the one this listener made.
    fn drop(&mut self) {
        if let (ListenerInner::Unix(_, Some(id)), NodeAddr::Unix(path)) = (&self.inner, &self.addr)
            && std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == *id)
        {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::thread;

    use super::*;
    use crate::error::ErrorKind;
    use crate::net::frame::{FrameKind, read_frame, write_frame};

    #[test]
    fn addresses_parse_and_round_trip() {
        for (text, want) in [
            ("127.0.0.1:5555", NodeAddr::loopback(5555)),
            ("tcp:127.0.0.1:5555", NodeAddr::loopback(5555)),
            ("localhost:80", NodeAddr::loopback(80)),
            ("tcp:LOCALHOST:0", NodeAddr::loopback(0)),
            ("[::1]:7", NodeAddr::Tcp("[::1]:7".parse().unwrap())),
            ("0.0.0.0:1", NodeAddr::Tcp("0.0.0.0:1".parse().unwrap())),
            ("unix:/tmp/node.sock", NodeAddr::Unix("/tmp/node.sock".into())),
            ("unix:relative.sock", NodeAddr::Unix("relative.sock".into())),
        ] {
            let got = NodeAddr::parse(text).unwrap();
            assert_eq!(got, want, "{text}");
            assert_eq!(got.to_string().parse::<NodeAddr>().unwrap(), got, "{text}");
        }
        assert_eq!(NodeAddr::loopback(9).to_string(), "127.0.0.1:9");
        assert_eq!(NodeAddr::Unix("/a/b".into()).to_string(), "unix:/a/b");
        assert_eq!(NodeAddr::parse("[::1]:7").unwrap().to_string(), "[::1]:7");
        for bad in [
            "",
            "unix:",
            "127.0.0.1",
            "127.0.0.1:99999",
            "host.example:80",
            "::1:80",
            "tcp:",
            ":80",
            "1.2.3:4",
        ] {
            let err = NodeAddr::parse(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument);
            assert!(err.message().contains(&format!("{bad:?}")), "{}", err.message());
        }
        assert!(NodeAddr::loopback(1).is_loopback());
        assert!(NodeAddr::parse("[::1]:1").unwrap().is_loopback());
        assert!(NodeAddr::parse("unix:/x").unwrap().is_loopback());
        assert!(!NodeAddr::parse("0.0.0.0:1").unwrap().is_loopback());
        assert!(!NodeAddr::parse("10.1.2.3:1").unwrap().is_loopback());
    }

    #[test]
    fn a_non_loopback_address_binds_only_with_allow_remote() {
        let any = NodeAddr::parse("0.0.0.0:0").unwrap();
        let err = Listener::bind(&any, false).unwrap_err();
        assert!(err.kind() == crate::error::ErrorKind::InvalidArgument);
        assert!(
            err.message().contains("non-loopback") && err.message().contains("allow_remote"),
            "{}",
            err.message()
        );
        let err = Listener::bind(&NodeAddr::parse("0.0.0.0:1").unwrap(), false).unwrap_err();
        assert!(err.message().contains("0.0.0.0:1"));
        // With allow_remote it binds (port 0: the wildcard address is never a real remote here).
        let l = Listener::bind(&any, true).unwrap();
        assert!(matches!(l.local_addr(), NodeAddr::Tcp(a) if a.port() != 0));
    }

    #[test]
    fn tcp_loopback_connects_and_carries_frames() {
        let l = Listener::bind(&NodeAddr::loopback(0), false).unwrap();
        let addr = l.local_addr();
        let NodeAddr::Tcp(bound) = addr else { panic!("a TCP address") };
        assert_ne!(bound.port(), 0);
        let server = thread::spawn(move || {
            let (mut s, peer) = l.accept().unwrap();
            assert!(peer.starts_with("127.0.0.1:"), "{peer}");
            if let Stream::Tcp(t) = &s {
                assert!(t.nodelay().unwrap());
            }
            let f = read_frame(&mut s, 1024).unwrap();
            write_frame(&mut s, FrameKind::ControlReply, f.seq, &f.body).unwrap();
        });
        let mut c = Stream::connect(&addr, Duration::from_secs(5)).unwrap();
        assert_eq!(c.peer(), addr.to_string());
        write_frame(&mut c, FrameKind::Control, 5, b"ping").unwrap();
        let f = read_frame(&mut c, 1024).unwrap();
        assert_eq!((f.kind, f.seq, &f.body[..]), (FrameKind::ControlReply, 5, &b"ping"[..]));
        server.join().unwrap();
        let clone = c.try_clone().unwrap();
        clone.shutdown();
        assert!(matches!(read_frame(&mut c, 1024), Err(crate::net::frame::FrameError::Closed)));
    }

    fn socket_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("simpler-net-{}-{name}.sock", std::process::id()))
    }

    #[test]
    fn a_unix_listener_accepts_and_cleans_up() {
        let path = socket_path("accept");
        let addr = NodeAddr::Unix(path.clone());
        let l = Listener::bind(&addr, false).unwrap();
        assert_eq!(l.local_addr(), addr);
        let server = thread::spawn(move || {
            let (mut s, peer) = l.accept().unwrap();
            let f = read_frame(&mut s, 64).unwrap();
            write_frame(&mut &s, FrameKind::Completion, f.seq + 1, b"done").unwrap();
            (peer, l)
        });
        let mut c = Stream::connect(&addr, Duration::from_secs(1)).unwrap();
        assert_eq!(c.peer(), addr.to_string());
        write_frame(&mut c, FrameKind::Task, 1, b"work").unwrap();
        let f = read_frame(&mut &c, 64).unwrap();
        assert_eq!((f.kind, f.seq, &f.body[..]), (FrameKind::Completion, 2, &b"done"[..]));
        let (peer, l) = server.join().unwrap();
        assert_eq!(peer, addr.to_string());
        // A second listener on a live socket is refused, and the live one is untouched.
        let err = Listener::bind(&addr, false).unwrap_err();
        assert!(err.message().contains("already listens"), "{}", err.message());
        assert!(Stream::connect(&addr, Duration::from_secs(1)).is_ok());
        drop(l);
        assert!(!path.exists(), "the listener removes its socket file");
    }

    #[test]
    fn a_stale_unix_socket_is_replaced_and_a_plain_file_is_not() {
        let path = socket_path("stale");
        let _ = std::fs::remove_file(&path);
        // A socket file nobody listens on (its listener forgotten, as after a crash).
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let l = Listener::bind(&NodeAddr::Unix(path.clone()), false).unwrap();
        let c = Stream::connect(&l.local_addr(), Duration::from_secs(1)).unwrap();
        drop((c, l));
        std::fs::write(&path, b"not a socket").unwrap();
        let err = Listener::bind(&NodeAddr::Unix(path.clone()), false).unwrap_err();
        assert!(err.message().contains("not a socket"), "{}", err.message());
        assert_eq!(std::fs::read(&path).unwrap(), b"not a socket");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn connecting_to_nothing_fails() {
        let l = Listener::bind(&NodeAddr::loopback(0), false).unwrap();
        let addr = l.local_addr();
        drop(l);
        assert!(Stream::connect(&addr, Duration::from_secs(1)).is_err());
        assert!(Stream::connect(&NodeAddr::Unix(socket_path("none")), Duration::from_secs(1)).is_err());
    }

    #[test]
    fn a_frame_counts_as_waiting_whole_only_when_all_of_it_is_there_and_fits_the_look() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut a, b) = (Stream::Unix(a), Stream::Unix(b));
        let mut look = [0u8; 64];
        assert_eq!(b.waiting_frame(&mut look), Waiting::Nothing);
        let mut frame = Vec::new();
        write_frame(&mut frame, FrameKind::Control, 3, &[9u8; 10]).unwrap();
        a.write_all(&frame[..20]).unwrap(); // part of the header
        assert_eq!(b.waiting_frame(&mut look), Waiting::Other);
        a.write_all(&frame[20..30]).unwrap(); // the header and part of the body
        assert_eq!(b.waiting_frame(&mut look), Waiting::Other);
        a.write_all(&frame[30..]).unwrap();
        assert_eq!(b.waiting_frame(&mut look), Waiting::Whole(frame.len()));
        assert_eq!(b.waiting_frame(&mut look), Waiting::Whole(frame.len()), "looking takes nothing");
        let got = read_frame(&mut &b, 64).unwrap();
        assert_eq!((got.kind, got.seq, got.body), (FrameKind::Control, 3, vec![9u8; 10]));
        // A whole frame longer than the look is not one a look can vouch for.
        write_frame(&mut a, FrameKind::Control, 4, &[1u8; 100]).unwrap();
        assert_eq!(b.waiting_frame(&mut look), Waiting::Other);
        assert_eq!(read_frame(&mut &b, 200).unwrap().body.len(), 100);
        drop(a);
        assert_eq!(b.waiting_frame(&mut look), Waiting::Other, "the end of the stream");
    }
}
