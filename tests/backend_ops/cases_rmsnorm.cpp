// RMS norm forward and backward against the cpu backend.
//
// Tolerances: both backends take the row sums in double (in different orders, so they may
// round to a different float in the last bit) and the elementwise formulas in float; a GPU
// may contract the products of dgamma's double sums into FMAs. So rstd agrees to ~1 ulp,
// y and dx to a few ulp of their terms, dgamma to ~1 ulp.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend_ops/harness.h"

namespace remat::test {

namespace {

// An output at the start of its own allocation (16-byte aligned: the float4 path runs).
Pair aligned_output(OpCheck& t, const Shape& s) {
  return t.values(std::vector<float>(static_cast<size_t>(s.numel()), std::numeric_limits<float>::quiet_NaN()), s);
}

struct Forward {
  Pair y, rstd;
};

Forward run_forward(OpCheck& t, const Pair& x, const Pair& gamma, float eps, bool aligned_y) {
  const Shape& s = x.ref.shape();
  Forward f{aligned_y ? aligned_output(t, s) : t.output(s), t.output({s.numel() / s[-1]})};
  t.run([&](Backend& be, Side side) {
    be.rmsnorm_forward(side(x), side(gamma), RmsNormParams{eps}, side(f.y), side(f.rstd));
  });
  return f;
}

std::string what(const Shape& s) { return "rmsnorm " + s.str(); }

}  // namespace

// C = 1, under and over a warp, GPT-2's 768 (float4 packs), warp-per-row at its limit and
// past it (a block per row), rank 3.
REMAT_OP_CASE(rmsnorm, forward_shapes) {
  for (const Shape& s :
       {Shape{3, 1}, Shape{5, 7}, Shape{4, 33}, Shape{5, 768}, Shape{3, 1024}, Shape{2, 1025}, Shape{2, 3, 36}}) {
    auto x = t.uniform(s, -2.0f, 3.0f), gamma = t.uniform({s[-1]}, 0.5f, 1.5f);
    for (bool aligned : {false, true}) {
      const Forward f = run_forward(t, x, gamma, 1e-6f, aligned);
      t.expect_close(f.rstd, 0, 1e-6, what(s) + " rstd");
      t.expect_close(f.y, 1e-6, 1e-5, what(s) + " y");
    }
  }
}

REMAT_OP_CASE(rmsnorm, backward_shapes_and_dx_over_dy) {
  for (const Shape& s : {Shape{5, 7}, Shape{4, 33}, Shape{5, 768}, Shape{2, 1025}, Shape{300, 45}}) {
    const int64_t c = s[-1];
    auto x = t.uniform(s, -2.0f, 3.0f), gamma = t.uniform({c}, 0.5f, 1.5f), dy = t.uniform(s);
    const Forward f = run_forward(t, x, gamma, 1e-6f, false);
    auto dx = t.output(s), dgamma = t.output_like(t.uniform({c}));
    t.run([&](Backend& be, Side side) {
      be.rmsnorm_backward(side(dy), side(x), side(gamma), side(f.rstd), side(dx), side(dgamma));
    });
    t.expect_close(dx, 1e-5, 1e-5, what(s) + " dx");
    t.expect_close(dgamma, 1e-6, 1e-6, what(s) + " dgamma");
    // dx written over dy: dgamma must still see the original dy.
    auto dy_dx = t.output_like(dy), dgamma2 = t.output_like(t.uniform({c}));
    t.run([&](Backend& be, Side side) {
      be.rmsnorm_backward(side(dy_dx), side(x), side(gamma), side(f.rstd), side(dy_dx), side(dgamma2));
    });
    t.expect_close(dy_dx, 1e-5, 1e-5, what(s) + " dx over dy");
    t.expect_close(dgamma2, 1e-6, 1e-6, what(s) + " dgamma (dx over dy)");
  }
}

// ---- bf16 (training.precision bf16; the two references: backend_ops/harness.h) ----------------
// RMSNorm: the fp32 case's tolerances (above) plus a bf16 step
// against the CPU; bitwise the device's fp32 kernel on the widened values (bf16 outputs
// rounded, rstd and dgamma the same bits).
REMAT_OP_CASE(rmsnorm, bf16) {
  ActivationDTypeScope bf16(DType::bf16);
  const int64_t rows = 37;
  for (int64_t c : kBf16RowLengths) {
    const std::string what = " C=" + std::to_string(c);
    auto x = t.uniform_bf16({rows, c}, -2.0f, 3.0f), gamma = t.uniform_bf16({c}, 0.5f, 1.5f);
    auto xf = t.as_f32(x), gf = t.as_f32(gamma);
    auto y = t.output({rows, c}, DType::bf16), y_aligned = aligned_bf16_output(t, {rows, c}), yf = t.output({rows, c}),
         yf_aligned = t.values(std::vector<float>(static_cast<size_t>(rows * c)), {rows, c});
    auto rstd = t.output({rows}), rstdf = t.output({rows});
    t.run([&](Backend& be, Side s) {
      be.rmsnorm_forward(s(x), s(gamma), RmsNormParams{1e-6f}, s(y), s(rstd));
      be.rmsnorm_forward(s(x), s(gamma), RmsNormParams{1e-6f}, s(y_aligned), s(rstd));
      be.rmsnorm_forward(s(xf), s(gf), RmsNormParams{1e-6f}, s(yf), s(rstdf));
      be.rmsnorm_forward(s(xf), s(gf), RmsNormParams{1e-6f}, s(yf_aligned), s(rstdf));
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

// ---- Gradients: the device's backward against central differences of its own forward --------
// (backend_ops/harness.h, "Gradient cases")

REMAT_OP_CASE(rmsnorm, grad) {
  const Shape s{5, 24};
  auto x = t.uniform(s, -2.0f, 2.0f), gamma = t.uniform({24}, 0.5f, 1.5f), dy = t.uniform(s);
  auto zeros = [&](int64_t c) { return t.output_like(t.values(std::vector<float>(c, 0.0f), {c})); };
  auto y = t.output(s), rstd = t.output({5}), dx = t.output(s), dg = zeros(24);
  t.run([&](Backend& be, Side d) {
    be.rmsnorm_forward(d(x), d(gamma), RmsNormParams{1e-6f}, d(y), d(rstd));
    be.rmsnorm_backward(d(dy), d(x), d(gamma), d(rstd), d(dx), d(dg));
  });
  auto loss = [&](Backend& be) {
    be.rmsnorm_forward(x.dut, gamma.dut, RmsNormParams{1e-6f}, y.dut, rstd.dut);
    return dot(dy.dut, y.dut);
  };
  t.expect_gradient("rmsnorm dx", x, dx, loss);
  t.expect_gradient("rmsnorm dgamma", gamma, dg, loss);
}

}  // namespace remat::test
