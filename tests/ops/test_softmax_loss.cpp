// Softmax, log-softmax, cross-entropy and accuracy on the CPU backend
// (src/backends/cpu/softmax_loss.cpp): against PyTorch goldens (tools/reference/golden/basic.py; bf16:
// tools/reference/golden/bf16_ops.py), finite differences, edge cases, thread counts and bad arguments.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "ops/op_test.h"
#include "remat/backend.h"
#include "remat/ops.h"
#include "support/expect_error.h"
#include "support/golden.h"
#include "support/gradcheck.h"

namespace remat::test {
namespace {

// Tolerances against PyTorch: both sides are fp32 with different summation orders
// (OpenBLAS vs PyTorch's BLAS, vectorised reductions), so agreement is to a few ulps of
// the accumulated magnitude, not bitwise.
constexpr double kRtol = 1e-5, kAtol = 1e-6;

TEST(SoftmaxLoss, SoftmaxAndLogSoftmaxMatchPyTorch) {
  for (const char* name : {"softmax_2d", "softmax_3d_odd", "log_softmax_2d", "log_softmax_3d_odd"}) {
    SCOPED_TRACE(name);
    auto g = load_golden(std::string("basic/") + name);
    const bool log = meta_int(g, "log") != 0;
    Tensor y = ops::softmax(cpu(), g.tensor("x"), log);
    EXPECT_TRUE(all_close(y, g.tensor("y"), kRtol, kAtol));
    Tensor dx = Tensor::empty(y.shape());
    cpu().softmax_backward(g.tensor("dy"), y, log, dx);
    EXPECT_TRUE(all_close(dx, g.tensor("dx"), kRtol, kAtol));
  }
}

TEST(SoftmaxLoss, SoftmaxGradientsMatchFiniteDifferences) {
  Tensor x = random_tensor({3, 11}, 15, -2, 2), dy = random_tensor({3, 11}, 16);
  for (bool log : {false, true}) {
    Tensor y = ops::softmax(cpu(), x, log), dx = Tensor::empty(x.shape());
    cpu().softmax_backward(dy, y, log, dx);
    EXPECT_TRUE(check_gradient(log ? "log_softmax" : "softmax", x, dx,
                               [&] { return remat::test::dot(ops::softmax(cpu(), x, log), dy); }));
  }
}

TEST(SoftmaxLoss, CrossEntropyMatchesPyTorch) {
  // ce_smooth*: label smoothing (F.cross_entropy's label_smoothing), with ignored rows.
  for (const char* name : {"ce_small", "ce_ignore", "ce_wide", "ce_smooth", "ce_smooth_wide"}) {
    SCOPED_TRACE(name);
    auto g = load_golden(std::string("basic/") + name);
    const int ignore = static_cast<int>(meta_int(g, "ignore_index"));
    const float eps = std::string(name).find("smooth") != std::string::npos
                          ? static_cast<float>(meta_float(g, "label_smoothing"))
                          : 0.0f;
    Tensor logits = g.tensor("logits"), targets = g.tensor("targets");
    auto ce = ops::cross_entropy(cpu(), logits, targets, ignore, eps);
    EXPECT_TRUE(all_close(ce.loss, g.tensor("loss"), kRtol, kAtol));
    Tensor dl = Tensor::empty(logits.shape());
    cpu().cross_entropy_backward(1.0f, logits, targets, ce.lse, ignore, eps, dl);
    EXPECT_TRUE(all_close(dl, g.tensor("dlogits"), kRtol, kAtol));
  }
}

TEST(SoftmaxLoss, CrossEntropyGradientAndEdgeCases) {
  Tensor logits = random_tensor({5, 7}, 17, -2, 2);
  Tensor targets = Tensor::from_ints({0, 6, -100, 3, 3}, {5});
  auto ce = ops::cross_entropy(cpu(), logits, targets);
  Tensor dl = Tensor::empty(logits.shape());
  cpu().cross_entropy_backward(2.0f, logits, targets, ce.lse, -100, 0.0f, dl);
  EXPECT_TRUE(check_gradient("cross_entropy", logits, dl,
                             [&] { return 2.0 * ops::cross_entropy(cpu(), logits, targets).loss.to_vector()[0]; }));
  // Label smoothing: the gradient of the smoothed loss, by finite differences.
  auto smooth = ops::cross_entropy(cpu(), logits, targets, -100, 0.2f);
  cpu().cross_entropy_backward(2.0f, logits, targets, smooth.lse, -100, 0.2f, dl);
  EXPECT_TRUE(check_gradient("cross_entropy label_smoothing 0.2", logits, dl, [&] {
    return 2.0 * ops::cross_entropy(cpu(), logits, targets, -100, 0.2f).loss.to_vector()[0];
  }));
  // Smoothing 0 takes the plain loss's path (no row means); any other one float a row.
  EXPECT_EQ(cpu().cross_entropy_forward_workspace(logits.shape(), 0.0f), 0u);
  EXPECT_EQ(cpu().cross_entropy_forward_workspace(logits.shape(), 0.2f), 5 * sizeof(float));
  EXPECT_REMAT_ERROR(ops::cross_entropy(cpu(), logits, targets, -100, 1.0f), "label smoothing must be in [0, 1)");
  EXPECT_REMAT_ERROR(ops::cross_entropy(cpu(), logits, targets, -100, -0.1f), "label smoothing must be in [0, 1)");
  // All rows ignored: NaN like PyTorch; gradient zero.
  Tensor none = Tensor::from_ints({-100, -100}, {2});
  Tensor l2 = random_tensor({2, 3}, 18);
  auto ce2 = ops::cross_entropy(cpu(), l2, none);
  EXPECT_TRUE(std::isnan(ce2.loss.to_vector()[0]));
  EXPECT_REMAT_ERROR(ops::cross_entropy(cpu(), l2, Tensor::from_ints({0, 3}, {2})),
                     "target 3 at row 1 is outside [0, 3)");
  int64_t counted = 0;
  Tensor acc_logits = Tensor::from_vector({0.1f, 0.9f, 0.0f, 2.0f, 1.0f, 2.0f, 0.5f, 0.2f, 0.1f}, {3, 3});
  EXPECT_EQ(cpu().accuracy(acc_logits, Tensor::from_ints({1, 2, -100}, {3}), -100, &counted),
            1);  // row 1 ties: the first max (0) wins
  EXPECT_EQ(counted, 2);
}

TEST(SoftmaxLoss, SoftmaxIsBitwiseIndependentOfThreadCount) {
  Tensor x = random_tensor({300, 129}, 19);
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    return ops::softmax(cpu(), x);
  };
  const int saved = omp_get_max_threads();
  Tensor sm1 = run(1);
  Tensor sm2 = run(2);
  omp_set_num_threads(saved);
  EXPECT_TRUE(bitwise_equal(sm1, sm2));
}

TEST(SoftmaxLoss, BadArgumentsNameTheOpAndShapes) {
  Tensor x = random_tensor({4, 3}, 22);
  Tensor ids = Tensor::from_ints({1, 2, 3}, {3});
  EXPECT_REMAT_ERROR(ops::cross_entropy(cpu(), x, Tensor::from_vector({0, 1, 2, 0}, {4})),
                     "cross_entropy_forward: targets f32[4] on cpu: expected dtype i32");
  EXPECT_REMAT_ERROR(ops::cross_entropy(cpu(), x, ids), "targets i32[3] on cpu: expected shape [4]");
}

// ---- bf16 ----------------------------------------------------------------------------------

TEST(SoftmaxLoss, Bf16SoftmaxAndCrossEntropyMatchPyTorch) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  for (const bool log : {false, true}) {
    auto f = load_golden(log ? "bf16_ops/log_softmax" : "bf16_ops/softmax");
    std::printf("  %s\n", log ? "log_softmax" : "softmax");
    Tensor x = bf16_in(f, "x"), y = bf16_empty(x.shape()), dx = bf16_empty(x.shape());
    cpu().softmax_forward(x, log, y);
    expect_bf16_golden(f, "y", y, 0, 2);
    // From remat's bf16 y, as in training; PyTorch's bf16 kernels round exp(y) and the row
    // sums to bf16 (log-softmax's dx cancels: dy - exp(y) sum(dy)).
    cpu().softmax_backward(bf16_in(f, "dy"), y, log, dx);
    expect_bf16_golden(f, "dx", dx, 0, log ? 48 : 2);
  }
  auto f = load_golden("bf16_ops/cross_entropy");
  Tensor x = bf16_in(f, "x"), dx = bf16_empty(x.shape());
  Tensor loss = Tensor::empty(Shape{1}), lse = Tensor::empty(Shape{x.size(0)});
  const Tensor& targets = f.tensor("targets");
  cpu().cross_entropy_forward(x, targets, -100, 0.0f, loss, lse, Tensor());
  expect_bf16_golden(f, "y", loss, 0.01, 2);  // remat's loss is f32; PyTorch's bf16 loss is rounded
  cpu().cross_entropy_backward(1.0f, x, targets, lse, -100, 0.0f, dx);
  expect_bf16_golden(f, "dx", dx, 0, 4);
}

TEST(SoftmaxLoss, Bf16AreTheRoundedFp32Ops) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  const int64_t n = 37, c = 96;
  Bf16Pair x = random_pair(Shape{n, c}, 4);
  Bf16Pair y = empty_pair(Shape{n, c}), dx = empty_pair(Shape{n, c});
  cpu().softmax_forward(x.f, false, y.f);
  cpu().softmax_forward(x.h, false, y.h);
  expect_rounded(y, "softmax");

  // Cross-entropy: the loss and lse are f32 and equal; dlogits rounded.
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7) % c);
  t[3] = -100;
  Tensor targets = Tensor::from_ints(t, Shape{n});
  Tensor lf = Tensor::empty(Shape{1}), lh = Tensor::empty(Shape{1}), sf = Tensor::empty(Shape{n}),
         sh = Tensor::empty(Shape{n});
  cpu().cross_entropy_forward(x.f, targets, -100, 0.0f, lf, sf, Tensor());
  cpu().cross_entropy_forward(x.h, targets, -100, 0.0f, lh, sh, Tensor());
  EXPECT_EQ(lf.to_vector(), lh.to_vector());
  EXPECT_EQ(sf.to_vector(), sh.to_vector());
  cpu().cross_entropy_backward(1.0f, x.f, targets, sf, -100, 0.0f, dx.f);
  cpu().cross_entropy_backward(1.0f, x.h, targets, sh, -100, 0.0f, dx.h);
  expect_rounded(dx, "cross_entropy_backward");
  EXPECT_EQ(cpu().accuracy(x.f, targets, -100, nullptr), cpu().accuracy(x.h, targets, -100, nullptr));
}

// Statistics stay f32 under bf16 activations: a bf16 loss or lse is refused by the validator
// (every backend), the error naming the op and the tensor.
TEST(SoftmaxLoss, Bf16StatisticsMustBeF32) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  const Shape s{4, 8};
  Bf16Pair x = random_pair(s, 30), y = empty_pair(s);
  Tensor st32 = Tensor::empty(Shape{4}), st16 = Tensor::empty(Shape{4}, Device::cpu(), DType::bf16);
  Tensor targets = Tensor::from_ints({0, 1, 2, 3}, Shape{4});
  Tensor loss16 = Tensor::empty(Shape{1}, Device::cpu(), DType::bf16), loss32 = Tensor::empty(Shape{1});
  expect_statistics_error(
      error_of([&] { cpu().cross_entropy_forward(x.h, targets, -100, 0.0f, loss16, st32, Tensor()); }),
      "cross_entropy_forward", "loss");
  expect_statistics_error(
      error_of([&] { cpu().cross_entropy_forward(x.h, targets, -100, 0.0f, loss32, st16, Tensor()); }),
      "cross_entropy_forward", "lse");
  expect_statistics_error(error_of([&] { cpu().cross_entropy_backward(1.0f, x.h, targets, st16, -100, 0.0f, y.h); }),
                          "cross_entropy_backward", "lse");
}

}  // namespace
}  // namespace remat::test
