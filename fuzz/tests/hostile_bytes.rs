//! Hostile bytes never crash a decoder: a short run of the randomized harness (this package,
//! through `simpler::__fuzz`) over every decoder that reads bytes another process wrote (the
//! wire codec, callable and chip descriptors, mailbox frames and their error tails, the remote
//! session's bodies). No panic, every refusal a named error, and no allocation larger than the
//! input justifies (counted by this binary's allocator). The long run is
//! `cargo run -p simpler-fuzz --profile fuzz`.

use simpler_fuzz::{Counting, Harness, Target};

#[global_allocator]
static ALLOC: Counting = Counting;

/// Inputs per decoder: a few seconds in all in a debug build.
const INPUTS: u64 = 10_000;

fn fuzz(target: Target) {
    let mut harness = Harness::new().expect("a private mailbox");
    let report =
        harness.run(target, 0x5EED, INPUTS, Some(&Counting::probe)).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(report.inputs, INPUTS);
    // The generator reaches both sides of every decoder.
    assert!(report.accepted > 0 && report.rejected > 0, "{report:?}");
}

#[test]
fn wire_args() {
    fuzz(Target::Args);
}

#[test]
fn wire_config() {
    fuzz(Target::Config);
}

#[test]
fn wire_desc() {
    fuzz(Target::Desc);
}

#[test]
fn callable_descriptor() {
    fuzz(Target::CallableDescriptor);
}

#[test]
fn chip_descriptor() {
    fuzz(Target::ChipDescriptor);
}

#[test]
fn mailbox_task_frame() {
    fuzz(Target::TaskFrame);
}

#[test]
fn mailbox_base_frame() {
    fuzz(Target::BaseFrame);
}

#[test]
fn remote_frame() {
    fuzz(Target::RemoteFrame);
}

#[test]
fn remote_task() {
    fuzz(Target::RemoteTask);
}

#[test]
fn remote_completion() {
    fuzz(Target::RemoteCompletion);
}
