// RMS normalisation over the last dimension (as LLaMA's RMSNorm): row-wise kernels
// (kernels/rows.cuh) whose row sums are taken in double, as the CPU backend does
// (src/backends/cpu/rmsnorm.cpp), and per-column sums for dgamma in row order. No atomics:
// the same bits every run. x, gamma, y, dy and dx may be bf16 (FloatBuf, kernels/bf16.cuh:
// fp32 math, bf16 outputs rounded once); rstd and dgamma are f32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/bf16.cuh"

namespace remat::kernels {

// Per row r of x [rows, c]: rstd[r] = 1 / sqrt(mean(x^2) + eps), y = x * rstd * gamma.
void rmsnorm_forward(FloatBuf x, FloatBuf gamma, int64_t rows, int64_t c, float eps, FloatBuf y, float* rstd,
                     cudaStream_t stream);

// dgamma += sum over rows of dy * (x * rstd): one thread per column adds the rows in
// order (the CPU's order), reading consecutive columns across a warp.
void rmsnorm_dgamma(FloatBuf dy, FloatBuf x, const float* rstd, int64_t rows, int64_t c, float* dgamma,
                    cudaStream_t stream);

// dx = rstd * (g - xhat * mean(g * xhat)) with g = dy * gamma, per row (the mean in
// double). dx may be dy: each row is read before it is written.
void rmsnorm_backward_dx(FloatBuf dy, FloatBuf x, FloatBuf gamma, const float* rstd, int64_t rows, int64_t c,
                         FloatBuf dx, cudaStream_t stream);

}  // namespace remat::kernels
