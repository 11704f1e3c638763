//! Check: the dataflow pass over a parsed graph. It keeps a table of tensors (graph parameters
//! and intermediates) with, for each, whether it holds a value, which task wrote it and which
//! tasks read it since; reports def-use errors, writes to read-only inputs, aliasing inside one
//! call or group, unwritten outputs and unread values; and turns the body into a [`Plan`]: the
//! steps to generate, with every argument classified, and the checks that need the callee's
//! signature (left to rustc as trait bounds). Every edge, write-after-read included, is
//! the engine's to infer from the tags.
//!
//! For a graph without loops and partitions (every use names a whole tensor) the pass computes
//! each task's incoming edges from its tensor table (the writer, and for a write the readers
//! since, in the engine's walk order), and `graph()` reads them (`GraphBuilder::node` / `edge`;
//! whether an edge after a write is a read after write or a write after write comes from the
//! callee's `PARAMS`). A graph with loops or partitions replays its body into the
//! `GraphBuilder` with the engine's footprint rules.
//!
//! # Partitions and loops
//!
//! A graph declares partitions (`let xs = x.split(N);`, `x.grid([A, B])`, `x.tiles([R, C])`)
//! and loops `for i in A..B` (bounds evaluated as `const`s) or `for (i, t) in xs`. The pass walks
//! a loop body once, as any iteration, and records for every tensor declared outside the loop
//! how the body touches it (whole, the piece at the loop's index or at an [`Affine`] function
//! of it, `2 * i + 1`, a fixed piece, another index). A write at the loop's index of one
//! partition is an index launch (parallel), and so are writes at affine indices of one
//! partition that no two iterations share (`2 * i` beside `2 * i + 1`); a range loop's affine
//! indices must name pieces the partition has (`CountCheck`: here for literals, by rustc for
//! `const`s, before anything is submitted for `tiles`); a whole or fixed
//! write must go to an `InOut` parameter (S0113: an accumulator the engine orders; checked by
//! rustc as a trait bound on `callee::PARAMS`, `__private::LoopWriteNotOut`, or
//! `LoopWritePieceNotOut`, which names the partition, for a fixed piece; so its error is a
//! plain E0277 with the S0113 message on the argument, not a failed `const` evaluation); a
//! range loop past the pieces of a partition is S0113 too (here, for literals; as a trait
//! bound, `__private::LoopWithinPieces`, for named constants); a write at another index,
//! pieces of two partitions, or a read of another iteration's piece are S0113 / S0114; a run-time bound, count or tile shape, `rows(..)` and
//! `slice(..)` are S0115.
//!
//! `let xs = x.tiles([R, C]);` of a graph *parameter* (tile shape evaluated as `const`s) is a
//! partition whose piece count is the run's. Iterations stay disjoint by construction (each
//! writes piece `i` of one partition), so the pass needs no count; it records instead what the
//! generated body checks first ([`Plan::tiled`], [`Plan::count_checks`], see `codegen`). Tiles
//! of an intermediate are refused (their count would depend on the `alloc`'s run-time dims).

use proc_macro2::Span;
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::spanned::Spanned;

use super::parse::{CallLine, ForLoop, GraphDef, Stmt, single_ident, unwrap};
use crate::ctxt::{Ctxt, at};
use crate::model::{self, Mode, ParamTy};

/// A piece index `a * i + b` in loop variable `i`, with integer literal coefficients (`a` at
/// least 1): `i` is `a = 1, b = 0`. Distinct iterations get distinct pieces; two such indices
/// with one `a` whose `b`s differ by other than a multiple of `a` (`2 * i`, `2 * i + 1`) never
/// name the same piece, in any two iterations.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Affine {
    pub(crate) a: u64,
    pub(crate) b: i64,
}

impl Affine {
    /// The loop variable itself.
    pub(crate) const PLAIN: Affine = Affine { a: 1, b: 0 };

    /// The piece at iteration `i`.
    pub(crate) fn at(self, i: u64) -> i128 {
        i128::from(self.a) * i128::from(i) + i128::from(self.b)
    }

    /// Whether no iteration's piece under `self` is another iteration's under `other` (nor,
    /// unless they are equal, the same iteration's).
    fn disjoint(self, other: Affine) -> bool {
        self.a == other.a && (i128::from(self.b) - i128::from(other.b)).rem_euclid(i128::from(self.a)) != 0
    }
}

/// `e` as `a * i + b` (`i`, `2 * i`, `i * 2`, `2 * i + 1`, `1 + 2 * i`, `i - 1`, `2 * (i + 1)`,
/// in parentheses or not) with integer literal coefficients, `a` at least 1: the ident `i` and
/// the coefficients; `None` for anything else.
pub(crate) fn affine(e: &syn::Expr) -> Option<(&syn::Ident, Affine)> {
    use syn::BinOp;
    let lit = |e: &syn::Expr| lit_u64(e).and_then(|v| i64::try_from(v).ok());
    match unwrap(e) {
        syn::Expr::Path(_) => single_ident(e).map(|i| (i, Affine::PLAIN)),
        syn::Expr::Binary(b) => match b.op {
            BinOp::Mul(_) => {
                let (k, rest) = match (lit(&b.left), lit(&b.right)) {
                    (Some(k), None) => (k, &*b.right),
                    (None, Some(k)) => (k, &*b.left),
                    _ => return None,
                };
                let (i, f) = affine(rest)?;
                let a = f.a.checked_mul(u64::try_from(k).ok()?).filter(|&a| a >= 1)?;
                Some((i, Affine { a, b: f.b.checked_mul(k)? }))
            }
            BinOp::Add(_) => {
                let (k, rest) = match (lit(&b.left), lit(&b.right)) {
                    (Some(k), None) => (k, &*b.right),
                    (None, Some(k)) => (k, &*b.left),
                    _ => return None,
                };
                let (i, f) = affine(rest)?;
                Some((i, Affine { a: f.a, b: f.b.checked_add(k)? }))
            }
            BinOp::Sub(_) => {
                let k = lit(&b.right)?;
                let (i, f) = affine(&b.left)?;
                Some((i, Affine { a: f.a, b: f.b.checked_sub(k)? }))
            }
            _ => None,
        },
        _ => None,
    }
}

/// Whether piece indices `x` and `y` name different pieces in any one iteration: two different
/// literals, or affine in one variable with one `a` and different `b`s (`2 * i`, `2 * i + 1`).
fn distinct_pieces(x: &syn::Expr, y: &syn::Expr) -> bool {
    if let (Some(m), Some(n)) = (lit_u64(x), lit_u64(y)) {
        return m != n;
    }
    match (affine(x), affine(y)) {
        (Some((i, f)), Some((j, g))) => i == j && f.a == g.a && f.b != g.b,
        _ => false,
    }
}

/// The value of integer literal `e` (in parentheses or not).
fn lit_u64(e: &syn::Expr) -> Option<u64> {
    match unwrap(e) {
        syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) => i.base10_parse().ok(),
        _ => None,
    }
}

/// The piece count of a partition whose counts per axis are all integer literals.
fn literal_count(counts: Option<&[syn::Expr]>) -> Option<u64> {
    counts?.iter().try_fold(1u64, |n, c| n.checked_mul(lit_u64(c)?))
}

/// What to generate, in order.
pub(crate) struct Plan {
    /// Tensor names in id order (parameters first), for the graph's replay.
    pub(crate) tensors: Vec<String>,
    pub(crate) steps: Vec<Step>,
    /// How many tasks the graph submits.
    pub(crate) tasks: usize,
    /// Whether some intermediate's edges are static (the body then tracks them).
    pub(crate) statik: bool,
    /// No loop and no partition: every tensor use names a whole tensor, so the edges computed
    /// here are the engine's, and `graph()` reads them instead of replaying the body.
    pub(crate) compile_time_edges: bool,
    /// The `tiles` partitions (their piece counts are the run's), computed before anything is
    /// submitted.
    pub(crate) tiled: Vec<Tiled>,
    /// The loops over a partition that index other partitions at the loop's index: their
    /// piece counts must agree (checked before anything is submitted).
    pub(crate) count_checks: Vec<CountCheck>,
}

/// A `let xs = x.tiles([r, c]);` of graph parameter `x`: partition `part`.
pub(crate) struct Tiled {
    pub(crate) part: usize,
    /// The parameter (as written in the signature).
    pub(crate) source: syn::Ident,
    /// The tile's dimensions (compile-time expressions).
    pub(crate) tile: Vec<syn::Expr>,
    /// `xs` (`x.tiles([16])`), for messages.
    pub(crate) text: String,
}

/// One partition whose piece count a loop relies on.
pub(crate) struct CountedPart {
    /// `xs` (`x.tiles([16])`), for messages.
    pub(crate) text: String,
    /// Partition number; its count is the run's when it is in `Plan::tiled`.
    pub(crate) part: usize,
    /// The counts per axis, for a partition known at compile time (`split`, `grid`).
    pub(crate) counts: Option<Vec<syn::Expr>>,
    /// The index the loop names its pieces at (the loop's own partition: the plain index).
    pub(crate) index: Affine,
    /// The index as written (`2*i+1`), for messages.
    pub(crate) index_text: String,
}

/// A loop over partition `parts[0]` that indexes the others at its index (they must have as
/// many pieces), or a loop over `a..end` that indexes `tiles` partitions at its index (they
/// must have at least `end` pieces).
pub(crate) struct CountCheck {
    /// "the loop at line 3".
    pub(crate) what: String,
    pub(crate) parts: Vec<CountedPart>,
    /// The range loop's end.
    pub(crate) end: Option<syn::Expr>,
    /// The range loop's start.
    pub(crate) start: Option<syn::Expr>,
}

/// An edge the check pass computed: the task that wrote (or read, for a write after read) the
/// tensor, and the consuming use (member, argument position). Whether an edge after a write
/// is a read after write or a write after write depends on the callee's parameter mode, which
/// the generated `graph()` takes from its `PARAMS`.
pub(crate) struct GraphEdge {
    pub(crate) from: usize,
    pub(crate) member: usize,
    pub(crate) pos: usize,
    pub(crate) tensor: String,
    /// A write after read (else: after the writer).
    pub(crate) war: bool,
}

/// One generated step.
pub(crate) enum Step {
    /// `let mut x = o.alloc_of::<T>(&[dims])?;` for tensor `id`; with `chip`, every task that
    /// names it runs on that chip (a constant), and it is `o.alloc_of_on::<T>(chip, ..)`.
    Alloc { id: usize, ident: syn::Ident, elem: syn::Type, dims: Vec<syn::Expr>, chip: Option<u32> },
    /// A scalar `let`, unchanged.
    Scalar(syn::Local),
    /// `scope(|| { ... })`: its steps, in a Rust block of their own (so its names end with it).
    Scope(Vec<Step>),
    /// One task: a call, or a group of members.
    Task(Task),
    /// `let xs = x.split(n);` / `x.grid([..])`: partition number `id` of tensor `tensor`.
    Partition {
        id: usize,
        tensor: usize,
        ident: syn::Ident,
        source: syn::Ident,
        method: syn::Ident,
        counts: Vec<syn::Expr>,
    },
    /// A loop: over `start..end`, or over the pieces of partition `part` (its name and number).
    For {
        var: syn::Ident,
        range: Option<(syn::Expr, syn::Expr)>,
        part: Option<(syn::Ident, usize)>,
        body: Vec<Step>,
    },
}

/// One task.
pub(crate) struct Task {
    pub(crate) index: usize,
    pub(crate) members: Vec<Member>,
    /// Signature-dependent checks (S0111, S0112, S0113), emitted as trait bounds.
    pub(crate) asserts: Vec<Assert>,
    /// Its incoming edges, in the order the engine's walk finds them.
    pub(crate) edges: Vec<GraphEdge>,
}

/// One call line of a task.
pub(crate) struct Member {
    pub(crate) line: CallLine,
    pub(crate) args: Vec<Arg>,
    /// (argument position, tensor id, piece) of its tensor arguments; the piece (partition
    /// number, index expression) only where `graph()` can evaluate the index.
    pub(crate) uses: Vec<ArgUse>,
    /// The worker index of `chip(e)` / `worker(e)` where `graph()` can evaluate `e`.
    pub(crate) target: Option<syn::Expr>,
    /// The uses of the graph's intermediates, every piece index included: their edges are
    /// computed by the generated code (static edges), not looked up in the TensorMap.
    pub(crate) internal: Vec<ArgUse>,
}

/// One tensor argument as `graph()` replays it: (argument position, tensor id, piece).
pub(crate) type ArgUse = (usize, usize, Option<(usize, syn::Expr)>);

/// What a tensor argument names: a whole tensor, or a piece `part[index]` of a partition.
pub(crate) struct Target {
    /// The tensor's name, or the partition's.
    pub(crate) ident: syn::Ident,
    /// The piece's index expression.
    pub(crate) index: Option<syn::Expr>,
}

/// One argument as lowered.
pub(crate) enum Arg {
    /// `&t`: a read.
    Read(Target, Span),
    /// `&mut t`: a write.
    Write(Target, Span),
    /// Anything else: a scalar expression, unchanged.
    Other(syn::Expr),
}

/// A check of the callee's parameter at `pos`.
pub(crate) struct Assert {
    pub(crate) span: Span,
    pub(crate) callee: syn::Expr,
    pub(crate) pos: usize,
    /// The tensor the argument names, for the message (as a type: the trait's message
    /// prints it).
    pub(crate) tensor: String,
    /// Which check: each is a trait bound on `Holds<{ fact }>` whose trait (in
    /// `__private`) carries the error's message, so a false fact is a plain E0277 on the
    /// argument, never a `const` evaluation failure (E0080).
    pub(crate) check: Check,
}

/// A signature-dependent check of one argument.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Check {
    /// S0111: a tensor that holds no value does not go to an `InOut` parameter.
    Unwritten,
    /// S0112: a value nothing has read is not overwritten through an `Out` parameter.
    Unread,
    /// S0113: what a loop writes in every iteration does not go to an `Out` parameter.
    LoopWrite,
    /// S0113: the same piece of a partition, written in every iteration (`&mut ys[0]`), does
    /// not go to an `Out` parameter; the message names the partition.
    LoopWritePiece,
}

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
    /// The piece (partition, index) the current value was written through (`None`: whole).
    written_piece: Option<(usize, syn::Expr)>,
    /// Out of scope (its `scope` ended).
    dead: bool,
    /// Already reported: no follow-on errors about it.
    errored: bool,
    /// An intermediate that is partitioned or used in a loop: its edges are static (computed
    /// by the generated code), where tracking them by piece pays; other intermediates go
    /// through the TensorMap like the parameters.
    statik: bool,
    /// Where the tasks that name it run.
    runs_on: RunsOn,
}

/// Where the tasks that name an intermediate run, as far as the call lines say.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum RunsOn {
    /// No task names it (yet).
    Nowhere,
    /// Every one on `chip(c)` with this constant `c`.
    Chip(u32),
    /// Anywhere else: a SUB worker, two chips, or a chip computed at run time.
    Elsewhere,
}

/// The constant chip of a `.on(chip(3))` placement.
fn constant_chip(place: &syn::Expr) -> Option<u32> {
    let syn::Expr::Call(call) = place else { return None };
    let syn::Expr::Path(f) = &*call.func else { return None };
    if f.path.segments.last().is_none_or(|s| s.ident != "chip") || call.args.len() != 1 {
        return None;
    }
    match &call.args[0] {
        syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) => i.base10_parse().ok(),
        _ => None,
    }
}

/// How one argument of a call uses its tensor.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    Read,
    Write,
}

/// What a name is bound to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bind {
    /// A tensor of the graph.
    Tensor(usize),
    /// A scalar (a parameter or a `let`).
    Scalar,
    /// The index variable of the loop at `depth` (0: the outermost).
    Index(usize),
    /// A partition of a tensor.
    Partition(usize),
    /// `t` of `for (i, t) in xs`: the piece of partition `part` at the index of loop `depth`.
    Piece(usize, usize),
}

/// A partition the graph declared.
struct Part {
    tensor: usize,
    /// The name the generated code gives it.
    ident: syn::Ident,
    /// The tensor and the counts as written: two partitions with the same key have the same pieces.
    key: String,
    /// `xs` (`x.tiles([16])`), for messages.
    text: String,
    /// The counts per axis for `split`/`grid` (`None`: `tiles`, counted at run time).
    counts: Option<Vec<syn::Expr>>,
}

/// How a loop body indexes the tensor it touches.
#[derive(Clone, PartialEq, Eq)]
enum Index {
    /// The whole tensor.
    Whole,
    /// A piece at an index affine in this loop variable (`i`, `2 * i + 1`).
    Var(String, Affine),
    /// A piece at an index that does not change with the loop (a literal).
    Fixed,
    /// A piece at another expression.
    Other(String),
}

/// One access of a tensor declared outside the loop.
struct LoopAccess {
    tensor: usize,
    /// The partition (for pieces).
    part: Option<usize>,
    write: bool,
    /// The partition's key (for pieces).
    key: Option<String>,
    /// The piece as written (`ys[i]`), for messages.
    text: String,
    /// The callable that touches it, for messages.
    callee: String,
    index: Index,
    span: Span,
}

/// A loop being checked.
struct Frame {
    var: String,
    var_ident: syn::Ident,
    /// Tensors with a smaller id were declared outside the loop.
    first_tensor: usize,
    span: Span,
    accesses: Vec<LoopAccess>,
}

/// A classified tensor argument.
struct Classified {
    id: usize,
    use_: Use,
    span: Span,
    target: Target,
    /// The partition (for a piece).
    part: Option<usize>,
}

struct Checker<'c> {
    cx: &'c mut Ctxt,
    tensors: Vec<Tensor>,
    parts: Vec<Part>,
    loops: Vec<Frame>,
    /// The graph has a loop.
    looped: bool,
    /// Name scopes: name -> what it is bound to.
    scopes: Vec<Vec<(String, Bind)>>,
    /// Task numbers as the engine counts them.
    next_task: usize,
    partial: bool,
    steps: Vec<Step>,
    tiled: Vec<Tiled>,
    count_checks: Vec<CountCheck>,
}

/// Checks `def` and plans its lowering; errors go to `cx`.
pub(crate) fn check(cx: &mut Ctxt, def: &GraphDef) -> Plan {
    let mut ck = Checker {
        cx,
        tensors: Vec::new(),
        parts: Vec::new(),
        loops: Vec::new(),
        looped: false,
        scopes: vec![Vec::new()],
        next_task: 0,
        partial: def.partial,
        steps: Vec::new(),
        tiled: Vec::new(),
        count_checks: Vec::new(),
    };
    for p in &def.params {
        if let ParamTy::Tensor { mode, .. } = &p.ty {
            ck.declare(&p.ident.unraw().to_string(), p.ident.span(), Origin::Param(*mode));
        } else {
            ck.scopes[0].push((p.ident.unraw().to_string(), Bind::Scalar));
        }
    }
    ck.stmts(&def.body);
    ck.close_scope(true);
    // Every use of a static intermediate takes the static path, every other use the TensorMap.
    let statik: Vec<bool> = ck.tensors.iter().map(|t| t.statik).collect();
    keep_static(&mut ck.steps, &statik);
    let mut chips: Vec<Option<u32>> = ck
        .tensors
        .iter()
        .map(|t| match t.runs_on {
            RunsOn::Chip(c) => Some(c),
            _ => None,
        })
        .collect();
    // An intermediate cut into strided pieces stays in host memory: a chip's copy-in packs a
    // strided host piece, which every backend's kernel then reads as a plain array, where a
    // strided view of device memory would reach an OpenCL kernel as it lies (and be refused).
    for p in &ck.parts {
        if p.counts.as_deref().is_some_and(strided_grid) {
            chips[p.tensor] = None;
        }
    }
    place_allocs(&mut ck.steps, &chips);
    let tensors = ck.tensors.iter().map(|t| t.name.clone()).collect();
    let compile_time_edges = ck.parts.is_empty() && !ck.looped;
    Plan {
        tensors,
        steps: ck.steps,
        tasks: ck.next_task,
        statik: statik.contains(&true),
        compile_time_edges,
        tiled: ck.tiled,
        count_checks: ck.count_checks,
    }
}

/// The identifiers of a token stream that could name a tensor: not a field or method name
/// (after `.`), not a path segment (after `::`), not the receiver of `.shape()`. A value after
/// one `:` (a struct literal's `field: t`) is a mention.
fn tensor_mentions(ts: proc_macro2::TokenStream, out: &mut Vec<proc_macro2::Ident>) {
    use proc_macro2::TokenTree;
    let tts: Vec<TokenTree> = ts.into_iter().collect();
    let punct = |k: usize, c: char| matches!(tts.get(k), Some(TokenTree::Punct(p)) if p.as_char() == c);
    for (k, tt) in tts.iter().enumerate() {
        match tt {
            TokenTree::Ident(i) => {
                let after_dot =
                    k > 0 && (punct(k - 1, '.') || (k > 1 && punct(k - 1, ':') && punct(k - 2, ':')));
                let shape = matches!(tts.get(k + 1), Some(TokenTree::Punct(p)) if p.as_char() == '.')
                    && matches!(tts.get(k + 2), Some(TokenTree::Ident(m)) if m == "shape");
                if !after_dot && !shape {
                    out.push(i.clone());
                }
            }
            TokenTree::Group(g) => tensor_mentions(g.stream(), out),
            _ => {}
        }
    }
}

/// Keeps, in every task, only the uses of static intermediates as static uses.
fn keep_static(steps: &mut [Step], statik: &[bool]) {
    for step in steps {
        match step {
            Step::Task(t) => {
                for m in &mut t.members {
                    m.internal.retain(|(_, id, _)| statik[*id]);
                }
            }
            Step::Scope(inner) | Step::For { body: inner, .. } => keep_static(inner, statik),
            _ => {}
        }
    }
}

/// Whether a partition with these counts per axis may cut strided pieces: more than one
/// piece along an axis after the first (a count that is not the literal `1`).
fn strided_grid(counts: &[syn::Expr]) -> bool {
    let one = |e: &syn::Expr| matches!(e, syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) if i.base10_digits() == "1");
    counts.iter().skip(1).any(|c| !one(c))
}

/// Places each intermediate whose tasks all run on one constant chip on that chip.
fn place_allocs(steps: &mut [Step], chips: &[Option<u32>]) {
    for step in steps {
        match step {
            Step::Alloc { id, chip, .. } => *chip = chips[*id],
            Step::Scope(inner) | Step::For { body: inner, .. } => place_allocs(inner, chips),
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

impl Checker<'_> {
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
            written_piece: None,
            dead: false,
            errored: false,
            statik: false,
            runs_on: RunsOn::Nowhere,
        });
        let id = self.tensors.len() - 1;
        self.scopes.last_mut().expect("a scope").push((name.to_string(), Bind::Tensor(id)));
        id
    }

    /// The live binding of `name`.
    fn lookup(&self, name: &str) -> Option<Bind> {
        self.scopes.iter().rev().flat_map(|s| s.iter().rev()).find(|(n, _)| n == name).map(|(_, t)| *t)
    }

    /// A tensor of this name whose scope has ended.
    fn dead(&self, name: &str) -> Option<usize> {
        self.tensors.iter().rposition(|t| t.name == name && t.dead)
    }

    fn stmts(&mut self, stmts: &[Stmt]) {
        for stmt in stmts {
            match stmt {
                Stmt::Alloc { ident, elem, dims } => {
                    for d in dims {
                        self.no_hidden_tensors(d);
                    }
                    let id = self.declare(&ident.unraw().to_string(), ident.span(), Origin::Alloc);
                    match elem {
                        Some(elem) => self.steps.push(Step::Alloc {
                            id,
                            ident: ident.clone(),
                            elem: elem.clone(),
                            dims: dims.clone(),
                            chip: None,
                        }),
                        None => self.tensors[id].errored = true,
                    }
                }
                Stmt::Scalar { ident, local } => {
                    // Passed through; it shadows any tensor of the same name.
                    if let Some(init) = &local.init {
                        self.no_hidden_tensors(&init.expr);
                    }
                    self.steps.push(Step::Scalar(local.clone()));
                    self.scopes.last_mut().expect("a scope").push((ident.unraw().to_string(), Bind::Scalar));
                }
                Stmt::Partition { ident, source, method, counts } => {
                    self.partition(ident, source, method, counts)
                }
                Stmt::For(l) => self.for_loop(l),
                Stmt::Call(line) => self.task(std::slice::from_ref(line)),
                Stmt::Scope(inner) => {
                    let outer = std::mem::take(&mut self.steps);
                    self.scopes.push(Vec::new());
                    self.stmts(inner);
                    self.close_scope(false);
                    let inner = std::mem::replace(&mut self.steps, outer);
                    self.steps.push(Step::Scope(inner));
                }
                Stmt::Group { span, members } => self.group(*span, members),
            }
        }
    }

    /// Ends the innermost scope (or the function): unread values and unwritten outputs.
    fn close_scope(&mut self, function: bool) {
        let scope = self.scopes.pop().unwrap_or_default();
        for (_, t) in scope {
            let Bind::Tensor(id) = t else { continue };
            self.tensors[id].dead = !function;
            let t = &self.tensors[id];
            if t.errored || self.partial {
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
        }
    }

    /// Classifies one argument: a tensor use (a whole tensor or a piece of a partition), or
    /// `None` for a scalar expression.
    fn classify(&mut self, e: &syn::Expr) -> Option<Classified> {
        let e = unwrap(e);
        let (inner, use_) = match e {
            syn::Expr::Reference(r) => {
                (unwrap(&r.expr), if r.mutability.is_some() { Use::Write } else { Use::Read })
            }
            other => (other, Use::Read),
        };
        let explicit = matches!(e, syn::Expr::Reference(_));
        // `xs[index]`: a piece of a partition.
        if let syn::Expr::Index(ix) = inner
            && let Some(ident) = single_ident(&ix.expr)
        {
            let name = ident.unraw().to_string();
            match self.lookup(&name) {
                Some(Bind::Partition(p)) => {
                    self.no_hidden_tensors(&ix.index);
                    let index = (*ix.index).clone();
                    return Some(Classified {
                        id: self.parts[p].tensor,
                        use_,
                        span: ident.span(),
                        target: Target { ident: self.parts[p].ident.clone(), index: Some(index) },
                        part: Some(p),
                    });
                }
                Some(Bind::Tensor(_)) => {
                    self.cx.error(
                        ident.span(),
                        format!("`{name}` is a tensor, not a partition: it has no pieces to index [S0110]\nhelp: partition it first, `let {name}s = {name}.split(N);`, then pass `{name}s[i]`"),
                    );
                    return None;
                }
                _ => {}
            }
        }
        let Some(ident) = single_ident(inner) else {
            self.no_hidden_tensors(e);
            return None;
        };
        let name = ident.unraw().to_string();
        match self.lookup(&name) {
            Some(Bind::Tensor(id)) => Some(Classified {
                id,
                use_,
                span: ident.span(),
                target: Target { ident: ident.clone(), index: None },
                part: None,
            }),
            Some(Bind::Piece(p, depth)) => {
                let var = self.loops[depth].var_ident.clone();
                Some(Classified {
                    id: self.parts[p].tensor,
                    use_,
                    span: ident.span(),
                    target: Target {
                        ident: self.parts[p].ident.clone(),
                        index: Some(syn::parse_quote!(#var)),
                    },
                    part: Some(p),
                })
            }
            Some(Bind::Partition(p)) => {
                let t = self.tensors[self.parts[p].tensor].name.clone();
                self.cx.error(
                    ident.span(),
                    format!("`{name}` is a partition of `{t}`, not a tensor [S0110]\nhelp: pass one piece, `{name}[i]`, or the whole tensor, `{t}`"),
                );
                None
            }
            Some(Bind::Scalar | Bind::Index(_)) if explicit => {
                self.cx.error(
                    ident.span(),
                    format!("`{name}` is a scalar, not a tensor of this graph [S0110]\nhelp: pass scalars by value"),
                );
                None
            }
            Some(Bind::Scalar | Bind::Index(_)) => None,
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

    /// Refuses live tensors named inside an expression the graph cannot follow (a field or
    /// method name that happens to equal a tensor's name is not the tensor; `t.shape()` only
    /// reads metadata and is allowed).
    fn no_hidden_tensors(&mut self, e: &syn::Expr) {
        let mut found = Vec::new();
        tensor_mentions(e.to_token_stream(), &mut found);
        for i in found {
            let id = match self.lookup(&i.unraw().to_string()) {
                Some(Bind::Tensor(id)) => Some(id),
                Some(Bind::Partition(p) | Bind::Piece(p, _)) => Some(self.parts[p].tensor),
                _ => None,
            };
            if let Some(id) = id {
                self.tensors[id].errored = true;
                self.cx.error(
                    i.span(),
                    format!(
                        "tensor `{i}` is used inside an expression here, where the graph cannot see whether it is read or written [S0110]\nhelp: pass a tensor directly: `{i}` to read it, `&mut {i}` to write it (`{i}.shape()` may be used in expressions)"
                    ),
                );
            }
        }
    }

    /// Refuses names bound at run time (graph scalars, `let`s, tensors) in an expression that
    /// must be known at compile time: a loop bound, a partition's count or a tile's shape.
    fn compile_time(&mut self, e: &syn::Expr, what: &str) {
        let mut found = Vec::new();
        tensor_mentions(e.to_token_stream(), &mut found);
        for i in found {
            let help = match self.lookup(&i.unraw().to_string()) {
                None => continue,
                Some(Bind::Partition(_)) => format!(
                    "to run once per piece of `{i}`, loop over the partition itself: `for (i, t) in {i} {{ .. }}` (its piece count may be the run's)"
                ),
                Some(_) => "use a literal or a `const`; when the count or the tile shape is known only at run time, write a `#[callable(orch)]` function and submit the tasks through an `IndexLaunch` (`o.index_launch()`), which checks the pieces at run time".to_string(),
            };
            self.cx.error(
                i.span(),
                format!("{what} must be known at compile time, but `{i}` is a value of the run [S0115]\nhelp: {help}"),
            );
        }
    }

    /// Whether `graph()` can evaluate `e`: it names only loop indices, literals and constants
    /// (names that start with an upper-case letter).
    fn replayable(&self, e: &syn::Expr) -> bool {
        let mut found = Vec::new();
        tensor_mentions(e.to_token_stream(), &mut found);
        found.iter().all(|i| {
            let name = i.unraw().to_string();
            match self.lookup(&name) {
                Some(Bind::Index(_)) => true,
                Some(_) => false,
                None => name.starts_with(|c: char| c.is_ascii_uppercase()),
            }
        })
    }

    /// `let xs = x.split(n);` / `x.grid([..])`.
    fn partition(
        &mut self,
        ident: &syn::Ident,
        source: &syn::Ident,
        method: &syn::Ident,
        counts: &[syn::Expr],
    ) {
        let name = source.unraw().to_string();
        let tensor = match self.lookup(&name) {
            Some(Bind::Tensor(id)) => id,
            _ => {
                self.cx.error(
                    source.span(),
                    format!("`{name}` is not a tensor of this graph, so it cannot be partitioned [S0110]\nhelp: partition a graph parameter or an `alloc` intermediate"),
                );
                self.scopes.last_mut().expect("a scope").push((ident.unraw().to_string(), Bind::Scalar));
                return;
            }
        };
        let tiles = method == "tiles";
        for c in counts {
            self.compile_time(c, if tiles { "a tile's shape" } else { "a partition's piece count" });
        }
        if counts.is_empty() {
            // Malformed (reported by the parser).
            self.tensors[tensor].errored = true;
        }
        if tiles && !matches!(self.tensors[tensor].origin, Origin::Param(_)) {
            // The count of an intermediate's tiles would depend on its `alloc`'s run-time dims.
            self.tensors[tensor].errored = true;
            self.cx.error(
                method.span(),
                format!("`{name}.tiles(..)` tiles an intermediate, whose tile count the graph cannot compute before the run [S0115]\nhelp: tile the graph's parameters; cut an intermediate with `{name}.split(N)` or `{name}.grid([A, B])`"),
            );
        }
        let args = counts.iter().map(|c| model::squash(c.to_token_stream())).collect::<Vec<_>>().join(", ");
        let key = format!("{name}.{method}({args})");
        let written = if tiles || method == "grid" {
            format!("{name}.{method}([{args}])")
        } else {
            format!("{name}.{method}({args})")
        };
        let pname = ident.unraw().to_string();
        let text = if pname.starts_with("__part_") {
            format!("`{written}`")
        } else {
            format!("`{pname}` (`{written}`)")
        };
        let id = self.parts.len();
        self.tensors[tensor].statik = true;
        if tiles && !counts.is_empty() {
            self.tiled.push(Tiled {
                part: id,
                source: source.clone(),
                tile: counts.to_vec(),
                text: text.clone(),
            });
        }
        let fixed = if tiles { None } else { Some(counts.to_vec()) };
        self.parts.push(Part { tensor, ident: ident.clone(), key, text, counts: fixed });
        self.scopes.last_mut().expect("a scope").push((ident.unraw().to_string(), Bind::Partition(id)));
        if !counts.is_empty() {
            self.steps.push(Step::Partition {
                id,
                tensor,
                ident: ident.clone(),
                source: source.clone(),
                method: method.clone(),
                counts: counts.to_vec(),
            });
        }
    }

    /// A loop: its body is checked once, as any iteration; then the accesses of tensors
    /// declared outside it are compared across iterations.
    fn for_loop(&mut self, l: &ForLoop) {
        if let Some((start, end)) = &l.range {
            self.compile_time(start, "a loop's bound");
            self.compile_time(end, "a loop's bound");
        }
        let part = match &l.piece {
            Some((_, p)) => match self.lookup(&p.unraw().to_string()) {
                Some(Bind::Partition(id)) => Some((self.parts[id].ident.clone(), id)),
                _ => {
                    self.cx.error(
                        p.span(),
                        format!("`{p}` is not a partition of this graph [S0115]\nhelp: loop over a partition: `let {p} = x.split(N);` first, or `for (i, t) in x.split(N) {{ .. }}`"),
                    );
                    return;
                }
            },
            None => None,
        };
        let var = l.var.unraw().to_string();
        self.looped = true;
        self.loops.push(Frame {
            var: var.clone(),
            var_ident: l.var.clone(),
            first_tensor: self.tensors.len(),
            span: l.span,
            accesses: Vec::new(),
        });
        let outer = std::mem::take(&mut self.steps);
        self.scopes.push(vec![(var, Bind::Index(self.loops.len() - 1))]);
        if let (Some((t, _)), Some((_, id))) = (&l.piece, &part) {
            let depth = self.loops.len() - 1;
            self.scopes.last_mut().expect("a scope").push((t.unraw().to_string(), Bind::Piece(*id, depth)));
        }
        self.stmts(&l.body);
        self.close_scope(false);
        let frame = self.loops.pop().expect("a loop");
        self.across_iterations(&frame);
        // The partitions indexed at the loop's index must have as many pieces as the loop's (a
        // range loop: at least as many pieces as its end, for those whose count is the run's).
        let end = l.range.as_ref().map(|(_, end)| end.clone());
        let start = l.range.as_ref().map(|(start, _)| start.clone());
        // (partition, index, index as written): each index a partition is named at.
        let mut ids: Vec<(usize, Affine, String)> =
            part.iter().map(|(_, p)| (*p, Affine::PLAIN, frame.var.clone())).collect();
        for a in &frame.accesses {
            if let (Some(q), Index::Var(v, f)) = (a.part, &a.index)
                && *v == frame.var
                && !ids.iter().any(|(p, g, _)| *p == q && g == f)
            {
                let ix =
                    a.text.split_once('[').map_or(v.clone(), |(_, r)| r.trim_end_matches(']').to_string());
                ids.push((q, *f, ix));
            }
        }
        let what = format!("the loop at line {}", frame.span.start().line);
        if let (Some(start), Some(end)) = (&start, &end) {
            // A range loop against a partition whose count is written as literals: checked here,
            // with a plain error. Named constants are the compiler's to evaluate (codegen).
            ids.retain(|(q, f, ix)| {
                let count = literal_count(self.parts[*q].counts.as_deref());
                // The plain index needs the end only (a start is never below 0).
                let s = if *f == Affine::PLAIN { Some(0) } else { lit_u64(start) };
                let (Some(s), Some(e), Some(n)) = (s, lit_u64(end), count) else {
                    return true;
                };
                let text = &self.parts[*q].text;
                if *f == Affine::PLAIN && e > n {
                    self.cx.error(
                        end.span(),
                        format!(
                            "{what} runs to `{e}` and indexes {text} at its index, but {text} has {n} pieces: its last iterations would name pieces that do not exist [S0113]\nhelp: loop over the partition itself, `for (i, t) in ..`, to run once per piece, or end the range at {n}"
                        ),
                    );
                } else if e > s && (f.at(s) < 0 || f.at(e - 1) >= i128::from(n)) {
                    let (first, last) = (f.at(s), f.at(e - 1));
                    self.cx.error(
                        end.span(),
                        format!(
                            "{what} runs over {s}..{e} and indexes {text} at `{ix}`, pieces {first} to {last}, but {text} has {n} pieces (0 to {}): some iterations would name pieces that do not exist [S0113]\nhelp: change the range or the index so that every piece it names is one of {text}",
                            n.saturating_sub(1)
                        ),
                    );
                }
                false
            });
        }
        if ids.len() > usize::from(end.is_none()) {
            let parts = ids
                .iter()
                .map(|(q, f, ix)| CountedPart {
                    text: self.parts[*q].text.clone(),
                    part: *q,
                    counts: self.parts[*q].counts.clone(),
                    index: *f,
                    index_text: ix.clone(),
                })
                .collect();
            self.count_checks.push(CountCheck { what, parts, end, start });
        }
        let body = std::mem::replace(&mut self.steps, outer);
        self.steps.push(Step::For { var: l.var.clone(), range: l.range.clone(), part, body });
    }

    /// Records an access for every enclosing loop the tensor was declared outside of; a write
    /// that is not a piece at that loop's index touches the same bytes in every iteration:
    /// refused (an index the graph cannot follow), or allowed only through an `InOut`
    /// parameter (an accumulator the engine orders), checked by an assertion.
    fn loop_access(&mut self, c: &Classified, callee: &syn::Expr, pos: usize, asserts: &mut Vec<Assert>) {
        let name = self.tensors[c.id].name.clone();
        let (key, text, index_text) = match (c.part, &c.target.index) {
            (Some(p), Some(ix)) => {
                let ix_text = model::squash(ix.to_token_stream());
                (
                    Some(self.parts[p].key.clone()),
                    format!("{}[{ix_text}]", c.target.ident),
                    Some((ix, ix_text)),
                )
            }
            _ => (None, name.clone(), None),
        };
        let write = c.use_ == Use::Write;
        let mut asserted = false;
        for depth in (0..self.loops.len()).rev() {
            if c.id >= self.loops[depth].first_tensor {
                continue;
            }
            let frame_var = self.loops[depth].var.clone();
            let index = match &index_text {
                None => Index::Whole,
                // By binding, not by name: a `let` or an inner loop may shadow the index.
                // Affine in an index variable (`i`, `2 * i + 1`), or a constant piece.
                Some((ix, t)) => match affine(ix).map(|(i, f)| (self.lookup(&i.unraw().to_string()), f)) {
                    Some((Some(Bind::Index(d)), f)) if d == depth => Index::Var(frame_var.clone(), f),
                    Some((Some(Bind::Index(_)), _)) => Index::Fixed,
                    _ if matches!(unwrap(ix), syn::Expr::Lit(_)) => Index::Fixed,
                    _ => Index::Other(t.clone()),
                },
            };
            if write && !self.tensors[c.id].errored {
                match &index {
                    Index::Var(..) => {}
                    Index::Whole | Index::Fixed if !asserted => {
                        asserted = true;
                        // A fixed piece is named by its partition (`ys`), not by the tensor
                        // it splits, which the loop does not write whole.
                        let (tensor, check) = match &index {
                            Index::Fixed => (c.target.ident.unraw().to_string(), Check::LoopWritePiece),
                            _ => (self.tensors[c.id].name.clone(), Check::LoopWrite),
                        };
                        asserts.push(Assert { span: c.span, callee: callee.clone(), pos, tensor, check });
                    }
                    Index::Whole | Index::Fixed => {}
                    Index::Other(t) => {
                        self.tensors[c.id].errored = true;
                        let shadowed = if *t == frame_var { " (a `let` shadows it here)" } else { "" };
                        self.cx.error(
                            c.span,
                            format!(
                                "argument {} of `{}` writes `{text}`, but the graph cannot prove that the iterations of the loop over `{frame_var}` ({}) write different pieces of `{name}`: the piece index `{t}` is not the loop's index{shadowed} [S0113]\nhelp: index the written piece with the loop variable itself, `&mut {}[{frame_var}]`, with a partition whose pieces match the iterations",
                                pos + 1,
                                model::squash(callee.to_token_stream()),
                                at(self.loops[depth].span),
                                c.target.ident
                            ),
                        );
                    }
                }
            }
            self.loops[depth].accesses.push(LoopAccess {
                tensor: c.id,
                part: c.part,
                write,
                key: key.clone(),
                text: text.clone(),
                callee: model::squash(callee.to_token_stream()),
                index,
                span: c.span,
            });
        }
    }

    /// The checks between iterations of one loop: the pieces written at the loop's index are
    /// of one partition, and nothing else in the body touches what they write.
    fn across_iterations(&mut self, frame: &Frame) {
        let var = &frame.var;
        let mut done: Vec<usize> = Vec::new();
        for a in &frame.accesses {
            if done.contains(&a.tensor) {
                continue;
            }
            done.push(a.tensor);
            let all: Vec<&LoopAccess> = frame.accesses.iter().filter(|b| b.tensor == a.tensor).collect();
            let at_var = |b: &LoopAccess| match &b.index {
                Index::Var(v, f) if v == var => Some(*f),
                _ => None,
            };
            // The writes at (an affine function of) the loop's index.
            let writes: Vec<&LoopAccess> =
                all.iter().copied().filter(|b| b.write && at_var(b).is_some()).collect();
            let Some(&first) = writes.first() else {
                continue;
            };
            let name = self.tensors[a.tensor].name.clone();
            if self.tensors[a.tensor].errored {
                continue;
            }
            // A write at the loop's index that `b` may meet in another iteration: none when `b`
            // names, through the same partition, the same piece as each write in its own
            // iteration or pieces no iteration of it writes (`2 * i` beside `2 * i + 1`).
            let clash = |b: &LoopAccess| -> Option<&LoopAccess> {
                let Some(f) = at_var(b).filter(|_| b.key == first.key) else { return Some(first) };
                writes.iter().copied().find(|w| at_var(w).is_some_and(|g| g != f && !g.disjoint(f)))
            };
            for b in &all {
                let Some(first) = clash(b) else {
                    continue;
                };
                if b.write {
                    // Two indices of one partition that iterations share, or another partition.
                    let help = if b.key == first.key && at_var(b).is_some() {
                        format!(
                            "give the writes indices that no two iterations share: `2 * {var}` beside `2 * {var} + 1` never meet, `{var}` beside `{var} + 1` do"
                        )
                    } else {
                        format!("write every piece of `{name}` through one partition, indexed by `{var}`")
                    };
                    self.cx.error(
                        b.span,
                        format!(
                            "`{}` is written here by `{}` and overlaps the pieces `{}` that other iterations of the loop over `{var}` ({}) write through `{}` ({}) [S0113]\nhelp: {help}",
                            b.text,
                            b.callee,
                            first.text,
                            at(frame.span),
                            first.callee,
                            at(first.span)
                        ),
                    );
                } else {
                    self.cx.error(
                        b.span,
                        format!(
                            "`{}` is read here by `{}`, but other iterations of the loop over `{var}` ({}) write the pieces `{}` of `{name}` through `{}` ({}), and nothing orders the iterations [S0114]\nhelp: read only this iteration's piece, `{}`, or read `{name}` after the loop, when every piece is written",
                            b.text,
                            b.callee,
                            at(frame.span),
                            first.text,
                            first.callee,
                            at(first.span),
                            first.text
                        ),
                    );
                }
                self.tensors[a.tensor].errored = true;
                break;
            }
        }
    }

    /// A live tensor whose name is close to `name`.
    fn similar(&self, name: &str) -> Option<String> {
        let live = self
            .scopes
            .iter()
            .flat_map(|s| s.iter())
            .filter(|(_, t)| matches!(t, Bind::Tensor(_) | Bind::Partition(_)))
            .map(|(n, _)| n.clone());
        live.map(|n| (distance(&n, name), n))
            .filter(|(d, n)| *d <= (n.len().max(name.len()) / 3).max(1))
            .min()
            .map(|(_, n)| n)
    }

    /// A `group(|| { ... })`: one task whose members are the inner call lines.
    fn group(&mut self, span: Span, lines: &[CallLine]) {
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
            // Different paths to one function (`copy`, `self::copy`) are fine: `submit_group`
            // also checks the digests at run time.
            if last(&l.callee) != last(&lines[0].callee) {
                let this = model::squash(l.callee.to_token_stream());
                self.cx.error(
                    l.callee.span(),
                    format!(
                        "a group runs one callable, but this member calls `{this}` and the first calls `{first}` ({}) [S0108]\nhelp: split it into two groups",
                        at(lines[0].callee.span())
                    ),
                );
            }
        }
        self.task(lines);
    }

    /// One task: a single call line, or the members of a group.
    fn task(&mut self, lines: &[CallLine]) {
        let index = self.next_task;
        self.next_task += 1;
        let group = lines.len() > 1;
        // Uses: (tensor, use, span, argument position, member).
        let mut uses: Vec<(usize, Use, Span, usize, usize)> = Vec::new();
        // What the user wrote for each use, when it names a piece (`hs[0]`, a loop's `t`).
        let mut pieces: Vec<Option<String>> = Vec::new();
        // The piece each use names: (partition, index).
        let mut at_piece: Vec<Option<(usize, syn::Expr)>> = Vec::new();
        let mut members = Vec::new();
        // S0113 assertions of writes that touch the same bytes in every iteration of a loop.
        let mut loop_asserts: Vec<Assert> = Vec::new();
        for (m, line) in lines.iter().enumerate() {
            let mut args = Vec::new();
            let mut member_uses = Vec::new();
            let mut internal = Vec::new();
            for (pos, a) in line.args.iter().enumerate() {
                match self.classify(a) {
                    Some(c) => {
                        uses.push((c.id, c.use_, c.span, pos, m));
                        at_piece.push(c.part.zip(c.target.index.clone()));
                        pieces.push(c.part.map(|_| match &c.target.index {
                            Some(ix) => {
                                format!("{}[{}]", c.target.ident, model::squash(ix.to_token_stream()))
                            }
                            None => c.target.ident.to_string(),
                        }));
                        let piece = match (c.part, &c.target.index) {
                            (Some(p), Some(ix)) if self.replayable(ix) => Some((p, ix.clone())),
                            _ => None,
                        };
                        member_uses.push((pos, c.id, piece));
                        if self.tensors[c.id].origin == Origin::Alloc && !self.loops.is_empty() {
                            self.tensors[c.id].statik = true;
                        }
                        if self.tensors[c.id].origin == Origin::Alloc {
                            let here = constant_chip(&line.place).map_or(RunsOn::Elsewhere, RunsOn::Chip);
                            let t = &mut self.tensors[c.id];
                            t.runs_on = match t.runs_on {
                                RunsOn::Nowhere => here,
                                same if same == here => same,
                                _ => RunsOn::Elsewhere,
                            };
                            let piece = c.part.zip(c.target.index.clone());
                            internal.push((pos, c.id, piece));
                        }
                        self.loop_access(&c, &line.callee, pos, &mut loop_asserts);
                        args.push(match c.use_ {
                            Use::Read => Arg::Read(c.target, a.span()),
                            Use::Write => Arg::Write(c.target, a.span()),
                        });
                    }
                    None => args.push(Arg::Other(a.clone())),
                }
            }
            let target = match &line.place {
                syn::Expr::Call(c) if c.args.len() == 1 && self.replayable(&c.args[0]) => {
                    Some(c.args[0].clone())
                }
                _ => None,
            };
            members.push(Member { line: line.clone(), args, uses: member_uses, target, internal });
        }
        let callee_name = model::squash(lines[0].callee.to_token_stream());
        self.check_uses(&uses, &pieces, group, &callee_name);

        // Signature-dependent checks.
        let accumulated: Vec<Span> = loop_asserts.iter().map(|a| a.span).collect();
        let mut asserts = loop_asserts;
        for (k, &(id, u, span, pos, m)) in uses.iter().enumerate() {
            if u != Use::Write {
                continue;
            }
            // Another piece than the one the current value was written through, in the same
            // iteration (`ys[2 * i + 1]` after `ys[2 * i]`): nothing is overwritten.
            let other_piece = match (&self.tensors[id].written_piece, &at_piece[k]) {
                (Some((p, x)), Some((q, y))) => p == q && distinct_pieces(x, y),
                _ => false,
            };
            // A loop's accumulator: S0113 says it better than S0112.
            let accumulator = accumulated.iter().any(|s| format!("{s:?}") == format!("{span:?}"));
            let t = &self.tensors[id];
            let (callee, tensor) = (lines[m].callee.clone(), t.name.clone());
            if !t.written {
                asserts.push(Assert { span, callee, pos, tensor, check: Check::Unwritten });
            } else if t.readers.is_empty() && t.writer.is_some() && !accumulator && !other_piece {
                asserts.push(Assert { span, callee, pos, tensor, check: Check::Unread });
            }
        }

        // Edges, from the state before this task (a task never reads and writes one tensor),
        // in the engine's walk order: per argument, its writer, then for a write the readers.
        let mut edges = Vec::new();
        for &(id, u, _, pos, m) in &uses {
            let t = &self.tensors[id];
            if let Some(from) = t.writer {
                edges.push(GraphEdge { from, member: m, pos, tensor: t.name.clone(), war: false });
            }
            if u == Use::Write {
                for &from in &t.readers {
                    edges.push(GraphEdge { from, member: m, pos, tensor: t.name.clone(), war: true });
                }
            }
        }

        // State updates. (A task that reads and writes one tensor is an error above.)
        for (k, &(id, u, span, _, _)) in uses.iter().enumerate() {
            let t = &mut self.tensors[id];
            if u == Use::Write {
                t.written_piece = at_piece[k].clone();
            }
            if u == Use::Read {
                if !t.readers.contains(&index) {
                    t.readers.push(index);
                }
            } else {
                t.writer = Some(index);
                t.written = true;
                t.readers.clear();
                t.written_at = Some(span);
            }
        }
        self.steps.push(Step::Task(Task { index, members, asserts, edges }));
    }

    /// Checks within one task: writes to `In` inputs, aliasing, reads of empty tensors.
    /// `pieces[i]`: what the user wrote for `uses[i]` when it names a piece of the tensor.
    fn check_uses(
        &mut self,
        uses: &[(usize, Use, Span, usize, usize)],
        pieces: &[Option<String>],
        group: bool,
        callee_name: &str,
    ) {
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
                let both_write = u == Use::Write && u2 == Use::Write;
                if group && m != m2 {
                    let what =
                        if both_write { "two written parameters" } else { "a read and a written parameter" };
                    self.cx.error(
                        span,
                        format!(
                            "`{name}` is used by two members of this group through {what} (member {} at {}) [S0108]\nhelp: the members run at the same time; give each member its own output",
                            m2 + 1,
                            at(span2)
                        ),
                    );
                } else if both_write {
                    self.cx.error(
                        span,
                        format!(
                            "`{name}` is passed to two written parameters of `{callee_name}` (arguments {} and {}) [S0103]\nhelp: the two writes would race inside one task; pass two different tensors",
                            pos2 + 1,
                            pos + 1
                        ),
                    );
                } else {
                    self.cx.error(
                        span,
                        format!(
                            "`{name}` is both read and written by this call of `{callee_name}` (arguments {} and {}) [S0104]\nhelp: write the result into a new intermediate",
                            pos2.min(pos) + 1,
                            pos2.max(pos) + 1
                        ),
                    );
                }
            }
            if u == Use::Read && !self.tensors[id].written && !self.tensors[id].errored && !self.partial {
                let t = &self.tensors[id];
                // The piece the user wrote, when it is one: the hint names what to pass.
                let (what, of, this, it) = match &pieces[i] {
                    Some(p) => {
                        (format!("`{p}`"), format!(" (a piece of `{name}`)"), p.clone(), format!("`{p}`"))
                    }
                    None => (format!("`{name}`"), String::new(), name.clone(), "it".to_string()),
                };
                let msg = match t.origin {
                    Origin::Param(_) if pieces[i].is_none() => format!(
                        "`{name}` is read here but no call has written it yet: it is an `Out` of this graph [S0101]\nhelp: write it first, or declare it `InOut` if the caller provides its contents"
                    ),
                    Origin::Param(_) => format!(
                        "{what}{of} is read here but no call has written it yet: `{name}` is an `Out` of this graph [S0101]\nhelp: write {what} first, or declare `{name}` `InOut` if the caller provides its contents"
                    ),
                    Origin::Alloc => format!(
                        "{what}{of} is read here but no call has written it yet [S0101]\nhelp: `{name}` was allocated at {} and holds no data: if this call writes {it}, pass `&mut {this}`; otherwise write it through an `Out` parameter first",
                        at(t.decl)
                    ),
                };
                self.tensors[id].errored = true;
                self.cx.error(span, msg);
            }
        }
    }
}
