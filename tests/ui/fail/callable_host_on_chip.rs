// A host function placed on a chip.
use simpler::{dsl::In, Orchestrator, dsl::Out, dsl::TensorOf, callable, dsl::chip};

#[callable(sub)]
fn copy(x: In<f32>, mut y: Out<f32>) {
    y.copy_from_slice(&x);
}

fn demo(o: &mut Orchestrator<'_>, x: TensorOf<f32>, mut y: TensorOf<f32>) -> simpler::Result<()> {
    copy::call(&x, &mut y)?.on(o, chip(0))?;
    Ok(())
}

fn main() {}
