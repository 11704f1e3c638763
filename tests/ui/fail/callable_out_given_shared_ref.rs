// An `Out` parameter given `&t`: a shared borrow does not grant write access.
use simpler::{dsl::In, dsl::Out, dsl::TensorOf, callable};

#[callable(sub)]
fn copy(x: In<f32>, mut y: Out<f32>) {
    y.copy_from_slice(&x);
}

fn demo(x: TensorOf<f32>, y: TensorOf<f32>) -> simpler::Result<()> {
    copy::call(&x, &y)?;
    Ok(())
}

fn main() {}
