// An `In` parameter given `&mut t`: the call would claim to write what it only reads.
use simpler::{dsl::In, dsl::Out, dsl::TensorOf, callable};

#[callable(sub)]
fn copy(x: In<f32>, mut y: Out<f32>) {
    y.copy_from_slice(&x);
}

fn demo(mut x: TensorOf<f32>, mut y: TensorOf<f32>) -> simpler::Result<()> {
    copy::call(&mut x, &mut y)?;
    Ok(())
}

fn main() {}
