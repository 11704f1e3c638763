// An `Out` parameter given a `TensorOf<f32, ReadOnly>`, even borrowed mutably.
use simpler::{dsl::In, dsl::Out, dsl::ReadOnly, dsl::TensorOf, callable};

#[callable(sub)]
fn copy(x: In<f32>, mut y: Out<f32>) {
    y.copy_from_slice(&x);
}

fn demo(x: TensorOf<f32>, mut y: TensorOf<f32, ReadOnly>) -> simpler::Result<()> {
    copy::call(&x, &mut y)?;
    Ok(())
}

fn main() {}
