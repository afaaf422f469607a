// The detail of one profiled step that the HTML page draws (and --json carries): bytes live
// by series over the step's events, merged down to screen resolution with the peak kept
// exact; the tensors live at the peak; what each layer recomputes.
#include <algorithm>
#include <map>
#include <optional>
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

// The step's alloc/free events (indexed 0..n-1), the tensors they make, and the bytes live
// after each event.
struct Sweep {
  std::vector<const MemoryEvent*> ev;
  std::vector<Tensor_> tensors;
  std::unordered_map<uint64_t, size_t> by_id;  // alloc id -> index in tensors
  std::vector<int64_t> total;                  // bytes live after each event
  int64_t peak = -1;
  size_t peak_at = 0;  // the first event at the peak

  // The number of alloc/free events before seq (an event's index, for the layer spans).
  int64_t index_of_seq(uint64_t seq) const {
    return static_cast<int64_t>(
        std::lower_bound(ev.begin(), ev.end(), seq, [](const MemoryEvent* e, uint64_t s) { return e->seq < s; }) -
        ev.begin());
  }
};

Sweep sweep_events(const StepProfile& p) {
  Sweep w;
  for (const auto& e : p.events)
    if (is_alloc_or_free(e)) w.ev.push_back(&e);
  const size_t n = w.ev.size();
  w.total.assign(n, 0);
  int64_t run = 0;
  for (size_t i = 0; i < n; ++i) {
    const MemoryEvent& e = *w.ev[i];
    if (e.kind == MemoryEvent::Kind::alloc) {
      Tensor_ t;
      t.id = e.alloc_id;
      t.begin = static_cast<int64_t>(i);
      t.bytes = e.bytes;
      t.series = series_of(e);
      t.phase = e.phase;
      t.owner = e.owner;
      t.shape = e.shape;
      w.by_id[e.alloc_id] = w.tensors.size();
      w.tensors.push_back(t);
      run += e.bytes;
    } else {
      auto it = w.by_id.find(e.alloc_id);
      if (it == w.by_id.end()) continue;  // allocated before the step
      Tensor_& t = w.tensors[it->second];
      t.end = static_cast<int64_t>(i);
      run -= t.bytes;
    }
    w.total[i] = run;
    if (run > w.peak) {
      w.peak = run;
      w.peak_at = i;
    }
  }
  return w;
}

// The points drawn: per bucket of events, the one with the most bytes live (the first
// such), so that no spike disappears; the global peak is one of them.
std::vector<size_t> drawn_points(const std::vector<int64_t>& total, size_t max_points) {
  const size_t n = total.size();
  std::vector<size_t> pts;
  const size_t bucket = std::max<size_t>(1, (n + max_points - 1) / std::max<size_t>(1, max_points));
  for (size_t b = 0; b < n; b += bucket) {
    size_t best = b;
    for (size_t i = b; i < std::min(n, b + bucket); ++i)
      if (total[i] > total[best]) best = i;
    pts.push_back(best);
  }
  if (n && pts.back() != n - 1) pts.push_back(n - 1);
  return pts;
}

// What a second sweep samples at each drawn point: the bytes of each series, the reserved
// bytes, how many tensors are live and the ids of the top_k largest; and which tensors
// those lists name, and the whole live set at the peak.
struct Samples {
  std::vector<std::vector<int64_t>> values;  // per series
  std::vector<int64_t> reserved, live_count;
  std::vector<nlohmann::json> top;
  std::set<size_t> referenced;  // tensor indices named by `top`, less those live at the peak
  std::vector<size_t> peak_live;
};

Samples sample_points(const StepProfile& p, const Sweep& w, const std::vector<size_t>& pts, size_t top_k) {
  const size_t ns = timeline_series().size(), n = w.ev.size();
  Samples out;
  out.values.resize(ns);
  std::vector<int64_t> cur(ns, 0);
  std::set<std::pair<int64_t, size_t>> live;  // (-bytes, tensor index): largest first
  size_t next = 0;
  for (size_t i = 0; i < n && next < pts.size(); ++i) {
    const MemoryEvent& e = *w.ev[i];
    auto it = w.by_id.find(e.alloc_id);
    if (it != w.by_id.end()) {
      const Tensor_& t = w.tensors[it->second];
      if (e.kind == MemoryEvent::Kind::alloc) {
        cur[static_cast<size_t>(t.series)] += t.bytes;
        live.insert({-t.bytes, it->second});
      } else {
        cur[static_cast<size_t>(t.series)] -= t.bytes;
        live.erase({-t.bytes, it->second});
      }
    }
    if (i != pts[next]) continue;
    for (size_t s = 0; s < ns; ++s) out.values[s].push_back(cur[s]);
    out.reserved.push_back(e.reserved_after - p.base_reserved_bytes);
    out.live_count.push_back(static_cast<int64_t>(live.size()));
    nlohmann::json ids = nlohmann::json::array();
    size_t k = 0;
    for (auto l = live.begin(); l != live.end() && k < top_k; ++l, ++k) {
      ids.push_back(w.tensors[l->second].id);
      out.referenced.insert(l->second);
    }
    out.top.push_back(ids);
    if (i == w.peak_at)
      for (const auto& l : live) out.peak_live.push_back(l.second);
    ++next;
  }
  // The tensors live at the peak are listed in full in live_at_peak, not again in tensors.
  for (size_t t : out.peak_live) out.referenced.erase(t);
  return out;
}

// The tensor rows ([id, begin, end, bytes, series, phase, owner, shape], by id) of the
// referenced tensors and of those live at the peak, with the layer and shape names they
// use, re-indexed.
struct TensorRows {
  nlohmann::json rows = nlohmann::json::array(), peak_rows = nlohmann::json::array();
  nlohmann::json owners = nlohmann::json::array(), shapes = nlohmann::json::array();
};

TensorRows tensor_rows(const StepProfile& p, const Sweep& w, const Samples& samples) {
  TensorRows out;
  std::map<uint32_t, size_t> owner_ix, shape_ix;
  auto owner_name = [&](uint32_t o) { return o < p.owners.size() ? p.owners[o] : std::string(); };
  auto shape_name = [&](uint32_t s) { return s < p.shapes.size() ? p.shapes[s] : std::string(); };
  auto intern = [](std::map<uint32_t, size_t>& ix, nlohmann::json& names, uint32_t k, const std::string& name) {
    auto [it, fresh] = ix.emplace(k, names.size());
    if (fresh) names.push_back(name);
    return it->second;
  };
  auto row = [&](size_t t) {
    const Tensor_& x = w.tensors[t];
    return nlohmann::json{x.id,
                          x.begin,
                          x.end,
                          x.bytes,
                          x.series,
                          phase_name(x.phase),
                          intern(owner_ix, out.owners, x.owner, owner_name(x.owner)),
                          intern(shape_ix, out.shapes, x.shape, shape_name(x.shape))};
  };
  for (size_t t : samples.referenced) out.rows.push_back(row(t));
  for (size_t t : samples.peak_live) out.peak_rows.push_back(row(t));
  return out;
}

// Phases as runs of events ([phase, first, end]): each event takes the phase of the layer
// span it lies in, else its own tag's; and each layer's spans ([phase, first, end]).
void phase_runs(const StepProfile& p, const Sweep& w, nlohmann::json& phases, nlohmann::json& layer_spans) {
  const size_t n = w.ev.size();
  std::vector<Phase> ph(n, Phase::setup);
  for (size_t i = 0; i < n; ++i)
    ph[i] = w.ev[i]->kind == MemoryEvent::Kind::alloc ? w.ev[i]->phase : (i ? ph[i - 1] : Phase::setup);
  layer_spans = nlohmann::json::object();
  for (const auto& s : p.spans) {
    const int64_t b = w.index_of_seq(s.begin), e = w.index_of_seq(s.end);
    for (int64_t i = b; i < e; ++i) ph[static_cast<size_t>(i)] = s.phase;
    if (s.layer >= 0 && static_cast<size_t>(s.layer) < p.layer_names.size())
      layer_spans[p.layer_names[static_cast<size_t>(s.layer)]].push_back({phase_name(s.phase), b, e});
  }
  phases = nlohmann::json::array();
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && ph[j] == ph[i]) ++j;
    phases.push_back({phase_name(ph[i]), i, j});
    i = j;
  }
}

// The pinned host tier of an offloading step: each offloaded product as [begin, end, bytes,
// layer] in device event indices (end -1: held at the end; a host event numbered seq
// happens just before the device's event of that seq, so it counts from that event's index
// on), the bytes held after each index where they change, and the first index of the peak.
struct HostTier {
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::pair<int64_t, int64_t>> held;  // (device event index, bytes held from it on)
  int64_t peak = 0;
  int64_t peak_at = -1;
};

HostTier host_tier(const StepProfile& p, const Sweep& w) {
  HostTier h;
  std::vector<std::pair<int64_t, int64_t>> deltas;  // (device event index, bytes)
  std::unordered_map<uint64_t, size_t> open;        // alloc id -> row
  for (const MemoryEvent& e : p.host_events) {
    if (!is_alloc_or_free(e)) continue;
    const int64_t at = w.index_of_seq(e.seq);
    if (e.kind == MemoryEvent::Kind::alloc) {
      deltas.push_back({at, e.bytes});
      open[e.alloc_id] = h.rows.size();
      h.rows.push_back({at, -1, e.bytes, e.owner < p.host_owners.size() ? p.host_owners[e.owner] : std::string()});
    } else if (auto it = open.find(e.alloc_id); it != open.end()) {
      deltas.push_back({at, -e.bytes});
      h.rows[it->second][1] = at;
      open.erase(it);
    }
  }
  std::stable_sort(deltas.begin(), deltas.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  int64_t live = 0;
  for (size_t d = 0; d < deltas.size();) {
    const int64_t at = deltas[d].first;
    for (; d < deltas.size() && deltas[d].first == at; ++d) live += deltas[d].second;
    h.held.push_back({at, live});
    if (live > h.peak) h.peak = live, h.peak_at = at;
  }
  return h;
}

// The host tier's JSON: bytes held at each drawn point, its peak, the products.
nlohmann::json host_json(const HostTier& h, const std::vector<size_t>& pts) {
  nlohmann::json values = nlohmann::json::array();
  int64_t live = 0;
  size_t d = 0;
  for (size_t pt : pts) {
    while (d < h.held.size() && h.held[d].first <= static_cast<int64_t>(pt)) live = h.held[d++].second;
    values.push_back(live);
  }
  return {{"values", values},
          {"peak_bytes", h.peak},
          {"tensor_fields", {"begin", "end", "bytes", "layer"}},
          {"tensors", h.rows}};
}

}  // namespace

nlohmann::json step_timeline_json(const StepProfile& p, size_t max_points, size_t top_k) {
  const auto& series = timeline_series();
  const Sweep w = sweep_events(p);
  std::vector<size_t> pts = drawn_points(w.total, max_points);
  std::optional<HostTier> host;
  if (!p.host_events.empty()) {  // the host tier's peak is drawn too, exact
    host = host_tier(p, w);
    if (host->peak_at >= 0 && static_cast<size_t>(host->peak_at) < w.ev.size() &&
        !std::binary_search(pts.begin(), pts.end(), static_cast<size_t>(host->peak_at)))
      pts.insert(std::upper_bound(pts.begin(), pts.end(), static_cast<size_t>(host->peak_at)),
                 static_cast<size_t>(host->peak_at));
  }
  const Samples samples = sample_points(p, w, pts, top_k);
  TensorRows rows = tensor_rows(p, w, samples);
  nlohmann::json phases, layer_spans;
  phase_runs(p, w, phases, layer_spans);

  nlohmann::json vals = nlohmann::json::object();
  for (size_t s = 0; s < series.size(); ++s) vals[series[s]] = samples.values[s];
  nlohmann::json j{{"events", w.ev.size()},
                   {"peak_event", w.peak_at},
                   {"peak_bytes", std::max<int64_t>(0, w.peak)},
                   {"series", series},
                   {"event", pts},
                   {"values", vals},
                   {"reserved", samples.reserved},
                   {"live_count", samples.live_count},
                   {"top", samples.top},
                   {"tensor_fields", {"id", "begin", "end", "bytes", "series", "phase", "layer", "shape"}},
                   {"tensors", rows.rows},
                   {"layers", rows.owners},
                   {"shapes", rows.shapes},
                   {"phases", phases},
                   {"layer_spans", layer_spans},
                   {"live_at_peak", rows.peak_rows}};
  if (host) j["host"] = host_json(*host, pts);
  return j;
}

}  // namespace remat
