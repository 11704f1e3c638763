//! Sessions of the size their root asks for ([`Node::sized`](super::Node::sized)).
//!
//! A sized node has no L3 Worker of its own: it has a function that makes one of a given size,
//! and [`SessionLimits`] (the most one session may ask, what a session that asks nothing gets,
//! and the most all its sessions may hold at once). Each session's Worker is made when its root
//! says its size (the SIZE control, the first a root sends), started there, and closed when the
//! session ends; its share of the limits ([`Share`]) is given back only after the Worker closed,
//! so the node never holds more processes than its limits say. A node with one Worker
//! ([`Node::new`](super::Node::new)) lends that Worker to every session
//! ([`SessionWorker::Shared`]).

use std::sync::Mutex;

use crate::error::{Error, ErrorKind, Result};
use crate::level::Level;
use crate::sys::sync;
use crate::worker::remote::wire::{refusal, refusal_of};
use crate::worker::{StartMethod, Worker};

/// What makes a sized node's session Workers: SUB workers, chips.
pub(crate) type MakeWorker = Box<dyn Fn(u32, u32) -> Result<Worker> + Send + Sync>;

/// A session's size: the SUB workers and chips of its L3 Worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Size {
    pub(crate) sub_workers: u32,
    pub(crate) chips: u32,
}

impl Size {
    /// The size of `worker`.
    pub(crate) fn of(worker: &Worker) -> Size {
        Size { sub_workers: worker.sub_workers() as u32, chips: worker.chips() as u32 }
    }

    pub(crate) fn fits(self, within: Size) -> bool {
        self.sub_workers <= within.sub_workers && self.chips <= within.chips
    }
}

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = |n: u32| if n == 1 { "" } else { "s" };
        write!(
            f,
            "{} SUB worker{} and {} chip{}",
            self.sub_workers,
            s(self.sub_workers),
            self.chips,
            s(self.chips)
        )
    }
}

/// What a sized node ([`Node::sized`](crate::remote::Node::sized)) gives its sessions: the SUB
/// workers and chips all its sessions may hold at once, the most one session may ask for, and
/// what a session whose root asks for nothing gets.
///
/// A root asks with [`RemoteWorker::requires`](crate::remote::RemoteWorker::requires). One that
/// asks more than a session may have is refused at `init` with
/// [`ErrorKind::InvalidArgument`]; one that asks more than the node has left while other
/// sessions run, with [`ErrorKind::ResourceExhausted`], naming what is held.
///
/// ```
/// use simpler::remote::SessionLimits;
///
/// // 8 SUB workers and 2 chips in all; a session gets at most 4 and 1, and 2 and 0 unasked.
/// let limits = SessionLimits::new(8, 2).per_session(4, 1).default_size(2, 0);
/// assert_eq!(limits.per_session_max(), (4, 1));
/// assert_eq!(limits.total(), (8, 2));
/// assert_eq!(limits.unasked(), (2, 0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    total: Size,
    per_session: Size,
    default: Size,
}

impl SessionLimits {
    /// The SUB workers and chips the node's sessions may hold at once, all of them together;
    /// one session may also ask for all of it, and gets all of it when it asks for nothing,
    /// until [`per_session`](Self::per_session) and [`default_size`](Self::default_size) say
    /// otherwise.
    ///
    /// ```
    /// let limits = simpler::remote::SessionLimits::new(4, 0);
    /// assert_eq!(limits.unasked(), (4, 0));
    /// ```
    pub fn new(sub_workers: u32, chips: u32) -> SessionLimits {
        let all = Size { sub_workers, chips };
        SessionLimits { total: all, per_session: all, default: all }
    }

    /// The most one session may ask for (it is also what the node announces as its size).
    /// A default size above it comes down to it.
    ///
    /// ```
    /// let limits = simpler::remote::SessionLimits::new(8, 2).per_session(2, 1);
    /// assert_eq!((limits.per_session_max(), limits.unasked()), ((2, 1), (2, 1)));
    /// ```
    pub fn per_session(mut self, sub_workers: u32, chips: u32) -> SessionLimits {
        self.per_session = Size { sub_workers, chips };
        self.default = Size {
            sub_workers: self.default.sub_workers.min(sub_workers),
            chips: self.default.chips.min(chips),
        };
        self
    }

    /// What a session whose root asks for no size gets (`RemoteWorker::requires` not called,
    /// or called with 0 and 0).
    ///
    /// ```
    /// let limits = simpler::remote::SessionLimits::new(8, 2).default_size(1, 0);
    /// assert_eq!(limits.unasked(), (1, 0));
    /// ```
    pub fn default_size(mut self, sub_workers: u32, chips: u32) -> SessionLimits {
        self.default = Size { sub_workers, chips };
        self
    }

    /// All sessions together: (SUB workers, chips).
    ///
    /// ```
    /// assert_eq!(simpler::remote::SessionLimits::new(3, 1).total(), (3, 1));
    /// ```
    pub fn total(&self) -> (u32, u32) {
        (self.total.sub_workers, self.total.chips)
    }

    /// One session at most: (SUB workers, chips).
    ///
    /// ```
    /// assert_eq!(simpler::remote::SessionLimits::new(3, 1).per_session(1, 1).per_session_max(), (1, 1));
    /// ```
    pub fn per_session_max(&self) -> (u32, u32) {
        (self.per_session.sub_workers, self.per_session.chips)
    }

    /// What a session that asks for nothing gets: (SUB workers, chips).
    ///
    /// ```
    /// assert_eq!(simpler::remote::SessionLimits::new(3, 1).default_size(2, 0).unasked(), (2, 0));
    /// ```
    pub fn unasked(&self) -> (u32, u32) {
        (self.default.sub_workers, self.default.chips)
    }

    /// Refuses limits that contradict each other.
    pub(crate) fn check(&self) -> Result<()> {
        if !self.per_session.fits(self.total) {
            return Err(Error::invalid(format!(
                "SessionLimits: a session may not have more ({}) than the node has ({})",
                self.per_session, self.total
            )));
        }
        if !self.default.fits(self.per_session) {
            return Err(Error::invalid(format!(
                "SessionLimits: the default size ({}) is more than a session may have ({})",
                self.default, self.per_session
            )));
        }
        Ok(())
    }
}

/// A sized node's Workers: what makes them, its limits, and what its sessions hold now.
pub(crate) struct Sized {
    make: MakeWorker,
    limits: SessionLimits,
    held: Mutex<(Size, usize)>,
}

impl Sized {
    pub(crate) fn new(limits: SessionLimits, make: MakeWorker) -> Result<Sized> {
        limits.check()?;
        Ok(Sized { make, limits, held: Mutex::new((Size::default(), 0)) })
    }

    pub(crate) fn limits(&self) -> &SessionLimits {
        &self.limits
    }

    /// A started Worker of `asked` (zero: the default size) for one session of the node
    /// `node`, with its share of the limits. An `Err` says why, starting `LIMIT:` when a session
    /// may not have that much, `RESOURCE:` when the node has too little left (or its Worker
    /// could not get what it needs).
    pub(crate) fn start(&self, asked: Size, node: &str) -> std::result::Result<SessionWorker<'_>, String> {
        let size = if asked == Size::default() { self.limits.default } else { asked };
        if !size.fits(self.limits.per_session) {
            return Err(refusal(
                ErrorKind::InvalidArgument,
                format_args!(
                    "the node at {node} gives a session at most {}; this root asked for {size}",
                    self.limits.per_session
                ),
            ));
        }
        let share = {
            let mut held = sync::lock(&self.held);
            // Past `u32::MAX` (limits of `u32::MAX` for "unlimited") does not fit either.
            let after = match (
                held.0.sub_workers.checked_add(size.sub_workers),
                held.0.chips.checked_add(size.chips),
            ) {
                (Some(sub_workers), Some(chips)) => Some(Size { sub_workers, chips }),
                _ => None,
            };
            let Some(after) = after.filter(|a| a.fits(self.limits.total)) else {
                return Err(refusal(
                    ErrorKind::ResourceExhausted,
                    format_args!(
                        "the node at {node} has {} in all and its {} other session{} hold {}; this root asked for {size}; try again once one ends",
                        self.limits.total,
                        held.1,
                        if held.1 == 1 { "" } else { "s" },
                        held.0
                    ),
                ));
            };
            *held = (after, held.1 + 1);
            Share { book: &self.held, size }
        };
        // A panic in the node's function fails this session alone.
        let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            (self.make)(size.sub_workers, size.chips)
        }));
        let mut worker = match made {
            Ok(made) => made.map_err(|e| {
                refusal_of(&e, format_args!("the node at {node} could not make a Worker of {size}: {e}"))
            })?,
            Err(_) => {
                return Err(format!(
                    "the node at {node} could not make a Worker of {size}: its function panicked"
                ));
            }
        };
        let made = Size::of(&worker);
        let wrong = if worker.level() != Level::Node {
            Some(format!("an {} Worker, not an L3 one", worker.level()))
        } else if worker.is_ready() {
            Some("a Worker started already (the node starts it)".to_string())
        } else if made != size {
            Some(format!("a Worker of {made}"))
        } else if worker.start_method() == StartMethod::Fork {
            Some("a Worker that starts its children by fork, which a node serving other sessions' threads must not do (StartMethod::Exec)".to_string())
        } else {
            None
        };
        if let Some(wrong) = wrong {
            return Err(format!("the node at {node} was asked for a Worker of {size} and made {wrong}"));
        }
        worker.init().map_err(|e| {
            refusal_of(&e, format_args!("the node at {node} could not start a Worker of {size}: {e}"))
        })?;
        Ok(SessionWorker::Own { worker: Box::new(worker), _share: share })
    }
}

/// A session's share of its sized node's limits: given back when it drops.
pub(crate) struct Share<'a> {
    book: &'a Mutex<(Size, usize)>,
    size: Size,
}

impl Drop for Share<'_> {
    fn drop(&mut self) {
        let mut held = sync::lock(self.book);
        held.0.sub_workers -= self.size.sub_workers;
        held.0.chips -= self.size.chips;
        held.1 -= 1;
    }
}

/// The L3 Worker a session's tasks run on.
pub(crate) enum SessionWorker<'a> {
    /// The node's one Worker, lent to each of its sessions.
    Shared(&'a Worker),
    /// A Worker of the session's own, of the size its root asked for; closed (its children
    /// reaped) before its share is given back, whatever the fields' order ([`Drop`]).
    Own { worker: Box<Worker>, _share: Share<'a> },
}

impl Drop for SessionWorker<'_> {
    fn drop(&mut self) {
        if let SessionWorker::Own { worker, .. } = self
            && let Err(e) = worker.close()
        {
            tracing::warn!(target: "simpler::remote", "a session's Worker did not close cleanly: {e}");
        }
    }
}

impl SessionWorker<'_> {
    pub(crate) fn worker(&self) -> &Worker {
        match self {
            SessionWorker::Shared(w) => w,
            SessionWorker::Own { worker, .. } => worker,
        }
    }

    /// Whether no other session runs on this Worker.
    pub(crate) fn own(&self) -> bool {
        matches!(self, SessionWorker::Own { .. })
    }

    pub(crate) fn size(&self) -> Size {
        Size::of(self.worker())
    }
}

#[cfg(test)]
mod tests;
