// S0006: a callable cannot be generic.
use simpler::{In, Out, callable};

#[callable(sub)]
fn copy<T: simpler::Element>(x: In<T>, mut y: Out<T>) {
    y.copy_from_slice(&x);
}

fn main() {}
