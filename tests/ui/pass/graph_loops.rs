// Loops in a graph: over a constant range and over a partition, with placement computed from
// the index, a per-iteration intermediate, an `InOut` accumulator and a combine after the loop.
use simpler::{dsl::In, dsl::InOut, dsl::Out, callable, task_graph};

#[callable(chip)]
fn scale(x: In<f32>, mut y: Out<f32>) {
    y.iter_mut().zip(x.iter()).for_each(|(o, v)| *o = 2.0 * v);
}

#[callable(sub)]
fn acc(mut total: InOut<f32>, x: In<f32>) {
    total.iter_mut().zip(x.iter()).for_each(|(t, v)| *t += v);
}

#[callable(sub)]
fn zero(mut total: Out<f32>) {
    total.fill(0.0);
}

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

const TILES: u32 = 4;

task_graph! {
    fn tiled(x: In<f32>, y: Out<f32>, total: Out<f32>, sums: Out<f32>) {
        let xs = x.split(TILES);
        let ys = y.split(TILES);
        for i in 0..TILES {
            scale(xs[i], &mut ys[i]).on(chip(i % 2));
        }
        zero(&mut total).on(sub());
        for (_, yt) in ys {
            let t = alloc::<f32>([4]);
            copy(yt, &mut t).on(sub());
            acc(&mut total, t).on(sub());
        }
        let q = sums.grid([2]);
        for (j, s) in x.split(2) {
            copy(s, &mut q[j]).on(sub());
        }
    }
}

fn main() {
    assert_eq!(tiled::graph().graph().node_count(), 4 + 1 + 8 + 2);
}
