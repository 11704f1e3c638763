//! Host functions: what a SUB worker runs. A [`HostFn`] is a plain `fn` ([`HostFnPtr`], which
//! crosses to a child as its offset in the binary) or, for a Worker whose children are forked
//! (`StartMethod::Fork`), a closure registrable only before `init`.

use std::any::TypeId;
use std::hash::BuildHasher;
use std::sync::Arc;

use crate::callable::identity::{CallableKind, Descriptor, host_fn_descriptor};
use crate::callable::linked::CallableInfo;
use crate::callable::registry::{Installable, Origin};
use crate::data::host_args::HostArgs;

/// What a host function returns: `Ok(())`, or any error (its message fails the task).
///
/// Any `std::error::Error + Send + Sync` converts with `?`, including [`Error`](crate::Error)
/// from the [`HostArgs`] accessors; a `String` or `&str` converts with `.into()`.
///
/// ```
/// use simpler::{HostArgs, HostResult};
///
/// fn checked_sqrt(args: &HostArgs<'_>) -> HostResult {
///     let x = args.input::<f32>(0)?.to_vec(); // a simpler::Error converts with `?`
///     if x.iter().any(|v| *v < 0.0) {
///         return Err("checked_sqrt: negative input".into());
///     }
///     for (o, v) in args.output::<f32>(1)?.iter_mut().zip(x) {
///         *o = v.sqrt();
///     }
///     Ok(())
/// }
///
/// let failed: HostResult = Err("boom".into());
/// assert_eq!(failed.unwrap_err().to_string(), "boom");
/// # let _ = checked_sqrt;
/// ```
pub type HostResult = std::result::Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A host function as a plain `fn` pointer; what [`HostFn::new`] takes.
///
/// ```
/// use simpler::{HostArgs, HostFn, callable::HostFnPtr, HostResult};
///
/// fn noop(_: &HostArgs<'_>) -> HostResult {
///     Ok(())
/// }
/// // Pick one of several functions at run time, then register it.
/// let table: [(&str, HostFnPtr); 1] = [("noop", noop)];
/// let (name, f) = table[0];
/// assert!(!HostFn::new(name, f).is_closure());
/// ```
pub type HostFnPtr = for<'a, 'b> fn(&'a HostArgs<'b>) -> HostResult;

// SAFETY: rule FA1 of `sys::fn_address` — a plain `fn` pointer type.
#[expect(unsafe_code, reason = "marks a fn pointer type as one whose address may cross a fork")]
unsafe impl crate::sys::fn_address::FnPointer for HostFnPtr {}

type Closure = dyn for<'a, 'b> Fn(&'a HostArgs<'b>) -> HostResult + Send + Sync;

/// A host function to register on a Worker; SUB workers run it with typed access to the
/// task's tensors and scalars.
///
/// [`HostFn::new`] takes a plain `fn` and may be registered before or after `init`;
/// [`HostFn::closure`] takes a closure: only SUB workers started by fork
/// ([`StartMethod::Fork`](crate::StartMethod::Fork)) can run one, and only if it is registered
/// before `init` (the fork copies it; a live worker cannot receive new code).
///
/// ```
/// use simpler::{HostArgs, HostFn, HostResult};
///
/// fn scale(args: &HostArgs<'_>) -> HostResult {
///     let k = args.scalar_f32(0)?;
///     for v in args.output::<f32>(0)? {
///         *v *= k;
///     }
///     Ok(())
/// }
/// let f = HostFn::new("scale", scale);
/// assert_eq!(f.name(), "scale");
/// let offset = 3u64;
/// let g = HostFn::closure("add_offset", move |args: &HostArgs<'_>| {
///     for v in args.output::<u64>(0)? {
///         *v += offset;
///     }
///     Ok(())
/// });
/// assert!(g.is_closure());
/// ```
#[derive(Clone)]
pub struct HostFn {
    name: Arc<str>,
    body: Body,
    descriptor: Descriptor,
    origin: Origin,
}

#[derive(Clone)]
pub(crate) enum Body {
    Ptr(HostFnPtr),
    Closure(Arc<Closure>),
}

impl std::fmt::Debug for HostFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostFn")
            .field("name", &self.name)
            .field("closure", &self.is_closure())
            .field("digest", &self.descriptor.digest())
            .finish()
    }
}

fn type_hash<T: 'static>() -> u64 {
    // A fixed-key hasher: the same binary gives the same value in every process.
    std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
        .hash_one(TypeId::of::<T>())
}

impl HostFn {
    /// A host function from a plain `fn` (registrable before or after `init`).
    ///
    /// Its identity (digest) is its kind and name, not its code, so [`handle`](HostFn::handle)
    /// gives the same handle wherever it is computed. Give each function its own name:
    /// registering a different function under a name already registered is refused (an
    /// [`ErrorKind::Callable`](crate::ErrorKind::Callable) error naming both, by where each
    /// `HostFn` was made). The same function again counts another reference. Functions are
    /// compared by address; an optimized build may give a small function several copies at
    /// different addresses, so make each function's `HostFn` in one place (a helper `fn`).
    ///
    /// ```
    /// use simpler::{HostArgs, HostFn, HostResult};
    ///
    /// fn fill(args: &HostArgs<'_>) -> HostResult {
    ///     let value = args.scalar(0)?;
    ///     args.output::<u64>(0)?.fill(value);
    ///     Ok(())
    /// }
    /// let f = HostFn::new("fill", fill);
    /// assert_eq!(f.name(), "fill");
    /// assert!(!f.is_closure());
    /// ```
    #[track_caller]
    pub fn new(name: &str, f: HostFnPtr) -> HostFn {
        // The identity is the name: not the address, which differs between the copies a
        // compiler may make of one small function.
        let descriptor = host_fn_descriptor(name, "fn", 0);
        let origin = Origin::Made(std::panic::Location::caller());
        HostFn { name: name.into(), body: Body::Ptr(f), descriptor, origin }
    }

    /// A host function from a closure, for a Worker whose SUB workers are forked
    /// ([`StartMethod::Fork`](crate::StartMethod::Fork)), registrable only before `init`.
    ///
    /// The closure may capture state (it must be `Send + Sync + 'static`); each forked SUB
    /// worker gets its own copy at fork time. Under the default
    /// [`StartMethod::Exec`](crate::StartMethod::Exec) a SUB worker is a new process of the
    /// binary, which runs functions of the binary only: registering a closure is refused.
    ///
    /// ```
    /// use simpler::{HostArgs, HostFn};
    ///
    /// let bias = 0.5f32;
    /// let add_bias = HostFn::closure("add_bias", move |args: &HostArgs<'_>| {
    ///     for v in args.output::<f32>(0)? {
    ///         *v += bias;
    ///     }
    ///     Ok(())
    /// });
    /// assert_eq!(add_bias.name(), "add_bias");
    /// assert!(add_bias.is_closure());
    /// ```
    #[track_caller]
    pub fn closure<F>(name: &str, f: F) -> HostFn
    where
        F: for<'a, 'b> Fn(&'a HostArgs<'b>) -> HostResult + Send + Sync + 'static,
    {
        // Two closures of one type may capture different values: each instance is its own
        // callable, so the descriptor carries a process-wide instance number besides the type.
        static INSTANCES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let instance = INSTANCES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let type_name = format!("{}#{instance}", std::any::type_name::<F>());
        let descriptor = host_fn_descriptor(name, &type_name, type_hash::<F>());
        let origin = Origin::Made(std::panic::Location::caller());
        HostFn { name: name.into(), body: Body::Closure(Arc::new(f)), descriptor, origin }
    }

    /// A `#[callable(sub)]` host function from the link-time registry, with the descriptor the
    /// macro computed.
    pub(crate) fn from_linked(info: &CallableInfo) -> crate::error::Result<HostFn> {
        match info.entry::<HostFnPtr>() {
            Some(f) if info.kind == CallableKind::HostFn => Ok(HostFn {
                name: info.name.into(),
                body: Body::Ptr(f),
                descriptor: info.descriptor_checked()?,
                origin: Origin::Macro(info.path),
            }),
            _ => Err(info.wrong_kind("a host function")),
        }
    }

    /// Rebuilds a `fn`-pointer host function from its descriptor (post-init registration in a
    /// child).
    pub(crate) fn from_parts(f: HostFnPtr, descriptor: Descriptor) -> HostFn {
        HostFn { name: "".into(), body: Body::Ptr(f), descriptor, origin: Origin::Sent }
    }

    /// The handle tasks name it by (digest, kind `HostFn`, name): the same in every process of
    /// this binary, so an orchestration function can name a host function it did not register.
    ///
    /// ```
    /// # fn f(_: &simpler::HostArgs<'_>) -> simpler::HostResult { Ok(()) }
    /// let h = simpler::HostFn::new("f", f).handle();
    /// assert_eq!(h.kind(), simpler::callable::CallableKind::HostFn);
    /// ```
    pub fn handle(&self) -> crate::callable::identity::CallableHandle {
        crate::callable::identity::CallableHandle::new(
            self.descriptor.digest(),
            crate::callable::identity::CallableKind::HostFn,
            &self.name,
        )
    }

    /// The name given at construction.
    ///
    /// ```
    /// use simpler::{HostArgs, HostFn, HostResult};
    /// fn noop(_: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    /// assert_eq!(HostFn::new("noop", noop).name(), "noop");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True for [`HostFn::closure`], false for [`HostFn::new`].
    ///
    /// ```
    /// use simpler::{HostArgs, HostFn, HostResult};
    /// fn noop(_: &HostArgs<'_>) -> HostResult {
    ///     Ok(())
    /// }
    /// assert!(!HostFn::new("noop", noop).is_closure());
    /// assert!(HostFn::closure("noop", |_: &HostArgs<'_>| Ok(())).is_closure());
    /// ```
    pub fn is_closure(&self) -> bool {
        matches!(self.body, Body::Closure(_))
    }

    pub(crate) fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    pub(crate) fn body(&self) -> &Body {
        &self.body
    }

    /// Calls the function.
    pub(crate) fn call(&self, args: &HostArgs<'_>) -> HostResult {
        match &self.body {
            Body::Ptr(f) => f(args),
            Body::Closure(f) => f(args),
        }
    }
}

impl Installable for HostFn {
    fn same_code(&self, other: &HostFn) -> bool {
        if Origin::both_macro(self.origin, other.origin) {
            return true;
        }
        match (&self.body, &other.body) {
            (Body::Ptr(a), Body::Ptr(b)) => std::ptr::fn_addr_eq(*a, *b),
            (Body::Closure(a), Body::Closure(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    fn describe(&self) -> String {
        match &self.body {
            Body::Ptr(f) => format!("`{}` ({}, fn at {:#x})", self.name, self.origin, *f as usize),
            Body::Closure(_) => format!("`{}` ({}, a closure)", self.name, self.origin),
        }
    }
}
