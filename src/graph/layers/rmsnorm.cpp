// rmsnorm: RMS normalisation over the last dimension with a learned scale (Zhang and
// Sennrich 2019; LLaMA's RMSNorm): y = x / sqrt(mean(x^2) + eps) * weight. The per-row
// rstd is saved for backward.
#include "graph/layers/layer_util.h"

namespace remat::layers {
namespace {

class RmsNorm final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit RmsNorm(ConfigReader& r) { p_.eps = static_cast<float>(r.number_or("eps", 1e-6, 1e-12, 1.0)); }
  LayerKind kind() const override { return LayerKind::norm; }
  StepRun step_run() const override { return StepRun::positionwise; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    REMAT_CHECK(in[0].rank() >= 2, "rmsnorm: input ", in[0].str(), " must have rank >= 2");
    c_ = in[0][-1];
    n_ = in[0].numel();
    return in[0];
  }
  std::vector<ParamSpec> param_specs() const override { return {ParamSpec::ones("weight", Shape{c_}).no_decay()}; }
  double forward_flops() const override { return 4.0 * n_; }
  void forward(ForwardContext& c) const override {
    const Tensor& x = c.in[0];
    c.out = Tensor::empty(x.shape(), c.be.device(), activation_dtype());
    Tensor rstd = Tensor::empty(Shape{x.numel() / c_}, c.be.device());
    c.be.rmsnorm_forward(x, c.params[0], p_, c.out, rstd);
    c.extras = {rstd};
  }
  void backward(BackwardContext& c) const override {
    // rmsnorm_backward's dx may alias dy (remat/backend_ops.def).
    Tensor dx = c.need_din[0] ? reuse_dout(c, c.in[0].shape()) : Tensor();
    c.be.rmsnorm_backward(c.dout, c.in[0], c.params[0], c.extras[0], dx, c.grads[0]);
    c.din = {dx};
  }
  std::vector<int> backward_inputs() const override { return {0}; }
  std::vector<std::string> extra_names() const override { return {"rstd"}; }

 private:
  RmsNormParams p_;
  int64_t c_ = 0, n_ = 0;
};

}  // namespace

REMAT_REGISTER_LAYER("rmsnorm", RmsNorm);

}  // namespace remat::layers
