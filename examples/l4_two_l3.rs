//! An L4 Worker driving two L3 Workers, each in its own process: one with chips, one with SUB
//! workers. The L4 graph has an edge between the two L3 tasks, inferred from a shared buffer.
//!
//! Run it with `cargo run --example l4_two_l3`.

#![allow(clippy::print_stdout)] // An example talks to its user.

use simpler::{
    CallConfig, ChipFn, DataType, HostArgs, HostFn, HostResult, Level, OrchFn, Orchestrator, Result,
    TaskArgs, Worker,
};

const N: usize = 1024;

fn vadd(args: &HostArgs<'_>) -> HostResult {
    let (a, b, out) = (args.input::<f32>(0)?, args.input::<f32>(1)?, args.output::<f32>(2)?);
    for i in 0..out.len() {
        out[i] = a[i] + b[i];
    }
    Ok(())
}

fn square(args: &HostArgs<'_>) -> HostResult {
    let (x, out) = (args.input::<f32>(0)?, args.output::<f32>(1)?);
    for i in 0..out.len() {
        out[i] = x[i] * x[i];
    }
    Ok(())
}

/// Runs on the L3 with chips: `out = a + b` on chip 0.
fn add_on_chip(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> Result<()> {
    let mut a = TaskArgs::new();
    a.input(args.tensor(0).expect("a"))?
        .input(args.tensor(1).expect("b"))?
        .output(args.tensor(2).expect("out"))?;
    orch.submit_next_level(&ChipFn::kernel("vadd", vadd).handle(), a, CallConfig::default(), 0).map(|_| ())
}

/// Runs on the L3 with SUB workers: `out = x * x`.
fn square_on_host(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> Result<()> {
    let mut a = TaskArgs::new();
    a.input(args.tensor(0).expect("x"))?.output(args.tensor(1).expect("out"))?;
    orch.submit_sub(&HostFn::new("square", square).handle(), a).map(|_| ())
}

fn main() -> simpler::Result<()> {
    let mut chips = Worker::builder().chips(1).chip_memory(16 << 20).build()?;
    chips.register_chip(ChipFn::kernel("vadd", vadd))?;
    let mut hosts = Worker::builder().sub_workers(2).build()?;
    hosts.register(HostFn::new("square", square))?;

    let mut l4 = Worker::builder().level(Level::Network1).build()?;
    let w_chips = l4.add_worker(chips)?;
    let w_hosts = l4.add_worker(hosts)?;
    let add = l4.register_orch(OrchFn::new("add_on_chip", add_on_chip))?;
    let sq = l4.register_orch(OrchFn::new("square_on_host", square_on_host))?;
    l4.init()?; // forks both L3 Workers; each starts its own children first

    let bufs: Vec<_> = (0..4).map(|_| l4.create_buffer(N * 4)).collect::<Result<_>>()?;
    bufs[0].write(0, &vec![1.0f32; N])?;
    bufs[1].write(0, &vec![2.0f32; N])?;
    let t: Vec<_> = bufs.iter().map(|b| b.tensor(&[N as u32], DataType::Float32)).collect::<Result<_>>()?;

    let run = l4.submit_captured(
        |orch, _, _| {
            let mut x = TaskArgs::new();
            x.input(&t[0])?.input(&t[1])?.output(&t[2])?;
            orch.submit_next_level(&add, x, CallConfig::default(), w_chips)?;
            let mut y = TaskArgs::new();
            y.input(&t[2])?.output(&t[3])?; // waits for the chip task: read-after-write
            orch.submit_next_level(&sq, y, CallConfig::default(), w_hosts)?;
            Ok(())
        },
        TaskArgs::new(),
        CallConfig::default(),
    )?;
    run.wait()?;
    println!("L4 DAG:\n{}", run.dag().expect("captured").to_dot());
    let got = bufs[3].read::<f32>(0, N)?;
    l4.close()?; // closes both L3 Workers and their children
    if got.iter().any(|&v| v != 9.0) {
        eprintln!("FAILED: expected (1 + 2)^2 = 9 everywhere");
        std::process::exit(1);
    }
    println!("(1 + 2)^2 = 9 in all {N} elements, computed across two L3 Workers");
    Ok(())
}
