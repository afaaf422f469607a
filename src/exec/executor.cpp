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
    : g_(g), params_(params), be_(be), plan_(std::move(plan)), opt_(opt), sched_(compile_schedule(g, plan_)) {
  REMAT_CHECK(params.device() == be.device(), "executor: parameters on ", params.device().str(), " but backend ",
              be.name(), " runs on ", be.device().str());
  const std::string wrong = check_schedule(g, sched_);
  REMAT_CHECK(wrong.empty(), "policy \"", plan_.policy, "\" compiles to a schedule that cannot run: ", wrong,
              " (plan bug)");
  // The parameters whose gradients are final after each layer's backward, of those this
  // step trains (a frozen parameter has no gradient).
  grads_final_ = PerLayer<std::vector<int>>(g.size());
  for (int i = 0; i < g.size(); ++i)
    for (int p : sched_.grads_final[static_cast<size_t>(i)])
      if (static_cast<size_t>(p) < params.grads.size() && params.grads[static_cast<size_t>(p)].defined())
        grads_final_[i].push_back(p);
  if (plan_.offloads()) make_host_pool();
}

// Offload: the host pool, sized by the offloaded outputs, made once.
void Executor::make_host_pool() {
  const std::string why = be_.offload_unsupported();
  REMAT_CHECK(why.empty(), "policy \"", plan_.policy, "\" offloads activations to host memory, which ", be_.name(),
              " cannot do: ", why, " (offload needs a GPU: --device cuda, or cuda-emu to try it)");
  size_t estimate = 0;
  for (int j = 0; j < g_.size(); ++j) {
    if (!plan_.offload[static_cast<size_t>(j)]) continue;
    const Layer& l = g_.layer(j);
    estimate += CachingAllocator::round_size(static_cast<size_t>(l.out_shape.numel()) * dtype_size(l.out_dtype));
  }
  // Extras and rounding: a quarter more; the pool takes another chunk if that is short.
  host_pool_ = std::make_unique<CachingAllocator>(be_.device().is_meta() ? Device::meta() : Device::cpu(),
                                                  be_.make_pinned_allocator(estimate + estimate / 4 + (1 << 20)));
}

// The products a layer keeps go to the host pool, on the copy stream, from the end of its
// forward (the output only where it outlives forward: `with_output`); the device copies
// stay until finish_offload.
void Executor::start_offload(int j, bool with_output) {
  Live& L = live_[j];
  const AllocTag tag{MemoryCategory::activation, g_.layer(j).name, Phase::forward};
  auto copy_out = [&](const Tensor& t) {
    if (opt_.verify_recompute) L.hashes.push_back(tensor_hash(t));
    Tensor h = Tensor::empty_in(*host_pool_, t.shape(), t.dtype(), tag);
    L.copies.push_back(be_.copy_async(h, t));
    return h;
  };
  if (with_output) L.host_out = copy_out(L.out);
  for (const Tensor& e : L.extras) L.host_extras.push_back(copy_out(e));
}

// Compute waits for the copies (it may reuse their source blocks from here on); the
// device products go.
void Executor::finish_offload(int j) {
  Live& L = live_[j];
  for (uint64_t t : L.copies) be_.wait_copy(t);
  L.copies.clear();
  if (L.host_out.defined()) L.out = Tensor();
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
  L.out_trip = L.host_out.defined();
  if (L.out_trip) L.out = copy_in(L.host_out);
  for (Tensor& h : L.host_extras) L.extras.push_back(copy_in(h));
  L.host_extras.clear();
}

// Before the first backward step that reads them: compute waits for the copies back.
void Executor::finish_prefetch(int j) {
  Live& L = live_[j];
  for (uint64_t t : L.copies) be_.wait_copy(t);
  L.copies.clear();
  if (!opt_.verify_recompute) return;
  std::vector<std::pair<const Tensor*, std::string>> products;
  if (L.out_trip) products.emplace_back(&L.out, "its output");
  for (size_t k = 0; k < L.extras.size(); ++k) products.emplace_back(&L.extras[k], "extra " + std::to_string(k));
  for (size_t k = 0; k < products.size() && k < L.hashes.size(); ++k)
    REMAT_CHECK(tensor_hash(*products[k].first) == L.hashes[k], "verify-recompute: layer \"", g_.layer(j).name,
                "\": ", products[k].second, " differs after its round trip through host memory (offload)");
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
  // The schedule frees extras only where a layer names them (Layer::extra_names).
  REMAT_CHECK(c.extras.size() <= l.extra_names().size(), "layer \"", l.name, "\" (", l.type, ") made ", c.extras.size(),
              " extras but names ", l.extra_names().size(), " (layer bug)");
  if (!extras_only) live_[i].out = c.out;  // else the kept output stays
  live_[i].extras = c.extras;
}

void Executor::drop_extras(int i, bool record_hash) {
  std::vector<Tensor>& extras = live_[i].extras;
  if (record_hash && opt_.verify_recompute)
    for (size_t k = 0; k < extras.size(); ++k) hashes_[{i, static_cast<int>(k)}] = tensor_hash(extras[k]);
  extras.clear();
}

void Executor::drop_output(int j, bool record_hash) {
  Tensor& t = live_[j].out;
  if (record_hash && opt_.verify_recompute) hashes_[{j, -1}] = tensor_hash(t);
  t = Tensor();
}

// ---- one training step: the schedule's forward, then its backward --------------------------------

StepStats Executor::train_step(const Batch& batch, RngGenerator& gen) {
  ActivationDTypeScope precision(params_.precision());  // bf16 activations under training.precision bf16
  StepStats st;
  begin_step(batch);
  gen.clear_reservations();  // keep only this step's record
  run(sched_.forward, &gen, &st);
  const Tensor& loss = live_[g_.loss_id].out;
  if (!opt_.read_loss)  // on meta too: the loss tensor's lifetime is part of the memory a step holds
    st.loss = NAN, st.loss_value = loss;
  else
    st.loss = loss.device().is_meta() ? 0.0f : loss.to_vector()[0];
  run(sched_.backward, &gen, &st);
  end_step();
  return st;
}

void Executor::begin_step(const Batch& batch) {
  params_.refresh_working(be_);
  live_ = PerLayer<Live>(g_.size());
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

// The interpreter: each instruction as remat/schedule.h defines it.
void Executor::run(const std::vector<Instr>& program, RngGenerator* gen, StepStats* st) {
  for (const Instr& x : program) {
    const int i = x.layer;
    const Layer& l = g_.layer(i);
    switch (x.op) {
      case Step::forward:
        if (x.flag)
          if (const uint64_t words = l.rng_words()) live_[i].rng = gen->reserve(words, l.name);
        forward_layer(i, /*training=*/x.flag, /*recompute=*/false, Phase::forward);
        if (st) st->forward_flops += l.forward_flops();
        break;
      case Step::recompute:
        forward_layer(i, /*training=*/true, /*recompute=*/true, Phase::recompute, /*extras_only=*/x.flag);
        st->recomputed_layers++;
        st->recompute_flops += x.flag ? l.extras_flops() : l.forward_flops();
        if (opt_.verify_recompute) verify_recomputed(i, x.flag);
        break;
      case Step::backward:
        if (i == g_.loss_id || live_[i].dout.defined()) backward_layer(i, *st);
        break;
      case Step::drop_extras: drop_extras(i, x.flag); break;
      case Step::free: drop_output(i, x.flag); break;
      case Step::offload: start_offload(i, x.flag); break;
      case Step::offload_wait: finish_offload(i); break;
      case Step::prefetch: start_prefetch(i); break;
      case Step::prefetch_wait: finish_prefetch(i); break;
      case Step::grads_final:
        if (opt_.on_grads_final && !grads_final_[i].empty()) opt_.on_grads_final(grads_final_[i]);
        break;
    }
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
  run(sched_.evaluate, nullptr, nullptr);
  Tensor logits = live_[g_.logits_id].out;
  if (loss) *loss = logits.device().is_meta() ? 0.0f : live_[g_.loss_id].out.to_vector()[0];
  for (int i = 0; i < g_.size(); ++i) live_[i].out = Tensor();
  return logits;
}

}  // namespace remat
