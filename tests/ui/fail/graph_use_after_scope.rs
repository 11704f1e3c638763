// S0110: an intermediate used after its scope ended.
use simpler::{dsl::In, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

task_graph! {
    fn g(x: In<f32>, y: Out<f32>, z: Out<f32>) {
        scope(|| {
            let h = alloc::<f32>([16]);
            copy(x, &mut h).on(sub());
            copy(h, &mut y).on(sub());
        });
        copy(h, &mut z).on(sub());
    }
}

fn main() {}
