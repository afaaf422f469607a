// A CheckpointPlan compiled to the instructions the executor runs (remat/schedule.h), and
// an independent check of a schedule's liveness.
#include "remat/schedule.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "remat/error.h"

namespace remat {

const char* step_name(Step s) {
  switch (s) {
    case Step::forward: return "forward";
    case Step::recompute: return "recompute";
    case Step::backward: return "backward";
    case Step::drop_extras: return "drop-extras";
    case Step::free: return "free";
    case Step::offload: return "offload";
    case Step::offload_wait: return "offload-wait";
    case Step::prefetch: return "prefetch";
    case Step::prefetch_wait: return "prefetch-wait";
    case Step::grads_final: return "grads-final";
  }
  return "?";
}

int64_t Schedule::recomputed_layers() const {
  return std::count_if(backward.begin(), backward.end(), [](const Instr& x) { return x.op == Step::recompute; });
}

std::string Schedule::listing(const Graph& g, bool with_evaluate) const {
  std::string out;
  int number = 0;
  auto section = [&](const char* title, const std::vector<Instr>& program) {
    out += std::string(title) + " (" + std::to_string(program.size()) + " instructions)\n";
    for (const Instr& x : program) {
      std::string note;
      if (x.op == Step::recompute && x.nest >= 0) note = "advance of nest " + std::to_string(x.nest);
      if (x.op == Step::recompute && x.flag) note = "extras only: its output is kept";
      if (x.op == Step::forward && !x.flag) note = "evaluation";
      if (x.op == Step::offload && !x.flag) note = "extras only: forward frees its output";
      if (x.op == Step::grads_final)
        note = std::to_string(grads_final[static_cast<size_t>(x.layer)].size()) + " parameters";
      char line[256];
      std::snprintf(line, sizeof line, "%6d  %-14s %-28s %s", ++number, step_name(x.op), g.layer(x.layer).name.c_str(),
                    note.c_str());
      std::string s = line;
      s.erase(s.find_last_not_of(' ') + 1);
      out += s + "\n";
    }
  };
  out += "schedule of policy " + policy + ": " + std::to_string(forward.size() + backward.size()) + " instructions, " +
         std::to_string(recomputed_layers()) + " layer forwards re-run\n";
  section("forward", forward);
  section("backward", backward);
  if (with_evaluate) section("evaluate", evaluate);
  return out;
}

namespace {

// What the plan means for one layer's products.
struct Lifetime {
  int fwd_last = -1;               // last forward consumer of the output, -1 if none
  bool read_by_backward = false;   // some backward reads the output
  bool read_by_recompute = false;  // a kept output some recomputed layer (or advance) reads
  int bwd_last = 0;                // smallest layer id whose backward (or recompute) reads it
  int rec_last = -1;               // last recomputed consumer within its segment
  std::vector<int> free_after;     // outputs to free after this layer's backward
  bool keep = false, keep_extras = false, rerun = false;
  int kept_by = -1;  // the nest whose advance keeps it, -1: forward
  int segment = -1;
};

// Layer i's inputs, each once (a layer may read one tensor twice).
std::vector<int> distinct_inputs(const Layer& l) {
  std::vector<int> out;
  for (int j : l.inputs)
    if (std::find(out.begin(), out.end(), j) == out.end()) out.push_back(j);
  return out;
}

bool has_extras(const Layer& l) { return !l.extra_names().empty(); }

class Compiler {
 public:
  Compiler(const Graph& g, const CheckpointPlan& p) : g_(g), p_(p), n_(g.size()) {}

  Schedule run() {
    REMAT_CHECK(static_cast<int>(p_.keep.size()) == n_ && p_.keep_extras.size() == p_.keep.size() &&
                    static_cast<int>(p_.rerun.size()) == n_ && static_cast<int>(p_.segment_of.size()) == n_,
                "plan \"", p_.policy, "\" does not match the graph (", p_.keep.size(), " layers planned, ", n_, ")");
    lifetimes();
    if (p_.offloads()) offload_points();
    Schedule s;
    s.policy = p_.policy;
    grads_final(s);
    forward(s.forward);
    backward(s.backward, s);
    evaluate(s.evaluate);
    return s;
  }

 private:
  void emit(std::vector<Instr>& v, Step op, int layer, bool flag = false, int nest = -1) {
    v.push_back(Instr{op, layer, flag, nest});
  }

  void lifetimes() {
    life_.assign(static_cast<size_t>(n_), Lifetime{});
    for (int i = 0; i < n_; ++i) {
      Lifetime& li = L(i);
      const auto k = static_cast<size_t>(i);
      li.bwd_last = n_;
      li.keep = p_.keep[k];
      li.keep_extras = p_.keep_extras[k];
      li.rerun = p_.rerun[k];
      li.kept_by = p_.kept_by.empty() ? -1 : p_.kept_by[k];
      li.segment = p_.segment_of[k];
    }
    for (int i = 0; i < n_; ++i) {
      const Layer& l = g_.layer(i);
      for (int j : l.inputs) L(j).fwd_last = std::max(L(j).fwd_last, i);
      for (int q : l.backward_inputs()) {
        Lifetime& in = L(l.inputs[static_cast<size_t>(q)]);
        in.read_by_backward = true;
        in.bwd_last = std::min(in.bwd_last, i);
      }
      if (l.backward_uses_output()) {
        L(i).read_by_backward = true;
        L(i).bwd_last = std::min(L(i).bwd_last, i);
      }
    }
    // A kept output read by a recomputed layer is that segment's checkpoint: it lives until
    // the segment is recomputed, just before the backward of the segment's last layer.
    for (int i = 0; i < n_; ++i) {
      if (!L(i).rerun) continue;
      const int seg_last = p_.segments[static_cast<size_t>(L(i).segment)].end - 1;
      for (int j : g_.layer(i).inputs) {
        if (!L(j).keep) continue;
        L(j).read_by_recompute = true;
        L(j).bwd_last = std::min(L(j).bwd_last, seg_last);
      }
    }
    // A nest's advance runs when backward reaches the nest's last layer; what it reads from
    // outside the advance (kept by forward or an enclosing advance) lives until then.
    advance_last_.assign(p_.nests.size(), {});
    for (size_t k = 0; k < p_.nests.size(); ++k) {
      const Nest& m = p_.nests[k];
      std::vector<int>& last = advance_last_[k];
      last.assign(m.advance.size(), -1);
      for (int i : m.advance)
        for (int j : g_.layer(i).inputs) {
          const int a = advance_index(m, j);
          if (a >= 0) {
            last[static_cast<size_t>(a)] = i;
          } else {
            REMAT_CHECK(L(j).keep, "plan \"", p_.policy, "\": the advance of a nest re-runs \"", g_.layer(i).name,
                        "\", which reads \"", g_.layer(j).name, "\", not kept (plan bug)");
            L(j).read_by_recompute = true;
            L(j).bwd_last = std::min(L(j).bwd_last, m.end - 1);
          }
        }
    }
    for (int j = 0; j < n_; ++j) {
      if (g_.layer(j).kind() == LayerKind::input || j == g_.loss_id) continue;
      if (L(j).bwd_last < n_) L(L(j).bwd_last).free_after.push_back(j);
    }
    // Within a recompute pass, the last recomputed consumer of each recomputed output.
    for (int i = 0; i < n_; ++i) {
      if (!L(i).rerun) continue;
      for (int j : g_.layer(i).inputs)
        if (L(j).segment == L(i).segment) L(j).rec_last = std::max(L(j).rec_last, i);
    }
  }

  // Offload: each offloaded product's device copy goes after the forward of its last
  // forward reader, and not before that of the next layer (its copy-out overlaps at least
  // one layer's compute); backward brings it back at prefetch_at and waits at need_at.
  void offload_points() {
    REMAT_CHECK(static_cast<int>(p_.offload.size()) == n_ && static_cast<int>(p_.prefetch_at.size()) == n_ &&
                    static_cast<int>(p_.need_at.size()) == n_,
                "plan \"", p_.policy, "\": offload flags do not match the graph");
    offload_done_.assign(static_cast<size_t>(n_) + 1, {});  // [n]: when forward ends
    prefetch_.assign(static_cast<size_t>(n_), {});
    prefetch_done_.assign(static_cast<size_t>(n_), {});
    for (int j = 0; j < n_; ++j) {
      if (!p_.offload[static_cast<size_t>(j)]) continue;
      const int need = p_.need_at[static_cast<size_t>(j)], at = p_.prefetch_at[static_cast<size_t>(j)];
      REMAT_CHECK(L(j).keep && L(j).kept_by < 0 && need >= j && at >= need && at < n_, "plan \"", p_.policy,
                  "\": the offload of \"", g_.layer(j).name, "\" is not planned consistently (plan bug)");
      offload_done_[static_cast<size_t>(std::min(n_, std::max(L(j).fwd_last, j + 1) + 1))].push_back(j);
      prefetch_[static_cast<size_t>(at)].push_back(j);
      prefetch_done_[static_cast<size_t>(need)].push_back(j);
    }
  }

  // A trainable parameter's gradient is final after the backward of the first layer that
  // uses it (backward runs in reverse graph order).
  void grads_final(Schedule& s) {
    s.grads_final.assign(static_cast<size_t>(n_), {});
    std::vector<int> first_use(g_.params.size(), n_);
    for (int i = 0; i < n_; ++i)
      for (int q : g_.layer_params[static_cast<size_t>(i)])
        first_use[static_cast<size_t>(q)] = std::min(first_use[static_cast<size_t>(q)], i);
    for (size_t q = 0; q < first_use.size(); ++q)
      if (first_use[q] < n_) s.grads_final[static_cast<size_t>(first_use[q])].push_back(static_cast<int>(q));
  }

  // An output whose forward life ended: kept only if backward (or a recompute) reads it and
  // the plan keeps it; freed otherwise (recompute rebuilds what backward needs). Its hash
  // is recorded where a re-run rebuilds it.
  void release_after_forward(std::vector<Instr>& v, int j) {
    if (g_.layer(j).kind() == LayerKind::input || j == g_.loss_id) return;
    const Lifetime& lj = L(j);
    if (lj.keep && lj.kept_by < 0 && (lj.read_by_backward || lj.read_by_recompute)) return;
    emit(v, Step::free, j, lj.read_by_backward || lj.kept_by >= 0);
  }

  void forward(std::vector<Instr>& v) {
    const bool off = p_.offloads();
    for (int i = 0; i < n_; ++i) {
      const Layer& l = g_.layer(i);
      if (off)
        for (int j : offload_done_[static_cast<size_t>(i)]) emit(v, Step::offload_wait, j);
      if (l.kind() == LayerKind::input) continue;
      emit(v, Step::forward, i, /*training=*/true);
      // Extras not kept are read only by this layer's backward, after a recompute.
      if (has_extras(l) && (!L(i).keep_extras || L(i).kept_by >= 0)) emit(v, Step::drop_extras, i, /*hash=*/true);
      // What forward keeps of the layer goes to host memory: its extras where kept, its
      // output where it outlives forward (else forward frees it below, copy or not).
      if (off && p_.offload[static_cast<size_t>(i)])
        emit(v, Step::offload, i, /*with_output=*/L(i).read_by_backward || L(i).read_by_recompute);
      for (int j : distinct_inputs(l))
        if (L(j).fwd_last == i) release_after_forward(v, j);
      if (L(i).fwd_last < 0) release_after_forward(v, i);
    }
    if (off)
      for (int j : offload_done_[static_cast<size_t>(n_)]) emit(v, Step::offload_wait, j);
  }

  void backward(std::vector<Instr>& v, const Schedule& s) {
    const bool off = p_.offloads();
    recomputed_.assign(p_.segments.size(), false);
    advanced_.assign(p_.nests.size(), false);
    for (int i = n_ - 1; i >= 0; --i) {
      const Layer& l = g_.layer(i);
      if (off) {
        for (int j : prefetch_[static_cast<size_t>(i)]) emit(v, Step::prefetch, j);
        for (int j : prefetch_done_[static_cast<size_t>(i)]) emit(v, Step::prefetch_wait, j);
      }
      if (l.kind() == LayerKind::input) continue;
      rebuild_for(v, i);
      emit(v, Step::backward, i);
      if (has_extras(l)) emit(v, Step::drop_extras, i);
      // Free every output whose last reader (backward or recompute) was this step.
      for (int j : L(i).free_after) emit(v, Step::free, j);
      if (i == g_.loss_id) emit(v, Step::free, i);
      if (!s.grads_final[static_cast<size_t>(i)].empty()) emit(v, Step::grads_final, i);
    }
  }

  // Before the backward of layer i: the advances of the nests that hold it, outermost
  // first, then the recompute of its segment, each once a step.
  void rebuild_for(std::vector<Instr>& v, int i) {
    const int s = L(i).segment;
    if (!p_.nests.empty()) {
      std::vector<int> path;  // the nests not yet advanced, innermost first
      for (int k = p_.nest_of[static_cast<size_t>(s)]; k >= 0 && !advanced_[static_cast<size_t>(k)];
           k = p_.nests[static_cast<size_t>(k)].parent)
        path.push_back(k);
      for (auto it = path.rbegin(); it != path.rend(); ++it) advance_nest(v, *it);
    }
    if (p_.segments[static_cast<size_t>(s)].recompute && !recomputed_[static_cast<size_t>(s)]) recompute_segment(v, s);
  }

  // A nest's advance: forward over its children but the last, keeping only the
  // checkpoints the plan gives it (their extras too where the plan keeps them); every other
  // product is freed after its last reader in the advance.
  void advance_nest(std::vector<Instr>& v, int k) {
    const Nest& m = p_.nests[static_cast<size_t>(k)];
    advanced_[static_cast<size_t>(k)] = true;
    const std::vector<int>& last = advance_last_[static_cast<size_t>(k)];
    for (size_t a = 0; a < m.advance.size(); ++a) {
      const int i = m.advance[a];
      const Layer& l = g_.layer(i);
      emit(v, Step::recompute, i, /*extras_only=*/false, k);
      const bool kept_here = L(i).kept_by == k && L(i).keep;
      if (has_extras(l) && !(kept_here && L(i).keep_extras)) emit(v, Step::drop_extras, i);
      for (int j : distinct_inputs(l)) {
        const int b = advance_index(m, j);
        if (b >= 0 && last[static_cast<size_t>(b)] == i && L(j).kept_by != k) emit(v, Step::free, j);
      }
      if (!kept_here && last[a] < 0) emit(v, Step::free, i);
    }
  }

  void recompute_segment(std::vector<Instr>& v, int s) {
    const Segment& seg = p_.segments[static_cast<size_t>(s)];
    recomputed_[static_cast<size_t>(s)] = true;
    for (int i = seg.begin; i < seg.end; ++i) {
      if (!L(i).rerun) continue;
      // A layer whose output is kept is re-run for its extras only.
      const bool extras_only = L(i).keep;
      emit(v, Step::recompute, i, extras_only);
      // Recomputed outputs that backward does not read are dropped after their last
      // recomputed consumer.
      for (int j : distinct_inputs(g_.layer(i)))
        if (L(j).rec_last == i && !L(j).keep && !L(j).read_by_backward) emit(v, Step::free, j);
      if (!extras_only && L(i).rec_last < 0 && !L(i).read_by_backward) emit(v, Step::free, i);
    }
  }

  // Evaluation: every layer once, its extras dropped, each output freed after its last
  // reader (the logits stay for the caller).
  void evaluate(std::vector<Instr>& v) {
    for (int i = 0; i < n_; ++i) {
      const Layer& l = g_.layer(i);
      if (l.kind() == LayerKind::input) continue;
      emit(v, Step::forward, i, /*training=*/false);
      if (has_extras(l)) emit(v, Step::drop_extras, i);
      for (int j : distinct_inputs(l))
        if (L(j).fwd_last == i && j != g_.logits_id && g_.layer(j).kind() != LayerKind::input) emit(v, Step::free, j);
    }
  }

  static int advance_index(const Nest& m, int j) {
    const auto it = std::lower_bound(m.advance.begin(), m.advance.end(), j);
    return it != m.advance.end() && *it == j ? static_cast<int>(it - m.advance.begin()) : -1;
  }

  Lifetime& L(int i) { return life_[static_cast<size_t>(i)]; }

  const Graph& g_;
  const CheckpointPlan& p_;
  const int n_;
  std::vector<Lifetime> life_;
  std::vector<std::vector<int>> advance_last_;  // per nest, aligned with Nest::advance: last reader in it
  std::vector<std::vector<int>> offload_done_, prefetch_, prefetch_done_;
  std::vector<bool> recomputed_, advanced_;
};

// ---- the check ----------------------------------------------------------------------------------

// Where each layer's products are during a simulated step.
struct Products {
  bool out = false, extras = false;
  // Offload: which products travel, and where they are: copied out (in flight until the
  // wait), away in host memory, copied back (in flight until the wait).
  bool trip_out = false, trip_extras = false;
  enum class Trip : uint8_t { none, out, away, back } trip = Trip::none;
};

class Checker {
 public:
  Checker(const Graph& g, const Schedule& s) : g_(g), s_(s), n_(g.size()) {}

  std::string run() {
    std::string e = program("forward", s_.forward, /*training=*/true);
    if (e.empty()) e = program("backward", s_.backward, true);
    if (e.empty()) e = end_of_step();
    if (!e.empty()) return e;
    return program("evaluate", s_.evaluate, false);
  }

 private:
  std::string program(const char* which, const std::vector<Instr>& prog, bool training) {
    const bool fresh = std::string(which) != "backward";
    if (fresh) {
      p_.assign(static_cast<size_t>(n_), Products{});
      for (int id : g_.input_ids) P(id).out = true;
      forwards_.assign(static_cast<size_t>(n_), 0);
      backwards_.assign(static_cast<size_t>(n_), 0);
      last_backward_ = n_;
    }
    for (size_t k = 0; k < prog.size(); ++k) {
      const Instr& x = prog[k];
      where_ = std::string(which) + " instruction " + std::to_string(k + 1) + " (" + step_name(x.op) + " \"" +
               (x.layer >= 0 && x.layer < n_ ? g_.layer(x.layer).name : "?") + "\")";
      if (x.layer < 0 || x.layer >= n_) return where_ + ": no such layer";
      if (const std::string e = step(x, training); !e.empty()) return where_ + ": " + e;
    }
    if (!training) {
      for (int i = 0; i < n_; ++i)
        if (g_.layer(i).kind() != LayerKind::input && forwards_[static_cast<size_t>(i)] != 1)
          return std::string(which) + ": layer \"" + g_.layer(i).name + "\" runs forward " +
                 std::to_string(forwards_[static_cast<size_t>(i)]) + " times";
      if (!P(g_.logits_id).out) return std::string(which) + ": the logits are not live at the end";
    }
    return "";
  }

  std::string read(int j, const char* what) {
    const Products& q = P(j);
    const std::string name = "\"" + g_.layer(j).name + "\" (" + what + ")";
    if (q.trip == Products::Trip::away && q.trip_out) return "reads " + name + " while it is in host memory";
    if (!q.out) return "reads " + name + ", which is not live";
    if (q.trip == Products::Trip::back && q.trip_out) return "reads " + name + " before its prefetch is waited for";
    return "";
  }

  std::string step(const Instr& x, bool training) {
    using Trip = Products::Trip;
    const Layer& l = g_.layer(x.layer);
    Products& me = P(x.layer);
    switch (x.op) {
      case Step::forward:
      case Step::recompute: {
        if (l.kind() == LayerKind::input) return "an input runs no forward";
        if (x.op == Step::forward && forwards_[static_cast<size_t>(x.layer)]++ > 0) return "runs forward twice";
        if (x.op == Step::recompute && forwards_[static_cast<size_t>(x.layer)] == 0)
          return "re-runs a layer forward never ran";
        if (x.op == Step::forward && x.flag != training) return "a forward in the wrong mode";
        for (int j : l.inputs)
          if (const std::string e = read(j, "an input"); !e.empty()) return e;
        if (x.op == Step::recompute && x.flag) {
          // For its extras only: the kept output stays where it is (on the device, or waiting
          // in host memory for its prefetch); the extras must not be mid-copy.
          if (!me.out && !(me.trip_out && me.trip == Trip::away))
            return "re-runs for its extras a layer whose output is gone";
        } else {
          if (me.trip_out && me.trip != Trip::none) return "overwrites an output whose copy is in flight or away";
          me.out = true;
        }
        if (me.trip_extras && me.trip != Trip::none) return "overwrites extras whose copy is in flight or away";
        me.extras = has_extras(l);
        return "";
      }
      case Step::backward: {
        if (backwards_[static_cast<size_t>(x.layer)]++ > 0) return "runs backward twice";
        if (x.layer >= last_backward_) return "backward out of reverse order";
        last_backward_ = x.layer;
        for (int q : l.backward_inputs())
          if (const std::string e = read(l.inputs[static_cast<size_t>(q)], "for backward"); !e.empty()) return e;
        if (l.backward_uses_output())
          if (const std::string e = read(x.layer, "its own output"); !e.empty()) return e;
        if (has_extras(l) && (!me.extras || (me.trip_extras && me.trip != Trip::none)))
          return "backward reads extras that are not live on the device";
        return "";
      }
      case Step::drop_extras:
        if (!me.extras) return "drops extras that are not live";
        if (me.trip_extras && me.trip != Trip::none) return "drops extras while their copy is in flight or away";
        me.extras = false;
        return "";
      case Step::free:
        if (me.trip_out && me.trip != Trip::none) return "frees an output while its copy is in flight or away";
        if (!me.out) return "frees an output that is not live";
        me.out = false;
        return "";
      case Step::offload:
        if (me.trip != Trip::none || me.trip_out || me.trip_extras) return "offloads a layer twice";
        if (x.flag && !me.out) return "offloads an output that is not live";
        me.trip_out = x.flag;
        me.trip_extras = me.extras;
        if (!me.trip_out && !me.trip_extras) return "offloads nothing";
        me.trip = Trip::out;
        return "";
      case Step::offload_wait:
        if (me.trip != Trip::out) return "waits for an offload that did not start";
        me.trip = Trip::away;
        if (me.trip_out) me.out = false;
        if (me.trip_extras) me.extras = false;
        return "";
      case Step::prefetch:
        if (me.trip != Trip::away) return "prefetches a product that is not in host memory";
        me.trip = Trip::back;
        if (me.trip_out) me.out = true;
        if (me.trip_extras) me.extras = true;
        return "";
      case Step::prefetch_wait:
        if (me.trip != Trip::back) return "waits for a prefetch that did not start";
        me.trip = Trip::none;
        me.trip_out = me.trip_extras = false;
        return "";
      case Step::grads_final:
        if (backwards_[static_cast<size_t>(x.layer)] == 0) return "gradients final before the layer's backward";
        return "";
    }
    return "unknown instruction";
  }

  std::string end_of_step() {
    for (int i = 0; i < n_; ++i) {
      const Layer& l = g_.layer(i);
      if (l.kind() == LayerKind::input) continue;
      if (forwards_[static_cast<size_t>(i)] == 0) return "layer \"" + l.name + "\" runs no forward";
      if (backwards_[static_cast<size_t>(i)] != 1) return "layer \"" + l.name + "\" runs no backward";
      if (P(i).out || P(i).extras || P(i).trip != Products::Trip::none)
        return "layer \"" + l.name + "\" still holds products at the end of the step";
    }
    return "";
  }

  Products& P(int i) { return p_[static_cast<size_t>(i)]; }

  const Graph& g_;
  const Schedule& s_;
  const int n_;
  std::vector<Products> p_;
  std::vector<int> forwards_, backwards_;
  int last_backward_ = 0;
  std::string where_;
};

}  // namespace

Schedule compile_schedule(const Graph& g, const CheckpointPlan& plan) { return Compiler(g, plan).run(); }

std::string check_schedule(const Graph& g, const Schedule& s) { return Checker(g, s).run(); }

}  // namespace remat
