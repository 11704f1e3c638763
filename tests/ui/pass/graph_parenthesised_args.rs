// Parenthesised arguments are tracked like plain ones: the write-after-read edges are there.
use simpler::{dsl::In, dsl::InOut, dsl::Out, callable, task_graph};

#[callable(sub)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

#[callable(sub)]
fn inc(mut x: InOut<f32>) {
    x.iter_mut().for_each(|v| *v += 1.0);
}

task_graph! {
    fn g(x: In<f32>, y: Out<f32>, z: Out<f32>) {
        let h = alloc::<f32>([4]);
        copy(x, &mut h).on(sub());
        copy((h), &mut y).on(sub());
        inc(&mut (h)).on(sub());
        copy(h, &mut z).on(sub());
    }
}

fn main() {
    let g = g::graph();
    let edges: Vec<(u32, u32)> = g
        .graph()
        .edge_indices()
        .map(|e| {
            let (a, b) = g.graph().edge_endpoints(e).unwrap();
            (g.graph()[a].index, g.graph()[b].index)
        })
        .collect();
    for want in [(0, 1), (1, 2), (2, 3)] {
        assert!(edges.contains(&want), "missing edge {want:?} in {edges:?}");
    }
}
