// Rotary position embeddings against the cpu backend.
//
// Tolerances: both backends compute each angle, cosine, sine and product in double and
// round once, but a GPU's double pow, cos and sin are not correctly rounded (within 1-2
// ulp of double) and it may contract the products into FMAs: the float results agree to
// the last bit nearly always, within 1 ulp always (rtol 2e-7 plus a tiny atol for values
// near 0).
#include <string>
#include <vector>

#include "backend_ops/harness.h"

namespace remat::test {

namespace {

std::string what(const Shape& s, const RopeParams& p) {
  return "rope " + s.str() + " heads " + std::to_string(p.heads) + " rotated " + std::to_string(p.rotated) +
         " scaling " + std::to_string(static_cast<int>(p.scaling.type));
}

}  // namespace

// q, k, v of one head each; grouped queries (8 q, 2 k, 2 v); every head turning (rotated =
// heads); none turning (a copy); Llama's d 128 at positions up to 300 and theta 500000, plain,
// scaled linearly, and with Llama 3.1's llama3 scaling (its original context shortened to 64
// so that every band of frequencies is met).
REMAT_OP_CASE(rope, forward_backward_shapes_in_place) {
  struct Case {
    Shape s;
    RopeParams p;
  };
  const RopeScaling none, linear{RopeScalingType::linear, 4.0, 1.0, 4.0, 8192.0},
      llama3{RopeScalingType::llama3, 8.0, 1.0, 4.0, 64.0};
  for (const Case& c :
       {Case{{2, 5, 3 * 8}, {3, 2, 10000.0, none}}, Case{{1, 7, 12 * 16}, {12, 10, 10000.0, none}},
        Case{{3, 4, 2 * 6}, {2, 2, 10000.0, none}}, Case{{2, 3, 2 * 4}, {2, 0, 10000.0, none}},
        Case{{1, 300, 3 * 128}, {3, 2, 500000.0, none}}, Case{{1, 300, 3 * 128}, {3, 2, 500000.0, linear}},
        Case{{1, 300, 3 * 128}, {3, 2, 500000.0, llama3}}}) {
    auto x = t.uniform(c.s, -2.0f, 2.0f), dy = t.uniform(c.s);
    auto y = t.output(c.s), dx = t.output(c.s), y_in_place = t.output_like(x), dx_in_place = t.output_like(dy);
    t.run([&](Backend& be, Side side) {
      be.rope_forward(side(x), c.p, side(y));
      be.rope_backward(side(dy), c.p, side(dx));
      be.rope_forward(side(y_in_place), c.p, side(y_in_place));
      be.rope_backward(side(dx_in_place), c.p, side(dx_in_place));
    });
    t.expect_close(y, 1e-7, 2e-7, what(c.s, c.p) + " y");
    t.expect_close(dx, 1e-7, 2e-7, what(c.s, c.p) + " dx");
    t.expect_close(y_in_place, 1e-7, 2e-7, what(c.s, c.p) + " y in place");
    t.expect_close(dx_in_place, 1e-7, 2e-7, what(c.s, c.p) + " dx over dy");
  }
}

// ---- bf16 (training.precision bf16; the two references: backend_ops/harness.h) ----------------
// Within a bf16 step of the CPU; bitwise the device's fp32 kernel on the widened values, rounded.
REMAT_OP_CASE(rope, bf16) {
  ActivationDTypeScope bf16(DType::bf16);
  const Shape s{2, 9, 4 * 16};
  const RopeParams p{4, 3, 10000.0, {}};
  auto x = t.uniform_bf16(s, -2.0f, 2.0f), xf = t.as_f32(x);
  auto y = t.output(s, DType::bf16), yf = t.output(s);
  auto dx = t.output(s, DType::bf16), dxf = t.output(s), in_place = t.output_like(x);
  t.run([&](Backend& be, Side side) {
    be.rope_forward(side(x), p, side(y));
    be.rope_forward(side(xf), p, side(yf));
    be.rope_backward(side(x), p, side(dx));
    be.rope_backward(side(xf), p, side(dxf));
    be.rope_forward(side(in_place), p, side(in_place));
  });
  t.expect_close(y, 1e-6, kBf16Rel, "rope y bf16");
  t.expect_close(dx, 1e-6, kBf16Rel, "rope dx bf16");
  t.expect_close(in_place, 1e-6, kBf16Rel, "rope y bf16 in place");
  expect_rounded_dut(y, yf, "rope y against fp32");
  expect_rounded_dut(dx, dxf, "rope dx against fp32");
}

// ---- Gradients: the device's backward against central differences of its own forward --------
// (backend_ops/harness.h, "Gradient cases")

REMAT_OP_CASE(rope, grad) {
  const Shape s{2, 6, 3 * 8};
  const RopeParams p{3, 2, 10000.0, {}};
  auto x = t.uniform(s, -2.0f, 2.0f), dy = t.uniform(s);
  auto y = t.output(s), dx = t.output(s);
  t.run([&](Backend& be, Side d) {
    be.rope_forward(d(x), p, d(y));
    be.rope_backward(d(dy), p, d(dx));
  });
  auto loss = [&](Backend& be) {
    be.rope_forward(x.dut, p, y.dut);
    return dot(dy.dut, y.dut);
  };
  t.expect_gradient("rope dx", x, dx, loss);
}

}  // namespace remat::test
