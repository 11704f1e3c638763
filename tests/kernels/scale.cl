// `y = k * x`, the OpenCL C body of `scale` (tests/tiles.rs).
__kernel void scale(__global const float* x, __global float* y, float k) {
    size_t i = get_global_id(0);
    y[i] = k * x[i];
}
