// embedding: token ids to vectors, plus learned positions when `positions` is given.
#include "graph/layers/layer_util.h"

namespace remat::layers {
namespace {

class Embedding final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit Embedding(ConfigReader& r)
      : vocab_(r.positive_int("vocab")),
        dim_(r.positive_int("dim")),
        max_seq_(r.int_or("positions", 0, 0, int64_t{1} << 24)),
        init_std_(r.number_or("init_std", 1.0, 1e-6, 10.0)),
        tie_(r.string_or("tie_weight", "")) {}
  LayerKind kind() const override { return LayerKind::embedding; }
  StepRun step_run() const override { return max_seq_ > 0 ? StepRun::positional : StepRun::positionwise; }
  bool input_differentiable(int) const override { return false; }
  DType input_dtype(int) const override { return DType::i32; }
  int64_t input_id_range(int) const override { return vocab_; }
  SelectiveKeep selective_keep() const override { return SelectiveKeep::all; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, 1);
    REMAT_CHECK(in[0].rank() == 2, "embedding: input ", in[0].str(), " must be token ids [B, T]");
    REMAT_CHECK(max_seq_ == 0 || in[0][1] <= max_seq_, "embedding: sequence length ", in[0][1], " exceeds positions ",
                max_seq_);
    n_ = in[0].numel();
    return Shape{in[0][0], in[0][1], dim_};
  }
  std::vector<ParamSpec> param_specs() const override {
    ParamSpec w = ParamSpec::normal("weight", Shape{vocab_, dim_}, static_cast<float>(init_std_));
    if (!tie_.empty()) w = w.tied_to(tie_ + ".weight");  // one table for two vocabularies' tokens
    std::vector<ParamSpec> ps{w};
    if (max_seq_ > 0)
      ps.push_back(ParamSpec::normal("pos_weight", Shape{max_seq_, dim_}, static_cast<float>(init_std_)));
    return ps;
  }
  double forward_flops() const override { return static_cast<double>(n_) * dim_; }
  void forward(ForwardContext& c) const override {
    Tensor pos = max_seq_ > 0 ? c.params[1] : Tensor();
    if (pos.defined() && c.position > 0) {  // incremental decoding: the rows from that position on
      REMAT_CHECK(c.position < max_seq_, "embedding: position ", c.position, " is past its ", max_seq_, " positions");
      pos = pos.view_at(c.position * dim_, Shape{max_seq_ - c.position, dim_});
    }
    c.out = ops::embedding(c.be, c.in[0], c.params[0], pos);
  }
  void backward(BackwardContext& c) const override {
    ops::embedding_backward(c.be, c.dout, c.in[0], c.grads[0], max_seq_ > 0 ? c.grads[1] : Tensor());
    c.din = {Tensor()};
  }
  std::vector<int> backward_inputs() const override { return {0}; }

 private:
  int64_t vocab_, dim_, max_seq_;
  double init_std_;
  std::string tie_;
  int64_t n_ = 0;
};

}  // namespace

REMAT_REGISTER_LAYER("embedding", Embedding);

}  // namespace remat::layers
