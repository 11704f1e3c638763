use super::*;
use crate::callable::identity::{host_fn_descriptor, orch_fn_descriptor};

// Test values: equal values are the same code.
impl Installable for &str {
    fn same_code(&self, other: &Self) -> bool {
        self == other
    }
    fn describe(&self) -> String {
        format!("value {self:?}")
    }
}
impl Installable for i32 {
    fn same_code(&self, other: &Self) -> bool {
        self == other
    }
    fn describe(&self) -> String {
        format!("value {self}")
    }
}
impl Installable for () {
    fn same_code(&self, _: &Self) -> bool {
        true
    }
    fn describe(&self) -> String {
        "()".to_string()
    }
}

fn desc(name: &str) -> (Digest, Vec<u8>) {
    let d = host_fn_descriptor(name, "tests::f", 1);
    (d.digest(), d.bytes().to_vec())
}

#[test]
fn install_refcount_release_and_slot_reuse() {
    let mut reg = Registry::new(8);
    assert!(reg.is_empty());
    let (a, da) = desc("a");
    let (b, db) = desc("b");
    let (c, dc) = desc("c");

    assert_eq!(reg.install(a, &da, "A").unwrap(), 0);
    assert_eq!(reg.install(b, &db, "B").unwrap(), 1);
    // Same digest, descriptor and code: refcount up.
    assert_eq!(reg.install(a, &da, "A").unwrap(), 0);
    assert_eq!(reg.refs(&a), 2);
    assert_eq!(reg.refs(&b), 1);
    assert_eq!(reg.get(&a), Some(&"A"));
    assert_eq!(reg.by_slot(0), Some(&"A"));
    assert_eq!(reg.by_slot(1), Some(&"B"));
    assert_eq!(reg.by_slot(2), None);
    assert_eq!(reg.slot_of(&b), Some(1));
    assert_eq!(reg.len(), 2);
    assert!(!reg.is_empty());
    let listed: Vec<_> = reg.iter().map(|(d, bytes, v)| (*d, bytes.to_vec(), *v)).collect();
    assert_eq!(listed, vec![(a, da.clone(), "A"), (b, db.clone(), "B")]);

    assert!(!reg.release(&a).unwrap());
    assert_eq!(reg.refs(&a), 1);
    assert!(reg.release(&a).unwrap());
    assert!(!reg.contains(&a));
    assert_eq!(reg.refs(&a), 0);
    assert_eq!(reg.get(&a), None);
    assert_eq!(reg.slot_of(&a), None);
    assert_eq!(reg.by_slot(0), None);
    assert_eq!(reg.len(), 1);

    // Slot 0 is reused by the next install.
    assert_eq!(reg.install(c, &dc, "C").unwrap(), 0);
    assert_eq!(reg.by_slot(0), Some(&"C"));
    // And reinstalling `a` gets a fresh slot.
    assert_eq!(reg.install(a, &da, "A3").unwrap(), 2);
    assert_eq!(reg.get(&a), Some(&"A3"));

    assert!(reg.release(&b).unwrap());
    assert!(reg.release(&c).unwrap());
    assert!(reg.release(&a).unwrap());
    assert!(reg.is_empty());
    assert_eq!(reg.iter().count(), 0);
    // Freed slots are reused lowest first.
    assert_eq!(reg.install(b, &db, "B").unwrap(), 0);
    assert_eq!(reg.install(c, &dc, "C").unwrap(), 1);
}

#[test]
fn claimed_digest_must_match_descriptor() {
    let mut reg = Registry::new(4);
    let (a, _) = desc("a");
    let (_, db) = desc("b");
    let err = reg.install(a, &db, ()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Callable);
    assert!(err.message().starts_with("HASHID_DESCRIPTOR_MISMATCH: "), "{err}");
    assert!(err.message().contains(&a.to_string()), "{err}");
    assert!(reg.is_empty());
}

#[test]
fn same_digest_different_descriptor_is_refused() {
    let mut reg = Registry::new(4);
    let (a, da) = desc("a");
    reg.install(a, &da, 1).unwrap();
    // A genuine sha256 collision cannot be built for a test, so plant a different descriptor
    // under `a` the way a corrupted registry would hold one.
    let other = orch_fn_descriptor("a", "tests::f", 1);
    let slot = reg.slot_of(&a).unwrap();
    reg.entry_mut(slot).descriptor = other.bytes().into();
    let err = reg.install(a, &da, 2).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Callable);
    assert!(err.message().starts_with("HASHID_DESCRIPTOR_MISMATCH: "), "{err}");
    assert_eq!(reg.refs(&a), 1);
    assert_eq!(reg.get(&a), Some(&1));
}

#[test]
fn a_different_value_under_an_installed_digest_is_refused_naming_both() {
    let mut reg = Registry::new(4);
    let (a, da) = desc("a");
    reg.install(a, &da, "first").unwrap();
    reg.check(a, &da, &"first").unwrap();
    let err = reg.check(a, &da, &"second").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Callable);
    let err2 = reg.install(a, &da, "second").unwrap_err();
    assert_eq!(err.message(), err2.message());
    for needle in ["HASHID_DESCRIPTOR_MISMATCH: ", "\"first\"", "\"second\"", "different function"] {
        assert!(err.message().contains(needle), "{needle}: {err}");
    }
    assert_eq!((reg.refs(&a), reg.get(&a)), (1, Some(&"first")));
}

#[test]
fn slots_run_out() {
    let mut reg = Registry::new(2);
    let (a, da) = desc("a");
    let (b, db) = desc("b");
    let (c, dc) = desc("c");
    reg.install(a, &da, ()).unwrap();
    reg.install(b, &db, ()).unwrap();
    // Re-installing a present digest needs no new slot.
    reg.install(a, &da, ()).unwrap();
    let err = reg.install(c, &dc, ()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Callable);
    assert!(err.message().starts_with("LOCAL_SLOT_EXHAUSTED: "), "{err}");
    assert_eq!(reg.check(c, &dc, &()).unwrap_err().message(), err.message());
    assert!(!reg.contains(&c));
    assert!(reg.release(&b).unwrap());
    reg.check(c, &dc, &()).unwrap();
    assert_eq!(reg.install(c, &dc, ()).unwrap(), 1);

    let mut none = Registry::new(0);
    let err = none.install(a, &da, ()).unwrap_err();
    assert!(err.message().starts_with("LOCAL_SLOT_EXHAUSTED: "), "{err}");
}

#[test]
fn release_unknown_names_the_digest() {
    let mut reg = Registry::<()>::new(2);
    let (a, da) = desc("a");
    let err = reg.release(&a).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Callable);
    assert!(err.message().contains(&a.to_string()), "{err}");
    // Releasing past zero is also unknown.
    reg.install(a, &da, ()).unwrap();
    assert!(reg.release(&a).unwrap());
    assert!(reg.release(&a).is_err());
}
