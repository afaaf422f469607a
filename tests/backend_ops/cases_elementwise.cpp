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

// SiLU: expf on the device against the CPU's exp (both within 2 ulp of exact): the GELU
// case's tolerances.
REMAT_OP_CASE(elementwise, silu) {
  for (int64_t n : kSizes) {
    auto x = t.values(gelu_inputs(t, n), {n}), dy = t.uniform({n});
    check_both_paths(t, {n}, 1e-6, 1e-5, "silu_forward",
                     [&](Backend& be, Side s, const Tensor& y) { be.silu_forward(s(x), y); });
    check_both_paths(t, {n}, 1e-6, 1e-5, "silu_backward",
                     [&](Backend& be, Side s, const Tensor& dx) { be.silu_backward(s(dy), s(x), dx); });
    // dx is dy
    auto g = t.uniform({n});
    t.run([&](Backend& be, Side s) { be.silu_backward(s(g), s(x), s(g)); });
    t.expect_close(g, 1e-6, 1e-5, "silu_backward in place n=" + std::to_string(n));
  }
}

// mul: one product per element, correctly rounded on both: bitwise.
REMAT_OP_CASE(elementwise, mul) {
  for (int64_t n : kSizes) {
    auto a = t.uniform({n}, -3.0f, 3.0f), b = t.uniform({n}, -3.0f, 3.0f), dy = t.uniform({n});
    check_both_paths(t, {n}, 0, 0, "mul_forward",
                     [&](Backend& be, Side s, const Tensor& y) { be.mul_forward(s(a), s(b), y); });
    auto da = t.output({n}), db = t.output({n}), da_only = t.output({n}), db_only = t.output({n});
    t.run([&](Backend& be, Side s) {
      be.mul_backward(s(dy), s(a), s(b), s(da), s(db));
      be.mul_backward(s(dy), s(a), s(b), s(da_only), Tensor());
      be.mul_backward(s(dy), s(a), s(b), Tensor(), s(db_only));
    });
    const std::string what = " n=" + std::to_string(n);
    t.expect_equal(da, "mul_backward da" + what);
    t.expect_equal(db, "mul_backward db" + what);
    t.expect_equal(da_only, "mul_backward da alone" + what);
    t.expect_equal(db_only, "mul_backward db alone" + what);
  }
  auto a = t.uniform({kLarge}), b = t.uniform({kLarge});
  check_both_paths(t, {kLarge}, 0, 0, "mul_forward large",
                   [&](Backend& be, Side s, const Tensor& y) { be.mul_forward(s(a), s(b), y); });
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

// ---- bf16 (training.precision bf16; the two references: backend_ops/harness.h) ----------------
// Sizes: the elementwise kernels' vector path (8 bf16 = 16 bytes when every pointer is
// 16-byte aligned) and its tail, the scalar path (guarded outputs start 67 elements into
// their storage: 134 bytes, not aligned), and launches mixing f32 and bf16 (an f32 master
// rounded into a bf16 working copy by scale, a bf16 activation added to an f32 tensor).

namespace {

const std::vector<int64_t> kBf16Sizes = {1, 3, 8, 13, 1001, 4096 + 5};

template <typename Op>
void check_map(OpCheck& t, const std::string& what, double atol, double rtol, int inputs, Op op) {
  for (int64_t n : kBf16Sizes) {
    const Shape s{n};
    std::vector<Pair> in;
    for (int i = 0; i < inputs; ++i) in.push_back(t.uniform_bf16(s, -3.0f, 3.0f));
    std::vector<Pair> in_f;
    for (const Pair& p : in) in_f.push_back(t.as_f32(p));
    auto y = t.output(s, DType::bf16);  // scalar path (not 16-byte aligned)
    auto y_aligned = aligned_bf16_output(t, s);
    auto y_f = t.output(s);
    t.run([&](Backend& be, Side side) {
      op(be, side, in, side(y));
      op(be, side, in, side(y_aligned));
      op(be, side, in_f, side(y_f));
    });
    const std::string label = what + " n=" + std::to_string(n);
    t.expect_close(y, atol, rtol, label);
    t.expect_close(y_aligned, atol, rtol, label + " (aligned)");
    expect_rounded_dut(y, y_f, label + " against fp32");
    expect_rounded_dut(y_aligned, y_f, label + " (aligned) against fp32");
  }
}

}  // namespace

REMAT_OP_CASE(elementwise, bf16_add_scale_relu) {
  ActivationDTypeScope bf16(DType::bf16);
  check_map(t, "add", 0, 0, 2,
            [](Backend& be, Side s, const std::vector<Pair>& in, const Tensor& y) { be.add(s(in[0]), s(in[1]), y); });
  check_map(t, "scale", 0, 0, 1,
            [](Backend& be, Side s, const std::vector<Pair>& in, const Tensor& y) { be.scale(s(in[0]), -1.37f, y); });
  check_map(t, "relu_forward", 0, 0, 1,
            [](Backend& be, Side s, const std::vector<Pair>& in, const Tensor& y) { be.relu_forward(s(in[0]), y); });
  check_map(t, "relu_backward", 0, 0, 2, [](Backend& be, Side s, const std::vector<Pair>& in, const Tensor& y) {
    be.relu_backward(s(in[0]), s(in[1]), y);
  });
}

REMAT_OP_CASE(elementwise, bf16_gelu) {
  ActivationDTypeScope bf16(DType::bf16);
  for (GeluApprox approx : {GeluApprox::none, GeluApprox::tanh}) {
    const std::string form = approx == GeluApprox::none ? " (erf)" : " (tanh)";
    // The fp32 case's tolerances (libm against the CPU's approximations) plus a bf16 step.
    check_map(t, "gelu_forward" + form, 1e-6, kBf16Rel, 1,
              [&](Backend& be, Side s, const std::vector<Pair>& in, const Tensor& y) {
                be.gelu_forward(s(in[0]), approx, y);
              });
    check_map(t, "gelu_backward" + form, 1e-5, kBf16Rel, 2,
              [&](Backend& be, Side s, const std::vector<Pair>& in, const Tensor& y) {
                be.gelu_backward(s(in[0]), s(in[1]), approx, y);
              });
  }
}

REMAT_OP_CASE(elementwise, bf16_silu_mul) {
  ActivationDTypeScope bf16(DType::bf16);
  // SiLU: the fp32 case's tolerances plus a bf16 step; mul: bitwise.
  check_map(t, "silu_forward", 1e-6, kBf16Rel, 1,
            [](Backend& be, Side s, const std::vector<Pair>& in, const Tensor& y) { be.silu_forward(s(in[0]), y); });
  check_map(t, "silu_backward", 1e-6, kBf16Rel, 2,
            [](Backend& be, Side s, const std::vector<Pair>& in, const Tensor& y) {
              be.silu_backward(s(in[0]), s(in[1]), y);
            });
  check_map(t, "mul_forward", 0, 0, 2, [](Backend& be, Side s, const std::vector<Pair>& in, const Tensor& y) {
    be.mul_forward(s(in[0]), s(in[1]), y);
  });
  // mul_backward's two outputs, each the product of dy and the other input
  check_map(t, "mul_backward da", 0, 0, 3, [](Backend& be, Side s, const std::vector<Pair>& in, const Tensor& y) {
    be.mul_backward(s(in[0]), s(in[1]), s(in[2]), y, Tensor());
  });
  check_map(t, "mul_backward db", 0, 0, 3, [](Backend& be, Side s, const std::vector<Pair>& in, const Tensor& y) {
    be.mul_backward(s(in[0]), s(in[1]), s(in[2]), Tensor(), y);
  });
  // dx over dy, as the silu layer's backward runs it
  for (int64_t n : kBf16Sizes) {
    auto x = t.uniform_bf16({n}, -4.0f, 4.0f), g = t.output_like(t.uniform_bf16({n}));
    auto g_aligned = t.uniform_bf16({n});
    t.run([&](Backend& be, Side s) {
      be.silu_backward(s(g), s(x), s(g));
      be.silu_backward(s(g_aligned), s(x), s(g_aligned));
    });
    t.expect_close(g, 1e-6, kBf16Rel, "silu_backward in place n=" + std::to_string(n));
    t.expect_close(g_aligned, 1e-6, kBf16Rel, "silu_backward in place (aligned) n=" + std::to_string(n));
  }
}

REMAT_OP_CASE(elementwise, bf16_in_place) {
  ActivationDTypeScope bf16(DType::bf16);
  for (int64_t n : kBf16Sizes) {
    const Shape s{n};
    auto x = t.uniform_bf16(s, -2.0f, 2.0f), src = t.uniform_bf16(s);
    auto g = t.output_like(t.uniform_bf16(s));  // guarded: scalar path
    auto g_aligned = t.uniform_bf16(s);
    auto acc = t.output_like(t.uniform_bf16(s));
    auto acc_aligned = t.uniform_bf16(s);
    auto sc = t.uniform_bf16(s);
    t.run([&](Backend& be, Side side) {
      be.gelu_backward(side(g), side(x), GeluApprox::tanh, side(g));
      be.relu_backward(side(g_aligned), side(x), side(g_aligned));
      be.accumulate(side(acc), side(src));
      be.accumulate(side(acc_aligned), side(src));
      be.scale(side(sc), 0.75f, side(sc));
    });
    const std::string label = " n=" + std::to_string(n);
    t.expect_close(g, 1e-5, kBf16Rel, "gelu_backward in place" + label);
    t.expect_equal(g_aligned, "relu_backward in place" + label);
    t.expect_equal(acc, "accumulate" + label);
    t.expect_equal(acc_aligned, "accumulate (aligned)" + label);
    t.expect_equal(sc, "scale in place" + label);
  }
}

// Launches that mix f32 and bf16 arrays: the working-copy refresh (an f32 master scaled by
// 1 into bf16: ParamStore::refresh_working), an f32 gradient accumulating a bf16 one, an
// f32 output of bf16 inputs.
REMAT_OP_CASE(elementwise, bf16_mixed_dtypes) {
  ActivationDTypeScope bf16(DType::bf16);
  for (int64_t n : kBf16Sizes) {
    const Shape s{n};
    auto master = t.uniform(s, -4.0f, 4.0f);
    auto working = t.output(s, DType::bf16), working_aligned = aligned_bf16_output(t, s);
    auto a = t.uniform_bf16(s), b = t.uniform(s);
    auto y_f32 = t.output(s), y_bf16 = t.output(s, DType::bf16);
    auto dst = t.output_like(t.uniform(s));
    auto src = t.uniform_bf16(s);
    t.run([&](Backend& be, Side side) {
      be.scale(side(master), 1.0f, side(working));
      be.scale(side(master), 1.0f, side(working_aligned));
      be.add(side(a), side(b), side(y_f32));
      be.add(side(a), side(b), side(y_bf16));
      be.accumulate(side(dst), side(src));
    });
    const std::string label = " n=" + std::to_string(n);
    t.expect_equal(working, "f32 master -> bf16 working copy" + label);
    t.expect_equal(working_aligned, "f32 master -> bf16 working copy (aligned)" + label);
    t.expect_equal(y_f32, "add bf16 + f32 -> f32" + label);
    t.expect_equal(y_bf16, "add bf16 + f32 -> bf16" + label);
    t.expect_equal(dst, "accumulate f32 += bf16" + label);
  }
  // Rounding at the edges: ties to even, subnormals kept, overflow to infinity, NaN.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> edge = {1.00390625f, 1.01171875f,     -1.00390625f, 3.3895314e38f, -3.4e38f,  1e-40f,
                                   -1e-45f,     1.17549435e-38f, nan,          inf,           -inf,      0.0f,
                                   -0.0f,       65504.5f,        0.333333343f, 2.71828175f,   1.0000001f};
  const Shape s{static_cast<int64_t>(edge.size())};
  auto master = t.values(edge, s);
  auto working = t.output(s, DType::bf16);
  t.run([&](Backend& be, Side side) { be.scale(side(master), 1.0f, side(working)); });
  t.expect_equal(working, "rounding edge cases");
}

// cast_multi, the working-copy refresh: 150 tensors (two launches of kCastMultiMax = 128),
// sizes from empty to several 16384-element chunks, destinations aligned (eight per access)
// and guarded (one by one), the rounding edge cases; and pairs that are not f32 -> bf16
// (bf16 -> f32, f32 -> f32: one copy each). Bitwise the cpu, and bitwise the device's own
// scale(src, 1, dst) per tensor (the refresh before).
REMAT_OP_CASE(elementwise, bf16_cast_multi) {
  ActivationDTypeScope bf16(DType::bf16);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<int64_t> sizes = {0, 1, 7, 8, 9, 100, 16384, 16385, 40000 + 3};
  std::vector<Pair> src, dst, per_tensor;
  for (int i = 0; i < 150; ++i) {
    const int64_t n = sizes[static_cast<size_t>(i) % sizes.size()];
    src.push_back(t.uniform({n}, -4.0f, 4.0f));
    const bool aligned = i % 2 == 0;
    dst.push_back(aligned ? aligned_bf16_output(t, {n}) : t.output({n}, DType::bf16));
    per_tensor.push_back(aligned ? aligned_bf16_output(t, {n}) : t.output({n}, DType::bf16));
  }
  const std::vector<float> edge = {1.00390625f, 1.01171875f,     -1.00390625f, 3.3895314e38f, -3.4e38f,  1e-40f,
                                   -1e-45f,     1.17549435e-38f, nan,          inf,           -inf,      0.0f,
                                   -0.0f,       65504.5f,        0.333333343f, 2.71828175f,   1.0000001f};
  const Shape es{static_cast<int64_t>(edge.size())};
  src.push_back(t.values(edge, es));
  dst.push_back(t.output(es, DType::bf16));
  per_tensor.push_back(t.output(es, DType::bf16));
  auto h = t.uniform_bf16({33}), f = t.uniform({35});
  auto widened = t.output({33}), copied = t.output({35});
  t.run([&](Backend& be, Side s) {
    std::vector<Tensor> a, b;
    for (size_t i = 0; i < src.size(); ++i) {
      a.push_back(s(src[i]));
      b.push_back(s(dst[i]));
    }
    a.push_back(s(h));
    b.push_back(s(widened));
    a.push_back(s(f));
    b.push_back(s(copied));
    be.cast_multi(a, b);
    for (size_t i = 0; i < src.size(); ++i) be.scale(s(src[i]), 1.0f, s(per_tensor[i]));
  });
  for (size_t i = 0; i < src.size(); ++i) {
    const std::string what = "cast_multi tensor " + std::to_string(i) + " n=" + std::to_string(src[i].ref.numel());
    t.expect_equal(dst[i], what);
    if (!perf_iterations()) {
      EXPECT_EQ(dut_bits(dst[i].dut), dut_bits(per_tensor[i].dut)) << what << ": against scale(src, 1) on the device";
    }
  }
  t.expect_equal(widened, "cast_multi bf16 -> f32");
  t.expect_equal(copied, "cast_multi f32 -> f32");
}

namespace {

void check_dropout_bf16(OpCheck& t, float p) {
  for (int64_t n : kBf16Sizes) {
    for (uint64_t offset : {0ull, 4ull, 3ull, 1001ull}) {
      const RngState rng{0x9876fedcull + static_cast<uint64_t>(n), offset};
      const std::string what =
          " p=" + std::to_string(p) + " n=" + std::to_string(n) + " offset=" + std::to_string(offset);
      auto x = t.uniform_bf16({n}), g = t.uniform_bf16({n});
      auto x_f = t.as_f32(x);
      auto y = t.output({n}, DType::bf16), y_aligned = aligned_bf16_output(t, {n}), y_f = t.output({n});
      t.run([&](Backend& be, Side s) {
        be.dropout_forward(s(x), p, rng, s(y));
        be.dropout_forward(s(x), p, rng, s(y_aligned));
        be.dropout_forward(s(x_f), p, rng, s(y_f));
        be.dropout_backward(s(g), p, rng, s(g));  // in place
      });
      t.expect_equal(y, "dropout_forward" + what);
      t.expect_equal(y_aligned, "dropout_forward (aligned)" + what);
      t.expect_equal(g, "dropout_backward in place" + what);
      // The same elements kept as in fp32 (the Philox mask of element i, whatever the dtype).
      expect_rounded_dut(y, y_f, "dropout_forward against fp32" + what);
    }
  }
}

}  // namespace

REMAT_OP_CASE(elementwise, bf16_dropout) {
  ActivationDTypeScope bf16(DType::bf16);
  for (float p : {0.0f, 0.1f, 0.5f, 1.0f}) check_dropout_bf16(t, p);
}

// ---- Gradients: the device's backward against central differences of its own forward --------
// (backend_ops/harness.h, "Gradient cases")

namespace {

// Values in [lo, hi) with |v| >= gap (away from ReLU's kink and pooling ties).
Pair away_from_zero(OpCheck& t, const Shape& s, float gap) {
  Pair p = t.uniform(s, -1.0f, 1.0f);
  auto v = p.ref.to_vector();
  for (auto& x : v) x = x < 0 ? x - gap : x + gap;
  return t.values(v, s);
}

}  // namespace

REMAT_OP_CASE(elementwise, grad_pointwise) {
  const Shape s{3, 37};
  auto x = away_from_zero(t, s, 0.05f), dy = t.uniform(s);
  auto y = t.output(s);
  {
    auto dx = t.output(s);
    t.run([&](Backend& be, Side d) { be.relu_backward(d(dy), d(x), d(dx)); });
    t.expect_gradient("relu", x, dx, [&](Backend& be) {
      be.relu_forward(x.dut, y.dut);
      return dot(dy.dut, y.dut);
    });
  }
  for (GeluApprox a : {GeluApprox::none, GeluApprox::tanh}) {
    auto dx = t.output(s);
    t.run([&](Backend& be, Side d) { be.gelu_backward(d(dy), d(x), a, d(dx)); });
    t.expect_gradient(a == GeluApprox::none ? "gelu" : "gelu tanh", x, dx, [&](Backend& be) {
      be.gelu_forward(x.dut, a, y.dut);
      return dot(dy.dut, y.dut);
    });
  }
  {
    const RngState rng{77, 8};
    auto dx = t.output(s);
    t.run([&](Backend& be, Side d) { be.dropout_backward(d(dy), 0.3f, rng, d(dx)); });
    t.expect_gradient("dropout", x, dx, [&](Backend& be) {
      be.dropout_forward(x.dut, 0.3f, rng, y.dut);
      return dot(dy.dut, y.dut);
    });
  }
}

REMAT_OP_CASE(elementwise, grad_silu_mul) {
  const Shape s{3, 37};
  auto x = t.uniform(s, -4.0f, 4.0f), dy = t.uniform(s), y = t.output(s);
  auto dx = t.output(s);
  t.run([&](Backend& be, Side d) { be.silu_backward(d(dy), d(x), d(dx)); });
  t.expect_gradient("silu", x, dx, [&](Backend& be) {
    be.silu_forward(x.dut, y.dut);
    return dot(dy.dut, y.dut);
  });
  auto a = t.uniform(s, -2.0f, 2.0f), b = t.uniform(s, -2.0f, 2.0f), da = t.output(s), db = t.output(s);
  t.run([&](Backend& be, Side d) { be.mul_backward(d(dy), d(a), d(b), d(da), d(db)); });
  auto loss = [&](Backend& be) {
    be.mul_forward(a.dut, b.dut, y.dut);
    return dot(dy.dut, y.dut);
  };
  t.expect_gradient("mul da", a, da, loss);
  t.expect_gradient("mul db", b, db, loss);
}

}  // namespace remat::test
