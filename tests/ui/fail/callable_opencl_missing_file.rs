// The OpenCL source file does not exist (paths are relative to the crate's Cargo.toml).
use simpler::{callable, dsl::In, dsl::Out};

#[callable(chip, opencl = "kernels/no_such_file.cl")]
fn copy(x: In<f32>, mut y: Out<f32>) {
    y.copy_from_slice(&x);
}

fn main() {}
