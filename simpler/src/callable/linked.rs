//! The link-time registry of `#[callable]` items.
//!
//! Every `#[callable]` (and every `task_graph!`) adds one [`CallableInfo`] to a distributed
//! slice that the linker gathers from all crates of the binary. Any process of the binary —
//! the parent, a SUB worker, a chip child, a nested Worker — finds a callable by its
//! digest there, without a registration message. A Worker registers every linked callable that
//! it can run when it starts ([`Worker::init`](crate::Worker::init)).
//!
//! The entry point is stored type-erased (`&dyn Any`), since this layer cannot name the
//! function types of the layers above; each kind takes it back with `entry::<F>()`
//! (`HostFn::from_linked`, `ChipFn::from_linked`, `OrchFn::from_linked`).

use std::any::Any;
use std::sync::OnceLock;

use crate::callable::identity::{CallableHandle, CallableKind, Descriptor, Digest};
use crate::error::{Error, ErrorKind, Result};

/// The descriptor payload format of `#[callable]` items (run-time registrations use 1).
pub(crate) const MACRO_PAYLOAD_FORMAT_VERSION: u32 = 2;

/// How a callable parameter is passed.
///
/// ```
/// use simpler::__private::ParamMode;
/// assert!(ParamMode::InOut.writes() && ParamMode::InOut.reads());
/// assert!(!ParamMode::Scalar.is_tensor());
/// assert_eq!(ParamMode::Out as u32, 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ParamMode {
    /// An `In<T>` tensor: read.
    In = 1,
    /// An `Out<T>` tensor: written, its earlier contents ignored.
    Out = 2,
    /// An `InOut<T>` tensor: read and written.
    InOut = 3,
    /// A scalar.
    Scalar = 4,
}

impl ParamMode {
    /// Whether the parameter is a tensor.
    ///
    /// ```
    /// assert!(simpler::__private::ParamMode::In.is_tensor());
    /// ```
    pub const fn is_tensor(self) -> bool {
        !matches!(self, ParamMode::Scalar)
    }

    /// Whether the callable reads the tensor.
    ///
    /// ```
    /// assert!(!simpler::__private::ParamMode::Out.reads());
    /// ```
    pub const fn reads(self) -> bool {
        matches!(self, ParamMode::In | ParamMode::InOut)
    }

    /// Whether the callable writes the tensor.
    ///
    /// ```
    /// assert!(simpler::__private::ParamMode::Out.writes());
    /// ```
    pub const fn writes(self) -> bool {
        matches!(self, ParamMode::Out | ParamMode::InOut)
    }
}

/// One parameter of a `#[callable]`'s signature.
///
/// ```
/// use simpler::{callable, dsl::In, dsl::Out};
/// use simpler::__private::ParamMode;
///
/// #[callable(sub)]
/// fn scale(x: In<f32>, mut y: Out<f32>, k: f32) {
///     for (o, i) in y.iter_mut().zip(x.iter()) {
///         *o = k * i;
///     }
/// }
/// let p = &scale::PARAMS;
/// assert_eq!((p[0].name, p[0].mode, p[0].ty), ("x", ParamMode::In, "f32"));
/// assert_eq!((p[2].name, p[2].mode, p[2].ty), ("k", ParamMode::Scalar, "f32"));
/// assert_eq!(p[0].resolved.name(), "f32"); // what the type name resolved to
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    /// The parameter's name.
    pub name: &'static str,
    /// How it is passed.
    pub mode: ParamMode,
    /// The element type of a tensor, or the scalar type, as written.
    pub ty: &'static str,
    /// What [`ty`](Param::ty) resolved to. Two callables that read alike (one digest) but
    /// resolve a type name differently are told apart by it.
    pub resolved: Resolved,
}

/// The type a parameter's type name resolved to, as [`std::any::type_name`] gives it (asked
/// for only when two callables share a digest).
///
/// ```
/// use simpler::__private::Resolved;
/// type T = f32;
/// assert_eq!(Resolved::of::<T>().name(), "f32");
/// assert_eq!(Resolved::of::<T>(), Resolved::of::<f32>());
/// assert_ne!(Resolved::of::<T>(), Resolved::of::<i32>());
/// ```
#[derive(Clone, Copy)]
pub struct Resolved(fn() -> &'static str);

impl Resolved {
    /// The resolved type of `T`.
    pub const fn of<T: ?Sized>() -> Resolved {
        Resolved(std::any::type_name::<T>)
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        (self.0)()
    }
}

impl PartialEq for Resolved {
    fn eq(&self, other: &Resolved) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Resolved {}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The link-time registry: one [`CallableInfo`] per `#[callable]` and `task_graph!` of every
/// crate linked into the binary (re-exported to generated code as `__private::CALLABLES`).
#[linkme::distributed_slice]
pub static CALLABLES: [CallableInfo];

/// Everything the macros know of one callable: identity, signature and entry point.
///
/// `#[callable]` generates one as `<name>::INFO`, with the canonical descriptor and its digest
/// computed at compile time, and records it in the link-time registry.
///
/// ```
/// use simpler::{callable, callable::CallableKind, callable::Digest, dsl::In, dsl::Out};
///
/// #[callable(chip)]
/// fn copy(a: In<u8>, mut b: Out<u8>) {
///     b.copy_from_slice(&a);
/// }
/// let info = &copy::INFO;
/// assert_eq!(info.name, "copy");
/// assert_eq!(info.kind, CallableKind::Chip);
/// assert_eq!(info.digest, Digest::of(info.descriptor));
/// assert_eq!(copy::DIGEST, info.digest);
/// assert!(simpler::__private::CallableInfo::find(info.digest).is_some());
/// assert!(info.source.is_none()); // no `opencl = "file.cl"`
/// ```
#[derive(Debug)]
pub struct CallableInfo {
    /// The function's name.
    pub name: &'static str,
    /// Its path as the descriptor records it: `crate::name`.
    pub path: &'static str,
    /// Its kind.
    pub kind: CallableKind,
    /// The canonical descriptor bytes (see the book's descriptor reference).
    pub descriptor: &'static [u8],
    /// sha256 of [`descriptor`](CallableInfo::descriptor), computed by the macro.
    pub digest: Digest,
    /// The signature, in order.
    pub params: &'static [Param],
    /// What it runs: a function pointer whose type depends on the kind. This layer does not
    /// name those types (an orchestration's names the engine's `Orchestrator`); the layer that
    /// runs each kind takes it back with [`entry`](CallableInfo::entry).
    entry: &'static (dyn Any + Send + Sync),
    /// A chip kernel's OpenCL C source, `(text, entry)`, from `#[callable(chip, opencl =
    /// "file.cl")]`: the text as the macro read it (its descriptor covers its sha256) and the
    /// name of the kernel function in it.
    pub source: Option<(&'static str, &'static str)>,
    handle: OnceLock<CallableHandle>,
}

impl CallableInfo {
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub const fn __new(
        name: &'static str,
        path: &'static str,
        kind: CallableKind,
        descriptor: &'static [u8],
        digest: [u8; 32],
        params: &'static [Param],
        entry: &'static (dyn Any + Send + Sync),
    ) -> CallableInfo {
        CallableInfo::__new_with_source(name, path, kind, descriptor, digest, params, entry, None)
    }

    /// [`__new`](CallableInfo::__new) for a kernel with OpenCL C `source` (`(text, entry)`).
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub const fn __new_with_source(
        name: &'static str,
        path: &'static str,
        kind: CallableKind,
        descriptor: &'static [u8],
        digest: [u8; 32],
        params: &'static [Param],
        entry: &'static (dyn Any + Send + Sync),
        source: Option<(&'static str, &'static str)>,
    ) -> CallableInfo {
        CallableInfo {
            name,
            path,
            kind,
            descriptor,
            digest: Digest::from_bytes(digest),
            params,
            entry,
            source,
            handle: OnceLock::new(),
        }
    }

    /// The handle tasks name it by (the same as the one a Worker's registration returns).
    ///
    /// ```
    /// # use simpler::{callable, dsl::In};
    /// # #[callable(sub)] fn look(x: In<f32>) { let _ = x; }
    /// let h = look::INFO.handle();
    /// assert_eq!((h.name(), h.digest()), ("look", look::DIGEST));
    /// ```
    #[inline]
    pub fn handle(&self) -> &CallableHandle {
        self.handle.get_or_init(|| CallableHandle::new(self.digest, self.kind, self.name))
    }

    /// Every `#[callable]` linked into this binary.
    ///
    /// ```
    /// # use simpler::callable;
    /// # #[callable(sub)] fn listed() {}
    /// assert!(simpler::__private::CallableInfo::linked().iter().any(|c| c.digest == listed::DIGEST));
    /// ```
    pub fn linked() -> &'static [CallableInfo] {
        &CALLABLES
    }

    /// [`linked`](CallableInfo::linked), unless two entries share a digest but resolve a
    /// parameter's type differently: one digest is one source text (the same file included
    /// twice is one callable), but two `#[callable]`s that read alike may resolve a type name
    /// differently (`type T` in two modules), and which one a task ran would be a matter of
    /// chance. Looked for once per process.
    pub(crate) fn linked_unambiguous() -> Result<&'static [CallableInfo]> {
        static ALIKE: OnceLock<Option<String>> = OnceLock::new();
        let linked = Self::linked();
        let alike = ALIKE.get_or_init(|| {
            let types = |c: &CallableInfo| {
                c.params.iter().map(|p| format!("{} as {}", p.ty, p.resolved.name())).collect::<Vec<_>>().join(", ")
            };
            linked.iter().enumerate().find_map(|(i, a)| {
                let b = linked[i + 1..].iter().find(|b| {
                    b.digest == a.digest && a.params.iter().zip(b.params).any(|(p, q)| p.resolved != q.resolved)
                })?;
                Some(format!(
                    "two #[callable]s `{}` have the same digest {} but different parameter types ({}; and {}): they read alike (the same name, parameters, type names and body text) in two modules where a type name means different types, so a task could run either; rename one of them",
                    a.path,
                    a.digest,
                    types(a),
                    types(b)
                ))
            })
        });
        match alike {
            None => Ok(linked),
            Some(msg) => Err(Error::new(ErrorKind::Callable, msg.clone())),
        }
    }

    /// The linked callable whose digest is `digest`, if any.
    ///
    /// ```
    /// # use simpler::callable;
    /// # #[callable(sub)] fn found() {}
    /// assert_eq!(simpler::__private::CallableInfo::find(found::DIGEST).unwrap().name, "found");
    /// assert!(simpler::__private::CallableInfo::find(simpler::callable::Digest::of(b"nothing")).is_none());
    /// ```
    pub fn find(digest: Digest) -> Option<&'static CallableInfo> {
        Self::linked().iter().find(|c| c.digest == digest)
    }

    /// The entry point as a function pointer of type `F`, if it is one.
    pub(crate) fn entry<F: Copy + 'static>(&self) -> Option<F> {
        self.entry.downcast_ref::<F>().copied()
    }

    /// The descriptor, checked against the digest and kind the macro recorded.
    pub(crate) fn descriptor_checked(&self) -> Result<Descriptor> {
        let d = Descriptor::from_bytes(self.descriptor.to_vec())?;
        if d.digest() != self.digest || d.kind() != self.kind {
            return Err(Error::new(
                ErrorKind::Callable,
                format!(
                    "HASHID_DESCRIPTOR_MISMATCH: `{}` claims {} but its descriptor hashes to {}",
                    self.name,
                    self.digest,
                    d.digest()
                ),
            ));
        }
        Ok(d)
    }

    /// The error for an entry point of another kind than the caller runs.
    pub(crate) fn wrong_kind(&self, what: &str) -> Error {
        Error::new(ErrorKind::Callable, format!("`{}` is not {what}", self.name))
    }
}
