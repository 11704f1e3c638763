// OpenCL source on a chip orchestration: it submits kernels; it is not one.
use simpler::{callable, dsl::In, dsl::Out, Orchestrator};

#[callable(chip, opencl = "kernels/plan.cl")]
fn plan(o: &mut Orchestrator<'_>, x: In<f32>, y: Out<f32>) {
    let _ = (o, x, y);
}

fn main() {}
