// S0113: an affine index that names pieces past the partition: with literals the macro
// refuses it and names the pieces; with named constants rustc does, with the S0113 message.
use simpler::{dsl::In, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

task_graph! {
    fn literal(x: In<f32>, y: Out<f32>) {
        let xs = x.split(4);
        let ys = y.split(7);
        for i in 0..4 {
            copy(xs[i], &mut ys[2 * i + 1]).on(sub());
        }
    }
}

task_graph! {
    fn below_zero(x: In<f32>, y: Out<f32>) {
        let xs = x.split(4);
        let ys = y.split(4);
        for i in 0..4 {
            copy(xs[i], &mut ys[i - 1]).on(sub());
        }
    }
}

const HALF: u32 = 4;
const PIECES: u32 = 7;

task_graph! {
    fn named(x: In<f32>, y: Out<f32>) {
        let xs = x.split(HALF);
        let ys = y.split(PIECES);
        for i in 0..HALF {
            copy(xs[i], &mut ys[2 * i + 1]).on(sub());
        }
    }
}

fn main() {
    let _ = (literal::graph(), below_zero::graph(), named::graph());
}
