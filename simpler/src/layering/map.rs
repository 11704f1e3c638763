//! Keeps `ARCHITECTURE.md` a true map: every path it names in backticks exists, and every
//! source file of the crate is named in it (a test file, a `tests/` folder and a `loom` model
//! excepted).
//!
//! A file counts as named when its path is (`` `engine/slot.rs` ``), or when one item of the
//! map's lists names its folder (`` `ipc/mailbox/` ``, `` `ipc/mailbox/mod.rs` ``, or
//! `` `chip/runtime.rs` `` for `chip/runtime/`) together with the file's name (`` `layout` ``).

use std::path::Path;

/// The items of `arch`: each Markdown list item with its continuation lines, and every other
/// line alone; with the line each starts on.
fn items(arch: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    for (n, line) in arch.lines().enumerate() {
        let continues = line.starts_with("  ") && !line.trim().is_empty();
        match out.last_mut() {
            Some((_, item)) if continues && item.trim_start().starts_with("* ") => {
                item.push(' ');
                item.push_str(line.trim());
            }
            _ => out.push((n + 1, line.to_string())),
        }
    }
    out
}

/// The backticked words of `text`.
fn ticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Every problem with the map `arch`, as `file:line: message`; `src` is the crate's `src/`,
/// `root` the workspace.
pub(super) fn problems(src: &Path, root: &Path, arch: &str) -> Vec<String> {
    let mut found = Vec::new();
    let items = items(arch);
    for (line, item) in &items {
        for word in ticked(item) {
            let pathlike = (word.ends_with(".rs") || word.ends_with('/'))
                && word.contains(['/', '.'])
                && word.chars().all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c));
            if pathlike && !src.join(word).exists() && !root.join(word).exists() {
                found.push(format!(
                    "../ARCHITECTURE.md:{line}: `{word}` is neither under simpler/src/ nor in the workspace"
                ));
            }
        }
    }
    let mut files = Vec::new();
    super::sources(src, &mut files);
    files.sort();
    for file in files {
        let rel = file.strip_prefix(src).expect("under src/").to_string_lossy().replace('\\', "/");
        let stem = rel.rsplit('/').next().expect("a name").trim_end_matches(".rs");
        let folder = rel.rsplit_once('/').map(|(d, _)| d);
        if stem == "tests" || stem == "loom_models" || rel.contains("/tests/") {
            continue;
        }
        let named = items.iter().any(|(_, item)| {
            let words = ticked(item);
            let has = |w: &str| words.contains(&w);
            has(&rel)
                || folder.is_some_and(|d| {
                    let holds =
                        has(&format!("{d}/")) || has(&format!("{d}/mod.rs")) || has(&format!("{d}.rs"));
                    holds && (stem == "mod" || has(stem) || has(&format!("{stem}.rs")))
                })
        });
        if !named {
            found.push(format!("{rel}: not named in ARCHITECTURE.md's module list (one line per module)"));
        }
    }
    found
}

#[test]
fn the_map_names_every_module_and_only_real_paths() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let arch = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let found = problems(&src, &root, &arch);
    assert!(
        found.is_empty(),
        "ARCHITECTURE.md is out of date (paths under simpler/src/):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_map_checker_sees_a_stale_path_and_a_missing_module() {
    let dir = std::env::temp_dir().join(format!("simpler-map-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("src/ipc/mailbox")).unwrap();
    for f in
        ["ipc/mod.rs", "ipc/mailbox/mod.rs", "ipc/mailbox/layout.rs", "ipc/mailbox/state.rs", "ipc/child.rs"]
    {
        std::fs::write(dir.join("src").join(f), "").unwrap();
    }
    let arch = "* `ipc/mod.rs`: index.\n* `ipc/mailbox/`: rules;\n  `layout`.\n* `ipc/mailbox.rs`: old.\n";
    let found = problems(&dir.join("src"), &dir, arch);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        found,
        [
            "../ARCHITECTURE.md:4: `ipc/mailbox.rs` is neither under simpler/src/ nor in the workspace",
            "ipc/child.rs: not named in ARCHITECTURE.md's module list (one line per module)",
            "ipc/mailbox/state.rs: not named in ARCHITECTURE.md's module list (one line per module)",
        ]
    );
}
