// Activation offload's plan (docs/checkpointing.md, "Offload"): which products a
// "+offload" policy sends to host memory and when backward brings them back, and the
// refusal where there is no second memory. The offloading step itself (bitwise, peaks
// measured equal to the prediction) runs on the CUDA backend: tests/test_device_exec.cpp.
#include <gtest/gtest.h>

#include <string>

#include "remat/config.h"
#include "remat/exec.h"
#include "remat/profile.h"
#include "support/expect_error.h"
#include "support/models.h"

using remat::Device;

namespace {

remat::Graph tiny(const char* name, int64_t batch = 2) {
  const std::string path = std::string(REMAT_SOURCE_DIR) + "/tests/configs/" + name;
  return remat::build_graph(remat::load_config(path).model, batch, path, {{"vocab", 24}});
}

}  // namespace

// gpt_char_tiny (4 blocks): every product forward keeps in the first three blocks and the
// embedding is offloaded, nothing of the last block, no view, nothing a nest's advance
// keeps; each comes back one unit ahead of its first reader.
TEST(Offload, PlanMovesWhatForwardKeepsBeforeTheLastUnit) {
  const remat::Graph g = tiny("gpt_char_tiny.json");
  const std::vector<remat::Segment> units = remat::plan_units(g);
  ASSERT_EQ(units.size(), 4u);
  for (const char* base : {"none", "sqrt", "selective", "revolve:1"}) {
    SCOPED_TRACE(base);
    const remat::CheckpointPlan plain = remat::make_plan(g, base);
    const remat::CheckpointPlan p = remat::make_plan(g, std::string(base) + "+offload");
    EXPECT_EQ(p.policy, std::string(base) + "+offload");
    EXPECT_EQ(p.keep, plain.keep);
    EXPECT_EQ(p.rerun, plain.rerun);
    ASSERT_TRUE(p.offloads());
    int offloaded = 0;
    for (int j = 0; j < g.size(); ++j) {
      const auto k = static_cast<size_t>(j);
      const remat::Layer& l = g.layer(j);
      if (!p.offload[k]) {
        EXPECT_EQ(p.prefetch_at[k], -1) << l.name;
        continue;
      }
      ++offloaded;
      EXPECT_LT(j, units.back().begin) << l.name << ": in the last unit";
      EXPECT_TRUE(p.keep[k] && p.kept_by[k] < 0) << l.name;
      EXPECT_NE(l.kind(), remat::LayerKind::view) << l.name;
      EXPECT_NE(l.kind(), remat::LayerKind::input) << l.name;
      EXPECT_GE(p.need_at[k], j) << l.name;
      EXPECT_GT(p.prefetch_at[k], p.need_at[k]) << l.name << ": prefetched at its first reader, not ahead";
    }
    EXPECT_GT(offloaded, 0);
    // What forward keeps and backward reads in the first block is all offloaded.
    for (int j = units[0].begin; j < units[0].end; ++j) {
      const auto k = static_cast<size_t>(j);
      const remat::Layer& l = g.layer(j);
      bool read = l.backward_uses_output() || (p.keep_extras[k] && !l.extra_names().empty());
      for (int i = j + 1; i < g.size(); ++i) {
        const remat::Layer& r = g.layer(i);
        for (int in : r.backward_inputs()) read = read || r.inputs[static_cast<size_t>(in)] == j;
        if (p.rerun[static_cast<size_t>(i)])
          for (int in : r.inputs) read = read || in == j;
      }
      const bool moves = p.keep[k] && p.kept_by[k] < 0 && l.kind() != remat::LayerKind::view;
      if (moves && read) {
        EXPECT_TRUE(p.offload[k]) << l.name;
      }
    }
    EXPECT_NE(p.describe(g).find("offloaded"), std::string::npos) << p.describe(g);
  }
}

// In a model of one repeated block (fashion_cnn_tiny), each layer counts as a unit.
TEST(Offload, OneBlockModelsOffloadLayerByLayer) {
  const remat::Graph g = tiny("fashion_cnn_tiny.json");
  ASSERT_EQ(remat::plan_units(g).size(), 1u);
  const remat::CheckpointPlan p = remat::make_plan(g, "none+offload");
  EXPECT_TRUE(p.offloads());
  EXPECT_FALSE(p.offload[static_cast<size_t>(g.size() - 2)]) << "the last layer before the loss";
}

// The cpu backend's memory is host memory: an offloading plan is refused with the reason,
// before any step runs; an unknown suffix names the policies.
TEST(Offload, CpuRefusesWithTheReason) {
  const remat::Graph g = tiny("gpt_char_tiny.json");
  remat::ParamStore params(g, Device::cpu(), 1);
  remat::Backend& be = remat::backend_for(Device::cpu());
  EXPECT_REMAT_ERROR(remat::Executor ex(g, params, be, remat::make_plan(g, "sqrt+offload")),
                     "policy \"sqrt+offload\" offloads activations to host memory, which cpu cannot do: the cpu "
                     "backend has no memory apart from the host's to offload to (offload needs a GPU: --device cuda, "
                     "or cuda-emu to try it)");
  EXPECT_REMAT_ERROR(remat::make_plan(g, "sqrt+offlaod"), "unknown checkpoint policy \"sqrt+offlaod\"");
  EXPECT_REMAT_ERROR(remat::make_plan(g, "+offload"), "unknown checkpoint policy \"+offload\"");
}

// "+offload:J" offloads the products of the first J units only: exactly what "+offload"
// offloads before the (J+1)-th unit begins, with the same prefetch points; J = units - 1
// is "+offload". J outside 1 .. units - 1, or not a number, is refused naming the range.
// (Under sqrt and revolve:1 some units keep nothing forward holds: J adds nothing there.)
TEST(Offload, FirstJUnitsOffloadThatPrefixOfTheFullPlan) {
  const remat::Graph g = tiny("gpt_char_tiny.json");
  const std::vector<remat::Segment> units = remat::offload_units(g);
  ASSERT_EQ(units.size(), 4u);
  for (const char* base : {"none", "sqrt", "selective", "revolve:1"}) {
    SCOPED_TRACE(base);
    const remat::CheckpointPlan full = remat::make_plan(g, std::string(base) + "+offload");
    size_t before = 0;  // products offloaded by the shorter prefix
    for (int j = 1; j <= 3; ++j) {
      const std::string policy = std::string(base) + "+offload:" + std::to_string(j);
      const remat::CheckpointPlan p = remat::make_plan(g, policy);
      EXPECT_EQ(p.policy, policy);
      EXPECT_EQ(p.keep, full.keep);
      size_t count = 0;
      for (int l = 0; l < g.size(); ++l) {
        const auto k = static_cast<size_t>(l);
        const bool in_prefix = l < units[static_cast<size_t>(j)].begin;
        EXPECT_EQ(p.offload[k], full.offload[k] && in_prefix) << g.layer(l).name << " J " << j;
        EXPECT_EQ(p.prefetch_at[k], p.offload[k] ? full.prefetch_at[k] : -1) << g.layer(l).name;
        EXPECT_EQ(p.need_at[k], p.offload[k] ? full.need_at[k] : -1) << g.layer(l).name;
        count += p.offload[k];
      }
      // Each unit adds what it keeps: under none and selective every unit keeps some.
      const bool every_unit_keeps = std::string(base) == "none" || std::string(base) == "selective";
      EXPECT_TRUE(every_unit_keeps ? count > before : count >= before)
          << "J " << j << ": " << count << " vs " << before;
      before = count;
      if (j == 3) {
        EXPECT_EQ(p.offload, full.offload);
      }
    }
  }
  EXPECT_REMAT_ERROR(remat::make_plan(g, "sqrt+offload:4"),
                     "policy \"sqrt+offload:4\": J counts the units offloaded, 1 to 3 (every unit but the last of 4)");
  EXPECT_REMAT_ERROR(remat::make_plan(g, "sqrt+offload:0"),
                     "policy \"sqrt+offload:0\": expected +offload:J with J (the units offloaded) a positive integer");
  for (const char* bad : {"sqrt+offload:", "sqrt+offload:2x", "sqrt+offload:-1", "sqrt+offload: 2"})
    EXPECT_REMAT_ERROR(remat::make_plan(g, bad), "expected +offload:J with J (the units offloaded) a positive integer");
  EXPECT_REMAT_ERROR(remat::make_plan(g, "sqrt+offloads"), "unknown checkpoint policy \"sqrt+offloads\"");
  EXPECT_REMAT_ERROR(remat::make_plan(g, "sqrt+offload:2+offload"),
                     "policy \"sqrt+offload:2+offload\": +offload twice");
}

// A budget plan chooses how many units to offload itself.
TEST(Offload, BudgetPlansTakeNoUnitCount) {
  const std::string path = std::string(REMAT_SOURCE_DIR) + "/tests/configs/gpt_char_tiny.json";
  const remat::Config cfg = remat::load_config(path);
  const remat::Graph g = remat::build_graph(cfg.model, 2, path, {{"vocab", 24}});
  EXPECT_REMAT_ERROR(remat::resolve_policy(cfg, g, "budget:1GiB+offload:2"),
                     "policy \"budget:1GiB+offload:2\": a budget plan chooses how many units to offload itself; "
                     "write budget:SIZE+offload");
}
