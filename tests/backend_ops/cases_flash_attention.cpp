// The fused (flash) attention on the device against the CPU backend.
//
// Shapes reach several query and key tiles (T up to 130), tile edges (T not a multiple of
// the tile), grouped-query attention (4 heads on 2 and on 1 key/value head), cross-attention
// with key lengths, head dims 32 to 256, dropout. Tolerances: out and lse are softmax-
// weighted averages, 2e-6 + 2e-5 relative apart (scores are sums of d <= 256 products of
// values in [-1, 1], scaled by 1/sqrt(d); the two backends sum in other orders and their
// exps differ by a few ulps); the gradients add up to T more terms: 1e-5 + 1e-4 relative.
// The dropout mask must be the CPU's: a wrong mask moves out by O(1), far outside these.
// bf16: the CPU on the same bf16 inputs, within a bf16 rounding of the largest value (the
// device may accumulate in another order, and tensor cores in their own).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend_ops/harness.h"

namespace remat::test {

namespace {

struct FlashShape {
  int64_t b, tq, tk;
  int h, hkv;
  int64_t d;
  bool causal, cross, lengths;
  float dropout;
  FlashAttentionParams params() const {
    return cross ? FlashAttentionParams::cross(h, hkv, d, dropout)
                 : FlashAttentionParams::packed(h, hkv, d, causal, dropout);
  }
  std::string str() const {
    return " b" + std::to_string(b) + " tq" + std::to_string(tq) + " tk" + std::to_string(tk) + " h" +
           std::to_string(h) + "/" + std::to_string(hkv) + " d" + std::to_string(d) + (causal ? " causal" : "") +
           (cross ? " cross" : "") + (lengths ? " lengths" : "") + " p" + std::to_string(dropout);
  }
};

// The operands of one shape: xq (and xkv, the same Pair when packed), key lengths, dout.
struct FlashInputs {
  Pair xq, xkv, lens, dout;
};

FlashInputs flash_inputs(OpCheck& t, const FlashShape& s, bool bf16) {
  const FlashAttentionParams p = s.params();
  auto make = [&](const Shape& shape) { return bf16 ? t.uniform_bf16(shape) : t.uniform(shape); };
  FlashInputs in;
  in.xq = make(s.cross ? Shape{s.b, s.tq, s.h * s.d} : Shape{s.b, s.tq, (s.h + 2 * int64_t{p.kv_heads()}) * s.d});
  in.xkv = s.cross ? make(Shape{s.b, s.tk, 2 * p.kv_heads() * s.d}) : in.xq;
  if (s.lengths) {
    std::vector<int32_t> l;
    for (int64_t b = 0; b < s.b; ++b) l.push_back(static_cast<int32_t>(std::max<int64_t>(1, s.tk - 7 * b - 3)));
    in.lens = t.int_values(l, Shape{s.b});
  }
  in.dout = make(Shape{s.b, s.tq, s.h * s.d});
  return in;
}

Tensor workspace_for(Backend& be, size_t bytes) {
  return bytes ? Tensor::empty(Shape{static_cast<int64_t>((bytes + 3) / 4)}, be.device()) : Tensor();
}

// Forward and backward of one shape; out, lse, dxq (and dxkv) compared with the cpu's.
void check_flash(OpCheck& t, const FlashShape& s, bool bf16, double atol, double rtol, double grad_atol,
                 double grad_rtol) {
  const FlashAttentionParams p = s.params();
  const FlashInputs in = flash_inputs(t, s, bf16);
  const DType dt = bf16 ? DType::bf16 : DType::f32;
  auto out = t.output({s.b, s.tq, s.h * s.d}, dt), lse = t.output({s.b, s.h, s.tq});
  auto dxq = t.output(in.xq.ref.shape(), dt);
  Pair dxkv = s.cross ? t.output(in.xkv.ref.shape(), dt) : dxq;
  const RngState rng{0xf1a5 ^ static_cast<uint64_t>(s.tq), 321};
  t.run([&](Backend& be, Side side) {
    const Tensor lens = s.lengths ? side(in.lens) : Tensor();
    be.flash_attention_forward(side(in.xq), side(in.xkv), lens, p, rng, side(out), side(lse));
    be.flash_attention_backward(
        side(in.dout), side(in.xq), side(in.xkv), lens, side(out), side(lse), p, rng, side(dxq), side(dxkv),
        workspace_for(be, be.flash_attention_backward_workspace(in.xq.ref.shape(), in.xkv.ref.shape(), p)));
  });
  t.expect_close(out, atol, rtol, "out" + s.str());
  t.expect_close(lse, 2e-6, 2e-5, "lse" + s.str());
  t.expect_close(dxq, grad_atol, grad_rtol, (s.cross ? "dxq" : "dqkv") + s.str());
  if (s.cross) t.expect_close(dxkv, grad_atol, grad_rtol, "dxkv" + s.str());
}

const std::vector<FlashShape>& flash_shapes() {
  static const std::vector<FlashShape> all = {
      {2, 37, 37, 3, 3, 32, true, false, false, 0.0f},    // one tile
      {2, 70, 70, 4, 2, 64, true, false, false, 0.2f},    // GQA, dropout, two tiles
      {1, 50, 90, 4, 1, 48, false, true, true, 0.1f},     // cross-attention, MQA, lengths
      {2, 130, 130, 2, 2, 128, true, false, true, 0.0f},  // three tiles, lengths
      {1, 40, 33, 2, 2, 256, false, true, false, 0.3f},   // the largest head
      {1, 65, 65, 2, 1, 80, true, false, false, 0.0f},    // d not a multiple of 16
  };
  return all;
}

}  // namespace

REMAT_OP_CASE(flash_attention, forward_backward) {
  for (const FlashShape& s : flash_shapes()) check_flash(t, s, false, 2e-6, 2e-5, 1e-5, 1e-4);
}

// Non-causal packed self-attention, and one key per batch element (kv_lens 1).
REMAT_OP_CASE(flash_attention, edges) {
  check_flash(t, FlashShape{3, 17, 17, 2, 2, 32, false, false, false, 0.5f}, false, 2e-6, 2e-5, 1e-5, 1e-4);
  const FlashAttentionParams p = FlashAttentionParams::cross(2, 0, 16, 0.0f);
  auto xq = t.uniform({2, 9, 32}), xkv = t.uniform({2, 5, 64}), lens = t.int_values({1, 5}, {2});
  auto out = t.output({2, 9, 32}), lse = t.output({2, 2, 9});
  t.run(
      [&](Backend& be, Side s) { be.flash_attention_forward(s(xq), s(xkv), s(lens), p, RngState{}, s(out), s(lse)); });
  t.expect_close(out, 2e-6, 2e-5, "out, one key");
  t.expect_close(lse, 2e-6, 2e-5, "lse, one key");
}

// Run to run: the same bits (no atomics; the emulator's shuffled lanes must not matter).
REMAT_OP_CASE(flash_attention, deterministic) {
  const FlashShape s = flash_shapes()[1];
  const FlashAttentionParams p = s.params();
  const FlashInputs in = flash_inputs(t, s, false);
  Backend& dut = backend_for(t.device());
  std::vector<std::vector<float>> runs;
  for (int k = 0; k < 2; ++k) {
    Tensor out = Tensor::empty(Shape{s.b, s.tq, s.h * s.d}, t.device()),
           lse = Tensor::empty(Shape{s.b, s.h, s.tq}, t.device());
    Tensor dqkv = Tensor::empty(in.xq.dut.shape(), t.device());
    dut.flash_attention_forward(in.xq.dut, in.xkv.dut, Tensor(), p, RngState{3, 4}, out, lse);
    dut.flash_attention_backward(
        in.dout.dut, in.xq.dut, in.xkv.dut, Tensor(), out, lse, p, RngState{3, 4}, dqkv, dqkv,
        workspace_for(dut, dut.flash_attention_backward_workspace(in.xq.dut.shape(), in.xkv.dut.shape(), p)));
    runs.push_back(dqkv.to_vector());
    const std::vector<float> o = out.to_vector();
    runs.back().insert(runs.back().end(), o.begin(), o.end());
  }
  EXPECT_TRUE(runs[0] == runs[1]) << "two runs differ";
}

REMAT_OP_CASE(flash_attention, bf16) {
  ActivationDTypeScope bf16(DType::bf16);
  for (const FlashShape& s : {flash_shapes()[1], flash_shapes()[2], flash_shapes()[5]})
    check_flash(t, s, true, 1.0 / 64, 1.0 / 64, 1.0 / 32, 1.0 / 32);
}

// The device's backward against central differences of its own forward (the mask fixed
// by the RngState).
REMAT_OP_CASE(flash_attention, grad) {
  for (const FlashShape& s : {FlashShape{1, 9, 9, 4, 2, 6, true, false, false, 0.25f},
                              FlashShape{2, 7, 11, 2, 1, 5, false, true, true, 0.0f}}) {
    const FlashAttentionParams p = s.params();
    const FlashInputs in = flash_inputs(t, s, false);
    auto out = t.output({s.b, s.tq, s.h * s.d}), lse = t.output({s.b, s.h, s.tq});
    auto dxq = t.output(in.xq.ref.shape());
    Pair dxkv = s.cross ? t.output(in.xkv.ref.shape()) : dxq;
    const RngState rng{8, 80};
    t.run([&](Backend& be, Side side) {
      const Tensor lens = s.lengths ? side(in.lens) : Tensor();
      be.flash_attention_forward(side(in.xq), side(in.xkv), lens, p, rng, side(out), side(lse));
      be.flash_attention_backward(
          side(in.dout), side(in.xq), side(in.xkv), lens, side(out), side(lse), p, rng, side(dxq), side(dxkv),
          workspace_for(be, be.flash_attention_backward_workspace(in.xq.ref.shape(), in.xkv.ref.shape(), p)));
    });
    auto loss = [&](Backend& be) {
      be.flash_attention_forward(in.xq.dut, in.xkv.dut, s.lengths ? in.lens.dut : Tensor(), p, rng, out.dut, lse.dut);
      return dot(in.dout.dut, out.dut);
    };
    t.expect_gradient("flash dxq" + s.str(), in.xq, dxq, loss);
    if (s.cross) t.expect_gradient("flash dxkv" + s.str(), in.xkv, dxkv, loss);
  }
}

}  // namespace remat::test
