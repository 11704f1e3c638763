//! Starting the root and its nodes with a cluster launcher (`mpirun`, `srun`): rank 0 is the
//! root, every other rank a node that connects to the root's address.
//!
//! [`Launch`] reads the rank, the size and the root's address from the launcher's environment
//! and `SIMPLER_ROOT` (no MPI library). `accept_ranks` is the root's side: it listens at the
//! root address and authenticates each rank's two connections (session and health, paired by
//! the rank's token), which the rank opens (`Node::serve_launch`); the HELLO's node id is the
//! rank. The handshake does not care which side connected. A job has at most 4096 ranks. CI
//! runs the `remote_nodes` example as three ranks under `mpirun` (`.ci/run`).

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};
use crate::net::auth::{ClusterKey, NodeHello, client_handshake};
use crate::net::transport::{Listener, NodeAddr, Stream};
use crate::worker::remote::lane;

/// Where the root of a launched job listens: `SIMPLER_ROOT=HOST:PORT`, the same in every rank.
pub(crate) const ROOT_ENV: &str = "SIMPLER_ROOT";

/// The environment variables launchers set: (rank, size). Open MPI, then PMI (MPICH, Intel MPI,
/// Slurm's PMI), then Slurm.
const LAUNCHERS: [(&str, &str); 3] = [
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
];

/// The most ranks a launched job may have: the root opens two connections and runs three
/// threads for each node.
const MAX_RANKS: u32 = 4096;

/// How a cluster launcher started this process: its rank, the job's size, and where the root
/// (rank 0) listens. The crate links no MPI library: the rank and size come from the
/// launcher's environment (`OMPI_COMM_WORLD_RANK` / `_SIZE` under `mpirun`, `PMI_RANK` /
/// `PMI_SIZE`, `SLURM_PROCID` / `SLURM_NTASKS` under `srun`), the root's address from
/// `SIMPLER_ROOT`, which the user passes to every rank (`mpirun -x SIMPLER_ROOT=...`).
///
/// Rank 0 builds the L4 Worker and calls
/// [`WorkerBuilder::launched_workers`](crate::WorkerBuilder::launched_workers); every other rank
/// builds its L3 Worker and serves it with [`Node::serve_launch`](crate::remote::Node::serve_launch),
/// connecting to the root.
///
/// ```
/// use simpler::{remote::Launch, remote::NodeAddr};
///
/// let launch = Launch::new(2, 3, NodeAddr::parse("127.0.0.1:7500")?)?;
/// assert_eq!((launch.rank(), launch.size(), launch.is_root()), (2, 3, false));
/// assert!(Launch::new(3, 3, NodeAddr::loopback(7500)).is_err()); // rank past the size
/// # Ok::<(), simpler::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    rank: u32,
    size: u32,
    root: NodeAddr,
}

impl Launch {
    /// Rank `rank` of a job of `size` ranks whose root listens at `root`. A rank past the
    /// size, or a size over 4096 (one root's sessions), is an `InvalidArgument` error.
    ///
    /// ```
    /// let l = simpler::remote::Launch::new(0, 2, simpler::remote::NodeAddr::loopback(7501))?;
    /// assert!(l.is_root());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn new(rank: u32, size: u32, root: NodeAddr) -> Result<Launch> {
        if rank >= size {
            return Err(Error::invalid(format!("Launch: rank {rank} of a job of {size} ranks")));
        }
        if size > MAX_RANKS {
            return Err(Error::invalid(format!(
                "Launch: a job of {size} ranks; one root drives at most {MAX_RANKS} nodes (each holds two connections and three threads of the root)"
            )));
        }
        Ok(Launch { rank, size, root })
    }

    /// The launch this process is part of, read from the launcher's environment; `None` when no
    /// launcher started it. An error when a launcher did but `SIMPLER_ROOT` is missing or not an
    /// address, or the rank and size are not numbers.
    ///
    /// ```
    /// // Outside mpirun / srun there is no launch.
    /// # if std::env::var_os("OMPI_COMM_WORLD_RANK").is_none() && std::env::var_os("PMI_RANK").is_none() && std::env::var_os("SLURM_PROCID").is_none() {
    /// assert!(simpler::remote::Launch::from_env()?.is_none());
    /// # }
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn from_env() -> Result<Option<Launch>> {
        Launch::from_vars(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Launch::from_env) over any source of variables (for tests).
    pub(crate) fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Launch>> {
        let Some((rank_var, rank, size_var, size)) =
            LAUNCHERS.iter().find_map(|&(r, s)| var(r).map(|rank| (r, rank, s, var(s))))
        else {
            return Ok(None);
        };
        let number = |name: &str, v: &str| {
            v.trim()
                .parse::<u32>()
                .map_err(|_| Error::invalid(format!("Launch: {name}={v:?} is not a number")))
        };
        let rank = number(rank_var, &rank)?;
        let size = match size {
            Some(s) => number(size_var, &s)?,
            None => return Err(Error::invalid(format!("Launch: {rank_var} is set but {size_var} is not"))),
        };
        let root = var(ROOT_ENV).ok_or_else(|| {
            Error::invalid(format!(
                "Launch: started by a launcher ({rank_var}={rank}) but {ROOT_ENV} is not set; pass the root's HOST:PORT to every rank (mpirun -x {ROOT_ENV}=...)"
            ))
        })?;
        let root = NodeAddr::parse(&root).map_err(|e| e.context(ROOT_ENV))?;
        Launch::new(rank, size, root).map(Some)
    }

    /// This process's rank (0 is the root).
    ///
    /// ```
    /// assert_eq!(simpler::remote::Launch::new(1, 2, simpler::remote::NodeAddr::loopback(7502))?.rank(), 1);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The number of ranks (the root and its nodes).
    ///
    /// ```
    /// assert_eq!(simpler::remote::Launch::new(1, 2, simpler::remote::NodeAddr::loopback(7503))?.size(), 2);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Where the root listens.
    ///
    /// ```
    /// let l = simpler::remote::Launch::new(1, 2, simpler::remote::NodeAddr::loopback(7504))?;
    /// assert_eq!(l.root().to_string(), "127.0.0.1:7504");
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn root(&self) -> &NodeAddr {
        &self.root
    }

    /// Whether this process is the root (rank 0).
    ///
    /// ```
    /// assert!(simpler::remote::Launch::new(0, 4, simpler::remote::NodeAddr::loopback(7505))?.is_root());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn is_root(&self) -> bool {
        self.rank == 0
    }
}

/// A launched node's connections as the root accepted them: session, health, HELLO, address.
pub(crate) type Accepted = (Stream, Stream, NodeHello, String);

/// The root's side of a launch: listens at `root`, accepts the nodes of `ranks`, authenticates
/// each one's session and health connections (paired by their token, `lane`), and returns
/// them with each rank's HELLO, within `timeout`.
pub(crate) fn accept_ranks(
    root: &NodeAddr,
    ranks: &[u32],
    key: &ClusterKey,
    timeout: Duration,
) -> Result<HashMap<u32, Accepted>> {
    let listener = Listener::bind(root, true)?;
    let deadline = crate::sys::clock::after(timeout);
    let mut got: HashMap<u32, Accepted> = HashMap::new();
    // Ranks whose session connection came, waiting for their health connection.
    let mut pending: HashMap<u32, (Stream, NodeHello, String, lane::Token)> = HashMap::new();
    while got.len() < ranks.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let missing: Vec<u32> = ranks.iter().copied().filter(|r| !got.contains_key(r)).collect();
        let timed_out = || {
            Error::new(
                ErrorKind::Timeout,
                format!(
                    "Worker.init: ranks {missing:?} did not connect to the root at {root} within {timeout:?}"
                ),
            )
        };
        if left.is_zero() {
            return Err(timed_out());
        }
        let mut fds = [nix::poll::PollFd::new(listener.as_fd(), nix::poll::PollFlags::POLLIN)];
        let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
        if nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(ms)).map_err(|e| Error::os("poll", e))? == 0
        {
            continue;
        }
        let (mut stream, peer) = listener.accept().map_err(|e| Error::os("accepting a node", e))?;
        let accepted = client_handshake(&mut stream, key, &peer).and_then(|hello| {
            let rank = hello.node_id as u32;
            if !ranks.contains(&rank) || got.contains_key(&rank) {
                return Err(Error::invalid(format!("a node claiming rank {rank}, which is not expected")));
            }
            let token = lane::read_token(&mut stream, left.min(Duration::from_secs(5)), &peer)?;
            Ok((rank, hello, token))
        });
        match accepted {
            Ok((rank, hello, token)) => match pending.remove(&rank) {
                // The rank's second connection: its health connection, if the token matches.
                Some((session, first, at, t)) if t == token => {
                    got.insert(rank, (session, stream, first, at));
                }
                Some(p) => {
                    tracing::warn!(target: "simpler::remote", peer = %peer, "refused a second connection of rank {rank}: not its session's token");
                    pending.insert(rank, p);
                    stream.shutdown();
                }
                None => {
                    pending.insert(rank, (stream, hello, peer, token));
                }
            },
            Err(e) => {
                tracing::warn!(target: "simpler::remote", peer = %peer, "refused a connection: {e}");
                stream.shutdown();
            }
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
    }

    #[test]
    fn a_launch_is_read_from_each_launchers_variables() {
        assert_eq!(Launch::from_vars(vars(&[])).unwrap(), None);
        let ompi = vars(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("SIMPLER_ROOT", "127.0.0.1:7600"),
        ]);
        assert_eq!(
            Launch::from_vars(ompi).unwrap().unwrap(),
            Launch::new(2, 3, NodeAddr::loopback(7600)).unwrap()
        );
        let slurm = vars(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4"), ("SIMPLER_ROOT", "127.0.0.1:7601")]);
        assert!(Launch::from_vars(slurm).unwrap().unwrap().is_root());
        let pmi = vars(&[("PMI_RANK", "1"), ("PMI_SIZE", "2"), ("SIMPLER_ROOT", "127.0.0.1:7602")]);
        assert_eq!(Launch::from_vars(pmi).unwrap().unwrap().rank(), 1);
    }

    #[test]
    fn a_launch_without_a_root_address_or_with_garbage_is_a_named_error() {
        let no_root = vars(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2")]);
        assert!(Launch::from_vars(no_root).unwrap_err().message().contains("SIMPLER_ROOT"));
        let bad = vars(&[("SLURM_PROCID", "x"), ("SLURM_NTASKS", "2"), ("SIMPLER_ROOT", "127.0.0.1:1")]);
        assert!(Launch::from_vars(bad).unwrap_err().message().contains("SLURM_PROCID"));
        let past = vars(&[("PMI_RANK", "5"), ("PMI_SIZE", "2"), ("SIMPLER_ROOT", "127.0.0.1:1")]);
        assert!(Launch::from_vars(past).unwrap_err().message().contains("rank 5"));
        let no_size = vars(&[("PMI_RANK", "0"), ("SIMPLER_ROOT", "127.0.0.1:1")]);
        assert!(Launch::from_vars(no_size).unwrap_err().message().contains("PMI_SIZE"));
        // A size no root could drive is refused before anything is made for its ranks.
        let huge = vars(&[("PMI_RANK", "0"), ("PMI_SIZE", "4000000000"), ("SIMPLER_ROOT", "127.0.0.1:1")]);
        let err = Launch::from_vars(huge).unwrap_err();
        assert!(err.message().contains("4000000000 ranks") && err.message().contains("4096"), "{err}");
        assert!(
            Launch::from_vars(vars(&[
                ("PMI_RANK", "0"),
                ("PMI_SIZE", "4096"),
                ("SIMPLER_ROOT", "127.0.0.1:1")
            ]))
            .is_ok()
        );
    }
}
