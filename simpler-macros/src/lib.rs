//! Procedural macros for [`simpler`](https://docs.rs/simpler): `#[callable]` and `task_graph!`,
//! and `#[isolated_test]` for tests that fork.
//!
//! Use them through `simpler` (`simpler::callable`, `simpler::task_graph`,
//! `simpler::test_support::isolated_test`), where they are documented. The shims here only convert token streams; the work is split into parsing
//! (`model`), checking (`graph`'s dataflow pass), descriptor computation (`descriptor`)
//! and code generation (`callable`, `graph`, `isolated`). Every error is collected (`ctxt`) and all
//! are reported at once, each spanned on the user's tokens; the user's item is still emitted
//! when expansion fails, so the rest of the crate keeps type-checking.

mod callable;
mod ctxt;
mod descriptor;
mod graph;
mod isolated;
mod model;

use proc_macro::TokenStream;

/// Turns a function into a callable; documented on `simpler::callable`.
#[proc_macro_attribute]
pub fn callable(attr: TokenStream, item: TokenStream) -> TokenStream {
    callable::expand(attr.into(), item.into()).into()
}

/// Writes an orchestration function as a graph of calls; documented on `simpler::task_graph`.
#[proc_macro]
pub fn task_graph(input: TokenStream) -> TokenStream {
    graph::expand(input.into()).into()
}

/// A `#[test]` that runs alone in a process of its own; documented on
/// `simpler::test_support::isolated_test`.
#[proc_macro_attribute]
pub fn isolated_test(attr: TokenStream, item: TokenStream) -> TokenStream {
    isolated::expand(attr.into(), item.into()).into()
}
