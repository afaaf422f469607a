// Optimizer steps and the global norm on the CUDA backend (kernels/optim.cu). The fp32
// coefficients come from the double hyperparameters exactly as in the CPU backend
// (src/backends/cpu/optim.cpp), which follows torch.optim.
#include <cmath>

#include "backends/cuda/cuda_backend.h"
#include "kernels/optim.cuh"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

namespace {
kernels::SgdCoefficients sgd_coefficients(const SgdParams& p, int64_t step) {
  kernels::SgdCoefficients c;
  c.weight_decay = static_cast<float>(p.weight_decay);
  c.momentum = static_cast<float>(p.momentum);
  c.one_minus_dampening = static_cast<float>(1.0 - p.dampening);
  c.neg_lr = static_cast<float>(-p.lr);
  c.first_step = step == 1;
  c.nesterov = p.nesterov;
  return c;
}
}  // namespace

void CudaBackend::sgd_step_impl(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p,
                                int64_t step) {
  const kernels::SgdCoefficients c = sgd_coefficients(p, step);
  float* buf = p.momentum != 0.0 ? momentum_buf.f32() : nullptr;
  kernels::sgd_step(param.f32(), grad.f32(), buf, param.numel(), c, stream_);
}

void CudaBackend::sgd_step_multi_impl(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                      const std::vector<Tensor>& momentum_bufs, const std::vector<SgdParams>& p,
                                      int64_t step) {
  std::vector<kernels::SgdMultiEntry> batch;
  auto flush = [&] {
    if (!batch.empty()) kernels::sgd_step_multi(batch.data(), static_cast<int>(batch.size()), stream_);
    batch.clear();
  };
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].numel() == 0) continue;
    float* buf = p[i].momentum != 0.0 ? momentum_bufs[i].f32() : nullptr;
    batch.push_back({params[i].f32(), grads[i].f32(), buf, params[i].numel(), sgd_coefficients(p[i], step)});
    if (batch.size() == static_cast<size_t>(kernels::kSgdMultiMax)) flush();
  }
  flush();
}

namespace {
kernels::AdamWCoefficients adamw_coefficients(const AdamWParams& p, int64_t step);
}  // namespace

void CudaBackend::adamw_step_multi_impl(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                        const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs,
                                        const std::vector<AdamWParams>& p, int64_t step) {
  std::vector<kernels::AdamWMultiEntry> batch;
  auto flush = [&] {
    if (!batch.empty()) kernels::adamw_step_multi(batch.data(), static_cast<int>(batch.size()), stream_);
    batch.clear();
  };
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].numel() == 0) continue;
    batch.push_back({params[i].f32(), grads[i].f32(), exp_avgs[i].f32(), exp_avg_sqs[i].f32(), params[i].numel(),
                     adamw_coefficients(p[i], step)});
    if (batch.size() == static_cast<size_t>(kernels::kAdamWMultiMax)) flush();
  }
  flush();
}

void CudaBackend::adamw_step_impl(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                                  const Tensor& exp_avg_sq, const AdamWParams& p, int64_t step) {
  kernels::adamw_step(param.f32(), grad.f32(), exp_avg.f32(), exp_avg_sq.f32(), param.numel(),
                      adamw_coefficients(p, step), stream_);
}

namespace {
kernels::AdamWCoefficients adamw_coefficients(const AdamWParams& p, int64_t step) {
  // Scalars in double (Python floats in torch.optim.AdamW), applied in float.
  const double bc1 = 1.0 - std::pow(p.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(p.beta2, static_cast<double>(step));
  kernels::AdamWCoefficients c;
  c.decay = static_cast<float>(1.0 - p.lr * p.weight_decay);
  c.step_size = static_cast<float>(p.lr / bc1);
  c.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  c.eps = static_cast<float>(p.eps);
  c.beta1 = static_cast<float>(p.beta1);
  c.beta2 = static_cast<float>(p.beta2);
  c.one_minus_beta1 = static_cast<float>(1.0 - p.beta1);
  c.one_minus_beta2 = static_cast<float>(1.0 - p.beta2);
  return c;
}
}  // namespace

namespace {

// scratch(): the running total (one double), the partial sums of one batch of tensors,
// and at the end the clipping scale.
constexpr size_t kClipScaleAt = CudaBackend::kScratchBytes - 64;
constexpr int64_t kNormPartials = static_cast<int64_t>(kClipScaleAt / sizeof(double)) - 1;
static_assert(kernels::kSumSquaresMaxBlocks <= kNormPartials, "global_norm: scratch too small for one tensor");
static_assert(sizeof(kernels::ClipScale) <= 64, "clip_grad_norm: the scale does not fit");

// Sum of squares of every tensor, in list order, into *total: the bits of one
// kernels::sum_squares per tensor, in batches of at most kNormMultiMax tensors whose
// partial sums fit the scratch (two launches per batch).
void sum_squares_all(const std::vector<Tensor>& tensors, double* total, cudaStream_t stream) {
  std::vector<kernels::NormMultiEntry> batch;
  int64_t blocks = 0;
  bool accumulate = false;
  auto flush = [&] {
    if (batch.empty()) return;
    kernels::sum_squares_multi(batch.data(), static_cast<int>(batch.size()), total + 1, total, accumulate, stream);
    accumulate = true;
    batch.clear();
    blocks = 0;
  };
  for (const Tensor& t : tensors) {
    const int64_t b = kernels::sum_squares_blocks(t.numel());
    if (batch.size() == static_cast<size_t>(kernels::kNormMultiMax) || blocks + b > kNormPartials) flush();
    batch.push_back({t.f32(), t.numel()});
    blocks += b;
  }
  flush();
}

}  // namespace

double CudaBackend::global_norm_impl(const std::vector<Tensor>& tensors) {
  auto* total = static_cast<double*>(scratch_);
  double sum = 0.0;
  if (tensors.empty()) return sum;
  sum_squares_all(tensors, total, stream_);
  copy_to_host(&sum, total, sizeof sum);
  return std::sqrt(sum);
}

void CudaBackend::clip_grad_norm_impl(const std::vector<Tensor>& tensors, double max_norm) {
  // The norm is global_norm's (the same kernels, the same order); coef is computed from it
  // on the device with the cpu's double formula, so the scaled gradients are the bits of
  // global_norm + scale without the read-back.
  auto* total = static_cast<double*>(scratch_);
  auto* scale = reinterpret_cast<kernels::ClipScale*>(static_cast<char*>(scratch_) + kClipScaleAt);
  if (tensors.empty()) return;
  sum_squares_all(tensors, total, stream_);
  kernels::clip_coefficient(total, max_norm, scale, stream_);
  std::vector<float*> xs;
  std::vector<int64_t> ns;
  for (size_t i = 0; i < tensors.size(); ++i) {
    xs.push_back(tensors[i].f32());
    ns.push_back(tensors[i].numel());
    if (xs.size() == static_cast<size_t>(kernels::kNormMultiMax) || i + 1 == tensors.size()) {
      kernels::scale_by_clip_multi(xs.data(), ns.data(), static_cast<int>(xs.size()), scale, stream_);
      xs.clear();
      ns.clear();
    }
  }
}

REMAT_KERNELS_ABI_END
}  // namespace remat
