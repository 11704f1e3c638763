// S0004: a tensor parameter needs its element type.
use simpler::{dsl::In, dsl::Out, callable};

#[callable(sub)]
fn copy(x: In, mut y: Out<f32>) {
    y.copy_from_slice(&x);
}

fn main() {}
