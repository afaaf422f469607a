// The schedule a plan compiles to (remat/schedule.h, docs/checkpointing.md "The
// schedule"): every policy of every test model passes the independent liveness check, the
// check catches broken schedules, and the executor runs exactly the schedule's forward,
// recompute and backward instructions in order.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>

#include "remat/config.h"
#include "remat/exec.h"
#include "remat/ops.h"
#include "support/expect_error.h"
#include "support/models.h"

using remat::Device;
using remat::Instr;
using remat::Step;

namespace {

remat::Graph tiny(const std::string& name, int64_t batch = 2) {
  const std::string path = std::string(REMAT_SOURCE_DIR) + "/tests/configs/" + name;
  return remat::build_graph(remat::load_config(path).model, batch, path, {{"vocab", 24}});
}

const char* const kPolicies[] = {
    "none",      "all",          "sqrt",         "selective",           "every:2",          "revolve:1", "revolve:2",
    "revolve:3", "none+offload", "sqrt+offload", "selective+offload:1", "revolve:2+offload"};

int count(const std::vector<Instr>& prog, Step op, int layer = -1) {
  int c = 0;
  for (const Instr& x : prog) c += x.op == op && (layer < 0 || x.layer == layer);
  return c;
}

// The first instruction of `op` in `prog` for which `pred` holds; -1 if none.
template <typename Pred>
int find(const std::vector<Instr>& prog, Step op, Pred pred) {
  for (size_t k = 0; k < prog.size(); ++k)
    if (prog[k].op == op && pred(prog[k])) return static_cast<int>(k);
  return -1;
}

}  // namespace

// Every test config under every policy that applies to it: the compiled schedule passes
// the liveness check, runs each layer's forward once, re-runs exactly the layers the plan
// counts, and offloads exactly the layers the plan marks (each out, waited for, back and
// waited for again, in that order).
TEST(Schedule, EveryPolicyOfEveryTestModelPassesTheCheck) {
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(REMAT_SOURCE_DIR) + "/tests/configs")) {
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    const remat::Graph g = tiny(name);
    for (const char* policy : kPolicies) {
      SCOPED_TRACE(policy);
      remat::CheckpointPlan p;
      try {
        p = remat::make_plan(g, policy);
      } catch (const remat::Error&) {
        continue;  // e.g. offload in a model of one unit
      }
      const remat::Schedule s = remat::compile_schedule(g, p);
      EXPECT_EQ(remat::check_schedule(g, s), "");
      EXPECT_EQ(s.recomputed_layers(), p.recomputed_layers());
      for (int i = 0; i < g.size(); ++i) {
        if (g.layer(i).kind() == remat::LayerKind::input) continue;
        EXPECT_EQ(count(s.forward, Step::forward, i), 1) << g.layer(i).name;
        EXPECT_EQ(count(s.backward, Step::backward, i), 1) << g.layer(i).name;
        EXPECT_EQ(count(s.evaluate, Step::forward, i), 1) << g.layer(i).name;
        const int off = p.offloads() && p.offload[static_cast<size_t>(i)] ? 1 : 0;
        EXPECT_EQ(count(s.forward, Step::offload, i), off) << g.layer(i).name;
        EXPECT_EQ(count(s.forward, Step::offload_wait, i), off) << g.layer(i).name;
        EXPECT_EQ(count(s.backward, Step::prefetch, i), off) << g.layer(i).name;
        EXPECT_EQ(count(s.backward, Step::prefetch_wait, i), off) << g.layer(i).name;
      }
      EXPECT_EQ(count(s.forward, Step::recompute) + count(s.forward, Step::backward), 0);
      ++checked;
    }
  }
  EXPECT_GT(checked, 80);
}

// The check is not a formality: each broken schedule is named for what breaks.
TEST(Schedule, TheCheckCatchesBrokenSchedules) {
  const remat::Graph g = tiny("gpt_char_tiny.json");
  const remat::Schedule sqrt = remat::compile_schedule(g, remat::make_plan(g, "sqrt"));
  ASSERT_EQ(remat::check_schedule(g, sqrt), "");
  {  // a recompute left out: a later reader finds its output gone
    remat::Schedule s = sqrt;
    const int k = find(s.backward, Step::recompute, [](const Instr& x) { return !x.flag; });
    ASSERT_GE(k, 0);
    s.backward.erase(s.backward.begin() + k);
    EXPECT_NE(remat::check_schedule(g, s).find("which is not live"), std::string::npos) << remat::check_schedule(g, s);
  }
  {  // a free left out: the step ends holding it
    remat::Schedule s = sqrt;
    const int k = find(s.backward, Step::free, [](const Instr&) { return true; });
    ASSERT_GE(k, 0);
    s.backward.erase(s.backward.begin() + k);
    EXPECT_NE(remat::check_schedule(g, s).find("still holds products at the end of the step"), std::string::npos)
        << remat::check_schedule(g, s);
  }
  {  // forward frees an output before its last forward reader
    remat::Schedule s = sqrt;
    const int k = find(s.forward, Step::free, [&](const Instr& x) { return x.layer > 0; });
    ASSERT_GE(k, 0);
    const Instr freed = s.forward[static_cast<size_t>(k)];
    s.forward.erase(s.forward.begin() + k);
    const int w = find(s.forward, Step::forward, [&](const Instr& x) { return x.layer == freed.layer; });
    s.forward.insert(s.forward.begin() + w + 1, freed);
    EXPECT_NE(remat::check_schedule(g, s).find("reads \"" + g.layer(freed.layer).name + "\""), std::string::npos)
        << remat::check_schedule(g, s);
  }
  {  // two backwards of one layer, and backward out of order
    remat::Schedule s = sqrt;
    const int k = find(s.backward, Step::backward, [](const Instr&) { return true; });
    s.backward.insert(s.backward.begin() + k, s.backward[static_cast<size_t>(k)]);
    EXPECT_NE(remat::check_schedule(g, s).find("runs backward twice"), std::string::npos);
    s = sqrt;
    const int a = find(s.backward, Step::backward, [](const Instr&) { return true; });
    const int b = find(s.backward, Step::backward, [&](const Instr& x) { return x.layer < s.backward[a].layer; });
    std::swap(s.backward[static_cast<size_t>(a)], s.backward[static_cast<size_t>(b)]);
    EXPECT_NE(remat::check_schedule(g, s).find("backward out of reverse order"), std::string::npos);
  }
  const remat::Schedule off = remat::compile_schedule(g, remat::make_plan(g, "none+offload"));
  ASSERT_EQ(remat::check_schedule(g, off), "");
  {  // a trip back left out: backward reads a product still in host memory
    remat::Schedule s = off;
    const int k = find(s.forward, Step::offload, [](const Instr& x) { return x.flag; });
    ASSERT_GE(k, 0);
    const int layer = s.forward[static_cast<size_t>(k)].layer;
    s.backward.erase(std::remove_if(s.backward.begin(), s.backward.end(),
                                    [&](const Instr& x) {
                                      return x.layer == layer &&
                                             (x.op == Step::prefetch || x.op == Step::prefetch_wait);
                                    }),
                     s.backward.end());
    EXPECT_NE(remat::check_schedule(g, s).find("\"" + g.layer(layer).name + "\" (for backward) while it is in host"),
              std::string::npos)
        << remat::check_schedule(g, s);
  }
  {  // the output freed while its copy-out is in flight
    remat::Schedule s = off;
    const int k = find(s.forward, Step::offload, [](const Instr& x) { return x.flag; });
    s.forward.insert(s.forward.begin() + k + 1, Instr{Step::free, s.forward[static_cast<size_t>(k)].layer});
    EXPECT_NE(remat::check_schedule(g, s).find("frees an output while its copy is in flight"), std::string::npos)
        << remat::check_schedule(g, s);
  }
  {  // compute does not wait for the copy back before its reader
    remat::Schedule s = off;
    const int k = find(s.backward, Step::prefetch_wait, [](const Instr&) { return true; });
    ASSERT_GE(k, 0);
    const Instr wait = s.backward[static_cast<size_t>(k)];
    s.backward.erase(s.backward.begin() + k);
    s.backward.push_back(wait);
    EXPECT_NE(remat::check_schedule(g, s).find("before its prefetch is waited for"), std::string::npos)
        << remat::check_schedule(g, s);
  }
}

// The executor interprets its schedule and nothing else: the layer spans it reports (the
// memory profiler's hook) are the schedule's forward, recompute and backward instructions,
// in order, and the re-runs it counts are the schedule's.
TEST(Schedule, TheExecutorRunsItsScheduleInOrder) {
  for (const char* name : {"gpt_char_tiny.json", "nmt_tiny.json", "fashion_cnn_tiny.json"})
    for (const char* policy : {"none", "sqrt", "selective", "revolve:2"}) {
      SCOPED_TRACE(std::string(name) + " " + policy);
      const remat::Graph g = tiny(name);
      remat::ParamStore params(g, Device::cpu(), 7);
      params.zero_grads(remat::backend_for(Device::cpu()));
      std::vector<std::pair<int, remat::Phase>> seen;
      remat::ExecOptions opt;
      opt.on_layer = [&](int layer, remat::Phase phase, bool begin) {
        if (begin) seen.emplace_back(layer, phase);
      };
      remat::Executor ex(g, params, remat::backend_for(Device::cpu()), remat::make_plan(g, policy), opt);
      remat::RngGenerator gen(3);
      const remat::StepStats st = ex.train_step(remat::test::batch_for(g, 1), gen);
      std::vector<std::pair<int, remat::Phase>> expected;
      for (const auto* prog : {&ex.schedule().forward, &ex.schedule().backward})
        for (const Instr& x : *prog) {
          if (x.op == Step::forward) expected.emplace_back(x.layer, remat::Phase::forward);
          if (x.op == Step::recompute) expected.emplace_back(x.layer, remat::Phase::recompute);
          if (x.op == Step::backward) expected.emplace_back(x.layer, remat::Phase::backward);
        }
      EXPECT_EQ(seen, expected);
      EXPECT_EQ(st.recomputed_layers, ex.schedule().recomputed_layers());
      EXPECT_EQ(st.recomputed_layers, ex.plan().recomputed_layers());
    }
}

// The listing `remat memprof --schedule` prints: a heading, then each program's
// instructions numbered in order, one a line, naming the operation and the layer.
TEST(Schedule, ListingNamesEveryInstructionInOrder) {
  const remat::Graph g = tiny("gpt_char_tiny.json");
  const remat::Schedule s = remat::compile_schedule(g, remat::make_plan(g, "revolve:2+offload"));
  std::istringstream in(s.listing(g));
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "schedule of policy revolve:2+offload: " + std::to_string(s.forward.size() + s.backward.size()) +
                      " instructions, " + std::to_string(s.recomputed_layers()) + " layer forwards re-run");
  int number = 0;
  for (const auto* prog : {&s.forward, &s.backward}) {
    std::getline(in, line);
    EXPECT_EQ(line, std::string(prog == &s.forward ? "forward" : "backward") + " (" + std::to_string(prog->size()) +
                        " instructions)");
    for (const Instr& x : *prog) {
      std::getline(in, line);
      // "%6d  op name [note]": the number, the operation, the layer, then the note.
      std::istringstream fields(line);
      int k = 0;
      std::string op, name, note;
      ASSERT_TRUE(fields >> k >> op >> name) << line;
      std::getline(fields >> std::ws, note);
      EXPECT_EQ(k, ++number);
      EXPECT_EQ(op, remat::step_name(x.op));
      EXPECT_EQ(name, g.layer(x.layer).name);
      if (x.op == Step::recompute && x.nest >= 0) {
        EXPECT_EQ(note, "advance of nest " + std::to_string(x.nest));
      }
    }
  }
  EXPECT_FALSE(std::getline(in, line)) << line;
  EXPECT_GT(count(s.backward, Step::recompute), 0);
  EXPECT_GT(count(s.backward, Step::prefetch), 0);
  EXPECT_GE(find(s.backward, Step::recompute, [](const Instr& x) { return x.nest >= 0; }), 0);
}

namespace {

// Sets "impl": "materialized" on every attention layer of a model's JSON.
void materialize_attention(nlohmann::json& j) {
  if (j.is_object()) {
    if (j.value("type", "") == "attention") j["impl"] = "materialized";
    for (auto& v : j) materialize_attention(v);
  } else if (j.is_array()) {
    for (auto& v : j) materialize_attention(v);
  }
}

}  // namespace

// The planner's every:K+selective with offload, K = 3 units: the materialized attention
// keeps its output (offloaded) and re-runs for its probabilities only, while that output
// still waits in host memory (its prefetch comes one unit later). A re-run for extras does
// not read its own output, so the schedule is valid: it passes the check and a step runs.
TEST(Schedule, ExtrasOnlyRerunWhileItsOutputWaitsInHostMemory) {
  const std::string path = std::string(REMAT_SOURCE_DIR) + "/tests/configs/gpt_char_tiny.json";
  nlohmann::json model = remat::load_config(path).model;
  materialize_attention(model);
  const remat::Graph g = remat::build_graph(model, 2, path, {{"vocab", 24}});
  const std::vector<remat::Segment> units = remat::plan_units(g);
  ASSERT_EQ(units.size(), 4u);
  const std::vector<remat::Segment> segs{{units[0].begin, units[2].end, true}, {units[3].begin, units[3].end, true}};
  std::vector<bool> keep(static_cast<size_t>(g.size()), true), keep_extras = keep;
  for (const auto& s : segs) remat::keep_selective(g, s, keep, keep_extras);
  remat::CheckpointPlan p = remat::make_plan_from_segments(g, "every:3+selective", segs, keep, keep_extras);
  remat::add_offload(g, p);
  const remat::Schedule s = remat::compile_schedule(g, p);
  // The case itself: an extras-only re-run of a layer whose output is offloaded, before its prefetch.
  bool away = false;
  for (size_t k = 0; k < s.backward.size() && !away; ++k) {
    const Instr& x = s.backward[k];
    if (x.op != Step::recompute || !x.flag || !p.offload[static_cast<size_t>(x.layer)]) continue;
    away = find(s.backward, Step::prefetch, [&](const Instr& y) { return y.layer == x.layer; }) > static_cast<int>(k);
  }
  ASSERT_TRUE(away) << "the plan no longer re-runs an offloaded layer for its extras before its prefetch";
  EXPECT_EQ(remat::check_schedule(g, s), "");
  remat::ParamStore params(g, Device::meta(), 1);
  remat::Executor ex(g, params, remat::backend_for(Device::meta()), p);
  remat::RngGenerator gen(1);
  EXPECT_EQ(ex.train_step(remat::test::batch_for(g, 1, Device::meta()), gen).recomputed_layers, s.recomputed_layers());
}
