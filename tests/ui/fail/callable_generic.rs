// S0006: a callable cannot be generic.
use simpler::{dsl::In, dsl::Out, callable};

#[callable(sub)]
fn copy<T: simpler::memory::Element>(x: In<T>, mut y: Out<T>) {
    y.copy_from_slice(&x);
}

fn main() {}
