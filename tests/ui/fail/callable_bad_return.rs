// A callable returns `()` or `Result<(), E>`.
use simpler::{dsl::In, callable};

#[callable(sub)]
fn count(x: In<f32>) -> i32 {
    x.len() as i32
}

fn main() {}
