//! Chip run pipelining across Worker runs: a chip prepares the first run behind the FIFO head
//! (copies its inputs in) while the head's kernel runs, and launches it once the head has
//! finished; what fails how when the chip dies or the run is stopped in between.
//!
//! The last test has one run (what a chip killed mid-kernel says); every other test has three
//! runs on one chip: A and B run a kernel that waits at a gate (a file
//! the test creates), C doubles its input. A executes while B is staged; once A's gate opens,
//! B executes (on the chip's executor thread) and C is prepared beside it, which the test sees
//! in C's `RunProgress::staged` while B still waits at its gate: so the preparation provably
//! overlaps B's kernel.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{Rig, expect_err, isolated_test, sigkill, spin_until, wait_for};
use simpler::{
    CallableHandle, DataType, ErrorKind, HostArgs, HostResult, RunHandle, RunOptions, TaskArgs, Worker,
    chip::CallConfig, chip::ChipFn, status::WorkerKind,
};

const N: usize = 1024;

/// The gate file `gate` of the test process that started this chip (its parent).
fn gate_path(test_pid: u32, gate: u64) -> PathBuf {
    std::env::temp_dir().join(format!("simpler-rt-pipelining-{test_pid}-gate{gate}"))
}

/// Waits (up to 20 s) until gate `scalar 0` is open, then copies its input to its output.
fn gated_copy(args: &HostArgs<'_>) -> HostResult {
    let gate = gate_path(std::os::unix::process::parent_id(), args.scalar(0)?);
    let deadline = Instant::now() + Duration::from_secs(20);
    if !spin_until(deadline, || gate.exists()) {
        return Err(format!("{} never opened", gate.display()).into());
    }
    let x = args.input::<f32>(0)?.to_vec();
    args.output::<f32>(1)?.copy_from_slice(&x);
    Ok(())
}

/// Announces that it runs (creates gate `scalar 0 + 100`), then runs as [`gated_copy`].
fn announced_gated_copy(args: &HostArgs<'_>) -> HostResult {
    let started = gate_path(std::os::unix::process::parent_id(), args.scalar(0)? + 100);
    std::fs::write(started, b"running")?;
    gated_copy(args)
}

/// `out = 2 x`.
fn double(args: &HostArgs<'_>) -> HostResult {
    let x = args.input::<f32>(0)?.to_vec();
    for (o, v) in args.output::<f32>(1)?.iter_mut().zip(x) {
        *o = 2.0 * v;
    }
    Ok(())
}

struct Gates(u32);

impl Gates {
    fn open(&self, gate: u64) {
        std::fs::write(gate_path(self.0, gate), b"open").unwrap();
    }
}

impl Drop for Gates {
    fn drop(&mut self) {
        for g in [1, 2, 3, 101, 102, 103] {
            let _ = std::fs::remove_file(gate_path(self.0, g));
        }
    }
}

/// One chip granting depth 2, three runs admitted at once.
fn rig() -> (Rig, CallableHandle, CallableHandle) {
    let mut rig = Rig::new(
        common::builder().chips(1).chip_memory(32 << 20).chip_cores(1).pipeline_depth(2).pending_run_depth(3),
    );
    let gated = rig.register_chip(ChipFn::kernel("gated_copy", gated_copy)).unwrap();
    let dbl = rig.register_chip(ChipFn::kernel("double", double)).unwrap();
    rig.init();
    (rig, gated, dbl)
}

/// Submits one run of `k` on chip 0 from `input` to `out` (scalar `gate`), captured.
fn submit(
    w: &Worker,
    k: &CallableHandle,
    input: &simpler::Buffer,
    out: &simpler::Buffer,
    gate: u64,
) -> RunHandle {
    let (ti, to) = (
        input.tensor(&[N as u32], DataType::Float32).unwrap(),
        out.tensor(&[N as u32], DataType::Float32).unwrap(),
    );
    let k = k.clone();
    w.submit_with(RunOptions::new().capture_dag(), move |orch, _, _| {
        let mut args = TaskArgs::new();
        args.input(&ti)?.output(&to)?.scalar(gate);
        orch.submit_next_level(&k, args, CallConfig::default(), 0).map(|_| ())
    })
    .unwrap()
}

/// An input of `N` floats `0, 1, 2, ...` (returned too) and `outs` zeroed outputs of `N`.
fn input_and_outputs(rig: &Rig, outs: usize) -> (simpler::Buffer, Vec<f32>, Vec<simpler::Buffer>) {
    let input = rig.create_buffer(N * 4).unwrap();
    let xs: Vec<f32> = (0..N).map(|i| i as f32).collect();
    input.write(0, &xs).unwrap();
    (input, xs, (0..outs).map(|_| rig.create_buffer(N * 4).unwrap()).collect())
}

/// Runs A and B (gated) and C (double) as the module docs say, and returns once C is
/// prepared on the chip while B waits at its gate: (A, B, C, their outputs, C's input).
fn three_runs(
    rig: &Rig,
    gated: &CallableHandle,
    dbl: &CallableHandle,
    gates: &Gates,
) -> ([RunHandle; 3], Vec<simpler::Buffer>, Vec<f32>) {
    let (input, xs, outs) = input_and_outputs(rig, 3);
    let a = submit(rig, gated, &input, &outs[0], 1);
    let b = submit(rig, gated, &input, &outs[1], 2);
    let c = submit(rig, dbl, &input, &outs[2], 0);
    gates.open(1);
    wait_for("C prepared while B runs", Duration::from_secs(20), || c.progress().staged == 1);
    assert_eq!(b.progress().completed, 0, "B still waits at its gate");
    ([a, b, c], outs, xs)
}

#[isolated_test]
fn a_successor_run_is_prepared_while_the_run_before_executes_and_starts_after_it() {
    let (rig, gated, dbl) = rig();
    let gates = Gates(std::process::id());
    let ([a, b, c], outs, xs) = three_runs(&rig, &gated, &dbl, &gates);
    gates.open(2);
    for h in [&a, &b, &c] {
        h.wait().unwrap();
    }
    assert_eq!(outs[1].read::<f32>(0, N).unwrap(), xs);
    let doubled: Vec<f32> = xs.iter().map(|v| 2.0 * v).collect();
    assert_eq!(outs[2].read::<f32>(0, N).unwrap(), doubled, "C's inputs, copied in early, were right");
    let (tb, tc) = (b.timeline().unwrap(), c.timeline().unwrap());
    let (rb, rc) = (&tb.records()[0], &tc.records()[0]);
    let staged = rc.staged_ns.expect("C was staged");
    assert!(staged < rb.ended_ns.unwrap(), "C was prepared before B ended: {rc:?} {rb:?}");
    assert!(rc.started_ns.unwrap() >= rb.ended_ns.unwrap(), "C started after B ended: {rc:?} {rb:?}");
    assert_eq!(rc.worker, "chip 0");
    assert_eq!(c.progress().staged, 0);
}

/// The chip dies while B executes and C is prepared: killed from outside, or by the Worker to
/// stop B when B is cancelled (a kernel cannot be interrupted). Both runs end promptly with
/// errors naming the chip; C's says it was staged, and why the chip died when the Worker
/// killed it.
#[isolated_test]
fn a_chip_that_dies_with_a_prepared_successor_fails_both_runs_with_named_errors() {
    for cancel in [false, true] {
        let (rig, gated, dbl) = rig();
        let gates = Gates(std::process::id());
        let ([a, b, c], _outs, _) = three_runs(&rig, &gated, &dbl, &gates);
        a.wait().unwrap();
        let started = Instant::now();
        if cancel {
            assert!(b.cancel());
            expect_err(b.wait(), ErrorKind::Cancelled, &["run", "cancelled", "gated_copy", "chip 0"]);
            expect_err(
                c.wait(),
                ErrorKind::WorkerDied,
                &["double", "chip 0", "killed it to stop a run", "staged"],
            );
        } else {
            let chip = rig.workers().into_iter().find(|w| w.kind == WorkerKind::Chip).unwrap();
            sigkill(chip.pid);
            expect_err(b.wait(), ErrorKind::WorkerDied, &["gated_copy", "chip 0", "died"]);
            expect_err(c.wait(), ErrorKind::WorkerDied, &["double", "chip 0", "staged", "not launched"]);
        }
        assert!(started.elapsed() < Duration::from_secs(10), "both runs ended promptly");
    }
}

#[isolated_test]
fn a_cancelled_run_gives_its_prepared_task_back_unlaunched_and_the_chip_serves_on() {
    let (rig, gated, dbl) = rig();
    let gates = Gates(std::process::id());
    let ([a, b, c], outs, xs) = three_runs(&rig, &gated, &dbl, &gates);
    assert!(c.cancel());
    expect_err(c.wait(), ErrorKind::Cancelled, &["cancelled"]);
    gates.open(2);
    a.wait().unwrap();
    b.wait().unwrap();
    assert_eq!(outs[1].read::<f32>(0, N).unwrap(), xs);
    assert!(outs[2].read::<f32>(0, N).unwrap().iter().all(|v| *v == 0.0), "the withdrawn task never ran");
    // The chip took no harm: a later run runs.
    let input = rig.create_buffer(N * 4).unwrap();
    input.write(0, &xs).unwrap();
    let out = rig.create_buffer(N * 4).unwrap();
    submit(&rig, &dbl, &input, &out, 0).wait().unwrap();
    assert_eq!(out.read::<f32>(0, N).unwrap()[3], 6.0);
}

#[isolated_test]
fn a_successor_that_fails_to_prepare_fails_alone() {
    let (rig, gated, dbl) = rig();
    let gates = Gates(std::process::id());
    let input = rig.create_buffer(N * 4).unwrap();
    let out = rig.create_buffer(N * 4).unwrap();
    // 40 MiB of input does not fit the chip's 32 MiB: preparing it fails.
    let huge = rig.create_buffer(40 << 20).unwrap();
    let huge_out = rig.create_buffer(N * 4).unwrap();
    let a = submit(&rig, &gated, &input, &out, 1);
    let (th, to) = (
        huge.tensor(&[(10 << 20) as u32], DataType::Float32).unwrap(),
        huge_out.tensor(&[N as u32], DataType::Float32).unwrap(),
    );
    let k = dbl.clone();
    let b = rig
        .submit(move |orch| {
            let mut args = TaskArgs::new();
            args.input(&th)?.output(&to)?;
            orch.submit_next_level(&k, args, CallConfig::default(), 0).map(|_| ())
        })
        .unwrap();
    gates.open(1);
    a.wait().unwrap();
    expect_err(b.wait(), ErrorKind::ResourceExhausted, &["double", "chip 0"]);
    // The chip serves on.
    let out2 = rig.create_buffer(N * 4).unwrap();
    submit(&rig, &dbl, &input, &out2, 0).wait().unwrap();
}

#[isolated_test]
fn a_chip_killed_while_its_only_run_executes_does_not_say_the_task_had_not_launched() {
    // One run, nothing behind it (submitted without waiting: the chip runs it on its executor
    // thread, ready to prepare a run that might follow).
    let (mut rig, _gated, _dbl) = rig();
    let announced = rig.register_chip(ChipFn::kernel("announced_gated_copy", announced_gated_copy)).unwrap();
    let gates = Gates(std::process::id());
    let input = rig.create_buffer(N * 4).unwrap();
    let out = rig.create_buffer(N * 4).unwrap();
    let run = submit(&rig, &announced, &input, &out, 1);
    let started = gate_path(std::process::id(), 101);
    wait_for("the kernel to run", Duration::from_secs(20), || started.exists());
    let chip = rig.workers().into_iter().find(|w| w.kind == WorkerKind::Chip).unwrap();
    sigkill(chip.pid);
    let err = expect_err(run.wait(), ErrorKind::WorkerDied, &["announced_gated_copy", "chip 0", "died"]);
    assert!(!err.message().contains("not launched"), "the kernel was running: {err}");
    drop(gates);
}

/// A staged successor stays withdrawable while a later task of the head runs on the chip: the
/// chip's loop must not execute that task on its own thread (it would read the WITHDRAW only
/// after the kernel), so cancelling the successor ends it at once, not when the head's kernel
/// ends.
#[isolated_test]
fn a_staged_successor_is_cancelled_at_once_while_a_second_task_of_the_head_runs() {
    let (mut rig, gated, dbl) = rig();
    let announced = rig.register_chip(ChipFn::kernel("announced_gated_copy", announced_gated_copy)).unwrap();
    let gates = Gates(std::process::id());
    let (input, xs, outs) = input_and_outputs(&rig, 4);
    let f32s = |b: &simpler::Buffer| b.tensor(&[N as u32], DataType::Float32).unwrap();
    // Z holds the chip (gate 1); A is staged behind it: T1 (gate 2), then T2 (announced, gate
    // 3), which reads what T1 wrote; C is staged once A is the head. C writes what T1 writes
    // and T2 reads, so it waits for its turn (a run independent of A would launch between T1
    // and T2).
    let z = submit(&rig, &gated, &input, &outs[0], 1);
    let (ti, t1_out, t2_out) = (f32s(&input), f32s(&outs[1]), f32s(&outs[2]));
    let (g, an) = (gated.clone(), announced.clone());
    let a = rig
        .submit(move |orch| {
            let mut t1 = TaskArgs::new();
            t1.input(&ti)?.output(&t1_out)?.scalar(2);
            orch.submit_next_level(&g, t1, CallConfig::default(), 0)?;
            let mut t2 = TaskArgs::new();
            t2.input(&t1_out)?.output(&t2_out)?.scalar(3);
            orch.submit_next_level(&an, t2, CallConfig::default(), 0).map(|_| ())
        })
        .unwrap();
    let c = submit(&rig, &dbl, &input, &outs[1], 0);
    gates.open(1);
    z.wait().unwrap();
    wait_for("C prepared while T1 runs", Duration::from_secs(20), || c.progress().staged == 1);
    gates.open(2);
    let t2_runs = gate_path(std::process::id(), 103);
    wait_for("T2 to run", Duration::from_secs(20), || t2_runs.exists());
    assert!(c.cancel());
    let ended = c.wait_timeout(Duration::from_secs(10));
    assert!(c.is_done(), "the staged successor was still live 10 s after its cancel: {ended:?}");
    let err = ended.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
    assert!(err.message().contains("staged and not launched") && err.message().contains("`double`"), "{err}");
    assert!(!a.is_done(), "T2 still waits at its gate");
    gates.open(3);
    a.wait().unwrap();
    assert_eq!(outs[1].read::<f32>(0, N).unwrap(), xs, "the withdrawn task never ran: T1's copy stands");
    assert_eq!(outs[2].read::<f32>(0, N).unwrap(), xs, "T2 read T1's copy");
}

/// The first of runs submitted back to back is overlapped too: the chip runs a task of a run
/// whose caller went on without waiting (`submit`) on its executor thread, so it can prepare
/// the run that follows while that kernel runs (it used to run it on its own thread, and
/// prepared the second run only after the first kernel).
#[isolated_test]
fn the_run_behind_the_first_of_a_burst_is_prepared_while_the_first_executes() {
    let (rig, gated, dbl) = rig();
    let gates = Gates(std::process::id());
    let (input, xs, outs) = input_and_outputs(&rig, 2);
    let a = submit(&rig, &gated, &input, &outs[0], 1);
    let b = submit(&rig, &dbl, &input, &outs[1], 0);
    wait_for("B prepared while A runs", Duration::from_secs(20), || b.progress().staged == 1);
    assert_eq!(a.progress().completed, 0, "A still waits at its gate");
    gates.open(1);
    a.wait().unwrap();
    b.wait().unwrap();
    assert_eq!(outs[1].read::<f32>(0, N).unwrap(), xs.iter().map(|v| 2.0 * v).collect::<Vec<_>>());
}

/// A group reserves its chips against the singles behind it, staging included (upstream's
/// rule): with runs queued, a single of the run behind the head, placed on a chip that a group
/// ahead of it in that run needs, is not staged there, so it cannot overtake the group. Three
/// chips, default pipelining. Run 1 holds chip 0 at its gate; run 2 submits a group on chips 0
/// and 1, then a single on chip 0, then one on chip 2 (which no group needs: run 2 reads only
/// what run 1 reads, so it is independent and that single runs at once, and the pass that
/// started it would have started or staged the single on chip 0 too). Chip 0 runs run 1's
/// task, the group, then the single.
#[isolated_test]
fn a_single_behind_a_group_does_not_overtake_it_through_staging() {
    let mut rig = Rig::new(common::builder().chips(3).chip_memory(32 << 20).chip_cores(1));
    let gated = rig.register_chip(ChipFn::kernel("gated_copy", gated_copy)).unwrap();
    let dbl = rig.register_chip(ChipFn::kernel("double", double)).unwrap();
    rig.init();
    let gates = Gates(std::process::id());
    let (input, xs, outs) = input_and_outputs(&rig, 5);
    let head = submit(&rig, &gated, &input, &outs[0], 1);
    let f32s = |b: &simpler::Buffer| b.tensor(&[N as u32], DataType::Float32).unwrap();
    let ti = f32s(&input);
    let o: Vec<_> = outs[1..].iter().map(f32s).collect();
    let k = dbl.clone();
    let next = rig
        .submit_with(RunOptions::new().capture_dag(), move |orch, _, _| {
            let one = |out: &simpler::Tensor| -> simpler::Result<TaskArgs> {
                let mut a = TaskArgs::new();
                a.input(&ti)?.output(out)?;
                Ok(a)
            };
            orch.submit_next_level_group(&k, vec![one(&o[0])?, one(&o[1])?], CallConfig::default(), &[0, 1])?;
            orch.submit_next_level(&k, one(&o[2])?, CallConfig::default(), 0)?;
            orch.submit_next_level(&k, one(&o[3])?, CallConfig::default(), 2).map(|_| ())
        })
        .unwrap();
    wait_for("the single on chip 2 run while run 1 runs", Duration::from_secs(20), || {
        next.progress().completed >= 1
    });
    gates.open(1);
    head.wait().unwrap();
    next.wait().unwrap();
    let doubled: Vec<f32> = xs.iter().map(|v| 2.0 * v).collect();
    for out in &outs[1..] {
        assert_eq!(out.read::<f32>(0, N).unwrap(), doubled);
    }
    let t = next.timeline().unwrap();
    let at = |i: u32| t.records().iter().find(|r| r.index == i).unwrap().clone();
    let (group, single, other) = (at(0), at(1), at(2));
    assert!(
        group.started_ns.unwrap() <= single.started_ns.unwrap(),
        "the single on chip 0 started before the group ahead of it: {group:?} {single:?}"
    );
    assert!(single.staged_ns.is_none(), "the single on chip 0 was staged ahead of the group: {single:?}");
    assert!(
        other.ended_ns.expect("the single on chip 2 ended") < group.started_ns.expect("the group started"),
        "the single on chip 2 ran while run 1 held chip 0: {other:?} {group:?}"
    );
}
