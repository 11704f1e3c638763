//! `#[callable(chip | sub | orch, crate = path)]`: parse the options and the signature, compute
//! the descriptor, generate the twin (`<fn>::INFO`, `DIGEST`, `PARAMS`, typed `call`), the
//! shim that decodes a task's arguments, and the link-time registry entry.
//!
//! The twin is a struct of the function's name beside it, with `NAME`, `DESCRIPTOR`, `DIGEST`,
//! `KIND`, `PARAMS`, `INFO`, `handle()`, the typed `call(...)` and the hidden `__shim`
//! (`task_graph!` adds `graph()`). `INFO` goes into the link-time registry (`CALLABLES`,
//! `simpler::callable::linked`), named by the generated code through `simpler::__private`.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;

use crate::ctxt::Ctxt;
use crate::descriptor;
use crate::model::{self, Kind, Mode, Param, ParamTy};

/// The attribute's options.
#[derive(Default)]
pub(crate) struct Options {
    pub(crate) kind: Option<Kind>,
    pub(crate) krate: Option<syn::Path>,
    /// `opencl = "path"`: the OpenCL C source file of a kernel, relative to the crate's
    /// `Cargo.toml`, and where the option was given.
    pub(crate) opencl: Option<(String, Span)>,
    /// `entry = "name"`: the kernel function in that source (default: the Rust fn's name).
    pub(crate) entry: Option<(String, Span)>,
}

/// A kernel's OpenCL C source as the macro read it.
pub(crate) struct Source {
    /// The path as written (relative to `CARGO_MANIFEST_DIR`).
    pub(crate) path: String,
    /// The file's text.
    pub(crate) text: String,
    /// The kernel function's name in it.
    pub(crate) entry: String,
}

/// A string-literal option value (`opencl = "..."`, `entry = "..."`), or an S0003 error.
fn string_option(cx: &mut Ctxt, name: &str, value: &syn::Expr, example: &str) -> Option<String> {
    match value {
        syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => Some(s.value()),
        other => {
            cx.error(
                other.span(),
                format!("`{name}` takes a string literal, e.g. `{name} = \"{example}\"` [S0003]"),
            );
            None
        }
    }
}

fn parse_options(cx: &mut Ctxt, attr: TokenStream) -> Options {
    let mut opts = Options::default();
    let metas = match Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated.parse2(attr.clone()) {
        Ok(m) => m,
        Err(e) => {
            cx.syn(e);
            return opts;
        }
    };
    let mut kind_span: Option<Span> = None;
    let mut crate_span: Option<Span> = None;
    let mut opencl_span: Option<Span> = None;
    let mut entry_span: Option<Span> = None;
    for meta in metas {
        let span = meta.span();
        match &meta {
            syn::Meta::Path(p) if p.is_ident("chip") || p.is_ident("sub") || p.is_ident("orch") => {
                let k = if p.is_ident("chip") {
                    Kind::Chip
                } else if p.is_ident("sub") {
                    Kind::Sub
                } else {
                    Kind::Orch
                };
                if let Some(first) = kind_span {
                    let given = model::squash(p.to_token_stream());
                    let msg = match opts.kind {
                        Some(prev) if prev == k => format!(
                            "duplicate kind `{given}` in `#[callable]` (first given at {}) [S0002]\nhelp: remove one of them",
                            crate::ctxt::at(first)
                        ),
                        prev => format!(
                            "conflicting kinds `{}` and `{given}` in `#[callable]` [S0002]\nhelp: a callable has exactly one kind: `chip`, `sub` or `orch`",
                            prev.map_or("?", Kind::keyword)
                        ),
                    };
                    cx.error(span, msg);
                } else {
                    kind_span = Some(span);
                    opts.kind = Some(k);
                }
            }
            syn::Meta::NameValue(nv) if nv.path.is_ident("crate") => {
                if let Some(first) = crate_span {
                    cx.error(
                        span,
                        format!(
                            "duplicate option `crate` in `#[callable]` (first given at {}) [S0002]\nhelp: remove one of them",
                            crate::ctxt::at(first)
                        ),
                    );
                    continue;
                }
                crate_span = Some(span);
                match &nv.value {
                    syn::Expr::Path(p) => opts.krate = Some(p.path.clone()),
                    other => cx.error(
                        other.span(),
                        "`crate` takes a path, e.g. `crate = ::my_simpler` [S0003]".to_string(),
                    ),
                }
            }
            syn::Meta::NameValue(nv) if nv.path.is_ident("opencl") || nv.path.is_ident("entry") => {
                let is_opencl = nv.path.is_ident("opencl");
                let (name, first, example) = if is_opencl {
                    ("opencl", &mut opencl_span, "kernels/vadd.cl")
                } else {
                    ("entry", &mut entry_span, "vadd")
                };
                if let Some(first) = *first {
                    cx.error(
                        span,
                        format!(
                            "duplicate option `{name}` in `#[callable]` (first given at {}) [S0002]\nhelp: remove one of them",
                            crate::ctxt::at(first)
                        ),
                    );
                    continue;
                }
                *first = Some(span);
                if let Some(v) = string_option(cx, name, &nv.value, example) {
                    if is_opencl {
                        opts.opencl = Some((v, span));
                    } else {
                        opts.entry = Some((v, span));
                    }
                }
            }
            _ => cx.error(
                span,
                format!(
                    "unknown option `{}` in `#[callable]` [S0003]\nhelp: the options are one kind (`chip`, `sub` or `orch`), `crate = path`, and for a chip kernel `opencl = \"file.cl\"` with an optional `entry = \"name\"`",
                    model::squash(meta.to_token_stream())
                ),
            ),
        }
    }
    if let Some(span) = entry_span
        && opencl_span.is_none()
    {
        cx.error(
            span,
            "`entry` names the kernel function in OpenCL source, but no `opencl = \"file.cl\"` is given [S0007]\nhelp: add `opencl = \"path/to/kernel.cl\"`, or remove `entry`".to_string(),
        );
    }
    if let (Some(span), Some(kind)) = (opencl_span, opts.kind)
        && kind != Kind::Chip
    {
        cx.error(
            span,
            format!(
                "`opencl` source is for chip kernels, not `{}` callables [S0007]\nhelp: only a `#[callable(chip)]` kernel runs on a device; remove `opencl`",
                kind.keyword()
            ),
        );
    }
    if kind_span.is_none() && !cx.failed() {
        cx.error(
            if attr.is_empty() { Span::call_site() } else { attr.span() },
            "`#[callable]` needs a kind [S0001]\nhelp: write `#[callable(chip)]` for a kernel or chip orchestration, `#[callable(sub)]` for a host function, `#[callable(orch)]` for an orchestration function".to_string(),
        );
    }
    opts
}

/// The analysed signature.
pub(crate) struct Sig {
    pub(crate) params: Vec<Param>,
    /// Whether the first parameter is the orchestrator (orchestrations).
    pub(crate) orchestrates: bool,
}

fn analyse(cx: &mut Ctxt, f: &syn::ItemFn, kind: Kind) -> Sig {
    let mut params = Vec::new();
    let mut orchestrates = false;
    if let Some(a) = &f.sig.asyncness {
        cx.error(
            a.span(),
            "a callable cannot be `async` [S0006]\nhelp: remove `async`; a worker calls it synchronously"
                .to_string(),
        );
    }
    let qualifiers = [
        f.sig.unsafety.map(|t| (t.span(), "unsafe")),
        f.sig.constness.map(|t| (t.span(), "const")),
        f.sig.abi.as_ref().map(|a| (a.extern_token.span(), "extern")),
    ];
    for (span, word) in qualifiers.into_iter().flatten() {
        cx.error(
            span,
            format!("a callable cannot be `{word}` [S0006]\nhelp: remove `{word}`; a worker calls it as a plain Rust function"),
        );
    }
    let lifetimes_only = f.sig.generics.params.iter().all(|p| matches!(p, syn::GenericParam::Lifetime(_)));
    if !f.sig.generics.params.is_empty() {
        let msg = if lifetimes_only {
            "a callable names no lifetimes [S0006]\nhelp: leave them out (`In<f32>`); the macro gives every tensor the lifetime of its task"
        } else {
            "a callable cannot be generic: its digest must name one function [S0006]\nhelp: write one callable per element type"
        };
        cx.error(f.sig.generics.span(), msg.to_string());
    }
    for (i, arg) in f.sig.inputs.iter().enumerate() {
        let syn::FnArg::Typed(pt) = arg else {
            cx.error(arg.span(), "a callable cannot take `self` [S0006]".to_string());
            continue;
        };
        if model::is_orchestrator(&pt.ty) {
            if i > 0 {
                cx.error_spanned(
                    &pt.ty,
                    format!(
                        "the orchestrator must be the first parameter of `{}` [S0005]\nhelp: move `{}` to the front",
                        f.sig.ident.unraw(),
                        pt.pat.to_token_stream()
                    ),
                );
            }
            orchestrates = true;
            continue;
        }
        let syn::Pat::Ident(pi) = &*pt.pat else {
            cx.error(pt.pat.span(), "a callable parameter must be a plain name [S0004]".to_string());
            continue;
        };
        if let Some(ty) = model::classify(cx, &pt.ty) {
            params.push(Param { ident: pi.ident.clone(), ty, decl: (*pt.ty).clone() });
        }
    }
    match kind {
        Kind::Orch if !orchestrates => cx.error(
            f.sig.paren_token.span.join(),
            format!(
                "orchestration callable `{}` must take the orchestrator first [S0005]\nhelp: add `o: &mut Orchestrator<'_>` as its first parameter",
                f.sig.ident
            ),
        ),
        Kind::Sub if orchestrates => cx.error(
            f.sig.inputs.span(),
            "a host function (`sub`) runs on a SUB worker and cannot orchestrate [S0005]\nhelp: use `#[callable(orch)]` for an orchestration function".to_string(),
        ),
        _ => {}
    }
    Sig { params, orchestrates }
}

pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut cx = Ctxt::default();
    let opts = parse_options(&mut cx, attr);
    let func: syn::ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(e) => {
            cx.syn(syn::Error::new(e.span(), "`#[callable]` goes on a function [S0006]"));
            let errors = cx.into_compile_errors();
            return quote!(#item #errors);
        }
    };
    let kind = opts.kind.unwrap_or(Kind::Sub);
    let sig = analyse(&mut cx, &func, kind);
    if cx.failed() {
        let errors = cx.into_compile_errors();
        return quote!(#item #errors);
    }
    let source = read_source(&mut cx, &opts, &func, &sig);
    if cx.failed() {
        let errors = cx.into_compile_errors();
        return quote!(#item #errors);
    }
    let root = model::root(opts.krate.as_ref());
    let tokens = func.to_token_stream().to_string();
    let subkind = match (kind, sig.orchestrates, &source) {
        (Kind::Chip, false, None) => 1,
        (Kind::Chip, true, _) => 2,
        (Kind::Chip, false, Some(_)) => 3,
        _ => 0,
    };
    let name = &func.sig.ident;
    let desc = descriptor::build_with_source(
        kind.code(),
        &format!("{}::{}", model::crate_name(), name.unraw()),
        subkind,
        &sig.params,
        &tokens,
        source.as_ref().map(|s| (s.entry.as_str(), s.text.as_str())),
    );
    let user_fn = rewrite(&root, &func, &sig, kind);
    let shim = shim(&root, name, &sig, kind);
    let twin = twin_with_source(
        &root,
        &func.vis,
        name,
        kind,
        subkind,
        &sig.params,
        &desc,
        shim,
        TokenStream::new(),
        source.as_ref(),
    );
    quote! {
        #user_fn
        #twin
    }
}

/// Reads the OpenCL C source of `opencl = "path"` (relative to the crate's `Cargo.toml`), if
/// given: only a chip kernel takes one (S0007).
fn read_source(cx: &mut Ctxt, opts: &Options, f: &syn::ItemFn, sig: &Sig) -> Option<Source> {
    let (path, span) = opts.opencl.as_ref()?;
    if opts.kind != Some(Kind::Chip) {
        return None; // reported by `parse_options`
    }
    if sig.orchestrates {
        cx.error(
            *span,
            format!(
                "`opencl` source is for chip kernels, but `{}` is a chip orchestration (it takes the orchestrator) [S0007]\nhelp: give the source to the kernels it submits, and remove `opencl` here",
                f.sig.ident.unraw()
            ),
        );
        return None;
    }
    let entry = match &opts.entry {
        Some((e, _)) => e.clone(),
        None => f.sig.ident.unraw().to_string(),
    };
    let c_ident = entry.chars().next().is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && entry.chars().all(|c| c == '_' || c.is_ascii_alphanumeric());
    if !c_ident {
        cx.error(
            opts.entry.as_ref().map_or(*span, |e| e.1),
            format!(
                "`entry = \"{entry}\"` is not the name of an OpenCL C function [S0007]\nhelp: name the `__kernel` function in the source: letters, digits and `_`, not starting with a digit"
            ),
        );
        return None;
    }
    let Ok(dir) = std::env::var("CARGO_MANIFEST_DIR") else {
        cx.error(
            *span,
            format!("cannot read `{path}`: `CARGO_MANIFEST_DIR` is not set (build with cargo) [S0007]"),
        );
        return None;
    };
    // Resolved as `include_str!` below resolves it, so the macro hashes the text it includes.
    let resolved = format!("{dir}/{path}");
    match std::fs::read_to_string(&resolved) {
        Ok(text) => Some(Source { path: path.clone(), text, entry }),
        Err(e) => {
            cx.error(
                *span,
                format!(
                    "cannot read the OpenCL source `{path}` of `{}`: {e} (resolved to `{resolved}`) [S0007]\nhelp: the path is relative to the directory of the crate's `Cargo.toml`",
                    f.sig.ident.unraw()
                ),
            );
            None
        }
    }
}

/// The user's function with tensor parameter types made explicit: `In<T>` gets its elided
/// lifetime in kernels and host functions; in orchestrations it becomes a typed handle.
fn rewrite(root: &TokenStream, f: &syn::ItemFn, sig: &Sig, kind: Kind) -> TokenStream {
    let mut f = f.clone();
    let handles = kind == Kind::Orch || sig.orchestrates;
    let mut added_mut = false;
    let mut checks = Vec::new();
    for arg in f.sig.inputs.iter_mut() {
        let syn::FnArg::Typed(pt) = arg else { continue };
        let Some(ParamTy::Tensor { mode, marker, elem }) = model::classify(&mut Ctxt::default(), &pt.ty)
        else {
            continue;
        };
        let span = pt.ty.span();
        if handles {
            checks.push(model::marker_check(&marker, &elem));
        }
        let ty: syn::Type = if handles {
            let access = if mode == Mode::In { quote!(ReadOnly) } else { quote!(ReadWrite) };
            if mode != Mode::In
                && let syn::Pat::Ident(pi) = &mut *pt.pat
                && pi.mutability.is_none()
            {
                pi.mutability = Some(syn::Token![mut](span));
                added_mut = true;
            }
            syn::parse_quote_spanned!(span=> #root::dsl::TensorOf<#elem, #root::dsl::#access>)
        } else {
            syn::parse_quote_spanned!(span=> #marker<'_, #elem>)
        };
        *pt.ty = ty;
    }
    if added_mut {
        f.attrs.push(syn::parse_quote!(#[allow(unused_mut)]));
    }
    for (i, c) in checks.into_iter().enumerate() {
        f.block.stmts.insert(i, syn::parse_quote!(#c));
    }
    f.into_token_stream()
}

/// The function a worker calls with a task's arguments: decodes them and calls the user's fn.
pub(crate) fn shim(root: &TokenStream, name: &syn::Ident, sig: &Sig, kind: Kind) -> TokenStream {
    let fname = name.unraw().to_string();
    let args = format_ident!("__args", span = model::hidden());
    let mut lets = Vec::new();
    let mut idents = Vec::new();
    let (mut ti, mut si) = (0usize, 0usize);
    let handles = kind == Kind::Orch || sig.orchestrates;
    for (k, p) in sig.params.iter().enumerate() {
        // Hidden names: a parameter may share the function's name (`fn scale(.., scale: f32)`).
        let id = &format_ident!("__p{}", k, span = model::hidden());
        let pname = p.ident.unraw().to_string();
        idents.push(id.clone());
        match &p.ty {
            ParamTy::Tensor { mode, elem, .. } => {
                let get = if handles {
                    let access = if *mode == Mode::In { quote!(ReadOnly) } else { quote!(ReadWrite) };
                    quote!(#root::__private::tensor::<#elem, #root::dsl::#access>(#args, #ti, #fname, #pname)?)
                } else {
                    let f = match mode {
                        Mode::In => quote!(input),
                        Mode::Out => quote!(output),
                        Mode::InOut => quote!(inout),
                    };
                    quote!(#root::__private::#f::<#elem>(#args, #ti, #fname, #pname)?)
                };
                lets.push(quote!(let #id = #get;));
                ti += 1;
            }
            ParamTy::Scalar => {
                let ty = &p.decl;
                let get = if handles {
                    quote!(#root::__private::orch_scalar::<#ty>(#args, #si, #fname, #pname)?)
                } else {
                    quote!(#root::__private::scalar::<#ty>(#args, #si, #fname, #pname)?)
                };
                lets.push(quote!(let #id = #get;));
                si += 1;
            }
        }
    }
    if handles {
        let o = format_ident!("__o", span = model::hidden());
        quote! {
            #[doc(hidden)]
            #[allow(unused_mut)]
            pub fn __shim(
                #o: &mut #root::Orchestrator<'_>,
                #args: &#root::TaskArgs,
                _: &#root::chip::CallConfig,
            ) -> #root::Result<()> {
                #(#lets)*
                #root::__private::CallableReturn::into_orch(#name(#o, #(#idents),*))
            }
        }
    } else {
        let at = format_ident!("__at", span = model::hidden());
        quote! {
            #[doc(hidden)]
            pub fn __shim(#args: &#root::HostArgs<'_>) -> #root::HostResult {
                let #at = #root::__private::at_worker(#args);
                #(#lets)*
                #root::__private::CallableReturn::into_host(#name(#(#idents),*))
            }
        }
    }
}

/// [`twin_with_source`] without device source (host functions, orchestrations, graphs).
#[allow(clippy::too_many_arguments)]
pub(crate) fn twin(
    root: &TokenStream,
    vis: &syn::Visibility,
    name: &syn::Ident,
    kind: Kind,
    subkind: u32,
    params: &[Param],
    desc: &descriptor::Descriptor,
    shim: TokenStream,
    extra: TokenStream,
) -> TokenStream {
    twin_with_source(root, vis, name, kind, subkind, params, desc, shim, extra, None)
}

/// The twin of a callable `name`: a braced struct of the same name (type namespace only, so
/// it sits beside the function) whose associated items are the callable's identity, signature
/// and typed `call`; plus its entry in the link-time registry.
#[allow(clippy::too_many_arguments)]
///
/// A kernel with OpenCL `source` records its text and entry in the registry entry, and names
/// the file in an `include_str!` so that editing it rebuilds the crate (and so recomputes the
/// digest, which covers the text).
pub(crate) fn twin_with_source(
    root: &TokenStream,
    vis: &syn::Visibility,
    name: &syn::Ident,
    kind: Kind,
    subkind: u32,
    params: &[Param],
    desc: &descriptor::Descriptor,
    shim: TokenStream,
    extra: TokenStream,
    source: Option<&Source>,
) -> TokenStream {
    let fname = name.unraw().to_string();
    let path = format!("{}::{fname}", model::crate_name());
    let bytes = syn::LitByteStr::new(&desc.bytes, Span::call_site());
    let digest = desc.digest.iter();
    let digest2 = desc.digest.iter();
    let n = params.len();
    let (kind_variant, kind_marker) = match kind {
        Kind::Chip => (quote!(Chip), quote!(ChipCallable)),
        Kind::Sub => (quote!(HostFn), quote!(HostCallable)),
        Kind::Orch => (quote!(Orch), quote!(OrchCallable)),
    };
    let entry = match (kind, subkind) {
        (Kind::Chip, 1 | 3) => quote!(Kernel),
        (Kind::Chip, _) => quote!(ChipOrchestration),
        (Kind::Sub, _) => quote!(Host),
        (Kind::Orch, _) => quote!(Orchestration),
    };
    let param_items = params.iter().map(|p| {
        let pname = p.ident.unraw().to_string();
        let ty = p.type_name();
        let mode = match &p.ty {
            ParamTy::Tensor { mode: Mode::In, .. } => quote!(In),
            ParamTy::Tensor { mode: Mode::Out, .. } => quote!(Out),
            ParamTy::Tensor { mode: Mode::InOut, .. } => quote!(InOut),
            ParamTy::Scalar => quote!(Scalar),
        };
        let resolved = match &p.ty {
            ParamTy::Tensor { elem, .. } => quote!(#root::__private::Resolved::of::<#elem>()),
            ParamTy::Scalar => {
                let decl = &p.decl;
                quote!(#root::__private::Resolved::of::<#decl>())
            }
        };
        quote!(#root::__private::Param { name: #pname, mode: #root::__private::ParamMode::#mode, ty: #ty, resolved: #resolved })
    });
    let c = format_ident!("__c", span = model::hidden());
    let mut call_params = Vec::new();
    // Tensors first, then scalars (the order `TaskArgs` takes them in; the shim counts each
    // kind apart), whatever the order of the signature.
    let mut call_body = Vec::new();
    let mut call_scalars = Vec::new();
    for p in params {
        let id = &p.ident;
        let pname = id.unraw().to_string();
        match &p.ty {
            ParamTy::Tensor { mode, elem, .. } => {
                let (tr, tag) = match mode {
                    Mode::In => (quote!(InArg), quote!(Input)),
                    Mode::Out => (quote!(OutArg), quote!(Output)),
                    Mode::InOut => (quote!(InOutArg), quote!(InOut)),
                };
                call_params.push(quote_spanned!(p.decl.span()=> #id: impl #root::dsl::#tr<#elem>));
                call_body.push(quote! {
                    #c.__tensor(#root::dsl::#tr::<#elem>::tensor(&#id), #root::Tag::#tag, #pname)?;
                });
            }
            ParamTy::Scalar => {
                let ty = &p.decl;
                call_params.push(quote!(#id: #ty));
                let bits = quote_spanned!(ty.span()=> <#ty as #root::dsl::Scalar>::to_bits(#id));
                call_scalars.push(quote!(#c.__scalar(#bits);));
            }
        }
    }
    call_body.extend(call_scalars);
    // The function's own case: `aB` and `ab` are two functions, so two statics.
    let statik = format_ident!("__SIMPLER_CALLABLE_{}", fname);
    let linkme_path = quote!(#root::__private::linkme);
    let (new, source_arg, track) = match source {
        Some(s) => {
            let (path, text, entry) = (&s.path, &s.text, &s.entry);
            (
                quote!(__new_with_source),
                quote!(::core::option::Option::Some((#text, #entry)),),
                quote! {
                    // Names the file to the compiler: editing it rebuilds this crate.
                    const _: &str = ::core::include_str!(::core::concat!(::core::env!("CARGO_MANIFEST_DIR"), "/", #path));
                },
            )
        }
        None => (quote!(__new), TokenStream::new(), TokenStream::new()),
    };
    quote! {
        #track

        #[doc(hidden)]
        #[allow(non_camel_case_types, dead_code)]
        #vis struct #name {}

        #[doc(hidden)]
        #[allow(unsafe_code, non_upper_case_globals)]
        #[#root::__private::linkme::distributed_slice(#root::__private::CALLABLES)]
        #[linkme(crate = #linkme_path)]
        static #statik: #root::__private::CallableInfo = #root::__private::CallableInfo::#new(
            #fname,
            #path,
            #root::callable::CallableKind::#kind_variant,
            #bytes,
            [#(#digest),*],
            &#name::PARAMS,
            {
                const ENTRY: #root::__private::entry::#entry = #name::__shim;
                &ENTRY
            },
            #source_arg
        );

        #[allow(dead_code, clippy::needless_question_mark)]
        impl #name {
            /// The callable's name.
            pub const NAME: &'static str = #fname;
            /// Its canonical descriptor bytes.
            pub const DESCRIPTOR: &'static [u8] = #bytes;
            /// sha256 of the descriptor, computed at compile time.
            pub const DIGEST: #root::callable::Digest = #root::callable::Digest::from_bytes([#(#digest2),*]);
            /// Its kind.
            pub const KIND: #root::callable::CallableKind = #root::callable::CallableKind::#kind_variant;
            /// Its signature (what the generated code checks against).
            #[doc(hidden)]
            pub const PARAMS: [#root::__private::Param; #n] = [#(#param_items),*];
            /// Everything above, as recorded in the link-time registry.
            #[doc(hidden)]
            pub const INFO: &'static #root::__private::CallableInfo = &#statik;

            /// The handle tasks name it by (the one a Worker's registration returns), for the
            /// plain `Orchestrator` API.
            #[inline]
            pub fn handle() -> &'static #root::CallableHandle {
                Self::INFO.handle()
            }

            /// A typed call: arguments in signature order, checked at compile time.
            #[inline]
            pub fn call(#(#call_params),*) -> #root::Result<#root::dsl::Call<#root::dsl::kind::#kind_marker>> {
                #[allow(unused_mut)]
                let mut #c = #root::dsl::Call::__new(Self::INFO);
                #(#call_body)*
                ::core::result::Result::Ok(#c)
            }

            #shim

            #extra
        }
    }
}
