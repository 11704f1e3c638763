//! Procedural macros for [`simpler`](https://docs.rs/simpler).
//!
//! This crate is a placeholder for `#[callable]` and `task_graph!`, which arrive with the DSL.
//! It exports nothing yet.
