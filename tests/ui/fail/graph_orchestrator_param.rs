// S0004: a task graph gets its orchestrator implicitly.
use simpler::{dsl::In, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

task_graph! {
    fn g(o: &mut simpler::Orchestrator<'_>, x: In<f32>, y: Out<f32>) {
        copy(x, &mut y).on(sub());
    }
}

fn main() {}
