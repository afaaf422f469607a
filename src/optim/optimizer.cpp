#include <cmath>

#include "remat/error.h"
#include "remat/optim.h"

namespace remat {

Optimizer::Optimizer(const OptimizerConfig& cfg, ParamStore& params, Backend& be)
    : cfg_(cfg), params_(params), be_(be) {
  const Graph& g = params.graph();
  for (size_t p = 0; p < params.values.size(); ++p) {
    if (!params.grads[p].defined()) continue;
    TagScope scope(MemoryCategory::optimizer_state, g.params[p].name, Phase::setup);
    auto& st = params.state[p];
    st.clear();
    if (cfg.type == "adamw") {
      st.push_back(Tensor::zeros(params.values[p].shape(), params.device()));
      st.push_back(Tensor::zeros(params.values[p].shape(), params.device()));
    } else if (cfg.momentum != 0.0) {
      st.push_back(Tensor::zeros(params.values[p].shape(), params.device()));
    }
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
  for (size_t p = 0; p < params_.values.size(); ++p) {
    if (!params_.grads[p].defined()) continue;
    const bool decay = g.params[p].spec.weight_decay;
    if (cfg_.type == "adamw") {
      AdamWParams ap{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, decay ? cfg_.weight_decay : 0.0};
      be_.adamw_step(params_.values[p], params_.grads[p], params_.state[p][0], params_.state[p][1], ap, step_);
    } else {
      SgdParams sp{lr, cfg_.momentum, cfg_.dampening, decay ? cfg_.weight_decay : 0.0, cfg_.nesterov};
      be_.sgd_step(params_.values[p], params_.grads[p], params_.state[p].empty() ? Tensor() : params_.state[p][0], sp,
                   step_);
    }
  }
}

std::vector<std::pair<std::string, Tensor>> Optimizer::named_state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  const Graph& g = params_.graph();
  const char* adam[] = {"exp_avg", "exp_avg_sq"};
  for (size_t p = 0; p < params_.state.size(); ++p)
    for (size_t k = 0; k < params_.state[p].size(); ++k)
      out.emplace_back(g.params[p].name + "." + (cfg_.type == "adamw" ? adam[k] : "momentum_buffer"),
                       params_.state[p][k]);
  return out;
}

}  // namespace remat
