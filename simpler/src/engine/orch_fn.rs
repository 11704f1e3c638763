//! Orchestration functions that a parent Worker dispatches to a nested Worker.

use std::sync::Arc;

use crate::callable::identity::{CallableHandle, CallableKind, Descriptor, orch_fn_descriptor};
use crate::callable::linked::CallableInfo;
use crate::callable::registry::{Installable, Origin};
use crate::data::call_config::CallConfig;
use crate::data::task_args::TaskArgs;
use crate::engine::orchestrator::Orchestrator;
use crate::error::Result;

/// An orchestration function as a plain `fn` pointer: what a nested Worker runs for a task.
///
/// ```
/// use simpler::{chip::CallConfig, OrchFnPtr, Orchestrator, TaskArgs};
///
/// fn step(_: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
///     assert_eq!(args.tensor_count(), 0);
///     Ok(())
/// }
/// let f: OrchFnPtr = step;
/// assert_eq!(simpler::OrchFn::new("step", f).name(), "step");
/// ```
pub type OrchFnPtr = for<'a, 'b> fn(&'a mut Orchestrator<'b>, &TaskArgs, &CallConfig) -> Result<()>;

// SAFETY: rule FA1 of `sys::fn_address` — a plain `fn` pointer type (the same type as a chip
// orchestration's `ChipOrchFnPtr`).
#[expect(unsafe_code, reason = "marks a fn pointer type as one whose address may cross a fork")]
unsafe impl crate::sys::fn_address::FnPointer for OrchFnPtr {}

/// An orchestration function to register on an L4 (or higher) Worker: its NEXT_LEVEL workers
/// (whole Workers one level down, each in its own process) run it as a run of their own, with
/// the task's arguments and config.
///
/// ```
/// use simpler::{chip::CallConfig, OrchFn, Orchestrator, TaskArgs};
///
/// fn l3_step(_orch: &mut Orchestrator<'_>, _args: &TaskArgs, _cfg: &CallConfig) -> simpler::Result<()> {
///     Ok(())
/// }
/// let f = OrchFn::new("l3_step", l3_step);
/// assert_eq!(f.name(), "l3_step");
/// assert_eq!(f.handle().kind(), simpler::callable::CallableKind::Orch);
/// ```
#[derive(Clone)]
pub struct OrchFn {
    name: Arc<str>,
    f: OrchFnPtr,
    descriptor: Descriptor,
    origin: Origin,
}

impl std::fmt::Debug for OrchFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrchFn").field("name", &self.name).field("digest", &self.descriptor.digest()).finish()
    }
}

impl OrchFn {
    /// An orchestration function from a plain `fn` (registrable before or after `init`).
    ///
    /// Its identity is its kind and name (as for [`HostFn::new`](crate::HostFn::new)): a
    /// different function under a name already registered is refused.
    ///
    /// ```
    /// # fn f(_: &mut simpler::Orchestrator<'_>, _: &simpler::TaskArgs, _: &simpler::chip::CallConfig) -> simpler::Result<()> { Ok(()) }
    /// let a = simpler::OrchFn::new("f", f);
    /// let b = simpler::OrchFn::new("f", f);
    /// assert_eq!(a.handle(), b.handle()); // the same function, the same identity
    /// ```
    #[track_caller]
    pub fn new(name: &str, f: OrchFnPtr) -> OrchFn {
        // The identity is the name (see `HostFn::new`).
        let descriptor = orch_fn_descriptor(name, "fn", 0);
        OrchFn { name: name.into(), f, descriptor, origin: Origin::Made(std::panic::Location::caller()) }
    }

    /// The name given at construction.
    ///
    /// ```
    /// # fn f(_: &mut simpler::Orchestrator<'_>, _: &simpler::TaskArgs, _: &simpler::chip::CallConfig) -> simpler::Result<()> { Ok(()) }
    /// assert_eq!(simpler::OrchFn::new("step", f).name(), "step");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The handle tasks name it by (digest, kind `Orch`, name).
    ///
    /// ```
    /// # fn f(_: &mut simpler::Orchestrator<'_>, _: &simpler::TaskArgs, _: &simpler::chip::CallConfig) -> simpler::Result<()> { Ok(()) }
    /// let h = simpler::OrchFn::new("step", f).handle();
    /// assert_eq!(h.name(), "step");
    /// ```
    pub fn handle(&self) -> CallableHandle {
        CallableHandle::new(self.descriptor.digest(), CallableKind::Orch, &self.name)
    }

    pub(crate) fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    /// The function's address, as a `REGISTER_ORCH` control carries it to a child.
    pub(crate) fn fn_address(&self) -> u64 {
        crate::sys::fn_address::FnAddress::of(self.f).to_wire()
    }

    /// The orchestration function of a `#[callable(orch)]` or `task_graph!` of this program,
    /// by its handle: for registering one explicitly where linked functions are not taken
    /// whole (a [`Node`](crate::remote::Node) built with
    /// [`linked_callables(false)`](crate::remote::Node::linked_callables) that serves some of
    /// them). Anything else is an [`ErrorKind::Callable`](crate::ErrorKind::Callable) error
    /// naming it.
    ///
    /// ```
    /// use simpler::prelude::*;
    ///
    /// #[callable(orch)]
    /// fn noop(_o: &mut Orchestrator<'_>) -> simpler::Result<()> {
    ///     Ok(())
    /// }
    /// let f = simpler::OrchFn::linked(noop::handle())?;
    /// assert_eq!(f.handle(), *noop::handle());
    /// fn plain(_: &mut Orchestrator<'_>, _: &simpler::TaskArgs, _: &simpler::chip::CallConfig) -> simpler::Result<()> {
    ///     Ok(())
    /// }
    /// let err = simpler::OrchFn::linked(&simpler::OrchFn::new("plain", plain).handle()).unwrap_err();
    /// assert_eq!(err.kind(), simpler::ErrorKind::Callable);
    /// # Ok::<(), simpler::Error>(())
    /// ```
    pub fn linked(handle: &CallableHandle) -> Result<OrchFn> {
        match CallableInfo::find(handle.digest()) {
            Some(info) if info.kind == CallableKind::Orch => OrchFn::from_linked(info),
            _ => Err(crate::error::Error::new(
                crate::error::ErrorKind::Callable,
                format!("{handle} is not a #[callable(orch)] or task_graph! of this program"),
            )),
        }
    }

    /// A `#[callable(orch)]` or `task_graph!` function from the link-time registry, with the
    /// descriptor the macro computed.
    pub(crate) fn from_linked(info: &CallableInfo) -> Result<OrchFn> {
        match info.entry::<OrchFnPtr>() {
            Some(f) => Ok(OrchFn {
                name: info.name.into(),
                f,
                descriptor: info.descriptor_checked()?,
                origin: Origin::Macro(info.path),
            }),
            None => Err(info.wrong_kind("an orchestration function")),
        }
    }

    pub(crate) fn from_parts(f: OrchFnPtr, descriptor: Descriptor) -> OrchFn {
        OrchFn { name: "".into(), f, descriptor, origin: Origin::Sent }
    }

    pub(crate) fn call(&self, orch: &mut Orchestrator<'_>, args: &TaskArgs, cfg: &CallConfig) -> Result<()> {
        (self.f)(orch, args, cfg)
    }
}

impl Installable for OrchFn {
    fn same_code(&self, other: &OrchFn) -> bool {
        Origin::both_macro(self.origin, other.origin) || std::ptr::fn_addr_eq(self.f, other.f)
    }

    fn describe(&self) -> String {
        // The address in this process (the wire word is an offset, see `sys::fn_address`).
        format!("`{}` ({}, fn at {:#x})", self.name, self.origin, self.f as usize)
    }
}
