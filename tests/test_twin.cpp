// remat against its PyTorch twin (tools/reference/torch_reference.py): for each tiny config in
// tests/configs, the golden file tests/golden/twin/<config>.safetensors holds random
// weights, a batch, and PyTorch's loss, parameter gradients and updated batchnorm
// running statistics after one training-mode forward and backward, computed in float64
// from the float32 values. remat loads the weights by full parameter name (every one
// must match), runs one Executor::train_step under the policies none, sqrt and selective,
// and must agree with the golden to float32 accuracy, and bitwise across policies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "remat/config.h"
#include "remat/exec.h"
#include "support/golden.h"

using remat::Device;
using remat::SafetensorsFile;
using remat::Tensor;
using remat::test::bitwise_equal;

namespace {

// Tolerances against the float64 reference. remat computes in float32: each result is a
// float32 sum of up to a few hundred products (a linear weight gradient over B*T = 48 rows,
// a conv weight gradient over N*H*W = 576 positions) through up to 4 blocks, so it carries
// an absolute error of a few 1e-7 of the magnitudes summed, which is the scale of the
// layer's gradients rather than of each entry (entries that are sums of cancelling terms
// are small but not more accurate; a bias before a batchnorm has an exactly zero gradient
// in exact arithmetic and about 4e-8 in float32). So each gradient is compared with
// atol = 1e-5 x its layer's largest golden gradient entry and rtol = 1e-4. Measured (the
// test prints them): worst error 8e-7 of the layer scale, worst 5e-6 relative on entries
// of at least 10% of it; the tolerances leave a 10-20x margin, and each semantic change
// tried on the tiny configs fails them (gelu tanh -> erf, ln_f eps 1e-5 -> 1e-3, causal
// off, 2 heads instead of 4, batchnorm momentum 0.2, another ignore_index). The loss must
// agree to 1e-5 relative (measured: 2e-8).
constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;
constexpr double kLossRtol = 1e-5;

double max_abs(const Tensor& t) {
  double m = 0;
  for (float v : t.to_vector()) m = std::max(m, static_cast<double>(std::fabs(v)));
  return m;
}

struct Case {
  std::string name;
  SafetensorsFile golden;
  remat::Config cfg;
  remat::Graph graph;
};

Case load_case(const std::string& name) {
  SafetensorsFile f = remat::test::load_golden(name);
  const std::string cfg_path = std::string(REMAT_SOURCE_DIR) + "/" + remat::test::meta_str(f, "config");
  remat::Config cfg = remat::load_config(cfg_path);
  std::map<std::string, int64_t> vars;
  const nlohmann::json vj = nlohmann::json::parse(remat::test::meta_str(f, "vars"));
  for (auto it = vj.begin(); it != vj.end(); ++it) vars[it.key()] = it.value().get<int64_t>();
  remat::Graph g = remat::build_graph(cfg.model, remat::test::meta_int(f, "batch"), cfg_path, vars);
  return Case{name, std::move(f), std::move(cfg), std::move(g)};
}

// Copies the golden's weights into `ps` by full name; every parameter and buffer of the
// graph must be in the golden with its shape, and the golden must hold no other.
void load_weights(const Case& c, remat::ParamStore& ps) {
  size_t in_golden = 0;
  for (const auto& e : c.golden.entries())
    if (e.name.rfind("param/", 0) == 0) ++in_golden;
  ASSERT_EQ(in_golden, c.graph.params.size()) << "the golden and the graph differ in parameter count";
  for (size_t p = 0; p < c.graph.params.size(); ++p) {
    const std::string key = "param/" + c.graph.params[p].name;
    ASSERT_TRUE(c.golden.has(key)) << "golden has no " << key;
    const Tensor v = c.golden.tensor(key);
    ASSERT_EQ(v.shape(), ps.values[p].shape()) << key;
    ps.values[p].copy_from(v);
  }
}

struct StepResult {
  float loss = 0;
  int64_t recomputed = 0;
  std::vector<Tensor> grads, values;
};

StepResult run_step(const Case& c, const std::string& policy) {
  remat::Backend& be = remat::backend_for(Device::cpu());
  remat::ParamStore ps(c.graph, Device::cpu(), 0);
  load_weights(c, ps);
  remat::Batch batch{c.golden.tensor("input"), c.golden.tensor("targets")};
  remat::Executor ex(c.graph, ps, be, remat::make_plan(c.graph, policy));
  remat::RngGenerator gen(1);
  ps.zero_grads(be);
  const remat::StepStats st = ex.train_step(batch, gen);
  StepResult r;
  r.loss = st.loss;
  r.recomputed = st.recomputed_layers;
  for (size_t p = 0; p < ps.values.size(); ++p) {
    r.grads.push_back(ps.grads[p].defined() ? ps.grads[p].clone() : Tensor());
    r.values.push_back(ps.values[p].clone());
  }
  return r;
}

class Twin : public ::testing::TestWithParam<std::string> {};

TEST_P(Twin, OneStepMatchesPyTorchUnderEveryPolicy) {
  const Case c = load_case(GetParam());
  const double want_loss = c.golden.tensor("loss").to_vector()[0];
  std::vector<StepResult> results;
  for (const char* policy : {"none", "sqrt", "selective"}) {
    SCOPED_TRACE(policy);
    StepResult r = run_step(c, policy);
    if (std::string(policy) != "none") {
      EXPECT_GT(r.recomputed, 0) << "the policy recomputed nothing";
    }
    EXPECT_NEAR(r.loss, want_loss, kLossRtol * std::fabs(want_loss));
    // A layer's gradients share a scale: the largest golden gradient entry of the layer.
    std::map<int, double> layer_scale;
    for (size_t p = 0; p < c.graph.params.size(); ++p)
      if (c.graph.params[p].spec.trainable) {
        double& s = layer_scale[c.graph.params[p].owner];
        s = std::max(s, max_abs(c.golden.tensor("grad/" + c.graph.params[p].name)));
      }
    double worst_abs = 0, worst_rel = 0;  // |error| / layer scale; relative on entries >= 10% of it
    size_t grads = 0, buffers = 0;
    for (size_t p = 0; p < c.graph.params.size(); ++p) {
      const auto& gp = c.graph.params[p];
      if (gp.spec.trainable) {
        const Tensor want = c.golden.tensor("grad/" + gp.name);
        const double scale = layer_scale[gp.owner];
        EXPECT_ALL_CLOSE(r.grads[p], want, kRtol, kAtol * scale) << "gradient of " << gp.name;
        const auto a = r.grads[p].to_vector(), e = want.to_vector();
        for (size_t i = 0; i < a.size() && i < e.size(); ++i) {
          const double err = std::fabs(static_cast<double>(a[i]) - e[i]);
          worst_abs = std::max(worst_abs, err / scale);
          if (std::fabs(e[i]) >= 0.1 * scale) worst_rel = std::max(worst_rel, err / std::fabs(e[i]));
        }
        ++grads;
      } else {
        // Buffers (batchnorm running statistics) moved once by momentum, recompute or not.
        EXPECT_ALL_CLOSE(r.values[p], c.golden.tensor("after/" + gp.name), kRtol, 1e-6) << gp.name;
        ++buffers;
      }
    }
    std::printf(
        "[ twin     ] %s %-9s loss %.9g (torch %.9g), %zu gradients, %zu buffers; gradient error: "
        "worst %.2e of the layer scale, worst %.2e relative on entries >= 10%% of it\n",
        c.name.c_str(), policy, static_cast<double>(r.loss), want_loss, grads, buffers, worst_abs, worst_rel);
    results.push_back(std::move(r));
  }
  // The policies agree bitwise: loss, gradients and running statistics.
  for (size_t k = 1; k < results.size(); ++k) {
    EXPECT_EQ(results[k].loss, results[0].loss) << "policy " << k;
    for (size_t p = 0; p < c.graph.params.size(); ++p) {
      const Tensor& a = c.graph.params[p].spec.trainable ? results[k].grads[p] : results[k].values[p];
      const Tensor& b = c.graph.params[p].spec.trainable ? results[0].grads[p] : results[0].values[p];
      EXPECT_TRUE(bitwise_equal(a, b)) << c.graph.params[p].name << " under policy " << k;
    }
  }
}

std::vector<std::string> cases() {
  auto v = remat::test::golden_cases("twin");
  return v;
}

INSTANTIATE_TEST_SUITE_P(Configs, Twin, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param.substr(i.param.find('/') + 1);
                           std::replace_if(
                               n.begin(), n.end(),
                               [](char ch) { return !std::isalnum(static_cast<unsigned char>(ch)); }, '_');
                           return n;
                         });

// The golden files cover the tiny configs they are made for (a missing golden would
// silently shrink the parameterised suite).
TEST(TwinGoldens, EveryTinyConfigHasOne) {
  const auto v = cases();
  for (const char* want : {"twin/gpt_char_tiny", "twin/fashion_cnn_tiny", "twin/conv_mix_tiny", "twin/seq_mix_tiny",
                           "twin/llama_tiny", "twin/vit_tiny", "twin/unet_tiny"})
    EXPECT_NE(std::find(v.begin(), v.end(), want), v.end()) << want;
}

}  // namespace
