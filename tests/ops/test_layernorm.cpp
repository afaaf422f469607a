// Layer normalisation on the CPU backend (src/backends/cpu/layernorm.cpp): against PyTorch
// goldens (tools/reference/golden/transformer.py; bf16: tools/reference/golden/bf16_ops.py), finite differences
// of L = sum(dy * y), dx over dy, determinism and bad arguments.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "ops/op_test.h"
#include "remat/backend.h"
#include "remat/ops.h"
#include "support/expect_error.h"
#include "support/golden.h"
#include "support/gradcheck.h"

namespace remat::test {
namespace {

// Tolerances (|actual - expected| <= atol + rtol * |expected|) against float64 references
// (tools/reference/golden/transformer.py: computed in float64 from the float32 inputs): y, mean, rstd,
// dx, dgamma, dbeta: rtol 1e-5, atol 1e-6 (worst seen about 3e-7 absolute on O(1) values, a
// few fp32 ulps); finite differences: support/gradcheck.h defaults (eps 1e-2, rtol 2e-2,
// atol 2e-3).

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(LayerNorm, GoldenCasesExist) {
  // Guards the loops of MatchesPyTorch against passing vacuously when files are missing.
  EXPECT_GE(transformer_cases("layernorm").size(), 3u);
}

TEST(LayerNorm, MatchesPyTorch) {
  for (const auto& name : transformer_cases("layernorm")) {
    SCOPED_TRACE(name);
    const auto f = test::load_golden(name);
    const Tensor x = f.tensor("x"), gamma = f.tensor("gamma"), beta = f.tensor("beta"), dy = f.tensor("dy");
    const float eps = static_cast<float>(test::meta_float(f, "eps"));
    const auto r = ops::layernorm(cpu(), x, gamma, beta, LayerNormParams{eps});
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

// Every op of the family, forward and backward, on shapes large enough that the CPU loops run
// in parallel; returns all results.
std::vector<Tensor> run_layernorm() {
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
  return out;
}

TEST(LayerNorm, BitwiseAcrossRunsAndThreadCounts) { expect_bitwise_across_runs_and_thread_counts(run_layernorm); }

TEST(LayerNorm, BadArgumentsNameTheOpAndShapes) {
  Backend& be = cpu();
  // LayerNorm: gamma of the wrong width, wrong dtype.
  const Tensor x = random_tensor(Shape{3, 8}, 128);
  EXPECT_REMAT_ERROR(ops::layernorm(be, x, random_tensor(Shape{7}, 129), random_tensor(Shape{8}, 130)),
                     "layernorm_forward: gamma f32[7] on cpu: expected shape [8]");
  EXPECT_REMAT_ERROR(
      ops::layernorm(be, x, Tensor::from_ints(std::vector<int32_t>(8, 1), Shape{8}), random_tensor(Shape{8}, 131)),
      "layernorm_forward: gamma i32[8] on cpu: expected dtype f32");
}

// ---- bf16 ----------------------------------------------------------------------------------

TEST(LayerNorm, Bf16MatchesPyTorch) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  auto f = load_golden("bf16_ops/layernorm");
  Tensor x = bf16_in(f, "x"), gamma = bf16_in(f, "gamma");
  const int64_t n = x.size(0), c = x.size(1);
  Tensor y = bf16_empty(x.shape()), dx = bf16_empty(x.shape());
  Tensor mean = Tensor::empty(Shape{n}), rstd = Tensor::empty(Shape{n});
  cpu().layernorm_forward(x, gamma, bf16_in(f, "beta"),
                          LayerNormParams{static_cast<float>(remat::test::meta_float(f, "eps"))}, y, mean, rstd);
  // PyTorch's bf16 layer norm rounds the normalised values (and its backward's partial
  // products) to bf16 before applying gamma and beta.
  expect_bf16_golden(f, "y", y, 0, 24);
  Tensor dgamma = Tensor::zeros(Shape{c}), dbeta = Tensor::zeros(Shape{c});
  ops::layernorm_backward(cpu(), bf16_in(f, "dy"), x, gamma, mean, rstd, dx, dgamma, dbeta);
  expect_bf16_golden(f, "dx", dx, 0, 12);
  expect_bf16_golden(f, "dgamma", dgamma, 0.01, 24);
  expect_bf16_golden(f, "dbeta", dbeta, 0.01, 20);
}

TEST(LayerNorm, Bf16IsTheRoundedFp32Op) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  const int64_t n = 37, c = 96;
  Bf16Pair x = random_pair(Shape{n, c}, 4), gamma = random_pair(Shape{c}, 5), beta = random_pair(Shape{c}, 6);
  Bf16Pair y = empty_pair(Shape{n, c});
  Tensor mf = Tensor::empty(Shape{n}), rf = Tensor::empty(Shape{n}), mh = Tensor::empty(Shape{n}),
         rh = Tensor::empty(Shape{n});
  cpu().layernorm_forward(x.f, gamma.f, beta.f, LayerNormParams{1e-5f}, y.f, mf, rf);
  cpu().layernorm_forward(x.h, gamma.h, beta.h, LayerNormParams{1e-5f}, y.h, mh, rh);
  expect_rounded(y, "layernorm_forward");
  EXPECT_EQ(mf.to_vector(), mh.to_vector());
  EXPECT_EQ(rf.to_vector(), rh.to_vector());
  Bf16Pair dy = random_pair(Shape{n, c}, 7), dx = empty_pair(Shape{n, c});
  Tensor dgf = Tensor::zeros(Shape{c}), dbf = Tensor::zeros(Shape{c}), dgh = Tensor::zeros(Shape{c}),
         dbh = Tensor::zeros(Shape{c});
  ops::layernorm_backward(cpu(), dy.f, x.f, gamma.f, mf, rf, dx.f, dgf, dbf);
  ops::layernorm_backward(cpu(), dy.h, x.h, gamma.h, mh, rh, dx.h, dgh, dbh);
  expect_rounded(dx, "layernorm_backward dx");
  EXPECT_EQ(dgf.to_vector(), dgh.to_vector()) << "dgamma (f32) from bf16 inputs";
  EXPECT_EQ(dbf.to_vector(), dbh.to_vector()) << "dbeta (f32) from bf16 inputs";
}

// Statistics stay f32 under bf16 activations: a bf16 mean or rstd is refused by the validator
// (every backend), the error naming the op and the tensor; gamma and beta may be bf16 working
// copies.
TEST(LayerNorm, Bf16StatisticsMustBeF32) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  const Shape s{4, 8};
  Bf16Pair x = random_pair(s, 30), g = random_pair(Shape{8}, 31), y = empty_pair(s);
  Tensor st32 = Tensor::empty(Shape{4}), st16 = Tensor::empty(Shape{4}, Device::cpu(), DType::bf16);
  expect_statistics_error(
      error_of([&] { cpu().layernorm_forward(x.h, g.h, g.h, LayerNormParams{1e-5f}, y.h, st16, st32); }),
      "layernorm_forward", "mean");
  expect_statistics_error(
      error_of([&] { cpu().layernorm_forward(x.h, g.h, g.h, LayerNormParams{1e-5f}, y.h, st32, st16); }),
      "layernorm_forward", "rstd");
  expect_statistics_error(
      error_of([&] { ops::layernorm_backward(cpu(), x.h, x.h, g.h, st32, st16, y.h, Tensor(), Tensor()); }),
      "layernorm_backward", "rstd");
  EXPECT_EQ(error_of([&] { cpu().layernorm_forward(x.h, g.h, g.h, LayerNormParams{1e-5f}, y.h, st32, st32); }), "");
}

}  // namespace
}  // namespace remat::test
