// Softmax, log-softmax, cross-entropy and accuracy against the cpu backend.
//
// Tolerances: the device sums a row in a different order than the CPU's 8 lanes, with
// an online maximum (exp(x - m) rescaled when m grows), and its expf differs from the
// CPU's polynomial vexp by ~2 ulp (vexp also clamps its argument at -87.3, so where the
// GPU underflows to 0 the CPU gives ~1e-38). So probabilities and gradients agree to a
// few ulp relative plus a tiny absolute term; log-probabilities and lse to a few ulp of
// their magnitude (up to ~170 with logits of +-80).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "backend_ops/harness.h"
#include "remat/error.h"

namespace remat::test {

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// An output at the start of its own allocation (16-byte aligned, so the kernels' float4
// path runs; OpCheck::output views sit after a guard zone and are not aligned). It has no
// guards, but starts as NaN: an element the device does not write fails against the
// reference, which writes every element.
Pair aligned_output(OpCheck& t, const Shape& s) { return t.values(std::vector<float>(s.numel(), kNaN), s); }

std::string shape_name(int64_t rows, int64_t n) { return "[" + std::to_string(rows) + ", " + std::to_string(n) + "]"; }

// Row lengths: 1, under a warp, a warp, over a warp, warp-per-row at its limit, just past
// it (a block per row), and rows several block-lengths long.
constexpr int64_t kLengths[] = {1, 7, 32, 33, 1000, 1024, 1025, 5003};
constexpr int64_t kRows[] = {1, 3, 64};

void check_softmax_forward(OpCheck& t, const Pair& x, const Pair& y, bool log, const std::string& what) {
  t.run([&](Backend& be, Side side) { be.softmax_forward(side(x), log, side(y)); });
  if (log)
    t.expect_close(y, 1e-5, 1e-6, what);  // |y| up to ~15 here: a few ulp of it
  else
    t.expect_close(y, 1e-8, 1e-5, what);  // rows of up to 5003 terms summed in another order
}

}  // namespace

REMAT_OP_CASE(softmax_loss, softmax_forward_shapes) {
  for (int log = 0; log < 2; ++log)
    for (int64_t rows : kRows)
      for (int64_t n : kLengths) {
        if (rows == 64 && n > 1100) continue;  // keep the emulator fast: the longest rows, few of them
        const Shape s{rows, n};
        auto x = t.uniform(s, -3.0f, 3.0f);
        auto y = t.output(s);
        check_softmax_forward(t, x, y, log != 0, std::string(log ? "log_softmax " : "softmax ") + shape_name(rows, n));
      }
}

REMAT_OP_CASE(softmax_loss, softmax_forward_vectorised_and_rank3) {
  // float4 packs (aligned output, length % 4 == 0), warp and block per row; and a rank-3
  // input whose leading dims are the rows.
  for (int log = 0; log < 2; ++log) {
    for (const Shape& s : {Shape{5, 1000}, Shape{3, 5004}, Shape{2, 3, 36}}) {
      auto x = t.uniform(s, -3.0f, 3.0f);
      auto y = aligned_output(t, s);
      check_softmax_forward(t, x, y, log != 0, std::string(log ? "log_softmax " : "softmax ") + s.str());
    }
  }
}

REMAT_OP_CASE(softmax_loss, softmax_forward_large_logits) {
  // Logits of +-80: exp overflows unless the maximum is subtracted. Row 0 has one large
  // value among small ones (probabilities of exp(-160): 0 here, ~1e-38 from vexp).
  for (int log = 0; log < 2; ++log) {
    for (int64_t n : {int64_t{33}, int64_t{2000}}) {
      auto v = t.uniform({4, n}, -80.0f, 80.0f).ref.to_vector();
      for (int64_t j = 0; j < n; ++j) v[static_cast<size_t>(j)] = j == n / 2 ? 80.0f : -80.0f;
      auto x = t.values(v, {4, n});
      auto y = t.output({4, n});
      t.run([&](Backend& be, Side s) { be.softmax_forward(s(x), log != 0, s(y)); });
      if (log)
        t.expect_close(y, 3e-5, 1e-6, "log_softmax +-80, n=" + std::to_string(n));  // |y| up to 160
      else
        t.expect_close(y, 1e-8, 1e-5, "softmax +-80, n=" + std::to_string(n));
    }
  }
}

namespace {

// Rows of special values, n wide: a causal-mask row (finite, then -inf); a row of -inf
// but for column 5 and the last 8 columns, so that many threads see only -inf; a row of
// -inf only; a row with a +inf; a row with a NaN; an ordinary row.
std::vector<float> special_rows(OpCheck& t, int64_t n) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  auto v = t.uniform({6, n}, -3.0f, 3.0f).ref.to_vector();
  auto at = [&](int64_t r, int64_t j) -> float& { return v[static_cast<size_t>(r * n + j)]; };
  for (int64_t j = n / 3; j < n; ++j) at(0, j) = -kInf;
  for (int64_t j = 0; j < n - 8; ++j)
    if (j != 5) at(1, j) = -kInf;
  for (int64_t j = 0; j < n; ++j) at(2, j) = -kInf;
  at(3, n / 2) = kInf;
  at(4, n - 1) = kNaN;
  return v;
}

}  // namespace

REMAT_OP_CASE(softmax_loss, softmax_forward_special_values) {
  // -inf (masking) contributes 0; a row of -inf only, a +inf or a NaN give NaN rows, as the
  // CPU's two passes (and PyTorch) do.
  for (int log = 0; log < 2; ++log) {
    for (int64_t n : {int64_t{40}, int64_t{1500}}) {
      auto x = t.values(special_rows(t, n), {6, n});
      auto y = t.output({6, n});
      check_softmax_forward(t, x, y, log != 0,
                            std::string(log ? "log_softmax" : "softmax") + " special n=" + std::to_string(n));
    }
  }
}

REMAT_OP_CASE(softmax_loss, softmax_forward_in_place) {
  for (int64_t n : {int64_t{33}, int64_t{3000}}) {
    auto x = t.output_like(t.uniform({3, n}, -3.0f, 3.0f));
    t.run([&](Backend& be, Side s) { be.softmax_forward(s(x), false, s(x)); });
    t.expect_close(x, 1e-8, 1e-5, "softmax in place, n=" + std::to_string(n));
  }
}

namespace {

// A softmax output as backward sees one: rows of positive values summing to 1 (or their
// logs), made on the host.
Pair softmax_output(OpCheck& t, int64_t rows, int64_t n, bool log) {
  auto p = t.uniform({rows, n}, 0.01f, 1.0f).ref.to_vector();
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) sum += p[static_cast<size_t>(r * n + j)];
    for (int64_t j = 0; j < n; ++j) {
      float& e = p[static_cast<size_t>(r * n + j)];
      e = static_cast<float>(e / sum);
      if (log) e = std::log(e);
    }
  }
  return t.values(p, {rows, n});
}

}  // namespace

REMAT_OP_CASE(softmax_loss, softmax_backward_shapes) {
  for (int log = 0; log < 2; ++log)
    for (int64_t rows : kRows)
      for (int64_t n : kLengths) {
        if (rows == 64 && n > 1100) continue;
        const Shape s{rows, n};
        auto dy = t.uniform(s);
        auto y = softmax_output(t, rows, n, log != 0);
        auto dx = t.output(s);
        t.run([&](Backend& be, Side side) { be.softmax_backward(side(dy), side(y), log != 0, side(dx)); });
        // dx = y * (dy - s) or dy - exp(y) * s, with s a sum of n terms taken in another
        // order: its rounding error is a few ulp of s, times y (at most 1) in dx.
        t.expect_close(dx, 1e-7, 1e-5, std::string(log ? "log_softmax dx " : "softmax dx ") + shape_name(rows, n));
      }
}

REMAT_OP_CASE(softmax_loss, softmax_backward_vectorised) {
  for (int log = 0; log < 2; ++log) {
    for (const Shape& s : {Shape{5, 1000}, Shape{3, 5004}}) {
      auto dy = t.uniform(s);
      auto y = softmax_output(t, s[0], s[1], log != 0);
      auto dx = aligned_output(t, s);
      t.run([&](Backend& be, Side side) { be.softmax_backward(side(dy), side(y), log != 0, side(dx)); });
      t.expect_close(dx, 1e-7, 1e-5, std::string(log ? "log_softmax dx " : "softmax dx ") + s.str());
    }
  }
}

namespace {

// Targets in [0, v) with the rows in `ignored` set to ignore_index.
Pair targets_with_ignored(OpCheck& t, int64_t rows, int64_t v, const std::vector<int64_t>& ignored, int ignore_index) {
  auto tg = t.ints({rows}, 0, static_cast<int>(v - 1)).ref.to_ints();
  for (int64_t r : ignored)
    if (r < rows) tg[static_cast<size_t>(r)] = ignore_index;
  return t.int_values(tg, {rows});
}

// Forward (loss, lse) and backward (dlogits) of one cross-entropy against the CPU.
// With label smoothing e, the forward's workspace (the row means) is the backend's own.
void check_cross_entropy(OpCheck& t, const Pair& logits, const Pair& targets, int ignore_index, const Pair& dlogits,
                         float dloss, double lse_atol, const std::string& what, float smoothing = 0.0f) {
  const int64_t rows = logits.ref.size(0);
  auto loss = t.output({1});
  auto lse = t.output({rows});
  auto ws = t.output({rows});
  t.run([&](Backend& be, Side s) {
    be.cross_entropy_forward(s(logits), s(targets), ignore_index, smoothing, s(loss), s(lse),
                             smoothing > 0.0f ? s(ws) : Tensor());
  });
  // lse: a few ulp of its magnitude (see the top); the loss is a mean of lse - x in double.
  t.expect_close(lse, lse_atol, 1e-6, what + " lse");
  t.expect_close(loss, lse_atol, 1e-6, what + " loss");
  t.run([&](Backend& be, Side s) {
    be.cross_entropy_backward(dloss, s(logits), s(targets), s(lse), ignore_index, smoothing, s(dlogits));
  });
  // scale * (p - onehot): a few ulp of p relative, with the 1e-38-vs-0 underflow absolute.
  t.expect_close(dlogits, 1e-9, 1e-5, what + " dlogits");
}

}  // namespace

REMAT_OP_CASE(softmax_loss, cross_entropy_shapes) {
  struct Case {
    int64_t rows, v;
  };
  for (const Case& c : {Case{1, 1}, Case{3, 7}, Case{64, 32}, Case{64, 33}, Case{64, 1000}, Case{3, 1025},
                        Case{3, 5003}, Case{2, 50257}}) {
    const std::string what = "cross_entropy " + shape_name(c.rows, c.v);
    auto logits = t.uniform({c.rows, c.v}, -4.0f, 4.0f);
    auto targets = targets_with_ignored(t, c.rows, c.v, {1, 5, 40}, -100);
    auto dlogits = t.output({c.rows, c.v});
    check_cross_entropy(t, logits, targets, -100, dlogits, 1.0f, 1e-5, what);
  }
}

REMAT_OP_CASE(softmax_loss, cross_entropy_label_smoothing) {
  // The row means on the device (a second reduction of the lse kernel) and the smoothed
  // gradient, vectorised or not, with ignored rows, against the CPU.
  struct Case {
    int64_t rows, v;
    float eps;
  };
  for (const Case& c : {Case{3, 7, 0.1f}, Case{64, 36, 0.25f}, Case{64, 1000, 0.1f}, Case{3, 5003, 0.5f}}) {
    const std::string what = "cross_entropy smoothing " + std::to_string(c.eps) + " " + shape_name(c.rows, c.v);
    auto logits = t.uniform({c.rows, c.v}, -4.0f, 4.0f);
    auto targets = targets_with_ignored(t, c.rows, c.v, {1, 5, 40}, 0);
    auto dlogits = t.output({c.rows, c.v});
    check_cross_entropy(t, logits, targets, 0, dlogits, 0.7f, 1e-5, what, c.eps);
  }
}

REMAT_OP_CASE(softmax_loss, cross_entropy_vectorised_and_dloss) {
  // Aligned dlogits with V % 4 == 0 (float4 path), and dloss != 1.
  for (int64_t v : {int64_t{36}, int64_t{2048}}) {
    auto logits = t.uniform({9, v}, -4.0f, 4.0f);
    auto targets = targets_with_ignored(t, 9, v, {2}, -100);
    auto dlogits = aligned_output(t, {9, v});
    check_cross_entropy(t, logits, targets, -100, dlogits, 0.37f, 1e-5, "cross_entropy V=" + std::to_string(v));
  }
}

REMAT_OP_CASE(softmax_loss, cross_entropy_ignore_index) {
  // ignore_index that is also a class: rows with target 0 are left out.
  {
    auto logits = t.uniform({64, 33}, -4.0f, 4.0f);
    auto targets = t.ints({64}, 0, 3);
    auto dlogits = t.output({64, 33});
    check_cross_entropy(t, logits, targets, 0, dlogits, 1.0f, 1e-5, "cross_entropy ignore_index=0");
  }
  // Every row ignored: the loss is NaN (as PyTorch), the gradient 0.
  for (int64_t v : {int64_t{7}, int64_t{3000}}) {
    auto logits = t.uniform({5, v}, -4.0f, 4.0f);
    auto targets = t.int_values(std::vector<int32_t>(5, -1), {5});
    auto dlogits = t.output({5, v});
    check_cross_entropy(t, logits, targets, -1, dlogits, 1.0f, 1e-5,
                        "cross_entropy all ignored V=" + std::to_string(v));
  }
}

REMAT_OP_CASE(softmax_loss, cross_entropy_large_logits) {
  // Logits of +-80 (exp(160) overflows a float): lse near 80, losses up to 160.
  for (int64_t v : {int64_t{33}, int64_t{5003}}) {
    auto logits = t.uniform({8, v}, -80.0f, 80.0f);
    auto targets = targets_with_ignored(t, 8, v, {3}, -100);
    auto dlogits = t.output({8, v});
    check_cross_entropy(t, logits, targets, -100, dlogits, 1.0f, 5e-5, "cross_entropy +-80 V=" + std::to_string(v));
  }
}

REMAT_OP_CASE(softmax_loss, cross_entropy_special_values) {
  // Masked logits (-inf) in rows that count; the rows of -inf only, +inf and NaN ignored
  // (their lse is NaN on both backends, their gradient 0).
  for (int64_t v : {int64_t{40}, int64_t{1500}}) {
    auto logits = t.values(special_rows(t, v), {6, v});
    auto targets = t.int_values({2, 5, -100, -100, -100, 7}, {6});
    auto dlogits = t.output({6, v});
    check_cross_entropy(t, logits, targets, -100, dlogits, 1.0f, 1e-5, "cross_entropy special V=" + std::to_string(v));
  }
}

REMAT_OP_CASE(softmax_loss, cross_entropy_bad_target) {
  // A target outside [0, V) that is not ignore_index: both backends throw, naming the
  // first bad row (row 2 here; row 4 is bad too).
  auto logits = t.uniform({6, 9});
  auto targets = t.int_values({1, -100, 9, 0, -3, 8}, {6});
  auto loss = t.output({1});
  auto lse = t.output({6});
  t.run([&](Backend& be, Side s) {
    try {
      be.cross_entropy_forward(s(logits), s(targets), -100, 0.0f, s(loss), s(lse), Tensor());
      ADD_FAILURE() << "no error on " << be.name();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("target 9 at row 2 is outside [0, 9)"), std::string::npos)
          << be.name() << ": " << e.what();
    }
  });
}

namespace {

// accuracy on both backends; the results must be equal, and equal `want` when given.
void check_accuracy(OpCheck& t, const Pair& logits, const Pair& targets, int ignore_index, const std::string& what,
                    int64_t want_correct = -1, int64_t want_counted = -1) {
  int64_t correct[2] = {-1, -1}, counted[2] = {-1, -1};
  t.run(
      [&](Backend& be, Side s) { correct[s.ref] = be.accuracy(s(logits), s(targets), ignore_index, &counted[s.ref]); });
  EXPECT_EQ(correct[0], correct[1]) << what << ": correct (device, cpu)";
  EXPECT_EQ(counted[0], counted[1]) << what << ": counted (device, cpu)";
  if (want_correct >= 0) {
    EXPECT_EQ(correct[1], want_correct) << what;
  }
  if (want_counted >= 0) {
    EXPECT_EQ(counted[1], want_counted) << what;
  }
}

}  // namespace

REMAT_OP_CASE(softmax_loss, accuracy_shapes) {
  struct Case {
    int64_t rows, v;
  };
  for (const Case& c :
       {Case{1, 1}, Case{3, 7}, Case{64, 33}, Case{64, 1000}, Case{64, 1028}, Case{3, 5003}, Case{2, 50257}}) {
    // Small integers as logits: many ties, and targets drawn near the maxima often hit.
    auto logits = t.ints({c.rows, c.v}, 0, 3);
    std::vector<float> lv;
    for (int32_t i : logits.ref.to_ints()) lv.push_back(static_cast<float>(i));
    auto x = t.values(lv, {c.rows, c.v});
    auto targets = targets_with_ignored(t, c.rows, std::min<int64_t>(c.v, 4), {0, 7}, -100);
    check_accuracy(t, x, targets, -100, "accuracy " + shape_name(c.rows, c.v));
  }
}

REMAT_OP_CASE(softmax_loss, accuracy_ties_and_specials) {
  // Known answers. Each row: logits, target, whether it counts as correct.
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const int64_t v = 40;  // longer than a warp: the maximum and its tie sit in different lanes
  std::vector<std::vector<float>> rows;
  std::vector<int32_t> targets;
  int64_t want = 0;
  auto add = [&](std::vector<float> row, int32_t target, bool correct) {
    row.resize(static_cast<size_t>(v), -1.0f);
    rows.push_back(row);
    targets.push_back(target);
    want += correct;
  };
  std::vector<float> tie(static_cast<size_t>(v), 0.0f);
  tie[3] = 5.0f, tie[35] = 5.0f;
  add(tie, 3, true);                                                // the first maximum wins the tie...
  add(tie, 35, false);                                              // ...not the second
  add(std::vector<float>(static_cast<size_t>(v), 2.0f), 0, true);   // all equal: column 0
  add(std::vector<float>(static_cast<size_t>(v), -kInf), 0, true);  // all -inf: column 0
  std::vector<float> nan0(static_cast<size_t>(v), 1.0f);
  nan0[0] = kNaN, nan0[9] = 7.0f;
  add(nan0, 0, true);  // NaN in column 0: nothing compares larger, column 0
  std::vector<float> nan9(static_cast<size_t>(v), 1.0f);
  nan9[9] = kNaN, nan9[20] = 7.0f;
  add(nan9, 20, true);  // a NaN elsewhere never wins
  std::vector<float> inf(static_cast<size_t>(v), 1.0f);
  inf[30] = kInf, inf[31] = kInf;
  add(inf, 30, true);     // +inf ties: the first
  add(tie, -100, false);  // ignored
  std::vector<float> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  const int64_t n = static_cast<int64_t>(rows.size());
  auto x = t.values(flat, {n, v});
  auto tg = t.int_values(targets, {n});
  check_accuracy(t, x, tg, -100, "accuracy ties", want, n - 1);

  // The same rows with every column repeated 125 times (5000 wide: a block per row, the
  // maxima far apart); the first maximum of column c is at c * 125.
  constexpr int64_t kRepeat = 125;
  std::vector<float> wide;
  for (const auto& r : rows)
    for (int64_t j = 0; j < v * kRepeat; ++j) wide.push_back(r[static_cast<size_t>(j / kRepeat)]);
  std::vector<int32_t> wide_targets;
  for (int32_t tj : targets) wide_targets.push_back(tj < 0 ? tj : tj * static_cast<int32_t>(kRepeat));
  check_accuracy(t, t.values(wide, {n, v * kRepeat}), t.int_values(wide_targets, {n}), -100, "accuracy ties (wide)",
                 want, n - 1);
}

REMAT_OP_CASE(softmax_loss, deterministic) {
  // The device gives the same bits run to run (no atomics in the sums; on a GPU the
  // blocks run in any order).
  auto x = t.uniform({64, 5003}, -4.0f, 4.0f);
  auto targets = targets_with_ignored(t, 64, 5003, {3, 9}, -100);
  Pair y[2] = {t.output({64, 5003}), t.output({64, 5003})}, loss[2] = {t.output({1}), t.output({1})},
       lse[2] = {t.output({64}), t.output({64})}, dx[2] = {t.output({64, 5003}), t.output({64, 5003})};
  t.run([&](Backend& be, Side s) {
    for (int k = 0; k < 2; ++k) {
      be.softmax_forward(s(x), false, s(y[k]));
      be.cross_entropy_forward(s(x), s(targets), -100, 0.0f, s(loss[k]), s(lse[k]), Tensor());
      be.cross_entropy_backward(1.0f, s(x), s(targets), s(lse[k]), -100, 0.0f, s(dx[k]));
    }
  });
  t.expect_equal({y[0].dut, y[1].dut}, "softmax run to run");
  t.expect_equal({loss[0].dut, loss[1].dut}, "loss run to run");
  t.expect_equal({dx[0].dut, dx[1].dut}, "dlogits run to run");
}

// ---- bf16 (training.precision bf16; the two references: backend_ops/harness.h) ----------------
REMAT_OP_CASE(softmax_loss, bf16_softmax) {
  ActivationDTypeScope bf16(DType::bf16);
  const int64_t rows = 19;
  for (int64_t n : kBf16RowLengths) {
    for (bool log : {false, true}) {
      const std::string what = std::string(log ? "log_softmax" : "softmax") + " n=" + std::to_string(n);
      auto x = t.uniform_bf16({rows, n}, -4.0f, 4.0f), xf = t.as_f32(x);
      auto y = t.output({rows, n}, DType::bf16), y_aligned = aligned_bf16_output(t, {rows, n}),
           yf = t.output({rows, n});
      auto yf_aligned = t.values(std::vector<float>(static_cast<size_t>(rows * n)), {rows, n});
      t.run([&](Backend& be, Side s) {
        be.softmax_forward(s(x), log, s(y));
        be.softmax_forward(s(x), log, s(y_aligned));
        be.softmax_forward(s(xf), log, s(yf));
        be.softmax_forward(s(xf), log, s(yf_aligned));
      });
      t.expect_close(y, 1e-5, kBf16Rel, what + " y");
      t.expect_close(y_aligned, 1e-5, kBf16Rel, what + " y (aligned)");
      expect_rounded_dut(y, yf, what + " y against fp32");
      expect_rounded_dut(y_aligned, yf_aligned, what + " y (aligned) against fp32");
      // Backward from the stored (bf16) y.
      auto dy = t.uniform_bf16({rows, n}), dyf = t.as_f32(dy), ys = t.as_f32(y_aligned);
      auto dx = aligned_bf16_output(t, {rows, n});
      auto dxf = t.values(std::vector<float>(static_cast<size_t>(rows * n)), {rows, n});
      t.run([&](Backend& be, Side s) {
        be.softmax_backward(s(dy), s(y_aligned), log, s(dx));
        be.softmax_backward(s(dyf), s(ys), log, s(dxf));
      });
      t.expect_close(dx, 1e-6, kBf16Rel, what + " dx");
      expect_rounded_dut(dx, dxf, what + " dx against fp32");
    }
  }
}

REMAT_OP_CASE(softmax_loss, bf16_cross_entropy_accuracy) {
  ActivationDTypeScope bf16(DType::bf16);
  const int64_t rows = 23;
  for (int64_t v : kBf16RowLengths) {
    const std::string what = " V=" + std::to_string(v);
    auto logits = t.uniform_bf16({rows, v}, -5.0f, 5.0f), lf = t.as_f32(logits);
    auto tg = t.ints({rows}, 0, static_cast<int>(v - 1)).ref.to_ints();
    tg[3] = -100;
    tg[11] = -100;
    auto targets = t.int_values(tg, {rows});
    auto loss = t.output({1}), lse = t.output({rows}), lossf = t.output({1}), lsef = t.output({rows});
    t.run([&](Backend& be, Side s) {
      be.cross_entropy_forward(s(logits), s(targets), -100, 0.0f, s(loss), s(lse), Tensor());
      be.cross_entropy_forward(s(lf), s(targets), -100, 0.0f, s(lossf), s(lsef), Tensor());
    });
    t.expect_close(lse, 1e-5, 1e-6, "lse (f32)" + what);
    t.expect_close(loss, 1e-5, 1e-6, "loss (f32)" + what);
    expect_same_dut_f32(lse, lsef, "lse" + what);
    expect_same_dut_f32(loss, lossf, "loss" + what);
    auto d = t.output({rows, v}, DType::bf16), d_aligned = aligned_bf16_output(t, {rows, v});
    auto df = t.output({rows, v});
    auto df_aligned = t.values(std::vector<float>(static_cast<size_t>(rows * v)), {rows, v});
    t.run([&](Backend& be, Side s) {
      be.cross_entropy_backward(0.7f, s(logits), s(targets), s(lse), -100, 0.0f, s(d));
      be.cross_entropy_backward(0.7f, s(logits), s(targets), s(lse), -100, 0.0f, s(d_aligned));
      be.cross_entropy_backward(0.7f, s(lf), s(targets), s(lsef), -100, 0.0f, s(df));
      be.cross_entropy_backward(0.7f, s(lf), s(targets), s(lsef), -100, 0.0f, s(df_aligned));
    });
    t.expect_close(d, 1e-9, kBf16Rel, "dlogits" + what);
    t.expect_close(d_aligned, 1e-9, kBf16Rel, "dlogits (aligned)" + what);
    expect_rounded_dut(d, df, "dlogits against fp32" + what);
    expect_rounded_dut(d_aligned, df_aligned, "dlogits (aligned) against fp32" + what);
    int64_t counted[2] = {0, 0}, correct[2] = {0, 0};
    t.run([&](Backend& be, Side s) {
      correct[s.ref ? 0 : 1] = be.accuracy(s(logits), s(targets), -100, &counted[s.ref ? 0 : 1]);
    });
    if (!perf_iterations()) {
      EXPECT_EQ(correct[0], correct[1]) << "accuracy" << what;
      EXPECT_EQ(counted[0], counted[1]) << "accuracy counted" << what;
      EXPECT_EQ(counted[1], rows - 2) << "accuracy counted" << what;
    }
  }
}

// ---- Gradients: the device's backward against central differences of its own forward --------
// (backend_ops/harness.h, "Gradient cases")

REMAT_OP_CASE(softmax_loss, grad_softmax) {
  const Shape s{4, 19};
  auto x = t.uniform(s, -2.0f, 2.0f), dy = t.uniform(s);
  for (bool log : {false, true}) {
    auto y = t.output(s), dx = t.output(s);
    t.run([&](Backend& be, Side d) {
      be.softmax_forward(d(x), log, d(y));
      be.softmax_backward(d(dy), d(y), log, d(dx));
    });
    auto y2 = t.output(s);
    t.expect_gradient(log ? "log_softmax" : "softmax", x, dx, [&](Backend& be) {
      be.softmax_forward(x.dut, log, y2.dut);
      return dot(dy.dut, y2.dut);
    });
  }
}

REMAT_OP_CASE(softmax_loss, grad_cross_entropy) {
  const int64_t n = 5, v = 11;
  auto logits = t.uniform({n, v}, -2.0f, 2.0f);
  auto targets = t.int_values({3, 0, 10, -100, 7}, {n});
  auto loss = t.output({1}), lse = t.output({n}), dlogits = t.output({n, v});
  t.run([&](Backend& be, Side d) {
    be.cross_entropy_forward(d(logits), d(targets), -100, 0.0f, d(loss), d(lse), Tensor());
    be.cross_entropy_backward(1.0f, d(logits), d(targets), d(lse), -100, 0.0f, d(dlogits));
  });
  auto loss2 = t.output({1}), lse2 = t.output({n});
  t.expect_gradient("cross_entropy", logits, dlogits, [&](Backend& be) {
    be.cross_entropy_forward(logits.dut, targets.dut, -100, 0.0f, loss2.dut, lse2.dut, Tensor());
    return static_cast<double>(loss2.dut.to_vector()[0]);
  });
}

}  // namespace remat::test
