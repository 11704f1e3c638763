//! Placeholder; replaced by the real benchmarks.
fn main() {}
