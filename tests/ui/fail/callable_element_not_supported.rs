// A tensor element type the engine does not have (rustc, through `Element`).
use simpler::{dsl::In, dsl::Out, callable};

#[callable(sub)]
fn copy(x: In<bool>, mut y: Out<bool>) {
    y.copy_from_slice(&x);
}

fn main() {}
