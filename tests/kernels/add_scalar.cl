// `x += k`, the OpenCL C body of `add_scalar` (tests/chips.rs).
__kernel void add_scalar(__global float* x, float k) {
    x[get_global_id(0)] += k;
}
