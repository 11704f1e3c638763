//! The mdBook tutorial (`book/src/*.md`) as doctests: every chapter's code blocks compile and
//! run with `cargo test -p simpler --doc book`, so the book stays true to the API.
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

#[doc = include_str!("../../book/src/chips.md")]
pub struct Chips;

#[doc = include_str!("../../book/src/going-up-a-level.md")]
pub struct GoingUpALevel;

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
