// The optimizer ops of the CPU backend (src/backends/cpu/optim.cpp): SGD and AdamW steps (one
// tensor and many), the global norm and gradient clipping, against torch.optim and
// torch.nn.utils goldens (tools/reference/golden/basic.py), thread counts and bad arguments.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ops/op_test.h"
#include "remat/backend.h"
#include "support/expect_error.h"
#include "support/golden.h"

namespace remat::test {
namespace {

// ---- Optimizers ----------------------------------------------------------------------------------

TEST(Optim, SgdTenStepsMatchTorchOptim) {
  for (const char* name : {"sgd_momentum_wd", "sgd_nesterov", "sgd_plain"}) {
    SCOPED_TRACE(name);
    auto g = load_golden(std::string("basic/") + name);
    remat::SgdParams p;
    p.lr = meta_float(g, "lr");
    p.weight_decay = meta_float(g, "weight_decay");
    p.momentum = meta_float(g, "momentum");
    p.dampening = meta_float(g, "dampening");
    p.nesterov = meta_int(g, "nesterov") != 0;
    Tensor param = g.tensor("param0");
    Tensor buf = Tensor::zeros(param.shape());
    for (int s = 1; s <= 10; ++s) cpu().sgd_step(param, g.tensor("grad" + std::to_string(s - 1)), buf, p, s);
    EXPECT_TRUE(all_close(param, g.tensor("param"), 1e-6, 1e-6));
    if (g.has("momentum_buffer")) {
      EXPECT_TRUE(all_close(buf, g.tensor("momentum_buffer"), 1e-6, 1e-6));
    }
    // sgd_step_multi over the same tensor twice (two copies): torch's values too, and the
    // bits of sgd_step; without momentum the buffers are undefined
    const bool mom = p.momentum != 0.0;
    std::vector<Tensor> ps{g.tensor("param0"), g.tensor("param0").clone()}, bufs;
    for (int i = 0; i < 2; ++i) bufs.push_back(mom ? Tensor::zeros(param.shape()) : Tensor());
    for (int s = 1; s <= 10; ++s) {
      const Tensor gr = g.tensor("grad" + std::to_string(s - 1));
      cpu().sgd_step_multi(ps, {gr, gr}, bufs, {p, p}, s);
    }
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(all_close(ps[i], g.tensor("param"), 1e-6, 1e-6));
      EXPECT_EQ(ps[i].to_vector(), param.to_vector()) << "not sgd_step's bits";
      if (mom) {
        EXPECT_EQ(bufs[i].to_vector(), buf.to_vector()) << "momentum_buf: not sgd_step's bits";
      }
    }
    EXPECT_REMAT_ERROR(cpu().sgd_step_multi(ps, {}, bufs, {p, p}, 1), "2 params but 0 grads");
    EXPECT_REMAT_ERROR(cpu().sgd_step_multi(ps, {param, param}, bufs, {p}, 1),
                       "2 params but 2 grads, 2 momentum_bufs and 1 hyperparameter sets");
    EXPECT_REMAT_ERROR(cpu().sgd_step_multi(ps, {param, param}, bufs, {p, p}, 0), "step counts from 1");
    if (mom) {
      EXPECT_REMAT_ERROR(cpu().sgd_step_multi(ps, {param, param}, {Tensor(), Tensor()}, {p, p}, 1),
                         "momentum_buf is undefined");
    }
  }
}

TEST(Optim, AdamWTenStepsMatchTorchOptim) {
  for (const char* name : {"adamw", "adamw_default"}) {
    SCOPED_TRACE(name);
    auto g = load_golden(std::string("basic/") + name);
    remat::AdamWParams p;
    p.lr = meta_float(g, "lr");
    p.weight_decay = meta_float(g, "weight_decay");
    p.beta1 = meta_float(g, "beta1");
    p.beta2 = meta_float(g, "beta2");
    p.eps = meta_float(g, "eps");
    Tensor param = g.tensor("param0");
    Tensor m = Tensor::zeros(param.shape()), v = Tensor::zeros(param.shape());
    for (int s = 1; s <= 10; ++s) cpu().adamw_step(param, g.tensor("grad" + std::to_string(s - 1)), m, v, p, s);
    EXPECT_TRUE(all_close(param, g.tensor("param"), 1e-6, 1e-6));
    EXPECT_TRUE(all_close(m, g.tensor("exp_avg"), 1e-6, 1e-7));
    EXPECT_TRUE(all_close(v, g.tensor("exp_avg_sq"), 1e-6, 1e-8));
    // adamw_step_multi over the same tensor twice (two copies): torch's values too
    Tensor p0 = g.tensor("param0"), p1 = g.tensor("param0").clone();
    std::vector<Tensor> ps{p0, p1}, ms, vs;
    for (int i = 0; i < 2; ++i) ms.push_back(Tensor::zeros(p0.shape())), vs.push_back(Tensor::zeros(p0.shape()));
    for (int s = 1; s <= 10; ++s) {
      const Tensor gr = g.tensor("grad" + std::to_string(s - 1));
      cpu().adamw_step_multi(ps, {gr, gr}, ms, vs, {p, p}, s);
    }
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(all_close(ps[static_cast<size_t>(i)], g.tensor("param"), 1e-6, 1e-6));
    EXPECT_REMAT_ERROR(cpu().adamw_step_multi(ps, {}, ms, vs, {p, p}, 1), "2 params but 0 grads");
  }
}

TEST(Optim, GlobalNormAndClippingMatchPyTorch) {
  auto g = load_golden("basic/clip_grad_norm");
  const int count = static_cast<int>(meta_int(g, "count"));
  const double max_norm = meta_float(g, "max_norm");
  std::vector<Tensor> grads;
  for (int i = 0; i < count; ++i) grads.push_back(g.tensor("g" + std::to_string(i)));
  const double norm = cpu().global_norm(grads);
  EXPECT_NEAR(norm, g.tensor("norm").to_vector()[0], 1e-5 * norm);
  // clip_grad_norm in one call, on copies: PyTorch's clipped gradients too.
  std::vector<Tensor> copies;
  for (const Tensor& t : grads) copies.push_back(t.clone());
  cpu().clip_grad_norm(copies, max_norm);
  for (int i = 0; i < count; ++i)
    EXPECT_TRUE(all_close(copies[static_cast<size_t>(i)], g.tensor("clipped" + std::to_string(i)), 1e-6, 1e-7)) << i;
  // a max_norm above the norm leaves them untouched
  std::vector<Tensor> kept;
  for (const Tensor& t : grads) kept.push_back(t.clone());
  cpu().clip_grad_norm(kept, 2.0 * norm);
  for (int i = 0; i < count; ++i)
    EXPECT_TRUE(bitwise_equal(kept[static_cast<size_t>(i)], grads[static_cast<size_t>(i)]));
  EXPECT_REMAT_ERROR(cpu().clip_grad_norm(kept, 0.0), "max_norm must be positive");
  // torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped to 1.
  const auto coef = static_cast<float>(std::min(1.0, max_norm / (norm + 1e-6)));
  for (int i = 0; i < count; ++i) {
    cpu().scale(grads[static_cast<size_t>(i)], coef, grads[static_cast<size_t>(i)]);
    EXPECT_TRUE(all_close(grads[static_cast<size_t>(i)], g.tensor("clipped" + std::to_string(i)), 1e-6, 1e-7));
  }
}

TEST(Optim, GlobalNormIsBitwiseIndependentOfThreadCount) {
  Tensor x = random_tensor({300, 129}, 19), w = random_tensor({65, 129}, 20);
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    return cpu().global_norm({x, w});
  };
  const int saved = omp_get_max_threads();
  const double n1 = run(1);
  const double n2 = run(2);
  omp_set_num_threads(saved);
  EXPECT_EQ(n1, n2);
}

TEST(Optim, BadArgumentsNameTheOpAndShapes) {
  Tensor p = random_tensor({3}, 3);
  EXPECT_REMAT_ERROR(cpu().sgd_step(p, p, Tensor(), remat::SgdParams{}, 0), "sgd_step: step counts from 1");
  remat::AdamWParams bad;
  bad.beta1 = 1.0;
  EXPECT_REMAT_ERROR(cpu().adamw_step(p, p, p.clone(), p.clone(), bad, 1), "betas must be in [0, 1)");
}

}  // namespace
}  // namespace remat::test
