// `opencl` given twice.
use simpler::{callable, dsl::In, dsl::Out};

#[callable(chip, opencl = "kernels/a.cl", opencl = "kernels/b.cl")]
fn copy(x: In<f32>, mut y: Out<f32>) {
    y.copy_from_slice(&x);
}

fn main() {}
