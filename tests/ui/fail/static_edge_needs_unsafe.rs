// Taking a tensor out of the TensorMap's ordering (what `task_graph!`'s static edges do) is
// `unsafe`, as `NoDep` is: safe code cannot skip a dependency.
use simpler::{dsl::Out, callable, dsl::sub};

#[callable(sub)]
fn fill(mut y: Out<f32>) {
    y.fill(1.0);
}

fn main() -> simpler::Result<()> {
    let buf = simpler::__private::doc_buffer(64)?;
    let mut y = buf.typed::<f32>(&[16])?;
    let mut call = fill::call(&mut y)?;
    call.__static(0);
    let _ = sub();
    Ok(())
}
