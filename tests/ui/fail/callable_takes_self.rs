// S0006: a callable cannot take `self`.
use simpler::{dsl::In, dsl::Out, callable};

struct Kernels;

impl Kernels {
    #[callable(sub)]
    fn copy(&self, x: In<f32>, mut y: Out<f32>) {
        y.copy_from_slice(&x);
    }
}

fn main() {}
