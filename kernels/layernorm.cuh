// Layer normalisation over the last dimension (PyTorch's F.layer_norm with affine gamma
// and beta): row-wise kernels (kernels/rows.cuh) whose row statistics are summed in
// double, as the CPU backend does (src/backends/cpu/layernorm.cpp), and column sums for
// dgamma and dbeta in a fixed order. No atomics: the same bits every run.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/bf16.cuh"

namespace remat::kernels {

// Per row r of x [rows, c]: mean[r], rstd[r] = 1 / sqrt(biased variance + eps) (two passes
// in double), y = (x - mean) * rstd * gamma + beta. y may be x.
void layernorm_forward(FloatBuf x, FloatBuf gamma, FloatBuf beta, int64_t rows, int64_t c, float eps, FloatBuf y,
                       float* mean, float* rstd, cudaStream_t stream);

// The blocks layernorm_param_grads aims for (as kColumnSumBlocks, bias.cuh: about four per
// SM of an H200) when the rows can be split.
constexpr int64_t kLayernormGradBlocks = 512;

// Row chunks of layernorm_param_grads for rows x c: enough for kLayernormGradBlocks blocks
// of 32 columns, each chunk of at least 64 rows (at most 1024 chunks); 1 when nothing is
// split. Shapes alone decide. (Inline, as column_sum_chunks: no stream in its signature.)
inline int64_t layernorm_param_grad_chunks(int64_t rows, int64_t c) {
  if (rows <= 0 || c <= 0) return 1;
  constexpr int64_t kMinChunkRows = 64, kMaxChunks = 1024;
  const int64_t col_blocks = (c + 31) / 32;
  const int64_t want = (kLayernormGradBlocks + col_blocks - 1) / col_blocks;
  const int64_t most = (rows + kMinChunkRows - 1) / kMinChunkRows;
  const int64_t chunks = std::max<int64_t>(1, std::min({want, most, kMaxChunks}));
  const int64_t chunk_rows = (rows + chunks - 1) / chunks;
  return (rows + chunk_rows - 1) / chunk_rows;  // no empty chunk
}

// The workspace of layernorm_param_grads: the chunks' column sums of dgamma and dbeta in
// double (2 c doubles a chunk), none with one chunk.
inline size_t layernorm_param_grads_workspace(int64_t rows, int64_t c) {
  const int64_t chunks = layernorm_param_grad_chunks(rows, c);
  return chunks > 1 ? static_cast<size_t>(chunks) * 2 * static_cast<size_t>(c) * sizeof(double) : 0;
}

// dgamma += sum over rows of dy * xhat, dbeta += sum over rows of dy (either may be null),
// with xhat = (x - mean) * rstd. Rows are split into layernorm_param_grad_chunks chunks
// whose per-column sums (double) go to `partial` (layernorm_param_grads_workspace bytes of
// device memory; unused with one chunk) and are then added in chunk order.
void layernorm_param_grads(FloatBuf dy, FloatBuf x, const float* mean, const float* rstd, int64_t rows, int64_t c,
                           float* dgamma, float* dbeta, double* partial, cudaStream_t stream);

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma, per row (the row
// means in double). dx may be dy or x: each row is read before it is written.
void layernorm_backward_dx(FloatBuf dy, FloatBuf x, FloatBuf gamma, const float* mean, const float* rstd, int64_t rows,
                           int64_t c, FloatBuf dx, cudaStream_t stream);

}  // namespace remat::kernels
