//! Two `#[callable]` items with one identity: a Worker that would register both refuses to start.
//!
//! The digest of a `#[callable]` covers its crate, name, signature and body tokens, not its
//! module: the two `which` below (same text, different `helper`s) share one. Registering the
//! second under the first's digest would silently run one for the other, so `init` refuses,
//! naming both. A binary of its own: every Worker with SUB workers in it refuses to start.

mod common;

use common::Rig;
use simpler::{ErrorKind, Worker};

mod one {
    use simpler::{Out, callable};

    fn helper() -> u64 {
        1
    }

    #[callable(sub)]
    pub fn which(mut out: Out<u64>) {
        out.fill(helper());
    }
}

mod two {
    use simpler::{Out, callable};

    fn helper() -> u64 {
        2
    }

    #[callable(sub)]
    pub fn which(mut out: Out<u64>) {
        out.fill(helper());
    }
}

#[test]
fn two_callables_with_one_digest_are_refused_naming_both() {
    assert_eq!(one::which::DIGEST, two::which::DIGEST, "same crate, name, signature and tokens");
    let mut rig = Rig::new(Worker::builder().sub_workers(1));
    let err = Worker::init(&mut rig).expect_err("two functions under one digest");
    assert_eq!(err.kind(), ErrorKind::Callable, "{err:?}");
    let m = err.message();
    assert!(m.contains("different function"), "{err:?}");
    assert!(m.matches("rt_callable_alias::which").count() >= 2, "both are named: {err:?}");
}
