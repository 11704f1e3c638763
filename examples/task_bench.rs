//! A Task Bench-compatible driver (github.com/StanfordLegion/task-bench): one task graph of
//! `-steps` x `-width` points, each point a task on a SUB worker. A task's dependencies are the
//! tensors it reads and writes: it writes its point's output (two generations per point,
//! alternating with `t % 2`, so a write also waits for the readers of the generation before)
//! and reads the outputs of the points of the previous step that its pattern names. Every task
//! checks its inputs; a wrong one fails the run, and the driver exits non-zero.
//!
//! ```text
//! cargo run --release --example task_bench -- -steps 1000 -width 2 -type stencil_1d \
//!     -kernel compute_bound -iter 4096
//! ```
//!
//! Flags (as the reference implementations): `-steps T` (4), `-width W` (4), `-type P`
//! (`trivial`, `no_comm`, `stencil_1d`, `fft`, `tree`, `all_to_all`), `-kernel K` (`empty`,
//! `compute_bound`), `-iter I` (0), `-output B` (16), `-scratch 0`, `-field 2`. This driver's
//! own: `--workers sub` (where tasks run; only SUB workers so far), `-worker N` or
//! `--sub-workers N` (SUB workers, default one per core), `-corrupt T,P` (task (T, P) writes a
//! wrong record, to see the checks fail the run). The report ends with the lines task-bench's
//! scripts parse (`Total Tasks`, `Total Dependencies`, `Total FLOPs`, `Elapsed Time ... seconds`).

#![allow(clippy::print_stdout)] // An example talks to its user.

#[path = "task_bench/graph.rs"]
mod graph;

use std::process::ExitCode;
use std::time::Instant;

use graph::{Graph, Kernel, Pattern, Slots};
use simpler::{HostFn, Worker};

/// Everything the command line sets.
struct Options {
    graph: Graph,
    sub_workers: usize,
    corrupt: Option<(i64, i64)>,
}

const USAGE: &str =
    "usage: task_bench [-steps T] [-width W] [-type trivial|no_comm|stencil_1d|fft|tree|all_to_all]
                  [-kernel empty|compute_bound] [-iter I] [-output B] [-scratch 0] [-field 2]
                  [--workers sub] [-worker N | --sub-workers N] [-corrupt T,P]";

fn parse(args: &[String]) -> Result<Options, String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut o = Options { graph: Graph::default(), sub_workers: cores, corrupt: None };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
            v.parse().map_err(|_| format!("{flag}: not a valid number: {v:?}"))
        }
        match flag.as_str() {
            "-steps" => o.graph.steps = num(flag, value()?)?,
            "-width" => o.graph.width = num(flag, value()?)?,
            "-type" => {
                let v = value()?;
                o.graph.pattern = Pattern::parse(v).ok_or_else(|| {
                    format!("-type {v}: not implemented yet (implemented: trivial, no_comm, stencil_1d, fft, tree, all_to_all)")
                })?;
            }
            "-kernel" => {
                let v = value()?;
                o.graph.kernel = Kernel::parse(v).ok_or_else(|| {
                    format!("-kernel {v}: not implemented yet (implemented: empty, compute_bound)")
                })?;
            }
            "-iter" => o.graph.iter = num(flag, value()?)?,
            "-output" => o.graph.output = num(flag, value()?)?,
            "-scratch" => {
                let v: u64 = num(flag, value()?)?;
                if v != 0 {
                    return Err(format!("-scratch {v}: not implemented yet (only -scratch 0)"));
                }
            }
            "-field" => {
                let v: u64 = num(flag, value()?)?;
                if v != 2 {
                    return Err(format!(
                        "-field {v}: not implemented yet (this driver keeps 2 generations per point)"
                    ));
                }
            }
            // Parameters of other patterns: accepted and unused, as in the C++ core.
            "-radix" | "-period" | "-fraction" => {
                value()?;
            }
            "-and" => return Err("-and (a second concurrent graph): not implemented yet".into()),
            "-worker" | "--sub-workers" => {
                o.sub_workers = num(flag, value()?)?;
                if o.sub_workers == 0 {
                    return Err(format!("{flag} must be at least 1"));
                }
            }
            "--workers" => match value()?.as_str() {
                "sub" => {}
                other @ ("chips" | "l4" | "remote") => {
                    return Err(format!("--workers {other}: not implemented yet (only --workers sub)"));
                }
                other => return Err(format!("--workers {other}: unknown (sub; later chips, l4, remote)")),
            },
            "-corrupt" => {
                let v = value()?;
                let (t, p) = v.split_once(',').ok_or_else(|| format!("-corrupt {v}: expected T,P"))?;
                o.corrupt = Some((num(flag, t)?, num(flag, p)?));
            }
            "-h" | "-help" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    o.graph.validate()?;
    Ok(o)
}

/// `printf("%e")`: six decimals and an exponent of at least two digits with its sign.
fn sci(x: f64) -> String {
    let s = format!("{x:.6e}");
    match s.split_once('e') {
        Some((m, e)) => {
            let e: i32 = e.parse().unwrap_or(0);
            format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
        }
        None => s, // inf, NaN
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("task_bench: {e}");
            }
            eprintln!("{USAGE}");
            return if e.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(2) };
        }
    };
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("task_bench: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(opts: &Options) -> simpler::Result<()> {
    let g = &opts.graph;
    let tasks = g.tasks();
    // Every task of the run stays in the window until the run ends (one scope): room for all.
    let window = (tasks as usize + 16).next_power_of_two().max(65536);
    let mut worker = Worker::builder().sub_workers(opts.sub_workers).task_window(window).build()?;
    let point = worker.register(HostFn::new("task_bench_point", graph::point))?;
    worker.init()?;
    let slots = Slots::new(&worker, g)?;

    println!("Running Task Benchmark");
    println!("  Configuration:");
    println!("    Task Graph 1:");
    println!("      Time Steps: {}", g.steps);
    println!("      Max Width: {}", g.width);
    println!("      Dependence Type: {}", g.pattern.name());
    println!("      Kernel:");
    println!("        Type: {}", g.kernel.name());
    println!("        Iterations: {}", g.iter);
    println!("        Output Bytes: {}", g.output);
    println!("        Scratch Bytes: 0");
    println!("  Workers: sub x {}", opts.sub_workers);

    // Timed: from just before the first submit until every task has completed.
    let started = Instant::now();
    let result = worker.run(|orch| g.submit(orch, &point, &slots, opts.corrupt));
    let elapsed = started.elapsed().as_secs_f64();
    drop(slots);
    worker.close()?;
    result?;

    let flops = g.flops();
    println!("Total Tasks {tasks}");
    println!("Total Dependencies {}", g.dependencies());
    println!("  Unable to estimate local/nonlocal dependencies");
    println!("Total FLOPs {flops}");
    println!("Total Bytes 0");
    println!("Elapsed Time {} seconds", sci(elapsed));
    println!("FLOP/s {}", sci(flops as f64 / elapsed));
    println!("B/s {}", sci(0.0));
    println!("Transfer (estimated):");
    println!("  Unable to estimate local/nonlocal transfer");
    Ok(())
}
