// linear: y = x w^T + b over the last dimension (PyTorch's nn.Linear, its initialisation).
#include "graph/layers/layer_util.h"

namespace remat::layers {
namespace {

class Linear final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit Linear(ConfigReader& r)
      : out_(r.positive_int("out_features")),
        bias_(r.bool_or("bias", true)),
        init_std_(r.number_or("init_std", 0.0, 0.0, 10.0)),
        tie_(r.string_or("tie_weight", "")) {}
  LayerKind kind() const override { return LayerKind::gemm; }
  StepRun step_run() const override { return StepRun::positionwise; }
  SelectiveKeep selective_keep() const override { return SelectiveKeep::all; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    REMAT_CHECK(in[0].rank() >= 2, "linear: input ", in[0].str(), " must have rank >= 2");
    in_ = in[0][-1];
    rows_ = in[0].numel() / in_;
    auto d = in[0].dims();
    d.back() = out_;
    return Shape(d);
  }
  std::vector<ParamSpec> param_specs() const override {
    ParamSpec w = init_std_ > 0 ? ParamSpec::normal("weight", Shape{out_, in_}, static_cast<float>(init_std_))
                                : ParamSpec::uniform("weight", Shape{out_, in_}, in_);
    if (!tie_.empty()) w = w.tied_to(tie_ + ".weight");
    std::vector<ParamSpec> ps{w};
    if (bias_) {
      ps.push_back(
          (init_std_ > 0 ? ParamSpec::zeros("bias", Shape{out_}) : ParamSpec::uniform("bias", Shape{out_}, in_))
              .no_decay());
    }
    return ps;
  }
  double forward_flops() const override { return 2.0 * rows_ * in_ * out_; }
  void forward(ForwardContext& c) const override {
    c.out = ops::linear(c.be, c.in[0], c.params[0], bias_ ? c.params[1] : Tensor());
  }
  void backward(BackwardContext& c) const override {
    Tensor dx = c.need_din[0] ? Tensor::empty(c.in[0].shape(), c.be.device(), activation_dtype()) : Tensor();
    c.be.linear_backward(c.dout, c.in[0], c.params[0], dx, c.grads[0], bias_ ? c.grads[1] : Tensor());
    c.din = {dx};
  }
  std::vector<int> backward_inputs() const override { return {0}; }

 private:
  int64_t out_, in_ = 0, rows_ = 0;
  bool bias_;
  double init_std_;
  std::string tie_;
};

}  // namespace

REMAT_REGISTER_LAYER("linear", Linear);

}  // namespace remat::layers
