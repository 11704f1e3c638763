// An option `#[callable]` does not have.
use simpler::{dsl::In, dsl::Out, callable};

#[callable(sub, fast)]
fn copy(x: In<f32>, mut y: Out<f32>) {
    y.copy_from_slice(&x);
}

fn main() {}
