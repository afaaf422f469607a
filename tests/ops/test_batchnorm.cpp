// 2-D batch normalisation on the CPU backend (src/backends/cpu/batchnorm.cpp): PyTorch
// goldens (tools/reference/golden/cnn.py; bf16: tools/reference/golden/bf16_ops.py), finite differences,
// determinism (run to run and across thread counts) and errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "ops/op_test.h"
#include "remat/backend.h"
#include "remat/ops.h"
#include "support/expect_error.h"
#include "support/golden.h"
#include "support/gradcheck.h"

namespace remat::test {
namespace {

// Tolerances against PyTorch and the double-precision references. Values are O(1) sums of
// at most a few hundred fp32 products, accumulated in another order than PyTorch's: errors
// of a few ulp of the largest partial sum, ~1e-6. rtol 1e-4 / atol 1e-5 leaves margin
// without hiding a wrong index or a missed term (O(0.01) to O(1) errors).
constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;

// ---- PyTorch goldens ------------------------------------------------------------------------

TEST(BatchNorm, TrainMatchesPyTorch) {
  const auto names = cnn_cases("bn_train");
  ASSERT_GE(names.size(), 2u);
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    const auto f = load_golden(name);
    BatchNormParams p;
    p.momentum = static_cast<float>(meta_float(f, "momentum"));
    p.eps = static_cast<float>(meta_float(f, "eps"));
    const Tensor x = f.tensor("x"), gamma = f.tensor("gamma"), beta = f.tensor("beta");
    const Tensor rm = f.tensor("running_mean"), rv = f.tensor("running_var");
    const auto r = ops::batchnorm2d_train(cpu(), x, gamma, beta, rm, rv, p, true);
    EXPECT_ALL_CLOSE(r.y, f.tensor("y"), kRtol, kAtol);
    EXPECT_ALL_CLOSE(r.mean, f.tensor("save_mean"), kRtol, kAtol);
    EXPECT_ALL_CLOSE(r.invstd, f.tensor("save_invstd"), kRtol, kAtol);
    EXPECT_ALL_CLOSE(rm, f.tensor("running_mean_new"), kRtol, kAtol);
    EXPECT_ALL_CLOSE(rv, f.tensor("running_var_new"), kRtol, kAtol);

    // Recompute (update_running = false): the same outputs, running statistics untouched.
    const Tensor rm2 = rm.clone(), rv2 = rv.clone();
    const auto again = ops::batchnorm2d_train(cpu(), x, gamma, beta, rm2, rv2, p, false);
    EXPECT_TRUE(bitwise_equal(again.y, r.y));
    EXPECT_TRUE(bitwise_equal(again.invstd, r.invstd));
    EXPECT_TRUE(bitwise_equal(rm2, rm));
    EXPECT_TRUE(bitwise_equal(rv2, rv));
    // Undefined running statistics are fine when they are not updated.
    EXPECT_NO_THROW(ops::batchnorm2d_train(cpu(), x, gamma, beta, Tensor(), Tensor(), p, false));

    const Tensor dx = Tensor::full(x.shape(), std::nanf(""));
    const Tensor dg0 = random_tensor(gamma.shape(), 9), dg = dg0.clone();
    const Tensor db0 = random_tensor(beta.shape(), 10), db = db0.clone();
    cpu().batchnorm2d_backward(f.tensor("dy"), x, gamma, r.mean, r.invstd, dx, dg, db);
    // dx combines three per-channel sums and cancels them: atol 1e-5 on O(1) values holds.
    EXPECT_ALL_CLOSE(dx, f.tensor("dx"), kRtol, kAtol);
    EXPECT_ALL_CLOSE(dg, plus(dg0, f.tensor("dgamma")), kRtol, kAtol);
    EXPECT_ALL_CLOSE(db, plus(db0, f.tensor("dbeta")), kRtol, kAtol);
  }
}

TEST(BatchNorm, EvalMatchesPyTorch) {
  const auto f = load_golden("cnn/bn_eval");
  BatchNormParams p;
  p.eps = static_cast<float>(meta_float(f, "eps"));
  const Tensor x = f.tensor("x");
  const Tensor y = Tensor::empty(x.shape());
  cpu().batchnorm2d_forward_eval(x, f.tensor("gamma"), f.tensor("beta"), f.tensor("running_mean"),
                                 f.tensor("running_var"), p, y);
  EXPECT_ALL_CLOSE(y, f.tensor("y"), kRtol, kAtol);
}

// ---- Finite differences (L = sum(dy * y)) -----------------------------------------------------

TEST(BatchNorm, GradientsMatchFiniteDifferences) {
  for (const Shape& s : {Shape{4, 3, 5, 6}, Shape{2, 5, 3, 1}}) {
    SCOPED_TRACE(s.str());
    BatchNormParams p;
    const Tensor x = random_tensor(s, 60), gamma = random_tensor(Shape{s[1]}, 61, 0.5f, 1.5f);
    const Tensor beta = random_tensor(Shape{s[1]}, 62);
    const Tensor dy = random_tensor(s, 63);
    const auto r = ops::batchnorm2d_train(cpu(), x, gamma, beta, Tensor(), Tensor(), p, false);
    const Tensor dx = ops::empty_like(cpu(), x), dg = Tensor::zeros(gamma.shape()), db = Tensor::zeros(beta.shape());
    cpu().batchnorm2d_backward(dy, x, gamma, r.mean, r.invstd, dx, dg, db);
    auto loss = [&] { return dot(dy, ops::batchnorm2d_train(cpu(), x, gamma, beta, Tensor(), Tensor(), p, false).y); };
    // Normalisation is smooth: central differences with eps 1e-2 are accurate to O(eps^2).
    EXPECT_TRUE(check_gradient("batchnorm2d dx", x, dx, loss));
    EXPECT_TRUE(check_gradient("batchnorm2d dgamma", gamma, dg, loss));
    EXPECT_TRUE(check_gradient("batchnorm2d dbeta", beta, db, loss));
  }
}

// ---- Determinism ------------------------------------------------------------------------------

struct BnRun {
  Tensor y, mean, invstd, rm, rv, dx, dg, db;
};

BnRun run_bn(const Shape& s) {
  const Tensor x = random_tensor(s, 90, -2.0f, 3.0f), gamma = random_tensor(Shape{s[1]}, 91);
  const Tensor beta = random_tensor(Shape{s[1]}, 92);
  BnRun r;
  r.rm = random_tensor(Shape{s[1]}, 93);
  r.rv = random_tensor(Shape{s[1]}, 94, 0.5f, 1.5f);
  const auto f = ops::batchnorm2d_train(cpu(), x, gamma, beta, r.rm, r.rv, BatchNormParams{}, true);
  r.y = f.y, r.mean = f.mean, r.invstd = f.invstd;
  const Tensor dy = random_tensor(s, 95);
  r.dx = ops::empty_like(cpu(), x);
  r.dg = random_tensor(Shape{s[1]}, 96);
  r.db = random_tensor(Shape{s[1]}, 97);
  cpu().batchnorm2d_backward(dy, x, gamma, f.mean, f.invstd, r.dx, r.dg, r.db);
  return r;
}

void expect_same(const BnRun& a, const BnRun& b) {
  for (auto m : {&BnRun::y, &BnRun::mean, &BnRun::invstd, &BnRun::rm, &BnRun::rv, &BnRun::dx, &BnRun::dg, &BnRun::db})
    EXPECT_TRUE(bitwise_equal(a.*m, b.*m));
}

const Shape kDetBn{8, 6, 40, 37};

TEST(BatchNorm, RunToRunBitwiseEqual) { expect_same(run_bn(kDetBn), run_bn(kDetBn)); }

// Any thread count gives the same bits: every output is computed by one thread in a fixed
// order.
TEST(BatchNorm, ThreadCountDoesNotChangeResults) {
  ThreadCount restore;
  omp_set_num_threads(1);
  const BnRun b1 = run_bn(kDetBn);
  for (int threads : {2, 3}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    omp_set_num_threads(threads);
    expect_same(b1, run_bn(kDetBn));
  }
}

// ---- Errors -------------------------------------------------------------------------------------

TEST(BatchNorm, BadArgumentsNameTheOpAndShapes) {
  Backend& be = cpu();
  const Tensor xi = Tensor::empty(Shape{1, 2, 4, 4}, Device::cpu(), DType::i32);
  const Tensor x = Tensor::zeros(Shape{2, 3, 4, 4}), c3 = Tensor::zeros(Shape{3}), c4 = Tensor::zeros(Shape{4});
  EXPECT_REMAT_ERROR(ops::batchnorm2d_train(be, x, c4, c3, c3, c3, BatchNormParams{}),
                     "batchnorm2d_forward_train: gamma f32[4] on cpu: expected shape [3]");
  EXPECT_REMAT_ERROR(
      be.batchnorm2d_forward_eval(xi, c3, c3, c3, c3, BatchNormParams{}, Tensor::empty(Shape{1, 2, 4, 4})),
      "batchnorm2d_forward_eval: x i32[1, 2, 4, 4] on cpu: expected dtype f32");
  EXPECT_REMAT_ERROR(ops::batchnorm2d_train(be, Tensor::zeros(Shape{1, 3, 1, 1}), c3, c3, c3, c3, BatchNormParams{}),
                     "batch statistics need more than one value per channel");
}

// ---- bf16 ----------------------------------------------------------------------------------

TEST(BatchNorm, Bf16MatchesPyTorch) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  auto f = load_golden("bf16_ops/batchnorm");
  Tensor x = bf16_in(f, "x"), gamma = bf16_in(f, "gamma");
  const int64_t c = x.size(1);
  Tensor rm = Tensor::zeros(Shape{c}), rv = Tensor::zeros(Shape{c});
  Tensor sm = Tensor::empty(Shape{c}), si = Tensor::empty(Shape{c});
  Tensor y = bf16_empty(x.shape());
  BatchNormParams bp;
  bp.eps = static_cast<float>(remat::test::meta_float(f, "eps"));
  cpu().batchnorm2d_forward_train(x, gamma, bf16_in(f, "beta"), rm, rv, bp, false, y, sm, si);
  // PyTorch's bf16 batch norm rounds its normalised values and statistics to bf16.
  expect_bf16_golden(f, "y", y, 0, 24);
  Tensor dx = bf16_empty(x.shape()), dgamma = Tensor::zeros(Shape{c}), dbeta = Tensor::zeros(Shape{c});
  cpu().batchnorm2d_backward(bf16_in(f, "dy"), x, gamma, sm, si, dx, dgamma, dbeta);
  expect_bf16_golden(f, "dx", dx, 0, 8);
  expect_bf16_golden(f, "dgamma", dgamma, 0.01, 2);
  expect_bf16_golden(f, "dbeta", dbeta, 0.01, 1);
}

TEST(BatchNorm, Bf16IsTheRoundedFp32Op) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  const int64_t N = 5, C = 6, H = 10, W = 12;
  Bf16Pair x = random_pair(Shape{N, C, H, W}, 20), gamma = random_pair(Shape{C}, 21), beta = random_pair(Shape{C}, 22);
  Bf16Pair y = empty_pair(Shape{N, C, H, W});
  Tensor rmf = Tensor::zeros(Shape{C}), rvf = Tensor::zeros(Shape{C}), rmh = Tensor::zeros(Shape{C}),
         rvh = Tensor::zeros(Shape{C});
  Tensor smf = Tensor::empty(Shape{C}), sif = Tensor::empty(Shape{C}), smh = Tensor::empty(Shape{C}),
         sih = Tensor::empty(Shape{C});
  const BatchNormParams bp;
  cpu().batchnorm2d_forward_train(x.f, gamma.f, beta.f, rmf, rvf, bp, true, y.f, smf, sif);
  cpu().batchnorm2d_forward_train(x.h, gamma.h, beta.h, rmh, rvh, bp, true, y.h, smh, sih);
  expect_rounded(y, "batchnorm2d_forward_train");
  EXPECT_EQ(smf.to_vector(), smh.to_vector());
  EXPECT_EQ(sif.to_vector(), sih.to_vector());
  EXPECT_EQ(rvf.to_vector(), rvh.to_vector()) << "running statistics (f32)";
  cpu().batchnorm2d_forward_eval(x.f, gamma.f, beta.f, rmf, rvf, bp, y.f);
  cpu().batchnorm2d_forward_eval(x.h, gamma.h, beta.h, rmh, rvh, bp, y.h);
  expect_rounded(y, "batchnorm2d_forward_eval");
  Bf16Pair dy = random_pair(Shape{N, C, H, W}, 23);
  Tensor dgf = Tensor::zeros(Shape{C}), dbf = Tensor::zeros(Shape{C}), dgh = Tensor::zeros(Shape{C}),
         dbh = Tensor::zeros(Shape{C});
  cpu().batchnorm2d_backward(dy.f, x.f, gamma.f, smf, sif, dy.f, dgf, dbf);  // dx in place of dy
  cpu().batchnorm2d_backward(dy.h, x.h, gamma.h, smh, sih, dy.h, dgh, dbh);
  expect_rounded(dy, "batchnorm2d_backward dx (in place)");
  EXPECT_EQ(dgf.to_vector(), dgh.to_vector());
  EXPECT_EQ(dbf.to_vector(), dbh.to_vector());
}

// Statistics stay f32 under bf16 activations: a bf16 batch-norm statistic is refused by the
// validator (every backend), the error naming the op and the tensor.
TEST(BatchNorm, Bf16StatisticsMustBeF32) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  const Shape xs{2, 4, 3, 3}, cs{4};
  Bf16Pair bx = random_pair(xs, 32), bg = random_pair(cs, 33), by = empty_pair(xs);
  Tensor c32 = Tensor::zeros(cs), c16 = Tensor::zeros(cs, Device::cpu(), DType::bf16);
  const BatchNormParams bp;
  expect_statistics_error(
      error_of([&] { cpu().batchnorm2d_forward_train(bx.h, bg.h, bg.h, c32, c32, bp, true, by.h, c16, c32); }),
      "batchnorm2d_forward_train", "save_mean");
  expect_statistics_error(
      error_of([&] { cpu().batchnorm2d_forward_train(bx.h, bg.h, bg.h, c32, c16, bp, true, by.h, c32, c32); }),
      "batchnorm2d_forward_train", "running_var");
  expect_statistics_error(error_of([&] { cpu().batchnorm2d_forward_eval(bx.h, bg.h, bg.h, c16, c32, bp, by.h); }),
                          "batchnorm2d_forward_eval", "running_mean");
  expect_statistics_error(error_of([&] { cpu().batchnorm2d_backward(bx.h, bx.h, bg.h, c32, c16, by.h, c32, c32); }),
                          "batchnorm2d_backward", "save_invstd");
  // gamma and beta may be bf16 working copies: the same calls with f32 statistics run.
  EXPECT_EQ(error_of([&] { cpu().batchnorm2d_forward_train(bx.h, bg.h, bg.h, c32, c32, bp, true, by.h, c32, c32); }),
            "");
}

}  // namespace
}  // namespace remat::test
