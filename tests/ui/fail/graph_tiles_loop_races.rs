// S0113 / S0114 for loops over tiles, whose count is the run's: a piece at another index, and
// a read of another iteration's piece, are refused as for `split`.
use simpler::{dsl::In, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

#[callable(sub)]
fn add(a: In<f32>, b: In<f32>, mut c: Out<f32>) {
    let _ = (a, b, &mut c);
}

const T: u32 = 16;

task_graph! {
    fn shifted(x: In<f32>, y: Out<f32>) {
        let ys = y.tiles([T]);
        for (i, xt) in x.tiles([T]) {
            copy(xt, &mut ys[i * i]).on(sub());
        }
    }
}

task_graph! {
    fn neighbour(x: In<f32>, y: Out<f32>, z: Out<f32>) {
        let ys = y.tiles([T]);
        let zs = z.tiles([T]);
        for (i, xt) in x.tiles([T]) {
            copy(xt, &mut ys[i]).on(sub());
            add(xt, ys[0], &mut zs[i]).on(sub());
        }
    }
}

fn main() {}
