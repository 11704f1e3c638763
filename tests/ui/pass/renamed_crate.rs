// `simpler` under another name: `crate = ...` on `#[callable]`, `#[simpler(crate = ...)]` on a
// graph.
extern crate simpler as renamed;

use renamed::dsl::{In, Out};

#[renamed::callable(sub, crate = ::renamed)]
fn copy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

#[renamed::callable(chip, crate = ::renamed)]
fn vcopy(a: In<f32>, mut b: Out<f32>) {
    b.copy_from_slice(&a);
}

#[renamed::callable(orch, crate = ::renamed)]
fn plan(o: &mut renamed::Orchestrator<'_>, a: In<f32>, y: Out<f32>) -> renamed::Result<()> {
    vcopy::call(&a, &mut y)?.on(o, renamed::dsl::chip(0))?;
    Ok(())
}

renamed::task_graph! {
    #[simpler(crate = ::renamed)]
    fn g(a: In<f32>, y: Out<f32>) {
        let h = alloc::<f32>([16]);
        copy(a, &mut h).on(sub());
        copy(h, &mut y).on(sub());
    }
}

fn main() {
    let _ = g::graph();
    let _ = plan::INFO;
}
