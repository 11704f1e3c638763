// S0006: a callable cannot be `async`.
use simpler::{dsl::In, dsl::Out, callable};

#[callable(sub)]
async fn copy(x: In<f32>, mut y: Out<f32>) {
    y.copy_from_slice(&x);
}

fn main() {}
