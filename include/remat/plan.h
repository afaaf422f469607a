// Checkpoint plans: which layers' products a step keeps from forward to backward and which
// it recomputes, segment by segment (docs/checkpointing.md). The executor (remat/executor.h)
// runs them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "remat/graph.h"

namespace remat {

struct Segment {
  int begin = 0;  // layer ids [begin, end)
  int end = 0;
  bool recompute = false;  // some layer of it is recomputed
};

// A nest: a range of recompute segments that backward rebuilds in stages (nested
// recompute: Chen et al. 2016, Griewank and Walther's Revolve). Forward keeps none of its
// layers but what later nests or segments read. When backward reaches the nest, one
// forward run over every child but the last (its *advance*) keeps only the children's
// boundaries (sub-checkpoints); then each child, last first, is rebuilt the same way:
// a child nest by its own advance, a child segment by its ordinary recompute. Nests are
// laminar; each holds at least two children (nests or segments), every one of them a
// recompute segment or a nest.
struct Nest {
  Nest() = default;
  Nest(int b, int e) : begin(b), end(e) {}
  int begin = 0;  // layer ids [begin, end)
  int end = 0;
  int parent = -1;           // the enclosing nest, -1 at the top
  int last_child_begin = 0;  // the advance runs [begin, last_child_begin)
  std::vector<int> advance;  // layers the advance runs (their outputs are not live then)
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
  std::vector<Nest> nests;  // empty: one level of segments
  // Per layer whose output is kept: -1 when forward keeps it, else the nest whose advance
  // keeps it (a sub-checkpoint: forward drops it).
  std::vector<int> kept_by;
  std::vector<int> nest_of;  // per segment: the innermost nest holding it, -1 if none
  // Activation offload (docs/checkpointing.md, "Offload"). Per layer: the products forward
  // keeps (its output, and its extras where kept) wait in pinned host memory between their
  // last forward reader and backward: copied out right after the layer's forward, copied
  // back (prefetched) when backward reaches prefetch_at[layer], ahead of need_at[layer],
  // the first backward step that reads them (its own backward, a reader's, or the
  // recompute or advance that re-runs a reader). Empty: nothing offloaded.
  std::vector<bool> offload;
  std::vector<int> prefetch_at;  // per layer; -1 where not offloaded
  std::vector<int> need_at;      // per layer; -1 where not offloaded
  bool offloads() const;

  int recomputed_layers() const;  // layer forwards re-run in each backward (advances included)
  std::string describe(const Graph& g) const;
  // One character per unit (plan_units), in forward order: '.' keeps all it makes, 's'
  // keeps some of it (selective), 'R' keeps at most its output (recomputed), 'N' in a nest;
  // '|' between two recompute segments that touch, ' ' between units that do not touch.
  std::string unit_layout(const Graph& g) const;
};

// Policies: none, all, every:K, sqrt, revolve:S, selective, manual, each optionally
// followed by "+offload" or "+offload:J" (see docs/checkpointing.md).
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
// keep_extras empty: each layer keeps its extras as it keeps its output. `nests` (their
// begin, end and parent; the rest is filled in) group recompute segments for nested
// recompute; a tensor read across a segment boundary inside a nest is kept from the
// advance of the innermost nest that holds it and its readers.
CheckpointPlan make_plan_from_segments(const Graph& g, const std::string& name, const std::vector<Segment>& segments,
                                       const std::vector<bool>& keep, const std::vector<bool>& keep_extras = {},
                                       std::vector<Nest> nests = {});

// The units offload counts: plan_units, or in a model of fewer than two, every layer but
// the inputs and the loss. Offload covers a prefix of them, never the last.
std::vector<Segment> offload_units(const Graph& g);

// Marks for offload every product the plan keeps from forward to backward in the first
// `units` offload units (and the layers before the first unit), except views (their bytes
// are another tensor's) and the tensors kept views read; sets prefetch_at one unit ahead of
// need_at. `units` -1: every offload unit but the last; otherwise 1 .. offload_units - 1.
// Appends "+offload" (units -1) or "+offload:J" to the policy name.
void add_offload(const Graph& g, CheckpointPlan& p, int units = -1);

// A policy's offload suffix: "P+offload" (every unit but the last) or "P+offload:J" (the
// first J units). `offload` false: no suffix, `base` the whole policy.
struct OffloadSuffix {
  std::string base;
  bool offload = false;
  int units = -1;  // J, or -1 for every unit but the last
};
OffloadSuffix split_offload_suffix(const std::string& policy);

// Revolve (Griewank and Walther 2000): the fewest unit forwards re-run in backward to
// train a chain of `n` equal units holding at most `slots` unit boundaries at a time (the
// chain's input counts as one; the units' own products are not counted), and the split
// that reaches it: advance `first` units, keep that boundary, reverse the rest with one
// slot less, then the first part. INT64_MAX where no schedule exists (slots 0, n > 1).
struct RevolveCost {
  int64_t reruns = 0;
  int first = 0;
};
// The table for chain lengths 0..n and slots 0..s: [length][slots].
std::vector<std::vector<RevolveCost>> revolve_table(int n, int s);

}  // namespace remat
