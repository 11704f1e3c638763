// `entry` names a function in OpenCL source, but no source is given.
use simpler::{callable, dsl::In, dsl::Out};

#[callable(chip, entry = "copy")]
fn copy(x: In<f32>, mut y: Out<f32>) {
    y.copy_from_slice(&x);
}

fn main() {}
