// `remat eval`: the loss and perplexity of a language model on token shards, for
// comparing a fine-tuned model with the one it started from; for a translation model, its
// loss on a corpus split and the BLEU of its greedy translations; for any other model (an
// image classifier, a character-level model on its text), its loss and accuracy on the
// whole evaluation set of its config's data.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "remat/bleu.h"
#include "remat/interop.h"

namespace remat {

struct EvalOptions {
  std::string config;     // model config (models/*.json), or a run folder (its config.json and weights)
  std::string init_from;  // weights (interop.h's init_from); "" = initialised from the seed
  bool init_from_partial = false;
  std::string data_path;  // token shards: a file, folder or glob; "" = the config's data.path
  std::string device = "auto";
  std::optional<int64_t> batch;      // > 0; unset: the config's training.batch
  std::optional<int64_t> seed;       // >= 0; unset: the config's training.seed
  int64_t max_batches = 0;           // 0 = every window (translation: every pair of the split)
  std::optional<std::string> split;  // translation: the corpus split (train | valid | test); unset: test
  std::string save_logits;           // a safetensors file for the first batch's input_ids, targets and logits
  bool quiet = false;
};

struct EvalResult {
  double loss = 0;                 // mean cross-entropy per target token, over every window evaluated
  double perplexity = 0;           // exp(loss); NaN for a model of images
  std::optional<double> accuracy;  // evaluate_dataset: the share of targets whose logit is the largest
  int64_t windows = 0, tokens = 0, batches = 0;
  std::string data;     // the files evaluated
  InitFromReport init;  // empty path when there was no --init-from
  // Translation: loss is the model's loss layer (label smoothing as configured) per target
  // piece; windows counts pairs; the BLEU of greedy translations and of copying the source.
  std::optional<BleuScore> bleu, copy_bleu;
};

// A language model on token shards.
EvalResult evaluate_lm(const EvalOptions& opt);
// An encoder-decoder on a split of its translation corpus (data.dataset "translation").
EvalResult evaluate_translation(const EvalOptions& opt);
// Any other model on the whole evaluation set of its config's data (images: their test
// set; text: its evaluation windows), in batches of --batch and one batch for the rest:
// loss (per image, or per target token of text) and accuracy (the targets its loss does not
// ignore). windows counts the samples.
EvalResult evaluate_dataset(const EvalOptions& opt);
// `remat predict`: an image classifier's classes (and logits) for images in a .npy file.
struct PredictOptions {
  std::string config;     // model config, or a run folder (its config.json and weights)
  std::string init_from;  // weights; "" = the run folder's, else initialised from the seed
  bool init_from_partial = false;
  std::string input;       // images: a .npy file (npy_images' rules)
  std::string out;         // "" or a .npy file for the classes, i32 [N]
  std::string logits_out;  // "" or a .npy file for the logits, f32 [N, classes]
  std::string device = "auto";
  std::optional<int64_t> batch;  // > 0; unset: the config's training.batch
  std::optional<int64_t> seed;   // >= 0; unset: the config's training.seed
  bool quiet = false;
};
struct Predictions {
  std::vector<int32_t> classes;  // per image, the class of the largest logit (the first of equals)
  Tensor logits;                 // f32 [N, classes] on the host
};
Predictions predict_images(PredictOptions opt);

// `remat eval`: a run folder's config and weights when `config` is a folder (its weights
// unless --init-from says otherwise), then by the config's data set: evaluate_translation,
// evaluate_lm (token shards, or --data), or evaluate_dataset.
EvalResult evaluate(EvalOptions opt);

}  // namespace remat
