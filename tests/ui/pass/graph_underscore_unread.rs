// An intermediate whose name starts with `_` may stay unread, as in Rust.
use simpler::{dsl::In, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

task_graph! {
    fn g(x: In<f32>, y: Out<f32>) {
        let _t = alloc::<f32>([16]);
        copy(x, &mut _t).on(sub());
        let _unused = alloc::<f32>([16]);
        copy(x, &mut y).on(sub());
    }
}

fn main() {
    let _ = g::graph();
}
