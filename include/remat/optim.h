// Optimizers over a ParamStore: the update of one training step. Below the profiler
// (which simulates a whole step, update included) and the training loop.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "remat/config.h"
#include "remat/params.h"

namespace remat {

// The trainable parameters of a ParamStore laid end to end as one flat vector of floats,
// cut into `ranks` equal shards, rank r owning [r * shard, (r + 1) * shard): the layout of
// the data-parallel gradient exchange and of the sharded optimizer state (ZeRO-1, see
// docs/distributed.md). Each parameter starts at a multiple of kAlign elements, so every
// piece of a shard starts 64-byte aligned inside its tensor (vector loads on the GPU).
struct FlatLayout {
  static constexpr int64_t kAlign = 16;
  FlatLayout(const ParamStore& params, int ranks);
  // Elements [begin, end) of parameter `param`, at flat positions offset[param] + begin ...
  struct Piece {
    size_t param;
    int64_t begin, end;
  };
  // The pieces of the parameters inside rank's shard, in parameter order.
  std::vector<Piece> pieces(int rank) const;
  std::vector<int64_t> offset;  // per parameter; -1 for those without a gradient
  std::vector<int64_t> numel;   // per parameter; 0 for those without a gradient
  int64_t elements = 0;         // trainable elements, padding excluded
  int64_t shard = 0;            // per rank, a multiple of kAlign
  int64_t size = 0;             // shard * ranks
  int ranks = 1;
};

// SGD (momentum, weight decay) or AdamW over every trainable parameter, with optional
// global gradient-norm clipping. State tensors are allocated with category optimizer_state.
//
// Sharded (ZeRO-1, training.shard_optimizer): rank `rank` of `ranks` keeps the state of
// its shard of FlatLayout(params, ranks) only (flat tensors of `shard` elements) and
// step() updates only the parameter elements of that shard; the caller gathers the
// updated weights from every rank (GradReducer::gather_weights). Element by element the
// update is the unsharded one, so the weights are bitwise those of an unsharded run.
class Optimizer {
 public:
  Optimizer(const OptimizerConfig& cfg, ParamStore& params, Backend& be);
  // ranks > 0: sharded, rank `rank` of `ranks` (ranks 1 shards nothing away but keeps flat
  // state); ranks 0: as the constructor above.
  Optimizer(const OptimizerConfig& cfg, ParamStore& params, Backend& be, int rank, int ranks);
  // One update at learning rate `lr`, gradients clipped first when grad_clip is set
  // (Backend::clip_grad_norm: the step never waits for the device). Sharded, the update
  // reads only this rank's shard of the gradients; clipping needs all of them.
  void step(double lr);
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t s) { step_ = s; }
  bool sharded() const { return ranks_ > 0; }
  int64_t state_bytes() const;  // this rank's state tensors, at their element size
  const FlatLayout* layout() const { return layout_.get(); }

  // The state as a checkpoint holds it, tensor by tensor ("<param>.exp_avg", ...), whether
  // sharded or not. Unsharded: the live tensors. Sharded: new host tensors, to be filled by
  // gather_state (saving) or by a checkpoint's reader and then scatter_state (resuming).
  std::vector<std::pair<std::string, Tensor>> checkpoint_state() const;
  // Sharded: fills checkpoint_state()'s tensors from every rank's shard; `allgather` is
  // the ranks' collective (recv = the ranks' `count` floats in rank order), so every rank
  // calls this.
  using AllGather = std::function<void(const float* send, float* recv, int64_t count)>;
  void gather_state(const std::vector<std::pair<std::string, Tensor>>& whole, const AllGather& allgather) const;
  // Sharded: takes this rank's shard from whole state tensors (as checkpoint_state()'s).
  void scatter_state(const std::vector<std::pair<std::string, Tensor>>& whole);

 private:
  void allocate_state();
  void step_sharded(double lr);

  OptimizerConfig cfg_;
  ParamStore& params_;
  Backend& be_;
  int64_t step_ = 0;
  int rank_ = 0, ranks_ = 0;            // ranks_ > 0: sharded
  std::unique_ptr<FlatLayout> layout_;  // sharded only
  std::vector<Tensor> shard_state_;     // sharded: exp_avg, exp_avg_sq (AdamW) or momentum_buffer
};

// The learning rate at `step` (counting from 1) of `total` steps: the optimizer section's
// lr under its schedule (src/optim/schedule.cpp).
double scheduled_lr(const OptimizerConfig& o, const ScheduleConfig& s, int64_t step, int64_t total);

}  // namespace remat
