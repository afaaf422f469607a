// Optimizer kernels (torch.optim.SGD and AdamW, the single-tensor formulas of the CPU
// backend, src/backends/cpu/optim.cpp) and the sum of squares behind the global gradient
// norm. The coefficients are fp32 values the caller derives from the double
// hyperparameters, as PyTorch does from its Python floats.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace remat::kernels {

struct SgdCoefficients {
  float weight_decay = 0.0f;
  float momentum = 0.0f;
  float one_minus_dampening = 1.0f;
  float neg_lr = 0.0f;
  bool first_step = true;  // step 1: the momentum buffer starts as the gradient
  bool nesterov = false;
};

// d = grad + weight_decay * param; with a momentum buffer (not null):
// buf = first_step ? d : momentum * buf + (1 - dampening) * d, d = nesterov ? d + momentum * buf : buf;
// then param += -lr * d.
void sgd_step(float* param, const float* grad, float* momentum_buf, int64_t n, const SgdCoefficients& c,
              cudaStream_t stream);

struct AdamWCoefficients {
  float decay = 1.0f;      // 1 - lr * weight_decay
  float step_size = 0.0f;  // lr / (1 - beta1^step)
  float bc2_sqrt = 1.0f;   // sqrt(1 - beta2^step)
  float eps = 0.0f;
  float beta1 = 0.0f, beta2 = 0.0f;
  float one_minus_beta1 = 1.0f, one_minus_beta2 = 1.0f;
};

// param *= decay; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
// param -= step_size * m / (sqrt(v) / bc2_sqrt + eps).
void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamWCoefficients& c, cudaStream_t stream);

// Where clip_coefficient leaves its result (device memory).
struct ClipScale {
  float value;
  int apply;  // coef < 1
};

// Multi-tensor AdamW: up to kAdamWMultiMax tensors per launch, their pointers and
// coefficients passed by value in the kernel's arguments (no device table, no upload).
// Each block updates one chunk of kAdamWMultiChunk elements of one tensor with adamw_step's
// formula and float4 rule: the same bits as one adamw_step per tensor.
constexpr int kAdamWMultiMax = 36;
constexpr int64_t kAdamWMultiChunk = 16384;
struct AdamWMultiEntry {
  float* w;
  const float* g;
  float* m;
  float* v;
  int64_t n;
  AdamWCoefficients c;
};
// Updates entries[0 .. count) (count <= kAdamWMultiMax) in one launch.
void adamw_step_multi(const AdamWMultiEntry* entries, int count, cudaStream_t stream);

// Multi-tensor SGD, as multi-tensor AdamW: up to kSgdMultiMax tensors per launch, their
// pointers and coefficients in the kernel's arguments, one chunk of kSgdMultiChunk elements
// of one tensor per block, sgd_step's formula and float4 rule: the same bits as one
// sgd_step per tensor. buf is null for an entry without momentum.
constexpr int kSgdMultiMax = 48;
constexpr int64_t kSgdMultiChunk = 16384;
struct SgdMultiEntry {
  float* w;
  const float* g;
  float* buf;
  int64_t n;
  SgdCoefficients c;
};
// Updates entries[0 .. count) (count <= kSgdMultiMax) in one launch.
void sgd_step_multi(const SgdMultiEntry* entries, int count, cudaStream_t stream);

// The most per-block partial sums sum_squares writes: `partials` holds that many doubles.
constexpr int kSumSquaresMaxBlocks = 1024;

// *total = sum of x[i]^2 (accumulate: *total += ...), in double. Two passes: blocks write
// partial sums, one block adds them. The order of the additions depends on n alone (not on
// the pointers' alignment or the device), so the result is the same bits on every run.
void sum_squares(const float* x, int64_t n, double* partials, double* total, bool accumulate, cudaStream_t stream);

// The blocks (and partial sums) sum_squares uses for n elements: at most kSumSquaresMaxBlocks.
// Inline: the emulator's kernel library and the nvcc-built one both link into the tools,
// and a function without a stream argument would otherwise be defined twice.
constexpr int kSumSquaresBlock = 256;
inline int64_t sum_squares_blocks(int64_t n) {
  const int64_t per_block = int64_t{4} * kSumSquaresBlock;
  const int64_t blocks = (n + per_block - 1) / per_block;
  return blocks < kSumSquaresMaxBlocks ? blocks : kSumSquaresMaxBlocks;
}

// Multi-tensor sum of squares: the same bits in *total as one sum_squares call per entry
// in order (the first with `accumulate`, the others accumulating), in two launches.
// partials holds the sum of sum_squares_blocks(entries[i].n) doubles; count <= kNormMultiMax.
constexpr int kNormMultiMax = 64;
struct NormMultiEntry {
  const float* x;
  int64_t n;
};
void sum_squares_multi(const NormMultiEntry* entries, int count, double* partials, double* total, bool accumulate,
                       cudaStream_t stream);

// Gradient clipping on the device: from *total (the sum of squares, as sum_squares leaves
// it) one thread computes coef = max_norm / (sqrt(*total) + 1e-6) in double and stores
// float(coef) in *scale, or 1 (no clipping) when coef >= 1 ...
void clip_coefficient(const double* total, double max_norm, ClipScale* scale, cudaStream_t stream);
// ... and x[i] *= scale->value for n elements when scale->apply (the fp32 product of scale).
void scale_by_clip(float* x, int64_t n, const ClipScale* scale, cudaStream_t stream);
// scale_by_clip over xs[i] (ns[i] elements), count <= kNormMultiMax, in one launch.
constexpr int64_t kScaleMultiChunk = 16384;
void scale_by_clip_multi(float* const* xs, const int64_t* ns, int count, const ClipScale* scale, cudaStream_t stream);

}  // namespace remat::kernels
