// S0114: a shadowed index reads another iteration's piece, which nothing orders.
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
    fn g(y: Out<f32>, n: u32) {
        let t = alloc::<f32>([n]);
        let ts = t.split(4);
        let ys = y.split(4);
        for i in 0..4 {
            fill(&mut ts[i], i).on(sub());
            let i = 3 - i;
            copy(ts[i], &mut ys[i]).on(sub());
        }
    }
}

fn main() {
    let _ = g::graph();
}
