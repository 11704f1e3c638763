//! The `timeline` suite with every chip on an OpenCL device (feature `opencl`), its kernels from
//! their OpenCL C source (see `common::builder`).

#[path = "timeline.rs"]
mod suite;
