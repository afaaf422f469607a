// A step's schedule: a CheckpointPlan compiled to the explicit list of instructions the
// executor interprets (docs/checkpointing.md, "The schedule"). Forward runs, frees,
// offloads and their waits, recomputes (a segment's re-runs, or a nest's advance that keeps
// sub-checkpoints), prefetches and their waits, backward runs, in the order they happen.
// Every policy compiles to one; `remat memprof --schedule` prints it. The executor decides
// nothing the schedule does not say but whether a layer gets a gradient at all (a layer no
// loss path reaches runs no backward).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "remat/graph.h"
#include "remat/plan.h"

namespace remat {

enum class Step : uint8_t {
  forward,        // run the layer's forward; flag: training (draws its random range), else evaluation
  recompute,      // re-run the layer's forward in backward with its forward's random range;
                  // flag: for its extras only (its output is kept); nest >= 0: that nest's advance
  backward,       // the layer's backward, if its output has a gradient (the loss always)
  drop_extras,    // free the layer's extras; flag: hash them first (--verify-recompute)
  free,           // free the layer's output; flag: hash it first (--verify-recompute)
  offload,        // copy the layer's kept products to the pinned host pool (copy stream): its
                  // extras where kept; flag: its output too (it outlives forward)
  offload_wait,   // compute waits for that copy; the device products go
  prefetch,       // copy the products back into fresh device blocks (copy stream)
  prefetch_wait,  // compute waits for the copy back
  grads_final,    // parameters whose gradients are final after this layer's backward
};
const char* step_name(Step s);

struct Instr {
  Step op = Step::forward;
  int layer = 0;
  bool flag = false;
  int nest = -1;  // recompute: the nest whose advance re-runs the layer, -1 a segment's recompute
};

struct Schedule {
  std::string policy;
  std::vector<Instr> forward;   // a training step's forward
  std::vector<Instr> backward;  // its backward, recomputes and prefetches included
  std::vector<Instr> evaluate;  // forward in evaluation mode (no plan: frees after last reader)
  // Per layer: the parameters (indices into Graph::params) whose gradients are final after
  // its backward (the first layer in graph order that uses them).
  std::vector<std::vector<int>> grads_final;

  int64_t recomputed_layers() const;  // recompute instructions in backward
  // One instruction a line, numbered, under "forward", "backward" and "evaluate" headings;
  // `with_evaluate` false leaves the evaluation program out.
  std::string listing(const Graph& g, bool with_evaluate = false) const;
};

// The plan's schedule. Throws (naming the plan) where the plan does not fit the graph.
Schedule compile_schedule(const Graph& g, const CheckpointPlan& plan);

// Runs the schedule's liveness on the graph alone, independently of how it was compiled:
// every read (forward, recompute and backward inputs, backward's own output and extras) is
// of a live product, offloaded products are read only on the device side of their trips,
// each layer runs forward once and backward once in reverse order, and the step ends with
// nothing live but the inputs. Returns the first violation, "" when there is none.
std::string check_schedule(const Graph& g, const Schedule& s);

}  // namespace remat
