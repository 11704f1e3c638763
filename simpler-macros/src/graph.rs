//! `task_graph!`: an orchestration function written as a graph of calls.
//!
//! Parse (the body is a `syn::ItemFn`), model (a table of tensors and their dataflow state),
//! check (def-use, write access, aliasing inside one call, unread values, groups) and lower
//! (one typed `call(...).on(...)` per line, plus the write-after-read `after` edges the engine
//! does not infer) in one pass over the statements; every error is collected.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;

use crate::callable::{self, Sig};
use crate::ctxt::{Ctxt, at};
use crate::descriptor;
use crate::model::{self, Kind, Mode, Param, ParamTy};

/// Where a tensor came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// A graph parameter with this mode.
    Param(Mode),
    /// An `alloc` inside the graph.
    Alloc,
}

/// One tensor the graph knows.
struct Tensor {
    name: String,
    decl: Span,
    origin: Origin,
    /// The task that wrote the current value (`None`: the caller wrote it).
    writer: Option<usize>,
    /// Whether it holds a value.
    written: bool,
    /// Tasks that read the current value.
    readers: Vec<usize>,
    /// Where the current value was written (for messages).
    written_at: Option<Span>,
    /// Out of scope (its `scope` ended).
    dead: bool,
    /// Already reported: no follow-on errors about it.
    errored: bool,
}

/// How one argument of a call uses its tensor.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    Read,
    Write,
}

struct Lowering {
    cx: Ctxt,
    root: TokenStream,
    o: syn::Ident,
    g: syn::Ident,
    tensors: Vec<Tensor>,
    /// Name scopes: name -> tensor index, or `None` for a scalar binding that shadows.
    scopes: Vec<Vec<(String, Option<usize>)>>,
    /// Task numbers as the engine counts them.
    next_task: usize,
    body: Vec<TokenStream>,
    replay: Vec<TokenStream>,
    /// An unsupported statement was seen: end-of-graph checks would only add noise.
    partial: bool,
}

pub(crate) fn expand(input: TokenStream) -> TokenStream {
    let mut func: syn::ItemFn = match syn::parse2(input) {
        Ok(f) => f,
        Err(e) => {
            let msg = format!(
                "{e}\nhelp: `task_graph!` takes one function: `task_graph! {{ fn name(x: In<f32>, y: Out<f32>) {{ ... }} }}`"
            );
            return syn::Error::new(e.span(), msg).to_compile_error();
        }
    };
    let mut cx = Ctxt::default();
    let krate = take_crate_option(&mut cx, &mut func);
    let root = model::root(krate.as_ref());
    let tokens = func.to_token_stream().to_string();

    // The signature: tensors and scalars, no orchestrator (the macro adds it).
    let mut params = Vec::new();
    for arg in &func.sig.inputs {
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
        if let Some(ty) = model::classify(&mut cx, &pt.ty) {
            params.push(Param { ident: pi.ident.clone(), ty, decl: (*pt.ty).clone() });
        }
    }
    if !func.sig.generics.params.is_empty() {
        cx.error(
            func.sig.generics.span(),
            "a task graph cannot be generic [S0006]\nhelp: write one graph per element type".to_string(),
        );
    }
    if let syn::ReturnType::Type(arrow, _) = &func.sig.output {
        cx.error(
            arrow.span(),
            "a task graph returns nothing [S0006]\nhelp: remove the return type; the generated function returns `simpler::Result<()>`".to_string(),
        );
    }
    let qualifiers = [
        func.sig.asyncness.map(|t| (t.span(), "async")),
        func.sig.unsafety.map(|t| (t.span(), "unsafe")),
        func.sig.constness.map(|t| (t.span(), "const")),
        func.sig.abi.as_ref().map(|a| (a.extern_token.span(), "extern")),
    ];
    for (span, word) in qualifiers.into_iter().flatten() {
        cx.error(span, format!("a task graph cannot be `{word}` [S0006]\nhelp: remove `{word}`"));
    }

    let o = format_ident!("__o", span = model::hidden());
    let g = format_ident!("__g", span = model::hidden());
    let mut lw = Lowering {
        cx,
        root: root.clone(),
        o: o.clone(),
        g: g.clone(),
        tensors: Vec::new(),
        scopes: vec![Vec::new()],
        next_task: 0,
        body: Vec::new(),
        replay: Vec::new(),
        partial: false,
    };
    for p in &params {
        if let ParamTy::Tensor { mode, .. } = &p.ty {
            let name = p.ident.to_string();
            lw.declare(&name, p.ident.span(), Origin::Param(*mode));
            lw.replay.push(quote!(#g.tensor(#name);));
        } else {
            lw.scopes[0].push((p.ident.to_string(), None));
        }
    }
    lw.stmts(&func.block.stmts);
    lw.close_scope(true);

    let name = func.sig.ident.clone();
    let vis = func.vis.clone();
    let attrs = &func.attrs;
    let sig = Sig { params, orchestrates: true };
    let desc = descriptor::build(
        Kind::Orch.code(),
        &format!("{}::{name}", model::crate_name()),
        0,
        &sig.params,
        &tokens,
    );
    let fn_params = sig.params.iter().map(|p| {
        let id = &p.ident;
        match &p.ty {
            ParamTy::Tensor { mode, elem, .. } => {
                let span = p.decl.span();
                if *mode == Mode::In {
                    quote_spanned!(span=> #id: #root::TensorOf<#elem, #root::ReadOnly>)
                } else {
                    quote_spanned!(span=> mut #id: #root::TensorOf<#elem, #root::ReadWrite>)
                }
            }
            ParamTy::Scalar => {
                let ty = &p.decl;
                quote!(#id: #ty)
            }
        }
    });
    let markers = sig.params.iter().filter_map(|p| match &p.ty {
        ParamTy::Tensor { marker, elem, .. } => Some(model::marker_check(marker, elem)),
        ParamTy::Scalar => None,
    });
    let markers: Vec<TokenStream> = markers.collect();
    let failed = lw.cx.failed();
    let body = if failed { Vec::new() } else { std::mem::take(&mut lw.body) };
    let replay = if failed { Vec::new() } else { std::mem::take(&mut lw.replay) };
    let shim = callable::shim(&root, &name, &sig, Kind::Orch);
    let extra = quote! {
        /// The graph's structure: its tasks and the dependencies between them, computed with
        /// the engine's rules (compare it with a captured run using `TaskGraph::matches`).
        pub fn graph() -> #root::TaskGraph {
            let mut #g = #root::__private::GraphBuilder::new();
            #(#replay)*
            #g.finish()
        }
    };
    let twin = callable::twin(&root, &vis, &name, Kind::Orch, 0, &sig.params, &desc, shim, extra);
    let errors = lw.cx.into_compile_errors();
    quote! {
        #(#attrs)*
        #[allow(unused_mut, unused_variables, clippy::needless_question_mark)]
        #vis fn #name(#o: &mut #root::Orchestrator<'_>, #(#fn_params),*) -> #root::Result<()> {
            #(#markers)*
            #(#body)*
            ::core::result::Result::Ok(())
        }
        #twin
        #errors
    }
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

/// The path's single identifier, if it is one.
fn single_ident(e: &syn::Expr) -> Option<&syn::Ident> {
    match unwrap(e) {
        syn::Expr::Path(p) if p.qself.is_none() && p.attrs.is_empty() => p.path.get_ident(),
        _ => None,
    }
}

/// `e` without surrounding parentheses and invisible groups.
fn unwrap(mut e: &syn::Expr) -> &syn::Expr {
    loop {
        match e {
            syn::Expr::Paren(p) => e = &p.expr,
            syn::Expr::Group(g) => e = &g.expr,
            _ => return e,
        }
    }
}

/// Every identifier in a token stream (to find tensors hidden inside expressions).
fn idents(ts: TokenStream, out: &mut Vec<proc_macro2::Ident>) {
    for tt in ts {
        match tt {
            proc_macro2::TokenTree::Ident(i) => out.push(i),
            proc_macro2::TokenTree::Group(g) => idents(g.stream(), out),
            _ => {}
        }
    }
}

/// Levenshtein distance, for "a tensor with a similar name exists".
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
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

/// A parsed call line: `callee(args)[.config(..)].on(place)`.
struct CallLine<'a> {
    callee: &'a syn::Expr,
    /// The span of the argument list's parentheses.
    paren: Span,
    args: Vec<&'a syn::Expr>,
    mods: Vec<&'a syn::ExprMethodCall>,
    place: &'a syn::Expr,
    span: Span,
}

fn parse_call_line(e: &syn::Expr) -> Option<CallLine<'_>> {
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
        mods.push(m);
        recv = &*m.receiver;
    }
    let syn::Expr::Call(call) = recv else { return None };
    if !matches!(&*call.func, syn::Expr::Path(_)) {
        return None;
    }
    mods.reverse();
    Some(CallLine {
        callee: &call.func,
        paren: call.paren_token.span.join(),
        args: call.args.iter().collect(),
        mods,
        place: &on.args[0],
        span: e.span(),
    })
}

impl Lowering {
    fn declare(&mut self, name: &str, span: Span, origin: Origin) -> usize {
        let written = matches!(origin, Origin::Param(Mode::In | Mode::InOut));
        self.tensors.push(Tensor {
            name: name.to_string(),
            decl: span,
            origin,
            writer: None,
            written,
            readers: Vec::new(),
            written_at: None,
            dead: false,
            errored: false,
        });
        let id = self.tensors.len() - 1;
        self.scopes.last_mut().expect("a scope").push((name.to_string(), Some(id)));
        id
    }

    /// The live binding of `name`: `Some(Some(t))` a tensor, `Some(None)` a scalar.
    fn lookup(&self, name: &str) -> Option<Option<usize>> {
        self.scopes.iter().rev().flat_map(|s| s.iter().rev()).find(|(n, _)| n == name).map(|(_, t)| *t)
    }

    /// A tensor of this name whose scope has ended.
    fn dead(&self, name: &str) -> Option<usize> {
        self.tensors.iter().rposition(|t| t.name == name && t.dead)
    }

    fn stmts(&mut self, stmts: &[syn::Stmt]) {
        for stmt in stmts {
            self.stmt(stmt);
        }
    }

    fn unsupported(&mut self, span: Span) {
        self.partial = true;
        self.cx.error(
            span,
            "unsupported statement in `task_graph!` [S0109]\nhelp: a graph body has `let x = alloc::<T>([dims]);`, scalar `let`s, call lines `f(args).on(placement);`, `scope(|| { ... });` and `group(|| { ... });`; for loops and branches, write a `#[callable(orch)]` function with the builder API".to_string(),
        );
    }

    fn stmt(&mut self, stmt: &syn::Stmt) {
        match stmt {
            syn::Stmt::Local(local) => self.local(local),
            syn::Stmt::Expr(e, _) => {
                if let Some(inner) = block_call(e, "scope") {
                    let (o, g) = (&self.o, &self.g);
                    self.body.push(quote!(#o.scope_begin()?;));
                    let _ = g;
                    self.scopes.push(Vec::new());
                    self.stmts(inner);
                    self.close_scope(false);
                    let o = &self.o;
                    self.body.push(quote!(#o.scope_end()?;));
                } else if let Some(inner) = block_call(e, "group") {
                    self.group(e.span(), inner);
                } else if let Some(line) = parse_call_line(e) {
                    self.call(&[line]);
                } else if is_unplaced_call(e) {
                    self.partial = true;
                    self.cx.error(
                        e.span(),
                        "this call has no placement [S0109]\nhelp: add `.on(sub())`, `.on(chip(N))` or `.on(worker(N))`".to_string(),
                    );
                } else {
                    self.unsupported(e.span());
                }
            }
            other => self.unsupported(other.span()),
        }
    }

    fn local(&mut self, local: &syn::Local) {
        let ident = match &local.pat {
            syn::Pat::Ident(pi) if pi.subpat.is_none() => pi.ident.clone(),
            syn::Pat::Type(pt) => match &*pt.pat {
                syn::Pat::Ident(pi) => pi.ident.clone(),
                other => return self.unsupported(other.span()),
            },
            other => return self.unsupported(other.span()),
        };
        let Some(init) = &local.init else { return self.unsupported(local.span()) };
        // `alloc::<T>([dims])`
        if let syn::Expr::Call(call) = &*init.expr
            && let syn::Expr::Path(p) = &*call.func
        {
            {
                let seg = p.path.segments.last();
                if p.path.segments.len() == 1 && seg.is_some_and(|s| s.ident == "alloc") {
                    let elem = match seg.map(|s| &s.arguments) {
                        Some(syn::PathArguments::AngleBracketed(a)) if a.args.len() == 1 => {
                            match &a.args[0] {
                                syn::GenericArgument::Type(t) => Some(t.clone()),
                                _ => None,
                            }
                        }
                        _ => None,
                    };
                    let dims = match call.args.first() {
                        Some(syn::Expr::Array(a)) if call.args.len() == 1 => {
                            Some(a.elems.iter().collect::<Vec<_>>())
                        }
                        _ => None,
                    };
                    let (Some(elem), Some(dims)) = (elem, dims) else {
                        self.cx.error(
                            call.span(),
                            "an intermediate is `alloc::<T>([dim, ...])` [S0109]\nhelp: e.g. `let h = alloc::<f32>([n, 64]);`".to_string(),
                        );
                        self.partial = true;
                        let id = self.declare(&ident.to_string(), ident.span(), Origin::Alloc);
                        self.tensors[id].errored = true;
                        return;
                    };
                    let (root, o, g) = (&self.root, &self.o, &self.g);
                    let name = ident.to_string();
                    self.body.push(quote_spanned! {ident.span()=>
                        let mut #ident = #o.alloc_of::<#elem>(&[#(#root::__private::dim(#dims)?),*])?;
                    });
                    self.replay.push(quote!(#g.alloc(#name);));
                    self.declare(&name, ident.span(), Origin::Alloc);
                    return;
                }
            }
        }
        // A scalar binding: passed through; it shadows any tensor of the same name.
        self.no_hidden_tensors(&init.expr);
        self.body.push(local.to_token_stream());
        self.scopes.last_mut().expect("a scope").push((ident.to_string(), None));
    }

    /// Ends the innermost scope (or the function): unread values and unwritten outputs.
    fn close_scope(&mut self, function: bool) {
        let scope = self.scopes.pop().unwrap_or_default();
        for (_, t) in scope {
            let Some(id) = t else { continue };
            let t = &self.tensors[id];
            if t.errored || self.partial {
                self.tensors[id].dead = !function;
                continue;
            }
            match t.origin {
                Origin::Alloc if !t.name.starts_with('_') => {
                    if !t.written {
                        self.cx.error(
                            t.decl,
                            format!(
                                "intermediate `{}` is allocated but never used [S0107]\nhelp: remove it, or name it `_{}`",
                                t.name, t.name
                            ),
                        );
                    } else if t.readers.is_empty() && t.writer.is_some() {
                        let when = t.written_at.map(|s| format!(" at {}", at(s))).unwrap_or_default();
                        self.cx.error(
                            t.written_at.unwrap_or(t.decl),
                            format!(
                                "the value written to `{}`{when} is never read [S0107]\nhelp: read it, drop the call that writes it, or name the intermediate `_{}`",
                                t.name, t.name
                            ),
                        );
                    }
                }
                Origin::Param(Mode::Out) if function && !t.written => {
                    self.cx.error(
                        t.decl,
                        format!(
                            "graph output `{}` is never written [S0106]\nhelp: pass `&mut {}` to an `Out` or `InOut` parameter of some call",
                            t.name, t.name
                        ),
                    );
                }
                _ => {}
            }
            self.tensors[id].dead = !function;
        }
    }

    /// Classifies one argument: a tensor use, or `None` for a scalar expression.
    fn classify(&mut self, e: &syn::Expr) -> Option<(usize, Use, Span)> {
        let e = unwrap(e);
        let (inner, use_) = match e {
            syn::Expr::Reference(r) => {
                (unwrap(&r.expr), if r.mutability.is_some() { Use::Write } else { Use::Read })
            }
            other => (other, Use::Read),
        };
        let explicit = matches!(e, syn::Expr::Reference(_));
        if single_ident(inner).is_none() {
            self.no_hidden_tensors(e);
            return None;
        }
        let ident = single_ident(inner)?;
        let name = ident.to_string();
        match self.lookup(&name) {
            Some(Some(id)) => Some((id, use_, ident.span())),
            Some(None) if explicit => {
                self.cx.error(
                    ident.span(),
                    format!("`{name}` is a scalar, not a tensor of this graph [S0110]\nhelp: pass scalars by value"),
                );
                None
            }
            Some(None) => None,
            None => {
                if let Some(d) = self.dead(&name) {
                    self.cx.error(
                        ident.span(),
                        format!(
                            "`{name}` is out of scope here: it was allocated at {} inside a `scope` that has ended [S0110]\nhelp: allocate it before the scope, or use it inside",
                            at(self.tensors[d].decl)
                        ),
                    );
                } else if explicit {
                    let help = match self.similar(&name) {
                        Some(n) => format!("a tensor with a similar name exists: `{n}`"),
                        None => "tensors are the graph's `In`/`Out`/`InOut` parameters and its `let x = alloc::<T>([..]);` intermediates".to_string(),
                    };
                    self.cx.error(ident.span(), format!("unknown tensor `{name}` [S0110]\nhelp: {help}"));
                }
                None
            }
        }
    }

    /// Refuses live tensors named inside an expression the graph cannot follow.
    fn no_hidden_tensors(&mut self, e: &syn::Expr) {
        let mut found = Vec::new();
        idents(e.to_token_stream(), &mut found);
        for i in found {
            if let Some(Some(id)) = self.lookup(&i.to_string()) {
                self.tensors[id].errored = true;
                self.cx.error(
                    i.span(),
                    format!(
                        "tensor `{i}` is used inside an expression here, where the graph cannot see whether it is read or written [S0110]\nhelp: pass a tensor directly: `{i}` to read it, `&mut {i}` to write it"
                    ),
                );
            }
        }
    }

    /// A live tensor whose name is close to `name`.
    fn similar(&self, name: &str) -> Option<String> {
        let live = self.scopes.iter().flat_map(|s| s.iter()).filter_map(|(n, t)| t.map(|_| n.clone()));
        live.map(|n| (distance(&n, name), n))
            .filter(|(d, n)| *d <= (n.len().max(name.len()) / 3).max(1))
            .min()
            .map(|(_, n)| n)
    }

    /// A `group(|| { ... })`: one task whose members are the inner call lines.
    fn group(&mut self, span: Span, stmts: &[syn::Stmt]) {
        let mut lines = Vec::new();
        for s in stmts {
            match s {
                syn::Stmt::Expr(e, _) => match parse_call_line(e) {
                    Some(l) => lines.push(l),
                    None => self.unsupported(e.span()),
                },
                other => self.unsupported(other.span()),
            }
        }
        if lines.is_empty() {
            self.cx.error(span, "a `group` needs at least one call line [S0108]\nhelp: put the members' call lines inside: `group(|| { f(a, &mut y0).on(chip(0)); f(a, &mut y1).on(chip(1)); });`".to_string());
            return;
        }
        let last = |e: &syn::Expr| match e {
            syn::Expr::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default(),
            other => model::squash(other.to_token_stream()),
        };
        let first = model::squash(lines[0].callee.to_token_stream());
        for l in &lines[1..] {
            let this = model::squash(l.callee.to_token_stream());
            // Different paths to one function (`copy`, `self::copy`) are fine: `submit_group`
            // also checks the digests at run time.
            if last(l.callee) != last(lines[0].callee) {
                self.cx.error(
                    l.callee.span(),
                    format!(
                        "a group runs one callable, but this member calls `{this}` and the first calls `{first}` ({}) [S0108]\nhelp: split it into two groups",
                        at(lines[0].callee.span())
                    ),
                );
            }
        }
        self.call(&lines);
    }

    /// One task: a single call line, or the members of a group.
    fn call(&mut self, lines: &[CallLine<'_>]) {
        let task = self.next_task;
        self.next_task += 1;
        let root = self.root.clone();
        let o = self.o.clone();
        let g = self.g.clone();
        let group = lines.len() > 1;
        // Uses per member: (tensor, use, span, argument position, member).
        let mut uses: Vec<(usize, Use, Span, usize, usize)> = Vec::new();
        let mut lowered_args: Vec<Vec<TokenStream>> = Vec::new();
        for (m, line) in lines.iter().enumerate() {
            let mut args = Vec::new();
            for (pos, a) in line.args.iter().enumerate() {
                match self.classify(a) {
                    Some((id, u, span)) => {
                        uses.push((id, u, span, pos, m));
                        let ident = syn::Ident::new(&self.tensors[id].name, span);
                        args.push(match u {
                            Use::Read => quote_spanned!(a.span()=> &#ident),
                            Use::Write => quote_spanned!(a.span()=> &mut #ident),
                        });
                    }
                    None => args.push(a.to_token_stream()),
                }
            }
            lowered_args.push(args);
        }
        let callee_name = model::squash(lines[0].callee.to_token_stream());

        // Checks within the task.
        for (i, &(id, u, span, pos, m)) in uses.iter().enumerate() {
            let name = self.tensors[id].name.clone();
            if u == Use::Write && self.tensors[id].origin == Origin::Param(Mode::In) {
                self.tensors[id].errored = true;
                self.cx.error(
                    span,
                    format!(
                        "cannot write `{name}`: it is an `In` input of this graph [S0102]\nhelp: declare it `InOut` in the graph's signature, or write into an intermediate"
                    ),
                );
            }
            for &(id2, u2, span2, pos2, m2) in &uses[..i] {
                if id2 != id || (u == Use::Read && u2 == Use::Read) {
                    continue;
                }
                let (what, code) = if u == Use::Write && u2 == Use::Write {
                    ("two written parameters", "S0103")
                } else {
                    ("a read and a written parameter", "S0104")
                };
                if group && m != m2 {
                    self.cx.error(
                        span,
                        format!(
                            "`{name}` is used by two members of this group through {what} (member {} at {}) [S0108]\nhelp: the members run at the same time; give each member its own output",
                            m2 + 1,
                            at(span2)
                        ),
                    );
                } else if code == "S0103" {
                    self.cx.error(
                        span,
                        format!(
                            "`{name}` is passed to two written parameters of `{callee_name}` (arguments {} and {}) [{code}]\nhelp: the two writes would race inside one task; pass two different tensors",
                            pos2 + 1,
                            pos + 1
                        ),
                    );
                } else {
                    self.cx.error(
                        span,
                        format!(
                            "`{name}` is both read and written by this call of `{callee_name}` (arguments {} and {}) [{code}]\nhelp: write the result into a new intermediate",
                            pos2.min(pos) + 1,
                            pos2.max(pos) + 1
                        ),
                    );
                }
            }
            if u == Use::Read && !self.tensors[id].written {
                let t = &self.tensors[id];
                let msg = match t.origin {
                    Origin::Param(_) => format!(
                        "`{name}` is read here but no call has written it yet: it is an `Out` of this graph [S0101]\nhelp: write it first, or declare it `InOut` if the caller provides its contents"
                    ),
                    Origin::Alloc => format!(
                        "`{name}` is read here but no call has written it yet [S0101]\nhelp: `{name}` was allocated at {} and holds no data; write it through an `Out` parameter first",
                        at(t.decl)
                    ),
                };
                self.tensors[id].errored = true;
                self.cx.error(span, msg);
            }
        }

        // Mode checks that need the callee's signature: const assertions rustc evaluates.
        let callee = lines[0].callee;
        let mut asserts = Vec::new();
        let mut after: Vec<usize> = Vec::new();
        for &(id, u, span, pos, _) in &uses {
            if u != Use::Write {
                continue;
            }
            let t = &self.tensors[id];
            let name = &t.name;
            if !t.written {
                let msg = format!(
                    "`{name}` has not been written yet, but argument {} of `{callee_name}` is an `InOut` parameter, which reads it [S0111]. help: pass `{name}` to an `Out` parameter first",
                    pos + 1
                );
                asserts.push(quote_spanned! {span=>
                    const { ::core::assert!(!(#pos < #callee::PARAMS.len() && ::core::matches!(#callee::PARAMS[#pos].mode, #root::ParamMode::InOut)), #msg) };
                });
            } else if t.readers.is_empty() && t.writer.is_some() {
                let when = t.written_at.map(|s| format!(" at {}", at(s))).unwrap_or_default();
                let msg = format!(
                    "`{name}` holds a value nothing has read (written{when}), and argument {} of `{callee_name}` is an `Out` parameter that would overwrite it without waiting [S0112]. help: read `{name}` first, or write into a fresh intermediate",
                    pos + 1
                );
                asserts.push(quote_spanned! {span=>
                    const { ::core::assert!(!(#pos < #callee::PARAMS.len() && ::core::matches!(#callee::PARAMS[#pos].mode, #root::ParamMode::Out)), #msg) };
                });
            }
            after.extend(t.readers.iter().copied().filter(|&r| r != task));
        }
        after.sort_unstable();
        after.dedup();

        // State updates.
        for &(id, u, span, _, _) in &uses {
            if u == Use::Read {
                let t = &mut self.tensors[id];
                if !t.readers.contains(&task) {
                    t.readers.push(task);
                }
            } else {
                let t = &mut self.tensors[id];
                t.writer = Some(task);
                t.written = true;
                t.readers.clear();
                t.written_at = Some(span);
            }
        }
        // Readers recorded before a write in the same task were cleared by it; a task that
        // reads and writes one tensor is an error above.

        // Code.
        let handle = format_ident!("__t{}", task, span = model::hidden());
        let afters: Vec<syn::Ident> =
            after.iter().map(|r| format_ident!("__t{}", r, span = model::hidden())).collect();
        let mut members = Vec::new();
        let mut replay_members = Vec::new();
        for (m, line) in lines.iter().enumerate() {
            let callee = line.callee;
            let args = &lowered_args[m];
            let mods = line.mods.iter().map(|mc| {
                let method = &mc.method;
                let a = &mc.args;
                quote!(.#method(#a))
            });
            let deps = if m == 0 { afters.clone() } else { Vec::new() };
            let place = self.placement(line.place);
            let mut list = proc_macro2::Group::new(proc_macro2::Delimiter::Parenthesis, quote!(#(#args),*));
            list.set_span(line.paren);
            members
                .push((quote_spanned!(line.span=> #callee::call #list ? #(#mods)* #(.after(#deps))*), place));
            let target = target_text(line.place);
            let arg_uses = uses.iter().filter(|u| u.4 == m).map(|&(id, _, _, pos, _)| quote!((#pos, #id)));
            replay_members.push(quote!((#target, &[#(#arg_uses),*] as &[(usize, usize)])));
        }
        // Names the callee as a value too: an unknown name gets rustc's "a function with a
        // similar name exists".
        let callee_check: Vec<TokenStream> = lines
            .iter()
            .map(|l| {
                let c = l.callee;
                quote_spanned!(c.span()=> let _ = #c;)
            })
            .collect();
        self.body.extend(callee_check);
        self.body.extend(asserts);
        if group {
            let items = members.iter().map(|(c, p)| quote!((#c, #p)));
            self.body.push(quote! {
                let #handle = #o.submit_group(::std::vec![#(#items),*])?;
            });
        } else {
            let (c, p) = &members[0];
            self.body.push(quote! {
                let #handle = #c.on(#o, #p)?;
            });
        }
        self.body.push(quote!(let _ = #handle;));
        self.replay.push(quote!(#g.call(#callee::INFO, &[#(#replay_members),*]);));
    }

    /// `sub()`, `chip(n)`, `worker(n)` need no import inside a graph.
    fn placement(&self, place: &syn::Expr) -> TokenStream {
        let root = &self.root;
        if let syn::Expr::Call(c) = place
            && let Some(id) = single_ident(&c.func)
            && (id == "sub" || id == "chip" || id == "worker")
        {
            let args = &c.args;
            let root = respan(root.clone(), id.span());
            return quote_spanned!(place.span()=> #root::#id(#args));
        }
        place.to_token_stream()
    }
}

/// `ts` with every token at `span` (so an error about the generated path points at the user's).
fn respan(ts: TokenStream, span: Span) -> TokenStream {
    ts.into_iter()
        .map(|mut tt| {
            if let proc_macro2::TokenTree::Group(g) = &tt {
                let mut n = proc_macro2::Group::new(g.delimiter(), respan(g.stream(), span));
                n.set_span(span);
                tt = proc_macro2::TokenTree::Group(n);
            } else {
                tt.set_span(span);
            }
            tt
        })
        .collect()
}

/// The target text of a placement as the engine's DAG capture prints it.
fn target_text(place: &syn::Expr) -> String {
    if let syn::Expr::Call(c) = place
        && let Some(id) = single_ident(&c.func)
    {
        if id == "sub" {
            return "sub".to_string();
        }
        if (id == "chip" || id == "worker") && c.args.len() == 1 {
            let arg = model::squash(c.args[0].to_token_stream());
            return format!("worker {arg}");
        }
    }
    model::squash(place.to_token_stream())
}
