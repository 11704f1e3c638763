// S0113: a range loop past the pieces of a split whose bound and count are named constants:
// the compiler evaluates them, and refuses the loop with the S0113 message (a plain error, not
// a `const` evaluation failure).
use simpler::{dsl::Out, callable, task_graph};

#[callable(sub)]
fn fill(mut y: Out<f32>, v: u32) {
    y.fill(v as f32);
}

const PIECES: u32 = 4;
const STEPS: u32 = 8;

task_graph! {
    fn g(y: Out<f32>) {
        let ys = y.split(PIECES);
        for i in 0..STEPS {
            fill(&mut ys[i], i).on(sub());
        }
    }
}

fn main() {
    let _ = g::graph();
}
