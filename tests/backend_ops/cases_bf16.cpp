// The ops on bf16 tensors (training.precision bf16: bf16 storage, fp32 math; the CPU
// backend's contract, src/backends/cpu/mixed.h and tests/ops/test_bf16_ops.cpp), on the
// device under test against the CPU backend running the same bf16 op. Every case runs
// inside ActivationDTypeScope(bf16), as the executor does, so the validators take bf16
// where they expect f32.
//
// Two references per op:
// - the CPU backend's bf16 op on the same bf16 inputs: bitwise for every op whose fp32
//   kernel is bitwise the CPU's (add, accumulate, scale, ReLU, dropout, embedding,
//   permute); within a bf16 rounding step (1/128 relative, plus the fp32 case's own
//   tolerance) for the others, whose fp32 kernels already differ from the CPU in the last
//   bits (GELU's libm erff/tanhf, the row reductions' order, GEMMs), because a value a few
//   fp32 ulps away can round to the neighbouring bf16;
// - the device's own fp32 op on the same values widened to f32, its output rounded to
//   bf16: bitwise, for every op whose bf16 kernel runs the fp32 kernel's arithmetic in the
//   same order on the widened values (elementwise, the row ops: layernorm, RMSNorm,
//   softmax, cross-entropy), so the bf16 kernels are shown to be the fp32 kernels plus
//   the conversions and nothing else.
//
// Sizes: the elementwise kernels' vector path (8 bf16 = 16 bytes when every pointer is
// 16-byte aligned) and its tail, the scalar path (guarded outputs start 67 elements into
// their storage: 134 bytes, not aligned), and launches mixing f32 and bf16 (an f32 master
// rounded into a bf16 working copy by scale, a bf16 activation added to an f32 tensor).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "backend_ops/harness.h"
#include "remat/bf16.h"
#include "remat/dtype.h"
#include "remat/error.h"
#include "remat/ops.h"

namespace remat::test {

namespace {

const std::vector<int64_t> kSizes = {1, 3, 8, 13, 1001, 4096 + 5};

template <typename Op>
void check_map(OpCheck& t, const std::string& what, double atol, double rtol, int inputs, Op op) {
  for (int64_t n : kSizes) {
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

REMAT_OP_CASE(elementwise, bf16_in_place) {
  ActivationDTypeScope bf16(DType::bf16);
  for (int64_t n : kSizes) {
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
  for (int64_t n : kSizes) {
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
  for (int64_t n : kSizes) {
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

// ---- GEMM and linear: cublasGemmEx with bf16 factors, fp32 accumulation ------------------
// Tolerances: the fp32 sums of the same (bf16) values in another order (cuBLAS's on the
// device, 512-wide panels on the CPU: up to ~1e-5 absolute at these sizes), then a bf16
// output may round to the neighbouring value: 1e-4 absolute + one bf16 step relative.
// f32 outputs of bf16 factors (parameter gradients) are fp32 sums: the fp32 cases' 1e-5.

REMAT_OP_CASE(gemm, bf16_gemm) {
  ActivationDTypeScope bf16(DType::bf16);
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      auto a = ta ? t.uniform_bf16({530, 37}) : t.uniform_bf16({37, 530});
      auto b = tb ? t.uniform_bf16({29, 530}) : t.uniform_bf16({530, 29});
      auto c = t.output({37, 29}, DType::bf16);
      auto c_beta = t.output_like(t.uniform_bf16({37, 29}));
      auto c_f32 = t.output_like(t.uniform({37, 29}));
      GemmParams p{ta != 0, tb != 0, 1.0f, 0.0f}, q{ta != 0, tb != 0, 0.5f, 2.0f};
      t.run([&](Backend& be, Side s) {
        be.gemm(s(a), s(b), s(c), p);
        be.gemm(s(a), s(b), s(c_beta), q);
        be.gemm(s(a), s(b), s(c_f32), q);
      });
      const std::string what = " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb);
      t.expect_close(c, 1e-4, kBf16Rel, "c" + what);
      t.expect_close(c_beta, 1e-4, kBf16Rel, "c (alpha, beta)" + what);
      t.expect_close(c_f32, 1e-5, 1e-5, "c f32 (alpha, beta)" + what);
    }
  }
  auto a = t.uniform_bf16({3, 4, 5, 6}), b = t.uniform_bf16({3, 4, 6, 7}), b2 = t.uniform_bf16({6, 7});
  auto c = t.output({3, 4, 5, 7}, DType::bf16), c2 = t.output({3, 4, 5, 7}, DType::bf16);
  t.run([&](Backend& be, Side s) {
    be.gemm(s(a), s(b), s(c), {});
    be.gemm(s(a), s(b2), s(c2), {});
  });
  t.expect_close(c, 1e-4, kBf16Rel, "c batched");
  t.expect_close(c2, 1e-4, kBf16Rel, "c batched (shared b)");
}

REMAT_OP_CASE(gemm, bf16_linear) {
  ActivationDTypeScope bf16(DType::bf16);
  // k = 1100 spans three of the CPU's 512-wide panels, 600 outputs two tiles.
  auto x = t.uniform_bf16({2, 35, 1100}), w = t.uniform_bf16({600, 1100}), b = t.uniform_bf16({600});
  auto b_f32 = t.uniform({600});  // an f32 bias into a bf16 y: broadcast rounded, then the GEMM
  auto y = t.output({2, 35, 600}, DType::bf16), y_nb = t.output({2, 35, 600}, DType::bf16);
  auto y_fb = t.output({2, 35, 600}, DType::bf16), y_f32 = t.output({2, 35, 600});
  t.run([&](Backend& be, Side s) {
    be.linear_forward(s(x), s(w), s(b), s(y));
    be.linear_forward(s(x), s(w), Tensor(), s(y_nb));
    be.linear_forward(s(x), s(w), s(b_f32), s(y_fb));
    be.linear_forward(s(x), s(w), s(b), s(y_f32));
  });
  t.expect_close(y, 1e-4, kBf16Rel, "y");
  t.expect_close(y_nb, 1e-4, kBf16Rel, "y (no bias)");
  // On the device an f32 bias is rounded to bf16 first (|b| < 1: off by up to 2^-9).
  t.expect_close(y_fb, 1e-4 + 1.0 / 512, kBf16Rel, "y (f32 bias)");
  t.expect_close(y_f32, 1e-4, 1e-5, "y f32 from bf16 factors");

  auto dy = t.uniform_bf16({2, 35, 600});
  auto dx = t.output({2, 35, 1100}, DType::bf16);
  auto dw = t.output_like(t.uniform({600, 1100}));  // f32 parameter gradients, accumulated into
  auto db = t.output_like(t.uniform({600}));
  t.run([&](Backend& be, Side s) { be.linear_backward(s(dy), s(x), s(w), s(dx), s(dw), s(db)); });
  t.expect_close(dx, 1e-4, kBf16Rel, "dx");
  t.expect_close(dw, 1e-5, 1e-5, "dw (f32)");
  t.expect_close(db, 1e-5, 1e-5, "db (f32)");
  // Column sums over many rows, split into chunks on the device.
  auto dy_many = t.uniform_bf16({3000, 45}), x_many = t.uniform_bf16({3000, 45}), w_many = t.uniform_bf16({45, 45});
  auto db_many = t.output_like(t.uniform({45}));
  t.run([&](Backend& be, Side s) {
    be.linear_backward(s(dy_many), s(x_many), s(w_many), Tensor(), Tensor(), s(db_many));
  });
  t.expect_close(db_many, 1e-4, 1e-5, "db over 3000 rows");
}

// cuBLAS has no f32-by-bf16 product (nor f32 factors into a bf16 C): the device runs its own
// FMA GEMM (kernels/gemm.cuh) for them, as a linear reading the f32 batch with bf16 working
// weights needs (mlp_deep's first layer). Against the CPU (which stages fp32): the
// tolerances above; the same bits on a second run.
REMAT_OP_CASE(gemm, bf16_mixed_factors) {
  ActivationDTypeScope bf16(DType::bf16);
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      auto a = ta ? t.uniform({70, 37}) : t.uniform({37, 70});  // f32 (not bf16 values)
      auto b = tb ? t.uniform_bf16({29, 70}) : t.uniform_bf16({70, 29});
      auto a16 = ta ? t.uniform_bf16({70, 37}) : t.uniform_bf16({37, 70});
      auto b32 = tb ? t.uniform({29, 70}) : t.uniform({70, 29});
      auto c = t.output({37, 29}, DType::bf16), c_again = t.output({37, 29}, DType::bf16);
      auto c_f32 = t.output_like(t.uniform({37, 29})), c_other = t.output_like(t.uniform_bf16({37, 29}));
      auto c_both32 = t.output({37, 29}, DType::bf16);  // f32 factors into a bf16 C
      auto a32 = ta ? t.uniform({70, 37}) : t.uniform({37, 70});
      GemmParams p{ta != 0, tb != 0, 1.0f, 0.0f}, q{ta != 0, tb != 0, 0.5f, 2.0f};
      t.run([&](Backend& be, Side s) {
        be.gemm(s(a), s(b), s(c), p);
        be.gemm(s(a), s(b), s(c_again), p);
        be.gemm(s(a), s(b), s(c_f32), q);
        be.gemm(s(a16), s(b32), s(c_other), q);
        be.gemm(s(a32), s(b32), s(c_both32), p);
      });
      const std::string what = " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb);
      t.expect_close(c, 1e-4, kBf16Rel, "f32 by bf16 into bf16" + what);
      t.expect_close(c_f32, 1e-5, 1e-5, "f32 by bf16 into f32 (alpha, beta)" + what);
      t.expect_close(c_other, 1e-4, kBf16Rel, "bf16 by f32 into bf16 (alpha, beta)" + what);
      t.expect_close(c_both32, 1e-4, kBf16Rel, "f32 by f32 into bf16" + what);
      if (!perf_iterations()) {
        EXPECT_EQ(dut_bits(c.dut), dut_bits(c_again.dut)) << "a second run" << what;
      }
    }
  }
  // Batched, and a batch sharing b.
  auto a = t.uniform({3, 4, 5, 6}), b = t.uniform_bf16({3, 4, 6, 7}), b2 = t.uniform_bf16({6, 7});
  auto c = t.output({3, 4, 5, 7}, DType::bf16), c2 = t.output({3, 4, 5, 7}, DType::bf16);
  t.run([&](Backend& be, Side s) {
    be.gemm(s(a), s(b), s(c), {});
    be.gemm(s(a), s(b2), s(c2), {});
  });
  t.expect_close(c, 1e-4, kBf16Rel, "f32 by bf16 batched");
  t.expect_close(c2, 1e-4, kBf16Rel, "f32 by bf16 batched (shared b)");
  // A linear on the f32 batch with bf16 weights: forward, and backward (dw, db; dx too).
  auto x = t.uniform({2, 9, 150}), w = t.uniform_bf16({40, 150}), bias = t.uniform_bf16({40});
  auto y = t.output({2, 9, 40}, DType::bf16);
  t.run([&](Backend& be, Side s) { be.linear_forward(s(x), s(w), s(bias), s(y)); });
  t.expect_close(y, 1e-4, kBf16Rel, "linear y from an f32 x");
  auto dy = t.uniform_bf16({2, 9, 40});
  auto dx = t.output({2, 9, 150}), dw = t.output_like(t.uniform({40, 150})), db = t.output_like(t.uniform({40}));
  t.run([&](Backend& be, Side s) { be.linear_backward(s(dy), s(x), s(w), s(dx), s(dw), s(db)); });
  t.expect_close(dx, 1e-5, 1e-5, "linear dx (f32) from an f32 x");
  t.expect_close(dw, 1e-5, 1e-5, "linear dw (f32) from an f32 x");
  t.expect_close(db, 1e-5, 1e-5, "linear db (f32)");
}

// ---- Row ops: layernorm, softmax, cross-entropy, accuracy ---------------------------------
// Rows of a warp (C <= 1024) and of a block, in packs of four (C % 4 == 0, aligned) and one
// by one. Against the CPU: the fp32 cases' tolerances plus a bf16 step; against the device's
// fp32 kernel on the same values: bitwise (bf16 outputs rounded; f32 statistics equal).

namespace {

const std::vector<int64_t> kRowLengths = {96, 75, 1600, 2051};

}  // namespace

REMAT_OP_CASE(layernorm, bf16) {
  ActivationDTypeScope bf16(DType::bf16);
  const int64_t rows = 37;
  for (int64_t c : kRowLengths) {
    const std::string what = " C=" + std::to_string(c);
    auto x = t.uniform_bf16({rows, c}, -2.0f, 3.0f), gamma = t.uniform_bf16({c}, 0.5f, 1.5f),
         beta = t.uniform_bf16({c});
    auto xf = t.as_f32(x), gf = t.as_f32(gamma), bf = t.as_f32(beta);
    auto y = t.output({rows, c}, DType::bf16), y_aligned = aligned_bf16_output(t, {rows, c}), yf = t.output({rows, c}),
         yf_aligned = t.values(std::vector<float>(static_cast<size_t>(rows * c)), {rows, c});
    auto mean = t.output({rows}), rstd = t.output({rows}), meanf = t.output({rows}), rstdf = t.output({rows});
    t.run([&](Backend& be, Side s) {
      be.layernorm_forward(s(x), s(gamma), s(beta), 1e-5f, s(y), s(mean), s(rstd));
      be.layernorm_forward(s(x), s(gamma), s(beta), 1e-5f, s(y_aligned), s(mean), s(rstd));
      be.layernorm_forward(s(xf), s(gf), s(bf), 1e-5f, s(yf), s(meanf), s(rstdf));
      be.layernorm_forward(s(xf), s(gf), s(bf), 1e-5f, s(yf_aligned), s(meanf), s(rstdf));
    });
    t.expect_close(mean, 1e-7, 1e-6, "layernorm mean" + what);
    t.expect_close(rstd, 0, 1e-6, "layernorm rstd" + what);
    t.expect_close(y, 1e-6, kBf16Rel, "layernorm y" + what);
    t.expect_close(y_aligned, 1e-6, kBf16Rel, "layernorm y (aligned)" + what);
    expect_same_dut_f32(mean, meanf, "layernorm mean" + what);
    expect_same_dut_f32(rstd, rstdf, "layernorm rstd" + what);
    expect_rounded_dut(y, yf, "layernorm y against fp32" + what);
    expect_rounded_dut(y_aligned, yf_aligned, "layernorm y (aligned) against fp32" + what);

    auto dy = t.uniform_bf16({rows, c}), dyf = t.as_f32(dy);
    auto dx = t.output({rows, c}, DType::bf16), dxf = t.output({rows, c});
    auto dx_in_place = t.output_like(dy);  // dx over dy, as backward runs it
    auto dg = t.output_like(t.uniform({c})), db = t.output_like(t.uniform({c}));
    auto dgf = t.output_like(dg), dbf = t.output_like(db);
    t.run([&](Backend& be, Side s) {
      ops::layernorm_backward(be, s(dy), s(x), s(gamma), s(mean), s(rstd), s(dx), s(dg), s(db));
      ops::layernorm_backward(be, s(dyf), s(xf), s(gf), s(meanf), s(rstdf), s(dxf), s(dgf), s(dbf));
      ops::layernorm_backward(be, s(dx_in_place), s(x), s(gamma), s(mean), s(rstd), s(dx_in_place), Tensor(), Tensor());
    });
    t.expect_close(dx, 1e-5, kBf16Rel, "layernorm dx" + what);
    t.expect_close(dx_in_place, 1e-5, kBf16Rel, "layernorm dx over dy" + what);
    t.expect_close(dg, 1e-6, 1e-6, "layernorm dgamma (f32)" + what);
    t.expect_close(db, 1e-6, 1e-6, "layernorm dbeta (f32)" + what);
    expect_rounded_dut(dx, dxf, "layernorm dx against fp32" + what);
    expect_same_dut_f32(dg, dgf, "layernorm dgamma" + what);
    expect_same_dut_f32(db, dbf, "layernorm dbeta" + what);
  }
}

// RMSNorm: the fp32 case's tolerances (tests/backend_ops/cases_rmsnorm.cpp) plus a bf16 step
// against the CPU; bitwise the device's fp32 kernel on the widened values (bf16 outputs
// rounded, rstd and dgamma the same bits).
REMAT_OP_CASE(rmsnorm, bf16) {
  ActivationDTypeScope bf16(DType::bf16);
  const int64_t rows = 37;
  for (int64_t c : kRowLengths) {
    const std::string what = " C=" + std::to_string(c);
    auto x = t.uniform_bf16({rows, c}, -2.0f, 3.0f), gamma = t.uniform_bf16({c}, 0.5f, 1.5f);
    auto xf = t.as_f32(x), gf = t.as_f32(gamma);
    auto y = t.output({rows, c}, DType::bf16), y_aligned = aligned_bf16_output(t, {rows, c}), yf = t.output({rows, c}),
         yf_aligned = t.values(std::vector<float>(static_cast<size_t>(rows * c)), {rows, c});
    auto rstd = t.output({rows}), rstdf = t.output({rows});
    t.run([&](Backend& be, Side s) {
      be.rmsnorm_forward(s(x), s(gamma), 1e-6f, s(y), s(rstd));
      be.rmsnorm_forward(s(x), s(gamma), 1e-6f, s(y_aligned), s(rstd));
      be.rmsnorm_forward(s(xf), s(gf), 1e-6f, s(yf), s(rstdf));
      be.rmsnorm_forward(s(xf), s(gf), 1e-6f, s(yf_aligned), s(rstdf));
    });
    t.expect_close(rstd, 0, 1e-6, "rmsnorm rstd" + what);
    t.expect_close(y, 1e-6, kBf16Rel, "rmsnorm y" + what);
    t.expect_close(y_aligned, 1e-6, kBf16Rel, "rmsnorm y (aligned)" + what);
    expect_same_dut_f32(rstd, rstdf, "rmsnorm rstd" + what);
    expect_rounded_dut(y, yf, "rmsnorm y against fp32" + what);
    expect_rounded_dut(y_aligned, yf_aligned, "rmsnorm y (aligned) against fp32" + what);

    auto dy = t.uniform_bf16({rows, c}), dyf = t.as_f32(dy);
    auto dx = t.output({rows, c}, DType::bf16), dxf = t.output({rows, c});
    auto dx_aligned = aligned_bf16_output(t, {rows, c});
    auto dxf_aligned = t.values(std::vector<float>(static_cast<size_t>(rows * c)), {rows, c});
    auto dx_in_place = t.output_like(dy);  // dx over dy, as backward runs it
    auto dg = t.output_like(t.uniform({c})), dgf = t.output_like(dg);
    t.run([&](Backend& be, Side s) {
      be.rmsnorm_backward(s(dy), s(x), s(gamma), s(rstd), s(dx), s(dg));
      be.rmsnorm_backward(s(dy), s(x), s(gamma), s(rstd), s(dx_aligned), Tensor());
      be.rmsnorm_backward(s(dyf), s(xf), s(gf), s(rstdf), s(dxf), s(dgf));
      be.rmsnorm_backward(s(dyf), s(xf), s(gf), s(rstdf), s(dxf_aligned), Tensor());
      be.rmsnorm_backward(s(dx_in_place), s(x), s(gamma), s(rstd), s(dx_in_place), Tensor());
    });
    t.expect_close(dx, 1e-5, kBf16Rel, "rmsnorm dx" + what);
    t.expect_close(dx_aligned, 1e-5, kBf16Rel, "rmsnorm dx (aligned)" + what);
    t.expect_close(dx_in_place, 1e-5, kBf16Rel, "rmsnorm dx over dy" + what);
    t.expect_close(dg, 1e-6, 1e-6, "rmsnorm dgamma (f32)" + what);
    expect_rounded_dut(dx, dxf, "rmsnorm dx against fp32" + what);
    expect_rounded_dut(dx_aligned, dxf_aligned, "rmsnorm dx (aligned) against fp32" + what);
    expect_same_dut_f32(dg, dgf, "rmsnorm dgamma" + what);
  }
}

REMAT_OP_CASE(softmax_loss, bf16_softmax) {
  ActivationDTypeScope bf16(DType::bf16);
  const int64_t rows = 19;
  for (int64_t n : kRowLengths) {
    for (bool log : {false, true}) {
      const std::string what = std::string(log ? "log_softmax" : "softmax") + " n=" + std::to_string(n);
      auto x = t.uniform_bf16({rows, n}, -4.0f, 4.0f), xf = t.as_f32(x);
      auto y = t.output({rows, n}, DType::bf16), y_aligned = aligned_bf16_output(t, {rows, n}),
           yf = t.output({rows, n});
      auto yf_aligned = t.values(std::vector<float>(static_cast<size_t>(rows * n)), {rows, n});
      t.run([&](Backend& be, Side s) {
        be.softmax_forward(s(x), log, s(y));
        be.softmax_forward(s(x), log, s(y_aligned));
        be.softmax_forward(s(xf), log, s(yf));
        be.softmax_forward(s(xf), log, s(yf_aligned));
      });
      t.expect_close(y, 1e-5, kBf16Rel, what + " y");
      t.expect_close(y_aligned, 1e-5, kBf16Rel, what + " y (aligned)");
      expect_rounded_dut(y, yf, what + " y against fp32");
      expect_rounded_dut(y_aligned, yf_aligned, what + " y (aligned) against fp32");
      // Backward from the stored (bf16) y.
      auto dy = t.uniform_bf16({rows, n}), dyf = t.as_f32(dy), ys = t.as_f32(y_aligned);
      auto dx = aligned_bf16_output(t, {rows, n});
      auto dxf = t.values(std::vector<float>(static_cast<size_t>(rows * n)), {rows, n});
      t.run([&](Backend& be, Side s) {
        be.softmax_backward(s(dy), s(y_aligned), log, s(dx));
        be.softmax_backward(s(dyf), s(ys), log, s(dxf));
      });
      t.expect_close(dx, 1e-6, kBf16Rel, what + " dx");
      expect_rounded_dut(dx, dxf, what + " dx against fp32");
    }
  }
}

REMAT_OP_CASE(softmax_loss, bf16_cross_entropy_accuracy) {
  ActivationDTypeScope bf16(DType::bf16);
  const int64_t rows = 23;
  for (int64_t v : kRowLengths) {
    const std::string what = " V=" + std::to_string(v);
    auto logits = t.uniform_bf16({rows, v}, -5.0f, 5.0f), lf = t.as_f32(logits);
    auto tg = t.ints({rows}, 0, static_cast<int>(v - 1)).ref.to_ints();
    tg[3] = -100;
    tg[11] = -100;
    auto targets = t.int_values(tg, {rows});
    auto loss = t.output({1}), lse = t.output({rows}), lossf = t.output({1}), lsef = t.output({rows});
    t.run([&](Backend& be, Side s) {
      be.cross_entropy_forward(s(logits), s(targets), -100, s(loss), s(lse));
      be.cross_entropy_forward(s(lf), s(targets), -100, s(lossf), s(lsef));
    });
    t.expect_close(lse, 1e-5, 1e-6, "lse (f32)" + what);
    t.expect_close(loss, 1e-5, 1e-6, "loss (f32)" + what);
    expect_same_dut_f32(lse, lsef, "lse" + what);
    expect_same_dut_f32(loss, lossf, "loss" + what);
    auto d = t.output({rows, v}, DType::bf16), d_aligned = aligned_bf16_output(t, {rows, v});
    auto df = t.output({rows, v});
    auto df_aligned = t.values(std::vector<float>(static_cast<size_t>(rows * v)), {rows, v});
    t.run([&](Backend& be, Side s) {
      be.cross_entropy_backward(0.7f, s(logits), s(targets), s(lse), -100, s(d));
      be.cross_entropy_backward(0.7f, s(logits), s(targets), s(lse), -100, s(d_aligned));
      be.cross_entropy_backward(0.7f, s(lf), s(targets), s(lsef), -100, s(df));
      be.cross_entropy_backward(0.7f, s(lf), s(targets), s(lsef), -100, s(df_aligned));
    });
    t.expect_close(d, 1e-9, kBf16Rel, "dlogits" + what);
    t.expect_close(d_aligned, 1e-9, kBf16Rel, "dlogits (aligned)" + what);
    expect_rounded_dut(d, df, "dlogits against fp32" + what);
    expect_rounded_dut(d_aligned, df_aligned, "dlogits (aligned) against fp32" + what);
    int64_t counted[2] = {0, 0}, correct[2] = {0, 0};
    t.run([&](Backend& be, Side s) {
      correct[s.ref ? 0 : 1] = be.accuracy(s(logits), s(targets), -100, &counted[s.ref ? 0 : 1]);
    });
    if (!perf_iterations()) {
      EXPECT_EQ(correct[0], correct[1]) << "accuracy" << what;
      EXPECT_EQ(counted[0], counted[1]) << "accuracy counted" << what;
      EXPECT_EQ(counted[1], rows - 2) << "accuracy counted" << what;
    }
  }
}

// ---- Embedding: a gather (+ positions), gradients into f32 tables: bitwise the CPU ----------

REMAT_OP_CASE(embedding, bf16) {
  ActivationDTypeScope bf16(DType::bf16);
  const int64_t B = 3, T = 9, V = 20;
  for (int64_t c : {40, 37, 256}) {  // units of eight bf16, one by one, several 256-channel chunks
    const std::string what = " C=" + std::to_string(c);
    auto ids = t.ints({B, T}, 0, static_cast<int>(V - 1));
    auto table = t.uniform_bf16({V, c}), pos = t.uniform_bf16({T, c});
    auto y = t.output({B, T, c}, DType::bf16), y_aligned = aligned_bf16_output(t, {B, T, c});
    auto y_nopos = t.output({B, T, c}, DType::bf16);
    auto table_f32 = t.uniform({V, c});  // an f32 table into a bf16 y (mixed)
    auto y_mixed = t.output({B, T, c}, DType::bf16);
    t.run([&](Backend& be, Side s) {
      be.embedding_forward(s(ids), s(table), s(pos), s(y));
      be.embedding_forward(s(ids), s(table), s(pos), s(y_aligned));
      be.embedding_forward(s(ids), s(table), Tensor(), s(y_nopos));
      be.embedding_forward(s(ids), s(table_f32), s(pos), s(y_mixed));
    });
    t.expect_equal(y, "embedding y" + what);
    t.expect_equal(y_aligned, "embedding y (aligned)" + what);
    t.expect_equal(y_nopos, "embedding y (no positions)" + what);
    t.expect_equal(y_mixed, "embedding y (f32 table)" + what);
    auto dy = t.uniform_bf16({B, T, c});
    auto dtable = t.output_like(t.uniform({V, c})), dpos = t.output_like(t.uniform({T, c}));
    t.run([&](Backend& be, Side s) { ops::embedding_backward(be, s(dy), s(ids), s(dtable), s(dpos)); });
    t.expect_equal(dtable, "embedding dtable (f32)" + what);
    t.expect_equal(dpos, "embedding dpos_table (f32)" + what);
  }
}

// ---- Attention: bf16 GEMMs (fp32 scores and dPd), probabilities rounded as stored ---------
// probs: the fp32 case's tolerance, then a bf16 step. out and dqkv: sums of T products of
// bf16 values, the device rounding its dropped probabilities and dS to bf16 for the GEMMs
// where the CPU keeps them in fp32: 1/64 of the largest |value| absolute (as the CPU's own
// bf16 test, tests/ops/test_bf16_ops.cpp: rounding errors of the summed terms scale with
// the terms, not with a result that cancels) + 1/64 relative.
// Backward runs from the same stored probabilities on both sides.

namespace {
// The largest |value| of the reference (cpu) side.
double max_abs(const Pair& p) {
  double m = 0.0;
  for (uint16_t b : dut_bits(p.ref)) {
    const double v = std::fabs(static_cast<double>(bf16_to_float(b)));
    if (std::isfinite(v)) m = std::max(m, v);
  }
  return m;
}
}  // namespace

REMAT_OP_CASE(attention, bf16) {
  ActivationDTypeScope bf16(DType::bf16);
  struct Shape4 {
    int64_t b, t, c;
    AttentionParams p;
  };
  for (const Shape4& sh : {Shape4{2, 24, 32, {4, true, 0.2f}}, Shape4{3, 37, 24, {2, false, 0.0f}},
                           Shape4{2, 17, 48, {3, true, 0.0f}}, Shape4{1, 40, 16, {1, false, 0.5f}}}) {
    for (int64_t group_batch : {0, 1}) {  // the default scratch limit, and one batch element per group
      const int64_t B = sh.b, T = sh.t, C = sh.c, H = sh.p.n_head;
      const std::string what = " B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
                               " H=" + std::to_string(H) + (sh.p.causal ? " causal" : "") +
                               " dropout=" + std::to_string(sh.p.dropout) + " groups of " +
                               (group_batch ? std::to_string(group_batch) : std::string("all"));
      const RngState rng{0xa77e ^ static_cast<uint64_t>(T), 96};
      auto qkv = t.uniform_bf16({B, T, 3 * C}, -2.0f, 2.0f);
      auto out = t.output({B, T, C}, DType::bf16), probs = t.output({B, H, T, T}, DType::bf16);
      auto probs_only = t.output({B, H, T, T}, DType::bf16);
      auto dout = t.uniform_bf16({B, T, C});
      auto dqkv = t.output({B, T, 3 * C}, DType::bf16);
      Pair probs_same;
      t.run([&](Backend& be, Side s) {
        const int64_t old = be.tuning().set_attention_group_bytes(group_batch * H * T * T * 4);
        auto ws = [&](size_t bytes) { return Tensor::empty(Shape{static_cast<int64_t>(bytes / 4 + 1)}, be.device()); };
        Tensor wf = ws(be.attention_forward_workspace(s(qkv).shape(), sh.p));
        be.attention_forward(s(qkv), sh.p, rng, s(out), s(probs), wf);
        be.attention_forward(s(qkv), sh.p, rng, Tensor(), s(probs_only), wf);
        be.tuning().set_attention_group_bytes(old);
      });
      t.expect_close(probs, 2e-6, kBf16Rel, "probs" + what);
      t.expect_close(probs_only, 2e-6, kBf16Rel, "probs only" + what);
      t.expect_close(out, max_abs(out) / 64, 1.0 / 64, "out" + what);
      probs_same = t.output_like(probs);  // the cpu's probabilities on both sides
      t.run([&](Backend& be, Side s) {
        const int64_t old = be.tuning().set_attention_group_bytes(group_batch * H * T * T * 4);
        Tensor wb = Tensor::empty(
            Shape{static_cast<int64_t>(be.attention_backward_workspace(s(qkv).shape(), sh.p) / 4 + 1)}, be.device());
        be.attention_backward(s(dout), s(qkv), s(probs_same), sh.p, rng, s(dqkv), wb);
        be.tuning().set_attention_group_bytes(old);
      });
      t.expect_close(dqkv, max_abs(dqkv) / 64, 1.0 / 64, "dqkv" + what);
    }
  }
  // Mixed f32 and bf16 tensors are refused on the device, naming the op and tensors.
  auto qkv = t.uniform_bf16({1, 4, 12});
  auto out = t.output({1, 4, 4}, DType::bf16), probs = t.output({1, 1, 4, 4});
  Backend& dut = backend_for(t.device());
  Tensor ws = Tensor::empty(
      Shape{static_cast<int64_t>(dut.attention_forward_workspace(qkv.dut.shape(), {1, true, 0.0f}) / 4 + 1)},
      t.device());
  try {
    dut.attention_forward(qkv.dut, {1, true, 0.0f}, RngState{1, 0}, out.dut, probs.dut, ws);
    ADD_FAILURE() << "attention with bf16 qkv and f32 probs was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention_forward"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected all f32 or all bf16"), std::string::npos) << e.what();
  }
}

REMAT_OP_CASE(attention, bf16_permute_0213) {
  ActivationDTypeScope bf16(DType::bf16);
  for (const Shape& sh : {Shape{2, 3, 4, 16}, Shape{2, 5, 3, 7}}) {
    auto x = t.uniform_bf16(sh);
    auto y = t.output({sh[0], sh[2], sh[1], sh[3]}, DType::bf16);
    auto y_aligned = aligned_bf16_output(t, {sh[0], sh[2], sh[1], sh[3]});
    auto back = aligned_bf16_output(t, sh);
    t.run([&](Backend& be, Side s) {
      be.permute_0213(s(x), s(y));
      be.permute_0213(s(x), s(y_aligned));
      be.permute_0213(s(y_aligned), s(back));
    });
    t.expect_equal(y, "permute " + sh.str());
    t.expect_equal(y_aligned, "permute (aligned) " + sh.str());
    t.expect_equal(back, "permute twice " + sh.str());
    EXPECT_EQ(dut_bits(back.dut), dut_bits(x.dut)) << "permute twice is the identity " << sh.str();
  }
}

// ---- Batch norm: statistics in double and f32 as in fp32, bf16 x/y/dy/dx ----------------
// Against the CPU: the fp32 case's 1e-6 (tests/backend_ops/cases_batchnorm.cpp) plus a bf16
// step on y and dx; the statistics, running buffers and parameter gradients f32 within
// 1e-6. Against the device's fp32 kernel on the widened values: bitwise (the same segments
// and packs of four; bf16 outputs rounded), aligned (packs) and guarded (one by one).

REMAT_OP_CASE(batchnorm, bf16) {
  ActivationDTypeScope bf16(DType::bf16);
  for (const Shape& xs : {Shape{4, 8, 12, 12}, Shape{3, 5, 7, 9}, Shape{2, 300, 1, 1}}) {
    const std::string what = " x " + xs.str();
    const Shape cs{xs[1]};
    auto x = t.uniform_bf16(xs, -1.0f, 2.0f), gamma = t.uniform_bf16(cs, 0.5f, 1.5f), beta = t.uniform_bf16(cs);
    auto xf = t.as_f32(x), gf = t.as_f32(gamma), bf = t.as_f32(beta);
    auto rm = t.output_like(t.uniform(cs)), rv = t.output_like(t.uniform(cs, 0.5f, 1.5f));
    auto rmf = t.output_like(rm), rvf = t.output_like(rv);
    auto y = t.output(xs, DType::bf16), y_aligned = aligned_bf16_output(t, xs), yf = t.output(xs);
    auto yf_aligned = t.values(std::vector<float>(static_cast<size_t>(xs.numel())), xs);
    auto mean = t.output(cs), invstd = t.output(cs), meanf = t.output(cs), invstdf = t.output(cs);
    BatchNormParams p;
    p.momentum = 0.1f;
    t.run([&](Backend& be, Side s) {
      be.batchnorm2d_forward_train(s(x), s(gamma), s(beta), s(rm), s(rv), p, true, s(y), s(mean), s(invstd));
      be.batchnorm2d_forward_train(s(x), s(gamma), s(beta), s(rm), s(rv), p, false, s(y_aligned), s(mean), s(invstd));
      be.batchnorm2d_forward_train(s(xf), s(gf), s(bf), s(rmf), s(rvf), p, true, s(yf), s(meanf), s(invstdf));
      be.batchnorm2d_forward_train(s(xf), s(gf), s(bf), s(rmf), s(rvf), p, false, s(yf_aligned), s(meanf), s(invstdf));
    });
    t.expect_close(y, 1e-6, 1e-6 + kBf16Rel, "batchnorm y" + what);
    t.expect_close(y_aligned, 1e-6, 1e-6 + kBf16Rel, "batchnorm y (aligned)" + what);
    t.expect_close(mean, 1e-6, 1e-6, "batchnorm save_mean" + what);
    t.expect_close(invstd, 0, 1e-6, "batchnorm save_invstd" + what);
    t.expect_close(rm, 1e-6, 1e-6, "batchnorm running_mean" + what);
    t.expect_close(rv, 0, 1e-6, "batchnorm running_var" + what);
    expect_rounded_dut(y, yf, "batchnorm y against fp32" + what);
    expect_rounded_dut(y_aligned, yf_aligned, "batchnorm y (aligned) against fp32" + what);
    for (const auto& [a, b, n] : {std::tuple{&mean, &meanf, "save_mean"}, std::tuple{&invstd, &invstdf, "save_invstd"},
                                  std::tuple{&rm, &rmf, "running_mean"}, std::tuple{&rv, &rvf, "running_var"}})
      expect_same_dut_f32(*a, *b, std::string("batchnorm ") + n + what);

    auto ye = t.output(xs, DType::bf16), yef = t.output(xs);
    t.run([&](Backend& be, Side s) {
      be.batchnorm2d_forward_eval(s(x), s(gamma), s(beta), s(rm), s(rv), p, s(ye));
      be.batchnorm2d_forward_eval(s(xf), s(gf), s(bf), s(rmf), s(rvf), p, s(yef));
    });
    t.expect_close(ye, 1e-6, 1e-6 + kBf16Rel, "batchnorm eval y" + what);
    expect_rounded_dut(ye, yef, "batchnorm eval y against fp32" + what);

    auto dy = t.uniform_bf16(xs), dyf = t.as_f32(dy);
    auto dx = t.output(xs, DType::bf16), dx_aligned = aligned_bf16_output(t, xs), dxf = t.output(xs);
    auto dxf_aligned = t.values(std::vector<float>(static_cast<size_t>(xs.numel())), xs);
    auto dx_in_place = t.output_like(dy);  // dx over dy
    auto dg = t.output_like(t.uniform(cs)), db = t.output_like(t.uniform(cs));
    auto dgf = t.output_like(dg), dbf = t.output_like(db);
    t.run([&](Backend& be, Side s) {
      be.batchnorm2d_backward(s(dy), s(x), s(gamma), s(mean), s(invstd), s(dx), s(dg), s(db));
      be.batchnorm2d_backward(s(dy), s(x), s(gamma), s(mean), s(invstd), s(dx_aligned), Tensor(), Tensor());
      be.batchnorm2d_backward(s(dyf), s(xf), s(gf), s(meanf), s(invstdf), s(dxf), s(dgf), s(dbf));
      be.batchnorm2d_backward(s(dyf), s(xf), s(gf), s(meanf), s(invstdf), s(dxf_aligned), Tensor(), Tensor());
      be.batchnorm2d_backward(s(dx_in_place), s(x), s(gamma), s(mean), s(invstd), s(dx_in_place), Tensor(), Tensor());
    });
    // Each side's backward reads its own statistics (a float ulp apart, where the fp32 case
    // feeds both sides the same ones): 1e-5, ten times that case's tolerance.
    t.expect_close(dx, 1e-5, 1e-5 + kBf16Rel, "batchnorm dx" + what);
    t.expect_close(dx_aligned, 1e-5, 1e-5 + kBf16Rel, "batchnorm dx (aligned)" + what);
    t.expect_close(dx_in_place, 1e-5, 1e-5 + kBf16Rel, "batchnorm dx over dy" + what);
    t.expect_close(dg, 1e-5, 1e-5, "batchnorm dgamma (f32)" + what);
    t.expect_close(db, 1e-5, 1e-5, "batchnorm dbeta (f32)" + what);
    expect_rounded_dut(dx, dxf, "batchnorm dx against fp32" + what);
    expect_rounded_dut(dx_aligned, dxf_aligned, "batchnorm dx (aligned) against fp32" + what);
    expect_same_dut_f32(dg, dgf, "batchnorm dgamma against fp32" + what);
    expect_same_dut_f32(db, dbf, "batchnorm dbeta against fp32" + what);
  }
}

// ---- Pooling: bitwise the CPU (the same scan and sums in fp32, bf16 outputs rounded once) ---
// Max pooling's backward into a bf16 dx sums in fp32 a tile of 1024 elements at a time (a
// 40 x 41 plane takes two tiles); overlapping windows make an input the maximum of several
// outputs, whose fp32 sum is rounded once as on the CPU. Global average pooling sums in
// double in another order than the CPU: its fp32 case's 1e-6 relative plus a bf16 step,
// and bitwise the device's fp32 kernel rounded (packs of four bf16 read the elements the
// float4 path reads).

namespace {

Pool2dParams pool_params(int k, int s, int pad) {
  Pool2dParams p;
  p.kernel_h = p.kernel_w = k;
  p.stride_h = p.stride_w = s;
  p.pad_h = p.pad_w = pad;
  return p;
}

}  // namespace

REMAT_OP_CASE(pool, bf16) {
  ActivationDTypeScope bf16(DType::bf16);
  struct Case {
    Shape x;
    Pool2dParams p;
  };
  for (const Case& c : {Case{{2, 8, 28, 28}, pool_params(2, 2, 0)}, Case{{2, 3, 15, 13}, pool_params(3, 2, 1)},
                        Case{{1, 2, 40, 41}, pool_params(3, 1, 1)}}) {
    const std::string what = " x " + c.x.str() + " k" + std::to_string(c.p.kernel_h) + " s" +
                             std::to_string(c.p.stride_h) + " p" + std::to_string(c.p.pad_h);
    const Shape ys = pool2d_output_shape(c.x, c.p);
    std::vector<float> xv = t.uniform_bf16(c.x).ref.to_vector();
    xv[5] = std::numeric_limits<float>::quiet_NaN();  // a NaN wins its windows
    xv[40] = xv[41];                                  // a tie keeps the first
    auto x = t.values_bf16(xv, c.x), xf = t.as_f32(x);
    auto y = t.output(ys, DType::bf16), idx = t.output(ys, DType::u8), yf = t.output(ys);
    auto idxf = t.output(ys, DType::u8);
    t.run([&](Backend& be, Side s) {
      be.maxpool2d_forward(s(x), c.p, s(y), s(idx));
      be.maxpool2d_forward(s(xf), c.p, s(yf), s(idxf));
    });
    t.expect_equal(y, "maxpool y" + what);
    t.expect_equal(idx, "maxpool indices" + what);
    expect_rounded_dut(y, yf, "maxpool y against fp32" + what);

    auto dy = t.uniform_bf16(ys), dyf = t.as_f32(dy);
    auto dx = t.output(c.x, DType::bf16), dx_f32 = t.output(c.x), dxf = t.output(c.x);
    t.run([&](Backend& be, Side s) {
      be.maxpool2d_backward(s(dy), s(idx), c.p, s(dx));      // fp32 tiles in shared memory
      be.maxpool2d_backward(s(dy), s(idx), c.p, s(dx_f32));  // a bf16 dy into an f32 dx
      be.maxpool2d_backward(s(dyf), s(idx), c.p, s(dxf));
    });
    t.expect_equal(dx, "maxpool dx" + what);
    t.expect_equal(dx_f32, "maxpool dx (f32) from a bf16 dy" + what);
    expect_rounded_dut(dx, dxf, "maxpool dx against fp32" + what);

    auto ya = t.output(ys, DType::bf16), yaf = t.output(ys);
    t.run([&](Backend& be, Side s) {
      be.avgpool2d_forward(s(x), c.p, s(ya));
      be.avgpool2d_forward(s(xf), c.p, s(yaf));
    });
    t.expect_equal(ya, "avgpool y" + what);
    expect_rounded_dut(ya, yaf, "avgpool y against fp32" + what);
    auto dxa = t.output(c.x, DType::bf16), dxaf = t.output(c.x);
    t.run([&](Backend& be, Side s) {
      be.avgpool2d_backward(s(dy), c.p, s(dxa));
      be.avgpool2d_backward(s(dyf), c.p, s(dxaf));
    });
    t.expect_equal(dxa, "avgpool dx" + what);
    expect_rounded_dut(dxa, dxaf, "avgpool dx against fp32" + what);
  }
  // Global average pooling: planes of 49 (one by one) and 64 elements (packs of four when
  // aligned), bf16 or f32 y from a bf16 x.
  for (const Shape& xs : {Shape{3, 5, 7, 7}, Shape{2, 9, 8, 8}}) {
    const std::string what = " x " + xs.str();
    const Shape ys{xs[0], xs[1]};
    auto x = t.uniform_bf16(xs, -2.0f, 3.0f), xf = t.as_f32(x);
    auto y = t.output(ys, DType::bf16), y_f32 = t.output(ys), yf = t.output(ys);
    t.run([&](Backend& be, Side s) {
      be.global_avgpool_forward(s(x), s(y));
      be.global_avgpool_forward(s(x), s(y_f32));
      be.global_avgpool_forward(s(xf), s(yf));
    });
    t.expect_close(y, 0, 1e-6 + kBf16Rel, "global_avgpool y" + what);
    t.expect_close(y_f32, 0, 1e-6, "global_avgpool y (f32)" + what);
    expect_rounded_dut(y, yf, "global_avgpool y against fp32" + what);
    expect_same_dut_f32(y_f32, yf, "global_avgpool y (f32) against fp32" + what);
    auto dy = t.uniform_bf16(ys), dyf = t.as_f32(dy);
    auto dx = t.output(xs, DType::bf16), dx_aligned = aligned_bf16_output(t, xs), dxf = t.output(xs);
    t.run([&](Backend& be, Side s) {
      be.global_avgpool_backward(s(dy), s(dx));
      be.global_avgpool_backward(s(dy), s(dx_aligned));
      be.global_avgpool_backward(s(dyf), s(dxf));
    });
    t.expect_equal(dx, "global_avgpool dx" + what);
    t.expect_equal(dx_aligned, "global_avgpool dx (aligned)" + what);
    expect_rounded_dut(dx, dxf, "global_avgpool dx against fp32" + what);
  }
}

}  // namespace remat::test
