// The executor: one training step or evaluation of a graph under a checkpoint plan.
//
// The executor compiles its CheckpointPlan once into a Schedule (remat/schedule.h): the
// explicit list of forward runs, frees, offloads, recomputes, prefetches and backward runs
// of a step, in order. A plan cuts the layers into segments and marks, per layer, whether
// its products (output and extras) are *kept* from forward to backward or *recomputed*. In
// forward, a recomputed product is freed as soon as forward no longer needs it (at the
// latest at its segment's boundary); in backward, before the first backward of a segment,
// the schedule re-runs the forward of the segment's recomputed layers from the kept
// tensors, with the RngState each layer drew in forward and without side effects
// (batchnorm running statistics), then backpropagates, freeing every tensor right after
// its last use. Because every op is deterministic and the random draws are replayed, a
// checkpointed step gives bitwise the losses and gradients of a plain one.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "remat/backend.h"
#include "remat/data.h"
#include "remat/graph.h"
#include "remat/params.h"
#include "remat/plan.h"
#include "remat/rng.h"
#include "remat/schedule.h"

namespace remat {

struct ExecOptions {
  ExecOptions() = default;
  explicit ExecOptions(bool verify) : verify_recompute(verify) {}
  bool verify_recompute = false;  // hash freed tensors and check them after recompute
  // Read the loss back in train_step (StepStats::loss). Off: train_step never waits for the
  // device; the loss tensor stays alive in StepStats::loss_value (one [1] tensor past its
  // free in backward) for the caller to read after its own synchronisation (the trainer,
  // at the end of the step: docs/kernels.md, "Stream drains").
  bool read_loss = true;
  // Called before (begin = true) and after each layer's forward, recompute and backward
  // (the memory profiler draws these as spans).
  std::function<void(int layer, Phase phase, bool begin)> on_layer;
  // Called in backward as soon as parameters' gradients are final for the step, with their
  // indices into ParamStore::grads: after the backward of the first layer (in graph order)
  // that uses them, so a parameter shared by several layers (a tied embedding and LM head)
  // comes after its last use. Every trainable parameter is named once per train_step. The
  // trainer's data-parallel reducer starts reducing a bucket there (docs/distributed.md).
  std::function<void(const std::vector<int>& params)> on_grads_final;
};

struct StepStats {
  float loss = 0.0f;              // NaN while not read (ExecOptions::read_loss off)
  Tensor loss_value;              // ExecOptions::read_loss off: the loss tensor [1] on the step's device
  int64_t recomputed_layers = 0;  // layer forwards re-run in backward
  double recompute_flops = 0.0;
  double forward_flops = 0.0;
  double backward_flops = 0.0;
};

// A vector indexed by layer id (an int, as Layer::id and Layer::inputs are).
template <typename T>
class PerLayer {
 public:
  PerLayer() = default;
  explicit PerLayer(int n, const T& v = T()) : v_(static_cast<size_t>(n), v) {}
  T& operator[](int i) { return v_[static_cast<size_t>(i)]; }
  const T& operator[](int i) const { return v_[static_cast<size_t>(i)]; }
  int size() const { return static_cast<int>(v_.size()); }

 private:
  std::vector<T> v_;
};

class Executor {
 public:
  Executor(const Graph& g, ParamStore& params, Backend& be, CheckpointPlan plan, ExecOptions opt = {});

  // Forward and backward of one batch in training mode. Random layers reserve their
  // ranges from `gen`. Parameter gradients accumulate into params.grads.
  StepStats train_step(const Batch& batch, RngGenerator& gen);
  // Forward in evaluation mode; returns the logits (the loss layer's first input) and the loss.
  Tensor evaluate(const Batch& batch, float* loss);

  const CheckpointPlan& plan() const { return plan_; }
  // The plan compiled: what train_step and evaluate run, instruction by instruction.
  const Schedule& schedule() const { return sched_; }
  // The pinned host pool offloaded products live in (the plan offloads: CheckpointPlan::
  // offload), made once with the executor; null where nothing is offloaded. Its stats are
  // the host tier's (allocated, peak), exact on meta as on the device.
  const CachingAllocator* host_pool() const { return host_pool_.get(); }
  CachingAllocator* host_pool() { return host_pool_.get(); }
  // Sets ExecOptions::on_grads_final after construction (an empty function: none).
  void set_on_grads_final(std::function<void(const std::vector<int>& params)> hook);

 private:
  // One layer's part of a step.
  struct Live {
    Tensor out;
    std::vector<Tensor> extras;
    RngState rng;  // the range it drew in forward, replayed by recompute and backward
    Tensor dout;   // the gradient of its output, accumulated over its consumers
    // Offload: the products' copies in the host pool (forward to prefetch), and the tickets
    // of the copies in flight (copy-out until the device products go, copy-in until need_at).
    Tensor host_out;
    std::vector<Tensor> host_extras;
    std::vector<uint64_t> copies;
    bool out_trip = false;         // the output is among the products brought back
    std::vector<uint64_t> hashes;  // --verify-recompute: the products' hashes before the trip
  };

  void begin_step(const Batch& batch);
  void bind_inputs(const Batch& batch);
  // Runs one program of the schedule; `st` null in evaluation.
  void run(const std::vector<Instr>& program, RngGenerator* gen, StepStats* st);
  void backward_layer(int i, StepStats& st);
  void accumulate_input_grads(const Layer& l, std::vector<Tensor>& din, const std::vector<bool>& need);
  void verify_recomputed(int i, bool extras_only);
  void forward_layer(int i, bool training, bool recompute, Phase phase, bool extras_only = false);
  void drop_extras(int i, bool record_hash);
  void drop_output(int j, bool record_hash);
  void make_host_pool();
  void start_offload(int j, bool with_output);
  void finish_offload(int j);
  void start_prefetch(int j);
  void finish_prefetch(int j);
  void end_step();

  const Graph& g_;
  ParamStore& params_;
  Backend& be_;
  CheckpointPlan plan_;
  ExecOptions opt_;

  Schedule sched_;
  std::unique_ptr<CachingAllocator> host_pool_;  // before live_: outlives the host copies
  PerLayer<std::vector<int>> grads_final_;       // per layer: the trainable ones of Schedule::grads_final
  PerLayer<Live> live_;
  std::map<std::pair<int, int>, uint64_t> hashes_;  // (layer, product: -1 output) -> hash
};

// 64-bit FNV-1a hash of a tensor's bytes (copied to the host when needed).
uint64_t tensor_hash(const Tensor& t);

}  // namespace remat
