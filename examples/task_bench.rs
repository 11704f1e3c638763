//! A Task Bench-compatible driver (github.com/StanfordLegion/task-bench): one task graph of
//! `-steps` x `-width` points, each point a task. A task's dependencies are the tensors it reads
//! and writes: it writes its point's output (two generations per point, alternating with
//! `t % 2`, so a write also waits for the readers of the generation before) and reads the
//! outputs of the points of the previous step that its pattern names. Every task checks its
//! inputs; a wrong one fails the run, and the driver exits non-zero.
//!
//! ```text
//! cargo run --release --example task_bench -- -steps 1000 -width 2 -type stencil_1d \
//!     -kernel compute_bound -iter 4096
//! ```
//!
//! Where the tasks run (`--workers`; the graph, the checks and the report are the same):
//!
//! * `sub` (the default): a host function on the SUB workers of one L3 Worker.
//! * `chips`: a kernel on chip `p % chips` of one L3 Worker with simulated chips of one core
//!   each; every task's host tensors are copied into the chip and its output back, which is
//!   what this placement costs.
//! * `l4`: an orchestration function on L3 Worker `p % 2` of an L4 Worker over two L3 Workers,
//!   which submits the point's host function to one of its SUB workers with the same
//!   arguments.
//! * `remote`: as `l4`, the two L3 Workers being nodes: this program started again with
//!   `--node` (SPMD), reached over loopback TCP with a fresh cluster key passed in the
//!   environment. The nodes end when the run does; if the driver fails they are killed and
//!   reaped, and if it dies they exit when their stdin (a pipe from it) closes.
//!
//! Flags (as the reference implementations): `-steps T` (4), `-width W` (4), `-type P`
//! (`trivial`, `no_comm`, `stencil_1d`, `fft`, `tree`, `all_to_all`), `-kernel K` (`empty`,
//! `compute_bound`), `-iter I` (0), `-output B` (16), `-scratch 0`, `-field 2`. This driver's
//! own: `--workers sub|chips|l4|remote` (where tasks run, above), `-worker N` or
//! `--sub-workers N` (the workers that run tasks: SUB workers, chips, or SUB workers over both
//! L3 Workers, at least one each; default one per core), `-corrupt T,P` (task (T, P) writes a
//! wrong record, to see the checks of the tasks that read it fail the run; under `trivial`
//! no task reads it), `--timeline PREFIX` (capture the run and write its timeline:
//! `PREFIX.json`, a Chrome trace, `PREFIX.svg` and `PREFIX.dot`; capturing costs time, so
//! do not time such a run), `--no-bind` (by default SUB worker `i` of `sub` runs only on the
//! `i`-th CPU this process may use, modulo their count, `WorkerBuilder::bind_sub_workers`, as
//! StarPU and Open MPI bind theirs). The report ends with the lines task-bench's scripts parse
//! (`Total Tasks`, `Total Dependencies`, `Total FLOPs`, `Elapsed Time ... seconds`); its `Workers:`
//! line names the placement. Process start and Worker start-up (the nodes' too) stay outside
//! the timed region.

#![allow(clippy::print_stdout)] // An example talks to its user.

#[path = "task_bench/graph.rs"]
mod graph;
#[path = "task_bench/setup.rs"]
mod setup;

use std::process::{Command, ExitCode};
use std::time::Instant;

use graph::{Graph, Kernel, Pattern, Slots};
use setup::{Nodes, Plan, Workers};

/// Everything the command line sets.
struct Options {
    graph: Graph,
    plan: Plan,
    corrupt: Option<(i64, i64)>,
    /// `--timeline PREFIX`: capture the run and write its timeline next to `PREFIX`.
    timeline: Option<String>,
}

const USAGE: &str =
    "usage: task_bench [-steps T] [-width W] [-type trivial|no_comm|stencil_1d|fft|tree|all_to_all]
                  [-kernel empty|compute_bound] [-iter I] [-output B] [-scratch 0] [-field 2]
                  [--workers sub|chips|l4|remote] [-worker N | --sub-workers N] [-corrupt T,P]
                  [--timeline PREFIX] [--no-bind]
  --workers: where tasks run: SUB workers (sub, the default), simulated chips (chips), an L4
             over two L3 Workers (l4), or the same with the L3s as node processes (remote)
  -worker N: the workers that run tasks: SUB workers, chips, or SUB workers over both L3s
             (at least one each); default one per core
  --timeline PREFIX: capture the run (slower) and write PREFIX.json (Chrome trace), .svg, .dot
  --no-bind: leave the SUB workers of `sub` unbound (by default worker i runs only on the
             i-th CPU this process may use, modulo their count)";

fn parse(args: &[String]) -> Result<Options, String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let plan = Plan { workers: Workers::Sub, count: cores, bind: true };
    let mut o = Options { graph: Graph::default(), plan, corrupt: None, timeline: None };
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
                o.plan.count = num(flag, value()?)?;
                if o.plan.count == 0 {
                    return Err(format!("{flag} must be at least 1"));
                }
            }
            "--workers" => {
                let v = value()?;
                o.plan.workers = Workers::parse(v)
                    .ok_or_else(|| format!("--workers {v}: unknown (sub, chips, l4, remote)"))?;
            }
            "--timeline" => o.timeline = Some(value()?.clone()),
            "--no-bind" => o.plan.bind = false,
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
    if args.first().map(String::as_str) == Some("--node") {
        // A node of `--workers remote`, started by the driver.
        return match setup::serve_node() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("task_bench node: {e}");
                ExitCode::FAILURE
            }
        };
    }
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
    // Each time step is a scope of its own (`Graph::submit`), so a task leaves the window once
    // it and its readers are done: the window bounds how far building runs ahead of execution
    // (and so the memory a run holds), whatever its length.
    let window = 1024;
    let plan = &opts.plan;
    // The nodes of `--workers remote` (none otherwise): this program again, in the node role.
    let nodes = Nodes::start(plan, || {
        let mut node = Command::new(std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into()));
        node.arg("--node");
        node
    })?;
    let mut worker = plan.builder(window, &nodes)?.build()?;
    let handle = plan.register(&mut worker)?;
    worker.init()?;
    let slots = Slots::new(&worker, g)?;
    let placement = plan.placement(&handle);

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
    println!("  Workers: {}", plan.describe(&nodes));

    // Timed: from just before the first submit until every task has completed.
    let started = Instant::now();
    // When the orchestration function returned: every task submitted (tasks run meanwhile).
    let built = std::cell::Cell::new(None);
    let submit_all = |orch: &mut simpler::Orchestrator<'_>| {
        let r = g.submit(orch, placement, &slots, opts.corrupt);
        built.set(Some(started.elapsed()));
        r
    };
    let (result, timeline) = match &opts.timeline {
        None => (worker.run(submit_all), None),
        Some(prefix) => {
            let options = simpler::RunOptions::new().capture_dag();
            let run = worker.submit_with(options, |orch, _, _| submit_all(orch));
            match run {
                Ok(run) => (run.wait(), run.timeline().map(|t| (prefix, t))),
                Err(e) => (Err(e), None),
            }
        }
    };
    let elapsed = started.elapsed().as_secs_f64();
    if let Some(built) = built.get() {
        // Not a line of the reference implementations (their scripts ignore it): how long
        // submitting the graph took, within the elapsed time (the tasks run meanwhile).
        println!("  Submitted in {} seconds", sci(built.as_secs_f64()));
    }
    if let Some((prefix, timeline)) = timeline {
        let files = timeline.write_files(prefix)?;
        println!(
            "  Timeline: {}",
            files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    drop(slots);
    worker.close()?;
    nodes.wait()?; // each node ends its session when the root closes; on an error above, `nodes` kills them
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
