// S0115: a loop whose constant range is empty never runs, so the graph's checks (which assume
// its body runs) cannot hold: `y` would stay unwritten.
use simpler::{dsl::Out, callable, task_graph};

const N: u32 = 0;

#[callable(sub)]
fn fill(mut y: Out<f32>, v: u32) {
    y.fill(v as f32);
}

task_graph! {
    fn g(y: Out<f32>) {
        let ys = y.split(1);
        for i in 0..N {
            fill(&mut ys[i], i).on(sub());
        }
    }
}

fn main() {}
