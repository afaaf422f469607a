// Fused attention on the CPU: FlashAttention-2 (Dao 2023) with exact tiles, never a
// [T, T] buffer. Per (batch b, query head h), with Q [tq, d], K, V [tk, d] the head's
// columns (key/value head h / (H / Hkv): grouped-query attention reads one K, V for a group
// of query heads) and s = 1 / sqrt(d):
//
// forward, per tile of bq query rows (the rows run their key tiles in order):
//   for each tile of bk keys:  S = s Q K^T;  m' = max(m, rowmax S);  P = exp(S - m')
//                              l = l exp(m - m') + rowsum P;  acc = acc exp(m - m') + (P o Z) V
//   out = acc / l;  lse = m + log l        (Z: the dropout factors, keep / (1 - p) or 0)
// backward, with delta = rowsum(dout o out) (which equals rowsum(P o dP), dropout or not):
//   P = exp(s Q K^T - lse);  dP = (dO V^T) o Z;  dS = P o (dP - delta)
//   dV = (P o Z)^T dO;  dK = s dS^T Q;  dQ = s dS K
// so that no sum needs atomics or depends on the thread count: one unit per (b, key/value
// head, key tile) sums dK and dV over the group's query heads and the query tiles in order;
// dQ is summed over the key tiles in order, either by the same units when one unit takes
// all of a (b, key/value head)'s key tiles (one pass, five tile products per pair of
// tiles: when those units alone keep the threads busy), or by a second pass, one unit per
// (b, h, query tile), that computes Q K^T and dO V^T again (seven products). Both give the
// same bits (the same operations in the same order per element); the workspace holds
// delta and the one pass's fp32 dQ, whichever runs, so the memory does not depend on it.
//
// Masks: causal (key j visible to query i when j <= i) and kv_lens (keys j >= kv_lens[b]
// invisible); a tile's invisible entries are exactly 0 in P. Key 0 is visible to every
// row, so no row is empty. Dropout keeps element ((b H + h) tq + i) tk + j of the op's
// Philox range, as the materialised attention's [B, H, T, T] probabilities do: the same
// mask on every backend, tiling and thread count.
//
// Determinism: every unit writes only its own rows; tiles start at multiples of the tile
// sizes, which depend on d only. The tile products are one fused multiply-add chain per
// element in k order, whichever of the portable, AVX2 and AVX-512 versions runs; the row
// passes are the same float operations on every path (the file is built without
// floating-point contraction). Scratch lives on each thread's stack (a few hundred KiB at
// most): nothing is allocated.
#include "backends/cpu/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <omp.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define REMAT_FLASH_X86 1
#endif

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/mixed.h"
#include "backends/cpu/philox_cpu.h"
#include "backends/cpu/simd.h"
#include "backends/cpu/softmax_exp.h"
#include "remat/bf16.h"
#include "remat/error.h"

namespace remat::cpu::flash {

namespace {

// ---- Tiles -------------------------------------------------------------------------------

struct Tiles {
  int64_t bq, bk;
};
// 64 x 64 up to d = 128, 32 x 32 beyond: every [rows, d] tile fits kTileFloats.
Tiles tiles_for(int64_t d) { return d <= 128 ? Tiles{64, 64} : Tiles{32, 32}; }
constexpr int64_t kTileFloats = 64 * 128;
constexpr int64_t kScoreFloats = 64 * 64;
static_assert(32 * kMaxHeadDim <= kTileFloats, "a 32-row tile of the largest head fits");

// ---- Tile products: c[m, n] (=, or += with acc) a[m, kd] b[kd, n], row-major ------------
// One fused multiply-add chain per element of c, k = 0, 1, ... in order, starting from 0 or
// from c: the portable and vector versions give the same bits.

void gemm_portable(int64_t m, int64_t n, int64_t kd, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                   int64_t ldc, bool acc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float s = acc ? c[i * ldc + j] : 0.0f;
      for (int64_t k = 0; k < kd; ++k) s = std::fma(a[i * lda + k], b[k * ldb + j], s);
      c[i * ldc + j] = s;
    }
}

#ifdef REMAT_FLASH_X86
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// R rows by V vectors of 16 columns, kept in registers over the whole k loop.
template <int R, int V>
__attribute__((target("avx512f"))) inline void block_avx512(int64_t kd, const float* a, int64_t lda, const float* b,
                                                            int64_t ldb, float* c, int64_t ldc, bool acc) {
  __m512 s[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) s[r][v] = acc ? _mm512_loadu_ps(c + r * ldc + 16 * v) : _mm512_setzero_ps();
  for (int64_t k = 0; k < kd; ++k) {
    __m512 bv[V];
    for (int v = 0; v < V; ++v) bv[v] = _mm512_loadu_ps(b + k * ldb + 16 * v);
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + k]);
      for (int v = 0; v < V; ++v) s[r][v] = _mm512_fmadd_ps(av, bv[v], s[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, s[r][v]);
}

template <int R>
__attribute__((target("avx512f"))) void rows_avx512(int64_t n, int64_t kd, const float* a, int64_t lda, const float* b,
                                                    int64_t ldb, float* c, int64_t ldc, bool acc) {
  int64_t j = 0;
  for (; j + 64 <= n; j += 64) block_avx512<R, 4>(kd, a, lda, b + j, ldb, c + j, ldc, acc);
  switch ((n - j) / 16) {
    case 3: block_avx512<R, 3>(kd, a, lda, b + j, ldb, c + j, ldc, acc), j += 48; break;
    case 2: block_avx512<R, 2>(kd, a, lda, b + j, ldb, c + j, ldc, acc), j += 32; break;
    case 1: block_avx512<R, 1>(kd, a, lda, b + j, ldb, c + j, ldc, acc), j += 16; break;
    default: break;
  }
  if (j < n) gemm_portable(R, n - j, kd, a, lda, b + j, ldb, c + j, ldc, acc);
}

__attribute__((target("avx512f"))) void gemm_avx512(int64_t m, int64_t n, int64_t kd, const float* a, int64_t lda,
                                                    const float* b, int64_t ldb, float* c, int64_t ldc, bool acc) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) rows_avx512<4>(n, kd, a + i * lda, lda, b, ldb, c + i * ldc, ldc, acc);
  switch (m - i) {
    case 3: rows_avx512<3>(n, kd, a + i * lda, lda, b, ldb, c + i * ldc, ldc, acc); break;
    case 2: rows_avx512<2>(n, kd, a + i * lda, lda, b, ldb, c + i * ldc, ldc, acc); break;
    case 1: rows_avx512<1>(n, kd, a + i * lda, lda, b, ldb, c + i * ldc, ldc, acc); break;
    default: break;
  }
}

// AVX2: 16 ymm registers, so 4 rows by 2 vectors of 8 columns (8 accumulators).
template <int R, int V>
__attribute__((target("avx2,fma"))) inline void block_avx2(int64_t kd, const float* a, int64_t lda, const float* b,
                                                           int64_t ldb, float* c, int64_t ldc, bool acc) {
  __m256 s[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) s[r][v] = acc ? _mm256_loadu_ps(c + r * ldc + 8 * v) : _mm256_setzero_ps();
  for (int64_t k = 0; k < kd; ++k) {
    __m256 bv[V];
    for (int v = 0; v < V; ++v) bv[v] = _mm256_loadu_ps(b + k * ldb + 8 * v);
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_set1_ps(a[r * lda + k]);
      for (int v = 0; v < V; ++v) s[r][v] = _mm256_fmadd_ps(av, bv[v], s[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(c + r * ldc + 8 * v, s[r][v]);
}

template <int R>
__attribute__((target("avx2,fma"))) void rows_avx2(int64_t n, int64_t kd, const float* a, int64_t lda, const float* b,
                                                   int64_t ldb, float* c, int64_t ldc, bool acc) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) block_avx2<R, 2>(kd, a, lda, b + j, ldb, c + j, ldc, acc);
  if (j + 8 <= n) block_avx2<R, 1>(kd, a, lda, b + j, ldb, c + j, ldc, acc), j += 8;
  if (j < n) gemm_portable(R, n - j, kd, a, lda, b + j, ldb, c + j, ldc, acc);
}

__attribute__((target("avx2,fma"))) void gemm_avx2(int64_t m, int64_t n, int64_t kd, const float* a, int64_t lda,
                                                   const float* b, int64_t ldb, float* c, int64_t ldc, bool acc) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) rows_avx2<4>(n, kd, a + i * lda, lda, b, ldb, c + i * ldc, ldc, acc);
  switch (m - i) {
    case 3: rows_avx2<3>(n, kd, a + i * lda, lda, b, ldb, c + i * ldc, ldc, acc); break;
    case 2: rows_avx2<2>(n, kd, a + i * lda, lda, b, ldb, c + i * ldc, ldc, acc); break;
    case 1: rows_avx2<1>(n, kd, a + i * lda, lda, b, ldb, c + i * ldc, ldc, acc); break;
    default: break;
  }
}

#pragma GCC diagnostic pop
#endif

using GemmFn = void (*)(int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, bool);

GemmFn tile_gemm() {
#ifdef REMAT_FLASH_X86
  switch (simd()) {
    case Simd::avx512: return &gemm_avx512;
    case Simd::avx2: return __builtin_cpu_supports("fma") ? &gemm_avx2 : &gemm_portable;
    default: break;
  }
#endif
  return &gemm_portable;
}

// ---- Rows of the operands ----------------------------------------------------------------

// Row t of batch element b, head n's d values, in fp32.
void load_row(const Operand& x, int64_t t_len, int64_t b, int64_t t, int64_t n, int64_t d, float* dst) {
  const int64_t at = (b * t_len + t) * x.w + x.col + n * d;
  if (!x.bf16) {
    std::memcpy(dst, static_cast<const float*>(x.data) + at, static_cast<size_t>(d) * sizeof(float));
    return;
  }
  const uint16_t* src = static_cast<const uint16_t*>(x.data) + at;
  for (int64_t c = 0; c < d; ++c) dst[c] = bf16_to_float(src[c]);
}

// Writes vals * mul (rounded to bf16 when the output is bf16).
void store_row(const Output& y, int64_t t_len, int64_t b, int64_t t, int64_t n, int64_t d, const float* vals,
               float mul) {
  const int64_t at = (b * t_len + t) * y.w + y.col + n * d;
  if (!y.bf16) {
    float* dst = static_cast<float*>(y.data) + at;
    for (int64_t c = 0; c < d; ++c) dst[c] = vals[c] * mul;
    return;
  }
  uint16_t* dst = static_cast<uint16_t*>(y.data) + at;
  for (int64_t c = 0; c < d; ++c) dst[c] = bf16_from_float(vals[c] * mul);
}

// Rows [t0, t0 + n) of head `head` into tile[n, d] (row stride d); rows n .. rows - 1 zero.
void load_rows(const Operand& x, int64_t t_len, int64_t b, int64_t t0, int64_t n, int64_t rows, int64_t head, int64_t d,
               float* tile) {
  for (int64_t r = 0; r < n; ++r) load_row(x, t_len, b, t0 + r, head, d, tile + r * d);
  std::fill(tile + n * d, tile + rows * d, 0.0f);
}

// The transpose: tile[c, r] (row stride cols) = row t0 + r, column c; columns n .. cols - 1 zero.
void load_rows_transposed(const Operand& x, int64_t t_len, int64_t b, int64_t t0, int64_t n, int64_t cols, int64_t head,
                          int64_t d, float* tile) {
  float row[kMaxHeadDim];
  for (int64_t r = 0; r < n; ++r) {
    load_row(x, t_len, b, t0 + r, head, d, row);
    for (int64_t c = 0; c < d; ++c) tile[c * cols + r] = row[c];
  }
  for (int64_t c = 0; c < d; ++c) std::fill(tile + c * cols + n, tile + (c + 1) * cols, 0.0f);
}

// ---- Rows of the score tile ---------------------------------------------------------------

// Row sums with kLanes interleaved partial sums (element j to lane j % kLanes) combined
// pairwise: a fixed order whatever the vector width.
constexpr int kLanes = 16;
float lane_sum(const float* x, int64_t n) {
  float acc[kLanes] = {};
  for (int64_t j = 0; j < n; ++j) acc[j % kLanes] += x[j];
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}
float lane_dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  for (int64_t j = 0; j < n; ++j) acc[j % kLanes] += a[j] * b[j];
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

// The row passes of the online softmax and its backward, one row of a score tile at a
// time: elementwise float operations, a maximum (exact in any order) and lane sums in the
// order above, so the AVX-512 versions give the portable versions' bits.
struct RowOps {
  // row[j] *= scale for j < vis; returns the maximum of those.
  float (*scale_max)(float* row, int64_t vis, float scale);
  // row[j] = exp(row[j] * scale - sub) for j < vis, 0 for vis <= j < nc; returns lane_sum
  // of the first vis.
  float (*exp_sum)(float* row, int64_t vis, int64_t nc, float scale, float sub);
  // dp[j] = p[j] (dp[j] f[j] - delta) and, with pd, pd[j] = p[j] f[j], for j < nc.
  void (*grads)(const float* p, const float* f, float delta, int64_t nc, float* dp, float* pd);
};

float scale_max_portable(float* row, int64_t vis, float scale) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < vis; ++j) {
    row[j] *= scale;
    mx = mx < row[j] ? row[j] : mx;
  }
  return mx;
}
float exp_sum_portable(float* row, int64_t vis, int64_t nc, float scale, float sub) {
  for (int64_t j = 0; j < vis; ++j) row[j] = exp_nonpositive(row[j] * scale - sub);
  std::fill(row + vis, row + nc, 0.0f);
  return lane_sum(row, vis);
}
void grads_portable(const float* p, const float* f, float delta, int64_t nc, float* dp, float* pd) {
  for (int64_t j = 0; j < nc; ++j) dp[j] = p[j] * (dp[j] * f[j] - delta);
  if (pd)
    for (int64_t j = 0; j < nc; ++j) pd[j] = p[j] * f[j];
}

#ifdef REMAT_FLASH_X86
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// Element j + k of the last (partial) vector is lane k, under a mask.
__attribute__((target("avx512f"))) inline __mmask16 tail_mask(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
}
__attribute__((target("avx512f"))) float scale_max_avx512(float* row, int64_t vis, float scale) {
  const __m512 sc = _mm512_set1_ps(scale);
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < vis; j += 16) {
    const __mmask16 k = tail_mask(vis - j);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + j), sc);
    _mm512_mask_storeu_ps(row + j, k, v);
    m = _mm512_mask_mov_ps(m, _mm512_mask_cmp_ps_mask(k, m, v, _CMP_LT_OQ), v);
  }
  return _mm512_reduce_max_ps(m);
}
__attribute__((target("avx512f"))) float exp_sum_avx512(float* row, int64_t vis, int64_t nc, float scale, float sub) {
  const __m512 sc = _mm512_set1_ps(scale), sb = _mm512_set1_ps(sub);
  __m512 a = _mm512_setzero_ps();
  for (int64_t j = 0; j < nc; j += 16) {
    const __mmask16 k = j < vis ? tail_mask(vis - j) : static_cast<__mmask16>(0);
    const __m512 e = exp_nonpositive16(_mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + j), sc), sb));
    _mm512_mask_storeu_ps(row + j, tail_mask(nc - j), _mm512_maskz_mov_ps(k, e));  // 0 past vis
    a = _mm512_mask_add_ps(a, k, a, e);
  }
  // lane_sum's pairwise combination: 8 + 8, 4 + 4, 2 + 2, 1 + 1.
  const __m256 h8 =
      _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
}
__attribute__((target("avx512f"))) void grads_avx512(const float* p, const float* f, float delta, int64_t nc, float* dp,
                                                     float* pd) {
  const __m512 dl = _mm512_set1_ps(delta);
  for (int64_t j = 0; j < nc; j += 16) {
    const __mmask16 k = tail_mask(nc - j);
    const __m512 pv = _mm512_maskz_loadu_ps(k, p + j), fv = _mm512_maskz_loadu_ps(k, f + j);
    const __m512 g = _mm512_mul_ps(pv, _mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, dp + j), fv), dl));
    _mm512_mask_storeu_ps(dp + j, k, g);
    if (pd) _mm512_mask_storeu_ps(pd + j, k, _mm512_mul_ps(pv, fv));
  }
}
#pragma GCC diagnostic pop
#endif

RowOps row_ops() {
#ifdef REMAT_FLASH_X86
  if (simd() == Simd::avx512) return RowOps{&scale_max_avx512, &exp_sum_avx512, &grads_avx512};
#endif
  return RowOps{&scale_max_portable, &exp_sum_portable, &grads_portable};
}

// Keys of the tile [j0, j0 + nk) visible to query i.
int64_t visible(const Problem& p, int64_t i, int64_t j0, int64_t nk) {
  if (!p.causal) return nk;
  return std::max<int64_t>(0, std::min<int64_t>(nk, i + 1 - j0));
}

struct Dropout {
  bool on = false;
  float keep = 1.0f, scale = 1.0f;
  explicit Dropout(const Problem& p) : on(1.0f - p.dropout < 1.0f), keep(1.0f - p.dropout), scale(1.0f / keep) {}
  // factor[j] for keys j0 .. j0 + n - 1 of query i of head (b, h).
  void factors(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n, float* factor) const {
    const uint64_t first = static_cast<uint64_t>(((b * p.h + h) * p.tq + i) * p.tk + j0);
    dropout_factors(p.rng.seed, p.rng.offset + first, n, keep, scale, factor);
  }
};

int64_t kv_len(const Problem& p, int64_t b) { return p.kv_lens ? p.kv_lens[b] : p.tk; }
// The columns of a score tile the products compute: the tile's keys rounded up to 16 (a
// vector), at most bk. The columns past the keys hold exact zeros, which add nothing.
int64_t score_cols(int64_t nk, int64_t bk) { return std::min(bk, (nk + 15) / 16 * 16); }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- Forward --------------------------------------------------------------------------------

struct ForwardScratch {
  alignas(64) float q[kTileFloats];
  alignas(64) float kt[kTileFloats];
  alignas(64) float v[kTileFloats];
  alignas(64) float acc[kTileFloats];
  alignas(64) float s[kScoreFloats];
  float m[64], l[64], factor[64];
};

void forward_tile(const Problem& p, const Tiles& t, GemmFn gemm, const Operand& q, const Operand& k, const Operand& v,
                  const Output& out, float* lse, int64_t b, int64_t h, int64_t i0) {
  ForwardScratch w;
  const int64_t d = p.d, bk = t.bk, nq = std::min(t.bq, p.tq - i0), kvh = h / (p.h / p.hkv);
  const int64_t kend = p.causal ? std::min(kv_len(p, b), i0 + nq) : kv_len(p, b);
  const Dropout drop(p);
  const RowOps rows = row_ops();
  load_rows(q, p.tq, b, i0, nq, nq, h, d, w.q);
  std::fill(w.acc, w.acc + nq * d, 0.0f);
  std::fill(w.m, w.m + nq, -std::numeric_limits<float>::infinity());
  std::fill(w.l, w.l + nq, 0.0f);
  for (int64_t j0 = 0; j0 < kend; j0 += bk) {
    const int64_t nk = std::min(bk, kend - j0), nc = score_cols(nk, bk);
    load_rows_transposed(k, p.tk, b, j0, nk, bk, kvh, d, w.kt);
    load_rows(v, p.tk, b, j0, nk, nc, kvh, d, w.v);
    gemm(nq, nc, d, w.q, d, w.kt, bk, w.s, bk, false);
    for (int64_t r = 0; r < nq; ++r) {
      float* row = w.s + r * bk;
      const int64_t vis = visible(p, i0 + r, j0, nk);
      if (vis == 0) {
        std::fill(row, row + nc, 0.0f);
        continue;
      }
      const float mx = rows.scale_max(row, vis, p.scale);
      const float m_new = w.m[r] < mx ? mx : w.m[r];
      const float alpha = exp_nonpositive(w.m[r] - m_new);  // ~1e-38 at the first tile: acc and l are 0
      w.l[r] = w.l[r] * alpha + rows.exp_sum(row, vis, nc, 1.0f, m_new);
      w.m[r] = m_new;
      float* acc = w.acc + r * d;
      for (int64_t c = 0; c < d; ++c) acc[c] *= alpha;
      if (drop.on) {
        drop.factors(p, b, h, i0 + r, j0, vis, w.factor);
        for (int64_t j = 0; j < vis; ++j) row[j] *= w.factor[j];
      }
    }
    gemm(nq, d, nc, w.s, bk, w.v, d, w.acc, d, true);
  }
  for (int64_t r = 0; r < nq; ++r) {
    store_row(out, p.tq, b, i0 + r, h, d, w.acc + r * d, 1.0f / w.l[r]);
    lse[(b * p.h + h) * p.tq + i0 + r] = w.m[r] + std::log(w.l[r]);
  }
}

// ---- Backward -------------------------------------------------------------------------------

// The probabilities of a score tile in place (P = exp(s S - lse), 0 where invisible), then
// dP = (dO V^T) o Z in `dp` turned into dS = P o (dP - delta); with `pd`, also the dropped
// probabilities P o Z.
struct RowGrads {
  const Problem& p;
  const Dropout& drop;
  const float* lse;    // of the tile's first row
  const float* delta;  // likewise
  float* factor;       // [bk]
  RowOps rows = row_ops();
  // Rows of stride bk, nc columns computed.
  void probabilities(float* s, int64_t nq, int64_t bk, int64_t nc, int64_t i0, int64_t j0, int64_t nk) const {
    for (int64_t r = 0; r < nq; ++r) {
      float* row = s + r * bk;
      const int64_t vis = visible(p, i0 + r, j0, nk);
      rows.exp_sum(row, vis, nc, p.scale, lse[r]);
    }
  }
  // s holds P; dp holds dO V^T on entry and dS on return; pd (when given) P o Z.
  void score_grads(const float* s, float* dp, float* pd, int64_t nq, int64_t bk, int64_t nc, int64_t b, int64_t h,
                   int64_t i0, int64_t j0, int64_t nk) const {
    for (int64_t r = 0; r < nq; ++r) {
      const float* pr = s + r * bk;
      float* dr = dp + r * bk;
      const int64_t vis = visible(p, i0 + r, j0, nk);
      if (drop.on && vis > 0)
        drop.factors(p, b, h, i0 + r, j0, vis, factor);
      else
        std::fill(factor, factor + vis, 1.0f);
      std::fill(factor + vis, factor + nc, 0.0f);
      rows.grads(pr, factor, delta[r], nc, dr, pd ? pd + r * bk : nullptr);
    }
  }
};

// dst[c, r] = src[r, c] for r < rows, c < cols (row strides: src ls, dst ld).
void transpose(const float* src, int64_t ls, int64_t rows, int64_t cols, float* dst, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ld + r] = src[r * ls + c];
}

struct KeyPassScratch {
  alignas(64) float q[kTileFloats];
  alignas(64) float dout[kTileFloats];
  alignas(64) float kt[kTileFloats];
  alignas(64) float vt[kTileFloats];
  alignas(64) float dk[kTileFloats];
  alignas(64) float dv[kTileFloats];
  alignas(64) float kr[kTileFloats];  // K's rows (one pass: dQ += dS K)
  alignas(64) float s[kScoreFloats];
  alignas(64) float dp[kScoreFloats];
  alignas(64) float pd[kScoreFloats];
  alignas(64) float t[kScoreFloats];
  float factor[64];
};

// dK, dV of key tile [j0, j0 + bk) of key/value head g of batch element b. With dq_acc
// ([B, H, tq, d] fp32), also dQ += dS K of the group's heads: one pass, when one thread
// takes every key tile of (b, g) in order, adds to each dQ in the order the second pass
// would (key tiles ascending), so it gives that pass's bits.
void key_tile(const Problem& p, const Tiles& t, GemmFn gemm, const Operand& q, const Operand& k, const Operand& v,
              const Operand& dout, const float* lse, const float* delta, const Output& dk, const Output& dv, int64_t b,
              int64_t g, int64_t j0, float* dq_acc) {
  KeyPassScratch w;
  const int64_t d = p.d, bq = t.bq, bk = t.bk, group = p.h / p.hkv;
  const int64_t nk_all = std::min(bk, p.tk - j0);
  const int64_t nk = std::max<int64_t>(0, std::min(nk_all, kv_len(p, b) - j0));  // keys past kv_len get 0
  const Dropout drop(p);
  std::fill(w.dk, w.dk + bk * d, 0.0f);
  std::fill(w.dv, w.dv + bk * d, 0.0f);
  if (nk > 0) {
    const int64_t nc = score_cols(nk, bk);
    load_rows_transposed(k, p.tk, b, j0, nk, bk, g, d, w.kt);
    load_rows_transposed(v, p.tk, b, j0, nk, bk, g, d, w.vt);
    if (dq_acc) load_rows(k, p.tk, b, j0, nk, nc, g, d, w.kr);
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const float* lse_h = lse + (b * p.h + h) * p.tq;
      const float* delta_h = delta + (b * p.h + h) * p.tq;
      for (int64_t i0 = p.causal ? j0 / bq * bq : 0; i0 < p.tq; i0 += bq) {
        const int64_t nq = std::min(bq, p.tq - i0);
        const RowGrads rg{p, drop, lse_h + i0, delta_h + i0, w.factor};
        load_rows(q, p.tq, b, i0, nq, nq, h, d, w.q);
        load_rows(dout, p.tq, b, i0, nq, nq, h, d, w.dout);
        gemm(nq, nc, d, w.q, d, w.kt, bk, w.s, bk, false);
        rg.probabilities(w.s, nq, bk, nc, i0, j0, nk);
        gemm(nq, nc, d, w.dout, d, w.vt, bk, w.dp, bk, false);
        rg.score_grads(w.s, w.dp, w.pd, nq, bk, nc, b, h, i0, j0, nk);
        if (dq_acc) gemm(nq, d, nc, w.dp, bk, w.kr, d, dq_acc + ((b * p.h + h) * p.tq + i0) * d, d, true);
        transpose(w.pd, bk, nq, nk, w.t, bq);  // (P o Z)^T [nk, nq]
        gemm(nk, d, nq, w.t, bq, w.dout, d, w.dv, d, true);
        transpose(w.dp, bk, nq, nk, w.t, bq);  // dS^T
        gemm(nk, d, nq, w.t, bq, w.q, d, w.dk, d, true);
      }
    }
  }
  for (int64_t r = 0; r < nk_all; ++r) {
    store_row(dk, p.tk, b, j0 + r, g, d, w.dk + r * d, p.scale);
    store_row(dv, p.tk, b, j0 + r, g, d, w.dv + r * d, 1.0f);
  }
}

struct QueryPassScratch {
  alignas(64) float q[kTileFloats];
  alignas(64) float dout[kTileFloats];
  alignas(64) float kt[kTileFloats];
  alignas(64) float vt[kTileFloats];
  alignas(64) float kr[kTileFloats];
  alignas(64) float dq[kTileFloats];
  alignas(64) float s[kScoreFloats];
  alignas(64) float dp[kScoreFloats];
  float factor[64];
};

// dQ of query tile [i0, i0 + bq) of head h of batch element b.
void query_tile(const Problem& p, const Tiles& t, GemmFn gemm, const Operand& q, const Operand& k, const Operand& v,
                const Operand& dout, const float* lse, const float* delta, const Output& dq, int64_t b, int64_t h,
                int64_t i0) {
  QueryPassScratch w;
  const int64_t d = p.d, bk = t.bk, nq = std::min(t.bq, p.tq - i0), kvh = h / (p.h / p.hkv);
  const int64_t kend = p.causal ? std::min(kv_len(p, b), i0 + nq) : kv_len(p, b);
  const Dropout drop(p);
  const RowGrads rg{p, drop, lse + (b * p.h + h) * p.tq + i0, delta + (b * p.h + h) * p.tq + i0, w.factor};
  load_rows(q, p.tq, b, i0, nq, nq, h, d, w.q);
  load_rows(dout, p.tq, b, i0, nq, nq, h, d, w.dout);
  std::fill(w.dq, w.dq + nq * d, 0.0f);
  for (int64_t j0 = 0; j0 < kend; j0 += bk) {
    const int64_t nk = std::min(bk, kend - j0), nc = score_cols(nk, bk);
    load_rows_transposed(k, p.tk, b, j0, nk, bk, kvh, d, w.kt);
    load_rows_transposed(v, p.tk, b, j0, nk, bk, kvh, d, w.vt);
    load_rows(k, p.tk, b, j0, nk, nc, kvh, d, w.kr);
    gemm(nq, nc, d, w.q, d, w.kt, bk, w.s, bk, false);
    rg.probabilities(w.s, nq, bk, nc, i0, j0, nk);
    gemm(nq, nc, d, w.dout, d, w.vt, bk, w.dp, bk, false);
    rg.score_grads(w.s, w.dp, nullptr, nq, bk, nc, b, h, i0, j0, nk);
    gemm(nq, d, nc, w.dp, bk, w.kr, d, w.dq, d, true);
  }
  for (int64_t r = 0; r < nq; ++r) store_row(dq, p.tq, b, i0 + r, h, d, w.dq + r * d, p.scale);
}

}  // namespace

void forward(const Problem& p, const Operand& q, const Operand& k, const Operand& v, const Output& out, float* lse) {
  const Tiles t = tiles_for(p.d);
  const GemmFn gemm = tile_gemm();
  const int64_t qt = ceil_div(p.tq, t.bq), units = p.b * p.h * qt;
  // Causal tiles grow with the row: dynamic scheduling balances them; each unit is computed
  // the same way whichever thread takes it.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t u = 0; u < units; ++u)
    forward_tile(p, t, gemm, q, k, v, out, lse, u / (p.h * qt), u / qt % p.h, u % qt * t.bq);
}

// delta [B, H, tq], then the one-pass dQ accumulator [B, H, tq, d].
int64_t backward_workspace_floats(const Problem& p) { return p.b * p.h * p.tq * (1 + p.d); }

namespace {
int g_passes = 0;  // set_backward_passes
}  // namespace

void set_backward_passes(int passes) { g_passes = passes; }

void backward(const Problem& p, const Operand& q, const Operand& k, const Operand& v, const Operand& out,
              const Operand& dout, const float* lse, float* workspace, const Output& dq, const Output& dk,
              const Output& dv) {
  const Tiles t = tiles_for(p.d);
  const GemmFn gemm = tile_gemm();
  float* delta = workspace;
  const int64_t rows = p.b * p.h * p.tq;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float o[kMaxHeadDim], g[kMaxHeadDim];
    const int64_t b = r / (p.h * p.tq), h = r / p.tq % p.h, i = r % p.tq;
    load_row(out, p.tq, b, i, h, p.d, o);
    load_row(dout, p.tq, b, i, h, p.d, g);
    delta[r] = lane_dot(o, g, p.d);
  }
  const int64_t kt = ceil_div(p.tk, t.bk);
  // One pass (five tile products per tile pair) where the (b, key/value head) units keep
  // the threads busy; else two passes (seven), parallel over tiles. The same bits either way.
  const bool one_pass = g_passes == 1 || (g_passes == 0 && p.b * p.hkv >= omp_get_max_threads());
  if (one_pass) {
    float* dq_acc = workspace + rows;
    std::fill(dq_acc, dq_acc + rows * p.d, 0.0f);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t u = 0; u < p.b * p.hkv; ++u)
      for (int64_t j = 0; j < kt; ++j)
        key_tile(p, t, gemm, q, k, v, dout, lse, delta, dk, dv, u / p.hkv, u % p.hkv, j * t.bk, dq_acc);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      store_row(dq, p.tq, r / (p.h * p.tq), r % p.tq, r / p.tq % p.h, p.d, dq_acc + r * p.d, p.scale);
    return;
  }
  const int64_t key_units = p.b * p.hkv * kt;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t u = 0; u < key_units; ++u)
    key_tile(p, t, gemm, q, k, v, dout, lse, delta, dk, dv, u / (p.hkv * kt), u / kt % p.hkv, u % kt * t.bk, nullptr);
  const int64_t qt = ceil_div(p.tq, t.bq), query_units = p.b * p.h * qt;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t u = 0; u < query_units; ++u)
    query_tile(p, t, gemm, q, k, v, dout, lse, delta, dq, u / (p.h * qt), u / qt % p.h, u % qt * t.bq);
}

}  // namespace remat::cpu::flash

// ---- The CPU backend's ops ----------------------------------------------------------------

namespace remat {

namespace {

// The problem of one call; kv_lens are read on the host and checked against tk.
cpu::flash::Problem flash_problem(const Tensor& xq, const Tensor& xkv, const Tensor& kv_lens,
                                  const FlashAttentionParams& p, RngState rng) {
  cpu::flash::Problem q;
  q.b = xq.size(0);
  q.tq = xq.size(1);
  q.tk = xkv.size(1);
  q.h = p.n_head;
  q.hkv = p.kv_heads();
  q.d = p.head_dim;
  q.causal = p.causal;
  q.dropout = p.dropout;
  q.rng = rng;
  q.scale = 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  if (kv_lens.defined()) {
    q.kv_lens = kv_lens.i32();
    for (int64_t b = 0; b < q.b; ++b)
      REMAT_CHECK(q.kv_lens[b] >= 1 && q.kv_lens[b] <= q.tk, "flash_attention: kv_lens[", b, "] = ", q.kv_lens[b],
                  " is outside [1, ", q.tk, "] (the keys of xkv ", xkv.str(), ")");
  }
  return q;
}

cpu::flash::Operand flash_operand(const Tensor& x, int64_t col) {
  return cpu::flash::Operand{x.raw_data(), cpu::is_bf16(x), x.size(2), col};
}
cpu::flash::Output flash_output(const Tensor& x, int64_t col) {
  return cpu::flash::Output{x.raw_data(), cpu::is_bf16(x), x.size(2), col};
}

}  // namespace

size_t cpu::flash_attention_backward_workspace(const Shape& xq, const Shape&, const FlashAttentionParams& p) {
  return static_cast<size_t>(xq[0] * p.n_head * xq[1] * (1 + p.head_dim)) * sizeof(float);  // delta, dQ
}

void CpuBackend::flash_attention_forward_impl(const Tensor& xq, const Tensor& xkv, const Tensor& kv_lens,
                                              const FlashAttentionParams& p, RngState rng, const Tensor& out,
                                              const Tensor& lse) {
  cpu::flash::forward(flash_problem(xq, xkv, kv_lens, p, rng), flash_operand(xq, p.q_col), flash_operand(xkv, p.k_col),
                      flash_operand(xkv, p.v_col), flash_output(out, 0), lse.f32());
}

size_t CpuBackend::flash_attention_backward_workspace_impl(const Shape& xq, const Shape& xkv,
                                                           const FlashAttentionParams& p) {
  return cpu::flash_attention_backward_workspace(xq, xkv, p);
}

void CpuBackend::flash_attention_backward_impl(const Tensor& dout, const Tensor& xq, const Tensor& xkv,
                                               const Tensor& kv_lens, const Tensor& out, const Tensor& lse,
                                               const FlashAttentionParams& p, RngState rng, const Tensor& dxq,
                                               const Tensor& dxkv, const Tensor& workspace) {
  cpu::flash::backward(flash_problem(xq, xkv, kv_lens, p, rng), flash_operand(xq, p.q_col), flash_operand(xkv, p.k_col),
                       flash_operand(xkv, p.v_col), flash_operand(out, 0), flash_operand(dout, 0), lse.f32(),
                       static_cast<float*>(workspace.raw_data()), flash_output(dxq, p.q_col),
                       flash_output(dxkv, p.k_col), flash_output(dxkv, p.v_col));
}

}  // namespace remat
