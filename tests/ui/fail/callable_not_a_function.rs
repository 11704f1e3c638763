// S0006: `#[callable]` on something that is not a function.
use simpler::callable;

#[callable(sub)]
struct Copy {
    x: u32,
}

fn main() {}
