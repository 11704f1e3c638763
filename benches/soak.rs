//! Soak (not in CI): one million tasks through one Worker with flat memory, then thousands of
//! Worker create/init/close cycles with no growth in processes, file descriptors, mappings or
//! host buffers.
//!
//! `cargo bench -p simpler-benches --bench soak [-- TASKS CYCLES]` (defaults 1 000 000 and
//! 10 000). Figures: `soak_tasks`, `soak_tasks_per_s`, `soak_rss_growth_kib` (this process,
//! after the first 10% of the tasks against the end), `soak_child_rss_growth_kib` (the SUB
//! workers, the same way), `soak_cycles`, `soak_cycles_per_s`, and the growth over the cycles
//! (measured after the first Worker closed, so what the first one starts for the life of the
//! process, such as the spawner thread, is not counted) of `soak_process_growth` (children of
//! this process, zombies included: every SUB worker is one, started by exec),
//! `soak_fd_growth`, `soak_mapping_growth` (lines of `/proc/self/maps`), `soak_memfd_growth`
//! (memfds this process holds or maps: the Workers' mailbox regions and heap rings, and host
//! buffers) and `soak_shm_name_growth` (this process's host buffers, `/memfd:sp-*-<pid>-b*`,
//! held or mapped here, and any `/dev/shm` name of this process, which earlier versions made).
//! Each must be 0.

#![allow(clippy::print_stdout)]

mod common;

use std::time::Instant;

use common::figure;
use simpler::{HostArgs, HostFn, HostResult, TaskArgs, Worker};

const TASKS_PER_RUN: usize = 1_000;

fn empty(_args: &HostArgs<'_>) -> HostResult {
    Ok(())
}

/// Resident set of process `pid` in KiB (`/proc/<pid>/statm`, second field, in pages).
fn rss_kib(pid: i32) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    pages * 4
}

/// Live children of this process (any state but zombie counts; zombies count too, as leaks).
fn children() -> usize {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().chars().all(|c| c.is_ascii_digit()))
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("stat"))
                        .ok()
                        .and_then(|s| {
                            s.rsplit(") ").next().map(|rest| rest.split_whitespace().nth(1) == Some(&me))
                        })
                        .unwrap_or(false)
                })
                .count()
        })
        .unwrap_or(0)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

fn mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps").map(|m| m.lines().count()).unwrap_or(0)
}

/// The memfd label in a `/proc/self/fd` link or a `/proc/self/maps` line (`/memfd:<label>
/// (deleted)`).
fn memfd_label(s: &str) -> Option<&str> {
    let rest = &s[s.find("/memfd:")? + "/memfd:".len()..];
    Some(rest.strip_suffix(" (deleted)").unwrap_or(rest))
}

/// The memfds this process holds a descriptor of or maps, by inode: `(all, host buffers)`, the
/// host buffers being the ones it made (`/memfd:sp-<8 hex>-<pid>-b<N>`; the others are the
/// Workers' mailbox regions and heap rings, `/memfd:simpler`); plus, among the host buffers,
/// any `/dev/shm` name of this process (what earlier versions made).
fn memfds() -> (usize, usize) {
    use std::os::unix::fs::MetadataExt;
    let tag = format!("-{}-b", std::process::id());
    let mut seen: Vec<(u64, bool)> = Vec::new();
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        for fd in fds.filter_map(|e| e.ok()) {
            let Ok(target) = std::fs::read_link(fd.path()) else { continue };
            let target = target.to_string_lossy();
            let Some(label) = memfd_label(&target) else { continue };
            let Ok(meta) = std::fs::metadata(fd.path()) else { continue };
            seen.push((meta.ino(), label.starts_with("sp-") && label.contains(&tag)));
        }
    }
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    for line in maps.lines() {
        let Some(label) = memfd_label(line) else { continue };
        // address perms offset dev inode path
        let Some(ino) = line.split_whitespace().nth(4).and_then(|i| i.parse().ok()) else { continue };
        seen.push((ino, label.starts_with("sp-") && label.contains(&tag)));
    }
    seen.sort_unstable();
    seen.dedup();
    let buffers = seen.iter().filter(|(_, mine)| *mine).count();
    let names = std::fs::read_dir("/dev/shm")
        .map(|d| d.filter_map(|e| e.ok()).filter(|e| e.file_name().to_string_lossy().contains(&tag)).count())
        .unwrap_or(0);
    (seen.len(), buffers + names)
}

fn main() -> simpler::Result<()> {
    let mut args = std::env::args().skip(1).filter(|a| !a.starts_with('-'));
    let tasks: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let cycles: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(10_000);

    // One million tasks through one Worker, each run with a fresh buffer written by one task.
    let mut worker = Worker::builder().sub_workers(2).build()?;
    let f = worker.register(HostFn::new("empty", empty))?;
    worker.init()?;
    let pids = worker.child_pids();
    let runs = tasks.div_ceil(TASKS_PER_RUN);
    let (mut rss_at, mut child_rss_at) = (0, 0);
    let start = Instant::now();
    for run in 0..runs {
        if run == runs / 10 {
            rss_at = rss_kib(std::process::id() as i32);
            child_rss_at = pids.iter().map(|&p| rss_kib(p)).sum();
        }
        let out = worker.create_buffer(64)?;
        let t = out.tensor(&[16], simpler::DataType::Float32)?;
        worker.run(|orch| {
            let mut first = TaskArgs::new();
            first.output(&t)?;
            orch.submit_sub(&f, first)?;
            for _ in 1..TASKS_PER_RUN {
                orch.submit_sub(&f, TaskArgs::new())?;
            }
            Ok(())
        })?;
    }
    let secs = start.elapsed().as_secs_f64();
    let rss_end = rss_kib(std::process::id() as i32);
    let child_rss_end: u64 = pids.iter().map(|&p| rss_kib(p)).sum();
    worker.close()?;
    let done = runs * TASKS_PER_RUN;
    println!("{done} tasks in {runs} runs of {TASKS_PER_RUN} on 2 SUB workers in {secs:.1} s");
    figure("soak_tasks", done as f64, "tasks");
    figure("soak_tasks_per_s", done as f64 / secs, "tasks/s");
    figure("soak_rss_growth_kib", rss_end as f64 - rss_at as f64, "KiB");
    figure("soak_child_rss_growth_kib", child_rss_end as f64 - child_rss_at as f64, "KiB");

    // Worker create/init/close cycles, each running one task and creating one buffer.
    let count = || (children(), open_fds(), mappings(), memfds());
    let (procs0, fds0, maps0, (memfds0, shm0)) = count();
    let start = Instant::now();
    for _ in 0..cycles {
        let mut w = Worker::builder().sub_workers(1).build()?;
        let f = w.register(HostFn::new("empty", empty))?;
        w.init()?;
        let b = w.create_buffer(64)?;
        let t = b.tensor(&[16], simpler::DataType::Float32)?;
        w.run(|orch| {
            let mut a = TaskArgs::new();
            a.output(&t)?;
            orch.submit_sub(&f, a).map(|_| ())
        })?;
        drop((t, b));
        w.close()?;
    }
    let secs = start.elapsed().as_secs_f64();
    let (procs1, fds1, maps1, (memfds1, shm1)) = count();
    println!(
        "{cycles} cycles in {secs:.1} s: children {procs0} -> {procs1}, fds {fds0} -> {fds1}, mappings {maps0} -> {maps1}, memfds {memfds0} -> {memfds1}, host buffers {shm0} -> {shm1}"
    );
    figure("soak_cycles", cycles as f64, "cycles");
    figure("soak_cycles_per_s", cycles as f64 / secs, "cycles/s");
    figure("soak_process_growth", procs1 as f64 - procs0 as f64, "processes");
    figure("soak_fd_growth", fds1 as f64 - fds0 as f64, "fds");
    figure("soak_mapping_growth", maps1 as f64 - maps0 as f64, "mappings");
    figure("soak_memfd_growth", memfds1 as f64 - memfds0 as f64, "memfds");
    figure("soak_shm_name_growth", shm1 as f64 - shm0 as f64, "names");
    Ok(())
}
