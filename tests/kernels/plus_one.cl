// `t = x + 1`, the OpenCL C body of `plus_one` (tests/device_intermediates.rs).
__kernel void plus_one(__global const float* x, __global float* t) {
    size_t i = get_global_id(0);
    t[i] = x[i] + 1.0f;
}
