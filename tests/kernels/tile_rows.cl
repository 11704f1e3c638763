// `y[r][c] = x[r][c] + 1000 r` over a tile of `cols` columns, the OpenCL C body of `tile_rows`
// (tests/tiles.rs): the chip hands a tile of a matrix over packed, so it is a plain row-major
// array here.
__kernel void tile_rows(__global const float* x, __global float* y, uint cols) {
    size_t i = get_global_id(0);
    y[i] = x[i] + 1000.0f * (float)(i / cols);
}
