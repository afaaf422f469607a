// BatchNorm2d on the CPU (NCHW), PyTorch's formulas.
//
// Statistics are per channel over (N, H, W). Every loop that reduces runs parallel over
// channels, and one thread sums a channel's N planes in order, in double (16 partial sums
// per plane, combined in a fixed order: cpu::sum_f64 and its kin): results do not depend
// on the thread count.
//
// bf16 storage (training.precision bf16): a channel of x (and dy) is converted to fp32 once
// per op (ChannelF32), y and dx written a plane at a time through fp32 staging (mixed.h),
// gamma and beta (working copies) widened whole; the
// statistics, running buffers and parameter gradients are f32. Each plane's arithmetic is
// the fp32 code's, so the results are the fp32 op's on the same values, then rounded.
#include <cmath>

#include "backends/cpu/bf16.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/mixed.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/simd.h"
#include "remat/error.h"

namespace remat {

namespace {

struct BnGeom {
  int64_t n, c, hw;
  explicit BnGeom(const Tensor& x) : n(x.size(0)), c(x.size(1)), hw(x.size(2) * x.size(3)) {}
  int64_t count() const { return n * hw; }
  int64_t plane(int64_t i, int64_t ch) const { return (i * c + ch) * hw; }
};

using cpu::sum_dev_dot_f64;
using cpu::sum_f64;
using cpu::sum_sq_dev_f64;

// The elementwise passes over a plane, compiled for the baseline, AVX2 and AVX-512 (the
// loop inlined into each; the same float operations at every width: no contraction in
// this file); cpu::simd() picks.
//   affine:     y = x * scale + shift
//   input_grad: dx = (dy - mean_dy - (x - mean) * k) * scale
__attribute__((always_inline)) inline void affine(const float* x, float scale, float shift, int64_t n, float* y) {
  for (int64_t j = 0; j < n; ++j) y[j] = x[j] * scale + shift;
}
__attribute__((always_inline)) inline void input_grad(const float* x, const float* dy, float mean, float mean_dy,
                                                      float k, float scale, int64_t n, float* dx) {
  for (int64_t j = 0; j < n; ++j) dx[j] = (dy[j] - mean_dy - (x[j] - mean) * k) * scale;
}
void affine_baseline(const float* x, float scale, float shift, int64_t n, float* y) { affine(x, scale, shift, n, y); }
void input_grad_baseline(const float* x, const float* dy, float mean, float mean_dy, float k, float scale, int64_t n,
                         float* dx) {
  input_grad(x, dy, mean, mean_dy, k, scale, n, dx);
}
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define REMAT_BN_X86 1
__attribute__((target("avx2"))) void affine_avx2(const float* x, float scale, float shift, int64_t n, float* y) {
  affine(x, scale, shift, n, y);
}
__attribute__((target("avx2"))) void input_grad_avx2(const float* x, const float* dy, float mean, float mean_dy,
                                                     float k, float scale, int64_t n, float* dx) {
  input_grad(x, dy, mean, mean_dy, k, scale, n, dx);
}
__attribute__((target("avx512f"))) void affine_avx512(const float* x, float scale, float shift, int64_t n, float* y) {
  affine(x, scale, shift, n, y);
}
__attribute__((target("avx512f"))) void input_grad_avx512(const float* x, const float* dy, float mean, float mean_dy,
                                                          float k, float scale, int64_t n, float* dx) {
  input_grad(x, dy, mean, mean_dy, k, scale, n, dx);
}
#endif

struct Passes {
  void (*affine)(const float*, float, float, int64_t, float*);
  void (*input_grad)(const float*, const float*, float, float, float, float, int64_t, float*);
};

Passes passes() {
#ifdef REMAT_BN_X86
  if (cpu::simd() == cpu::Simd::avx512) return {&affine_avx512, &input_grad_avx512};
  if (cpu::simd() == cpu::Simd::avx2) return {&affine_avx2, &input_grad_avx2};
#endif
  return {&affine_baseline, &input_grad_baseline};
}

// The N planes of one channel of a float tensor in fp32: plane(i) points into the tensor
// when f32; a bf16 channel is converted once, into staging slot `slot`, so the passes
// over it (two sums and the affine map forward, two sums and dx backward) convert nothing.
class ChannelF32 {
 public:
  ChannelF32(const Tensor& t, const BnGeom& g, int64_t ch, int slot) : g_(g), ch_(ch) {
    if (!cpu::is_bf16(t)) {
      base_ = t.f32();
      return;
    }
    buf_ = cpu::staging(slot, g.n * g.hw);
    for (int64_t i = 0; i < g.n; ++i) cpu::bf16_to_f32(t.bf16() + g.plane(i, ch), buf_ + i * g.hw, g.hw);
  }
  const float* plane(int64_t i) const { return base_ ? base_ + g_.plane(i, ch_) : buf_ + i * g_.hw; }

 private:
  const BnGeom& g_;
  int64_t ch_;
  const float* base_ = nullptr;
  float* buf_ = nullptr;
};

}  // namespace

void CpuBackend::batchnorm2d_forward_train_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                                const Tensor& running_mean, const Tensor& running_var,
                                                const BatchNormParams& p, bool update_running, const Tensor& y,
                                                const Tensor& save_mean, const Tensor& save_invstd) {
  const BnGeom g(x);
  const float* gp = cpu::f32_all(gamma, 5);
  const float* bp = cpu::f32_all(beta, 6);
  float* smp = save_mean.f32();
  float* sip = save_invstd.f32();
  float* rmp = update_running ? running_mean.f32() : nullptr;
  float* rvp = update_running ? running_var.f32() : nullptr;
  const int64_t count = g.count();
  const double momentum = p.momentum;
  const Passes pass = passes();
#pragma omp parallel for schedule(static) if (g.n * g.c * g.hw >= cpu::kParallelMinWork)
  for (int64_t ch = 0; ch < g.c; ++ch) {
    const ChannelF32 xc(x, g, ch, 0);
    cpu::F32Writer wy(y, 2);
    double sum = 0.0;
    for (int64_t i = 0; i < g.n; ++i) sum += sum_f64(xc.plane(i), g.hw);
    const double mean = count > 0 ? sum / static_cast<double>(count) : 0.0;
    double sq = 0.0;
    for (int64_t i = 0; i < g.n; ++i) sq += sum_sq_dev_f64(xc.plane(i), g.hw, mean);
    const double var = count > 0 ? sq / static_cast<double>(count) : 0.0;  // biased, for normalising
    const double invstd = 1.0 / std::sqrt(var + static_cast<double>(p.eps));
    smp[ch] = static_cast<float>(mean);
    sip[ch] = static_cast<float>(invstd);
    if (update_running) {  // validation guarantees count >= 2 here
      const double unbiased = sq / static_cast<double>(count - 1);
      rmp[ch] = static_cast<float>((1.0 - momentum) * rmp[ch] + momentum * mean);
      rvp[ch] = static_cast<float>((1.0 - momentum) * rvp[ch] + momentum * unbiased);
    }
    const double scale = invstd * gp[ch];
    const float fscale = static_cast<float>(scale);
    const float fshift = static_cast<float>(bp[ch] - mean * scale);
    for (int64_t i = 0; i < g.n; ++i) {
      pass.affine(xc.plane(i), fscale, fshift, g.hw, wy.get(g.plane(i, ch), g.hw));
      wy.put();
    }
  }
}

void CpuBackend::batchnorm2d_forward_eval_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                               const Tensor& running_mean, const Tensor& running_var,
                                               const BatchNormParams& p, const Tensor& y) {
  const BnGeom g(x);
  const float* gp = cpu::f32_all(gamma, 5);
  const float* bp = cpu::f32_all(beta, 6);
  const float* rmp = running_mean.f32();
  const float* rvp = running_var.f32();
  const int64_t units = g.n * g.c;
  const Passes pass = passes();
#pragma omp parallel for schedule(static) if (units * g.hw >= cpu::kParallelMinWork)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t ch = u % g.c;
    const double scale = gp[ch] / std::sqrt(static_cast<double>(rvp[ch]) + static_cast<double>(p.eps));
    const float fscale = static_cast<float>(scale);
    const float fshift = static_cast<float>(bp[ch] - rmp[ch] * scale);
    cpu::F32Reader rx(x, 0);
    cpu::F32Writer wy(y, 2);
    pass.affine(rx.get(u * g.hw, g.hw), fscale, fshift, g.hw, wy.get(u * g.hw, g.hw));
    wy.put();
  }
}

void CpuBackend::batchnorm2d_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                           const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dx,
                                           const Tensor& dgamma, const Tensor& dbeta) {
  const BnGeom g(x);
  const float* gp = cpu::f32_all(gamma, 5);
  const float* smp = save_mean.f32();
  const float* sip = save_invstd.f32();
  float* dgp = dgamma.defined() ? dgamma.f32() : nullptr;
  float* dbp = dbeta.defined() ? dbeta.f32() : nullptr;
  const int64_t count = g.count();
  const Passes pass = passes();
#pragma omp parallel for schedule(static) if (g.n * g.c * g.hw >= cpu::kParallelMinWork)
  for (int64_t ch = 0; ch < g.c; ++ch) {
    const ChannelF32 xc(x, g, ch, 0), dyc(dy, g, ch, 1);
    const double mean = smp[ch], invstd = sip[ch];
    double sum_dy = 0.0, dot = 0.0;
    for (int64_t i = 0; i < g.n; ++i) {
      sum_dy += sum_f64(dyc.plane(i), g.hw);
      dot += sum_dev_dot_f64(xc.plane(i), dyc.plane(i), g.hw, mean);
    }
    if (dbp) dbp[ch] += static_cast<float>(sum_dy);
    if (dgp) dgp[ch] += static_cast<float>(dot * invstd);
    if (!dx.defined() || count == 0) continue;
    // dx = (dy - mean(dy) - (x - mean) * k) * invstd * gamma, k = dot * invstd^2 / count
    const float fk = static_cast<float>(dot * invstd * invstd / static_cast<double>(count));
    const float fmean = static_cast<float>(mean);
    const float fmdy = static_cast<float>(sum_dy / static_cast<double>(count));
    const float fscale = static_cast<float>(invstd * gp[ch]);
    cpu::F32Writer wdx(dx, 2);  // dx may be dy: each plane of dy is read before its dx is written
    for (int64_t i = 0; i < g.n; ++i) {
      pass.input_grad(xc.plane(i), dyc.plane(i), fmean, fmdy, fk, fscale, g.hw, wdx.get(g.plane(i, ch), g.hw));
      wdx.put();
    }
  }
}

}  // namespace remat
