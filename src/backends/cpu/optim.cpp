// Optimizer steps with PyTorch's formulas (torch.optim.SGD and AdamW, single-tensor
// path), and the global gradient norm.
#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/simd.h"

namespace remat {

namespace {

// AdamW's update of elements [b, e), the scalars in float. The AVX-512 version does the
// same operations in the same order, so the two round alike.
struct AdamWScalars {
  float decay, b1, one_b1, b2, one_b2, bc2_sqrt, eps, neg_step;
};

inline void adamw_range(float* w, const float* g, float* m, float* v, int64_t b, int64_t e, const AdamWScalars& s) {
  for (int64_t i = b; i < e; ++i) {
    const float wi = w[i] * s.decay;
    m[i] = m[i] * s.b1 + g[i] * s.one_b1;
    v[i] = v[i] * s.b2 + s.one_b2 * g[i] * g[i];
    const float denom = std::sqrt(v[i]) / s.bc2_sqrt + s.eps;
    w[i] = wi + s.neg_step * (m[i] / denom);
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define REMAT_OPTIM_AVX512 1
__attribute__((target("avx512f"))) void adamw_range_avx512(float* w, const float* g, float* m, float* v, int64_t b,
                                                           int64_t e, const AdamWScalars& s) {
  const __m512 decay = _mm512_set1_ps(s.decay), b1 = _mm512_set1_ps(s.b1), one_b1 = _mm512_set1_ps(s.one_b1);
  const __m512 b2 = _mm512_set1_ps(s.b2), one_b2 = _mm512_set1_ps(s.one_b2), bc2 = _mm512_set1_ps(s.bc2_sqrt);
  const __m512 eps = _mm512_set1_ps(s.eps), neg_step = _mm512_set1_ps(s.neg_step);
  int64_t i = b;
  for (; i + 16 <= e; i += 16) {
    const __m512 gi = _mm512_loadu_ps(g + i);
    const __m512 wi = _mm512_mul_ps(_mm512_loadu_ps(w + i), decay);
    const __m512 mi = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(m + i), b1), _mm512_mul_ps(gi, one_b1));
    const __m512 vi =
        _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(v + i), b2), _mm512_mul_ps(_mm512_mul_ps(one_b2, gi), gi));
    // (the masked form: GCC 12 warns about _mm512_sqrt_ps's undefined pass-through)
    const __m512 root = _mm512_mask_sqrt_ps(vi, static_cast<__mmask16>(0xFFFF), vi);
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(root, bc2), eps);
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    _mm512_storeu_ps(w + i, _mm512_add_ps(wi, _mm512_mul_ps(neg_step, _mm512_div_ps(mi, denom))));
  }
  adamw_range(w, g, m, v, i, e, s);
}
#endif

}  // namespace

void CpuBackend::sgd_step_impl(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p,
                               int64_t step) {
  float* w = param.f32();
  const float* g = grad.f32();
  float* buf = p.momentum != 0.0 ? momentum_buf.f32() : nullptr;
  const auto wd = static_cast<float>(p.weight_decay), mom = static_cast<float>(p.momentum),
             one_damp = static_cast<float>(1.0 - p.dampening), neg_lr = static_cast<float>(-p.lr);
  cpu::parallel_for(param.numel(), cpu::kParallelMinWork, [&](int64_t b, int64_t e) {
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
  const AdamWScalars s{static_cast<float>(1.0 - p.lr * p.weight_decay),
                       static_cast<float>(p.beta1),
                       static_cast<float>(1.0 - p.beta1),
                       static_cast<float>(p.beta2),
                       static_cast<float>(1.0 - p.beta2),
                       static_cast<float>(std::sqrt(bc2)),
                       static_cast<float>(p.eps),
                       -static_cast<float>(p.lr / bc1)};
#ifdef REMAT_OPTIM_AVX512
  auto* range = cpu::simd() == cpu::Simd::avx512 ? &adamw_range_avx512 : &adamw_range;
#else
  auto* range = &adamw_range;
#endif
  cpu::parallel_for(param.numel(), cpu::kParallelMinWork, [&](int64_t b, int64_t e) { range(w, g, m, v, b, e, s); });
}

double CpuBackend::global_norm_impl(const std::vector<Tensor>& tensors) {
  double total = 0.0;
  for (const Tensor& t : tensors) {
    const float* x = t.f32();
    total += cpu::chunked_sum(t.numel(), [&](int64_t i) { return static_cast<double>(x[i]) * x[i]; });
  }
  return std::sqrt(total);
}

void CpuBackend::adamw_step_multi_impl(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                       const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs,
                                       const std::vector<AdamWParams>& p, int64_t step) {
  for (size_t i = 0; i < params.size(); ++i)
    adamw_step_impl(params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], p[i], step);
}

void CpuBackend::sgd_step_multi_impl(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                     const std::vector<Tensor>& momentum_bufs, const std::vector<SgdParams>& p,
                                     int64_t step) {
  for (size_t i = 0; i < params.size(); ++i) sgd_step_impl(params[i], grads[i], momentum_bufs[i], p[i], step);
}

void CpuBackend::clip_grad_norm_impl(const std::vector<Tensor>& tensors, double max_norm) {
  const double coef = max_norm / (global_norm_impl(tensors) + 1e-6);
  if (coef < 1.0)
    for (const Tensor& t : tensors) scale_impl(t, static_cast<float>(coef), t);
}

}  // namespace remat
