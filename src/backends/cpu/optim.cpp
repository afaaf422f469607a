// Optimizer steps with PyTorch's formulas (torch.optim.SGD and AdamW, single-tensor
// path), and the global gradient norm.
#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/parallel.h"

namespace remat {

namespace {
constexpr int64_t kGrain = 1 << 14;
}

void CpuBackend::sgd_step_impl(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p,
                               int64_t step) {
  float* w = param.f32();
  const float* g = grad.f32();
  float* buf = p.momentum != 0.0 ? momentum_buf.f32() : nullptr;
  const auto wd = static_cast<float>(p.weight_decay), mom = static_cast<float>(p.momentum),
             one_damp = static_cast<float>(1.0 - p.dampening), neg_lr = static_cast<float>(-p.lr);
  cpu::parallel_for(param.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float d = g[i];
      if (wd != 0.0f) d = d + wd * w[i];
      if (buf) {
        buf[i] = step == 1 ? d : buf[i] * mom + one_damp * d;
        d = p.nesterov ? d + mom * buf[i] : buf[i];
      }
      w[i] = w[i] + neg_lr * d;
    }
  });
}

void CpuBackend::adamw_step_impl(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                                 const Tensor& exp_avg_sq, const AdamWParams& p, int64_t step) {
  float* w = param.f32();
  const float* g = grad.f32();
  float *m = exp_avg.f32(), *v = exp_avg_sq.f32();
  // As torch.optim.AdamW: scalars in double (Python floats), applied in float.
  const double bc1 = 1.0 - std::pow(p.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(p.beta2, static_cast<double>(step));
  const auto decay = static_cast<float>(1.0 - p.lr * p.weight_decay);
  const auto step_size = static_cast<float>(p.lr / bc1);
  const auto bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const auto eps = static_cast<float>(p.eps);
  const auto b1 = static_cast<float>(p.beta1), b2 = static_cast<float>(p.beta2);
  const auto one_b1 = static_cast<float>(1.0 - p.beta1), one_b2 = static_cast<float>(1.0 - p.beta2);
  cpu::parallel_for(param.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      w[i] = w[i] * decay;
      m[i] = m[i] * b1 + g[i] * one_b1;
      v[i] = v[i] * b2 + one_b2 * g[i] * g[i];
      const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
      w[i] = w[i] + (-step_size) * (m[i] / denom);
    }
  });
}

double CpuBackend::global_norm_impl(const std::vector<Tensor>& tensors) {
  double total = 0.0;
  for (const Tensor& t : tensors) {
    const float* x = t.f32();
    total += cpu::chunked_sum(t.numel(), [&](int64_t i) { return static_cast<double>(x[i]) * x[i]; });
  }
  return std::sqrt(total);
}

}  // namespace remat
