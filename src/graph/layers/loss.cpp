// The loss layer: cross-entropy over logits and i32 targets (built by build_graph from the
// model's "loss" section, not by a layer type).
#include "graph/layers/layer_util.h"

namespace remat {

namespace {

using layers::expect_inputs;

class CrossEntropyLoss final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit CrossEntropyLoss(int ignore_index) : ignore_(ignore_index) {}
  LayerKind kind() const override { return LayerKind::loss; }
  bool input_differentiable(int i) const override { return i == 0; }
  DType input_dtype(int k) const override { return k == 1 ? DType::i32 : DType::f32; }
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
    auto r = ops::cross_entropy(c.be, c.in[0].view(Shape{n_, v_}), c.in[1].view(Shape{n_}), ignore_);
    c.out = r.loss;
    c.extras = {r.lse};
  }
  void backward(BackwardContext& c) const override {
    Tensor dl = Tensor::empty(Shape{n_, v_}, c.be.device(), activation_dtype());
    c.be.cross_entropy_backward(1.0f, c.in[0].view(Shape{n_, v_}), c.in[1].view(Shape{n_}), c.extras[0], ignore_, dl);
    c.din = {dl.view(c.in[0].shape()), Tensor()};
  }
  std::vector<int> backward_inputs() const override { return {0, 1}; }
  std::vector<std::string> extra_names() const override { return {"lse"}; }

 private:
  int ignore_;
  int64_t v_ = 0, n_ = 0;
};

}  // namespace

std::unique_ptr<Layer> make_cross_entropy(int ignore_index) { return std::make_unique<CrossEntropyLoss>(ignore_index); }

}  // namespace remat
