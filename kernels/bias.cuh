// Bias kernels: broadcast a bias into every row, and deterministic column sums of a
// row-major matrix (bias gradients).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/bf16.cuh"

namespace remat::kernels {

// y[r, c] = b[c] for every row r (b and y f32 or bf16: a bf16 y gets b rounded).
void bias_broadcast(FloatBuf b, int64_t rows, int64_t cols, FloatBuf y, cudaStream_t stream);

// The blocks column_sums aims for (about four per SM of an H200) when the rows can be split.
constexpr int64_t kColumnSumBlocks = 512;

// Row chunks column_sums uses for rows x cols with partial_bytes of partial-sum buffer: as
// many as give kColumnSumBlocks blocks, at most what the buffer holds (chunks x cols
// floats), each of at least 16 rows; 1 when nothing is split. The chunk count depends on
// the shapes and the buffer size alone. (Inline: it has no stream in its signature, so it
// would link twice in the CUDA and emulator builds.)
inline int64_t column_sum_chunks(int64_t rows, int64_t cols, size_t partial_bytes) {
  if (rows == 0 || cols == 0) return 1;
  const int64_t col_blocks = (cols + 31) / 32;                                     // 32 columns a block
  const int64_t want = (kColumnSumBlocks + col_blocks - 1) / col_blocks;           // blocks to fill the GPU
  const int64_t fit = static_cast<int64_t>(partial_bytes / sizeof(float)) / cols;  // chunk sums that fit
  const int64_t most = (rows + 15) / 16;                                           // chunks of 16 rows at least
  return std::max<int64_t>(1, std::min({want, fit, most}));
}

// out[c] = sum over rows of x[r, c] (accumulate: out[c] += ...); x f32 or bf16 (widened
// exactly: the fp32 sums of the same values), out f32. Blocks of 32 columns, the
// rows split into column_sum_chunks chunks over the grid's y; each chunk's sum goes to
// `partials` (device memory, partial_bytes), and a second pass adds them in chunk order.
// No atomics: the order depends on the shapes alone, the same bits every run.
void column_sums(FloatBuf x, int64_t rows, int64_t cols, float* out, bool accumulate, float* partials,
                 size_t partial_bytes, cudaStream_t stream);

}  // namespace remat::kernels
