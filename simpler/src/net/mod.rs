//! The network layer: the framed, authenticated protocol between a root (an L4 Worker) and the
//! L3 nodes it drives on other hosts.
//!
//! It sits beside `ipc` and `chip` (layer 6) and names only `error` below it. The message layer
//! (what TASK, CONTROL and COMPLETION bodies hold), the node server and the engine endpoint are
//! built on it.
//!
//! * [`frame`]: the frame header, [`frame::read_frame`] / [`frame::write_frame`], and the
//!   bounds-checked body reader and writer.
//! * [`auth`]: the [`ClusterKey`] and the HELLO handshake ([`auth::client_handshake`] on the
//!   root, [`auth::server_handshake`] on the node).
//! * [`transport`]: [`NodeAddr`], the TCP or Unix-domain [`transport::Stream`] and
//!   [`transport::Listener`].
//!
//! # Frames
//!
//! Every message is one frame: a 24-byte header, then `body_len` bytes of body. All integers
//! are little-endian.
//!
//! | offset | size | field | rule |
//! | --- | --- | --- | --- |
//! | 0 | 4 | magic | `b"SPNF"` |
//! | 4 | 2 | version | [`frame::PROTOCOL_VERSION`] (5); any other is refused, naming both |
//! | 6 | 2 | kind | a [`frame::FrameKind`] (1-8); any other is refused |
//! | 8 | 4 | flags | must be 0 (none are defined in version 5) |
//! | 12 | 8 | seq | the sender's sequence number; the layer above gives it meaning |
//! | 20 | 4 | body_len | at most the reader's limit |
//!
//! Kinds: 1 HELLO (the handshake, the only kind before it completes), 2 TASK (root to node),
//! 3 CONTROL (root to node), 4 CONTROL_REPLY (node to root), 5 COMPLETION (node to root),
//! 6 HEALTH, 7 SHUTDOWN, 8 CANCEL (root to node, on the health connection: cancel the task
//! whose TASK frame had this `seq`).
//!
//! Limits: a reader checks the whole header before it allocates or reads the body, so a
//! claimed length over the limit costs nothing. HELLO frames are read with
//! [`frame::MAX_HELLO_BODY`] (4 KiB); an authenticated session's frames with at most
//! [`frame::DEFAULT_MAX_BODY`] (1 GiB, below the 4 GiB the `u32` length can say). A clean end of
//! stream between frames is [`frame::FrameError::Closed`]; one inside a frame is
//! `Malformed("connection closed inside a frame (..)")`. A writer sends header and body in one
//! vectored write.
//!
//! # The handshake
//!
//! Every connection starts with it; the node speaks first. Each HELLO body begins with a step
//! byte; the nonces are 32 bytes from `/dev/urandom`, the MACs HMAC-SHA256 under the cluster key
//! (compared in constant time):
//!
//! | # | from | step | body after the step byte |
//! | --- | --- | --- | --- |
//! | 1 | node | 1 challenge | `version: u16`, `nonce_n` |
//! | 2 | root | 2 response | `version: u16`, `nonce_r`, `mac_r = HMAC(key, "simpler-hello-v1\|root" ‖ nonce_n ‖ nonce_r)` |
//! | 3 | node | 3 ready | `mac_n = HMAC(key, "simpler-hello-v1\|node" ‖ nonce_r ‖ nonce_n ‖ node_id ‖ sub_workers ‖ chips ‖ pid)`, `node_id: u64`, `sub_workers: u32`, `chips: u32`, `pid: u32` (the node's process id on its host) |
//! | - | either | 4 refused | nothing |
//!
//! The node checks `mac_r` before it says anything about itself, so a root without the key (or
//! one replaying a response recorded from an earlier session: the node's nonce differs) learns
//! only "refused"; the root checks `mac_n`, so a fake node without the key is refused too. The
//! "root" and "node" labels keep either proof from being reflected as the other's, and `mac_n`
//! covers the fields the node announces. The whole handshake must finish within
//! [`auth::HANDSHAKE_TIMEOUT`] (5 s) on each side (each read waits only for what is left of it,
//! so a peer trickling bytes cannot stretch it; the read timeout is cleared afterwards), and any
//! failure ends the connection. A node may answer a connection with "refused" at once (it takes
//! no root now); the root then says so rather than blaming the key.
//!
//! What the handshake does not do: frames after it are neither encrypted nor authenticated one
//! by one. It keeps out roots and nodes without the key; on a network where someone can alter
//! traffic, run the cluster over a tunnel (which is why a non-loopback listener needs
//! `allow_remote`).
//!
//! # Unsafe
//!
//! None: everything here is safe `std` (sockets, `/dev/urandom`) and the `hmac` crate.

pub(crate) mod auth;
pub(crate) mod frame;
pub(crate) mod transport;

pub use auth::ClusterKey;
pub use transport::NodeAddr;
