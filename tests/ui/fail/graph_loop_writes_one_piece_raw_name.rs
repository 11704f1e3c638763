// S0113 for a fixed piece of a partition with a raw name: the message names it `r#type`, as
// written, and the macro does not panic making a type of that name.
use simpler::{dsl::In, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

const TILES: u32 = 4;

task_graph! {
    fn g(x: In<f32>, y: Out<f32>) {
        let xs = x.split(TILES);
        let r#type = y.split(TILES);
        for i in 0..TILES {
            copy(xs[i], &mut r#type[0]).on(sub());
        }
    }
}

fn main() {}
