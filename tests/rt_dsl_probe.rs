#![allow(missing_docs)]
use simpler::{In, InOut, Orchestrator, Out, Worker, callable, chip, sub};

#[callable(sub)]
fn add(a: In<f32>, b: In<f32>, mut out: Out<f32>, k: f32) {
    for i in 0..out.len() {
        out[i] = (a[i] + b[i]) * k;
    }
}

#[callable(chip)]
fn vinc(mut x: InOut<u32>) -> Result<(), String> {
    for v in x.iter_mut() {
        *v += 1;
    }
    Ok(())
}

#[callable(orch)]
fn step(o: &mut Orchestrator<'_>, a: In<f32>, y: Out<f32>) -> simpler::Result<()> {
    add::call(&a, &a, &mut y, 1.0)?.on(o, sub())?;
    Ok(())
}

#[test]
fn probe() -> simpler::Result<()> {
    assert_eq!(add::PARAMS.len(), 4);
    let mut w = Worker::builder().sub_workers(1).build()?;
    w.init()?;
    let (ba, bb, bo) = (w.create_buffer(64)?, w.create_buffer(64)?, w.create_buffer(64)?);
    ba.write(0, &[1.0f32; 16])?;
    bb.write(0, &[2.0f32; 16])?;
    let (ta, tb, mut to) = (ba.typed::<f32>(&[16])?, bb.typed::<f32>(&[16])?, bo.typed::<f32>(&[16])?);
    w.run(
        |o, _, _| {
            add::call(&ta, &tb, &mut to, 2.0)?.on(o, sub())?;
            Ok(())
        },
        simpler::TaskArgs::new(),
        simpler::CallConfig::default(),
    )?;
    assert_eq!(bo.read::<f32>(0, 16)?, vec![6.0; 16]);
    let _ = chip(0);
    let _ = vinc::INFO;
    let _ = step::INFO;
    w.close()
}

mod g {
    use super::add;
    use simpler::{In, Out, task_graph};
    task_graph! {
        pub fn diamond(a: In<f32>, b: In<f32>, y: Out<f32>, n: u32) {
            let t1 = alloc::<f32>([n]);
            let t2 = alloc::<f32>([n]);
            add(a, b, &mut t1, 1.0).on(sub());
            add(b, a, &mut t2, 1.0).on(sub());
            add(t1, t2, &mut y, 0.5).on(sub());
        }
    }
}

#[test]
fn graph_probe() -> simpler::Result<()> {
    let mut w = Worker::builder().sub_workers(2).build()?;
    w.init()?;
    let (ba, bb, bo) = (w.create_buffer(64)?, w.create_buffer(64)?, w.create_buffer(64)?);
    ba.write(0, &[1.0f32; 16])?;
    bb.write(0, &[2.0f32; 16])?;
    let (ta, tb, mut to) = (ba.typed::<f32>(&[16])?, bb.typed::<f32>(&[16])?, bo.typed::<f32>(&[16])?);
    let run = g::diamond::call(&ta, &tb, &mut to, 16)?.submit_captured(&w)?;
    run.wait()?;
    assert_eq!(bo.read::<f32>(0, 16)?, vec![3.0; 16]);
    let dag = run.dag().unwrap();
    println!("{}\n{}", dag.to_dot(), g::diamond::graph().to_dot());
    assert!(g::diamond::graph().matches(&dag));
    w.close()
}
