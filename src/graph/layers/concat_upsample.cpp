// The layers of U-Net-style skip connections (Ronneberger et al. 2015): concat joins its
// inputs along the channel dimension (dimension 1: [N, C1, ...] and [N, C2, ...] ->
// [N, C1 + C2, ...]), upsample repeats each pixel of [N, C, H, W] into a 2x2 block (nearest
// neighbour, PyTorch's F.interpolate(scale_factor=2, mode="nearest")). Built from ops every
// backend has: concat copies each sample's block of channels with scale(x, 1) (exact in
// fp32 and bf16); upsample is 4 x avgpool2d's backward over 2x2 windows (each output dy/4,
// times 4: exact, both powers of two, but for subnormal values and the sign of a zero), its
// backward 4 x avgpool2d's forward (the sum of each 2x2 block of the gradient).
#include "graph/layers/layer_util.h"

namespace remat::layers {
namespace {

class Concat final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit Concat(ConfigReader&) {}
  LayerKind kind() const override { return LayerKind::pointwise; }
  Shape infer(const std::vector<Shape>& in) override {
    REMAT_CHECK(in.size() >= 2, "concat: needs at least two inputs (\"inputs\": [...]), got ", in.size());
    REMAT_CHECK(in[0].rank() >= 2, "concat: input ", in[0].str(), " must have rank >= 2 ([N, C, ...])");
    std::vector<int64_t> d = in[0].dims();
    channels_.clear();
    in_ = in;
    for (const Shape& s : in) {
      bool same = s.rank() == in[0].rank();
      for (int k = 0; same && k < s.rank(); ++k) same = k == 1 || s[k] == in[0][k];
      REMAT_CHECK(same, "concat: inputs ", in[0].str(), " and ", s.str(), " differ beyond dimension 1 (channels)");
      channels_.push_back(s[1]);
    }
    d[1] = 0;
    for (int64_t c : channels_) d[1] += c;
    out_ = Shape(d);
    inner_ = out_[1] == 0 ? 0 : out_.numel() / (out_[0] * out_[1]);
    return out_;
  }
  void forward(ForwardContext& c) const override {
    c.out = Tensor::empty(out_, c.be.device(), activation_dtype());
    int64_t offset = 0;  // channels before input k
    for (size_t k = 0; k < channels_.size(); ++k) {
      const Shape block{channels_[k] * inner_};
      for (int64_t n = 0; n < out_[0]; ++n)
        c.be.scale(c.in[k].view_at(n * block[0], block), 1.0f, c.out.view_at((n * out_[1] + offset) * inner_, block));
      offset += channels_[k];
    }
  }
  void backward(BackwardContext& c) const override {
    c.din.assign(channels_.size(), Tensor());
    int64_t offset = 0;
    for (size_t k = 0; k < channels_.size(); ++k) {
      if (c.need_din[k]) {
        const Shape block{channels_[k] * inner_};
        c.din[k] = Tensor::empty(in_[k], c.be.device(), activation_dtype());  // backward reads no input
        for (int64_t n = 0; n < out_[0]; ++n)
          c.be.scale(c.dout.view_at((n * out_[1] + offset) * inner_, block), 1.0f,
                     c.din[k].view_at(n * block[0], block));
      }
      offset += channels_[k];
    }
  }

 private:
  std::vector<Shape> in_;
  std::vector<int64_t> channels_;
  Shape out_;
  int64_t inner_ = 0;
};

class Upsample final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit Upsample(ConfigReader& r) {
    if (r.int_or("scale_factor", 2, 1, 64) != 2) r.fail("scale_factor", "must be 2 (the only factor so far)");
  }
  LayerKind kind() const override { return LayerKind::pool; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    REMAT_CHECK(in[0].rank() == 4, "upsample: input ", in[0].str(), " must be [N, C, H, W]");
    in_ = in[0];
    return Shape{in_[0], in_[1], 2 * in_[2], 2 * in_[3]};
  }
  double forward_flops() const override { return 4.0 * numel_of(in_); }
  double backward_flops() const override { return 4.0 * numel_of(in_); }
  void forward(ForwardContext& c) const override {
    c.out = Tensor::empty(Shape{in_[0], in_[1], 2 * in_[2], 2 * in_[3]}, c.be.device(), activation_dtype());
    c.be.avgpool2d_backward(c.in[0], Pool2dParams{}, c.out);  // each x / 4 into its 2x2 block
    c.be.scale(c.out, 4.0f, c.out);
  }
  void backward(BackwardContext& c) const override {
    Tensor dx = ops::avgpool2d(c.be, c.dout, Pool2dParams{});  // each 2x2 block's sum / 4
    c.be.scale(dx, 4.0f, dx);
    c.din = {dx};
  }

 private:
  Shape in_;
};

}  // namespace

REMAT_REGISTER_LAYER("concat", Concat);
REMAT_REGISTER_LAYER("upsample", Upsample);

}  // namespace remat::layers
