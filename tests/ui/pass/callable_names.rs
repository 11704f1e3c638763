// Raw identifiers and names that differ only in case are callables of their own.
#![allow(non_snake_case)]
use simpler::{dsl::In, dsl::Out, callable};

#[callable(sub)]
fn r#match(a: In<f32>, mut r#type: Out<f32>) {
    r#type.copy_from_slice(&a);
}

#[callable(sub)]
fn aB() {}

#[callable(sub)]
fn ab() {}

fn main() {
    assert_eq!(r#match::NAME, "match");
    assert_eq!(r#match::PARAMS[1].name, "type");
    assert_ne!(aB::DIGEST, ab::DIGEST);
}
