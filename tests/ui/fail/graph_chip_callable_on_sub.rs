// A chip callable placed on a SUB worker inside a graph.
use simpler::{dsl::In, dsl::Out, callable, task_graph};

#[callable(chip)]
fn vcopy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

task_graph! {
    fn g(x: In<f32>, y: Out<f32>) {
        vcopy(x, &mut y).on(sub());
    }
}

fn main() {}
