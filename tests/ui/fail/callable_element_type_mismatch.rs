// An `In<f32>` parameter given a tensor of `i32` elements.
use simpler::{dsl::In, dsl::Out, dsl::TensorOf, callable};

#[callable(sub)]
fn scale(x: In<f32>, mut y: Out<f32>, k: f32) {
    for i in 0..y.len() {
        y[i] = x[i] * k;
    }
}

fn demo(x: TensorOf<i32>, mut y: TensorOf<f32>) -> simpler::Result<()> {
    scale::call(&x, &mut y, 2.0)?;
    Ok(())
}

fn main() {}
