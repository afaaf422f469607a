// Attention and permute_0213 on the CPU backend (src/backends/cpu/attention.cpp): against
// PyTorch goldens (bf16: tools/reference/golden/bf16_ops.py), a naive float64 reference with Philox
// dropout, finite differences, determinism and bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ops/op_test.h"
#include "remat/backend.h"
#include "remat/ops.h"
#include "remat/philox.h"
#include "support/expect_error.h"
#include "support/golden.h"
#include "support/gradcheck.h"

namespace remat::test {
namespace {

// References: PyTorch goldens (tools/reference/golden/transformer.py, computed in float64 from the
// float32 inputs), finite differences of L = sum(dy * y), and for dropout (whose Philox mask
// PyTorch cannot reproduce) a naive float64 implementation in this file drawing its mask with
// philox::keep.
//
// Tolerances (|actual - expected| <= atol + rtol * |expected|), against float64 references:
// out, probs, dqkv: rtol 1e-5, atol 1e-6 (T <= 70; worst seen about 3e-7 absolute on O(1)
// values); permute_0213: exact; finite differences: support/gradcheck.h defaults (eps 1e-2,
// rtol 2e-2, atol 2e-3).

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Tensor from_doubles(const std::vector<double>& v, const Shape& s) {
  return Tensor::from_vector(std::vector<float>(v.begin(), v.end()), s);
}

TEST(Attention, GoldenCasesExist) {
  // Guards the loops of MatchesPyTorch against passing vacuously when files are missing.
  EXPECT_GE(transformer_cases("attention").size(), 4u);
  EXPECT_GE(transformer_cases("permute_0213").size(), 2u);
}

TEST(Attention, MatchesPyTorch) {
  for (const auto& name : transformer_cases("attention")) {
    SCOPED_TRACE(name);
    const auto f = test::load_golden(name);
    AttentionParams p;
    p.n_head = static_cast<int>(test::meta_int(f, "n_head"));
    p.causal = test::meta_int(f, "causal") != 0;
    p.dropout = static_cast<float>(test::meta_float(f, "dropout"));
    const Tensor qkv = f.tensor("qkv"), dout = f.tensor("dout");
    const RngState rng{5, 8};
    const auto r = ops::attention(cpu(), qkv, p, rng);
    EXPECT_ALL_CLOSE(r.out, f.tensor("out"), 1e-5, 1e-6);
    EXPECT_ALL_CLOSE(r.probs, f.tensor("probs"), 1e-5, 1e-6);
    if (p.causal) {
      const int64_t t = qkv.size(1);
      const auto pr = r.probs.to_vector();
      for (int64_t e = 0; e < r.probs.numel(); ++e)
        if (e % t > (e / t) % t) {
          ASSERT_EQ(pr[e], 0.0f) << "masked entry at flat index " << e;
        }
    }
    // dqkv is written: NaN before.
    const Tensor dqkv = Tensor::full(qkv.shape(), kNaN);
    const Tensor ws = ops::workspace(cpu(), cpu().attention_backward_workspace(qkv.shape(), p));
    cpu().attention_backward(dout, qkv, r.probs, p, rng, dqkv, ws);
    EXPECT_ALL_CLOSE(dqkv, f.tensor("dqkv"), 1e-5, 1e-6);
    EXPECT_ALL_CLOSE(ops::attention_backward(cpu(), dout, qkv, r.probs, p, rng), f.tensor("dqkv"), 1e-5, 1e-6);
  }
}

// A float64 reference of attention with Philox dropout, written from the formulas with
// plain loops: out, probs (before dropout) and dqkv for upstream gradient dout.
struct NaiveAttention {
  std::vector<double> out, probs, dqkv;
  int64_t kept = 0, dropped = 0;  // over the unmasked entries
};

NaiveAttention naive_attention(const Tensor& qkv_t, const Tensor& dout_t, const AttentionParams& p, RngState rng) {
  const int64_t B = qkv_t.size(0), T = qkv_t.size(1), C = qkv_t.size(2) / 3, H = p.n_head, hs = C / H;
  const auto qkv = qkv_t.to_vector(), dout = dout_t.to_vector();
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  NaiveAttention r;
  r.out.assign(static_cast<size_t>(B * T * C), 0.0);
  r.probs.assign(static_cast<size_t>(B * H * T * T), 0.0);
  r.dqkv.assign(static_cast<size_t>(B * T * 3 * C), 0.0);
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t d) {
    return static_cast<size_t>((b * T + t) * 3 * C + part * C + h * hs + d);
  };
  std::vector<double> P(static_cast<size_t>(T * T)), M(P.size()), dP(P.size()), dS(P.size());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        double mx = -INFINITY;
        std::vector<double> s(static_cast<size_t>(T), -INFINITY);
        for (int64_t j = 0; j < T; ++j) {
          if (p.causal && j > i) continue;
          double acc = 0;
          for (int64_t d = 0; d < hs; ++d) acc += static_cast<double>(qkv[at(b, i, 0, h, d)]) * qkv[at(b, j, 1, h, d)];
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < T; ++j) sum += std::exp(s[j] - mx);
        for (int64_t j = 0; j < T; ++j) {
          const size_t e = static_cast<size_t>(i * T + j);
          P[e] = std::exp(s[j] - mx) / sum;
          const uint64_t flat = static_cast<uint64_t>(((b * H + h) * T + i) * T + j);
          const bool keep = p.dropout == 0.0f || philox::keep(rng.seed, rng.offset, flat, 1.0f - p.dropout);
          M[e] = keep ? 1.0 / (1.0 - p.dropout) : 0.0;
          if (!(p.causal && j > i)) (keep ? r.kept : r.dropped) += 1;
          r.probs[static_cast<size_t>(flat)] = P[e];
        }
      }
      for (int64_t i = 0; i < T; ++i)
        for (int64_t d = 0; d < hs; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < T; ++j) acc += P[i * T + j] * M[i * T + j] * qkv[at(b, j, 2, h, d)];
          r.out[static_cast<size_t>((b * T + i) * C + h * hs + d)] = acc;
        }
      // Backward.
      auto g = [&](int64_t t, int64_t d) {
        return static_cast<double>(dout[static_cast<size_t>((b * T + t) * C + h * hs + d)]);
      };
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < hs; ++d) acc += g(i, d) * qkv[at(b, j, 2, h, d)];
          dP[i * T + j] = acc * M[i * T + j];
        }
      for (int64_t i = 0; i < T; ++i) {
        double rs = 0;
        for (int64_t j = 0; j < T; ++j) rs += P[i * T + j] * dP[i * T + j];
        for (int64_t j = 0; j < T; ++j) dS[i * T + j] = P[i * T + j] * (dP[i * T + j] - rs);
      }
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < hs; ++d) {
          double dq = 0, dk = 0, dv = 0;
          for (int64_t u = 0; u < T; ++u) {
            dq += dS[t * T + u] * qkv[at(b, u, 1, h, d)] * scale;
            dk += dS[u * T + t] * qkv[at(b, u, 0, h, d)] * scale;
            dv += P[u * T + t] * M[u * T + t] * g(u, d);
          }
          r.dqkv[at(b, t, 0, h, d)] = dq;
          r.dqkv[at(b, t, 1, h, d)] = dk;
          r.dqkv[at(b, t, 2, h, d)] = dv;
        }
    }
  }
  return r;
}

TEST(Attention, DropoutMatchesNaiveReference) {
  // T = 7: rows start at word offsets that are not multiples of 4 (a Philox block).
  // T = 70: the causal GEMMs go by blocks of rows, the last one partial; rows are longer
  // than one chunk of the dropout mask.
  for (const auto& [shape, n_head] : std::vector<std::pair<Shape, int>>{{Shape{2, 7, 36}, 3}, {Shape{1, 70, 24}, 2}})
    for (bool causal : {true, false}) {
      const Tensor qkv = random_tensor(shape, 51, -1.5f, 1.5f);
      const Tensor dout = random_tensor(Shape{shape[0], shape[1], shape[2] / 3}, 52);
      for (float drop : {0.0f, 0.3f}) {
        SCOPED_TRACE(shape.str() + (causal ? " causal" : " full") + " dropout " + std::to_string(drop));
        const AttentionParams p{n_head, causal, drop};
        const RngState rng{1234, 4096};
        const auto ref = naive_attention(qkv, dout, p, rng);
        if (drop > 0.0f) {  // the mask is not trivial
          EXPECT_GT(ref.kept, 0);
          EXPECT_GT(ref.dropped, 0);
        }
        const auto r = ops::attention(cpu(), qkv, p, rng);
        EXPECT_ALL_CLOSE(r.probs, from_doubles(ref.probs, r.probs.shape()), 1e-5, 1e-6);
        EXPECT_ALL_CLOSE(r.out, from_doubles(ref.out, r.out.shape()), 1e-5, 1e-6);
        const Tensor dqkv = ops::attention_backward(cpu(), dout, qkv, r.probs, p, rng);
        EXPECT_ALL_CLOSE(dqkv, from_doubles(ref.dqkv, qkv.shape()), 1e-5, 1e-6);
        // A different Philox range gives a different mask, hence a different output.
        if (drop > 0.0f) {
          EXPECT_FALSE(bitwise_equal(ops::attention(cpu(), qkv, p, RngState{1234, 8192}).out, r.out));
        }
      }
    }
}

TEST(Attention, DropoutOneGivesZeros) {
  const Tensor qkv = random_tensor(Shape{2, 6, 24}, 61);
  const AttentionParams p{2, true, 1.0f};
  const auto r = ops::attention(cpu(), qkv, p, RngState{3, 0});
  for (float v : r.out.to_vector()) ASSERT_EQ(v, 0.0f);
  // probs are saved before dropout: still a softmax.
  const auto ref = naive_attention(qkv, Tensor::zeros(Shape{2, 6, 8}), AttentionParams{2, true, 0.0f}, RngState{});
  EXPECT_ALL_CLOSE(r.probs, from_doubles(ref.probs, r.probs.shape()), 1e-5, 1e-6);
  const Tensor dqkv =
      ops::attention_backward(cpu(), random_tensor(Shape{2, 6, 8}, 62), qkv, r.probs, p, RngState{3, 0});
  for (float v : dqkv.to_vector()) ASSERT_EQ(v, 0.0f);
}

TEST(Attention, GradientsMatchFiniteDifferences) {
  // With dropout the mask is fixed by rng, so the loss stays a smooth function of qkv and
  // the check also proves that backward regenerates the forward's mask.
  const Tensor qkv = random_tensor(Shape{2, 6, 24}, 71);
  const Tensor dout = random_tensor(Shape{2, 6, 8}, 72);
  const RngState rng{77, 128};
  for (bool causal : {true, false}) {
    for (float drop : {0.0f, 0.25f}) {
      SCOPED_TRACE(std::string(causal ? "causal" : "full") + " dropout " + std::to_string(drop));
      const AttentionParams p{2, causal, drop};
      const auto r = ops::attention(cpu(), qkv, p, rng);
      const Tensor dqkv = ops::attention_backward(cpu(), dout, qkv, r.probs, p, rng);
      auto loss = [&] { return dot(dout, ops::attention(cpu(), qkv, p, rng).out); };
      test::GradCheckOptions opt;
      opt.max_elements = 96;
      EXPECT_TRUE(check_gradient("attention dqkv", qkv, dqkv, loss, opt));
    }
  }
}

TEST(Attention, Permute0213MatchesPyTorchAndIsItsOwnInverse) {
  for (const auto& name : transformer_cases("permute_0213")) {
    SCOPED_TRACE(name);
    const auto f = test::load_golden(name);
    const Tensor x = f.tensor("x");
    const Tensor y = ops::permute_0213(cpu(), x);
    EXPECT_TRUE(bitwise_equal(y, f.tensor("y")));
    EXPECT_TRUE(bitwise_equal(ops::permute_0213(cpu(), y), x));
  }
}

// Every op of the family, forward and backward, on shapes large enough that the CPU loops run
// in parallel; returns all results.
std::vector<Tensor> run_attention() {
  Backend& be = cpu();
  std::vector<Tensor> out;
  for (int64_t t : {33, 70})  // rows on one thread, and in parallel
    for (bool causal : {true, false}) {
      const Tensor qkv = random_tensor(Shape{2, t, 96}, 101), dout = random_tensor(Shape{2, t, 32}, 102);
      const AttentionParams p{4, causal, 0.2f};
      const RngState rng{9, 40};
      auto r = ops::attention(be, qkv, p, rng);
      out.insert(out.end(), {r.out, r.probs, ops::attention_backward(be, dout, qkv, r.probs, p, rng)});
    }
  out.push_back(ops::permute_0213(be, random_tensor(Shape{4, 16, 9, 32}, 111)));
  return out;
}

TEST(Attention, BitwiseAcrossRunsAndThreadCounts) { expect_bitwise_across_runs_and_thread_counts(run_attention); }

TEST(Attention, BadArgumentsNameTheOpAndShapes) {
  Backend& be = cpu();
  const Tensor qkv = random_tensor(Shape{2, 5, 12}, 121);
  // C = 4 is not divisible by 3 heads.
  EXPECT_REMAT_ERROR(ops::attention(be, qkv, AttentionParams{3, true, 0.0f}, RngState{}),
                     "attention_forward: qkv [2, 5, 12]: last dimension must be 3 * C with C divisible by n_head 3");
  EXPECT_REMAT_ERROR(be.attention_backward_workspace(qkv.shape(), AttentionParams{3, true, 0.0f}),
                     "attention_backward: qkv [2, 5, 12]");
  EXPECT_REMAT_ERROR(be.attention_forward(random_tensor(Shape{5, 12}, 122), AttentionParams{}, RngState{},
                                          Tensor::empty(Shape{5, 4}), Tensor::empty(Shape{1, 1, 5, 5}), Tensor()),
                     "expected rank 3");
  EXPECT_REMAT_ERROR(ops::attention(be, Tensor::zeros(Shape{1, 2, 0}), AttentionParams{}, RngState{}),
                     "must be positive");
  EXPECT_REMAT_ERROR(ops::attention(be, qkv, AttentionParams{2, true, 1.5f}, RngState{}), "dropout must be in [0, 1]");
  // probs of the wrong shape in backward.
  EXPECT_REMAT_ERROR(
      ops::attention_backward(be, random_tensor(Shape{2, 5, 4}, 123), qkv, Tensor::zeros(Shape{2, 1, 5, 5}),
                              AttentionParams{2, true, 0.0f}, RngState{}),
      "probs f32[2, 1, 5, 5] on cpu: expected shape [2, 2, 5, 5]");

  // Outputs over inputs (probs [1, 1, 6, 6] can be a view of qkv [1, 6, 6]).
  const Tensor qkv6 = random_tensor(Shape{1, 6, 6}, 125);
  EXPECT_REMAT_ERROR(be.attention_forward(qkv6, AttentionParams{1, true, 0.0f}, RngState{},
                                          Tensor::empty(Shape{1, 6, 2}), qkv6.reshape({1, 1, 6, 6}), Tensor()),
                     "attention_forward: qkv, out and probs must not share storage");
  const Tensor probs = Tensor::zeros(Shape{2, 2, 5, 5});
  EXPECT_REMAT_ERROR(be.attention_backward(random_tensor(Shape{2, 5, 4}, 125), qkv, probs,
                                           AttentionParams{2, true, 0.0f}, RngState{}, qkv, ops::workspace(be, 400)),
                     "attention_backward: dqkv must not share storage with qkv, dout or probs");

  // Workspace too small, or missing.
  const AttentionParams pd{2, true, 0.1f};
  const size_t need = be.attention_forward_workspace(qkv.shape(), pd);
  EXPECT_EQ(need, 4u * 5u * 5u * sizeof(float));  // 2 batches x 2 heads of [5, 5]
  const Tensor small = Tensor::empty(Shape{static_cast<int64_t>(need / 4 - 1)});
  EXPECT_REMAT_ERROR(
      be.attention_forward(qkv, pd, RngState{}, Tensor::empty(Shape{2, 5, 4}), Tensor::empty(Shape{2, 2, 5, 5}), small),
      "attention_forward: workspace of 400 bytes needed, got 396");
  EXPECT_REMAT_ERROR(be.attention_backward(random_tensor(Shape{2, 5, 4}, 124), qkv, Tensor::zeros(Shape{2, 2, 5, 5}),
                                           pd, RngState{}, Tensor::empty(qkv.shape()), Tensor()),
                     "attention_backward: workspace of 800 bytes needed, got none");

  // permute_0213: wrong rank; output aliasing the input.
  EXPECT_REMAT_ERROR(be.permute_0213(random_tensor(Shape{2, 3, 4}, 132), Tensor::empty(Shape{2, 4, 3})),
                     "permute_0213: x f32[2, 3, 4] on cpu: expected rank 4");
  const Tensor sq = random_tensor(Shape{1, 3, 3, 2}, 133);
  EXPECT_REMAT_ERROR(be.permute_0213(sq, sq), "must not share storage");
}

// ---- bf16 ----------------------------------------------------------------------------------

TEST(Attention, Bf16MatchesPyTorch) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  auto f = load_golden("bf16_ops/attention");
  Tensor qkv = bf16_in(f, "qkv");
  const AttentionParams p{static_cast<int>(remat::test::meta_int(f, "heads")), true, 0.0f};
  const int64_t b = qkv.size(0), t = qkv.size(1);
  Tensor out = bf16_empty(f.tensor("y").shape()), probs = bf16_empty(Shape{b, p.n_head, t, t});
  Tensor ws = Tensor::empty(Shape{static_cast<int64_t>(cpu().attention_forward_workspace(qkv.shape(), p) / 4 + 1)});
  cpu().attention_forward(qkv, p, RngState{}, out, probs, ws);
  // PyTorch's bf16 attention rounds the scores (and P V's output) to bf16 as well.
  expect_bf16_golden(f, "y", out, 0, 16);
  Tensor dqkv = bf16_empty(qkv.shape());
  Tensor wsb = Tensor::empty(Shape{static_cast<int64_t>(cpu().attention_backward_workspace(qkv.shape(), p) / 4 + 1)});
  cpu().attention_backward(bf16_in(f, "dy"), qkv, probs, p, RngState{}, dqkv, wsb);
  // The fp32 reference's softmax backward reads its fp32 probabilities, remat the stored bf16
  // ones; PyTorch's bf16 backward also rounds dP, dS and the GEMM outputs.
  expect_bf16_golden(f, "dqkv", dqkv, 3, 8);
}

TEST(Attention, Bf16ProbsRoundedOutputsClose) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  const int64_t B = 2, T = 24, C = 32;
  const AttentionParams p{4, true, 0.2f};
  const RngState rng{3, 1000};
  Bf16Pair qkv = random_pair(Shape{B, T, 3 * C}, 15);
  Bf16Pair out = empty_pair(Shape{B, T, C}), probs = empty_pair(Shape{B, 4, T, T});
  Tensor wsf, wsh;
  {
    ActivationDTypeScope f32(DType::f32);
    wsf = Tensor::empty(Shape{static_cast<int64_t>(cpu().attention_forward_workspace(qkv.f.shape(), p) / 4 + 1)});
  }
  wsh = Tensor::empty(Shape{static_cast<int64_t>(cpu().attention_forward_workspace(qkv.h.shape(), p) / 4 + 1)});
  {
    ActivationDTypeScope f32(DType::f32);
    cpu().attention_forward(qkv.f, p, rng, out.f, probs.f, wsf);
  }
  cpu().attention_forward(qkv.h, p, rng, out.h, probs.h, wsh);
  expect_rounded(probs, "attention probs");
  expect_close_to_fp32(out, 1.0 / 64, "attention out");
  // Backward from the bf16 probabilities: the fp32 reference reads the same (widened) values.
  Bf16Pair dout = random_pair(Shape{B, T, C}, 16), dqkv = empty_pair(Shape{B, T, 3 * C});
  Bf16Pair probs_b = bf16_pair(widen(probs.h), probs.h.shape());
  {
    ActivationDTypeScope f32(DType::f32);
    Tensor ws =
        Tensor::empty(Shape{static_cast<int64_t>(cpu().attention_backward_workspace(qkv.f.shape(), p) / 4 + 1)});
    cpu().attention_backward(dout.f, qkv.f, probs_b.f, p, rng, dqkv.f, ws);
  }
  Tensor ws = Tensor::empty(Shape{static_cast<int64_t>(cpu().attention_backward_workspace(qkv.h.shape(), p) / 4 + 1)});
  cpu().attention_backward(dout.h, qkv.h, probs_b.h, p, rng, dqkv.h, ws);
  expect_close_to_fp32(dqkv, 1.0 / 64, "attention dqkv");
}

// permute_0213 copies one dtype: x and y alike.
TEST(Attention, Bf16Permute0213KeepsItsDtype) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  Bf16Pair p = random_pair(Shape{2, 3, 4, 5}, 34);
  Tensor q32 = Tensor::empty(Shape{2, 4, 3, 5});
  const std::string msg = error_of([&] { cpu().permute_0213(p.h, q32); });
  EXPECT_NE(msg.find("permute_0213: x bf16[2, 3, 4, 5] on cpu and y f32[2, 4, 3, 5] on cpu"), std::string::npos) << msg;
  EXPECT_NE(msg.find("need one dtype"), std::string::npos) << msg;
}

}  // namespace
}  // namespace remat::test
