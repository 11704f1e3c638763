//! A run that serves a task of the level above (a nested Worker's run, a chip orchestration)
//! may name only bytes inside the tensors that task was given, and its own `orch.alloc`
//! intermediates: widening a given view, or keeping a tensor for a later run, is refused,
//! since those bytes may belong to another task running meanwhile.

mod common;

use common::{Rig, isolated_test};
use simpler::{
    DataType, HostArgs, HostFn, HostResult, OrchFn, Orchestrator, Result, TaskArgs, Worker, chip::CallConfig,
    chip::ChipFn, memory::TensorView, status::Level,
};

const N: u32 = 16;

/// Fills its output with 0xBAD.
fn scribble(args: &HostArgs<'_>) -> HostResult {
    args.output::<u64>(0)?.fill(0xBAD);
    Ok(())
}

/// Given row 0 of a 2 x N matrix (tensor 0, writable), writes the first half of it (inside
/// what it was given), then re-views it as row 1 (outside) and tries to write that.
fn widen(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> Result<()> {
    let given = args.tensor(0).expect("one tensor");
    let scribble = HostFn::new("scribble", scribble).handle();
    let half = given.reshape(TensorView::new(0, &[N / 2], None, DataType::Uint64)?)?;
    let mut a = TaskArgs::new();
    a.output(&half)?;
    orch.submit_sub(&scribble, a)?;
    let row1 = given.reshape(TensorView::new(u64::from(N) * 8, &[N], None, DataType::Uint64)?)?;
    let mut b = TaskArgs::new();
    b.output(&row1)?;
    orch.submit_sub(&scribble, b).map(|_| ())
}

/// A nested Worker with one SUB worker that runs `scribble`, under an L4 rig with `orch`.
fn l4_over_l3(orch: OrchFn) -> (Rig, simpler::CallableHandle, u32) {
    let mut l3 = Worker::builder().sub_workers(1).build().unwrap();
    l3.register(HostFn::new("scribble", scribble)).unwrap();
    let mut rig = Rig::new(Worker::builder().level(Level::Network1).sub_workers(1).worker(l3));
    let w = 0;
    let h = rig.register_orch(orch).unwrap();
    rig.init();
    (rig, h, w)
}

fn submit_to(rig: &Rig, h: &simpler::CallableHandle, w: u32, t: &simpler::Tensor) -> simpler::Result<()> {
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.output(t)?;
        orch.submit_next_level(h, a, CallConfig::default(), w).map(|_| ())
    })
}

#[isolated_test]
fn a_nested_run_cannot_widen_a_view_it_was_given() {
    let (rig, h, w) = l4_over_l3(OrchFn::new("widen", widen));
    let x = rig.create_buffer(2 * N as usize * 8).unwrap();
    let m = x.tensor(&[2, N], DataType::Uint64).unwrap();
    let err = submit_to(&rig, &h, w, &m.rows(0..1).unwrap()).unwrap_err();
    assert!(err.message().contains("that this run was not given"), "{err}");
    let got = x.read::<u64>(0, 2 * N as usize).unwrap();
    assert!(got[..N as usize / 2].iter().all(|v| *v == 0xBAD), "the view inside ran: {got:?}");
    assert!(got[N as usize..].iter().all(|v| *v == 0), "row 1 was never written: {got:?}");
}

/// The nested Worker's process keeps the tensor of its first task here.
static KEPT: std::sync::Mutex<Option<simpler::Tensor>> = std::sync::Mutex::new(None);

/// On its first task keeps tensor 0; on later ones writes the kept tensor.
fn keep(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> Result<()> {
    let mut kept = KEPT.lock().unwrap();
    let Some(old) = kept.as_ref() else {
        *kept = Some(args.tensor(0).expect("one tensor").clone());
        return Ok(());
    };
    let mut a = TaskArgs::new();
    a.output(old)?;
    orch.submit_sub(&HostFn::new("scribble", scribble).handle(), a).map(|_| ())
}

#[isolated_test]
fn a_nested_run_cannot_use_a_tensor_kept_from_an_earlier_task() {
    let (rig, h, w) = l4_over_l3(OrchFn::new("keep", keep));
    let (x, z) = (rig.create_buffer(N as usize * 8).unwrap(), rig.create_buffer(8).unwrap());
    let (tx, tz) = (x.tensor(&[N], DataType::Uint64).unwrap(), z.tensor(&[1], DataType::Uint64).unwrap());
    submit_to(&rig, &h, w, &tx).unwrap();
    // The second task is given only `z`; `x` may be another task's meanwhile.
    let err = submit_to(&rig, &h, w, &tz).unwrap_err();
    assert!(err.message().contains("that this run was not given"), "{err}");
    assert!(x.read::<u64>(0, N as usize).unwrap().iter().all(|v| *v == 0));
}

/// Fills its output with `scalar 0`.
fn fill_k(args: &HostArgs<'_>) -> HostResult {
    let v = args.scalar(0)?;
    args.output::<u64>(0)?.fill(v);
    Ok(())
}

/// The chip process keeps the (staged) tensor of its first chip orchestration here.
static CHIP_KEPT: std::sync::Mutex<Option<simpler::Tensor>> = std::sync::Mutex::new(None);

/// On its first run keeps tensor 0 (its host output, staged on the chip); on later runs
/// fills this run's tensor 0 on core 0 and the kept one on core 1.
fn chip_keep(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> Result<()> {
    let mut kept = CHIP_KEPT.lock().unwrap();
    let fill = ChipFn::kernel("fill_k", fill_k).handle();
    let mut a = TaskArgs::new();
    a.output(args.tensor(0).expect("one tensor"))?.scalar(1);
    orch.submit_next_level(&fill, a, CallConfig::default(), 0)?;
    let Some(old) = kept.as_ref() else {
        *kept = Some(args.tensor(0).expect("one tensor").clone());
        return Ok(());
    };
    let mut b = TaskArgs::new();
    b.output(old)?.scalar(2);
    orch.submit_next_level(&fill, b, CallConfig::default(), 1).map(|_| ())
}

#[isolated_test]
fn a_chip_orchestration_cannot_use_a_tensor_kept_from_an_earlier_run() {
    let mut rig = Rig::new(Worker::builder().chips(1).chip_memory(16 << 20).chip_cores(2));
    rig.register_chip(ChipFn::kernel("fill_k", fill_k)).unwrap();
    let h = rig.register_chip(ChipFn::orchestration("chip_keep", chip_keep)).unwrap();
    rig.init();
    let (h1, h2) = (rig.create_buffer(N as usize * 8).unwrap(), rig.create_buffer(N as usize * 8).unwrap());
    let run = |b: &simpler::Buffer| {
        let t = b.tensor(&[N], DataType::Uint64).unwrap();
        rig.run(|orch| {
            let mut a = TaskArgs::new();
            a.output(&t)?;
            orch.submit_next_level(&h, a, CallConfig::default(), 0).map(|_| ())
        })
    };
    run(&h1).unwrap();
    assert!(h1.read::<u64>(0, N as usize).unwrap().iter().all(|v| *v == 1));
    // The kept tensor names the same staging bytes as this run's under its old identity:
    // two cores would write them at once, unordered.
    let err = run(&h2).unwrap_err();
    assert!(
        err.message().contains("chip_keep") && err.message().contains("that this run was not given"),
        "{err}"
    );
}
