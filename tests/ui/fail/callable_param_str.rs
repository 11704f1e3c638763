// A parameter type a task cannot carry: a reference.
use simpler::{dsl::Out, callable};

#[callable(sub)]
fn label(name: &str, mut y: Out<u8>) {
    y.copy_from_slice(name.as_bytes());
}

fn main() {}
