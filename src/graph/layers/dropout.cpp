// dropout: inverted dropout whose mask is regenerated from the layer's Philox range in
// backward and in recompute, never stored.
#include "graph/layers/layer_util.h"

namespace remat::layers {
namespace {

class Dropout final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit Dropout(ConfigReader& r) : p_(static_cast<float>(r.number_or("p", 0.5, 0.0, 1.0))) {}
  LayerKind kind() const override { return LayerKind::dropout; }
  StepRun step_run() const override { return StepRun::positionwise; }  // evaluation: the identity
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    n_ = in[0].numel();
    return in[0];
  }
  uint64_t rng_words() const override { return p_ > 0.0f && p_ < 1.0f ? static_cast<uint64_t>(n_) : 0; }
  double forward_flops() const override { return static_cast<double>(n_); }
  double backward_flops() const override { return static_cast<double>(n_); }
  void forward(ForwardContext& c) const override {
    c.out = (c.training && p_ > 0.0f) ? ops::dropout(c.be, c.in[0], p_, c.rng) : c.in[0];
  }
  void backward(BackwardContext& c) const override {
    if (p_ == 0.0f) {
      c.din = {c.dout};
      return;
    }
    Tensor dx = reuse_dout(c, c.dout.shape());
    c.be.dropout_backward(c.dout, p_, c.rng, dx);
    c.din = {dx};
  }

 private:
  float p_;
  int64_t n_ = 0;
};

}  // namespace

REMAT_REGISTER_LAYER("dropout", Dropout);

}  // namespace remat::layers
