// Incremental decoding with a key/value cache (include/remat/incremental.h).
#include "remat/incremental.h"

#include <algorithm>

#include "remat/error.h"
#include "remat/memory.h"

namespace remat {

namespace {

// Per layer: whether it reads `target` through other layers (the target's own input layer
// included).
std::vector<bool> reads_target(const Graph& g, int target) {
  std::vector<bool> dyn(static_cast<size_t>(g.size()), false);
  for (int i = 0; i < g.size(); ++i) {
    bool d = i == target;
    for (int j : g.layer(i).inputs) d = d || dyn[static_cast<size_t>(j)];
    dyn[static_cast<size_t>(i)] = d;
  }
  return dyn;
}

// Per layer: the logits depend on it.
std::vector<bool> logits_need(const Graph& g) {
  std::vector<bool> need(static_cast<size_t>(g.size()), false);
  need[static_cast<size_t>(g.logits_id)] = true;
  for (int i = g.logits_id; i >= 0; --i)
    if (need[static_cast<size_t>(i)])
      for (int j : g.layer(i).inputs) need[static_cast<size_t>(j)] = true;
  return need;
}

}  // namespace

std::string IncrementalDecoder::unsupported(const Graph& g, const std::string& target) {
  const int t = g.input(target);
  if (t < 0) return "the model has no input named \"" + target + "\"";
  const std::vector<bool> dyn = reads_target(g, t), need = logits_need(g);
  for (int i = 0; i < g.size(); ++i) {
    const Layer& l = g.layer(i);
    if (!need[static_cast<size_t>(i)] || !dyn[static_cast<size_t>(i)] || i == t) continue;
    const Layer::StepRun run = l.step_run();
    if (run == Layer::StepRun::no)
      return "layer \"" + l.name + "\" (" + layer_kind_name(l.kind()) + ") reads the target but cannot run on one " +
             "position at a time";
    if (l.kind() == LayerKind::attention) {  // cross-attention: queries from the target, keys from another sequence
      for (size_t k = 0; k < l.inputs.size(); ++k)
        if (dyn[static_cast<size_t>(l.inputs[k])] != (k == 0))
          return "layer \"" + l.name + "\" (cross-attention) reads " +
                 (k == 0 ? "queries that do not come from the target"
                         : "keys, values or key lengths computed from the target (\"" + g.layer(l.inputs[k]).name +
                               "\"): one position would see itself alone");
      continue;
    }
    for (int j : l.inputs)
      if (!dyn[static_cast<size_t>(j)])
        return "layer \"" + l.name + "\" reads the target and \"" + g.layer(j).name +
               "\", which does not: one position of the one against all of the other";
  }
  return "";
}

IncrementalDecoder::IncrementalDecoder(const Graph& g, ParamStore& params, Backend& be, const std::string& target)
    : g_(g), params_(params), be_(be), target_(g.input(target)) {
  const std::string why = unsupported(g, target);
  REMAT_CHECK(why.empty(), "incremental decoding: ", why);
  needed_ = logits_need(g);
  dynamic_ = reads_target(g, target_);
  static_.resize(static_cast<size_t>(g.size()));
  caches_.resize(static_cast<size_t>(g.size()));
  last_read_.assign(static_cast<size_t>(g.size()), -1);
  for (int i = 0; i < g.size(); ++i)
    if (needed_[static_cast<size_t>(i)] && dynamic_[static_cast<size_t>(i)])
      for (int j : g.layer(i).inputs) last_read_[static_cast<size_t>(j)] = i;
}

void IncrementalDecoder::start(const Batch& inputs) {
  ActivationDTypeScope precision(params_.precision());
  params_.refresh_working(be_);
  std::vector<Tensor> out(static_cast<size_t>(g_.size()));
  for (int i = 0; i < g_.size(); ++i) {
    const auto k = static_cast<size_t>(i);
    caches_[k] = Tensor();
    static_[k] = Tensor();
    const Layer& l = g_.layer(i);
    if (!needed_[k] || dynamic_[k]) continue;
    if (l.kind() == LayerKind::input) {
      const Tensor& t = inputs.at(l.name);
      REMAT_CHECK(t.shape() == l.out_shape && t.dtype() == l.out_dtype, "incremental decoding: input \"", l.name, "\" ",
                  t.str(), " does not match the model's ", l.out_shape.str(), " ", dtype_name(l.out_dtype));
      out[k] = t;
      continue;
    }
    TagScope scope(MemoryCategory::activation, l.name, Phase::forward);
    ForwardContext c(be_);
    c.training = false;
    for (int j : l.inputs) c.in.push_back(out[static_cast<size_t>(j)]);
    for (int p : g_.layer_params[k]) c.params.push_back(params_.compute_value(static_cast<size_t>(p)));
    l.forward(c);
    out[k] = c.out;
  }
  // Keep what the steps read; the rest goes.
  for (int i = 0; i < g_.size(); ++i)
    if (last_read_[static_cast<size_t>(i)] >= 0 && !dynamic_[static_cast<size_t>(i)])
      static_[static_cast<size_t>(i)] = out[static_cast<size_t>(i)];
  // The caches: [B, T, 2 kv_heads d] per cached attention, T the target's length; the
  // width is the layer's input less its queries (q, k, v packed: heads + 2 kv_heads).
  const int64_t b = g_.batch, t = g_.layer(target_).out_shape[1];
  for (int i = 0; i < g_.size(); ++i) {
    const Layer& l = g_.layer(i);
    if (!needed_[static_cast<size_t>(i)] || !dynamic_[static_cast<size_t>(i)] || l.step_run() != Layer::StepRun::cached)
      continue;
    const int64_t q = l.out_shape[2], w = g_.layer(l.inputs[0]).out_shape[2];
    TagScope scope(MemoryCategory::activation, l.name + " kv cache", Phase::forward);
    caches_[static_cast<size_t>(i)] = Tensor::zeros(Shape{b, t, w - q}, be_.device(), activation_dtype());
  }
  next_position_ = 0;
}

Tensor IncrementalDecoder::step(const Tensor& tokens, int64_t position) {
  REMAT_CHECK(position == next_position_, "incremental decoding: position ", position, " after ", next_position_,
              " steps (start() a batch, then positions 0, 1, 2, ...)");
  const Layer& tl = g_.layer(target_);
  REMAT_CHECK(position < tl.out_shape[1], "incremental decoding: position ", position, " is past the target's ",
              tl.out_shape[1]);
  REMAT_CHECK(tokens.shape() == Shape({g_.batch, 1}) && tokens.dtype() == DType::i32, "incremental decoding: tokens ",
              tokens.str(), " must be i32 [", g_.batch, ", 1]");
  ActivationDTypeScope precision(params_.precision());
  std::vector<Tensor> out(static_cast<size_t>(g_.size()));
  out[static_cast<size_t>(target_)] = tokens;
  for (int i = 0; i < g_.size(); ++i) {
    const auto k = static_cast<size_t>(i);
    const Layer& l = g_.layer(i);
    if (!needed_[k] || !dynamic_[k] || i == target_) continue;
    TagScope scope(MemoryCategory::activation, l.name, Phase::forward);
    ForwardContext c(be_);
    c.training = false;
    c.position = position;
    if (l.step_run() == Layer::StepRun::cached) c.kv_cache = &caches_[k];
    for (int j : l.inputs)
      c.in.push_back(dynamic_[static_cast<size_t>(j)] ? out[static_cast<size_t>(j)] : static_[static_cast<size_t>(j)]);
    for (int p : g_.layer_params[k]) c.params.push_back(params_.compute_value(static_cast<size_t>(p)));
    l.forward(c);
    out[k] = c.out;
    for (int j : l.inputs)  // this step's products go after their last reader
      if (dynamic_[static_cast<size_t>(j)] && last_read_[static_cast<size_t>(j)] == i && j != g_.logits_id)
        out[static_cast<size_t>(j)] = Tensor();
  }
  ++next_position_;
  return out[static_cast<size_t>(g_.logits_id)];
}

void IncrementalDecoder::reorder(const std::vector<int64_t>& from) {
  const int64_t b = g_.batch;
  REMAT_CHECK(static_cast<int64_t>(from.size()) == b, "incremental decoding: reorder takes ", b, " rows, got ",
              from.size());
  for (int64_t r : from) REMAT_CHECK(r >= 0 && r < b, "incremental decoding: reorder from row ", r, " of ", b);
  for (Tensor& cache : caches_) {
    if (!cache.defined()) continue;
    const int64_t row = cache.numel() / b;
    Tensor old = Tensor::empty(cache.shape(), cache.device(), cache.dtype());
    old.copy_from(cache);
    for (int64_t r = 0; r < b; ++r)
      if (from[static_cast<size_t>(r)] != r)
        cache.view_at(r * row, Shape{row}).copy_from(old.view_at(from[static_cast<size_t>(r)] * row, Shape{row}));
  }
}

}  // namespace remat
