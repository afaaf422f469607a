// Training: the loop behind `remat train`, and checkpoints. The optimizers are in
// remat/optim.h, the memory report of a run in remat/profile.h.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "remat/config.h"
#include "remat/executor.h"
#include "remat/optim.h"
#include "remat/params.h"

namespace remat {

struct TrainOptions {
  std::string config;     // path of the model config
  std::string policy;     // "" = the config's
  std::string precision;  // "" = the config's training.precision (fp32 | bf16)
  std::string device = "auto";
  // Unset: the config's. Set values are checked (a negative batch is an error, never the
  // config's value in disguise).
  std::optional<int64_t> steps;        // > 0
  std::optional<int64_t> epochs;       // > 0
  std::optional<int64_t> batch;        // > 0
  std::optional<int64_t> micro_batch;  // >= 0; 0 = the whole batch
  std::string reduce = "ordered";      // data parallel: "ordered" (bitwise for any rank count) or "fast"
  bool shard_optimizer = false;        // sets training.shard_optimizer (ZeRO-1)
  // Data parallel on cpu: reduce buckets of gradients during the backward sweep (the same
  // bits as after it; docs/distributed.md), each bucket closing at bucket_kib KiB.
  bool overlap = true;
  int64_t bucket_kib = 512;
  std::optional<int64_t> seed;  // >= 0
  std::string out;              // run folder: checkpoint/, metrics.jsonl, config.json, memory.html
  std::string resume;           // run folder to resume from
  // out may be a folder that holds a run (a checkpoint or metrics.jsonl) only with
  // overwrite, which starts it over: its checkpoint is removed, metrics.jsonl truncated.
  bool overwrite = false;
  // With resume: fit the learning-rate schedule to this run's length; by default it keeps
  // the length recorded in the checkpoint (a run extended with --steps continues past the
  // end of its schedule at the schedule's final rate).
  bool reschedule = false;
  std::string data_path;           // overrides data.path
  std::string dataset;             // overrides data.dataset (e.g. token_shards for a synthetic config)
  std::string init_from;           // weights to start from: a Hugging Face GPT-2 checkpoint or a remat run (interop.h)
  bool init_from_partial = false;  // tolerate missing and unexpected tensors in init_from
  bool verify_recompute = false;
  bool quiet = false;  // no progress lines
  bool sample = true;  // generate a text sample at the end (character models)
  // Called after every step with (step, loss); tests use it to stop early.
  std::function<void(int64_t, float)> on_step;
  // Called with this rank's gradients after the backward of each micro-batch (its index m
  // in the step) and after the reduction (m = -1), before the optimizer; tests use it.
  std::function<void(int64_t, const std::vector<Tensor>&)> on_grads;
};

struct TrainResult {
  int64_t steps = 0;        // total steps done (including those before a resume)
  int ranks = 1;            // data-parallel ranks of the run
  int64_t comm_bytes = 0;   // sent by this rank in the steps of this call (docs/distributed.md)
  double comm_ms = 0;       // with collectives in flight, in the steps of this call
  double comm_wait_ms = 0;  // of which blocked in them (comm_ms - comm_wait_ms: hidden behind backward)
  float last_loss = 0.0f;
  std::vector<float> losses;  // of the steps run in this call
  double eval_loss = 0.0;
  double eval_accuracy = -1.0;  // -1 when not evaluated
  int64_t peak_bytes = 0;
  MemoryStats peak_stats;  // allocator statistics of the step that reached peak_bytes
  std::string sample;
  int64_t host_peak_bytes = 0;  // the pinned host pool's peak (the plan offloads: POLICY+offload)
  std::string policy;           // the plan the run trained under (a budget: "budget:SIZE -> plan")
  std::string precision;        // fp32 or bf16
  // data.length_buckets: the steps of this call by the length their batch was cut to (0:
  // the model's lengths); empty without buckets.
  std::map<int64_t, int64_t> batches_by_length;
  double valid_bleu = -1.0;  // a translation run: greedy BLEU on its valid split's first pairs (-1: none)
};

// A training run in named phases (tiny-cuda-nn's Trainer is the model):
//   Trainer t(options);   // config, device, data, graph, plan, parameters; resumes when asked
//   while (t.steps_done() < t.total_steps()) t.step();
//   t.evaluate(); t.checkpoint();
// run() is that loop with logging and the config's periodic evaluation, checkpoints and
// samples; train(options) is Trainer(options).run().
class Trainer {
 public:
  explicit Trainer(const TrainOptions& opt);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One training step: the next batch, forward and backward (recomputing as the plan
  // says), the optimizer update; logs it when the config says so.
  StepStats step();
  // Loss and accuracy on (up to training.eval_batches batches of) the evaluation set.
  std::pair<double, double> evaluate();
  // Saves the run's checkpoint into its folder (nothing without one).
  void checkpoint();
  // `length` characters sampled from a text model, drawn with `seed`.
  std::string sample(int64_t length, uint64_t seed);
  TrainResult run();

  int64_t steps_done() const;   // including the steps before a resume
  int64_t total_steps() const;  // of the whole run

  struct State;  // what a run holds (src/train/train.cpp)

 private:
  void init_weights();
  void resume();
  void resume_schedule(int64_t recorded);  // the learning-rate schedule's length on resume
  void open_run_folder();
  void write_memory_page();
  void log_step(const StepStats& st, double lr, double ms, const MemoryStats& mem);
  void translation_bleu();  // a translation run's end: greedy BLEU on valid pairs

  std::unique_ptr<State> s_;
};

TrainResult train(const TrainOptions& opt);

// Checkpoint files in `dir`: model.safetensors (parameters and buffers by name),
// optimizer.safetensors, state.json. Written into a fresh folder that then replaces the
// previous checkpoint, so a crash leaves the old checkpoint or the new one, never a mix.
struct CheckpointState {
  int64_t step = 0;
  uint64_t seed = 0;
  uint64_t rng_offset = 0;
  int64_t epoch = 0, position = 0;  // batch sampler
  int64_t optimizer_steps = 0;
  std::string policy, config_name;
  int64_t batch = 0, train_size = 0;  // the data order depends on them: checked on resume
  // The learning-rate schedule's length (the run's total steps when it started, or at its
  // last --reschedule); 0 in checkpoints made before it was recorded.
  int64_t schedule_steps = 0;
};
// optimizer_state: Optimizer::checkpoint_state(), gathered from every rank when sharded.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
void save_checkpoint(const std::string& dir, const ParamStore& params, const NamedTensors& optimizer_state,
                     const CheckpointState& state);
// Loads into params and the optimizer state tensors (shapes and names must match: a
// sharded optimizer then takes its shard, Optimizer::scatter_state) and returns the state;
// the caller sets the optimizer's step count from it.
CheckpointState load_checkpoint(const std::string& dir, ParamStore& params, const NamedTensors& optimizer_state);

}  // namespace remat
