// Parameter storage: a model's parameters, their gradients, the bf16 working copies and
// the optimizer state, on one device.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "remat/backend.h"
#include "remat/graph.h"

namespace remat {

// Parameters, their gradients, and optimizer state, on one device.
class ParamStore {
 public:
  // Allocates every parameter (category parameter) and, for trainable ones, a gradient
  // (category gradient), and initialises them from `seed` (Philox; identical on every device).
  // With initialise false the values are left unset, for a caller that fills them
  // (interop.h's init_from), which can still initialise(p) the ones it does not fill.
  ParamStore(const Graph& g, Device device, uint64_t seed, bool initialise = true);
  // Sets parameter p to the values the constructor gives it (its Philox draws start at an
  // offset fixed by the parameters before it, so the order of calls does not matter).
  void initialise(size_t p);

  const Graph& graph() const { return *graph_; }
  Device device() const { return device_; }
  // The activation dtype the store was made under (f32, or bf16 with working copies): the
  // executor runs its steps and evaluations in it (ActivationDTypeScope).
  DType precision() const { return precision_; }
  std::vector<Tensor> values;  // per graph param
  std::vector<Tensor> grads;   // undefined for buffers
  // Under bf16 (activation_dtype() bf16 when constructed): the bf16 working copy of each
  // trainable parameter that the forward and backward GEMMs read (category parameter,
  // beside the fp32 master in `values`); empty under fp32. Gradients stay fp32.
  std::vector<Tensor> working;
  // Rounds every master into its working copy (nothing under fp32). The executor calls it
  // at the start of each step and evaluation, so the copies always follow the masters
  // (after an optimizer step, a checkpoint load, --init-from) without anyone marking them.
  // One Backend::cast_multi over every copy: on the CUDA backend a few launches per step
  // (kernels::kCastMultiMax tensors each), not one per parameter.
  void refresh_working(Backend& be);
  // What a layer's ops read for parameter p: its bf16 working copy if it has one, else the
  // master (fp32 runs, buffers, frozen parameters).
  const Tensor& compute_value(size_t p) const {
    return p < working.size() && working[p].defined() ? working[p] : values[p];
  }
  // Optimizer state, created by the optimizer (category optimizer_state).
  std::vector<std::vector<Tensor>> state;

  void zero_grads(Backend& be);
  // Names and tensors of every value (checkpoint weights).
  std::vector<std::pair<std::string, Tensor>> named_values() const;

 private:
  const Graph* graph_;
  Device device_;
  DType precision_ = DType::f32;
  uint64_t seed_ = 0;
  std::vector<uint64_t> offsets_;  // per parameter: the first Philox word of its initialisation
};

}  // namespace remat
