// S0113: an inner loop that reuses the outer loop's index name shadows it: every iteration of
// the outer loop writes the same pieces.
use simpler::{dsl::Out, callable, task_graph};

#[callable(sub)]
fn fill(mut y: Out<f32>, v: u32) {
    y.fill(v as f32);
}

task_graph! {
    fn g(y: Out<f32>) {
        let ys = y.split(2);
        for i in 0..3 {
            for i in 0..2 {
                fill(&mut ys[i], i).on(sub());
            }
        }
    }
}

fn main() {
    let _ = g::graph();
}
