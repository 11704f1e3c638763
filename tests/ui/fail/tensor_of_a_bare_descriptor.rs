// A tensor is made from its buffer, never from the bare descriptor: a tensor of a descriptor
// would not hold the buffer, so a host write could change the bytes a running task holds.
use simpler::{Buffer, DataType, Tensor, memory::TensorView};

fn view_of(buf: &Buffer) -> simpler::Result<Tensor> {
    Tensor::new(*buf.desc(), TensorView::new(0, &[8], None, DataType::Float32)?)
}

fn main() {
    let _ = view_of;
}
