// S0113: one loop writes pieces of `y` through two partitions whose pieces overlap.
use simpler::{dsl::In, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

task_graph! {
    fn g(x: In<f32>, y: Out<f32>) {
        let xs = x.split(2);
        let quarters = y.split(4);
        let halves = y.split(2);
        for i in 0..2 {
            copy(xs[i], &mut quarters[i]).on(sub());
            copy(xs[i], &mut halves[i]).on(sub());
        }
    }
}

fn main() {}
