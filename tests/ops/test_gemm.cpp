// The GEMM and linear ops of the CPU backend (src/backends/cpu/gemm.cpp): against PyTorch
// goldens (tools/reference/golden/basic.py; bf16: tools/reference/golden/bf16_ops.py), finite differences, thread
// counts and bad arguments.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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

TEST(Gemm, GemmMatchesPyTorch) {
  for (const char* name : {"gemm_small", "gemm_trans_a", "gemm_trans_b", "gemm_batched_tt", "gemm_batched_shared_b"}) {
    SCOPED_TRACE(name);
    auto g = load_golden(std::string("basic/") + name);
    Tensor c = g.tensor("c0");
    cpu().gemm(
        g.tensor("a"), g.tensor("b"), c,
        remat::GemmParams{meta_int(g, "trans_a") != 0, meta_int(g, "trans_b") != 0,
                          static_cast<float>(meta_float(g, "alpha")), static_cast<float>(meta_float(g, "beta"))});
    EXPECT_TRUE(all_close(c, g.tensor("c"), kRtol, kAtol));
  }
}

TEST(Gemm, LinearForwardBackwardMatchesPyTorch) {
  for (const char* name : {"linear_2d", "linear_3d_nobias", "linear_odd"}) {
    SCOPED_TRACE(name);
    auto g = load_golden(std::string("basic/") + name);
    const bool bias = meta_int(g, "bias") != 0;
    Tensor x = g.tensor("x"), w = g.tensor("w"), b = bias ? g.tensor("b") : Tensor();
    Tensor y = ops::linear(cpu(), x, w, b);
    EXPECT_TRUE(all_close(y, g.tensor("y"), kRtol, kAtol));
    Tensor dx = Tensor::empty(x.shape());
    Tensor dw = Tensor::full(w.shape(), 0.25f);  // parameter gradients accumulate
    Tensor db = bias ? Tensor::zeros(b.shape()) : Tensor();
    cpu().linear_backward(g.tensor("dy"), x, w, dx, dw, db);
    EXPECT_TRUE(all_close(dx, g.tensor("dx"), kRtol, kAtol));
    Tensor want_dw = g.tensor("dw");
    std::vector<float> wd = want_dw.to_vector();
    for (float& v : wd) v += 0.25f;
    EXPECT_TRUE(all_close(dw, Tensor::from_vector(wd, w.shape()), kRtol, kAtol));
    if (bias) {
      EXPECT_TRUE(all_close(db, g.tensor("db"), kRtol, kAtol));
    }
  }
}

TEST(Gemm, LinearGradientsMatchFiniteDifferences) {
  Tensor x = random_tensor({5, 6}, 1), w = random_tensor({4, 6}, 2), b = random_tensor({4}, 3);
  Tensor dy = random_tensor({5, 4}, 4);
  auto loss = [&] { return remat::test::dot(ops::linear(cpu(), x, w, b), dy); };
  Tensor dx = Tensor::empty(x.shape()), dw = Tensor::zeros(w.shape()), db = Tensor::zeros(b.shape());
  cpu().linear_backward(dy, x, w, dx, dw, db);
  EXPECT_TRUE(check_gradient("linear dx", x, dx, loss));
  EXPECT_TRUE(check_gradient("linear dw", w, dw, loss));
  EXPECT_TRUE(check_gradient("linear db", b, db, loss));
}

TEST(Gemm, MatmulGradientsMatchFiniteDifferences) {
  // d(a @ b) by the gemm identities the executor uses: da = dc b^T, db = a^T dc.
  Tensor a = random_tensor({2, 3, 4}, 5), b = random_tensor({2, 4, 5}, 6), dc = random_tensor({2, 3, 5}, 7);
  auto loss = [&] { return remat::test::dot(ops::matmul(cpu(), a, b), dc); };
  Tensor da = ops::matmul(cpu(), dc, b, false, true);
  Tensor db = ops::matmul(cpu(), a, dc, true, false);
  EXPECT_TRUE(check_gradient("matmul da", a, da, loss));
  EXPECT_TRUE(check_gradient("matmul db", b, db, loss));
}

TEST(Gemm, LinearBackwardIsBitwiseIndependentOfThreadCount) {
  Tensor x = random_tensor({300, 129}, 19), w = random_tensor({65, 129}, 20), dy = random_tensor({300, 65}, 21);
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    Tensor db = Tensor::zeros({65});
    cpu().linear_backward(dy, x, w, Tensor(), Tensor(), db);
    return db;
  };
  const int saved = omp_get_max_threads();
  Tensor db1 = run(1);
  Tensor db2 = run(2);
  omp_set_num_threads(saved);
  EXPECT_TRUE(bitwise_equal(db1, db2));
}

TEST(Gemm, BadArgumentsNameTheOpAndShapes) {
  Tensor x = random_tensor({4, 3}, 22), w = random_tensor({5, 4}, 23);
  EXPECT_REMAT_ERROR(ops::linear(cpu(), x, w, Tensor()),
                     "linear_forward: x f32[4, 3] on cpu and w f32[5, 4] on cpu: in_features differ (3 vs 4)");
  EXPECT_REMAT_ERROR(ops::linear(cpu(), x, random_tensor({5, 3}, 1), random_tensor({4}, 2)),
                     "linear_forward: b f32[4] on cpu: expected shape [5]");
  EXPECT_REMAT_ERROR(ops::matmul(cpu(), x, x),
                     "gemm: a f32[4, 3] on cpu and b f32[4, 3] on cpu: inner dimensions differ");
}

// ---- bf16 ----------------------------------------------------------------------------------

// gemm on bf16 factors into a bf16 C: the fp32 product of the same (bf16) values rounded, within
// one bf16 rounding step (the CPU sums k in 512-wide panels: another order than one sgemm, so
// a product a few fp32 ulps away may round to the neighbouring bf16), with and without alpha
// and beta, every transpose; k = 1100 spans three panels.
TEST(Gemm, Bf16GemmWithinOneRoundingOfFp32) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  const int64_t m = 37, n = 29, k = 1100;
  uint32_t seed = 60;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      SCOPED_TRACE("ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
      Bf16Pair a = random_pair(ta ? Shape{k, m} : Shape{m, k}, seed++);
      Bf16Pair b = random_pair(tb ? Shape{n, k} : Shape{k, n}, seed++);
      Bf16Pair c = empty_pair(Shape{m, n});
      const GemmParams p{ta != 0, tb != 0, 1.0f, 0.0f};
      cpu().gemm(a.f, b.f, c.f, p);
      cpu().gemm(a.h, b.h, c.h, p);
      expect_close_to_fp32(c, 1.0 / 128, "gemm");
      Bf16Pair c_beta = random_pair(Shape{m, n}, seed++);  // C read back (beta = 2)
      const GemmParams q{ta != 0, tb != 0, 0.5f, 2.0f};
      cpu().gemm(a.f, b.f, c_beta.f, q);
      cpu().gemm(a.h, b.h, c_beta.h, q);
      expect_close_to_fp32(c_beta, 1.0 / 128, "gemm (alpha, beta)");
    }
  }
}

TEST(Gemm, Bf16LinearMatchesPyTorch) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  auto f = load_golden("bf16_ops/linear");
  Tensor x = bf16_in(f, "x"), w = bf16_in(f, "w"), b = bf16_in(f, "b");
  Tensor y = bf16_empty(f.tensor("y").shape());
  cpu().linear_forward(x, w, b, y);
  expect_bf16_golden(f, "y", y, 1, 1);
  Tensor dx = bf16_empty(x.shape()), dw = Tensor::zeros(w.shape()), db = Tensor::zeros(b.shape());
  cpu().linear_backward(bf16_in(f, "dy"), x, w, dx, dw, db);
  expect_bf16_golden(f, "dx", dx, 1, 1);
  expect_bf16_golden(f, "dw", dw, 1, 1);
  expect_bf16_golden(f, "db", db, 1, 1);
}

TEST(Gemm, Bf16LinearWithinOneRoundingOfFp32) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  // k = 1100 spans three 512-wide panels; 600 output columns two tiles.
  const int64_t rows = 70, in = 1100, out = 600;
  Bf16Pair x = random_pair(Shape{rows, in}, 11), w = random_pair(Shape{out, in}, 12), b = random_pair(Shape{out}, 13);
  Bf16Pair y = empty_pair(Shape{rows, out});
  cpu().linear_forward(x.f, w.f, b.f, y.f);
  cpu().linear_forward(x.h, w.h, b.h, y.h);
  expect_close_to_fp32(y, 1.0 / 128, "linear_forward");
  Bf16Pair dy = random_pair(Shape{rows, out}, 14), dx = empty_pair(Shape{rows, in});
  Tensor dwf = Tensor::zeros(Shape{out, in}), dwh = Tensor::zeros(Shape{out, in}), dbf = Tensor::zeros(Shape{out}),
         dbh = Tensor::zeros(Shape{out});
  cpu().linear_backward(dy.f, x.f, w.f, dx.f, dwf, dbf);
  cpu().linear_backward(dy.h, x.h, w.h, dx.h, dwh, dbh);
  expect_close_to_fp32(dx, 1.0 / 128, "linear_backward dx");
  // dw is f32 (accumulated in fp32 from bf16 inputs): only the summation order differs.
  const auto a = dwf.to_vector(), c = dwh.to_vector();
  double worst = 0, mx = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - c[i]));
    mx = std::max(mx, std::fabs(static_cast<double>(a[i])));
  }
  EXPECT_LE(worst, 1e-5 * mx);
  EXPECT_EQ(dbf.to_vector(), dbh.to_vector()) << "bias gradient: column_sums' order on the same values";
}

}  // namespace
}  // namespace remat::test
