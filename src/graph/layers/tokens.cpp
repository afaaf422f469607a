// The layers that turn an image into a sequence of tokens and back, for vision transformers
// (Dosovitskiy et al. 2021): patch_tokens ([N, C, H, W] -> [N, H*W, C], after a conv2d
// whose kernel and stride are the patch size), position_embedding (a learned [T, D] table
// added to every sequence of the batch) and mean_tokens ([N, T, D] -> [N, D], the mean
// over the sequence, ViT's pooled head). Built from ops every backend has (permute_0213,
// add, accumulate, global average pooling), so they run alike on cpu, meta and CUDA.
#include "graph/layers/layer_util.h"

namespace remat::layers {
namespace {

// [N, C, H, W] -> [N, H*W, C]: the channels of each position become its token (a copy, not a
// view: the layout changes).
class PatchTokens final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit PatchTokens(ConfigReader&) {}
  LayerKind kind() const override { return LayerKind::pointwise; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    REMAT_CHECK(in[0].rank() == 4, "patch_tokens: input ", in[0].str(), " must be [N, C, H, W]");
    in_ = in[0];
    return Shape{in_[0], in_[2] * in_[3], in_[1]};
  }
  void forward(ForwardContext& c) const override {
    // [N, C, HW, 1] -> [N, HW, C, 1]
    c.out = ops::permute_0213(c.be, c.in[0].view(Shape{in_[0], in_[1], in_[2] * in_[3], 1}))
                .view(Shape{in_[0], in_[2] * in_[3], in_[1]});
  }
  void backward(BackwardContext& c) const override {
    c.din = {ops::permute_0213(c.be, c.dout.view(Shape{in_[0], in_[2] * in_[3], in_[1], 1})).view(in_)};
  }

 private:
  Shape in_;
};

// y[n, t, :] = x[n, t, :] + weight[t, :] over a learned table of `positions` rows (at least
// the sequence length T; rows T.. unused), as ViT's and GPT-2's learned positions.
class PositionEmbedding final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit PositionEmbedding(ConfigReader& r)
      : positions_(r.positive_int("positions")), init_std_(r.number_or("init_std", 0.02, 0.0, 10.0)) {}
  LayerKind kind() const override { return LayerKind::pointwise; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    REMAT_CHECK(in[0].rank() == 3, "position_embedding: input ", in[0].str(), " must be [N, T, D]");
    REMAT_CHECK(in[0][1] <= positions_, "position_embedding: sequence length ", in[0][1], " exceeds positions ",
                positions_);
    in_ = in[0];
    return in_;
  }
  std::vector<ParamSpec> param_specs() const override {
    return {ParamSpec::normal("weight", Shape{positions_, in_[2]}, static_cast<float>(init_std_)).no_decay()};
  }
  double forward_flops() const override { return numel_of(in_); }
  double backward_flops() const override { return numel_of(in_); }
  void forward(ForwardContext& c) const override {
    const int64_t n = in_[0], row = in_[1] * in_[2];
    const Shape seq{in_[1], in_[2]};
    const Tensor table = c.params[0].view_at(0, seq);  // the first T rows
    c.out = Tensor::empty(in_, c.be.device(), activation_dtype());
    for (int64_t b = 0; b < n; ++b) c.be.add(c.in[0].view_at(b * row, seq), table, c.out.view_at(b * row, seq));
  }
  void backward(BackwardContext& c) const override {
    const int64_t n = in_[0], row = in_[1] * in_[2];
    const Shape seq{in_[1], in_[2]};
    if (c.grads[0].defined()) {
      const Tensor dtable = c.grads[0].view_at(0, seq);
      for (int64_t b = 0; b < n; ++b) c.be.accumulate(dtable, c.dout.view_at(b * row, seq));
    }
    c.din = {c.dout};
  }

 private:
  int64_t positions_;
  double init_std_;
  Shape in_;
};

// [N, T, D] -> [N, D]: the mean over the sequence.
class MeanTokens final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit MeanTokens(ConfigReader&) {}
  LayerKind kind() const override { return LayerKind::pool; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    REMAT_CHECK(in[0].rank() == 3, "mean_tokens: input ", in[0].str(), " must be [N, T, D]");
    in_ = in[0];
    return Shape{in_[0], in_[2]};
  }
  double forward_flops() const override { return numel_of(in_); }
  double backward_flops() const override { return numel_of(in_); }
  void forward(ForwardContext& c) const override {
    // [N, T, D, 1] -> [N, D, T, 1], then the mean of each plane.
    const Tensor planes = ops::permute_0213(c.be, c.in[0].view(Shape{in_[0], in_[1], in_[2], 1}));
    c.out = ops::global_avgpool(c.be, planes);
  }
  void backward(BackwardContext& c) const override {
    Tensor planes = Tensor::empty(Shape{in_[0], in_[2], in_[1], 1}, c.be.device(), activation_dtype());
    c.be.global_avgpool_backward(c.dout, planes);
    c.din = {ops::permute_0213(c.be, planes).view(in_)};
  }

 private:
  Shape in_;
};

}  // namespace

REMAT_REGISTER_LAYER("patch_tokens", PatchTokens);
REMAT_REGISTER_LAYER("position_embedding", PositionEmbedding);
REMAT_REGISTER_LAYER("mean_tokens", MeanTokens);

}  // namespace remat::layers
