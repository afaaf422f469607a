// Multi-head self-attention and the head permute.
//
// Tolerances: probs agree to 2e-6 + 2e-5 relative (scores are sums of hs <= 64 products in
// [-1, 1], scaled; the CPU's exp is a polynomial good to 2.5e-7); out and dqkv are further
// sums over T <= 33 positions, 2e-5 + 1e-4 relative. The dropout masks must be identical:
// cases with a one-hot V (forward) or a one-hot dout (backward) copy the dropped
// probabilities into out / dV, whose zeros are then compared exactly.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "backend_ops/harness.h"
#include "remat/bf16.h"
#include "remat/error.h"

namespace remat::test {

namespace {

struct AttnShape {
  int64_t b, t, c;
  int n_head;
};

std::string label(const AttnShape& s, const AttentionParams& p) {
  return "B=" + std::to_string(s.b) + " T=" + std::to_string(s.t) + " C=" + std::to_string(s.c) +
         " H=" + std::to_string(s.n_head) + (p.causal ? " causal" : " full") + " p=" + std::to_string(p.dropout);
}

// A workspace of `bytes` (at least one float) filled with NaN: an op must not read what it
// did not write.
Tensor nan_workspace(Backend& be, size_t bytes) {
  const int64_t n = std::max<int64_t>(static_cast<int64_t>((bytes + 3) / 4), 1);
  return Tensor::full({n}, std::numeric_limits<float>::quiet_NaN(), be.device());
}

void forward(Backend& be, Side s, const Pair& qkv, const AttentionParams& p, RngState rng, const Pair& out,
             const Pair& probs) {
  Tensor ws = nan_workspace(be, be.attention_forward_workspace(s(qkv).shape(), p));
  be.attention_forward(s(qkv), p, rng, s(out), s(probs), ws);
}

void backward(Backend& be, Side s, const Pair& dout, const Pair& qkv, const Pair& probs, const AttentionParams& p,
              RngState rng, const Pair& dqkv) {
  Tensor ws = nan_workspace(be, be.attention_backward_workspace(s(qkv).shape(), p));
  be.attention_backward(s(dout), s(qkv), s(probs), p, rng, s(dqkv), ws);
}

// Zero where the reference is zero, and nowhere else.
void expect_same_zeros(const Pair& p, const std::string& what) {
  const auto r = p.ref.to_vector(), d = p.dut.to_vector();
  int64_t bad = 0, first = -1, zeros = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    zeros += r[i] == 0.0f;
    if ((r[i] == 0.0f) != (d[i] == 0.0f) && bad++ == 0) first = static_cast<int64_t>(i);
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " zeros differ, first at flat index " << first;
  EXPECT_GT(zeros, 0) << what << ": no zeros at all, the check checks nothing";
}

const AttnShape kShapes[] = {{2, 1, 8, 1}, {2, 5, 8, 2}, {2, 16, 24, 4}, {2, 33, 64, 4}, {2, 33, 12, 1}, {1, 7, 6, 2}};

constexpr double kProbsAtol = 2e-6, kProbsRtol = 2e-5;
constexpr double kSumAtol = 2e-5, kSumRtol = 1e-4;

// Forward and backward of one shape for each dropout probability (causal or not), against the cpu: the
// probabilities within the softmax tolerance, out and dqkv within (sum_atol, sum_rtol).
void forward_and_backward(OpCheck& t, const AttnShape& s, RngState rng, std::initializer_list<float> dropouts,
                          double sum_atol, double sum_rtol, bool causal = true) {
  for (float dropout : dropouts) {
    const AttentionParams p{s.n_head, causal, dropout};
    auto qkv = t.uniform({s.b, s.t, 3 * s.c});
    auto dout = t.uniform({s.b, s.t, s.c});
    auto out = t.output({s.b, s.t, s.c}), probs = t.output({s.b, s.n_head, s.t, s.t});
    auto dqkv = t.output({s.b, s.t, 3 * s.c});
    t.run([&](Backend& be, Side sd) {
      forward(be, sd, qkv, p, rng, out, probs);
      backward(be, sd, dout, qkv, probs, p, rng, dqkv);
    });
    t.expect_close(probs, kProbsAtol, kProbsRtol, "probs " + label(s, p));
    t.expect_close(out, sum_atol, sum_rtol, "out " + label(s, p));
    t.expect_close(dqkv, sum_atol, sum_rtol, "dqkv " + label(s, p));
  }
}

}  // namespace

REMAT_OP_CASE(attention, forward) {
  for (const auto& s : kShapes) {
    for (bool causal : {true, false}) {
      for (float dropout : {0.0f, 0.1f}) {
        const AttentionParams p{s.n_head, causal, dropout};
        const RngState rng{1234, 8};
        auto qkv = t.uniform({s.b, s.t, 3 * s.c});
        auto out = t.output({s.b, s.t, s.c}), probs = t.output({s.b, s.n_head, s.t, s.t});
        t.run([&](Backend& be, Side sd) { forward(be, sd, qkv, p, rng, out, probs); });
        t.expect_close(probs, kProbsAtol, kProbsRtol, "probs " + label(s, p));
        t.expect_close(out, kSumAtol, kSumRtol, "out " + label(s, p));
      }
    }
  }
}

REMAT_OP_CASE(attention, probs_only) {
  // Without out, forward computes the probabilities only (what recompute rebuilds when the
  // output is kept): on each side bitwise those of a full forward, whatever the dropout.
  for (const auto& s : kShapes) {
    for (bool causal : {true, false}) {
      for (float dropout : {0.0f, 0.1f}) {
        const AttentionParams p{s.n_head, causal, dropout};
        const RngState rng{1234, 8};
        auto qkv = t.uniform({s.b, s.t, 3 * s.c});
        auto out = t.output({s.b, s.t, s.c}), full = t.output({s.b, s.n_head, s.t, s.t});
        auto probs = t.output({s.b, s.n_head, s.t, s.t});
        t.run([&](Backend& be, Side sd) {
          forward(be, sd, qkv, p, rng, out, full);
          Tensor ws = nan_workspace(be, be.attention_forward_workspace(sd(qkv).shape(), p));
          be.attention_forward(sd(qkv), p, rng, Tensor(), sd(probs), ws);
          EXPECT_EQ(sd(probs).to_vector(), sd(full).to_vector())
              << (sd.ref ? "reference" : "device") << ": probs only vs full forward, " << label(s, p);
        });
        t.expect_close(probs, kProbsAtol, kProbsRtol, "probs only " + label(s, p));
      }
    }
  }
}

REMAT_OP_CASE(attention, backward) {
  for (const auto& s : kShapes)
    for (bool causal : {true, false})
      forward_and_backward(t, s, RngState{99, 4}, {0.0f, 0.1f}, kSumAtol, kSumRtol, causal);
}

REMAT_OP_CASE(attention, dropout_mask_forward) {
  // V one-hot (v[b, j, h*hs + j] = 1, hs >= T): out[b, i, h*hs + j] = dropped probs[b, h, i, j].
  // Offsets 6 (not a whole Philox block) and 12.
  const int64_t B = 2, T = 16, H = 2, hs = 16, C = H * hs;
  for (uint64_t offset : {6u, 12u}) {
    for (bool causal : {true, false}) {
      const AttentionParams p{static_cast<int>(H), causal, 0.5f};
      const RngState rng{7, offset};
      std::vector<float> x(static_cast<size_t>(B * T * 3 * C));
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < T; ++j)
          for (int64_t col = 0; col < 3 * C; ++col) {
            float& v = x[static_cast<size_t>((b * T + j) * 3 * C + col)];
            v = col < 2 * C ? u(t.rng()) : ((col - 2 * C) % hs == j ? 1.0f : 0.0f);
          }
      auto qkv = t.values(x, {B, T, 3 * C});
      auto out = t.output({B, T, C}), probs = t.output({B, H, T, T});
      t.run([&](Backend& be, Side sd) { forward(be, sd, qkv, p, rng, out, probs); });
      const std::string what =
          std::string("out (dropped probs) offset ") + std::to_string(offset) + (causal ? " causal" : " full");
      t.expect_close(out, kProbsAtol, kProbsRtol, what);
      expect_same_zeros(out, what);
    }
  }
}

REMAT_OP_CASE(attention, dropout_mask_backward) {
  // dout one-hot (dout[b, i, h*hs + i] = 1, hs >= T): dV[b, j, h*hs + i] = dropped probs[b, h, i, j].
  const int64_t B = 2, T = 13, H = 2, hs = 16, C = H * hs;
  for (bool causal : {true, false}) {
    const AttentionParams p{static_cast<int>(H), causal, 0.5f};
    const RngState rng{31, 6};
    std::vector<float> g(static_cast<size_t>(B * T * C), 0.0f);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < T; ++i)
        for (int64_t h = 0; h < H; ++h) g[static_cast<size_t>((b * T + i) * C + h * hs + i)] = 1.0f;
    auto qkv = t.uniform({B, T, 3 * C});
    auto dout = t.values(g, {B, T, C});
    auto out = t.output({B, T, C}), probs = t.output({B, H, T, T});
    auto dqkv = t.output({B, T, 3 * C});
    t.run([&](Backend& be, Side sd) {
      forward(be, sd, qkv, p, rng, out, probs);
      backward(be, sd, dout, qkv, probs, p, rng, dqkv);
    });
    const std::string what = causal ? "dqkv (dV: dropped probs) causal" : "dqkv (dV: dropped probs) full";
    t.expect_close(dqkv, kSumAtol, kSumRtol, what);
    // Compare the zeros of the dV columns only (dQ and dK have no exact zeros).
    const auto r = dqkv.ref.to_vector(), d = dqkv.dut.to_vector();
    std::vector<float> rv, dv;
    for (size_t i = 0; i < r.size(); ++i)
      if (static_cast<int64_t>(i) % (3 * C) >= 2 * C) {
        rv.push_back(r[i]);
        dv.push_back(d[i]);
      }
    const int64_t n = static_cast<int64_t>(rv.size());
    expect_same_zeros(Pair{Tensor::from_vector(rv, {n}), Tensor::from_vector(dv, {n})}, what);
  }
}

REMAT_OP_CASE(attention, dropout_one) {
  // p = 1 drops everything: out and dqkv are exactly 0; probs are still the softmax.
  const AttentionParams p{2, true, 1.0f};
  const RngState rng{5, 0};
  auto qkv = t.uniform({2, 9, 3 * 16});
  auto dout = t.uniform({2, 9, 16});
  auto out = t.output({2, 9, 16}), probs = t.output({2, 2, 9, 9});
  auto dqkv = t.output({2, 9, 3 * 16});
  t.run([&](Backend& be, Side sd) {
    forward(be, sd, qkv, p, rng, out, probs);
    backward(be, sd, dout, qkv, probs, p, rng, dqkv);
  });
  t.expect_close(probs, kProbsAtol, kProbsRtol, "probs");
  t.expect_equal(out, "out");
  t.expect_equal(dqkv, "dqkv");
}

REMAT_OP_CASE(attention, several_groups) {
  // The scratch limit shrunk (set_attention_group_bytes) so a few batch elements fill it:
  // groups of one, two (the last one short) and three (one group) batch elements.
  const AttnShape s{3, 11, 12, 2};
  const int64_t per_b = s.n_head * s.t * s.t * static_cast<int64_t>(sizeof(float));
  for (int64_t per_group : {1, 2, 3}) {
    for (float dropout : {0.0f, 0.25f}) {
      const AttentionParams p{s.n_head, true, dropout};
      const RngState rng{78, 3};
      auto qkv = t.uniform({s.b, s.t, 3 * s.c});
      auto dout = t.uniform({s.b, s.t, s.c});
      auto out = t.output({s.b, s.t, s.c}), probs = t.output({s.b, s.n_head, s.t, s.t});
      auto dqkv = t.output({s.b, s.t, 3 * s.c});
      t.run([&](Backend& be, Side sd) {
        const int64_t old = be.tuning().set_attention_group_bytes(per_group * per_b);
        // The device's scratch shrank to one group's (dP/dS, plus the dropped copy).
        if (!sd.ref) {
          EXPECT_EQ(be.attention_backward_workspace(sd(qkv).shape(), p),
                    static_cast<size_t>(per_group * per_b * (p.applies_dropout() ? 2 : 1)));
        }
        forward(be, sd, qkv, p, rng, out, probs);
        backward(be, sd, dout, qkv, probs, p, rng, dqkv);
        be.tuning().set_attention_group_bytes(old);
      });
      const std::string what = label(s, p) + " groups of " + std::to_string(per_group);
      t.expect_close(probs, kProbsAtol, kProbsRtol, "probs " + what);
      t.expect_close(out, kSumAtol, kSumRtol, "out " + what);
      t.expect_close(dqkv, kSumAtol, kSumRtol, "dqkv " + what);
    }
  }
}

REMAT_OP_CASE(attention, many_heads) {
  // More heads in one group (B * H = 2800 at T = 2) than one pointer-array call of the CUDA
  // backend takes (2730: three arrays in its 64 KiB scratch): two calls per product, the
  // second from head 2730 on.
  forward_and_backward(t, AttnShape{700, 2, 8, 4}, RngState{41, 2}, {0.0f, 0.25f}, kSumAtol, kSumRtol);
}

#ifndef REMAT_TEST_EMU
REMAT_OP_CASE(attention, several_groups_gpu) {
  // More scratch than one group holds at the default limit (64 MiB per buffer): three
  // groups of one batch element each. Too slow emulated; only in the GPU build (the
  // emulated build runs several_groups, the limit shrunk). Sums over up to 1100 positions.
  forward_and_backward(t, AttnShape{3, 1100, 28, 14}, RngState{77, 16}, {0.0f, 0.1f}, 1e-4, 1e-3);
}
#endif

REMAT_OP_CASE(attention, permute_0213) {
  // A pure copy: bit-identical. [2, 5, 3, 8] from an aligned buffer takes the float4 path.
  const Shape shapes[] = {{2, 3, 5, 7}, {1, 1, 1, 1}, {3, 4, 2, 1}, {2, 5, 3, 8}};
  for (const auto& sh : shapes) {
    auto x = t.uniform(sh);
    const Shape ysh{sh[0], sh[2], sh[1], sh[3]};
    auto y = t.output(ysh);
    auto y_aligned = t.uniform(ysh);
    auto back = t.uniform(sh);
    t.run([&](Backend& be, Side s) {
      be.permute_0213(s(x), s(y));
      be.permute_0213(s(x), s(y_aligned));
      be.permute_0213(s(y_aligned), s(back));
    });
    t.expect_equal(y, "y " + sh.str());
    t.expect_equal(y_aligned, "y (aligned) " + sh.str());
    t.expect_equal(back, "permute twice " + sh.str());
    EXPECT_EQ(back.dut.to_vector(), x.dut.to_vector()) << "permute_0213 is its own inverse";
  }
}

// ---- bf16 (training.precision bf16; the two references: backend_ops/harness.h) ----------------
// bf16 GEMMs (fp32 scores and dPd), probabilities rounded as stored.
// probs: the fp32 case's tolerance, then a bf16 step. out and dqkv: sums of T products of
// bf16 values, the device rounding its dropped probabilities and dS to bf16 for the GEMMs
// where the CPU keeps them in fp32: 1/64 of the largest |value| absolute (as the CPU's own
// bf16 test, Attention.Bf16ProbsRoundedOutputsClose in tests/ops/test_attention.cpp: rounding errors of the summed
// terms scale with the terms, not with a result that cancels) + 1/64 relative. Backward runs from the same stored
// probabilities on both sides.

namespace {
// The largest |value| of the reference (cpu) side.
double max_abs(const Pair& p) {
  double m = 0.0;
  for (uint16_t b : dut_bits(p.ref)) {
    const double v = std::fabs(static_cast<double>(bf16_to_float(b)));
    if (std::isfinite(v)) m = std::max(m, v);
  }
  return m;
}
}  // namespace

REMAT_OP_CASE(attention, bf16) {
  ActivationDTypeScope bf16(DType::bf16);
  struct Shape4 {
    int64_t b, t, c;
    AttentionParams p;
  };
  for (const Shape4& sh : {Shape4{2, 24, 32, {4, true, 0.2f}}, Shape4{3, 37, 24, {2, false, 0.0f}},
                           Shape4{2, 17, 48, {3, true, 0.0f}}, Shape4{1, 40, 16, {1, false, 0.5f}}}) {
    for (int64_t group_batch : {0, 1}) {  // the default scratch limit, and one batch element per group
      const int64_t B = sh.b, T = sh.t, C = sh.c, H = sh.p.n_head;
      const std::string what = " B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
                               " H=" + std::to_string(H) + (sh.p.causal ? " causal" : "") +
                               " dropout=" + std::to_string(sh.p.dropout) + " groups of " +
                               (group_batch ? std::to_string(group_batch) : std::string("all"));
      const RngState rng{0xa77e ^ static_cast<uint64_t>(T), 96};
      auto qkv = t.uniform_bf16({B, T, 3 * C}, -2.0f, 2.0f);
      auto out = t.output({B, T, C}, DType::bf16), probs = t.output({B, H, T, T}, DType::bf16);
      auto probs_only = t.output({B, H, T, T}, DType::bf16);
      auto dout = t.uniform_bf16({B, T, C});
      auto dqkv = t.output({B, T, 3 * C}, DType::bf16);
      Pair probs_same;
      t.run([&](Backend& be, Side s) {
        const int64_t old = be.tuning().set_attention_group_bytes(group_batch * H * T * T * 4);
        auto ws = [&](size_t bytes) { return Tensor::empty(Shape{static_cast<int64_t>(bytes / 4 + 1)}, be.device()); };
        Tensor wf = ws(be.attention_forward_workspace(s(qkv).shape(), sh.p));
        be.attention_forward(s(qkv), sh.p, rng, s(out), s(probs), wf);
        be.attention_forward(s(qkv), sh.p, rng, Tensor(), s(probs_only), wf);
        be.tuning().set_attention_group_bytes(old);
      });
      t.expect_close(probs, 2e-6, kBf16Rel, "probs" + what);
      t.expect_close(probs_only, 2e-6, kBf16Rel, "probs only" + what);
      t.expect_close(out, max_abs(out) / 64, 1.0 / 64, "out" + what);
      probs_same = t.output_like(probs);  // the cpu's probabilities on both sides
      t.run([&](Backend& be, Side s) {
        const int64_t old = be.tuning().set_attention_group_bytes(group_batch * H * T * T * 4);
        Tensor wb = Tensor::empty(
            Shape{static_cast<int64_t>(be.attention_backward_workspace(s(qkv).shape(), sh.p) / 4 + 1)}, be.device());
        be.attention_backward(s(dout), s(qkv), s(probs_same), sh.p, rng, s(dqkv), wb);
        be.tuning().set_attention_group_bytes(old);
      });
      t.expect_close(dqkv, max_abs(dqkv) / 64, 1.0 / 64, "dqkv" + what);
    }
  }
  // Mixed f32 and bf16 tensors are refused on the device, naming the op and tensors.
  auto qkv = t.uniform_bf16({1, 4, 12});
  auto out = t.output({1, 4, 4}, DType::bf16), probs = t.output({1, 1, 4, 4});
  Backend& dut = backend_for(t.device());
  Tensor ws = Tensor::empty(
      Shape{static_cast<int64_t>(dut.attention_forward_workspace(qkv.dut.shape(), {1, true, 0.0f}) / 4 + 1)},
      t.device());
  try {
    dut.attention_forward(qkv.dut, {1, true, 0.0f}, RngState{1, 0}, out.dut, probs.dut, ws);
    ADD_FAILURE() << "attention with bf16 qkv and f32 probs was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention_forward"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected all f32 or all bf16"), std::string::npos) << e.what();
  }
}

REMAT_OP_CASE(attention, bf16_permute_0213) {
  ActivationDTypeScope bf16(DType::bf16);
  for (const Shape& sh : {Shape{2, 3, 4, 16}, Shape{2, 5, 3, 7}}) {
    auto x = t.uniform_bf16(sh);
    auto y = t.output({sh[0], sh[2], sh[1], sh[3]}, DType::bf16);
    auto y_aligned = aligned_bf16_output(t, {sh[0], sh[2], sh[1], sh[3]});
    auto back = aligned_bf16_output(t, sh);
    t.run([&](Backend& be, Side s) {
      be.permute_0213(s(x), s(y));
      be.permute_0213(s(x), s(y_aligned));
      be.permute_0213(s(y_aligned), s(back));
    });
    t.expect_equal(y, "permute " + sh.str());
    t.expect_equal(y_aligned, "permute (aligned) " + sh.str());
    t.expect_equal(back, "permute twice " + sh.str());
    EXPECT_EQ(dut_bits(back.dut), dut_bits(x.dut)) << "permute twice is the identity " << sh.str();
  }
}

// ---- Gradients: the device's backward against central differences of its own forward --------
// (backend_ops/harness.h, "Gradient cases")

REMAT_OP_CASE(attention, grad) {
  const int64_t b = 2, tt = 5, c = 12;
  for (float drop : {0.0f, 0.25f}) {  // with dropout the mask is the same for every forward (one RngState)
    AttentionParams p;
    p.n_head = 3;
    p.dropout = drop;
    const RngState rng{5, 40};
    auto qkv = t.uniform({b, tt, 3 * c}), dout = t.uniform({b, tt, c});
    auto out = t.output({b, tt, c}), probs = t.output({b, 3, tt, tt}), dqkv = t.output({b, tt, 3 * c});
    t.run([&](Backend& be, Side d) {
      auto ws = [&](size_t bytes) {
        return bytes ? Tensor::empty(Shape{static_cast<int64_t>((bytes + 3) / 4)}, be.device()) : Tensor();
      };
      be.attention_forward(d(qkv), p, rng, d(out), d(probs), ws(be.attention_forward_workspace(qkv.ref.shape(), p)));
      be.attention_backward(d(dout), d(qkv), d(probs), p, rng, d(dqkv),
                            ws(be.attention_backward_workspace(qkv.ref.shape(), p)));
    });
    t.expect_gradient(drop > 0 ? "attention dqkv (dropout)" : "attention dqkv", qkv, dqkv, [&](Backend& be) {
      const size_t bytes = be.attention_forward_workspace(qkv.dut.shape(), p);
      Tensor work = bytes ? Tensor::empty(Shape{static_cast<int64_t>((bytes + 3) / 4)}, be.device()) : Tensor();
      be.attention_forward(qkv.dut, p, rng, out.dut, probs.dut, work);
      return dot(dout.dut, out.dut);
    });
  }
}

}  // namespace remat::test
