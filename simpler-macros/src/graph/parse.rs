//! Parse: the `task_graph!` input as a `syn::ItemFn`, turned into a [`GraphDef`] whose body is a
//! list of graph statements. Syntax errors (statements the graph syntax does not have, a
//! malformed `alloc`, a call without placement, signature shapes) are reported here.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::spanned::Spanned;

use crate::ctxt::{Ctxt, at};
use crate::model::{self, Param};

/// A parsed graph.
pub(crate) struct GraphDef {
    pub(crate) attrs: Vec<syn::Attribute>,
    pub(crate) vis: syn::Visibility,
    pub(crate) name: syn::Ident,
    /// `#[simpler(crate = path)]`.
    pub(crate) krate: Option<syn::Path>,
    pub(crate) params: Vec<Param>,
    pub(crate) body: Vec<Stmt>,
    /// The input's token text (hashed into the descriptor).
    pub(crate) tokens: String,
    /// A statement could not be parsed: end-of-graph checks would only add noise.
    pub(crate) partial: bool,
}

/// One statement of a graph body.
pub(crate) enum Stmt {
    /// `let x = alloc::<T>([dims]);` (`elem` is `None` when malformed; already reported).
    Alloc { ident: syn::Ident, elem: Option<syn::Type>, dims: Vec<syn::Expr> },
    /// Any other `let`: a scalar binding, passed through.
    Scalar { ident: syn::Ident, local: syn::Local },
    /// `callee(args)[.config(..)].on(place);`
    Call(CallLine),
    /// `scope(|| { ... });`
    Scope(Vec<Stmt>),
    /// `group(|| { ... });`: its call lines are the members of one task.
    Group { span: Span, members: Vec<CallLine> },
    /// `let xs = x.split(n);`, `let xs = x.grid([a, b]);` or `let xs = x.tiles([r, c]);`: a
    /// partition of tensor `source` into pieces (`counts`: pieces per axis, from axis 0; for
    /// `tiles`, the tile's dimensions).
    Partition { ident: syn::Ident, source: syn::Ident, method: syn::Ident, counts: Vec<syn::Expr> },
    /// `for i in a..b { ... }`, or `for (i, t) in xs { ... }` over a partition (`piece`: `t` and
    /// the partition's name; the range is then the partition's pieces).
    For(Box<ForLoop>),
}

/// A `for` loop of a graph body (an index launch).
pub(crate) struct ForLoop {
    /// The index variable (`_` allowed).
    pub(crate) var: syn::Ident,
    /// `a..b` of `for i in a..b` (`None`: over a partition's pieces).
    pub(crate) range: Option<(syn::Expr, syn::Expr)>,
    /// `(t, xs)` of `for (i, t) in xs`.
    pub(crate) piece: Option<(syn::Ident, syn::Ident)>,
    pub(crate) body: Vec<Stmt>,
    /// The `for` keyword.
    pub(crate) span: Span,
}

/// A call line: `callee(args)[.config(..)].on(place)`.
#[derive(Clone)]
pub(crate) struct CallLine {
    pub(crate) callee: syn::Expr,
    /// The span of the argument list's parentheses.
    pub(crate) paren: Span,
    pub(crate) args: Vec<syn::Expr>,
    pub(crate) mods: Vec<syn::ExprMethodCall>,
    pub(crate) place: syn::Expr,
    pub(crate) span: Span,
}

/// Parses the input; `None` only when it is not a function at all (reported in `cx`).
pub(crate) fn parse(cx: &mut Ctxt, input: TokenStream) -> Option<GraphDef> {
    let mut func: syn::ItemFn = match syn::parse2(input) {
        Ok(f) => f,
        Err(e) => {
            let msg = format!(
                "{e}\nhelp: `task_graph!` takes one function: `task_graph! {{ fn name(x: In<f32>, y: Out<f32>) {{ ... }} }}`"
            );
            cx.syn(syn::Error::new(e.span(), msg));
            return None;
        }
    };
    let krate = take_crate_option(cx, &mut func);
    let tokens = func.to_token_stream().to_string();
    let params = signature(cx, &func.sig);
    let mut def = GraphDef {
        attrs: func.attrs.clone(),
        vis: func.vis.clone(),
        name: func.sig.ident.clone(),
        krate,
        params,
        body: Vec::new(),
        tokens,
        partial: false,
    };
    def.body = stmts(cx, &mut def.partial, &func.block.stmts);
    Some(def)
}

/// The graph's parameters: tensors and scalars, no orchestrator (the macro adds it).
fn signature(cx: &mut Ctxt, sig: &syn::Signature) -> Vec<Param> {
    let mut params = Vec::new();
    for arg in &sig.inputs {
        let syn::FnArg::Typed(pt) = arg else {
            cx.error(arg.span(), "a task graph cannot take `self` [S0006]".to_string());
            continue;
        };
        let syn::Pat::Ident(pi) = &*pt.pat else {
            cx.error(pt.pat.span(), "a graph parameter must be a plain name [S0004]".to_string());
            continue;
        };
        if model::is_orchestrator(&pt.ty) {
            cx.error(
                pt.ty.span(),
                "a task graph gets its orchestrator implicitly [S0004]\nhelp: remove this parameter"
                    .to_string(),
            );
            continue;
        }
        if let Some(ty) = model::classify(cx, &pt.ty) {
            params.push(Param { ident: pi.ident.clone(), ty, decl: (*pt.ty).clone() });
        }
    }
    if !sig.generics.params.is_empty() {
        cx.error(
            sig.generics.span(),
            "a task graph cannot be generic [S0006]\nhelp: write one graph per element type".to_string(),
        );
    }
    if let syn::ReturnType::Type(arrow, _) = &sig.output {
        cx.error(
            arrow.span(),
            "a task graph returns nothing [S0006]\nhelp: remove the return type; the generated function returns `simpler::Result<()>`".to_string(),
        );
    }
    let qualifiers = [
        sig.asyncness.map(|t| (t.span(), "async")),
        sig.unsafety.map(|t| (t.span(), "unsafe")),
        sig.constness.map(|t| (t.span(), "const")),
        sig.abi.as_ref().map(|a| (a.extern_token.span(), "extern")),
    ];
    for (span, word) in qualifiers.into_iter().flatten() {
        cx.error(span, format!("a task graph cannot be `{word}` [S0006]\nhelp: remove `{word}`"));
    }
    params
}

/// Removes `#[simpler(crate = path)]` from the function's attributes and returns the path.
fn take_crate_option(cx: &mut Ctxt, func: &mut syn::ItemFn) -> Option<syn::Path> {
    let mut krate = None;
    let mut keep = Vec::new();
    for attr in std::mem::take(&mut func.attrs) {
        if !attr.path().is_ident("simpler") {
            keep.push(attr);
            continue;
        }
        let r = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("crate") {
                if let Some((_, first)) = &krate {
                    return Err(meta.error(format!(
                        "duplicate option `crate` in `#[simpler(...)]` (first given at {}) [S0002]\nhelp: remove one of them",
                        at(*first)
                    )));
                }
                let span = meta.path.span();
                krate = Some((meta.value()?.parse::<syn::Path>()?, span));
                Ok(())
            } else {
                let name = model::squash(meta.path.to_token_stream());
                Err(meta.error(format!(
                    "unknown option `{name}` in `#[simpler(...)]` [S0003]\nhelp: the only option is `crate = path`"
                )))
            }
        });
        if let Err(e) = r {
            cx.syn(e);
        }
    }
    func.attrs = keep;
    krate.map(|(p, _)| p)
}

fn unsupported(cx: &mut Ctxt, partial: &mut bool, span: Span) {
    *partial = true;
    cx.error(
        span,
        "unsupported statement in `task_graph!` [S0109]\nhelp: a graph body has `let x = alloc::<T>([dims]);`, scalar `let`s, call lines `f(args).on(placement);`, `scope(|| { ... });`, `group(|| { ... });`, partitions `let xs = x.split(N);` and loops `for i in 0..N { ... }`; for branches and loops whose bound is known only at run time, write a `#[callable(orch)]` function with the builder API".to_string(),
    );
}

fn stmts(cx: &mut Ctxt, partial: &mut bool, input: &[syn::Stmt]) -> Vec<Stmt> {
    let mut out = Vec::new();
    for stmt in input {
        match stmt {
            syn::Stmt::Local(local) => {
                if let Some(s) = parse_local(cx, partial, local) {
                    out.push(s);
                }
            }
            syn::Stmt::Expr(syn::Expr::ForLoop(f), _) => {
                if let Some(l) = parse_for(cx, partial, f, &mut out) {
                    out.push(Stmt::For(Box::new(l)));
                }
            }
            syn::Stmt::Expr(e, _) => {
                if let Some(inner) = block_call(e, "scope") {
                    out.push(Stmt::Scope(stmts(cx, partial, inner)));
                } else if let Some(inner) = block_call(e, "group") {
                    let mut members = Vec::new();
                    for s in inner {
                        match s {
                            syn::Stmt::Expr(e, _) => match parse_call_line(e) {
                                Some(l) => members.push(l),
                                None => unsupported(cx, partial, e.span()),
                            },
                            other => unsupported(cx, partial, other.span()),
                        }
                    }
                    out.push(Stmt::Group { span: e.span(), members });
                } else if let Some(line) = parse_call_line(e) {
                    out.push(Stmt::Call(line));
                } else if is_unplaced_call(e) {
                    *partial = true;
                    cx.error(
                        e.span(),
                        "this call has no placement [S0109]\nhelp: add `.on(sub())`, `.on(chip(N))` or `.on(worker(N))`".to_string(),
                    );
                } else {
                    unsupported(cx, partial, e.span());
                }
            }
            other => unsupported(cx, partial, other.span()),
        }
    }
    out
}

fn parse_local(cx: &mut Ctxt, partial: &mut bool, local: &syn::Local) -> Option<Stmt> {
    let ident = match &local.pat {
        syn::Pat::Ident(pi) if pi.subpat.is_none() => pi.ident.clone(),
        syn::Pat::Type(pt) => match &*pt.pat {
            syn::Pat::Ident(pi) => pi.ident.clone(),
            other => {
                unsupported(cx, partial, other.span());
                return None;
            }
        },
        other => {
            unsupported(cx, partial, other.span());
            return None;
        }
    };
    let Some(init) = &local.init else {
        unsupported(cx, partial, local.span());
        return None;
    };
    // `x.split(n)`, `x.grid([a, b])`
    if let Some((source, method, counts)) = partition_expr(cx, partial, &init.expr) {
        return Some(Stmt::Partition { ident, source, method, counts });
    }
    // `alloc::<T>([dims])`
    if let syn::Expr::Call(call) = &*init.expr
        && let syn::Expr::Path(p) = &*call.func
        && p.path.segments.len() == 1
        && p.path.segments[0].ident == "alloc"
    {
        let elem = match &p.path.segments[0].arguments {
            syn::PathArguments::AngleBracketed(a) if a.args.len() == 1 => match &a.args[0] {
                syn::GenericArgument::Type(t) => Some(t.clone()),
                _ => None,
            },
            _ => None,
        };
        let dims = match call.args.first() {
            Some(syn::Expr::Array(a)) if call.args.len() == 1 => Some(a.elems.iter().cloned().collect()),
            _ => None,
        };
        return Some(match (elem, dims) {
            (Some(elem), Some(dims)) => Stmt::Alloc { ident, elem: Some(elem), dims },
            _ => {
                *partial = true;
                cx.error(
                    call.span(),
                    "an intermediate is `alloc::<T>([dim, ...])` [S0109]\nhelp: e.g. `let h = alloc::<f32>([n, 64]);`".to_string(),
                );
                Stmt::Alloc { ident, elem: None, dims: Vec::new() }
            }
        });
    }
    Some(Stmt::Scalar { ident, local: local.clone() })
}

/// `x.split(n)` / `x.grid([a, b])` / `x.tiles([r, c])`: the tensor, the method and the piece
/// counts per axis (for `tiles`, the tile's dimensions: the count is the run's). `rows(..)` and
/// `slice(..)` are refused here: their pieces depend on run-time bounds.
fn partition_expr(
    cx: &mut Ctxt,
    partial: &mut bool,
    e: &syn::Expr,
) -> Option<(syn::Ident, syn::Ident, Vec<syn::Expr>)> {
    let syn::Expr::MethodCall(m) = unwrap(e) else { return None };
    let source = single_ident(&m.receiver)?.clone();
    let method = m.method.to_string();
    if !matches!(method.as_str(), "split" | "grid" | "tiles" | "rows" | "slice") {
        return None;
    }
    let array = |e: &syn::Expr| match unwrap(e) {
        syn::Expr::Array(a) if !a.elems.is_empty() => Some(a.elems.iter().cloned().collect::<Vec<_>>()),
        syn::Expr::Reference(r) if r.mutability.is_none() => match unwrap(&r.expr) {
            syn::Expr::Array(a) if !a.elems.is_empty() => Some(a.elems.iter().cloned().collect()),
            _ => None,
        },
        _ => None,
    };
    // For `tiles`, the "counts" are the tile's dimensions (the piece count is the run's).
    let counts = match (method.as_str(), m.args.len(), m.args.first()) {
        ("split", 1, Some(n)) => Some(vec![n.clone()]),
        ("grid" | "tiles", 1, Some(a)) => array(a),
        _ => None,
    };
    match counts {
        Some(counts) => Some((source, m.method.clone(), counts)),
        None => {
            *partial = true;
            cx.error(
                m.method.span(),
                format!(
                    "`{source}.{method}(..)` is not a partition a graph can check [S0115]\nhelp: a graph partitions a tensor into pieces it can tell apart: `{source}.split(N)` (N equal pieces of axis 0), `{source}.grid([A, B])` (A x B pieces) with counts known at compile time, or `{source}.tiles([R, C])` with a tile shape known at compile time; for `rows(..)`, `slice(..)` or counts and tile shapes known only at run time, use `IndexLaunch` in a `#[callable(orch)]` function"
                ),
            );
            Some((source, m.method.clone(), Vec::new()))
        }
    }
}

/// `for i in a..b { .. }` or `for (i, t) in xs { .. }` / `for (i, t) in x.split(n) { .. }` (the
/// inline partition is pushed to `out` first, under a hidden name).
fn parse_for(
    cx: &mut Ctxt,
    partial: &mut bool,
    f: &syn::ExprForLoop,
    out: &mut Vec<Stmt>,
) -> Option<ForLoop> {
    let span = f.for_token.span;
    let help = "help: a graph loop is `for i in 0..N { .. }` with `N` a literal or a `const`, or `for (i, t) in xs { .. }` over a partition `let xs = x.split(N);` or `let xs = x.tiles([R]);` (or `for (i, t) in x.tiles([R]) { .. }`)";
    let bad = |cx: &mut Ctxt, partial: &mut bool, span: Span, what: &str| {
        *partial = true;
        cx.error(span, format!("{what} [S0115]\n{help}"));
    };
    let pat_ident = |p: &syn::Pat| match p {
        syn::Pat::Ident(pi) if pi.subpat.is_none() && pi.by_ref.is_none() => Some(pi.ident.clone()),
        syn::Pat::Wild(w) => Some(syn::Ident::new("_", w.underscore_token.span)),
        _ => None,
    };
    let body = stmts(cx, partial, &f.body.stmts);
    if let syn::Expr::Range(r) = unwrap(&f.expr) {
        let Some(var) = pat_ident(&f.pat) else {
            bad(cx, partial, f.pat.span(), "a loop over a range binds one index variable");
            return None;
        };
        let (Some(start), Some(end), syn::RangeLimits::HalfOpen(_)) = (&r.start, &r.end, &r.limits) else {
            bad(cx, partial, r.span(), "a graph loop runs over a half-open range `a..b`");
            return None;
        };
        return Some(ForLoop {
            var,
            range: Some(((**start).clone(), (**end).clone())),
            piece: None,
            body,
            span,
        });
    }
    let syn::Pat::Tuple(t) = &*f.pat else {
        bad(cx, partial, f.pat.span(), "a loop over a partition binds `(i, piece)`");
        return None;
    };
    let (Some(var), Some(piece)) = (
        t.elems.first().and_then(pat_ident),
        t.elems.iter().nth(1).and_then(pat_ident).filter(|_| t.elems.len() == 2),
    ) else {
        bad(cx, partial, t.span(), "a loop over a partition binds `(i, piece)`");
        return None;
    };
    // `for (_, t) in xs`: the piece still needs the index, under a name the user cannot see.
    let var = if var == "_" { syn::Ident::new("__index", Span::mixed_site()) } else { var };
    let part = if let Some(p) = single_ident(&f.expr) {
        p.clone()
    } else if let Some((source, method, counts)) = partition_expr(cx, partial, &f.expr) {
        let hidden = syn::Ident::new(&format!("__part_{piece}"), piece.span());
        out.push(Stmt::Partition { ident: hidden.clone(), source, method, counts });
        hidden
    } else {
        bad(cx, partial, f.expr.span(), "a graph loop runs over a range `0..N` or a partition");
        return None;
    };
    Some(ForLoop { var, range: None, piece: Some((piece, part)), body, span })
}

/// The path's single identifier, if it is one.
pub(crate) fn single_ident(e: &syn::Expr) -> Option<&syn::Ident> {
    match unwrap(e) {
        syn::Expr::Path(p) if p.qself.is_none() && p.attrs.is_empty() => p.path.get_ident(),
        _ => None,
    }
}

/// `e` without surrounding parentheses and invisible groups.
pub(crate) fn unwrap(mut e: &syn::Expr) -> &syn::Expr {
    loop {
        match e {
            syn::Expr::Paren(p) => e = &p.expr,
            syn::Expr::Group(g) => e = &g.expr,
            _ => return e,
        }
    }
}

/// A `name(|| { ... })` statement: the closure's statements.
fn block_call<'a>(e: &'a syn::Expr, name: &str) -> Option<&'a [syn::Stmt]> {
    let syn::Expr::Call(call) = e else { return None };
    if single_ident(&call.func).is_none_or(|i| i != name) || call.args.len() != 1 {
        return None;
    }
    let syn::Expr::Closure(c) = &call.args[0] else { return None };
    if !c.inputs.is_empty() {
        return None;
    }
    match &*c.body {
        syn::Expr::Block(b) => Some(&b.block.stmts),
        _ => None,
    }
}

/// `f(args)` or `f(args).config(..)` without `.on(..)`.
fn is_unplaced_call(e: &syn::Expr) -> bool {
    match e {
        syn::Expr::Call(c) => matches!(&*c.func, syn::Expr::Path(_)),
        syn::Expr::MethodCall(m) if m.method == "config" => is_unplaced_call(&m.receiver),
        _ => false,
    }
}

fn parse_call_line(e: &syn::Expr) -> Option<CallLine> {
    let syn::Expr::MethodCall(on) = e else { return None };
    if on.method != "on" || on.args.len() != 1 {
        return None;
    }
    let mut mods = Vec::new();
    let mut recv = &*on.receiver;
    while let syn::Expr::MethodCall(m) = recv {
        if m.method != "config" || m.args.len() != 1 {
            return None;
        }
        mods.push(m.clone());
        recv = &*m.receiver;
    }
    let syn::Expr::Call(call) = recv else { return None };
    if !matches!(&*call.func, syn::Expr::Path(_)) {
        return None;
    }
    mods.reverse();
    Some(CallLine {
        callee: (*call.func).clone(),
        paren: call.paren_token.span.join(),
        args: call.args.iter().cloned().collect(),
        mods,
        place: on.args[0].clone(),
        span: e.span(),
    })
}
