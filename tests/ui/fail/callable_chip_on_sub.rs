// A chip callable placed on a SUB worker.
use simpler::{dsl::In, Orchestrator, dsl::Out, dsl::TensorOf, callable, dsl::sub};

#[callable(chip)]
fn copy(x: In<f32>, mut y: Out<f32>) {
    y.copy_from_slice(&x);
}

fn demo(o: &mut Orchestrator<'_>, x: TensorOf<f32>, mut y: TensorOf<f32>) -> simpler::Result<()> {
    copy::call(&x, &mut y)?.on(o, sub())?;
    Ok(())
}

fn main() {}
