// Training: the loop behind `remat train`, and checkpoints. The optimizers are in
// remat/optim.h, the memory report of a run in remat/profile.h.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "remat/config.h"
#include "remat/exec.h"
#include "remat/optim.h"

namespace remat {

struct TrainOptions {
  std::string config;        // path of the model config
  std::string policy;        // "" = the config's
  std::string device = "auto";
  int64_t steps = -1;        // -1 = the config's
  int64_t epochs = -1;
  int64_t batch = -1;
  int64_t seed = -1;
  std::string out;           // run folder: checkpoint/, metrics.jsonl, config.json
  std::string resume;        // run folder to resume from
  std::string data_path;     // overrides data.path
  std::string dataset;       // overrides data.dataset (e.g. token_shards for a synthetic config)
  std::string init_from;     // weights to start from: a Hugging Face GPT-2 checkpoint or a remat run (interop.h)
  bool init_from_partial = false;  // tolerate missing and unexpected tensors in init_from
  bool verify_recompute = false;
  bool quiet = false;        // no progress lines
  bool sample = true;        // generate a text sample at the end (character models)
  // Called after every step with (step, loss); tests use it to stop early.
  std::function<void(int64_t, float)> on_step;
};

struct TrainResult {
  int64_t steps = 0;  // total steps done (including those before a resume)
  float last_loss = 0.0f;
  std::vector<float> losses;  // of the steps run in this call
  double eval_loss = 0.0;
  double eval_accuracy = -1.0;  // -1 when not evaluated
  int64_t peak_bytes = 0;
  MemoryStats peak_stats;  // allocator statistics of the step that reached peak_bytes
  std::string sample;
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
};
void save_checkpoint(const std::string& dir, const ParamStore& params, const Optimizer& opt,
                     const CheckpointState& state);
// Loads into params/optimizer state (shapes and names must match) and returns the state.
CheckpointState load_checkpoint(const std::string& dir, ParamStore& params, Optimizer& opt);

}  // namespace remat
