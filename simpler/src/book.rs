//! The mdBook tutorial (`book/src/*.md`) as doctests: every chapter's code blocks compile and
//! run with `cargo test -p simpler-rt --doc book`, so the book stays true to the API.
//!
//! This module exists only when rustdoc collects doctests (`lib.rs` declares it under
//! `#[cfg(doctest)]`); one unit struct per chapter carries the chapter as its documentation.

#[doc = include_str!("../../book/src/introduction.md")]
pub struct Introduction;

#[doc = include_str!("../../book/src/quick-start.md")]
pub struct QuickStart;

#[doc = include_str!("../../book/src/buffers-and-tensors.md")]
pub struct BuffersAndTensors;

#[doc = include_str!("../../book/src/callables-and-digests.md")]
pub struct CallablesAndDigests;

#[doc = include_str!("../../book/src/orchestration.md")]
pub struct Orchestration;

#[doc = include_str!("../../book/src/task-graphs.md")]
pub struct TaskGraphs;

#[doc = include_str!("../../book/src/scopes-and-memory.md")]
pub struct ScopesAndMemory;

#[doc = include_str!("../../book/src/placement-and-groups.md")]
pub struct PlacementAndGroups;

#[doc = include_str!("../../book/src/tiles-and-index-launches.md")]
pub struct TilesAndIndexLaunches;

#[doc = include_str!("../../book/src/chips.md")]
pub struct Chips;

#[doc = include_str!("../../book/src/real-devices.md")]
pub struct RealDevices;

#[doc = include_str!("../../book/src/going-up-a-level.md")]
pub struct GoingUpALevel;

#[doc = include_str!("../../book/src/across-hosts.md")]
pub struct AcrossHosts;

#[doc = include_str!("../../book/src/failures.md")]
pub struct Failures;

#[doc = include_str!("../../book/src/observability.md")]
pub struct Observability;

#[doc = include_str!("../../book/src/performance.md")]
pub struct Performance;

#[doc = include_str!("../../book/src/reference-descriptor.md")]
pub struct ReferenceDescriptor;

#[doc = include_str!("../../book/src/reference-mailbox.md")]
pub struct ReferenceMailbox;

/// Error code S0001.
#[doc = include_str!("../../book/src/errors/S0001.md")]
pub struct ErrorS0001;

/// Error code S0002.
#[doc = include_str!("../../book/src/errors/S0002.md")]
pub struct ErrorS0002;

/// Error code S0003.
#[doc = include_str!("../../book/src/errors/S0003.md")]
pub struct ErrorS0003;

/// Error code S0004.
#[doc = include_str!("../../book/src/errors/S0004.md")]
pub struct ErrorS0004;

/// Error code S0005.
#[doc = include_str!("../../book/src/errors/S0005.md")]
pub struct ErrorS0005;

/// Error code S0006.
#[doc = include_str!("../../book/src/errors/S0006.md")]
pub struct ErrorS0006;

/// Error code S0007.
#[doc = include_str!("../../book/src/errors/S0007.md")]
pub struct ErrorS0007;

/// Error code S0101.
#[doc = include_str!("../../book/src/errors/S0101.md")]
pub struct ErrorS0101;

/// Error code S0102.
#[doc = include_str!("../../book/src/errors/S0102.md")]
pub struct ErrorS0102;

/// Error code S0103.
#[doc = include_str!("../../book/src/errors/S0103.md")]
pub struct ErrorS0103;

/// Error code S0104.
#[doc = include_str!("../../book/src/errors/S0104.md")]
pub struct ErrorS0104;

/// Error code S0106.
#[doc = include_str!("../../book/src/errors/S0106.md")]
pub struct ErrorS0106;

/// Error code S0107.
#[doc = include_str!("../../book/src/errors/S0107.md")]
pub struct ErrorS0107;

/// Error code S0108.
#[doc = include_str!("../../book/src/errors/S0108.md")]
pub struct ErrorS0108;

/// Error code S0109.
#[doc = include_str!("../../book/src/errors/S0109.md")]
pub struct ErrorS0109;

/// Error code S0110.
#[doc = include_str!("../../book/src/errors/S0110.md")]
pub struct ErrorS0110;

/// Error code S0111.
#[doc = include_str!("../../book/src/errors/S0111.md")]
pub struct ErrorS0111;

/// Error code S0112.
#[doc = include_str!("../../book/src/errors/S0112.md")]
pub struct ErrorS0112;

/// Error code S0113.
#[doc = include_str!("../../book/src/errors/S0113.md")]
pub struct ErrorS0113;

/// Error code S0114.
#[doc = include_str!("../../book/src/errors/S0114.md")]
pub struct ErrorS0114;

/// Error code S0115.
#[doc = include_str!("../../book/src/errors/S0115.md")]
pub struct ErrorS0115;

/// The error-code index.
#[doc = include_str!("../../book/src/errors/README.md")]
pub struct ErrorCodes;
