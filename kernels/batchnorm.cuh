// BatchNorm2d kernels (NCHW, PyTorch's formulas, as the CPU backend): per-channel
// statistics over (N, H, W), reduced in double in a fixed order.
//
// Each channel's N * H * W elements are cut into `splits` contiguous segments, one block
// each (so that a few channels still fill the GPU). A first kernel writes each block's
// partial sums to `scratch`; a second sums a channel's partials in segment order, derives
// the statistics and applies them. No atomics: the same bits on every run. Channels go
// through in rounds when their partials do not fit in `scratch` at once.
//
// x, gamma, beta, y, dy and dx may be bf16 (FloatBuf, kernels/bf16.cuh): fp32 math on the
// widened values in the f32 launch's order (the same segments and packs of four), bf16
// outputs rounded once; the statistics, running buffers and dgamma/dbeta are f32.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/bf16.cuh"

namespace remat::kernels {

struct BatchNormShape {
  int64_t n, c, hw;
};

// Training mode: save_mean, save_invstd (biased variance) of the batch; y normalised with
// them. With running_mean and running_var non-null they move by momentum (the variance
// by the unbiased one).
void batchnorm_forward_train(FloatBuf x, FloatBuf gamma, FloatBuf beta, const BatchNormShape& g, float momentum,
                             float eps, float* running_mean, float* running_var, FloatBuf y, float* save_mean,
                             float* save_invstd, void* scratch, size_t scratch_bytes, cudaStream_t stream);

// Evaluation mode: y normalised with the running statistics.
void batchnorm_forward_eval(FloatBuf x, FloatBuf gamma, FloatBuf beta, const float* running_mean,
                            const float* running_var, const BatchNormShape& g, float eps, FloatBuf y,
                            cudaStream_t stream);

// dx (if present) = (dy - mean(dy) - (x - mean) * k) * invstd * gamma with
// k = sum((x - mean) * dy) * invstd^2 / count; dgamma += sum((x - mean) * dy) * invstd and
// dbeta += sum(dy) (each if non-null).
void batchnorm_backward(FloatBuf dy, FloatBuf x, FloatBuf gamma, const float* save_mean, const float* save_invstd,
                        const BatchNormShape& g, FloatBuf dx, float* dgamma, float* dbeta, void* scratch,
                        size_t scratch_bytes, cudaStream_t stream);

}  // namespace remat::kernels
