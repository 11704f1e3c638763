// Names the graph must handle: raw identifiers, a parameter named like its function, shape
// metadata in scalar expressions, a field named like a tensor, a tensor named like the type of
// its elements (the signature checks name tensors as types of their own, for their messages,
// which must shadow nothing).
use simpler::{dsl::In, dsl::InOut, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

#[callable(sub)]
fn scale(mut x: InOut<f32>, scale: f32) {
    x.iter_mut().for_each(|v| *v *= scale);
}

#[callable(sub)]
fn tick(_n: u32) {}

struct Dims {
    x: u32,
}
const D: Dims = Dims { x: 4 };

task_graph! {
    fn r#loop(r#in: In<f32>, y: Out<f32>) {
        let r#type = alloc::<f32>([r#in.shape()[0]]);
        copy(r#in, &mut r#type).on(sub());
        scale(&mut r#type, 2.0).on(sub());
        copy(r#type, &mut y).on(sub());
        let n = r#in.shape()[0] + D.x;
        tick(n).on(sub());
    }
}

task_graph! {
    fn g(g: In<f32>, y: Out<f32>) {
        copy(g, &mut y).on(sub());
    }
}

task_graph! {
    fn prim(x: In<f32>, y: Out<f32>) {
        let f32 = alloc::<f32>([4]);
        copy(x, &mut f32).on(sub());
        scale(&mut f32, 2.0).on(sub());
        copy(f32, &mut y).on(sub());
    }
}

fn main() {
    assert_eq!(r#loop::NAME, "loop");
    assert_eq!(r#loop::graph().graph().node_count(), 4);
    assert_eq!(g::graph().graph().node_count(), 1);
    assert_eq!(prim::graph().graph().node_count(), 3);
}
