//! Data stays on the device: an intermediate that only one chip's kernels use lives in that
//! chip's memory (the L3 Worker's device heap), so a run copies in only what the host gives and
//! copies back only what the host reads. A backend that counts copies (in the chip processes,
//! reporting through a file) sees it.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};

use common::{Rig, expect_err, isolated_test};
use simpler::chip::{CallConfig, ChipBackend, ChipFn, ChipSpec, DeviceMemory, SimChip};
use simpler::{
    DataType, ErrorKind, HostArgs, HostFn, HostResult, RunOptions, TaskArgs, Worker, callable, dsl::In,
    dsl::Out, task_graph,
};

const N: u32 = 256;

/// `t = x + 1`.
#[callable(chip, opencl = "kernels/plus_one.cl", entry = "plus_one")]
fn plus_one(x: In<f32>, mut t: Out<f32>) {
    for (o, i) in t.iter_mut().zip(x.iter()) {
        *o = i + 1.0;
    }
}

/// `y = 2 t` on a chip core.
#[callable(chip, opencl = "kernels/twice.cl", entry = "twice")]
fn twice(t: In<f32>, mut y: Out<f32>) {
    for (o, i) in y.iter_mut().zip(t.iter()) {
        *o = 2.0 * i;
    }
}

/// `y = 2 t` on a SUB worker.
#[callable(sub)]
fn twice_sub(t: In<f32>, mut y: Out<f32>) {
    for (o, i) in y.iter_mut().zip(t.iter()) {
        *o = 2.0 * i;
    }
}

task_graph! {
    /// Both kernels on chip 0: `tmp` never leaves it.
    fn on_chip(x: In<f32>, y: Out<f32>) {
        let tmp = alloc::<f32>([N]);
        plus_one(x, &mut tmp).on(chip(0));
        twice(tmp, &mut y).on(chip(0));
    }
}

task_graph! {
    /// The consumer on a SUB worker: `tmp` is host memory, copied back from the chip.
    fn via_host(x: In<f32>, y: Out<f32>) {
        let tmp = alloc::<f32>([N]);
        plus_one(x, &mut tmp).on(chip(0));
        twice_sub(tmp, &mut y).on(sub());
    }
}

/// A `SimChip` whose copies are appended, one line each (`in <bytes>` / `out <bytes>`), to a
/// file named after the test process (the chip runs in a process of its own).
struct Counting(SimChip);

fn log_path() -> std::path::PathBuf {
    // The chip process's parent is the test process.
    std::env::temp_dir().join(format!("simpler-copies-{}", std::os::unix::process::parent_id()))
}

fn log(line: String) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(log_path()).expect("the copy log");
    writeln!(f, "{line}").expect("a log line");
}

impl ChipBackend for Counting {
    fn cores(&self) -> usize {
        self.0.cores()
    }
    fn host_memory(&self) -> Option<&DeviceMemory> {
        self.0.host_memory()
    }
    fn copy_to_device(&self, dst: u64, src: &[u8]) -> simpler::Result<()> {
        log(format!("in {}", src.len()));
        self.0.copy_to_device(dst, src)
    }
    fn copy_from_device(&self, src: u64, dst: &mut [u8]) -> simpler::Result<()> {
        log(format!("out {}", dst.len()));
        self.0.copy_from_device(src, dst)
    }
}

fn counting(spec: &ChipSpec) -> simpler::Result<Box<dyn ChipBackend>> {
    Ok(Box::new(Counting(SimChip::new(spec.memory_bytes(), spec.cores())?)))
}

/// The copies logged since the last call: (copies in, bytes in, copies out, bytes out).
fn copies_since(seen: &AtomicU64) -> (usize, usize, usize, usize) {
    let text =
        std::fs::read_to_string(std::env::temp_dir().join(format!("simpler-copies-{}", std::process::id())))
            .unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let new = &lines[seen.swap(lines.len() as u64, Ordering::SeqCst) as usize..];
    let mut c = (0, 0, 0, 0);
    for l in new {
        let (dir, n) = l.split_once(' ').expect("a log line");
        let n: usize = n.parse().expect("a byte count");
        if dir == "in" {
            (c.0, c.1) = (c.0 + 1, c.1 + n);
        } else {
            (c.2, c.3) = (c.2 + 1, c.3 + n);
        }
    }
    c
}

fn ramp(w: &Worker) -> (simpler::Buffer, simpler::dsl::TensorOf<f32>) {
    let b = w.create_buffer(N as usize * 4).unwrap();
    b.write(0, &(0..N).map(|v| v as f32).collect::<Vec<_>>()).unwrap();
    let t = b.typed::<f32>(&[N]).unwrap();
    (b, t)
}

#[isolated_test]
fn an_intermediate_used_only_on_one_chip_never_leaves_it() {
    let _ = std::fs::remove_file(std::env::temp_dir().join(format!("simpler-copies-{}", std::process::id())));
    let seen = AtomicU64::new(0);
    let mut rig =
        Rig::new(common::builder().chips(1).sub_workers(1).chip_memory(64 << 20).chip_backend(counting));
    rig.init();
    let setup = copies_since(&seen);
    assert_eq!((setup.0, setup.2), (0, 0), "starting the chip copies nothing");
    let (_bx, x) = ramp(&rig);
    let (by, mut y) = ramp(&rig);
    let want: Vec<f32> = (0..N).map(|v| 2.0 * (v as f32 + 1.0)).collect();
    let bytes = N as usize * 4;
    for _ in 0..3 {
        on_chip::call(&x, &mut y).unwrap().submit_with(&rig, RunOptions::new()).unwrap().wait().unwrap();
        assert_eq!(by.read::<f32>(0, N as usize).unwrap(), want);
        assert_eq!(
            copies_since(&seen),
            (1, bytes, 1, bytes),
            "per run: x in and y out; the intermediate stays on the chip"
        );
    }
    // With a SUB consumer the intermediate is host memory: the chip copies it out.
    by.write(0, &vec![0.0f32; N as usize]).unwrap();
    via_host::call(&x, &mut y).unwrap().submit_with(&rig, RunOptions::new()).unwrap().wait().unwrap();
    assert_eq!(by.read::<f32>(0, N as usize).unwrap(), want);
    assert_eq!(copies_since(&seen), (1, bytes, 1, bytes), "x in, tmp out (y is the SUB worker's)");
    let _ = std::fs::remove_file(std::env::temp_dir().join(format!("simpler-copies-{}", std::process::id())));
}

fn touch(args: &HostArgs<'_>) -> HostResult {
    args.input::<f32>(0)?;
    Ok(())
}

/// An `alloc_on` intermediate is chip memory: a SUB task or another chip's kernel naming it is
/// refused at submit, naming the tensor; without a device heap it is a host intermediate.
#[isolated_test]
fn a_device_intermediate_goes_only_to_its_chip() {
    let mut rig = Rig::new(common::builder().chips(2).sub_workers(1).chip_memory(16 << 20));
    let sub = rig.register(HostFn::new("touch", touch)).unwrap();
    let k = rig
        .register_chip(
            ChipFn::kernel("plus_one_plain", plus_one_host)
                .with_source(simpler::chip::KernelSource::opencl(
                    include_str!("kernels/plus_one.cl"),
                    "plus_one",
                ))
                .unwrap(),
        )
        .unwrap();
    rig.init();
    let err = rig
        .run(|orch| {
            let tmp = orch.alloc_on(0, &[N], DataType::Float32)?;
            let mut a = TaskArgs::new();
            a.input(&tmp)?;
            orch.submit_sub(&sub, a)?;
            Ok(())
        })
        .unwrap_err();
    assert!(
        err.message().contains("tensor 0") && err.message().contains("SUB tasks run on the host"),
        "{err}"
    );
    let err = rig
        .run(|orch| {
            let tmp = orch.alloc_on(0, &[N], DataType::Float32)?;
            let out = orch.alloc(&[N], DataType::Float32)?;
            let mut a = TaskArgs::new();
            a.input(&tmp)?.output(&out)?;
            orch.submit_next_level(&k, a, CallConfig::default(), 1)?;
            Ok(())
        })
        .unwrap_err();
    assert!(err.message().contains("lives on chip 0 but this task runs on chip 1"), "{err}");
    drop(rig);

    // No device heap: the same intermediate is host memory, and a SUB task may read it.
    let mut rig = Rig::new(common::builder().chips(1).sub_workers(1).chip_heap_ring_size(0));
    let sub = rig.register(HostFn::new("touch", touch)).unwrap();
    rig.init();
    rig.run(|orch| {
        let tmp = orch.alloc_on(0, &[N], DataType::Float32)?;
        let mut a = TaskArgs::new();
        a.input(&tmp)?;
        orch.submit_sub(&sub, a)?;
        Ok(())
    })
    .unwrap();
}

fn plus_one_host(args: &HostArgs<'_>) -> HostResult {
    let (x, t) = (args.input::<f32>(0)?, args.output::<f32>(1)?);
    for (o, i) in t.iter_mut().zip(x.iter()) {
        *o = i + 1.0;
    }
    Ok(())
}

/// A device heap that cannot fit the chip's memory is an `init` error when its size was asked
/// for, naming the chip and the setting.
#[isolated_test]
fn an_explicit_device_heap_that_does_not_fit_fails_init() {
    let mut w = common::builder().chips(1).chip_memory(1 << 20).chip_heap_ring_size(1 << 20).build().unwrap();
    let err = expect_err(w.init(), ErrorKind::ResourceExhausted, &["chip 0", "chip_heap_ring_size"]);
    drop(err);
}
