// `y = a * x + y + plus`, the OpenCL C body of `saxpy_plus` in tests/opencl.rs (whose Rust body
// is the same): tensors first, then the scalars narrowed to their declared types.
__kernel void saxpy(__global const float* x, __global float* y, float a, int plus) {
    size_t i = get_global_id(0);
    y[i] = a * x[i] + y[i] + (float)plus;
}
