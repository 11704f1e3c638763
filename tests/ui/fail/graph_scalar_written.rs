// S0110: `&mut` on a scalar.
use simpler::{dsl::In, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

task_graph! {
    fn g(x: In<f32>, y: Out<f32>, n: u32) {
        copy(x, &mut n).on(sub());
        copy(x, &mut y).on(sub());
    }
}

fn main() {}
