// Checkpoint policies: from a policy name to segments and keep flags.
#include <cmath>
#include <cstdio>
#include <cstdlib>

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
                                       const std::vector<bool>& keep_in, const std::vector<bool>& keep_extras_in) {
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
  for (int i = 0; i < g.size(); ++i) {
    const Layer& l = g.layer(i);
    if (always_kept(l) || !p.segments[static_cast<size_t>(p.segment_of[static_cast<size_t>(i)])].recompute)
      p.keep[static_cast<size_t>(i)] = true;
    for (int j : l.inputs)
      if (p.segment_of[static_cast<size_t>(j)] != p.segment_of[static_cast<size_t>(i)])
        p.keep[static_cast<size_t>(j)] = true;
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
  return p;
}

CheckpointPlan make_plan(const Graph& g, const std::string& policy) {
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
  REMAT_THROW("unknown checkpoint policy \"", policy, "\" (expected none, all, every:K, sqrt, selective or manual)");
}

int CheckpointPlan::recomputed_layers() const {
  int n = 0;
  for (bool r : rerun) n += r;
  return n;
}

std::string CheckpointPlan::describe(const Graph& g) const {
  std::string out = "policy " + policy + ": ";
  int rs = 0;
  for (const auto& s : segments) rs += s.recompute;
  out += std::to_string(rs) + " recompute segment(s), " + std::to_string(recomputed_layers()) + " of " +
         std::to_string(g.size()) + " layers recomputed";
  return out;
}

}  // namespace remat
