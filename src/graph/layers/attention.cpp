// attention: causal multi-head self-attention over a fused [B, T, 3C] q, k, v input.
#include "graph/layers/layer_util.h"

namespace remat::layers {
namespace {

class Attention final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit Attention(ConfigReader& r) {
    p_.n_head = static_cast<int>(r.int_or("heads", 1, 1, 1 << 16));
    p_.dropout = static_cast<float>(r.number_or("dropout", 0.0, 0.0, 1.0));
    p_.causal = r.bool_or("causal", true);
  }
  LayerKind kind() const override { return LayerKind::attention; }
  // P V is a GEMM product worth keeping; the probabilities (a softmax) are recomputed.
  SelectiveKeep selective_keep() const override { return SelectiveKeep::output; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    REMAT_CHECK(in[0].rank() == 3 && in[0][2] % (3 * p_.n_head) == 0, "attention: input ", in[0].str(),
                " must be [B, T, 3C] with C divisible by heads ", p_.n_head);
    b_ = in[0][0];
    t_ = in[0][1];
    c_ = in[0][2] / 3;
    return Shape{b_, t_, c_};
  }
  uint64_t rng_words() const override {
    return p_.dropout > 0.0f && p_.dropout < 1.0f ? static_cast<uint64_t>(b_ * p_.n_head * t_ * t_) : 0;
  }
  // Two GEMMs (Q K^T and P V) and the row work (scale, max, exp, sum, dropout) per score;
  // the probabilities alone take the first GEMM and the softmax.
  double forward_flops() const override {
    return 4.0 * b_ * t_ * t_ * c_ * (p_.causal ? 0.5 : 1.0) + 5.0 * b_ * p_.n_head * t_ * t_;
  }
  double extras_flops() const override {
    return 2.0 * b_ * t_ * t_ * c_ * (p_.causal ? 0.5 : 1.0) + 4.0 * b_ * p_.n_head * t_ * t_;
  }
  void forward(ForwardContext& c) const override {
    if (c.extras_only) {  // the output is kept: rebuild the probabilities only
      c.extras = {ops::attention_probs(c.be, c.in[0], p_)};
      return;
    }
    AttentionParams p = p_;
    if (!c.training) p.dropout = 0.0f;
    auto r = ops::attention(c.be, c.in[0], p, c.rng);
    c.out = r.out;
    c.extras = {r.probs};
  }
  void backward(BackwardContext& c) const override {
    c.din = {ops::attention_backward(c.be, c.dout, c.in[0], c.extras[0], p_, c.rng)};
  }
  std::vector<int> backward_inputs() const override { return {0}; }
  std::vector<std::string> extra_names() const override { return {"probs"}; }

 private:
  AttentionParams p_;
  int64_t b_ = 0, t_ = 0, c_ = 0;
};

}  // namespace

REMAT_REGISTER_LAYER("attention", Attention);

}  // namespace remat::layers
