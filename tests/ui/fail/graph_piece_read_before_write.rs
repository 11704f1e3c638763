// S0101: a piece of an intermediate read before any call writes it: the error and its hint
// name the piece the graph wrote (`hs[1]`), not the whole allocation.
use simpler::{dsl::In, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

task_graph! {
    fn g(y: Out<f32>) {
        let h = alloc::<f32>([16]);
        let hs = h.split(2);
        copy(hs[1], &mut y).on(sub());
    }
}

fn main() {}
