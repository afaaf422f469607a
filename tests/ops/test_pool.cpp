// Max, average and global average pooling on the CPU backend (src/backends/cpu/pool.cpp):
// PyTorch goldens (tools/reference/golden/cnn.py; bf16: tools/reference/golden/bf16_ops.py), finite differences,
// max pooling's ties, NaNs, window offsets and a direct-loop backward, determinism (run to
// run and across thread counts) and errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
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

// The flat h * W + w positions in their planes that max pooling's window offsets (u8,
// r * kernel_w + c from each window's top-left corner in padded coordinates) name.
std::vector<int32_t> flat_positions(const Tensor& indices, const Shape& x, const Pool2dParams& p) {
  const auto off = indices.to_ints();
  const int64_t pq = indices.size(2) * indices.size(3), q = indices.size(3);
  std::vector<int32_t> out(off.size());
  for (size_t e = 0; e < off.size(); ++e) {
    const int64_t o = static_cast<int64_t>(e) % pq, pp = o / q, qq = o % q;
    const int64_t hh = pp * p.stride_h - p.pad_h + off[e] / p.kernel_w;
    const int64_t ww = qq * p.stride_w - p.pad_w + off[e] % p.kernel_w;
    out[e] = static_cast<int32_t>(hh * x[3] + ww);
  }
  return out;
}

Pool2dParams pool_params(const SafetensorsFile& f) {
  Pool2dParams p;
  p.kernel_h = static_cast<int>(meta_int(f, "kernel_h"));
  p.kernel_w = static_cast<int>(meta_int(f, "kernel_w"));
  p.stride_h = static_cast<int>(meta_int(f, "stride_h"));
  p.stride_w = static_cast<int>(meta_int(f, "stride_w"));
  p.pad_h = static_cast<int>(meta_int(f, "pad_h"));
  p.pad_w = static_cast<int>(meta_int(f, "pad_w"));
  return p;
}

// ---- PyTorch goldens ------------------------------------------------------------------------

TEST(Pool, MaxPool2dMatchesPyTorch) {
  const auto names = cnn_cases("maxpool_");
  ASSERT_GE(names.size(), 4u);
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    const auto f = load_golden(name);
    const Pool2dParams p = pool_params(f);
    const auto r = ops::maxpool2d(cpu(), f.tensor("x"), p);
    // The max is one of the inputs: exact.
    EXPECT_TRUE(bitwise_equal(r.y, f.tensor("y")));
    // ties: PyTorch's first maximum (PyTorch saves flat positions; we save window offsets)
    EXPECT_EQ(flat_positions(r.indices, f.tensor("x").shape(), p), f.tensor("indices").to_ints());
    const Tensor dx = Tensor::full(f.tensor("x").shape(), std::nanf(""));
    cpu().maxpool2d_backward(f.tensor("dy"), r.indices, p, dx);
    EXPECT_ALL_CLOSE(dx, f.tensor("dx"), kRtol, kAtol);
  }
}

TEST(Pool, AvgPool2dMatchesPyTorch) {
  const auto names = cnn_cases("avgpool_");
  ASSERT_GE(names.size(), 3u);
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    const auto f = load_golden(name);
    const Pool2dParams p = pool_params(f);
    EXPECT_ALL_CLOSE(ops::avgpool2d(cpu(), f.tensor("x"), p), f.tensor("y"), kRtol, kAtol);
    const Tensor dx = Tensor::full(f.tensor("x").shape(), std::nanf(""));
    cpu().avgpool2d_backward(f.tensor("dy"), p, dx);
    EXPECT_ALL_CLOSE(dx, f.tensor("dx"), kRtol, kAtol);
  }
}

TEST(Pool, GlobalAvgPoolMatchesPyTorch) {
  const auto names = cnn_cases("global_avgpool_");
  ASSERT_GE(names.size(), 2u);
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    const auto f = load_golden(name);
    EXPECT_ALL_CLOSE(ops::global_avgpool(cpu(), f.tensor("x")), f.tensor("y"), kRtol, kAtol);
    const Tensor dx = Tensor::full(f.tensor("x").shape(), std::nanf(""));
    cpu().global_avgpool_backward(f.tensor("dy"), dx);
    EXPECT_ALL_CLOSE(dx, f.tensor("dx"), kRtol, kAtol);
  }
}

// ---- Finite differences (L = sum(dy * y)) -----------------------------------------------------

// Distinct values at least `gap` apart, shuffled: no ties, and a +-eps perturbation
// (eps < gap / 2) never changes which element is the maximum.
Tensor distinct_values(const Shape& s, uint32_t seed, float gap) {
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = gap * (static_cast<float>(i) - static_cast<float>(v.size()) / 2);
  std::mt19937 rng(seed);
  std::shuffle(v.begin(), v.end(), rng);
  return Tensor::from_vector(v, s);
}

TEST(Pool, GradientsMatchFiniteDifferences) {
  struct PoolCase {
    Shape x;
    Pool2dParams p;
  };
  auto pool = [](int kh, int kw, int sh, int sw, int ph, int pw) {
    Pool2dParams p;
    p.kernel_h = kh, p.kernel_w = kw, p.stride_h = sh, p.stride_w = sw, p.pad_h = ph, p.pad_w = pw;
    return p;
  };
  const std::vector<PoolCase> cases = {{Shape{2, 3, 8, 6}, pool(2, 2, 2, 2, 0, 0)},
                                       {Shape{2, 2, 7, 9}, pool(3, 3, 2, 2, 1, 1)},
                                       {Shape{1, 2, 5, 7}, pool(3, 2, 1, 2, 1, 1)}};
  uint32_t seed = 40;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.x.str());
    GradCheckOptions opt;
    opt.eps = 1e-2;
    const Tensor x = distinct_values(c.x, seed++, 0.05f);
    const auto r = ops::maxpool2d(cpu(), x, c.p);
    const Tensor dy = random_tensor(r.y.shape(), seed++);
    const Tensor dx = ops::empty_like(cpu(), x);
    cpu().maxpool2d_backward(dy, r.indices, c.p, dx);
    EXPECT_TRUE(check_gradient(
        "maxpool2d dx", x, dx, [&] { return dot(dy, ops::maxpool2d(cpu(), x, c.p).y); }, opt));

    const Tensor xa = random_tensor(c.x, seed++);
    const Tensor dya = random_tensor(r.y.shape(), seed++);
    const Tensor dxa = ops::empty_like(cpu(), xa);
    cpu().avgpool2d_backward(dya, c.p, dxa);
    EXPECT_TRUE(check_gradient("avgpool2d dx", xa, dxa, [&] { return dot(dya, ops::avgpool2d(cpu(), xa, c.p)); }));
  }
  const Tensor x = random_tensor(Shape{3, 4, 5, 3}, 50);
  const Tensor dy = random_tensor(Shape{3, 4}, 51);
  const Tensor dx = ops::empty_like(cpu(), x);
  cpu().global_avgpool_backward(dy, dx);
  EXPECT_TRUE(check_gradient("global_avgpool dx", x, dx, [&] { return dot(dy, ops::global_avgpool(cpu(), x)); }));
}

// ---- Pooling details --------------------------------------------------------------------------

TEST(Pool, MaxPoolTiesPaddingAndNaN) {
  Pool2dParams p;
  p.kernel_h = p.kernel_w = 2;
  p.stride_h = p.stride_w = 1;
  // Ties: the first maximum in scan order (row by row) wins.
  const Tensor x = Tensor::from_vector({1, 3, 3, 3, 2, 1}, Shape{1, 1, 2, 3});
  const auto r = ops::maxpool2d(cpu(), x, p);
  EXPECT_EQ(r.y.to_vector(), (std::vector<float>{3, 3}));
  EXPECT_EQ(r.indices.to_ints(), (std::vector<int32_t>{1, 0}));  // window offsets of position 1
  // Padding never wins, even over negative inputs.
  p.kernel_h = p.kernel_w = 3;
  p.pad_h = p.pad_w = 1;
  const Tensor neg = Tensor::from_vector({-5, -4, -3, -2}, Shape{1, 1, 2, 2});
  const auto rn = ops::maxpool2d(cpu(), neg, p);
  EXPECT_EQ(rn.y.to_vector(), (std::vector<float>{-2, -2, -2, -2}));
  EXPECT_EQ(flat_positions(rn.indices, neg.shape(), p), (std::vector<int32_t>{3, 3, 3, 3}));
  // NaN wins, the last one in scan order; all -inf picks the window's first input element
  // (both as PyTorch 1.13's max_pool2d).
  p.kernel_h = p.kernel_w = 2;
  p.pad_h = p.pad_w = 0;
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  const auto rnan = ops::maxpool2d(cpu(), Tensor::from_vector({1, nan, 3, nan, 2, 5}, Shape{1, 1, 2, 3}), p);
  EXPECT_TRUE(std::isnan(rnan.y.to_vector()[0]) && std::isnan(rnan.y.to_vector()[1]));
  EXPECT_EQ(rnan.indices.to_ints(), (std::vector<int32_t>{2, 0}));  // positions 3 and 1
  p.kernel_h = p.kernel_w = 3;
  p.pad_h = p.pad_w = 1;
  const auto rinf = ops::maxpool2d(cpu(), Tensor::full(Shape{1, 1, 2, 2}, -inf), p);
  EXPECT_EQ(rinf.y.to_vector(), (std::vector<float>(4, -inf)));
  EXPECT_EQ(flat_positions(rinf.indices, Shape{1, 1, 2, 2}, p), (std::vector<int32_t>{0, 0, 0, 0}));
  // Backward gathers every window's gradient at its maximum.
  const Tensor dy = Tensor::from_vector({1, 2, 3, 4}, Shape{1, 1, 2, 2});
  const Tensor dx = Tensor::full(neg.shape(), 99.0f);
  cpu().maxpool2d_backward(dy, rn.indices, p, dx);
  EXPECT_EQ(dx.to_vector(), (std::vector<float>{0, 0, 0, 10}));
}

// 2 x 2 windows of stride 2 (a vectorised path): ties, NaNs, infinities, widths that are
// odd (the last column dropped), below and above a vector of outputs, against the rule
// written out: the first maximum in scan order, or the window's last NaN.
TEST(Pool, MaxPool2x2Stride2MatchesTheRule) {
  Pool2dParams p;
  p.kernel_h = p.kernel_w = 2;
  p.stride_h = p.stride_w = 2;
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(5);
  for (const Shape& s : {Shape{1, 1, 2, 2}, Shape{2, 3, 9, 7}, Shape{2, 2, 10, 37}, Shape{1, 2, 4, 64}}) {
    SCOPED_TRACE(s.str());
    std::vector<float> v(static_cast<size_t>(s.numel()));
    const float pool[] = {-inf, -2.0f, -1.0f, 0.0f, 1.0f, 2.0f, inf, nan};
    for (auto& e : v) e = pool[rng() % 8];
    const auto r = ops::maxpool2d(cpu(), Tensor::from_vector(v, s), p);
    const auto y = r.y.to_vector();
    const auto idx = flat_positions(r.indices, s, p);
    const int64_t h = s[2], w = s[3], ph = h / 2, pw = w / 2;
    for (int64_t pl = 0; pl < s[0] * s[1]; ++pl)
      for (int64_t i = 0; i < ph; ++i)
        for (int64_t j = 0; j < pw; ++j) {
          int64_t best = 2 * i * w + 2 * j;
          for (int64_t a = 0; a < 2; ++a)
            for (int64_t b = 0; b < 2; ++b) {
              const int64_t at = (2 * i + a) * w + 2 * j + b;
              const float e = v[static_cast<size_t>(pl * h * w + at)], cur = v[static_cast<size_t>(pl * h * w + best)];
              if (std::isnan(e) || (!std::isnan(cur) && e > cur)) best = at;
            }
          const size_t o = static_cast<size_t>((pl * ph + i) * pw + j);
          ASSERT_EQ(idx[o], best) << "plane " << pl << " output (" << i << ", " << j << ")";
          const float want = v[static_cast<size_t>(pl * h * w + best)];
          EXPECT_TRUE(std::isnan(want) ? std::isnan(y[o]) : y[o] == want);
        }
  }
}

// The saved index is the offset r * kernel_w + c of the maximum within its window, from the
// window's top-left corner in padded coordinates; overlapping windows (stride < kernel)
// that share a maximum name it by different offsets, and backward adds both gradients.
TEST(Pool, MaxPoolIndexIsTheWindowOffset) {
  Pool2dParams p;
  p.kernel_h = p.kernel_w = 3;
  p.stride_h = p.stride_w = 2;
  p.pad_h = p.pad_w = 1;
  const Tensor x = Tensor::from_vector({1, 5, 2, 0,  //
                                        3, 4, 9, 6,  //
                                        7, 8, 0, 1},
                                       Shape{1, 1, 3, 4});
  const auto r = ops::maxpool2d(cpu(), x, p);
  EXPECT_EQ(r.indices.dtype(), DType::u8);
  EXPECT_EQ(r.y.to_vector(), (std::vector<float>{5, 9, 8, 9}));
  // Windows at padded (-1, -1), (-1, 1), (1, -1), (1, 1): the maxima (0, 1), (1, 2), (2, 1)
  // and (1, 2) again.
  EXPECT_EQ(r.indices.to_ints(), (std::vector<int32_t>{5, 7, 5, 1}));
  const Tensor dx = Tensor::full(x.shape(), 99.0f);
  cpu().maxpool2d_backward(Tensor::from_vector({1, 2, 3, 4}, Shape{1, 1, 2, 2}), r.indices, p, dx);
  EXPECT_EQ(dx.to_vector(), (std::vector<float>{0, 1, 0, 0, 0, 0, 6, 0, 0, 3, 0, 0}));

  // A 2 x 3 window (offsets r * 3 + c), stride 1 x 2, padding 1 x 1.
  p.kernel_h = 2, p.stride_h = 1;
  const auto r2 = ops::maxpool2d(cpu(), Tensor::from_vector({1, 2, 3, 6, 5, 4}, Shape{1, 1, 2, 3}), p);
  EXPECT_EQ(r2.y.to_vector(), (std::vector<float>{2, 3, 6, 5, 6, 5}));
  EXPECT_EQ(r2.indices.to_ints(), (std::vector<int32_t>{5, 4, 4, 3, 1, 0}));
}

// Backward against a direct loop: every window scanned for its first maximum, its gradient
// added there, the outputs in order (the same float sums): bitwise, windows of up to 256.
TEST(Pool, MaxPoolBackwardMatchesADirectLoop) {
  struct PoolCase {
    Shape x;
    int kh, kw, sh, sw, ph, pw;
  };
  uint32_t seed = 70;
  for (const PoolCase& c :
       {PoolCase{Shape{2, 3, 8, 6}, 2, 2, 2, 2, 0, 0}, PoolCase{Shape{2, 2, 9, 7}, 3, 3, 2, 2, 1, 1},
        PoolCase{Shape{1, 3, 7, 9}, 3, 2, 1, 2, 1, 1}, PoolCase{Shape{1, 2, 6, 5}, 4, 4, 1, 1, 2, 2},
        PoolCase{Shape{1, 2, 20, 18}, 16, 16, 3, 2, 8, 8}}) {
    SCOPED_TRACE(c.x.str() + " k" + std::to_string(c.kh) + "x" + std::to_string(c.kw));
    Pool2dParams p;
    p.kernel_h = c.kh, p.kernel_w = c.kw, p.stride_h = c.sh, p.stride_w = c.sw, p.pad_h = c.ph, p.pad_w = c.pw;
    // Few distinct values: many ties and shared maxima.
    std::vector<float> v(static_cast<size_t>(c.x.numel()));
    std::mt19937 rng(seed++);
    for (auto& e : v) e = static_cast<float>(rng() % 5);
    const auto r = ops::maxpool2d(cpu(), Tensor::from_vector(v, c.x), p);
    const Tensor dy = random_tensor(r.y.shape(), seed++);
    const Tensor dx = Tensor::full(c.x, std::nanf(""));
    cpu().maxpool2d_backward(dy, r.indices, p, dx);

    const int64_t h = c.x[2], w = c.x[3], P = r.y.size(2), Q = r.y.size(3);
    const auto g = dy.to_vector();
    const auto off = r.indices.to_ints();
    std::vector<float> want(v.size(), 0.0f);
    for (int64_t pl = 0; pl < c.x[0] * c.x[1]; ++pl)
      for (int64_t pp = 0; pp < P; ++pp)
        for (int64_t qq = 0; qq < Q; ++qq) {
          const int64_t h0 = pp * c.sh - c.ph, w0 = qq * c.sw - c.pw;
          int64_t best = -1;
          for (int64_t a = 0; a < c.kh; ++a)
            for (int64_t b = 0; b < c.kw; ++b) {
              const int64_t hh = h0 + a, ww = w0 + b;
              if (hh < 0 || hh >= h || ww < 0 || ww >= w) continue;
              if (best < 0 ||
                  v[static_cast<size_t>(pl * h * w + hh * w + ww)] > v[static_cast<size_t>(pl * h * w + best)])
                best = hh * w + ww;
            }
          const size_t o = static_cast<size_t>((pl * P + pp) * Q + qq);
          ASSERT_EQ(off[o], (best / w - h0) * c.kw + (best % w - w0)) << "output " << o;
          want[static_cast<size_t>(pl * h * w + best)] += g[o];
        }
    EXPECT_TRUE(bitwise_equal(dx, Tensor::from_vector(want, c.x)));
  }
}

// kernel_h * kernel_w above 256 does not fit a one-byte offset: both validators say so.
TEST(Pool, MaxPoolRejectsWindowsOver256) {
  Pool2dParams p;
  p.kernel_h = p.kernel_w = 17;
  const Tensor x = Tensor::zeros(Shape{1, 1, 20, 20});
  EXPECT_REMAT_ERROR(ops::maxpool2d(cpu(), x, p),
                     "maxpool2d_forward: kernel 17x17 has 289 positions; at most 256 (the saved index is one byte");
  EXPECT_REMAT_ERROR(
      cpu().maxpool2d_backward(Tensor::zeros(Shape{1, 1, 2, 2}),
                               Tensor::empty(Shape{1, 1, 2, 2}, Device::cpu(), DType::u8), p, Tensor::empty(x.shape())),
      "maxpool2d_backward: kernel 17x17 has 289 positions");
  p.kernel_w = 15;  // 255 positions
  EXPECT_EQ(ops::maxpool2d(cpu(), x, p).indices.dtype(), DType::u8);
}

TEST(Pool, MaxPoolBackwardRejectsBadIndices) {
  Pool2dParams p;  // 2 x 2, stride 2
  const Tensor dy = Tensor::from_vector({1, 2}, Shape{1, 1, 1, 2});
  const Tensor dx = Tensor::empty(Shape{1, 1, 2, 4});
  // Offset 4 is outside a 2 x 2 window.
  EXPECT_REMAT_ERROR(cpu().maxpool2d_backward(dy, Tensor::from_u8({0, 4}, Shape{1, 1, 1, 2}), p, dx),
                     "maxpool2d_backward: indices u8[1, 1, 1, 2] on cpu hold 4 at flat position 1");
  // Offset 0 of a padded 3 x 3 window is padding.
  p.kernel_h = p.kernel_w = 3;
  p.stride_h = p.stride_w = 1;
  p.pad_h = p.pad_w = 1;
  EXPECT_REMAT_ERROR(cpu().maxpool2d_backward(Tensor::zeros(Shape{1, 1, 2, 4}),
                                              Tensor::from_u8(std::vector<uint8_t>(8, 0), Shape{1, 1, 2, 4}), p, dx),
                     "maxpool2d_backward: indices u8[1, 1, 2, 4] on cpu hold 0 at flat position 0");
  // dy must be the pool of dx.
  EXPECT_REMAT_ERROR(cpu().maxpool2d_backward(dy, Tensor::from_u8({0, 0}, Shape{1, 1, 1, 2}), p, dx),
                     "maxpool2d_backward: dy f32[1, 1, 1, 2] on cpu: expected shape [1, 1, 2, 4]");
}

// ---- Determinism ------------------------------------------------------------------------------

struct PoolRun {
  Tensor ymax, idx, dxmax, yavg, dxavg, ygap, dxgap;
};

PoolRun run_pools(const Shape& s) {
  Pool2dParams p;
  p.kernel_h = p.kernel_w = 3;
  p.pad_h = p.pad_w = 1;
  const Tensor x = random_tensor(s, 100);
  PoolRun r;
  const auto m = ops::maxpool2d(cpu(), x, p);
  r.ymax = m.y, r.idx = m.indices;
  const Tensor dy = random_tensor(m.y.shape(), 101);
  r.dxmax = ops::empty_like(cpu(), x);
  cpu().maxpool2d_backward(dy, m.indices, p, r.dxmax);
  r.yavg = ops::avgpool2d(cpu(), x, p);
  r.dxavg = ops::empty_like(cpu(), x);
  cpu().avgpool2d_backward(dy, p, r.dxavg);
  r.ygap = ops::global_avgpool(cpu(), x);
  r.dxgap = ops::empty_like(cpu(), x);
  cpu().global_avgpool_backward(random_tensor(r.ygap.shape(), 102), r.dxgap);
  return r;
}

void expect_same(const PoolRun& a, const PoolRun& b) {
  for (auto m : {&PoolRun::ymax, &PoolRun::idx, &PoolRun::dxmax, &PoolRun::yavg, &PoolRun::dxavg, &PoolRun::ygap,
                 &PoolRun::dxgap})
    EXPECT_TRUE(bitwise_equal(a.*m, b.*m));
}

const Shape kDetPool{4, 6, 41, 37};

TEST(Pool, RunToRunBitwiseEqual) { expect_same(run_pools(kDetPool), run_pools(kDetPool)); }

// Any thread count gives the same bits: every output is computed by one thread in a fixed
// order.
TEST(Pool, ThreadCountDoesNotChangeResults) {
  ThreadCount restore;
  omp_set_num_threads(1);
  const PoolRun p1 = run_pools(kDetPool);
  for (int threads : {2, 3}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    omp_set_num_threads(threads);
    expect_same(p1, run_pools(kDetPool));
  }
}

// ---- Errors -------------------------------------------------------------------------------------

TEST(Pool, BadArgumentsNameTheOpAndShapes) {
  Backend& be = cpu();
  Pool2dParams p;
  EXPECT_REMAT_ERROR(ops::maxpool2d(be, Tensor::zeros(Shape{3, 8, 8}), p), "expected rank 4");
  p.kernel_h = p.kernel_w = 5;
  EXPECT_REMAT_ERROR(ops::avgpool2d(be, Tensor::zeros(Shape{1, 1, 4, 8}), p),
                     "kernel 5x5 is larger than the padded input [1, 1, 4, 8]");
  const Tensor xi = Tensor::empty(Shape{1, 2, 4, 4}, Device::cpu(), DType::i32);
  p.kernel_h = p.kernel_w = 2;
  EXPECT_REMAT_ERROR(be.maxpool2d_forward(xi, p, Tensor::empty(Shape{1, 2, 2, 2}),
                                          Tensor::empty(Shape{1, 2, 2, 2}, Device::cpu(), DType::u8)),
                     "maxpool2d_forward: x i32[1, 2, 4, 4] on cpu: expected dtype f32");
  EXPECT_REMAT_ERROR(be.global_avgpool_forward(Tensor::zeros(Shape{2, 3, 4, 4}), Tensor::empty(Shape{2, 4})),
                     "global_avgpool_forward: y f32[2, 4] on cpu: expected shape [2, 3]");
}

// ---- bf16 ----------------------------------------------------------------------------------

TEST(Pool, Bf16MatchesPyTorch) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  const Pool2dParams maxp{2, 2, 2, 2, 0, 0}, avgp{3, 3, 2, 2, 1, 1};
  {
    auto f = load_golden("bf16_ops/maxpool");
    std::printf("  maxpool\n");
    Tensor x = bf16_in(f, "x"), y = bf16_empty(f.tensor("y").shape()), dx = bf16_empty(x.shape());
    Tensor idx = Tensor::empty(y.shape(), Device::cpu(), DType::u8);
    cpu().maxpool2d_forward(x, maxp, y, idx);
    expect_bf16_golden(f, "y", y, 0, 0);
    cpu().maxpool2d_backward(bf16_in(f, "dy"), idx, maxp, dx);
    expect_bf16_golden(f, "dx", dx, 0, 0);
  }
  {
    auto f = load_golden("bf16_ops/avgpool");
    std::printf("  avgpool\n");
    Tensor x = bf16_in(f, "x"), y = bf16_empty(f.tensor("y").shape()), dx = bf16_empty(x.shape());
    cpu().avgpool2d_forward(x, avgp, y);
    expect_bf16_golden(f, "y", y, 0, 1);
    cpu().avgpool2d_backward(bf16_in(f, "dy"), avgp, dx);
    expect_bf16_golden(f, "dx", dx, 0, 12);  // PyTorch adds overlapping windows' shares in bf16
  }
  {
    auto f = load_golden("bf16_ops/global_avgpool");
    std::printf("  global_avgpool\n");
    Tensor x = bf16_in(f, "x"), y = bf16_empty(f.tensor("y").shape()), dx = bf16_empty(x.shape());
    cpu().global_avgpool_forward(x, y);
    expect_bf16_golden(f, "y", y, 0, 2);
    cpu().global_avgpool_backward(bf16_in(f, "dy"), dx);
    expect_bf16_golden(f, "dx", dx, 0, 1);
  }
}

TEST(Pool, Bf16AreTheRoundedFp32Ops) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  const int64_t N = 5, C = 6, H = 10, W = 12;
  Bf16Pair x = random_pair(Shape{N, C, H, W}, 20);
  for (const Pool2dParams pp : {Pool2dParams{}, Pool2dParams{3, 3, 2, 2, 1, 1}}) {
    const int64_t P = (H + 2 * pp.pad_h - pp.kernel_h) / pp.stride_h + 1;
    const int64_t Q = (W + 2 * pp.pad_w - pp.kernel_w) / pp.stride_w + 1;
    Bf16Pair py = empty_pair(Shape{N, C, P, Q});
    Tensor idf = Tensor::empty(Shape{N, C, P, Q}, Device::cpu(), DType::u8);
    Tensor idh = Tensor::empty(Shape{N, C, P, Q}, Device::cpu(), DType::u8);
    cpu().maxpool2d_forward(x.f, pp, py.f, idf);
    cpu().maxpool2d_forward(x.h, pp, py.h, idh);
    expect_rounded(py, "maxpool2d_forward");
    EXPECT_EQ(idf.to_ints(), idh.to_ints());
    Bf16Pair pdy = random_pair(Shape{N, C, P, Q}, 24), dx = empty_pair(Shape{N, C, H, W});
    cpu().maxpool2d_backward(pdy.f, idf, pp, dx.f);
    cpu().maxpool2d_backward(pdy.h, idh, pp, dx.h);
    expect_rounded(dx, "maxpool2d_backward");
    cpu().avgpool2d_forward(x.f, pp, py.f);
    cpu().avgpool2d_forward(x.h, pp, py.h);
    expect_rounded(py, "avgpool2d_forward");
    cpu().avgpool2d_backward(pdy.f, pp, dx.f);
    cpu().avgpool2d_backward(pdy.h, pp, dx.h);
    expect_rounded(dx, "avgpool2d_backward");
  }
  Bf16Pair g = empty_pair(Shape{N, C});
  cpu().global_avgpool_forward(x.f, g.f);
  cpu().global_avgpool_forward(x.h, g.h);
  expect_rounded(g, "global_avgpool_forward");
  Bf16Pair gdy = random_pair(Shape{N, C}, 25), gdx = empty_pair(Shape{N, C, H, W});
  cpu().global_avgpool_backward(gdy.f, gdx.f);
  cpu().global_avgpool_backward(gdy.h, gdx.h);
  expect_rounded(gdx, "global_avgpool_backward");
}

}  // namespace
}  // namespace remat::test
