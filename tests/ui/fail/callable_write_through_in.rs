// A kernel body cannot write through an `In<T>` parameter.
use simpler::{dsl::In, dsl::Out, callable};

#[callable(chip)]
fn clobber(x: In<f32>, mut y: Out<f32>) {
    x[0] = 1.0;
    y.copy_from_slice(&x);
}

fn main() {}
