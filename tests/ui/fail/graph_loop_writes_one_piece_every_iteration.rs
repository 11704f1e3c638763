// S0113: a loop whose every iteration writes the same piece `ys[0]` through an `Out` parameter:
// the message names the partition, not the tensor it splits.
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
    fn g(x: In<f32>, y: Out<f32>) {
        let xs = x.split(TILES);
        let ys = y.split(TILES);
        for i in 0..TILES {
            copy(xs[i], &mut ys[0]).on(sub());
        }
    }
}

fn main() {}
