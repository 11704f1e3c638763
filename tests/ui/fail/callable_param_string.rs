// A parameter type a task cannot carry: a path type that is not a scalar.
use simpler::{dsl::Out, callable};

#[callable(sub)]
fn label(name: String, mut y: Out<u8>) {
    y.copy_from_slice(name.as_bytes());
}

fn main() {}
