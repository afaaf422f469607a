// The budget planner's dynamic program over a chain of units that differ (rotor's
// heterogeneous chains: Beaumont et al. 2019), for the plans of one mode per unit: keep,
// selective, or recompute in full within a segment of consecutive units
// (docs/memory.md, "Chains whose units differ").
//
// Four exact simulations on meta (none, selective, all, one segment over each run of
// touching units) measure, per unit, what each mode keeps from forward to backward and
// what the unit holds above that while its forward, recompute and backward run. A plan's
// peak is then the largest of those phases, each what the units before keep plus what the
// phase holds, and its recompute FLOPs a sum over units: the program finds the cheapest
// plan of the modelled peaks under a budget in O(n * L * P) (L the longest segment tried,
// P the undominated (kept bytes, FLOPs) pairs per unit boundary). The planner simulates what it
// returns; tests/test_profile.cpp checks the model against exact simulation of every plan
// of small chains and the planner against brute force.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "remat/config.h"
#include "remat/graph.h"
#include "remat/profile.h"

namespace remat {

struct UnitChainModel {
  // The chain's items in forward order: its units, and between two units that do not
  // touch, the layers between them as one item that every plan keeps (e.g. an encoder's
  // last norm, read by every decoder block). A recompute segment spans touching units only.
  std::vector<int> unit_item;  // per unit, its item
  std::vector<bool> gap;       // per item: layers between units (always kept)
  // Per item, the bytes kept from its forward to backward: everything its backward reads
  // (keep), what selective keeps, its boundary (the output the next item reads; recompute).
  std::vector<int64_t> keep_bytes, selective_bytes, boundary_bytes;
  // Per item, what its phases hold above the items kept before it (and, in a phase of a
  // recompute, the units rebuilt before it), calibrated on the four simulations.
  std::vector<int64_t> forward_keep, forward_selective, forward_last, forward_inner;
  std::vector<int64_t> recompute_selective, recompute_last, recompute_inner, backward;
  // The leading items whose kept bytes wait in host memory between forward and backward
  // (the plan offloads its first units, add_offload): a block of them holds its kept bytes
  // on the device through the next block's phases (the copy out during its forward, the
  // copy back ahead of its own backward) and adds nothing to what the device holds for the
  // blocks after that. A model, not exact: a product the next unit's backward reads comes
  // back two units ahead, and host bytes and copy time are not weighed (within the prefix
  // the least recompute wins); the planner simulates what the program returns, runs it
  // again under the budget less any excess, and cuts offload back. 0 without offload.
  size_t offloaded_items = 0;
  int64_t after_units = 0;  // the layers after the units (head, loss) over every item's kept bytes
  int64_t outside = 0;      // everything else (layers before the units, optimizer): plan-independent
  // Per item, the forward FLOPs re-run: selective, in full at a segment's end, in full
  // inside a segment (its output then rebuilt too).
  std::vector<double> selective_flops, last_flops, inner_flops;
  int units() const { return static_cast<int>(unit_item.size()); }
  size_t items() const { return gap.size(); }
};

// Measures the model of g's units (at least one unit). `workspace_model` as for
// profile_step.
UnitChainModel measure_unit_chain(const Config& cfg, const Graph& g, Backend* workspace_model = nullptr);

// The modelled peak (above the step's base, as StepProfile::peak_bytes) and recompute
// FLOPs of a plan of one mode per unit (plan_from_unit_modes' modes).
int64_t modelled_peak(const UnitChainModel& m, const std::vector<UnitModeSpec>& modes);
double modelled_recompute_flops(const UnitChainModel& m, const std::vector<UnitModeSpec>& modes);

// The unit modes of least modelled recompute FLOPs whose modelled peak is at most
// `budget` (ties: the lower peak); nullopt where none is. Segments hold at most
// `max_segment` units (0: any number).
std::optional<std::vector<UnitModeSpec>> cheapest_unit_modes(const UnitChainModel& m, int64_t budget,
                                                             int max_segment = 0);

}  // namespace remat
