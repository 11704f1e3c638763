// `y[r][c] += 1000 r + c` over a tile of `cols` columns, in place, the OpenCL C body of
// `tile_bump` (tests/tiles.rs).
__kernel void tile_bump(__global float* y, uint cols) {
    size_t i = get_global_id(0);
    y[i] += 1000.0f * (float)(i / cols) + (float)(i % cols);
}
