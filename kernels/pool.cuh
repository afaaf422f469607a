// Pooling kernels over NCHW planes: max and average (count_include_pad) pooling and global
// average pooling, forward and backward. Each output element is computed by one thread in
// the CPU backend's order, so max and average pooling give the CPU's bits; no atomics.
//
// x, y, dy and dx may be bf16 (FloatBuf, kernels/bf16.cuh): fp32 math on the widened
// values, each bf16 output rounded once (a max pool's y is an element of x, so exact), as
// the CPU backend (src/backends/cpu/pool.cpp), so the bf16 ops are the CPU's bits too.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/bf16.cuh"

namespace remat::kernels {

// planes = N * C input planes of h x w, output planes of p x q; window, stride and padding
// as remat::Pool2dParams.
struct PoolShape {
  int64_t planes, h, w, p, q;
  int64_t kh, kw, sh, sw, ph, pw;
};

// y = the first maximum of each window (a NaN wins: the last one), indices = its offset
// r * kw + c within the window (from the window's top-left corner in padded coordinates),
// one byte each (kh * kw <= 256).
void maxpool2d_forward(FloatBuf x, const PoolShape& g, FloatBuf y, uint8_t* indices, cudaStream_t stream);

// dx = 0, then dx[plane][t_j] += dy[plane][j] in the order of j, t_j the flat position that
// output j's window offset names. One warp per plane; an offset outside the window or on its
// padding is skipped. A bf16 dx is summed in fp32 in shared memory, a tile of the plane at a
// time (each tile reads all of the plane's indices), and rounded once.
void maxpool2d_backward(FloatBuf dy, const uint8_t* indices, const PoolShape& g, FloatBuf dx, cudaStream_t stream);

// y = sum of the window's elements inside the input / (kh * kw).
void avgpool2d_forward(FloatBuf x, const PoolShape& g, FloatBuf y, cudaStream_t stream);

// dx[h][w] = sum over the windows holding (h, w), in output order, of dy / (kh * kw): a gather.
void avgpool2d_backward(FloatBuf dy, const PoolShape& g, FloatBuf dx, cudaStream_t stream);

// y[plane] = mean of the plane's hw elements (summed in double; NaN for hw == 0).
void global_avgpool_forward(FloatBuf x, int64_t planes, int64_t hw, FloatBuf y, cudaStream_t stream);

// dx[plane][j] = dy[plane] / hw.
void global_avgpool_backward(FloatBuf dy, int64_t planes, int64_t hw, FloatBuf dx, cudaStream_t stream);

}  // namespace remat::kernels
