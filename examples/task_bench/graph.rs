//! The Task Bench graph on simpler: the iteration space, the six dependence patterns, the two
//! kernels, the per-task checks (one function, run as a host function or a chip kernel) and the
//! submission of one graph as one run, on any [`Placement`].
//!
//! Shared by the `task_bench` example (`examples/task_bench.rs`) and its integration test
//! (`tests/task_bench.rs`, through `#[path]`), so the test exercises exactly what the example runs.
//! See `/work/shared/taskbench/SPEC.md` (written from task-bench's `core/`) for the contract.

#![allow(dead_code)] // The example and the test use different parts.

use std::sync::OnceLock;

use simpler::chip::CallConfig;
use simpler::memory::TensorView;
use simpler::{
    Buffer, CallableHandle, DataType, HostArgs, HostFn, HostResult, Orchestrator, TaskArgs, Tensor, Worker,
};

/// A dependence pattern (`-type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// No dependencies at all.
    Trivial,
    /// `{p}`: one chain per point.
    NoComm,
    /// `p-1 ..= p+1`, clipped to the graph (not periodic).
    Stencil1d,
    /// Butterfly: `p - 2^d`, `p`, `p + 2^d` with `d` cycling over `ceil(log2 W)` sets.
    Fft,
    /// `p / 2`, on a graph whose width doubles each step up to `W`.
    Tree,
    /// Every point of the previous step.
    AllToAll,
}

impl Pattern {
    /// Every pattern, in the order of their ids.
    pub const ALL: [Pattern; 6] = [
        Pattern::Trivial,
        Pattern::NoComm,
        Pattern::Stencil1d,
        Pattern::Fft,
        Pattern::Tree,
        Pattern::AllToAll,
    ];

    /// The `-type` name.
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Trivial => "trivial",
            Pattern::NoComm => "no_comm",
            Pattern::Stencil1d => "stencil_1d",
            Pattern::Fft => "fft",
            Pattern::Tree => "tree",
            Pattern::AllToAll => "all_to_all",
        }
    }

    /// The pattern named `name`.
    pub fn parse(name: &str) -> Option<Pattern> {
        Pattern::ALL.into_iter().find(|p| p.name() == name)
    }

    fn id(self) -> u64 {
        Pattern::ALL.iter().position(|&p| p == self).unwrap_or(0) as u64
    }

    fn from_id(id: u64) -> Option<Pattern> {
        Pattern::ALL.get(id as usize).copied()
    }
}

/// A kernel (`-kernel`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Nothing; 0 FLOPs (the checks still run).
    Empty,
    /// 16 independent 4-wide FMA chains, `iter` iterations, then a serial 64-lane product.
    ComputeBound,
}

impl Kernel {
    /// The `-kernel` name.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Empty => "empty",
            Kernel::ComputeBound => "compute_bound",
        }
    }

    /// The kernel named `name`.
    pub fn parse(name: &str) -> Option<Kernel> {
        [Kernel::Empty, Kernel::ComputeBound].into_iter().find(|k| k.name() == name)
    }
}

/// One task graph: `-steps`, `-width`, `-type`, `-kernel`, `-iter`, `-output`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Graph {
    /// Timesteps `T`.
    pub steps: i64,
    /// Maximum width `W`.
    pub width: i64,
    /// Dependence pattern.
    pub pattern: Pattern,
    /// Kernel.
    pub kernel: Kernel,
    /// Kernel iterations per task.
    pub iter: u64,
    /// Bytes each task writes (a multiple of 16, at least 16).
    pub output: u64,
}

impl Default for Graph {
    fn default() -> Self {
        Graph { steps: 4, width: 4, pattern: Pattern::Trivial, kernel: Kernel::Empty, iter: 0, output: 16 }
    }
}

/// The number of scalars a task carries (see [`Graph::task_args`]).
const SCALARS: usize = 9;

impl Graph {
    /// Checks the parameters as the C++ core does (plus what this implementation needs).
    pub fn validate(&self) -> Result<(), String> {
        if self.steps <= 0 {
            return Err(format!("-steps must be > 0 (got {})", self.steps));
        }
        if self.width <= 0 {
            return Err(format!("-width must be > 0 (got {})", self.width));
        }
        if self.output < 16 || !self.output.is_multiple_of(16) {
            return Err(format!("-output must be a multiple of 16 and at least 16 (got {})", self.output));
        }
        if self.pattern == Pattern::Fft && self.width < 2 {
            return Err("-type fft needs -width >= 2 (W = 1 divides by zero in the C++ core)".into());
        }
        if self.output / 8 > u64::from(u32::MAX) {
            return Err(format!("-output {} is too large", self.output));
        }
        Ok(())
    }

    /// First active point at step `t` (0 for these patterns; 0 for `t < 0`).
    pub fn offset_at(&self, _t: i64) -> i64 {
        0
    }

    /// Active points at step `t`: `W`, or `min(W, 2^t)` for `tree`; 0 for `t < 0`.
    pub fn width_at(&self, t: i64) -> i64 {
        if t < 0 {
            return 0;
        }
        match self.pattern {
            Pattern::Tree => self.width.min(1i64 << t.min(62)),
            _ => self.width,
        }
    }

    /// Whether point `p` is active at step `t`.
    pub fn active(&self, t: i64, p: i64) -> bool {
        let off = self.offset_at(t);
        t >= 0 && t < self.steps && off <= p && p < off + self.width_at(t)
    }

    /// The dependence set of step `t` (only `fft` has more than one).
    pub fn dset(&self, t: i64) -> i64 {
        match self.pattern {
            Pattern::Fft => {
                let s = i64::from(64 - ((self.width - 1) as u64).leading_zeros()); // ceil(log2 W)
                (t + s - 1).rem_euclid(s)
            }
            _ => 0,
        }
    }

    /// Calls `f(q)` for each point `q` of step `t - 1` that task `(t, p)` reads, in ascending
    /// order (only points active at `t - 1`; none at `t = 0`).
    pub fn for_each_dep(&self, t: i64, p: i64, mut f: impl FnMut(i64)) {
        if t <= 0 {
            return;
        }
        let (off, w) = (self.offset_at(t - 1), self.width_at(t - 1));
        let mut emit = |q: i64| {
            if off <= q && q < off + w {
                f(q);
            }
        };
        let last = self.width - 1;
        match self.pattern {
            Pattern::Trivial => {}
            Pattern::NoComm => emit(p),
            Pattern::Stencil1d => (0.max(p - 1)..=(p + 1).min(last)).for_each(emit),
            Pattern::Fft => {
                let d = 1i64 << self.dset(t);
                if p - d >= 0 {
                    emit(p - d);
                }
                emit(p);
                if p + d <= last {
                    emit(p + d);
                }
            }
            Pattern::Tree => emit(p / 2),
            Pattern::AllToAll => (0..=last).for_each(emit),
        }
    }

    /// Total tasks: the sum of the active widths.
    pub fn tasks(&self) -> u64 {
        (0..self.steps).map(|t| self.width_at(t) as u64).sum()
    }

    /// Total dependencies: the sum over all tasks of their active inputs.
    pub fn dependencies(&self) -> u64 {
        let mut n = 0u64;
        for t in 0..self.steps {
            let off = self.offset_at(t);
            for p in off..off + self.width_at(t) {
                self.for_each_dep(t, p, |_| n += 1);
            }
        }
        n
    }

    /// FLOPs per task: `128 * iter + 64` for `compute_bound`, 0 for `empty`.
    pub fn flops_per_task(&self) -> u64 {
        match self.kernel {
            Kernel::Empty => 0,
            Kernel::ComputeBound => 128 * self.iter + 64,
        }
    }

    /// Total FLOPs.
    pub fn flops(&self) -> u64 {
        self.tasks() * self.flops_per_task()
    }

    /// The arguments of task `(t, p)`: its output (slot `t % 2` of point `p`), then one input
    /// per dependency in ascending order (slot `(t - 1) % 2`), then the scalars the host
    /// function rebuilds the graph from. `corrupt` makes the task write a wrong record.
    pub fn task_args(&self, slots: &Slots, t: i64, p: i64, corrupt: bool) -> simpler::Result<TaskArgs> {
        let mut args = TaskArgs::new();
        args.output(slots.get(t, p))?;
        let mut deps = Ok(());
        self.for_each_dep(t, p, |q| {
            if deps.is_ok() {
                deps = args.input(slots.get(t - 1, q)).map(|_| ());
            }
        });
        deps?;
        args.scalar(t as u64)
            .scalar(p as u64)
            .scalar(self.steps as u64)
            .scalar(self.width as u64)
            .scalar(self.pattern.id())
            .scalar(u64::from(self.kernel == Kernel::ComputeBound))
            .scalar(self.iter)
            .scalar(self.output)
            .scalar(u64::from(corrupt));
        Ok(args)
    }

    /// Submits every task of the graph, step by step, where `placement` says; `corrupt` names
    /// one task that writes a wrong record (its consumers must then fail the run).
    ///
    /// The placement is matched once, outside the loop: each arm runs the same loop
    /// ([`Graph::each_task`]) with its own submit, so `Placement::Sub` does no more work per
    /// task than a loop of `submit_sub` alone.
    pub fn submit(
        &self,
        orch: &mut Orchestrator<'_>,
        placement: Placement<'_>,
        slots: &Slots,
        corrupt: Option<(i64, i64)>,
    ) -> simpler::Result<()> {
        match placement {
            Placement::Sub { point } => {
                self.each_task(orch, slots, corrupt, |o, _, args| o.submit_sub(point, args).map(|_| ()))
            }
            Placement::Chips { kernel, chips } => self.each_task(orch, slots, corrupt, |o, p, args| {
                o.submit_next_level(kernel, args, CallConfig::default(), p as u32 % chips).map(|_| ())
            }),
            Placement::Workers { orch: step, workers } => {
                self.each_task(orch, slots, corrupt, |o, p, args| {
                    o.submit_next_level(step, args, CallConfig::default(), p as u32 % workers).map(|_| ())
                })
            }
        }
    }

    /// Calls `submit(orch, p, args)` for every task `(t, p)` in order of `t`, then `p`, each
    /// time step in a scope of its own: as a step's scope ends, its tasks may be consumed once
    /// they and their readers are done, so a run of any length holds only the live steps (the
    /// dependencies between steps come from the tensors, across scopes).
    #[inline(always)]
    fn each_task<'a>(
        &self,
        orch: &mut Orchestrator<'a>,
        slots: &Slots,
        corrupt: Option<(i64, i64)>,
        mut submit: impl FnMut(&mut Orchestrator<'a>, i64, TaskArgs) -> simpler::Result<()>,
    ) -> simpler::Result<()> {
        for t in 0..self.steps {
            orch.scope(|orch| {
                let off = self.offset_at(t);
                for p in off..off + self.width_at(t) {
                    submit(orch, p, self.task_args(slots, t, p, corrupt == Some((t, p)))?)?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }
}

/// Where each task of the graph runs (`--workers`), with the handle it is submitted under.
/// Every placement runs [`point`] on the task's own arguments; they differ in what carries it.
#[derive(Clone, Copy, Debug)]
pub enum Placement<'a> {
    /// `point` as a host function on a SUB worker of this Worker (`submit_sub`).
    Sub {
        /// The handle of `HostFn::new("task_bench_point", point)`.
        point: &'a CallableHandle,
    },
    /// `point` as a kernel on chip `p % chips` of this L3 Worker (`submit_next_level`); the
    /// chip copies the task's host tensors in before and its output back after.
    Chips {
        /// The handle of `ChipFn::kernel("task_bench_point", point)`.
        kernel: &'a CallableHandle,
        /// The chips of the Worker.
        chips: u32,
    },
    /// An orchestration function on Worker `p % workers` of this L4 Worker (nested or remote),
    /// which submits `point` to one of its SUB workers with the same arguments
    /// ([`l3_point`]).
    Workers {
        /// The handle of `OrchFn::new("task_bench_l3_point", l3_point)`.
        orch: &'a CallableHandle,
        /// The L3 Workers of the L4 Worker.
        workers: u32,
    },
}

/// The orchestration function of the L4 placements: runs on an L3 Worker as a run of its own
/// and submits [`point`] to one of its SUB workers with the task's arguments as they came.
pub fn l3_point(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> simpler::Result<()> {
    static POINT: OnceLock<CallableHandle> = OnceLock::new();
    let handle = POINT.get_or_init(|| HostFn::new("task_bench_point", point).handle());
    orch.submit_sub(handle, args.clone()).map(|_| ())
}

/// Two generations of output per point, in one shared buffer: step `t` writes slot `t % 2`,
/// so the write of `(t, p)` is ordered after every reader of `(t - 2, p)` (write after read),
/// as in the OpenMP and StarPU versions with `-field 2`.
pub struct Slots {
    /// The buffer that holds every slot (kept alive with the tensors).
    pub buffer: Buffer,
    tensors: [Vec<Tensor>; 2],
}

impl Slots {
    /// Allocates `2 * W` outputs of `-output` bytes each, as `i64` tensors.
    pub fn new(worker: &Worker, graph: &Graph) -> simpler::Result<Slots> {
        let (w, b) = (graph.width as usize, graph.output);
        let buffer = worker.create_buffer(2 * w * b as usize)?;
        let mut tensors = [Vec::with_capacity(w), Vec::with_capacity(w)];
        for (slot, list) in tensors.iter_mut().enumerate() {
            for p in 0..w {
                let offset = (slot * w + p) as u64 * b;
                list.push(buffer.view(TensorView::new(offset, &[(b / 8) as u32], None, DataType::Int64)?)?);
            }
        }
        Ok(Slots { buffer, tensors })
    }

    /// The output of point `p` at step `t`.
    pub fn get(&self, t: i64, p: i64) -> &Tensor {
        &self.tensors[t.rem_euclid(2) as usize][p as usize]
    }
}

/// The host function of every task: `execute_point` of the C++ core. Checks `(t, p)`, checks
/// every input record against `(t - 1, q)`, fills the output with `(t, p)` and runs the kernel.
/// Any mismatch fails the task (and so the run).
pub fn point(args: &HostArgs<'_>) -> HostResult {
    let s = args.scalars();
    if s.len() != SCALARS {
        return Err(format!("task_bench point: {} scalars, expected {SCALARS}", s.len()).into());
    }
    let (t, p) = (s[0] as i64, s[1] as i64);
    let pattern = Pattern::from_id(s[4]).ok_or_else(|| format!("unknown pattern id {}", s[4]))?;
    let kernel = if s[5] == 1 { Kernel::ComputeBound } else { Kernel::Empty };
    let graph = Graph { steps: s[2] as i64, width: s[3] as i64, pattern, kernel, iter: s[6], output: s[7] };
    let corrupt = s[8] != 0;

    // 1. The point exists.
    if !graph.active(t, p) {
        return Err(format!("task ({t}, {p}) is not in the graph").into());
    }
    // 2. Every active input holds B/16 records of (t - 1, q).
    let records = (graph.output / 16) as usize;
    let mut next = 1;
    let mut bad: Option<String> = None;
    graph.for_each_dep(t, p, |q| {
        if bad.is_some() {
            return;
        }
        let input = match args.input::<i64>(next) {
            Ok(x) => x,
            Err(e) => {
                bad = Some(format!("task ({t}, {p}): input {next} (point {q}): {e}"));
                return;
            }
        };
        next += 1;
        if input.len() != 2 * records {
            bad = Some(format!(
                "task ({t}, {p}): input from point {q} has {} bytes, expected {}",
                8 * input.len(),
                graph.output
            ));
            return;
        }
        if let Some(r) = input.chunks_exact(2).position(|r| r[0] != t - 1 || r[1] != q) {
            let got = &input[2 * r..2 * r + 2];
            bad = Some(format!(
                "task ({t}, {p}): input from point {q}, record {r}: got ({}, {}), expected ({}, {q})",
                got[0],
                got[1],
                t - 1
            ));
        }
    });
    if let Some(msg) = bad {
        return Err(msg.into());
    }
    // 3. The output: B/16 records of (t, p).
    let out = args.output::<i64>(0)?;
    if out.len() != 2 * records {
        return Err(format!(
            "task ({t}, {p}): output has {} bytes, expected {}",
            8 * out.len(),
            graph.output
        )
        .into());
    }
    let written = if corrupt { p ^ 0x5a5a } else { p };
    for r in out.chunks_exact_mut(2) {
        r[0] = t;
        r[1] = written;
    }
    // 4. No scratch (`-scratch 0`). 5. The kernel.
    if kernel == Kernel::ComputeBound {
        std::hint::black_box(compute_bound(graph.iter));
    }
    Ok(())
}

/// The `compute_bound` kernel: 16 independent chains of `A = A * A + A` over 4 doubles each
/// (lanes 4, 3, 2, 1), `iter` iterations, then the product of all 64 lanes in lane order (a
/// serial chain of 64 multiplies). 256-bit FMAs where the CPU has AVX2 and FMA, as the reference
/// build; plain doubles (`1.2345`) otherwise, as its fallback.
pub fn compute_bound(iter: u64) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        return avx2::compute_bound(iter);
    }
    let mut a = [std::hint::black_box(1.2345f64); 64];
    for _ in 0..iter {
        for v in &mut a {
            *v = *v * *v + *v;
        }
    }
    product(&a)
}

/// `dot = 1; dot *= lane` over the lanes in order.
fn product(lanes: &[f64; 64]) -> f64 {
    let mut dot = 1.0;
    for &v in lanes {
        dot *= v;
    }
    dot
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // Intrinsics behind a run-time CPU feature check; see the SAFETY comments.
mod avx2 {
    use std::arch::x86_64::{__m256d, _mm256_fmadd_pd, _mm256_set_pd, _mm256_storeu_pd};

    /// Call only where the CPU has AVX2 and FMA.
    pub(super) fn compute_bound(iter: u64) -> f64 {
        // SAFETY: the caller checked at run time that the CPU supports AVX2 and FMA.
        unsafe { chains(iter) }
    }

    #[target_feature(enable = "avx2,fma")]
    fn chains(iter: u64) -> f64 {
        // _mm256_set_pd takes the highest lane first: lane 0 is 4.0.
        let init = _mm256_set_pd(1.0, 2.0, 3.0, std::hint::black_box(4.0));
        let mut a: [__m256d; 16] = [init; 16];
        for _ in 0..iter {
            for v in &mut a {
                *v = _mm256_fmadd_pd(*v, *v, *v);
            }
        }
        let mut lanes = [0.0f64; 64];
        for (i, v) in a.iter().enumerate() {
            let dst = &mut lanes[4 * i..4 * i + 4];
            // SAFETY: `dst` is 4 writable f64s; storeu needs no alignment.
            unsafe { _mm256_storeu_pd(dst.as_mut_ptr(), *v) };
        }
        super::product(&lanes)
    }
}
