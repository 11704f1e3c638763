//! What flows through the engine: element types, buffers, tensors, task arguments, call configs,
//! and the bounds-checked wire codec.

pub(crate) mod buffer;
pub(crate) mod call_config;
pub(crate) mod dtype;
pub(crate) mod footprint;
pub(crate) mod host_args;
pub(crate) mod task_args;
pub(crate) mod tensor;
pub(crate) mod wire;
