// Checkpoint plans, parameter storage and the executor.
//
// The executor walks the graph in topological order. A CheckpointPlan cuts the layers
// into segments and marks, per layer, whether its products (output and extras) are
// *kept* from forward to backward or *recomputed*. In forward, a recomputed product is
// freed as soon as forward no longer needs it (at the latest at its segment's boundary);
// in backward, before the first backward of a segment, the executor re-runs the forward
// of the segment's recomputed layers from the kept tensors, with the RngState each layer
// drew in forward and without side effects (batchnorm running statistics), then
// backpropagates, freeing every tensor right after its last use. Because every op is
// deterministic and the random draws are replayed, a checkpointed step gives bitwise the
// losses and gradients of a plain one.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "remat/backend.h"
#include "remat/data.h"
#include "remat/graph.h"
#include "remat/rng.h"

namespace remat {

struct Segment {
  int begin = 0;  // layer ids [begin, end)
  int end = 0;
  bool recompute = false;  // some layer of it is recomputed
};

struct CheckpointPlan {
  std::string policy;
  std::vector<Segment> segments;  // cover every layer, in order
  std::vector<bool> keep;         // per layer: its output is kept
  // Per layer: its extras are kept. False wherever keep is false (a re-run rebuilds all
  // of a layer's products); false where keep is true re-runs the layer for its extras
  // only (ForwardContext::extras_only), e.g. attention's probabilities under selective.
  std::vector<bool> keep_extras;
  std::vector<int> segment_of;  // per layer
  // Per layer: re-run in backward because backward (or another re-run layer) reads a
  // product it does not keep. A non-kept layer nobody reads again is not re-run.
  std::vector<bool> rerun;

  int recomputed_layers() const;  // layers re-run in each backward
  std::string describe(const Graph& g) const;
};

// Policies: none, all, every:K, sqrt, selective, manual (see docs/checkpointing.md).
// Units are the repeated-block instances of the model, or, in a model without repeated
// blocks, its layers.
CheckpointPlan make_plan(const Graph& g, const std::string& policy);
// The units the policies group: repeated-block instances, or in a model without repeated
// blocks every layer but the inputs and the loss. Each unit is a range of layer ids.
std::vector<Segment> plan_units(const Graph& g);
// What the selective policy keeps, in the layers of `s`, as each layer says
// (Layer::selective_keep: GEMM, convolution and embedding products whole; attention's
// P V output but not its probabilities). Sets keep and keep_extras (per layer of g) for
// those layers.
void keep_selective(const Graph& g, const Segment& s, std::vector<bool>& keep, std::vector<bool>& keep_extras);

// A plan from explicit per-layer keep flags grouped into segments (used by the planner
// and tests); enforces that every tensor read across a segment boundary is kept.
// keep_extras empty: each layer keeps its extras as it keeps its output.
CheckpointPlan make_plan_from_segments(const Graph& g, const std::string& name, const std::vector<Segment>& segments,
                                       const std::vector<bool>& keep, const std::vector<bool>& keep_extras = {});

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
  // Sets ExecOptions::on_grads_final after construction (an empty function: none).
  void set_on_grads_final(std::function<void(const std::vector<int>& params)> hook);

 private:
  // What the plan means for one layer's products, worked out once (the constructor).
  struct Lifetime {
    int fwd_last = -1;                                      // last forward consumer of the output, -1 if none
    bool read_by_backward = false;                          // some backward reads the output
    bool read_by_recompute = false;                         // a kept output some recomputed layer reads
    int bwd_last = 0;                                       // smallest layer id whose backward (or recompute) reads it
    int rec_last = -1;                                      // last recomputed consumer within its segment
    std::vector<int> free_after;                            // outputs to free after this layer's backward
    bool keep = false, keep_extras = false, rerun = false;  // the plan's flags
    int segment = -1;
  };
  // One layer's part of a step.
  struct Live {
    Tensor out;
    std::vector<Tensor> extras;
    RngState rng;  // the range it drew in forward, replayed by recompute and backward
    Tensor dout;   // the gradient of its output, accumulated over its consumers
  };

  void begin_step(const Batch& batch);
  void bind_inputs(const Batch& batch);
  void forward_pass(RngGenerator& gen, StepStats& st);
  void release_after_forward(int j);
  void backward_pass(StepStats& st);
  void backward_layer(int i, StepStats& st);
  void accumulate_input_grads(const Layer& l, std::vector<Tensor>& din, const std::vector<bool>& need);
  void recompute_segment(int s, StepStats& st);
  void verify_recomputed(int i, bool extras_only);
  void forward_layer(int i, bool training, bool recompute, Phase phase, bool extras_only = false);
  void drop_output(int j, bool record_hash);
  void end_step();

  const Graph& g_;
  ParamStore& params_;
  Backend& be_;
  CheckpointPlan plan_;
  ExecOptions opt_;

  PerLayer<Lifetime> life_;
  PerLayer<std::vector<int>> grads_final_;  // per layer: parameters whose gradients its backward completes
  PerLayer<Live> live_;
  std::vector<bool> recomputed_;                    // per segment, this step
  std::map<std::pair<int, int>, uint64_t> hashes_;  // (layer, product: -1 output) -> hash
};

// 64-bit FNV-1a hash of a tensor's bytes (copied to the host when needed).
uint64_t tensor_hash(const Tensor& t);

}  // namespace remat
