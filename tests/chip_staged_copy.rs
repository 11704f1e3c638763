//! A staged successor whose copy-in is long (a backend that takes 200 ms per 512 KiB copied
//! to the device, 3.2 s for its 8 MiB input): the chip copies it in piece by piece, and between
//! pieces it answers the running task's end, reads a withdraw of the staged run (cancel,
//! deadline) and stops copying, and a chip killed meanwhile fails both runs at once. The
//! running task's outputs go back while a piece is being copied in, not between pieces.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{Rig, TempFiles, expect_err, isolated_test, marker_file, sigkill, spin_until, wait_for};
use simpler::{
    CallableHandle, DataType, ErrorKind, HostArgs, HostResult, RunHandle, RunOptions, TaskArgs, Worker,
    chip::CallConfig, chip::ChipBackend, chip::ChipFn, chip::ChipSpec, chip::DeviceMemory, chip::SimChip,
    status::WorkerKind,
};

const N: usize = 1024;
/// The successor's input: 8 MiB, copied in 16 pieces of 512 KiB.
const BIG: usize = 2 << 20;
/// How long the backend takes per 512 KiB copied in (8 MiB: ~3.2 s in all).
const SLOW: Duration = Duration::from_millis(200);
/// The pieces of B's input.
const PIECES: usize = BIG * 4 / (512 << 10);

/// Marker `name` of the test process `test_pid` ([`marker_file`]).
fn marker(test_pid: u32, name: &str) -> PathBuf {
    marker_file(&format!("staged-copy-{name}"), test_pid)
}

/// Waits (up to 20 s) until gate `scalar 0` is open, then copies its input to its output.
fn gated_copy(args: &HostArgs<'_>) -> HostResult {
    let gate = marker(std::os::unix::process::parent_id(), &format!("gate{}", args.scalar(0)?));
    if !spin_until(Instant::now() + Duration::from_secs(20), || gate.exists()) {
        return Err(format!("{} never opened", gate.display()).into());
    }
    let x = args.input::<f32>(0)?.to_vec();
    args.output::<f32>(1)?.copy_from_slice(&x);
    Ok(())
}

/// `out[..N] = 2 x[..N]` (the big input's first N floats).
fn double_head(args: &HostArgs<'_>) -> HostResult {
    let x = args.input::<f32>(0)?[..N].to_vec();
    for (o, v) in args.output::<f32>(1)?.iter_mut().zip(x) {
        *o = 2.0 * v;
    }
    Ok(())
}

/// A `SimChip` whose host-to-device copies are slow (per byte); a big one leaves a marker.
struct Slow(SimChip);

impl ChipBackend for Slow {
    fn cores(&self) -> usize {
        self.0.cores()
    }
    fn host_memory(&self) -> Option<&DeviceMemory> {
        self.0.host_memory()
    }
    fn copy_to_device(&self, dst: u64, src: &[u8]) -> simpler::Result<()> {
        // A cost per byte (not per call): 512 KiB take SLOW. Each big piece (only B's input
        // has any) adds a byte to the `pieces` marker before it is copied.
        if src.len() >= 256 << 10 {
            use std::io::Write;
            let pieces = marker(std::os::unix::process::parent_id(), "pieces");
            let mut f =
                std::fs::OpenOptions::new().create(true).append(true).open(pieces).expect("the marker");
            f.write_all(b"1").expect("a byte of the marker");
        }
        std::thread::sleep(SLOW * src.len() as u32 / (512 << 10));
        self.0.copy_to_device(dst, src)
    }
}

fn slow(spec: &ChipSpec) -> simpler::Result<Box<dyn ChipBackend>> {
    Ok(Box::new(Slow(SimChip::new(spec.memory_bytes(), spec.cores())?)))
}

/// `Slow`, but a piece of B's input begun once A's gate is open waits (up to 20 s) for A's
/// output to have gone back to the host, which the backend marks (`out`); one that waited in
/// vain marks `late`.
struct Waiting(Slow);

impl ChipBackend for Waiting {
    fn cores(&self) -> usize {
        self.0.cores()
    }
    fn host_memory(&self) -> Option<&DeviceMemory> {
        self.0.host_memory()
    }
    fn copy_to_device(&self, dst: u64, src: &[u8]) -> simpler::Result<()> {
        let test = std::os::unix::process::parent_id();
        let big = src.len() >= 256 << 10;
        let waits = big && marker(test, "gate1").exists();
        if waits {
            // This piece waits for A's output: A may end now (`gated_until_a_piece`).
            std::fs::write(marker(test, "waiting"), b"1").expect("the marker");
        }
        let copied = self.0.copy_to_device(dst, src);
        if waits && !spin_until(Instant::now() + Duration::from_secs(20), || marker(test, "out").exists()) {
            std::fs::write(marker(test, "late"), b"late").expect("the marker");
        }
        copied
    }
    fn copy_from_device(&self, src: u64, dst: &mut [u8]) -> simpler::Result<()> {
        let test = std::os::unix::process::parent_id();
        let copied = self.0.copy_from_device(src, dst);
        if marker(test, "gate1").exists() {
            std::fs::write(marker(test, "out"), b"out").expect("the marker");
        }
        copied
    }
}

fn waiting(spec: &ChipSpec) -> simpler::Result<Box<dyn ChipBackend>> {
    Ok(Box::new(Waiting(Slow(SimChip::new(spec.memory_bytes(), spec.cores())?))))
}

/// Waits (up to 20 s) until a piece of B's input has begun that waits for this task's output
/// (one begun after gate 1 opened), then copies its input to its output: it ends while that
/// piece is under way.
fn gated_until_a_piece(args: &HostArgs<'_>) -> HostResult {
    let test = std::os::unix::process::parent_id();
    if !spin_until(Instant::now() + Duration::from_secs(20), || marker(test, "waiting").exists()) {
        return Err("no piece of the successor's input began waiting for this task's output".into());
    }
    let x = args.input::<f32>(0)?.to_vec();
    args.output::<f32>(1)?.copy_from_slice(&x);
    Ok(())
}

/// This test process's markers, removed before and after it.
fn markers() -> TempFiles {
    TempFiles::new(["gate1", "pieces", "out", "late", "waiting"].map(|m| marker(std::process::id(), m)))
}

fn rig() -> (Rig, CallableHandle, CallableHandle) {
    rig_with(slow, ChipFn::kernel("gated_copy", gated_copy))
}

fn rig_with(
    backend: fn(&ChipSpec) -> simpler::Result<Box<dyn ChipBackend>>,
    head: ChipFn,
) -> (Rig, CallableHandle, CallableHandle) {
    let mut rig = Rig::new(
        common::builder()
            .chips(1)
            .chip_memory(64 << 20)
            .chip_cores(1)
            .pipeline_depth(2)
            .pending_run_depth(3)
            .chip_backend(backend),
    );
    let gated = rig.register_chip(head).unwrap();
    let dbl = rig.register_chip(ChipFn::kernel("double_head", double_head)).unwrap();
    rig.init();
    (rig, gated, dbl)
}

fn submit(
    w: &Worker,
    k: &CallableHandle,
    input: (&simpler::Buffer, usize),
    out: &simpler::Buffer,
    gate: u64,
    opts: RunOptions,
) -> RunHandle {
    let (ti, to) = (
        input.0.tensor(&[input.1 as u32], DataType::Float32).unwrap(),
        out.tensor(&[N as u32], DataType::Float32).unwrap(),
    );
    let k = k.clone();
    w.submit_with(opts, move |orch, _, _| {
        let mut args = TaskArgs::new();
        args.input(&ti)?.output(&to)?.scalar(gate);
        orch.submit_next_level(&k, args, CallConfig::default(), 0).map(|_| ())
    })
    .unwrap()
}

/// A (gated) runs on the chip; B (8 MiB input, slow copy-in) is staged behind it. Returns once
/// B's copy-in is under way.
fn a_runs_b_copies(
    rig: &Rig,
    gated: &CallableHandle,
    dbl: &CallableHandle,
    b_opts: RunOptions,
) -> (RunHandle, RunHandle, Vec<simpler::Buffer>) {
    let small = rig.create_buffer(N * 4).unwrap();
    small.write(0, &(0..N).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
    let big = rig.create_buffer(BIG * 4).unwrap();
    big.write(0, &(0..BIG).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
    let outs: Vec<_> = (0..2).map(|_| rig.create_buffer(N * 4).unwrap()).collect();
    let a = submit(rig, gated, (&small, N), &outs[0], 1, RunOptions::new());
    let b = submit(rig, dbl, (&big, BIG), &outs[1], 0, b_opts);
    wait_for("B's copy-in to start", Duration::from_secs(20), || pieces_begun() > 0);
    assert_eq!(b.progress().staged, 0, "B is still copying in");
    (a, b, outs)
}

/// How many pieces of B's input the chip has begun to copy (16 make all of it).
fn pieces_begun() -> usize {
    std::fs::read(marker(std::process::id(), "pieces")).map_or(0, |b| b.len())
}

/// The head's end is answered between pieces of the successor's copy-in, not after all of it.
#[isolated_test]
fn the_heads_end_is_answered_while_the_successor_copies_in() {
    let _m = markers();
    let (rig, gated, dbl) = rig();
    let (a, b, outs) = a_runs_b_copies(&rig, &gated, &dbl, RunOptions::new());
    std::fs::write(marker(std::process::id(), "gate1"), b"open").unwrap();
    a.wait().unwrap();
    let begun = pieces_begun();
    b.wait().unwrap();
    assert!(begun < PIECES, "A's end was answered only after B's whole copy-in ({begun} pieces)");
    assert_eq!(pieces_begun(), PIECES, "then B's copy-in went on to the end");
    assert_eq!(outs[1].read::<f32>(0, N).unwrap()[3], 6.0);
}

/// The head's outputs go back to the host as soon as it has run, while the chip thread is
/// inside a piece of the successor's copy-in: a piece that waits for them is not left waiting
/// (were they copied back between pieces, it would wait for itself).
#[isolated_test]
fn the_heads_outputs_go_back_while_a_piece_of_the_successor_copies_in() {
    let _m = markers();
    let (rig, gated, dbl) = rig_with(waiting, ChipFn::kernel("gated_until_a_piece", gated_until_a_piece));
    let (a, b, outs) = a_runs_b_copies(&rig, &gated, &dbl, RunOptions::new());
    std::fs::write(marker(std::process::id(), "gate1"), b"open").unwrap();
    a.wait().unwrap();
    b.wait().unwrap();
    assert!(
        !marker(std::process::id(), "late").exists(),
        "a piece of B's copy-in waited in vain for A's output to go back"
    );
    assert_eq!(outs[0].read::<f32>(0, N).unwrap()[5], 5.0, "A's output");
    assert_eq!(outs[1].read::<f32>(0, N).unwrap()[3], 6.0, "B's output");
}

/// A (held at its gate) runs, B copies in behind it and is stopped by `stop`: B ends with
/// `kind` well before its copy-in would have (at the next piece, unlaunched), and A then ends
/// as usual.
fn stopped_while_it_copies_in(
    b_opts: RunOptions,
    stop: impl FnOnce(&RunHandle),
    kind: ErrorKind,
    needle: &str,
) {
    let _m = markers();
    let (rig, gated, dbl) = rig();
    let (a, b, outs) = a_runs_b_copies(&rig, &gated, &dbl, b_opts);
    stop(&b);
    expect_err(b.wait(), kind, &[needle]);
    let begun = pieces_begun();
    std::fs::write(marker(std::process::id(), "gate1"), b"open").unwrap();
    a.wait().unwrap();
    assert!(outs[1].read::<f32>(0, N).unwrap().iter().all(|v| *v == 0.0), "B never ran");
    assert!(begun < PIECES, "B ended only after its whole copy-in ({begun} pieces)");
    assert_eq!(pieces_begun(), begun, "and its copy-in stopped there");
}

/// Cancelling the successor while it copies in ends it at the next piece, unlaunched.
#[isolated_test]
fn a_successor_cancelled_while_it_copies_in_ends_at_once_unlaunched() {
    stopped_while_it_copies_in(RunOptions::new(), |b| assert!(b.cancel()), ErrorKind::Cancelled, "cancelled");
}

/// A deadline of the successor that passes while it copies in ends it likewise.
#[isolated_test]
fn a_successor_whose_deadline_passes_while_it_copies_in_ends_at_its_deadline() {
    let opts = RunOptions::new().deadline(Duration::from_millis(300));
    stopped_while_it_copies_in(opts, |_| {}, ErrorKind::Timeout, "deadline");
}

/// The chip dies mid-copy: both runs end at once, B's error saying it was not yet prepared.
#[isolated_test]
fn a_chip_killed_while_the_successor_copies_in_fails_both_promptly() {
    let _m = markers();
    let (rig, gated, dbl) = rig();
    let (a, b, _outs) = a_runs_b_copies(&rig, &gated, &dbl, RunOptions::new());
    let chip = rig.workers().into_iter().find(|w| w.kind == WorkerKind::Chip).unwrap();
    let t = Instant::now();
    sigkill(chip.pid);
    expect_err(a.wait(), ErrorKind::WorkerDied, &["gated_copy", "died"]);
    expect_err(b.wait(), ErrorKind::WorkerDied, &["double_head", "staged", "not yet prepared"]);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}
