// Gradient accumulation (training.micro_batch): the reduced gradient is bitwise the
// micro-batches' gradients summed left to right and scaled by 1/K, under every policy;
// it is close to the full batch's; the memory model counts the accumulation buffer.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "remat/io.h"
#include "remat/profile.h"
#include "remat/train.h"
#include "support/expect_error.h"

namespace fs = std::filesystem;

namespace {

std::string tmp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("remat_micro_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::string write_config(const std::string& dir, double dropout, const std::string& extra_training = "") {
  const std::string path = dir + "/tiny.json";
  std::ofstream(path) << R"({
    "name": "tiny",
    "model": {
      "input": {"type": "image", "shape": [1, 6, 6]},
      "layers": [
        {"type": "flatten"},
        {"type": "linear", "name": "proj", "out_features": 24},
        {"type": "repeat", "name": "b", "count": 4, "checkpoint": true, "layers": [
          {"type": "linear", "name": "fc1", "out_features": 32},
          {"type": "gelu", "name": "act"},
          {"type": "linear", "name": "fc2", "out_features": 24},
          {"type": "dropout", "name": "drop", "p": )"
                      << dropout << R"(},
          {"type": "add", "name": "res", "inputs": ["in", "drop"]}
        ]},
        {"type": "linear", "name": "head", "out_features": 4}
      ]
    },
    "data": {"dataset": "synthetic_images", "image_shape": [1, 6, 6], "classes": 4, "synthetic_size": 96},
    "optimizer": {"type": "adamw", "lr": 0.01, "weight_decay": 0.01},
    "training": {"batch": 8, "steps": 3, "policy": "sqrt", "log_every": 1)"
                      << extra_training << R"(}
  })";
  return path;
}

std::vector<float> flat(const std::vector<remat::Tensor>& grads) {
  std::vector<float> out;
  for (const auto& g : grads)
    if (g.defined()) {
      const std::vector<float> v = g.to_vector();
      out.insert(out.end(), v.begin(), v.end());
    }
  return out;
}

std::map<std::string, std::vector<float>> weights(const std::string& run) {
  std::map<std::string, std::vector<float>> w;
  auto f = remat::SafetensorsFile::load(run + "/checkpoint/model.safetensors");
  for (const auto& e : f.entries()) w[e.name] = f.tensor(e.name).to_vector();
  return w;
}

}  // namespace

TEST(MicroBatch, GradientIsTheFixedOrderSumOfTheMicroBatchesUnderEveryPolicy) {
  const std::string dir = tmp_dir("sum");
  const std::string cfg = write_config(dir, 0.2);
  for (const char* policy : {"none", "all", "every:2", "sqrt", "selective"}) {
    remat::TrainOptions o;
    o.config = cfg;
    o.device = "cpu";
    o.policy = policy;
    o.quiet = true;
    o.micro_batch = 2;  // 4 micro-batches per step
    std::vector<std::vector<float>> micro;
    int checked = 0;
    o.on_grads = [&](int64_t m, const std::vector<remat::Tensor>& grads) {
      if (m >= 0) {
        ASSERT_EQ(m, static_cast<int64_t>(micro.size()));
        micro.push_back(flat(grads));
        return;
      }
      ASSERT_EQ(micro.size(), 4u);
      // The reference: left to right in micro-batch order, then times 1/K, in float.
      std::vector<float> want = micro[0];
      for (size_t k = 1; k < micro.size(); ++k)
        for (size_t i = 0; i < want.size(); ++i) want[i] += micro[k][i];
      for (float& v : want) v *= 1.0f / 4.0f;
      const std::vector<float> got = flat(grads);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << policy << " element " << i;
      EXPECT_NE(micro[0], micro[1]) << "the micro-batches are different samples";
      micro.clear();
      ++checked;
    };
    remat::train(o);
    EXPECT_EQ(checked, 3) << policy;
  }
  fs::remove_all(dir);
}

TEST(MicroBatch, CloseToTheFullBatchAndTheSameUnderEveryPolicy) {
  const std::string dir = tmp_dir("close");
  const std::string cfg = write_config(dir, 0.0);
  auto run = [&](int64_t micro, const std::string& policy, std::vector<float>* first_grad) {
    remat::TrainOptions o;
    o.config = cfg;
    o.device = "cpu";
    o.policy = policy;
    o.quiet = true;
    o.micro_batch = micro;
    o.out = dir + "/run_" + std::to_string(micro) + "_" + policy;
    o.on_grads = [&](int64_t m, const std::vector<remat::Tensor>& g) {
      if (first_grad->empty() && m == (micro == 0 ? 0 : -1)) *first_grad = flat(g);
    };
    const remat::TrainResult r = remat::train(o);
    return std::make_pair(r, weights(o.out));
  };
  std::vector<float> g_full, g_micro;
  const auto [full, w_full] = run(0, "none", &g_full);
  const auto [micro, w_micro] = run(2, "none", &g_micro);
  ASSERT_EQ(g_full.size(), g_micro.size());
  for (size_t i = 0; i < g_full.size(); ++i)
    EXPECT_NEAR(g_micro[i], g_full[i], 1e-6 + 1e-5 * std::fabs(g_full[i])) << "gradient element " << i;
  for (size_t s = 0; s < full.losses.size(); ++s) EXPECT_NEAR(micro.losses[s], full.losses[s], 1e-5) << "step " << s;
  for (const auto& [name, w] : w_full)
    for (size_t i = 0; i < w.size(); ++i)
      ASSERT_NEAR(w_micro.at(name)[i], w[i], 1e-4 + 1e-4 * std::fabs(w[i])) << name << "[" << i << "]";
  // Checkpointing changes no bit of a micro-batched run.
  for (const char* policy : {"all", "sqrt", "selective"}) {
    std::vector<float> g;
    const auto [r, w] = run(2, policy, &g);
    EXPECT_EQ(r.losses, micro.losses) << policy;
    EXPECT_EQ(w, w_micro) << policy;
  }
  fs::remove_all(dir);
}

TEST(MicroBatch, MustDivideTheBatch) {
  const std::string dir = tmp_dir("divide");
  remat::TrainOptions o;
  o.config = write_config(dir, 0.0);
  o.device = "cpu";
  o.quiet = true;
  o.micro_batch = 3;
  EXPECT_REMAT_ERROR(remat::train(o), "/training/micro_batch: 3 does not divide /training/batch 8");
  EXPECT_REMAT_ERROR(remat::load_config(write_config(dir, 0.0, R"(, "micro_batch": 5)")),
                     "tiny.json: /training/micro_batch: 5 does not divide /training/batch 8");
  fs::remove_all(dir);
}

// The trainer's measured peak grows by what the memory model says the accumulation
// buffer costs: the profile of a micro-batched step (meta) against the measured run.
TEST(MicroBatch, MeasuredPeakMatchesTheMemoryModel) {
  const std::string dir = tmp_dir("peak");
  const std::string cfg_path = write_config(dir, 0.0);
  auto measured = [&](int64_t micro) {
    remat::TrainOptions o;
    o.config = cfg_path;
    o.device = "cpu";
    o.quiet = true;
    o.steps = 1;
    o.micro_batch = micro;
    return remat::train(o).peak_bytes;
  };
  auto predicted = [&](int64_t micro) {
    remat::Config cfg = remat::load_config(cfg_path);
    cfg.training.micro_batch = micro;
    remat::Graph g = remat::build_config_graph(cfg, cfg.training.micro(), 0);
    return remat::profile_step(cfg, g, remat::make_plan(g, "sqrt"), remat::Device::meta()).peak_bytes;
  };
  const int64_t one = measured(0), acc = measured(2);
  // The micro-batched step's peak: smaller activations, plus the accumulation buffer (the
  // run's peak also holds its data sets, which the profile of a step does not).
  EXPECT_EQ(acc - one, predicted(2) - predicted(0));
  // Planning with the micro-batch as a lever: a budget no plan meets at the whole batch
  // is met at a smaller micro-batch (the largest that fits).
  remat::Config cfg = remat::load_config(cfg_path);
  cfg.training.batch = 512;
  remat::Config at8 = cfg;
  at8.training.micro_batch = 8;
  remat::Graph g8 = remat::build_config_graph(at8, 8, 0);
  const int64_t budget = remat::profile_step(at8, g8, remat::make_plan(g8, "none"), remat::Device::meta()).peak_bytes;
  remat::Graph g512 = remat::build_config_graph(cfg, 512, 0);
  EXPECT_REMAT_ERROR(remat::plan_for_budget(cfg, g512, budget), "no plan fits the budget");
  const remat::MicroBatchPlan mp = remat::plan_micro_batch_for_budget(cfg, budget);
  EXPECT_GE(mp.micro_batch, 8);
  EXPECT_LT(mp.micro_batch, 512);
  EXPECT_EQ(512 % mp.micro_batch, 0);
  EXPECT_LE(mp.best.peak_bytes, budget);
  EXPECT_EQ(mp.config.training.micro_batch, mp.micro_batch);
  fs::remove_all(dir);
}
