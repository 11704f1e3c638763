// `entry` must name an OpenCL C function.
use simpler::{callable, dsl::In, dsl::Out};

#[callable(chip, opencl = "kernels/copy.cl", entry = "copy kernel")]
fn copy(x: In<f32>, mut y: Out<f32>) {
    y.copy_from_slice(&x);
}

fn main() {}
