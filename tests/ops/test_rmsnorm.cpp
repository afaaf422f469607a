// RMSNorm of the CPU backend (src/backends/cpu/rmsnorm.cpp) against PyTorch goldens
// (tools/reference/golden/transformer.py: the formula in float64, differentiated by autograd; bf16:
// tools/reference/golden/bf16_ops.py) and finite differences of L = sum(dy * y), dx over dy, bad
// arguments.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "ops/op_test.h"
#include "remat/backend.h"
#include "support/expect_error.h"
#include "support/golden.h"
#include "support/gradcheck.h"

namespace remat::test {
namespace {

// Tolerances (|actual - expected| <= atol + rtol * |expected|), against float64 references:
// y, rstd, dx, dgamma: rtol 1e-5, atol 1e-6 (a few fp32 ulps of O(1) values); finite
// differences: support/gradcheck.h defaults.

struct Forward {
  Tensor y, rstd;
};

Forward forward(const Tensor& x, const Tensor& gamma, float eps) {
  Forward f{Tensor::empty(x.shape()), Tensor::empty(Shape{x.numel() / x.size(-1)})};
  cpu().rmsnorm_forward(x, gamma, RmsNormParams{eps}, f.y, f.rstd);
  return f;
}

TEST(RmsNorm, MatchesPyTorch) {
  const auto cases = transformer_cases("rmsnorm");
  ASSERT_GE(cases.size(), 3u);  // the loop must not pass vacuously
  for (const auto& name : cases) {
    SCOPED_TRACE(name);
    const auto f = test::load_golden(name);
    const Tensor x = f.tensor("x"), gamma = f.tensor("gamma"), dy = f.tensor("dy");
    const float eps = static_cast<float>(test::meta_float(f, "eps"));
    const Forward r = forward(x, gamma, eps);
    EXPECT_ALL_CLOSE(r.y, f.tensor("y"), 1e-5, 1e-6);
    EXPECT_ALL_CLOSE(r.rstd, f.tensor("rstd"), 1e-5, 1e-6);

    // dx is written (NaN before); dgamma accumulates onto what it held.
    const Tensor dx = Tensor::full(x.shape(), std::numeric_limits<float>::quiet_NaN());
    const Tensor g0 = random_tensor(gamma.shape(), 11), dgamma = g0.clone();
    cpu().rmsnorm_backward(dy, x, gamma, r.rstd, dx, dgamma);
    EXPECT_ALL_CLOSE(dx, f.tensor("dx"), 1e-5, 1e-6);
    auto sum = g0.to_vector();
    const auto want = f.tensor("dgamma").to_vector();
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += want[i];
    EXPECT_ALL_CLOSE(dgamma, Tensor::from_vector(sum, gamma.shape()), 1e-5, 1e-6);

    // An undefined gradient is skipped; the other is unchanged by the omission.
    const Tensor dx2 = Tensor::full(x.shape(), 0.0f);
    cpu().rmsnorm_backward(dy, x, gamma, r.rstd, dx2, Tensor());
    EXPECT_TRUE(bitwise_equal(dx2, dx));

    // dx may alias dy (remat/backend_ops.def): the same bits, dgamma from the original dy.
    const Tensor inplace = dy.clone(), dgamma2 = g0.clone();
    cpu().rmsnorm_backward(inplace, x, gamma, r.rstd, inplace, dgamma2);
    EXPECT_TRUE(bitwise_equal(inplace, dx));
    EXPECT_TRUE(bitwise_equal(dgamma2, dgamma));
  }
}

TEST(RmsNorm, GradientsMatchFiniteDifferences) {
  const Tensor x = random_tensor(Shape{3, 4, 21}, 1, -2.0f, 2.0f);
  const Tensor gamma = random_tensor(Shape{21}, 2, 0.5f, 1.5f), dy = random_tensor(x.shape(), 4);
  const Forward r = forward(x, gamma, 1e-6f);
  const Tensor dx = Tensor::empty(x.shape()), dgamma = Tensor::zeros(gamma.shape());
  cpu().rmsnorm_backward(dy, x, gamma, r.rstd, dx, dgamma);
  auto loss = [&] { return test::dot(dy, forward(x, gamma, 1e-6f).y); };
  EXPECT_TRUE(test::check_gradient("rmsnorm dx", x, dx, loss));
  EXPECT_TRUE(test::check_gradient("rmsnorm dgamma", gamma, dgamma, loss));
}

TEST(RmsNorm, BadArgumentsNameTheOpAndShapes) {
  const Tensor x = random_tensor(Shape{4, 8}, 1), y = Tensor::empty(Shape{4, 8}), rstd = Tensor::empty(Shape{4});
  EXPECT_REMAT_ERROR(cpu().rmsnorm_forward(x, random_tensor(Shape{7}, 2), RmsNormParams{1e-6f}, y, rstd),
                     "rmsnorm_forward: gamma f32[7] on cpu: expected shape [8]");
  EXPECT_REMAT_ERROR(
      cpu().rmsnorm_forward(x, random_tensor(Shape{8}, 2), RmsNormParams{1e-6f}, y, Tensor::empty(Shape{5})),
      "rmsnorm_forward: rstd f32[5] on cpu: expected shape [4]");
  EXPECT_REMAT_ERROR(cpu().rmsnorm_forward(x, random_tensor(Shape{8}, 2), RmsNormParams{0.0f}, y, rstd),
                     "eps must be positive");
  EXPECT_REMAT_ERROR(
      cpu().rmsnorm_backward(random_tensor(Shape{4, 9}, 3), x, random_tensor(Shape{8}, 2), rstd, Tensor(), Tensor()),
      "rmsnorm_backward: dy f32[4, 9] on cpu and x f32[4, 8] on cpu must have the same shape");
}

// ---- bf16 ----------------------------------------------------------------------------------

TEST(RmsNorm, Bf16MatchesPyTorch) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  auto r = load_golden("bf16_ops/rmsnorm");
  const Tensor x = bf16_in(r, "x");
  const int64_t n = x.size(0), c = x.size(1);
  Tensor y = bf16_empty(x.shape()), dx = bf16_empty(x.shape());
  Tensor rs = Tensor::empty(Shape{n}), dg = Tensor::zeros(Shape{c});
  cpu().rmsnorm_forward(bf16_in(r, "x"), bf16_in(r, "gamma"),
                        RmsNormParams{static_cast<float>(remat::test::meta_float(r, "eps"))}, y, rs);
  expect_bf16_golden(r, "y", y, 0, 0);  // written out in fp32 inside for both references
  cpu().rmsnorm_backward(bf16_in(r, "dy"), bf16_in(r, "x"), bf16_in(r, "gamma"), rs, dx, dg);
  expect_bf16_golden(r, "dx", dx, 0, 0);
  expect_bf16_golden(r, "dgamma", dg, 0.01, 1);  // PyTorch's bf16 parameter gradient is rounded once
}

TEST(RmsNorm, Bf16IsTheRoundedFp32Op) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  const int64_t n = 29, c = 72;
  Bf16Pair x = random_pair(Shape{n, c}, 17), gamma = random_pair(Shape{c}, 18), y = empty_pair(Shape{n, c});
  Tensor rf = Tensor::empty(Shape{n}), rh = Tensor::empty(Shape{n});
  cpu().rmsnorm_forward(x.f, gamma.f, RmsNormParams{1e-6f}, y.f, rf);
  cpu().rmsnorm_forward(x.h, gamma.h, RmsNormParams{1e-6f}, y.h, rh);
  expect_rounded(y, "rmsnorm_forward");
  EXPECT_EQ(rf.to_vector(), rh.to_vector());
  Bf16Pair dy = random_pair(Shape{n, c}, 19), dx = empty_pair(Shape{n, c});
  Tensor dgf = Tensor::zeros(Shape{c}), dgh = Tensor::zeros(Shape{c});
  cpu().rmsnorm_backward(dy.f, x.f, gamma.f, rf, dx.f, dgf);
  cpu().rmsnorm_backward(dy.h, x.h, gamma.h, rh, dx.h, dgh);
  expect_rounded(dx, "rmsnorm_backward dx");
  EXPECT_EQ(dgf.to_vector(), dgh.to_vector()) << "dgamma (f32) from bf16 inputs";
}

// Statistics stay f32 under bf16 activations: a bf16 rstd is refused by the validator (every
// backend), the error naming the op and the tensor.
TEST(RmsNorm, Bf16StatisticsMustBeF32) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  const Shape s{4, 8};
  Bf16Pair x = random_pair(s, 30), g = random_pair(Shape{8}, 31), y = empty_pair(s);
  Tensor st32 = Tensor::empty(Shape{4}), st16 = Tensor::empty(Shape{4}, Device::cpu(), DType::bf16);
  expect_statistics_error(error_of([&] { cpu().rmsnorm_forward(x.h, g.h, RmsNormParams{1e-6f}, y.h, st16); }),
                          "rmsnorm_forward", "rstd");
  expect_statistics_error(error_of([&] { cpu().rmsnorm_backward(x.h, x.h, g.h, st16, y.h, Tensor()); }),
                          "rmsnorm_backward", "rstd");
}

}  // namespace
}  // namespace remat::test
