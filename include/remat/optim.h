// Optimizers over a ParamStore: the update of one training step. Below the profiler
// (which simulates a whole step, update included) and the training loop.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "remat/config.h"
#include "remat/exec.h"

namespace remat {

// SGD (momentum, weight decay) or AdamW over every trainable parameter, with optional
// global gradient-norm clipping. State tensors are allocated with category optimizer_state.
class Optimizer {
 public:
  Optimizer(const OptimizerConfig& cfg, ParamStore& params, Backend& be);
  // One update at learning rate `lr`, gradients clipped first when grad_clip is set
  // (Backend::clip_grad_norm: the step never waits for the device).
  void step(double lr);
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t s) { step_ = s; }
  // Named state tensors for checkpoints ("<param>.exp_avg", ...).
  std::vector<std::pair<std::string, Tensor>> named_state() const;

 private:
  OptimizerConfig cfg_;
  ParamStore& params_;
  Backend& be_;
  int64_t step_ = 0;
};

}  // namespace remat
