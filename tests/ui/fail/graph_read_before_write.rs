// S0101: an intermediate read before any call writes it.
use simpler::{dsl::In, dsl::InOut, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

#[callable(sub)]
fn inc(mut x: InOut<f32>) {
    x.iter_mut().for_each(|v| *v += 1.0);
}

#[callable(sub)]
fn split(a: In<f32>, mut lo: Out<f32>, mut hi: Out<f32>) {
    lo.copy_from_slice(&a);
    hi.copy_from_slice(&a);
}

task_graph! {
    fn g(y: Out<f32>) {
        let h = alloc::<f32>([16]);
        copy(h, &mut y).on(sub());
    }
}

fn main() {}
