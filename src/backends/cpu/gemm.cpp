// GEMM and linear layers through OpenBLAS (row-major cblas_sgemm).
#include <cblas.h>

#include <algorithm>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/parallel.h"

namespace remat {

namespace {

// c[m, n] = alpha * op(a) op(b) + beta * c for row-major matrices.
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b, float beta,
           float* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // cblas may not scale c when k == 0
    for (int64_t i = 0; i < m * n; ++i) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(ta ? m : k), b,
              static_cast<int>(tb ? k : n), beta, c, static_cast<int>(n));
}

}  // namespace

void CpuBackend::gemm_impl(const Tensor& a, const Tensor& b, const Tensor& c, const GemmParams& p) {
  const int64_t m = c.size(-2), n = c.size(-1);
  const int64_t k = p.trans_a ? a.size(-2) : a.size(-1);
  const int64_t batch = m * n == 0 ? 0 : c.numel() / (m * n);
  const bool shared_b = b.rank() == 2;
  for (int64_t i = 0; i < batch; ++i) {
    sgemm(p.trans_a, p.trans_b, m, n, k, p.alpha, a.f32() + i * m * k, b.f32() + (shared_b ? 0 : i * k * n), p.beta,
          c.f32() + i * m * n);
  }
}

void CpuBackend::linear_forward_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  const int64_t in = w.size(1), out = w.size(0), rows = in == 0 ? x.numel() : x.numel() / in;
  float* py = y.f32();
  if (b.defined()) {
    const float* pb = b.f32();
    cpu::parallel_for(rows, 64, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) std::copy(pb, pb + out, py + r * out);
    });
  }
  sgemm(false, true, rows, out, in, 1.0f, x.f32(), w.f32(), b.defined() ? 1.0f : 0.0f, py);
}

void CpuBackend::linear_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx,
                                      const Tensor& dw, const Tensor& db) {
  const int64_t in = w.size(1), out = w.size(0), rows = dy.numel() / std::max<int64_t>(out, 1);
  if (dx.defined()) sgemm(false, false, rows, in, out, 1.0f, dy.f32(), w.f32(), 0.0f, dx.f32());
  if (dw.defined()) sgemm(true, false, out, in, rows, 1.0f, dy.f32(), x.f32(), 1.0f, dw.f32());
  if (db.defined()) cpu::column_sums(dy.f32(), rows, out, db.f32(), /*accumulate=*/true);
}

}  // namespace remat
