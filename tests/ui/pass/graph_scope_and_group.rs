// A graph with a scope, a group and scalar lets; its static structure has every task.
use simpler::{dsl::In, dsl::InOut, dsl::Out, callable, task_graph};

#[callable(sub)]
fn add(a: In<f32>, b: In<f32>, mut out: Out<f32>, k: f32) {
    for i in 0..out.len() {
        out[i] = (a[i] + b[i]) * k;
    }
}

#[callable(sub)]
fn inc(mut x: InOut<f32>) {
    x.iter_mut().for_each(|v| *v += 1.0);
}

#[callable(chip)]
fn vadd(a: In<f32>, b: In<f32>, mut out: Out<f32>) {
    for i in 0..out.len() {
        out[i] = a[i] + b[i];
    }
}

task_graph! {
    /// Docs and attributes on the graph are kept.
    pub fn g(a: In<f32>, b: In<f32>, y: Out<f32>, y0: Out<f32>, y1: Out<f32>, n: u32) {
        let m = n * 2;
        let t = alloc::<f32>([m]);
        add(a, b, &mut t, 1.0).on(sub());
        scope(|| {
            let u = alloc::<f32>([n, 2]);
            add(t, a, &mut u, 0.5).on(sub());
            add(u, b, &mut y, 2.0).on(sub());
        });
        inc(&mut y).on(sub());
        group(|| {
            vadd(a, t, &mut y0).on(chip(0));
            vadd(b, t, &mut y1).on(chip(1));
        });
    }
}

fn main() {
    let graph = g::graph();
    let dot = graph.to_dot();
    assert!(dot.contains("add"), "{dot}");
    assert_eq!(g::KIND, simpler::callable::CallableKind::Orch);
    assert_eq!(g::PARAMS.len(), 6);
}
