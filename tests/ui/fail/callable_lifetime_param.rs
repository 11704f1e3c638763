// S0006: a callable names no lifetimes; the macro gives every tensor the lifetime of its task.
use simpler::{dsl::In, dsl::Out, callable};

#[callable(sub)]
fn copy<'a>(a: In<'a, f32>, mut b: Out<'a, f32>) {
    b.copy_from_slice(&a);
}

fn main() {}
