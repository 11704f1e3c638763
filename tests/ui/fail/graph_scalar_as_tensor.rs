// A scalar passed where a tensor parameter is expected.
use simpler::{dsl::In, dsl::InOut, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

#[callable(sub)]
fn inc(mut x: InOut<f32>) {
    x.iter_mut().for_each(|v| *v += 1.0);
}

task_graph! {
    fn g(y: Out<f32>, n: u32) {
        copy(n, &mut y).on(sub());
    }
}

fn main() {}
