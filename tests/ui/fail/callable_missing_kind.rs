// `#[callable]` without a kind.
use simpler::{dsl::In, dsl::Out, callable};

#[callable]
fn copy(x: In<f32>, mut y: Out<f32>) {
    y.copy_from_slice(&x);
}

fn main() {}
