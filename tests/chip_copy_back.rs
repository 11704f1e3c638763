//! A chip's executor thread copies a run's outputs back into host memory as soon as the kernel
//! ends, while the chip thread goes on with other work: never under host bytes the chip has
//! lent to a control meanwhile. (That nothing goes back once the chip is shutting down, its
//! run given up, is a unit test of the chip runtime.)

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Rig, TempFiles, isolated_test, marker_file, spin_until, wait_for};
use simpler::{
    DataType, HostArgs, HostResult, RunOptions, TaskArgs, Worker, chip::CallConfig, chip::ChipBackend,
    chip::ChipFn, chip::ChipSpec, chip::DeviceMemory, chip::SimChip,
};

const N: usize = 1024;

/// Marker `name` of the test process `test_pid` ([`marker_file`]).
fn marker(test_pid: u32, name: &str) -> PathBuf {
    marker_file(&format!("copy-back-{name}"), test_pid)
}

/// Marks that it started, waits (up to 20 s) for the gate, then fills its output with 7.0.
fn gated_fill(args: &HostArgs<'_>) -> HostResult {
    let test = std::os::unix::process::parent_id();
    std::fs::write(marker(test, "started"), b"1").expect("the marker");
    if !spin_until(Instant::now() + Duration::from_secs(20), || marker(test, "gate").exists()) {
        return Err("the gate never opened".into());
    }
    args.output::<f32>(0)?.fill(7.0);
    Ok(())
}

/// Set in the chip process once an output has gone back to the host.
static COPIED_BACK: AtomicBool = AtomicBool::new(false);

/// A `SimChip` that keeps the host bytes a `copy_to` lends it and looks at them again once an
/// output has been copied back (it waits up to 10 s for one): the lent slice must not change.
struct Probe(SimChip);

impl ChipBackend for Probe {
    fn cores(&self) -> usize {
        self.0.cores()
    }
    fn host_memory(&self) -> Option<&DeviceMemory> {
        self.0.host_memory()
    }
    fn copy_to_device(&self, dst: u64, src: &[u8]) -> simpler::Result<()> {
        if src.len() == N * 4 {
            let test = std::os::unix::process::parent_id();
            let before = src.to_vec();
            spin_until(Instant::now() + Duration::from_secs(10), || COPIED_BACK.load(Ordering::SeqCst));
            let after = std::hint::black_box(src).to_vec();
            let what = if before == after { "unchanged" } else { "mutated" };
            std::fs::write(marker(test, what), format!("{:?} -> {:?}", &before[..4], &after[..4]))
                .expect("the marker");
        }
        self.0.copy_to_device(dst, src)
    }
    fn copy_from_device(&self, src: u64, dst: &mut [u8]) -> simpler::Result<()> {
        let copied = self.0.copy_from_device(src, dst);
        COPIED_BACK.store(true, Ordering::SeqCst);
        copied
    }
}

fn probe(spec: &ChipSpec) -> simpler::Result<Box<dyn ChipBackend>> {
    Ok(Box::new(Probe(SimChip::new(spec.memory_bytes(), spec.cores())?)))
}

/// `Worker::copy_to` from a host buffer that a running chip task writes: the chip serves the
/// copy only after the task's outputs have gone back, so the bytes it lends its backend do not
/// change under it.
#[isolated_test]
fn a_copy_to_from_a_buffer_a_running_chip_task_writes_waits_for_the_copy_back() {
    let me = std::process::id();
    let _m = TempFiles::new(["started", "gate", "mutated", "unchanged"].map(|m| marker(me, m)));
    let mut rig = Rig::new(
        Worker::builder().chips(1).chip_memory(16 << 20).chip_cores(1).pipeline_depth(2).chip_backend(probe),
    );
    let k = rig.register_chip(ChipFn::kernel("gated_fill", gated_fill)).unwrap();
    rig.init();
    let x = rig.create_buffer(N * 4).unwrap();
    x.write(0, &vec![1.0f32; N]).unwrap();
    let dev = rig.alloc_child_tensor(0, &[N as u32], DataType::Float32).unwrap();
    let t = x.tensor(&[N as u32], DataType::Float32).unwrap();
    // Submitted without waiting: its task runs on the chip's executor thread.
    let run = rig
        .submit_with(RunOptions::new(), move |orch, _, _| {
            let mut args = TaskArgs::new();
            args.output(&t)?;
            orch.submit_next_level(&k, args, CallConfig::default(), 0).map(|_| ())
        })
        .unwrap();
    wait_for("the kernel to start", Duration::from_secs(20), || marker(me, "started").exists());
    // `copy_to` blocks until the chip has served it: open the gate a while after it is posted.
    // (Were the gate opened before the copy is posted, the test would check less, never fail
    // wrongly.)
    let gate = marker(me, "gate");
    let opener = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        std::fs::write(gate, b"open").expect("the gate");
    });
    rig.copy_to(&dev, &x).unwrap();
    opener.join().unwrap();
    run.wait().unwrap();
    assert_eq!(x.read::<f32>(0, 1).unwrap()[0], 7.0, "the task's output");
    let seen = |m| std::fs::read_to_string(marker(me, m)).ok();
    assert_eq!(seen("mutated"), None, "the host bytes lent to the backend changed under it");
    assert!(seen("unchanged").is_some(), "the backend's copy ran");
    x.write(0, &vec![0.0f32; N]).unwrap();
    rig.copy_from(&x, &dev).unwrap();
    assert_eq!(
        x.read::<f32>(0, N).unwrap(),
        vec![7.0f32; N],
        "the chip copied the output, once it had gone back"
    );
}
