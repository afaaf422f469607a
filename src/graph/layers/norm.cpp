// The normalisations: batchnorm2d (over N, H, W per channel, with running statistics)
// and layernorm (over the last dimension).
#include "graph/layers/layer_util.h"

namespace remat::layers {
namespace {

class BatchNorm2d final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit BatchNorm2d(ConfigReader& r) {
    p_.momentum = static_cast<float>(r.number_or("momentum", 0.1, 0.0, 1.0));
    p_.eps = static_cast<float>(r.number_or("eps", 1e-5, 1e-12, 1.0));
  }
  LayerKind kind() const override { return LayerKind::norm; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    REMAT_CHECK(in[0].rank() == 4, "batchnorm2d: input ", in[0].str(), " must be [N, C, H, W]");
    c_ = in[0][1];
    n_ = in[0].numel();
    return in[0];
  }
  std::vector<ParamSpec> param_specs() const override {
    return {ParamSpec::ones("weight", Shape{c_}).no_decay(), ParamSpec::zeros("bias", Shape{c_}).no_decay(),
            ParamSpec::zeros("running_mean", Shape{c_}).buffer(), ParamSpec::ones("running_var", Shape{c_}).buffer()};
  }
  double forward_flops() const override { return 8.0 * n_; }
  void forward(ForwardContext& c) const override {
    if (!c.training) {
      c.out = Tensor::empty(c.in[0].shape(), c.be.device(), activation_dtype());
      c.be.batchnorm2d_forward_eval(c.in[0], c.params[0], c.params[1], c.params[2], c.params[3], p_, c.out);
      return;
    }
    auto r = ops::batchnorm2d_train(c.be, c.in[0], c.params[0], c.params[1], c.params[2], c.params[3], p_,
                                    /*update_running=*/!c.recompute);
    c.out = r.y;
    c.extras = {r.mean, r.invstd};
  }
  void backward(BackwardContext& c) const override {
    // batchnorm2d_backward's dx may alias dy (remat/backend_ops.def).
    Tensor dx = c.need_din[0] ? reuse_dout(c, c.in[0].shape()) : Tensor();
    c.be.batchnorm2d_backward(c.dout, c.in[0], c.params[0], c.extras[0], c.extras[1], dx, c.grads[0], c.grads[1]);
    c.din = {dx};
  }
  std::vector<int> backward_inputs() const override { return {0}; }
  std::vector<std::string> extra_names() const override { return {"save_mean", "save_invstd"}; }

 private:
  BatchNormParams p_;
  int64_t c_ = 0, n_ = 0;
};

class LayerNorm final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit LayerNorm(ConfigReader& r) { p_.eps = static_cast<float>(r.number_or("eps", 1e-5, 1e-12, 1.0)); }
  LayerKind kind() const override { return LayerKind::norm; }
  StepRun step_run() const override { return StepRun::positionwise; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    REMAT_CHECK(in[0].rank() >= 2, "layernorm: input ", in[0].str(), " must have rank >= 2");
    c_ = in[0][-1];
    n_ = in[0].numel();
    return in[0];
  }
  std::vector<ParamSpec> param_specs() const override {
    return {ParamSpec::ones("weight", Shape{c_}).no_decay(), ParamSpec::zeros("bias", Shape{c_}).no_decay()};
  }
  double forward_flops() const override { return 8.0 * n_; }
  void forward(ForwardContext& c) const override {
    auto r = ops::layernorm(c.be, c.in[0], c.params[0], c.params[1], p_);
    c.out = r.y;
    c.extras = {r.mean, r.invstd};
  }
  void backward(BackwardContext& c) const override {
    // layernorm_backward's dx may alias dy (remat/backend_ops.def).
    Tensor dx = c.need_din[0] ? reuse_dout(c, c.in[0].shape()) : Tensor();
    ops::layernorm_backward(c.be, c.dout, c.in[0], c.params[0], c.extras[0], c.extras[1], dx, c.grads[0], c.grads[1]);
    c.din = {dx};
  }
  std::vector<int> backward_inputs() const override { return {0}; }
  std::vector<std::string> extra_names() const override { return {"mean", "rstd"}; }

 private:
  LayerNormParams p_;
  int64_t c_ = 0, n_ = 0;
};

}  // namespace

REMAT_REGISTER_LAYER("batchnorm2d", BatchNorm2d);
REMAT_REGISTER_LAYER("layernorm", LayerNorm);

}  // namespace remat::layers
