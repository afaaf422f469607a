// Nested recompute (docs/checkpointing.md, "Nested recompute: revolve:S"): the Revolve
// table against Griewank and Walther's closed form, the executor's re-runs against the
// table, bitwise equality with the plain step, the memory each slot count takes, and the
// plan's structure.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "remat/config.h"
#include "remat/exec.h"
#include "remat/profile.h"
#include "support/expect_error.h"
#include "support/golden.h"

using remat::Batch;
using remat::Device;
using remat::Tensor;
using remat::test::bitwise_equal;
using remat::test::random_tensor;

namespace {

// n residual blocks fc1 -> GELU -> fc2 -> dropout -> add, as tests/test_executor.cpp's chain.
nlohmann::json chain(int blocks, int width = 8, double dropout = 0.2) {
  nlohmann::json block =
      nlohmann::json::array({{{"type", "linear"}, {"name", "fc1"}, {"out_features", 2 * width}, {"init_std", 0.1}},
                             {{"type", "gelu"}, {"name", "act"}},
                             {{"type", "linear"}, {"name", "fc2"}, {"out_features", width}, {"init_std", 0.1}},
                             {{"type", "dropout"}, {"name", "drop"}, {"p", dropout}},
                             {{"type", "add"}, {"name", "res"}, {"inputs", {"in", "drop"}}}});
  return {{"input", {{"type", "image"}, {"shape", {1, 4, 4}}}},
          {"layers",
           {{{"type", "flatten"}},
            {{"type", "linear"}, {"name", "proj"}, {"out_features", width}},
            {{"type", "repeat"}, {"name", "block"}, {"count", blocks}, {"layers", block}},
            {{"type", "linear"}, {"name", "head"}, {"out_features", 5}}}}};
}

Batch image_batch(int64_t b, uint32_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(b));
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>((i * 3 + seed) % 5);
  return Batch(random_tensor({b, 1, 4, 4}, seed), Tensor::from_ints(t, {b}));
}

// C(n, k) in 64 bits (small arguments).
int64_t choose(int64_t n, int64_t k) {
  if (k < 0 || k > n) return 0;
  int64_t r = 1;
  for (int64_t i = 1; i <= k; ++i) r = r * (n - k + i) / i;
  return r;
}

struct Step {
  std::vector<float> losses;
  std::vector<Tensor> state;  // gradients and weights after the last step
  int unit_forwards = 0;      // re-runs of the blocks' first layer in the last step
  int64_t recomputed = 0;
};

Step train(const remat::Graph& g, const std::string& policy, bool verify = true) {
  remat::Backend& be = remat::backend_for(Device::cpu());
  remat::ParamStore params(g, Device::cpu(), 11);
  remat::ExecOptions opt{verify};
  Step r;
  opt.on_layer = [&](int layer, remat::Phase phase, bool begin) {
    const std::string& name = g.layer(layer).name;
    if (begin && phase == remat::Phase::recompute && name.size() > 4 && name.substr(name.size() - 4) == ".fc1")
      r.unit_forwards++;
  };
  remat::Executor ex(g, params, be, remat::make_plan(g, policy), opt);
  remat::RngGenerator gen(5);
  for (int step = 1; step <= 2; ++step) {
    params.zero_grads(be);
    r.unit_forwards = 0;
    const auto st = ex.train_step(image_batch(g.batch, static_cast<uint32_t>(step)), gen);
    r.losses.push_back(st.loss);
    r.recomputed = st.recomputed_layers;
    EXPECT_EQ(st.recomputed_layers, ex.plan().recomputed_layers()) << policy;
    remat::SgdParams sp;
    sp.lr = 0.05;
    if (step == 1)
      for (size_t p = 0; p < params.values.size(); ++p)
        if (params.grads[p].defined()) be.sgd_step(params.values[p], params.grads[p], Tensor(), sp, step);
  }
  for (size_t p = 0; p < params.values.size(); ++p) {
    r.state.push_back(params.values[p].clone());
    if (params.grads[p].defined()) r.state.push_back(params.grads[p].clone());
  }
  return r;
}

}  // namespace

// Griewank and Walther (2000), Proposition 1: with s snapshots, reversing l steps takes at
// least t*l - C(s+t, s+1) forward steps, t the smallest integer with C(s+t, s) >= l.
TEST(Revolve, TableEqualsTheClosedForm) {
  const auto table = remat::revolve_table(64, 8);
  for (int s = 1; s <= 8; ++s)
    for (int n = 1; n <= 64; ++n) {
      int64_t t = 0;
      while (choose(s + t, s) < n) ++t;
      const int64_t closed = t * n - choose(s + t, s + 1);
      EXPECT_EQ(table[static_cast<size_t>(n)][static_cast<size_t>(s)].reruns, closed) << "n " << n << " s " << s;
    }
  // One slot: every unit re-run from the chain's input, 0 + 1 + ... + (n-1).
  EXPECT_EQ(table[10][1].reruns, 45);
  // As many slots as units: each unit but the last once.
  EXPECT_EQ(remat::revolve_table(10, 10)[10][10].reruns, 9);
}

TEST(Revolve, TheExecutorRerunsTheOptimalNumberOfUnitForwards) {
  const auto table = remat::revolve_table(70, 5);
  for (int n : {2, 3, 5, 8, 12, 70}) {  // 70 with one slot: nests 69 deep
    remat::Graph g = remat::build_graph(chain(n), 2, "test");
    for (int s = 1; s <= 5; ++s) {
      SCOPED_TRACE("n " + std::to_string(n) + " revolve:" + std::to_string(s));
      const Step r = train(g, "revolve:" + std::to_string(s), /*verify=*/false);
      EXPECT_EQ(r.unit_forwards, table[static_cast<size_t>(n)][static_cast<size_t>(std::min(s, n))].reruns);
    }
  }
}

TEST(Revolve, IsBitwiseTheSameStepAsThePlainOne) {
  remat::Graph g = remat::build_graph(chain(10, 8, 0.3), 3, "test");
  const Step plain = train(g, "none", false);
  for (const char* policy : {"revolve:1", "revolve:2", "revolve:3", "revolve:10", "revolve:50"}) {
    SCOPED_TRACE(policy);
    const Step r = train(g, policy);  // --verify-recompute: every rebuilt tensor hashes as forward's
    EXPECT_GT(r.recomputed, 0);
    EXPECT_EQ(r.losses, plain.losses);
    ASSERT_EQ(r.state.size(), plain.state.size());
    for (size_t k = 0; k < r.state.size(); ++k) EXPECT_TRUE(bitwise_equal(r.state[k], plain.state[k])) << k;
  }
}

TEST(Revolve, FewerSlotsTakeLessMemoryAndMoreReruns) {
  // 64 blocks on meta: the activation peak falls with the slots, far below sqrt's at one
  // or two slots, and the measured peak on the cpu equals the prediction.
  remat::Config cfg;
  cfg.model = chain(64, 64, 0.1);
  cfg.training.batch = 32;
  remat::Graph g = remat::build_graph(cfg.model, cfg.training.batch, "test");
  auto profile = [&](const std::string& policy, Device d) {
    return remat::profile_step(cfg, g, remat::make_plan(g, policy), d);
  };
  std::map<int, remat::StepProfile> by_slots;
  for (int s : {1, 2, 3, 4, 8}) by_slots.emplace(s, profile("revolve:" + std::to_string(s), Device::meta()));
  const auto sqrt = profile("sqrt", Device::meta());
  const auto all = profile("all", Device::meta());
  auto act = [](const remat::StepProfile& p) { return p.peak_by_category[remat::MemoryCategory::activation]; };
  for (auto it = std::next(by_slots.begin()); it != by_slots.end(); ++it) {
    const auto& fewer = std::prev(it)->second;
    EXPECT_LE(act(fewer), act(it->second)) << "revolve:" << std::prev(it)->first << " vs revolve:" << it->first;
    EXPECT_GE(fewer.recomputed_layers, it->second.recomputed_layers);
  }
  EXPECT_LT(act(by_slots.at(2)), act(sqrt) / 2);
  EXPECT_LT(act(by_slots.at(8)), act(all));
  const auto measured = profile("revolve:3", Device::cpu());
  EXPECT_EQ(measured.peak_bytes, by_slots.at(3).peak_bytes);
  EXPECT_EQ(measured.recomputed_layers, by_slots.at(3).recomputed_layers);
}

TEST(Revolve, PlanStructureAndErrors) {
  remat::Graph g = remat::build_graph(chain(6), 2, "test");
  EXPECT_REMAT_ERROR(remat::make_plan(g, "revolve:0"), "expected revolve:S");
  EXPECT_REMAT_ERROR(remat::make_plan(g, "revolve:"), "expected revolve:S");
  EXPECT_REMAT_ERROR(remat::make_plan(g, "revolve:x"), "expected revolve:S");
  // One slot over 6 blocks: of the first five blocks forward keeps only the last one's
  // output (the last block's input, which it runs keeping everything); the five form
  // nested ranges, each advanced from the chain's input.
  const auto one = remat::make_plan(g, "revolve:1");
  EXPECT_EQ(one.nests.size(), 4u);
  for (const remat::Nest& m : one.nests) EXPECT_GT(m.last_child_begin, m.begin);
  std::vector<std::string> kept_by_forward;
  for (int i = 0; i < g.size(); ++i)
    if (one.keep[static_cast<size_t>(i)] && one.kept_by[static_cast<size_t>(i)] < 0 &&
        g.layer(i).name.rfind("block", 0) == 0 && g.layer(i).name.rfind("block5", 0) != 0)
      kept_by_forward.push_back(g.layer(i).name);
  EXPECT_EQ(kept_by_forward, std::vector<std::string>{"block4.res"});
  // Slots beyond the block count change nothing.
  EXPECT_EQ(remat::make_plan(g, "revolve:6").recomputed_layers(),
            remat::make_plan(g, "revolve:60").recomputed_layers());
  // A nest that cuts a segment in two is refused.
  std::vector<bool> keep(static_cast<size_t>(g.size()), false);
  const auto units = remat::plan_units(g);
  std::vector<remat::Segment> segs;
  for (const auto& u : units) segs.push_back({u.begin, u.end, true});
  EXPECT_REMAT_ERROR(
      remat::make_plan_from_segments(g, "bad", segs, keep, {}, {remat::Nest{units[0].begin + 1, units[2].end}}),
      "does not start and end at segment boundaries");
  EXPECT_REMAT_ERROR(remat::make_plan_from_segments(
                         g, "bad", segs, keep, {},
                         {remat::Nest{units[0].begin, units[2].end}, remat::Nest{units[1].begin, units[3].end}}),
                     "overlaps another");
  EXPECT_REMAT_ERROR(
      remat::make_plan_from_segments(g, "bad", segs, keep, {}, {remat::Nest{units[1].begin, units[1].end}}),
      "has a single child");
}

// Every nested plan of short chains that recomputes every unit but the last (top-level
// parts, each one recomputed unit or any binary tree of nests over its units; the last unit
// kept or not), simulated on meta: none is better in both peak and re-run FLOPs than some
// revolve:S, so Revolve's slot model picks plans on the Pareto front of what the executor
// runs. (Plans that also keep whole units are not in this family: keeping a unit trades
// memory for re-runs differently, and the budget planner mixes the two.)
TEST(Revolve, NoNestedPlanOfAShortChainBeatsIt) {
  for (int n : {3, 4, 5, 6}) {
    SCOPED_TRACE("blocks " + std::to_string(n));
    remat::Config cfg;
    cfg.model = chain(n, 32, 0.1);
    cfg.training.batch = 16;
    remat::Graph g = remat::build_graph(cfg.model, cfg.training.batch, "test");
    const auto units = remat::plan_units(g);
    struct Point {
      int64_t peak;
      double flops;
    };
    auto measure = [&](const remat::CheckpointPlan& plan) {
      const auto p = remat::profile_step(cfg, g, plan, Device::meta(), false);
      return Point{p.peak_bytes, p.recompute_flops};
    };
    std::vector<Point> revolve;
    for (int s = 1; s <= n; ++s) revolve.push_back(measure(remat::make_plan(g, "revolve:" + std::to_string(s))));
    // Trees over units [a, b): the nests and leaf segments, one shape at a time.
    std::vector<remat::Segment> segs;
    std::vector<remat::Nest> nests;
    std::vector<bool> keep;
    int plans = 0;
    std::function<void(int, std::function<void()>)> parts;
    std::function<void(int, int, std::function<void()>)> tree = [&](int a, int b, std::function<void()> next) {
      if (b - a == 1) {
        segs.push_back({units[static_cast<size_t>(a)].begin, units[static_cast<size_t>(a)].end, true});
        next();
        segs.pop_back();
        return;
      }
      for (int m = a + 1; m < b; ++m) {
        nests.emplace_back(units[static_cast<size_t>(a)].begin, units[static_cast<size_t>(b - 1)].end);
        tree(a, m, [&, m, b] { tree(m, b, next); });
        nests.pop_back();
      }
    };
    parts = [&](int a, std::function<void()> done) {
      if (a == n) return done();
      for (int b = a + 1; b <= n; ++b) {
        for (int u = units[static_cast<size_t>(a)].begin; u < units[static_cast<size_t>(b - 1)].end; ++u)
          keep[static_cast<size_t>(u)] = false;
        tree(a, b, [&, b] { parts(b, done); });
        for (int u = units[static_cast<size_t>(a)].begin; u < units[static_cast<size_t>(b - 1)].end; ++u)
          keep[static_cast<size_t>(u)] = true;
        if (b == a + 1 && b == n) parts(b, done);  // the last unit kept
      }
    };
    keep.assign(static_cast<size_t>(g.size()), true);
    parts(0, [&] {
      std::vector<remat::Segment> sorted = segs;
      std::sort(sorted.begin(), sorted.end(), [](const auto& x, const auto& y) { return x.begin < y.begin; });
      const Point t = measure(remat::make_plan_from_segments(g, "tree", sorted, keep, {}, nests));
      ++plans;
      bool dominated = false;
      for (const Point& r : revolve) dominated = dominated || (r.peak <= t.peak && r.flops <= t.flops);
      EXPECT_TRUE(dominated) << "plan " << plans << ": peak " << t.peak << ", re-run FLOPs " << t.flops;
    });
    if (n == 3) {
      EXPECT_EQ(plans, 7);  // [3] two ways; [1 2], [2 1], [1 1 1]; the last two with the last unit kept
    }
    EXPECT_GT(plans, 2 * n);
  }
}
