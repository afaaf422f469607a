// attention: multi-head attention. Its inputs:
// - one tensor [B, T, (heads + 2 kv_heads) d]: q, k, v side by side (self-attention, the
//   output of one linear layer), or with "cross": true two, q [B, tq, heads d] and kv
//   [B, tk, 2 kv_heads d] (cross-attention: queries from one sequence, keys and values from
//   another);
// - with "key_lengths": true, one more: i32 [B], the number of real (unpadded) keys of each
//   batch element; later keys are masked.
// "impl": "fused" (the default) runs the fused attention (Backend::flash_attention_*): no
// [T, T] tensor, the saved state is the output and one log-sum-exp per row.
// "materialized" runs the reference path (Backend::attention_*): the [B, H, T, T]
// probabilities are made and saved (or recomputed), for packed self-attention with as many
// key/value heads as heads and no key lengths.
#include "graph/layers/layer_util.h"

namespace remat::layers {
namespace {

class Attention final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit Attention(ConfigReader& r) {
    heads_ = static_cast<int>(r.int_or("heads", 1, 1, 1 << 16));
    kv_heads_ = static_cast<int>(r.int_or("kv_heads", heads_, 1, 1 << 16));
    if (heads_ % kv_heads_ != 0)
      r.fail("kv_heads",
             "heads " + std::to_string(heads_) + " is not a multiple of kv_heads " + std::to_string(kv_heads_));
    dropout_ = static_cast<float>(r.number_or("dropout", 0.0, 0.0, 1.0));
    causal_ = r.bool_or("causal", true);
    cross_ = r.bool_or("cross", false);
    lengths_ = r.bool_or("key_lengths", false);
    if (cross_ && causal_ && r.has("causal")) r.fail("causal", "cross-attention is not causal");
    if (cross_) causal_ = false;
    fused_ = r.one_of("impl", {"fused", "materialized"}, "fused") == "fused";
    if (!fused_ && (cross_ || lengths_ || kv_heads_ != heads_))
      r.fail("impl",
             "\"materialized\" runs packed self-attention with kv_heads = heads and no key_lengths; use "
             "\"fused\"");
  }
  LayerKind kind() const override { return LayerKind::attention; }
  // Cross-attention's queries are position-wise (its keys are another sequence's); causal
  // fused self-attention decodes with a key/value cache; non-causal self-attention cannot.
  StepRun step_run() const override {
    if (cross_) return StepRun::positionwise;
    return causal_ && fused_ && !lengths_ ? StepRun::cached : StepRun::no;
  }
  // Fused: nothing T x T to rebuild, so selective keeps it whole, as a GEMM. Materialised:
  // P V is a GEMM product worth keeping; the probabilities (a softmax) are recomputed.
  SelectiveKeep selective_keep() const override { return fused_ ? SelectiveKeep::all : SelectiveKeep::output; }
  DType input_dtype(int k) const override { return lengths_ && k == inputs_used() - 1 ? DType::i32 : DType::f32; }
  bool input_differentiable(int k) const override { return !(lengths_ && k == inputs_used() - 1); }
  // Key lengths: 1 to tk (synthetic data draws from that).
  int64_t input_id_range(int k) const override { return lengths_ && k == inputs_used() - 1 ? tk_ + 1 : 0; }
  int64_t input_id_min(int k) const override { return lengths_ && k == inputs_used() - 1 ? 1 : 0; }
  Shape infer(const std::vector<Shape>& in) override {
    expect_inputs(in, static_cast<size_t>(inputs_used()));
    const int64_t per = cross_ ? heads_ : heads_ + 2 * int64_t{kv_heads_};
    REMAT_CHECK(in[0].rank() == 3 && in[0][2] % per == 0, "attention: input ", in[0].str(), " must be [B, T, ",
                cross_ ? "heads d" : "(heads + 2 kv_heads) d", "] with heads ", heads_, ", kv_heads ", kv_heads_);
    b_ = in[0][0];
    tq_ = tk_ = in[0][1];
    d_ = in[0][2] / per;
    if (cross_) {
      REMAT_CHECK(in[1].rank() == 3 && in[1][0] == b_ && in[1][2] == 2 * kv_heads_ * d_, "attention: kv ", in[1].str(),
                  " must be [", b_, ", tk, ", 2 * kv_heads_ * d_, "] (k and v of ", kv_heads_, " heads of ", d_,
                  ") for queries ", in[0].str());
      tk_ = in[1][1];
    }
    if (lengths_) {
      const Shape& l = in[static_cast<size_t>(inputs_used() - 1)];
      REMAT_CHECK(l.rank() == 1 && l[0] == b_, "attention: key lengths ", l.str(), " must be [", b_, "]");
    }
    REMAT_CHECK(!fused_ || d_ <= 256, "attention: head dimension ", d_, " is larger than 256");
    return Shape{b_, tq_, heads_ * d_};
  }
  uint64_t rng_words() const override {
    return dropout_ > 0.0f && dropout_ < 1.0f ? static_cast<uint64_t>(b_ * heads_ * tq_ * tk_) : 0;
  }
  // Two products (Q K^T and P V) and the row work (scale, max, exp, sum, dropout) per
  // score. Fused backward: seven tile products (dK, dV in one pass, dQ in another that
  // computes Q K^T and dO V^T again); materialised: four products.
  double forward_flops() const override {
    return fused_ ? 2.0 * gemm_flops() + 5.0 * scores() : 2.0 * gemm_flops() + 5.0 * b_ * heads_ * tq_ * tk_;
  }
  double backward_flops() const override {
    return fused_ ? 7.0 * gemm_flops() + 10.0 * scores() : 2.0 * forward_flops();
  }
  // Materialised with its output kept: the probabilities alone (the first product and the
  // softmax). Fused: a re-run computes everything.
  double extras_flops() const override {
    return fused_ ? forward_flops() : gemm_flops() + 4.0 * b_ * heads_ * tq_ * tk_;
  }

  void forward(ForwardContext& c) const override {
    if (c.kv_cache) return forward_cached(c);
    if (!fused_) return forward_materialized(c);
    const FlashAttentionParams p = params(c.training);
    const Tensor& xkv = cross_ ? c.in[1] : c.in[0];
    auto r = ops::flash_attention(c.be, c.in[0], xkv, lengths(c.in), p, c.rng);
    c.out = r.out;  // a re-run for the extras (extras_only) computes the output anyway
    c.extras = {r.lse};
  }
  void backward(BackwardContext& c) const override {
    if (!fused_) {
      AttentionParams p{heads_, causal_, dropout_};
      c.din = {ops::attention_backward(c.be, c.dout, c.in[0], c.extras[0], p, c.rng)};
      return;
    }
    const Tensor& xkv = cross_ ? c.in[1] : c.in[0];
    auto g = ops::flash_attention_backward(c.be, c.dout, c.in[0], xkv, lengths(c.in), c.out, c.extras[0], params(true),
                                           c.rng);
    c.din = {g.dxq};
    if (cross_) c.din.push_back(g.dxkv);
    if (lengths_) c.din.push_back(Tensor());
  }
  std::vector<int> backward_inputs() const override {
    std::vector<int> all(static_cast<size_t>(inputs_used()));
    for (int k = 0; k < inputs_used(); ++k) all[static_cast<size_t>(k)] = k;
    return fused_ ? all : std::vector<int>{0};
  }
  // Fused backward needs the output (delta = rowsum(dout * out)).
  bool backward_uses_output() const override { return fused_; }
  std::vector<std::string> extra_names() const override { return {fused_ ? "lse" : "probs"}; }

 private:
  int inputs_used() const { return 1 + (cross_ ? 1 : 0) + (lengths_ ? 1 : 0); }
  double scores() const {
    return static_cast<double>(b_ * heads_ * tq_) * static_cast<double>(tk_) * (causal_ ? 0.5 : 1.0);
  }
  double gemm_flops() const { return 2.0 * scores() * static_cast<double>(d_); }
  FlashAttentionParams params(bool training) const {
    const float drop = training ? dropout_ : 0.0f;
    return cross_ ? FlashAttentionParams::cross(heads_, kv_heads_, d_, drop)
                  : FlashAttentionParams::packed(heads_, kv_heads_, d_, causal_, drop);
  }
  Tensor lengths(const std::vector<Tensor>& in) const { return lengths_ ? in.back() : Tensor(); }
  // Incremental decoding: the position's q, k, v [B, 1, W]; k and v go to the cache's row
  // `position`, then q attends over rows 0 .. position (the rest masked by length), as the
  // causal attention's row `position` does over the whole sequence.
  void forward_cached(ForwardContext& c) const {
    Tensor& cache = *c.kv_cache;
    const Tensor& x = c.in[0];
    const int64_t b = x.size(0), w = x.size(2), q = heads_ * d_, kv = 2 * int64_t{kv_heads_} * d_, t = cache.size(1);
    REMAT_CHECK(x.size(1) == 1 && cache.rank() == 3 && cache.size(0) == b && cache.size(2) == kv && c.position >= 0 &&
                    c.position < t,
                "attention: a cached step takes one position [", b, ", 1, ", w, "] and a cache [", b, ", T, ", kv,
                "] with the position below T; got ", x.str(), ", ", cache.str(), ", position ", c.position);
    for (int64_t r = 0; r < b; ++r)
      cache.view_at((r * t + c.position) * kv, Shape{kv}).copy_from(x.view_at(r * w + q, Shape{kv}));
    const Tensor lens =
        Tensor::from_ints(std::vector<int32_t>(static_cast<size_t>(b), static_cast<int32_t>(c.position + 1)), Shape{b})
            .to(c.be.device());
    FlashAttentionParams p = FlashAttentionParams::cross(heads_, kv_heads_, d_, 0.0f);
    auto r = ops::flash_attention(c.be, x, cache, lens, p, c.rng);  // q: the first heads d columns of x
    c.out = r.out;
    c.extras = {r.lse};
  }
  void forward_materialized(ForwardContext& c) const {
    AttentionParams p{heads_, causal_, dropout_};
    if (c.extras_only) {  // the output is kept: rebuild the probabilities only
      c.extras = {ops::attention_probs(c.be, c.in[0], p)};
      return;
    }
    if (!c.training) p.dropout = 0.0f;
    auto r = ops::attention(c.be, c.in[0], p, c.rng);
    c.out = r.out;
    c.extras = {r.probs};
  }

  int heads_ = 1, kv_heads_ = 1;
  float dropout_ = 0.0f;
  bool causal_ = true, cross_ = false, lengths_ = false, fused_ = true;
  int64_t b_ = 0, tq_ = 0, tk_ = 0, d_ = 0;
};

}  // namespace

REMAT_REGISTER_LAYER("attention", Attention);

}  // namespace remat::layers
