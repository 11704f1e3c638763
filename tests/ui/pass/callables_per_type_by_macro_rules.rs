// One callable per element type, written by `macro_rules!` (the advice S0006 gives for
// generics): a `$t:ty` arrives as an invisible group, and is a scalar type all the same.
use simpler::{dsl::InOut, callable};

macro_rules! scale_for {
    ($name:ident, $t:ty) => {
        #[callable(sub)]
        fn $name(mut x: InOut<$t>, k: $t) {
            x.iter_mut().for_each(|v| *v = *v * k);
        }
    };
}
scale_for!(scale_f32, f32);
scale_for!(scale_i32, i32);

fn main() {
    assert_ne!(scale_f32::DIGEST, scale_i32::DIGEST);
    assert_eq!(scale_f32::PARAMS[0].ty, "f32");
}
