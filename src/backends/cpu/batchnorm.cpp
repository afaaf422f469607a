// BatchNorm2d on the CPU (NCHW), PyTorch's formulas.
//
// Statistics are per channel over (N, H, W). Every loop that reduces runs parallel over
// channels, and one thread sums a channel's N planes in order, in double (four partial
// sums per plane, combined in a fixed order): results do not depend on the thread count.
#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/parallel.h"
#include "remat/error.h"

namespace remat {

namespace {

// Below this many elements a loop runs on the calling thread (the results are the same
// either way; it saves the fork/join on small tensors).
constexpr int64_t kMinParallelWork = int64_t{1} << 15;

struct BnGeom {
  int64_t n, c, hw;
  explicit BnGeom(const Tensor& x) : n(x.size(0)), c(x.size(1)), hw(x.size(2) * x.size(3)) {}
  int64_t count() const { return n * hw; }
  int64_t plane(int64_t i, int64_t ch) const { return (i * c + ch) * hw; }
};

using cpu::sum_f64;

// sum((s - mean)^2)
double sum_sq_dev_f64(const float* s, int64_t n, double mean) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const double d0 = s[j] - mean, d1 = s[j + 1] - mean, d2 = s[j + 2] - mean, d3 = s[j + 3] - mean;
    a0 += d0 * d0;
    a1 += d1 * d1;
    a2 += d2 * d2;
    a3 += d3 * d3;
  }
  for (; j < n; ++j) {
    const double d = s[j] - mean;
    a0 += d * d;
  }
  return (a0 + a1) + (a2 + a3);
}

// sum((x - mean) * dy)
double sum_dev_dot_f64(const float* x, const float* dy, int64_t n, double mean) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    a0 += (x[j] - mean) * dy[j];
    a1 += (x[j + 1] - mean) * dy[j + 1];
    a2 += (x[j + 2] - mean) * dy[j + 2];
    a3 += (x[j + 3] - mean) * dy[j + 3];
  }
  for (; j < n; ++j) a0 += (x[j] - mean) * dy[j];
  return (a0 + a1) + (a2 + a3);
}

// y = x * scale + shift over a plane.
void affine(const float* x, float scale, float shift, int64_t n, float* y) {
  for (int64_t j = 0; j < n; ++j) y[j] = x[j] * scale + shift;
}

}  // namespace

void CpuBackend::batchnorm2d_forward_train_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                                const Tensor& running_mean, const Tensor& running_var,
                                                const BatchNormParams& p, bool update_running, const Tensor& y,
                                                const Tensor& save_mean, const Tensor& save_invstd) {
  const BnGeom g(x);
  const float* xp = x.f32();
  const float* gp = gamma.f32();
  const float* bp = beta.f32();
  float* yp = y.f32();
  float* smp = save_mean.f32();
  float* sip = save_invstd.f32();
  float* rmp = update_running ? running_mean.f32() : nullptr;
  float* rvp = update_running ? running_var.f32() : nullptr;
  const int64_t count = g.count();
  const double momentum = p.momentum;
#pragma omp parallel for schedule(static) if (g.n * g.c * g.hw >= kMinParallelWork)
  for (int64_t ch = 0; ch < g.c; ++ch) {
    double sum = 0.0;
    for (int64_t i = 0; i < g.n; ++i) sum += sum_f64(xp + g.plane(i, ch), g.hw);
    const double mean = count > 0 ? sum / static_cast<double>(count) : 0.0;
    double sq = 0.0;
    for (int64_t i = 0; i < g.n; ++i) sq += sum_sq_dev_f64(xp + g.plane(i, ch), g.hw, mean);
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
    for (int64_t i = 0; i < g.n; ++i) affine(xp + g.plane(i, ch), fscale, fshift, g.hw, yp + g.plane(i, ch));
  }
}

void CpuBackend::batchnorm2d_forward_eval_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                               const Tensor& running_mean, const Tensor& running_var,
                                               const BatchNormParams& p, const Tensor& y) {
  const BnGeom g(x);
  const float* xp = x.f32();
  const float* gp = gamma.f32();
  const float* bp = beta.f32();
  const float* rmp = running_mean.f32();
  const float* rvp = running_var.f32();
  float* yp = y.f32();
  const int64_t units = g.n * g.c;
#pragma omp parallel for schedule(static) if (units * g.hw >= kMinParallelWork)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t ch = u % g.c;
    const double scale = gp[ch] / std::sqrt(static_cast<double>(rvp[ch]) + static_cast<double>(p.eps));
    const float fscale = static_cast<float>(scale);
    const float fshift = static_cast<float>(bp[ch] - rmp[ch] * scale);
    affine(xp + u * g.hw, fscale, fshift, g.hw, yp + u * g.hw);
  }
}

void CpuBackend::batchnorm2d_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                           const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dx,
                                           const Tensor& dgamma, const Tensor& dbeta) {
  const BnGeom g(x);
  const float* dyp = dy.f32();
  const float* xp = x.f32();
  const float* gp = gamma.f32();
  const float* smp = save_mean.f32();
  const float* sip = save_invstd.f32();
  float* dxp = dx.defined() ? dx.f32() : nullptr;
  float* dgp = dgamma.defined() ? dgamma.f32() : nullptr;
  float* dbp = dbeta.defined() ? dbeta.f32() : nullptr;
  const int64_t count = g.count();
#pragma omp parallel for schedule(static) if (g.n * g.c * g.hw >= kMinParallelWork)
  for (int64_t ch = 0; ch < g.c; ++ch) {
    const double mean = smp[ch], invstd = sip[ch];
    double sum_dy = 0.0, dot = 0.0;
    for (int64_t i = 0; i < g.n; ++i) {
      sum_dy += sum_f64(dyp + g.plane(i, ch), g.hw);
      dot += sum_dev_dot_f64(xp + g.plane(i, ch), dyp + g.plane(i, ch), g.hw, mean);
    }
    if (dbp) dbp[ch] += static_cast<float>(sum_dy);
    if (dgp) dgp[ch] += static_cast<float>(dot * invstd);
    if (!dxp || count == 0) continue;
    // dx = (dy - mean(dy) - (x - mean) * k) * invstd * gamma, k = dot * invstd^2 / count
    const float fk = static_cast<float>(dot * invstd * invstd / static_cast<double>(count));
    const float fmean = static_cast<float>(mean);
    const float fmdy = static_cast<float>(sum_dy / static_cast<double>(count));
    const float fscale = static_cast<float>(invstd * gp[ch]);
    for (int64_t i = 0; i < g.n; ++i) {
      const float* xs = xp + g.plane(i, ch);
      const float* gs = dyp + g.plane(i, ch);
      float* d = dxp + g.plane(i, ch);
      for (int64_t j = 0; j < g.hw; ++j) d[j] = (gs[j] - fmdy - (xs[j] - fmean) * fk) * fscale;
    }
  }
}

}  // namespace remat
