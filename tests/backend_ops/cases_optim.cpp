// Optimizer steps (SGD, AdamW) and the global norm.
//
// Each optimizer runs three steps in a row (step counts 1, 2, 3, a new gradient each
// step) on the same state on both sides, into guarded state (not 16-byte aligned: the
// kernels' scalar path) and into plain aligned state (the float4 path). Tolerance 1e-6
// absolute + 1e-6 relative: the operations are the CPU backend's, in the same order, but
// nvcc fuses multiply-adds (one rounding fewer) and the CPU build does not, so a GPU may
// differ by a few ulps after three steps (the emulator compiles like the CPU: equal bits).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backend_ops/harness.h"

namespace remat::test {

namespace {

const std::vector<int64_t> kSizes = {1, 3, 4, 1001, 4096 + 3};
constexpr double kAtol = 1e-6, kRtol = 1e-6;

bool aligned16(const Tensor& x) { return reinterpret_cast<uintptr_t>(x.f32()) % 16 == 0; }

std::string sgd_name(const SgdParams& p) {
  return "sgd lr=" + std::to_string(p.lr) + " momentum=" + std::to_string(p.momentum) +
         " dampening=" + std::to_string(p.dampening) + " wd=" + std::to_string(p.weight_decay) +
         (p.nesterov ? " nesterov" : "");
}

void check_sgd(OpCheck& t, const SgdParams& p) {
  for (int64_t n : kSizes) {
    const std::string what = sgd_name(p) + " n=" + std::to_string(n);
    // guarded state, and aligned state (the buffer's contents before step 1 are unused)
    auto w = t.output_like(t.uniform({n})), buf = t.output_like(t.uniform({n}, 5.0f, 6.0f));
    auto w_al = t.uniform({n}), buf_al = t.uniform({n}, 5.0f, 6.0f);
    ASSERT_TRUE(aligned16(w_al.dut) && aligned16(buf_al.dut)) << "the float4 path is not exercised";
    for (int64_t step = 1; step <= 3; ++step) {
      auto g = t.uniform({n}, -2.0f, 2.0f);
      t.run([&](Backend& be, Side s) {
        be.sgd_step(s(w), s(g), p.momentum != 0.0 ? s(buf) : Tensor(), p, step);
        be.sgd_step(s(w_al), s(g), p.momentum != 0.0 ? s(buf_al) : Tensor(), p, step);
      });
    }
    t.expect_close(w, kAtol, kRtol, what + " param");
    t.expect_close(w_al, kAtol, kRtol, what + " param (aligned)");
    if (p.momentum != 0.0) {
      t.expect_close(buf, kAtol, kRtol, what + " momentum_buf");
      t.expect_close(buf_al, kAtol, kRtol, what + " momentum_buf (aligned)");
    }
  }
}

std::string adamw_name(const AdamWParams& p) {
  return "adamw lr=" + std::to_string(p.lr) + " betas=" + std::to_string(p.beta1) + "," + std::to_string(p.beta2) +
         " eps=" + std::to_string(p.eps) + " wd=" + std::to_string(p.weight_decay);
}

void check_adamw(OpCheck& t, const AdamWParams& p) {
  for (int64_t n : kSizes) {
    const std::string what = adamw_name(p) + " n=" + std::to_string(n);
    // moments start at zero, as in torch.optim; the aligned copy starts from random moments
    const std::vector<float> zeros(static_cast<size_t>(n), 0.0f);
    auto w = t.output_like(t.uniform({n}));
    auto m = t.output_like(t.values(zeros, {n})), v = t.output_like(t.values(zeros, {n}));
    auto w_al = t.uniform({n}), m_al = t.uniform({n}, -0.1f, 0.1f), v_al = t.uniform({n}, 0.0f, 0.01f);
    ASSERT_TRUE(aligned16(w_al.dut) && aligned16(m_al.dut) && aligned16(v_al.dut))
        << "the float4 path is not exercised";
    for (int64_t step = 1; step <= 3; ++step) {
      auto g = t.uniform({n}, -2.0f, 2.0f);
      t.run([&](Backend& be, Side s) {
        be.adamw_step(s(w), s(g), s(m), s(v), p, step);
        be.adamw_step(s(w_al), s(g), s(m_al), s(v_al), p, step);
      });
    }
    t.expect_close(w, kAtol, kRtol, what + " param");
    t.expect_close(m, kAtol, kRtol, what + " exp_avg");
    t.expect_close(v, kAtol, kRtol, what + " exp_avg_sq");
    t.expect_close(w_al, kAtol, kRtol, what + " param (aligned)");
    t.expect_close(m_al, kAtol, kRtol, what + " exp_avg (aligned)");
    t.expect_close(v_al, kAtol, kRtol, what + " exp_avg_sq (aligned)");
  }
}

}  // namespace

REMAT_OP_CASE(optim, sgd_plain) { check_sgd(t, SgdParams{0.1, 0.0, 0.0, 0.0, false}); }
REMAT_OP_CASE(optim, sgd_weight_decay) { check_sgd(t, SgdParams{0.05, 0.0, 0.0, 1e-2, false}); }
REMAT_OP_CASE(optim, sgd_momentum) { check_sgd(t, SgdParams{0.1, 0.9, 0.0, 0.0, false}); }
REMAT_OP_CASE(optim, sgd_momentum_dampening_wd) { check_sgd(t, SgdParams{0.03, 0.8, 0.1, 5e-3, false}); }
REMAT_OP_CASE(optim, sgd_nesterov) { check_sgd(t, SgdParams{0.1, 0.9, 0.0, 1e-4, true}); }

REMAT_OP_CASE(optim, adamw_default) { check_adamw(t, AdamWParams{}); }
REMAT_OP_CASE(optim, adamw_no_decay) { check_adamw(t, AdamWParams{3e-3, 0.9, 0.999, 1e-8, 0.0}); }
REMAT_OP_CASE(optim, adamw_other_betas) { check_adamw(t, AdamWParams{1e-2, 0.8, 0.99, 1e-6, 0.1}); }

// adamw_step_multi: bitwise one adamw_step per tensor on the device under test, and close
// to the cpu's. 45 tensors (two launches of kAdamWMultiMax = 36), sizes from empty to
// several chunks of 16384, aligned and not, two hyperparameter sets (decay and none).
REMAT_OP_CASE(optim, adamw_step_multi) {
  std::vector<int64_t> sizes;
  for (int i = 0; i < 45; ++i) sizes.push_back(i % 9 == 4 ? 0 : (i * 7919) % 40000 + (i % 3));
  std::vector<Pair> w, m, v, w1, m1, v1;
  std::vector<AdamWParams> ps;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    w.push_back(t.output_like(t.uniform({n})));  // output_like: not 16-byte aligned
    m.push_back(t.uniform({n}, -0.1f, 0.1f));
    v.push_back(t.uniform({n}, 0.0f, 0.01f));
    if (i % 2) w.back() = t.uniform({n});  // aligned
    w1.push_back(t.output_like(w.back()));
    m1.push_back(t.output_like(m.back()));
    v1.push_back(t.output_like(v.back()));
    ps.push_back(i % 3 ? AdamWParams{1e-2, 0.9, 0.95, 1e-8, 0.1} : AdamWParams{1e-2, 0.9, 0.95, 1e-8, 0.0});
  }
  for (int64_t step = 1; step <= 2; ++step) {
    std::vector<Pair> g;
    for (int64_t n : sizes) g.push_back(t.uniform({n}, -2.0f, 2.0f));
    t.run([&](Backend& be, Side s) {
      std::vector<Tensor> sw, sg, sm, sv;
      for (size_t i = 0; i < sizes.size(); ++i) {
        sw.push_back(s(w[i]));
        sg.push_back(s(g[i]));
        sm.push_back(s(m[i]));
        sv.push_back(s(v[i]));
        be.adamw_step(s(w1[i]), s(g[i]), s(m1[i]), s(v1[i]), ps[i], step);
      }
      be.adamw_step_multi(sw, sg, sm, sv, ps, step);
    });
  }
  auto same = [](const Pair& a, const Pair& b) {
    const std::vector<float> x = a.dut.to_vector(), y = b.dut.to_vector();
    return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
  };
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::string what = "adamw_step_multi tensor " + std::to_string(i) + " n=" + std::to_string(sizes[i]);
    t.expect_close(w[i], kAtol, kRtol, what + " param");
    t.expect_close(m[i], kAtol, kRtol, what + " exp_avg");
    t.expect_close(v[i], kAtol, kRtol, what + " exp_avg_sq");
    EXPECT_TRUE(same(w[i], w1[i]) && same(m[i], m1[i]) && same(v[i], v1[i])) << what << ": not adamw_step's bits";
  }
}

// sgd_step_multi: bitwise one sgd_step per tensor on the device under test, and close to
// the cpu's. For each hyperparameter family (plain, momentum with dampening and decay,
// Nesterov) 53 tensors (two launches of kSgdMultiMax = 48), sizes from empty to several
// chunks of 16384 and not multiples of 4, aligned and not, three steps (step 1 starts the
// momentum buffer). Within a list some tensors have no weight decay; the plain family
// mixes in tensors with momentum (their buffers defined) and the others without (undefined
// buffers), so one launch carries both kinds.
REMAT_OP_CASE(optim, sgd_step_multi) {
  const std::vector<SgdParams> families = {SgdParams{0.1, 0.0, 0.0, 1e-2, false},
                                           SgdParams{0.03, 0.8, 0.1, 5e-3, false},
                                           SgdParams{0.1, 0.9, 0.0, 1e-4, true}};
  for (size_t f = 0; f < families.size(); ++f) {
    std::vector<int64_t> sizes;
    for (int i = 0; i < 53; ++i) sizes.push_back(i % 11 == 5 ? 0 : (i * 7919 + 13) % 40000 + (i % 4));
    std::vector<Pair> w, b, w1, b1;
    std::vector<SgdParams> ps;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int64_t n = sizes[i];
      SgdParams p = families[f];
      if (i % 3 == 0) p.weight_decay = 0.0;
      if (f == 0 && i % 4 == 1) p.momentum = 0.9;  // plain and momentum tensors in one list
      ps.push_back(p);
      w.push_back(t.output_like(t.uniform({n})));  // output_like: not 16-byte aligned
      if (i % 2) w.back() = t.uniform({n});        // aligned
      w1.push_back(t.output_like(w.back()));
      if (p.momentum != 0.0) {
        b.push_back(i % 5 == 2 ? t.output_like(t.uniform({n}, 5.0f, 6.0f)) : t.uniform({n}, 5.0f, 6.0f));
        b1.push_back(t.output_like(b.back()));
      } else {
        b.emplace_back();
        b1.emplace_back();
      }
    }
    for (int64_t step = 1; step <= 3; ++step) {
      std::vector<Pair> g;
      for (int64_t n : sizes) g.push_back(t.uniform({n}, -2.0f, 2.0f));
      t.run([&](Backend& be, Side s) {
        std::vector<Tensor> sw, sg, sb;
        for (size_t i = 0; i < sizes.size(); ++i) {
          const bool mom = ps[i].momentum != 0.0;
          sw.push_back(s(w[i]));
          sg.push_back(s(g[i]));
          sb.push_back(mom ? s(b[i]) : Tensor());
          be.sgd_step(s(w1[i]), s(g[i]), mom ? s(b1[i]) : Tensor(), ps[i], step);
        }
        be.sgd_step_multi(sw, sg, sb, ps, step);
      });
    }
    auto same = [](const Pair& a, const Pair& c) {
      const std::vector<float> x = a.dut.to_vector(), y = c.dut.to_vector();
      return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
    };
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::string what =
          "sgd_step_multi " + sgd_name(ps[i]) + " tensor " + std::to_string(i) + " n=" + std::to_string(sizes[i]);
      t.expect_close(w[i], kAtol, kRtol, what + " param");
      EXPECT_TRUE(same(w[i], w1[i])) << what << ": param not sgd_step's bits";
      if (ps[i].momentum != 0.0) {
        t.expect_close(b[i], kAtol, kRtol, what + " momentum_buf");
        EXPECT_TRUE(same(b[i], b1[i])) << what << ": momentum_buf not sgd_step's bits";
      }
    }
  }
}

// global_norm: squares are exact in double (24-bit by 24-bit mantissas), so only the order
// of double additions differs from the CPU: relative error about n * 2^-53, far below the
// 1e-9 allowed. Several tensors, odd sizes, an empty one, and one above 1024 blocks x 256
// threads x 4 elements (the partial sums' grid loops).
REMAT_OP_CASE(optim, global_norm) {
  const std::vector<int64_t> sizes = {1, 3, 0, 1001, 4096 + 3, 4 * 256 * 1024 + 4 * 1000 + 5};
  std::vector<Pair> ts;
  for (int64_t n : sizes) ts.push_back(t.uniform({n}, -3.0f, 3.0f));
  auto norm_of = [&](const std::vector<Pair>& list) {
    double r[2] = {0.0, 0.0};
    t.run([&](Backend& be, Side s) {
      std::vector<Tensor> side;
      for (const auto& p : list) side.push_back(s(p));
      r[s.ref ? 0 : 1] = be.global_norm(side);
    });
    return std::vector<double>{r[0], r[1]};
  };
  const auto all = norm_of(ts);
  EXPECT_NEAR(all[1], all[0], 1e-9 * all[0]) << "global_norm of " << ts.size() << " tensors";
  for (size_t i = 0; i < ts.size(); ++i) {
    const auto one = norm_of({ts[i]});
    EXPECT_NEAR(one[1], one[0], 1e-9 * one[0]) << "global_norm of one tensor of " << sizes[i];
  }
  const auto none = norm_of({});
  EXPECT_EQ(none[1], 0.0) << "global_norm of no tensors";

  // Reproducible: the same bits on a second run, and whether or not the data is 16-byte
  // aligned (the float4 path sums the same groups of four in the same order).
  const auto again = norm_of(ts);
  EXPECT_EQ(again[1], all[1]) << "global_norm differs between two runs";
  std::vector<Pair> misaligned;
  for (const auto& p : ts) misaligned.push_back(t.output_like(p));
  ASSERT_FALSE(aligned16(misaligned[3].dut));
  EXPECT_EQ(norm_of(misaligned)[1], all[1]) << "global_norm depends on the alignment";
}

// clip_grad_norm: on the device the coefficient is computed there, from global_norm's sum,
// with the cpu's double formula: the clipped tensors are bitwise those of the device's
// global_norm + scale (the host path it replaces), and close to the cpu's (whose norm adds
// in another order). A max_norm above the norm leaves everything untouched.
REMAT_OP_CASE(optim, clip_grad_norm) {
  const std::vector<int64_t> sizes = {1, 0, 1001, 4096 + 3, 300000};
  for (const double max_norm : {1.0, 1e9}) {
    std::vector<Pair> ts, copies;
    for (int64_t n : sizes) {
      ts.push_back(t.uniform({n}, -3.0f, 3.0f));
      copies.push_back(t.output_like(ts.back()));
    }
    std::vector<Pair> clipped;
    for (const auto& p : ts) clipped.push_back(t.output_like(p));
    t.run([&](Backend& be, Side s) {
      std::vector<Tensor> side;
      for (const auto& p : clipped) side.push_back(s(p));
      be.clip_grad_norm(side, max_norm);
    });
    // the host path on the device under test
    t.run([&](Backend& be, Side s) {
      if (s.ref) return;
      std::vector<Tensor> side;
      for (const auto& p : copies) side.push_back(s(p));
      const double coef = max_norm / (be.global_norm(side) + 1e-6);
      if (coef < 1.0)
        for (const Tensor& x : side) be.scale(x, static_cast<float>(coef), x);
    });
    for (size_t i = 0; i < ts.size(); ++i) {
      const std::string what = "clip_grad_norm " + std::to_string(max_norm) + " tensor " + std::to_string(i);
      t.expect_close(clipped[i], 1e-6, 1e-6, what);
      const std::vector<float> a = clipped[i].dut.to_vector(), b = copies[i].dut.to_vector();
      ASSERT_EQ(a.size(), b.size()) << what;
      if (!a.empty()) {
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << what << ": not global_norm + scale";
      }
      if (max_norm > 1e6) {
        const std::vector<float> c = ts[i].dut.to_vector();
        if (!a.empty()) {
          EXPECT_EQ(0, std::memcmp(a.data(), c.data(), a.size() * sizeof(float))) << what << ": changed";
        }
      }
    }
  }
}

}  // namespace remat::test
