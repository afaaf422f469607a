// Elementwise ops: add, accumulate, scale, ReLU, GELU (erf and tanh forms), dropout.
//
// Each op runs twice per size: into a guarded output (a view 67 floats into its storage,
// so not 16-byte aligned: the kernels' scalar path, with the guards checked) and into a
// plain aligned tensor (the float4 path, n / 4 float4s and the n % 4 tail). Sizes: 1, 3,
// 4, 1001, 4099, and one above 4096 blocks x 256 threads x 4 so that the grid-stride loops
// go round more than once.
//
// Tolerances: add, scale, ReLU and dropout are one rounding of the same fp32 operation on
// both sides (dropout's mask is the same Philox bits), so they must be bitwise equal. GELU
// uses libm-grade erff/tanhf/expf on the device and the CPU backend's vectorisable
// approximations (vmath.h: erf and tanh within 2e-7 absolute, exp within 2 ulp), so
// 1e-6 absolute + 1e-5 relative: about 0.5 |x| * 2e-7 plus a few ulps for |x| <= 6.
// Except the tanh form's backward, 1e-5 absolute: its 0.5 x (1 - t^2) sqrt(2/pi)
// (1 + 3 kappa x^2) term multiplies tanh's absolute error near +-1 (~3e-7 between the two
// sides) by up to ~10 at |x| ~ 5, where 1 - t^2 is all cancellation.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend_ops/harness.h"

namespace remat::test {

namespace {

const std::vector<int64_t> kSizes = {1, 3, 4, 1001, 4096 + 3};
constexpr int64_t kLarge = 4096 * 256 * 4 + 4 * 1000 + 1;  // more than one grid-stride round

bool aligned16(const Tensor& x) { return reinterpret_cast<uintptr_t>(x.f32()) % 16 == 0; }

// An output the kernels see 16-byte aligned: plain storage, NaN until written.
Pair aligned_output(OpCheck& t, const Shape& s) {
  Pair p = t.values(std::vector<float>(static_cast<size_t>(s.numel()), std::numeric_limits<float>::quiet_NaN()), s);
  EXPECT_TRUE(aligned16(p.dut)) << "the float4 path is not exercised";
  return p;
}

// Both outputs of `op` (guarded, misaligned, and aligned) compared with the CPU.
template <typename Op>
void check_both_paths(OpCheck& t, const Shape& s, double atol, double rtol, const std::string& what, Op op) {
  auto y = t.output(s);
  auto y_aligned = aligned_output(t, s);
  t.run([&](Backend& be, Side side) {
    op(be, side, side(y));
    op(be, side, side(y_aligned));
  });
  t.expect_close(y, atol, rtol, what + " n=" + std::to_string(s.numel()));
  t.expect_close(y_aligned, atol, rtol, what + " (aligned) n=" + std::to_string(s.numel()));
}

std::vector<float> uniform_host(OpCheck& t, int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(t.rng());
  return v;
}

// Uniform in [-6, 6) with zeros, tiny values and saturating ones mixed in.
std::vector<float> gelu_inputs(OpCheck& t, int64_t n) {
  std::vector<float> v = uniform_host(t, n, -6.0f, 6.0f);
  const float special[] = {0.0f, -0.0f, 1e-20f, -1e-20f, 10.0f, -10.0f, 30.0f, -30.0f};
  for (size_t i = 0; i < sizeof special / sizeof special[0] && i < v.size(); ++i) v[i * 7 % v.size()] = special[i];
  return v;
}

}  // namespace

REMAT_OP_CASE(elementwise, add) {
  for (int64_t n : kSizes) {
    auto a = t.uniform({n}), b = t.uniform({n});
    check_both_paths(t, {n}, 0, 0, "add", [&](Backend& be, Side s, const Tensor& y) { be.add(s(a), s(b), y); });
  }
}

REMAT_OP_CASE(elementwise, add_large_and_in_place) {
  auto a = t.uniform({kLarge}), b = t.uniform({kLarge});
  check_both_paths(t, {kLarge}, 0, 0, "add", [&](Backend& be, Side s, const Tensor& y) { be.add(s(a), s(b), y); });
  // y is a, then y is b
  auto a2 = t.output_like(a), b2 = t.output_like(b);
  auto c = t.uniform({3, 7}), d = t.uniform({3, 7});
  t.run([&](Backend& be, Side s) {
    be.add(s(a), s(b), s(a));
    be.add(s(c), s(d), s(d));
    be.add(s(a2), s(b2), s(b2));
  });
  t.expect_equal(a, "add in place (y = a)");
  t.expect_equal(d, "add in place (y = b)");
  t.expect_equal(b2, "add in place (guarded, y = b)");
}

REMAT_OP_CASE(elementwise, accumulate) {
  for (int64_t n : kSizes) {
    auto src = t.uniform({n});
    auto dst = t.output_like(t.uniform({n}));  // guarded: scalar path
    auto dst_aligned = t.uniform({n});
    t.run([&](Backend& be, Side s) {
      be.accumulate(s(dst), s(src));
      be.accumulate(s(dst_aligned), s(src));
    });
    t.expect_equal(dst, "accumulate n=" + std::to_string(n));
    t.expect_equal(dst_aligned, "accumulate (aligned) n=" + std::to_string(n));
  }
  // same element count, different shapes
  auto src = t.uniform({15});
  auto dst = t.output_like(t.uniform({3, 5}));
  t.run([&](Backend& be, Side s) { be.accumulate(s(dst), s(src)); });
  t.expect_equal(dst, "accumulate [3, 5] += [15]");
}

REMAT_OP_CASE(elementwise, scale) {
  for (int64_t n : kSizes) {
    auto x = t.uniform({n}, -3.0f, 3.0f);
    for (float alpha : {0.5f, -3.25f, 0.0f}) {
      check_both_paths(t, {n}, 0, 0, "scale alpha=" + std::to_string(alpha),
                       [&](Backend& be, Side s, const Tensor& y) { be.scale(s(x), alpha, y); });
    }
    // y is x: guarded (scalar path) and plain (float4 path)
    auto g = t.output_like(x);
    auto p = t.uniform({n});
    t.run([&](Backend& be, Side s) {
      be.scale(s(g), 1.7f, s(g));
      be.scale(s(p), -0.3f, s(p));
    });
    t.expect_equal(g, "scale in place n=" + std::to_string(n));
    t.expect_equal(p, "scale in place (aligned) n=" + std::to_string(n));
  }
}

REMAT_OP_CASE(elementwise, relu) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (int64_t n : kSizes) {
    auto x_host = uniform_host(t, n, -1.0f, 1.0f);
    const float special[] = {0.0f, -0.0f, nan, inf, -inf, 1e-38f};
    for (size_t i = 0; i < 6 && i < x_host.size(); ++i) x_host[i * 5 % x_host.size()] = special[i];
    auto x = t.values(x_host, {n}), dy = t.uniform({n});
    check_both_paths(t, {n}, 0, 0, "relu_forward",
                     [&](Backend& be, Side s, const Tensor& y) { be.relu_forward(s(x), y); });
    check_both_paths(t, {n}, 0, 0, "relu_backward",
                     [&](Backend& be, Side s, const Tensor& dx) { be.relu_backward(s(dy), s(x), dx); });
    // dx is dy
    auto g = t.uniform({n});
    t.run([&](Backend& be, Side s) { be.relu_backward(s(g), s(x), s(g)); });
    t.expect_equal(g, "relu_backward in place n=" + std::to_string(n));
  }
}

REMAT_OP_CASE(elementwise, gelu) {
  for (GeluApprox approx : {GeluApprox::none, GeluApprox::tanh}) {
    const std::string form = approx == GeluApprox::none ? " (erf)" : " (tanh)";
    for (int64_t n : kSizes) {
      auto x = t.values(gelu_inputs(t, n), {n}), dy = t.uniform({n});
      check_both_paths(t, {n}, 1e-6, 1e-5, "gelu_forward" + form,
                       [&](Backend& be, Side s, const Tensor& y) { be.gelu_forward(s(x), approx, y); });
      const double backward_atol = approx == GeluApprox::none ? 1e-6 : 1e-5;
      check_both_paths(t, {n}, backward_atol, 1e-5, "gelu_backward" + form,
                       [&](Backend& be, Side s, const Tensor& dx) { be.gelu_backward(s(dy), s(x), approx, dx); });
      // dx is dy
      auto g = t.uniform({n});
      t.run([&](Backend& be, Side s) { be.gelu_backward(s(g), s(x), approx, s(g)); });
      t.expect_close(g, backward_atol, 1e-5, "gelu_backward in place" + form + " n=" + std::to_string(n));
    }
  }
}

// Dropout: the mask bits must equal the CPU's for the same RngState, forward and backward,
// for offsets that are multiples of 4 (one Philox block per four elements, float4) and
// offsets that are not (the blocks straddle elements).
namespace {

void check_dropout(OpCheck& t, float p, const std::vector<int64_t>& sizes) {
  for (int64_t n : sizes) {
    for (uint64_t offset : {0ull, 4ull, 1000ull, 3ull, 1001ull}) {
      const RngState rng{0x1234abcd5678ull + static_cast<uint64_t>(n), offset};
      const std::string what =
          " p=" + std::to_string(p) + " n=" + std::to_string(n) + " offset=" + std::to_string(offset);
      auto x = t.uniform({n}), dy = t.uniform({n});
      check_both_paths(t, {n}, 0, 0, "dropout_forward" + what,
                       [&](Backend& be, Side s, const Tensor& y) { be.dropout_forward(s(x), p, rng, y); });
      check_both_paths(t, {n}, 0, 0, "dropout_backward" + what,
                       [&](Backend& be, Side s, const Tensor& dx) { be.dropout_backward(s(dy), p, rng, dx); });
      // in place, as recompute and backward may run it
      auto g = t.uniform({n});
      t.run([&](Backend& be, Side s) { be.dropout_backward(s(g), p, rng, s(g)); });
      t.expect_equal(g, "dropout_backward in place" + what);
    }
  }
}

}  // namespace

REMAT_OP_CASE(elementwise, dropout_p0) { check_dropout(t, 0.0f, kSizes); }
REMAT_OP_CASE(elementwise, dropout_p01) { check_dropout(t, 0.1f, kSizes); }
REMAT_OP_CASE(elementwise, dropout_p05) { check_dropout(t, 0.5f, kSizes); }
REMAT_OP_CASE(elementwise, dropout_p1) { check_dropout(t, 1.0f, kSizes); }

REMAT_OP_CASE(elementwise, dropout_large) {
  // more Philox blocks than threads in the grid; the seed's high word matters too
  const RngState rng{0xfedcba9876543210ull, 4096};
  auto x = t.uniform({kLarge});
  check_both_paths(t, {kLarge}, 0, 0, "dropout_forward large",
                   [&](Backend& be, Side s, const Tensor& y) { be.dropout_forward(s(x), 0.25f, rng, y); });
}

}  // namespace remat::test
