// The basic op family on the CPU backend: GEMM, linear, elementwise, dropout, softmax,
// cross-entropy, optimizers, global norm. Against PyTorch goldens (tools/golden/basic.py),
// finite differences, and independent references for what PyTorch cannot give
// (dropout masks).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>

#include "remat/backend.h"
#include "remat/ops.h"
#include "remat/philox.h"
#include "support/expect_error.h"
#include "support/golden.h"
#include "support/gradcheck.h"

using remat::Backend;
using remat::Device;
using remat::Shape;
using remat::Tensor;
using remat::test::all_close;
using remat::test::bitwise_equal;
using remat::test::check_gradient;
using remat::test::load_golden;
using remat::test::meta_float;
using remat::test::meta_int;
using remat::test::random_tensor;
namespace ops = remat::ops;

namespace {

Backend& cpu() { return remat::backend_for(Device::cpu()); }

// Tolerances against PyTorch: both sides are fp32 with different summation orders
// (OpenBLAS vs PyTorch's BLAS, vectorised reductions), so agreement is to a few ulps of
// the accumulated magnitude, not bitwise.
constexpr double kRtol = 1e-5, kAtol = 1e-6;

}  // namespace

// ---- GEMM and linear ---------------------------------------------------------------------

TEST(BasicOps, GemmMatchesPyTorch) {
  for (const char* name : {"gemm_small", "gemm_trans_a", "gemm_trans_b", "gemm_batched_tt", "gemm_batched_shared_b"}) {
    SCOPED_TRACE(name);
    auto g = load_golden(std::string("basic/") + name);
    Tensor c = g.tensor("c0");
    cpu().gemm(
        g.tensor("a"), g.tensor("b"), c,
        remat::GemmParams{meta_int(g, "trans_a") != 0, meta_int(g, "trans_b") != 0,
                          static_cast<float>(meta_float(g, "alpha")), static_cast<float>(meta_float(g, "beta"))});
    EXPECT_TRUE(all_close(c, g.tensor("c"), kRtol, kAtol));
  }
}

TEST(BasicOps, LinearForwardBackwardMatchesPyTorch) {
  for (const char* name : {"linear_2d", "linear_3d_nobias", "linear_odd"}) {
    SCOPED_TRACE(name);
    auto g = load_golden(std::string("basic/") + name);
    const bool bias = meta_int(g, "bias") != 0;
    Tensor x = g.tensor("x"), w = g.tensor("w"), b = bias ? g.tensor("b") : Tensor();
    Tensor y = ops::linear(cpu(), x, w, b);
    EXPECT_TRUE(all_close(y, g.tensor("y"), kRtol, kAtol));
    Tensor dx = Tensor::empty(x.shape());
    Tensor dw = Tensor::full(w.shape(), 0.25f);  // parameter gradients accumulate
    Tensor db = bias ? Tensor::zeros(b.shape()) : Tensor();
    cpu().linear_backward(g.tensor("dy"), x, w, dx, dw, db);
    EXPECT_TRUE(all_close(dx, g.tensor("dx"), kRtol, kAtol));
    Tensor want_dw = g.tensor("dw");
    std::vector<float> wd = want_dw.to_vector();
    for (float& v : wd) v += 0.25f;
    EXPECT_TRUE(all_close(dw, Tensor::from_vector(wd, w.shape()), kRtol, kAtol));
    if (bias) {
      EXPECT_TRUE(all_close(db, g.tensor("db"), kRtol, kAtol));
    }
  }
}

TEST(BasicOps, LinearGradientsMatchFiniteDifferences) {
  Tensor x = random_tensor({5, 6}, 1), w = random_tensor({4, 6}, 2), b = random_tensor({4}, 3);
  Tensor dy = random_tensor({5, 4}, 4);
  auto loss = [&] { return remat::test::dot(ops::linear(cpu(), x, w, b), dy); };
  Tensor dx = Tensor::empty(x.shape()), dw = Tensor::zeros(w.shape()), db = Tensor::zeros(b.shape());
  cpu().linear_backward(dy, x, w, dx, dw, db);
  EXPECT_TRUE(check_gradient("linear dx", x, dx, loss));
  EXPECT_TRUE(check_gradient("linear dw", w, dw, loss));
  EXPECT_TRUE(check_gradient("linear db", b, db, loss));
}

TEST(BasicOps, MatmulGradientsMatchFiniteDifferences) {
  // d(a @ b) by the gemm identities the executor uses: da = dc b^T, db = a^T dc.
  Tensor a = random_tensor({2, 3, 4}, 5), b = random_tensor({2, 4, 5}, 6), dc = random_tensor({2, 3, 5}, 7);
  auto loss = [&] { return remat::test::dot(ops::matmul(cpu(), a, b), dc); };
  Tensor da = ops::matmul(cpu(), dc, b, false, true);
  Tensor db = ops::matmul(cpu(), a, dc, true, false);
  EXPECT_TRUE(check_gradient("matmul da", a, da, loss));
  EXPECT_TRUE(check_gradient("matmul db", b, db, loss));
}

// ---- Elementwise -------------------------------------------------------------------------------

TEST(BasicOps, ReluGeluAddMatchPyTorch) {
  struct Case {
    const char* name;
    int kind;  // 0 relu, 1 gelu erf, 2 gelu tanh
  };
  for (Case c : {Case{"relu", 0}, Case{"gelu_erf", 1}, Case{"gelu_tanh", 2}}) {
    SCOPED_TRACE(c.name);
    auto g = load_golden(std::string("basic/") + c.name);
    Tensor x = g.tensor("x"), dx = Tensor::empty(x.shape());
    const auto approx = c.kind == 2 ? remat::GeluApprox::tanh : remat::GeluApprox::none;
    Tensor y = c.kind == 0 ? ops::relu(cpu(), x) : ops::gelu(cpu(), x, approx);
    // GELU: erf/tanh from libm vs PyTorch's vectorised versions differ by a few ulps.
    EXPECT_TRUE(all_close(y, g.tensor("y"), 1e-5, 1e-6));
    if (c.kind == 0)
      cpu().relu_backward(g.tensor("dy"), x, dx);
    else
      cpu().gelu_backward(g.tensor("dy"), x, approx, dx);
    EXPECT_TRUE(all_close(dx, g.tensor("dx"), 1e-5, 1e-6));
  }
  auto g = load_golden("basic/add");
  EXPECT_TRUE(all_close(ops::add(cpu(), g.tensor("a"), g.tensor("b")), g.tensor("y"), 0, 0));
}

TEST(BasicOps, ElementwiseGradientsMatchFiniteDifferences) {
  Tensor x = random_tensor({3, 41}, 8, -3.0f, 3.0f), dy = random_tensor({3, 41}, 9);
  Tensor dx = Tensor::empty(x.shape());
  for (auto approx : {remat::GeluApprox::none, remat::GeluApprox::tanh}) {
    cpu().gelu_backward(dy, x, approx, dx);
    EXPECT_TRUE(check_gradient("gelu", x, dx, [&] { return remat::test::dot(ops::gelu(cpu(), x, approx), dy); }));
  }
  cpu().relu_backward(dy, x, dx);
  remat::test::GradCheckOptions opt;
  const float* px = x.f32();
  opt.skip = [&](int64_t i) { return std::fabs(px[i]) < 2 * opt.eps; };  // the kink at 0
  EXPECT_TRUE(check_gradient(
      "relu", x, dx, [&] { return remat::test::dot(ops::relu(cpu(), x), dy); }, opt));
  // scale and accumulate
  Tensor y = Tensor::empty(x.shape());
  cpu().scale(x, -2.0f, y);
  EXPECT_EQ(y.to_vector()[7], -2.0f * x.to_vector()[7]);
  Tensor acc = x.clone();
  cpu().accumulate(acc, y);
  EXPECT_EQ(acc.to_vector()[7], x.to_vector()[7] + y.to_vector()[7]);
}

// ---- Dropout (no PyTorch golden can share our mask: an independent reference) ---------------

TEST(BasicOps, DropoutMatchesElementKeyedReference) {
  const int64_t n = 10007;
  Tensor x = random_tensor({n}, 10);
  // 6: not block-aligned, takes the per-element path; the last one puts bits in every part
  // of the Philox counter (block >> 16 and block >> 48).
  for (uint64_t offset : {0ull, 8ull, 6ull, (1ull << 50) + (3ull << 20) + 8ull}) {
    const remat::RngState rng{77, offset};
    const float p = 0.3f;
    Tensor y = ops::dropout(cpu(), x, p, rng);
    const auto xv = x.to_vector(), yv = y.to_vector();
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float u = remat::philox::uniform(remat::philox::word(77, offset + static_cast<uint64_t>(i)));
      const float want = u < 0.7f ? xv[static_cast<size_t>(i)] * (1.0f / 0.7f) : 0.0f;
      ASSERT_EQ(yv[static_cast<size_t>(i)], want) << "offset " << offset << " element " << i;
      kept += u < 0.7f;
    }
    const double sd = std::sqrt(n * 0.7 * 0.3);
    EXPECT_NEAR(static_cast<double>(kept), 0.7 * n, 6 * sd);
  }
}

TEST(BasicOps, DropoutBackwardUsesTheForwardMask) {
  Tensor x = random_tensor({3, 333}, 11), dy = random_tensor({3, 333}, 12);
  const remat::RngState rng{5, 1024};
  Tensor y = ops::dropout(cpu(), x, 0.5f, rng);
  Tensor dx = Tensor::empty(x.shape());
  cpu().dropout_backward(dy, 0.5f, rng, dx);
  const auto yv = y.to_vector(), dxv = dx.to_vector(), xv = x.to_vector(), dyv = dy.to_vector();
  for (size_t i = 0; i < yv.size(); ++i) {
    const bool kept = yv[i] != 0.0f;
    ASSERT_EQ(dxv[i], kept ? dyv[i] * 2.0f : 0.0f) << i;
    if (kept) {
      ASSERT_EQ(yv[i], xv[i] * 2.0f);
    }
  }
  EXPECT_TRUE(
      check_gradient("dropout", x, dx, [&] { return remat::test::dot(ops::dropout(cpu(), x, 0.5f, rng), dy); }));
}

TEST(BasicOps, DropoutEdgeProbabilitiesAndThreadCounts) {
  Tensor x = random_tensor({4096}, 13);
  EXPECT_TRUE(bitwise_equal(ops::dropout(cpu(), x, 0.0f, {1, 0}), x));
  for (float v : ops::dropout(cpu(), x, 1.0f, {1, 0}).to_vector()) ASSERT_EQ(v, 0.0f);
  // p close to 1: a handful kept, each scaled by 1/(1-p), finite.
  Tensor big = random_tensor({1 << 16}, 14);
  Tensor y = ops::dropout(cpu(), big, 0.9999f, {3, 0});
  int kept = 0;
  for (float v : y.to_vector()) {
    ASSERT_TRUE(std::isfinite(v));
    kept += v != 0.0f;
  }
  EXPECT_LT(kept, 40);
  // Same mask with 1 and 2 threads.
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  Tensor y1 = ops::dropout(cpu(), big, 0.4f, {9, 64});
  omp_set_num_threads(2);
  Tensor y2 = ops::dropout(cpu(), big, 0.4f, {9, 64});
  omp_set_num_threads(saved);
  EXPECT_TRUE(bitwise_equal(y1, y2));
  EXPECT_REMAT_ERROR(ops::dropout(cpu(), x, 1.5f, {1, 0}), "dropout_forward: p must be in [0, 1]");
}

// ---- Softmax and cross-entropy ---------------------------------------------------------------

TEST(BasicOps, SoftmaxAndLogSoftmaxMatchPyTorch) {
  for (const char* name : {"softmax_2d", "softmax_3d_odd", "log_softmax_2d", "log_softmax_3d_odd"}) {
    SCOPED_TRACE(name);
    auto g = load_golden(std::string("basic/") + name);
    const bool log = meta_int(g, "log") != 0;
    Tensor y = ops::softmax(cpu(), g.tensor("x"), log);
    EXPECT_TRUE(all_close(y, g.tensor("y"), kRtol, kAtol));
    Tensor dx = Tensor::empty(y.shape());
    cpu().softmax_backward(g.tensor("dy"), y, log, dx);
    EXPECT_TRUE(all_close(dx, g.tensor("dx"), kRtol, kAtol));
  }
}

TEST(BasicOps, SoftmaxGradientsMatchFiniteDifferences) {
  Tensor x = random_tensor({3, 11}, 15, -2, 2), dy = random_tensor({3, 11}, 16);
  for (bool log : {false, true}) {
    Tensor y = ops::softmax(cpu(), x, log), dx = Tensor::empty(x.shape());
    cpu().softmax_backward(dy, y, log, dx);
    EXPECT_TRUE(check_gradient(log ? "log_softmax" : "softmax", x, dx,
                               [&] { return remat::test::dot(ops::softmax(cpu(), x, log), dy); }));
  }
}

TEST(BasicOps, CrossEntropyMatchesPyTorch) {
  for (const char* name : {"ce_small", "ce_ignore", "ce_wide"}) {
    SCOPED_TRACE(name);
    auto g = load_golden(std::string("basic/") + name);
    const int ignore = static_cast<int>(meta_int(g, "ignore_index"));
    Tensor logits = g.tensor("logits"), targets = g.tensor("targets");
    auto ce = ops::cross_entropy(cpu(), logits, targets, ignore);
    EXPECT_TRUE(all_close(ce.loss, g.tensor("loss"), kRtol, kAtol));
    Tensor dl = Tensor::empty(logits.shape());
    cpu().cross_entropy_backward(1.0f, logits, targets, ce.lse, ignore, dl);
    EXPECT_TRUE(all_close(dl, g.tensor("dlogits"), kRtol, kAtol));
  }
}

TEST(BasicOps, CrossEntropyGradientAndEdgeCases) {
  Tensor logits = random_tensor({5, 7}, 17, -2, 2);
  Tensor targets = Tensor::from_ints({0, 6, -100, 3, 3}, {5});
  auto ce = ops::cross_entropy(cpu(), logits, targets);
  Tensor dl = Tensor::empty(logits.shape());
  cpu().cross_entropy_backward(2.0f, logits, targets, ce.lse, -100, dl);
  EXPECT_TRUE(check_gradient("cross_entropy", logits, dl,
                             [&] { return 2.0 * ops::cross_entropy(cpu(), logits, targets).loss.to_vector()[0]; }));
  // All rows ignored: NaN like PyTorch; gradient zero.
  Tensor none = Tensor::from_ints({-100, -100}, {2});
  Tensor l2 = random_tensor({2, 3}, 18);
  auto ce2 = ops::cross_entropy(cpu(), l2, none);
  EXPECT_TRUE(std::isnan(ce2.loss.to_vector()[0]));
  EXPECT_REMAT_ERROR(ops::cross_entropy(cpu(), l2, Tensor::from_ints({0, 3}, {2})),
                     "target 3 at row 1 is outside [0, 3)");
  int64_t counted = 0;
  Tensor acc_logits = Tensor::from_vector({0.1f, 0.9f, 0.0f, 2.0f, 1.0f, 2.0f, 0.5f, 0.2f, 0.1f}, {3, 3});
  EXPECT_EQ(cpu().accuracy(acc_logits, Tensor::from_ints({1, 2, -100}, {3}), -100, &counted),
            1);  // row 1 ties: the first max (0) wins
  EXPECT_EQ(counted, 2);
}

// ---- Optimizers ----------------------------------------------------------------------------------

TEST(BasicOps, SgdTenStepsMatchTorchOptim) {
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

TEST(BasicOps, AdamWTenStepsMatchTorchOptim) {
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

TEST(BasicOps, GlobalNormAndClippingMatchPyTorch) {
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

// ---- Determinism, validation, meta -----------------------------------------------------------

TEST(BasicOps, ResultsAreBitwiseIndependentOfThreadCount) {
  Tensor x = random_tensor({300, 129}, 19), w = random_tensor({65, 129}, 20), dy = random_tensor({300, 65}, 21);
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    Tensor db = Tensor::zeros({65});
    cpu().linear_backward(dy, x, w, Tensor(), Tensor(), db);
    Tensor sm = ops::softmax(cpu(), x);
    const double n = cpu().global_norm({x, w});
    return std::make_tuple(db, sm, n);
  };
  const int saved = omp_get_max_threads();
  auto [db1, sm1, n1] = run(1);
  auto [db2, sm2, n2] = run(2);
  omp_set_num_threads(saved);
  EXPECT_TRUE(bitwise_equal(db1, db2));
  EXPECT_TRUE(bitwise_equal(sm1, sm2));
  EXPECT_EQ(n1, n2);
}

TEST(BasicOps, BadInputNamesOpAndShapes) {
  Tensor x = random_tensor({4, 3}, 22), w = random_tensor({5, 4}, 23);
  EXPECT_REMAT_ERROR(ops::linear(cpu(), x, w, Tensor()),
                     "linear_forward: x f32[4, 3] on cpu and w f32[5, 4] on cpu: in_features differ (3 vs 4)");
  EXPECT_REMAT_ERROR(ops::linear(cpu(), x, random_tensor({5, 3}, 1), random_tensor({4}, 2)),
                     "linear_forward: b f32[4] on cpu: expected shape [5]");
  EXPECT_REMAT_ERROR(ops::matmul(cpu(), x, x),
                     "gemm: a f32[4, 3] on cpu and b f32[4, 3] on cpu: inner dimensions differ");
  EXPECT_REMAT_ERROR(ops::add(cpu(), x, w), "add: a f32[4, 3] on cpu and b f32[5, 4] on cpu must have the same shape");
  Tensor ids = Tensor::from_ints({1, 2, 3}, {3});
  EXPECT_REMAT_ERROR(ops::relu(cpu(), ids), "relu_forward: x i32[3] on cpu: expected dtype f32");
  EXPECT_REMAT_ERROR(ops::cross_entropy(cpu(), x, Tensor::from_vector({0, 1, 2, 0}, {4})),
                     "cross_entropy_forward: targets f32[4] on cpu: expected dtype i32");
  EXPECT_REMAT_ERROR(ops::cross_entropy(cpu(), x, ids), "targets i32[3] on cpu: expected shape [4]");
  Tensor meta_x = Tensor::empty({4, 3}, Device::meta());
  EXPECT_REMAT_ERROR(cpu().relu_forward(meta_x, Tensor::empty({4, 3})), "expected a tensor on cpu");
  Tensor p = random_tensor({3}, 3);
  EXPECT_REMAT_ERROR(cpu().sgd_step(p, p, Tensor(), remat::SgdParams{}, 0), "sgd_step: step counts from 1");
  remat::AdamWParams bad;
  bad.beta1 = 1.0;
  EXPECT_REMAT_ERROR(cpu().adamw_step(p, p, p.clone(), p.clone(), bad, 1), "betas must be in [0, 1)");
}

TEST(BasicOps, MetaAllocatesWhatCpuAllocates) {
  auto run = [](Device d) {
    auto& alloc = remat::allocator_for(d);
    alloc.reset_peak();
    const auto before = alloc.stats();
    Backend& be = remat::backend_for(d);
    {
      remat::TagScope scope(remat::MemoryCategory::activation, "mlp", remat::Phase::forward);
      Tensor x = Tensor::empty({8, 33}, d), w = Tensor::empty({17, 33}, d), b = Tensor::empty({17}, d);
      Tensor h = ops::linear(be, x, w, b);
      Tensor a = ops::gelu(be, h);
      Tensor y = ops::dropout(be, a, 0.1f, {1, 0});
      Tensor targets = Tensor::empty({8}, d, remat::DType::i32);
      auto ce = ops::cross_entropy(be, y, targets);
      (void)ce;
    }
    const auto after = alloc.stats();
    return std::make_pair(after.peak_allocated - before.allocated, after.num_allocs - before.num_allocs);
  };
  // On cpu the data are uninitialised; only the targets must be valid for cross-entropy.
  auto cpu_run = [&] {
    auto& alloc = remat::allocator_for(Device::cpu());
    alloc.reset_peak();
    const auto before = alloc.stats();
    Backend& be = cpu();
    {
      remat::TagScope scope(remat::MemoryCategory::activation, "mlp", remat::Phase::forward);
      Tensor x = Tensor::zeros({8, 33}), w = Tensor::zeros({17, 33}), b = Tensor::zeros({17});
      Tensor h = ops::linear(be, x, w, b);
      Tensor a = ops::gelu(be, h);
      Tensor y = ops::dropout(be, a, 0.1f, {1, 0});
      Tensor targets = Tensor::from_ints(std::vector<int32_t>(8, 0), {8});
      auto ce = ops::cross_entropy(be, y, targets);
      (void)ce;
    }
    const auto after = alloc.stats();
    return std::make_pair(after.peak_allocated - before.allocated, after.num_allocs - before.num_allocs);
  };
  auto m = run(Device::meta());
  auto c = cpu_run();
  EXPECT_EQ(m.first, c.first);
  EXPECT_EQ(m.second, c.second);
  EXPECT_GT(m.first, 0);
}

TEST(BasicOps, VectorMathMatchesLibmAndPropagatesNan) {
  // The CPU backend's branch-free exp/tanh/erf (src/backends/cpu/vmath.h) against libm.
  Tensor x = Tensor::from_vector({-100.0f, -87.0f, -20.0f, -1.5f, -1e-3f, 0.0f, 1e-3f, 0.5f, 3.0f, 20.0f, 80.0f,
                                  std::numeric_limits<float>::quiet_NaN()},
                                 {12});
  Tensor y = ops::softmax(cpu(), x.reshape({12, 1}));  // exp(x - x) per row: 1, or NaN
  const auto yv = y.to_vector();
  for (size_t i = 0; i + 1 < yv.size(); ++i) EXPECT_EQ(yv[i], 1.0f) << i;
  EXPECT_TRUE(std::isnan(yv.back()));
  Tensor g = ops::gelu(cpu(), x, remat::GeluApprox::tanh);
  Tensor ge = ops::gelu(cpu(), x, remat::GeluApprox::none);
  const auto gv = g.to_vector(), gev = ge.to_vector(), xv = x.to_vector();
  for (size_t i = 0; i + 1 < xv.size(); ++i) {
    const double v = xv[i];
    const double t = 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    const double e = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    EXPECT_NEAR(gv[i], t, 1e-6 + 1e-6 * std::fabs(t)) << v;
    EXPECT_NEAR(gev[i], e, 1e-6 + 1e-6 * std::fabs(e)) << v;
  }
  EXPECT_TRUE(std::isnan(gv.back()));
  EXPECT_TRUE(std::isnan(gev.back()));
}
