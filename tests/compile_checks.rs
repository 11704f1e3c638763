//! Compile-time promises of `#[callable]` and `task_graph!`: every check the macros and the
//! typed API make has a case under `ui/fail` (its error message pinned in the `.stderr` next to
//! it), and the shapes that must keep compiling (scopes, groups, write-after-read, hygiene, a
//! renamed crate) are under `ui/pass`.
//!
//! Regenerate the messages after a deliberate change with
//! `TRYBUILD=overwrite cargo test -p simpler-tests --test compile_checks`, then read the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/fail/*.rs");
    t.pass("ui/pass/*.rs");
}
