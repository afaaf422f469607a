// The dynamic program over a chain of differing units (remat/chain_planner.h).
#include "remat/chain_planner.h"

#include <algorithm>
#include <map>
#include <string>

#include "remat/error.h"

namespace remat {

namespace {

// What one calibration step held at most in each phase of each unit, above its base.
struct PhaseMaxima {
  std::vector<int64_t> forward, recompute, backward;  // per item
  int64_t after_units = 0, outside = 0;
  std::vector<int64_t> saved;       // per item: its forward allocations still held when forward ends
  std::vector<double> rerun_flops;  // per item: the forward FLOPs its layers re-run
};

// The chain's items (UnitChainModel): per item its layer range, and whether it is a gap.
struct Item {
  int begin = 0, end = 0;
  bool gap = false;
};

std::vector<Item> chain_items(const std::vector<Segment>& units) {
  std::vector<Item> items;
  for (size_t u = 0; u < units.size(); ++u) {
    if (u > 0 && units[u - 1].end < units[u].begin) items.push_back({units[u - 1].end, units[u].begin, true});
    items.push_back({units[u].begin, units[u].end, false});
  }
  return items;
}

PhaseMaxima measure(const Config& cfg, const Graph& g, const std::vector<Item>& items, const CheckpointPlan& plan,
                    Backend* ws) {
  const StepProfile p = profile_step(cfg, g, plan, Device::meta(), /*keep_events=*/true, ws);
  const auto n = items.size();
  std::vector<int> unit_of(static_cast<size_t>(g.size()), -1);  // item; -1: before the items, -2: after
  for (size_t u = 0; u < n; ++u)
    for (int i = items[u].begin; i < items[u].end; ++i) unit_of[static_cast<size_t>(i)] = static_cast<int>(u);
  for (int i = items.back().end; i < g.size(); ++i) unit_of[static_cast<size_t>(i)] = -2;
  PhaseMaxima m;
  m.forward.assign(n, 0);
  m.recompute.assign(n, 0);
  m.backward.assign(n, 0);
  m.saved.assign(n, 0);
  m.rerun_flops.assign(n, 0.0);
  auto live = [&](size_t e) { return p.events[e].allocated_after - p.base_bytes; };
  // Each span's phase holds its own events and those up to the next span's (the executor
  // frees between layers); the events before the first span (parameters, the batch) and
  // after the last (the optimizer's update) count as outside every unit.
  for (size_t k = 0; k < p.spans.size(); ++k) {
    const LayerSpan& sp = p.spans[k];
    const uint64_t end = k + 1 < p.spans.size() ? p.spans[k + 1].begin : sp.end;
    int64_t most = sp.begin > 0 ? live(sp.begin - 1) : 0;  // what the phase starts with
    for (uint64_t e = sp.begin; e < end; ++e) most = std::max(most, live(e));
    const int u = unit_of[static_cast<size_t>(sp.layer)];
    int64_t* slot = &m.outside;
    if (u == -2) {
      slot = &m.after_units;
    } else if (u >= 0) {
      auto& v = sp.phase == Phase::forward ? m.forward : sp.phase == Phase::recompute ? m.recompute : m.backward;
      slot = &v[static_cast<size_t>(u)];
    }
    *slot = std::max(*slot, most);
  }
  const uint64_t first = p.spans.empty() ? p.events.size() : p.spans.front().begin;
  const uint64_t last = p.spans.empty() ? p.events.size() : p.spans.back().end;
  for (size_t e = 0; e < p.events.size(); ++e)
    if (e < first || e >= last) m.outside = std::max(m.outside, live(e));
  std::map<std::string, int64_t> saved;
  for (const LayerProfile& l : p.layers) saved[l.name] = l.saved_bytes;
  for (size_t u = 0; u < n; ++u)
    for (int i = items[u].begin; i < items[u].end; ++i) {
      m.saved[u] += saved[g.layer(i).name];
      if (plan.rerun[static_cast<size_t>(i)]) m.rerun_flops[u] += g.layer(i).forward_flops();
    }
  return m;
}

// Sum of v[begin, end).
int64_t sum(const std::vector<int64_t>& v, size_t begin, size_t end) {
  int64_t s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s;
}

// The modelled peak of a block of units [i, j) whose backward starts with `kept_before`
// bytes kept by the units before it: one unit kept (mode 0), one selective (1), or a
// recompute segment (2). The block's kept bytes and recompute FLOPs come with it.
struct ChainBlock {
  int64_t peak = 0, kept = 0;
  double flops = 0.0;
};

// The recompute segments [i, i + 1), ..., [i, end), built up unit by unit.
std::vector<ChainBlock> segments_from(const UnitChainModel& m, size_t i, size_t end) {
  std::vector<ChainBlock> out;
  int64_t rebuilt = 0;  // the segment's units before v, rebuilt when v's recompute or backward runs
  int64_t forward = 0, recompute = 0, backward = 0;  // over the units before v, as inner units
  double flops = 0.0;                                // of the units before v, as inner units
  for (size_t v = i; v < end; ++v) {
    backward = std::max(backward, rebuilt + m.keep_bytes[v] + m.backward[v]);
    ChainBlock b;  // [i, v + 1): v is the last unit
    b.kept = m.boundary_bytes[v];
    b.peak =
        std::max({forward, m.forward_last[v], b.kept + std::max(recompute, rebuilt + m.recompute_last[v]), backward});
    b.flops = flops + m.last_flops[v];
    out.push_back(b);
    forward = std::max(forward, m.forward_inner[v]);
    recompute = std::max(recompute, rebuilt + m.recompute_inner[v]);
    flops += m.inner_flops[v];
    rebuilt += m.keep_bytes[v];
  }
  return out;
}

ChainBlock block_of(const UnitChainModel& m, size_t i, size_t j, int mode) {
  ChainBlock b;
  if (mode == 0) {
    b.kept = m.keep_bytes[i];
    b.peak = std::max(m.forward_keep[i], m.keep_bytes[i] + m.backward[i]);
  } else if (mode == 1) {
    b.kept = m.selective_bytes[i];
    b.peak = std::max(
        {m.forward_selective[i], m.selective_bytes[i] + m.recompute_selective[i], m.keep_bytes[i] + m.backward[i]});
    b.flops = m.selective_flops[i];
  } else {
    b = segments_from(m, i, j).back();
  }
  return b;
}

}  // namespace

UnitChainModel measure_unit_chain(const Config& cfg, const Graph& g, Backend* ws) {
  const std::vector<Segment> units = plan_units(g);
  REMAT_CHECK(!units.empty(), "the chain planner needs a model with at least one unit");
  const std::vector<Item> items = chain_items(units);
  const size_t n = items.size();
  UnitChainModel m;
  for (size_t k = 0; k < n; ++k) {
    m.gap.push_back(items[k].gap);
    if (!items[k].gap) m.unit_item.push_back(static_cast<int>(k));
  }
  // The four calibration steps; in the last, each run of touching units one segment.
  const std::vector<UnitModeSpec> one_segment(units.size(), UnitModeSpec{2, 0});
  const PhaseMaxima none = measure(cfg, g, items, make_plan(g, "none"), ws);
  const PhaseMaxima sel = measure(cfg, g, items, make_plan(g, "selective"), ws);
  const PhaseMaxima all = measure(cfg, g, items, make_plan(g, "all"), ws);
  const PhaseMaxima one = measure(cfg, g, items, plan_from_unit_modes(g, "runs", one_segment), ws);
  m.keep_bytes = none.saved;
  m.selective_bytes = sel.saved;
  m.boundary_bytes = all.saved;
  for (auto* v : {&m.forward_keep, &m.forward_selective, &m.forward_last, &m.forward_inner, &m.recompute_selective,
                  &m.recompute_last, &m.recompute_inner, &m.backward})
    v->resize(n);
  int64_t rebuilt = 0;  // in `one`: the run's units before u, rebuilt by its recompute
  for (size_t u = 0; u < n; ++u) {
    m.forward_keep[u] = none.forward[u] - sum(m.keep_bytes, 0, u);
    m.backward[u] = none.backward[u] - sum(m.keep_bytes, 0, u + 1);
    m.forward_selective[u] = sel.forward[u] - sum(m.selective_bytes, 0, u);
    m.recompute_selective[u] = sel.recompute[u] - sum(m.selective_bytes, 0, u + 1);
    m.forward_last[u] = all.forward[u] - sum(m.boundary_bytes, 0, u);
    m.recompute_last[u] = all.recompute[u] - sum(m.boundary_bytes, 0, u + 1);
    // Each run one segment: what the items before the run keep, its last unit's boundary
    // and the run's units before u rebuilt while u's recompute runs.
    size_t run_end = u;  // the run's last item
    while (run_end + 1 < n && !items[run_end + 1].gap && !items[u].gap) ++run_end;
    if (u == 0 || items[u - 1].gap || items[u].gap) rebuilt = 0;
    m.forward_inner[u] = one.forward[u] - sum(one.saved, 0, u);
    m.recompute_inner[u] = one.recompute[u] - sum(one.saved, 0, u) - one.saved[run_end] - rebuilt;
    rebuilt += m.keep_bytes[u];
  }
  m.after_units = none.after_units - sum(m.keep_bytes, 0, n);
  m.outside = std::max({none.outside, sel.outside, all.outside, one.outside});
  m.selective_flops = sel.rerun_flops;
  m.last_flops = all.rerun_flops;
  m.inner_flops = one.rerun_flops;
  return m;
}

namespace {

// Per item, its mode and segment group: the units' as given, the gaps kept.
std::vector<UnitModeSpec> item_modes(const UnitChainModel& m, const std::vector<UnitModeSpec>& modes) {
  REMAT_CHECK(static_cast<int>(modes.size()) == m.units(), "chain planner: ", modes.size(), " modes for ", m.units(),
              " units");
  std::vector<UnitModeSpec> out(m.items(), UnitModeSpec{0, 0});
  for (size_t u = 0; u < modes.size(); ++u) out[static_cast<size_t>(m.unit_item[u])] = modes[u];
  return out;
}

// Calls f(i, j, mode) for each block [i, j) of items: a unit or gap kept (0), a unit
// selective (1), or a segment of touching units of one group recomputed (2).
template <typename F>
void for_each_block(const UnitChainModel& m, const std::vector<UnitModeSpec>& modes, F f) {
  for (size_t i = 0; i < modes.size();) {
    size_t j = i + 1;
    if (modes[i].mode == 2)
      while (j < modes.size() && !m.gap[j] && modes[j].mode == 2 && modes[j].group == modes[i].group) ++j;
    f(i, j, modes[i].mode);
    i = j;
  }
}

}  // namespace

int64_t modelled_peak(const UnitChainModel& m, const std::vector<UnitModeSpec>& modes) {
  int64_t kept = 0, in_flight = 0, peak = m.outside;
  for_each_block(m, item_modes(m, modes), [&](size_t i, size_t j, int mode) {
    const ChainBlock b = block_of(m, i, j, mode);
    peak = std::max(peak, kept + in_flight + b.peak);
    const bool offloaded = j <= m.offloaded_items;  // as in cheapest_unit_modes
    kept += offloaded ? 0 : b.kept;
    in_flight = offloaded ? b.kept : 0;
  });
  return std::max(peak, kept + m.after_units);
}

double modelled_recompute_flops(const UnitChainModel& m, const std::vector<UnitModeSpec>& modes) {
  double flops = 0.0;
  for_each_block(m, item_modes(m, modes),
                 [&](size_t i, size_t j, int mode) { flops += block_of(m, i, j, mode).flops; });
  return flops;
}

std::optional<std::vector<UnitModeSpec>> cheapest_unit_modes(const UnitChainModel& m, int64_t budget, int max_segment) {
  const size_t n = m.items();
  if (m.outside > budget) return std::nullopt;
  const size_t longest = max_segment > 0 ? static_cast<size_t>(max_segment) : n;
  // At each unit boundary, the undominated ways to reach it: bytes kept by the units before
  // (ascending) and the recompute FLOPs spent (descending), each with how it was reached.
  struct State {
    int64_t kept = 0;
    int64_t in_flight = 0;  // an offloaded block's kept bytes, still on the device for the next block
    double flops = 0.0;
    size_t from = 0, from_state = 0;  // the boundary and state it extends
    int mode = 0;                     // of the block [from, here)
  };
  // Sorts by kept bytes and keeps each state that spends less than every state keeping
  // fewer bytes. Within an offloaded prefix, a state is dropped only where one that keeps
  // no more, has no more in flight and spends no more comes before it.
  auto prune = [](std::vector<State>& v) {
    std::sort(v.begin(), v.end(), [](const State& a, const State& b) {
      return a.kept != b.kept             ? a.kept < b.kept
             : a.in_flight != b.in_flight ? a.in_flight < b.in_flight
                                          : a.flops < b.flops;
    });
    size_t out = 0;
    const bool any_in_flight = std::any_of(v.begin(), v.end(), [](const State& x) { return x.in_flight > 0; });
    for (size_t k = 0; k < v.size(); ++k) {
      bool dominated = false;
      if (!any_in_flight)
        dominated = out > 0 && v[out - 1].flops <= v[k].flops;  // the last kept spends least so far
      else
        for (size_t q = 0; q < out && !dominated; ++q)
          dominated = v[q].in_flight <= v[k].in_flight && v[q].flops <= v[k].flops;
      if (!dominated) v[out++] = v[k];
    }
    v.resize(out);
  };
  constexpr size_t kMaxStates = 2048;
  std::vector<std::vector<State>> at(n + 1), pending(n + 1);
  pending[0].push_back({});
  for (size_t i = 0; i < n; ++i) {
    prune(pending[i]);
    at[i] = std::move(pending[i]);
    pending[i] = {};
    // On long chains the undominated states can number in the thousands at every
    // boundary: past kMaxStates, one per 1/kMaxStates of their range of kept bytes (the
    // cheapest there, which keeps the most of them), so the plan stays within the budget
    // and near the optimum.
    if (at[i].size() > kMaxStates) {
      std::vector<State> thin;
      const int64_t step =
          std::max<int64_t>(1, (at[i].back().kept - at[i].front().kept) / static_cast<int64_t>(kMaxStates) + 1);
      for (size_t k = 0; k < at[i].size(); ++k)
        if (k + 1 == at[i].size() || at[i][k].kept / step != at[i][k + 1].kept / step) thin.push_back(at[i][k]);
      at[i] = std::move(thin);
    }
    // The blocks that start here: item i kept, or unit i selective, or a segment [i, j)
    // of touching units.
    std::vector<std::pair<size_t, ChainBlock>> blocks;
    blocks.push_back({i + 1, block_of(m, i, i + 1, 0)});
    if (!m.gap[i]) {
      blocks.push_back({i + 1, block_of(m, i, i + 1, 1)});
      size_t end = i + 1;
      while (end < std::min(n, i + longest) && !m.gap[end]) ++end;
      const std::vector<ChainBlock> segs = segments_from(m, i, end);
      for (size_t k = 0; k < segs.size(); ++k) blocks.push_back({i + k + 1, segs[k]});
    }
    for (size_t k = 0; k < at[i].size(); ++k) {
      const State& s = at[i][k];
      for (size_t b = 0; b < blocks.size(); ++b) {
        const auto& [j, blk] = blocks[b];
        // Kept bytes only grow, and the layers after the units see all of them.
        // A block in the offloaded prefix hands its kept bytes to the host: they stay on the
        // device while the next block's forward runs (the copy out) and its backward (the
        // copy back, one unit ahead), and leave the running total.
        const bool offloaded = j <= m.offloaded_items;
        const int64_t kept = s.kept + (offloaded ? 0 : blk.kept);
        if (s.kept + s.in_flight + blk.peak > budget || kept + m.after_units > budget) continue;
        pending[j].push_back(
            {kept, offloaded ? blk.kept : 0, s.flops + blk.flops, i, k, b < 2 ? static_cast<int>(b) : 2});
        if (pending[j].size() >= 4 * kMaxStates) prune(pending[j]);
      }
    }
  }
  // The end: the layers after the units see every unit's kept bytes.
  const State* best = nullptr;
  for (const State& s : pending[n])
    if (s.kept + m.after_units <= budget &&
        (!best || s.flops < best->flops || (s.flops == best->flops && s.kept < best->kept)))
      best = &s;
  if (!best) return std::nullopt;
  std::vector<UnitModeSpec> modes(n);  // per item
  State s = *best;
  size_t here = n;
  int group = 0;
  while (true) {
    for (size_t u = s.from; u < here; ++u) modes[u] = {s.mode, s.mode == 2 ? group : 0};
    ++group;
    here = s.from;
    if (here == 0) break;
    s = at[here][s.from_state];
  }
  std::vector<UnitModeSpec> out;
  for (int k : m.unit_item) out.push_back(modes[static_cast<size_t>(k)]);
  return out;
}

}  // namespace remat
