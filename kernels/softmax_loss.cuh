// Softmax and log-softmax over the last dimension, cross-entropy with its fused
// backward, and accuracy: row-wise kernels (kernels/rows.cuh), numerically stable (every
// exponential is of x - max), with fixed-order reductions: the same bits every run.
// The formulas are the CPU backend's (src/backends/cpu/softmax_loss.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/bf16.cuh"

namespace remat::kernels {

// y = softmax(x) (or log_softmax when `log`) over rows of length n. y may be x.
void softmax_forward(FloatBuf x, int64_t rows, int64_t n, bool log, FloatBuf y, cudaStream_t stream);

// dx = y * (dy - sum(dy * y)), or for log-softmax dx = dy - exp(y) * sum(dy). dx may be dy.
void softmax_backward(FloatBuf dy, FloatBuf y, int64_t rows, int64_t n, bool log, FloatBuf dx, cudaStream_t stream);

// What cross_entropy_forward found wrong with the targets: the first row whose target is
// neither ignore_index nor in [0, n), or bad_row = -1.
struct CrossEntropyCheck {
  int64_t bad_row;
  int32_t bad_target;
};

// lse[r] = logsumexp(x[r, :]) for every row; loss[0] = mean over the rows whose target is
// not ignore_index of lse[r] - x[r, target[r]], summed in double in a fixed order (NaN
// when every row is ignored). With label smoothing e > 0 a row's term is lse[r] -
// (1 - e) x[r, target[r]] - e mean(x[r, :]), the row means written to row_mean ([rows]
// floats of device memory; unused when e = 0). Rows with an out-of-range target are left
// out of the loss and reported in *check (device memory).
void cross_entropy_forward(FloatBuf x, const int32_t* targets, int64_t rows, int64_t n, int ignore_index,
                           float smoothing, float* loss, float* lse, float* row_mean, CrossEntropyCheck* check,
                           cudaStream_t stream);

// dx[r, j] = scale * (exp(x[r, j] - lse[r]) - e / n - (1 - e) (j == target[r])) with
// scale = dloss / count (count: rows not ignored) and e the label smoothing; ignored rows
// get 0. `scale` is one float of device memory for the scale, computed on the device from
// the targets. dx may be x.
void cross_entropy_backward(float dloss, FloatBuf x, const int32_t* targets, const float* lse, int64_t rows, int64_t n,
                            int ignore_index, float smoothing, FloatBuf dx, float* scale, cudaStream_t stream);

// Adds to counts[0] the rows whose target is not ignore_index, and to counts[1] those of
// them whose first maximum is the target (as the CPU's sequential scan finds it: a NaN
// never wins, except that a NaN in column 0 keeps column 0). counts: two values of device
// memory, zeroed by the caller.
void accuracy(FloatBuf x, const int32_t* targets, int64_t rows, int64_t n, int ignore_index, unsigned long long* counts,
              cudaStream_t stream);

}  // namespace remat::kernels
