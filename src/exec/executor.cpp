#include <algorithm>
#include <cstdio>

#include "remat/error.h"
#include "remat/exec.h"
#include "remat/log.h"
#include "remat/ops.h"

namespace remat {

uint64_t tensor_hash(const Tensor& t) {
  if (!t.defined() || t.device().is_meta()) return 0;
  const Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
  const auto* p = static_cast<const unsigned char*>(h.raw_data());
  uint64_t x = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < h.nbytes(); ++i) {
    x ^= p[i];
    x *= 0x100000001b3ull;
  }
  return x;
}

Executor::Executor(const Graph& g, ParamStore& params, Backend& be, CheckpointPlan plan, ExecOptions opt)
    : g_(g), params_(params), be_(be), plan_(std::move(plan)), opt_(opt) {
  REMAT_CHECK(params.device() == be.device(), "executor: parameters on ", params.device().str(), " but backend ",
              be.name(), " runs on ", be.device().str());
  REMAT_CHECK(static_cast<int>(plan_.keep.size()) == g.size() && plan_.keep_extras.size() == plan_.keep.size(),
              "executor: plan does not match the graph");
  const auto n = static_cast<size_t>(g.size());
  fwd_last_.assign(n, -1);
  out_needed_bwd_.assign(n, false);
  bwd_last_.assign(n, g.size());
  rec_last_.assign(n, -1);
  for (int i = 0; i < g.size(); ++i) {
    const Layer& l = g.layer(i);
    for (int j : l.inputs) fwd_last_[static_cast<size_t>(j)] = std::max(fwd_last_[static_cast<size_t>(j)], i);
    for (int p : l.backward_inputs()) {
      const int j = l.inputs[static_cast<size_t>(p)];
      out_needed_bwd_[static_cast<size_t>(j)] = true;
      bwd_last_[static_cast<size_t>(j)] = std::min(bwd_last_[static_cast<size_t>(j)], i);
    }
    if (l.backward_uses_output()) {
      out_needed_bwd_[static_cast<size_t>(i)] = true;
      bwd_last_[static_cast<size_t>(i)] = std::min(bwd_last_[static_cast<size_t>(i)], i);
    }
  }
  // A kept output read by a recomputed layer is that segment's checkpoint: it must live
  // until the segment is recomputed, which happens just before the backward of the
  // segment's last layer.
  needed_rec_.assign(n, false);
  for (int i = 0; i < g.size(); ++i) {
    if (!plan_.rerun[static_cast<size_t>(i)]) continue;
    const int seg_last = plan_.segments[static_cast<size_t>(plan_.segment_of[static_cast<size_t>(i)])].end - 1;
    for (int j : g.layer(i).inputs) {
      if (!plan_.keep[static_cast<size_t>(j)]) continue;
      needed_rec_[static_cast<size_t>(j)] = true;
      bwd_last_[static_cast<size_t>(j)] = std::min(bwd_last_[static_cast<size_t>(j)], seg_last);
    }
  }
  free_after_.assign(n, {});
  for (int j = 0; j < g.size(); ++j) {
    const LayerKind k = g.layer(j).kind();
    if (k == LayerKind::input || j == g.loss_id) continue;
    if (bwd_last_[static_cast<size_t>(j)] < g.size()) free_after_[static_cast<size_t>(bwd_last_[static_cast<size_t>(j)])].push_back(j);
  }
  // Within a recompute pass, the last recomputed consumer of each recomputed output.
  for (int i = 0; i < g.size(); ++i) {
    if (!plan_.rerun[static_cast<size_t>(i)]) continue;
    for (int j : g.layer(i).inputs)
      if (plan_.segment_of[static_cast<size_t>(j)] == plan_.segment_of[static_cast<size_t>(i)])
        rec_last_[static_cast<size_t>(j)] = std::max(rec_last_[static_cast<size_t>(j)], i);
  }
}

void Executor::forward_layer(int i, bool training, bool recompute, Phase phase, bool extras_only) {
  const Layer& l = g_.layer(i);
  TagScope scope(MemoryCategory::activation, l.name, phase);
  ForwardContext c{be_, training, recompute, rng_[static_cast<size_t>(i)], {}, {}, Tensor(), {}, extras_only};
  for (int j : l.inputs) {
    REMAT_CHECK(out_[static_cast<size_t>(j)].defined(), "executor: input \"", g_.layer(j).name, "\" of layer \"",
                l.name, "\" is not live (plan bug)");
    c.in.push_back(out_[static_cast<size_t>(j)]);
  }
  for (int p : g_.layer_params[static_cast<size_t>(i)]) c.params.push_back(params_.values[static_cast<size_t>(p)]);
  if (opt_.on_layer) opt_.on_layer(i, phase, true);
  l.forward(c);
  if (opt_.on_layer) opt_.on_layer(i, phase, false);
  if (!extras_only) out_[static_cast<size_t>(i)] = c.out;  // else the kept output stays
  extras_[static_cast<size_t>(i)] = c.extras;
}

void Executor::drop_output(int j, bool record_hash) {
  Tensor& t = out_[static_cast<size_t>(j)];
  if (record_hash && opt_.verify_recompute) hashes_[{j, -1}] = tensor_hash(t);
  t = Tensor();
}

StepStats Executor::train_step(const Batch& batch, RngGenerator& gen) {
  const int n = g_.size();
  StepStats st;
  out_.assign(static_cast<size_t>(n), Tensor());
  extras_.assign(static_cast<size_t>(n), {});
  rng_.assign(static_cast<size_t>(n), RngState{});
  recomputed_.assign(plan_.segments.size(), false);
  hashes_.clear();
  gen.clear_reservations();  // keep only this step's record
  out_[static_cast<size_t>(g_.input_id)] = batch.input;
  out_[static_cast<size_t>(g_.targets_id)] = batch.targets;
  REMAT_CHECK(batch.input.shape() == g_.layer(g_.input_id).out_shape, "batch input ", batch.input.str(),
              " does not match the model input ", g_.layer(g_.input_id).out_shape.str());
  REMAT_CHECK(batch.targets.numel() == g_.layer(g_.targets_id).out_shape.numel(), "batch targets ",
              batch.targets.str(), " do not match the model's ", g_.layer(g_.targets_id).out_shape.str());

  // ---- forward ----
  for (int i = 0; i < n; ++i) {
    const Layer& l = g_.layer(i);
    if (l.kind() == LayerKind::input) continue;
    if (const uint64_t words = l.rng_words()) rng_[static_cast<size_t>(i)] = gen.reserve(words, l.name);
    forward_layer(i, /*training=*/true, /*recompute=*/false, Phase::forward);
    st.forward_flops += l.forward_flops();
    if (!plan_.keep_extras[static_cast<size_t>(i)]) {  // read only by this layer's backward, after recompute
      if (opt_.verify_recompute)
        for (size_t k = 0; k < extras_[static_cast<size_t>(i)].size(); ++k)
          hashes_[{i, static_cast<int>(k)}] = tensor_hash(extras_[static_cast<size_t>(i)][k]);
      extras_[static_cast<size_t>(i)].clear();
    }
    // Outputs whose forward life ended: keep them only if backward reads them and the
    // plan keeps them; otherwise free now (recompute rebuilds what backward needs).
    auto release = [&](int j) {
      const Layer& lj = g_.layer(j);
      if (lj.kind() == LayerKind::input || j == g_.loss_id) return;
      const bool needed = out_needed_bwd_[static_cast<size_t>(j)];
      if (plan_.keep[static_cast<size_t>(j)] && (needed || needed_rec_[static_cast<size_t>(j)])) return;
      drop_output(j, needed);
    };
    for (int j : l.inputs)
      if (fwd_last_[static_cast<size_t>(j)] == i) release(j);
    if (fwd_last_[static_cast<size_t>(i)] < 0) release(i);
  }
  st.loss = out_[static_cast<size_t>(g_.loss_id)].device().is_meta() ? 0.0f : out_[static_cast<size_t>(g_.loss_id)].to_vector()[0];

  // ---- backward ----
  std::vector<Tensor> dgrad(static_cast<size_t>(n));
  for (int i = n - 1; i >= 0; --i) {
    const Layer& l = g_.layer(i);
    if (l.kind() == LayerKind::input) continue;
    const int s = plan_.segment_of[static_cast<size_t>(i)];
    if (plan_.segments[static_cast<size_t>(s)].recompute && !recomputed_[static_cast<size_t>(s)]) recompute_segment(s, st);
    if (i == g_.loss_id || dgrad[static_cast<size_t>(i)].defined()) {
      TagScope scope(MemoryCategory::temporary, l.name, Phase::backward);
      // The context takes the only reference to the output gradient, so a layer may write
      // its input gradient into it when nothing else shares it (Layer::reuse_dout).
      BackwardContext c{be_, rng_[static_cast<size_t>(i)], {}, Tensor(), extras_[static_cast<size_t>(i)],
                        std::move(dgrad[static_cast<size_t>(i)]), {}, {}, {}, {}};
      dgrad[static_cast<size_t>(i)] = Tensor();
      c.in.resize(l.inputs.size());
      for (int p : l.backward_inputs()) {
        const int j = l.inputs[static_cast<size_t>(p)];
        REMAT_CHECK(out_[static_cast<size_t>(j)].defined(), "executor: \"", g_.layer(j).name,
                    "\" is not live for the backward of \"", l.name, "\" (plan bug)");
        c.in[static_cast<size_t>(p)] = out_[static_cast<size_t>(j)];
      }
      if (l.backward_uses_output()) c.out = out_[static_cast<size_t>(i)];
      for (int p : g_.layer_params[static_cast<size_t>(i)]) {
        c.params.push_back(params_.values[static_cast<size_t>(p)]);
        c.grads.push_back(params_.grads[static_cast<size_t>(p)]);
      }
      for (size_t k = 0; k < l.inputs.size(); ++k) {
        const Layer& in = g_.layer(l.inputs[k]);
        c.need_din.push_back(l.input_differentiable(static_cast<int>(k)) && in.kind() != LayerKind::input);
      }
      if (opt_.on_layer) opt_.on_layer(i, Phase::backward, true);
      l.backward(c);
      st.backward_flops += l.backward_flops();
      dgrad[static_cast<size_t>(i)] = Tensor();
      for (size_t k = 0; k < l.inputs.size(); ++k) {
        if (!c.need_din[k] || k >= c.din.size() || !c.din[k].defined()) continue;
        const auto j = static_cast<size_t>(l.inputs[k]);
        Tensor& d = c.din[k];
        if (!dgrad[j].defined()) {
          dgrad[j] = d;
        } else if (dgrad[j].storage_use_count() == 1) {
          be_.accumulate(dgrad[j], d);  // no other tensor shares it: add in place
        } else {
          dgrad[j] = ops::add(be_, dgrad[j], d);  // an alias (e.g. of dout through add): fresh sum
        }
        d = Tensor();
      }
      if (opt_.on_layer) opt_.on_layer(i, Phase::backward, false);
    }
    extras_[static_cast<size_t>(i)].clear();
    // Free every output whose last reader (backward or recompute) was this step.
    for (int j : free_after_[static_cast<size_t>(i)]) out_[static_cast<size_t>(j)] = Tensor();
    if (i == g_.loss_id) out_[static_cast<size_t>(i)] = Tensor();
  }
  out_.assign(static_cast<size_t>(n), Tensor());
  extras_.assign(static_cast<size_t>(n), {});
  return st;
}

void Executor::recompute_segment(int s, StepStats& st) {
  const Segment& seg = plan_.segments[static_cast<size_t>(s)];
  recomputed_[static_cast<size_t>(s)] = true;
  for (int i = seg.begin; i < seg.end; ++i) {
    if (!plan_.rerun[static_cast<size_t>(i)]) continue;
    const Layer& l = g_.layer(i);
    // A layer whose output is kept is re-run for its extras only.
    const bool extras_only = plan_.keep[static_cast<size_t>(i)];
    forward_layer(i, /*training=*/true, /*recompute=*/true, Phase::recompute, extras_only);
    st.recomputed_layers++;
    st.recompute_flops += extras_only ? l.extras_flops() : l.forward_flops();
    if (opt_.verify_recompute) {
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
      if (!extras_only) check(-1, out_[static_cast<size_t>(i)], "output");
      const auto names = l.extra_names();
      for (size_t k = 0; k < extras_[static_cast<size_t>(i)].size(); ++k)
        check(static_cast<int>(k), extras_[static_cast<size_t>(i)][k],
              k < names.size() ? "tensor \"" + names[k] + "\"" : "extra " + std::to_string(k));
    }
    // Recomputed outputs that backward does not read are dropped after their last
    // recomputed consumer.
    for (int j : l.inputs)
      if (rec_last_[static_cast<size_t>(j)] == i && !plan_.keep[static_cast<size_t>(j)] && !out_needed_bwd_[static_cast<size_t>(j)])
        out_[static_cast<size_t>(j)] = Tensor();
    if (!extras_only && rec_last_[static_cast<size_t>(i)] < 0 && !out_needed_bwd_[static_cast<size_t>(i)])
      out_[static_cast<size_t>(i)] = Tensor();
  }
}

Tensor Executor::evaluate(const Batch& batch, float* loss) {
  const int n = g_.size();
  out_.assign(static_cast<size_t>(n), Tensor());
  extras_.assign(static_cast<size_t>(n), {});
  rng_.assign(static_cast<size_t>(n), RngState{});
  out_[static_cast<size_t>(g_.input_id)] = batch.input;
  out_[static_cast<size_t>(g_.targets_id)] = batch.targets;
  for (int i = 0; i < n; ++i) {
    const Layer& l = g_.layer(i);
    if (l.kind() == LayerKind::input) continue;
    forward_layer(i, /*training=*/false, /*recompute=*/false, Phase::forward);
    extras_[static_cast<size_t>(i)].clear();
    for (int j : l.inputs)
      if (fwd_last_[static_cast<size_t>(j)] == i && j != g_.logits_id && g_.layer(j).kind() != LayerKind::input)
        out_[static_cast<size_t>(j)] = Tensor();
  }
  Tensor logits = out_[static_cast<size_t>(g_.logits_id)];
  if (loss) *loss = logits.device().is_meta() ? 0.0f : out_[static_cast<size_t>(g_.loss_id)].to_vector()[0];
  out_.assign(static_cast<size_t>(n), Tensor());
  return logits;
}

}  // namespace remat
