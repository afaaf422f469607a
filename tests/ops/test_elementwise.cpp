// The elementwise ops of the CPU backend (src/backends/cpu/elementwise.cpp): add, accumulate,
// scale, cast_multi, ReLU, GELU, dropout. Against PyTorch goldens (tools/reference/golden/basic.py;
// bf16: tools/reference/golden/bf16_ops.py), finite differences, an independent reference for what
// PyTorch cannot give (dropout masks), and bad arguments.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
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

// Tolerances against PyTorch: both sides are fp32 with different summation orders
// (OpenBLAS vs PyTorch's BLAS, vectorised reductions), so agreement is to a few ulps of
// the accumulated magnitude, not bitwise.
constexpr double kRtol = 1e-5, kAtol = 1e-6;

TEST(Elementwise, ReluGeluAddMatchPyTorch) {
  struct Case {
    const char* name;
    int kind;  // 0 relu, 1 gelu erf, 2 gelu tanh
  };
  for (Case c : {Case{"relu", 0}, Case{"gelu_erf", 1}, Case{"gelu_tanh", 2}}) {
    SCOPED_TRACE(c.name);
    auto g = load_golden(std::string("basic/") + c.name);
    Tensor x = g.tensor("x"), dx = Tensor::empty(x.shape());
    const auto approx = c.kind == 2 ? remat::GeluApprox::tanh : remat::GeluApprox::none;
    Tensor y = c.kind == 0 ? ops::relu(cpu(), x) : ops::gelu(cpu(), x, approx);
    // GELU: erf/tanh from libm vs PyTorch's vectorised versions differ by a few ulps.
    EXPECT_TRUE(all_close(y, g.tensor("y"), 1e-5, 1e-6));
    if (c.kind == 0)
      cpu().relu_backward(g.tensor("dy"), x, dx);
    else
      cpu().gelu_backward(g.tensor("dy"), x, approx, dx);
    EXPECT_TRUE(all_close(dx, g.tensor("dx"), 1e-5, 1e-6));
  }
  auto g = load_golden("basic/add");
  EXPECT_TRUE(all_close(ops::add(cpu(), g.tensor("a"), g.tensor("b")), g.tensor("y"), 0, 0));
}

TEST(Elementwise, GradientsMatchFiniteDifferences) {
  Tensor x = random_tensor({3, 41}, 8, -3.0f, 3.0f), dy = random_tensor({3, 41}, 9);
  Tensor dx = Tensor::empty(x.shape());
  for (auto approx : {remat::GeluApprox::none, remat::GeluApprox::tanh}) {
    cpu().gelu_backward(dy, x, approx, dx);
    EXPECT_TRUE(check_gradient("gelu", x, dx, [&] { return remat::test::dot(ops::gelu(cpu(), x, approx), dy); }));
  }
  cpu().relu_backward(dy, x, dx);
  remat::test::GradCheckOptions opt;
  const float* px = x.f32();
  opt.skip = [&](int64_t i) { return std::fabs(px[i]) < 2 * opt.eps; };  // the kink at 0
  EXPECT_TRUE(check_gradient(
      "relu", x, dx, [&] { return remat::test::dot(ops::relu(cpu(), x), dy); }, opt));
  // scale and accumulate
  Tensor y = Tensor::empty(x.shape());
  cpu().scale(x, -2.0f, y);
  EXPECT_EQ(y.to_vector()[7], -2.0f * x.to_vector()[7]);
  Tensor acc = x.clone();
  cpu().accumulate(acc, y);
  EXPECT_EQ(acc.to_vector()[7], x.to_vector()[7] + y.to_vector()[7]);
}

// SiLU and mul (LLaMA's SwiGLU MLP) against PyTorch's fp32 ops (tools/reference/golden/basic.py): SiLU's
// exp is the CPU's vectorised one (within 2 ulp, as GELU's erf and tanh): 1e-5 relative, 1e-6
// absolute; mul is one product per element, correctly rounded on both: exact.
TEST(Elementwise, SiluMulMatchPyTorch) {
  auto g = load_golden("basic/silu");
  const Tensor x = g.tensor("x"), dy = g.tensor("dy");
  Tensor y = Tensor::empty(x.shape());
  cpu().silu_forward(x, y);
  EXPECT_TRUE(all_close(y, g.tensor("y"), 1e-5, 1e-6));
  Tensor dx = Tensor::full(x.shape(), std::numeric_limits<float>::quiet_NaN());
  cpu().silu_backward(dy, x, dx);
  EXPECT_TRUE(all_close(dx, g.tensor("dx"), 1e-5, 1e-6));
  // dx over dy (remat/backend_ops.def): the same bits
  Tensor in_place = dy.clone();
  cpu().silu_backward(in_place, x, in_place);
  EXPECT_TRUE(bitwise_equal(in_place, dx));

  auto m = load_golden("basic/mul");
  const Tensor a = m.tensor("a"), b = m.tensor("b"), mdy = m.tensor("dy");
  Tensor ab = Tensor::empty(a.shape());
  cpu().mul_forward(a, b, ab);
  EXPECT_TRUE(all_close(ab, m.tensor("y"), 0, 0));
  Tensor da = Tensor::empty(a.shape()), db = Tensor::empty(b.shape());
  cpu().mul_backward(mdy, a, b, da, db);
  EXPECT_TRUE(all_close(da, m.tensor("da"), 0, 0));
  EXPECT_TRUE(all_close(db, m.tensor("db"), 0, 0));
  // either gradient alone
  Tensor da2 = Tensor::empty(a.shape()), db2 = Tensor::empty(b.shape());
  cpu().mul_backward(mdy, a, b, da2, Tensor());
  cpu().mul_backward(mdy, a, b, Tensor(), db2);
  EXPECT_TRUE(bitwise_equal(da2, da));
  EXPECT_TRUE(bitwise_equal(db2, db));
}

TEST(Elementwise, SiluMulGradientsMatchFiniteDifferences) {
  Tensor x = random_tensor({3, 41}, 30, -4.0f, 4.0f), dy = random_tensor({3, 41}, 31);
  Tensor dx = Tensor::empty(x.shape()), y = Tensor::empty(x.shape());
  cpu().silu_backward(dy, x, dx);
  EXPECT_TRUE(check_gradient("silu", x, dx, [&] {
    cpu().silu_forward(x, y);
    return dot(y, dy);
  }));
  Tensor a = random_tensor({3, 41}, 32, -2.0f, 2.0f), b = random_tensor({3, 41}, 33, -2.0f, 2.0f);
  Tensor da = Tensor::empty(a.shape()), db = Tensor::empty(b.shape());
  cpu().mul_backward(dy, a, b, da, db);
  auto loss = [&] {
    cpu().mul_forward(a, b, y);
    return dot(y, dy);
  };
  EXPECT_TRUE(check_gradient("mul da", a, da, loss));
  EXPECT_TRUE(check_gradient("mul db", b, db, loss));
}

// ---- Dropout (no PyTorch golden can share our mask: an independent reference) ---------------

TEST(Elementwise, DropoutMatchesElementKeyedReference) {
  const int64_t n = 10007;
  Tensor x = random_tensor({n}, 10);
  // 6: not block-aligned, takes the per-element path; the last one puts bits in every part
  // of the Philox counter (block >> 16 and block >> 48).
  for (uint64_t offset : {0ull, 8ull, 6ull, (1ull << 50) + (3ull << 20) + 8ull}) {
    const remat::RngState rng{77, offset};
    const float p = 0.3f;
    Tensor y = ops::dropout(cpu(), x, p, rng);
    const auto xv = x.to_vector(), yv = y.to_vector();
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float u = remat::philox::uniform(remat::philox::word(77, offset + static_cast<uint64_t>(i)));
      const float want = u < 0.7f ? xv[static_cast<size_t>(i)] * (1.0f / 0.7f) : 0.0f;
      ASSERT_EQ(yv[static_cast<size_t>(i)], want) << "offset " << offset << " element " << i;
      kept += u < 0.7f;
    }
    const double sd = std::sqrt(n * 0.7 * 0.3);
    EXPECT_NEAR(static_cast<double>(kept), 0.7 * n, 6 * sd);
  }
}

TEST(Elementwise, DropoutBackwardUsesTheForwardMask) {
  Tensor x = random_tensor({3, 333}, 11), dy = random_tensor({3, 333}, 12);
  const remat::RngState rng{5, 1024};
  Tensor y = ops::dropout(cpu(), x, 0.5f, rng);
  Tensor dx = Tensor::empty(x.shape());
  cpu().dropout_backward(dy, 0.5f, rng, dx);
  const auto yv = y.to_vector(), dxv = dx.to_vector(), xv = x.to_vector(), dyv = dy.to_vector();
  for (size_t i = 0; i < yv.size(); ++i) {
    const bool kept = yv[i] != 0.0f;
    ASSERT_EQ(dxv[i], kept ? dyv[i] * 2.0f : 0.0f) << i;
    if (kept) {
      ASSERT_EQ(yv[i], xv[i] * 2.0f);
    }
  }
  EXPECT_TRUE(
      check_gradient("dropout", x, dx, [&] { return remat::test::dot(ops::dropout(cpu(), x, 0.5f, rng), dy); }));
}

TEST(Elementwise, DropoutEdgeProbabilitiesAndThreadCounts) {
  Tensor x = random_tensor({4096}, 13);
  EXPECT_TRUE(bitwise_equal(ops::dropout(cpu(), x, 0.0f, {1, 0}), x));
  for (float v : ops::dropout(cpu(), x, 1.0f, {1, 0}).to_vector()) ASSERT_EQ(v, 0.0f);
  // p close to 1: a handful kept, each scaled by 1/(1-p), finite.
  Tensor big = random_tensor({1 << 16}, 14);
  Tensor y = ops::dropout(cpu(), big, 0.9999f, {3, 0});
  int kept = 0;
  for (float v : y.to_vector()) {
    ASSERT_TRUE(std::isfinite(v));
    kept += v != 0.0f;
  }
  EXPECT_LT(kept, 40);
  // Same mask with 1 and 2 threads.
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  Tensor y1 = ops::dropout(cpu(), big, 0.4f, {9, 64});
  omp_set_num_threads(2);
  Tensor y2 = ops::dropout(cpu(), big, 0.4f, {9, 64});
  omp_set_num_threads(saved);
  EXPECT_TRUE(bitwise_equal(y1, y2));
  EXPECT_REMAT_ERROR(ops::dropout(cpu(), x, 1.5f, {1, 0}), "dropout_forward: p must be in [0, 1]");
}

TEST(Elementwise, BadArgumentsNameTheOpAndShapes) {
  Tensor x = random_tensor({4, 3}, 22), w = random_tensor({5, 4}, 23);
  EXPECT_REMAT_ERROR(ops::add(cpu(), x, w), "add: a f32[4, 3] on cpu and b f32[5, 4] on cpu must have the same shape");
  Tensor ids = Tensor::from_ints({1, 2, 3}, {3});
  EXPECT_REMAT_ERROR(ops::relu(cpu(), ids), "relu_forward: x i32[3] on cpu: expected dtype f32");
  Tensor meta_x = Tensor::empty({4, 3}, Device::meta());
  EXPECT_REMAT_ERROR(cpu().relu_forward(meta_x, Tensor::empty({4, 3})), "expected a tensor on cpu");
  EXPECT_REMAT_ERROR(cpu().silu_forward(x, Tensor::empty({3, 4})),
                     "silu_forward: x f32[4, 3] on cpu and y f32[3, 4] on cpu must have the same shape");
  EXPECT_REMAT_ERROR(cpu().mul_forward(x, w, Tensor::empty({4, 3})),
                     "mul_forward: a f32[4, 3] on cpu and b f32[5, 4] on cpu must have the same shape");
  // mul_backward writes da before it reads dy and a for db: no output over an input.
  Tensor dy = random_tensor({4, 3}, 24), b = random_tensor({4, 3}, 25);
  EXPECT_REMAT_ERROR(cpu().mul_backward(dy, x, b, dy, Tensor::empty({4, 3})),
                     "mul_backward: da f32[4, 3] on cpu must not share storage with dy, a or b");
  EXPECT_REMAT_ERROR(cpu().mul_backward(dy, x, b, Tensor(), Tensor::empty({5, 3})),
                     "mul_backward: db f32[5, 3] on cpu: expected shape [4, 3]");
}

// ---- bf16 ----------------------------------------------------------------------------------

TEST(Elementwise, Bf16PointwiseMatchPyTorch) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  for (const char* name : {"gelu_erf", "gelu_tanh", "relu"}) {
    SCOPED_TRACE(name);
    std::printf("  %s\n", name);
    auto f = load_golden(std::string("bf16_ops/") + name);
    Tensor x = bf16_in(f, "x"), y = bf16_empty(x.shape()), dx = bf16_empty(x.shape());
    const std::string n = name;
    if (n == "relu") {
      cpu().relu_forward(x, y);
      cpu().relu_backward(bf16_in(f, "dy"), x, dx);
    } else {
      const GeluApprox a = n == "gelu_tanh" ? GeluApprox::tanh : GeluApprox::none;
      cpu().gelu_forward(x, a, y);
      cpu().gelu_backward(bf16_in(f, "dy"), x, a, dx);
    }
    // PyTorch 1.13's bf16 tanh GELU rounds its intermediates to bf16 (the erf one does not).
    const bool tanh = n == "gelu_tanh";
    expect_bf16_golden(f, "y", y, 0, tanh ? 16 : 0);
    expect_bf16_golden(f, "dx", dx, 0, tanh ? 64 : 0);
  }
  auto f = load_golden("bf16_ops/add");
  Tensor y = bf16_empty(f.tensor("x").shape());
  cpu().add(bf16_in(f, "x"), bf16_in(f, "x2"), y);
  expect_bf16_golden(f, "y", y, 0, 0);
}

// SiLU and mul on bf16 tensors against PyTorch 1.13 (tools/reference/golden/bf16_ops.py). The fp32
// reference on the same values: within one bf16 step for SiLU (its exp is not PyTorch's, so an
// fp32 result a few ulps away may round to the neighbouring bf16; 0 measured), exact for mul
// (one product, rounded once). PyTorch's bf16 SiLU kernels round intermediates to bf16 (1.9
// and 8.6 ulp measured for y and dx: allowed 4 and 16); its bf16 product is rounded once.
TEST(Elementwise, Bf16SiluMulMatchPyTorch) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  auto f = load_golden("bf16_ops/silu");
  Tensor x = bf16_in(f, "x"), y = bf16_empty(x.shape()), dx = bf16_empty(x.shape());
  cpu().silu_forward(x, y);
  cpu().silu_backward(bf16_in(f, "dy"), x, dx);
  expect_bf16_golden(f, "y", y, 1, 4);
  expect_bf16_golden(f, "dx", dx, 1, 16);
  auto m = load_golden("bf16_ops/mul");
  Tensor a = bf16_in(m, "x"), b = bf16_in(m, "x2"), ab = bf16_empty(a.shape());
  Tensor da = bf16_empty(a.shape()), db = bf16_empty(a.shape());
  cpu().mul_forward(a, b, ab);
  cpu().mul_backward(bf16_in(m, "dy"), a, b, da, db);
  expect_bf16_golden(m, "y", ab, 0, 0);
  expect_bf16_golden(m, "dx", da, 0, 0);
  expect_bf16_golden(m, "dx2", db, 0, 0);
}

// SiLU and mul on bf16 tensors are the fp32 ops on the same values, rounded once.
TEST(Elementwise, Bf16SiluMulAreTheRoundedFp32Ops) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  const Shape s{3, 5000};  // several pieces and parallel chunks, a short last one
  Bf16Pair a = random_pair(s, 50), b = random_pair(s, 51), g = random_pair(s, 52);
  Bf16Pair y = empty_pair(s), y2 = empty_pair(s);
  cpu().silu_forward(a.f, y.f);
  cpu().silu_forward(a.h, y.h);
  expect_rounded(y, "silu_forward");
  cpu().silu_backward(g.f, a.f, y.f);
  cpu().silu_backward(g.h, a.h, y.h);
  expect_rounded(y, "silu_backward");
  cpu().mul_forward(a.f, b.f, y.f);
  cpu().mul_forward(a.h, b.h, y.h);
  expect_rounded(y, "mul_forward");
  cpu().mul_backward(g.f, a.f, b.f, y.f, y2.f);
  cpu().mul_backward(g.h, a.h, b.h, y.h, y2.h);
  expect_rounded(y, "mul_backward da");
  expect_rounded(y2, "mul_backward db");
  // In place, as the silu layer's backward runs it (dx aliases dy).
  cpu().silu_backward(g.f, a.f, g.f);
  cpu().silu_backward(g.h, a.h, g.h);
  expect_rounded(g, "silu_backward in place");
}

TEST(Elementwise, Bf16AreTheRoundedFp32Ops) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  const Shape s{3, 5000};  // several pieces and parallel chunks, a short last one
  Bf16Pair a = random_pair(s, 1), b = random_pair(s, 2);
  Bf16Pair y = empty_pair(s);
  cpu().add(a.f, b.f, y.f);
  cpu().add(a.h, b.h, y.h);
  expect_rounded(y, "add");
  cpu().gelu_forward(a.f, GeluApprox::tanh, y.f);
  cpu().gelu_forward(a.h, GeluApprox::tanh, y.h);
  expect_rounded(y, "gelu tanh");
  cpu().gelu_backward(b.f, a.f, GeluApprox::none, y.f);
  cpu().gelu_backward(b.h, a.h, GeluApprox::none, y.h);
  expect_rounded(y, "gelu_backward erf");
  cpu().dropout_forward(a.f, 0.25f, RngState{7, 123}, y.f);
  cpu().dropout_forward(a.h, 0.25f, RngState{7, 123}, y.h);
  expect_rounded(y, "dropout");
  // In place, as backward runs it (dx aliases dy).
  Bf16Pair g = random_pair(s, 3);
  cpu().dropout_backward(g.f, 0.25f, RngState{7, 123}, g.f);
  cpu().dropout_backward(g.h, 0.25f, RngState{7, 123}, g.h);
  expect_rounded(g, "dropout_backward in place");
  g = bf16_pair(widen(g.h), s);  // both sides from the same (bf16) values again
  cpu().accumulate(g.f, a.f);
  cpu().accumulate(g.h, a.h);
  expect_rounded(g, "accumulate");
}

// cast_multi (the working-copy refresh): every f32 -> bf16 pair is scale(src, 1, dst)'s bits
// (one rounding to nearest even: ties, subnormals, overflow, NaN), bf16 -> f32 is exact and a
// pair of one dtype a copy; tensors of any size in one call.
TEST(Elementwise, Bf16CastMultiIsScaleByOnePerTensor) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<Tensor> src, dst, want;
  const std::vector<float> edge = {1.00390625f, 1.01171875f, -1.00390625f, 3.3895314e38f, -3.4e38f, 1e-40f,
                                   -1e-45f,     nan,         inf,          -inf,          0.0f,     -0.0f};
  src.push_back(Tensor::from_vector(edge, Shape{static_cast<int64_t>(edge.size())}));
  std::mt19937 gen(40);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{2048}, int64_t{2049}, int64_t{70001}}) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = u(gen);
    src.push_back(Tensor::from_vector(v, Shape{n}));
  }
  for (const Tensor& s : src) {
    dst.push_back(Tensor::empty(s.shape(), Device::cpu(), DType::bf16));
    want.push_back(Tensor::empty(s.shape(), Device::cpu(), DType::bf16));
    cpu().scale(s, 1.0f, want.back());
  }
  Bf16Pair h = random_pair(Shape{3, 7}, 41);  // bf16 -> f32, and f32 -> f32
  Tensor widened = Tensor::empty(h.h.shape()), copied = Tensor::empty(h.f.shape());
  src.push_back(h.h);
  dst.push_back(widened);
  src.push_back(h.f);
  dst.push_back(copied);
  cpu().cast_multi(src, dst);
  for (size_t i = 0; i + 2 < src.size(); ++i)
    EXPECT_EQ(bits(dst[i]), bits(want[i])) << "tensor " << i << " " << src[i].str();
  EXPECT_EQ(widened.to_vector(), h.f.to_vector());
  EXPECT_EQ(copied.to_vector(), h.f.to_vector());
  // Mismatched lists and shapes are errors naming the op.
  EXPECT_NE(error_of([&] { cpu().cast_multi(src, {}); }).find("cast_multi: 9 sources but 0 destinations"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              cpu().cast_multi({h.f}, {Tensor::empty(Shape{7, 3}, Device::cpu(), DType::bf16)});
            }).find("cast_multi: src 0 f32[3, 7] on cpu and dst bf16[7, 3] on cpu must have the same shape"),
            std::string::npos);
}

}  // namespace
}  // namespace remat::test
