// The CPU backend's AVX2 and AVX-512 paths (src/backends/cpu/simd.h) against its baseline
// code: the same bits for every op that has them (elementwise, dropout, attention,
// layernorm, max-pool, AdamW, batchnorm, the direct convolution), on inputs with odd
// lengths (vector tails), special values and unaligned Philox offsets. Levels this CPU
// lacks are skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/conv_internal.h"
#include "backends/cpu/philox_cpu.h"
#include "backends/cpu/simd.h"
#include "remat/backend.h"
#include "remat/ops.h"
#include "remat/philox.h"
#include "support/golden.h"

using remat::Backend;
using remat::Device;
using remat::Shape;
using remat::Tensor;
using remat::cpu::Simd;
using remat::test::bitwise_equal;
using remat::test::random_tensor;
namespace ops = remat::ops;

namespace {

Backend& cpu() { return remat::backend_for(Device::cpu()); }

// The levels above the baseline that this CPU runs.
std::vector<Simd> vector_levels() {
  std::vector<Simd> out;
  for (Simd s : {Simd::avx2, Simd::avx512})
    if (static_cast<int>(s) <= static_cast<int>(remat::cpu::detected_simd())) out.push_back(s);
  return out;
}

// Restores the level on scope exit.
struct SimdLimit {
  explicit SimdLimit(Simd s) { remat::cpu::set_simd_limit(s); }
  ~SimdLimit() { remat::cpu::set_simd_limit(Simd::avx512); }
};

// run() at the baseline and at every vector level: every tensor it returns is bitwise the
// baseline's.
void expect_paths_agree(const std::string& what, const std::function<std::vector<Tensor>()>& run) {
  if (vector_levels().empty()) GTEST_SKIP() << "this CPU has no AVX2";
  std::vector<Tensor> base;
  {
    SimdLimit l(Simd::baseline);
    base = run();
  }
  for (Simd s : vector_levels()) {
    SimdLimit l(s);
    const std::vector<Tensor> got = run();
    ASSERT_EQ(got.size(), base.size());
    for (size_t k = 0; k < got.size(); ++k)
      EXPECT_TRUE(bitwise_equal(got[k], base[k])) << what << ": tensor " << k << " at " << remat::cpu::simd_name(s);
  }
}

// Uniform values in [-lo, lo] with special values sprinkled in: NaN, infinities, signed
// zeros, a denormal, values past the exp clamps and around the GELU's bend.
Tensor with_specials(int64_t n, uint32_t seed, float lo) {
  std::vector<float> v = random_tensor({n}, seed, -lo, lo).to_vector();
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            0.0f,
                            -0.0f,
                            1e-40f,
                            -1e-40f,
                            100.0f,
                            -100.0f,
                            44.0f,
                            -44.0f,
                            9.0f,
                            -9.0f,
                            3.0e38f,
                            -3.0e38f};
  for (size_t k = 0; k < sizeof specials / sizeof specials[0]; ++k) v[(k * 7919) % v.size()] = specials[k];
  return Tensor::from_vector(v, {n});
}

}  // namespace

TEST(SimdPaths, PhiloxBlocksMatchTheScalarGenerator) {
  // Block indices whose 16-bit and 48-bit counter fields carry inside a vector.
  for (uint64_t b0 :
       {uint64_t{0}, uint64_t{0xfff9}, (uint64_t{1} << 48) - 11, ~uint64_t{0} - 20, uint64_t{123456789}}) {
    for (Simd s : {Simd::baseline, Simd::avx2, Simd::avx512}) {
      if (static_cast<int>(s) > static_cast<int>(remat::cpu::detected_simd())) continue;
      SimdLimit l(s);
      std::vector<uint32_t> words(4 * 37);
      remat::cpu::philox_blocks(0x1234abcd5678ef01ull, b0, 37, words.data());
      for (int64_t b = 0; b < 37; ++b) {
        const remat::philox::Bits4 want = remat::philox::block(0x1234abcd5678ef01ull, b0 + static_cast<uint64_t>(b));
        const uint32_t w4[4] = {want.x, want.y, want.z, want.w};
        for (int c = 0; c < 4; ++c)
          ASSERT_EQ(words[static_cast<size_t>(4 * b + c)], w4[c])
              << remat::cpu::simd_name(s) << " b0 " << b0 << " block " << b;
      }
    }
  }
}

TEST(SimdPaths, ElementwiseOpsAreBitwiseTheBaseline) {
  for (int64_t n : {int64_t{1}, int64_t{15}, int64_t{17}, int64_t{1000}, int64_t{70001}}) {
    const Tensor x = with_specials(n, 1, 6.0f);
    const Tensor dy = random_tensor(x.shape(), 2);
    expect_paths_agree("elementwise n=" + std::to_string(n), [&] {
      std::vector<Tensor> out;
      for (remat::GeluApprox a : {remat::GeluApprox::none, remat::GeluApprox::tanh}) {
        Tensor y = Tensor::empty(x.shape()), dx = Tensor::empty(x.shape());
        cpu().gelu_forward(x, a, y);
        cpu().gelu_backward(dy, x, a, dx);
        out.push_back(y);
        out.push_back(dx);
      }
      Tensor r = Tensor::empty(x.shape()), dr = Tensor::empty(x.shape()), s = Tensor::empty(x.shape());
      cpu().relu_forward(x, r);
      cpu().relu_backward(dy, x, dr);
      cpu().add(x, dy, s);
      out.insert(out.end(), {r, dr, s});
      return out;
    });
  }
}

TEST(SimdPaths, DropoutIsBitwiseTheBaseline) {
  const Tensor x = with_specials(100003, 3, 2.0f);
  for (uint64_t offset : {uint64_t{0}, uint64_t{4}, uint64_t{6}, uint64_t{1023}}) {
    for (float p : {0.1f, 0.5f, 0.9999f}) {
      expect_paths_agree("dropout offset " + std::to_string(offset) + " p " + std::to_string(p), [&] {
        Tensor y = Tensor::empty(x.shape()), dx = Tensor::empty(x.shape());
        cpu().dropout_forward(x, p, {77, offset}, y);
        cpu().dropout_backward(x, p, {77, offset}, dx);
        return std::vector<Tensor>{y, dx};
      });
    }
  }
}

TEST(SimdPaths, AttentionIsBitwiseTheBaseline) {
  // T = 37 leaves vector tails in every row; T = 64 has whole vectors only.
  for (int64_t t : {int64_t{37}, int64_t{64}}) {
    for (bool causal : {true, false}) {
      const int64_t b = 2, c = 32;
      const remat::AttentionParams p{4, causal, 0.2f};
      const Tensor qkv = random_tensor({b, t, 3 * c}, 4, -2.0f, 2.0f), dout = random_tensor({b, t, c}, 5);
      expect_paths_agree("attention T=" + std::to_string(t) + (causal ? " causal" : " full"), [&] {
        auto r = ops::attention(cpu(), qkv, p, {11, 8});
        Tensor probs_only = ops::attention_probs(cpu(), qkv, p);
        Tensor dqkv = ops::attention_backward(cpu(), dout, qkv, r.probs, p, {11, 8});
        return std::vector<Tensor>{r.out, r.probs, probs_only, dqkv};
      });
    }
  }
}

TEST(SimdPaths, LayerNormForwardIsBitwiseTheBaseline) {
  // Rows of 1, 7, 8, 37 and 128 channels: whole vectors, tails, a row shorter than one.
  for (int64_t c : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{37}, int64_t{128}}) {
    const Tensor x = random_tensor({5, 3, c}, 6, -3.0f, 3.0f), g = random_tensor({c}, 7), b = random_tensor({c}, 8);
    expect_paths_agree("layernorm C=" + std::to_string(c), [&] {
      auto r = ops::layernorm(cpu(), x, g, b);
      return std::vector<Tensor>{r.y, r.mean, r.invstd};
    });
  }
}

namespace {

// Values with ties, infinities and NaNs (for max-pooling's selection rules).
Tensor awkward(const Shape& s, uint32_t seed) {
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  const float pool[] = {-inf, -2.0f, -0.5f, 0.0f, 0.25f, 1.0f, 3.0f, inf, nan};
  std::mt19937 rng(seed);
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (auto& e : v) e = rng() % 4 == 0 ? pool[rng() % 9] : static_cast<float>(rng() % 1000) / 500.0f - 1.0f;
  return Tensor::from_vector(v, s);
}

}  // namespace

TEST(SimdPaths, MaxPool2x2IsBitwiseTheBaseline) {
  remat::Pool2dParams p;
  p.kernel_h = p.kernel_w = 2;
  p.stride_h = p.stride_w = 2;
  for (const Shape& s : {Shape{2, 3, 10, 37}, Shape{1, 2, 6, 64}}) {
    const Tensor x = awkward(s, 3);
    expect_paths_agree("maxpool2x2 " + s.str(), [&] {
      const auto r = ops::maxpool2d(cpu(), x, p);
      return std::vector<Tensor>{r.y, r.indices};
    });
  }
}

TEST(SimdPaths, AdamWIsBitwiseTheBaseline) {
  expect_paths_agree("adamw", [] {
    Tensor w = random_tensor(Shape{1013}, 3), m = Tensor::zeros(Shape{1013}), v = Tensor::zeros(Shape{1013});
    remat::AdamWParams p;
    p.weight_decay = 0.1;
    for (int step = 1; step <= 3; ++step) cpu().adamw_step(w, random_tensor(Shape{1013}, 10 + step), m, v, p, step);
    return std::vector<Tensor>{w, m, v};
  });
}

TEST(SimdPaths, BatchNormAndItsSumsAreBitwiseTheBaseline) {
  for (const Shape& s : {Shape{3, 4, 7, 9}, Shape{2, 3, 16, 16}}) {  // planes of 63 (a tail) and 256
    const Tensor x = random_tensor(s, 4, -2.0f, 3.0f), dy = random_tensor(s, 5);
    const Tensor gamma = random_tensor(Shape{s[1]}, 6), beta = random_tensor(Shape{s[1]}, 7);
    expect_paths_agree("batchnorm " + s.str(), [&] {
      Tensor rm = Tensor::zeros(Shape{s[1]}), rv = Tensor::full(Shape{s[1]}, 1.0f);
      const auto f = ops::batchnorm2d_train(cpu(), x, gamma, beta, rm, rv, remat::BatchNormParams{}, true);
      Tensor dx = Tensor::empty(s), dg = Tensor::zeros(Shape{s[1]}), db = Tensor::zeros(Shape{s[1]});
      cpu().batchnorm2d_backward(dy, x, gamma, f.mean, f.invstd, dx, dg, db);
      Tensor ye = Tensor::empty(s);
      cpu().batchnorm2d_forward_eval(x, gamma, beta, rm, rv, remat::BatchNormParams{}, ye);
      return std::vector<Tensor>{f.y, f.mean, f.invstd, rm, rv, dx, dg, db, ye, ops::global_avgpool(cpu(), x)};
    });
  }
}

// The direct convolution path's transposed stores and dy^T (and the bias gradient's sums).
TEST(SimdPaths, Conv2dDirectIsBitwiseTheBaseline) {
  const remat::cpu_conv::Path saved = remat::cpu_conv::path();
  remat::cpu_conv::set_path(remat::cpu_conv::Path::direct);
  remat::Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  const Shape xs{3, 8, 9, 11}, ws{16, 8, 3, 3};
  const Tensor x = random_tensor(xs, 8), w = random_tensor(ws, 9, -0.5f, 0.5f), b = random_tensor(Shape{16}, 10);
  expect_paths_agree("conv2d direct", [&] {
    Tensor y = ops::conv2d(cpu(), x, w, b, p);
    Tensor dw = Tensor::zeros(ws), db = Tensor::zeros(Shape{16});
    Tensor dx = ops::conv2d_backward(cpu(), y, x, w, p, true, dw, db);
    return std::vector<Tensor>{y, dx, dw, db};
  });
  remat::cpu_conv::set_path(saved);
}

TEST(VectorMath, MatchesLibmAndPropagatesNan) {
  // The CPU backend's branch-free exp/tanh/erf (src/backends/cpu/vmath.h) against libm.
  Tensor x = Tensor::from_vector({-100.0f, -87.0f, -20.0f, -1.5f, -1e-3f, 0.0f, 1e-3f, 0.5f, 3.0f, 20.0f, 80.0f,
                                  std::numeric_limits<float>::quiet_NaN()},
                                 {12});
  Tensor y = ops::softmax(cpu(), x.reshape({12, 1}));  // exp(x - x) per row: 1, or NaN
  const auto yv = y.to_vector();
  for (size_t i = 0; i + 1 < yv.size(); ++i) EXPECT_EQ(yv[i], 1.0f) << i;
  EXPECT_TRUE(std::isnan(yv.back()));
  Tensor g = ops::gelu(cpu(), x, remat::GeluApprox::tanh);
  Tensor ge = ops::gelu(cpu(), x, remat::GeluApprox::none);
  const auto gv = g.to_vector(), gev = ge.to_vector(), xv = x.to_vector();
  for (size_t i = 0; i + 1 < xv.size(); ++i) {
    const double v = xv[i];
    const double t = 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    const double e = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    EXPECT_NEAR(gv[i], t, 1e-6 + 1e-6 * std::fabs(t)) << v;
    EXPECT_NEAR(gev[i], e, 1e-6 + 1e-6 * std::fabs(e)) << v;
  }
  EXPECT_TRUE(std::isnan(gv.back()));
  EXPECT_TRUE(std::isnan(gev.back()));
}
