// Incremental decoding with a key/value cache (docs/translation.md, "Decoding"): the layers
// of a model that do not read its target input run once per batch of sources; then each
// step runs the layers that do on one target position, causal self-attention adding that
// position's keys and values to a cache and attending over the positions so far
// (Layer::step_run). A step costs one position's work instead of the whole target's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "remat/backend.h"
#include "remat/data.h"
#include "remat/graph.h"
#include "remat/params.h"

namespace remat {

class IncrementalDecoder {
 public:
  // Why `g` cannot be decoded one target position at a time ("" when it can): it has no
  // input named `target`, or a layer that reads the target (through other layers) cannot
  // run on one position (Layer::step_run: rope, convolutions, reshapes, non-causal
  // self-attention), or a position-wise layer also reads a sequence that is not
  // computed from the target (cross-attention aside).
  static std::string unsupported(const Graph& g, const std::string& target);

  // `g`: the model at batch B; `target`: the name of its target-token input [B, T].
  IncrementalDecoder(const Graph& g, ParamStore& params, Backend& be, const std::string& target);

  // A new batch: every input of the model but the target (and those only the loss reads),
  // on the device. Runs the layers that do not read the target and empties the caches.
  void start(const Batch& inputs);
  // The logits [B, 1, V] of target position `position` (0, 1, 2, ... in turn, below T),
  // given the tokens at that position, i32 [B, 1] on the device.
  Tensor step(const Tensor& tokens, int64_t position);
  // Beam search: row r continues the hypothesis of row from[r] (size B), caches included.
  void reorder(const std::vector<int64_t>& from);

 private:
  const Graph& g_;
  ParamStore& params_;
  Backend& be_;
  int target_ = -1;
  std::vector<bool> needed_;    // per layer: the logits depend on it
  std::vector<bool> dynamic_;   // per layer: reads the target
  std::vector<Tensor> static_;  // per layer: outputs of static layers that dynamic ones read
  std::vector<Tensor> caches_;  // per layer: the key/value cache of cached attention
  std::vector<int> last_read_;  // per layer: the last dynamic layer reading it in a step
  int64_t next_position_ = 0;
};

}  // namespace remat
