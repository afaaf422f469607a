// Layer normalisation over the last dimension (PyTorch's F.layer_norm with an affine
// gamma/beta): per row, mean and rstd = 1 / sqrt(biased variance + eps) are saved for
// backward.
//
// Threading: forward and dx are parallel over rows (each row independent). dgamma and
// dbeta are reductions over rows; they are parallel over fixed blocks of channels, and
// each channel sums its rows sequentially in row order, so the result does not depend
// on the thread count and needs no scratch memory.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backends/cpu/cpu_backend.h"

namespace remat {

namespace {
constexpr int64_t kChannelBlock = 16;  // one 64-byte cache line of floats
// Loops over fewer elements than this run on the calling thread: waking the OpenMP team
// costs more than it saves. (Each element is computed the same way either way.)
constexpr int64_t kParallelMinWork = int64_t{1} << 14;
}  // namespace

void CpuBackend::layernorm_forward_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                                        const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const int64_t c = x.size(-1);
  const int64_t n = mean.numel();
  const float* xp = x.f32();
  const float* g = gamma.f32();
  const float* bt = beta.f32();
  float* yp = y.f32();
  float* mp = mean.f32();
  float* rp = rstd.f32();
#pragma omp parallel for schedule(static) if (n * c >= kParallelMinWork)
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = xp + r * c;
    // Two passes in double: exact enough that the variance never goes negative.
    double s = 0.0;
    for (int64_t j = 0; j < c; ++j) s += xr[j];
    const double mu = s / static_cast<double>(c);
    double ss = 0.0;
    for (int64_t j = 0; j < c; ++j) {
      const double d = xr[j] - mu;
      ss += d * d;
    }
    const double var = ss / static_cast<double>(c);
    const float m = static_cast<float>(mu);
    const float rs = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
    mp[r] = m;
    rp[r] = rs;
    float* yr = yp + r * c;
    for (int64_t j = 0; j < c; ++j) yr[j] = (xr[j] - m) * rs * g[j] + bt[j];
  }
}

void CpuBackend::layernorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                         const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                                         const Tensor& dbeta) {
  const int64_t c = x.size(-1);
  const int64_t n = mean.numel();
  const float* xp = x.f32();
  const float* dyp = dy.f32();
  const float* g = gamma.f32();
  const float* mp = mean.f32();
  const float* rp = rstd.f32();

  // Parameter gradients first: dx may then alias dy or x (each row of dx is written after
  // the reads of its own row).
  if (dgamma.defined() || dbeta.defined()) {
    float* dg = dgamma.defined() ? dgamma.f32() : nullptr;
    float* db = dbeta.defined() ? dbeta.f32() : nullptr;
    const int64_t nblocks = (c + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (n * c >= kParallelMinWork)
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const int64_t j0 = blk * kChannelBlock;
      const int64_t w = std::min(kChannelBlock, c - j0);
      double acc_g[kChannelBlock] = {};
      double acc_b[kChannelBlock] = {};
      for (int64_t r = 0; r < n; ++r) {
        const float* xr = xp + r * c + j0;
        const float* dyr = dyp + r * c + j0;
        const float m = mp[r], rs = rp[r];
        for (int64_t k = 0; k < w; ++k) {
          acc_g[k] += static_cast<double>(dyr[k]) * ((xr[k] - m) * rs);
          acc_b[k] += dyr[k];
        }
      }
      for (int64_t k = 0; k < w; ++k) {
        if (dg) dg[j0 + k] += static_cast<float>(acc_g[k]);
        if (db) db[j0 + k] += static_cast<float>(acc_b[k]);
      }
    }
  }

  if (dx.defined()) {
    float* dxp = dx.f32();
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma.
#pragma omp parallel for schedule(static) if (n * c >= kParallelMinWork)
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = xp + r * c;
      const float* dyr = dyp + r * c;
      const float m = mp[r], rs = rp[r];
      double sum_g = 0.0, sum_gx = 0.0;
      for (int64_t j = 0; j < c; ++j) {
        const float gj = dyr[j] * g[j];
        const float xhat = (xr[j] - m) * rs;
        sum_g += gj;
        sum_gx += static_cast<double>(gj) * xhat;
      }
      const float mean_g = static_cast<float>(sum_g / static_cast<double>(c));
      const float mean_gx = static_cast<float>(sum_gx / static_cast<double>(c));
      float* dxr = dxp + r * c;
      for (int64_t j = 0; j < c; ++j) {
        const float xhat = (xr[j] - m) * rs;
        dxr[j] = rs * (dyr[j] * g[j] - mean_g - xhat * mean_gx);
      }
    }
  }
}

}  // namespace remat
