//! The same kernel on four chips, as one group task and as four single tasks. A group runs one
//! callable with one argument list per member, one member per chip; its members start together
//! (or none does) and it is one node of the DAG, so a later task that reads the members'
//! outputs waits for the group as a whole. Singles are independent tasks that start as their
//! chips come free.
//!
//! Run it with `cargo run --example chip_groups`.

#![allow(clippy::print_stdout)] // An example talks to its user.

use std::process::ExitCode;

use simpler::prelude::*;

const N: u32 = 256;

/// `y = x + k` on one core of one chip; each member of a group gets its own `k`.
#[callable(chip)]
fn shift(x: In<f32>, mut y: Out<f32>, k: f32) {
    for i in 0..y.len() {
        y[i] = x[i] + k;
    }
}

/// `total = y0 + y1 + y2 + y3`.
#[callable(chip)]
fn sum4(y0: In<f32>, y1: In<f32>, y2: In<f32>, y3: In<f32>, mut total: Out<f32>) {
    for i in 0..total.len() {
        total[i] = y0[i] + y1[i] + y2[i] + y3[i];
    }
}

task_graph! {
    /// A group of four `shift`s, one per chip, then a reader of all four outputs.
    fn group_then_sum(x: In<f32>, y0: Out<f32>, y1: Out<f32>, y2: Out<f32>, y3: Out<f32>, total: Out<f32>) {
        group(|| {
            shift(x, &mut y0, 0.0).on(chip(0));
            shift(x, &mut y1, 1.0).on(chip(1));
            shift(x, &mut y2, 2.0).on(chip(2));
            shift(x, &mut y3, 3.0).on(chip(3));
        });
        sum4(y0, y1, y2, y3, &mut total).on(chip(0));
    }
}

/// Prints a captured run's tasks; true when it has `want` (tasks, members of task 0) and each
/// output `k` holds `x + k`. Zeroes the outputs, so that the next run has to write them again.
fn check(what: &str, run: &RunHandle, want: (usize, u32), outs: &[Buffer]) -> simpler::Result<bool> {
    let dag = run.dag().expect("submitted with capture");
    println!("{what}:");
    for t in dag.graph().node_weights() {
        println!("  task {}: {} x{} on {}", t.index, t.callable, t.members, t.target);
    }
    let first = dag.node(0).map_or(0, |i| dag.graph()[i].members);
    let mut ok = (dag.graph().node_count(), first) == want;
    for (k, b) in outs.iter().enumerate() {
        ok &= b.read::<f32>(0, N as usize)?.iter().enumerate().all(|(i, &v)| v == (i + k) as f32);
        b.write(0, &vec![0.0f32; N as usize])?;
    }
    Ok(ok)
}

fn main() -> simpler::Result<ExitCode> {
    let mut worker = Worker::builder().chips(4).chip_memory(16 << 20).build()?;
    worker.init()?;
    let n = N as usize;
    let bx = worker.create_buffer(4 * n)?;
    bx.write(0, &(0..n).map(|i| i as f32).collect::<Vec<_>>())?;
    let x = bx.typed::<f32>(&[N])?;
    let bufs: Vec<_> = (0..5).map(|_| worker.create_buffer(4 * n)).collect::<simpler::Result<_>>()?;
    let mut ys: Vec<TensorOf<f32>> = bufs.iter().map(|b| b.typed(&[N])).collect::<simpler::Result<_>>()?;
    // 1. A task_graph! group, then a task that waits for the whole group.
    let [y0, y1, y2, y3, total] = &mut ys[..] else { unreachable!("five tensors") };
    let run = group_then_sum::call(&x, y0, y1, y2, y3, total)?
        .submit_with(&worker, simpler::RunOptions::new().capture_dag())?;
    run.wait()?;
    let mut ok = bufs[4].read::<f32>(0, n)?.iter().enumerate().all(|(i, &v)| v == 4.0 * i as f32 + 6.0);
    ok &= check("a group in a task_graph!, then sum4", &run, (2, 4), &bufs[..4])?;

    // 2. The same group from a closure, built in a loop: one typed call and one chip per member.
    let outs = &mut ys[..4];
    let run = worker.submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
        let mut members = Vec::new();
        for (k, y) in outs.iter_mut().enumerate() {
            members.push((shift::call(&x, y, k as f32)?, chip(k as u32)));
        }
        orch.submit_group(members).map(|_| ())
    })?;
    run.wait()?;
    ok &= check("the same group with submit_group", &run, (1, 4), &bufs[..4])?;

    // 3. Four singles: four tasks, each on its own chip.
    let run = worker.submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
        for (k, y) in outs.iter_mut().enumerate() {
            shift::call(&x, y, k as f32)?.on(orch, chip(k as u32))?;
        }
        Ok(())
    })?;
    run.wait()?;
    ok &= check("four singles", &run, (4, 1), &bufs[..4])?;

    worker.close()?;
    if !ok {
        eprintln!("FAILED: wrong outputs or DAG shapes");
        return Ok(ExitCode::FAILURE);
    }
    println!("result check: every member wrote x + k on its own chip, in all three runs");
    Ok(ExitCode::SUCCESS)
}
