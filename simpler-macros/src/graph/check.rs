//! Check: the dataflow pass over a parsed graph. It keeps a table of tensors (graph parameters
//! and intermediates) with, for each, whether it holds a value, which task wrote it and which
//! tasks read it since; reports def-use errors, writes to read-only inputs, aliasing inside one
//! call or group, unwritten outputs and unread values; and turns the body into a [`Plan`]: the
//! steps to generate, with every argument classified, and the checks that need the callee's
//! signature (left to rustc as `const` assertions). Every edge, write-after-read included, is
//! the engine's to infer from the tags.

use proc_macro2::Span;
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::spanned::Spanned;

use super::parse::{CallLine, GraphDef, Stmt, single_ident, unwrap};
use crate::ctxt::{Ctxt, at};
use crate::model::{self, Mode, ParamTy};

/// What to generate, in order.
pub(crate) struct Plan {
    /// Tensor names in id order (parameters first), for the graph's replay.
    pub(crate) tensors: Vec<String>,
    pub(crate) steps: Vec<Step>,
    /// How many tasks the graph submits.
    pub(crate) tasks: usize,
}

/// One generated step.
pub(crate) enum Step {
    /// `let mut x = o.alloc_of::<T>(&[dims])?;` for tensor `id`.
    Alloc { ident: syn::Ident, elem: syn::Type, dims: Vec<syn::Expr> },
    /// A scalar `let`, unchanged.
    Scalar(syn::Local),
    /// `scope(|| { ... })`: its steps, in a Rust block of their own (so its names end with it).
    Scope(Vec<Step>),
    /// One task: a call, or a group of members.
    Task(Task),
}

/// One task.
pub(crate) struct Task {
    pub(crate) index: usize,
    pub(crate) members: Vec<Member>,
    /// Signature-dependent checks, emitted as `const` assertions.
    pub(crate) asserts: Vec<Assert>,
}

/// One call line of a task.
pub(crate) struct Member {
    pub(crate) line: CallLine,
    pub(crate) args: Vec<Arg>,
    /// (argument position, tensor id) of its tensor arguments.
    pub(crate) uses: Vec<(usize, usize)>,
}

/// One argument as lowered.
pub(crate) enum Arg {
    /// `&t`: a read.
    Read(syn::Ident, Span),
    /// `&mut t`: a write.
    Write(syn::Ident, Span),
    /// Anything else: a scalar expression, unchanged.
    Other(syn::Expr),
}

/// A mode the callee's parameter at `pos` must not have.
pub(crate) struct Assert {
    pub(crate) span: Span,
    pub(crate) callee: syn::Expr,
    pub(crate) pos: usize,
    pub(crate) forbid: Mode,
    pub(crate) message: String,
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

struct Checker<'c> {
    cx: &'c mut Ctxt,
    tensors: Vec<Tensor>,
    /// Name scopes: name -> tensor index, or `None` for a scalar binding that shadows.
    scopes: Vec<Vec<(String, Option<usize>)>>,
    /// Task numbers as the engine counts them.
    next_task: usize,
    partial: bool,
    steps: Vec<Step>,
}

/// Checks `def` and plans its lowering; errors go to `cx`.
pub(crate) fn check(cx: &mut Ctxt, def: &GraphDef) -> Plan {
    let mut ck = Checker {
        cx,
        tensors: Vec::new(),
        scopes: vec![Vec::new()],
        next_task: 0,
        partial: def.partial,
        steps: Vec::new(),
    };
    for p in &def.params {
        if let ParamTy::Tensor { mode, .. } = &p.ty {
            ck.declare(&p.ident.unraw().to_string(), p.ident.span(), Origin::Param(*mode));
        } else {
            ck.scopes[0].push((p.ident.unraw().to_string(), None));
        }
    }
    ck.stmts(&def.body);
    ck.close_scope(true);
    let tensors = ck.tensors.iter().map(|t| t.name.clone()).collect();
    Plan { tensors, steps: ck.steps, tasks: ck.next_task }
}

/// The identifiers of a token stream that could name a tensor: not a field or method name
/// (after `.` or `::`), not the receiver of `.shape()`.
fn tensor_mentions(ts: proc_macro2::TokenStream, out: &mut Vec<proc_macro2::Ident>) {
    use proc_macro2::TokenTree;
    let tts: Vec<TokenTree> = ts.into_iter().collect();
    for (k, tt) in tts.iter().enumerate() {
        match tt {
            TokenTree::Ident(i) => {
                let after_dot = k > 0
                    && matches!(&tts[k - 1], TokenTree::Punct(p) if p.as_char() == '.' || p.as_char() == ':');
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
                            ident: ident.clone(),
                            elem: elem.clone(),
                            dims: dims.clone(),
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
                    self.scopes.last_mut().expect("a scope").push((ident.unraw().to_string(), None));
                }
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
            let Some(id) = t else { continue };
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
        let Some(ident) = single_ident(inner) else {
            self.no_hidden_tensors(e);
            return None;
        };
        let name = ident.unraw().to_string();
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

    /// Refuses live tensors named inside an expression the graph cannot follow (a field or
    /// method name that happens to equal a tensor's name is not the tensor; `t.shape()` only
    /// reads metadata and is allowed).
    fn no_hidden_tensors(&mut self, e: &syn::Expr) {
        let mut found = Vec::new();
        tensor_mentions(e.to_token_stream(), &mut found);
        for i in found {
            if let Some(Some(id)) = self.lookup(&i.unraw().to_string()) {
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

    /// A live tensor whose name is close to `name`.
    fn similar(&self, name: &str) -> Option<String> {
        let live = self.scopes.iter().flat_map(|s| s.iter()).filter_map(|(n, t)| t.map(|_| n.clone()));
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
        let mut members = Vec::new();
        for (m, line) in lines.iter().enumerate() {
            let mut args = Vec::new();
            let mut member_uses = Vec::new();
            for (pos, a) in line.args.iter().enumerate() {
                match self.classify(a) {
                    Some((id, u, span)) => {
                        uses.push((id, u, span, pos, m));
                        member_uses.push((pos, id));
                        let ident = tensor_ident(a).expect("a tensor argument is a name");
                        args.push(match u {
                            Use::Read => Arg::Read(ident, a.span()),
                            Use::Write => Arg::Write(ident, a.span()),
                        });
                    }
                    None => args.push(Arg::Other(a.clone())),
                }
            }
            members.push(Member { line: line.clone(), args, uses: member_uses });
        }
        let callee_name = model::squash(lines[0].callee.to_token_stream());
        self.check_uses(&uses, group, &callee_name);

        // Signature-dependent checks.
        let mut asserts = Vec::new();
        for &(id, u, span, pos, m) in &uses {
            if u != Use::Write {
                continue;
            }
            let t = &self.tensors[id];
            let name = &t.name;
            let callee = lines[m].callee.clone();
            if !t.written {
                asserts.push(Assert {
                    span,
                    callee,
                    pos,
                    forbid: Mode::InOut,
                    message: format!(
                        "`{name}` has not been written yet, but argument {} of `{callee_name}` is an `InOut` parameter, which reads it [S0111]. help: pass `{name}` to an `Out` parameter first",
                        pos + 1
                    ),
                });
            } else if t.readers.is_empty() && t.writer.is_some() {
                let when = t.written_at.map(|s| format!(" at {}", at(s))).unwrap_or_default();
                asserts.push(Assert {
                    span,
                    callee,
                    pos,
                    forbid: Mode::Out,
                    message: format!(
                        "`{name}` holds a value nothing has read (written{when}), and argument {} of `{callee_name}` is an `Out` parameter that would overwrite it before anything read it, so that value is lost [S0112]. help: read `{name}` first, or write into a fresh intermediate",
                        pos + 1
                    ),
                });
            }
        }

        // State updates. (A task that reads and writes one tensor is an error above.)
        for &(id, u, span, _, _) in &uses {
            let t = &mut self.tensors[id];
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
        self.steps.push(Step::Task(Task { index, members, asserts }));
    }

    /// Checks within one task: writes to `In` inputs, aliasing, reads of empty tensors.
    fn check_uses(&mut self, uses: &[(usize, Use, Span, usize, usize)], group: bool, callee_name: &str) {
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
                let msg = match t.origin {
                    Origin::Param(_) => format!(
                        "`{name}` is read here but no call has written it yet: it is an `Out` of this graph [S0101]\nhelp: write it first, or declare it `InOut` if the caller provides its contents"
                    ),
                    Origin::Alloc => format!(
                        "`{name}` is read here but no call has written it yet [S0101]\nhelp: `{name}` was allocated at {} and holds no data: if this call writes it, pass `&mut {name}`; otherwise write it through an `Out` parameter first",
                        at(t.decl)
                    ),
                };
                self.tensors[id].errored = true;
                self.cx.error(span, msg);
            }
        }
    }
}

/// The identifier naming the tensor in a tensor argument (`t`, `&t`, `&mut (t)`).
fn tensor_ident(e: &syn::Expr) -> Option<syn::Ident> {
    let e = unwrap(e);
    let inner = match e {
        syn::Expr::Reference(r) => unwrap(&r.expr),
        other => other,
    };
    single_ident(inner).cloned()
}
