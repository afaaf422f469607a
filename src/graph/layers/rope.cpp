// rope: rotary position embeddings (Su et al. 2021) on attention's packed q, k, v, as Hugging
// Face's Llama turns them (the halves form): in [B, T, (heads + 2 kv_heads) d], the heads of
// q and k turn by position, v's pass through. Placed between the qkv projection and the
// attention layer. Nothing is saved: backward turns the gradient back by the same angles.
#include <string>

#include "graph/layers/layer_util.h"

namespace remat::layers {
namespace {

class Rope final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit Rope(ConfigReader& r) {
    heads_ = static_cast<int>(r.int_or("heads", 1, 1, 1 << 16));
    kv_heads_ = static_cast<int>(r.int_or("kv_heads", heads_, 1, 1 << 16));
    if (heads_ % kv_heads_ != 0)
      r.fail("kv_heads",
             "heads " + std::to_string(heads_) + " is not a multiple of kv_heads " + std::to_string(kv_heads_));
    p_.theta = r.number_or("theta", 10000.0, 1.0, 1e12);
    if (r.has("scaling")) read_scaling(r.child("scaling"));
    p_.heads = heads_ + 2 * kv_heads_;
    p_.rotated = heads_ + kv_heads_;
  }
  LayerKind kind() const override { return LayerKind::pointwise; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    const Shape& s = in[0];
    REMAT_CHECK(s.rank() == 3 && s[2] % p_.heads == 0 && (s[2] / p_.heads) % 2 == 0, "rope: input ", s.str(),
                " must be [B, T, (heads + 2 kv_heads) d] with heads ", heads_, ", kv_heads ", kv_heads_,
                " and d even (attention's packed q, k, v)");
    n_ = s[0] * s[1] * p_.rotated * (s[2] / p_.heads);
    return s;
  }
  // Per turned channel: a cosine, a sine (counted as one op each) and two multiplies and an
  // add per element of its pair.
  double forward_flops() const override { return 4.0 * static_cast<double>(n_); }
  void forward(ForwardContext& c) const override {
    c.out = Tensor::empty(c.in[0].shape(), c.be.device(), activation_dtype());
    c.be.rope_forward(c.in[0], p_, c.out);
  }
  void backward(BackwardContext& c) const override {
    // rope_backward's dx may alias dy (remat/backend_ops.def); backward reads no input (its
    // shape is dy's).
    Tensor dx = reuse_dout(c, c.dout.shape());
    c.be.rope_backward(c.dout, p_, dx);
    c.din = {dx};
  }
  std::vector<int> backward_inputs() const override { return {}; }

 private:
  // "scaling": {"type": "linear" | "llama3", "factor": F, ...}, Hugging Face's rope_scaling
  // (remat/rope.h).
  void read_scaling(ConfigReader s) {
    RopeScaling& sc = p_.scaling;
    const std::string type = s.one_of("type", {"none", "linear", "llama3"}, "none");
    sc.type = type == "linear"   ? RopeScalingType::linear
              : type == "llama3" ? RopeScalingType::llama3
                                 : RopeScalingType::none;
    if (sc.type != RopeScalingType::none) sc.factor = s.number("factor");
    if (sc.type != RopeScalingType::none && !(sc.factor > 0.0)) s.fail("factor", "must be positive");
    if (sc.type == RopeScalingType::llama3) {
      sc.low_freq_factor = s.number_or("low_freq_factor", sc.low_freq_factor, 1e-6, 1e6);
      sc.high_freq_factor = s.number_or("high_freq_factor", sc.high_freq_factor, 1e-6, 1e6);
      sc.original_max_position = static_cast<double>(
          s.positive_int_or("original_max_position", static_cast<int64_t>(sc.original_max_position)));
      if (!(sc.high_freq_factor > sc.low_freq_factor))
        s.fail("high_freq_factor", "must be above low_freq_factor (" + std::to_string(sc.low_freq_factor) + ")");
    }
    s.finish();
  }

  RopeParams p_;
  int heads_ = 1, kv_heads_ = 1;
  int64_t n_ = 0;
};

}  // namespace

REMAT_REGISTER_LAYER("rope", Rope);

}  // namespace remat::layers
