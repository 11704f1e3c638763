// S0006: an `unsafe fn` cannot be a callable (a worker calls it from safe code).
use simpler::{dsl::InOut, callable};

#[callable(sub)]
unsafe fn danger(mut x: InOut<f32>) {
    x[0] = 1.0;
}

fn main() {}
