// Checkpoint plans: which layers' products a step keeps from forward to backward and which
// it recomputes, segment by segment (docs/checkpointing.md). The executor (remat/executor.h)
// runs them.
#pragma once

#include <string>
#include <vector>

#include "remat/graph.h"

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

}  // namespace remat
