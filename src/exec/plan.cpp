// Checkpoint policies: from a policy name to segments and keep flags.
#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "remat/error.h"
#include "remat/plan.h"

namespace remat {

namespace {

bool always_kept(const Layer& l) { return l.kind() == LayerKind::input || l.kind() == LayerKind::loss; }

// Recompute segments made of groups of `k` consecutive units.
std::vector<Segment> group_units(const std::vector<Segment>& units, int64_t k) {
  std::vector<Segment> out;
  for (size_t i = 0; i < units.size(); i += static_cast<size_t>(k)) {
    const size_t last = std::min(units.size(), i + static_cast<size_t>(k)) - 1;
    out.push_back({units[i].begin, units[last].end, true});
  }
  return out;
}

// Checks the nests, orders them outermost first, links parents, and works out which
// checkpoints each advance keeps and which layers it runs.
void add_nests(const Graph& g, CheckpointPlan& p, std::vector<Nest> nests, const std::vector<bool>& boundary_only) {
  const auto n = static_cast<size_t>(g.size());
  p.kept_by.assign(n, -1);
  p.nest_of.assign(p.segments.size(), -1);
  if (nests.empty()) return;
  std::sort(nests.begin(), nests.end(),
            [](const Nest& a, const Nest& b) { return a.begin != b.begin ? a.begin < b.begin : a.end > b.end; });
  std::vector<int> open;  // the nests holding the current one, outermost first
  for (size_t k = 0; k < nests.size(); ++k) {
    Nest& m = nests[k];
    REMAT_CHECK(m.begin >= 0 && m.end <= g.size() && m.begin < m.end, "plan: nest [", m.begin, ", ", m.end,
                ") is out of range");
    while (!open.empty() && nests[static_cast<size_t>(open.back())].end <= m.begin) open.pop_back();
    REMAT_CHECK(open.empty() || m.end <= nests[static_cast<size_t>(open.back())].end, "plan: nest [", m.begin, ", ",
                m.end, ") overlaps another");
    m.parent = open.empty() ? -1 : open.back();
    open.push_back(static_cast<int>(k));
    const Segment& first = p.segments[static_cast<size_t>(p.segment_of[static_cast<size_t>(m.begin)])];
    const Segment& last = p.segments[static_cast<size_t>(p.segment_of[static_cast<size_t>(m.end - 1)])];
    REMAT_CHECK(first.begin == m.begin && last.end == m.end, "plan: nest [", m.begin, ", ", m.end,
                ") does not start and end at segment boundaries");
  }
  // Each nest's last child: the outermost nest or segment under it that ends where it ends.
  for (size_t k = 0; k < nests.size(); ++k) {
    Nest& m = nests[k];
    m.last_child_begin = p.segments[static_cast<size_t>(p.segment_of[static_cast<size_t>(m.end - 1)])].begin;
    for (size_t c = 0; c < nests.size(); ++c)
      if (nests[c].parent == static_cast<int>(k) && nests[c].end == m.end) m.last_child_begin = nests[c].begin;
    REMAT_CHECK(m.last_child_begin > m.begin, "plan: nest [", m.begin, ", ", m.end, ") has a single child");
  }
  for (size_t si = 0; si < p.segments.size(); ++si)
    for (size_t k = 0; k < nests.size(); ++k)
      if (nests[k].begin <= p.segments[si].begin && p.segments[si].end <= nests[k].end)
        p.nest_of[si] = static_cast<int>(k);
  // A checkpoint kept only because a later segment reads it is kept by the innermost nest
  // that holds it and all its readers; forward keeps it when none does.
  auto holds = [&](int k, int i) {
    return nests[static_cast<size_t>(k)].begin <= i && i < nests[static_cast<size_t>(k)].end;
  };
  std::vector<int> last_reader(n, -1);
  for (int i = 0; i < g.size(); ++i)
    for (int j : g.layer(i).inputs)
      last_reader[static_cast<size_t>(j)] = std::max(last_reader[static_cast<size_t>(j)], i);
  for (int j = 0; j < g.size(); ++j) {
    if (!boundary_only[static_cast<size_t>(j)]) continue;
    int k = p.nest_of[static_cast<size_t>(p.segment_of[static_cast<size_t>(j)])];
    while (k >= 0 && !holds(k, last_reader[static_cast<size_t>(j)])) k = nests[static_cast<size_t>(k)].parent;
    p.kept_by[static_cast<size_t>(j)] = k;
  }
  // What each advance runs: the layers of its first children that lead to a checkpoint it
  // keeps, except those live already (kept by forward or by an enclosing advance).
  for (size_t k = 0; k < nests.size(); ++k) {
    Nest& m = nests[k];
    // Live at this advance: kept by forward or by an enclosing nest's advance.
    auto live = [&](int i) {
      if (!p.keep[static_cast<size_t>(i)]) return false;
      const int by = p.kept_by[static_cast<size_t>(i)];
      if (by < 0) return true;
      for (int a = m.parent; a >= 0; a = nests[static_cast<size_t>(a)].parent)
        if (a == by) return true;
      return false;
    };
    // Backwards over the advance: a layer is run if it is not live and its output is kept
    // here or read by a layer that is run (one pass, marking inputs as read).
    const auto width = static_cast<size_t>(m.last_child_begin - m.begin);
    std::vector<bool> need(width, false), read(width, false);
    for (int i = m.last_child_begin - 1; i >= m.begin; --i) {
      const auto at = static_cast<size_t>(i - m.begin);
      if (live(i) ||
          !(read[at] || (p.kept_by[static_cast<size_t>(i)] == static_cast<int>(k) && p.keep[static_cast<size_t>(i)])))
        continue;
      need[at] = true;
      for (int in : g.layer(i).inputs)
        if (in >= m.begin && in < i) read[static_cast<size_t>(in - m.begin)] = true;
    }
    m.advance.clear();
    for (int i = m.begin; i < m.last_child_begin; ++i)
      if (need[static_cast<size_t>(i - m.begin)]) m.advance.push_back(i);
  }
  p.nests = std::move(nests);
}

}  // namespace

// Units: repeated-block instances if the model has them, else every layer that can be
// recomputed. Each unit is a contiguous range of layer ids.
std::vector<Segment> plan_units(const Graph& g) {
  std::vector<Segment> units;
  if (g.num_units > 0) {
    for (int i = 0; i < g.size(); ++i) {
      const int u = g.layer(i).unit;
      if (u < 0) continue;
      if (!units.empty() && g.layer(units.back().end - 1).unit == u && units.back().end == i) {
        units.back().end = i + 1;
      } else {
        units.push_back({i, i + 1, false});
      }
    }
  } else {
    for (int i = 0; i < g.size(); ++i)
      if (!always_kept(g.layer(i))) units.push_back({i, i + 1, false});
  }
  return units;
}

void keep_selective(const Graph& g, const Segment& s, std::vector<bool>& keep, std::vector<bool>& keep_extras) {
  for (int i = s.begin; i < s.end; ++i) {
    const Layer::SelectiveKeep k = g.layer(i).selective_keep();
    keep[static_cast<size_t>(i)] = k != Layer::SelectiveKeep::nothing;
    keep_extras[static_cast<size_t>(i)] = k == Layer::SelectiveKeep::all;
  }
}

CheckpointPlan make_plan_from_segments(const Graph& g, const std::string& name, const std::vector<Segment>& given,
                                       const std::vector<bool>& keep_in, const std::vector<bool>& keep_extras_in,
                                       std::vector<Nest> nests) {
  REMAT_CHECK(static_cast<int>(keep_in.size()) == g.size(), "plan: ", keep_in.size(), " keep flags for ", g.size(),
              " layers");
  REMAT_CHECK(keep_extras_in.empty() || keep_extras_in.size() == keep_in.size(), "plan: ", keep_extras_in.size(),
              " keep-extras flags for ", g.size(), " layers");
  CheckpointPlan p;
  p.policy = name;
  p.keep = keep_in;
  p.segment_of.assign(static_cast<size_t>(g.size()), -1);
  // Fill the gaps between the given segments with plain (kept) single-layer segments.
  int next = 0;
  auto plain = [&](int upto) {
    for (; next < upto; ++next) p.segments.push_back({next, next + 1, false});
  };
  for (const Segment& s : given) {
    REMAT_CHECK(s.begin >= next && s.end > s.begin && s.end <= g.size(), "plan: segment [", s.begin, ", ", s.end,
                ") overlaps or is out of order");
    plain(s.begin);
    p.segments.push_back(s);
    next = s.end;
  }
  plain(g.size());
  for (size_t si = 0; si < p.segments.size(); ++si)
    for (int i = p.segments[si].begin; i < p.segments[si].end; ++i)
      p.segment_of[static_cast<size_t>(i)] = static_cast<int>(si);
  // Invariants: inputs and the loss are kept; anything read by a later segment is kept
  // (it is that segment's checkpoint); a layer outside any recompute segment is kept.
  std::vector<bool> boundary_only(static_cast<size_t>(g.size()), false);  // kept only as a checkpoint
  for (int i = 0; i < g.size(); ++i) {
    const Layer& l = g.layer(i);
    if (always_kept(l) || !p.segments[static_cast<size_t>(p.segment_of[static_cast<size_t>(i)])].recompute)
      p.keep[static_cast<size_t>(i)] = true;
    for (int j : l.inputs)
      if (p.segment_of[static_cast<size_t>(j)] != p.segment_of[static_cast<size_t>(i)] &&
          !p.keep[static_cast<size_t>(j)])
        p.keep[static_cast<size_t>(j)] = boundary_only[static_cast<size_t>(j)] = true;
  }
  // Extras are kept with the output unless asked otherwise; a layer kept only because
  // the invariants above demand it keeps all its products.
  p.keep_extras.assign(static_cast<size_t>(g.size()), false);
  for (size_t i = 0; i < p.keep.size(); ++i)
    p.keep_extras[i] = p.keep[i] && (keep_extras_in.empty() || keep_extras_in[i] || !keep_in[i]);
  // Which layers backward needs to re-run: those whose extras are not kept (read by
  // their own backward), and, among those whose output is not kept, those whose output
  // some backward reads and, walking each segment backwards, those whose output a re-run
  // layer reads. A layer whose output is not kept has all its readers in its own segment
  // (a reader in another segment makes it that segment's checkpoint, kept above), so the
  // search for re-run readers ends at the segment's end.
  const auto n = static_cast<size_t>(g.size());
  std::vector<bool> out_read_by_backward(n, false);
  for (int i = 0; i < g.size(); ++i) {
    const Layer& l = g.layer(i);
    for (int k : l.backward_inputs())
      out_read_by_backward[static_cast<size_t>(l.inputs[static_cast<size_t>(k)])] = true;
    if (l.backward_uses_output()) out_read_by_backward[static_cast<size_t>(i)] = true;
  }
  p.rerun.assign(n, false);
  for (int i = g.size() - 1; i >= 0; --i) {
    const Layer& l = g.layer(i);
    bool need = !p.keep_extras[static_cast<size_t>(i)] && !l.extra_names().empty();
    if (!p.keep[static_cast<size_t>(i)]) {
      need = need || out_read_by_backward[static_cast<size_t>(i)];
      const int segment_end = p.segments[static_cast<size_t>(p.segment_of[static_cast<size_t>(i)])].end;
      for (int j = i + 1; j < segment_end && !need; ++j) {
        if (!p.rerun[static_cast<size_t>(j)]) continue;
        for (int in : g.layer(j).inputs) need = need || in == i;
      }
    }
    p.rerun[static_cast<size_t>(i)] = need;
  }
  for (Segment& s : p.segments) {
    bool any = false;
    for (int i = s.begin; i < s.end; ++i) any = any || p.rerun[static_cast<size_t>(i)];
    s.recompute = any;
  }
  add_nests(g, p, std::move(nests), boundary_only);
  return p;
}

std::vector<std::vector<RevolveCost>> revolve_table(int n, int s) {
  REMAT_CHECK(n >= 0 && s >= 0, "revolve: negative chain length or slots");
  std::vector<std::vector<RevolveCost>> t(static_cast<size_t>(n) + 1,
                                          std::vector<RevolveCost>(static_cast<size_t>(s) + 1, {INT64_MAX, 0}));
  for (int k = 0; k <= s; ++k) t[0][static_cast<size_t>(k)] = {0, 0};
  if (n >= 1)
    for (int k = 0; k <= s; ++k) t[1][static_cast<size_t>(k)] = {0, 0};  // the last unit: no re-run
  for (int len = 2; len <= n; ++len)
    for (int k = 1; k <= s; ++k) {
      RevolveCost& best = t[static_cast<size_t>(len)][static_cast<size_t>(k)];
      for (int m = 1; m < len; ++m) {
        const int64_t right = t[static_cast<size_t>(len - m)][static_cast<size_t>(k - 1)].reruns;
        const int64_t left = t[static_cast<size_t>(m)][static_cast<size_t>(k)].reruns;
        if (right == INT64_MAX || left == INT64_MAX) continue;
        const int64_t c = m + right + left;
        if (c < best.reruns) best = {c, m};
      }
    }
  return t;
}

namespace {

// revolve:S over the plan's units. Forward keeps the boundaries of the chain's top-level
// parts ([first] [first'] ... [last unit]); each part is rebuilt in backward as a nest.
CheckpointPlan revolve_plan(const Graph& g, const std::string& policy, int slots) {
  const std::vector<Segment> units = plan_units(g);
  const int n = static_cast<int>(units.size());
  const int s = std::min(slots, std::max(n, 1));
  const auto table = revolve_table(n, s);
  std::vector<bool> keep(static_cast<size_t>(g.size()), true);
  std::vector<Segment> segs;
  std::vector<Nest> nests;
  auto unit = [&](int u) { return units[static_cast<size_t>(u)]; };
  // Units [a, b), rebuilt in backward from the boundary before a with k slots.
  std::function<void(int, int, int)> rebuild = [&](int a, int b, int k) {
    if (b - a == 1) {
      segs.push_back({unit(a).begin, unit(a).end, true});
      for (int i = unit(a).begin; i < unit(a).end; ++i) keep[static_cast<size_t>(i)] = false;
      return;
    }
    nests.emplace_back(unit(a).begin, unit(b - 1).end);
    const int m = a + table[static_cast<size_t>(b - a)][static_cast<size_t>(k)].first;
    rebuild(a, m, k);
    rebuild(m, b, k - 1);
  };
  // Forward's own path: it runs [a, b) once, keeping the boundary at each split.
  int a = 0, k = s;
  while (n - a > 1) {
    const int m = a + table[static_cast<size_t>(n - a)][static_cast<size_t>(k)].first;
    rebuild(a, m, k);
    a = m, --k;
  }
  return make_plan_from_segments(g, policy, segs, keep, {}, nests);
}

}  // namespace

bool CheckpointPlan::offloads() const { return std::find(offload.begin(), offload.end(), true) != offload.end(); }

std::vector<Segment> offload_units(const Graph& g) {
  std::vector<Segment> units = plan_units(g);
  if (units.size() < 2) {
    units.clear();
    for (int i = 0; i < g.size(); ++i)
      if (!always_kept(g.layer(i))) units.push_back({i, i + 1, false});
  }
  return units;
}

OffloadSuffix split_offload_suffix(const std::string& policy) {
  static const std::string kOffload = "+offload";
  const size_t at = policy.rfind(kOffload);
  if (at == std::string::npos || at == 0) return {policy, false, -1};
  const std::string tail = policy.substr(at + kOffload.size());
  REMAT_CHECK(policy.find(kOffload) == at, "policy \"", policy, "\": +offload twice");
  if (tail.empty()) return {policy.substr(0, at), true, -1};
  if (tail[0] != ':') return {policy, false, -1};
  char* end = nullptr;
  const long j = std::strtol(tail.c_str() + 1, &end, 10);
  REMAT_CHECK(tail.size() > 1 && std::isdigit(static_cast<unsigned char>(tail[1])) && end && *end == '\0' && j > 0 &&
                  j < INT_MAX,
              "policy \"", policy, "\": expected +offload:J with J (the units offloaded) a positive integer");
  return {policy.substr(0, at), true, static_cast<int>(j)};
}

void add_offload(const Graph& g, CheckpointPlan& p, int offloaded_units) {
  const auto n = static_cast<size_t>(g.size());
  const std::vector<Segment> units = offload_units(g);
  const int most = static_cast<int>(units.size()) - 1;
  REMAT_CHECK(offloaded_units == -1 || (offloaded_units >= 1 && offloaded_units <= most), "policy \"", p.policy,
              "+offload:", offloaded_units, "\": ",
              most < 1 ? std::string("this model has no unit before its last to offload")
                       : "J counts the units offloaded, 1 to " + std::to_string(most) +
                             " (every unit but the last of " + std::to_string(units.size()) + ")");
  p.offload.assign(n, false);
  p.prefetch_at.assign(n, -1);
  p.need_at.assign(n, -1);
  if (!p.policy.empty())
    p.policy += offloaded_units == -1 ? std::string("+offload") : "+offload:" + std::to_string(offloaded_units);
  if (units.size() < 2) return;
  // The first backward step that reads each product (-1: none).
  std::vector<int> need(n, -1);
  auto read_at = [&](int j, int step) { need[static_cast<size_t>(j)] = std::max(need[static_cast<size_t>(j)], step); };
  for (int i = 0; i < g.size(); ++i) {
    const Layer& l = g.layer(i);
    for (int k : l.backward_inputs()) read_at(l.inputs[static_cast<size_t>(k)], i);
    if (l.backward_uses_output() || (p.keep_extras[static_cast<size_t>(i)] && !l.extra_names().empty())) read_at(i, i);
    if (p.rerun[static_cast<size_t>(i)]) {
      const int rebuilt_at = p.segments[static_cast<size_t>(p.segment_of[static_cast<size_t>(i)])].end - 1;
      for (int j : l.inputs)
        if (p.keep[static_cast<size_t>(j)]) read_at(j, rebuilt_at);
    }
  }
  for (const Nest& m : p.nests)
    for (int i : m.advance)
      for (int j : g.layer(i).inputs)
        if (!std::binary_search(m.advance.begin(), m.advance.end(), j)) read_at(j, m.end - 1);
  // Views share their source's bytes: neither they nor what a kept view reads (through
  // views) move.
  std::vector<bool> pinned(n, false);
  for (int i = g.size() - 1; i >= 0; --i) {
    const Layer& l = g.layer(i);
    if (l.kind() != LayerKind::view) continue;
    if (p.keep[static_cast<size_t>(i)] || pinned[static_cast<size_t>(i)])
      for (int j : l.inputs) pinned[static_cast<size_t>(j)] = true;
    pinned[static_cast<size_t>(i)] = true;
  }
  const int first_kept_on_device = units[static_cast<size_t>(offloaded_units == -1 ? most : offloaded_units)].begin;
  for (int j = 0; j < first_kept_on_device; ++j) {
    const auto k = static_cast<size_t>(j);
    if (always_kept(g.layer(j)) || !p.keep[k] || p.kept_by[k] >= 0 || pinned[k] || need[k] < 0) continue;
    p.offload[k] = true;
    p.need_at[k] = need[k];
    // One unit ahead: the last layer of the first unit that starts after need_at, whose
    // backward comes just before; the loss's step where none does.
    int at = g.size() - 1;
    for (const Segment& u : units)
      if (u.begin > need[k]) {
        at = u.end - 1;
        break;
      }
    p.prefetch_at[k] = at;
  }
}

CheckpointPlan make_plan(const Graph& g, const std::string& policy) {
  if (const OffloadSuffix o = split_offload_suffix(policy); o.offload) {
    CheckpointPlan p = make_plan(g, o.base);
    add_offload(g, p, o.units);
    return p;
  }
  const std::vector<Segment> units = plan_units(g);
  std::vector<bool> keep(static_cast<size_t>(g.size()), true), keep_extras = keep;
  auto recompute_all = [&](const std::vector<Segment>& segs) {
    for (const auto& s : segs)
      for (int i = s.begin; i < s.end; ++i) keep[static_cast<size_t>(i)] = false;
  };
  if (policy == "none") return make_plan_from_segments(g, policy, {}, keep);
  if (policy == "all") {
    recompute_all(units);
    return make_plan_from_segments(g, policy, group_units(units, 1), keep);
  }
  if (policy == "sqrt") {
    const auto k = std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(units.size()))));
    auto segs = group_units(units, k);
    recompute_all(segs);
    return make_plan_from_segments(g, policy, segs, keep);
  }
  if (policy.rfind("every:", 0) == 0) {
    char* end = nullptr;
    const long k = std::strtol(policy.c_str() + 6, &end, 10);
    REMAT_CHECK(end && *end == '\0' && k > 0 && policy.size() > 6, "policy \"", policy,
                "\": expected every:K with K a positive integer");
    auto segs = group_units(units, k);
    recompute_all(segs);
    return make_plan_from_segments(g, policy, segs, keep);
  }
  if (policy.rfind("revolve:", 0) == 0) {
    char* end = nullptr;
    const long k = std::strtol(policy.c_str() + 8, &end, 10);
    REMAT_CHECK(end && *end == '\0' && k > 0 && k < INT_MAX && policy.size() > 8, "policy \"", policy,
                "\": expected revolve:S with S (the checkpoint slots) a positive integer");
    return revolve_plan(g, policy, static_cast<int>(k));
  }
  if (policy == "selective") {
    // Keep what GEMMs and convolutions produce (expensive to recompute), recompute the
    // pointwise, norm, dropout, softmax (attention's probabilities) and pooling layers
    // (cheap).
    auto segs = group_units(units, 1);
    for (const auto& s : segs) keep_selective(g, s, keep, keep_extras);
    return make_plan_from_segments(g, policy, segs, keep, keep_extras);
  }
  if (policy == "manual") {
    std::vector<Segment> segs;
    for (const auto& u : units)
      if (g.layer(u.begin).checkpoint) segs.push_back({u.begin, u.end, true});
    recompute_all(segs);
    return make_plan_from_segments(g, policy, segs, keep);
  }
  REMAT_THROW("unknown checkpoint policy \"", policy,
              "\" (expected none, all, every:K, sqrt, revolve:S, selective or manual, each optionally followed by "
              "+offload or +offload:J; or budget:SIZE, optionally +offload)");
}

int CheckpointPlan::recomputed_layers() const {
  int n = 0;
  for (bool r : rerun) n += r;
  for (const Nest& m : nests) n += static_cast<int>(m.advance.size());
  return n;
}

std::string CheckpointPlan::describe(const Graph& g) const {
  std::string out = "policy " + policy + ": ";
  int rs = 0;
  for (const auto& s : segments) rs += s.recompute;
  out += std::to_string(rs) + " recompute segment(s), ";
  if (nests.empty())
    out += std::to_string(recomputed_layers()) + " of " + std::to_string(g.size()) + " layers recomputed";
  else
    out += std::to_string(nests.size()) + " nest(s), " + std::to_string(recomputed_layers()) +
           " layer forwards re-run (" + std::to_string(g.size()) + " layers)";
  if (offloads())
    out += ", " + std::to_string(std::count(offload.begin(), offload.end(), true)) + " layers' products offloaded";
  return out;
}

std::string CheckpointPlan::unit_layout(const Graph& g) const {
  std::string out;
  const std::vector<Segment> units = plan_units(g);
  char prev = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    const Segment& s = units[u];
    int kept = 0;  // layers keeping their output, the unit's last one aside
    bool all = true, nested = false;
    for (int i = s.begin; i < s.end; ++i) {
      const auto k = static_cast<size_t>(i);
      all = all && keep[k] && keep_extras[k];
      kept += keep[k] && i + 1 < s.end;
      nested = nested || (!nests.empty() && nest_of[static_cast<size_t>(segment_of[k])] >= 0);
    }
    const char c = nested ? 'N' : all ? '.' : kept > 0 ? 's' : 'R';
    if (u > 0 && units[u - 1].end != s.begin)
      out += ' ';
    else if (u > 0 && c == 'R' && prev == 'R' &&
             segment_of[static_cast<size_t>(s.begin)] != segment_of[static_cast<size_t>(s.begin - 1)])
      out += '|';
    out += c;
    prev = c;
  }
  return out;
}

}  // namespace remat
