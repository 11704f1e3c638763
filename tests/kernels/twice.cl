// `y = 2 t`, the OpenCL C body of `twice` (tests/device_intermediates.rs).
__kernel void twice(__global const float* t, __global float* y) {
    size_t i = get_global_id(0);
    y[i] = 2.0f * t[i];
}
