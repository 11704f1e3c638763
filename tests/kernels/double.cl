// `out = 2 * x`, the OpenCL C body of `common::double` (`double` is a type in OpenCL C, so the
// function is `double_it`).
__kernel void double_it(__global const float* x, __global float* out) {
    size_t i = get_global_id(0);
    out[i] = 2.0f * x[i];
}
