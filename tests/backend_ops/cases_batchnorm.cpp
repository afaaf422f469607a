// BatchNorm2d against the CPU backend: training forward (batch statistics, running
// statistics moved or not), evaluation forward and backward, at the shipped models'
// shapes (fashion_cnn: 32 and 64 channels; resnet_tiny: 16 to 64 channels down to 7x7)
// and odd ones; float4 and scalar paths; more channels than one round of partial sums.
//
// Tolerance: both sides reduce in double (in different orders) and then apply the same
// float formulas (the GPU rounds each operation as the CPU's unfused code does), so the
// statistics and parameter gradients differ by at most a float ulp from rounding the
// doubles (1e-6 relative), and y / dx by the effect of such an ulp in their coefficients:
// 1e-6 absolute plus 1e-6 relative (the values are of order 1).
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "backend_ops/harness.h"

namespace remat::test {

namespace {

constexpr double kTol = 1e-6;

// An output without guards, 16-byte aligned (the harness's guarded outputs are not), so
// that the float4 paths run; NaN-filled like a guarded one.
Pair aligned_output(OpCheck& t, const Shape& s) {
  return t.values(std::vector<float>(static_cast<size_t>(s.numel()), std::numeric_limits<float>::quiet_NaN()), s);
}

void check_train(OpCheck& t, const Shape& xs, bool update_running, float lo = -1.0f, float hi = 1.0f) {
  const Shape cs{xs[1]};
  auto x = t.uniform(xs, lo, hi), gamma = t.uniform(cs, 0.5f, 1.5f), beta = t.uniform(cs);
  auto rm = t.output_like(t.uniform(cs)), rv = t.output_like(t.uniform(cs, 0.5f, 1.5f));
  auto y = t.output(xs), y_aligned = aligned_output(t, xs);
  auto mean = t.output(cs), invstd = t.output(cs);
  BatchNormParams p;
  p.momentum = 0.1f;
  t.run([&](Backend& be, Side s) {
    be.batchnorm2d_forward_train(s(x), s(gamma), s(beta), s(rm), s(rv), p, update_running, s(y), s(mean), s(invstd));
  });
  t.expect_close(y, kTol, kTol, "y");
  t.expect_close(mean, kTol, kTol, "save_mean");
  t.expect_close(invstd, 0.0, kTol, "save_invstd");
  t.expect_close(rm, kTol, kTol, "running_mean");
  t.expect_close(rv, 0.0, kTol, "running_var");
  // Again into an aligned y (the float4 path where H * W % 4 == 0), statistics not moved.
  t.run([&](Backend& be, Side s) {
    be.batchnorm2d_forward_train(s(x), s(gamma), s(beta), s(rm), s(rv), p, false, s(y_aligned), s(mean), s(invstd));
  });
  t.expect_close(y_aligned, kTol, kTol, "y (aligned)");
}

void check_backward(OpCheck& t, const Shape& xs) {
  const Shape cs{xs[1]};
  auto dy = t.uniform(xs), x = t.uniform(xs), gamma = t.uniform(cs, 0.5f, 1.5f);
  auto mean = t.uniform(cs, -0.1f, 0.1f), invstd = t.uniform(cs, 0.5f, 2.0f);
  auto dx = t.output(xs), dx_aligned = aligned_output(t, xs);
  auto dgamma = t.output_like(t.uniform(cs)), dbeta = t.output_like(t.uniform(cs));  // accumulated into
  t.run([&](Backend& be, Side s) {
    be.batchnorm2d_backward(s(dy), s(x), s(gamma), s(mean), s(invstd), s(dx), s(dgamma), s(dbeta));
    be.batchnorm2d_backward(s(dy), s(x), s(gamma), s(mean), s(invstd), s(dx_aligned), Tensor(), Tensor());
  });
  t.expect_close(dx, kTol, kTol, "dx");
  t.expect_close(dx_aligned, kTol, kTol, "dx (aligned)");
  t.expect_close(dgamma, kTol, kTol, "dgamma");
  t.expect_close(dbeta, kTol, kTol, "dbeta");

  // Parameter gradients only (one block per channel), and dgamma without dbeta.
  auto dgamma2 = t.output_like(t.uniform(cs)), dbeta2 = t.output_like(t.uniform(cs));
  t.run([&](Backend& be, Side s) {
    be.batchnorm2d_backward(s(dy), s(x), s(gamma), s(mean), s(invstd), Tensor(), s(dgamma2), s(dbeta2));
    be.batchnorm2d_backward(s(dy), s(x), s(gamma), s(mean), s(invstd), Tensor(), s(dgamma2), Tensor());
  });
  t.expect_close(dgamma2, kTol, kTol, "dgamma (no dx)");
  t.expect_close(dbeta2, kTol, kTol, "dbeta (no dx)");
}

}  // namespace

REMAT_OP_CASE(batchnorm, train_fashion) {
  check_train(t, {4, 32, 28, 28}, true);
  check_train(t, {4, 64, 14, 14}, true);
}

REMAT_OP_CASE(batchnorm, train_resnet) {
  check_train(t, {4, 16, 28, 28}, true);
  check_train(t, {4, 64, 7, 7}, true);  // 49: scalar path
}

// Odd sizes; statistics not moved; one value per channel (variance 0); a mean far from 0
// (the one-pass variance works on deviations from a shift).
REMAT_OP_CASE(batchnorm, train_odd) {
  check_train(t, {3, 5, 7, 9}, false);
  check_train(t, {1, 4, 1, 1}, false);
  check_train(t, {2, 3, 1, 1}, true);
  check_train(t, {3, 6, 10, 10}, true, 99.0f, 101.0f);
  check_train(t, {2, 3, 0, 4}, false);  // empty planes: mean 0, invstd 1 / sqrt(eps)
}

// More channels than one round of partial sums in the 64 KiB scratch (4096 at one segment).
REMAT_OP_CASE(batchnorm, train_many_channels) { check_train(t, {2, 5000, 1, 1}, true); }

REMAT_OP_CASE(batchnorm, eval) {
  for (const Shape& xs : {Shape{4, 32, 28, 28}, Shape{3, 5, 7, 9}, Shape{2, 64, 7, 7}}) {
    const Shape cs{xs[1]};
    auto x = t.uniform(xs), gamma = t.uniform(cs, 0.5f, 1.5f), beta = t.uniform(cs);
    auto rm = t.uniform(cs), rv = t.uniform(cs, 0.5f, 1.5f);
    auto y = t.output(xs), y_aligned = aligned_output(t, xs);
    t.run([&](Backend& be, Side s) {
      be.batchnorm2d_forward_eval(s(x), s(gamma), s(beta), s(rm), s(rv), {}, s(y));
      be.batchnorm2d_forward_eval(s(x), s(gamma), s(beta), s(rm), s(rv), {}, s(y_aligned));
    });
    t.expect_close(y, kTol, kTol, "y " + xs.str());
    t.expect_close(y_aligned, kTol, kTol, "y (aligned) " + xs.str());
  }
}

REMAT_OP_CASE(batchnorm, backward) {
  check_backward(t, {4, 32, 28, 28});
  check_backward(t, {4, 64, 7, 7});
  check_backward(t, {3, 5, 7, 9});
  check_backward(t, {2, 3, 1, 1});
}

REMAT_OP_CASE(batchnorm, backward_many_channels) { check_backward(t, {2, 5000, 1, 1}); }

// The same inputs twice give the same bits.
REMAT_OP_CASE(batchnorm, deterministic) {
  const Shape xs{4, 16, 14, 14}, cs{16};
  auto dy = t.uniform(xs), x = t.uniform(xs), gamma = t.uniform(cs), mean = t.uniform(cs), invstd = t.uniform(cs);
  const auto g0 = t.uniform(cs);
  auto dx1 = t.output(xs), dx2 = t.output(xs);
  auto dg1 = t.output_like(g0), dg2 = t.output_like(g0);
  Backend& dut = backend_for(t.device());
  dut.batchnorm2d_backward(dy.dut, x.dut, gamma.dut, mean.dut, invstd.dut, dx1.dut, dg1.dut, Tensor());
  dut.batchnorm2d_backward(dy.dut, x.dut, gamma.dut, mean.dut, invstd.dut, dx2.dut, dg2.dut, Tensor());
  EXPECT_EQ(dx1.dut.to_vector(), dx2.dut.to_vector());
  EXPECT_EQ(dg1.dut.to_vector(), dg2.dut.to_vector());
}

// ---- bf16 (training.precision bf16; the two references: backend_ops/harness.h) ----------------
// Statistics in double and f32 as in fp32, bf16 x/y/dy/dx.
// Against the CPU: the fp32 case's 1e-6 (above) plus a bf16
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

// ---- Gradients: the device's backward against central differences of its own forward --------
// (backend_ops/harness.h, "Gradient cases")

// Training mode (batch statistics; running statistics not updated).
REMAT_OP_CASE(batchnorm, grad) {
  auto zeros = [&](int64_t c) { return t.output_like(t.values(std::vector<float>(c, 0.0f), {c})); };
  const Shape bs{4, 3, 3, 5};
  auto bx = t.uniform(bs, -2.0f, 2.0f), bdy = t.uniform(bs), bg = t.uniform({3}, 0.5f, 1.5f), bb = t.uniform({3});
  auto y = t.output(bs), m = t.output({3}), is = t.output({3}), dx = t.output(bs), dg = zeros(3), db = zeros(3);
  t.run([&](Backend& be, Side d) {
    be.batchnorm2d_forward_train(d(bx), d(bg), d(bb), Tensor(), Tensor(), BatchNormParams{}, false, d(y), d(m), d(is));
    be.batchnorm2d_backward(d(bdy), d(bx), d(bg), d(m), d(is), d(dx), d(dg), d(db));
  });
  auto loss = [&](Backend& be) {
    be.batchnorm2d_forward_train(bx.dut, bg.dut, bb.dut, Tensor(), Tensor(), BatchNormParams{}, false, y.dut, m.dut,
                                 is.dut);
    return dot(bdy.dut, y.dut);
  };
  t.expect_gradient("batchnorm2d dx", bx, dx, loss);
  t.expect_gradient("batchnorm2d dgamma", bg, dg, loss);
  t.expect_gradient("batchnorm2d dbeta", bb, db, loss);
}

}  // namespace remat::test
