//! The `l2_worker` suite with every chip on an OpenCL device (feature `opencl`), its kernels from
//! their OpenCL C source (see `common::builder`).

#[path = "l2_worker.rs"]
mod suite;
