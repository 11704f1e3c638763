// S0115: what a graph still cannot check: a tile shape that is a run-time value, rows with
// bounds, tiles of an intermediate, and a range loop bounded by a partition's length.
use simpler::{dsl::In, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

const T: u32 = 4;

task_graph! {
    fn g(x: In<f32>, y: Out<f32>, z: Out<f32>, n: u32) {
        let xs = x.tiles([n]);
        let ys = y.rows(0..T);
        let h = alloc::<f32>([16]);
        let hs = h.tiles([T]);
        let zs = z.tiles([T]);
        for i in 0..zs.len() {
            copy(xs[i], &mut zs[i]).on(sub());
        }
    }
}

fn main() {}
