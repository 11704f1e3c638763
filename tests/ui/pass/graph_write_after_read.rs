// A write after a read compiles: the engine orders it (a write-after-read edge).
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
    fn war(a: In<f32>, y: Out<f32>, z: Out<f32>) {
        let h = alloc::<f32>([16]);
        copy(a, &mut h).on(sub());
        copy(h, &mut y).on(sub());
        inc(&mut h).on(sub());
        copy(h, &mut z).on(sub());
    }
}

fn main() {
    // Tasks: 0 writes `h`, 1 reads it, 2 overwrites it, 3 reads the new value.
    let graph = war::graph();
    let g = graph.graph();
    assert_eq!(g.node_count(), 4);
    let after: Vec<_> = g
        .edge_indices()
        .filter(|&e| matches!(g[e], simpler::dsl::GraphEdge::WriteAfterRead { .. }))
        .map(|e| {
            let (a, b) = g.edge_endpoints(e).unwrap();
            (g[a].index, g[b].index)
        })
        .collect();
    assert_eq!(after, vec![(1, 2)], "{}", graph.to_dot());
}
