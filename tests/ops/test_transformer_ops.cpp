// Transformer ops of the CPU backend: layernorm, embedding, attention, permute_0213.
//
// References: PyTorch goldens (tools/golden/transformer.py, computed in float64 from the
// float32 inputs), finite differences of L = sum(dy * y), and for attention with dropout
// (whose Philox mask PyTorch cannot reproduce) a naive float64 implementation in this file
// drawing its mask with philox::keep.
//
// Tolerances (|actual - expected| <= atol + rtol * |expected|), against float64 references:
// - layernorm y, mean, rstd, dx, dgamma, dbeta: rtol 1e-5, atol 1e-6
// - embedding y: exact (one float add is correctly rounded); dtable, dpos_table: 1e-6, 1e-6
// - attention out, probs, dqkv: rtol 1e-5, atol 1e-6 (T <= 70)
// The worst errors seen are about 3e-7 absolute on O(1) values (a few fp32 ulps).
// - permute_0213: exact
// - finite differences: support/gradcheck.h defaults (eps 1e-2, rtol 2e-2, atol 2e-3)
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "remat/backend.h"
#include "remat/memory.h"
#include "remat/ops.h"
#include "remat/philox.h"
#include "support/expect_error.h"
#include "support/golden.h"
#include "support/gradcheck.h"

namespace remat {
namespace {

using test::all_close;
using test::bitwise_equal;
using test::check_gradient;
using test::dot;
using test::random_tensor;

Backend& cpu() { return backend_for(Device::cpu()); }

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The golden cases of the family whose metadata "op" is `op`.
std::vector<std::string> cases_of(const std::string& op) {
  std::vector<std::string> out;
  for (const auto& name : test::golden_cases("transformer"))
    if (test::meta_str(test::load_golden(name), "op") == op) out.push_back(name);
  return out;
}

// a + b elementwise in float (the expected value of an accumulated gradient).
Tensor plus(const Tensor& a, const Tensor& b) {
  auto x = a.to_vector();
  const auto y = b.to_vector();
  for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  return Tensor::from_vector(x, a.shape());
}

Tensor from_doubles(const std::vector<double>& v, const Shape& s) {
  return Tensor::from_vector(std::vector<float>(v.begin(), v.end()), s);
}

Tensor random_ids(const Shape& s, int32_t vocab, uint32_t seed) {
  const Tensor u = random_tensor(s, seed, 0.0f, static_cast<float>(vocab));
  std::vector<int32_t> ids;
  for (float x : u.to_vector()) ids.push_back(std::min(vocab - 1, static_cast<int32_t>(x)));
  return Tensor::from_ints(ids, s);
}

TEST(TransformerGolden, EveryOpHasCases) {
  // Guards the loops below against passing vacuously when files are missing.
  EXPECT_GE(cases_of("layernorm").size(), 3u);
  EXPECT_GE(cases_of("embedding").size(), 2u);
  EXPECT_GE(cases_of("attention").size(), 4u);
  EXPECT_GE(cases_of("permute_0213").size(), 2u);
}

// ---- LayerNorm ---------------------------------------------------------------------------

TEST(LayerNorm, MatchesPyTorch) {
  for (const auto& name : cases_of("layernorm")) {
    SCOPED_TRACE(name);
    const auto f = test::load_golden(name);
    const Tensor x = f.tensor("x"), gamma = f.tensor("gamma"), beta = f.tensor("beta"), dy = f.tensor("dy");
    const float eps = static_cast<float>(test::meta_float(f, "eps"));
    const auto r = ops::layernorm(cpu(), x, gamma, beta, eps);
    EXPECT_ALL_CLOSE(r.y, f.tensor("y"), 1e-5, 1e-6);
    EXPECT_ALL_CLOSE(r.mean, f.tensor("mean"), 1e-5, 1e-6);
    EXPECT_ALL_CLOSE(r.invstd, f.tensor("rstd"), 1e-5, 1e-6);

    // dx is written (NaN before), dgamma and dbeta accumulate onto what they held.
    const Tensor dx = Tensor::full(x.shape(), kNaN);
    const Tensor g0 = random_tensor(gamma.shape(), 11), b0 = random_tensor(gamma.shape(), 12);
    const Tensor dgamma = g0.clone(), dbeta = b0.clone();
    ops::layernorm_backward(cpu(), dy, x, gamma, r.mean, r.invstd, dx, dgamma, dbeta);
    EXPECT_ALL_CLOSE(dx, f.tensor("dx"), 1e-5, 1e-6);
    EXPECT_ALL_CLOSE(dgamma, plus(g0, f.tensor("dgamma")), 1e-5, 1e-6);
    EXPECT_ALL_CLOSE(dbeta, plus(b0, f.tensor("dbeta")), 1e-5, 1e-6);

    // Undefined gradients are skipped; the others are unchanged by the omission.
    const Tensor dx2 = Tensor::full(x.shape(), kNaN);
    ops::layernorm_backward(cpu(), dy, x, gamma, r.mean, r.invstd, dx2, Tensor(), Tensor());
    EXPECT_TRUE(bitwise_equal(dx2, dx));
    const Tensor dgamma2 = g0.clone();
    ops::layernorm_backward(cpu(), dy, x, gamma, r.mean, r.invstd, Tensor(), dgamma2, Tensor());
    EXPECT_TRUE(bitwise_equal(dgamma2, dgamma));
  }
}

TEST(LayerNorm, BackwardMayWriteDxOverDy) {
  const Tensor x = random_tensor(Shape{40, 30}, 5, -2.0f, 2.0f);
  const Tensor gamma = random_tensor(Shape{30}, 6), beta = random_tensor(Shape{30}, 7),
               dy = random_tensor(x.shape(), 8);
  const auto r = ops::layernorm(cpu(), x, gamma, beta);
  const Tensor dx = ops::empty_like(cpu(), x), dg = Tensor::zeros(gamma.shape()), db = Tensor::zeros(beta.shape());
  ops::layernorm_backward(cpu(), dy, x, gamma, r.mean, r.invstd, dx, dg, db);
  const Tensor inplace = dy.clone(), dg2 = Tensor::zeros(gamma.shape()), db2 = Tensor::zeros(beta.shape());
  ops::layernorm_backward(cpu(), inplace, x, gamma, r.mean, r.invstd, inplace, dg2, db2);
  EXPECT_TRUE(bitwise_equal(inplace, dx));
  EXPECT_TRUE(bitwise_equal(dg2, dg));
  EXPECT_TRUE(bitwise_equal(db2, db));
}

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  const Tensor x = random_tensor(Shape{3, 4, 21}, 1, -2.0f, 2.0f);
  const Tensor gamma = random_tensor(Shape{21}, 2, 0.5f, 1.5f), beta = random_tensor(Shape{21}, 3);
  const Tensor dy = random_tensor(x.shape(), 4);
  const auto r = ops::layernorm(cpu(), x, gamma, beta);
  const Tensor dx = ops::empty_like(cpu(), x), dgamma = Tensor::zeros(gamma.shape()),
               dbeta = Tensor::zeros(beta.shape());
  ops::layernorm_backward(cpu(), dy, x, gamma, r.mean, r.invstd, dx, dgamma, dbeta);
  auto loss = [&] { return dot(dy, ops::layernorm(cpu(), x, gamma, beta).y); };
  EXPECT_TRUE(check_gradient("layernorm dx", x, dx, loss));
  EXPECT_TRUE(check_gradient("layernorm dgamma", gamma, dgamma, loss));
  EXPECT_TRUE(check_gradient("layernorm dbeta", beta, dbeta, loss));
}

// ---- Embedding ---------------------------------------------------------------------------

TEST(Embedding, MatchesPyTorch) {
  for (const auto& name : cases_of("embedding")) {
    SCOPED_TRACE(name);
    const auto f = test::load_golden(name);
    const bool with_pos = test::meta_int(f, "pos") != 0;
    const Tensor ids = f.tensor("ids"), table = f.tensor("table"), dy = f.tensor("dy");
    const Tensor pos = with_pos ? f.tensor("pos_table") : Tensor();
    const Tensor y = ops::embedding(cpu(), ids, table, pos);
    EXPECT_ALL_CLOSE(y, f.tensor("y"), 0.0, 0.0);

    const Tensor t0 = random_tensor(table.shape(), 21);
    const Tensor dtable = t0.clone();
    Tensor p0, dpos;
    if (with_pos) {
      p0 = random_tensor(pos.shape(), 22);
      dpos = p0.clone();
    }
    ops::embedding_backward(cpu(), dy, ids, dtable, dpos);
    EXPECT_ALL_CLOSE(dtable, plus(t0, f.tensor("dtable")), 1e-6, 1e-6);
    if (with_pos) {
      EXPECT_ALL_CLOSE(dpos, plus(p0, f.tensor("dpos_table")), 1e-6, 1e-6);
      // Rows of pos_table past T receive nothing.
      const int64_t t = ids.size(1), c = pos.size(1);
      const auto got = dpos.to_vector(), init = p0.to_vector();
      for (int64_t i = t * c; i < pos.numel(); ++i) ASSERT_EQ(got[i], init[i]) << "flat index " << i;
    }
  }
}

TEST(Embedding, GradientsMatchFiniteDifferences) {
  const Tensor ids = random_ids(Shape{3, 5}, 4, 31);  // 15 tokens over 4 ids: many repeats
  const Tensor table = random_tensor(Shape{4, 18}, 32), pos = random_tensor(Shape{7, 18}, 33);
  const Tensor dy = random_tensor(Shape{3, 5, 18}, 34);
  const Tensor dtable = Tensor::zeros(table.shape()), dpos = Tensor::zeros(pos.shape());
  ops::embedding_backward(cpu(), dy, ids, dtable, dpos);
  auto loss = [&] { return dot(dy, ops::embedding(cpu(), ids, table, pos)); };
  test::GradCheckOptions opt;
  opt.max_elements = 1000;  // every element (the op is linear, so this is cheap and exact)
  EXPECT_TRUE(check_gradient("embedding dtable", table, dtable, loss, opt));
  EXPECT_TRUE(check_gradient("embedding dpos_table", pos, dpos, loss, opt));

  // Without positions, and with only the position gradient requested.
  const Tensor dtable2 = Tensor::zeros(table.shape());
  ops::embedding_backward(cpu(), dy, ids, dtable2, Tensor());
  EXPECT_TRUE(bitwise_equal(dtable2, dtable));
  const Tensor dpos2 = Tensor::zeros(pos.shape());
  ops::embedding_backward(cpu(), dy, ids, Tensor(), dpos2);
  EXPECT_TRUE(bitwise_equal(dpos2, dpos));
}

TEST(Embedding, OutOfRangeIdsAreErrors) {
  const Tensor table = random_tensor(Shape{5, 4}, 41);
  const Tensor y = Tensor::empty(Shape{2, 3, 4});
  EXPECT_REMAT_ERROR(cpu().embedding_forward(Tensor::from_ints({0, 1, 2, 3, 4, 5}, Shape{2, 3}), table, Tensor(), y),
                     "embedding_forward: ids[1, 2] = 5 is out of range [0, 5)");
  EXPECT_REMAT_ERROR(ops::embedding(cpu(), Tensor::from_ints({0, -1, 2, 3, 4, 0}, Shape{2, 3}), table, Tensor()),
                     "ids[0, 1] = -1 is out of range [0, 5)");
  // Backward checks the ids against dtable before touching it.
  const Tensor dtable = Tensor::zeros(Shape{5, 4});
  EXPECT_REMAT_ERROR(ops::embedding_backward(cpu(), random_tensor(Shape{2, 3, 4}, 42),
                                             Tensor::from_ints({0, 1, 7, 3, 4, 0}, Shape{2, 3}), dtable, Tensor()),
                     "embedding_backward: ids[0, 2] = 7 is out of range [0, 5)");
  for (float v : dtable.to_vector()) ASSERT_EQ(v, 0.0f);
}

// ---- Attention ---------------------------------------------------------------------------

TEST(Attention, MatchesPyTorch) {
  for (const auto& name : cases_of("attention")) {
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

// ---- permute_0213 ------------------------------------------------------------------------

TEST(Permute0213, MatchesPyTorchAndIsItsOwnInverse) {
  for (const auto& name : cases_of("permute_0213")) {
    SCOPED_TRACE(name);
    const auto f = test::load_golden(name);
    const Tensor x = f.tensor("x");
    const Tensor y = ops::permute_0213(cpu(), x);
    EXPECT_TRUE(bitwise_equal(y, f.tensor("y")));
    EXPECT_TRUE(bitwise_equal(ops::permute_0213(cpu(), y), x));
  }
}

// ---- Determinism -------------------------------------------------------------------------

// Every op of the family, forward and backward, on shapes with several channel blocks and
// repeated ids, large enough that the CPU loops run in parallel; returns all results.
std::vector<Tensor> run_family() {
  Backend& be = cpu();
  std::vector<Tensor> out;
  {
    const Tensor x = random_tensor(Shape{400, 53}, 81, -2.0f, 2.0f), gamma = random_tensor(Shape{53}, 82),
                 beta = random_tensor(Shape{53}, 83), dy = random_tensor(Shape{400, 53}, 84);
    auto r = ops::layernorm(be, x, gamma, beta);
    const Tensor dx = ops::empty_like(be, x), dg = random_tensor(Shape{53}, 85), db = random_tensor(Shape{53}, 86);
    ops::layernorm_backward(be, dy, x, gamma, r.mean, r.invstd, dx, dg, db);
    out.insert(out.end(), {r.y, r.mean, r.invstd, dx, dg, db});
  }
  {
    const Tensor ids = random_ids(Shape{4, 64}, 10, 91), table = random_tensor(Shape{10, 72}, 92),
                 pos = random_tensor(Shape{80, 72}, 93), dy = random_tensor(Shape{4, 64, 72}, 94);
    const Tensor dtable = random_tensor(Shape{10, 72}, 95), dpos = random_tensor(Shape{80, 72}, 96);
    out.push_back(ops::embedding(be, ids, table, pos));
    ops::embedding_backward(be, dy, ids, dtable, dpos);
    out.insert(out.end(), {dtable, dpos});
  }
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

TEST(TransformerDeterminism, BitwiseAcrossRunsAndThreadCounts) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  const auto a = run_family();
  const auto b = run_family();
  omp_set_num_threads(1);
  const auto c = run_family();
  omp_set_num_threads(3);
  const auto d = run_family();
  omp_set_num_threads(saved);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("result " + std::to_string(i));
    EXPECT_TRUE(bitwise_equal(a[i], b[i])) << "run to run";
    EXPECT_TRUE(bitwise_equal(a[i], c[i])) << "2 threads vs 1";
    EXPECT_TRUE(bitwise_equal(a[i], d[i])) << "2 threads vs 3";
  }
}

// ---- Errors ------------------------------------------------------------------------------

TEST(TransformerErrors, BadArgumentsNameTheOpAndShapes) {
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

  // Embedding: float ids, wrong ranks.
  const Tensor table = random_tensor(Shape{5, 4}, 125);
  EXPECT_REMAT_ERROR(
      be.embedding_forward(random_tensor(Shape{2, 3}, 126), table, Tensor(), Tensor::empty(Shape{2, 3, 4})),
      "embedding_forward: ids f32[2, 3] on cpu: expected dtype i32");
  EXPECT_REMAT_ERROR(
      be.embedding_forward(Tensor::from_ints({0, 1, 2}, Shape{3}), table, Tensor(), Tensor::empty(Shape{1, 3, 4})),
      "embedding_forward: ids i32[3] on cpu: expected rank 2");
  EXPECT_REMAT_ERROR(
      ops::embedding(be, Tensor::from_ints({0, 1, 2, 3}, Shape{2, 2}), table, random_tensor(Shape{1, 4}, 127)),
      "pos_table f32[1, 4] on cpu must be [Tmax >= 2, 4]");

  // LayerNorm: gamma of the wrong width, wrong dtype.
  const Tensor x = random_tensor(Shape{3, 8}, 128);
  EXPECT_REMAT_ERROR(ops::layernorm(be, x, random_tensor(Shape{7}, 129), random_tensor(Shape{8}, 130)),
                     "layernorm_forward: gamma f32[7] on cpu: expected shape [8]");
  EXPECT_REMAT_ERROR(
      ops::layernorm(be, x, Tensor::from_ints(std::vector<int32_t>(8, 1), Shape{8}), random_tensor(Shape{8}, 131)),
      "layernorm_forward: gamma i32[8] on cpu: expected dtype f32");

  // permute_0213: wrong rank; output aliasing the input.
  EXPECT_REMAT_ERROR(be.permute_0213(random_tensor(Shape{2, 3, 4}, 132), Tensor::empty(Shape{2, 4, 3})),
                     "permute_0213: x f32[2, 3, 4] on cpu: expected rank 4");
  const Tensor sq = random_tensor(Shape{1, 3, 3, 2}, 133);
  EXPECT_REMAT_ERROR(be.permute_0213(sq, sq), "must not share storage");
}

// ---- Meta backend ------------------------------------------------------------------------

struct AllocDelta {
  int64_t allocated, peak, requested, allocs, frees, workspace_peak;
  bool operator==(const AllocDelta& o) const {
    return allocated == o.allocated && peak == o.peak && requested == o.requested && allocs == o.allocs &&
           frees == o.frees && workspace_peak == o.workspace_peak;
  }
};

std::ostream& operator<<(std::ostream& os, const AllocDelta& d) {
  return os << "{allocated " << d.allocated << ", peak " << d.peak << ", requested " << d.requested << ", allocs "
            << d.allocs << ", frees " << d.frees << ", workspace peak " << d.workspace_peak << "}";
}

// Allocator activity of the family's wrappers on device d (inputs allocated beforehand).
AllocDelta family_allocations(Device d, const AttentionParams& p) {
  Backend& be = backend_for(d);
  auto& alloc = allocator_for(d);
  const bool data = d.is_cpu();
  auto input = [&](const Shape& s, uint32_t seed) { return data ? random_tensor(s, seed) : Tensor::empty(s, d); };
  const Tensor qkv = input(Shape{2, 9, 48}, 141), dout = input(Shape{2, 9, 16}, 142);
  const Tensor x = input(Shape{18, 16}, 143), gamma = input(Shape{16}, 144), beta = input(Shape{16}, 145);
  const Tensor ids = data ? random_ids(Shape{2, 9}, 6, 146) : Tensor::empty(Shape{2, 9}, d, DType::i32);
  const Tensor table = input(Shape{6, 16}, 147), pos = input(Shape{9, 16}, 148);
  alloc.reset_peak();
  const MemoryStats s0 = alloc.stats();
  {
    TagScope tag(MemoryCategory::activation, "block0", Phase::forward);
    const Tensor e = ops::embedding(be, ids, table, pos);
    const auto ln = ops::layernorm(be, x, gamma, beta);
    const auto a = ops::attention(be, qkv, p, RngState{1, 0});
    const Tensor dqkv = ops::attention_backward(be, dout, qkv, a.probs, p, RngState{1, 0});
    const Tensor perm = ops::permute_0213(be, a.probs);
  }
  const MemoryStats s1 = alloc.stats();
  return AllocDelta{s1.allocated - s0.allocated,
                    s1.peak_allocated - s0.allocated,
                    s1.requested - s0.requested,
                    s1.num_allocs - s0.num_allocs,
                    s1.num_frees - s0.num_frees,
                    s1.peak_by_category[MemoryCategory::workspace] - s0.by_category[MemoryCategory::workspace]};
}

TEST(TransformerMeta, AllocatesExactlyWhatCpuAllocates) {
  for (float drop : {0.0f, 0.1f}) {
    SCOPED_TRACE("dropout " + std::to_string(drop));
    const AttentionParams p{2, true, drop};
    const AllocDelta c = family_allocations(Device::cpu(), p);
    const AllocDelta m = family_allocations(Device::meta(), p);
    EXPECT_EQ(c, m);
    // Not vacuous: outputs were allocated and freed, and the workspace peak is the larger
    // of the two attention workspaces (all 4 heads of [9, 9] fit one group).
    EXPECT_GT(c.peak, 0);
    EXPECT_GE(c.allocs, 9);
    EXPECT_EQ(c.allocs, c.frees);
    const int64_t head = 9 * 9 * sizeof(float);
    EXPECT_EQ(cpu().attention_forward_workspace(Shape{2, 9, 48}, p), drop > 0.0f ? 4 * head : 0);
    EXPECT_EQ(cpu().attention_backward_workspace(Shape{2, 9, 48}, p), drop > 0.0f ? 8 * head : 4 * head);
    EXPECT_EQ(c.workspace_peak, static_cast<int64_t>(CachingAllocator::round_size(drop > 0.0f ? 8 * head : 4 * head)));
  }
}

}  // namespace
}  // namespace remat
