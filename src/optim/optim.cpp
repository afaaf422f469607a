#include <algorithm>
#include <cmath>

#include "remat/error.h"
#include "remat/optim.h"

namespace remat {

FlatLayout::FlatLayout(const ParamStore& params, int n) : ranks(n) {
  REMAT_CHECK(n >= 1, "FlatLayout: ", n, " ranks");
  offset.assign(params.values.size(), -1);
  numel.assign(params.values.size(), 0);
  int64_t at = 0;
  for (size_t p = 0; p < params.grads.size(); ++p) {
    if (!params.grads[p].defined()) continue;
    at = (at + kAlign - 1) / kAlign * kAlign;
    offset[p] = at;
    numel[p] = params.grads[p].numel();
    at += numel[p];
    elements += params.grads[p].numel();
  }
  shard = ((at + n - 1) / n + kAlign - 1) / kAlign * kAlign;
  size = shard * n;
}

std::vector<FlatLayout::Piece> FlatLayout::pieces(int rank) const {
  const int64_t lo = shard * rank, hi = lo + shard;
  std::vector<Piece> out;
  for (size_t p = 0; p < offset.size(); ++p) {
    if (offset[p] < 0) continue;
    const int64_t b = std::max(lo, offset[p]), e = std::min(hi, offset[p] + numel[p]);
    if (b < e) out.push_back({p, b - offset[p], e - offset[p]});
  }
  return out;
}

namespace {

int state_kinds(const OptimizerConfig& cfg) { return cfg.type == "adamw" ? 2 : cfg.momentum != 0.0 ? 1 : 0; }

const char* state_name(const OptimizerConfig& cfg, int k) {
  static const char* adam[] = {"exp_avg", "exp_avg_sq"};
  return cfg.type == "adamw" ? adam[k] : "momentum_buffer";
}

}  // namespace

Optimizer::Optimizer(const OptimizerConfig& cfg, ParamStore& params, Backend& be)
    : cfg_(cfg), params_(params), be_(be) {
  allocate_state();
}

Optimizer::Optimizer(const OptimizerConfig& cfg, ParamStore& params, Backend& be, int rank, int ranks)
    : cfg_(cfg), params_(params), be_(be), rank_(rank), ranks_(ranks) {
  REMAT_CHECK(ranks >= 0 && rank >= 0 && (ranks == 0 || rank < ranks), "sharded optimizer: rank ", rank, " of ", ranks);
  if (ranks > 0) layout_ = std::make_unique<FlatLayout>(params, ranks);
  allocate_state();
}

int64_t Optimizer::state_bytes() const {
  int64_t b = 0;
  for (const Tensor& t : shard_state_) b += static_cast<int64_t>(t.nbytes());
  for (const auto& st : params_.state)
    for (const Tensor& t : st) b += static_cast<int64_t>(t.nbytes());
  return b;
}

void Optimizer::allocate_state() {
  const Graph& g = params_.graph();
  if (sharded()) {
    TagScope scope(MemoryCategory::optimizer_state, "shard", Phase::setup);
    for (int k = 0; k < state_kinds(cfg_); ++k)
      shard_state_.push_back(Tensor::zeros(Shape{layout_->shard}, params_.device()));
    return;
  }
  for (size_t p = 0; p < params_.values.size(); ++p) {
    if (!params_.grads[p].defined()) continue;
    TagScope scope(MemoryCategory::optimizer_state, g.params[p].name, Phase::setup);
    auto& st = params_.state[p];
    st.clear();
    for (int k = 0; k < state_kinds(cfg_); ++k)
      st.push_back(Tensor::zeros(params_.values[p].shape(), params_.device()));
  }
}

void Optimizer::step(double lr) {
  ++step_;
  const Graph& g = params_.graph();
  if (cfg_.grad_clip > 0.0) {
    std::vector<Tensor> grads;
    for (const Tensor& t : params_.grads)
      if (t.defined()) grads.push_back(t);
    // torch.nn.utils.clip_grad_norm_, on the device: no value comes back to the host.
    be_.clip_grad_norm(grads, cfg_.grad_clip);
  }
  TagScope scope(MemoryCategory::temporary, "optimizer", Phase::optimizer);
  if (sharded()) {
    step_sharded(lr);
    return;
  }
  if (cfg_.type == "adamw") {  // every tensor in one call: a few multi-tensor launches on the GPU
    std::vector<Tensor> w, gr, m, v;
    std::vector<AdamWParams> ps;
    for (size_t p = 0; p < params_.values.size(); ++p) {
      if (!params_.grads[p].defined()) continue;
      w.push_back(params_.values[p]);
      gr.push_back(params_.grads[p]);
      m.push_back(params_.state[p][0]);
      v.push_back(params_.state[p][1]);
      const bool decay = g.params[p].spec.weight_decay;
      ps.push_back({lr, cfg_.beta1, cfg_.beta2, cfg_.eps, decay ? cfg_.weight_decay : 0.0});
    }
    be_.adamw_step_multi(w, gr, m, v, ps, step_);
    return;
  }
  // SGD: every tensor in one call too (momentum buffers undefined without momentum)
  std::vector<Tensor> w, gr, bufs;
  std::vector<SgdParams> ps;
  for (size_t p = 0; p < params_.values.size(); ++p) {
    if (!params_.grads[p].defined()) continue;
    const bool decay = g.params[p].spec.weight_decay;
    w.push_back(params_.values[p]);
    gr.push_back(params_.grads[p]);
    bufs.push_back(params_.state[p].empty() ? Tensor() : params_.state[p][0]);
    ps.push_back({lr, cfg_.momentum, cfg_.dampening, decay ? cfg_.weight_decay : 0.0, cfg_.nesterov});
  }
  be_.sgd_step_multi(w, gr, bufs, ps, step_);
}

// The same calls as the unsharded update, on views of this rank's pieces: each element
// meets the same float operations, so the bits are those of the unsharded update.
void Optimizer::step_sharded(double lr) {
  const Graph& g = params_.graph();
  const int64_t lo = layout_->shard * rank_;
  auto view = [](const Tensor& t, int64_t at, int64_t n) { return t.view_at(at, Shape{n}); };
  std::vector<Tensor> w, gr, m, v;  // m: AdamW's exp_avg or SGD's momentum buffer
  std::vector<AdamWParams> ps;
  std::vector<SgdParams> sps;
  for (const FlatLayout::Piece& pc : layout_->pieces(rank_)) {
    const int64_t n = pc.end - pc.begin, at = layout_->offset[pc.param] + pc.begin - lo;
    const bool decay = g.params[pc.param].spec.weight_decay;
    const Tensor wv = view(params_.values[pc.param], pc.begin, n), gv = view(params_.grads[pc.param], pc.begin, n);
    if (cfg_.type == "adamw") {
      w.push_back(wv);
      gr.push_back(gv);
      m.push_back(view(shard_state_[0], at, n));
      v.push_back(view(shard_state_[1], at, n));
      ps.push_back({lr, cfg_.beta1, cfg_.beta2, cfg_.eps, decay ? cfg_.weight_decay : 0.0});
    } else {
      w.push_back(wv);
      gr.push_back(gv);
      m.push_back(shard_state_.empty() ? Tensor() : view(shard_state_[0], at, n));
      sps.push_back({lr, cfg_.momentum, cfg_.dampening, decay ? cfg_.weight_decay : 0.0, cfg_.nesterov});
    }
  }
  if (w.empty()) return;
  if (cfg_.type == "adamw")
    be_.adamw_step_multi(w, gr, m, v, ps, step_);
  else
    be_.sgd_step_multi(w, gr, m, sps, step_);
}

std::vector<std::pair<std::string, Tensor>> Optimizer::checkpoint_state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  const Graph& g = params_.graph();
  for (size_t p = 0; p < params_.values.size(); ++p) {
    if (!params_.grads[p].defined()) continue;
    for (int k = 0; k < state_kinds(cfg_); ++k) {
      const std::string name = g.params[p].name + "." + state_name(cfg_, k);
      if (sharded())
        out.emplace_back(name, Tensor::zeros(params_.values[p].shape(), Device::cpu()));
      else
        out.emplace_back(name, params_.state[p][static_cast<size_t>(k)]);
    }
  }
  return out;
}

void Optimizer::gather_state(const std::vector<std::pair<std::string, Tensor>>& whole,
                             const AllGather& allgather) const {
  REMAT_CHECK(sharded(), "gather_state: the optimizer is not sharded");
  const int kinds = state_kinds(cfg_);
  std::vector<float> all(static_cast<size_t>(layout_->size));
  for (int k = 0; k < kinds; ++k) {
    const std::vector<float> mine = shard_state_[static_cast<size_t>(k)].to_vector();
    allgather(mine.data(), all.data(), layout_->shard);
    size_t i = static_cast<size_t>(k);  // whole: each parameter's kinds in turn
    for (size_t p = 0; p < params_.values.size(); ++p) {
      if (layout_->offset[p] < 0) continue;
      const Tensor& t = whole[i].second;
      std::copy_n(all.data() + layout_->offset[p], t.numel(), t.f32());
      i += static_cast<size_t>(kinds);
    }
  }
}

void Optimizer::scatter_state(const std::vector<std::pair<std::string, Tensor>>& whole) {
  REMAT_CHECK(sharded(), "scatter_state: the optimizer is not sharded");
  const int kinds = state_kinds(cfg_);
  const int64_t lo = layout_->shard * rank_;
  // Where each parameter's state tensors are in `whole`.
  std::vector<size_t> first(params_.values.size(), 0);
  for (size_t p = 0, i = 0; p < params_.values.size(); ++p)
    if (layout_->offset[p] >= 0) {
      first[p] = i;
      i += static_cast<size_t>(kinds);
    }
  for (int k = 0; k < kinds; ++k) {
    std::vector<float> mine(static_cast<size_t>(layout_->shard), 0.0f);
    for (const FlatLayout::Piece& pc : layout_->pieces(rank_)) {
      const float* src = whole[first[pc.param] + static_cast<size_t>(k)].second.f32();
      std::copy(src + pc.begin, src + pc.end, mine.data() + layout_->offset[pc.param] + pc.begin - lo);
    }
    shard_state_[static_cast<size_t>(k)].copy_from(Tensor::from_vector(mine, Shape{layout_->shard}));
  }
}

}  // namespace remat
