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
// The GEMMs run on the calling thread, one (b, h) after another (OpenBLAS threads each
// call itself; cblas is never called inside an OpenMP region). Softmax, dropout and the
// softmax backward are OpenMP-parallel over rows, each row computed by one thread in a
// fixed order, so results do not depend on the OpenMP thread count. One [T, T] scratch
// matrix comes from the workspace: the dropped probabilities in forward (only with
// dropout), dP/dS in backward.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "kernels/philox.cuh"
#include "remat/error.h"

namespace remat {

namespace {

struct AttnDims {
  int64_t b, t, c, h, hs;
};

AttnDims attn_dims(const Shape& qkv, const AttentionParams& p) {
  AttnDims d{qkv[0], qkv[1], qkv[2] / 3, p.n_head, 0};
  d.hs = d.c / d.h;
  // cblas takes int sizes and leading dimensions.
  REMAT_CHECK(d.t <= INT_MAX && qkv[2] <= INT_MAX, "attention: qkv ", qkv.str(), " is too large for cblas");
  return d;
}

size_t scratch_bytes(const Shape& qkv) { return static_cast<size_t>(qkv[1] * qkv[1]) * sizeof(float); }

// Calls f(j, kept) for j in [0, n): whether dropout keeps element `first + j` of the op's
// Philox range. The same decision as philox::keep(seed, offset, first + j, keep_prob), but
// each Philox block (four words) is computed once instead of once per word.
template <typename F>
inline void for_each_keep(RngState rng, uint64_t first, int64_t n, float keep_prob, F&& f) {
  uint64_t w = rng.offset + first;
  int64_t j = 0;
  while (j < n) {
    const philox::Bits4 bits = philox::block(rng.seed, w >> 2);
    for (unsigned comp = static_cast<unsigned>(w & 3u); comp < 4 && j < n; ++comp, ++j, ++w) {
      f(j, philox::uniform(philox::component(bits, comp)) < keep_prob);
    }
  }
}

void sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

}  // namespace

size_t CpuBackend::attention_forward_workspace_impl(const Shape& qkv, const AttentionParams& p) {
  return p.dropout > 0.0f ? scratch_bytes(qkv) : 0;
}

size_t CpuBackend::attention_backward_workspace_impl(const Shape& qkv, const AttentionParams&) {
  return scratch_bytes(qkv);
}

void CpuBackend::attention_forward_impl(const Tensor& qkv, const AttentionParams& p, RngState rng, const Tensor& out,
                                        const Tensor& probs, const Tensor& workspace) {
  const AttnDims d = attn_dims(qkv.shape(), p);
  if (d.b == 0 || d.t == 0) return;
  const int64_t T = d.t, C = d.c, ld = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.hs));
  const bool dropout = p.dropout > 0.0f;
  const float keep_prob = 1.0f - p.dropout;
  const float inv_keep = keep_prob > 0.0f ? 1.0f / keep_prob : 0.0f;
  const bool causal = p.causal;
  const float* x = qkv.f32();
  float* pr = probs.f32();
  float* o = out.f32();
  float* buf = dropout ? workspace.f32() : nullptr;

  for (int64_t bh = 0; bh < d.b * d.h; ++bh) {
    const int64_t b = bh / d.h, h = bh % d.h;
    const float* q = x + b * T * ld + h * d.hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* s = pr + bh * T * T;
    sgemm(CblasNoTrans, CblasTrans, T, T, d.hs, scale, q, ld, k, ld, 0.0f, s, T);

#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < T; ++i) {
      float* row = s + i * T;
      const int64_t n = causal ? i + 1 : T;
      float mx = row[0];
      for (int64_t j = 1; j < n; ++j) mx = std::max(mx, row[j]);
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        row[j] = std::exp(row[j] - mx);
        sum += row[j];
      }
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j < n; ++j) row[j] *= inv;
      for (int64_t j = n; j < T; ++j) row[j] = 0.0f;
      if (dropout) {
        float* drow = buf + i * T;
        for_each_keep(rng, static_cast<uint64_t>((bh * T + i) * T), n, keep_prob,
                      [&](int64_t j, bool kept) { drow[j] = kept ? row[j] * inv_keep : 0.0f; });
        for (int64_t j = n; j < T; ++j) drow[j] = 0.0f;
      }
    }

    sgemm(CblasNoTrans, CblasNoTrans, T, d.hs, T, 1.0f, dropout ? buf : s, T, v, ld, 0.0f, o + b * T * C + h * d.hs,
          C);
  }
}

void CpuBackend::attention_backward_impl(const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                                         const AttentionParams& p, RngState rng, const Tensor& dqkv,
                                         const Tensor& workspace) {
  const AttnDims d = attn_dims(qkv.shape(), p);
  if (d.b == 0 || d.t == 0) return;
  const int64_t T = d.t, C = d.c, ld = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.hs));
  const bool dropout = p.dropout > 0.0f;
  const float keep_prob = 1.0f - p.dropout;
  const float inv_keep = keep_prob > 0.0f ? 1.0f / keep_prob : 0.0f;
  const bool causal = p.causal;
  const float* x = qkv.f32();
  const float* pr = probs.f32();
  const float* go = dout.f32();
  float* dx = dqkv.f32();
  float* buf = workspace.f32();

  for (int64_t bh = 0; bh < d.b * d.h; ++bh) {
    const int64_t b = bh / d.h, h = bh % d.h;
    const float* q = x + b * T * ld + h * d.hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    const float* P = pr + bh * T * T;
    const float* dO = go + b * T * C + h * d.hs;
    float* dq = dx + b * T * ld + h * d.hs;
    float* dk = dq + C;
    float* dv = dq + 2 * C;

    // dV = Pd^T dO, with Pd the dropped probabilities (rebuilt in buf from the same mask).
    if (dropout) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < T; ++i) {
        const float* row = P + i * T;
        float* drow = buf + i * T;
        const int64_t n = causal ? i + 1 : T;
        for_each_keep(rng, static_cast<uint64_t>((bh * T + i) * T), n, keep_prob,
                      [&](int64_t j, bool kept) { drow[j] = kept ? row[j] * inv_keep : 0.0f; });
        for (int64_t j = n; j < T; ++j) drow[j] = 0.0f;
      }
    }
    sgemm(CblasTrans, CblasNoTrans, T, d.hs, T, 1.0f, dropout ? buf : P, T, dO, C, 0.0f, dv, ld);

    // dPd = dO V^T, then dS = P * (dP - rowsum(dP * P)) in place.
    sgemm(CblasNoTrans, CblasTrans, T, T, d.hs, 1.0f, dO, C, v, ld, 0.0f, buf, T);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < T; ++i) {
      const float* row = P + i * T;
      float* g = buf + i * T;
      const int64_t n = causal ? i + 1 : T;
      if (dropout) {
        for_each_keep(rng, static_cast<uint64_t>((bh * T + i) * T), n, keep_prob,
                      [&](int64_t j, bool kept) { g[j] = kept ? g[j] * inv_keep : 0.0f; });
      }
      float dot = 0.0f;
      for (int64_t j = 0; j < n; ++j) dot += g[j] * row[j];
      for (int64_t j = 0; j < n; ++j) g[j] = row[j] * (g[j] - dot);
      for (int64_t j = n; j < T; ++j) g[j] = 0.0f;
    }

    // dQ = dS K / sqrt(hs); dK = dS^T Q / sqrt(hs).
    sgemm(CblasNoTrans, CblasNoTrans, T, d.hs, T, scale, buf, T, k, ld, 0.0f, dq, ld);
    sgemm(CblasTrans, CblasNoTrans, T, d.hs, T, scale, buf, T, q, ld, 0.0f, dk, ld);
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
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t a = r / (C * B), c = (r / B) % C, b = r % B;
    std::memcpy(dst + static_cast<size_t>(r) * row_bytes,
                src + static_cast<size_t>((a * B + b) * C + c) * row_bytes, row_bytes);
  }
}

}  // namespace remat
