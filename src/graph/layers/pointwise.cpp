// The pointwise layers: relu, gelu, silu, add (a residual join), mul (a gate: LLaMA's SwiGLU
// MLP multiplies silu(gate) by up), and flatten (a view).
#include "graph/layers/layer_util.h"

namespace remat::layers {
namespace {

class Relu final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit Relu(ConfigReader&) {}
  LayerKind kind() const override { return LayerKind::pointwise; }
  StepRun step_run() const override { return StepRun::positionwise; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    n_ = in[0].numel();
    return in[0];
  }
  double forward_flops() const override { return static_cast<double>(n_); }
  double backward_flops() const override { return static_cast<double>(n_); }
  void forward(ForwardContext& c) const override { c.out = ops::relu(c.be, c.in[0]); }
  void backward(BackwardContext& c) const override {
    Tensor dx = reuse_dout(c, c.in[0].shape());
    c.be.relu_backward(c.dout, c.in[0], dx);
    c.din = {dx};
  }
  std::vector<int> backward_inputs() const override { return {0}; }

 private:
  int64_t n_ = 0;
};

class Gelu final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit Gelu(ConfigReader& r)
      : approx_(r.one_of("approximate", {"none", "tanh"}, "none") == "tanh" ? GeluApprox::tanh : GeluApprox::none) {}
  LayerKind kind() const override { return LayerKind::pointwise; }
  StepRun step_run() const override { return StepRun::positionwise; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    n_ = in[0].numel();
    return in[0];
  }
  double forward_flops() const override { return 8.0 * n_; }
  void forward(ForwardContext& c) const override { c.out = ops::gelu(c.be, c.in[0], approx_); }
  void backward(BackwardContext& c) const override {
    Tensor dx = reuse_dout(c, c.in[0].shape());
    c.be.gelu_backward(c.dout, c.in[0], approx_, dx);
    c.din = {dx};
  }
  std::vector<int> backward_inputs() const override { return {0}; }

 private:
  GeluApprox approx_;
  int64_t n_ = 0;
};

class Silu final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit Silu(ConfigReader&) {}
  LayerKind kind() const override { return LayerKind::pointwise; }
  StepRun step_run() const override { return StepRun::positionwise; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    n_ = in[0].numel();
    return in[0];
  }
  double forward_flops() const override { return 4.0 * n_; }
  void forward(ForwardContext& c) const override {
    c.out = Tensor::empty(c.in[0].shape(), c.be.device(), activation_dtype());
    c.be.silu_forward(c.in[0], c.out);
  }
  void backward(BackwardContext& c) const override {
    // silu_backward's dx may alias dy (remat/backend_ops.def).
    Tensor dx = reuse_dout(c, c.in[0].shape());
    c.be.silu_backward(c.dout, c.in[0], dx);
    c.din = {dx};
  }
  std::vector<int> backward_inputs() const override { return {0}; }

 private:
  int64_t n_ = 0;
};

class Add final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit Add(ConfigReader&) {}
  LayerKind kind() const override { return LayerKind::pointwise; }
  StepRun step_run() const override { return StepRun::positionwise; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 2);
    REMAT_CHECK(in[0] == in[1], "add: inputs ", in[0].str(), " and ", in[1].str(), " differ in shape");
    n_ = in[0].numel();
    return in[0];
  }
  double forward_flops() const override { return static_cast<double>(n_); }
  double backward_flops() const override { return 0.0; }
  void forward(ForwardContext& c) const override { c.out = ops::add(c.be, c.in[0], c.in[1]); }
  void backward(BackwardContext& c) const override { c.din = {c.dout, c.dout}; }

 private:
  int64_t n_ = 0;
};

class Mul final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit Mul(ConfigReader&) {}
  LayerKind kind() const override { return LayerKind::pointwise; }
  StepRun step_run() const override { return StepRun::positionwise; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 2);
    REMAT_CHECK(in[0] == in[1], "mul: inputs ", in[0].str(), " and ", in[1].str(), " differ in shape");
    n_ = in[0].numel();
    return in[0];
  }
  double forward_flops() const override { return static_cast<double>(n_); }
  void forward(ForwardContext& c) const override {
    c.out = Tensor::empty(c.in[0].shape(), c.be.device(), activation_dtype());
    c.be.mul_forward(c.in[0], c.in[1], c.out);
  }
  void backward(BackwardContext& c) const override {
    // mul_backward's outputs never share storage with dy (it reads dy twice): fresh buffers.
    auto grad = [&](int i) {
      return c.need_din[i] ? Tensor::empty(c.in[i].shape(), c.be.device(), activation_dtype()) : Tensor();
    };
    Tensor da = grad(0), db = grad(1);
    if (da.defined() || db.defined()) c.be.mul_backward(c.dout, c.in[0], c.in[1], da, db);
    c.din = {da, db};
  }
  std::vector<int> backward_inputs() const override { return {0, 1}; }

 private:
  int64_t n_ = 0;
};

class Flatten final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit Flatten(ConfigReader&) {}
  LayerKind kind() const override { return LayerKind::view; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    in_ = in[0];
    return Shape{in[0][0], in[0][0] == 0 ? 0 : in[0].numel() / in[0][0]};
  }
  void forward(ForwardContext& c) const override { c.out = c.in[0].view(out_shape); }
  void backward(BackwardContext& c) const override { c.din = {c.dout.view(in_)}; }

 private:
  Shape in_;
};

}  // namespace

REMAT_REGISTER_LAYER("relu", Relu);
REMAT_REGISTER_LAYER("gelu", Gelu);
REMAT_REGISTER_LAYER("silu", Silu);
REMAT_REGISTER_LAYER("add", Add);
REMAT_REGISTER_LAYER("mul", Mul);
REMAT_REGISTER_LAYER("flatten", Flatten);

}  // namespace remat::layers
