// GEMM and linear layers through OpenBLAS (row-major cblas_sgemm).
//
// With a bf16 operand (training.precision bf16) the product runs over tiles of C: each
// tile's A and B panels are converted to fp32 (mixed.h), multiplied by cblas_sgemm into
// an fp32 tile, panel after panel along k, and the tile is rounded to bf16 once at the
// end (or added straight into an fp32 C, such as a parameter gradient). Debian's
// OpenBLAS has no bf16 GEMM; whole-tensor copies would cost the memory bf16 saves.
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "backends/cpu/bf16.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/mixed.h"
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

// Rows per task of a parallel conversion of rows of `cols` elements.
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, cpu::kParallelMinWork / std::max<int64_t>(cols, 1)); }

// Rows [r0, r0 + rows) x columns [c0, c0 + cols) of a row-major matrix (leading dimension
// ld, starting `off` elements into t) in fp32: a pointer into t when f32 (*ld_out = ld),
// else converted into staging slot `slot` (*ld_out = cols).
const float* panel(const Tensor& t, int64_t off, int64_t ld, int64_t r0, int64_t c0, int64_t rows, int64_t cols,
                   int slot, int64_t* ld_out) {
  if (!cpu::is_bf16(t)) {
    *ld_out = ld;
    return t.f32() + off + r0 * ld + c0;
  }
  float* buf = cpu::staging(slot, rows * cols);
  const uint16_t* h = t.bf16() + off;
  // In parallel: the GEMM runs on every core, a serial conversion would leave them idle.
  cpu::parallel_for(rows, row_grain(cols), [&](int64_t a, int64_t b) {
    for (int64_t r = a; r < b; ++r) cpu::bf16_to_f32(h + (r0 + r) * ld + c0, buf + r * cols, cols);
  });
  *ld_out = cols;
  return buf;
}

// c[m, n] = alpha * op(a) op(b) + beta * c (beta * c replaced by bias[j] when bias is
// defined), where any of a, b, c may be bf16; the operands start a_off, b_off, c_off
// elements into their tensors, with the leading dimensions of sgemm above. All f32: one
// sgemm, the fp32 path as it always was.
void gemm_mixed(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const Tensor& a, int64_t a_off,
                const Tensor& b, int64_t b_off, float beta, const Tensor& c, int64_t c_off, const Tensor& bias) {
  if (m == 0 || n == 0) return;
  const int64_t lda = ta ? m : k, ldb = tb ? k : n;
  constexpr int64_t kTile = 512;
  const float* pbias = bias.defined() ? cpu::f32_all(bias, 6) : nullptr;
  const bool c_bf16 = cpu::is_bf16(c);
  for (int64_t i0 = 0; i0 < m; i0 += kTile) {
    const int64_t mi = std::min(kTile, m - i0);
    for (int64_t j0 = 0; j0 < n; j0 += kTile) {
      const int64_t nj = std::min(kTile, n - j0);
      // The C tile in fp32: c itself when f32, else a converted copy (only read when beta != 0).
      float* ct;
      int64_t ldc;
      if (c_bf16) {
        ct = cpu::staging(5, mi * nj);
        ldc = nj;
        if (beta != 0.0f && !pbias)
          cpu::parallel_for(mi, row_grain(nj), [&](int64_t a, int64_t b) {
            for (int64_t r = a; r < b; ++r) cpu::bf16_to_f32(c.bf16() + c_off + (i0 + r) * n + j0, ct + r * nj, nj);
          });
      } else {
        ct = c.f32() + c_off + i0 * n + j0;
        ldc = n;
      }
      float first_beta = beta;
      if (pbias) {
        for (int64_t r = 0; r < mi; ++r) std::copy(pbias + j0, pbias + j0 + nj, ct + r * ldc);
        first_beta = 1.0f;
      }
      if (k == 0) {
        for (int64_t r = 0; r < mi; ++r)
          for (int64_t j = 0; j < nj; ++j) ct[r * ldc + j] = first_beta == 0.0f ? 0.0f : first_beta * ct[r * ldc + j];
      }
      for (int64_t k0 = 0; k0 < k; k0 += kTile) {
        const int64_t kk = std::min(kTile, k - k0);
        int64_t la = 0, lb = 0;
        const float* pa =
            ta ? panel(a, a_off, lda, k0, i0, kk, mi, 3, &la) : panel(a, a_off, lda, i0, k0, mi, kk, 3, &la);
        const float* pb =
            tb ? panel(b, b_off, ldb, j0, k0, nj, kk, 4, &lb) : panel(b, b_off, ldb, k0, j0, kk, nj, 4, &lb);
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(mi),
                    static_cast<int>(nj), static_cast<int>(kk), alpha, pa, static_cast<int>(la), pb,
                    static_cast<int>(lb), k0 == 0 ? first_beta : 1.0f, ct, static_cast<int>(ldc));
      }
      if (c_bf16)
        cpu::parallel_for(mi, row_grain(nj), [&](int64_t a, int64_t b) {
          for (int64_t r = a; r < b; ++r) cpu::f32_to_bf16(ct + r * nj, c.bf16() + c_off + (i0 + r) * n + j0, nj);
        });
    }
  }
}

// out[j] += sum over rows of x[r, j] for a bf16 x: column_sums' blocks and order (parallel.cpp)
// over the rows converted one at a time, so the same bits as column_sums of the fp32 values.
void column_sums_bf16(const Tensor& x, int64_t rows, int64_t cols, float* out) {
  constexpr int64_t kRowBlock = 256;
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  std::vector<float> partial(static_cast<size_t>(std::max<int64_t>(blocks, 1) * cols), 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    cpu::F32Reader rx(x, 0);
    float* acc = partial.data() + blk * cols;
    const int64_t r1 = std::min(rows, (blk + 1) * kRowBlock);
    for (int64_t r = blk * kRowBlock; r < r1; ++r) {
      const float* row = rx.row(r, cols);
      for (int64_t j = 0; j < cols; ++j) acc[j] += row[j];
    }
  }
  for (int64_t j = 0; j < cols; ++j) {
    float s = 0.0f;
    for (int64_t blk = 0; blk < blocks; ++blk) s += partial[static_cast<size_t>(blk * cols + j)];
    out[j] += s;
  }
}

}  // namespace

void CpuBackend::gemm_impl(const Tensor& a, const Tensor& b, const Tensor& c, const GemmParams& p) {
  const int64_t m = c.size(-2), n = c.size(-1);
  const int64_t k = p.trans_a ? a.size(-2) : a.size(-1);
  const int64_t batch = m * n == 0 ? 0 : c.numel() / (m * n);
  const bool shared_b = b.rank() == 2;
  if (!cpu::all_f32({&a, &b, &c})) {
    for (int64_t i = 0; i < batch; ++i)
      gemm_mixed(p.trans_a, p.trans_b, m, n, k, p.alpha, a, i * m * k, b, shared_b ? 0 : i * k * n, p.beta, c,
                 i * m * n, Tensor());
    return;
  }
  for (int64_t i = 0; i < batch; ++i) {
    sgemm(p.trans_a, p.trans_b, m, n, k, p.alpha, a.f32() + i * m * k, b.f32() + (shared_b ? 0 : i * k * n), p.beta,
          c.f32() + i * m * n);
  }
}

void CpuBackend::linear_forward_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  const int64_t in = w.size(1), out = w.size(0), rows = in == 0 ? x.numel() : x.numel() / in;
  if (!cpu::all_f32({&x, &w, &b, &y})) return gemm_mixed(false, true, rows, out, in, 1.0f, x, 0, w, 0, 0.0f, y, 0, b);
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
  if (!cpu::all_f32({&dy, &x, &w, &dx, &dw, &db})) {
    if (dx.defined()) gemm_mixed(false, false, rows, in, out, 1.0f, dy, 0, w, 0, 0.0f, dx, 0, Tensor());
    if (dw.defined()) gemm_mixed(true, false, out, in, rows, 1.0f, dy, 0, x, 0, 1.0f, dw, 0, Tensor());
    if (db.defined()) {
      if (cpu::is_bf16(dy))
        column_sums_bf16(dy, rows, out, db.f32());
      else
        cpu::column_sums(dy.f32(), rows, out, db.f32(), /*accumulate=*/true);
    }
    return;
  }
  if (dx.defined()) sgemm(false, false, rows, in, out, 1.0f, dy.f32(), w.f32(), 0.0f, dx.f32());
  if (dw.defined()) sgemm(true, false, out, in, rows, 1.0f, dy.f32(), x.f32(), 1.0f, dw.f32());
  if (db.defined()) cpu::column_sums(dy.f32(), rows, out, db.f32(), /*accumulate=*/true);
}

}  // namespace remat
