// conv2d on the CPU: im2col + a packed GEMM of our own, a chunk of images at a time.
//
// For a chunk of nb images, L = nb * P * Q output positions, each group g computes
//   forward   y_g [Kg, L]         = w_g [Kg, Cg*R*S] @ col_g [Cg*R*S, L]   (+ bias)
//   backward  dw_g [Kg, Cg*R*S]  += dy_g [Kg, L] @ col_g^T
//             col_g               = w_g^T @ dy_g, then col2im into dx
// im2col writes the column matrix straight into the panel layout the GEMM micro-kernel
// reads (no separate packing pass), and the GEMM epilogue writes y (NCHW, plus bias),
// dw (+=) or the plain column matrix for col2im directly.
//
// Why not cblas_sgemm: OpenBLAS's pthread build runs its own thread pool beside OpenMP's,
// and on a small machine the two oversubscribe the cores at every im2col/GEMM hand-over
// (measured on 2 cores: 3-5x slower than either pool alone); and its results change with
// its thread count. Here every loop, the GEMM included, is an OpenMP loop over disjoint
// outputs, and each output element is summed by one thread in a fixed order (an FMA
// chain over k), so results are bitwise identical for any thread count. The micro-kernel
// has AVX-512 and AVX2 versions chosen at run time and a portable one; all three compute
// the same FMA chain, so they agree bit for bit.
//
// Workspace: the packed operands of one chunk. The chunk size, and so the workspace,
// depends only on the shapes (the meta backend reuses the queries).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define REMAT_CONV_X86 1
#endif

#include "backends/cpu/cpu_backend.h"
#include "remat/error.h"

namespace remat {

namespace {

// ---- The GEMM micro-kernel: tile[MR][NR] = sum over k of a[k][i] * b[k][j] ----------------
// A panel holds MR rows of A, k-major (a[k * MR + i]); a B panel NR columns of B, k-major
// (b[k * NR + j]). Rows past M and columns past N are zero-filled and their results dropped.
constexpr int64_t MR = 8;
constexpr int64_t NR = 32;

using MicroKernel = void (*)(int64_t kdim, const float* a, const float* b, float* tile);

void micro_kernel_portable(int64_t kdim, const float* a, const float* b, float* tile) {
  float acc[MR][NR] = {};
  for (int64_t k = 0; k < kdim; ++k)
    for (int64_t i = 0; i < MR; ++i) {
      const float av = a[k * MR + i];
      for (int64_t j = 0; j < NR; ++j) acc[i][j] = std::fma(av, b[k * NR + j], acc[i][j]);
    }
  std::memcpy(tile, acc, sizeof(acc));
}

#ifdef REMAT_CONV_X86
__attribute__((target("avx512f"))) void micro_kernel_avx512(int64_t kdim, const float* a, const float* b,
                                                             float* tile) {
  __m512 acc[MR][2];
  for (int64_t i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kdim; ++k) {
    const __m512 b0 = _mm512_loadu_ps(b + k * NR), b1 = _mm512_loadu_ps(b + k * NR + 16);
    for (int64_t i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(a[k * MR + i]);
      acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);
    }
  }
  for (int64_t i = 0; i < MR; ++i) {
    _mm512_storeu_ps(tile + i * NR, acc[i][0]);
    _mm512_storeu_ps(tile + i * NR + 16, acc[i][1]);
  }
}

// 16 ymm registers: the tile in four 4 x 16 quarters (8 accumulators each).
__attribute__((target("avx2,fma"))) void micro_kernel_avx2(int64_t kdim, const float* a, const float* b,
                                                            float* tile) {
  for (int64_t i0 = 0; i0 < MR; i0 += 4)
    for (int64_t j0 = 0; j0 < NR; j0 += 16) {
      __m256 acc[4][2];
      for (int64_t i = 0; i < 4; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
      for (int64_t k = 0; k < kdim; ++k) {
        const __m256 b0 = _mm256_loadu_ps(b + k * NR + j0), b1 = _mm256_loadu_ps(b + k * NR + j0 + 8);
        for (int64_t i = 0; i < 4; ++i) {
          const __m256 av = _mm256_broadcast_ss(a + k * MR + i0 + i);
          acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
          acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
        }
      }
      for (int64_t i = 0; i < 4; ++i) {
        _mm256_storeu_ps(tile + (i0 + i) * NR + j0, acc[i][0]);
        _mm256_storeu_ps(tile + (i0 + i) * NR + j0 + 8, acc[i][1]);
      }
    }
}
#endif

MicroKernel pick_micro_kernel() {
#ifdef REMAT_CONV_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return micro_kernel_avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return micro_kernel_avx2;
#endif
  return micro_kernel_portable;
}

const MicroKernel micro_kernel = pick_micro_kernel();

inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
inline int64_t ceil_div(int64_t v, int64_t m) { return (v + m - 1) / m; }

// Below this much work a loop runs on the calling thread (results are the same either way).
constexpr int64_t kMinParallelWork = int64_t{1} << 15;

// Packed GEMM over `groups` independent problems: C_g [M, N] = A_g [M, K] @ B_g [K, N], with
// A_g in MR-row panels (a + g * a_stride) and B_g in NR-column panels (b + g * b_stride).
// store(g, i0, j0, mr, nr, tile) receives each tile (row stride NR); tiles are disjoint,
// one thread each.
template <class Store>
void packed_gemm(int64_t groups, int64_t m, int64_t n, int64_t kdim, const float* a, int64_t a_stride,
                 const float* b, int64_t b_stride, const Store& store) {
  const int64_t mp = ceil_div(m, MR), np = ceil_div(n, NR), tiles = groups * np * mp;
  const bool par = tiles * MR * NR * std::max<int64_t>(kdim, 1) >= 64 * kMinParallelWork;
  // Consecutive tiles share a B panel (it stays in cache while all A panels pass over it).
#pragma omp parallel for schedule(static) if (par)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t g = t / (np * mp), jp = (t / mp) % np, ip = t % mp;
    alignas(64) float tile[MR * NR];
    micro_kernel(kdim, a + g * a_stride + ip * MR * kdim, b + g * b_stride + jp * NR * kdim, tile);
    store(g, ip * MR, jp * NR, std::min(MR, m - ip * MR), std::min(NR, n - jp * NR), tile);
  }
}

// ---- Geometry and chunking -------------------------------------------------------------

// Output positions (columns) a chunk aims for: enough tiles for every thread and few
// hand-overs between loops. The packed column matrix is capped at kMaxColBytes, but a
// chunk always holds at least one image.
constexpr int64_t kTargetColumns = 4096;
constexpr int64_t kMaxColBytes = int64_t{16} << 20;

struct ConvGeom {
  int64_t n, c, h, w;      // input
  int64_t k, r, s;         // filters
  int64_t p, q;            // output plane
  int64_t sh, sw, ph, pw, dh, dw;
  int64_t groups, cg, kg;  // channels and filters per group
  int64_t grows;           // Cg * R * S: rows of a group's column matrix (GEMM depth forward)
  int64_t plane;           // P * Q
  int64_t nb;              // images per chunk
  int64_t len, len_pad;    // columns of a full chunk, and rounded up to NR

  ConvGeom(const Shape& x, const Shape& wt, const Conv2dParams& prm) {
    n = x[0], c = x[1], h = x[2], w = x[3];
    k = wt[0], r = wt[2], s = wt[3];
    sh = prm.stride_h, sw = prm.stride_w, ph = prm.pad_h, pw = prm.pad_w;
    dh = prm.dilation_h, dw = prm.dilation_w;
    groups = prm.groups;
    cg = c / groups, kg = k / groups;
    p = (h + 2 * ph - dh * (r - 1) - 1) / sh + 1;
    q = (w + 2 * pw - dw * (s - 1) - 1) / sw + 1;
    grows = cg * r * s;
    plane = p * q;
    nb = 1;
    if (plane > 0 && n > 0) {
      nb = std::max<int64_t>(1, kTargetColumns / plane);
      const int64_t col_bytes_per_image = std::max<int64_t>(1, c * r * s * plane * 4);
      nb = std::min(nb, std::max<int64_t>(1, kMaxColBytes / col_bytes_per_image));
      nb = std::min(nb, n);
    }
    len = nb * plane;
    len_pad = round_up(len, NR);
  }

  // Nothing to compute (empty output, or no input channels: y is the bias, dx and dw get 0).
  bool trivial() const { return n == 0 || k == 0 || plane == 0 || grows == 0; }

  // Forward workspace (floats): packed w (A panels) and the packed column matrix (B panels).
  int64_t fwd_a() const { return groups * round_up(kg, MR) * grows; }
  int64_t fwd_b() const { return groups * grows * len_pad; }
  // Backward: packed w^T (A for dx), dy as A panels (for dw) and as B panels (for dx), and
  // one buffer for col^T in B panels (for dw) and then the plain column matrix (for dx).
  int64_t bwd_wt() const { return groups * round_up(grows, MR) * kg; }
  int64_t bwd_dya() const { return groups * round_up(kg, MR) * len; }
  int64_t bwd_dyb() const { return groups * kg * len_pad; }
  int64_t bwd_col() const { return std::max(groups * round_up(grows, NR) * len, groups * grows * len); }

  size_t fwd_bytes() const { return trivial() ? 0 : static_cast<size_t>(fwd_a() + fwd_b()) * sizeof(float); }
  size_t bwd_bytes() const {
    return trivial() ? 0 : static_cast<size_t>(bwd_wt() + bwd_dya() + bwd_dyb() + bwd_col()) * sizeof(float);
  }
};

// First output index o >= 0 with o * stride >= t.
inline int64_t first_at_least(int64_t t, int64_t stride) { return t <= 0 ? 0 : (t + stride - 1) / stride; }

// Output range [lo, hi) whose input coordinate o * stride + off lies in [0, size).
inline void valid_range(int64_t off, int64_t stride, int64_t size, int64_t out, int64_t* lo, int64_t* hi) {
  *lo = std::min(out, first_at_least(-off, stride));
  *hi = std::min(out, std::max(*lo, first_at_least(size - off, stride)));
}

// Writes a run of values into one row of B panels (depth `kdim`, row `kk`): column l goes
// to panel l / NR, slot l % NR.
struct PanelRowWriter {
  float* base;  // panel 0, row kk
  int64_t panel_stride;
  int64_t jp, j;
  float* at;

  PanelRowWriter(float* b, int64_t kdim, int64_t kk, int64_t l0)
      : base(b + kk * NR), panel_stride(kdim * NR), jp(l0 / NR), j(l0 % NR), at(base + jp * panel_stride) {}

  void advance(int64_t m) {
    j += m;
    if (j == NR) {
      j = 0;
      at += panel_stride;
    }
  }
  void zeros(int64_t count) {
    while (count > 0) {
      const int64_t m = std::min(count, NR - j);
      for (int64_t t = 0; t < m; ++t) at[j + t] = 0.0f;
      count -= m;
      advance(m);
    }
  }
  void copy(const float* src, int64_t stride, int64_t count) {
    while (count > 0) {
      const int64_t m = std::min(count, NR - j);
      float* d = at + j;
      if (stride == 1) {  // runs are short (<= NR): a loop beats a memcpy call
        for (int64_t t = 0; t < m; ++t) d[t] = src[t];
      } else {
        for (int64_t t = 0; t < m; ++t) d[t] = src[t * stride];
      }
      src += m * stride;
      count -= m;
      advance(m);
    }
  }
};

// im2col into B panels: B_g[kk][l] = x[n0 + i, g*Cg + c, p*sh - ph + r*dh, q*sw - pw + s*dw]
// for kk = (c, r, s) and l = (i, p, q), 0 in the padding and past the chunk's columns.
// One panel (NR columns, every row) per iteration: the writes are sequential.
void im2col_panels(const ConvGeom& g, const float* x, int64_t n0, int64_t nb, float* b) {
  const int64_t len = nb * g.plane, np = ceil_div(len, NR), units = g.groups * np;
  std::vector<int64_t> qrange_v(static_cast<size_t>(2 * g.s));  // valid q range of each s
  for (int64_t ss = 0; ss < g.s; ++ss)
    valid_range(ss * g.dw - g.pw, g.sw, g.w, g.q, &qrange_v[static_cast<size_t>(2 * ss)],
                &qrange_v[static_cast<size_t>(2 * ss + 1)]);
  const int64_t* qrange = qrange_v.data();
#pragma omp parallel for schedule(static) if (units * NR * g.grows >= kMinParallelWork)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t gi = u / np, jp = u % np;
    float* panel = b + (gi * np + jp) * NR * g.grows;
    // The panel's columns as runs within one output row: (image, p, first q, count, slot).
    struct Run {
      int64_t i, p, q0, count, slot;
    };
    Run runs[NR];
    int64_t nruns = 0;
    for (int64_t l = jp * NR, end = std::min(len, jp * NR + NR); l < end;) {
      const int64_t i = l / g.plane, pos = l % g.plane, pp = pos / g.q, qq = pos % g.q;
      const int64_t count = std::min(end - l, g.q - qq);
      runs[nruns++] = Run{i, pp, qq, count, l - jp * NR};
      l += count;
    }
    const int64_t filled = std::min(len - jp * NR, NR);
    float* d = panel;  // row kk = (c, r, s), in order
    for (int64_t c = 0; c < g.cg; ++c) {
      const int64_t ch = gi * g.cg + c;
      for (int64_t rr = 0; rr < g.r; ++rr) {
        const int64_t hoff = rr * g.dh - g.ph;
        for (int64_t ss = 0; ss < g.s; ++ss, d += NR) {
          const int64_t woff = ss * g.dw - g.pw;
          const int64_t q_lo = qrange[2 * ss], q_hi = qrange[2 * ss + 1];
          for (int64_t t = 0; t < nruns; ++t) {
            const Run& run = runs[t];
            float* dr = d + run.slot;
            const int64_t hh = run.p * g.sh + hoff;
            if (hh < 0 || hh >= g.h) {
              for (int64_t j = 0; j < run.count; ++j) dr[j] = 0.0f;
              continue;
            }
            const float* srow = x + (((n0 + run.i) * g.c + ch) * g.h + hh) * g.w + woff;
            const int64_t lo = std::clamp(q_lo - run.q0, int64_t{0}, run.count);
            const int64_t hi = std::clamp(q_hi - run.q0, lo, run.count);
            for (int64_t j = 0; j < lo; ++j) dr[j] = 0.0f;
            if (g.sw == 1) {
              const float* sr = srow + run.q0;
              for (int64_t j = lo; j < hi; ++j) dr[j] = sr[j];
            } else {
              for (int64_t j = lo; j < hi; ++j) dr[j] = srow[(run.q0 + j) * g.sw];
            }
            for (int64_t j = hi; j < run.count; ++j) dr[j] = 0.0f;
          }
          for (int64_t j = filled; j < NR; ++j) d[j] = 0.0f;  // past the chunk's last column
        }
      }
    }
  }
}

// im2col transposed into B panels over the column-matrix rows: B_g[l][kk] (depth L, width
// Cg*R*S), for the dw GEMM; rows past Cg*R*S are zero. One (group, panel, image) per
// iteration, position by position, so that each position's NR values are written together.
void im2col_t_panels(const ConvGeom& g, const float* x, int64_t n0, int64_t nb, float* b) {
  const int64_t len = nb * g.plane, np = ceil_div(g.grows, NR), units = g.groups * np * nb;
  const int64_t group_stride = np * NR * len;
#pragma omp parallel for schedule(static) if (units * NR * g.plane >= kMinParallelWork)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t gi = u / (np * nb), jp = (u / nb) % np, i = u % nb;
    float* panel = b + gi * group_stride + jp * NR * len + i * g.plane * NR;  // row l = i * plane
    const float* src = x + (n0 + i) * g.c * g.h * g.w;
    const int64_t jn = std::min(NR, g.grows - jp * NR);  // real rows in this panel
    // Per row: the input offset of output position (0, 0), and its valid output ranges.
    int64_t off[NR], p_lo[NR], p_hi[NR], q_lo[NR], q_hi[NR];
    int64_t in_p_lo = 0, in_p_hi = g.p, in_q_lo = 0, in_q_hi = g.q;  // where every row is valid
    for (int64_t j = 0; j < jn; ++j) {
      const int64_t kk = jp * NR + j;
      const int64_t ch = gi * g.cg + kk / (g.r * g.s), rr = (kk / g.s) % g.r, ss = kk % g.s;
      const int64_t hoff = rr * g.dh - g.ph, woff = ss * g.dw - g.pw;
      off[j] = ch * g.h * g.w + hoff * g.w + woff;
      valid_range(hoff, g.sh, g.h, g.p, &p_lo[j], &p_hi[j]);
      valid_range(woff, g.sw, g.w, g.q, &q_lo[j], &q_hi[j]);
      in_p_lo = std::max(in_p_lo, p_lo[j]), in_p_hi = std::min(in_p_hi, p_hi[j]);
      in_q_lo = std::max(in_q_lo, q_lo[j]), in_q_hi = std::min(in_q_hi, q_hi[j]);
    }
    for (int64_t pp = 0; pp < g.p; ++pp) {
      const bool row_inside = pp >= in_p_lo && pp < in_p_hi;
      for (int64_t qq = 0; qq < g.q; ++qq) {
        float* d = panel + (pp * g.q + qq) * NR;
        const int64_t pos = pp * g.sh * g.w + qq * g.sw;
        if (row_inside && qq >= in_q_lo && qq < in_q_hi) {
          for (int64_t j = 0; j < jn; ++j) d[j] = src[off[j] + pos];
        } else {
          for (int64_t j = 0; j < jn; ++j)
            d[j] = pp >= p_lo[j] && pp < p_hi[j] && qq >= q_lo[j] && qq < q_hi[j] ? src[off[j] + pos] : 0.0f;
        }
        for (int64_t j = jn; j < NR; ++j) d[j] = 0.0f;
      }
    }
  }
}

// dx[n0 + i, c] = sum over (r, s, p, q) of the plain column matrix col [C*R*S, L] at the
// positions im2col read from; one (image, channel) plane per iteration, in a fixed order.
void col2im(const ConvGeom& g, const float* col, int64_t n0, int64_t nb, float* dx) {
  const int64_t len = nb * g.plane, units = nb * g.c;
#pragma omp parallel for schedule(static) if (units * g.r * g.s * g.plane >= kMinParallelWork)
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

// Packs rows [0, m) x depth [0, kdim) of a strided matrix into MR-row A panels
// (a[(ip * kdim + k) * MR + i]), zero past m. Element (i, k) is src[i * rs + k * ks].
void pack_a(const float* src, int64_t rs, int64_t ks, int64_t m, int64_t kdim, float* a) {
  const int64_t mp = ceil_div(m, MR);
#pragma omp parallel for schedule(static) if (mp * MR * kdim >= kMinParallelWork)
  for (int64_t ip = 0; ip < mp; ++ip) {
    float* d = a + ip * MR * kdim;
    const int64_t rows = std::min(MR, m - ip * MR);
    for (int64_t k = 0; k < kdim; ++k)
      for (int64_t i = 0; i < MR; ++i) d[k * MR + i] = i < rows ? src[(ip * MR + i) * rs + k * ks] : 0.0f;
  }
}

// Maps chunk column l to the offset of (image n0 + l / plane, position l % plane) in an
// NCHW tensor with `k` channels, relative to channel 0.
struct ChunkColumns {
  int64_t plane, image_stride;
  int64_t offset(int64_t l) const { return (l / plane) * image_stride + l % plane; }
};

// dy of a chunk (group g, channel rows) as A panels: A_g[m][l] = dy[n0 + l/PQ, g*Kg + m, l%PQ],
// depth L. One (group, panel, image) per iteration.
void pack_dy_a(const ConvGeom& g, const float* dy, int64_t n0, int64_t nb, float* a) {
  const int64_t len = nb * g.plane, mp = ceil_div(g.kg, MR), units = g.groups * mp * nb;
  const int64_t kplane = g.k * g.plane;
#pragma omp parallel for schedule(static) if (units * MR * g.plane >= kMinParallelWork)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t gi = u / (mp * nb), ip = (u / nb) % mp, i = u % nb;
    float* d = a + (gi * mp + ip) * MR * len + i * g.plane * MR;
    const int64_t rows = std::min(MR, g.kg - ip * MR);
    const float* src = dy + (n0 + i) * kplane + (gi * g.kg + ip * MR) * g.plane;
    for (int64_t l = 0; l < g.plane; ++l)
      for (int64_t t = 0; t < MR; ++t) d[l * MR + t] = t < rows ? src[t * g.plane + l] : 0.0f;
  }
}

// dy of a chunk as B panels: B_g[k][l] = dy[n0 + l/PQ, g*Kg + k, l%PQ], depth Kg.
void pack_dy_b(const ConvGeom& g, const float* dy, int64_t n0, int64_t nb, float* b) {
  const int64_t len = nb * g.plane, len_pad = round_up(len, NR), units = g.k * nb;
  const int64_t kplane = g.k * g.plane;
#pragma omp parallel for schedule(static) if (units * g.plane >= kMinParallelWork)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t kk = u / nb, i = u % nb, gi = kk / g.kg;
    PanelRowWriter out(b + gi * g.kg * len_pad, g.kg, kk % g.kg, i * g.plane);
    out.copy(dy + (n0 + i) * kplane + kk * g.plane, 1, g.plane);
    if (i == nb - 1 && len_pad > len) out.zeros(len_pad - len);
  }
}

}  // namespace

size_t CpuBackend::conv2d_forward_workspace_impl(const Shape& x, const Shape& w, const Conv2dParams& p) {
  return ConvGeom(x, w, p).fwd_bytes();
}

size_t CpuBackend::conv2d_backward_workspace_impl(const Shape& x, const Shape& w, const Conv2dParams& p) {
  return ConvGeom(x, w, p).bwd_bytes();
}

void CpuBackend::conv2d_forward_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& prm,
                                     const Tensor& y, const Tensor& workspace) {
  const ConvGeom g(x.shape(), w.shape(), prm);
  float* yp = y.f32();
  const float* bp = b.defined() ? b.f32() : nullptr;
  const int64_t kplane = g.k * g.plane;
  if (g.trivial()) {  // y is the bias
    const int64_t units = g.n * g.k;
#pragma omp parallel for schedule(static) if (units * g.plane >= kMinParallelWork)
    for (int64_t u = 0; u < units; ++u)
      std::fill(yp + u * g.plane, yp + (u + 1) * g.plane, bp ? bp[u % g.k] : 0.0f);
    return;
  }
  const float* xp = x.f32();
  float* pa = workspace.f32();
  float* pb = pa + g.fwd_a();
  const int64_t a_stride = round_up(g.kg, MR) * g.grows;
  for (int64_t gi = 0; gi < g.groups; ++gi)
    pack_a(w.f32() + gi * g.kg * g.grows, g.grows, 1, g.kg, g.grows, pa + gi * a_stride);
  for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) {
    const int64_t nb = std::min(g.nb, g.n - n0), len = nb * g.plane, len_pad = round_up(len, NR);
    im2col_panels(g, xp, n0, nb, pb);
    const ChunkColumns cols{g.plane, kplane};
    float* out = yp + n0 * kplane;
    packed_gemm(g.groups, g.kg, len, g.grows, pa, a_stride, pb, g.grows * len_pad,
                [&](int64_t gi, int64_t i0, int64_t j0, int64_t mr, int64_t nr, const float* tile) {
                  const int64_t pos = j0 % g.plane;
                  const bool contiguous = pos + nr <= g.plane;
                  const int64_t base = cols.offset(j0);
                  for (int64_t i = 0; i < mr; ++i) {
                    const int64_t m = gi * g.kg + i0 + i;
                    const float bias = bp ? bp[m] : 0.0f;
                    const float* t = tile + i * NR;
                    if (contiguous) {
                      float* d = out + base + m * g.plane;
                      for (int64_t j = 0; j < nr; ++j) d[j] = t[j] + bias;
                    } else {
                      for (int64_t j = 0; j < nr; ++j) out[cols.offset(j0 + j) + m * g.plane] = t[j] + bias;
                    }
                  }
                });
  }
}

void CpuBackend::conv2d_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Conv2dParams& prm,
                                      const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& workspace) {
  const ConvGeom g(x.shape(), w.shape(), prm);
  const float* dyp = dy.f32();
  const int64_t kplane = g.k * g.plane;

  if (db.defined() && g.n > 0) {
    float* dbp = db.f32();
#pragma omp parallel for schedule(static) if (g.n * kplane >= kMinParallelWork)
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
  if (g.trivial()) {  // dx is 0 (no output position or filter sees it); dw gets nothing
    if (need_dx) std::fill(dx.f32(), dx.f32() + dx.numel(), 0.0f);
    return;
  }
  const float* xp = x.f32();
  float* dxp = need_dx ? dx.f32() : nullptr;
  float* dwp = need_dw ? dw.f32() : nullptr;
  float* wt = workspace.f32();
  float* dya = wt + g.bwd_wt();
  float* dyb = dya + g.bwd_dya();
  float* col = dyb + g.bwd_dyb();
  const int64_t wt_stride = round_up(g.grows, MR) * g.kg;
  if (need_dx) {  // w_g^T [Cg*R*S, Kg] as A panels
    for (int64_t gi = 0; gi < g.groups; ++gi)
      pack_a(w.f32() + gi * g.kg * g.grows, 1, g.grows, g.grows, g.kg, wt + gi * wt_stride);
  }
  for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) {
    const int64_t nb = std::min(g.nb, g.n - n0), len = nb * g.plane, len_pad = round_up(len, NR);
    if (need_dw) {
      pack_dy_a(g, dyp, n0, nb, dya);
      im2col_t_panels(g, xp, n0, nb, col);
      packed_gemm(g.groups, g.kg, g.grows, len, dya, round_up(g.kg, MR) * len, col,
                  round_up(g.grows, NR) * len,
                  [&](int64_t gi, int64_t i0, int64_t j0, int64_t mr, int64_t nr, const float* tile) {
                    for (int64_t i = 0; i < mr; ++i) {
                      float* d = dwp + (gi * g.kg + i0 + i) * g.grows + j0;
                      const float* t = tile + i * NR;
                      for (int64_t j = 0; j < nr; ++j) d[j] += t[j];
                    }
                  });
    }
    if (need_dx) {
      pack_dy_b(g, dyp, n0, nb, dyb);
      packed_gemm(g.groups, g.grows, len, g.kg, wt, wt_stride, dyb, g.kg * len_pad,
                  [&](int64_t gi, int64_t i0, int64_t j0, int64_t mr, int64_t nr, const float* tile) {
                    for (int64_t i = 0; i < mr; ++i) {
                      float* d = col + (gi * g.grows + i0 + i) * len + j0;
                      std::memcpy(d, tile + i * NR, static_cast<size_t>(nr) * sizeof(float));
                    }
                  });
      col2im(g, col, n0, nb, dxp);
    }
  }
}

}  // namespace remat
