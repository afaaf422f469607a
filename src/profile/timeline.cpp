// The detail of one profiled step that the HTML page draws (and --json carries): bytes live
// by series over the step's events, merged down to screen resolution with the peak kept
// exact; the tensors live at the peak; what each layer recomputes.
#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "remat/error.h"
#include "remat/profile.h"

namespace remat {

const std::vector<std::string>& timeline_series() {
  // The memory categories, with activations split into those the forward pass made (kept
  // or freed) and those a recompute made.
  static const std::vector<std::string> s{"parameter",  "gradient",  "optimizer_state", "activation",
                                          "recomputed", "workspace", "temporary",       "input"};
  return s;
}

namespace {

int series_of(const MemoryEvent& e) {
  switch (e.category) {
    case MemoryCategory::parameter: return 0;
    case MemoryCategory::gradient: return 1;
    case MemoryCategory::optimizer_state: return 2;
    case MemoryCategory::activation: return e.phase == Phase::recompute ? 4 : 3;
    case MemoryCategory::workspace: return 5;
    case MemoryCategory::temporary: return 6;
    case MemoryCategory::input: return 7;
  }
  return 6;
}

bool is_alloc_or_free(const MemoryEvent& e) {
  return e.kind == MemoryEvent::Kind::alloc || e.kind == MemoryEvent::Kind::free;
}

struct Tensor_ {
  uint64_t id = 0;
  int64_t begin = 0, end = -1;  // alloc/free event indices (end -1: live at the end)
  int64_t bytes = 0;
  int series = 0;
  Phase phase = Phase::setup;
  uint32_t owner = 0, shape = 0;
};

}  // namespace

nlohmann::json step_timeline_json(const StepProfile& p, size_t max_points, size_t top_k) {
  const auto& series = timeline_series();
  const size_t ns = series.size();
  // alloc/free events only, indexed 0..n-1; seq -> index for the layer spans
  std::vector<const MemoryEvent*> ev;
  for (const auto& e : p.events)
    if (is_alloc_or_free(e)) ev.push_back(&e);
  const size_t n = ev.size();
  auto index_of_seq = [&](uint64_t seq) {  // number of alloc/free events before seq
    return static_cast<int64_t>(
        std::lower_bound(ev.begin(), ev.end(), seq, [](const MemoryEvent* e, uint64_t s) { return e->seq < s; }) -
        ev.begin());
  };

  // Tensors, and the running totals after every event.
  std::vector<Tensor_> tensors;
  std::unordered_map<uint64_t, size_t> by_id;
  std::vector<int64_t> total(n, 0);
  std::vector<int64_t> cur(ns, 0);
  int64_t run = 0, peak = -1;
  size_t peak_at = 0;
  for (size_t i = 0; i < n; ++i) {
    const MemoryEvent& e = *ev[i];
    if (e.kind == MemoryEvent::Kind::alloc) {
      Tensor_ t;
      t.id = e.alloc_id;
      t.begin = static_cast<int64_t>(i);
      t.bytes = e.bytes;
      t.series = series_of(e);
      t.phase = e.phase;
      t.owner = e.owner;
      t.shape = e.shape;
      by_id[e.alloc_id] = tensors.size();
      tensors.push_back(t);
      cur[static_cast<size_t>(t.series)] += e.bytes;
      run += e.bytes;
    } else {
      auto it = by_id.find(e.alloc_id);
      if (it == by_id.end()) continue;  // allocated before the step
      Tensor_& t = tensors[it->second];
      t.end = static_cast<int64_t>(i);
      cur[static_cast<size_t>(t.series)] -= t.bytes;
      run -= t.bytes;
    }
    total[i] = run;
    if (run > peak) {
      peak = run;
      peak_at = i;
    }
  }

  // The points drawn: per bucket of events, the one with the most bytes live (the first
  // such), so that no spike disappears; the global peak is one of them.
  std::vector<size_t> pts;
  const size_t bucket = std::max<size_t>(1, (n + max_points - 1) / std::max<size_t>(1, max_points));
  for (size_t b = 0; b < n; b += bucket) {
    size_t best = b;
    for (size_t i = b; i < std::min(n, b + bucket); ++i)
      if (total[i] > total[best]) best = i;
    pts.push_back(best);
  }
  if (n && pts.back() != n - 1) pts.push_back(n - 1);

  // A second sweep: the series and the live set at each point.
  std::vector<std::vector<int64_t>> values(ns);
  std::vector<int64_t> reserved, live_count;
  std::vector<nlohmann::json> top;
  std::set<size_t> referenced;
  std::set<std::pair<int64_t, size_t>> live;  // (-bytes, tensor index): largest first
  std::fill(cur.begin(), cur.end(), 0);
  size_t next = 0;
  std::vector<size_t> peak_live;
  for (size_t i = 0; i < n && next < pts.size(); ++i) {
    const MemoryEvent& e = *ev[i];
    auto it = by_id.find(e.alloc_id);
    if (it != by_id.end()) {
      const Tensor_& t = tensors[it->second];
      if (e.kind == MemoryEvent::Kind::alloc) {
        cur[static_cast<size_t>(t.series)] += t.bytes;
        live.insert({-t.bytes, it->second});
      } else {
        cur[static_cast<size_t>(t.series)] -= t.bytes;
        live.erase({-t.bytes, it->second});
      }
    }
    if (i != pts[next]) continue;
    for (size_t s = 0; s < ns; ++s) values[s].push_back(cur[s]);
    reserved.push_back(e.reserved_after - p.base_reserved_bytes);
    live_count.push_back(static_cast<int64_t>(live.size()));
    nlohmann::json ids = nlohmann::json::array();
    size_t k = 0;
    for (auto l = live.begin(); l != live.end() && k < top_k; ++l, ++k) {
      ids.push_back(tensors[l->second].id);
      referenced.insert(l->second);
    }
    top.push_back(ids);
    if (i == peak_at)
      for (const auto& l : live) peak_live.push_back(l.second);
    ++next;
  }
  // The tensors live at the peak are listed in full in live_at_peak, not again here.
  for (size_t t : peak_live) referenced.erase(t);

  // Names used, re-indexed.
  std::map<uint32_t, size_t> owner_ix, shape_ix;
  nlohmann::json owners = nlohmann::json::array(), shapes = nlohmann::json::array();
  auto owner_name = [&](uint32_t o) { return o < p.owners.size() ? p.owners[o] : std::string(); };
  auto shape_name = [&](uint32_t s) { return s < p.shapes.size() ? p.shapes[s] : std::string(); };
  auto intern = [](std::map<uint32_t, size_t>& ix, nlohmann::json& names, uint32_t k, const std::string& name) {
    auto [it, fresh] = ix.emplace(k, names.size());
    if (fresh) names.push_back(name);
    return it->second;
  };
  // [id, begin, end, bytes, series, phase, owner, shape], by id
  auto row = [&](size_t t) {
    const Tensor_& x = tensors[t];
    return nlohmann::json{x.id,
                          x.begin,
                          x.end,
                          x.bytes,
                          x.series,
                          phase_name(x.phase),
                          intern(owner_ix, owners, x.owner, owner_name(x.owner)),
                          intern(shape_ix, shapes, x.shape, shape_name(x.shape))};
  };
  nlohmann::json trows = nlohmann::json::array();
  for (size_t t : referenced) trows.push_back(row(t));
  nlohmann::json peak_rows = nlohmann::json::array();
  for (size_t t : peak_live) peak_rows.push_back(row(t));

  // Phases: each event takes the phase of the layer span it lies in, else its own tag's.
  std::vector<Phase> ph(n, Phase::setup);
  for (size_t i = 0; i < n; ++i)
    ph[i] = ev[i]->kind == MemoryEvent::Kind::alloc ? ev[i]->phase : (i ? ph[i - 1] : Phase::setup);
  nlohmann::json layer_spans = nlohmann::json::object();
  for (const auto& s : p.spans) {
    const int64_t b = index_of_seq(s.begin), e = index_of_seq(s.end);
    for (int64_t i = b; i < e; ++i) ph[static_cast<size_t>(i)] = s.phase;
    if (s.layer >= 0 && static_cast<size_t>(s.layer) < p.layer_names.size())
      layer_spans[p.layer_names[static_cast<size_t>(s.layer)]].push_back({phase_name(s.phase), b, e});
  }
  nlohmann::json phases = nlohmann::json::array();
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && ph[j] == ph[i]) ++j;
    phases.push_back({phase_name(ph[i]), i, j});
    i = j;
  }

  nlohmann::json vals = nlohmann::json::object();
  for (size_t s = 0; s < ns; ++s) vals[series[s]] = values[s];
  nlohmann::json j{{"events", n},
                   {"peak_event", peak_at},
                   {"peak_bytes", std::max<int64_t>(0, peak)},
                   {"series", series},
                   {"event", pts},
                   {"values", vals},
                   {"reserved", reserved},
                   {"live_count", live_count},
                   {"top", top},
                   {"tensor_fields", {"id", "begin", "end", "bytes", "series", "phase", "layer", "shape"}},
                   {"tensors", trows},
                   {"layers", owners},
                   {"shapes", shapes},
                   {"phases", phases},
                   {"layer_spans", layer_spans},
                   {"live_at_peak", peak_rows}};
  return j;
}

}  // namespace remat
