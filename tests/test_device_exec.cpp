// The executor and the trainer on the CUDA backend: built twice (tests/CMakeLists.txt),
// on cuda-emu (label kernels, every build) and on cuda (label gpu). REMAT_TEST_DEVICE
// names the device under test.
// - Every shipped config, scaled down (one of each model they shrink to), and the tiny test
//   configs (those only under REMAT_TEST_MODELS=tiny, as the asan preset runs): three
//   steps with dropout on give bitwise the same losses, gradients and weights under every checkpoint policy
//   as the plain step, on the device (the executor's invariant holds on this backend too).
// - The same plain run on the device matches the cpu backend within stated tolerances.
// - A short `remat train` run on the device matches the cpu run's losses.
// - The same under training.precision bf16 (bf16 activations and working copies, fp32
//   masters and gradients): bitwise across policies on the device, close to the cpu's bf16
//   step and training run, measured peak equal to the prediction.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "remat/config.h"
#include "remat/error.h"
#include "remat/exec.h"
#include "remat/incremental.h"
#include "remat/optim.h"
#include "remat/profile.h"
#include "remat/train.h"
#include "support/expect_error.h"
#include "support/golden.h"
#include "support/models.h"
#if defined(REMAT_TEST_EMU)
#include "backends/cuda/cuda_backend.h"
#include "kernels/emu/emu.h"
#endif

using remat::Batch;
using remat::Device;
using remat::Tensor;
using remat::test::bitwise_equal;

namespace {

#if defined(REMAT_TEST_EMU)
const bool kRegistered = (remat::register_cuda_emu_backend(), true);
#endif

Device dut() { return Device::parse(REMAT_TEST_DEVICE); }

bool skip_without_device() { return dut().is_cuda() && !remat::cuda_status().available; }

using remat::test::batch_for;

struct StepRun {
  std::vector<float> losses;
  std::vector<Tensor> state;  // on the host: weights (and BN running statistics), then gradients
  std::vector<std::string> names;
};

// Three steps (SGD between them), dropout on where the model has it; under bf16 the store
// has working copies and the executor runs in bf16 (as the trainer sets it up).
StepRun run(const remat::Graph& g, Device d, const std::string& policy, remat::DType precision = remat::DType::f32) {
  remat::Backend& be = remat::backend_for(d);
  remat::ActivationDTypeScope scope(precision);
  remat::ParamStore params(g, d, 5);
  remat::Executor ex(g, params, be, remat::make_plan(g, policy), remat::ExecOptions{policy != "none"});
  remat::RngGenerator gen(9);
  StepRun r;
  for (int step = 1; step <= 3; ++step) {
    params.zero_grads(be);
    r.losses.push_back(ex.train_step(batch_for(g, static_cast<uint32_t>(step), d), gen).loss);
    remat::SgdParams sp;
    sp.lr = 0.01;
    for (size_t p = 0; p < params.values.size(); ++p)
      if (params.grads[p].defined() && step < 3) be.sgd_step(params.values[p], params.grads[p], Tensor(), sp, step);
  }
  for (size_t p = 0; p < params.values.size(); ++p) {
    r.state.push_back(params.values[p].to(Device::cpu()));
    r.names.push_back(g.params[p].name);
    if (params.grads[p].defined()) {
      r.state.push_back(params.grads[p].to(Device::cpu()));
      r.names.push_back(g.params[p].name + ".grad");
    }
  }
  return r;
}

struct Model {
  std::string name;
  remat::Graph graph;
};

// A config with what does not change the computation left out (names, descriptions,
// initial scales): two shipped configs that shrink to the same model test the same thing.
nlohmann::json without_names(nlohmann::json j) {
  if (j.is_object()) {
    for (const char* k : {"name", "description", "init_std"}) j.erase(k);
    for (auto& v : j) v = without_names(v);
  } else if (j.is_array()) {
    for (auto& v : j) v = without_names(v);
  }
  return j;
}

// The shipped configs scaled down (one of each model they shrink to: gpt2_124m stands for
// gpt2_350m and gpt2_1558m) and the tiny test configs, which together use every layer type
// (tests/test_coverage.cpp). REMAT_TEST_MODELS=tiny: the tiny configs only (the asan test
// preset's choice: the sanitizers look for memory errors, which the tiny configs reach
// through every layer, at a third of the time).
bool tiny_models_only() {
  const char* only = std::getenv("REMAT_TEST_MODELS");
  return only && std::string(only) == "tiny";
}

std::vector<Model> test_models() {
  std::vector<Model> out;
  if (!tiny_models_only()) {
    std::vector<std::filesystem::path> shipped;
    for (const auto& entry : std::filesystem::directory_iterator(std::string(REMAT_SOURCE_DIR) + "/models"))
      if (entry.path().extension() == ".json") shipped.push_back(entry.path());
    std::sort(shipped.begin(), shipped.end());
    std::set<std::string> seen;
    for (const auto& path : shipped) {
      remat::Config c = remat::load_config(path.string());
      const nlohmann::json small = remat::test::shrink_model(c.model);
      if (!seen.insert(without_names(small).dump()).second) continue;
      out.push_back({path.filename().string(), remat::build_graph(small, 3, path.string(), {{"vocab", 11}})});
    }
  }
  for (const char* tiny : {"gpt_char_tiny.json", "fashion_cnn_tiny.json", "conv_mix_tiny.json", "seq_mix_tiny.json",
                           "swiglu_tiny.json", "nmt_tiny.json", "llama_tiny.json", "vit_tiny.json", "unet_tiny.json"}) {
    const std::string path = std::string(REMAT_SOURCE_DIR) + "/tests/configs/" + tiny;
    remat::Config c = remat::load_config(path);
    out.push_back({tiny, remat::build_graph(c.model, 2, path, {{"vocab", 24}})});
  }
  return out;
}

// A tiny test config at batch 2 and a precision, with its graph (vocabulary 24).
struct TinyStep {
  remat::Config cfg;
  remat::Graph graph;
};
TinyStep tiny_step(const std::string& name, const std::string& precision) {
  const std::string path = std::string(REMAT_SOURCE_DIR) + "/tests/configs/" + name;
  remat::Config cfg = remat::load_config(path);
  cfg.training.batch = 2;
  cfg.training.precision = precision;
  remat::Graph g = remat::build_graph(cfg.model, 2, path, {{"vocab", 24}});
  return {std::move(cfg), std::move(g)};
}

// max |a - b| <= atol + rtol * max |a| over the tensor
::testing::AssertionResult close(const Tensor& a, const Tensor& b, double atol, double rtol) {
  const auto va = a.to_vector(), vb = b.to_vector();
  if (va.size() != vb.size()) return ::testing::AssertionFailure() << "sizes differ";
  double worst = 0.0, scale = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(va[i])));
    const double e = std::fabs(static_cast<double>(va[i]) - vb[i]);
    if (!(e <= worst)) {
      worst = e;
      at = i;
    }
  }
  if (worst <= atol + rtol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max abs difference " << worst << " at " << at << " (cpu " << va[at]
                                       << ", device " << vb[at] << "), allowed " << atol + rtol * scale;
}

// bf16 on the device against bf16 on the cpu, measured by how far bf16 itself moves the cpu's
// result from fp32: max |device - cpu| <= 4 max |cpu fp32 - cpu| + 1e-4 max |cpu| over a
// tensor (or a loss). Both backends round every activation to bf16; where their fp32 sums
// differ in the last bits (GEMM order, tree reductions) a value rounds to the neighbouring
// bf16, so the two bf16 runs drift apart as a bf16 run drifts from fp32, through the layers
// and the steps; a relative tolerance alone would fail where a gradient cancels to near 0
// and bf16's noise is all there is (a batch-normalised network's biases), and pass a wrong
// kernel on a large tensor. Observed on cuda-emu (three steps, every config): at most 1.9
// times bf16's own distance, losses within 5e-5 relative (bf16's own: up to 4e-3).
::testing::AssertionResult bf16_close(const std::vector<float>& cpu, const std::vector<float>& dev,
                                      const std::vector<float>& cpu32) {
  if (cpu.size() != dev.size() || cpu.size() != cpu32.size()) return ::testing::AssertionFailure() << "sizes differ";
  double d_dev = 0.0, d_bf16 = 0.0, scale = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double e = std::fabs(static_cast<double>(dev[i]) - cpu[i]);
    if (!(e <= d_dev)) d_dev = e, at = i;
    d_bf16 = std::max(d_bf16, std::fabs(static_cast<double>(cpu32[i]) - cpu[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(cpu[i])));
  }
  const double allowed = 4.0 * d_bf16 + 1e-4 * scale;
  if (d_dev <= allowed) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |device - cpu| " << d_dev << " at " << at << " (cpu " << cpu[at]
                                       << ", device " << dev[at] << "), allowed " << allowed
                                       << " (bf16 moves the cpu by " << d_bf16 << " from fp32)";
}
::testing::AssertionResult bf16_close(const Tensor& cpu, const Tensor& dev, const Tensor& cpu32) {
  return bf16_close(cpu.to_vector(), dev.to_vector(), cpu32.to_vector());
}
::testing::AssertionResult bf16_close(float cpu, float dev, float cpu32) {
  return bf16_close(std::vector<float>{cpu}, std::vector<float>{dev}, std::vector<float>{cpu32});
}

}  // namespace

TEST(DeviceExec, EveryPolicyIsBitwiseThePlainStepAndMatchesCpu) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << remat::cuda_status().error;
  {
    for (const Model& m : test_models()) {
      SCOPED_TRACE(m.name);
      const StepRun plain = run(m.graph, dut(), "none");
      for (float l : plain.losses) EXPECT_TRUE(std::isfinite(l));
      for (const char* policy : {"all", "every:2", "sqrt", "selective", "manual", "revolve:1"}) {
        const StepRun r = run(m.graph, dut(), policy);
        EXPECT_EQ(r.losses, plain.losses) << policy;
        ASSERT_EQ(r.state.size(), plain.state.size());
        for (size_t k = 0; k < r.state.size(); ++k)
          EXPECT_TRUE(bitwise_equal(r.state[k], plain.state[k])) << policy << " " << r.names[k];
      }
      // Against the cpu backend. Tolerance: three steps of fp32 arithmetic whose sums run
      // in other orders (cuBLAS tiles, tree reductions); relative to each tensor's scale.
      const StepRun cpu = run(m.graph, Device::cpu(), "none");
      for (size_t i = 0; i < cpu.losses.size(); ++i)
        EXPECT_NEAR(plain.losses[i], cpu.losses[i], 1e-4 * std::max(1.0f, std::fabs(cpu.losses[i])))
            << "step " << i + 1;
      for (size_t k = 0; k < cpu.state.size(); ++k)
        EXPECT_TRUE(close(cpu.state[k], plain.state[k], 1e-5, 2e-3)) << cpu.names[k];
    }
  }
}

// training.precision bf16 on the device: every shipped config (scaled down) and the tiny
// test configs give bitwise the plain bf16 step under every policy, and stay close to the
// cpu's bf16 step (bf16_close: measured against bf16's own distance from fp32 on the cpu).
TEST(DeviceExec, Bf16EveryPolicyIsBitwiseThePlainStepAndMatchesCpu) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << remat::cuda_status().error;
  const remat::DType bf16 = remat::DType::bf16;
  for (const Model& m : test_models()) {
    SCOPED_TRACE(m.name);
    const StepRun plain = run(m.graph, dut(), "none", bf16);
    for (float l : plain.losses) EXPECT_TRUE(std::isfinite(l));
    for (const char* policy : {"all", "every:2", "sqrt", "selective", "manual", "revolve:1"}) {
      const StepRun r = run(m.graph, dut(), policy, bf16);
      EXPECT_EQ(r.losses, plain.losses) << policy;
      ASSERT_EQ(r.state.size(), plain.state.size());
      for (size_t k = 0; k < r.state.size(); ++k)
        EXPECT_TRUE(bitwise_equal(r.state[k], plain.state[k])) << policy << " " << r.names[k];
    }
    EXPECT_NE(plain.losses, run(m.graph, dut(), "none").losses) << "the bf16 step computed in bf16";
    const StepRun cpu = run(m.graph, Device::cpu(), "none", bf16);
    const StepRun cpu32 = run(m.graph, Device::cpu(), "none");
    for (size_t i = 0; i < cpu.losses.size(); ++i)
      EXPECT_TRUE(bf16_close(cpu.losses[i], plain.losses[i], cpu32.losses[i])) << "loss, step " << i + 1;
    for (size_t k = 0; k < cpu.state.size(); ++k)
      EXPECT_TRUE(bf16_close(cpu.state[k], plain.state[k], cpu32.state[k])) << cpu.names[k];
  }
}

TEST(DeviceExec, TrainingRunMatchesCpu) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << remat::cuda_status().error;
  auto train_on = [](const std::string& device) {
    remat::TrainOptions o;
    o.config = std::string(REMAT_SOURCE_DIR) + "/tests/configs/gpt_char_tiny.json";
    o.device = device;
    o.steps = 4;
    o.quiet = true;
    o.sample = false;
    return remat::train(o);
  };
  {
    const remat::TrainResult on_device = train_on(dut().str());
    const remat::TrainResult on_cpu = train_on("cpu");
    ASSERT_EQ(on_device.losses.size(), on_cpu.losses.size());
    for (size_t i = 0; i < on_cpu.losses.size(); ++i)
      EXPECT_NEAR(on_device.losses[i], on_cpu.losses[i], 1e-4 * std::fabs(on_cpu.losses[i])) << "step " << i + 1;
    EXPECT_GT(on_device.peak_bytes, 0);
  }
}

// A short bf16 training run on the device against the cpu's (gpt_char_tiny: the transformer
// ops; fashion_cnn_tiny: convolution from the f32 batch, batch norm, pooling; mlp_deep's
// linear on the f32 batch is in the step test above). bf16_close per step's loss, over
// four steps of AdamW, against the cpu's fp32 run.
TEST(DeviceExec, Bf16TrainingRunMatchesCpu) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << remat::cuda_status().error;
  for (const char* name : {"gpt_char_tiny.json", "fashion_cnn_tiny.json"}) {
    SCOPED_TRACE(name);
    auto train_on = [&](const std::string& device, const char* precision = "bf16") {
      remat::TrainOptions o;
      o.config = std::string(REMAT_SOURCE_DIR) + "/tests/configs/" + name;
      o.device = device;
      o.precision = precision;
      o.steps = 4;
      o.quiet = true;
      o.sample = false;
      return remat::train(o);
    };
    const remat::TrainResult on_device = train_on(dut().str());
    const remat::TrainResult on_cpu = train_on("cpu"), on_cpu32 = train_on("cpu", "fp32");
    ASSERT_EQ(on_device.losses.size(), on_cpu.losses.size());
    ASSERT_EQ(on_cpu32.losses.size(), on_cpu.losses.size());
    EXPECT_NE(on_cpu.losses, on_cpu32.losses) << "the bf16 run computed in bf16";
    EXPECT_NE(on_device.losses, on_cpu32.losses) << "the bf16 run on the device computed in bf16";
    for (size_t i = 0; i < on_cpu.losses.size(); ++i)
      EXPECT_TRUE(bf16_close(on_cpu.losses[i], on_device.losses[i], on_cpu32.losses[i])) << "step " << i + 1;
    EXPECT_GT(on_device.peak_bytes, 0);
  }
}

// Exact accounting on the device: a step's measured peak equals the meta prediction made
// with this backend's workspace sizes, for plain, checkpointed and budget plans, in fp32
// and in bf16 (bf16 activations and working copies; the bf16 workspaces of convolution and
// attention, which the queries give under the bf16 scope profile_step sets).
TEST(DeviceExec, MeasuredPeakEqualsThePrediction) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << remat::cuda_status().error;
  int budgets_below_plain = 0;
  for (const char* precision : {"fp32", "bf16"})
    for (const char* name : {"fashion_cnn_tiny.json", "gpt_char_tiny.json", "conv_mix_tiny.json"}) {
      SCOPED_TRACE(std::string(name) + " " + precision);
      auto [cfg, g] = tiny_step(name, precision);
      remat::Backend* ws = &remat::backend_for(dut());
      const auto plain = remat::profile_step(cfg, g, remat::make_plan(g, "none"), Device::meta(), false, ws);
      int64_t lowest_reserved = plain.peak_reserved_bytes;
      for (std::string policy : {"none", "sqrt", "selective"}) {
        remat::CheckpointPlan plan = remat::resolve_policy(cfg, g, policy, ws);
        const auto predicted = remat::profile_step(cfg, g, plan, Device::meta(), false, ws);
        const auto measured = remat::profile_step(cfg, g, plan, dut(), false);
        EXPECT_EQ(measured.precision, precision);
        EXPECT_EQ(measured.peak_bytes, predicted.peak_bytes) << policy;
        EXPECT_EQ(measured.peak_by_category.bytes, predicted.peak_by_category.bytes) << policy;
        EXPECT_EQ(measured.peak_reserved_bytes, predicted.peak_reserved_bytes) << policy;
        lowest_reserved = std::min(lowest_reserved, predicted.peak_reserved_bytes);
      }
      // A budget just below the plain step's reserved peak (what a budget bounds) where
      // checkpointing lowers it, else at it (a tiny CNN's reserved peak may not move): the
      // plan found fits, measured on the device.
      const bool lower = lowest_reserved < plain.peak_reserved_bytes;
      budgets_below_plain += lower;
      const int64_t budget = plain.peak_reserved_bytes - (lower ? 1 : 0);
      remat::CheckpointPlan plan = remat::resolve_policy(cfg, g, "budget:" + std::to_string(budget), ws);
      const auto predicted = remat::profile_step(cfg, g, plan, Device::meta(), false, ws);
      const auto measured = remat::profile_step(cfg, g, plan, dut(), false);
      EXPECT_LE(measured.peak_reserved_bytes, budget) << plan.policy;
      EXPECT_EQ(measured.peak_reserved_bytes, predicted.peak_reserved_bytes) << plan.policy;
      EXPECT_EQ(measured.peak_bytes, predicted.peak_bytes) << plan.policy;
    }
  EXPECT_GE(budgets_below_plain, 2);  // gpt_char_tiny's, fp32 and bf16 at least
}

// Activation offload (docs/checkpointing.md, "Offload"): the products a plan keeps wait in
// pinned host memory, copied out and back on the copy stream. Every model (shipped configs
// scaled down, the tiny test configs), fp32 and bf16, offload over four policies: bitwise
// the plain step's losses, gradients and weights, with --verify-recompute checking each
// product after its round trip. On cuda-emu the copies run only when the executor waits for
// them (kernels/emu/emu.cpp, "PendingCopy"), so a missing wait shows here as wrong bits.
TEST(DeviceExec, OffloadIsBitwiseThePlainStep) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << remat::cuda_status().error;
  for (remat::DType precision : {remat::DType::f32, remat::DType::bf16})
    for (const Model& m : test_models()) {
      SCOPED_TRACE(m.name + (precision == remat::DType::bf16 ? " bf16" : " fp32"));
      const StepRun plain = run(m.graph, dut(), "none", precision);
      for (const char* policy :
           {"none+offload", "sqrt+offload", "selective+offload", "revolve:2+offload", "selective+offload:1"}) {
        ASSERT_TRUE(remat::make_plan(m.graph, policy).offloads() || remat::plan_units(m.graph).size() < 2) << policy;
        const StepRun r = run(m.graph, dut(), policy, precision);
        EXPECT_EQ(r.losses, plain.losses) << policy;
        ASSERT_EQ(r.state.size(), plain.state.size());
        for (size_t k = 0; k < r.state.size(); ++k)
          EXPECT_TRUE(bitwise_equal(r.state[k], plain.state[k])) << policy << " " << r.names[k];
      }
    }
}

// Offload's accounting: the device peak and the pinned host pool's peak measured on the
// device equal the meta prediction to the byte, and offload lowers the plain step's device
// peak (at the end of forward) by moving bytes to the host tier. Under a checkpointing
// policy the peak may lie in backward, where a product prefetched one unit ahead adds to
// it (fashion_cnn_tiny: sqrt+offload 1 KiB above sqrt): which to offload is the planner's
// choice. The same for offloading the first J units only (+offload:J).
TEST(DeviceExec, OffloadPeaksEqualThePrediction) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << remat::cuda_status().error;
  for (const char* precision : {"fp32", "bf16"})
    for (const char* name : {"gpt_char_tiny.json", "fashion_cnn_tiny.json", "conv_mix_tiny.json"}) {
      SCOPED_TRACE(std::string(name) + " " + precision);
      auto [cfg, g] = tiny_step(name, precision);
      remat::Backend* ws = &remat::backend_for(dut());
      std::map<std::string, int64_t> host_peak;  // by policy
      for (std::string base : {"none", "sqrt", "selective", "none+offload:1", "selective+offload:1"}) {
        const std::string suffix = base.find('+') == std::string::npos ? "+offload" : "";
        const auto without = remat::profile_step(cfg, g, remat::make_plan(g, remat::split_offload_suffix(base).base),
                                                 Device::meta(), false, ws);
        remat::CheckpointPlan plan = remat::make_plan(g, base + suffix);
        const auto predicted = remat::profile_step(cfg, g, plan, Device::meta(), false, ws);
        const auto measured = remat::profile_step(cfg, g, plan, dut(), false);
        EXPECT_EQ(measured.peak_bytes, predicted.peak_bytes) << plan.policy;
        EXPECT_EQ(measured.peak_by_category.bytes, predicted.peak_by_category.bytes) << plan.policy;
        EXPECT_EQ(measured.host_peak_bytes, predicted.host_peak_bytes) << plan.policy;
        EXPECT_GT(predicted.host_peak_bytes, 0) << plan.policy;
        if (base == "none") {
          EXPECT_LT(predicted.peak_bytes, without.peak_bytes) << plan.policy;
        }
        EXPECT_EQ(without.host_peak_bytes, 0) << base;
        host_peak[plan.policy] = predicted.host_peak_bytes;
      }
      // The first unit alone holds less of the host than every unit but the last (the same
      // where there are two).
      if (remat::offload_units(g).size() > 2) {
        EXPECT_LT(host_peak["none+offload:1"], host_peak["none+offload"]);
      } else {
        EXPECT_EQ(host_peak["none+offload:1"], host_peak["none+offload"]);
      }
    }
}

// Incremental decoding (remat/incremental.h) on the device: for every encoder-decoder model
// (shipped configs scaled down, nmt_tiny), fp32 and bf16, each step's logits, one target
// position at a time with the key/value cache (causal self-attention reading q out of the
// step's packed q, k, v beside a cache of keys masked by length), equal the whole model's
// forward over the same target.
TEST(DeviceExec, IncrementalDecodingMatchesTheWholeModel) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << remat::cuda_status().error;
  int decoders = 0;
  for (const Model& m : test_models()) {
    if (m.graph.input("tgt") < 0) continue;
    ASSERT_EQ(remat::IncrementalDecoder::unsupported(m.graph, "tgt"), "") << m.name;
    ++decoders;
    for (remat::DType precision : {remat::DType::f32, remat::DType::bf16}) {
      SCOPED_TRACE(m.name + (precision == remat::DType::bf16 ? " bf16" : " fp32"));
      remat::Backend& be = remat::backend_for(dut());
      remat::ActivationDTypeScope scope(precision);
      remat::ParamStore params(m.graph, dut(), 5);
      const remat::Batch b = batch_for(m.graph, 1, dut());
      remat::Executor ex(m.graph, params, be, remat::make_plan(m.graph, "none"));
      float loss = 0;
      const std::vector<float> whole = ex.evaluate(b, &loss).to_vector();
      const int64_t B = m.graph.batch, T = b.at("tgt").size(1), V = m.graph.layer(m.graph.logits_id).out_shape[-1];
      const std::vector<int32_t> tgt = b.at("tgt").to_ints();
      remat::IncrementalDecoder dec(m.graph, params, be, "tgt");
      dec.start(b);
      double worst = 0, scale = 0;
      for (int64_t t = 0; t < T; ++t) {
        std::vector<int32_t> col(static_cast<size_t>(B));
        for (int64_t r = 0; r < B; ++r) col[static_cast<size_t>(r)] = tgt[static_cast<size_t>(r * T + t)];
        const std::vector<float> step = dec.step(Tensor::from_ints(col, remat::Shape{B, 1}).to(dut()), t).to_vector();
        for (int64_t r = 0; r < B; ++r)
          for (int64_t v = 0; v < V; ++v) {
            const double want = whole[static_cast<size_t>((r * T + t) * V + v)];
            worst = std::max(worst, std::abs(step[static_cast<size_t>(r * V + v)] - want));
            scale = std::max(scale, std::abs(want));
          }
      }
      EXPECT_LE(worst, (precision == remat::DType::f32 ? 1e-5 : 3e-2) * std::max(1.0, scale));
    }
  }
  EXPECT_GE(decoders, tiny_models_only() ? 1 : 3) << "nmt_tiny, nmt_de and transformer_base";
}

#if defined(REMAT_TEST_EMU)
// The emulator's copy stream (a non-blocking stream) is stricter than a GPU's: a copy runs
// only when something waits for it, so data read before the wait is stale however the
// timing would fall on a GPU; the wait (an event, the stream's synchronisation) runs it.
TEST(DeviceExec, EmulatedCopyStreamCopiesOnlyWhenWaitedFor) {
  remat::Backend& be = remat::backend_for(dut());
  remat::CachingAllocator pool(Device::cpu(), be.make_pinned_allocator(1 << 20));
  const remat::AllocTag tag{remat::MemoryCategory::activation, "test", remat::Phase::forward};
  Tensor host = Tensor::empty_in(pool, remat::Shape{4}, remat::DType::f32, tag);
  Tensor dev = Tensor::from_vector({1.0f, 2.0f, 3.0f, 4.0f}, remat::Shape{4}, dut());
  Tensor back = Tensor::zeros(remat::Shape{4}, dut());
  std::fill(host.f32(), host.f32() + 4, -1.0f);
  const uint64_t out = be.copy_async(host, dev);
  EXPECT_EQ(host.to_vector(), (std::vector<float>{-1.0f, -1.0f, -1.0f, -1.0f})) << "ran before any wait";
  dev.fill_(9.0f);  // compute reuses the source before waiting: the copy reads 9s
  be.wait_copy(out);
  EXPECT_EQ(host.to_vector(), (std::vector<float>{9.0f, 9.0f, 9.0f, 9.0f}));
  const uint64_t in = be.copy_async(back, host);
  EXPECT_EQ(back.to_vector(), (std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f})) << "ran before any wait";
  be.wait_copy(in);
  EXPECT_EQ(back.to_vector(), (std::vector<float>{9.0f, 9.0f, 9.0f, 9.0f}));
  EXPECT_THROW(be.wait_copy(in), remat::Error) << "a ticket is waited for once";
}

// A copy whose device tensor is freed before compute waits for it fails at the wait, on
// the emulator as on a GPU: the allocator could have handed the block to a kernel while
// the copy stream read or wrote it.
TEST(DeviceExec, CopyWhoseDeviceTensorWentBeforeTheWaitFails) {
  remat::Backend& be = remat::backend_for(dut());
  remat::CachingAllocator pool(Device::cpu(), be.make_pinned_allocator(1 << 20));
  const remat::AllocTag tag{remat::MemoryCategory::activation, "test", remat::Phase::forward};
  Tensor host = Tensor::empty_in(pool, remat::Shape{4}, remat::DType::f32, tag);
  Tensor dev = Tensor::from_vector({1.0f, 2.0f, 3.0f, 4.0f}, remat::Shape{4}, dut());
  const uint64_t out = be.copy_async(host, dev);
  dev = Tensor();
  EXPECT_REMAT_ERROR(be.wait_copy(out),
                     "offload copy " + std::to_string(out) +
                         ": the device tensor it reads was freed before compute waited for the copy");
  Tensor back = Tensor::zeros(remat::Shape{4}, dut());
  const uint64_t in = be.copy_async(back, host);
  host = Tensor();  // the host side may go at once: only the copy stream touches the pool
  back = Tensor();
  EXPECT_REMAT_ERROR(be.wait_copy(in),
                     "offload copy " + std::to_string(in) + ": the device tensor it writes was freed");
}

// The cuda-emu device's tensors live in the emulator's device memory, which host code
// cannot address, as a GPU's: reading or writing one through its data pointer dies with
// the emulator's message naming the allocation, while copies and ops reach it.
TEST(DeviceExecDeathTest, HostCodeTouchingACudaEmuTensorDies) {
  if (!remat::emu::device_memory_protected()) GTEST_SKIP() << "REMAT_EMU_PROTECT_DEVICE_MEMORY=0";
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenBLAS and OpenMP have threads
  const Tensor t = Tensor::from_vector({1.0f, 2.0f, 3.0f, 4.0f}, remat::Shape{4}, Device::cuda_emu());
  EXPECT_TRUE(remat::emu::is_device_pointer(t.f32()));
  const float* p = t.f32();
  EXPECT_DEATH({ std::printf("%g\n", static_cast<double>(*static_cast<const volatile float*>(p + 2))); },
               "cuda-emu: host code touched device memory at 0x[0-9a-f]+, inside the cudaMalloc allocation of "
               "[0-9]+ bytes at 0x[0-9a-f]+: a GPU's memory is not addressable from the host");
  EXPECT_DEATH({ t.f32()[0] = 5.0f; }, "host code touched device memory");
  // The same tensor through the device kind's copies, fills and an op.
  EXPECT_EQ(t.to_vector(), (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f}));
  Tensor y = Tensor::full(remat::Shape{4}, 0.5f, Device::cuda_emu());
  remat::backend_for(Device::cuda_emu()).add(t, y, y);
  EXPECT_EQ(y.to_vector(), (std::vector<float>{1.5f, 2.5f, 3.5f, 4.5f}));
  EXPECT_EQ(Tensor::zeros(remat::Shape{3}, Device::cuda_emu(), remat::DType::i32).to_ints(),
            (std::vector<int32_t>{0, 0, 0}));
}

// The backend puts every op on its own stream: training steps of the tiny models (forward,
// recomputation, backward, SGD and AdamW, norm and accuracy read back) enqueue nothing on
// the legacy default stream (the emulator counts kernel launches, copies, fills and cuBLAS
// calls there).
TEST(DeviceExec, NothingRunsOnTheDefaultStream) {
  namespace emu = remat::emu;
  const uint64_t before = emu::default_stream_uses();
  cudaMemsetAsync(nullptr, 0, 0);  // the counter can fail: one use of the default stream
  ASSERT_EQ(emu::default_stream_uses(), before + 1);
  remat::Backend& be = remat::backend_for(dut());
  const uint64_t start = emu::default_stream_uses();
  for (const char* tiny : {"gpt_char_tiny.json", "fashion_cnn_tiny.json", "conv_mix_tiny.json"}) {
    const std::string path = std::string(REMAT_SOURCE_DIR) + "/tests/configs/" + tiny;
    remat::Config c = remat::load_config(path);
    const remat::Graph g = remat::build_graph(c.model, 2, path, {{"vocab", 24}});
    run(g, dut(), "sqrt");
    remat::ParamStore params(g, dut(), 5);
    std::vector<Tensor> grads;
    for (size_t p = 0; p < params.values.size(); ++p) {
      if (!params.grads[p].defined()) continue;
      Tensor m = Tensor::zeros(params.values[p].shape(), dut()), v = Tensor::zeros(params.values[p].shape(), dut());
      params.grads[p].fill_(0.5f);
      be.adamw_step(params.values[p], params.grads[p], m, v, remat::AdamWParams{}, 1);
      grads.push_back(params.grads[p]);
    }
    EXPECT_GT(be.global_norm(grads), 0.0) << tiny;
    EXPECT_EQ(emu::default_stream_uses(), start) << tiny << ": work on the legacy default stream";
  }
}

// Stream drains (docs/kernels.md): a training step — upload of a host-built batch, forward,
// backward and the optimizer, the loss left on the device as the trainer does — waits for
// the stream not once between its first op and the end-of-step synchronize, with or
// without gradient clipping (computed on the device). Ids and targets written on the device (no host-known range) are
// checked by kernels whose flag is read back: there the count grows, so the counter can fail.
TEST(DeviceExec, StreamDrainsPerStep) {
  auto& be = dynamic_cast<remat::CudaBackend&>(remat::backend_for(dut()));
  for (const char* tiny : {"gpt_char_tiny.json", "fashion_cnn_tiny.json"}) {
    SCOPED_TRACE(tiny);
    const std::string path = std::string(REMAT_SOURCE_DIR) + "/tests/configs/" + tiny;
    remat::Config c = remat::load_config(path);
    const remat::Graph g = remat::build_graph(c.model, 2, path, {{"vocab", 24}});
    for (const double clip : {0.0, 1.0}) {
      SCOPED_TRACE("grad_clip " + std::to_string(clip));
      remat::ParamStore params(g, dut(), 5);
      remat::ExecOptions eo;
      eo.read_loss = false;
      remat::Executor ex(g, params, be, remat::make_plan(g, "sqrt"), eo);
      remat::OptimizerConfig oc = c.optimizer;
      oc.grad_clip = clip;
      remat::Optimizer opt(oc, params, be);
      remat::RngGenerator gen(9);
      for (int step = 1; step <= 2; ++step) {
        const Batch batch = batch_for(g, static_cast<uint32_t>(step), dut());
        const int64_t before = be.stream_drains();
        params.zero_grads(be);
        remat::StepStats st = ex.train_step(batch, gen);
        opt.step(1e-3);
        EXPECT_EQ(be.stream_drains() - before, 0) << "step " << step;
        EXPECT_TRUE(std::isnan(st.loss));
        ASSERT_TRUE(st.loss_value.defined());
        be.synchronize();
        EXPECT_TRUE(std::isfinite(st.loss_value.to_vector()[0]));
      }
      // The same batch with ids and targets copied on the device: their range is unknown.
      const Batch host = batch_for(g, 7, dut());
      Batch on_device;
      for (const auto& [name, t] : host.items()) on_device.set(name, t.clone());
      const int64_t before = be.stream_drains();
      params.zero_grads(be);
      ex.train_step(on_device, gen);
      const int64_t checks = (on_device.input().dtype() == remat::DType::i32 ? 2 : 0) + 1;  // embedding fwd + bwd, loss
      EXPECT_GE(be.stream_drains() - before, checks);
    }
  }
}

// cuBLAS's math mode: the default mode while TF32 is off, pedantic only when asked for,
// TF32 winning over pedantic.
TEST(DeviceExec, CublasMathMode) {
  auto& be = dynamic_cast<remat::CudaBackend&>(remat::backend_for(dut()));
  const bool tf32 = be.tf32(), pedantic = be.pedantic_math();
  auto mode = [&] {
    cublasMath_t m{};
    EXPECT_EQ(cublasGetMathMode(be.cublas(), &m), CUBLAS_STATUS_SUCCESS);
    return m;
  };
  be.set_pedantic_math(false);
  be.set_tf32(false);
  EXPECT_EQ(mode(), CUBLAS_DEFAULT_MATH);
  be.set_pedantic_math(true);
  EXPECT_EQ(mode(), CUBLAS_PEDANTIC_MATH);
  be.set_tf32(true);
  EXPECT_EQ(mode(), CUBLAS_TF32_TENSOR_OP_MATH);
  be.set_tf32(false);
  EXPECT_EQ(mode(), CUBLAS_PEDANTIC_MATH);
  be.set_pedantic_math(false);
  EXPECT_EQ(mode(), CUBLAS_DEFAULT_MATH);
  be.set_pedantic_math(pedantic);
  be.set_tf32(tf32);
}

// Attention's products on cuBLAS (src/backends/cuda/attention.cpp): one pointer-array call
// per product over all the heads of a group of batch elements, counted by the emulated
// cuBLAS. B = 8 and H = 12 as GPT-2 124M at batch 8 (small T and head size): one group at
// the default scratch limit, 6 calls per forward + backward (before the pointer arrays: 48,
// one strided call per batch element and product); groups of one batch element (what
// GPT-2 124M's T = 1024 gives at the default 64 MiB limit: 12 * 1024^2 * 4 bytes = 48 MiB
// per element): 8 * 6 = 48 strided calls (no arrays to build); groups of three: 3 * 6. The
// results are bitwise those of the strided calls (each head the same GEMM), fp32 and bf16.
TEST(DeviceExec, AttentionIsOneCublasCallPerProductAndGroup) {
  auto& be = dynamic_cast<remat::CudaBackend&>(remat::backend_for(dut()));
  const int64_t B = 8, T = 8, H = 12, hs = 8, C = H * hs;
  const remat::AttentionParams p{static_cast<int>(H), true, 0.1f};
  const remat::RngState rng{11, 4};
  for (const remat::DType dt : {remat::DType::f32, remat::DType::bf16}) {
    SCOPED_TRACE(remat::dtype_name(dt));
    remat::ActivationDTypeScope scope(dt);
    auto make = [&](const remat::Shape& sh, uint32_t seed) {
      const Tensor f = remat::test::random_tensor(sh, seed).to(dut());
      if (dt == remat::DType::f32) return f;
      Tensor h = Tensor::empty(sh, dut(), dt);
      be.scale(f, 1.0f, h);
      return h;
    };
    const Tensor qkv = make({B, T, 3 * C}, 1), dout = make({B, T, C}, 2);
    struct Result {
      uint64_t calls;
      std::vector<float> out, probs, dqkv;
    };
    auto run_with = [&](int64_t group_elements) {
      const int64_t old = be.set_attention_group_bytes(group_elements * H * T * T * 4);
      Tensor out = Tensor::empty({B, T, C}, dut(), dt), probs = Tensor::empty({B, H, T, T}, dut(), dt);
      Tensor dqkv = Tensor::empty({B, T, 3 * C}, dut(), dt);
      auto ws = [&](size_t bytes) { return Tensor::empty({static_cast<int64_t>(bytes / 4 + 1)}, dut()); };
      const Tensor wf = ws(be.attention_forward_workspace(qkv.shape(), p));
      const Tensor wb = ws(be.attention_backward_workspace(qkv.shape(), p));
      const uint64_t before = remat::emu::cublas_gemm_calls();
      be.attention_forward(qkv, p, rng, out, probs, wf);
      be.attention_backward(dout, qkv, probs, p, rng, dqkv, wb);
      const uint64_t calls = remat::emu::cublas_gemm_calls() - before;
      be.set_attention_group_bytes(old);
      return Result{calls, out.to_vector(), probs.to_vector(), dqkv.to_vector()};  // bf16 widened exactly
    };
    const Result one_group = run_with(0), singles = run_with(1), threes = run_with(3);
    EXPECT_EQ(one_group.calls, 6u);
    EXPECT_EQ(singles.calls, 48u);
    EXPECT_EQ(threes.calls, 18u);
    for (const Result* r : {&singles, &threes}) {  // no NaN: == is bitwise here
      EXPECT_EQ(r->out, one_group.out);
      EXPECT_EQ(r->probs, one_group.probs);
      EXPECT_EQ(r->dqkv, one_group.dqkv);
    }
  }
}
#endif
