// conv2d on the CPU: im2col + OpenBLAS sgemm, a chunk of images at a time.
//
// For a chunk of nb images the column matrix is col [C*R*S, nb*P*Q] (row (c, r, s), column
// (image, p, q)), so one GEMM per group covers the whole chunk:
//   forward   ybuf[Kg, L]   = w_g [Kg, Cg*R*S] @ col_g            (L = nb * P * Q)
//   backward  dw_g          += dybuf_g @ col_g^T
//             col_g         = w_g^T @ dybuf_g, then col2im into dx
// ybuf / dybuf hold the chunk's outputs K-major ([K, nb, P*Q]); when a chunk is a single
// image they are y / dy themselves. The chunk size depends only on the shapes, so the
// workspace (col, plus ybuf when nb > 1) does too: the meta backend reuses the query.
//
// Determinism: im2col and the K-major copies are plain copies; col2im sums each dx
// element over (r, s, p, q) in a fixed order within one thread (parallel over (image,
// channel) planes); db sums each channel in double in a fixed order; the GEMMs are
// OpenBLAS's, whose threading splits the output, never the reduction. So results do not
// depend on the OpenMP thread count. cblas is only called from the calling thread, never
// from inside an OpenMP region.
#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "remat/error.h"

namespace remat {

namespace {

// Columns (image positions) a chunk aims for: OpenBLAS reaches its full two-thread rate
// from about 4k columns at the GEMM shapes of CNN layers. The column matrix is capped at
// kMaxColBytes, but a chunk always holds at least one image.
constexpr int64_t kTargetColumns = 4096;
constexpr int64_t kMaxColBytes = int64_t{16} << 20;

struct ConvGeom {
  int64_t n, c, h, w;      // input
  int64_t k, r, s;         // filters
  int64_t p, q;            // output plane
  int64_t sh, sw, ph, pw, dh, dw;
  int64_t groups, cg, kg;  // channels and filters per group
  int64_t rows;            // C * R * S: rows of the column matrix
  int64_t plane;           // P * Q
  int64_t nb;              // images per chunk
  bool direct;             // nb == 1: GEMMs read and write y / dy in place

  ConvGeom(const Shape& x, const Shape& wt, const Conv2dParams& prm) {
    n = x[0], c = x[1], h = x[2], w = x[3];
    k = wt[0], r = wt[2], s = wt[3];
    sh = prm.stride_h, sw = prm.stride_w, ph = prm.pad_h, pw = prm.pad_w;
    dh = prm.dilation_h, dw = prm.dilation_w;
    groups = prm.groups;
    cg = c / groups, kg = k / groups;
    p = (h + 2 * ph - dh * (r - 1) - 1) / sh + 1;
    q = (w + 2 * pw - dw * (s - 1) - 1) / sw + 1;
    rows = c * r * s;
    plane = p * q;
    nb = 1;
    if (plane > 0 && n > 0) {
      nb = std::max<int64_t>(1, kTargetColumns / plane);
      const int64_t col_bytes_per_image = std::max<int64_t>(1, rows * plane * 4);
      nb = std::min(nb, std::max<int64_t>(1, kMaxColBytes / col_bytes_per_image));
      nb = std::min(nb, n);
    }
    direct = nb == 1;
  }

  bool empty() const { return n == 0 || k == 0 || plane == 0; }
  // Workspace floats: col, plus the K-major chunk buffer when chunks hold several images.
  int64_t col_floats() const { return rows * nb * plane; }
  int64_t buf_floats() const { return direct ? 0 : k * nb * plane; }
  size_t workspace_bytes() const {
    if (empty() || rows == 0) return 0;
    return static_cast<size_t>(col_floats() + buf_floats()) * sizeof(float);
  }
};

// First output index o >= 0 with o * stride >= t.
inline int64_t first_at_least(int64_t t, int64_t stride) { return t <= 0 ? 0 : (t + stride - 1) / stride; }

// Output range [lo, hi) whose input coordinate o * stride + off lies in [0, size).
inline void valid_range(int64_t off, int64_t stride, int64_t size, int64_t out, int64_t* lo, int64_t* hi) {
  *lo = std::min(out, first_at_least(-off, stride));
  *hi = std::min(out, std::max(*lo, first_at_least(size - off, stride)));
}

// col[(c, r, s), (i, p, q)] = x[n0 + i, c, p*sh - ph + r*dh, q*sw - pw + s*dw] (0 outside).
void im2col(const ConvGeom& g, const float* x, int64_t n0, int64_t nb, float* col) {
  const int64_t len = nb * g.plane, units = g.rows * nb;
#pragma omp parallel for schedule(static)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t row = u / nb, i = u % nb;
    const int64_t ch = row / (g.r * g.s), rr = (row / g.s) % g.r, ss = row % g.s;
    const float* src = x + ((n0 + i) * g.c + ch) * g.h * g.w;
    float* dst = col + row * len + i * g.plane;
    const int64_t hoff = rr * g.dh - g.ph, woff = ss * g.dw - g.pw;
    int64_t p_lo, p_hi, q_lo, q_hi;
    valid_range(hoff, g.sh, g.h, g.p, &p_lo, &p_hi);
    valid_range(woff, g.sw, g.w, g.q, &q_lo, &q_hi);
    std::fill(dst, dst + p_lo * g.q, 0.0f);
    for (int64_t pp = p_lo; pp < p_hi; ++pp) {
      float* d = dst + pp * g.q;
      const float* srow = src + (pp * g.sh + hoff) * g.w + woff;
      std::fill(d, d + q_lo, 0.0f);
      if (g.sw == 1) {
        std::memcpy(d + q_lo, srow + q_lo, static_cast<size_t>(q_hi - q_lo) * sizeof(float));
      } else {
        for (int64_t qq = q_lo; qq < q_hi; ++qq) d[qq] = srow[qq * g.sw];
      }
      std::fill(d + q_hi, d + g.q, 0.0f);
    }
    std::fill(dst + p_hi * g.q, dst + g.plane, 0.0f);
  }
}

// dx[n0 + i, c] = sum over (r, s, p, q) of col at the positions im2col read from.
// One (image, channel) plane per iteration, summed in a fixed order.
void col2im(const ConvGeom& g, const float* col, int64_t n0, int64_t nb, float* dx) {
  const int64_t len = nb * g.plane, units = nb * g.c;
#pragma omp parallel for schedule(static)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t i = u / g.c, ch = u % g.c;
    float* dst = dx + ((n0 + i) * g.c + ch) * g.h * g.w;
    std::fill(dst, dst + g.h * g.w, 0.0f);
    for (int64_t rr = 0; rr < g.r; ++rr) {
      const int64_t hoff = rr * g.dh - g.ph;
      int64_t p_lo, p_hi;
      valid_range(hoff, g.sh, g.h, g.p, &p_lo, &p_hi);
      for (int64_t ss = 0; ss < g.s; ++ss) {
        const int64_t woff = ss * g.dw - g.pw;
        int64_t q_lo, q_hi;
        valid_range(woff, g.sw, g.w, g.q, &q_lo, &q_hi);
        const float* src = col + ((ch * g.r + rr) * g.s + ss) * len + i * g.plane;
        for (int64_t pp = p_lo; pp < p_hi; ++pp) {
          float* drow = dst + (pp * g.sh + hoff) * g.w + woff;
          const float* srow = src + pp * g.q;
          if (g.sw == 1) {
            for (int64_t qq = q_lo; qq < q_hi; ++qq) drow[qq] += srow[qq];
          } else {
            for (int64_t qq = q_lo; qq < q_hi; ++qq) drow[qq * g.sw] += srow[qq];
          }
        }
      }
    }
  }
}

// Row-major C[m, n] = alpha * op(A) @ op(B) + beta * C.
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t kk, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(kk), 1.0f, a, static_cast<int>(std::max<int64_t>(1, lda)), b,
              static_cast<int>(std::max<int64_t>(1, ldb)), beta, c, static_cast<int>(std::max<int64_t>(1, ldc)));
}

void check_gemm_dims(const ConvGeom& g) {
  // cblas takes int dimensions.
  constexpr int64_t kMax = 2147483647;
  REMAT_CHECK(g.rows <= kMax && g.nb * g.plane <= kMax && g.k <= kMax,
              "conv2d: a GEMM dimension exceeds the int range of cblas");
}

}  // namespace

size_t CpuBackend::conv2d_forward_workspace_impl(const Shape& x, const Shape& w, const Conv2dParams& p) {
  return ConvGeom(x, w, p).workspace_bytes();
}

size_t CpuBackend::conv2d_backward_workspace_impl(const Shape& x, const Shape& w, const Conv2dParams& p) {
  return ConvGeom(x, w, p).workspace_bytes();
}

void CpuBackend::conv2d_forward_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& prm,
                                     const Tensor& y, const Tensor& workspace) {
  const ConvGeom g(x.shape(), w.shape(), prm);
  if (g.empty()) return;
  check_gemm_dims(g);
  const float* xp = x.f32();
  const float* wp = w.f32();
  const float* bp = b.defined() ? b.f32() : nullptr;
  float* yp = y.f32();
  const int64_t kplane = g.k * g.plane;
  if (g.rows == 0) {  // no input channels: y is the bias
#pragma omp parallel for schedule(static)
    for (int64_t u = 0; u < g.n * g.k; ++u)
      std::fill(yp + u * g.plane, yp + (u + 1) * g.plane, bp ? bp[u % g.k] : 0.0f);
    return;
  }
  float* col = workspace.f32();
  float* buf = col + g.col_floats();
  const int64_t grows = g.cg * g.r * g.s;
  for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) {
    const int64_t nb = std::min(g.nb, g.n - n0), len = nb * g.plane;
    im2col(g, xp, n0, nb, col);
    float* out = g.direct ? yp + n0 * kplane : buf;
    for (int64_t gi = 0; gi < g.groups; ++gi)
      sgemm(false, false, g.kg, len, grows, wp + gi * g.kg * grows, grows, col + gi * grows * len, len, 0.0f,
            out + gi * g.kg * len, len);
    // Bias, and the K-major chunk back to NCHW.
    const int64_t units = nb * g.k;
    if (g.direct && bp) {
#pragma omp parallel for schedule(static)
      for (int64_t kk = 0; kk < g.k; ++kk) {
        float* d = out + kk * g.plane;
        const float bias = bp[kk];
        for (int64_t j = 0; j < g.plane; ++j) d[j] += bias;
      }
    } else if (!g.direct) {
#pragma omp parallel for schedule(static)
      for (int64_t u = 0; u < units; ++u) {
        const int64_t i = u / g.k, kk = u % g.k;
        const float* s = buf + kk * len + i * g.plane;
        float* d = yp + (n0 + i) * kplane + kk * g.plane;
        const float bias = bp ? bp[kk] : 0.0f;
        for (int64_t j = 0; j < g.plane; ++j) d[j] = s[j] + bias;
      }
    }
  }
}

void CpuBackend::conv2d_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Conv2dParams& prm,
                                      const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& workspace) {
  const ConvGeom g(x.shape(), w.shape(), prm);
  const float* dyp = dy.f32();
  const int64_t kplane = g.k * g.plane;

  if (db.defined() && g.n > 0) {
    float* dbp = db.f32();
#pragma omp parallel for schedule(static)
    for (int64_t kk = 0; kk < g.k; ++kk) {
      double sum = 0.0;
      for (int64_t i = 0; i < g.n; ++i) {
        const float* s = dyp + i * kplane + kk * g.plane;
        // Four partial sums (fixed order) for instruction-level parallelism.
        double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        int64_t j = 0;
        for (; j + 4 <= g.plane; j += 4) {
          a0 += s[j];
          a1 += s[j + 1];
          a2 += s[j + 2];
          a3 += s[j + 3];
        }
        for (; j < g.plane; ++j) a0 += s[j];
        sum += (a0 + a1) + (a2 + a3);
      }
      dbp[kk] += static_cast<float>(sum);
    }
  }

  const bool need_dx = dx.defined(), need_dw = dw.defined();
  if (!need_dx && !need_dw) return;
  if (g.empty() || g.rows == 0) {
    // No output positions or no input channels: dx gets nothing, dw nothing to add.
    if (need_dx) std::fill(dx.f32(), dx.f32() + dx.numel(), 0.0f);
    return;
  }
  check_gemm_dims(g);
  const float* xp = x.f32();
  const float* wp = w.f32();
  float* dxp = need_dx ? dx.f32() : nullptr;
  float* dwp = need_dw ? dw.f32() : nullptr;
  float* col = workspace.f32();
  float* buf = col + g.col_floats();
  const int64_t grows = g.cg * g.r * g.s;
  for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) {
    const int64_t nb = std::min(g.nb, g.n - n0), len = nb * g.plane;
    const float* grad = dyp + n0 * kplane;
    if (!g.direct) {  // dy of the chunk, K-major
      const int64_t units = nb * g.k;
#pragma omp parallel for schedule(static)
      for (int64_t u = 0; u < units; ++u) {
        const int64_t i = u / g.k, kk = u % g.k;
        std::memcpy(buf + kk * len + i * g.plane, dyp + (n0 + i) * kplane + kk * g.plane,
                    static_cast<size_t>(g.plane) * sizeof(float));
      }
      grad = buf;
    }
    if (need_dw) {
      im2col(g, xp, n0, nb, col);
      for (int64_t gi = 0; gi < g.groups; ++gi)
        sgemm(false, true, g.kg, grows, len, grad + gi * g.kg * len, len, col + gi * grows * len, len, 1.0f,
              dwp + gi * g.kg * grows, grows);
    }
    if (need_dx) {
      for (int64_t gi = 0; gi < g.groups; ++gi)
        sgemm(true, false, grows, len, g.kg, wp + gi * g.kg * grows, grows, grad + gi * g.kg * len, len, 0.0f,
              col + gi * grows * len, len);
      col2im(g, col, n0, nb, dxp);
    }
  }
}

}  // namespace remat
