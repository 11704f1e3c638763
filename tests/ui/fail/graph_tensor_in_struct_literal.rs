// S0110: a tensor as a struct literal's field value is used inside an expression.
use simpler::{dsl::In, dsl::Out, dsl::TensorOf, callable, task_graph};

#[callable(sub)]
fn fill(mut y: Out<f32>, v: u32) {
    y.fill(v as f32);
}

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

pub struct Holder {
    pub inner: TensorOf<f32>,
}

task_graph! {
    fn g(y: Out<f32>, n: u32) {
        let _t = alloc::<f32>([n]);
        let ts = _t.split(2);
        for (i, p) in ts {
            fill(&mut p, i).on(sub());
        }
        let h = Holder { inner: _t };
        copy(&h.inner, &mut y).on(sub());
    }
}

fn main() {
    let _ = g::graph();
}
