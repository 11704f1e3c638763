//! Placeholder replaced by the integration suites.
#[test]
fn placeholder() {}
