// The fused attention of the CPU backend (Backend::flash_attention_*; FlashAttention-2 tiles,
// src/backends/cpu/flash_attention.cpp).
//
// References:
// - PyTorch goldens of the materialised attention (tools/golden/transformer.py, float64 from
//   the float32 inputs; packed self-attention, no dropout): out and dqkv.
// - A float64 implementation in this file written from the formulas with plain loops (every
//   score materialised), with the Philox mask drawn by philox::keep at the element index
//   ((b H + h) tq + i) tk + j: grouped-query attention, cross-attention, key lengths,
//   dropout, head dims up to 256, f32 and bf16 storage.
// - The materialised op (Backend::attention_*) with dropout: the same mask, so the same out
//   and dqkv to rounding.
// - Finite differences of L = sum(dout * out) (support/gradcheck.h).
//
// Tolerances (|actual - expected| <= atol + rtol |expected|): f32 against float64 references
// rtol 1e-5, atol 2e-6 (the worst seen: about 2e-6 absolute on O(1) values at d = 256, a few
// fp32 ulps of sums over 256 products and up to 130 keys); bf16 storage: the reference takes
// the same bf16 inputs, so only the rounding of out, dq, dk, dv to bf16 (2^-9 relative) and
// of fp32 sums remains: rtol 8e-3, atol 4e-3.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backends/cpu/flash_attention.h"
#include "backends/cpu/simd.h"
#include "remat/backend.h"
#include "remat/bf16.h"
#include "remat/ops.h"
#include "remat/philox.h"
#include "support/expect_error.h"
#include "support/golden.h"
#include "support/gradcheck.h"

namespace remat {
namespace {

using test::bitwise_equal;
using test::random_tensor;

Backend& cpu() { return backend_for(Device::cpu()); }

// One configuration of the op: packed ([B, T, (H + 2 Hkv) d], one tensor) or cross (q
// [B, tq, H d], kv [B, tk, 2 Hkv d]).
struct Config {
  int64_t b, tq, tk;
  int h, hkv;
  int64_t d;
  bool causal, cross, lengths;
  float dropout;
  FlashAttentionParams params() const {
    return cross ? FlashAttentionParams::cross(h, hkv, d, dropout)
                 : FlashAttentionParams::packed(h, hkv, d, causal, dropout);
  }
  std::string str() const {
    return "b" + std::to_string(b) + " tq" + std::to_string(tq) + " tk" + std::to_string(tk) + " h" +
           std::to_string(h) + "/" + std::to_string(hkv) + " d" + std::to_string(d) + (causal ? " causal" : "") +
           (cross ? " cross" : "") + (lengths ? " lengths" : "") + " p" + std::to_string(dropout);
  }
};

struct Inputs {
  Tensor xq, xkv, lens, dout;
};

Inputs make_inputs(const Config& s, uint32_t seed) {
  const FlashAttentionParams p = s.params();
  Inputs in;
  if (s.cross) {
    in.xq = random_tensor(Shape{s.b, s.tq, s.h * s.d}, seed);
    in.xkv = random_tensor(Shape{s.b, s.tk, 2 * s.hkv * s.d}, seed + 1);
  } else {
    in.xq = in.xkv = random_tensor(Shape{s.b, s.tq, (s.h + 2 * int64_t{p.kv_heads()}) * s.d}, seed);
  }
  if (s.lengths) {
    std::vector<int32_t> l;
    for (int64_t b = 0; b < s.b; ++b) l.push_back(static_cast<int32_t>(std::max<int64_t>(1, s.tk - 7 * b - 3)));
    in.lens = Tensor::from_ints(l, Shape{s.b});
  }
  in.dout = random_tensor(Shape{s.b, s.tq, s.h * s.d}, seed + 2);
  return in;
}

// float64 attention from the formulas: out [B, tq, H d], lse [B, H, tq], and the gradients
// of xq and xkv (one tensor's worth each; summed into one when packed).
struct Naive {
  std::vector<double> out, lse, dxq, dxkv;
};

Naive naive(const Config& s, const Inputs& in, RngState rng) {
  const FlashAttentionParams p = s.params();
  const std::vector<float> xq = in.xq.to_vector(), xkv = in.xkv.to_vector(), dout = in.dout.to_vector();
  const std::vector<int32_t> lens = in.lens.defined() ? in.lens.to_ints() : std::vector<int32_t>();
  const int64_t wq = in.xq.size(2), wkv = in.xkv.size(2), d = s.d, group = s.h / p.kv_heads();
  const double scale = 1.0 / std::sqrt(static_cast<double>(static_cast<float>(d)));
  const float keep = 1.0f - s.dropout, factor = 1.0f / keep;
  Naive r;
  r.out.assign(static_cast<size_t>(s.b * s.tq * s.h * d), 0.0);
  r.lse.assign(static_cast<size_t>(s.b * s.h * s.tq), 0.0);
  r.dxq.assign(xq.size(), 0.0);
  r.dxkv.assign(xkv.size(), 0.0);
  auto q = [&](int64_t b, int64_t i, int64_t h, int64_t c) { return (b * s.tq + i) * wq + p.q_col + h * d + c; };
  auto k = [&](int64_t b, int64_t j, int64_t g, int64_t c) { return (b * s.tk + j) * wkv + p.k_col + g * d + c; };
  auto v = [&](int64_t b, int64_t j, int64_t g, int64_t c) { return (b * s.tk + j) * wkv + p.v_col + g * d + c; };
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.h; ++h) {
      const int64_t g = h / group, len = lens.empty() ? s.tk : lens[static_cast<size_t>(b)];
      for (int64_t i = 0; i < s.tq; ++i) {
        std::vector<double> sc(static_cast<size_t>(s.tk), -INFINITY), pr(static_cast<size_t>(s.tk), 0.0),
            z(static_cast<size_t>(s.tk), 0.0), dp(static_cast<size_t>(s.tk), 0.0);
        double mx = -INFINITY;
        for (int64_t j = 0; j < len; ++j) {
          if (s.causal && j > i) continue;
          double a = 0;
          for (int64_t c = 0; c < d; ++c) a += static_cast<double>(xq[q(b, i, h, c)]) * xkv[k(b, j, g, c)];
          sc[j] = a * scale;
          mx = std::max(mx, sc[j]);
        }
        double l = 0;
        for (int64_t j = 0; j < s.tk; ++j)
          if (sc[j] != -INFINITY) l += pr[j] = std::exp(sc[j] - mx);
        r.lse[static_cast<size_t>((b * s.h + h) * s.tq + i)] = mx + std::log(l);
        for (int64_t j = 0; j < s.tk; ++j) {
          pr[j] /= l;
          const uint64_t e = static_cast<uint64_t>(((b * s.h + h) * s.tq + i) * s.tk + j);
          z[j] = s.dropout > 0.0f ? (philox::keep(rng.seed, rng.offset, e, keep) ? factor : 0.0) : 1.0;
        }
        double delta = 0;
        for (int64_t j = 0; j < s.tk; ++j) {
          for (int64_t c = 0; c < d; ++c) {
            const size_t o = static_cast<size_t>(((b * s.tq + i) * s.h + h) * d + c);
            r.out[o] += pr[j] * z[j] * xkv[v(b, j, g, c)];
            dp[j] += static_cast<double>(dout[o]) * xkv[v(b, j, g, c)];
          }
          dp[j] *= z[j];
          delta += pr[j] * dp[j];
        }
        for (int64_t j = 0; j < s.tk; ++j) {
          const double ds = pr[j] * (dp[j] - delta);
          for (int64_t c = 0; c < d; ++c) {
            const size_t o = static_cast<size_t>(((b * s.tq + i) * s.h + h) * d + c);
            r.dxq[q(b, i, h, c)] += ds * xkv[k(b, j, g, c)] * scale;
            r.dxkv[k(b, j, g, c)] += ds * xq[q(b, i, h, c)] * scale;
            r.dxkv[v(b, j, g, c)] += pr[j] * z[j] * dout[o];
          }
        }
      }
    }
  if (!s.cross)  // one tensor: q's columns from dxq, k's and v's from dxkv
    for (size_t e = 0; e < r.dxq.size(); ++e) r.dxq[e] += r.dxkv[e];
  return r;
}

Tensor from_doubles(const std::vector<double>& v, const Shape& s) {
  return Tensor::from_vector(std::vector<float>(v.begin(), v.end()), s);
}

// The bf16 values of a tensor, as f32 (what a bf16 copy holds); a bf16 tensor of them; and
// a bf16 tensor widened to f32 (exact).
Tensor rounded(const Tensor& t) {
  std::vector<float> v = t.to_vector();
  for (float& x : v) x = round_to_bf16(x);
  return Tensor::from_vector(v, t.shape());
}
Tensor to_bf16(const Tensor& t) {
  const Tensor out = Tensor::empty(t.shape(), Device::cpu(), DType::bf16);
  const std::vector<float> v = t.to_vector();
  for (size_t i = 0; i < v.size(); ++i) out.bf16()[i] = bf16_from_float(v[i]);
  return out;
}
Tensor widened(const Tensor& t) { return Tensor::from_vector(t.to_vector(), t.shape()); }

const std::vector<Config>& setups() {
  static const std::vector<Config> all = {
      {2, 37, 37, 3, 3, 32, true, false, false, 0.0f},    // one tile, causal
      {2, 70, 70, 4, 2, 64, true, false, false, 0.2f},    // two tiles each way, GQA, dropout
      {1, 50, 90, 4, 1, 48, false, true, true, 0.1f},     // cross-attention, MQA, lengths
      {2, 130, 130, 2, 2, 128, true, false, true, 0.0f},  // three tiles, lengths on self-attention
      {1, 40, 33, 2, 2, 256, false, true, false, 0.3f},   // the largest head (32 x 32 tiles)
      {1, 65, 65, 2, 1, 80, true, false, false, 0.0f},    // d not a multiple of 16
      {3, 5, 9, 1, 1, 8, false, true, true, 0.0f},        // tiny
  };
  return all;
}

TEST(FlashAttention, MatchesPyTorch) {
  int cases = 0;
  for (const auto& name : test::golden_cases("transformer")) {
    const auto f = test::load_golden(name);
    if (test::meta_str(f, "op") != "attention") continue;
    SCOPED_TRACE(name);
    const int h = static_cast<int>(test::meta_int(f, "n_head"));
    const Tensor qkv = f.tensor("qkv"), dout = f.tensor("dout");
    const FlashAttentionParams p =
        FlashAttentionParams::packed(h, 0, qkv.size(2) / 3 / h, test::meta_int(f, "causal") != 0,
                                     static_cast<float>(test::meta_float(f, "dropout")));
    ASSERT_EQ(p.dropout, 0.0f) << "PyTorch cannot reproduce the Philox mask";
    const auto r = ops::flash_attention(cpu(), qkv, qkv, Tensor(), p, RngState{5, 8});
    EXPECT_ALL_CLOSE(r.out, f.tensor("out"), 1e-5, 1e-6);
    const auto g = ops::flash_attention_backward(cpu(), dout, qkv, qkv, Tensor(), r.out, r.lse, p, RngState{5, 8});
    EXPECT_TRUE(g.dxkv.same_view(g.dxq));
    EXPECT_ALL_CLOSE(g.dxq, f.tensor("dqkv"), 1e-5, 1e-6);
    ++cases;
  }
  EXPECT_GE(cases, 4);
}

TEST(FlashAttention, MatchesNaiveReference) {
  const RngState rng{7, 1000};
  for (const Config& s : setups()) {
    SCOPED_TRACE(s.str());
    const Inputs in = make_inputs(s, 11);
    const FlashAttentionParams p = s.params();
    const auto r = ops::flash_attention(cpu(), in.xq, in.xkv, in.lens, p, rng);
    const auto g = ops::flash_attention_backward(cpu(), in.dout, in.xq, in.xkv, in.lens, r.out, r.lse, p, rng);
    const Naive ref = naive(s, in, rng);
    EXPECT_ALL_CLOSE(r.out, from_doubles(ref.out, r.out.shape()), 1e-5, 2e-6);
    EXPECT_ALL_CLOSE(r.lse, from_doubles(ref.lse, r.lse.shape()), 1e-5, 2e-6);
    EXPECT_ALL_CLOSE(g.dxq, from_doubles(ref.dxq, in.xq.shape()), 1e-5, 2e-6);
    if (s.cross) {
      EXPECT_ALL_CLOSE(g.dxkv, from_doubles(ref.dxkv, in.xkv.shape()), 1e-5, 2e-6);
    }
  }
}

// bf16 storage (training.precision bf16): fp32 math on the bf16 values, outputs rounded once.
TEST(FlashAttention, Bf16StorageMatchesTheReferenceOnTheSameValues) {
  const RngState rng{3, 77};
  for (const Config& s : {setups()[1], setups()[2], setups()[5]}) {
    SCOPED_TRACE(s.str());
    Inputs in = make_inputs(s, 21);
    in.xq = rounded(in.xq);
    in.xkv = s.cross ? rounded(in.xkv) : in.xq;
    in.dout = rounded(in.dout);
    const Naive ref = naive(s, in, rng);
    ActivationDTypeScope bf16(DType::bf16);
    const Tensor xq = to_bf16(in.xq), xkv = s.cross ? to_bf16(in.xkv) : xq, dout = to_bf16(in.dout);
    const FlashAttentionParams p = s.params();
    const auto r = ops::flash_attention(cpu(), xq, xkv, in.lens, p, rng);
    ASSERT_EQ(r.out.dtype(), DType::bf16);
    ASSERT_EQ(r.lse.dtype(), DType::f32);
    const auto g = ops::flash_attention_backward(cpu(), dout, xq, xkv, in.lens, r.out, r.lse, p, rng);
    EXPECT_ALL_CLOSE(widened(r.out), from_doubles(ref.out, r.out.shape()), 8e-3, 4e-3);
    EXPECT_ALL_CLOSE(r.lse, from_doubles(ref.lse, r.lse.shape()), 1e-5, 2e-6);
    EXPECT_ALL_CLOSE(widened(g.dxq), from_doubles(ref.dxq, xq.shape()), 8e-3, 4e-3);
    if (s.cross) {
      EXPECT_ALL_CLOSE(widened(g.dxkv), from_doubles(ref.dxkv, xkv.shape()), 8e-3, 4e-3);
    }
  }
}

// The materialised op draws the same mask: with dropout, both give the same out and dqkv
// (to rounding: their sums run in other orders).
TEST(FlashAttention, SameDropoutMaskAsTheMaterialisedAttention) {
  for (const bool causal : {true, false}) {
    const Tensor qkv = random_tensor(Shape{2, 70, 3 * 24}, 31), dout = random_tensor(Shape{2, 70, 24}, 32);
    const RngState rng{99, 123};
    const AttentionParams ap{3, causal, 0.5f};
    const auto ref = ops::attention(cpu(), qkv, ap, rng);
    const Tensor ref_d = ops::attention_backward(cpu(), dout, qkv, ref.probs, ap, rng);
    const FlashAttentionParams p = FlashAttentionParams::packed(3, 0, 8, causal, 0.5f);
    const auto r = ops::flash_attention(cpu(), qkv, qkv, Tensor(), p, rng);
    EXPECT_ALL_CLOSE(r.out, ref.out, 1e-5, 2e-6);
    const auto g = ops::flash_attention_backward(cpu(), dout, qkv, qkv, Tensor(), r.out, r.lse, p, rng);
    EXPECT_ALL_CLOSE(g.dxq, ref_d, 1e-5, 2e-6);
    // Another Philox range is another mask.
    EXPECT_FALSE(
        test::all_close(ops::flash_attention(cpu(), qkv, qkv, Tensor(), p, RngState{99, 124}).out, r.out, 1e-3, 1e-3));
  }
}

// The same bits with any thread count, with the backward in one pass or two, and on every
// vector path (portable, AVX2, AVX-512).
TEST(FlashAttention, BitwiseAcrossThreadCountsAndVectorPaths) {
  const Config s = setups()[1];
  const Inputs in = make_inputs(s, 41);
  const FlashAttentionParams p = s.params();
  const RngState rng{5, 6};
  auto run = [&] {
    auto r = ops::flash_attention(cpu(), in.xq, in.xkv, in.lens, p, rng);
    auto g = ops::flash_attention_backward(cpu(), in.dout, in.xq, in.xkv, in.lens, r.out, r.lse, p, rng);
    return std::vector<Tensor>{r.out, r.lse, g.dxq};
  };
  const std::vector<Tensor> base = run();
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<Tensor> one = run();
  omp_set_num_threads(threads);
  for (size_t k = 0; k < base.size(); ++k) EXPECT_TRUE(bitwise_equal(one[k], base[k])) << "output " << k;
  for (const int passes : {1, 2}) {  // one pass (dQ with dK, dV) or two: the same bits
    cpu::flash::set_backward_passes(passes);
    const std::vector<Tensor> other = run();
    cpu::flash::set_backward_passes(0);
    for (size_t k = 0; k < base.size(); ++k) EXPECT_TRUE(bitwise_equal(other[k], base[k])) << passes << " pass(es)";
  }
  for (const cpu::Simd level : {cpu::Simd::baseline, cpu::Simd::avx2}) {
    cpu::set_simd_limit(level);
    const std::vector<Tensor> other = run();
    cpu::set_simd_limit(cpu::Simd::avx512);
    for (size_t k = 0; k < base.size(); ++k)
      EXPECT_TRUE(bitwise_equal(other[k], base[k])) << cpu::simd_name(level) << ", output " << k;
  }
}

// dL/dxq and dL/dxkv of L = sum(dout * out) against central differences, with the mask
// (a function of the element index only) held fixed by the RngState.
TEST(FlashAttention, GradientsMatchFiniteDifferences) {
  for (const Config& s :
       {Config{1, 9, 9, 4, 2, 6, true, false, false, 0.25f}, Config{2, 7, 11, 2, 1, 5, false, true, true, 0.0f}}) {
    SCOPED_TRACE(s.str());
    const Inputs in = make_inputs(s, 51);
    const FlashAttentionParams p = s.params();
    const RngState rng{12, 34};
    const auto r = ops::flash_attention(cpu(), in.xq, in.xkv, in.lens, p, rng);
    const auto g = ops::flash_attention_backward(cpu(), in.dout, in.xq, in.xkv, in.lens, r.out, r.lse, p, rng);
    auto loss = [&] { return test::dot(ops::flash_attention(cpu(), in.xq, in.xkv, in.lens, p, rng).out, in.dout); };
    EXPECT_TRUE(test::check_gradient("dxq", in.xq, g.dxq, loss));
    if (s.cross) {
      EXPECT_TRUE(test::check_gradient("dxkv", in.xkv, g.dxkv, loss));
    }
  }
}

TEST(FlashAttention, BadArgumentsNameTheOpAndShapes) {
  const Tensor qkv = random_tensor(Shape{2, 5, 3 * 8}, 1);
  const FlashAttentionParams p = FlashAttentionParams::packed(2, 0, 4, true, 0.0f);
  EXPECT_REMAT_ERROR(
      ops::flash_attention(cpu(), qkv, qkv, Tensor(), FlashAttentionParams::packed(2, 0, 5, true, 0.0f), RngState{}),
      "flash_attention_forward: xq [2, 5, 24] and xkv [2, 5, 24] are not tiled by q");
  EXPECT_REMAT_ERROR(
      ops::flash_attention(cpu(), qkv, qkv, Tensor(), FlashAttentionParams::packed(3, 2, 4, true, 0.0f), RngState{}),
      "n_head 3 is not a multiple of the 2 key/value heads");
  const Tensor q = random_tensor(Shape{2, 5, 8}, 2), kv = random_tensor(Shape{2, 6, 16}, 3);
  FlashAttentionParams causal_cross = FlashAttentionParams::cross(2, 0, 4, 0.0f);
  causal_cross.causal = true;
  EXPECT_REMAT_ERROR(ops::flash_attention(cpu(), q, kv, Tensor(), causal_cross, RngState{}),
                     "causal attention needs as many queries as keys, got 5 and 6");
  EXPECT_REMAT_ERROR(ops::flash_attention(cpu(), q, kv, Tensor::from_ints({3, 7}, Shape{2}),
                                          FlashAttentionParams::cross(2, 0, 4, 0.0f), RngState{}),
                     "flash_attention: kv_lens[1] = 7 is outside [1, 6]");
  EXPECT_REMAT_ERROR(ops::flash_attention(cpu(), q, kv, Tensor::from_ints({3}, Shape{1}),
                                          FlashAttentionParams::cross(2, 0, 4, 0.0f), RngState{}),
                     "kv_lens i32[1] on cpu: expected shape [2]");
  const auto r = ops::flash_attention(cpu(), qkv, qkv, Tensor(), p, RngState{});
  const Tensor ws = ops::workspace(cpu(), cpu().flash_attention_backward_workspace(qkv.shape(), qkv.shape(), p));
  const Tensor other = Tensor::zeros(qkv.shape());
  EXPECT_REMAT_ERROR(cpu().flash_attention_backward(r.out, qkv, qkv, Tensor(), r.out, r.lse, p, RngState{}, other,
                                                    Tensor::zeros(qkv.shape()), ws),
                     "xkv is xq (packed), so dxkv must be dxq");
}

}  // namespace
}  // namespace remat
