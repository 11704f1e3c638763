//! Recursion: a Worker whose NEXT_LEVEL workers are whole Workers one level down, each in a
//! process of its own (L4 over L3, L5 over L4, ...).
//!
//! The child side (what a nested Worker process serves) is `worker::serve::nested`.

use crate::callable::identity::{CallableHandle, CallableKind};
use crate::engine::orch_fn::OrchFn;
use crate::error::{Error, Result};
use crate::ipc::child::CTRL_REGISTER_ORCH;
use crate::level::Level;
use crate::worker::{Phase, Worker};

impl Worker {
    /// Adds a Worker one level down as a NEXT_LEVEL worker of this one (L4 and up) and returns
    /// its worker id (`0, 1, ...` in the order added). The child must not be initialized:
    /// `init` forks one process per child, in which the child starts its own subtree.
    ///
    /// ```
    /// use simpler::{Level, Worker};
    /// let mut l4 = Worker::builder().level(Level::Network1).build()?;
    /// let l3 = Worker::builder().sub_workers(1).build()?;
    /// assert_eq!(l4.add_worker(l3)?, 0);
    /// // An L3 Worker takes chips, not Workers:
    /// let mut other = Worker::builder().build()?;
    /// assert!(other.add_worker(Worker::builder().build()?).is_err());
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn add_worker(&mut self, child: Worker) -> Result<u32> {
        if self.cfg.level <= Level::Node {
            return Err(Error::invalid(format!(
                "Worker.add_worker: an {} Worker takes chips and SUB workers, not Workers; add Workers to an L4 (or higher) Worker",
                self.cfg.level
            )));
        }
        if !matches!(self.phase, Phase::New) {
            return Err(Error::state("Worker.add_worker: only before init"));
        }
        if !matches!(child.phase, Phase::New) {
            return Err(Error::state(
                "Worker.add_worker: the child must not be initialized (the parent starts it)",
            ));
        }
        if child.cfg.level.number() + 1 != self.cfg.level.number() {
            return Err(Error::invalid(format!(
                "Worker.add_worker: an {} Worker takes {} Workers, not {}",
                self.cfg.level,
                Level::from_number(self.cfg.level.number() - 1)
                    .map_or("lower".to_string(), |l| l.to_string()),
                child.cfg.level
            )));
        }
        self.children.push(child);
        Ok(self.children.len() as u32 - 1)
    }

    /// Number of nested Workers added with [`add_worker`](Worker::add_worker).
    ///
    /// ```
    /// let l4 = simpler::Worker::builder().level(simpler::Level::Network1).build()?;
    /// assert_eq!(l4.nested_workers(), 0);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn nested_workers(&self) -> usize {
        match &self.phase {
            Phase::Ready(live) if self.cfg.level > Level::Node => live.engine.config().next_level_workers,
            _ => self.children.len(),
        }
    }

    /// Registers an orchestration function that this Worker (L4 and up) dispatches by digest to
    /// its nested Workers with `submit_next_level`; the nested Worker runs it as a run of its own.
    ///
    /// After `init` it is sent to every nested Worker, all or nothing (if one refuses, the others
    /// drop it again). A different function under the name of a registered one is refused,
    /// before and after `init`.
    ///
    /// ```
    /// use simpler::{CallConfig, Level, OrchFn, Orchestrator, TaskArgs, Worker};
    /// fn step(_: &mut Orchestrator<'_>, _: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    ///     Ok(())
    /// }
    /// let mut l4 = Worker::builder().level(Level::Network1).build()?;
    /// let h = l4.register_orch(OrchFn::new("step", step))?;
    /// assert_eq!(h.kind(), simpler::CallableKind::Orch);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn register_orch(&mut self, f: OrchFn) -> Result<CallableHandle> {
        if self.cfg.level <= Level::Node {
            return Err(Error::invalid(format!(
                "Worker.register_orch: an {} Worker has no nested Workers to run orchestration functions",
                self.cfg.level
            )));
        }
        let desc = f.descriptor().clone();
        let digest = desc.digest();
        let handle = CallableHandle::new(digest, CallableKind::Orch, f.name());
        if matches!(self.phase, Phase::Closed) {
            return Err(Error::state("Worker.register_orch: the Worker is closed"));
        }
        let context = |e: Error| e.context(format!("Worker.register_orch of {handle}"));
        self.orch_registry.check(digest, desc.bytes(), &f).map_err(context)?;
        if let Phase::Ready(live) = &self.phase {
            let addr = f.fn_address();
            live.register_on(
                &self.targets(live, CallableKind::Orch),
                |i| self.target_label(i),
                &digest,
                |mb| mb.post_control(CTRL_REGISTER_ORCH, addr, digest.as_bytes(), desc.bytes()),
            )
            .map_err(context)?;
        }
        self.orch_registry.install(digest, desc.bytes(), f)?;
        self.record(&handle);
        Ok(handle)
    }
}
