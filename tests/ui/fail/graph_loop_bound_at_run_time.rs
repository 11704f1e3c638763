// S0115: a loop bound that is a run-time value of the graph.
use simpler::{dsl::In, dsl::InOut, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

#[callable(sub)]
fn acc(mut total: InOut<f32>, x: In<f32>) {
    total.iter_mut().zip(x.iter()).for_each(|(t, v)| *t += v);
}

const TILES: u32 = 4;

task_graph! {
    fn g(x: In<f32>, y: Out<f32>, n: u32) {
        let xs = x.split(n);
        let ys = y.split(TILES);
        for i in 0..n {
            copy(xs[i], &mut ys[i]).on(sub());
        }
    }
}

fn main() {}
