//! `#[isolated_test(crate = path)]`: a `#[test]` that runs alone in a process of its own.
//!
//! The item is emitted with `#[test]` in front and, as its first statement, the guard every
//! forking test needs: `if !<crate>::test_support::in_own_process() { return; }` (`crate`
//! defaults to `::simpler`; the library's own unit tests pass `crate = crate`).

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;

use crate::ctxt::Ctxt;
use crate::model;

/// The one option, `crate = path`.
fn parse_options(cx: &mut Ctxt, attr: TokenStream) -> Option<syn::Path> {
    let metas = match Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated.parse2(attr) {
        Ok(m) => m,
        Err(e) => {
            cx.syn(e);
            return None;
        }
    };
    let mut krate = None;
    for meta in metas {
        match &meta {
            syn::Meta::NameValue(nv) if nv.path.is_ident("crate") && krate.is_none() => match &nv.value {
                syn::Expr::Path(p) => krate = Some(p.path.clone()),
                other => cx.error(other.span(), "`crate` takes a path, e.g. `crate = ::my_simpler`"),
            },
            _ => cx.error(
                meta.span(),
                format!(
                    "unexpected `{}` in `#[isolated_test]`\nhelp: the one option is `crate = path`, given once",
                    model::squash(meta.to_token_stream())
                ),
            ),
        }
    }
    krate
}

/// Expands `#[isolated_test]` on `item`.
pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut cx = Ctxt::default();
    let krate = parse_options(&mut cx, attr);
    let mut func: syn::ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(e) => {
            cx.syn(syn::Error::new(e.span(), "`#[isolated_test]` goes on a test function"));
            let errors = cx.into_compile_errors();
            return quote!(#item #errors);
        }
    };
    let sig = &func.sig;
    if !sig.inputs.is_empty() {
        cx.error_spanned(&sig.inputs, "a test takes no parameters");
    }
    if let syn::ReturnType::Type(_, ty) = &sig.output {
        cx.error_spanned(ty, "an `#[isolated_test]` returns `()`: when it is rerun alone, it returns early");
    }
    if sig.asyncness.is_some() || !sig.generics.params.is_empty() {
        cx.error(sig.ident.span(), "an `#[isolated_test]` is a plain `fn` without generics");
    }
    if let Some(test) = func.attrs.iter().find(|a| a.path().is_ident("test")) {
        cx.error_spanned(test, "`#[isolated_test]` is a `#[test]` already\nhelp: remove this `#[test]`");
    }
    if cx.failed() {
        let errors = cx.into_compile_errors();
        return quote!(#item #errors);
    }
    let root = model::root(krate.as_ref());
    let guard: syn::Stmt = syn::parse_quote_spanned! {Span::call_site()=>
        if !#root::test_support::in_own_process() {
            return;
        }
    };
    func.block.stmts.insert(0, guard);
    quote!(#[test] #func)
}
