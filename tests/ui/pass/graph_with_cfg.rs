// A `#[cfg]` on a task graph's function holds for everything the macro makes of it.
use simpler::{dsl::InOut, callable, task_graph};

#[callable(sub)]
fn kept(mut x: InOut<f32>) {
    x[0] = 1.0;
}

task_graph! {
    #[cfg(any())]
    fn gone_graph(x: InOut<f32>) {
        kept(&mut x).on(sub());
    }
}

task_graph! {
    #[cfg(all())]
    fn kept_graph(x: InOut<f32>) {
        kept(&mut x).on(sub());
    }
}

fn main() {
    assert_eq!(kept_graph::graph().graph().node_count(), 1);
}
