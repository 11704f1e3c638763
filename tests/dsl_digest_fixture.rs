// Included twice by dsl.rs: the same source must give the same digest.
use simpler::{dsl::In, dsl::Out, callable};

#[callable(sub)]
pub fn fixture(x: In<u32>, mut y: Out<u32>) {
    for (o, i) in y.iter_mut().zip(x.iter()) {
        *o = i + 1;
    }
}
