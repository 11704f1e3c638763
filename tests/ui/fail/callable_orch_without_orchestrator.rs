// An orchestration callable must take the orchestrator first.
use simpler::{dsl::In, dsl::Out, callable};

#[callable(orch)]
fn plan(x: In<f32>, y: Out<f32>) -> simpler::Result<()> {
    let _ = (x, y);
    Ok(())
}

fn main() {}
