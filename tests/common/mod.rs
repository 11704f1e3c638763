//! Shared helpers of the integration suites.
//!
//! * [`Rig`]: a [`Worker`] that, when it drops at the end of a test, closes the Worker and checks
//!   that it left nothing behind: every child process it forked is gone (reaped, not a zombie),
//!   every process below them (under nested Workers) has died, and no host buffer of any of
//!   them, or of this process, remains: no process holds or maps its memfd
//!   (`/memfd:sp-<8 hex>-<pid>-b<N>`), and no `/dev/shm/sp-*-<pid>-*` name (what earlier
//!   versions made) exists. Declare it first in a test so every
//!   buffer, tensor and run handle of the test drops before it. When the test panics it only
//!   closes the Worker (which reaps the children), so a failure is never hidden by a second panic.
//! * Host functions used by several suites, and helpers to build tensors and check errors.
//! * [`words`]: atomics over a `u32` tensor, so host functions in different worker processes can
//!   count, rendezvous and log through one shared scratch buffer (tagged `NoDep`).
//!
//! Every test that builds a Worker is an `#[isolated_test]`
//! ([`simpler::test_support::isolated_test`], re-exported here) rather than a `#[test]`: it
//! forks, and the rig's checks count this process's buffers, so it must run alone in its
//! process. Under `cargo nextest` it already does; under `cargo test` its guard
//! (`simpler::test_support::in_own_process`) reruns the test binary for that one test.

#![expect(
    unsafe_code,
    reason = "`words`: atomics over shared memory; `fork_process`: fork(2), pidfd_open(2) and waitpid(2); `exit_this_thread`, `exit_process`: exit(2), _exit(2); see their SAFETY comments"
)]
#![allow(dead_code)] // Every suite compiles this module and uses a different part of it.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use simpler::test_support::isolated_test;
use simpler::{
    Buffer, CallableHandle, DataType, Error, ErrorKind, HostArgs, HostFn, HostResult, Tensor, Worker,
    WorkerBuilder, callable::HostFnPtr, chip::ChipFn, chip::KernelSource, memory::TensorView,
};

// ------------------------------------------------------------------------------------------ rig

/// A Worker that checks, when it drops, that the test left no process and no shm object behind.
pub struct Rig {
    worker: Worker,
    pids: Vec<i32>,
    /// The processes below the children after `init` (under nested Workers).
    grandchildren: Vec<i32>,
}

impl Rig {
    /// An uninitialized Worker from `builder`.
    pub fn new(builder: WorkerBuilder) -> Rig {
        Rig {
            worker: builder.build().expect("WorkerBuilder::build"),
            pids: Vec::new(),
            grandchildren: Vec::new(),
        }
    }

    /// A Worker from `builder` with the functions `fns` registered (by name), initialized.
    pub fn start<const N: usize>(
        builder: WorkerBuilder,
        fns: [(&str, HostFnPtr); N],
    ) -> (Rig, [CallableHandle; N]) {
        let mut rig = Rig::new(builder);
        let handles = fns.map(|(name, f)| rig.worker.register(HostFn::new(name, f)).expect("register"));
        rig.init();
        (rig, handles)
    }

    /// `Worker::init`, then records the child pids for the final check.
    pub fn init(&mut self) {
        self.worker.init().expect("Worker::init");
        self.pids = self.worker.child_pids();
        assert_eq!(
            self.pids.len(),
            self.worker.sub_workers() + self.worker.chips() + self.worker.nested_workers(),
            "one child process per SUB worker and chip"
        );
        for &pid in &self.pids {
            assert!(process_exists(pid), "child {pid} should be running after init");
        }
        // A nested Worker has built its whole subtree before it reported ready.
        self.grandchildren = self.pids.iter().flat_map(|&pid| descendants(pid).into_iter().skip(1)).collect();
    }

    /// The child pids recorded at `init` (they stay recorded after `close`).
    pub fn pids(&self) -> &[i32] {
        &self.pids
    }
}

impl Deref for Rig {
    type Target = Worker;
    fn deref(&self) -> &Worker {
        &self.worker
    }
}

impl DerefMut for Rig {
    fn deref_mut(&mut self) -> &mut Worker {
        &mut self.worker
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let closed = self.worker.close();
        if std::thread::panicking() {
            return; // the Worker is closed (children reaped); do not hide the test's failure
        }
        if let Err(e) = closed {
            panic!("Worker::close at the end of the test failed: {e:?}");
        }
        assert!(!self.worker.is_ready(), "a closed Worker is not ready");
        assert!(self.worker.child_pids().is_empty(), "a closed Worker lists no children");
        // The processes below the children first: until they have died, they may still map a
        // buffer of this process.
        assert_descendants_dead(&self.grandchildren);
        assert_left_nothing(&self.pids);
    }
}

/// `pid` and every process below it (from `/proc/<pid>/task/*/children`), parents first.
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut out = vec![pid];
    let mut next = 0;
    while next < out.len() {
        let at = out[next];
        next += 1;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{at}/task")) else { continue };
        for task in tasks.filter_map(|t| t.ok()) {
            let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            out.extend(children.split_whitespace().filter_map(|c| c.parse::<i32>().ok()));
        }
    }
    out
}

/// Asserts that the processes `pids` below our children have died and left no shm buffer. A
/// grandchild whose parent was killed is reaped by init, not by us, so it may stay a zombie a
/// little while: dead is enough here (our own children must be reaped, see
/// [`assert_left_nothing`]).
#[track_caller]
pub fn assert_descendants_dead(pids: &[i32]) {
    let alive = || pids.iter().copied().filter(|&p| process_alive(p)).collect::<Vec<i32>>();
    wait_for("processes below the Worker's children to die", Duration::from_secs(10), || alive().is_empty());
    let left: Vec<String> = pids.iter().flat_map(|&p| shm_of(p)).collect();
    assert!(left.is_empty(), "shared-memory buffers left behind: {left:?}");
}

/// True while `pid` names a process that has not exited (a zombie has).
pub fn process_alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state is the first field after the parenthesized command name.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|s| s != "Z" && s != "X")
}

/// Asserts that every process in `pids` is gone (reaped) and that no host buffer of this
/// process or of any of them is left: no process holds or maps one, and no `/dev/shm` name of
/// one exists.
#[track_caller]
pub fn assert_left_nothing(pids: &[i32]) {
    let alive: Vec<i32> = pids.iter().copied().filter(|&p| process_exists(p)).collect();
    assert!(alive.is_empty(), "child processes {alive:?} outlived their Worker");
    let mut left = shm_of(std::process::id() as i32);
    for &pid in pids {
        left.extend(shm_of(pid));
    }
    assert!(left.is_empty(), "shared-memory buffers left behind: {left:?}");
}

/// True while `pid` names a process (also a zombie: it must have been reaped to be gone).
pub fn process_exists(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 sends nothing; it only checks that the pid exists.
    let rc = unsafe { libc::kill(pid, 0) };
    if rc == 0 {
        return true;
    }
    let errno = std::io::Error::last_os_error().raw_os_error();
    assert_eq!(errno, Some(libc::ESRCH), "kill({pid}, 0) failed with an unexpected error");
    false
}

/// Sends `sig` to `pid` (to the process group `-pid` when `pid` is negative); false when
/// `kill(2)` fails (no such process).
pub fn send_signal(pid: i32, sig: i32) -> bool {
    // SAFETY: kill(2) on a process or group this test started; no memory is involved.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// Sets this process's soft and hard limits on open file descriptors to `n` (irreversible: for
/// a test that runs alone in its process).
pub fn limit_fds(n: u64) {
    let lim = libc::rlimit { rlim_cur: n, rlim_max: n };
    // SAFETY: setrlimit(2) reads the struct passed by reference, alive for the call.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    assert_eq!(rc, 0, "setrlimit(RLIMIT_NOFILE, {n}): {}", std::io::Error::last_os_error());
}

/// Sends SIGKILL to `pid`.
pub fn sigkill(pid: i32) {
    // SAFETY: kill(2) on a pid this test forked (through the Worker); no memory is involved.
    let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(rc, 0, "kill({pid}, SIGKILL): {}", std::io::Error::last_os_error());
}

/// The host buffers of this process that are alive: the memfds it made and still holds a
/// descriptor of (one per buffer, by name), and any `/dev/shm` name of it (what earlier
/// versions made). A buffer a worker process still maps after its last clone dropped is not
/// alive (see [`shm_of`] for that).
pub fn leftover_shm() -> Vec<String> {
    let me = std::process::id() as i32;
    let mut out: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .map(|fds| {
            fds.filter_map(|e| e.ok())
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .filter_map(|t| memfd_label(&t.to_string_lossy()))
                .filter(|label| buffer_creator(label) == Some(me))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out.dedup();
    out.extend(legacy_names_of(me));
    out
}

/// The host buffers process `pid` made that anything still holds: every live process that holds
/// or maps one of its memfds (as `"<holder pid>:<label>"`, see [`memfd_users`]), and the
/// `/dev/shm` names (what earlier versions made) named like its buffers.
pub fn shm_of(pid: i32) -> Vec<String> {
    let mut out: Vec<String> = memfd_users()
        .into_iter()
        .filter(|(_, label)| buffer_creator(label) == Some(pid))
        .map(|(holder, label)| format!("{holder}:{label}"))
        .collect();
    out.extend(legacy_names_of(pid));
    out
}

/// The `/dev/shm` names of process `pid`'s buffers (what earlier versions made).
fn legacy_names_of(pid: i32) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return out };
    out.extend(
        dir.filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| buffer_creator(name) == Some(pid)),
    );
    out
}

/// The creator's pid in a host buffer's name `sp-<8 hex>-<pid>-b<N>`.
pub fn buffer_creator(name: &str) -> Option<i32> {
    let parts: Vec<&str> = name.split('-').collect();
    let ok = parts.len() == 4
        && parts[0] == "sp"
        && parts[1].len() == 8
        && parts[1].bytes().all(|b| b.is_ascii_hexdigit())
        && parts[3].strip_prefix('b').is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if ok { parts[2].parse().ok() } else { None }
}

/// The label of a memfd in a `/proc/*/fd` link or a `/proc/*/maps` line: the kernel shows it
/// as `/memfd:<label> (deleted)`.
pub fn memfd_label(s: &str) -> Option<String> {
    let rest = &s[s.find("/memfd:")? + "/memfd:".len()..];
    Some(rest.strip_suffix(" (deleted)").unwrap_or(rest).to_string())
}

/// Every (live process, memfd label) where the process holds a descriptor of the memfd or maps
/// it, from `/proc/*/fd` and `/proc/*/maps` (processes this user cannot inspect are skipped).
pub fn memfd_users() -> Vec<(i32, String)> {
    let label = memfd_label;
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else { return out };
    for p in procs.filter_map(|e| e.ok()) {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let mut labels: Vec<String> = Vec::new();
        if let Ok(fds) = std::fs::read_dir(p.path().join("fd")) {
            for fd in fds.filter_map(|e| e.ok()) {
                if let Some(l) = std::fs::read_link(fd.path()).ok().and_then(|t| label(&t.to_string_lossy()))
                {
                    labels.push(l);
                }
            }
        }
        let maps = std::fs::read_to_string(p.path().join("maps")).unwrap_or_default();
        labels.extend(maps.lines().filter_map(label));
        labels.sort();
        labels.dedup();
        out.extend(labels.into_iter().map(|l| (pid, l)));
    }
    out
}

// -------------------------------------------------------------------------- builders & checks

/// `Worker::builder()` with this suite's chip backend. The chip suites are compiled again as
/// `<suite>_discrete` and `<suite>_opencl` (see `tests/Cargo.toml`): the first runs every chip
/// on a [`DiscreteSim`](simpler::chip::DiscreteSim), whose memory the host cannot read, so the
/// same tests check that nothing reaches device memory but through the backend's copies; the
/// second on an OpenCL device (feature `opencl`; CI runs it on PoCL), kernels from their OpenCL
/// C source. The others use the default `SimChip`. A test that sets a backend of its own keeps
/// it.
pub fn builder() -> WorkerBuilder {
    let builder = Worker::builder();
    #[cfg(feature = "opencl")]
    if on_opencl_chips() {
        return builder.chip_backend(simpler::chip::OpenClChip::backend);
    }
    if on_discrete_chips() { builder.chip_backend(simpler::chip::DiscreteSim::backend) } else { builder }
}

/// Whether this suite runs its chips on `DiscreteSim` (see [`builder`]).
pub fn on_discrete_chips() -> bool {
    env!("CARGO_CRATE_NAME").ends_with("_discrete")
}

/// Whether this suite runs its chips on an OpenCL device (see [`builder`]).
pub fn on_opencl_chips() -> bool {
    env!("CARGO_CRATE_NAME").ends_with("_opencl")
}

/// True, after saying why, when this suite runs on OpenCL chips and the test's kernels are
/// ones only Rust can write (they fail with a message, panic, or wait on the test): the test
/// returns at once there, and runs on the simulated chips.
#[must_use]
pub fn needs_rust_kernels() -> bool {
    let skip = on_opencl_chips();
    if skip {
        eprintln!(
            "not on an OpenCL chip: this test's kernels fail, block or wait on the test, which only Rust kernels do"
        );
    }
    skip
}

/// `common::vadd` as a chip kernel, with its OpenCL C source (`tests/kernels/vadd.cl`).
pub fn vadd_kernel() -> ChipFn {
    ChipFn::kernel("vadd", vadd)
        .with_source(KernelSource::opencl(include_str!("../kernels/vadd.cl"), "vadd"))
        .expect("a kernel")
}

/// `common::double` as a chip kernel, with its OpenCL C source (`tests/kernels/double.cl`).
pub fn double_kernel() -> ChipFn {
    ChipFn::kernel("double", double)
        .with_source(KernelSource::opencl(include_str!("../kernels/double.cl"), "double_it"))
        .expect("a kernel")
}

/// A builder with `n` SUB workers and a short back-pressure timeout (tests must not hang).
pub fn subs(n: usize) -> WorkerBuilder {
    Worker::builder().sub_workers(n).backpressure_timeout(Duration::from_secs(5))
}

/// A zeroed host buffer of `n` `u64` elements.
pub fn u64_buffer(w: &Worker, n: usize) -> Buffer {
    let b = w.create_buffer(n * 8).expect("create_buffer");
    b.write(0, &vec![0u64; n]).expect("zero buffer");
    b
}

/// A zeroed host buffer of `n` `u32` words (scratch for counters, flags and logs).
pub fn u32_buffer(w: &Worker, n: usize) -> Buffer {
    let b = w.create_buffer(n * 4).expect("create_buffer");
    b.write(0, &vec![0u32; n]).expect("zero buffer");
    b
}

/// Elements `[start, start + len)` of a `u64` buffer as a contiguous 1-D tensor.
pub fn u64s(b: &Buffer, start: usize, len: usize) -> Tensor {
    b.view(TensorView::new(8 * start as u64, &[len as u32], None, DataType::Uint64).expect("view"))
        .expect("tensor")
}

/// The whole `u32` buffer as a 1-D tensor.
pub fn words_of(b: &Buffer) -> Tensor {
    b.tensor(&[(b.nbytes() / 4) as u32], DataType::Uint32).expect("tensor")
}

pub fn read_u64(b: &Buffer, start: usize, len: usize) -> Vec<u64> {
    b.read::<u64>(start, len).expect("read")
}

pub fn read_u32(b: &Buffer, start: usize, len: usize) -> Vec<u32> {
    b.read::<u32>(start, len).expect("read")
}

/// Asserts `err` is of `kind` and its message contains every needle.
#[track_caller]
pub fn assert_err(err: &Error, kind: ErrorKind, needles: &[&str]) {
    assert_eq!(err.kind(), kind, "wrong error kind: {err:?}");
    for n in needles {
        assert!(err.message().contains(n), "error message should mention {n:?}: {err:?}");
    }
}

/// Unwraps the error of `r` and checks it as [`assert_err`].
#[track_caller]
pub fn expect_err<T: std::fmt::Debug>(r: simpler::Result<T>, kind: ErrorKind, needles: &[&str]) -> Error {
    match r {
        Ok(v) => panic!("expected a {kind} error mentioning {needles:?}, got Ok({v:?})"),
        Err(e) => {
            assert_err(&e, kind, needles);
            e
        }
    }
}

/// Waits (polling, yielding) until `cond` holds; panics naming `what` after `timeout`.
#[track_caller]
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::yield_now();
    }
}

// ------------------------------------------------------------------ host-function building blocks

/// Tensor `i` (a contiguous `u32` tensor, tagged `NoDep`, `InOut` or `Output`) as atomics.
pub fn words<'a>(
    args: &'a HostArgs<'_>,
    i: usize,
) -> Result<&'a [AtomicU32], Box<dyn std::error::Error + Send + Sync>> {
    let w: &'a mut [u32] = args.output::<u32>(i)?;
    let ptr = w.as_mut_ptr();
    if !(ptr as usize).is_multiple_of(align_of::<AtomicU32>()) {
        return Err(format!("tensor {i} is not aligned for atomics").into());
    }
    // SAFETY: `AtomicU32` has the size and bit validity of `u32`, and `ptr` is aligned for it
    // (checked above). The exclusive borrow `w` is given up here, so no other reference of this
    // process aliases the words for `'a` (HostArgs hands tensor `i` out once per call). Other
    // processes touch these bytes concurrently: workers only through this same atomic view,
    // the test process by copying whole words (`Buffer::read`/`write`) to poll and set flags.
    Ok(unsafe { std::slice::from_raw_parts(ptr.cast::<AtomicU32>(), w.len()) })
}

/// Yields until `cond` holds (true) or `deadline` passes (false).
pub fn spin_until(deadline: Instant, mut cond: impl FnMut() -> bool) -> bool {
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::yield_now();
    }
}

fn after_ms(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

fn after_us(us: u64) -> Instant {
    Instant::now() + Duration::from_micros(us)
}

// --------------------------------------------------------------------------- host functions

/// Does nothing.
pub fn noop(_args: &HostArgs<'_>) -> HostResult {
    Ok(())
}

/// `t0[..] = s0` (tensor 0: `u64`, writable).
pub fn fill(args: &HostArgs<'_>) -> HostResult {
    let v = args.scalar(0)?;
    args.output::<u64>(0)?.fill(v);
    Ok(())
}

/// `t1[i] = t0[i] * s0 + s1` (wrapping; `u64`).
pub fn affine(args: &HostArgs<'_>) -> HostResult {
    let (mul, add) = (args.scalar(0)?, args.scalar(1)?);
    let x = args.input::<u64>(0)?;
    let y = args.output::<u64>(1)?;
    if x.len() != y.len() {
        return Err(format!("affine: input has {} elements, output {}", x.len(), y.len()).into());
    }
    for (o, i) in y.iter_mut().zip(x) {
        *o = i.wrapping_mul(mul).wrapping_add(add);
    }
    Ok(())
}

/// `last[i] = sum of every earlier tensor's [i]` (`u64`).
pub fn sum(args: &HostArgs<'_>) -> HostResult {
    let n = args.tensor_count();
    let out = args.output::<u64>(n - 1)?;
    out.fill(0);
    for k in 0..n - 1 {
        for (o, v) in out.iter_mut().zip(args.input::<u64>(k)?) {
            *o = o.wrapping_add(*v);
        }
    }
    Ok(())
}

/// Probe for mutual exclusion. Tensor 0: scratch words `[active, max_active]` (`NoDep`).
/// Scalars: `hold_us`, then optionally `op` and `value` applied to tensor 1 (`u64`):
/// op 1 = set every element to `value` (`Output` is enough), op 2 = `x = x * 10 + value`
/// (`InOut`).
///
/// On entry it counts itself active and records the maximum; then it holds for `hold_us`, or
/// until it sees another probe active (an overlap, already recorded), applies the op, and leaves.
pub fn exclusive(args: &HostArgs<'_>) -> HostResult {
    let w = words(args, 0)?;
    let hold = args.scalar(0)?;
    let now = w[0].fetch_add(1, Ordering::SeqCst) + 1;
    w[1].fetch_max(now, Ordering::SeqCst);
    spin_until(after_us(hold), || w[0].load(Ordering::SeqCst) > 1);
    let op = args.scalars().get(1).copied().unwrap_or(0);
    let value = args.scalars().get(2).copied().unwrap_or(0);
    match op {
        0 => {}
        1 => args.output::<u64>(1)?.fill(value),
        2 => {
            for x in args.output::<u64>(1)? {
                *x = x.wrapping_mul(10).wrapping_add(value);
            }
        }
        other => return Err(format!("exclusive: unknown op {other}").into()),
    }
    w[0].fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

/// Rendezvous. Tensor 0: scratch words `[arrived]` (`NoDep`). Scalars: `parties`, `timeout_ms`,
/// and optionally `value`, written to every element of tensor 1 (`u64`) once all arrived
/// (without it, tensor 1 and later are only named, never touched).
/// Fails when the others do not all arrive in time (they cannot be running at once).
pub fn rendezvous(args: &HostArgs<'_>) -> HostResult {
    let w = words(args, 0)?;
    let (parties, timeout) = (args.scalar(0)?, args.scalar(1)?);
    w[0].fetch_add(1, Ordering::SeqCst);
    if !spin_until(after_ms(timeout), || u64::from(w[0].load(Ordering::SeqCst)) >= parties) {
        return Err(format!(
            "rendezvous: only {} of {parties} tasks arrived within {timeout} ms",
            w[0].load(Ordering::SeqCst)
        )
        .into());
    }
    if let Some(&value) = args.scalars().get(2) {
        args.output::<u64>(1)?.fill(value);
    }
    Ok(())
}

/// Group member probe. Tensor 0: scratch words `[arrived]` (`NoDep`); tensor 1: one `u32`
/// (writable) that receives this member's worker index. Scalars: `parties`, `timeout_ms`,
/// `hold_us` (held after the rendezvous, before writing the index).
pub fn member(args: &HostArgs<'_>) -> HostResult {
    let w = words(args, 0)?;
    let (parties, timeout, hold) = (args.scalar(0)?, args.scalar(1)?, args.scalar(2)?);
    w[0].fetch_add(1, Ordering::SeqCst);
    if !spin_until(after_ms(timeout), || u64::from(w[0].load(Ordering::SeqCst)) >= parties) {
        return Err(format!(
            "member on worker {}: only {} of {parties} members arrived within {timeout} ms",
            args.worker_index(),
            w[0].load(Ordering::SeqCst)
        )
        .into());
    }
    spin_until(after_us(hold), || false);
    args.output::<u32>(1)?[0] = args.worker_index();
    Ok(())
}

/// `t0[0] = worker index` (tensor 0: one writable `u32`).
pub fn record_worker(args: &HostArgs<'_>) -> HostResult {
    args.output::<u32>(0)?[0] = args.worker_index();
    Ok(())
}

/// Appends `s0` to a shared log. Tensor 0: scratch words `[arrivals, len, entries...]` (`NoDep`).
/// Scalar 1 (`hold_us`, optional): before appending, hold until another task arrives or the time
/// passes, so a task that wrongly runs alongside this one appends first.
pub fn log_append(args: &HostArgs<'_>) -> HostResult {
    let w = words(args, 0)?;
    let id = u32::try_from(args.scalar(0)?)?;
    let hold = args.scalars().get(1).copied().unwrap_or(0);
    let me = w[0].fetch_add(1, Ordering::SeqCst) + 1;
    spin_until(after_us(hold), || w[0].load(Ordering::SeqCst) != me);
    let at = w[1].fetch_add(1, Ordering::SeqCst) as usize;
    let slot = w.get(2 + at).ok_or("log_append: the log is full")?;
    slot.store(id, Ordering::SeqCst);
    Ok(())
}

/// Always fails with `boom <s0>`.
pub fn fail(args: &HostArgs<'_>) -> HostResult {
    Err(format!("boom {}", args.scalar(0)?).into())
}

/// Always panics with `kaboom <s0>`.
pub fn panics(args: &HostArgs<'_>) -> HostResult {
    panic!("kaboom {}", args.scalar(0)?);
}

/// Tells the test it runs, then blocks until released. Tensor 0: scratch words
/// `[pid, release]` (`NoDep`). Writes its process id to word 0, then waits until word 1 is not
/// zero; fails after scalar 0 milliseconds. Optionally then writes `s1` to tensor 1 (`u64`).
pub fn block_on_flag(args: &HostArgs<'_>) -> HostResult {
    let w = words(args, 0)?;
    let timeout = args.scalar(0)?;
    w[0].store(std::process::id(), Ordering::SeqCst);
    if !spin_until(after_ms(timeout), || w[1].load(Ordering::SeqCst) != 0) {
        return Err(format!("block_on_flag: not released within {timeout} ms").into());
    }
    if args.tensor_count() > 1 {
        args.output::<u64>(1)?.fill(args.scalar(1)?);
    }
    Ok(())
}

/// Fails with `boom <s0>` once released ([`release`]): tensor 0 is scratch words
/// `[_, release]` (`NoDep`). A test that must submit tasks after it before it fails (a task that
/// depends on it, to see it not run) releases it then.
pub fn fail_once_released(args: &HostArgs<'_>) -> HostResult {
    let w = words(args, 0)?;
    if !spin_until(after_ms(10_000), || w[1].load(Ordering::SeqCst) != 0) {
        return Err("fail_once_released: not released within 10 s".into());
    }
    Err(format!("boom {}", args.scalar(0)?).into())
}

/// Releases [`block_on_flag`]: sets word 1 of tensor 0 (`NoDep`).
pub fn release_flag(args: &HostArgs<'_>) -> HostResult {
    words(args, 0)?[1].store(1, Ordering::SeqCst);
    Ok(())
}

/// From the test: waits until a [`block_on_flag`] task runs; returns its process id.
pub fn wait_blocked(flag: &Buffer) -> i32 {
    let mut pid = 0;
    wait_for("the blocking task to start", Duration::from_secs(10), || {
        pid = read_u32(flag, 0, 1)[0];
        pid != 0
    });
    pid as i32
}

/// From the test: releases every [`block_on_flag`] task waiting on `flag`.
pub fn release(flag: &Buffer) {
    flag.write(1, &[1u32]).expect("set the release flag");
}

/// Copies the `u32` words of tensor 0 (readable: `Input`, `InOut` or `NoDep`) into tensor 1
/// (`u32`, writable): what tensor 0 held when this task ran.
pub fn snapshot(args: &HostArgs<'_>) -> HostResult {
    let src = args.input::<u32>(0)?;
    let dst = args.output::<u32>(1)?;
    if src.len() != dst.len() {
        return Err(format!("snapshot: {} words into {}", src.len(), dst.len()).into());
    }
    dst.copy_from_slice(src);
    Ok(())
}

// -------------------------------------------------------------------------- chip kernels (f32)

/// `out[i] = a[i] + b[i]` (tensors 0, 1 in; 2 out).
pub fn vadd(args: &HostArgs<'_>) -> HostResult {
    let (a, b, out) = (args.input::<f32>(0)?, args.input::<f32>(1)?, args.output::<f32>(2)?);
    for i in 0..out.len() {
        out[i] = a[i] + b[i];
    }
    Ok(())
}

/// `out[i] = 2 * x[i]` (tensor 0 in, 1 out).
pub fn double(args: &HostArgs<'_>) -> HostResult {
    let (x, out) = (args.input::<f32>(0)?, args.output::<f32>(1)?);
    for i in 0..out.len() {
        out[i] = 2.0 * x[i];
    }
    Ok(())
}

/// Fails with "kernel says no".
pub fn fail_kernel(_: &HostArgs<'_>) -> HostResult {
    Err("kernel says no".into())
}

// -------------------------------------------------------------------------------- orchestrate

/// Adds a tensor tagged `NoDep` (untracked) for the tests' scratch state.
pub trait Untracked {
    /// `TaskArgs::no_dep` for tensors the tests touch only through [`words`] atomics, or from
    /// tasks they order by other means (flags, explicit dependencies).
    fn untracked(&mut self, t: &simpler::Tensor) -> simpler::Result<&mut simpler::TaskArgs>;
}

impl Untracked for simpler::TaskArgs {
    fn untracked(&mut self, t: &simpler::Tensor) -> simpler::Result<&mut simpler::TaskArgs> {
        // SAFETY: the tests' NoDep tensors are scratch words every task reads and writes only
        // through `words` (atomics), or data whose tasks the test orders itself.
        unsafe { self.no_dep(t) }
    }
}

// ------------------------------------------------------------------------------------- forking

/// Forks this process; the child runs `body` (a panic counts as exit code 101) and exits with
/// its code at once, running no destructor of what it inherited. Returns the child's pid; reap
/// it with [`wait_process`].
pub fn fork_process(body: impl FnOnce() -> i32) -> i32 {
    // SAFETY: fork(2) has no preconditions; the child below only runs `body` and `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(101);
        // SAFETY: `_exit` ends this forked child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    pid
}

/// Ends the calling thread only, with the raw `exit` system call: as `pthread_exit` from
/// `main` does, the thread ends and the process lives on while another thread runs, but
/// nothing unwinds through Rust frames. The caller must hold no lock another thread needs.
pub fn exit_this_thread() -> ! {
    // SAFETY: exit(2) ends this thread and returns no memory; the caller holds no lock.
    unsafe { libc::syscall(libc::SYS_exit, 0) };
    unreachable!("exit(2) returned")
}

/// Ends this (forked) process, all its threads, with `code`, running no destructor.
pub fn exit_process(code: i32) -> ! {
    // SAFETY: `_exit` ends the process without running the destructors of what it inherited.
    unsafe { libc::_exit(code) }
}

/// Waits up to `limit` for child `pid` (from [`fork_process`]) to exit and reaps it: its exit
/// code, or `None` when it was killed by a signal or outlived `limit` (then it is killed and
/// reaped too).
pub fn wait_process(pid: i32, limit: Duration) -> Option<i32> {
    // SAFETY: pidfd_open(2) on a child of this process; the result is a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    assert!(fd >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let end = Instant::now() + limit;
    let exited = loop {
        let left = end.saturating_duration_since(Instant::now()).as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one live `pollfd`; `left` is a timeout in ms.
        let n = unsafe { libc::poll(&mut pfd, 1, left) };
        if n > 0 {
            break true;
        }
        if n == 0 {
            break false;
        }
        assert_eq!(std::io::Error::last_os_error().kind(), std::io::ErrorKind::Interrupted);
    };
    if !exited {
        // SAFETY: kill(2) of our own unreaped child (its pid cannot be reused before the reap).
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let mut status = 0;
    // SAFETY: waitpid(2) on our own child, writing one `c_int`; `fd` is ours to close.
    let reaped = unsafe { libc::waitpid(pid, &mut status, 0) };
    // SAFETY: `fd` is the pidfd opened above, closed once.
    unsafe { libc::close(fd) };
    assert_eq!(reaped, pid, "waitpid: {}", std::io::Error::last_os_error());
    (exited && libc::WIFEXITED(status)).then(|| libc::WEXITSTATUS(status))
}

/// The marker `what` of process `owner` (the test, or the L3 Worker between it and the worker
/// that runs the task): a file in the temp directory through which a task running in a worker
/// process tells the test that it runs (a kernel works on device copies of its tensors, so it
/// cannot tell through them). Name it in a [`TempFiles`] so that it goes with the test.
pub fn marker_file(what: &str, owner: u32) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("simpler-rt-{what}-{owner}"))
}

/// Announces `content` in the marker `what` of this process's parent ([`marker_file`]): written,
/// then renamed, so the test sees it only whole.
pub fn announce_to_parent(what: &str, content: &str) -> std::io::Result<()> {
    let marker = marker_file(what, std::os::unix::process::parent_id());
    std::fs::write(marker.with_extension("tmp"), content)?;
    std::fs::rename(marker.with_extension("tmp"), &marker)
}

/// The content of marker `marker` once it appears (up to 20 s; `what` says what it waits for).
pub fn wait_for_marker(marker: &std::path::Path, what: &str) -> String {
    wait_for(what, Duration::from_secs(20), || marker.exists());
    std::fs::read_to_string(marker).expect("read the marker")
}

/// Parks the calling worker process's task until the process is killed, which the test does:
/// no CPU is spent meanwhile. Fails after 30 s, so a test that forgot to kill it ends.
pub fn park_until_killed() -> simpler::HostResult {
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        std::thread::park_timeout(left);
    }
    Err("never killed".into())
}

/// Files a test names in the temp directory (markers, gates): removed when it is made (left by
/// an earlier process of the same id) and when it drops, also when the test panics.
pub struct TempFiles(Vec<std::path::PathBuf>);

impl TempFiles {
    pub fn new(files: impl IntoIterator<Item = std::path::PathBuf>) -> TempFiles {
        let files = TempFiles(files.into_iter().collect());
        files.remove();
        files
    }

    fn remove(&self) {
        for f in &self.0 {
            let _ = std::fs::remove_file(f);
            let _ = std::fs::remove_file(f.with_extension("tmp"));
        }
    }
}

impl Drop for TempFiles {
    fn drop(&mut self) {
        self.remove();
    }
}
