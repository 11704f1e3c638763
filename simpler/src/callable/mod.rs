//! Callable identity and per-target callable registries.
//!
//! A callable (a chip kernel, a host function, an orchestration function) is identified by the
//! sha256 [`Digest`] of its canonical descriptor bytes, printed as
//! `sha256:<64 lowercase hex>`. The canonical encoding is little-endian and map-free: every
//! integer is a `u32`, strings and byte arrays are a `u32` length followed by the bytes, lists are
//! a `u32` count followed by the items, optionals are a `u8` presence marker (0 or 1) followed by
//! the value, and every descriptor begins with `u32 schema_version = 1` and `u32 kind`.
//!
//! Each target process keeps a registry (`registry.rs`) mapping digests to private local
//! slots, with reference counts; installing the same digest with a different descriptor is an
//! error (`HASHID_DESCRIPTOR_MISMATCH`).
//!
//! A kernel with OpenCL C source also has the parameters that source declares
//! (`signature.rs`), which a submit checks a task's arguments against.

pub(crate) mod host;
pub(crate) mod identity;
pub(crate) mod linked;
pub(crate) mod registry;
pub(crate) mod signature;

pub use host::HostFnPtr;
pub use identity::{CallableKind, Digest, Namespace};
