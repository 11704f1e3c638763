// `opencl` takes a string literal (a path), not an expression.
use simpler::{callable, dsl::In, dsl::Out};

const PATH: &str = "kernels/copy.cl";

#[callable(chip, opencl = PATH)]
fn copy(x: In<f32>, mut y: Out<f32>) {
    y.copy_from_slice(&x);
}

fn main() {}
