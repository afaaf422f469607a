#include <algorithm>
#include <cmath>
#include <cstdio>

#include "remat/error.h"
#include "remat/executor.h"
#include "remat/hash.h"
#include "remat/log.h"
#include "remat/ops.h"

namespace remat {

uint64_t tensor_hash(const Tensor& t) {
  if (!t.defined() || t.device().is_meta()) return 0;
  const Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
  return fnv1a64(h.raw_data(), h.nbytes());
}

Executor::Executor(const Graph& g, ParamStore& params, Backend& be, CheckpointPlan plan, ExecOptions opt)
    : g_(g), params_(params), be_(be), plan_(std::move(plan)), opt_(opt) {
  REMAT_CHECK(params.device() == be.device(), "executor: parameters on ", params.device().str(), " but backend ",
              be.name(), " runs on ", be.device().str());
  REMAT_CHECK(static_cast<int>(plan_.keep.size()) == g.size() && plan_.keep_extras.size() == plan_.keep.size(),
              "executor: plan does not match the graph");
  const int n = g.size();
  life_ = PerLayer<Lifetime>(n);
  for (int i = 0; i < n; ++i) {
    Lifetime& li = life_[i];
    const auto k = static_cast<size_t>(i);
    li.bwd_last = n;
    li.keep = plan_.keep[k];
    li.keep_extras = plan_.keep_extras[k];
    li.rerun = plan_.rerun[k];
    li.kept_by = plan_.kept_by.empty() ? -1 : plan_.kept_by[k];
    li.segment = plan_.segment_of[k];
  }
  for (int i = 0; i < n; ++i) {
    const Layer& l = g.layer(i);
    for (int j : l.inputs) life_[j].fwd_last = std::max(life_[j].fwd_last, i);
    for (int p : l.backward_inputs()) {
      Lifetime& in = life_[l.inputs[static_cast<size_t>(p)]];
      in.read_by_backward = true;
      in.bwd_last = std::min(in.bwd_last, i);
    }
    if (l.backward_uses_output()) {
      life_[i].read_by_backward = true;
      life_[i].bwd_last = std::min(life_[i].bwd_last, i);
    }
  }
  // A kept output read by a recomputed layer is that segment's checkpoint: it must live
  // until the segment is recomputed, which happens just before the backward of the
  // segment's last layer.
  for (int i = 0; i < n; ++i) {
    if (!life_[i].rerun) continue;
    const int seg_last = plan_.segments[static_cast<size_t>(life_[i].segment)].end - 1;
    for (int j : g.layer(i).inputs) {
      if (!life_[j].keep) continue;
      life_[j].read_by_recompute = true;
      life_[j].bwd_last = std::min(life_[j].bwd_last, seg_last);
    }
  }
  // A nest's advance runs when backward reaches the nest's last layer; what it reads from
  // outside the advance (kept by forward or an enclosing advance) lives until then.
  advance_last_.assign(plan_.nests.size(), {});
  for (size_t k = 0; k < plan_.nests.size(); ++k) {
    const Nest& m = plan_.nests[k];
    std::vector<int>& last = advance_last_[k];
    last.assign(m.advance.size(), -1);
    for (int i : m.advance)
      for (int j : g.layer(i).inputs) {
        const auto it = std::lower_bound(m.advance.begin(), m.advance.end(), j);
        if (it != m.advance.end() && *it == j) {
          last[static_cast<size_t>(it - m.advance.begin())] = i;
        } else {
          REMAT_CHECK(life_[j].keep, "executor: nest advance of \"", g.layer(i).name, "\" reads \"", g.layer(j).name,
                      "\", which is not kept (plan bug)");
          life_[j].read_by_recompute = true;
          life_[j].bwd_last = std::min(life_[j].bwd_last, m.end - 1);
        }
      }
  }
  for (int j = 0; j < n; ++j) {
    if (g.layer(j).kind() == LayerKind::input || j == g.loss_id) continue;
    if (life_[j].bwd_last < n) life_[life_[j].bwd_last].free_after.push_back(j);
  }
  // A trainable parameter's gradient is final after the backward of the first layer that
  // uses it (backward runs in reverse graph order).
  grads_final_ = PerLayer<std::vector<int>>(n);
  std::vector<int> first_use(g.params.size(), n);
  for (int i = 0; i < n; ++i)
    for (int p : g.layer_params[static_cast<size_t>(i)])
      first_use[static_cast<size_t>(p)] = std::min(first_use[static_cast<size_t>(p)], i);
  for (size_t p = 0; p < first_use.size(); ++p)
    if (first_use[p] < n && p < params.grads.size() && params.grads[p].defined())
      grads_final_[first_use[p]].push_back(static_cast<int>(p));
  // Within a recompute pass, the last recomputed consumer of each recomputed output.
  for (int i = 0; i < n; ++i) {
    if (!life_[i].rerun) continue;
    for (int j : g.layer(i).inputs)
      if (life_[j].segment == life_[i].segment) life_[j].rec_last = std::max(life_[j].rec_last, i);
  }
  if (plan_.offloads()) plan_offload();
}

// Offload: when each offloaded product's device copy goes (after the forward of its last
// forward reader, and not before that of the next layer, so that its copy-out overlaps at
// least one layer's compute), and when backward brings it back; the host pool, sized by
// the outputs.
void Executor::plan_offload() {
  const std::string why = be_.offload_unsupported();
  REMAT_CHECK(why.empty(), "policy \"", plan_.policy, "\" offloads activations to host memory, which ", be_.name(),
              " cannot do: ", why, " (offload needs a GPU: --device cuda, or cuda-emu to try it)");
  const int n = g_.size();
  REMAT_CHECK(static_cast<int>(plan_.offload.size()) == n && static_cast<int>(plan_.prefetch_at.size()) == n &&
                  static_cast<int>(plan_.need_at.size()) == n,
              "executor: offload flags do not match the graph");
  offload_done_ = PerLayer<std::vector<int>>(n + 1);  // [n]: when forward ends
  prefetch_ = PerLayer<std::vector<int>>(n);
  prefetch_done_ = PerLayer<std::vector<int>>(n);
  size_t estimate = 0;
  for (int j = 0; j < n; ++j) {
    if (!plan_.offload[static_cast<size_t>(j)]) continue;
    const int need = plan_.need_at[static_cast<size_t>(j)], at = plan_.prefetch_at[static_cast<size_t>(j)];
    REMAT_CHECK(life_[j].keep && life_[j].kept_by < 0 && need >= j && at >= need && at < n, "executor: offload of \"",
                g_.layer(j).name, "\" is not planned consistently (plan bug)");
    offload_done_[std::min(n, std::max(life_[j].fwd_last, j + 1) + 1)].push_back(j);
    prefetch_[at].push_back(j);
    prefetch_done_[need].push_back(j);
    const Layer& l = g_.layer(j);
    estimate += CachingAllocator::round_size(static_cast<size_t>(l.out_shape.numel()) * dtype_size(l.out_dtype));
  }
  // Extras and rounding: a quarter more; the pool takes another chunk if that is short.
  host_pool_ = std::make_unique<CachingAllocator>(be_.device().is_meta() ? Device::meta() : Device::cpu(),
                                                  be_.make_pinned_allocator(estimate + estimate / 4 + (1 << 20)));
}

// The products a layer keeps go to the host pool, on the copy stream, from the end of its
// forward; the device copies stay until finish_offload.
void Executor::start_offload(int j) {
  Live& L = live_[j];
  const AllocTag tag{MemoryCategory::activation, g_.layer(j).name, Phase::forward};
  auto copy_out = [&](const Tensor& t) {
    if (opt_.verify_recompute) L.hashes.push_back(tensor_hash(t));
    Tensor h = Tensor::empty_in(*host_pool_, t.shape(), t.dtype(), tag);
    L.copies.push_back(be_.copy_async(h, t));
    return h;
  };
  L.host_out = copy_out(L.out);
  for (const Tensor& e : L.extras) L.host_extras.push_back(copy_out(e));
}

// Compute waits for the copies (it may reuse their source blocks from here on); the
// device products go.
void Executor::finish_offload(int j) {
  Live& L = live_[j];
  for (uint64_t t : L.copies) be_.wait_copy(t);
  L.copies.clear();
  L.out = Tensor();
  L.extras.clear();
}

// Backward brings the products back into fresh device blocks; the host copies return to
// the pool at once (only the copy stream, in order, touches the pool's memory).
void Executor::start_prefetch(int j) {
  Live& L = live_[j];
  TagScope scope(MemoryCategory::activation, g_.layer(j).name, Phase::backward);
  auto copy_in = [&](Tensor& h) {
    Tensor d = Tensor::empty(h.shape(), be_.device(), h.dtype());
    L.copies.push_back(be_.copy_async(d, h));
    h = Tensor();
    return d;
  };
  L.out = copy_in(L.host_out);
  for (Tensor& h : L.host_extras) L.extras.push_back(copy_in(h));
  L.host_extras.clear();
}

// Before the first backward step that reads them: compute waits for the copies back.
void Executor::finish_prefetch(int j) {
  Live& L = live_[j];
  for (uint64_t t : L.copies) be_.wait_copy(t);
  L.copies.clear();
  if (!opt_.verify_recompute) return;
  std::vector<const Tensor*> products{&L.out};
  for (const Tensor& e : L.extras) products.push_back(&e);
  for (size_t k = 0; k < products.size() && k < L.hashes.size(); ++k)
    REMAT_CHECK(tensor_hash(*products[k]) == L.hashes[k], "verify-recompute: layer \"", g_.layer(j).name,
                "\": ", k == 0 ? std::string("its output") : "extra " + std::to_string(k - 1),
                " differs after its round trip through host memory (offload)");
  L.hashes.clear();
}

void Executor::forward_layer(int i, bool training, bool recompute, Phase phase, bool extras_only) {
  const Layer& l = g_.layer(i);
  TagScope scope(MemoryCategory::activation, l.name, phase);
  ForwardContext c(be_);
  c.training = training;
  c.recompute = recompute;
  c.rng = live_[i].rng;
  c.extras_only = extras_only;
  for (int j : l.inputs) {
    REMAT_CHECK(live_[j].out.defined(), "executor: input \"", g_.layer(j).name, "\" of layer \"", l.name,
                "\" is not live (plan bug)");
    c.in.push_back(live_[j].out);
  }
  for (int p : g_.layer_params[static_cast<size_t>(i)])
    c.params.push_back(params_.compute_value(static_cast<size_t>(p)));
  if (opt_.on_layer) opt_.on_layer(i, phase, true);
  l.forward(c);
  if (opt_.on_layer) opt_.on_layer(i, phase, false);
  if (!extras_only) live_[i].out = c.out;  // else the kept output stays
  live_[i].extras = c.extras;
}

void Executor::drop_output(int j, bool record_hash) {
  Tensor& t = live_[j].out;
  if (record_hash && opt_.verify_recompute) hashes_[{j, -1}] = tensor_hash(t);
  t = Tensor();
}

// ---- one training step: forward, then backward with recompute ----------------------------------

StepStats Executor::train_step(const Batch& batch, RngGenerator& gen) {
  ActivationDTypeScope precision(params_.precision());  // bf16 activations under training.precision bf16
  StepStats st;
  begin_step(batch);
  gen.clear_reservations();  // keep only this step's record
  forward_pass(gen, st);
  const Tensor& loss = live_[g_.loss_id].out;
  if (loss.device().is_meta())
    st.loss = 0.0f;
  else if (opt_.read_loss)
    st.loss = loss.to_vector()[0];
  else
    st.loss = NAN, st.loss_value = loss;
  backward_pass(st);
  end_step();
  return st;
}

void Executor::begin_step(const Batch& batch) {
  params_.refresh_working(be_);
  live_ = PerLayer<Live>(g_.size());
  recomputed_.assign(plan_.segments.size(), false);
  advanced_.assign(plan_.nests.size(), false);
  hashes_.clear();
  bind_inputs(batch);
}

// Each model input takes the batch's tensor of its name, of exactly its shape and dtype.
void Executor::bind_inputs(const Batch& batch) {
  for (int id : g_.input_ids) {
    const Layer& in = g_.layer(id);
    REMAT_CHECK(batch.has(in.name), "the batch has no tensor for the model input \"", in.name, "\" ",
                in.out_shape.str(), " ", dtype_name(in.out_dtype));
    const Tensor& t = batch.at(in.name);
    REMAT_CHECK(t.shape() == in.out_shape && t.dtype() == in.out_dtype, "batch tensor \"", in.name, "\" ", t.str(),
                " does not match the model input ", in.out_shape.str(), " ", dtype_name(in.out_dtype));
    live_[id].out = t;
  }
  for (const auto& item : batch.items())
    REMAT_CHECK(g_.input(item.first) >= 0, "batch tensor \"", item.first, "\" is no input of the model");
}

void Executor::end_step() {
  for (int i = 0; i < g_.size(); ++i) live_[i].out = Tensor();
  for (int i = 0; i < g_.size(); ++i) live_[i].extras.clear();
}

void Executor::forward_pass(RngGenerator& gen, StepStats& st) {
  for (int i = 0; i < g_.size(); ++i) {
    const Layer& l = g_.layer(i);
    if (host_pool_)
      for (int j : offload_done_[i]) finish_offload(j);  // after the forward of layer i - 1
    if (l.kind() == LayerKind::input) continue;
    if (const uint64_t words = l.rng_words()) live_[i].rng = gen.reserve(words, l.name);
    forward_layer(i, /*training=*/true, /*recompute=*/false, Phase::forward);
    st.forward_flops += l.forward_flops();
    if (!life_[i].keep_extras || life_[i].kept_by >= 0) {  // read only by this layer's backward, after recompute
      std::vector<Tensor>& extras = live_[i].extras;
      if (opt_.verify_recompute)
        for (size_t k = 0; k < extras.size(); ++k) hashes_[{i, static_cast<int>(k)}] = tensor_hash(extras[k]);
      extras.clear();
    }
    if (host_pool_ && plan_.offload[static_cast<size_t>(i)]) start_offload(i);
    for (int j : l.inputs)
      if (life_[j].fwd_last == i) release_after_forward(j);
    if (life_[i].fwd_last < 0) release_after_forward(i);
  }
  if (host_pool_)
    for (int j : offload_done_[g_.size()]) finish_offload(j);
}

// An output whose forward life ended: kept only if backward (or a recompute) reads it and
// the plan keeps it; freed otherwise (recompute rebuilds what backward needs).
void Executor::release_after_forward(int j) {
  if (g_.layer(j).kind() == LayerKind::input || j == g_.loss_id) return;
  const Lifetime& lj = life_[j];
  if (lj.keep && lj.kept_by < 0 && (lj.read_by_backward || lj.read_by_recompute)) return;
  drop_output(j, lj.read_by_backward || lj.kept_by >= 0);
}

void Executor::backward_pass(StepStats& st) {
  for (int i = g_.size() - 1; i >= 0; --i) {
    const Layer& l = g_.layer(i);
    if (host_pool_) {
      for (int j : prefetch_[i]) start_prefetch(j);
      for (int j : prefetch_done_[i]) finish_prefetch(j);
    }
    if (l.kind() == LayerKind::input) continue;
    rebuild_for(i, st);
    if (i == g_.loss_id || live_[i].dout.defined()) backward_layer(i, st);
    live_[i].extras.clear();
    // Free every output whose last reader (backward or recompute) was this step.
    for (int j : life_[i].free_after) live_[j].out = Tensor();
    if (i == g_.loss_id) live_[i].out = Tensor();
    if (opt_.on_grads_final && !grads_final_[i].empty()) opt_.on_grads_final(grads_final_[i]);
  }
}

void Executor::set_on_grads_final(std::function<void(const std::vector<int>& params)> hook) {
  opt_.on_grads_final = std::move(hook);
}

void Executor::backward_layer(int i, StepStats& st) {
  const Layer& l = g_.layer(i);
  TagScope scope(MemoryCategory::temporary, l.name, Phase::backward);
  BackwardContext c(be_);
  c.rng = live_[i].rng;
  c.extras = live_[i].extras;
  // The context takes the only reference to the output gradient, so a layer may write its
  // input gradient into it when nothing else shares it (reuse_dout).
  c.dout = std::move(live_[i].dout);
  live_[i].dout = Tensor();
  c.in.resize(l.inputs.size());
  for (int p : l.backward_inputs()) {
    const int j = l.inputs[static_cast<size_t>(p)];
    REMAT_CHECK(live_[j].out.defined(), "executor: \"", g_.layer(j).name, "\" is not live for the backward of \"",
                l.name, "\" (plan bug)");
    c.in[static_cast<size_t>(p)] = live_[j].out;
  }
  if (l.backward_uses_output()) c.out = live_[i].out;
  for (int p : g_.layer_params[static_cast<size_t>(i)]) {
    c.params.push_back(params_.compute_value(static_cast<size_t>(p)));
    c.grads.push_back(params_.grads[static_cast<size_t>(p)]);
  }
  for (size_t k = 0; k < l.inputs.size(); ++k)
    c.need_din.push_back(l.input_differentiable(static_cast<int>(k)) &&
                         g_.layer(l.inputs[k]).kind() != LayerKind::input);
  if (opt_.on_layer) opt_.on_layer(i, Phase::backward, true);
  l.backward(c);
  st.backward_flops += l.backward_flops();
  accumulate_input_grads(l, c.din, c.need_din);
  if (opt_.on_layer) opt_.on_layer(i, Phase::backward, false);
}

// Adds each input gradient into the gradient of the output it flows to.
void Executor::accumulate_input_grads(const Layer& l, std::vector<Tensor>& din, const std::vector<bool>& need) {
  for (size_t k = 0; k < l.inputs.size(); ++k) {
    if (!need[k] || k >= din.size() || !din[k].defined()) continue;
    Tensor& dst = live_[l.inputs[k]].dout;
    Tensor& d = din[k];
    if (!dst.defined()) {
      dst = d;
    } else if (dst.storage_use_count() == 1) {
      be_.accumulate(dst, d);  // no other tensor shares it: add in place
    } else {
      dst = ops::add(be_, dst, d);  // an alias (e.g. of dout through add): fresh sum
    }
    d = Tensor();
  }
}

// Before the backward of layer i: the advances of the nests that hold it, outermost
// first, then the recompute of its segment, each once a step.
void Executor::rebuild_for(int i, StepStats& st) {
  const int s = life_[i].segment;
  if (!plan_.nests.empty()) {
    // The nests not yet advanced hold this one's parent chain up to the first advanced one.
    nest_path_.clear();
    for (int k = plan_.nest_of[static_cast<size_t>(s)]; k >= 0 && !advanced_[static_cast<size_t>(k)];
         k = plan_.nests[static_cast<size_t>(k)].parent)
      nest_path_.push_back(k);
    for (auto it = nest_path_.rbegin(); it != nest_path_.rend(); ++it) advance_nest(*it, st);
  }
  if (plan_.segments[static_cast<size_t>(s)].recompute && !recomputed_[static_cast<size_t>(s)])
    recompute_segment(s, st);
}

// A nest's advance: forward over its children but the last, keeping only the
// checkpoints the plan gives it (their extras too where the plan keeps them); every other
// product is freed after its last reader in the advance.
void Executor::advance_nest(int k, StepStats& st) {
  const Nest& m = plan_.nests[static_cast<size_t>(k)];
  advanced_[static_cast<size_t>(k)] = true;
  const std::vector<int>& last = advance_last_[static_cast<size_t>(k)];
  for (size_t a = 0; a < m.advance.size(); ++a) {
    const int i = m.advance[a];
    const Layer& l = g_.layer(i);
    forward_layer(i, /*training=*/true, /*recompute=*/true, Phase::recompute);
    st.recomputed_layers++;
    st.recompute_flops += l.forward_flops();
    if (opt_.verify_recompute) verify_recomputed(i, false);
    const bool kept_here = life_[i].kept_by == k && life_[i].keep;
    if (!(kept_here && life_[i].keep_extras)) live_[i].extras.clear();
    for (int j : l.inputs) {
      const auto it = std::lower_bound(m.advance.begin(), m.advance.end(), j);
      if (it == m.advance.end() || *it != j) continue;
      if (last[static_cast<size_t>(it - m.advance.begin())] == i && life_[j].kept_by != k) live_[j].out = Tensor();
    }
    if (!kept_here && last[a] < 0) live_[i].out = Tensor();
  }
}

void Executor::recompute_segment(int s, StepStats& st) {
  const Segment& seg = plan_.segments[static_cast<size_t>(s)];
  recomputed_[static_cast<size_t>(s)] = true;
  for (int i = seg.begin; i < seg.end; ++i) {
    if (!life_[i].rerun) continue;
    const Layer& l = g_.layer(i);
    // A layer whose output is kept is re-run for its extras only.
    const bool extras_only = life_[i].keep;
    forward_layer(i, /*training=*/true, /*recompute=*/true, Phase::recompute, extras_only);
    st.recomputed_layers++;
    st.recompute_flops += extras_only ? l.extras_flops() : l.forward_flops();
    if (opt_.verify_recompute) verify_recomputed(i, extras_only);
    // Recomputed outputs that backward does not read are dropped after their last
    // recomputed consumer.
    for (int j : l.inputs)
      if (life_[j].rec_last == i && !life_[j].keep && !life_[j].read_by_backward) live_[j].out = Tensor();
    if (!extras_only && life_[i].rec_last < 0 && !life_[i].read_by_backward) live_[i].out = Tensor();
  }
}

// --verify-recompute: what a re-run produced must hash as what forward produced.
void Executor::verify_recomputed(int i, bool extras_only) {
  const Layer& l = g_.layer(i);
  auto check = [&](int k, const Tensor& t, const std::string& what) {
    auto it = hashes_.find({i, k});
    if (it == hashes_.end()) return;
    const uint64_t h = tensor_hash(t);
    if (h != it->second) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%016llx vs %016llx", static_cast<unsigned long long>(it->second),
                    static_cast<unsigned long long>(h));
      REMAT_THROW("verify-recompute: layer \"", l.name, "\" (", l.type, "): ", what,
                  " differs after recompute (forward hash vs recompute hash: ", buf,
                  "); the layer is not deterministic or its inputs changed");
    }
  };
  if (!extras_only) check(-1, live_[i].out, "output");
  const auto names = l.extra_names();
  const std::vector<Tensor>& extras = live_[i].extras;
  for (size_t k = 0; k < extras.size(); ++k)
    check(static_cast<int>(k), extras[k],
          k < names.size() ? "tensor \"" + names[k] + "\"" : "extra " + std::to_string(k));
}

// ---- evaluation ------------------------------------------------------------------------------------

Tensor Executor::evaluate(const Batch& batch, float* loss) {
  ActivationDTypeScope precision(params_.precision());
  params_.refresh_working(be_);
  live_ = PerLayer<Live>(g_.size());
  bind_inputs(batch);
  for (int i = 0; i < g_.size(); ++i) {
    const Layer& l = g_.layer(i);
    if (l.kind() == LayerKind::input) continue;
    forward_layer(i, /*training=*/false, /*recompute=*/false, Phase::forward);
    live_[i].extras.clear();
    for (int j : l.inputs)
      if (life_[j].fwd_last == i && j != g_.logits_id && g_.layer(j).kind() != LayerKind::input)
        live_[j].out = Tensor();
  }
  Tensor logits = live_[g_.logits_id].out;
  if (loss) *loss = logits.device().is_meta() ? 0.0f : live_[g_.loss_id].out.to_vector()[0];
  for (int i = 0; i < g_.size(); ++i) live_[i].out = Tensor();
  return logits;
}

}  // namespace remat
