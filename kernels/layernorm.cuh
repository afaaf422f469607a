// Layer normalisation over the last dimension (PyTorch's F.layer_norm with affine gamma
// and beta): row-wise kernels (kernels/rows.cuh) whose row statistics are summed in
// double, as the CPU backend does (src/backends/cpu/layernorm.cpp), and column sums for
// dgamma and dbeta in a fixed order. No atomics: the same bits every run.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/bf16.cuh"

namespace remat::kernels {

// Per row r of x [rows, c]: mean[r], rstd[r] = 1 / sqrt(biased variance + eps) (two passes
// in double), y = (x - mean) * rstd * gamma + beta. y may be x.
void layernorm_forward(FloatBuf x, FloatBuf gamma, FloatBuf beta, int64_t rows, int64_t c, float eps, FloatBuf y,
                       float* mean, float* rstd, cudaStream_t stream);

// dgamma += sum over rows of dy * xhat, dbeta += sum over rows of dy (either may be null),
// with xhat = (x - mean) * rstd. Rows are split into chunks whose per-column sums (double)
// go to `partial` (partial_bytes of device memory) and are then added in chunk order; the
// chunking depends only on rows, c and partial_bytes.
void layernorm_param_grads(FloatBuf dy, FloatBuf x, const float* mean, const float* rstd, int64_t rows, int64_t c,
                           float* dgamma, float* dbeta, double* partial, size_t partial_bytes, cudaStream_t stream);

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma, per row (the row
// means in double). dx may be dy or x: each row is read before it is written.
void layernorm_backward_dx(FloatBuf dy, FloatBuf x, FloatBuf gamma, const float* mean, const float* rstd, int64_t rows,
                           int64_t c, FloatBuf dx, cudaStream_t stream);

}  // namespace remat::kernels
