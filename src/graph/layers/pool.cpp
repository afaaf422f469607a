// The pooling layers: maxpool2d, avgpool2d, global_avgpool.
#include "graph/layers/layer_util.h"

namespace remat::layers {
namespace {

Pool2dParams read_pool(ConfigReader& r) {
  Pool2dParams p;
  std::tie(p.kernel_h, p.kernel_w) = int_or_pair(r, "kernel", 2, 1);
  std::tie(p.stride_h, p.stride_w) = int_or_pair(r, "stride", -1, 1);
  if (!r.has("stride")) std::tie(p.stride_h, p.stride_w) = std::make_pair(p.kernel_h, p.kernel_w);
  std::tie(p.pad_h, p.pad_w) = int_or_pair(r, "padding", 0, 0);
  return p;
}

class MaxPool2d final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit MaxPool2d(ConfigReader& r) : p_(read_pool(r)) {
    // The saved indices are one byte: an offset within the window (backend_ops.def).
    const int64_t window = int64_t{p_.kernel_h} * p_.kernel_w;
    if (window > kMaxPoolWindow)
      r.fail("kernel", "maxpool2d kernel " + std::to_string(p_.kernel_h) + "x" + std::to_string(p_.kernel_w) + " has " +
                           std::to_string(window) + " positions; at most " + std::to_string(kMaxPoolWindow) +
                           " (its saved index is one byte)");
  }
  LayerKind kind() const override { return LayerKind::pool; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    REMAT_CHECK(in[0].rank() == 4, "maxpool2d: input ", in[0].str(), " must be [N, C, H, W]");
    in_ = in[0];
    return pool2d_output_shape(in[0], p_);
  }
  double forward_flops() const override { return numel_of(out_shape) * p_.kernel_h * p_.kernel_w; }
  double backward_flops() const override { return numel_of(in_); }
  void forward(ForwardContext& c) const override {
    auto r = ops::maxpool2d(c.be, c.in[0], p_);
    c.out = r.y;
    c.extras = {r.indices};
  }
  void backward(BackwardContext& c) const override {
    Tensor dx = Tensor::empty(in_, c.be.device(), activation_dtype());
    c.be.maxpool2d_backward(c.dout, c.extras[0], p_, dx);
    c.din = {dx};
  }
  std::vector<std::string> extra_names() const override { return {"indices"}; }

 private:
  Pool2dParams p_;
  Shape in_;
};

class AvgPool2d final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit AvgPool2d(ConfigReader& r) : p_(read_pool(r)) {}
  LayerKind kind() const override { return LayerKind::pool; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    REMAT_CHECK(in[0].rank() == 4, "avgpool2d: input ", in[0].str(), " must be [N, C, H, W]");
    in_ = in[0];
    return pool2d_output_shape(in[0], p_);
  }
  double forward_flops() const override { return numel_of(out_shape) * p_.kernel_h * p_.kernel_w; }
  double backward_flops() const override { return numel_of(in_); }
  void forward(ForwardContext& c) const override { c.out = ops::avgpool2d(c.be, c.in[0], p_); }
  void backward(BackwardContext& c) const override {
    Tensor dx = Tensor::empty(in_, c.be.device(), activation_dtype());
    c.be.avgpool2d_backward(c.dout, p_, dx);
    c.din = {dx};
  }

 private:
  Pool2dParams p_;
  Shape in_;
};

class GlobalAvgPool final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit GlobalAvgPool(ConfigReader&) {}
  LayerKind kind() const override { return LayerKind::pool; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    REMAT_CHECK(in[0].rank() == 4, "global_avgpool: input ", in[0].str(), " must be [N, C, H, W]");
    in_ = in[0];
    return Shape{in[0][0], in[0][1]};
  }
  double forward_flops() const override { return numel_of(in_); }
  double backward_flops() const override { return numel_of(in_); }
  void forward(ForwardContext& c) const override { c.out = ops::global_avgpool(c.be, c.in[0]); }
  void backward(BackwardContext& c) const override {
    Tensor dx = Tensor::empty(in_, c.be.device(), activation_dtype());
    c.be.global_avgpool_backward(c.dout, dx);
    c.din = {dx};
  }

 private:
  Shape in_;
};

}  // namespace

REMAT_REGISTER_LAYER("maxpool2d", MaxPool2d);
REMAT_REGISTER_LAYER("avgpool2d", AvgPool2d);
REMAT_REGISTER_LAYER("global_avgpool", GlobalAvgPool);

}  // namespace remat::layers
