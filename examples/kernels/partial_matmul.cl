// One partial product of examples/tiled_matmul.rs on an OpenCL device:
// p[M, N] = a_tile[M, KT] . b_tile[KT, N], the same as the Rust body of `partial_matmul`.
//
// Tensors come first (__global pointers to each view's first element), then the scalars in
// signature order. A strided piece (`a_tile`, a column block of `a`) arrives packed: a plain
// row-major [M, KT] array. The global work size is the element count of `p` (the first
// writable tensor): one work-item per output element.
__kernel void partial_matmul(__global const float* a, __global const float* b, __global float* p,
                             uint m, uint n, uint kt) {
    size_t ij = get_global_id(0);
    if (ij >= (size_t)m * n) {
        return;
    }
    uint i = (uint)(ij / n);
    uint j = (uint)(ij % n);
    float acc = 0.0f;
    for (uint k = 0; k < kt; ++k) {
        acc += a[i * kt + k] * b[k * n + j];
    }
    p[ij] = acc;
}
