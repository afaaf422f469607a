// conv2d: a 2-D convolution over NCHW images (PyTorch's nn.Conv2d).
#include "graph/layers/layer_util.h"

namespace remat::layers {
namespace {

class Conv2d final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit Conv2d(ConfigReader& r) : k_(r.positive_int("out_channels")), bias_(r.bool_or("bias", true)) {
    std::tie(kh_, kw_) = int_or_pair(r, "kernel", -1, 1);
    if (kh_ < 0) r.fail("kernel", "missing (required)");
    std::tie(p_.stride_h, p_.stride_w) = int_or_pair(r, "stride", 1, 1);
    std::tie(p_.pad_h, p_.pad_w) = int_or_pair(r, "padding", 0, 0);
    std::tie(p_.dilation_h, p_.dilation_w) = int_or_pair(r, "dilation", 1, 1);
    p_.groups = static_cast<int>(r.int_or("groups", 1, 1, 1 << 20));
  }
  LayerKind kind() const override { return LayerKind::conv; }
  SelectiveKeep selective_keep() const override { return SelectiveKeep::all; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    REMAT_CHECK(in[0].rank() == 4, "conv2d: input ", in[0].str(), " must be [N, C, H, W]");
    c_ = in[0][1];
    REMAT_CHECK(c_ % p_.groups == 0 && k_ % p_.groups == 0, "conv2d: input channels ", c_, " and out_channels ", k_,
                " must be divisible by groups ", p_.groups);
    out_ = conv2d_output_shape(in[0], w_shape(), p_);
    return out_;
  }
  Shape w_shape() const { return Shape{k_, c_ / p_.groups, kh_, kw_}; }
  std::vector<ParamSpec> param_specs() const override {
    const int64_t fan_in = c_ / p_.groups * kh_ * kw_;
    std::vector<ParamSpec> ps{ParamSpec::uniform("weight", w_shape(), fan_in)};
    if (bias_) ps.push_back(ParamSpec::uniform("bias", Shape{k_}, fan_in).no_decay());
    return ps;
  }
  double forward_flops() const override { return 2.0 * numel_of(out_) * (c_ / p_.groups) * kh_ * kw_; }
  void forward(ForwardContext& c) const override {
    c.out = ops::conv2d(c.be, c.in[0], c.params[0], bias_ ? c.params[1] : Tensor(), p_);
  }
  void backward(BackwardContext& c) const override {
    c.din = {ops::conv2d_backward(c.be, c.dout, c.in[0], c.params[0], p_, c.need_din[0], c.grads[0],
                                  bias_ ? c.grads[1] : Tensor())};
  }
  std::vector<int> backward_inputs() const override { return {0}; }

 private:
  int64_t k_, c_ = 0;
  int kh_ = 0, kw_ = 0;
  bool bias_;
  Conv2dParams p_;
  Shape out_;
};

}  // namespace

REMAT_REGISTER_LAYER("conv2d", Conv2d);

}  // namespace remat::layers
