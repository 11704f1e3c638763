// S0005: a host function cannot take the orchestrator.
use simpler::{dsl::In, Orchestrator, callable};

#[callable(sub)]
fn plan(o: &mut Orchestrator<'_>, x: In<f32>) {
    let _ = (o, x);
}

fn main() {}
