// Layer norm forward and backward against the cpu backend.
//
// Tolerances: both backends take the row statistics and the dgamma/dbeta column sums in
// double (in different orders, so they may round to a different float in the last bit),
// and the elementwise formulas in float, which a GPU may contract into FMAs. So mean and
// rstd agree to ~1 ulp, y and dx to a few ulp of their terms, dgamma/dbeta to ~1 ulp.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend_ops/harness.h"
#include "remat/error.h"
#include "remat/ops.h"

namespace remat::test {

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// An output at the start of its own allocation (16-byte aligned: the float4 path runs),
// NaN so that an element the device does not write fails against the reference.
Pair aligned_output(OpCheck& t, const Shape& s) { return t.values(std::vector<float>(s.numel(), kNaN), s); }

// C = 1 (variance 0: y = beta), under and over a warp, GPT-2's 768, warp-per-row at its
// limit and past it, and rows several block-lengths long.
constexpr int64_t kChannels[] = {1, 7, 32, 33, 768, 1024, 1025, 5003};
constexpr int64_t kRows[] = {1, 3, 64};

struct Forward {
  Pair y, mean, rstd;
};

Forward run_forward(OpCheck& t, const Pair& x, const Pair& gamma, const Pair& beta, float eps, bool aligned_y) {
  const Shape& s = x.ref.shape();
  const int64_t n = s.numel() / s[-1];
  Forward f{aligned_y ? aligned_output(t, s) : t.output(s), t.output({n}), t.output({n})};
  t.run([&](Backend& be, Side side) {
    be.layernorm_forward(side(x), side(gamma), side(beta), LayerNormParams{eps}, side(f.y), side(f.mean), side(f.rstd));
  });
  return f;
}

void expect_forward(OpCheck& t, const Forward& f, const std::string& what) {
  t.expect_close(f.mean, 1e-7, 1e-6, what + " mean");  // a double mean rounded to float
  t.expect_close(f.rstd, 0, 1e-6, what + " rstd");
  t.expect_close(f.y, 1e-6, 1e-5, what + " y");  // (x - m) * rs * g + b: a few ulp of ~3
}

std::string shape_name(int64_t rows, int64_t c) { return "[" + std::to_string(rows) + ", " + std::to_string(c) + "]"; }

}  // namespace

REMAT_OP_CASE(layernorm, forward_shapes) {
  for (int64_t rows : kRows)
    for (int64_t c : kChannels) {
      if (rows == 64 && c > 1100) continue;       // keep the emulator fast: the longest rows, few of them
      auto x = t.uniform({rows, c}, 1.0f, 5.0f);  // mean far from 0: the two passes matter
      auto gamma = t.uniform({c}, 0.5f, 1.5f), beta = t.uniform({c}, -0.5f, 0.5f);
      expect_forward(t, run_forward(t, x, gamma, beta, 1e-5f, false), "layernorm " + shape_name(rows, c));
    }
}

REMAT_OP_CASE(layernorm, forward_vectorised_rank3_eps) {
  // float4 packs (aligned y, C % 4 == 0) with a warp and with a block per row; rank-3
  // input (rows = leading dims); a large eps; a large offset (1000 + [-1, 1]).
  for (const Shape& s : {Shape{5, 768}, Shape{3, 2048}, Shape{2, 3, 36}}) {
    auto x = t.uniform(s, -2.0f, 2.0f);
    auto gamma = t.uniform({s[-1]}, 0.5f, 1.5f), beta = t.uniform({s[-1]}, -0.5f, 0.5f);
    expect_forward(t, run_forward(t, x, gamma, beta, 1e-5f, true), "layernorm aligned " + s.str());
    expect_forward(t, run_forward(t, x, gamma, beta, 0.5f, false), "layernorm eps=0.5 " + s.str());
  }
  auto x = t.uniform({4, 300}, 999.0f, 1001.0f);
  auto gamma = t.uniform({300}, 0.5f, 1.5f), beta = t.uniform({300}, -0.5f, 0.5f);
  expect_forward(t, run_forward(t, x, gamma, beta, 1e-5f, false), "layernorm offset 1000");
}

namespace {

struct Backward {
  Pair dx, dgamma, dbeta;
};

// Forward on both backends, then backward with dgamma/dbeta accumulated into random
// starting values.
Backward run_backward(OpCheck& t, const Shape& s, bool aligned_dx) {
  const int64_t c = s[-1];
  auto x = t.uniform(s, -2.0f, 3.0f);
  auto gamma = t.uniform({c}, 0.5f, 1.5f), beta = t.uniform({c}, -0.5f, 0.5f);
  const Forward f = run_forward(t, x, gamma, beta, 1e-5f, false);
  auto dy = t.uniform(s);
  Backward b{aligned_dx ? aligned_output(t, s) : t.output(s), t.output_like(t.uniform({c})),
             t.output_like(t.uniform({c}))};
  t.run([&](Backend& be, Side side) {
    ops::layernorm_backward(be, side(dy), side(x), side(gamma), side(f.mean), side(f.rstd), side(b.dx), side(b.dgamma),
                            side(b.dbeta));
  });
  return b;
}

void expect_backward(OpCheck& t, const Backward& b, const std::string& what) {
  t.expect_close(b.dx, 1e-5, 1e-5, what + " dx");          // rs * (g - mean(g) - xhat * mean(g xhat))
  t.expect_close(b.dgamma, 1e-6, 1e-6, what + " dgamma");  // column sums in double, + a start value
  t.expect_close(b.dbeta, 1e-6, 1e-6, what + " dbeta");
}

}  // namespace

REMAT_OP_CASE(layernorm, backward_shapes) {
  for (int64_t rows : kRows)
    for (int64_t c : kChannels) {
      if (rows == 64 && c > 1100) continue;
      expect_backward(t, run_backward(t, {rows, c}, false), "layernorm backward " + shape_name(rows, c));
    }
}

REMAT_OP_CASE(layernorm, backward_vectorised_and_many_rows) {
  expect_backward(t, run_backward(t, {5, 768}, true), "layernorm backward aligned [5, 768]");
  expect_backward(t, run_backward(t, {3, 2048}, true), "layernorm backward aligned [3, 2048]");
  // dgamma/dbeta over rows split into chunks (the device's workspace; enough chunks of at
  // least 64 rows for 512 blocks of 32 columns): 47 chunks of 64 rows (C = 45, 2 column
  // blocks: 256 wanted); 16 chunks of 63 rows (C = 768); 22 chunks of 91 rows (C = 768,
  // 24 x 22 = 528 blocks; the 64 KiB scratch held 5); 2 and 4 chunks for C = 5003 (157
  // column blocks).
  expect_backward(t, run_backward(t, {3000, 45}, false), "layernorm backward [3000, 45]");
  expect_backward(t, run_backward(t, {1000, 768}, false), "layernorm backward [1000, 768]");
  expect_backward(t, run_backward(t, {2000, 768}, false), "layernorm backward [2000, 768]");
  expect_backward(t, run_backward(t, {70, 5003}, false), "layernorm backward [70, 5003]");
  expect_backward(t, run_backward(t, {300, 5003}, false), "layernorm backward [300, 5003]");
}

REMAT_OP_CASE(layernorm, backward_workspace) {
  // The device asks for chunks x 2 C doubles (none with one chunk); the cpu for nothing.
  // A missing workspace is an error when dgamma or dbeta is wanted.
  t.run([&](Backend& be, Side s) {
    const auto bytes = [&](const Shape& x) { return be.layernorm_backward_workspace(x); };
    EXPECT_EQ(bytes({2000, 768}), s.ref ? 0u : 22u * 2 * 768 * 8) << be.name();
    EXPECT_EQ(bytes({8, 1024, 768}), s.ref ? 0u : 22u * 2 * 768 * 8) << "GPT-2 124M, batch 8";
    EXPECT_EQ(bytes({3000, 45}), s.ref ? 0u : 47u * 2 * 45 * 8);
    EXPECT_EQ(bytes({64, 768}), 0u) << "one chunk";
    EXPECT_EQ(bytes({300, 5003}), s.ref ? 0u : 4u * 2 * 5003 * 8);
  });
  const int64_t rows = 200, c = 96;
  auto x = t.uniform({rows, c}, -2.0f, 3.0f), dy = t.uniform({rows, c});
  auto gamma = t.uniform({c}, 0.5f, 1.5f), beta = t.uniform({c}, -0.5f, 0.5f);
  const Forward f = run_forward(t, x, gamma, beta, 1e-5f, false);
  auto dgamma = t.output_like(t.uniform({c})), dx = t.output({rows, c});
  t.run([&](Backend& be, Side s) {
    if (!s.ref) {
      EXPECT_THROW(
          be.layernorm_backward(s(dy), s(x), s(gamma), s(f.mean), s(f.rstd), Tensor(), s(dgamma), Tensor(), Tensor()),
          Error);
    }
    be.layernorm_backward(s(dy), s(x), s(gamma), s(f.mean), s(f.rstd), s(dx), Tensor(), Tensor(), Tensor());
  });
  t.expect_close(dx, 1e-5, 1e-5, "dx without a workspace");
}

REMAT_OP_CASE(layernorm, backward_optional_grads_and_in_place) {
  const int64_t rows = 40, c = 96;
  auto x = t.uniform({rows, c}, -2.0f, 3.0f);
  auto gamma = t.uniform({c}, 0.5f, 1.5f), beta = t.uniform({c}, -0.5f, 0.5f);
  const Forward f = run_forward(t, x, gamma, beta, 1e-5f, false);
  auto dy = t.uniform({rows, c});

  // Only dgamma; only dbeta; only dx.
  auto dgamma = t.output_like(t.uniform({c})), dbeta = t.output_like(t.uniform({c}));
  auto dx = t.output({rows, c});
  t.run([&](Backend& be, Side s) {
    ops::layernorm_backward(be, s(dy), s(x), s(gamma), s(f.mean), s(f.rstd), Tensor(), s(dgamma), Tensor());
    ops::layernorm_backward(be, s(dy), s(x), s(gamma), s(f.mean), s(f.rstd), Tensor(), Tensor(), s(dbeta));
    ops::layernorm_backward(be, s(dy), s(x), s(gamma), s(f.mean), s(f.rstd), s(dx), Tensor(), Tensor());
  });
  t.expect_close(dgamma, 1e-6, 1e-6, "dgamma alone");
  t.expect_close(dbeta, 1e-6, 1e-6, "dbeta alone");
  t.expect_close(dx, 1e-5, 1e-5, "dx alone");

  // dx written over dy: the parameter gradients must still see the original dy.
  auto dy_dx = t.output_like(dy);
  auto dgamma2 = t.output_like(t.uniform({c})), dbeta2 = t.output_like(t.uniform({c}));
  t.run([&](Backend& be, Side s) {
    ops::layernorm_backward(be, s(dy_dx), s(x), s(gamma), s(f.mean), s(f.rstd), s(dy_dx), s(dgamma2), s(dbeta2));
  });
  t.expect_close(dy_dx, 1e-5, 1e-5, "dx over dy");
  t.expect_close(dgamma2, 1e-6, 1e-6, "dgamma (dx over dy)");
  t.expect_close(dbeta2, 1e-6, 1e-6, "dbeta (dx over dy)");
}

REMAT_OP_CASE(layernorm, deterministic) {
  // The device gives the same bits run to run: dgamma/dbeta over many rows (chunked
  // column sums: 47 chunks for C = 96, 22 for C = 768), dx and y.
  for (const Shape& s : {Shape{3000, 96}, Shape{2000, 768}}) {
    const int64_t c = s[-1];
    auto x = t.uniform(s, -2.0f, 3.0f), dy = t.uniform(s);
    auto gamma = t.uniform({c}, 0.5f, 1.5f), beta = t.uniform({c}, -0.5f, 0.5f);
    auto start = t.uniform({c});
    Forward f[2] = {run_forward(t, x, gamma, beta, 1e-5f, false), run_forward(t, x, gamma, beta, 1e-5f, false)};
    Pair dx[2] = {t.output(s), t.output(s)}, dgamma[2] = {t.output_like(start), t.output_like(start)};
    t.run([&](Backend& be, Side side) {
      for (int k = 0; k < 2; ++k)
        ops::layernorm_backward(be, side(dy), side(x), side(gamma), side(f[k].mean), side(f[k].rstd), side(dx[k]),
                                side(dgamma[k]), Tensor());
    });
    t.expect_equal({f[0].y.dut, f[1].y.dut}, "y run to run");
    t.expect_equal({dx[0].dut, dx[1].dut}, "dx run to run");
    t.expect_equal({dgamma[0].dut, dgamma[1].dut}, "dgamma run to run " + s.str());
  }
}

// ---- bf16 (training.precision bf16; the two references: backend_ops/harness.h) ----------------
REMAT_OP_CASE(layernorm, bf16) {
  ActivationDTypeScope bf16(DType::bf16);
  const int64_t rows = 37;
  for (int64_t c : kBf16RowLengths) {
    const std::string what = " C=" + std::to_string(c);
    auto x = t.uniform_bf16({rows, c}, -2.0f, 3.0f), gamma = t.uniform_bf16({c}, 0.5f, 1.5f),
         beta = t.uniform_bf16({c});
    auto xf = t.as_f32(x), gf = t.as_f32(gamma), bf = t.as_f32(beta);
    auto y = t.output({rows, c}, DType::bf16), y_aligned = aligned_bf16_output(t, {rows, c}), yf = t.output({rows, c}),
         yf_aligned = t.values(std::vector<float>(static_cast<size_t>(rows * c)), {rows, c});
    auto mean = t.output({rows}), rstd = t.output({rows}), meanf = t.output({rows}), rstdf = t.output({rows});
    t.run([&](Backend& be, Side s) {
      be.layernorm_forward(s(x), s(gamma), s(beta), LayerNormParams{1e-5f}, s(y), s(mean), s(rstd));
      be.layernorm_forward(s(x), s(gamma), s(beta), LayerNormParams{1e-5f}, s(y_aligned), s(mean), s(rstd));
      be.layernorm_forward(s(xf), s(gf), s(bf), LayerNormParams{1e-5f}, s(yf), s(meanf), s(rstdf));
      be.layernorm_forward(s(xf), s(gf), s(bf), LayerNormParams{1e-5f}, s(yf_aligned), s(meanf), s(rstdf));
    });
    t.expect_close(mean, 1e-7, 1e-6, "layernorm mean" + what);
    t.expect_close(rstd, 0, 1e-6, "layernorm rstd" + what);
    t.expect_close(y, 1e-6, kBf16Rel, "layernorm y" + what);
    t.expect_close(y_aligned, 1e-6, kBf16Rel, "layernorm y (aligned)" + what);
    expect_same_dut_f32(mean, meanf, "layernorm mean" + what);
    expect_same_dut_f32(rstd, rstdf, "layernorm rstd" + what);
    expect_rounded_dut(y, yf, "layernorm y against fp32" + what);
    expect_rounded_dut(y_aligned, yf_aligned, "layernorm y (aligned) against fp32" + what);

    auto dy = t.uniform_bf16({rows, c}), dyf = t.as_f32(dy);
    auto dx = t.output({rows, c}, DType::bf16), dxf = t.output({rows, c});
    auto dx_in_place = t.output_like(dy);  // dx over dy, as backward runs it
    auto dg = t.output_like(t.uniform({c})), db = t.output_like(t.uniform({c}));
    auto dgf = t.output_like(dg), dbf = t.output_like(db);
    t.run([&](Backend& be, Side s) {
      ops::layernorm_backward(be, s(dy), s(x), s(gamma), s(mean), s(rstd), s(dx), s(dg), s(db));
      ops::layernorm_backward(be, s(dyf), s(xf), s(gf), s(meanf), s(rstdf), s(dxf), s(dgf), s(dbf));
      ops::layernorm_backward(be, s(dx_in_place), s(x), s(gamma), s(mean), s(rstd), s(dx_in_place), Tensor(), Tensor());
    });
    t.expect_close(dx, 1e-5, kBf16Rel, "layernorm dx" + what);
    t.expect_close(dx_in_place, 1e-5, kBf16Rel, "layernorm dx over dy" + what);
    t.expect_close(dg, 1e-6, 1e-6, "layernorm dgamma (f32)" + what);
    t.expect_close(db, 1e-6, 1e-6, "layernorm dbeta (f32)" + what);
    expect_rounded_dut(dx, dxf, "layernorm dx against fp32" + what);
    expect_same_dut_f32(dg, dgf, "layernorm dgamma" + what);
    expect_same_dut_f32(db, dbf, "layernorm dbeta" + what);
  }
}

// ---- Gradients: the device's backward against central differences of its own forward --------
// (backend_ops/harness.h, "Gradient cases")

REMAT_OP_CASE(layernorm, grad) {
  const Shape s{5, 24};
  auto x = t.uniform(s, -2.0f, 2.0f), gamma = t.uniform({24}, 0.5f, 1.5f), beta = t.uniform({24}), dy = t.uniform(s);
  auto zeros = [&](int64_t c) { return t.output_like(t.values(std::vector<float>(c, 0.0f), {c})); };
  auto y = t.output(s), mean = t.output({5}), rstd = t.output({5}), dx = t.output(s);
  auto dg = zeros(24), db = zeros(24);
  t.run([&](Backend& be, Side d) {
    be.layernorm_forward(d(x), d(gamma), d(beta), LayerNormParams{1e-5f}, d(y), d(mean), d(rstd));
    ops::layernorm_backward(be, d(dy), d(x), d(gamma), d(mean), d(rstd), d(dx), d(dg), d(db));
  });
  auto loss = [&](Backend& be) {
    be.layernorm_forward(x.dut, gamma.dut, beta.dut, LayerNormParams{1e-5f}, y.dut, mean.dut, rstd.dut);
    return dot(dy.dut, y.dut);
  };
  t.expect_gradient("layernorm dx", x, dx, loss);
  t.expect_gradient("layernorm dgamma", gamma, dg, loss);
  t.expect_gradient("layernorm dbeta", beta, db, loss);
}

}  // namespace remat::test
