// Config files (models/*.json): model, data, optimizer, schedule and training sections,
// each documented key by key in docs/config.md. Every error names the file and the JSON
// pointer of the offending value, e.g.
//   models/x.json: /model/layers/2/kernel: expected a positive integer, got "3x3"
// and unknown keys are errors (a typo must not silently become a default).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "remat/dtype.h"

namespace remat {

// Reads one JSON object, tracking which keys were consumed. Integer fields may be given
// as "$name" to take a value from `vars` (e.g. "$vocab", filled from the data set).
// The name of `names` nearest to `typo` (edit distance at most 2, or a third of its
// length), if one is nearest alone; "" otherwise. For "did you mean" in errors.
std::string nearest_name(const std::string& typo, const std::vector<std::string>& names);

class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& obj, std::string pointer, std::string source,
               const std::map<std::string, int64_t>* vars = nullptr);

  bool has(const std::string& key) const;
  int64_t positive_int(const std::string& key);
  int64_t positive_int_or(const std::string& key, int64_t def);
  int64_t int_or(const std::string& key, int64_t def, int64_t min, int64_t max);
  double number(const std::string& key);
  double number_or(const std::string& key, double def, double min, double max);
  bool bool_or(const std::string& key, bool def);
  std::string string(const std::string& key);
  std::string string_or(const std::string& key, const std::string& def);
  std::string one_of(const std::string& key, const std::vector<std::string>& choices, const std::string& def);
  std::vector<std::string> string_list_or(const std::string& key, const std::vector<std::string>& def);
  std::vector<int64_t> shape(const std::string& key);        // a list of positive integers
  const nlohmann::json& raw(const std::string& key);         // marks consumed
  ConfigReader child(const std::string& key);                // an object
  ConfigReader child(const std::string& key, size_t index);  // element of an array of objects
  size_t array_size(const std::string& key);                 // marks consumed; must be an array

  // Throws for the first key never consumed ("unknown key", with "did you mean" the nearest
  // key looked up when it is within 2 edits, or a third of the key's length, and unique).
  void finish() const;
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;
  const std::string& pointer() const { return pointer_; }
  const std::string& source() const { return source_; }
  const std::map<std::string, int64_t>* vars() const { return vars_; }

 private:
  const nlohmann::json& get(const std::string& key);
  int64_t as_int(const std::string& key, const nlohmann::json& v, int64_t min, int64_t max, const char* what);
  const nlohmann::json& obj_;
  std::string pointer_, source_;
  const std::map<std::string, int64_t>* vars_;
  std::set<std::string> used_;
  mutable std::set<std::string> asked_;  // every key looked up, present or not (finish's suggestions)
};

constexpr int64_t kGpt2Vocab = 50257;  // GPT-2's tokenizer: the default vocabulary of token shards
// The default tokenizer size of a "translation" data set (remat corpus --vocab; data.vocab).
constexpr int64_t kTranslationVocab = 4000;

// The values of data.dataset (DataConfig::dataset), for the config reader and --dataset.
const std::vector<std::string>& known_datasets();

struct DataConfig {
  // fashion_mnist | text | synthetic_images | synthetic_text | token_shards | translation | npy
  std::string dataset = "fashion_mnist";
  std::string path;               // folder (fashion_mnist, text corpus, shards, npy arrays), file or glob (shards)
  int64_t synthetic_size = 2048;  // samples (images) or tokens (text) for synthetic sets
  // synthetic_text: the vocabulary; token_shards: $vocab (kGpt2Vocab); translation: the tokenizer's size
  int64_t vocab = 32;
  std::vector<int64_t> image_shape{1, 28, 28};
  int64_t classes = 10;
  double eval_fraction =
      0.1;              // text: share of the tokens held out for evaluation; npy without test files: of the samples
  bool shuffle = true;  // false: batches in data order (for comparisons)
  // translation: shorter lengths a batch of like-length pairs is cut to (ascending, each
  // below the model's; BatchSampler::group_by_length), run on a graph built at that
  // length; empty: every batch has the model's lengths.
  std::vector<int64_t> length_buckets;
  // Training-time augmentation of image batches ("augment": {...}); evaluation batches are
  // never augmented.
  struct Augment {
    double hflip = 0.0;  // probability that a training image is mirrored left-right
  } augment;
};

struct OptimizerConfig {
  std::string type = "adamw";  // adamw | sgd
  double lr = 1e-3;
  double weight_decay = 0.0;
  double momentum = 0.9;  // sgd
  double dampening = 0.0;
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adamw
  double grad_clip = 0.0;                         // global norm; 0 = off
};

struct ScheduleConfig {
  std::string type = "constant";  // constant | cosine | step
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.0;  // cosine floor as a fraction of lr
  int64_t step_size = 1000;   // step: decay every step_size steps
  double gamma = 0.1;         // step: factor
};

struct TrainingConfig {
  int64_t batch = 32;
  // Gradient accumulation: a step of `batch` samples runs batch / micro_batch
  // micro-batches (0 = one micro-batch of the whole batch); must divide batch.
  int64_t micro_batch = 0;
  int64_t micro() const { return micro_batch > 0 ? micro_batch : batch; }
  int64_t micro_batches() const { return batch / micro(); }
  // Data parallel: each rank keeps the optimizer state of 1/N of the parameters (ZeRO-1,
  // docs/distributed.md); bitwise the weights of an unsharded run.
  bool shard_optimizer = false;
  // Not a config key: the data-parallel ranks a step is profiled and planned for, one
  // rank's step (the trainer sets mpirun's rank count; memprof and plan take --ranks).
  int ranks = 1;
  // Not a config key: the reduction exchanges gradients on the device (NCCL on cuda:N):
  // each rank holds two flat gradient-sized buffers and a shard of one on the device
  // (docs/distributed.md), which the profile counts too.
  bool device_collectives = false;
  int64_t epochs = 0;  // one of epochs / steps; steps wins when both are given
  int64_t steps = 0;
  uint64_t seed = 0;
  std::string policy = "none";
  // fp32 | bf16: bf16 activations and working weights, fp32 masters, gradients and moments
  // (docs/memory.md, "Mixed precision"); fp16 is rejected.
  std::string precision = "fp32";
  int64_t log_every = 10;
  int64_t eval_every = 0;        // steps; 0 = at the end of each epoch (and of the run)
  int64_t eval_batches = 0;      // 0 = the whole eval set
  int64_t checkpoint_every = 0;  // steps; 0 = only at the end
  int64_t sample_every = 0;      // text models: generate a sample every N steps (0 = at the end)
  int64_t sample_length = 200;
};

struct Config {
  std::string source;  // the file, for messages
  std::string name;
  std::string description;
  nlohmann::json model;  // validated when the graph is built
  DataConfig data;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  TrainingConfig training;

  // The config with every default filled in (written beside a run's checkpoints).
  nlohmann::json resolved() const;
};

// `dataset`, when not empty, replaces data.dataset before the file is read, so that the
// data section's defaults are those of that data set (remat train --dataset).
Config load_config(const std::string& path, const std::string& dataset = "");
Config parse_config(const nlohmann::json& j, const std::string& source);
// training.micro_batch divides training.batch (an error naming both fields otherwise);
// for a run after the command line's overrides (parse_config checks the file's).
void check_micro_batch(const Config& cfg);

// The precisions training.precision and --precision take.
const std::vector<std::string>& precisions();
// Empty when `p` names a precision, else why not (fp16: no loss scaling, use bf16).
std::string precision_error(const std::string& p);
// The storage dtype of float activations under precision `p` (fp32: f32, bf16: bf16).
DType precision_dtype(const std::string& p);

}  // namespace remat
