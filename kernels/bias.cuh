// Bias kernels: broadcast a bias into every row, and deterministic column sums of a
// row-major matrix (bias gradients).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace remat::kernels {

// y[r, c] = b[c] for every row r.
void bias_broadcast(const float* b, int64_t rows, int64_t cols, float* y, cudaStream_t stream);

// out[c] = sum over rows of x[r, c] (accumulate: out[c] += ...). The rows are summed in a
// fixed order: no atomics, the same bits every run.
void column_sums(const float* x, int64_t rows, int64_t cols, float* out, bool accumulate, cudaStream_t stream);

}  // namespace remat::kernels
