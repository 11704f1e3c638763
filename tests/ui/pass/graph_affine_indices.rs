// Affine piece indices in a loop variable (`2 * i`, `2 * i + 1`, `i + 1`, `i * 2`, `1 + 2 * i`,
// `i - 1`) are index launches like plain ones: writes at `2 * i` and `2 * i + 1` of one
// partition never meet, whatever the iteration.
use simpler::{dsl::In, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

const PIECES: u32 = 8;
const HALF: u32 = 4;

task_graph! {
    fn literal(x: In<f32>, y: Out<f32>) {
        let xs = x.split(8);
        let ys = y.split(8);
        for i in 0..4 {
            copy(xs[i], &mut ys[2 * i]).on(sub());
            copy(xs[i + 4], &mut ys[1 + i * 2]).on(sub());
        }
    }
}

task_graph! {
    fn named(x: In<f32>, y: Out<f32>, z: Out<f32>) {
        let xs = x.split(PIECES);
        let ys = y.split(PIECES);
        let zs = z.split(HALF);
        for i in 1..HALF {
            copy(xs[2 * i + 1], &mut ys[2 * (i - 1)]).on(sub());
            copy(xs[i - 1], &mut zs[i]).on(sub());
        }
    }
}

task_graph! {
    fn over_a_partition(x: In<f32>, y: Out<f32>) {
        let ys = y.split(PIECES);
        for (i, xt) in x.split(HALF) {
            copy(xt, &mut ys[2 * i]).on(sub());
            copy(xt, &mut ys[2 * i + 1]).on(sub());
        }
    }
}

fn main() {
    let _ = (literal::graph(), named::graph(), over_a_partition::graph());
}
