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

    /// Connects as [`Stream::connect`] does, but gives up (`Ok(None)`) as soon as a message
    /// comes on `cancel`. A blocking connect cannot be interrupted (a TCP one to a host off the
    /// network, a Unix one to a listener whose queue is full), so it runs on a thread of its
    /// own, which ends by its own timeout (TCP) or the listener's end and drops what it made
    /// once abandoned. With every sender of `cancel` gone, it waits for the connect alone.
    pub(crate) fn connect_cancellable(
        addr: &NodeAddr,
        timeout: Duration,
        cancel: &crossbeam_channel::Receiver<()>,
    ) -> io::Result<Option<Stream>> {
        let (tx, made) = crossbeam_channel::bounded(1);
        let at = addr.clone();
        std::thread::Builder::new().name("simpler-connect".into()).spawn(move || {
            let _ = tx.send(Stream::connect(&at, timeout));
        })?;
        let lost = || io::Error::other("the connecting thread ended without a result");
        crossbeam_channel::select! {
            recv(made) -> r => r.unwrap_or_else(|_| Err(lost())).map(Some),
            recv(cancel) -> m => match m {
                Ok(()) => Ok(None),
                Err(_) => made.recv().unwrap_or_else(|_| Err(lost())).map(Some),
            },
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

    /// This end's address, for a TCP connection.
    pub(crate) fn local_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Stream::Tcp(s) => s.local_addr().ok(),
            Stream::Unix(_) => None,
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
mod tests;
