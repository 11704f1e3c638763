// A host function placed on a chip inside a graph.
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
    fn g(x: In<f32>, y: Out<f32>) {
        copy(x, &mut y).on(chip(0));
    }
}

fn main() {}
