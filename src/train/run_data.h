// The data of a training run, as its config asks: training and evaluation sets, images
// or text, and the batches the trainer draws from them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "remat/config.h"
#include "remat/data.h"
#include "remat/graph.h"
#include "remat/token_shards.h"
#include "remat/translation.h"

namespace remat {

struct RunData {
  bool text = false;
  bool shards = false;  // text as token shards (train_shards, eval_shards), not train_text
  // Pairs of a translation corpus (train; valid evaluates): the model's inputs src, src_len,
  // tgt and targets, fitted to its lengths (seq_len: the target's).
  std::shared_ptr<TranslationData> translation;
  ImageDataset train_images, eval_images;
  TextDataset train_text, eval_text;
  TokenShards train_shards, eval_shards;
  int64_t vocab = 0;     // shards: the model's vocabulary, which every token is checked against
  std::string describe;  // shards: which files train and evaluate
  int64_t seq_len = 0;
  double hflip = 0.0;  // data.augment.hflip: training images only
  uint64_t seed = 0;   // the run's seed, which the flips are drawn from
  int64_t train_size() const {
    if (translation) return translation->train.size();
    if (shards) return train_shards.windows(seq_len);
    return text ? text_windows(train_text, seq_len) : train_images.labels.numel();
  }
  int64_t eval_size() const {
    if (translation) return translation->valid.size();
    if (shards) return eval_shards.windows(seq_len);
    return text ? text_windows(eval_text, seq_len) : eval_images.labels.numel();
  }
  // Translation with data.length_buckets: the buckets below the model's lengths, ascending
  // (fit_data_to_model checks them); empty without.
  std::vector<int64_t> length_buckets;
  // Translation: per training pair, the length it needs (its source and </s>, or <s> and
  // its target, the longer), what the sampler groups batches by; empty for other data.
  std::vector<int64_t> train_lengths() const;
  // The smallest length bucket every pair of idx fits, or 0 (the model's lengths: no bucket
  // holds them all, or there are no buckets).
  int64_t bucket_length(const std::vector<int64_t>& idx) const;
  // A training batch of the sampler's epoch `epoch`, augmented as the config asks; a
  // translation batch cut to `length` (bucket_length's; 0: the model's lengths).
  Batch train_batch(const std::vector<int64_t>& idx, int64_t epoch, Device d, int64_t length = 0) const;
  Batch eval_batch(const std::vector<int64_t>& idx, Device d) const;  // never augmented

 private:
  // Sample i is image i, or the text window starting at token i * seq_len.
  Batch batch(const ImageDataset& images, const TextDataset& txt, const std::vector<int64_t>& idx, Device d,
              const std::vector<uint8_t>& flips) const;
};

// Loads the data sets of `cfg` (checked against the model's input: images or tokens).
RunData load_run_data(const Config& cfg, const nlohmann::json& model);

// Checks that the data gives what model `g` takes, before any step: the built-in data sets
// feed the model inputs "input" and "targets" (images of the data's [C, H, W] and their
// labels, below the loss's classes; or token windows and their next tokens), and the
// model declares no other input; a translation corpus feeds "src" [B, S], "src_len" [B],
// "tgt" and "targets" [B, T] (its pairs are fitted to S and T), with a loss that ignores
// <pad> (0) and logits of the tokenizer's vocabulary. Sets the text windows' length (seq_len) and the shards'
// vocabulary from the model. Errors name the config, the input and both shapes.
void fit_data_to_model(RunData& data, const Graph& g, const Config& cfg);

}  // namespace remat
