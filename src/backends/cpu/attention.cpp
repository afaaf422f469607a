// Multi-head self-attention over a fused qkv [B, T, 3C] (GPT-2 layout: q, k, v side by
// side on the last dim, head h in columns h*hs .. (h+1)*hs of each), and permute_0213.
//
// Per (batch b, head h), with Q, K, V the [T, hs] slices of qkv (row stride 3C, read in
// place by cblas_sgemm through its leading dimension, no copies):
//   S = Q K^T / sqrt(hs); causal: S[i, j] = -inf for j > i
//   P = softmax(S) row-wise -> probs[b, h] (masked entries exactly 0)
//   Pd = P * keep / (1 - p) (dropout; keep from Philox, element index = flat index of
//        the entry in probs [B, H, T, T], so backward regenerates it)
//   out[b, :, h*hs ..] = Pd V
// Backward, with dO the head's slice of dout:
//   dV = Pd^T dO;  dPd = dO V^T;  dP = dPd * keep / (1 - p)
//   dS = P * (dP - rowsum(dP * P));  dQ = dS K / sqrt(hs);  dK = dS^T Q / sqrt(hs)
//
// The GEMMs run on the calling thread (OpenBLAS threads each call itself; cblas is never
// called inside an OpenMP region), a group of heads back to back; then one OpenMP region
// does the group's row work (softmax, dropout, softmax backward), each row computed by one
// thread in a fixed order, so results do not depend on the thread count. Scratch comes
// from the workspace: a [G, T, T] block per group of G heads (G sized from the shapes
// only) for the dropped probabilities in forward (only with dropout) and for dP/dS (plus
// the dropped probabilities, with dropout) in backward.
#include <cblas.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backends/attention_dims.h"
#include "backends/cpu/bf16.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/mixed.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/philox_cpu.h"
#include "backends/cpu/simd.h"
#include "backends/cpu/softmax_exp.h"
#include "remat/bf16.h"
#include "remat/error.h"

namespace remat {

namespace {

using cpu::exp_nonpositive;
#if defined(__SSE2__)
using cpu::exp_nonpositive4;
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
using cpu::exp_nonpositive16;
#endif

// Heads are processed in groups: the GEMMs of a whole group run back to back, then one
// OpenMP region does the group's row work. Few switches between OpenBLAS's threads and
// OpenMP's keep the two thread pools from fighting over the cores (each spins for a while
// after its work). A group's scratch is kGroupScratchBytes at most (one head at least).
constexpr int64_t kGroupScratchBytes = int64_t{4} << 20;

int64_t group_heads(const AttnDims& d) {
  const int64_t per_head = d.t * d.t * static_cast<int64_t>(sizeof(float));
  return std::max<int64_t>(1, std::min<int64_t>(d.b * d.h, kGroupScratchBytes / std::max<int64_t>(per_head, 1)));
}

// Forward needs scratch for the dropped probabilities only; backward for dP/dS, and the
// dropped probabilities too with dropout.
size_t forward_scratch_floats(const AttnDims& d, const AttentionParams& p) {
  return p.applies_dropout() ? static_cast<size_t>(group_heads(d) * d.t * d.t) : 0;
}
size_t backward_scratch_floats(const AttnDims& d, const AttentionParams& p) {
  return static_cast<size_t>(group_heads(d) * d.t * d.t) * (p.applies_dropout() ? 2 : 1);
}

// ---- Row kernels -------------------------------------------------------------------------

// Row sums use kLanes interleaved partial sums (element j goes to lane j % kLanes) combined
// pairwise at the end: a fixed order, independent of vector width and thread count.
constexpr int kLanes = 16;

inline float lane_combine(float* acc) {
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

// The maximum is exact whatever the order: four independent chains for speed.
inline float row_max(const float* x, int64_t n) {
  float m[4] = {x[0], x[0], x[0], x[0]};
  int64_t j = 0;
  for (; j + 4 <= n; j += 4)
    for (int k = 0; k < 4; ++k) m[k] = m[k] < x[j + k] ? x[j + k] : m[k];
  for (; j < n; ++j) m[0] = m[0] < x[j] ? x[j] : m[0];
  const float a = m[0] < m[1] ? m[1] : m[0], b = m[2] < m[3] ? m[3] : m[2];
  return a < b ? b : a;
}

inline float row_dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += a[j + k] * b[j + k];
  for (int k = 0; j + k < n; ++k) acc[k] += a[j + k] * b[j + k];
  return lane_combine(acc);
}

// x[j] = exp(x[j] - mx) for j < n; returns their sum.
inline float exp_shift_sum(float* x, int64_t n, float mx) {
  float acc[kLanes] = {};
  int64_t j = 0;
#if defined(__SSE2__)
  static_assert(kLanes == 16, "four SSE2 accumulators hold the lanes");
  const __m128 m = _mm_set1_ps(mx);
  __m128 a[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
  for (; j + kLanes <= n; j += kLanes) {
    for (int v = 0; v < 4; ++v) {
      const __m128 e = exp_nonpositive4(_mm_sub_ps(_mm_loadu_ps(x + j + 4 * v), m));
      _mm_storeu_ps(x + j + 4 * v, e);
      a[v] = _mm_add_ps(a[v], e);
    }
  }
  for (int v = 0; v < 4; ++v) _mm_storeu_ps(acc + 4 * v, a[v]);
#else
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      x[j + k] = exp_nonpositive(x[j + k] - mx);
      acc[k] += x[j + k];
    }
#endif
  for (int k = 0; j + k < n; ++k) {
    x[j + k] = exp_nonpositive(x[j + k] - mx);
    acc[k] += x[j + k];
  }
  return lane_combine(acc);
}

// x[j] = softmax(x[0 .. n))[j], in place.
inline void softmax_row(float* x, int64_t n) {
  const float inv = 1.0f / exp_shift_sum(x, n, row_max(x, n));
  for (int64_t j = 0; j < n; ++j) x[j] *= inv;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define REMAT_ATTENTION_AVX512 1
// softmax_row with AVX-512: the same float operations (the file is built without
// floating-point contraction), and the kLanes partial sums are the 16 lanes of one
// register, so the results are bitwise those of the versions above.
// (GCC 12's AVX-512 headers trip -W[maybe-]uninitialized on their own _mm512_undefined_*
// pass-through operands, GCC bug 105593.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// The last n % 16 elements go through the same vector code under a mask: element j + k
// of the tail is lane k, as in the scalar tail loops.
__attribute__((target("avx512f"))) void softmax_row_avx512(float* x, int64_t n) {
  static_assert(kLanes == 16, "one AVX-512 register holds the lanes");
  const int64_t whole = n / kLanes * kLanes;
  const __mmask16 tail = static_cast<__mmask16>((1u << (n - whole)) - 1u);
  // The maximum as row_max computes it: each lane starts at x[0] and takes x[j] when it
  // is greater, so it is NaN exactly when x[0] is.
  __m512 m = _mm512_set1_ps(x[0]);
  for (int64_t j = 0; j < whole; j += kLanes) {
    const __m512 v = _mm512_loadu_ps(x + j);
    m = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(m, v, _CMP_LT_OQ), v);
  }
  const __m512 vt = _mm512_maskz_loadu_ps(tail, x + whole);
  m = _mm512_mask_mov_ps(m, _mm512_mask_cmp_ps_mask(tail, m, vt, _CMP_LT_OQ), vt);
  // The lanes are all NaN or none is: any order of maxima gives row_max's value.
  const float mx = _mm512_reduce_max_ps(m);
  // exp and the lane sums, as exp_shift_sum.
  const __m512 vm = _mm512_set1_ps(mx);
  __m512 a = _mm512_setzero_ps();
  for (int64_t j = 0; j < whole; j += kLanes) {
    const __m512 e = exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(x + j), vm));
    _mm512_storeu_ps(x + j, e);
    a = _mm512_add_ps(a, e);
  }
  const __m512 et = exp_nonpositive16(_mm512_sub_ps(vt, vm));
  _mm512_mask_storeu_ps(x + whole, tail, et);
  a = _mm512_mask_add_ps(a, tail, a, et);
  // lane_combine in registers: halves added pairwise, 8 + 8, 4 + 4, 2 + 2, 1 + 1.
  __m256 h8 =
      _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
  __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  const float sum = _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
  const __m512 inv = _mm512_set1_ps(1.0f / sum);
  for (int64_t j = 0; j < whole; j += kLanes) _mm512_storeu_ps(x + j, _mm512_mul_ps(_mm512_loadu_ps(x + j), inv));
  _mm512_mask_storeu_ps(x + whole, tail, _mm512_mul_ps(et, inv));
}
#pragma GCC diagnostic pop
#endif

void sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), 0.0f, c, static_cast<int>(ldc));
}

// The three GEMM shapes of attention, per head, over [T, T] matrices (row stride T) and
// [T, hs] slices (row strides ld*). When causal, the [T, T] operand is zero above the
// diagonal, so the GEMMs go by blocks of kCausalBlock rows (or columns) and skip the
// blocks above the diagonal: about half the work for long sequences.
constexpr int64_t kCausalBlock = 64;

// S = alpha X Y^T; when causal, only the blocks on and below the diagonal are written.
void gemm_xyt(bool causal, int64_t T, int64_t hs, float alpha, const float* X, int64_t ldx, const float* Y, int64_t ldy,
              float* S) {
  const int64_t R = causal ? kCausalBlock : T;
  for (int64_t i0 = 0; i0 < T; i0 += R) {
    const int64_t i1 = std::min(T, i0 + R);
    sgemm(CblasNoTrans, CblasTrans, i1 - i0, causal ? i1 : T, hs, alpha, X + i0 * ldx, ldx, Y, ldy, S + i0 * T, T);
  }
}

// Out = alpha A B (A [T, T]).
void gemm_ab(bool causal, int64_t T, int64_t hs, float alpha, const float* A, const float* B, int64_t ldb, float* out,
             int64_t ldo) {
  const int64_t R = causal ? kCausalBlock : T;
  for (int64_t i0 = 0; i0 < T; i0 += R) {
    const int64_t i1 = std::min(T, i0 + R);
    sgemm(CblasNoTrans, CblasNoTrans, i1 - i0, hs, causal ? i1 : T, alpha, A + i0 * T, T, B, ldb, out + i0 * ldo, ldo);
  }
}

// Out = alpha A^T B (A [T, T]).
void gemm_atb(bool causal, int64_t T, int64_t hs, float alpha, const float* A, const float* B, int64_t ldb, float* out,
              int64_t ldo) {
  const int64_t R = causal ? kCausalBlock : T;
  for (int64_t j0 = 0; j0 < T; j0 += R) {
    const int64_t j1 = std::min(T, j0 + R), first = causal ? j0 : 0;  // rows i < j0 of A are zero in columns >= j0
    sgemm(CblasTrans, CblasNoTrans, j1 - j0, hs, T - first, alpha, A + first * T + j0, T, B + first * ldb, ldb,
          out + j0 * ldo, ldo);
  }
}

// Row loops over a group of heads: chunks of rows spread round-robin over the threads, so
// causal rows (whose cost grows with i) balance; every row is computed the same way
// whichever thread gets it.
constexpr int kRowChunk = 8;

// bf16 (training.precision bf16): qkv, out, probs, dout and dqkv are bf16. The heads of one
// batch element at a time run the fp32 code below on fp32 copies in the workspace: that
// element's qkv [T, 3C] (and dout [T, C] in backward), its probabilities [H, T, T], and
// its out [T, C] or dqkv [T, 3C] before they are rounded to bf16. The probabilities are
// rounded to bf16 as soon as the softmax has made them, so P V uses the probabilities that
// are stored and that backward reads.
struct Bf16Staging {
  size_t qkv, dout, probs, result;  // floats of each block
  size_t total() const { return qkv + dout + probs + result; }
};
Bf16Staging bf16_staging(const AttnDims& d, bool backward) {
  const size_t t = static_cast<size_t>(d.t), c = static_cast<size_t>(d.c);
  return Bf16Staging{t * 3 * c, backward ? t * c : 0, static_cast<size_t>(d.h) * t * t, backward ? t * 3 * c : t * c};
}
AttnDims one_element(AttnDims d) {
  d.b = 1;
  return d;
}
bool bf16_mode() { return activation_dtype() == DType::bf16; }

// The heads [bh0, bh0 + d.b * d.h) of the op (its first head bh0: the dropout element
// indices are those of the whole op) over fp32 pointers to that range of qkv, probs and
// out. round_probs: the probabilities are rounded to bf16 values in place (bf16 mode).
void forward_heads(const AttnDims& d, int64_t bh0, const AttentionParams& p, RngState rng, const float* x, float* pr,
                   float* o, float* dropped, bool round_probs) {
  const int64_t T = d.t, C = d.c, ld = 3 * C, BH = d.b * d.h;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.hs));
  // Without out, only the probabilities: no dropout (they are taken before it), no P V.
  const bool dropout = p.applies_dropout() && o;
  const float keep_prob = 1.0f - p.dropout;
  const float inv_keep = keep_prob > 0.0f ? 1.0f / keep_prob : 0.0f;
  const bool causal = p.causal;
  // Without dropout nothing needs scratch and all heads form one group.
  const int64_t G = dropout ? group_heads(d) : BH;
  const bool avx512 = cpu::simd() == cpu::Simd::avx512;
  auto head_q = [&](int64_t bh) { return x + (bh / d.h) * T * ld + (bh % d.h) * d.hs; };

  for (int64_t g0 = 0; g0 < BH; g0 += G) {
    const int64_t g1 = std::min(BH, g0 + G);
    // Scores, scaled, straight into probs.
    for (int64_t bh = g0; bh < g1; ++bh) {
      const float* q = head_q(bh);
      gemm_xyt(causal, T, d.hs, scale, q, ld, q + C, ld, pr + bh * T * T);
    }
    // Softmax (and dropout) row by row.
    const int64_t rows = (g1 - g0) * T;
#pragma omp parallel for schedule(static, kRowChunk) if (rows * T >= cpu::kParallelMinWork)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t bh = g0 + r / T, i = r % T;
      float* row = pr + (bh * T + i) * T;
      const int64_t n = causal ? i + 1 : T;
#ifdef REMAT_ATTENTION_AVX512
      if (avx512)
        softmax_row_avx512(row, n);
      else
#endif
        softmax_row(row, n);
      std::fill(row + n, row + T, 0.0f);
      if (round_probs)
        for (int64_t j = 0; j < n; ++j) row[j] = bf16_to_float(bf16_from_float(row[j]));
      if (dropout) {
        float* drow = dropped + r * T;
        cpu::for_each_dropout_chunk(rng, static_cast<uint64_t>(((bh0 + bh) * T + i) * T), n, keep_prob, inv_keep,
                                    [&](int64_t j0, const float* f, int64_t m) {
                                      for (int64_t k = 0; k < m; ++k) drow[j0 + k] = row[j0 + k] * f[k];
                                    });
        std::fill(drow + n, drow + T, 0.0f);
      }
    }
    // out[b, :, h] = (dropped) probs @ V.
    for (int64_t bh = g0; o && bh < g1; ++bh) {
      const float* P = dropout ? dropped + (bh - g0) * T * T : pr + bh * T * T;
      gemm_ab(causal, T, d.hs, 1.0f, P, head_q(bh) + 2 * C, ld, o + (bh / d.h) * T * C + (bh % d.h) * d.hs, C);
    }
  }
}

// Backward over the heads [bh0, bh0 + d.b * d.h), as forward_heads.
void backward_heads(const AttnDims& d, int64_t bh0, const AttentionParams& p, RngState rng, const float* go,
                    const float* x, const float* pr, float* dx, float* ds) {
  const int64_t T = d.t, C = d.c, ld = 3 * C, BH = d.b * d.h;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.hs));
  const bool dropout = p.applies_dropout();
  const float keep_prob = 1.0f - p.dropout;
  const float inv_keep = keep_prob > 0.0f ? 1.0f / keep_prob : 0.0f;
  const bool causal = p.causal;
  const int64_t G = group_heads(d);
  float* dropped = dropout ? ds + G * T * T : nullptr;  // [G, T, T]: dropped probs; ds [G, T, T]: dPd, then dS
  auto head_off = [&](int64_t bh) { return (bh / d.h) * T * ld + (bh % d.h) * d.hs; };
  auto head_out = [&](int64_t bh) { return (bh / d.h) * T * C + (bh % d.h) * d.hs; };

  for (int64_t g0 = 0; g0 < BH; g0 += G) {
    const int64_t g1 = std::min(BH, g0 + G);
    // dPd = dO V^T.
    for (int64_t bh = g0; bh < g1; ++bh)
      gemm_xyt(causal, T, d.hs, 1.0f, go + head_out(bh), C, x + head_off(bh) + 2 * C, ld, ds + (bh - g0) * T * T);
    // dP = dPd * mask / (1 - p); dS = P * (dP - rowsum(dP * P)); the dropped probs for dV.
    const int64_t rows = (g1 - g0) * T;
#pragma omp parallel for schedule(static, kRowChunk) if (rows * T >= cpu::kParallelMinWork)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t bh = g0 + r / T, i = r % T;
      const float* row = pr + (bh * T + i) * T;
      float* g = ds + r * T;
      const int64_t n = causal ? i + 1 : T;
      if (dropout) {
        float* drow = dropped + r * T;
        cpu::for_each_dropout_chunk(rng, static_cast<uint64_t>(((bh0 + bh) * T + i) * T), n, keep_prob, inv_keep,
                                    [&](int64_t j0, const float* f, int64_t m) {
                                      for (int64_t k = 0; k < m; ++k) {
                                        g[j0 + k] *= f[k];
                                        drow[j0 + k] = row[j0 + k] * f[k];
                                      }
                                    });
        std::fill(drow + n, drow + T, 0.0f);
      }
      const float dot = row_dot(g, row, n);
      for (int64_t j = 0; j < n; ++j) g[j] = row[j] * (g[j] - dot);
      std::fill(g + n, g + T, 0.0f);
    }
    for (int64_t bh = g0; bh < g1; ++bh) {
      const float* q = x + head_off(bh);
      float* dq = dx + head_off(bh);
      const float* S = ds + (bh - g0) * T * T;
      const float* P = dropout ? dropped + (bh - g0) * T * T : pr + bh * T * T;
      // dV = Pd^T dO; dQ = dS K / sqrt(hs); dK = dS^T Q / sqrt(hs).
      gemm_atb(causal, T, d.hs, 1.0f, P, go + head_out(bh), C, dq + 2 * C, ld);
      gemm_ab(causal, T, d.hs, scale, S, q + C, ld, dq, ld);
      gemm_atb(causal, T, d.hs, scale, S, q, ld, dq + C, ld);
    }
  }
}

}  // namespace

size_t cpu::attention_forward_workspace(const Shape& qkv, const AttentionParams& p) {
  const AttnDims d = attn_dims(qkv, p, "cblas");
  if (bf16_mode()) return (forward_scratch_floats(one_element(d), p) + bf16_staging(d, false).total()) * sizeof(float);
  return forward_scratch_floats(d, p) * sizeof(float);
}

size_t cpu::attention_backward_workspace(const Shape& qkv, const AttentionParams& p) {
  const AttnDims d = attn_dims(qkv, p, "cblas");
  if (bf16_mode()) return (backward_scratch_floats(one_element(d), p) + bf16_staging(d, true).total()) * sizeof(float);
  return backward_scratch_floats(d, p) * sizeof(float);
}

size_t CpuBackend::attention_forward_workspace_impl(const Shape& qkv, const AttentionParams& p) {
  return cpu::attention_forward_workspace(qkv, p);
}

size_t CpuBackend::attention_backward_workspace_impl(const Shape& qkv, const AttentionParams& p) {
  return cpu::attention_backward_workspace(qkv, p);
}

void CpuBackend::attention_forward_impl(const Tensor& qkv, const AttentionParams& p, RngState rng, const Tensor& out,
                                        const Tensor& probs, const Tensor& workspace) {
  const AttnDims d = attn_dims(qkv.shape(), p, "cblas");
  if (d.b == 0 || d.t == 0) return;
  if (cpu::all_f32({&qkv, &out, &probs})) {
    float* dropped = p.applies_dropout() && out.defined() ? workspace.f32() : nullptr;
    forward_heads(d, 0, p, rng, qkv.f32(), probs.f32(), out.defined() ? out.f32() : nullptr, dropped, false);
    return;
  }
  REMAT_CHECK(bf16_mode() && cpu::is_bf16(qkv) && cpu::is_bf16(probs) && (!out.defined() || cpu::is_bf16(out)),
              "attention_forward: qkv ", qkv.str(), ", probs ", probs.str(), ": expected all f32 or all bf16");
  const AttnDims d1 = one_element(d);
  const Bf16Staging st = bf16_staging(d, false);
  float* xs = workspace.f32();
  float* ps = xs + st.qkv;
  float* os = ps + st.probs;
  float* scratch = os + st.result;
  const int64_t xq = d.t * 3 * d.c, hp = d.h * d.t * d.t, oc = d.t * d.c;
  for (int64_t b = 0; b < d.b; ++b) {
    cpu::bf16_to_f32_parallel(qkv.bf16() + b * xq, xs, xq);
    forward_heads(d1, b * d.h, p, rng, xs, ps, out.defined() ? os : nullptr, scratch, true);
    cpu::f32_to_bf16_parallel(ps, probs.bf16() + b * hp, hp);  // bf16 values already: exact
    if (out.defined()) cpu::f32_to_bf16_parallel(os, out.bf16() + b * oc, oc);
  }
}

void CpuBackend::attention_backward_impl(const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                                         const AttentionParams& p, RngState rng, const Tensor& dqkv,
                                         const Tensor& workspace) {
  const AttnDims d = attn_dims(qkv.shape(), p, "cblas");
  if (d.b == 0 || d.t == 0) return;
  if (cpu::all_f32({&dout, &qkv, &probs, &dqkv})) {
    backward_heads(d, 0, p, rng, dout.f32(), qkv.f32(), probs.f32(), dqkv.f32(), workspace.f32());
    return;
  }
  REMAT_CHECK(bf16_mode() && cpu::is_bf16(qkv) && cpu::is_bf16(probs) && cpu::is_bf16(dout) && cpu::is_bf16(dqkv),
              "attention_backward: qkv ", qkv.str(), ", dqkv ", dqkv.str(), ": expected all f32 or all bf16");
  const AttnDims d1 = one_element(d);
  const Bf16Staging st = bf16_staging(d, true);
  float* xs = workspace.f32();
  float* gs = xs + st.qkv;
  float* ps = gs + st.dout;
  float* dxs = ps + st.probs;
  float* scratch = dxs + st.result;
  const int64_t xq = d.t * 3 * d.c, hp = d.h * d.t * d.t, oc = d.t * d.c;
  for (int64_t b = 0; b < d.b; ++b) {
    cpu::bf16_to_f32_parallel(qkv.bf16() + b * xq, xs, xq);
    cpu::bf16_to_f32_parallel(dout.bf16() + b * oc, gs, oc);
    cpu::bf16_to_f32_parallel(probs.bf16() + b * hp, ps, hp);
    backward_heads(d1, b * d.h, p, rng, gs, xs, ps, dxs, scratch);
    cpu::f32_to_bf16_parallel(dxs, dqkv.bf16() + b * xq, xq);
  }
}

void CpuBackend::permute_0213_impl(const Tensor& x, const Tensor& y) {
  const int64_t A = x.size(0), B = x.size(1), C = x.size(2), D = x.size(3);
  const size_t row_bytes = static_cast<size_t>(D) * dtype_size(x.dtype());
  const int64_t rows = A * C * B;
  if (row_bytes == 0 || rows == 0) return;
  const auto* src = static_cast<const unsigned char*>(x.raw_data());
  auto* dst = static_cast<unsigned char*>(y.raw_data());
  // One output row y[a, c, b, :] = x[a, b, c, :] per iteration.
#pragma omp parallel for schedule(static) if (rows * D >= cpu::kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t a = r / (C * B), c = (r / B) % C, b = r % B;
    std::memcpy(dst + static_cast<size_t>(r) * row_bytes, src + static_cast<size_t>((a * B + b) * C + c) * row_bytes,
                row_bytes);
  }
}

}  // namespace remat
