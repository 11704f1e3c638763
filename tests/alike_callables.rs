//! Two `#[callable]`s that read alike (the same name, parameters, type names and body) in two
//! modules, where the type name means different types: they have one digest, so a task could
//! run either. A Worker refuses to start, naming them (in a test binary of its own: every
//! Worker of this binary links both).

mod common;

use common::isolated_test;
use simpler::{ErrorKind, Worker, callable, dsl::InOut};

mod fa {
    use super::*;
    type T = f32;
    #[callable(sub)]
    pub fn twice(mut x: InOut<T>) {
        for v in x.iter_mut() {
            *v = *v + *v;
        }
    }
}

mod fb {
    use super::*;
    type T = i32;
    #[callable(sub)]
    pub fn twice(mut x: InOut<T>) {
        for v in x.iter_mut() {
            *v = *v + *v;
        }
    }
}

#[isolated_test]
fn two_callables_that_read_alike_share_a_digest_and_no_worker_starts_with_them() {
    assert_eq!(fa::twice::DIGEST, fb::twice::DIGEST, "the macro cannot tell them apart");
    let mut w = Worker::builder().sub_workers(1).build().unwrap();
    let err = w.init().unwrap_err();
    common::assert_err(
        &err,
        ErrorKind::Callable,
        &["twice", "same digest", "T as f32", "T as i32", "rename one of them"],
    );
    assert!(w.child_pids().is_empty(), "nothing was started");
}
