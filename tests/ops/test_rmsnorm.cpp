// RMSNorm of the CPU backend against PyTorch goldens (tools/golden/transformer.py: the
// formula in float64, differentiated by autograd) and finite differences of L = sum(dy * y).
//
// Tolerances (|actual - expected| <= atol + rtol * |expected|), against float64 references:
// y, rstd, dx, dgamma: rtol 1e-5, atol 1e-6 (a few fp32 ulps of O(1) values); finite
// differences: support/gradcheck.h defaults.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "remat/backend.h"
#include "support/expect_error.h"
#include "support/golden.h"
#include "support/gradcheck.h"

namespace remat {
namespace {

using test::bitwise_equal;
using test::random_tensor;

Backend& cpu() { return backend_for(Device::cpu()); }

std::vector<std::string> rmsnorm_cases() {
  std::vector<std::string> out;
  for (const auto& name : test::golden_cases("transformer"))
    if (test::meta_str(test::load_golden(name), "op") == "rmsnorm") out.push_back(name);
  return out;
}

struct Forward {
  Tensor y, rstd;
};

Forward forward(const Tensor& x, const Tensor& gamma, float eps) {
  Forward f{Tensor::empty(x.shape()), Tensor::empty(Shape{x.numel() / x.size(-1)})};
  cpu().rmsnorm_forward(x, gamma, eps, f.y, f.rstd);
  return f;
}

TEST(RmsNorm, MatchesPyTorch) {
  const auto cases = rmsnorm_cases();
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
  EXPECT_REMAT_ERROR(cpu().rmsnorm_forward(x, random_tensor(Shape{7}, 2), 1e-6f, y, rstd),
                     "rmsnorm_forward: gamma f32[7] on cpu: expected shape [8]");
  EXPECT_REMAT_ERROR(cpu().rmsnorm_forward(x, random_tensor(Shape{8}, 2), 1e-6f, y, Tensor::empty(Shape{5})),
                     "rmsnorm_forward: rstd f32[5] on cpu: expected shape [4]");
  EXPECT_REMAT_ERROR(cpu().rmsnorm_forward(x, random_tensor(Shape{8}, 2), 0.0f, y, rstd), "eps must be positive");
  EXPECT_REMAT_ERROR(
      cpu().rmsnorm_backward(random_tensor(Shape{4, 9}, 3), x, random_tensor(Shape{8}, 2), rstd, Tensor(), Tensor()),
      "rmsnorm_backward: dy f32[4, 9] on cpu and x f32[4, 8] on cpu must have the same shape");
}

}  // namespace
}  // namespace remat
