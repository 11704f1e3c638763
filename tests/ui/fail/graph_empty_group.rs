// S0108: a group needs at least one call line.
use simpler::{dsl::In, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

task_graph! {
    fn g(x: In<f32>, y: Out<f32>) {
        group(|| {});
        copy(x, &mut y).on(sub());
    }
}

fn main() {}
