// A callable, and a graph using it, declared inside a function body.
use simpler::{dsl::In, dsl::Out, callable, task_graph};

fn main() {
    #[callable(sub)]
    fn copy(a: In<f32>, mut b: Out<f32>) {
        b.copy_from_slice(&a);
    }

    task_graph! {
        fn g(a: In<f32>, y: Out<f32>) {
            copy(a, &mut y).on(sub());
        }
    }

    assert_eq!(copy::NAME, "copy");
    let _ = g::graph();
}
