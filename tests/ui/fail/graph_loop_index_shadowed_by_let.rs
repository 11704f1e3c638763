// S0113: a `let` that shadows the loop index is not the loop index: every iteration writes
// piece 0 through an `Out` parameter.
use simpler::{dsl::In, dsl::Out, callable, task_graph};

#[callable(sub)]
fn fill(mut y: Out<f32>, v: u32) {
    y.fill(v as f32);
}

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

task_graph! {
    fn g(y: Out<f32>) {
        let ys = y.split(4);
        for i in 0..4 {
            let i = 0u32;
            fill(&mut ys[i], i).on(sub());
        }
    }
}

fn main() {
    let _ = g::graph();
    let _ = copy::NAME;
}
