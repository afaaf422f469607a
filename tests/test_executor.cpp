// The checkpointing executor: every policy gives bitwise the losses and gradients of
// the plain step; recompute counts match the plan; peak activation memory follows the
// plan; --verify-recompute catches a non-deterministic layer; config errors carry the
// file and JSON pointer.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>

#include "remat/config.h"
#include "remat/exec.h"
#include "remat/ops.h"
#include "support/expect_error.h"
#include "support/golden.h"
#include "support/models.h"

using remat::Batch;
using remat::Device;
using remat::Tensor;
using remat::test::bitwise_equal;
using remat::test::random_tensor;

namespace {

nlohmann::json chain_model(int blocks, int width, double dropout) {
  return nlohmann::json::parse(R"({
    "input": {"type": "image", "shape": [1, 4, 4]},
    "layers": [
      {"type": "flatten"},
      {"type": "linear", "name": "proj", "out_features": )" +
                               std::to_string(width) + R"(},
      {"type": "repeat", "name": "block", "count": )" +
                               std::to_string(blocks) + R"(, "checkpoint": true, "layers": [
        {"type": "linear", "name": "fc1", "out_features": )" +
                               std::to_string(2 * width) + R"(, "init_std": 0.1},
        {"type": "gelu", "name": "act"},
        {"type": "linear", "name": "fc2", "out_features": )" +
                               std::to_string(width) + R"(, "init_std": 0.1},
        {"type": "dropout", "name": "drop", "p": )" +
                               std::to_string(dropout) + R"(},
        {"type": "add", "name": "res", "inputs": ["in", "drop"]}
      ]},
      {"type": "linear", "name": "head", "out_features": 5}
    ]})");
}

Batch image_batch(int64_t b, uint32_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(b));
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>((i * 7 + seed) % 5);
  return Batch(random_tensor({b, 1, 4, 4}, seed), Tensor::from_ints(t, {b}));
}

struct RunResult {
  std::vector<float> losses;
  std::vector<Tensor> grads;  // after the last step
  std::vector<Tensor> values;
  int64_t recomputed = 0;
};

// Three SGD steps with dropout on; returns losses and the final gradients and weights.
RunResult run(const remat::Graph& g, const std::string& policy, bool verify = false) {
  remat::Backend& be = remat::backend_for(Device::cpu());
  remat::ParamStore params(g, Device::cpu(), 42);
  remat::Executor ex(g, params, be, remat::make_plan(g, policy), remat::ExecOptions{verify});
  remat::RngGenerator gen(7);
  RunResult r;
  for (int step = 1; step <= 3; ++step) {
    params.zero_grads(be);
    auto st = ex.train_step(image_batch(g.batch, static_cast<uint32_t>(step)), gen);
    r.losses.push_back(st.loss);
    r.recomputed = st.recomputed_layers;
    EXPECT_EQ(st.recomputed_layers, ex.plan().recomputed_layers()) << policy;
    if (step < 3) {
      remat::SgdParams sp;
      sp.lr = 0.05;
      for (size_t p = 0; p < params.values.size(); ++p)
        if (params.grads[p].defined()) be.sgd_step(params.values[p], params.grads[p], Tensor(), sp, step);
    }
  }
  for (size_t p = 0; p < params.values.size(); ++p) {
    r.grads.push_back(params.grads[p].clone());
    r.values.push_back(params.values[p].clone());
  }
  return r;
}

}  // namespace

TEST(Executor, EveryPolicyIsBitwiseIdenticalToThePlainStep) {
  remat::Graph g = remat::build_graph(chain_model(9, 16, 0.2), 6, "test");
  const RunResult plain = run(g, "none");
  EXPECT_EQ(plain.recomputed, 0);
  for (const char* policy : {"all", "every:2", "every:4", "sqrt", "selective", "manual", "revolve:1", "revolve:2"}) {
    SCOPED_TRACE(policy);
    const RunResult r = run(g, policy);
    EXPECT_GT(r.recomputed, 0);
    ASSERT_EQ(r.losses.size(), plain.losses.size());
    for (size_t i = 0; i < r.losses.size(); ++i) EXPECT_EQ(r.losses[i], plain.losses[i]) << "step " << i + 1;
    for (size_t p = 0; p < r.grads.size(); ++p) {
      EXPECT_TRUE(bitwise_equal(r.grads[p], plain.grads[p])) << g.params[p].name;
      EXPECT_TRUE(bitwise_equal(r.values[p], plain.values[p])) << g.params[p].name;
    }
  }
}

TEST(Executor, LossDecreasesOnALearnableBatch) {
  remat::Graph g = remat::build_graph(chain_model(3, 16, 0.0), 8, "test");
  remat::Backend& be = remat::backend_for(Device::cpu());
  remat::ParamStore params(g, Device::cpu(), 1);
  remat::Executor ex(g, params, be, remat::make_plan(g, "sqrt"));
  remat::RngGenerator gen(1);
  Batch b = image_batch(8, 3);
  float first = 0, last = 0;
  remat::SgdParams sp;
  sp.lr = 0.1;
  for (int step = 1; step <= 30; ++step) {
    params.zero_grads(be);
    auto st = ex.train_step(b, gen);
    if (step == 1) first = st.loss;
    last = st.loss;
    for (size_t p = 0; p < params.values.size(); ++p)
      if (params.grads[p].defined()) be.sgd_step(params.values[p], params.grads[p], Tensor(), sp, step);
  }
  EXPECT_LT(last, 0.5f * first);
}

TEST(Executor, PeakActivationMemoryFollowsThePlan) {
  // n blocks; a block keeps A bytes of activations when stored; its output (the next
  // block's checkpoint) is c bytes. Plain: ~n*A. Segments of k blocks: ~(n/k)*c + k*A.
  const int n = 16, width = 64;
  const int64_t batch = 32;
  remat::Graph g = remat::build_graph(chain_model(n, width, 0.1), batch, "test");
  const int64_t c = batch * width * 4;  // res output
  // Stored per block: what backward reads: fc1's output (read by GELU), GELU's output (read
  // by fc2) and the residual output (read by the next fc1). fc2's and dropout's outputs
  // are read by nothing in backward and are freed as soon as forward is past them.
  const int64_t A = batch * (2 * width + 2 * width + width) * 4;
  auto peak = [&](const std::string& policy) {
    remat::Backend& be = remat::backend_for(Device::cpu());
    remat::ParamStore params(g, Device::cpu(), 3);
    remat::Executor ex(g, params, be, remat::make_plan(g, policy));
    remat::RngGenerator gen(1);
    Batch b = image_batch(batch, 1);
    auto& alloc = remat::allocator_for(Device::cpu());
    alloc.reset_peak();
    ex.train_step(b, gen);
    return alloc.stats().peak_by_category[remat::MemoryCategory::activation];
  };
  const int64_t none = peak("none"), all = peak("all"), sqrt4 = peak("sqrt"), every8 = peak("every:8");
  // Plain keeps every block: at least n*A.
  EXPECT_GE(none, n * A);
  EXPECT_LE(none, n * A + 4 * A);
  // all: n checkpoints + one block recomputed.
  EXPECT_LE(all, n * c + 2 * A + 2 * c);
  EXPECT_GE(all, n * c);
  // sqrt (k = 4): 4 checkpoints + 4 blocks.
  EXPECT_LE(sqrt4, (n / 4) * c + 4 * A + 2 * A);
  EXPECT_GE(sqrt4, 4 * A);
  // every:8: 2 checkpoints + 8 blocks.
  EXPECT_LE(every8, 2 * c + 8 * A + 2 * A);
  EXPECT_LT(sqrt4, none / 2);
  EXPECT_LT(all, sqrt4);
}

namespace {
std::atomic<int> g_noise{0};

// A layer whose output changes every call: recompute cannot reproduce it.
class NoisyLayer final : public remat::Layer {
 public:
  explicit NoisyLayer(remat::ConfigReader&) {}
  remat::LayerKind kind() const override { return remat::LayerKind::pointwise; }
  remat::Shape infer(const std::vector<remat::Shape>& in) override { return in[0]; }
  void forward(remat::ForwardContext& c) const override {
    c.out = c.in[0].clone();
    c.out.f32()[0] += static_cast<float>(++g_noise);
  }
  void backward(remat::BackwardContext& c) const override { c.din = {c.dout}; }
  std::vector<int> backward_inputs() const override { return {0}; }
};
}  // namespace

TEST(Executor, VerifyRecomputeNamesTheFirstDifferingLayer) {
  static bool registered = [] {
    remat::register_layer_type("noisy_test", [](remat::ConfigReader& r) { return std::make_unique<NoisyLayer>(r); });
    return true;
  }();
  (void)registered;
  EXPECT_REMAT_ERROR(remat::register_layer_type("noisy_test", nullptr), "already registered");
  auto model = chain_model(2, 8, 0.1);
  model["layers"][2]["layers"].insert(model["layers"][2]["layers"].begin() + 2,
                                      nlohmann::json{{"type", "noisy_test"}, {"name", "noise"}});
  model["layers"][2]["layers"][3]["inputs"] = {"noise"};
  remat::Graph g = remat::build_graph(model, 4, "test");
  // Without verification, a recomputed step silently uses different values...
  EXPECT_NO_THROW(run(g, "all"));
  // ...with it, the executor stops at the layer.
  EXPECT_REMAT_ERROR(run(g, "all", /*verify=*/true),
                     "verify-recompute: layer \"block1.noise\" (noisy_test): output differs");
  // A deterministic model passes verification under every policy.
  remat::Graph ok = remat::build_graph(chain_model(4, 8, 0.3), 4, "test");
  for (const char* policy : {"all", "sqrt", "selective"}) EXPECT_NO_THROW(run(ok, policy, true)) << policy;
}

TEST(Executor, UnknownPolicyAndPlanStructure) {
  remat::Graph g = remat::build_graph(chain_model(9, 8, 0.0), 2, "test");
  EXPECT_REMAT_ERROR(remat::make_plan(g, "sometimes"), "unknown checkpoint policy \"sometimes\"");
  EXPECT_REMAT_ERROR(remat::make_plan(g, "every:0"), "expected every:K");
  EXPECT_REMAT_ERROR(remat::make_plan(g, "every:x"), "expected every:K");
  auto p = remat::make_plan(g, "sqrt");  // 9 blocks -> segments of 3
  int recompute_segments = 0;
  for (const auto& s : p.segments) recompute_segments += s.recompute;
  EXPECT_EQ(recompute_segments, 3);
  auto sel = remat::make_plan(g, "selective");
  for (int i = 0; i < g.size(); ++i)
    if (g.layer(i).kind() == remat::LayerKind::gemm) {
      EXPECT_TRUE(sel.keep[static_cast<size_t>(i)]) << g.layer(i).name;
    }
  EXPECT_EQ(remat::make_plan(g, "none").recomputed_layers(), 0);
}

TEST(Config, ErrorsNameFileAndPointer) {
  auto bad = [](const std::string& model_json, const char* msg) {
    EXPECT_REMAT_ERROR(remat::build_graph(nlohmann::json::parse(model_json), 2, "models/x.json"), msg);
  };
  const std::string in = R"("input": {"type": "image", "shape": [1, 4, 4]}, )";
  bad("{" + in + R"("layers": [{"type": "flatten"}, {"type": "linear", "out_features": "3x3"}]})",
      "models/x.json: /model/layers/1/out_features: expected a positive integer, got \"3x3\"");
  bad("{" + in + R"("layers": [{"type": "conv"}]})",
      "models/x.json: /model/layers/0/type: unknown layer type \"conv\"");
  bad("{" + in + R"("layers": [{"type": "relu", "slope": 2}]})", "models/x.json: /model/layers/0/slope: unknown key");
  bad("{" + in + R"("layers": [{"type": "add", "inputs": ["input", "nowhere"]}]})",
      "/model/layers/0/inputs: no tensor named \"nowhere\"");
  bad("{" + in + R"("layers": [{"type": "conv2d", "out_channels": 4, "kernel": 7}]})",
      "models/x.json: /model/layers/0: layer \"conv2d0\" (conv2d): ");
  // maxpool2d's saved index is one byte: at most 256 window positions.
  const std::string big = R"("input": {"type": "image", "shape": [1, 20, 20]}, )";
  bad("{" + big + R"("layers": [{"type": "maxpool2d", "kernel": 17}]})",
      "models/x.json: /model/layers/0/kernel: maxpool2d kernel 17x17 has 289 positions; at most 256");
  EXPECT_NO_THROW(remat::build_graph(
      nlohmann::json::parse("{" + big + R"("layers": [{"type": "maxpool2d", "kernel": 16}, {"type": "flatten"},
                                                 {"type": "linear", "out_features": 3}]})"),
      2, "models/x.json"));
  bad("{" + in +
          R"("layers": [{"type": "repeat", "count": 2, "layers": [{"type": "relu", "name": "r"}], "extra": 1}]})",
      "/model/layers/0/extra: unknown key");
  bad("{" + in + R"("layers": [{"type": "flatten"}, {"type": "linear", "out_features": 4, "tie_weight": "nope"}]})",
      "/model/layers/1/tie_weight: no parameter \"nope.weight\"");
  bad(R"({"input": {"type": "image", "shape": [1, 4]}, "layers": [{"type": "relu"}]})",
      "/model/input/shape: expected [C, H, W]");
  EXPECT_REMAT_ERROR(remat::parse_config(nlohmann::json::parse(R"({"model": {}, "training": {"batch": 0}})"), "c.json"),
                     "c.json: /training/batch: expected a positive integer, got 0");
  EXPECT_REMAT_ERROR(remat::parse_config(nlohmann::json::parse(R"({"model": {}, "optimiser": {}})"), "c.json"),
                     "c.json: /optimiser: unknown key (did you mean \"optimizer\"?)");
  // A typo gets the nearest key the object knows; a key near none gets no guess.
  EXPECT_REMAT_ERROR(remat::parse_config(nlohmann::json::parse(R"({"model": {}, "training": {"stpes": 3}})"), "c.json"),
                     "c.json: /training/stpes: unknown key (did you mean \"steps\"?)");
  bad("{" + in + R"("layers": [{"type": "linear", "out_featurs": 4}]})",
      "/model/layers/0/out_features: missing (required; the object has \"out_featurs\": a typo?)");
  bad("{" + in + R"("layers": [{"type": "linear", "out_features": 4, "bais": false}]})",
      "/model/layers/0/bais: unknown key (did you mean \"bias\"?)");
  try {
    remat::parse_config(nlohmann::json::parse(R"({"model": {}, "training": {"colour": 3}})"), "c.json");
    ADD_FAILURE() << "an unknown key was accepted";
  } catch (const remat::Error& e) {
    EXPECT_EQ(std::string(e.message()), "c.json: /training/colour: unknown key");
  }
  EXPECT_REMAT_ERROR(remat::load_config("/nonexistent/m.json"), "cannot open /nonexistent/m.json");
  // training.precision: fp32 (default) or bf16; fp16 refused with the reason.
  auto training = [](const std::string& t) {
    return remat::parse_config(nlohmann::json::parse(R"({"model": {}, "training": )" + t + "}"), "c.json");
  };
  EXPECT_EQ(training("{}").training.precision, "fp32");
  EXPECT_EQ(training(R"({"precision": "bf16"})").training.precision, "bf16");
  EXPECT_EQ(training(R"({"precision": "bf16"})").resolved()["training"]["precision"], "bf16");
  EXPECT_REMAT_ERROR(training(R"({"precision": "fp16"})"),
                     "c.json: /training/precision: fp16 is not supported (it needs loss scaling");
  EXPECT_REMAT_ERROR(training(R"({"precision": "f32"})"),
                     "c.json: /training/precision: unknown precision \"f32\" (expected fp32 or bf16)");
  EXPECT_REMAT_ERROR(training(R"({"precision": 16})"), "c.json: /training/precision: expected a string");
  // data.augment: an object of known keys, hflip a probability, images only.
  auto data = [](const std::string& d) {
    return remat::parse_config(nlohmann::json::parse(R"({"model": {}, "data": )" + d + "}"), "c.json");
  };
  EXPECT_EQ(data(R"({"augment": {"hflip": 0.5}})").data.augment.hflip, 0.5);
  EXPECT_EQ(data("{}").data.augment.hflip, 0.0);
  EXPECT_EQ(data(R"({"augment": {"hflip": 0.5}})").resolved()["data"]["augment"]["hflip"], 0.5);
  EXPECT_REMAT_ERROR(data(R"({"augment": {"hflip": 1.5}})"),
                     "c.json: /data/augment/hflip: expected a number in [0, 1], got 1.5");
  EXPECT_REMAT_ERROR(data(R"({"augment": {"hflip": "yes"}})"), "c.json: /data/augment/hflip: expected a number");
  EXPECT_REMAT_ERROR(data(R"({"augment": {"vflip": 0.5}})"), "c.json: /data/augment/vflip: unknown key");
  EXPECT_REMAT_ERROR(data(R"({"augment": 0.5})"), "c.json: /data/augment: expected an object");
  EXPECT_REMAT_ERROR(data(R"({"dataset": "text", "augment": {"hflip": 0.5}})"),
                     "c.json: /data/augment/hflip: mirrors images, but the data set text is text");
}

TEST(Config, EveryShippedModelBuilds) {
  for (const auto& entry : std::filesystem::directory_iterator(std::string(REMAT_SOURCE_DIR) + "/models")) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().filename().string());
    remat::Config c = remat::load_config(entry.path().string());
    remat::Graph g = remat::build_graph(c.model, 2, entry.path().string(), {{"vocab", 96}});
    EXPECT_GT(g.parameter_count(), 0);
    EXPECT_NO_THROW(remat::make_plan(g, c.training.policy));
  }
}

namespace {

using remat::test::batch_for;

}  // namespace

TEST(Executor, ShippedConfigsScaledDownAreBitwiseEqualUnderEveryPolicy) {
  // The shipped models, scaled down, and the test configs, which are tiny already
  // (together they use every layer type: tests/test_coverage.cpp).
  std::vector<std::pair<std::filesystem::directory_entry, bool>> configs;  // (file, scale down)
  for (const char* dir : {"/models", "/tests/configs"})
    for (const auto& entry : std::filesystem::directory_iterator(std::string(REMAT_SOURCE_DIR) + dir))
      configs.emplace_back(entry, std::string(dir) == "/models");
  for (const auto& [entry, scale_down] : configs) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().filename().string());
    remat::Config c = remat::load_config(entry.path().string());
    remat::Graph g = remat::build_graph(scale_down ? remat::test::shrink_model(c.model) : c.model, 3,
                                        entry.path().string(), {{"vocab", 11}});
    remat::Backend& be = remat::backend_for(Device::cpu());
    auto run_policy = [&](const std::string& policy, remat::DType precision) {
      remat::ActivationDTypeScope scope(precision);  // bf16: working copies and bf16 activations
      remat::ParamStore params(g, Device::cpu(), 5);
      remat::Executor ex(g, params, be, remat::make_plan(g, policy), remat::ExecOptions{policy != "none"});
      remat::RngGenerator gen(9);
      std::vector<float> losses;
      for (int step = 1; step <= 3; ++step) {
        params.zero_grads(be);
        losses.push_back(ex.train_step(batch_for(g, static_cast<uint32_t>(step)), gen).loss);
        remat::SgdParams sp;
        sp.lr = 0.01;
        for (size_t p = 0; p < params.values.size(); ++p)
          if (params.grads[p].defined() && step < 3) be.sgd_step(params.values[p], params.grads[p], Tensor(), sp, step);
      }
      std::vector<Tensor> state;  // gradients, and every value incl. batchnorm running statistics
      for (size_t p = 0; p < params.values.size(); ++p) {
        state.push_back(params.values[p].clone());
        if (params.grads[p].defined()) state.push_back(params.grads[p].clone());
      }
      return std::make_pair(losses, state);
    };
    std::vector<float> fp32_losses;
    for (const remat::DType precision : {remat::DType::f32, remat::DType::bf16}) {
      SCOPED_TRACE(remat::dtype_name(precision));
      const auto plain = run_policy("none", precision);
      for (float l : plain.first) EXPECT_TRUE(std::isfinite(l));
      if (precision == remat::DType::f32)
        fp32_losses = plain.first;
      else  // the same masters, rounded: the first loss within bf16's rounding of fp32's
        EXPECT_NEAR(plain.first[0], fp32_losses[0], 0.02 * std::fabs(fp32_losses[0]));
      for (const char* policy : {"all", "every:2", "sqrt", "selective", "manual", "revolve:1"}) {
        const auto r = run_policy(policy, precision);
        EXPECT_EQ(r.first, plain.first) << policy;
        ASSERT_EQ(r.second.size(), plain.second.size());
        for (size_t k = 0; k < r.second.size(); ++k)
          EXPECT_TRUE(bitwise_equal(r.second[k], plain.second[k])) << policy << " tensor " << k;
      }
    }
  }
}

TEST(Executor, RecomputeSkipsLayersBackwardNeverReads) {
  // In a checkpointed block fc1 -> act -> fc2 -> drop -> res, backward reads fc1's output
  // (GELU) and act's output (fc2), but nothing reads fc2's or drop's outputs: they are
  // not re-run.
  remat::Graph g = remat::build_graph(chain_model(2, 8, 0.1), 2, "test");
  const auto plan = remat::make_plan(g, "all");
  auto rerun = [&](const std::string& name) {
    for (int i = 0; i < g.size(); ++i)
      if (g.layer(i).name == name) return static_cast<bool>(plan.rerun[static_cast<size_t>(i)]);
    ADD_FAILURE() << "no layer " << name;
    return false;
  };
  EXPECT_TRUE(rerun("block0.fc1"));
  EXPECT_TRUE(rerun("block0.act"));
  EXPECT_FALSE(rerun("block0.fc2"));
  EXPECT_FALSE(rerun("block0.drop"));
  EXPECT_FALSE(rerun("block0.res"));  // the segment's output is kept
  EXPECT_EQ(plan.recomputed_layers(), 4);
}

namespace {

// The recompute FLOPs a step under `plan` must count, after checking that each layer kind
// keeps what selective keeps (attention per `attention_keeps`: output and extras).
double checked_selective_flops(const remat::Graph& g, const remat::CheckpointPlan& plan, bool keep_attention_extras) {
  double expected_flops = 0.0;
  int attention_layers = 0;
  for (int i = 0; i < g.size(); ++i) {
    const remat::Layer& l = g.layer(i);
    const auto k = static_cast<size_t>(i);
    if (l.unit < 0) continue;
    if (l.kind() == remat::LayerKind::attention) {
      ++attention_layers;
      EXPECT_TRUE(plan.keep[k]) << l.name;
      EXPECT_EQ(plan.keep_extras[k], keep_attention_extras) << l.name;
      EXPECT_EQ(plan.rerun[k], !keep_attention_extras) << l.name;
    } else if (l.kind() == remat::LayerKind::gemm) {
      EXPECT_TRUE(plan.keep[k] && plan.keep_extras[k] && !plan.rerun[k]) << l.name;
    } else if (l.kind() == remat::LayerKind::norm) {
      EXPECT_TRUE(!plan.keep[k] && !plan.keep_extras[k] && plan.rerun[k]) << l.name;
    }
    if (plan.rerun[k]) expected_flops += plan.keep[k] ? l.extras_flops() : l.forward_flops();
  }
  EXPECT_GT(attention_layers, 0);
  return expected_flops;
}

}  // namespace

TEST(Executor, SelectiveKeepsAttentionOutputAndRebuildsOnlyItsProbabilities) {
  // Materialised attention: its output is its P V GEMM's product: selective keeps it (the
  // projection's backward reads it) and re-runs the layer for its probabilities (a softmax)
  // only, without dropout or P V; recompute FLOPs count that. Fused attention has nothing
  // [T, T] to rebuild: selective keeps it whole (output and one log-sum-exp per row).
  remat::Config c = remat::load_config(std::string(REMAT_SOURCE_DIR) + "/models/gpt_char.json");
  for (const char* impl : {"materialized", "fused"}) {
    SCOPED_TRACE(impl);
    const bool fused = std::string(impl) == "fused";
    remat::Graph g = remat::build_graph(remat::test::with_attention_impl(remat::test::shrink_model(c.model), impl), 3,
                                        "gpt_char", {{"vocab", 11}});
    const auto plan = remat::make_plan(g, "selective");
    const double expected_flops = checked_selective_flops(g, plan, fused);
    for (int i = 0; i < g.size(); ++i)
      if (g.layer(i).kind() == remat::LayerKind::attention) {
        EXPECT_EQ(g.layer(i).extras_flops() < g.layer(i).forward_flops(), !fused);
        EXPECT_EQ(g.layer(i).backward_uses_output(), fused);
      }
    remat::Backend& be = remat::backend_for(Device::cpu());
    remat::ParamStore params(g, Device::cpu(), 5);
    remat::Executor ex(g, params, be, plan, remat::ExecOptions{/*verify=*/true});
    remat::RngGenerator gen(9);
    const auto st = ex.train_step(batch_for(g, 1), gen);
    EXPECT_EQ(st.recomputed_layers, plan.recomputed_layers());
    EXPECT_DOUBLE_EQ(st.recompute_flops, expected_flops);
    // The other policies re-run attention in full.
    const auto all = remat::make_plan(g, "all");
    for (int i = 0; i < g.size(); ++i)
      if (g.layer(i).kind() == remat::LayerKind::attention) {
        EXPECT_FALSE(all.keep[static_cast<size_t>(i)] || all.keep_extras[static_cast<size_t>(i)]);
      }
  }
}

// The fused and the materialised attention train the same model to the same losses and
// gradients (to rounding), dropout included: one mask, drawn by element index.
TEST(Executor, FusedAttentionTrainsAsTheMaterialisedPath) {
  remat::Config c = remat::load_config(std::string(REMAT_SOURCE_DIR) + "/models/gpt_char.json");
  std::vector<float> losses[2];
  std::vector<std::vector<float>> grads[2];
  int k = 0;
  for (const char* impl : {"materialized", "fused"}) {
    remat::Graph g = remat::build_graph(remat::test::with_attention_impl(remat::test::shrink_model(c.model), impl), 3,
                                        "gpt_char", {{"vocab", 11}});
    remat::Backend& be = remat::backend_for(Device::cpu());
    remat::ParamStore params(g, Device::cpu(), 5);
    remat::Executor ex(g, params, be, remat::make_plan(g, "sqrt"));
    remat::RngGenerator gen(9);
    for (uint32_t step = 0; step < 2; ++step) {
      params.zero_grads(be);
      losses[k].push_back(ex.train_step(batch_for(g, step), gen).loss);
    }
    for (const Tensor& t : params.grads)
      if (t.defined()) grads[k].push_back(t.to_vector());
    ++k;
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t s = 0; s < losses[0].size(); ++s) EXPECT_NEAR(losses[1][s], losses[0][s], 2e-5 * std::abs(losses[0][s]));
  for (size_t p = 0; p < grads[0].size(); ++p)
    for (size_t e = 0; e < grads[0][p].size(); ++e)
      ASSERT_NEAR(grads[1][p][e], grads[0][p][e], 1e-4 + 1e-3 * std::abs(grads[0][p][e])) << "parameter " << p;
}

TEST(Executor, GradsFinalHookNamesEachParameterOnceWithItsFinalGradient) {
  // gpt_char (scaled down) ties its head to the embedding: the table's gradient gets the
  // head's contribution first and the embedding's last, so it is final only after the
  // embedding's backward. At each call the named gradients must already hold their final
  // values, and the call comes right after the backward of the parameter's first user.
  remat::Config c = remat::load_config(std::string(REMAT_SOURCE_DIR) + "/models/gpt_char.json");
  remat::Graph g = remat::build_graph(remat::test::shrink_model(c.model), 3, "gpt_char", {{"vocab", 11}});
  remat::Backend& be = remat::backend_for(Device::cpu());
  int tied = -1;  // the parameter two layers use
  std::vector<int> users(g.params.size(), 0), first_user(g.params.size(), g.size());
  for (int i = 0; i < g.size(); ++i)
    for (int p : g.layer_params[static_cast<size_t>(i)]) {
      ++users[static_cast<size_t>(p)];
      first_user[static_cast<size_t>(p)] = std::min(first_user[static_cast<size_t>(p)], i);
      if (users[static_cast<size_t>(p)] == 2) tied = p;
    }
  ASSERT_GE(tied, 0) << "gpt_char has no tied parameter";
  for (const char* policy : {"none", "sqrt", "selective"}) {
    SCOPED_TRACE(policy);
    remat::ParamStore params(g, Device::cpu(), 5);
    int last_backward = -1;  // the layer whose backward ended last
    remat::ExecOptions eo;
    eo.on_layer = [&](int i, remat::Phase ph, bool begin) {
      if (ph == remat::Phase::backward && !begin) last_backward = i;
    };
    remat::Executor ex(g, params, be, remat::make_plan(g, policy), eo);
    std::vector<Tensor> at_call(params.grads.size());
    std::vector<int> calls_of(params.grads.size(), 0), after(params.grads.size(), -1);
    int calls = 0;
    ex.set_on_grads_final([&](const std::vector<int>& ps) {
      ++calls;
      for (int p : ps) {
        ++calls_of[static_cast<size_t>(p)];
        at_call[static_cast<size_t>(p)] = params.grads[static_cast<size_t>(p)].clone();
        after[static_cast<size_t>(p)] = last_backward;
      }
    });
    remat::RngGenerator gen(9);
    params.zero_grads(be);
    ex.train_step(batch_for(g, 1), gen);
    int trainable = 0;
    for (size_t p = 0; p < params.grads.size(); ++p) {
      if (!params.grads[p].defined()) {
        EXPECT_EQ(calls_of[p], 0) << g.params[p].name;
        continue;
      }
      ++trainable;
      ASSERT_EQ(calls_of[p], 1) << g.params[p].name;
      EXPECT_TRUE(bitwise_equal(at_call[p], params.grads[p])) << g.params[p].name << " was named before its end";
      EXPECT_EQ(after[p], first_user[p]) << g.params[p].name;
    }
    EXPECT_GT(trainable, 10);
    EXPECT_GT(calls, 5);  // during the sweep, layer by layer, not once at its end
    EXPECT_EQ(after[static_cast<size_t>(tied)], first_user[static_cast<size_t>(tied)]);
  }
}
