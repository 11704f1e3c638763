// S0113 / S0114 with affine indices: writes at `2 * i` and `2 * i + 2` meet (iteration 1's
// first piece is iteration 0's second), and a read at `i` of pieces written at `2 * i` may be
// another iteration's; `2 * i` beside `2 * i + 1` would be fine.
use simpler::{dsl::In, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

#[callable(sub)]
fn add(a: In<f32>, b: In<f32>, mut c: Out<f32>) {
    let _ = (a, b, &mut c);
}

task_graph! {
    fn writes_meet(x: In<f32>, y: Out<f32>) {
        let xs = x.split(4);
        let ys = y.split(10);
        for i in 0..4 {
            copy(xs[i], &mut ys[2 * i]).on(sub());
            copy(xs[i], &mut ys[2 * i + 2]).on(sub());
        }
    }
}

task_graph! {
    fn reads_another(x: In<f32>, y: Out<f32>, z: Out<f32>) {
        let xs = x.split(4);
        let ys = y.split(8);
        let zs = z.split(4);
        for i in 0..4 {
            copy(xs[i], &mut ys[2 * i]).on(sub());
            add(xs[i], ys[i], &mut zs[i]).on(sub());
        }
    }
}

fn main() {}
