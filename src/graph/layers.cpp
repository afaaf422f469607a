// The built-in layer types. Each one: its config keys (docs/config.md), shape inference,
// parameters with PyTorch's default initialisation, FLOPs, forward, backward, and what
// backward reads.
#include <cmath>
#include <map>
#include <mutex>

#include "remat/config.h"
#include "remat/error.h"
#include "remat/graph.h"
#include "remat/ops.h"

namespace remat {

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::input: return "input";
    case LayerKind::gemm: return "gemm";
    case LayerKind::conv: return "conv";
    case LayerKind::pointwise: return "pointwise";
    case LayerKind::norm: return "norm";
    case LayerKind::dropout: return "dropout";
    case LayerKind::attention: return "attention";
    case LayerKind::pool: return "pool";
    case LayerKind::embedding: return "embedding";
    case LayerKind::view: return "view";
    case LayerKind::loss: return "loss";
  }
  return "?";
}

Tensor reuse_dout(BackwardContext& c, const Shape& shape) {
  if (c.dout.defined() && c.dout.storage_use_count() == 1 && c.dout.shape() == shape) return c.dout;
  return Tensor::empty(shape, c.be.device());
}

namespace {

double numel_of(const Shape& s) { return static_cast<double>(s.numel()); }

void expect_inputs(const std::vector<Shape>& in, size_t n) {
  REMAT_CHECK(in.size() == n, "expected ", n, " input(s), got ", in.size());
}

ParamSpec uniform_param(const std::string& name, const Shape& s, int64_t fan_in, bool decay = true) {
  return ParamSpec{name, s, Init::uniform, static_cast<float>(1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(fan_in, 1)))), true, decay, ""};
}

// ---- linear ---------------------------------------------------------------------------------

class Linear final : public Layer {
 public:
  explicit Linear(ConfigReader& r)
      : out_(r.positive_int("out_features")), bias_(r.bool_or("bias", true)),
        init_std_(r.number_or("init_std", 0.0, 0.0, 10.0)), tie_(r.string_or("tie_weight", "")) {}
  LayerKind kind() const override { return LayerKind::gemm; }
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
    ParamSpec w = uniform_param("weight", Shape{out_, in_}, in_);
    if (init_std_ > 0) w = ParamSpec{"weight", Shape{out_, in_}, Init::normal, static_cast<float>(init_std_), true, true, ""};
    if (!tie_.empty()) w.tie = tie_ + ".weight";
    std::vector<ParamSpec> ps{w};
    if (bias_) {
      ParamSpec b = uniform_param("bias", Shape{out_}, in_, false);
      if (init_std_ > 0) b.init = Init::zeros;
      ps.push_back(b);
    }
    return ps;
  }
  double forward_flops() const override { return 2.0 * rows_ * in_ * out_; }
  void forward(ForwardContext& c) override {
    c.out = ops::linear(c.be, c.in[0], c.params[0], bias_ ? c.params[1] : Tensor());
  }
  void backward(BackwardContext& c) override {
    Tensor dx = c.need_din[0] ? Tensor::empty(c.in[0].shape(), c.be.device()) : Tensor();
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

// ---- conv2d -----------------------------------------------------------------------------------

std::pair<int, int> int_or_pair(ConfigReader& r, const std::string& key, int def, int min) {
  if (!r.has(key)) return {def, def};
  const auto& v = r.raw(key);
  auto check = [&](const nlohmann::json& x, const std::string& k) {
    if (!x.is_number_integer() || x.get<int64_t>() < min || x.get<int64_t>() > 1 << 20)
      r.fail(k, std::string("expected ") + (min > 0 ? "a positive" : "a non-negative") +
                    " integer or a list of two, got " + x.dump());
    return static_cast<int>(x.get<int64_t>());
  };
  if (v.is_array()) {
    if (v.size() != 2) r.fail(key, "expected a list of two integers, got " + v.dump());
    return {check(v[0], key + "/0"), check(v[1], key + "/1")};
  }
  int x = check(v, key);
  return {x, x};
}

class Conv2d final : public Layer {
 public:
  explicit Conv2d(ConfigReader& r) : k_(r.positive_int("out_channels")), bias_(r.bool_or("bias", true)) {
    std::tie(kh_, kw_) = int_or_pair(r, "kernel", -1, 1);
    if (kh_ < 0) r.fail("kernel", "missing (required)");
    std::tie(p_.stride_h, p_.stride_w) = int_or_pair(r, "stride", 1, 1);
    std::tie(p_.pad_h, p_.pad_w) = int_or_pair(r, "padding", 0, 0);
    std::tie(p_.dilation_h, p_.dilation_w) = int_or_pair(r, "dilation", 1, 1);
    p_.groups = static_cast<int>(r.int_or("groups", 1, 1, 1 << 20));
  }
  LayerKind kind() const override { return LayerKind::conv; }
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
    std::vector<ParamSpec> ps{uniform_param("weight", w_shape(), fan_in)};
    if (bias_) ps.push_back(uniform_param("bias", Shape{k_}, fan_in, false));
    return ps;
  }
  double forward_flops() const override { return 2.0 * numel_of(out_) * (c_ / p_.groups) * kh_ * kw_; }
  void forward(ForwardContext& c) override {
    c.out = ops::conv2d(c.be, c.in[0], c.params[0], bias_ ? c.params[1] : Tensor(), p_);
  }
  void backward(BackwardContext& c) override {
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

// ---- normalisation ------------------------------------------------------------------------------

class BatchNorm2d final : public Layer {
 public:
  explicit BatchNorm2d(ConfigReader& r) {
    p_.momentum = static_cast<float>(r.number_or("momentum", 0.1, 0.0, 1.0));
    p_.eps = static_cast<float>(r.number_or("eps", 1e-5, 1e-12, 1.0));
  }
  LayerKind kind() const override { return LayerKind::norm; }
  bool has_side_effects() const override { return true; }  // running statistics
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    REMAT_CHECK(in[0].rank() == 4, "batchnorm2d: input ", in[0].str(), " must be [N, C, H, W]");
    c_ = in[0][1];
    n_ = in[0].numel();
    return in[0];
  }
  std::vector<ParamSpec> param_specs() const override {
    return {ParamSpec{"weight", Shape{c_}, Init::ones, 0, true, false, ""},
            ParamSpec{"bias", Shape{c_}, Init::zeros, 0, true, false, ""},
            ParamSpec{"running_mean", Shape{c_}, Init::zeros, 0, false, false, ""},
            ParamSpec{"running_var", Shape{c_}, Init::ones, 0, false, false, ""}};
  }
  double forward_flops() const override { return 8.0 * n_; }
  void forward(ForwardContext& c) override {
    if (!c.training) {
      c.out = Tensor::empty(c.in[0].shape(), c.be.device());
      c.be.batchnorm2d_forward_eval(c.in[0], c.params[0], c.params[1], c.params[2], c.params[3], p_, c.out);
      return;
    }
    auto r = ops::batchnorm2d_train(c.be, c.in[0], c.params[0], c.params[1], c.params[2], c.params[3], p_,
                                    /*update_running=*/!c.recompute);
    c.out = r.y;
    c.extras = {r.mean, r.invstd};
  }
  void backward(BackwardContext& c) override {
    // The CPU batchnorm backward reads a channel's dy whole before writing its dx: dx may be dy.
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
  explicit LayerNorm(ConfigReader& r) : eps_(static_cast<float>(r.number_or("eps", 1e-5, 1e-12, 1.0))) {}
  LayerKind kind() const override { return LayerKind::norm; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    REMAT_CHECK(in[0].rank() >= 2, "layernorm: input ", in[0].str(), " must have rank >= 2");
    c_ = in[0][-1];
    n_ = in[0].numel();
    return in[0];
  }
  std::vector<ParamSpec> param_specs() const override {
    return {ParamSpec{"weight", Shape{c_}, Init::ones, 0, true, false, ""},
            ParamSpec{"bias", Shape{c_}, Init::zeros, 0, true, false, ""}};
  }
  double forward_flops() const override { return 8.0 * n_; }
  void forward(ForwardContext& c) override {
    auto r = ops::layernorm(c.be, c.in[0], c.params[0], c.params[1], eps_);
    c.out = r.y;
    c.extras = {r.mean, r.invstd};
  }
  void backward(BackwardContext& c) override {
    // The CPU layernorm backward computes the parameter gradients before dx, so dx may be dy.
    Tensor dx = c.need_din[0] ? reuse_dout(c, c.in[0].shape()) : Tensor();
    c.be.layernorm_backward(c.dout, c.in[0], c.params[0], c.extras[0], c.extras[1], dx, c.grads[0], c.grads[1]);
    c.din = {dx};
  }
  std::vector<int> backward_inputs() const override { return {0}; }
  std::vector<std::string> extra_names() const override { return {"mean", "rstd"}; }

 private:
  float eps_;
  int64_t c_ = 0, n_ = 0;
};

// ---- pointwise ----------------------------------------------------------------------------------

class Relu final : public Layer {
 public:
  explicit Relu(ConfigReader&) {}
  LayerKind kind() const override { return LayerKind::pointwise; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    n_ = in[0].numel();
    return in[0];
  }
  double forward_flops() const override { return static_cast<double>(n_); }
  double backward_flops() const override { return static_cast<double>(n_); }
  void forward(ForwardContext& c) override { c.out = ops::relu(c.be, c.in[0]); }
  void backward(BackwardContext& c) override {
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
  explicit Gelu(ConfigReader& r)
      : approx_(r.one_of("approximate", {"none", "tanh"}, "none") == "tanh" ? GeluApprox::tanh : GeluApprox::none) {}
  LayerKind kind() const override { return LayerKind::pointwise; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    n_ = in[0].numel();
    return in[0];
  }
  double forward_flops() const override { return 8.0 * n_; }
  void forward(ForwardContext& c) override { c.out = ops::gelu(c.be, c.in[0], approx_); }
  void backward(BackwardContext& c) override {
    Tensor dx = reuse_dout(c, c.in[0].shape());
    c.be.gelu_backward(c.dout, c.in[0], approx_, dx);
    c.din = {dx};
  }
  std::vector<int> backward_inputs() const override { return {0}; }

 private:
  GeluApprox approx_;
  int64_t n_ = 0;
};

class Dropout final : public Layer {
 public:
  explicit Dropout(ConfigReader& r) : p_(static_cast<float>(r.number_or("p", 0.5, 0.0, 1.0))) {}
  LayerKind kind() const override { return LayerKind::dropout; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    n_ = in[0].numel();
    return in[0];
  }
  uint64_t rng_words() const override { return p_ > 0.0f && p_ < 1.0f ? static_cast<uint64_t>(n_) : 0; }
  double forward_flops() const override { return static_cast<double>(n_); }
  double backward_flops() const override { return static_cast<double>(n_); }
  void forward(ForwardContext& c) override {
    c.out = (c.training && p_ > 0.0f) ? ops::dropout(c.be, c.in[0], p_, c.rng) : c.in[0];
  }
  void backward(BackwardContext& c) override {
    if (p_ == 0.0f) {
      c.din = {c.dout};
      return;
    }
    Tensor dx = reuse_dout(c, c.dout.shape());
    c.be.dropout_backward(c.dout, p_, c.rng, dx);
    c.din = {dx};
  }

 private:
  float p_;
  int64_t n_ = 0;
};

class Add final : public Layer {
 public:
  explicit Add(ConfigReader&) {}
  LayerKind kind() const override { return LayerKind::pointwise; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 2);
    REMAT_CHECK(in[0] == in[1], "add: inputs ", in[0].str(), " and ", in[1].str(), " differ in shape");
    n_ = in[0].numel();
    return in[0];
  }
  double forward_flops() const override { return static_cast<double>(n_); }
  double backward_flops() const override { return 0.0; }
  void forward(ForwardContext& c) override { c.out = ops::add(c.be, c.in[0], c.in[1]); }
  void backward(BackwardContext& c) override { c.din = {c.dout, c.dout}; }

 private:
  int64_t n_ = 0;
};

class Flatten final : public Layer {
 public:
  explicit Flatten(ConfigReader&) {}
  LayerKind kind() const override { return LayerKind::view; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    in_ = in[0];
    return Shape{in[0][0], in[0][0] == 0 ? 0 : in[0].numel() / in[0][0]};
  }
  void forward(ForwardContext& c) override { c.out = c.in[0].view(out_shape); }
  void backward(BackwardContext& c) override { c.din = {c.dout.view(in_)}; }

 private:
  Shape in_;
};

// ---- pooling -------------------------------------------------------------------------------------

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
  explicit MaxPool2d(ConfigReader& r) : p_(read_pool(r)) {}
  LayerKind kind() const override { return LayerKind::pool; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    REMAT_CHECK(in[0].rank() == 4, "maxpool2d: input ", in[0].str(), " must be [N, C, H, W]");
    in_ = in[0];
    return pool2d_output_shape(in[0], p_);
  }
  double forward_flops() const override { return numel_of(out_shape) * p_.kernel_h * p_.kernel_w; }
  double backward_flops() const override { return numel_of(in_); }
  void forward(ForwardContext& c) override {
    auto r = ops::maxpool2d(c.be, c.in[0], p_);
    c.out = r.y;
    c.extras = {r.indices};
  }
  void backward(BackwardContext& c) override {
    Tensor dx = Tensor::empty(in_, c.be.device());
    c.be.maxpool2d_backward(c.dout, c.extras[0], dx);
    c.din = {dx};
  }
  std::vector<std::string> extra_names() const override { return {"indices"}; }

 private:
  Pool2dParams p_;
  Shape in_;
};

class AvgPool2d final : public Layer {
 public:
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
  void forward(ForwardContext& c) override { c.out = ops::avgpool2d(c.be, c.in[0], p_); }
  void backward(BackwardContext& c) override {
    Tensor dx = Tensor::empty(in_, c.be.device());
    c.be.avgpool2d_backward(c.dout, p_, dx);
    c.din = {dx};
  }

 private:
  Pool2dParams p_;
  Shape in_;
};

class GlobalAvgPool final : public Layer {
 public:
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
  void forward(ForwardContext& c) override { c.out = ops::global_avgpool(c.be, c.in[0]); }
  void backward(BackwardContext& c) override {
    Tensor dx = Tensor::empty(in_, c.be.device());
    c.be.global_avgpool_backward(c.dout, dx);
    c.din = {dx};
  }

 private:
  Shape in_;
};

// ---- transformer pieces -----------------------------------------------------------------------------

class Embedding final : public Layer {
 public:
  explicit Embedding(ConfigReader& r)
      : vocab_(r.positive_int("vocab")), dim_(r.positive_int("dim")),
        max_seq_(r.int_or("positions", 0, 0, int64_t{1} << 24)), init_std_(r.number_or("init_std", 1.0, 1e-6, 10.0)) {}
  LayerKind kind() const override { return LayerKind::embedding; }
  bool input_differentiable(int) const override { return false; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    REMAT_CHECK(in[0].rank() == 2, "embedding: input ", in[0].str(), " must be token ids [B, T]");
    REMAT_CHECK(max_seq_ == 0 || in[0][1] <= max_seq_, "embedding: sequence length ", in[0][1],
                " exceeds positions ", max_seq_);
    n_ = in[0].numel();
    return Shape{in[0][0], in[0][1], dim_};
  }
  std::vector<ParamSpec> param_specs() const override {
    std::vector<ParamSpec> ps{ParamSpec{"weight", Shape{vocab_, dim_}, Init::normal, static_cast<float>(init_std_), true, true, ""}};
    if (max_seq_ > 0)
      ps.push_back(ParamSpec{"pos_weight", Shape{max_seq_, dim_}, Init::normal, static_cast<float>(init_std_), true, true, ""});
    return ps;
  }
  double forward_flops() const override { return static_cast<double>(n_) * dim_; }
  void forward(ForwardContext& c) override {
    c.out = ops::embedding(c.be, c.in[0], c.params[0], max_seq_ > 0 ? c.params[1] : Tensor());
  }
  void backward(BackwardContext& c) override {
    c.be.embedding_backward(c.dout, c.in[0], c.grads[0], max_seq_ > 0 ? c.grads[1] : Tensor());
    c.din = {Tensor()};
  }
  std::vector<int> backward_inputs() const override { return {0}; }

 private:
  int64_t vocab_, dim_, max_seq_;
  double init_std_;
  int64_t n_ = 0;
};

class Attention final : public Layer {
 public:
  explicit Attention(ConfigReader& r) {
    p_.n_head = static_cast<int>(r.int_or("heads", 1, 1, 1 << 16));
    p_.dropout = static_cast<float>(r.number_or("dropout", 0.0, 0.0, 1.0));
    p_.causal = r.bool_or("causal", true);
  }
  LayerKind kind() const override { return LayerKind::attention; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    REMAT_CHECK(in[0].rank() == 3 && in[0][2] % (3 * p_.n_head) == 0, "attention: input ", in[0].str(),
                " must be [B, T, 3C] with C divisible by heads ", p_.n_head);
    b_ = in[0][0];
    t_ = in[0][1];
    c_ = in[0][2] / 3;
    return Shape{b_, t_, c_};
  }
  uint64_t rng_words() const override {
    return p_.dropout > 0.0f && p_.dropout < 1.0f ? static_cast<uint64_t>(b_ * p_.n_head * t_ * t_) : 0;
  }
  // Two GEMMs (Q K^T and P V) and the row work (scale, max, exp, sum, dropout) per score;
  // the probabilities alone take the first GEMM and the softmax.
  double forward_flops() const override {
    return 4.0 * b_ * t_ * t_ * c_ * (p_.causal ? 0.5 : 1.0) + 5.0 * b_ * p_.n_head * t_ * t_;
  }
  double extras_flops() const override {
    return 2.0 * b_ * t_ * t_ * c_ * (p_.causal ? 0.5 : 1.0) + 4.0 * b_ * p_.n_head * t_ * t_;
  }
  void forward(ForwardContext& c) override {
    if (c.extras_only) {  // the output is kept: rebuild the probabilities only
      c.extras = {ops::attention_probs(c.be, c.in[0], p_)};
      return;
    }
    AttentionParams p = p_;
    if (!c.training) p.dropout = 0.0f;
    auto r = ops::attention(c.be, c.in[0], p, c.rng);
    c.out = r.out;
    c.extras = {r.probs};
  }
  void backward(BackwardContext& c) override {
    c.din = {ops::attention_backward(c.be, c.dout, c.in[0], c.extras[0], p_, c.rng)};
  }
  std::vector<int> backward_inputs() const override { return {0}; }
  std::vector<std::string> extra_names() const override { return {"probs"}; }

 private:
  AttentionParams p_;
  int64_t b_ = 0, t_ = 0, c_ = 0;
};

}  // namespace

// ---- loss (built by build_graph from the model's "loss" section) ------------------------------------

class CrossEntropyLoss final : public Layer {
 public:
  explicit CrossEntropyLoss(int ignore_index) : ignore_(ignore_index) {}
  LayerKind kind() const override { return LayerKind::loss; }
  bool input_differentiable(int i) const override { return i == 0; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 2);
    REMAT_CHECK(in[0].rank() >= 2, "cross_entropy: logits ", in[0].str(), " must have rank >= 2");
    v_ = in[0][-1];
    n_ = in[0].numel() / v_;
    REMAT_CHECK(in[1].numel() == n_, "cross_entropy: targets ", in[1].str(), " do not match logits ", in[0].str(),
                " (", n_, " rows)");
    return Shape{1};
  }
  double forward_flops() const override { return 4.0 * n_ * v_; }
  double backward_flops() const override { return 3.0 * n_ * v_; }
  void forward(ForwardContext& c) override {
    auto r = ops::cross_entropy(c.be, c.in[0].view(Shape{n_, v_}), c.in[1].view(Shape{n_}), ignore_);
    c.out = r.loss;
    c.extras = {r.lse};
  }
  void backward(BackwardContext& c) override {
    Tensor dl = Tensor::empty(Shape{n_, v_}, c.be.device());
    c.be.cross_entropy_backward(1.0f, c.in[0].view(Shape{n_, v_}), c.in[1].view(Shape{n_}), c.extras[0], ignore_, dl);
    c.din = {dl.view(c.in[0].shape()), Tensor()};
  }
  std::vector<int> backward_inputs() const override { return {0, 1}; }
  std::vector<std::string> extra_names() const override { return {"lse"}; }

 private:
  int ignore_;
  int64_t v_ = 0, n_ = 0;
};

std::unique_ptr<Layer> make_cross_entropy(int ignore_index) { return std::make_unique<CrossEntropyLoss>(ignore_index); }

// ---- registry -----------------------------------------------------------------------------------------

namespace {

std::map<std::string, LayerFactory>& registry() {
  static auto* r = new std::map<std::string, LayerFactory>();
  return *r;
}
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

template <typename L>
void reg(const char* name) {
  registry()[name] = [](ConfigReader& r) -> std::unique_ptr<Layer> { return std::make_unique<L>(r); };
}

void register_builtins() {
  static bool done = [] {
    reg<Linear>("linear");
    reg<Conv2d>("conv2d");
    reg<BatchNorm2d>("batchnorm2d");
    reg<LayerNorm>("layernorm");
    reg<Relu>("relu");
    reg<Gelu>("gelu");
    reg<Dropout>("dropout");
    reg<Add>("add");
    reg<Flatten>("flatten");
    reg<MaxPool2d>("maxpool2d");
    reg<AvgPool2d>("avgpool2d");
    reg<GlobalAvgPool>("global_avgpool");
    reg<Embedding>("embedding");
    reg<Attention>("attention");
    return true;
  }();
  (void)done;
}

}  // namespace

void register_layer_type(const std::string& type, LayerFactory factory) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  register_builtins();
  REMAT_CHECK(type != "repeat" && !registry().count(type), "layer type \"", type, "\" is already registered");
  registry()[type] = std::move(factory);
}

std::vector<std::string> layer_types() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  register_builtins();
  std::vector<std::string> out;
  for (auto& [k, v] : registry()) out.push_back(k);
  return out;
}

LayerFactory find_layer_factory(const std::string& type) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  register_builtins();
  auto it = registry().find(type);
  return it == registry().end() ? LayerFactory() : it->second;
}

}  // namespace remat
