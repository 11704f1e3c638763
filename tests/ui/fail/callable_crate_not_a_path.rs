// S0003: `crate` takes a path.
use simpler::{dsl::In, dsl::Out, callable};

#[callable(sub, crate = "simpler")]
fn copy(x: In<f32>, mut y: Out<f32>) {
    y.copy_from_slice(&x);
}

fn main() {}
