//! A kernel's declared parameters, read from its OpenCL C source text ([`KernelSignature`]), so
//! that a task whose arguments cannot match them is refused when it is submitted, by the process
//! that submits it (which never loads OpenCL), rather than when a chip launches it.
//!
//! The parser is small and tolerant. It removes comments and preprocessor lines, finds the
//! definition `__kernel` (or `kernel`) `... void <entry>(...) {`, splits its parameters at
//! top-level commas and reads each one: a `__global` (or `global`) pointer is a tensor, with its
//! element type when that is a plain OpenCL C type ([`Param::Tensor`]); anything else without
//! `*` is a scalar. It gives up, and there is no signature (so no check at submit; the chip's
//! own check at launch remains), whenever it is unsure: no such definition, two that differ, a
//! parameter that names a macro the source `#define`s, one with no name (a macro, most likely),
//! an array, a pointer that is not `__global`, or a pointer to a pointer.
//!
//! A tensor parameter's element type is checked when the parser knows it: `float` is
//! [`DataType::Float32`], `double` `Float64`, `half` `Float16`, `char` `Int8`, `uchar` `Uint8`, `short` `Int16`,
//! `ushort` `Uint16`, `int` `Int32`, `uint` `Uint32`, `long` `Int64`, `ulong` `Uint64` (and the
//! `unsigned ...` spellings). OpenCL C has no name for `bool`, the 8- and 4-bit floats or
//! `bfloat16`, so a kernel reads those as bytes or 16-bit words: `uchar` also takes
//! `Bool`, `Fp8E4M3Fn`, `Fp8E8M0` and `Fp4E2M1` tensors, `ushort` also `BFloat16`. Any other
//! type (vector types, `void`, typedefs) takes any tensor.

use std::fmt::{self, Write as _};

use crate::data::dtype::DataType;
use crate::error::{Error, Result};

/// What one kernel parameter takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Param {
    /// A `__global` pointer: a tensor, whose element type must be this one when it is known.
    Tensor(Option<DataType>),
    /// Anything else without `*`: a scalar word.
    Scalar,
}

/// The parameters a kernel's OpenCL C source declares, in order, and the check of a task's
/// arguments against them.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct KernelSignature {
    /// The kernel function's name.
    entry: Box<str>,
    /// Each parameter as written (comments removed, blanks collapsed), for messages.
    decls: Box<[Box<str>]>,
    /// What each parameter takes.
    params: Box<[Param]>,
    /// The element types of the tensor parameters, in order (`None`: any).
    tensors: Box<[Option<DataType>]>,
    /// How many scalar parameters there are.
    scalars: usize,
    /// Whether every tensor parameter comes before every scalar one (how a task passes them).
    tensors_first: bool,
}

impl KernelSignature {
    /// The parameters of kernel function `entry` in OpenCL C source `text`; `None` when the
    /// parser cannot tell (see the [module docs](self)).
    pub(crate) fn parse_opencl(text: &str, entry: &str) -> Option<KernelSignature> {
        let (code, macros) = strip(text);
        let tokens = tokenize(&code);
        let mut found: Option<Vec<(String, Param)>> = None;
        let mut i = 0;
        while i + 1 < tokens.len() {
            if tokens[i].text != entry || tokens[i + 1].text != "(" || !declares_kernel(&tokens[..i]) {
                i += 1;
                continue;
            }
            let close = matching(&tokens, i + 1)?;
            // A definition, not a prototype (whose parameters may be left unnamed).
            if tokens.get(close + 1).is_some_and(|t| t.text == "{") {
                let params = params(&code, &tokens[i + 2..close], &macros)?;
                match &found {
                    Some(earlier) if *earlier != params => return None,
                    _ => found = Some(params),
                }
            }
            i = close + 1;
        }
        let found = found?;
        let params: Box<[Param]> = found.iter().map(|(_, p)| *p).collect();
        let tensors: Box<[Option<DataType>]> = params
            .iter()
            .filter_map(|p| match p {
                Param::Tensor(d) => Some(*d),
                Param::Scalar => None,
            })
            .collect();
        let scalars = params.len() - tensors.len();
        let tensors_first = params[..tensors.len()].iter().all(|p| matches!(p, Param::Tensor(_)));
        Some(KernelSignature {
            entry: entry.into(),
            decls: found.into_iter().map(|(d, _)| d.into_boxed_str()).collect(),
            params,
            tensors,
            scalars,
            tensors_first,
        })
    }

    /// What each parameter takes, in order.
    #[cfg(test)]
    pub(crate) fn params(&self) -> &[Param] {
        &self.params
    }

    /// Checks a task's arguments, tensors of element types `dtypes` then `scalars` scalar
    /// words, against the parameters; a mismatch is an [`ErrorKind::InvalidArgument`] error
    /// naming `kernel` (the callable, as its handle prints), what the source declares and what
    /// the task passed. Allocates nothing unless it fails.
    ///
    /// [`ErrorKind::InvalidArgument`]: crate::error::ErrorKind::InvalidArgument
    pub(crate) fn check<I>(&self, kernel: &dyn fmt::Display, dtypes: I, scalars: usize) -> Result<()>
    where
        I: ExactSizeIterator<Item = DataType> + Clone,
    {
        if self.tensors_first
            && dtypes.len() == self.tensors.len()
            && scalars == self.scalars
            && self.tensors.iter().zip(dtypes.clone()).all(|(want, got)| want.is_none_or(|w| takes(w, got)))
        {
            return Ok(());
        }
        Err(Error::invalid(self.mismatch(kernel, dtypes, scalars)))
    }

    /// The message of a failed [`check`](Self::check).
    fn mismatch(
        &self,
        kernel: &dyn fmt::Display,
        dtypes: impl Iterator<Item = DataType>,
        scalars: usize,
    ) -> String {
        let declared = format!("`{}({})`", self.entry, self.decls.join(", "));
        if !self.tensors_first {
            return format!(
                "kernel {kernel}: its OpenCL C source declares {declared}, with a scalar before a __global pointer; a task passes its tensors first, then its scalars, so no task can call it: declare the __global pointers first"
            );
        }
        let given: Vec<DataType> = dtypes.collect();
        if given.len() == self.tensors.len() && scalars == self.scalars {
            let (i, want, got) = self
                .tensors
                .iter()
                .zip(&given)
                .enumerate()
                .find_map(|(i, (w, g))| w.filter(|w| !takes(*w, *g)).map(|w| (i, w, *g)))
                .expect("a check that failed with matching counts has a wrong element type");
            let decl = self.tensor_decl(i);
            return format!(
                "kernel {kernel}: tensor {i} holds {got} elements, but its OpenCL C source declares {declared}, whose tensor {i} (`{decl}`) holds {want}"
            );
        }
        let mut passed = String::new();
        let _ = write!(passed, "{}", count(given.len(), "tensor"));
        list(&mut passed, given.iter().map(|d| d.name()));
        let mut declares = String::new();
        let _ = write!(declares, "{}", count(self.tensors.len(), "tensor"));
        list(&mut declares, self.tensors.iter().map(|d| d.map_or("any", DataType::name)));
        format!(
            "kernel {kernel}: the task passed {passed} and {}, but its OpenCL C source declares {declared}: {declares}, then {}",
            count(scalars, "scalar"),
            count(self.scalars, "scalar")
        )
    }

    /// The declaration of tensor parameter `i`.
    fn tensor_decl(&self, i: usize) -> &str {
        let at = self.params.iter().enumerate().filter(|(_, p)| matches!(p, Param::Tensor(_))).nth(i);
        at.map_or("", |(j, _)| &self.decls[j])
    }
}

/// Whether a parameter that reads elements of type `want` takes a tensor of `got` elements:
/// the same type, or one OpenCL C has no name for, read as bytes (`uchar`) or 16-bit words
/// (`ushort`).
fn takes(want: DataType, got: DataType) -> bool {
    want == got
        || (want == DataType::Uint8
            && matches!(got, DataType::Bool | DataType::Fp8E4M3Fn | DataType::Fp8E8M0 | DataType::Fp4E2M1))
        || (want == DataType::Uint16 && got == DataType::BFloat16)
}

/// `"1 tensor"`, `"2 tensors"`.
fn count(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// Appends ` (a, b)` for a non-empty list.
fn list<'a>(out: &mut String, items: impl Iterator<Item = &'a str>) {
    let mut first = true;
    for item in items {
        out.push_str(if first { " (" } else { ", " });
        out.push_str(item);
        first = false;
    }
    if !first {
        out.push(')');
    }
}

/// `text` without comments (each one a blank) and preprocessor lines (each one a newline), and
/// the names the preprocessor lines `#define`.
fn strip(text: &str) -> (String, Vec<String>) {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut macros = Vec::new();
    let mut i = 0;
    let mut line_start = true;
    while i < b.len() {
        let c = b[i];
        if line_start && c == b'#' {
            // A directive, to the end of its line and its continuations.
            let start = i;
            while i < b.len() && !(b[i] == b'\n' && b[i - 1] != b'\\') {
                i += 1;
            }
            let line = &text[start + 1..i];
            let mut words =
                line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| !w.is_empty());
            if words.next() == Some("define")
                && let Some(name) = words.next()
            {
                macros.push(name.to_string());
            }
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let end = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
            out.push(' ');
            // Keep the line structure, so a `#` after the comment still starts a line.
            out.extend(text[i..end].chars().filter(|&c| c == '\n'));
            i = end;
            continue;
        }
        if c == b'"' || c == b'\'' {
            // A literal, kept whole (a `//` inside it is no comment).
            let start = i;
            i += 1;
            while i < b.len() && b[i] != c && b[i] != b'\n' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            // Past the closing quote; an unclosed literal ends before its line does.
            i = if b.get(i) == Some(&c) { i + 1 } else { i.min(b.len()) };
            out.push_str(&text[start..i]);
            line_start = false;
            continue;
        }
        if c == b'\n' {
            line_start = true;
        } else if !c.is_ascii_whitespace() {
            line_start = false;
        }
        // Copy one whole character (the text is UTF-8).
        let len = text[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&text[i..i + len]);
        i += len;
    }
    (out, macros)
}

/// One token of stripped source: an identifier or number, a literal, or one other character.
#[derive(Clone, Copy, Debug)]
struct Token<'a> {
    text: &'a str,
    /// Byte offset in the stripped source.
    at: usize,
}

fn tokenize(code: &str) -> Vec<Token<'_>> {
    let mut out = Vec::new();
    let mut chars = code.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        if c.is_whitespace() {
            continue;
        }
        let mut end = at + c.len_utf8();
        if c == '"' || c == '\'' {
            // A literal (as `strip` kept it) is one token.
            let mut escaped = false;
            for (j, d) in chars.by_ref() {
                if d == '\n' {
                    break;
                }
                end = j + d.len_utf8();
                if !escaped && d == c {
                    break;
                }
                escaped = !escaped && d == '\\';
            }
        } else if c.is_ascii_alphanumeric() || c == '_' {
            while let Some(&(j, d)) = chars.peek() {
                if !(d.is_ascii_alphanumeric() || d == '_') {
                    break;
                }
                end = j + d.len_utf8();
                chars.next();
            }
        }
        out.push(Token { text: &code[at..end], at });
    }
    out
}

/// Whether the tokens before a function's name, back to the previous declaration, make it a
/// kernel function returning `void`.
fn declares_kernel(before: &[Token<'_>]) -> bool {
    let head = before.iter().rev().take_while(|t| !matches!(t.text, ";" | "{" | "}"));
    let (mut kernel, mut void) = (false, false);
    for t in head {
        kernel |= matches!(t.text, "__kernel" | "kernel");
        void |= t.text == "void";
    }
    kernel && void
}

/// The index of the bracket that closes the one at `open`.
fn matching(tokens: &[Token<'_>], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, t) in tokens.iter().enumerate().skip(open) {
        match t.text {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// The parameters between a kernel's parentheses, each as written and what it takes.
fn params(code: &str, inside: &[Token<'_>], macros: &[String]) -> Option<Vec<(String, Param)>> {
    if inside.is_empty() || (inside.len() == 1 && inside[0].text == "void") {
        return Some(Vec::new());
    }
    let mut parts = Vec::new();
    let (mut start, mut depth) = (0, 0usize);
    for (i, t) in inside.iter().enumerate() {
        match t.text {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => depth = depth.checked_sub(1)?,
            "," if depth == 0 => {
                parts.push(&inside[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inside[start..]);
    parts
        .into_iter()
        .map(|part| {
            let (first, last) = (part.first()?, part.last()?);
            let decl =
                code[first.at..last.at + last.text.len()].split_whitespace().collect::<Vec<_>>().join(" ");
            Some((decl, param(part, macros)?))
        })
        .collect()
}

/// What one parameter takes; `None` when it is not plain enough to tell.
fn param(part: &[Token<'_>], macros: &[String]) -> Option<Param> {
    let mut global = false;
    let mut stars = 0;
    let mut words: Vec<&str> = Vec::new();
    let mut i = 0;
    while i < part.len() {
        let t = part[i].text;
        match t {
            "__attribute__" => {
                i = matching(part, i + 1)? + 1;
                continue;
            }
            "*" => stars += 1,
            "__global" | "global" => global = true,
            "__local" | "local" | "__constant" | "constant" | "__generic" | "generic" => return None,
            "const" | "volatile" | "restrict" | "__restrict" | "__private" | "private" | "__read_only"
            | "read_only" | "__write_only" | "write_only" | "__read_write" | "read_write" => {}
            _ if t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') => {
                if macros.iter().any(|m| m == t) {
                    return None;
                }
                words.push(t);
            }
            // An array, a default, anything else a plain parameter does not have.
            _ => return None,
        }
        i += 1;
    }
    // A type and a name: one word alone is most likely a macro.
    let (_name, ty) = words.split_last()?;
    if ty.is_empty() {
        return None;
    }
    match (stars, global) {
        (0, false) => Some(Param::Scalar),
        (1, true) => Some(Param::Tensor(element(ty))),
        _ => None,
    }
}

/// The element type a plain OpenCL C type names.
fn element(ty: &[&str]) -> Option<DataType> {
    Some(match ty {
        ["float"] => DataType::Float32,
        ["double"] => DataType::Float64,
        ["half"] => DataType::Float16,
        ["char"] | ["signed", "char"] => DataType::Int8,
        ["uchar"] | ["unsigned", "char"] => DataType::Uint8,
        ["short"] | ["signed", "short"] | ["short", "int"] => DataType::Int16,
        ["ushort"] | ["unsigned", "short"] | ["unsigned", "short", "int"] => DataType::Uint16,
        ["int"] | ["signed", "int"] | ["signed"] => DataType::Int32,
        ["uint"] | ["unsigned", "int"] | ["unsigned"] => DataType::Uint32,
        ["long"] | ["signed", "long"] | ["long", "int"] => DataType::Int64,
        ["ulong"] | ["unsigned", "long"] | ["unsigned", "long", "int"] => DataType::Uint64,
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
