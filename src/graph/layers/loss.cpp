// Loss layers: the last layer of a model, a scalar [1] that backward starts from.
// cross_entropy: the mean over non-ignored rows of -log softmax(logits)[target], over logits
// [..., classes] and i32 targets (class ids) of the same number of rows; with
// label_smoothing e, of -sum_j q_j log softmax(logits)_j for q = (1 - e) onehot + e / classes.
#include "graph/layers/layer_util.h"

namespace remat {

namespace {

using layers::expect_inputs;

class CrossEntropyLoss final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit CrossEntropyLoss(ConfigReader& r)
      : ignore_(static_cast<int>(r.int_or("ignore_index", -100, -(int64_t{1} << 31), (int64_t{1} << 31) - 1))),
        smoothing_(static_cast<float>(r.number_or("label_smoothing", 0.0, 0.0, 1.0))) {
    if (!(smoothing_ < 1.0f)) r.fail("label_smoothing", "must be below 1 (1 would ignore the targets)");
  }
  LayerKind kind() const override { return LayerKind::loss; }
  bool input_differentiable(int i) const override { return i == 0; }
  DType input_dtype(int k) const override { return k == 1 ? DType::i32 : DType::f32; }
  // Targets are class ids below the logits' last dimension (synthetic data draws them so).
  int64_t input_id_range(int k) const override { return k == 1 ? v_ : 0; }
  std::optional<int> ignore_index() const override { return ignore_; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 2);
    REMAT_CHECK(in[0].rank() >= 2, "cross_entropy: logits ", in[0].str(), " must have rank >= 2");
    v_ = in[0][-1];
    n_ = in[0].numel() / v_;
    REMAT_CHECK(in[1].numel() == n_, "cross_entropy: targets ", in[1].str(), " do not match logits ", in[0].str(), " (",
                n_, " rows)");
    return Shape{1};
  }
  double forward_flops() const override { return 4.0 * n_ * v_; }
  double backward_flops() const override { return 3.0 * n_ * v_; }
  void forward(ForwardContext& c) const override {
    auto r = ops::cross_entropy(c.be, c.in[0].view(Shape{n_, v_}), c.in[1].view(Shape{n_}), ignore_, smoothing_);
    c.out = r.loss;
    c.extras = {r.lse};
  }
  void backward(BackwardContext& c) const override {
    Tensor dl = Tensor::empty(Shape{n_, v_}, c.be.device(), activation_dtype());
    c.be.cross_entropy_backward(1.0f, c.in[0].view(Shape{n_, v_}), c.in[1].view(Shape{n_}), c.extras[0], ignore_,
                                smoothing_, dl);
    c.din = {dl.view(c.in[0].shape()), Tensor()};
  }
  std::vector<int> backward_inputs() const override { return {0, 1}; }
  std::vector<std::string> extra_names() const override { return {"lse"}; }

 private:
  int ignore_;
  float smoothing_;
  int64_t v_ = 0, n_ = 0;
};

}  // namespace

REMAT_REGISTER_LAYER("cross_entropy", CrossEntropyLoss);

}  // namespace remat
