// Rotary position embeddings of the CPU backend (src/backends/cpu/rope.cpp) against PyTorch
// goldens (tools/reference/golden/transformer.py: Hugging Face Llama's rotate_half form in
// float64, differentiated by autograd; bf16: tools/reference/golden/bf16_ops.py), finite
// differences of L = sum(dy * y), the rotation's inverse, in place, bad arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ops/op_test.h"
#include "remat/backend.h"
#include "support/expect_error.h"
#include "support/golden.h"
#include "support/gradcheck.h"

namespace remat::test {
namespace {

// Tolerances (|actual - expected| <= atol + rtol * |expected|), against float64 references:
// y and dx rtol 1e-5, atol 1e-6: remat rounds each output once from double math (angles
// included), so the error is the float rounding of O(1) values.

RopeParams params_of(const SafetensorsFile& f) {
  RopeParams p;
  p.heads = static_cast<int>(meta_int(f, "heads"));
  p.rotated = static_cast<int>(meta_int(f, "rotated"));
  p.theta = meta_float(f, "theta");
  return p;
}

TEST(Rope, MatchesPyTorch) {
  const auto cases = transformer_cases("rope");
  ASSERT_GE(cases.size(), 3u);  // the loop must not pass vacuously
  for (const auto& name : cases) {
    SCOPED_TRACE(name);
    const auto f = load_golden(name);
    const RopeParams p = params_of(f);
    const Tensor x = f.tensor("x"), dy = f.tensor("dy");
    const Tensor y = Tensor::full(x.shape(), std::numeric_limits<float>::quiet_NaN());
    cpu().rope_forward(x, p, y);
    EXPECT_ALL_CLOSE(y, f.tensor("y"), 1e-5, 1e-6);
    const Tensor dx = Tensor::full(x.shape(), std::numeric_limits<float>::quiet_NaN());
    cpu().rope_backward(dy, p, dx);
    EXPECT_ALL_CLOSE(dx, f.tensor("dx"), 1e-5, 1e-6);
    // In place (remat/backend_ops.def): the same bits.
    const Tensor x2 = x.clone(), dy2 = dy.clone();
    cpu().rope_forward(x2, p, x2);
    cpu().rope_backward(dy2, p, dy2);
    EXPECT_TRUE(bitwise_equal(x2, y));
    EXPECT_TRUE(bitwise_equal(dy2, dx));
  }
}

TEST(Rope, GradientsMatchFiniteDifferences) {
  const RopeParams p{5, 3, 10000.0, {}};
  const Tensor x = random_tensor(Shape{2, 6, 5 * 8}, 1, -2.0f, 2.0f), dy = random_tensor(x.shape(), 2);
  const Tensor dx = Tensor::empty(x.shape());
  cpu().rope_backward(dy, p, dx);
  auto loss = [&] {
    const Tensor y = Tensor::empty(x.shape());
    cpu().rope_forward(x, p, y);
    return dot(dy, y);
  };
  EXPECT_TRUE(check_gradient("rope dx", x, dx, loss));
}

// A rotation: backward (the inverse) undoes forward to float rounding, and position 0
// turns by nothing (its outputs are its inputs, bit for bit).
TEST(Rope, BackwardUndoesForwardAndPositionZeroStays) {
  const RopeParams p{4, 4, 500000.0, {}};
  const Tensor x = random_tensor(Shape{2, 33, 4 * 12}, 3, -3.0f, 3.0f), y = Tensor::empty(x.shape());
  const Tensor back = Tensor::empty(x.shape());
  cpu().rope_forward(x, p, y);
  cpu().rope_backward(y, p, back);
  EXPECT_ALL_CLOSE(back, x, 1e-6, 1e-6);
  const auto xs = x.to_vector(), ys = y.to_vector();
  const int64_t c = x.size(2), t = x.size(1);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t j = 0; j < c; ++j)
      EXPECT_EQ(ys[static_cast<size_t>(b * t * c + j)], xs[static_cast<size_t>(b * t * c + j)]);
}

// Long-context scaling (remat/rope.h) against the frequencies written out here as Hugging
// Face's _compute_llama3_parameters computes them (vectorised: the low band divided, the
// medium band blended), for Llama 3.1's factors with the original context shortened to 64
// so that the three bands all hold pairs of d 64 at theta 10000.
TEST(Rope, Llama3AndLinearScalingMatchTheirFormulas) {
  const int64_t b = 1, t = 40, heads = 3, d = 64, half = d / 2;
  const Tensor x = random_tensor(Shape{b, t, heads * d}, 5, -2.0f, 2.0f);
  const auto xs = x.to_vector();
  const double theta = 10000.0, factor = 8.0, low = 1.0, high = 4.0, original = 64.0;
  std::vector<double> f(half);
  int bands[3] = {0, 0, 0};
  for (int64_t i = 0; i < half; ++i) {
    const double inv = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(d));
    const double wavelen = 2.0 * 3.141592653589793 / inv;
    const double divided = wavelen > original / low ? inv / factor : inv;
    const double smooth = (original / wavelen - low) / (high - low);
    const bool medium = !(wavelen < original / high) && !(wavelen > original / low);
    f[static_cast<size_t>(i)] = medium ? (1.0 - smooth) * divided / factor + smooth * divided : divided;
    ++bands[medium ? 1 : wavelen > original / low ? 2 : 0];
  }
  ASSERT_TRUE(bands[0] > 0 && bands[1] > 0 && bands[2] > 0) << bands[0] << " " << bands[1] << " " << bands[2];
  auto reference = [&](const std::vector<double>& freq) {
    std::vector<float> y(xs.size());
    for (int64_t r = 0; r < t; ++r)
      for (int64_t h = 0; h < heads; ++h) {
        const size_t at = static_cast<size_t>(r * heads * d + h * d);
        for (int64_t i = 0; i < half; ++i) {
          const double a = static_cast<double>(r) * freq[static_cast<size_t>(i)];
          const double u = xs[at + i], v = xs[at + i + half];
          y[at + i] = h < 2 ? static_cast<float>(u * std::cos(a) - v * std::sin(a)) : xs[at + i];
          y[at + i + half] = h < 2 ? static_cast<float>(v * std::cos(a) + u * std::sin(a)) : xs[at + i + half];
        }
      }
    return y;
  };
  RopeParams p{heads, 2, theta, {RopeScalingType::llama3, factor, low, high, original}};
  const Tensor y = Tensor::empty(x.shape());
  cpu().rope_forward(x, p, y);
  EXPECT_ALL_CLOSE(y, Tensor::from_vector(reference(f), x.shape()), 1e-6, 1e-6);

  // Linear: every frequency divided by the factor.
  p.scaling = RopeScaling{RopeScalingType::linear, 2.5, 1.0, 4.0, 8192.0};
  std::vector<double> lin(half);
  for (int64_t i = 0; i < half; ++i)
    lin[static_cast<size_t>(i)] = std::pow(theta, -static_cast<double>(2 * i) / static_cast<double>(d)) / 2.5;
  cpu().rope_forward(x, p, y);
  EXPECT_ALL_CLOSE(y, Tensor::from_vector(reference(lin), x.shape()), 1e-6, 1e-6);
  // Backward is still forward's inverse.
  const Tensor back = Tensor::empty(x.shape());
  cpu().rope_backward(y, p, back);
  EXPECT_ALL_CLOSE(back, x, 1e-6, 1e-6);

  EXPECT_REMAT_ERROR(cpu().rope_forward(x, RopeParams{heads, 2, theta, {RopeScalingType::linear, 0.0, 1, 4, 8192}}, y),
                     "rope_forward: scaling factor must be positive");
  EXPECT_REMAT_ERROR(cpu().rope_forward(x, RopeParams{heads, 2, theta, {RopeScalingType::llama3, 8.0, 4, 4, 8192}}, y),
                     "rope_forward: llama3 scaling needs 0 < low_freq_factor < high_freq_factor");
}

TEST(Rope, BadArgumentsNameTheOpAndShapes) {
  const Tensor x = random_tensor(Shape{2, 3, 12}, 1), y = Tensor::empty(Shape{2, 3, 12});
  EXPECT_REMAT_ERROR(cpu().rope_forward(x, RopeParams{3, 2, 10000.0, {}}, Tensor::empty(Shape{2, 3, 11})),
                     "rope_forward: x f32[2, 3, 12] on cpu and y f32[2, 3, 11] on cpu must have the same shape");
  EXPECT_REMAT_ERROR(cpu().rope_forward(x, RopeParams{5, 2, 10000.0, {}}, y),
                     "rope_forward: x's last size 12 is not 5 heads of an even size");
  EXPECT_REMAT_ERROR(cpu().rope_forward(x, RopeParams{4, 2, 10000.0, {}}, y),
                     "rope_forward: x's last size 12 is not 4 heads of an even size");
  EXPECT_REMAT_ERROR(cpu().rope_backward(x, RopeParams{2, 3, 10000.0, {}}, y),
                     "rope_backward: heads 2 and rotated 3: expected 0 <= rotated <= heads");
  EXPECT_REMAT_ERROR(cpu().rope_forward(x, RopeParams{2, 2, 0.0, {}}, y), "rope_forward: theta must be positive");
  EXPECT_REMAT_ERROR(
      cpu().rope_forward(random_tensor(Shape{6, 12}, 1), RopeParams{2, 2, 10000.0, {}}, Tensor::empty(Shape{6, 12})),
      "rope_forward: x");
}

// ---- bf16 ----------------------------------------------------------------------------------

TEST(Rope, Bf16MatchesPyTorch) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  auto r = load_golden("bf16_ops/rope");
  const RopeParams p = params_of(r);
  const Tensor x = bf16_in(r, "x");
  Tensor y = bf16_empty(x.shape()), dx = bf16_empty(x.shape());
  cpu().rope_forward(x, p, y);
  // From the fp32 op: double math rounded to float, then to bf16, against fp32 math rounded
  // to bf16: at most a rounding tie apart. Hugging Face's bf16 path rounds cos and sin to
  // bf16 before multiplying, then each product and their sum: where a pair nearly cancels,
  // that is a few bf16 steps of the larger product, tens of ulps against err_ulps' floor
  // (max/64); measured 19 (y) and 16 (dx).
  expect_bf16_golden(r, "y", y, 1, 32);
  cpu().rope_backward(bf16_in(r, "dy"), p, dx);
  expect_bf16_golden(r, "dx", dx, 1, 32);
}

TEST(Rope, Bf16IsTheRoundedFp32Op) {
  ActivationDTypeScope bf16_activations(DType::bf16);
  const Shape s{3, 7, 3 * 10};
  const RopeParams p{3, 2, 10000.0, {}};
  Bf16Pair x = random_pair(s, 21), y = empty_pair(s);
  cpu().rope_forward(x.f, p, y.f);
  cpu().rope_forward(x.h, p, y.h);
  expect_rounded(y, "rope_forward");
  Bf16Pair dy = random_pair(s, 22), dx = empty_pair(s);
  cpu().rope_backward(dy.f, p, dx.f);
  cpu().rope_backward(dy.h, p, dx.h);
  expect_rounded(dx, "rope_backward");
}

}  // namespace
}  // namespace remat::test
