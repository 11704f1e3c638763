// S0005: the orchestrator must be the first parameter.
use simpler::{dsl::In, Orchestrator, callable};

#[callable(orch)]
fn plan(x: In<f32>, o: &mut Orchestrator<'_>) -> simpler::Result<()> {
    let _ = (x, o);
    Ok(())
}

fn main() {}
