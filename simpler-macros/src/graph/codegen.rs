//! Codegen: a checked [`Plan`] becomes the orchestration function (one typed
//! `callee::call(..)?.on(orch, place)?` per task, exactly the Orchestrator calls a hand-written
//! orchestration makes), its `graph()` replay, and the twin shared with `#[callable(orch)]`.
//!
//! Loops become real `for` loops over the typed pieces (`__private::piece`, `piece_mut`);
//! `graph()` replays them, comparing pieces as per-axis fractions of the tensor (exact for even
//! partitions, as the engine's lattice overlap is), and a per-iteration `alloc` is a fresh
//! tensor in the replay.
//!
//! Tiles with a run-time count: before any task is submitted the body computes each tiled
//! partition's counts per axis from the parameter's shape (`__private::tile_counts`; a tile
//! that does not divide is an error there), checks that the partitions a `for (i, t) in xs`
//! loop indexes at its index have as many pieces as `xs` (`same_counts`) and that a
//! `for i in A..B` loop's tiled partitions have at least `B` (`enough_pieces`); both are
//! `InvalidArgument` errors that name the partitions and their counts. Those counts feed
//! `StaticEdges::partition` and the replay. A graph with a tiled partition has no `graph()` but
//! `graph_for(shape, ..)` (one `&[u32]` per tensor parameter, in order) returning
//! `Result<TaskGraph>`: the same prelude on the shapes, then the replay.
//!
//! Static edges: the body tracks every use of the graph's intermediates in a `StaticEdges`
//! (`simpler::dsl::graph`; whole uses in a list, pieces of one partition by index) with the
//! footprint rules, and gives each task the edges as deps (a read after write retains its
//! producer) with those tensors marked static; parameters go through the TensorMap.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;

use super::check::{Affine, Arg, Check, Plan, Step, Target, Task};
use super::parse::{GraphDef, single_ident};
use crate::callable::{self, Sig};
use crate::descriptor;
use crate::model::{self, Kind, Mode, ParamTy};

/// The generated items. `failed`: errors were reported, so the body and the replay stay empty
/// (the function and its twin are still emitted, so the rest of the crate type-checks).
pub(crate) fn generate(def: GraphDef, plan: &Plan, failed: bool) -> TokenStream {
    let root = model::root(def.krate.as_ref());
    let o = format_ident!("__o", span = model::hidden());
    let g = format_ident!("__g", span = model::hidden());
    let name = &def.name;
    let (body, replay) = if failed {
        (Vec::new(), Vec::new())
    } else {
        let se = format_ident!("__se", span = model::hidden());
        let mut out = Gen {
            root: &root,
            o: &o,
            g: &g,
            se: &se,
            statik: plan.statik,
            compile_time_edges: plan.compile_time_edges,
            body: Vec::new(),
            replay: Vec::new(),
            named: std::collections::BTreeSet::new(),
        };
        // Before anything is submitted: the tile counts (a tile that does not divide its
        // tensor is an error here), then the loops' piece counts.
        for t in &plan.tiled {
            let (pc, src, text) = (piece_counts(t.part), &t.source, &t.text);
            let tile: Vec<TokenStream> = t.tile.iter().map(const_u32).collect();
            out.body.push(quote! {
                let #pc = #root::__private::tile_counts(#src.shape(), &[#(#tile),*], #text)?;
            });
            out.replay.push(quote! {
                let #pc = #root::__private::tile_counts(#src, &[#(#tile),*], #text)?;
            });
        }
        let graph_name = name.to_string();
        for c in &plan.count_checks {
            let what = &c.what;
            // A range loop's end against a partition whose count is a constant too: checked
            // by the compiler.
            if let (Some(start), Some(end)) = (&c.start, &c.end) {
                for p in c.parts.iter().filter(|p| p.counts.is_some()) {
                    let counts = p.counts.as_deref().unwrap_or_default();
                    let n: Vec<TokenStream> = counts.iter().map(const_u32).collect();
                    // A trait bound, not a `const` assertion: a false fact is a plain error
                    // with the S0113 message (`__private::LoopWithinPieces`), on the end.
                    let end_span = end.span();
                    let (start, end) = (const_u32(start), const_u32(end));
                    // The loop's first and last pieces, `a * start + b` and `a * (end - 1) + b`,
                    // are pieces of the partition (the plain index: `end <= count`).
                    let fact = if p.index == Affine::PLAIN {
                        quote!((#end) <= (1u32 #(* #n)*))
                    } else {
                        let (a, b) = (p.index.a as i128, p.index.b as i128);
                        quote! {
                            (#end) <= (#start)
                                || (#a * ((#start) as i128) + #b >= 0
                                    && #a * ((#end) as i128 - 1) + #b < (1u32 #(* #n)*) as i128)
                        }
                    };
                    out.body.push(respan(
                        quote! {
                            #[allow(clippy::identity_op)]
                            #root::__private::loop_within_pieces::<#root::__private::Holds<{ #fact }>>();
                        },
                        end_span,
                    ));
                }
            }
            let mut parts = c.parts.iter().filter(|p| c.end.is_none() || p.counts.is_none()).peekable();
            if parts.peek().is_none() {
                continue;
            }
            let parts = parts.map(|p| {
                let text = &p.text;
                let n = match &p.counts {
                    Some(counts) => {
                        let counts: Vec<TokenStream> = counts.iter().map(const_u32).collect();
                        quote!(1u32 #(* #counts)*)
                    }
                    None => {
                        let pc = piece_counts(p.part);
                        quote!(::core::iter::Iterator::product::<u32>(#pc.iter()))
                    }
                };
                let (a, b, ix) = (p.index.a, p.index.b, &p.index_text);
                quote!((#text, #n, #a, #b, #ix))
            });
            let check = match &c.end {
                None => quote! {
                    #root::__private::same_counts(#graph_name, #what, &[#(#parts),*])?;
                },
                Some(end) => {
                    let end = const_u32(end);
                    let start = c.start.as_ref().map_or(quote!(0u32), const_u32);
                    quote! {
                        #root::__private::enough_pieces(#graph_name, #what, #start, #end, &[#(#parts),*])?;
                    }
                }
            };
            out.body.push(check.clone());
            // `graph()` (no tiles) returns no `Result`: its counts are the compiler's.
            if !plan.tiled.is_empty() {
                out.replay.push(check);
            }
        }
        if plan.statik {
            let n = plan.tensors.len();
            out.body.push(quote!(let mut #se = #root::__private::StaticEdges::new(#n); let _ = &mut #se;));
        }
        for tensor in &plan.tensors {
            out.replay.push(quote!(#g.tensor(#tensor);));
        }
        // Task handles outlive the scopes their tasks are in.
        for t in 0..plan.tasks {
            let handle = format_ident!("__t{}", t, span = model::hidden());
            out.body.push(quote!(let mut #handle: #root::TaskHandle;));
        }
        for step in &plan.steps {
            out.step(step);
        }
        // The types named after the tensors that signature checks name (S0111-S0113), one per
        // name in this graph, so that rustc prints them bare (`h`, not `g::h`) unless another
        // item of the crate has that name; in a module of their own, so that they shadow
        // nothing the body names (a tensor called `f32`).
        let mut body = Vec::new();
        if !out.named.is_empty() {
            let names = out.named.iter().map(|n| tensor_type(n));
            let tensors = tensor_types();
            body.push(quote! {
                #[allow(non_camel_case_types, dead_code, unreachable_pub, clippy::items_after_statements)]
                mod #tensors { #(pub struct #names {})* }
            });
        }
        body.append(&mut out.body);
        (body, out.replay)
    };
    let fn_params: Vec<TokenStream> = def
        .params
        .iter()
        .map(|p| {
            let id = &p.ident;
            match &p.ty {
                ParamTy::Tensor { mode, elem, .. } => {
                    let span = p.decl.span();
                    if *mode == Mode::In {
                        quote_spanned!(span=> #id: #root::dsl::TensorOf<#elem, #root::dsl::ReadOnly>)
                    } else {
                        quote_spanned!(span=> mut #id: #root::dsl::TensorOf<#elem, #root::dsl::ReadWrite>)
                    }
                }
                ParamTy::Scalar => {
                    let ty = &p.decl;
                    quote!(#id: #ty)
                }
            }
        })
        .collect();
    let markers: Vec<TokenStream> = def
        .params
        .iter()
        .filter_map(|p| match &p.ty {
            ParamTy::Tensor { marker, elem, .. } => Some(model::marker_check(marker, elem)),
            ParamTy::Scalar => None,
        })
        .collect();
    let desc = descriptor::build(
        Kind::Orch.code(),
        &format!("{}::{}", model::crate_name(), syn::ext::IdentExt::unraw(name)),
        0,
        &def.params,
        &def.tokens,
    );
    let sig = Sig { params: def.params, orchestrates: true };
    let shim = callable::shim(&root, name, &sig, Kind::Orch);
    let extra = if plan.tiled.is_empty() {
        quote! {
            /// The graph's structure: its tasks and the dependencies between them, computed with
            /// the engine's rules (compare it with a captured run using `TaskGraph::matches`).
            #[allow(unused_variables, clippy::cast_possible_truncation, clippy::unnecessary_cast)]
            pub fn graph() -> #root::dsl::TaskGraph {
                let mut #g = #root::__private::GraphBuilder::new();
                #(#replay)*
                #g.finish()
            }
        }
    } else {
        // Its tile counts are the run's: the graph is drawn for the shapes of its tensors.
        let shapes = sig.params.iter().filter(|p| matches!(p.ty, ParamTy::Tensor { .. })).map(|p| {
            let id = &p.ident;
            quote!(#id: &[u32])
        });
        quote! {
            /// The graph's structure for tensors of these shapes (one per tensor parameter, in
            /// order): its tasks and the dependencies between them, computed with the engine's
            /// rules (compare it with a captured run using `TaskGraph::matches`). A graph that
            /// tiles its tensors has as many tasks as the run's shapes give tiles.
            ///
            /// # Errors
            ///
            /// A tile that does not divide its tensor, or partitions of one loop whose piece
            /// counts differ: the errors the run would return.
            #[allow(unused_variables, clippy::cast_possible_truncation, clippy::unnecessary_cast)]
            pub fn graph_for(#(#shapes),*) -> #root::Result<#root::dsl::TaskGraph> {
                let mut #g = #root::__private::GraphBuilder::new();
                #(#replay)*
                ::core::result::Result::Ok(#g.finish())
            }
        }
    };
    let mut twin = callable::twin(&root, &def.vis, name, Kind::Orch, 0, &sig.params, &desc, shim, extra);
    let (attrs, vis) = (&def.attrs, &def.vis);
    // A `#[cfg]` on the function holds for its twin's items too (else they name a function
    // that is not there).
    let cfgs: Vec<&syn::Attribute> = attrs.iter().filter(|a| a.path().is_ident("cfg")).collect();
    if !cfgs.is_empty()
        && let Ok(mut file) = syn::parse2::<syn::File>(twin.clone())
    {
        for item in &mut file.items {
            if let Some(item_attrs) = item_attrs(item) {
                item_attrs.extend(cfgs.iter().map(|a| (*a).clone()));
            }
        }
        twin = file.into_token_stream();
    }
    // After an error the body is left empty: its parameters are unused, which is not news.
    let quiet = if failed { quote!(#[allow(unused_variables)]) } else { TokenStream::new() };
    quote! {
        #(#attrs)*
        #[allow(unused_mut, clippy::needless_question_mark, clippy::unnecessary_cast)]
        #quiet
        #vis fn #name(#o: &mut #root::Orchestrator<'_>, #(#fn_params),*) -> #root::Result<()> {
            #(#markers)*
            #(#body)*
            ::core::result::Result::Ok(())
        }
        #twin
    }
}

/// The module, in a graph function's body, of the types named after its tensors (for the
/// messages of the signature checks).
fn tensor_types() -> syn::Ident {
    format_ident!("__tensors", span = model::hidden())
}

/// The type named after tensor `name` (raw, so that a tensor named like a keyword, `r#type`,
/// works; one named like a path keyword, which no `let` can bind, gets a name of its own
/// rather than a macro panic).
fn tensor_type(name: &str) -> proc_macro2::Ident {
    match name {
        "self" | "super" | "crate" | "Self" | "_" => format_ident!("tensor", span = model::hidden()),
        _ => proc_macro2::Ident::new_raw(name, model::hidden()),
    }
}

struct Gen<'a> {
    root: &'a TokenStream,
    o: &'a syn::Ident,
    g: &'a syn::Ident,
    /// The generated `StaticEdges` of the graph's intermediates.
    se: &'a syn::Ident,
    /// Whether the body tracks static edges at all.
    statik: bool,
    /// Whether `graph()` reads the edges the check pass computed (else it replays the body).
    compile_time_edges: bool,
    body: Vec<TokenStream>,
    replay: Vec<TokenStream>,
    /// The tensors signature checks name, as types of their own (declared once each).
    named: std::collections::BTreeSet<String>,
}

impl Gen<'_> {
    fn step(&mut self, step: &Step) {
        let (root, o) = (self.root, self.o);
        match step {
            Step::Alloc { id, ident, elem, dims, chip } => {
                // Used only on one chip: in that chip's memory (device heap), where the level
                // has one.
                self.body.push(match chip {
                    Some(c) => quote_spanned! {ident.span()=>
                        let mut #ident = #o.alloc_of_on::<#elem>(#c, &[#(#root::__private::dim(#dims)?),*])?;
                    },
                    None => quote_spanned! {ident.span()=>
                        let mut #ident = #o.alloc_of::<#elem>(&[#(#root::__private::dim(#dims)?),*])?;
                    },
                });
                // A new buffer each time (each iteration of a loop allocates its own).
                let (g, se) = (self.g, self.se);
                if self.statik {
                    self.body.push(quote!(#se.fresh(#id);));
                }
                self.replay.push(quote!(#g.fresh(#id);));
            }
            Step::Scalar(local) => self.body.push(local.to_token_stream()),
            Step::Scope(inner) => {
                let outer = std::mem::take(&mut self.body);
                for s in inner {
                    self.step(s);
                }
                let inner = std::mem::replace(&mut self.body, outer);
                self.body.push(quote! {
                    #root::__private::scope_begin(#o)?;
                    {
                        #(#inner)*
                    }
                    #root::__private::scope_end(#o)?;
                });
            }
            Step::Task(task) => self.task(task),
            Step::Partition { id, tensor, ident, source, method, counts } if method == "tiles" => {
                let tile: Vec<TokenStream> = counts.iter().map(const_u32).collect();
                self.body.push(quote_spanned! {method.span()=>
                    let mut #ident = #source.#method(&[#(#tile),*])?;
                });
                let (g, se, pc) = (self.g, self.se, piece_counts(*id));
                if self.statik {
                    self.body.push(quote!(#se.partition(#id, &#pc);));
                }
                self.replay.push(quote!(#g.partition(#id, #tensor, &#pc);));
            }
            Step::Partition { id, tensor, ident, source, method, counts } => {
                let counts: Vec<TokenStream> = counts.iter().map(const_u32).collect();
                let arg = if method == "split" { quote!(#(#counts)*) } else { quote!(&[#(#counts),*]) };
                self.body.push(quote_spanned! {method.span()=>
                    let mut #ident = #source.#method(#arg)?;
                });
                let (g, se) = (self.g, self.se);
                if self.statik {
                    self.body.push(quote!(#se.partition(#id, &[#(#counts),*]);));
                }
                self.replay.push(quote!(#g.partition(#id, #tensor, &[#(#counts),*]);));
            }
            Step::For { var, range, part, body } => {
                let g = self.g;
                let (run, replay_range) = match (range, part) {
                    (Some((start, end)), _) => {
                        let (s, e) = (const_u32(start), const_u32(end));
                        // The checks assume the body runs: a loop that never does (its
                        // outputs unwritten, its intermediates unread) is refused.
                        let msg = format!(
                            "the loop over `{var}` at line {} never runs: `{}..{}` is empty, and the graph's checks assume the body runs [S0115]. help: remove the loop, or give it a range with at least one index",
                            start.span().start().line,
                            model::squash(start.to_token_stream()),
                            model::squash(end.to_token_stream())
                        );
                        self.body.push(quote_spanned! {end.span()=>
                            const _: () = ::core::assert!(#s < #e, #msg);
                        });
                        let root = self.root;
                        let r = quote!(#root::__private::range(#s, #e));
                        (r.clone(), r)
                    }
                    (None, Some((ident, id))) => {
                        (quote!(0u32..(#ident.len() as u32)), quote!(0u32..#g.pieces(#id)))
                    }
                    (None, None) => unreachable!("a loop has a range or a partition"),
                };
                let (outer_body, outer_replay) =
                    (std::mem::take(&mut self.body), std::mem::take(&mut self.replay));
                for s in body {
                    self.step(s);
                }
                let inner = std::mem::replace(&mut self.body, outer_body);
                let inner_replay = std::mem::replace(&mut self.replay, outer_replay);
                self.body.push(quote!(for #var in #run { #(#inner)* }));
                self.replay.push(quote!(for #var in #replay_range { #(#inner_replay)* }));
            }
        }
    }

    fn task(&mut self, task: &Task) {
        let (root, o, g) = (self.root, self.o, self.g);
        // Names each callee as a value too: an unknown name gets rustc's "a function with a
        // similar name exists".
        for m in &task.members {
            let c = &m.line.callee;
            self.body.push(quote_spanned!(c.span()=> let _ = #c;));
        }
        for a in &task.asserts {
            let (callee, pos) = (&a.callee, a.pos);
            let (bound, mode) = match a.check {
                Check::Unwritten => (quote!(inout_has_a_value), quote!(InOut)),
                Check::Unread => (quote!(no_unread_value_overwritten), quote!(Out)),
                Check::LoopWrite => (quote!(loop_write_not_out), quote!(Out)),
                Check::LoopWritePiece => (quote!(loop_write_piece_not_out), quote!(Out)),
            };
            // A trait bound whose trait carries the message (S0111, S0112, S0113): a plain
            // compile error with the code, on the argument. Every token on the argument, so
            // rustc's error points there, but the callee's path, so that an unknown callee is
            // one error, on the callee.
            let (bound, is, mode) = (
                respan(quote!(#root::__private::#bound::<#root::__private::Holds), a.span),
                respan(quote!(!#root::__private::param_is), a.span),
                respan(quote!(#root::__private::ParamMode::#mode), a.span),
            );
            // The tensor's name as a type of its own, which the trait's message prints
            // ("the tensor `h` holds no value yet"), declared at the top of the body.
            self.named.insert(a.tensor.clone());
            let (tensors, name) = (tensor_types(), tensor_type(&a.tensor));
            self.body.push(quote_spanned! {a.span=>
                #bound<{ #is(&#callee::PARAMS, #pos, #mode) }>, #tensors::#name>();
            });
        }
        let handle = format_ident!("__t{}", task.index, span = model::hidden());
        let mut calls = Vec::new();
        let mut replay_members = Vec::new();
        for member in &task.members {
            let line = &member.line;
            let callee = &line.callee;
            let args = member.args.iter().map(|a| match a {
                Arg::Read(Target { ident, index: None }, span) => quote_spanned!(*span=> &#ident),
                Arg::Write(Target { ident, index: None }, span) => quote_spanned!(*span=> &mut #ident),
                Arg::Read(Target { ident, index: Some(ix) }, span) => {
                    let name = ident.to_string();
                    quote_spanned!(*span=> #root::__private::piece(&#ident, #ix, #name)?)
                }
                Arg::Write(Target { ident, index: Some(ix) }, span) => {
                    let name = ident.to_string();
                    quote_spanned!(*span=> #root::__private::piece_mut(&mut #ident, #ix, #name)?)
                }
                Arg::Other(e) => e.to_token_stream(),
            });
            let mods = line.mods.iter().map(|mc| {
                let (method, a) = (&mc.method, &mc.args);
                quote!(.#method(#a))
            });
            let mut list = proc_macro2::Group::new(proc_macro2::Delimiter::Parenthesis, quote!(#(#args),*));
            list.set_span(line.paren);
            let place = self.placement(&line.place);
            let call = quote_spanned!(line.span=> #callee::call #list ? #(#mods)*);
            let call = if member.internal.is_empty() {
                call
            } else {
                let se = self.se;
                let c = format_ident!("__c", span = model::hidden());
                let uses = member.internal.iter().map(|(pos, id, piece)| match piece {
                    Some((part, ix)) => {
                        quote!((#pos, #id, ::core::option::Option::Some((#part, (#ix) as u32))))
                    }
                    None => quote!((#pos, #id, ::core::option::Option::None)),
                });
                quote!({
                    let mut #c = #call;
                    // SAFETY: every use of the graph's static intermediates goes through the
                    // tracker, with the uses the checker derived from the graph.
                    #[allow(unsafe_code)]
                    unsafe { #se.uses(#callee::INFO, &[#(#uses),*], &mut #c) };
                    #c
                })
            };
            calls.push((call, place));
            let target = match &member.target {
                Some(e) if target_text(&line.place) == "worker ?" => {
                    quote!(::std::format!("worker {}", #e).as_str())
                }
                _ => {
                    let t = target_text(&line.place);
                    quote!(#t)
                }
            };
            let uses = member.uses.iter().map(|(pos, id, piece)| match piece {
                Some((part, ix)) => quote!((#pos, #id, ::core::option::Option::Some((#part, (#ix) as u32)))),
                None => quote!((#pos, #id, ::core::option::Option::None)),
            });
            replay_members.push(quote!((#target, &[#(#uses),*] as &[#root::__private::ArgUse])));
        }
        if calls.len() > 1 {
            let items = calls.iter().map(|(c, p)| quote!((#c, #p)));
            self.body.push(quote!(#handle = #o.submit_group(::std::vec![#(#items),*])?;));
        } else {
            let (c, p) = &calls[0];
            self.body.push(quote!(#handle = #c.on(#o, #p)?;));
        }
        if task.members.iter().any(|m| !m.internal.is_empty()) {
            let se = self.se;
            self.body.push(quote!(#se.done(#handle);));
        }
        self.body.push(quote!(let _ = #handle;));
        let callee = &task.members[0].line.callee;
        if self.compile_time_edges {
            let targets = task.members.iter().map(|m| target_text(&m.line.place));
            let to = task.index;
            self.replay.push(quote!(#g.node(#callee::INFO, &[#(#targets),*]);));
            for e in &task.edges {
                let (from, pos, tensor, war) = (e.from, e.pos, &e.tensor, e.war);
                let consumer = &task.members[e.member].line.callee;
                self.replay.push(quote!(#g.edge(#from, #to, #consumer::INFO, #pos, #tensor, #war);));
            }
        } else {
            self.replay.push(quote!(#g.call(#callee::INFO, &[#(#replay_members),*]);));
        }
    }

    /// `sub()`, `chip(n)`, `worker(n)` need no import inside a graph.
    fn placement(&self, place: &syn::Expr) -> TokenStream {
        if let syn::Expr::Call(c) = place
            && let Some(id) = single_ident(&c.func)
            && (id == "sub" || id == "chip" || id == "worker")
        {
            let args = &c.args;
            let root = respan(self.root.clone(), id.span());
            return quote_spanned!(place.span()=> #root::dsl::#id(#args));
        }
        place.to_token_stream()
    }
}

/// The generated name of the piece counts per axis of `tiles` partition `part`.
fn piece_counts(part: usize) -> syn::Ident {
    format_ident!("__pc{}", part, span = model::hidden())
}

/// `{ const N: u32 = e; N }`: `e` evaluated at compile time, as a `u32` (a loop bound, a
/// partition's count: `graph()` needs them without the run's values).
fn const_u32(e: &syn::Expr) -> TokenStream {
    let n = format_ident!("__N", span = model::hidden());
    quote_spanned!(e.span()=> { const #n: u32 = #e; #n })
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
/// `sub()`, `chip(3)`, `simpler::dsl::worker(3u32)`: known at compile time. Any other placement
/// (`chip(n)`, a variable) is only known at run time: `worker ?`, which
/// [`TaskGraph::matches`] accepts for any worker.
fn target_text(place: &syn::Expr) -> String {
    if let syn::Expr::Call(c) = place
        && let syn::Expr::Path(p) = &*c.func
        && let Some(last) = p.path.segments.last()
    {
        if last.ident == "sub" && c.args.is_empty() {
            return "sub".to_string();
        }
        if (last.ident == "chip" || last.ident == "worker")
            && c.args.len() == 1
            && let syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(n), .. }) = &c.args[0]
            && let Ok(n) = n.base10_parse::<u32>()
        {
            return format!("worker {n}");
        }
    }
    "worker ?".to_string()
}

/// The attributes of an item the twin emits.
fn item_attrs(item: &mut syn::Item) -> Option<&mut Vec<syn::Attribute>> {
    match item {
        syn::Item::Struct(i) => Some(&mut i.attrs),
        syn::Item::Static(i) => Some(&mut i.attrs),
        syn::Item::Impl(i) => Some(&mut i.attrs),
        syn::Item::Const(i) => Some(&mut i.attrs),
        syn::Item::Fn(i) => Some(&mut i.attrs),
        syn::Item::Mod(i) => Some(&mut i.attrs),
        syn::Item::Use(i) => Some(&mut i.attrs),
        _ => None,
    }
}
