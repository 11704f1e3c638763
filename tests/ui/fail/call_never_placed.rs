// A `Call` that is built and never placed or run does nothing: the compiler says so.
#![deny(unused_must_use)]
use simpler::{dsl::In, Orchestrator, dsl::Out, dsl::TensorOf, callable};

#[callable(sub)]
fn copy(x: In<f32>, mut y: Out<f32>) {
    y.copy_from_slice(&x);
}

fn build(_orch: &mut Orchestrator<'_>, x: &TensorOf<f32>, mut y: TensorOf<f32>) -> simpler::Result<()> {
    copy::call(x, &mut y)?;
    Ok(())
}

fn main() {
    let _ = build;
}
