// S0109: an intermediate is `alloc::<T>([dims])`.
use simpler::{dsl::In, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

task_graph! {
    fn g(x: In<f32>, y: Out<f32>) {
        let h = alloc::<f32>(16);
        copy(x, &mut h).on(sub());
        copy(h, &mut y).on(sub());
    }
}

fn main() {}
