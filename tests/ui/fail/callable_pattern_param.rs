// S0004: a parameter must be a plain name.
use simpler::{dsl::Out, callable};

#[callable(sub)]
fn copy((a, b): (u32, u32), mut y: Out<f32>) {
    let _ = (a, b, &mut y);
}

fn main() {}
