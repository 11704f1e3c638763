// OpenCL source on a host function: only a chip kernel runs on a device.
use simpler::{callable, dsl::In, dsl::Out};

#[callable(sub, opencl = "kernels/copy.cl")]
fn copy(x: In<f32>, mut y: Out<f32>) {
    y.copy_from_slice(&x);
}

fn main() {}
