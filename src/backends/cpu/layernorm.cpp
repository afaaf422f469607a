// Layer normalisation over the last dimension (PyTorch's F.layer_norm with an affine
// gamma/beta): per row, mean and rstd = 1 / sqrt(biased variance + eps) are saved for
// backward.
//
// Threading: forward and dx are parallel over rows (each row independent). dgamma and
// dbeta are reductions over rows; they are parallel over fixed blocks of channels, and
// each channel sums its rows sequentially in row order, so the result does not depend
// on the thread count and needs no scratch memory.
//
// The forward's row sums use kLanes partial sums in double (element j goes to lane
// j % kLanes), combined pairwise: a fixed order that vectorises. The row function is
// compiled for the baseline, AVX2 and AVX-512 (cpu::simd() picks one); the same
// operations in the same order, so the same bits.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/mixed.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/simd.h"

namespace remat {

namespace {
constexpr int64_t kChannelBlock = 16;  // one 64-byte cache line of floats
constexpr int kLanes = 8;

inline double lane_combine(double* acc) {
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

// One row: mean, rstd and y. Two passes in double: exact enough that the variance never
// goes negative.
inline void forward_row(const float* xr, int64_t c, const float* g, const float* bt, float eps, float* yr, float* m_out,
                        float* rs_out) {
  double acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= c; j += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += static_cast<double>(xr[j + k]);
  for (int k = 0; j + k < c; ++k) acc[k] += static_cast<double>(xr[j + k]);
  const double mu = lane_combine(acc) / static_cast<double>(c);
  double sq[kLanes] = {};
  for (j = 0; j + kLanes <= c; j += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      const double d = static_cast<double>(xr[j + k]) - mu;
      sq[k] += d * d;
    }
  for (int k = 0; j + k < c; ++k) {
    const double d = static_cast<double>(xr[j + k]) - mu;
    sq[k] += d * d;
  }
  const double var = lane_combine(sq) / static_cast<double>(c);
  const float m = static_cast<float>(mu);
  const float rs = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
  *m_out = m;
  *rs_out = rs;
  for (j = 0; j < c; ++j) yr[j] = (xr[j] - m) * rs * g[j] + bt[j];
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define REMAT_LAYERNORM_X86 1
__attribute__((target("avx2"))) void forward_row_avx2(const float* xr, int64_t c, const float* g, const float* bt,
                                                      float eps, float* yr, float* m, float* rs) {
  forward_row(xr, c, g, bt, eps, yr, m, rs);
}
__attribute__((target("avx512f"))) void forward_row_avx512(const float* xr, int64_t c, const float* g, const float* bt,
                                                           float eps, float* yr, float* m, float* rs) {
  forward_row(xr, c, g, bt, eps, yr, m, rs);
}
#endif

}  // namespace

void CpuBackend::layernorm_forward_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                        const LayerNormParams& p, const Tensor& y, const Tensor& mean,
                                        const Tensor& rstd) {
  const float eps = p.eps;
  const int64_t c = x.size(-1);
  const int64_t n = mean.numel();
  // x, gamma, beta and y may be bf16: rows staged in fp32 (mixed.h); mean and rstd are f32.
  const float* g = cpu::f32_all(gamma, 6);
  const float* bt = cpu::f32_all(beta, 7);
  float* mp = mean.f32();
  float* rp = rstd.f32();
  const cpu::Simd level = cpu::simd();
#pragma omp parallel for schedule(static) if (n * c >= cpu::kParallelMinWork)
  for (int64_t r = 0; r < n; ++r) {
    cpu::F32Reader rx(x, 0);
    cpu::F32Writer wy(y, 2);
    const float* xr = rx.row(r, c);
    float* yr = wy.row(r, c);
#ifdef REMAT_LAYERNORM_X86
    if (level == cpu::Simd::avx512)
      forward_row_avx512(xr, c, g, bt, eps, yr, mp + r, rp + r);
    else if (level == cpu::Simd::avx2)
      forward_row_avx2(xr, c, g, bt, eps, yr, mp + r, rp + r);
    else
#endif
      forward_row(xr, c, g, bt, eps, yr, mp + r, rp + r);
    wy.put();
  }
}

size_t cpu::layernorm_backward_workspace(const Shape&) { return 0; }

size_t CpuBackend::layernorm_backward_workspace_impl(const Shape& x) { return cpu::layernorm_backward_workspace(x); }

void CpuBackend::layernorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                         const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                                         const Tensor& dbeta, const Tensor& /*workspace: none needed*/) {
  const int64_t c = x.size(-1);
  const int64_t n = mean.numel();
  const float* g = cpu::f32_all(gamma, 6);
  const float* mp = mean.f32();
  const float* rp = rstd.f32();

  // Parameter gradients first: dx may then alias dy or x (each row of dx is written after
  // the reads of its own row).
  if (dgamma.defined() || dbeta.defined()) {
    float* dg = dgamma.defined() ? dgamma.f32() : nullptr;
    float* db = dbeta.defined() ? dbeta.f32() : nullptr;
    const int64_t nblocks = (c + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (n * c >= cpu::kParallelMinWork)
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const int64_t j0 = blk * kChannelBlock;
      const int64_t w = std::min(kChannelBlock, c - j0);
      double acc_g[kChannelBlock] = {};
      double acc_b[kChannelBlock] = {};
      cpu::F32Reader rx(x, 0), rdy(dy, 1);
      for (int64_t r = 0; r < n; ++r) {
        const float* xr = rx.get(r * c + j0, w);
        const float* dyr = rdy.get(r * c + j0, w);
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
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma.
#pragma omp parallel for schedule(static) if (n * c >= cpu::kParallelMinWork)
    for (int64_t r = 0; r < n; ++r) {
      cpu::F32Reader rx(x, 0), rdy(dy, 1);
      cpu::F32Writer wdx(dx, 2);
      const float* xr = rx.row(r, c);
      const float* dyr = rdy.row(r, c);
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
      float* dxr = wdx.row(r, c);  // may be dy's or x's own row (f32): read above, element by element below
      for (int64_t j = 0; j < c; ++j) {
        const float xhat = (xr[j] - m) * rs;
        dxr[j] = rs * (dyr[j] * g[j] - mean_g - xhat * mean_gx);
      }
      wdx.put();
    }
  }
}

}  // namespace remat
