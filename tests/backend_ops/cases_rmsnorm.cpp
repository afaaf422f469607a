// RMS norm forward and backward against the cpu backend.
//
// Tolerances: both backends take the row sums in double (in different orders, so they may
// round to a different float in the last bit) and the elementwise formulas in float; a GPU
// may contract the products of dgamma's double sums into FMAs. So rstd agrees to ~1 ulp,
// y and dx to a few ulp of their terms, dgamma to ~1 ulp.
#include <cmath>
#include <limits>
#include <string>

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
  t.run([&](Backend& be, Side side) { be.rmsnorm_forward(side(x), side(gamma), eps, side(f.y), side(f.rstd)); });
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

}  // namespace remat::test
