//! Chip backends: a Worker reaches its chips' devices only through `ChipBackend`, so a backend
//! written here (one that wraps `SimChip` and counts every call) sees every allocation, free
//! and copy the chip runtime makes, and its errors are what the user gets.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};

use common::{double, isolated_test, vadd};

use simpler::{
    DataType, ErrorKind, Orchestrator, TaskArgs, Worker, chip::CallConfig, chip::ChipBackend, chip::ChipFn,
    chip::ChipSpec, chip::DeviceMemory, chip::SimChip, memory::TensorView, status::Level,
};

/// What the counting backends of this process counted (each test runs in a process of its
/// own, and a factory is a plain `fn`, so the counts live in a static).
static COUNTS: Counts = Counts {
    malloc: AtomicUsize::new(0),
    free: AtomicUsize::new(0),
    copy_in: AtomicUsize::new(0),
    copy_out: AtomicUsize::new(0),
    bytes_in: AtomicUsize::new(0),
    bytes_out: AtomicUsize::new(0),
};

struct Counts {
    malloc: AtomicUsize,
    free: AtomicUsize,
    copy_in: AtomicUsize,
    copy_out: AtomicUsize,
    bytes_in: AtomicUsize,
    bytes_out: AtomicUsize,
}

impl Counts {
    fn get(&self) -> [usize; 4] {
        [&self.malloc, &self.free, &self.copy_in, &self.copy_out].map(|c| c.load(Ordering::SeqCst))
    }
}

/// A `SimChip` that counts every call the runtime makes, and may refuse allocations above a
/// budget with a message of its own.
struct Counting {
    sim: SimChip,
    counts: &'static Counts,
    budget: Option<u64>,
}

impl ChipBackend for Counting {
    fn cores(&self) -> usize {
        self.sim.cores()
    }

    fn host_memory(&self) -> Option<&DeviceMemory> {
        self.sim.host_memory()
    }

    fn malloc(&self, nbytes: u64) -> simpler::Result<u64> {
        self.counts.malloc.fetch_add(1, Ordering::SeqCst);
        if self.budget.is_some_and(|b| nbytes > b) {
            return Err(simpler::Error::new(
                ErrorKind::InvalidArgument,
                format!("counting backend: {nbytes} bytes is over budget"),
            ));
        }
        self.sim.malloc(nbytes)
    }

    fn free(&self, ptr: u64) -> simpler::Result<()> {
        self.counts.free.fetch_add(1, Ordering::SeqCst);
        self.sim.free(ptr)
    }

    fn copy_to_device(&self, dst: u64, src: &[u8]) -> simpler::Result<()> {
        self.counts.copy_in.fetch_add(1, Ordering::SeqCst);
        self.counts.bytes_in.fetch_add(src.len(), Ordering::SeqCst);
        self.sim.copy_to_device(dst, src)
    }

    fn copy_from_device(&self, src: u64, dst: &mut [u8]) -> simpler::Result<()> {
        self.counts.copy_out.fetch_add(1, Ordering::SeqCst);
        self.counts.bytes_out.fetch_add(dst.len(), Ordering::SeqCst);
        self.sim.copy_from_device(src, dst)
    }
}

fn counting(spec: &ChipSpec) -> simpler::Result<Box<dyn ChipBackend>> {
    let sim = SimChip::new(spec.memory_bytes(), spec.cores())?;
    Ok(Box::new(Counting { sim, counts: &COUNTS, budget: None }))
}

/// A counting backend that refuses allocations over 1 KiB.
fn counting_1k(spec: &ChipSpec) -> simpler::Result<Box<dyn ChipBackend>> {
    let sim = SimChip::new(spec.memory_bytes(), spec.cores())?;
    Ok(Box::new(Counting { sim, counts: &COUNTS, budget: Some(1024) }))
}

/// A chip orchestration: `t = a + b` into an `orch.alloc` intermediate on the cores, then
/// `out = 2 * t`.
fn add_then_double(orch: &mut Orchestrator<'_>, args: &TaskArgs, _cfg: &CallConfig) -> simpler::Result<()> {
    let (a, b, out) =
        (args.tensor(0).unwrap().clone(), args.tensor(1).unwrap().clone(), args.tensor(2).unwrap().clone());
    let t = orch.alloc(&[16], DataType::Float32)?;
    let vadd = ChipFn::kernel("vadd", vadd).handle();
    let double = ChipFn::kernel("double", double).handle();
    let mut first = TaskArgs::new();
    first.input(&a)?.input(&b)?.output(&t)?;
    orch.submit_next_level(&vadd, first, CallConfig::default(), 0)?;
    let mut second = TaskArgs::new();
    second.input(&t)?.output(&out)?;
    orch.submit_next_level(&double, second, CallConfig::default(), 1)?;
    Ok(())
}

#[isolated_test]
fn every_device_operation_of_an_l2_chip_goes_through_its_backend() {
    let counts = &COUNTS;
    let mut chip = Worker::builder()
        .level(Level::Chip)
        .chip_memory(16 << 20)
        .chip_cores(2)
        .chip_backend(counting)
        .build()
        .unwrap();
    let add = chip.register_chip(ChipFn::kernel("vadd", vadd)).unwrap();
    chip.register_chip(ChipFn::kernel("double", double)).unwrap();
    let orch = chip.register_chip(ChipFn::orchestration("add_then_double", add_then_double)).unwrap();
    chip.init().unwrap();
    assert_eq!(counts.get(), [0; 4], "building the chip moves nothing");

    let (a, b, out) =
        (chip.create_buffer(64).unwrap(), chip.create_buffer(64).unwrap(), chip.create_buffer(64).unwrap());
    a.write(0, &[1.0f32; 16]).unwrap();
    b.write(0, &[2.5f32; 16]).unwrap();
    let t = |x: &simpler::Buffer| x.tensor(&[16], DataType::Float32).unwrap();
    let args = || {
        let mut args = TaskArgs::new();
        args.input(&t(&a)).unwrap().input(&t(&b)).unwrap().output(&t(&out)).unwrap();
        args
    };

    // A kernel over three host tensors: one staging block (three slices), kept for the next
    // runs; two copied in, one copied back.
    chip.run_callable(&add, args(), CallConfig::default()).unwrap();
    assert_eq!(out.read::<f32>(0, 16).unwrap(), vec![3.5f32; 16]);
    assert_eq!(counts.get(), [1, 0, 2, 1], "malloc, free, copies in, copies out");
    assert_eq!(counts.bytes_in.load(Ordering::SeqCst), 128);
    assert_eq!(counts.bytes_out.load(Ordering::SeqCst), 64);

    // A chip orchestration: the same copies through the retained staging block (no new
    // allocation), plus its `orch.alloc` intermediate.
    chip.run_callable(&orch, args(), CallConfig::default()).unwrap();
    assert_eq!(out.read::<f32>(0, 16).unwrap(), vec![7.0f32; 16]);
    assert_eq!(counts.get(), [1 + 1, 1, 2 + 2, 1 + 1]);

    // Chip-resident memory: allocate, copy in, copy out, free.
    let dev = chip.alloc_child_tensor(0, &[16], DataType::Float32).unwrap();
    chip.copy_to(&dev, &a).unwrap();
    chip.copy_from(&out, &dev).unwrap();
    assert_eq!(out.read::<f32>(0, 16).unwrap(), vec![1.0f32; 16]);
    chip.free(&dev).unwrap();
    assert_eq!(counts.get(), [3, 2, 5, 3]);
    drop((a, b, out));
    chip.close().unwrap();
    assert_eq!(counts.get(), [3, 3, 5, 3], "the staging block is freed at close");
}

#[isolated_test]
fn a_strided_host_tensor_moves_packed_through_the_backend_in_one_copy() {
    let counts = &COUNTS;
    let mut chip = Worker::builder()
        .level(Level::Chip)
        .chip_memory(1 << 20)
        .chip_cores(1)
        .chip_backend(counting)
        .build()
        .unwrap();
    let twice = chip.register_chip(ChipFn::kernel("double", double)).unwrap();
    chip.init().unwrap();
    // Column 1 of a 4x4 f32 matrix (4 elements, 16 bytes apart) doubled into column 2 of
    // another, whose other elements keep their sentinel.
    let (m, out) = (chip.create_buffer(64).unwrap(), chip.create_buffer(64).unwrap());
    m.write(0, &(0..16).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
    out.write(0, &[-1.0f32; 16]).unwrap();
    let column = |b: &simpler::Buffer, c: u64| {
        b.view(TensorView::new(4 * c, &[4], Some(&[4]), DataType::Float32).unwrap()).unwrap()
    };
    let mut args = TaskArgs::new();
    args.input(&column(&m, 1)).unwrap().output(&column(&out, 2)).unwrap();
    chip.run_callable(&twice, args, CallConfig::default()).unwrap();
    let want: Vec<f32> = (0..16).map(|i| if i % 4 == 2 { 2.0 * (i - 1) as f32 } else { -1.0 }).collect();
    assert_eq!(out.read::<f32>(0, 16).unwrap(), want, "only the column's elements changed");
    assert_eq!(
        counts.get(),
        [1, 0, 1, 1],
        "one staging block; each strided column gathered (or scattered) on the host and moved in one copy"
    );
    assert_eq!(counts.bytes_in.load(Ordering::SeqCst), 16, "only the column's elements, not its gaps");
    assert_eq!(counts.bytes_out.load(Ordering::SeqCst), 16, "only the column's elements, not its gaps");
    drop((m, out));
    chip.close().unwrap();
}

#[isolated_test]
fn an_l3_chip_child_uses_the_backend_its_factory_makes() {
    let counts = &COUNTS;
    let builder = Worker::builder().chips(2).chip_memory(16 << 20).chip_cores(1).chip_backend(counting_1k);
    let mut rig = common::Rig::new(builder);
    let add = rig.register_chip(ChipFn::kernel("vadd", vadd)).unwrap();
    rig.init();
    // Within the backend's budget the chip works as usual.
    let (a, b, out) =
        (rig.create_buffer(64).unwrap(), rig.create_buffer(64).unwrap(), rig.create_buffer(64).unwrap());
    a.write(0, &[1.0f32; 16]).unwrap();
    b.write(0, &[2.0f32; 16]).unwrap();
    let t = |x: &simpler::Buffer| x.tensor(&[16], DataType::Float32).unwrap();
    let (ta, tb, to) = (t(&a), t(&b), t(&out));
    rig.run(|orch| {
        let mut args = TaskArgs::new();
        args.input(&ta)?.input(&tb)?.output(&to)?;
        orch.submit_next_level(&add, args, CallConfig::default(), 1)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(out.read::<f32>(0, 16).unwrap(), vec![3.0f32; 16]);
    // Over it, the chip child's backend refuses, with its own message, naming the chip.
    let err = rig.alloc_child_tensor(1, &[1024], DataType::Float32).unwrap_err();
    assert!(err.message().contains("over budget") && err.message().contains("chip 1"), "{err}");
    assert_eq!(counts.get(), [0; 4], "the chips' backends live in the chip processes, not here");
    drop((a, b, out));
}

#[isolated_test]
fn a_failing_backend_factory_fails_init_naming_the_chip() {
    let mut chip = Worker::builder()
        .level(Level::Chip)
        .chip_backend(|spec: &ChipSpec| {
            Err(simpler::Error::new(ErrorKind::InvalidArgument, format!("no device {}", spec.chip_id())))
        })
        .build()
        .unwrap();
    let err = chip.init().unwrap_err();
    assert!(err.message().contains("no device 0") && err.message().contains("chip 0"), "{err}");
}
