//! Keeps `ARCHITECTURE.md` true: a module may name only modules of lower layers (and itself),
//! and the map's layer table shows the layers of [`LAYERS`]. Beside it, `rules` checks the
//! numbered rules (every one cited is defined, and the map's rule table agrees with the module
//! docs) and `map` the map's paths and module list.
//!
//! ```text
//! error  <-  sys  <-  data, level  <-  callable  <-  dfx  <-  engine  <-  ipc, chip, net  <-  worker  <-  dsl  <-  lib.rs
//! ```
//!
//! The test reads every source file under `src/` and checks each `crate::module` path outside
//! comments against the table below. `ipc`, `chip` and `net` share a layer and may not name
//! each other. Paths through the crate root's re-exports (`crate::Worker`) are refused everywhere
//! but at the top, since they hide which layer an item comes from. `super::` stays inside one
//! module.

use std::path::{Path, PathBuf};

mod map;
mod rules;

/// Each top-level module (a file or folder under `src/`) and its layer.
const LAYERS: &[(&str, u32)] = &[
    ("error", 0),
    ("test_support", 0),
    ("sys", 1),
    ("data", 2),
    ("level", 2),
    ("callable", 3),
    ("dfx", 4),
    ("engine", 5),
    ("ipc", 6),
    ("chip", 6),
    ("net", 6),
    ("worker", 7),
    ("dsl", 8),
    // The top: the crate root and what only it (or the benches) uses.
    ("lib", 9),
    ("book", 9),
    ("bench_support", 9),
    ("fuzz", 9),
    ("layering", 9),
];

fn layer(module: &str) -> Option<u32> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|&(_, l)| l)
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The `crate::name` paths of one line of code (comments and string contents excluded).
fn crate_paths(line: &str) -> Vec<String> {
    let code = line.trim_start();
    if code.starts_with("//") {
        return Vec::new();
    }
    let code = code.split(" //").next().unwrap_or(code);
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        // `$crate::` and `my_crate::` are not this crate's root.
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        out.push(name);
    }
    out
}

/// Every violation in the tree, as `file:line: message`.
fn violations(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    sources(src, &mut files);
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let rel = file.strip_prefix(src).expect("under src/");
        let module = rel.components().next().expect("a component").as_os_str().to_string_lossy();
        let module = module.trim_end_matches(".rs").to_string();
        let Some(own) = layer(&module) else {
            found.push(format!("{}: module `{module}` has no layer in LAYERS", rel.display()));
            continue;
        };
        let text = std::fs::read_to_string(&file).expect("read source");
        for (n, line) in text.lines().enumerate() {
            for name in crate_paths(line) {
                let at = format!("{}:{}", rel.display(), n + 1);
                match layer(&name) {
                    _ if name == module => {}
                    Some(l) if l < own => {}
                    Some(l) if l == own => {
                        found.push(format!("{at}: `{module}` names `{name}`, a sibling of its layer"))
                    }
                    Some(_) => found.push(format!("{at}: `{module}` names `{name}`, a layer above it")),
                    None if own == 9 => {}
                    None => found.push(format!(
                        "{at}: `{module}` names `crate::{name}` through the crate root; name its module"
                    )),
                }
            }
        }
    }
    found
}

#[test]
fn modules_name_only_layers_below_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = violations(&src);
    assert!(found.is_empty(), "layering violations:\n{}", found.join("\n"));
}

/// The (module, layer) pairs of the layer table in `ARCHITECTURE.md` (the table whose header
/// starts `| layer |`), each with its line.
fn map_layers(arch: &str) -> Vec<(usize, String, u32)> {
    let mut out = Vec::new();
    let mut inside = false;
    for (n, line) in arch.lines().enumerate() {
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').map(str::trim).collect();
        if !line.trim_start().starts_with('|') {
            inside = false;
        } else if cells.first() == Some(&"layer") {
            inside = true;
        } else if inside && let (Ok(layer), Some(modules)) = (cells[0].parse::<u32>(), cells.get(1)) {
            for m in modules.split(',') {
                out.push((n + 1, m.trim().trim_matches('`').to_string(), layer));
            }
        }
    }
    out
}

#[test]
fn the_map_shows_the_layers_of_the_table_here() {
    let arch = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../ARCHITECTURE.md"))
        .expect("read ARCHITECTURE.md");
    let shown = map_layers(&arch);
    let mut found = Vec::new();
    for &(module, l) in LAYERS {
        match shown.iter().find(|(_, m, _)| m == module) {
            None => found
                .push(format!("../ARCHITECTURE.md: the layer table has no module `{module}` (layer {l})")),
            Some((line, _, s)) if *s != l => found.push(format!(
                "../ARCHITECTURE.md:{line}: `{module}` is in layer {s}; LAYERS puts it in {l}"
            )),
            Some(_) => {}
        }
    }
    for (line, m, _) in &shown {
        if layer(m).is_none() {
            found.push(format!("../ARCHITECTURE.md:{line}: `{m}` is in the layer table but not in LAYERS"));
        }
    }
    assert!(
        found.is_empty(),
        "the layer table of ARCHITECTURE.md disagrees with LAYERS:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checker_sees_an_upward_path() {
    assert_eq!(crate_paths("use crate::worker::Worker;"), ["worker"]);
    assert_eq!(crate_paths("    let x = crate::sys::sync::lock(&m); // crate::dsl"), ["sys"]);
    assert!(crate_paths("/// see [`x`](crate::worker::Worker)").is_empty());
    assert!(crate_paths("$crate::foo and other_crate::bar").is_empty());
    let dir = std::env::temp_dir().join(format!("simpler-layering-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("data/x.rs"), "use crate::engine::Engine;\nuse crate::Worker;\n").unwrap();
    let found = violations(&dir);
    let _ = LAYERS;
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].contains("a layer above it"), "{found:?}");
    assert!(found[1].contains("through the crate root"), "{found:?}");
}
