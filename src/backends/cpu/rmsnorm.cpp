// RMS normalisation over the last dimension (Zhang and Sennrich 2019; LLaMA's RMSNorm):
// per row, rstd = 1 / sqrt(mean(x^2) + eps), saved for backward; y = x * rstd * gamma.
//
// Order of the sums, which the CUDA kernels follow where they can: each row's sum of
// squares (forward) and of g * xhat (dx) in double, element by element; dgamma per channel
// in double over the rows in row order. Rows are independent, so forward and dx are
// parallel over rows; dgamma is parallel over channels. No result depends on the thread
// count.
//
// bf16 storage (training.precision bf16): x, y, dy and dx rows are staged in fp32 (mixed.h),
// gamma (a working copy) widened whole; rstd and dgamma are f32.
#include <cmath>
#include <cstdint>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/mixed.h"
#include "backends/cpu/parallel.h"

namespace remat {

namespace {
constexpr int64_t kRowsPerTask = 16;
constexpr int64_t kChannelBlock = 16;  // dgamma: one 64-byte line of each row at a time
}  // namespace

void CpuBackend::rmsnorm_forward_impl(const Tensor& x, const Tensor& gamma, const RmsNormParams& p, const Tensor& y,
                                      const Tensor& rstd) {
  const float eps = p.eps;
  const int64_t c = x.size(-1), n = rstd.numel();
  const float* g = cpu::f32_all(gamma, 6);
  float* rp = rstd.f32();
  cpu::parallel_for(n, kRowsPerTask, [&](int64_t r0, int64_t r1) {
    cpu::F32Reader rx(x, 0);
    cpu::F32Writer wy(y, 2);
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = rx.row(r, c);
      double ss = 0.0;
      for (int64_t j = 0; j < c; ++j) ss += static_cast<double>(xr[j]) * xr[j];
      const float rs = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(c) + static_cast<double>(eps)));
      rp[r] = rs;
      float* yr = wy.row(r, c);
      for (int64_t j = 0; j < c; ++j) yr[j] = xr[j] * rs * g[j];
      wy.put();
    }
  });
}

void CpuBackend::rmsnorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                                       const Tensor& dx, const Tensor& dgamma) {
  const int64_t c = x.size(-1), n = rstd.numel();
  const float* g = cpu::f32_all(gamma, 6);
  const float* rp = rstd.f32();
  // dgamma first: dx may then alias dy (each row of dx is written after its reads).
  if (dgamma.defined()) {
    float* dg = dgamma.f32();
    cpu::parallel_for(c, kChannelBlock, [&](int64_t j0, int64_t j1) {
      cpu::F32Reader rx(x, 0), rdy(dy, 1);
      double acc[kChannelBlock] = {};
      for (int64_t r = 0; r < n; ++r) {
        const float* xr = rx.get(r * c + j0, j1 - j0);
        const float* dyr = rdy.get(r * c + j0, j1 - j0);
        const float rs = rp[r];
        for (int64_t j = 0; j < j1 - j0; ++j) acc[j] += static_cast<double>(dyr[j]) * (xr[j] * rs);
      }
      for (int64_t j = j0; j < j1; ++j) dg[j] += static_cast<float>(acc[j - j0]);
    });
  }
  if (!dx.defined()) return;
  cpu::parallel_for(n, kRowsPerTask, [&](int64_t r0, int64_t r1) {
    cpu::F32Reader rx(x, 0), rdy(dy, 1);
    cpu::F32Writer wdx(dx, 2);
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = rx.row(r, c);
      const float* dyr = rdy.row(r, c);
      const float rs = rp[r];
      double sum_gx = 0.0;
      for (int64_t j = 0; j < c; ++j) sum_gx += static_cast<double>(dyr[j] * g[j]) * (xr[j] * rs);
      const float mean_gx = static_cast<float>(sum_gx / static_cast<double>(c));
      float* dxr = wdx.row(r, c);  // may be dy's own row (f32): read above, element by element below
      for (int64_t j = 0; j < c; ++j) dxr[j] = rs * (dyr[j] * g[j] - (xr[j] * rs) * mean_gx);
      wdx.put();
    }
  });
}

}  // namespace remat
