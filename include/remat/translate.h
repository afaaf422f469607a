// `remat translate`: greedy decoding or beam search with a trained encoder-decoder (a
// translation run), scored with corpus BLEU against the references of a corpus split.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "remat/backend.h"
#include "remat/bleu.h"
#include "remat/graph.h"
#include "remat/params.h"

namespace remat {

// Greedy decoding: for each source (pieces, without </s>), the target pieces the model
// predicts one position at a time from <s>, each the arg max of the logits (the lowest id
// on ties), until </s> or the model's target length. `g` is the model at its batch size
// B; sources go B at a time (a short last batch is filled with copies of its first source
// and their outputs dropped). With `kv_cache` (and a model that allows it:
// IncrementalDecoder::unsupported), the encoder runs once a batch and each position runs
// the decoder on that position alone (remat/incremental.h); otherwise each position runs
// the whole model's forward in evaluation mode over the whole target.
std::vector<std::vector<int32_t>> greedy_decode(const Graph& g, ParamStore& params, Backend& be,
                                                const std::vector<std::vector<int32_t>>& sources, bool kv_cache = true);

// A decoded target: its pieces (no </s>) and its log-probability under the model, the sum
// over its pieces and the </s> that ended it (none when it ran to the target length).
struct Hypothesis {
  std::vector<int32_t> tokens;
  double log_prob = 0;
};

// Beam search with `beam` hypotheses per source (as fairseq's, but for the end): at each
// position every live hypothesis is extended by every piece; of the 2 beam best extensions
// by summed log-probability (ties: the earlier hypothesis, then the lower id), an
// extension by </s> among the first `beam` finishes, the others stay live until `beam` are;
// a source is done with `beam` finished ones. At the target length the live ones finish
// as they are, without a </s> (fairseq forces one and scores it). The result is the
// finished hypothesis with the best log_prob / length^length_penalty (length: pieces, plus
// one for the </s> when there is one). Each position runs the model once over B / beam
// sources' hypotheses (B: g's batch, at least `beam`), with a key/value cache as
// greedy_decode's whose rows follow their hypotheses. beam 1 picks what greedy_decode picks.
std::vector<Hypothesis> beam_decode(const Graph& g, ParamStore& params, Backend& be,
                                    const std::vector<std::vector<int32_t>>& sources, int64_t beam,
                                    double length_penalty = 1.0, bool kv_cache = true);

struct TranslateOptions {
  std::string run;             // a run folder: its config.json and checkpoint
  std::string split = "test";  // the corpus split translated and scored (train | valid | test)
  std::string input;           // instead: a file of source sentences, one a line ("-": stdin); not scored
  std::string output;          // where the translations go, one a line (written atomically); "": stdout
  std::string device = "auto";
  std::optional<int64_t> batch;  // sentences a batch; unset: the run's training.batch
  int64_t max_sentences = 0;     // 0: all
  int64_t beam = 1;              // 1: greedy; more: beam search (beam_decode)
  double length_penalty = 1.0;   // beam search: scores divided by length^length_penalty
  bool no_kv_cache = false;      // run the whole model at every position (greedy_decode's kv_cache off)
  bool quiet = false;
};

struct TranslateResult {
  std::vector<std::string> sources, hypotheses, references;  // references: a split only
  std::optional<BleuScore> bleu;                             // a split only
  std::optional<BleuScore> copy_bleu;  // a split only: the sources themselves as translations (a floor)
  int64_t too_long = 0;                // sources longer than the model's source length (cut to fit)
  double seconds = 0;
};

TranslateResult translate(const TranslateOptions& o);

}  // namespace remat
