// Convolution kernels for the im2col + GEMM path (NCHW, any stride, padding, dilation and
// groups): the column matrix of a chunk of images and its inverse, and the small layout
// and bias kernels around the GEMMs. Every output element is written by one thread, in a
// fixed order: no atomics.
//
// The column matrix of images [n0, n0 + nb) has C * R * S rows and L = nb * P * Q columns:
//   col[(c * R + r) * S + s][i * P * Q + p * Q + q] = x[n0 + i][c][p * sh - ph + r * dh][q * sw - pw + s * dw]
// (0 where that falls in the padding). The rows of group g are the contiguous block
// [g * Cg * R * S, (g + 1) * Cg * R * S).
//
// bf16 (training.precision bf16; kernels/bf16.cuh): every array is a FloatBuf. A copy into a
// bf16 array (col, the dy transpose) rounds an f32 source once and copies a bf16 one
// exactly; sums (col2im, the channel sums) are fp32 (double) on the widened values, the
// bf16 outputs rounded once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/bf16.cuh"

namespace remat::kernels {

// x [N, C, H, W], filters [K, C / groups, R, S], output planes P x Q; stride, padding and
// dilation as remat::Conv2dParams.
struct ConvShape {
  int64_t n, c, h, w;
  int64_t k, r, s;
  int64_t p, q;
  int64_t sh, sw, ph, pw, dh, dw;
};

// col (C * R * S rows of nb * P * Q) from images [n0, n0 + nb) of x.
void im2col(FloatBuf x, const ConvShape& g, int64_t n0, int64_t nb, FloatBuf col, cudaStream_t stream);

// The adjoint of im2col: dx[n0 + i][c][h][w] = the sum over (r, s), in that order, of the
// col entries im2col would read from x[n0 + i][c][h][w]. A gather per input element.
void col2im(FloatBuf col, const ConvShape& g, int64_t n0, int64_t nb, FloatBuf dx, cudaStream_t stream);

// dst[c][i * plane + j] = src[n0 + i][c][j] for i < nb: a chunk of an [N, C, plane] tensor
// with the first two dimensions swapped.
void nchw_to_cnhw(FloatBuf src, int64_t n0, int64_t nb, int64_t c, int64_t plane, FloatBuf dst, cudaStream_t stream);

// y[i][c][j] = b[c] for an [n, c, plane] tensor.
void broadcast_channels(FloatBuf b, int64_t n, int64_t c, int64_t plane, FloatBuf y, cudaStream_t stream);

// db[c] += the sum over i and j of dy[i][c][j] (in double, fixed order) for an [n, c, plane] tensor.
void accumulate_channel_sums(FloatBuf dy, int64_t n, int64_t c, int64_t plane, float* db, cudaStream_t stream);

}  // namespace remat::kernels
