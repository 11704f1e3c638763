//! Keeps the numbered rules honest: every rule a comment, a `SAFETY` comment or a lint reason
//! cites is one a module doc defines, and the rule table of `ARCHITECTURE.md` lists each family
//! with exactly the range its module defines.
//!
//! **Definitions** are read from module docs (`//!` lines) only, in the two forms the modules
//! use: `* **M3 (claims).** ...` and `P3. ...` at the start of a doc line. A family is one
//! prefix (`M`, `FA`, ...) numbered 1, 2, ... without a gap, defined in exactly one file. The
//! engine's two protocols are numbered without a prefix (`1. ...` right after a doc line that
//! ends in "rules:"): the slot state machine (`engine/slot.rs`) and the scheduler role
//! (`engine/mod.rs`).
//!
//! **Citations** are read from comments (`//`, `///`, `//!`, consecutive lines joined, so a
//! list may wrap) and from `reason = "..."` strings, and from all of `ARCHITECTURE.md`:
//!
//! * after the word `rule` or `rules`, a list of rules (`M3`, `M2-M4`, `D1–D3`, `F*`, and for
//!   the unprefixed families `5`, `1-4`), joined by `,` and `and`; any prefix there must be
//!   defined;
//! * anywhere else, a standalone token `X<n>` whose prefix `X` a module defines (`(M4)`,
//!   `(task frame, M10)`, `rules M2, M3`). `L<n>` alone names a level of the hierarchy (L2,
//!   L3, ...), so the lease rules count only after `rule`.
//!
//! A cited rule must exist, a range must run upwards within one family, and a range in a lint
//! reason of the file that defines the family (the module's own `#![expect(unsafe_code, ...)]`)
//! must be the whole family, as must each range of the `ARCHITECTURE.md` table.

use std::collections::BTreeMap;
use std::path::Path;

/// One family of numbered rules: its prefix (empty for the engine's unprefixed ones), the file
/// (under `src/`) whose module doc defines it, and how many rules it has.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Family {
    prefix: String,
    file: String,
    count: u32,
}

impl Family {
    fn range(&self) -> String {
        format!("{p}1-{p}{n}", p = self.prefix, n = self.count)
    }
}

/// A rule reference as written: a prefix and a number, or a prefix and `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ref {
    One(String, u32),
    Range(String, u32, String, u32),
    All(String),
}

/// Splits `X12` into (`X`, 12): one or two capital letters and one or two digits.
fn split_ref(token: &str) -> Option<(String, u32)> {
    let letters: String = token.chars().take_while(|c| c.is_ascii_uppercase()).collect();
    let digits = &token[letters.len()..];
    let prefix_ok = (1..=2).contains(&letters.len());
    let digits_ok = (1..=2).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit());
    (prefix_ok && digits_ok).then(|| (letters, digits.parse().expect("digits")))
}

/// The numbered rule families the module docs under `src` define, or what is wrong with them.
fn definitions(files: &[(String, String)]) -> (Vec<Family>, Vec<String>) {
    let mut found: BTreeMap<(String, String), (usize, Vec<u32>)> = BTreeMap::new();
    let mut problems = Vec::new();
    for (rel, text) in files {
        let mut unprefixed_list = false;
        for (n, line) in text.lines().enumerate() {
            let Some(doc) = line.trim_start().strip_prefix("//!") else {
                unprefixed_list = false;
                continue;
            };
            let doc = doc.strip_prefix(' ').unwrap_or(doc);
            let defined = if let Some(rest) = doc.strip_prefix("* **") {
                let token: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
                let after = &rest[token.len()..];
                split_ref(&token).filter(|_| after.starts_with(" (") || after.starts_with(".**"))
            } else if let Some((token, _)) = doc.split_once(". ") {
                if unprefixed_list && !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()) {
                    token.parse().ok().map(|k| (String::new(), k))
                } else {
                    split_ref(token)
                }
            } else {
                None
            };
            if doc.to_ascii_lowercase().trim_end().ends_with("rules:") {
                unprefixed_list = true;
            } else if !(doc.trim().is_empty() || doc.starts_with(' ') || defined.is_some()) {
                unprefixed_list = false;
            }
            if let Some((prefix, k)) = defined {
                found.entry((prefix, rel.clone())).or_insert_with(|| (n + 1, Vec::new())).1.push(k);
            }
        }
    }
    let mut families: Vec<Family> = Vec::new();
    for ((prefix, file), (line, numbers)) in found {
        let expected: Vec<u32> = (1..=numbers.len() as u32).collect();
        if numbers != expected {
            problems.push(format!(
                "{file}:{line}: rules {prefix}* are defined as {numbers:?}; they must be numbered 1, 2, ... in order"
            ));
        }
        if !prefix.is_empty()
            && let Some(other) = families.iter().find(|f| f.prefix == prefix)
        {
            problems.push(format!(
                "{file}:{line}: rules {prefix}* are defined here and in {}; a prefix belongs to one module",
                other.file
            ));
            continue;
        }
        families.push(Family { prefix, file, count: numbers.len() as u32 });
    }
    (families, problems)
}

/// Text to scan, each piece with the line it starts on and whether it is a lint reason:
/// comments (consecutive comment lines joined, one line each, without their markers) and
/// `reason = "..."` strings. With `all`, the whole text is one piece (a Markdown file).
fn texts(source: &str, all: bool) -> Vec<(usize, String, bool)> {
    if all {
        return vec![(1, source.to_string(), false)];
    }
    let mut out: Vec<(usize, String, bool)> = Vec::new();
    let mut joined: Option<(usize, String)> = None;
    for (n, line) in source.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("//") {
            let text = rest.trim_start_matches(['/', '!']);
            match &mut joined {
                Some((_, piece)) => {
                    piece.push('\n');
                    piece.push_str(text);
                }
                None => joined = Some((n + 1, text.to_string())),
            }
        } else {
            out.extend(joined.take().map(|(l, t)| (l, t, false)));
            if let Some((_, comment)) = line.split_once(" // ") {
                out.push((n + 1, comment.to_string(), false));
            }
        }
        if let Some(at) = trimmed.find("reason = \"") {
            let reason = &trimmed[at + "reason = \"".len()..];
            let reason = reason.split('"').next().unwrap_or(reason);
            out.push((n + 1, reason.to_string(), true));
        }
    }
    out.extend(joined.map(|(l, t)| (l, t, false)));
    out
}

/// Whether `word` is a number of one or two digits.
fn small_number(word: &str) -> Option<u32> {
    (!word.is_empty() && word.len() <= 2 && word.bytes().all(|b| b.is_ascii_digit()))
        .then(|| word.parse().expect("digits"))
}

/// The rule references of one piece of text, each with the number of line breaks before it in
/// the piece. `prefixes` are the defined ones, which count outside a `rule` list too.
fn citations(text: &str, prefixes: &[&str]) -> Vec<(usize, Ref)> {
    let chars: Vec<char> = text.chars().collect();
    let word_at = |i: usize| -> (String, usize) {
        let end = (i..chars.len())
            .find(|&j| !(chars[j].is_alphanumeric() || chars[j] == '_'))
            .unwrap_or(chars.len());
        (chars[i..end].iter().collect(), end)
    };
    let joined_before = |i: usize| {
        i > 0 && (chars[i - 1].is_alphanumeric() || matches!(chars[i - 1], '_' | ':' | '.' | '/' | '$'))
    };
    let joined_after =
        |j: usize| j < chars.len() && (chars[j].is_alphanumeric() || matches!(chars[j], '_' | '(' | '/'));
    let skip_space = |mut j: usize| {
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        j
    };
    // A reference at `i`: `X3`, `X3-X5` (or `X3–X5`), `X*`, and with `numbers` `3` and `3-5`;
    // with the index just past it.
    let reference = |i: usize, numbers: bool| -> Option<(Ref, usize)> {
        if joined_before(i) {
            return None;
        }
        let (word, end) = word_at(i);
        let all_caps = word.chars().all(|c| c.is_ascii_uppercase());
        if all_caps && (1..=2).contains(&word.len()) && chars.get(end) == Some(&'*') && !joined_after(end + 1)
        {
            return Some((Ref::All(word), end + 1));
        }
        let one = split_ref(&word)
            .or_else(|| small_number(&word).filter(|_| numbers).map(|k| (String::new(), k)))?;
        if matches!(chars.get(end), Some('-' | '–')) {
            let (second, end2) = word_at(end + 1);
            let two = split_ref(&second)
                .or_else(|| small_number(&second).filter(|_| one.0.is_empty()).map(|k| (String::new(), k)));
            if let Some(two) = two
                && !joined_after(end2)
            {
                return Some((Ref::Range(one.0, one.1, two.0, two.1), end2));
            }
        }
        (!joined_after(end)).then_some((Ref::One(one.0, one.1), end))
    };
    let line_of = |i: usize| chars[..i].iter().filter(|&&c| c == '\n').count();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if !chars[i].is_alphanumeric() || joined_before(i) {
            i += 1;
            continue;
        }
        let (word, end) = word_at(i);
        if word.eq_ignore_ascii_case("rule") || word.eq_ignore_ascii_case("rules") {
            // The list after the word: references joined by `,` and `and`.
            let mut at = end;
            while at < chars.len() && chars[at].is_whitespace() {
                let start = skip_space(at);
                let Some((r, stop)) = reference(start, true) else { break };
                out.push((line_of(start), r));
                at = stop;
                let comma = chars.get(at) == Some(&',');
                let next = skip_space(at + usize::from(comma));
                let (and, after_and) = word_at(next);
                if and == "and" {
                    at = after_and;
                } else if comma {
                    at += 1;
                } else {
                    break;
                }
            }
            i = at.max(end);
            continue;
        }
        if let Some((r, stop)) = reference(i, false) {
            let (Ref::One(p, _) | Ref::Range(p, ..) | Ref::All(p)) = &r;
            if p != "L" && prefixes.contains(&p.as_str()) {
                out.push((line_of(i), r));
            }
            i = stop;
            continue;
        }
        i = end;
    }
    out
}

/// What is wrong with one reference, cited in `file` (a lint reason when `reason`).
fn check(r: &Ref, families: &[Family], file: &str, reason: bool) -> Option<String> {
    let family = |p: &str| families.iter().find(|f| f.prefix == p);
    let unprefixed: Vec<&Family> = families.iter().filter(|f| f.prefix.is_empty()).collect();
    match r {
        Ref::All(p) => family(p)
            .is_none()
            .then(|| format!("rules {p}* cited, but no module doc defines rules {p}1, {p}2, ...")),
        Ref::One(p, k) if p.is_empty() => (!unprefixed.iter().any(|f| *k <= f.count)).then(|| {
            format!("rule {k} cited, but the unprefixed families ({}) have no rule {k}", names(&unprefixed))
        }),
        Ref::One(p, k) => match family(p) {
            None => Some(format!("rule {p}{k} cited, but no module doc defines rules {p}*")),
            Some(f) if *k == 0 || *k > f.count => {
                Some(format!("rule {p}{k} cited, but {} defines {}", f.file, f.range()))
            }
            Some(_) => None,
        },
        Ref::Range(p, lo, q, hi) => {
            let text = format!("{p}{lo}-{q}{hi}");
            if p != q || lo >= hi {
                return Some(format!("rules {text}: a range runs upwards within one family"));
            }
            if p.is_empty() {
                return (!unprefixed.iter().any(|f| *hi <= f.count && *lo >= 1)).then(|| {
                    format!(
                        "rules {text} cited, but no unprefixed family ({}) has them all",
                        names(&unprefixed)
                    )
                });
            }
            match family(p) {
                None => Some(format!("rules {text} cited, but no module doc defines rules {p}*")),
                Some(f) if *lo == 0 || *hi > f.count => {
                    Some(format!("rules {text} cited, but {} defines {}", f.file, f.range()))
                }
                Some(f) if reason && f.file == file && (*lo != 1 || *hi != f.count) => Some(format!(
                    "rules {text} in a lint reason of the module that defines them: name the whole family, {}",
                    f.range()
                )),
                Some(_) => None,
            }
        }
    }
}

fn names(families: &[&Family]) -> String {
    families.iter().map(|f| format!("{} in {}", f.range(), f.file)).collect::<Vec<_>>().join(", ")
}

/// The rows of the rule table in `ARCHITECTURE.md` (the table whose header starts
/// `| prefix |`): (line, prefix, module, range).
fn table_rows(arch: &str) -> Vec<(usize, String, String, String)> {
    let mut rows = Vec::new();
    let mut inside = false;
    for (n, line) in arch.lines().enumerate() {
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').map(str::trim).collect();
        if !line.trim_start().starts_with('|') {
            inside = false;
        } else if cells.first() == Some(&"prefix") {
            inside = true;
        } else if inside && !cells[0].starts_with("---") && cells.len() >= 3 {
            let clean = |s: &str| s.trim_matches('`').to_string();
            let prefix = if cells[0] == "—" || cells[0] == "-" { String::new() } else { clean(cells[0]) };
            rows.push((n + 1, prefix, clean(cells[1]), clean(cells[2])));
        }
    }
    rows
}

/// Every problem with the rules under `src` and the table of `arch` (the text of
/// `ARCHITECTURE.md`), as `file:line: message`.
pub(super) fn problems(src: &Path, arch: &str) -> Vec<String> {
    let mut paths = Vec::new();
    super::sources(src, &mut paths);
    paths.sort();
    let files: Vec<(String, String)> = paths
        .iter()
        .map(|p| {
            let rel = p.strip_prefix(src).expect("under src/").display().to_string();
            (rel, std::fs::read_to_string(p).expect("read source"))
        })
        .collect();
    let (families, mut found) = definitions(&files);
    let prefixes: Vec<&str> = families.iter().map(|f| f.prefix.as_str()).filter(|p| !p.is_empty()).collect();
    let sources = files.iter().map(|(rel, text)| (rel.as_str(), text.as_str(), false));
    for (rel, text, all) in sources.chain([("../ARCHITECTURE.md", arch, true)]) {
        for (line, piece, reason) in texts(text, all) {
            for (offset, r) in citations(&piece, &prefixes) {
                if let Some(problem) = check(&r, &families, rel, reason) {
                    found.push(format!("{rel}:{}: {problem}", line + offset));
                }
            }
        }
    }
    found.extend(table_problems(&families, arch));
    found
}

/// What is wrong with the rule table of `arch` (the text of `ARCHITECTURE.md`): each family
/// must have one row with its prefix (`—` for none), module and whole range, and no other row.
fn table_problems(families: &[Family], arch: &str) -> Vec<String> {
    let mut found = Vec::new();
    let rows = table_rows(arch);
    if rows.is_empty() {
        found
            .push("../ARCHITECTURE.md: no rule table (a table whose header starts `| prefix |`)".to_string());
    }
    for f in families {
        let name = if f.prefix.is_empty() { "—".to_string() } else { f.prefix.clone() };
        match rows.iter().find(|(_, p, m, _)| *p == f.prefix && (!p.is_empty() || *m == f.file)) {
            None => found.push(format!(
                "../ARCHITECTURE.md: the rule table has no row `| {name} | {} | {} |`",
                f.file,
                f.range()
            )),
            Some((line, _, module, range)) => {
                if *module != f.file || *range != f.range() {
                    found.push(format!(
                        "../ARCHITECTURE.md:{line}: row `{name}` says {range} in {module}; the module doc of {} defines {}",
                        f.file,
                        f.range()
                    ));
                }
            }
        }
    }
    for (line, prefix, module, _) in &rows {
        if !families.iter().any(|f| f.prefix == *prefix && (!prefix.is_empty() || f.file == *module)) {
            found.push(format!(
                "../ARCHITECTURE.md:{line}: row `{prefix}` ({module}) names rules no module doc defines"
            ));
        }
    }
    found
}

#[test]
fn cited_rules_are_defined_and_the_table_agrees() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let arch = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../ARCHITECTURE.md"))
        .expect("read ARCHITECTURE.md");
    let found = problems(&src, &arch);
    assert!(found.is_empty(), "rule problems (paths under simpler/src/):\n{}", found.join("\n"));
}

#[test]
fn the_matcher_reads_citations_and_nothing_else() {
    let prefixes = ["M", "FA", "P", "D"];
    let refs = |text: &str| citations(text, &prefixes).into_iter().map(|(_, r)| r).collect::<Vec<_>>();
    let one = |p: &str, k| Ref::One(p.to_string(), k);
    assert_eq!(refs("SAFETY: rule M3 — the claim"), [one("M", 3)]);
    assert_eq!(refs("(rules M2, M4 and M11)"), [one("M", 2), one("M", 4), one("M", 11)]);
    assert_eq!(
        refs("rules M2-M4, M10; rules D1–D3"),
        [Ref::Range("M".into(), 2, "M".into(), 4), one("M", 10), Ref::Range("D".into(), 1, "D".into(), 3)]
    );
    assert_eq!(refs("the task words (M12) and\nthe frame (hand-over, M4)."), [one("M", 12), one("M", 4)]);
    assert_eq!(
        refs("rules F*, D* and rule\nFA2"),
        [Ref::All("F".into()), Ref::All("D".into()), one("FA", 2)]
    );
    assert_eq!(
        refs("rules 1, 3 and 4 of `slot`; rules 1-5"),
        [one("", 1), one("", 3), one("", 4), Ref::Range(String::new(), 1, String::new(), 5)]
    );
    // Not rules: identifiers, hex, levels, unknown prefixes outside a `rule` list, numbers elsewhere.
    assert!(
        refs("M1_FLAG, xM3, 0xM3, sha256:BA78, P2P, M3(x), a/M3, step 4, S0113, (L3), L2 chip, (Q7)")
            .is_empty()
    );
    // A lease rule needs the word: `L5` alone is a level.
    assert_eq!(refs("rule L5 of `engine::lease`; an L5 Worker"), [one("L", 5)]);
    let families = vec![
        Family { prefix: "M".into(), file: "ipc/mailbox/mod.rs".into(), count: 12 },
        Family { prefix: String::new(), file: "engine/slot.rs".into(), count: 4 },
    ];
    assert!(check(&one("M", 13), &families, "x.rs", false).unwrap().contains("defines M1-M12"));
    assert!(
        check(&one("Q", 1), &families, "x.rs", false).unwrap().contains("no module doc defines rules Q*")
    );
    assert!(check(&one("", 5), &families, "x.rs", false).is_some());
    let part = Ref::Range("M".into(), 1, "M".into(), 9);
    assert!(check(&part, &families, "ipc/mailbox/layout.rs", true).is_none());
    assert!(
        check(&part, &families, "ipc/mailbox/mod.rs", true).unwrap().contains("the whole family, M1-M12")
    );
    let table = "| prefix | module | rules | about |\n| --- | --- | --- | --- |\n| `M` | `ipc/mailbox/mod.rs` | M1-M9 | x |\n| — | `engine/slot.rs` | 1-4 | y |\n";
    let rows = table_rows(table);
    assert_eq!(rows[0], (3, "M".to_string(), "ipc/mailbox/mod.rs".to_string(), "M1-M9".to_string()));
    assert_eq!(rows[1].1, "");
    let found = table_problems(&families, table);
    assert_eq!(
        found,
        [
            "../ARCHITECTURE.md:3: row `M` says M1-M9 in ipc/mailbox/mod.rs; the module doc of ipc/mailbox/mod.rs defines M1-M12"
        ]
    );
}
