// S0113: a range loop past the pieces of a split, when the bound and the count are both
// constants: the compiler refuses it.
use simpler::{dsl::Out, callable, task_graph};

#[callable(sub)]
fn fill(mut y: Out<f32>, v: u32) {
    y.fill(v as f32);
}

task_graph! {
    fn g(y: Out<f32>) {
        let ys = y.split(4);
        for i in 0..8 {
            fill(&mut ys[i], i).on(sub());
        }
    }
}

fn main() {
    let _ = g::graph();
}
