//! `task_graph!`: an orchestration function written as a graph of calls.
//!
//! Three stages, each in its module: [`parse`] (the input as a `syn::ItemFn`, its body as graph
//! statements, syntax errors), [`check`] (the dataflow pass over a table of tensors: def-use,
//! write access, aliasing, unread values, groups; it plans every task with its
//! write-after-read edges) and [`codegen`] (the function, its `graph()` replay and its twin).
//! Errors from every stage are collected and reported together.

mod check;
mod codegen;
mod parse;

use proc_macro2::TokenStream;

use crate::ctxt::Ctxt;

pub(crate) fn expand(input: TokenStream) -> TokenStream {
    let mut cx = Ctxt::default();
    let Some(def) = parse::parse(&mut cx, input) else {
        return cx.into_compile_errors();
    };
    let plan = check::check(&mut cx, &def);
    let failed = cx.failed();
    let items = codegen::generate(def, &plan, failed);
    let errors = cx.into_compile_errors();
    quote::quote!(#items #errors)
}
