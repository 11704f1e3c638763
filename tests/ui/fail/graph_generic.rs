// S0006: a task graph cannot be generic.
use simpler::{dsl::In, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

task_graph! {
    fn g<T: simpler::memory::Element>(x: In<f32>, y: Out<f32>) {
        copy(x, &mut y).on(sub());
    }
}

fn main() {}
